"""The `vlm` service (seed 003) on the real inference server: questions about an image over
srv/Generate answered by the staged VLM, bad ones refused with their Status code, and
action-chunk requests (srv/Infer) still answered while VLM questions are in progress."""
from __future__ import annotations


from rosutil import requires_rclpy, ros_ctx  # noqa: F401
from test_nodes import Caller, make_request, server_args

pytestmark = requires_rclpy

VLM = "/robotserve/vlm/generate"


def question(rid, prompt="what is on the table", *, side=64, encoding="rgb8", max_tokens=0, nbytes=None):
    from sensor_msgs.msg import Image

    from robotserve_ros.srv import Generate

    r = Generate.Request()
    r.request_id, r.prompt, r.max_tokens = rid, prompt, max_tokens
    if side:
        im = Image()
        im.width = im.height = side
        im.encoding, im.step = encoding, side * 3
        im.data = bytes((i * 7) % 251 for i in range(nbytes if nbytes is not None else side * side * 3))
        r.observation.images = [im]
    return r


def test_vlm_questions_share_the_server_with_action_chunks(ros_ctx):
    from robotserve_ros.srv import Generate

    ros_ctx.start_node(server_args("services:=[vlm]", "vlm.shape:=tiny", "vlm.max_tokens:=30", "vlm.max_prompt_words:=8",
                                   "vlm.max_pending:=8"))
    infer = Caller(ros_ctx)
    gen = ros_ctx.node.create_client(Generate, VLM)
    assert gen.wait_for_service(timeout_sec=30), "vlm service did not come up"

    def call(req, timeout=60.0):
        fut = gen.call_async(req)
        assert ros_ctx.wait_for(fut.done, timeout), "no answer"
        return fut.result()

    ok = call(question("q0"))
    assert ok.status.reason == "ok", ok.status.message
    assert ok.output_tokens >= 1 and ok.output_tokens <= 30 and ok.text
    assert ok.prompt_tokens > 5 and 0 < ok.ttft_s <= ok.latency_s
    # same question, same answer (greedy, deterministic weights)
    assert call(question("q0b")).text == ok.text
    # bad questions get their own codes
    assert call(question("e1", prompt="   ")).status.reason == "bad_prompt"
    assert call(question("e2", prompt="a b c d e f g h i j")).status.reason == "bad_prompt"
    assert call(question("e3", encoding="rgba8")).status.reason == "bad_observation"
    assert call(question("e4", nbytes=10)).status.reason == "bad_observation"
    assert call(question("e5", max_tokens=99)).status.reason == "bad_request"
    # several questions in flight; action chunks sent after them are answered meanwhile
    futs = [gen.call_async(question(f"b{i}", side=128)) for i in range(4)]
    chunks = [infer.call(make_request(f"arm{r}", 0), timeout=30) for r in range(3)]
    assert [c.status.reason for c in chunks] == ["ok"] * 3
    assert not all(f.done() for f in futs), "the questions finished before the action chunks were served"
    assert ros_ctx.wait_for(lambda: all(f.done() for f in futs), 120)
    assert [f.result().status.reason for f in futs] == ["ok"] * 4
    # text-only question (no image) works too
    assert call(question("t", side=0)).status.reason == "ok"
