"""Compressed camera frames (issue 26 item 3): the codec's bounds (a frame is checked against
the policy from its header, before a pixel is decoded), the gRPC link carrying JPEG/PNG, the
server node decoding them beside raw images (a corrupt, oversized or wrong-size frame refused
to its robot while another robot is served), robot_client sending JPEG from a simulated
robot's camera, and `bench fleet-live --image-transport`."""
from __future__ import annotations

import struct
import time
import zlib

import numpy as np
import pytest

from robotserve_ros.core.observation import BadObservation, ObservationSpec, PayloadTooLarge
from robotserve_ros.transport.images import decode_frame, encode_frame

SPEC = ObservationSpec(width=32, height=32, encodings=("rgb8",))


def scene(seed: int = 0, size: int = 32) -> np.ndarray:
    """A smooth image with a few edges (JPEG's loss stays small, as on a rendered camera)."""
    yy, xx = np.mgrid[0:size, 0:size]
    img = np.stack([xx * 255 // (size - 1), yy * 255 // (size - 1), np.full_like(xx, 40 * seed % 256)], -1)
    img[size // 4: size // 2, size // 4: size // 2] = (200, 30, 90 + seed)
    return img.astype(np.uint8)


def png_claiming(width: int, height: int) -> bytes:
    """A tiny real PNG whose header says width x height (a decompression bomb's shape)."""
    fmt, data = encode_frame(scene(), "rgb8", "png", 9)
    ihdr = struct.pack(">II", width, height) + data[24:29]
    return data[:16] + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)) + data[33:]


@pytest.fixture
def no_decoding(monkeypatch):
    """Fails the test if OpenCV is asked to decode anything."""
    import cv2

    def refuse(*_a, **_k):
        raise AssertionError("decoded a frame that should have been refused from its header")

    monkeypatch.setattr(cv2, "imdecode", refuse)


def test_jpeg_and_png_round_trip_to_the_policys_array():
    img = scene(1)
    fmt, data = encode_frame(img, "rgb8", "jpeg", 90)
    assert fmt == "rgb8; jpeg compressed bgr8" and len(data) < img.nbytes
    got = decode_frame("cam", fmt, data, SPEC)
    assert got.shape == (32, 32, 3) and got.dtype == np.uint8
    assert np.abs(got.astype(int) - img).mean() < 4  # lossy, not another image (channels not swapped)
    fmt, data = encode_frame(img, "rgb8", "png", 3)
    np.testing.assert_array_equal(decode_frame("cam", fmt, data, SPEC), img)  # lossless
    grey = img[..., :1]
    fmt, data = encode_frame(grey, "mono8", "png", 3)
    np.testing.assert_array_equal(decode_frame("cam", fmt, data, ObservationSpec(encodings=("mono8",))), grey)


def test_a_frame_claiming_more_pixels_than_allowed_is_refused_undecoded(no_decoding):
    bomb = png_claiming(9000, 9000)
    assert len(bomb) < 2000
    with pytest.raises(PayloadTooLarge, match="claims 9000x9000.*not decoded"):
        decode_frame("compressed_images[0]", "png", bomb, ObservationSpec())  # any size: max_bytes bounds it
    with pytest.raises(BadObservation, match="9000x9000 but the policy takes 32x32"):
        decode_frame("compressed_images[0]", "png", bomb, SPEC)
    with pytest.raises(PayloadTooLarge, match="claims over .* pixels"):  # past Pillow's own limit
        decode_frame("compressed_images[0]", "png", png_claiming(60000, 60000), ObservationSpec())


def test_a_requests_frames_share_one_decoded_budget_checked_before_any_decoding(no_decoding):
    """Per-frame limits alone let every frame of a request claim the most: together they may
    decode to spec.max_bytes, and a call's frames to the call's budget (DecodeBudget)."""
    from types import SimpleNamespace

    from robotserve_ros.transport.images import DecodeBudget, decode_frames

    frame = SimpleNamespace(format="png", data=png_claiming(1000, 1000))  # 3 MB decoded each, < 8 MB alone
    with pytest.raises(PayloadTooLarge, match=r"cams\[2\]: decodes to 3000000 bytes, past the 8388608 bytes its request"):
        decode_frames("cams", [frame] * 16, ObservationSpec())  # refused at the third header, nothing decoded
    call = DecodeBudget(5_000_000, "call")
    with pytest.raises(PayloadTooLarge, match=r"cams\[1\].*5000000 bytes its call"):
        decode_frames("cams", [frame, frame], ObservationSpec(), call)


def test_the_gpu_server_bounds_what_one_call_decodes(monkeypatch):
    import grpc

    from robotserve_ros.core import EngineProfile
    from robotserve_ros.core.observation import Observation
    from robotserve_ros.core.types import InferenceRequest
    from robotserve_ros.engines.simulated import SimulatedEngine
    from robotserve_ros.transport import stubs
    from robotserve_ros.transport.gpu_server import GpuServer
    from robotserve_ros.transport.tensors import Limits, request_to_pb

    pb, pb_grpc = stubs()
    req = InferenceRequest("arm/t", 0, observation=Observation(images=[scene(3)], joints=np.zeros(6, np.float32)))
    eng = SimulatedEngine(EngineProfile({1: 1.0}), chunk_size=8, action_dim=3)  # no observation spec: any size
    with GpuServer(eng, "127.0.0.1:0", limits=Limits(max_call_decoded_bytes=4_000_000)) as srv, \
            grpc.insecure_channel(srv.address) as ch:
        stub = pb_grpc.GpuServerStub(ch)
        msg = pb.InferBatchRequest(requests=[request_to_pb(pb, req, "png", 3) for _ in range(3)])
        zeros = encode_frame(np.zeros((1000, 1000, 3), np.uint8), "rgb8", "png", 9)[1]
        assert len(zeros) < 20_000  # a few KB on the wire, 3 MB decoded
        for r in msg.requests:
            r.observation.compressed_images[0].data = zeros
        import cv2

        calls = []
        real = cv2.imdecode
        monkeypatch.setattr(cv2, "imdecode", lambda *a: calls.append(1) or real(*a))
        with pytest.raises(grpc.RpcError) as e:
            stub.InferBatch(msg, timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "requests[1].observation.compressed_images[0]" in e.value.details() and "its call" in e.value.details()
        assert len(calls) == 1  # the first frame's: the second was refused from its header
        ok = stub.InferBatch(pb.InferBatchRequest(requests=[request_to_pb(pb, req, "png", 3)]), timeout=5)
        assert len(ok.chunks) == 1  # and a good call is served


@pytest.mark.parametrize("what, fmt, data, text", [
    ("garbage", "jpeg", b"\x00\x01not an image" * 10, "not a readable jpeg"),
    ("unknown format", "webp", b"RIFF", "is not jpeg or png"),
    ("format names the other codec", "png", encode_frame(scene(), "rgb8", "jpeg", 90)[1], "format says png but the data is jpeg"),
    ("truncated jpeg", "jpeg", encode_frame(scene(), "rgb8", "jpeg", 90)[1][:-200], "truncated jpeg"),
    ("wrong size", "jpeg", encode_frame(scene(size=64), "rgb8", "jpeg", 90)[1], "64x64 but the policy takes 32x32"),
    ("grey for a colour policy", "png", encode_frame(scene()[..., :1], "mono8", "png", 1)[1], "decodes to mono8"),
])
def test_bad_frames_are_refused_with_the_reason(what, fmt, data, text):
    with pytest.raises(BadObservation, match=text):
        decode_frame("compressed_images[0]", fmt, data, SPEC)


@pytest.mark.parametrize("kind", ["jpeg", "png"])
def test_damaged_files_give_the_policys_array_or_a_clear_refusal(kind):
    """Bytes changed or cut anywhere in a real file: decoded to the policy's shape, or refused
    as a RequestError naming the field; never another exception, never another shape."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from robotserve_ros.core.errors import RequestError

    fmt, data = encode_frame(scene(3), "rgb8", kind, 90 if kind == "jpeg" else 3)

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(0, 255)), max_size=6),
           st.integers(1, len(data)))
    def check(edits, keep):
        b = bytearray(data)
        for at, v in edits:
            b[at] = v
        try:
            got = decode_frame("compressed_images[0]", fmt, bytes(b[:keep]), SPEC)
        except RequestError as e:
            assert e.message.startswith("compressed_images[0]: ")
        else:
            assert got.shape == (32, 32, 3) and got.dtype == np.uint8

    check()


# --- the gRPC link to a remote GPU server ---------------------------------------------------
def test_the_grpc_link_carries_compressed_frames_and_refuses_a_bad_one():
    import grpc

    from robotserve_ros.core import EngineProfile
    from robotserve_ros.core.observation import Observation
    from robotserve_ros.core.types import InferenceRequest
    from robotserve_ros.engines.simulated import SimulatedEngine
    from robotserve_ros.transport import stubs
    from robotserve_ros.transport.gpu_server import GpuServer
    from robotserve_ros.transport.remote_engine import RemoteEngine
    from robotserve_ros.transport.tensors import request_to_pb

    pb, pb_grpc = stubs()
    seen = []

    class Recording(SimulatedEngine):
        observation_spec = ObservationSpec(cameras=1, width=32, height=32, encodings=("rgb8",), joints=6)

        def infer(self, batch):
            seen.extend(np.array(r.observation.images[0]) for r in batch)
            return super().infer(batch)

    img = scene(2)
    req = InferenceRequest("arm/t", 0, observation=Observation(images=[img], joints=np.zeros(6, np.float32)))
    raw_bytes = request_to_pb(pb, req).ByteSize()
    jpeg_msg = request_to_pb(pb, req, "jpeg", 90)
    assert not jpeg_msg.observation.images and len(jpeg_msg.observation.compressed_images) == 1
    assert jpeg_msg.ByteSize() < raw_bytes / 2

    eng = Recording(EngineProfile({1: 1.0, 2: 1.5}), chunk_size=8, action_dim=3)
    with GpuServer(eng, "127.0.0.1:0") as srv:
        for transport, exact in (("jpeg", False), ("png", True)):
            remote = RemoteEngine(address=srv.address, ping_interval_s=0, image_transport=transport, image_quality=90 if transport == "jpeg" else 3)
            try:
                (got,) = remote.infer([req])
            finally:
                remote.close()
            assert got.actions.shape == (8, 3)
            assert remote.link.ratio_samples == 1 and remote.link.wire_ratio < 0.5  # the placement sees the saving
            if exact:
                np.testing.assert_array_equal(seen[-1], img)
            else:
                assert seen[-1].shape == img.shape and np.abs(seen[-1].astype(int) - img).mean() < 4
        with grpc.insecure_channel(srv.address) as ch:
            stub = pb_grpc.GpuServerStub(ch)
            bad = pb.InferBatchRequest(requests=[request_to_pb(pb, req, "png", 3)])
            bad.requests[0].observation.compressed_images[0].data = png_claiming(9000, 9000)
            n = len(seen)
            with pytest.raises(grpc.RpcError) as e:
                stub.InferBatch(bad, timeout=5)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "requests[0].observation.compressed_images[0]" in e.value.details() and "9000x9000" in e.value.details()
            assert len(seen) == n  # nothing of the call reached the engine
            rep = stub.InferBatch(pb.InferBatchRequest(requests=[jpeg_msg]), timeout=5)
            assert [c.task_id for c in rep.chunks] == ["arm/t"]


# --- the ROS path -------------------------------------------------------------------------
from rosutil import requires_rclpy, ros_ctx  # noqa: E402,F401


def infer_request(task: str, img: np.ndarray, transport: str = "raw", *, data: bytes = None, fmt: str = None, rnd: int = 0):
    """srv/Infer with one camera as raw sensor_msgs/Image or as a CompressedImage."""
    from sensor_msgs.msg import CompressedImage, Image

    from robotserve_ros.srv import Infer

    r = Infer.Request()
    r.task_id, r.round_id = task, rnd
    r.observation.joint_state.position = [0.1] * 6
    r.horizon.name, r.horizon.has_param, r.horizon.param = "static", True, 8.0
    if rnd > 0:  # the robot's execution so far (the node clock is the system clock)
        now = time.time()
        r.has_exec_info = True
        r.exec_info.exec_start.sec, r.exec_info.exec_start.nanosec = int(now), int(now % 1 * 1e9)
        r.exec_info.actions_left, r.exec_info.control_hz = 2, 30.0
    if transport == "raw":
        h, w, _ = img.shape
        im = Image(height=h, width=w, encoding="rgb8", step=3 * w)
        im.data = img.tobytes()
        r.observation.images = [im]
    else:
        f, d = encode_frame(img, "rgb8", transport, 90 if transport == "jpeg" else 3)
        r.compressed_images = [CompressedImage(format=fmt or f, data=data if data is not None else d)]
    return r


@requires_rclpy
def test_server_node_serves_raw_jpeg_and_png_alike(ros_ctx, tmp_path):
    """A deterministic policy (tiny ACT, 32x32 camera) behind the real server node: PNG gives
    the raw frame's actions exactly, JPEG q90 nearly, and another frame other actions (so the
    decoded image is what the policy saw)."""
    pytest.importorskip("lerobot")
    from lerobot_policies import make_policy_dir
    from test_nodes import Caller, server_args

    from robotserve_ros.nodes.convert import chunk_to_array

    d = make_policy_dir("act", tmp_path / "act", image_hw=(32, 32))
    ros_ctx.start_node(server_args("engine.name:=lerobot", f"engine.lerobot.policy_dir:={d}", "obs_width:=32",
                                   "obs_height:=32"))
    c = Caller(ros_ctx)
    out = {}
    for k, (frame, transport) in enumerate([(1, "raw"), (1, "png"), (1, "jpeg"), (2, "raw")]):
        res = c.call(infer_request(f"t{k}", scene(frame), transport), timeout=60)
        assert res.status.reason == "ok", res.status.message
        out[(frame, transport)] = chunk_to_array(res.chunk)
    np.testing.assert_array_equal(out[(1, "png")], out[(1, "raw")])
    jpeg_diff = np.abs(out[(1, "jpeg")] - out[(1, "raw")]).max()
    other = np.abs(out[(2, "raw")] - out[(1, "raw")]).max()
    assert jpeg_diff < other and other > 0, (jpeg_diff, other)


@requires_rclpy
def test_bad_compressed_frames_are_refused_while_another_robot_is_served(ros_ctx):
    from diagnostic_msgs.msg import DiagnosticArray
    from sensor_msgs.msg import Image
    from test_nodes import Caller, server_args

    ros_ctx.start_node(server_args())  # the policy takes 96x96 rgb8
    diags = ros_ctx.collect(DiagnosticArray, "/diagnostics", 10)
    c = Caller(ros_ctx)
    good = scene(0, 96)
    both = infer_request("x5", good, "jpeg")
    both.observation.images = [Image(height=96, width=96, encoding="rgb8", step=288, data=good.tobytes())]
    bad = {
        "corrupt": (infer_request("x1", good, "jpeg", data=b"\xff\xd8garbage\xff\xd9"), "bad_observation", "not a readable jpeg"),
        "decompression bomb": (infer_request("x2", good, "png", data=png_claiming(9000, 9000)), "bad_observation",
                               "9000x9000 but the policy takes 96x96 (not decoded)"),
        "wrong size": (infer_request("x3", scene(0, 64), "jpeg"), "bad_observation", "64x64 but the policy takes 96x96"),
        "not jpeg or png": (infer_request("x4", good, "jpeg", fmt="rgb8; webp"), "bad_observation", "is not jpeg or png"),
        "raw and compressed at once": (both, "bad_observation", "send one or the other"),
    }
    for rnd, transport in enumerate(("jpeg", "png", "raw")):
        res = c.call(infer_request("good", good, transport, rnd=rnd))
        assert res.status.reason == "ok", f"{transport}: {res.status.message}"
    good_round = 3
    for what, (req, code, text) in bad.items():
        res = c.call(req)
        assert res.status.reason == code and res.status.code != 0, f"{what}: {res.status.reason}: {res.status.message}"
        assert text in res.status.message, f"{what}: {res.status.message}"
        ok = c.call(infer_request("good", good, "jpeg", rnd=good_round))
        assert ok.status.reason == "ok" and ok.chunk.round_id == good_round, what
        good_round += 1

    def counted():
        vals = {kv.key: kv.value for kv in diags[-1].status[0].values} if diags else {}
        return vals.get("errors/bad_observation") == str(len(bad))

    assert ros_ctx.wait_for(counted, 5), "refusals not counted in diagnostics"


@requires_rclpy
def test_robot_client_sends_jpeg_from_a_simulated_camera(ros_ctx, tmp_path):
    """sim_robot's camera -> robot_client (image_transport jpeg) -> the server decodes: tasks
    run to the end with every request accepted."""
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from test_nodes import fleet_params, start_fleet_of_one

    from robotserve_ros.msg import ExecutionProgress

    params = fleet_params(tmp_path, server={"obs_width": 96, "obs_height": 96}, tasks=2, image_transport="jpeg",
                          image_quality=80)
    client, diagnostics = start_fleet_of_one(ros_ctx, params)
    progress = ros_ctx.collect(ExecutionProgress, "/robotserve/progress", QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
    assert ros_ctx.wait_for(lambda: any(m.task_done for m in progress), 60), client.output()
    assert ros_ctx.wait_for(lambda: int(diagnostics().get("served_by_tier/edge", 0)) >= 3, 10), diagnostics()
    assert not [k for k in diagnostics() if k.startswith("errors/")], diagnostics()
    assert client.stop() == 0, client.output()


def test_robot_client_refuses_a_wrong_image_transport():
    from robotserve_ros.config import ConfigError
    from robotserve_ros.nodes.robot_client import RobotClientConfig

    with pytest.raises(ConfigError, match="image_transport.*'webp' is not one of raw, jpeg, png"):
        RobotClientConfig(image_transport="webp")
    with pytest.raises(ConfigError, match="image_quality.*0 is not in 1..100 for jpeg"):
        RobotClientConfig(image_transport="jpeg", image_quality=0)
    assert RobotClientConfig(image_transport="png", image_quality=0).image_quality == 0


def test_a_remote_tier_takes_image_transport_to_its_engine():
    from robotserve_ros.config import ConfigError
    from robotserve_ros.nodes.server_config import RemoteTierConfig

    kw = RemoteTierConfig(address="10.0.0.2:50051", image_transport="jpeg", image_quality=75).engine_params()
    assert (kw["image_transport"], kw["image_quality"]) == ("jpeg", 75)
    with pytest.raises(ConfigError, match="image_quality.*12 is not in 0..9 for png"):
        RemoteTierConfig(address="10.0.0.2:50051", image_transport="png", image_quality=12)


# --- the CLI option of bench fleet-live ---------------------------------------------------
def test_fleet_live_image_transport_option_is_checked(capsys):
    from robotserve_ros.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "fleet-live", "--out", "x.json", "--image-transport", "webp"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "webp" in err[0] and "jpeg" in err[0], err


@requires_rclpy
def test_fleet_live_light_with_jpeg_frames(tmp_path, monkeypatch):
    from test_bench_live import _apply_env

    from robotserve_ros.bench.fleet_live import run_fleet_live

    _apply_env(monkeypatch)
    res = run_fleet_live(tmp_path / "light.json", robots=4, duration=6.0, per_process=2, log_dir=tmp_path / "logs",
                         verbose=False, light=True, image_transport="jpeg")
    assert res["image_transport"] == "jpeg"
    assert res["lost_chunks"] == 0 and res["duplicate_chunks"] == 0 and res["chunks_served"] > 0, res
    assert not res["errors"], res["errors"]  # every JPEG round accepted by the server
