"""srv/Generate on the real inference server (a subprocess on an isolated ROS domain): the
SLO-aware disaggregated service (seed 004) with the tiny random-weight Llama. Concurrent
requests are answered with their TTFT/TPOT; bad SLOs, images, empty and too-long prompts get
their own codes and the server keeps serving; /diagnostics shows the service."""
from __future__ import annotations


from rosutil import requires_rclpy, ros_ctx  # noqa: F401

pytestmark = requires_rclpy

SERVICE = "/robotserve/generate"


def params(tmp_path, **gen):
    import yaml

    svc = {"engine": "tiny", "chat_template": False, "ttft_slo_s": 30.0, "tpot_slo_s": 5.0, "max_tokens": 6, **gen}
    cfg = {"inference_server": {"ros__parameters": {
        "engine": {"batch_sizes": [1], "latency_ms": [10.0]}, "diagnostics_hz": 5.0,
        "services": ["generate"], "generate": svc}}}
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def request(rid, prompt="move the red cube to the left bin", **kw):
    from robotserve_ros.srv import Generate

    r = Generate.Request()
    r.request_id, r.task_id, r.prompt = rid, "operator", prompt
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_generate_serves_concurrent_requests_and_refuses_bad_ones(ros_ctx, tmp_path):
    from diagnostic_msgs.msg import DiagnosticArray
    from sensor_msgs.msg import Image

    from robotserve_ros.srv import Generate

    srv = ros_ctx.start_node(["robotserve_ros.nodes.inference_server", "--ros-args", "--params-file", params(tmp_path)])
    diags = ros_ctx.collect(DiagnosticArray, "/diagnostics", 10)
    cli = ros_ctx.node.create_client(Generate, SERVICE)
    assert cli.wait_for_service(timeout_sec=120), srv.output()  # torch + transformers import under load

    futs = [cli.call_async(request(f"q{i}", "pick " * (1 + 40 * i), max_tokens=4 + i)) for i in range(3)]
    assert ros_ctx.wait_for(lambda: all(f.done() for f in futs), 90), srv.output()
    for i, f in enumerate(futs):
        res = f.result()
        assert res.status.reason == "ok", res.status.message
        assert res.prompt_tokens == len("pick " * (1 + 40 * i)) and 1 <= res.output_tokens <= 4 + i
        assert isinstance(res.text, str)
        assert 0 < res.ttft_s <= res.latency_s and res.tpot_s >= 0

    im = Image()
    im.width = im.height = 2
    im.encoding, im.step, im.data = "rgb8", 6, bytes(12)
    with_image = request("img")
    with_image.observation.images = [im]
    bad = {"bad_deadline": [request("b1", ttft_slo_s=-1.0), request("b2", tpot_slo_s=float("nan"))],
           "bad_prompt": [request("b3", prompt="  "), with_image, request("b4", prompt="x" * 3000)]}
    for code, reqs in bad.items():
        for r in reqs:
            f = cli.call_async(r)
            assert ros_ctx.wait_for(f.done, 30), srv.output()
            assert f.result().status.reason == code, (r.request_id, f.result().status)
            assert f.result().status.message
    # still serving, the default SLOs and max_tokens inherited (0)
    f = cli.call_async(request("after"))
    assert ros_ctx.wait_for(f.done, 30)
    assert f.result().status.reason == "ok" and 1 <= f.result().output_tokens <= 6

    def svc_stats():
        if not diags:
            return {}
        return {kv.key: kv.value for kv in diags[-1].status[0].values if kv.key.startswith("services/generate/")}

    assert ros_ctx.wait_for(lambda: svc_stats().get("services/generate/answered") == "4", 20), svc_stats()
    st = svc_stats()
    assert st["services/generate/scheduler"] == "urgency_slack"
    assert "'bad_deadline': 2" in st["services/generate/errors"] and "'bad_prompt': 3" in st["services/generate/errors"]
    assert srv.stop() == 0, srv.output()
