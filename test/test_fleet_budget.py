"""The budgets checked the other way (issue 37 item 3): the documented fleet, 100 robots with
3 cameras of 224x224 at 30 Hz, is served with 0 refusals under the defaults, through the real
budget checks (docs/security.md, "A real fleet under the defaults")."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

pytest.importorskip("websockets")
openpi_client = pytest.importorskip("openpi_client.websocket_client_policy")

from robotserve_ros.config import SchedulerConfig  # noqa: E402
from robotserve_ros.core.clock import WallClock  # noqa: E402
from robotserve_ros.core.observation import ObservationSpec  # noqa: E402
from robotserve_ros.core.profile import EngineProfile  # noqa: E402
from robotserve_ros.engines.simulated import SimulatedEngine  # noqa: E402
from robotserve_ros.serve import fleet_over  # noqa: E402
from robotserve_ros.transport.openpi.config import EndpointConfig  # noqa: E402
from robotserve_ros.transport.openpi.endpoint import OpenPiEndpoint, _Conn  # noqa: E402

ROBOTS, CAMERAS, SIDE, HZ = 100, 3, 224, 30.0
CAMERA_KEYS = ("observation/image", "observation/wrist_image", "observation/image_2")  # openpi's, then the third


def fleet_observation(rng) -> dict:
    obs = {k: rng.integers(0, 255, (SIDE, SIDE, 3), dtype=np.uint8) for k in CAMERA_KEYS[:CAMERAS]}
    return {**obs, "observation/state": np.zeros(6, np.float32), "prompt": "pick up the cube"}


@pytest.fixture
def endpoint(tmp_path):
    """The openpi endpoint with every budget at its default, one API key (how a fleet whose
    robots share an address, as here on loopback, is deployed), a policy of 3 cameras."""
    key = tmp_path / "key"
    key.write_text("fleet\n")
    engine = SimulatedEngine(EngineProfile({1: 5.0, 32: 20.0}), chunk_size=8, action_dim=6, realtime=True)
    engine.observation_spec = ObservationSpec(cameras=CAMERAS, joints=6)
    fleet = fleet_over(engine, SchedulerConfig(name="remaining").build(), WallClock(), slots=1).start()
    ep = OpenPiEndpoint(EndpointConfig(port=0, api_key_file=str(key)), fleet).start()
    yield ep
    ep.close()
    fleet.close()


def test_a_100_robot_fleet_of_3_cameras_is_served_by_openpi_with_no_refusal(endpoint):
    """100 connections from one address, each sending its 3 x 224x224 frames (~452 KB a frame,
    45 MB together) at once, twice: every round answered, nothing refused or waiting."""
    clients = [openpi_client.WebsocketClientPolicy("127.0.0.1", endpoint.port, api_key="fleet") for _ in range(ROBOTS)]
    go, out = threading.Barrier(ROBOTS), []

    def robot(i: int, c) -> None:
        rng = np.random.default_rng(i)
        go.wait()
        out.extend(c.infer(fleet_observation(rng))["actions"].shape for _ in range(2))

    threads = [threading.Thread(target=robot, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert out == [(8, 6)] * (2 * ROBOTS)
    s = endpoint.stats()
    assert s["refused"] == {} and s["chunks"] == 2 * ROBOTS and s["connected"] == ROBOTS
    assert endpoint.budgets.held_total == 0


def test_the_fleets_control_rate_passes_the_default_rate_budget():
    """openpi asks once per chunk, at most once per control tick: a robot calling at 30 Hz for
    10 s never meets max_rate_hz / rate_burst (the endpoint's own token bucket)."""
    cfg = EndpointConfig()
    ep = OpenPiEndpoint.__new__(OpenPiEndpoint)
    ep.cfg = cfg
    c = _Conn("t", "p", HZ, cfg.rate_burst, session=None)
    t0 = time.monotonic()
    for k in range(int(10 * HZ)):
        ep._rate(c, t0 + k / HZ)  # raises Refusal past the budget


def test_srv_infer_defaults_take_the_fleets_requests_and_waiting_calls():
    """srv/Infer: a request of 3 raw 224x224 rgb8 frames passes the default request budget
    (max_request_bytes, max_images) through the node's own conversion; the 100 robots' calls
    waiting at once (one round each, the engine held) pass the default infer_queue.max_waiting
    through the Fleet, all answered, none refused."""
    pytest.importorskip("rclpy")
    from sensor_msgs.msg import Image

    from robotserve_ros.nodes.convert import request_from_msg
    from robotserve_ros.nodes.server_config import InferenceServerConfig
    from robotserve_ros.srv import Infer

    cfg = InferenceServerConfig()
    spec = cfg.observation_spec(ObservationSpec(cameras=CAMERAS, width=SIDE, height=SIDE, joints=6))
    r = Infer.Request()
    r.task_id, r.round_id = "robot_0/task0", 0
    for _ in range(CAMERAS):
        im = Image()
        im.width = im.height = SIDE
        im.encoding, im.step, im.data = "rgb8", SIDE * 3, bytes(SIDE * SIDE * 3)
        r.observation.images.append(im)
    r.observation.joint_state.position = [0.0] * 6
    r.horizon.name, r.horizon.has_param, r.horizon.param = "static", True, 8.0
    assert len(request_from_msg(r, spec).observation.images) == CAMERAS

    from robotserve_ros.core.types import HorizonChoice, InferenceRequest

    gate = threading.Event()
    engine = SimulatedEngine(EngineProfile({1: 1.0, 128: 2.0}), chunk_size=8, action_dim=6)
    real = engine.infer
    engine.infer = lambda batch: (gate.wait(30), real(batch))[1]
    fleet = fleet_over(engine, SchedulerConfig(name="remaining").build(), WallClock(), slots=1,
                       max_waiting=cfg.max_waiting).start()
    try:
        s = fleet.session("ros")
        calls = [s.submit(InferenceRequest(f"robot_{i}/task0", 0, horizon=HorizonChoice("static", 8.0)))
                 for i in range(ROBOTS)]
        gate.set()
        assert all(f.result(30).task_id == f"robot_{i}/task0" for i, f in enumerate(calls))
        assert not fleet.core_stats()["errors"]
    finally:
        fleet.close()


def test_a_100_robot_fleet_of_3_cameras_is_served_by_lerobot_with_no_refusal():
    """The LeRobot endpoint under its defaults: 100 connections (LeRobot's RobotClient, one
    process each), each with a GetActions call always open (its receiver thread) while it
    sends an observation of 3 x 224x224 images: every robot gets its chunk, no call refused
    (grpc's maximum_concurrent_rpcs, the call guard's caps, the session and payload budgets)."""
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("lerobot")
    import pickle

    from robotserve_ros.engines.torch_env import import_lerobot_policies

    import_lerobot_policies()
    from lerobot.async_inference.helpers import RemotePolicyConfig, TimedObservation
    from lerobot.transport import services_pb2 as pb
    from lerobot.transport import services_pb2_grpc as pb_grpc
    from lerobot.transport.utils import send_bytes_in_chunks

    from robotserve_ros.transport.lerobot.config import CompatConfig
    from robotserve_ros.transport.lerobot.protocol import LeRobotCompatServer

    cams = [f"cam{i}" for i in range(CAMERAS)]
    features = {"observation.state": {"dtype": "float32", "shape": (6,), "names": [f"j{i}.pos" for i in range(6)]},
                **{f"observation.images.{c}": {"dtype": "image", "shape": (SIDE, SIDE, 3),
                                               "names": ["height", "width", "channels"]} for c in cams}}
    setup = pb.PolicySetup(data=pickle.dumps(RemotePolicyConfig("diffusion", "/policies/dp", features, 4, "cpu")))
    srv = LeRobotCompatServer(CompatConfig(port=0, engine="simulated", engine_params={"chunk_size": 8},
                                           profile_ms={1: 5.0, 32: 20.0}, policy_dirs=("/policies",)))
    go, got, failed = threading.Barrier(ROBOTS), [], []

    def robot(i: int) -> None:
        channel = grpc.insecure_channel(f"127.0.0.1:{srv.port}", options=[("grpc.use_local_subchannel_pool", 1)])
        stub = pb_grpc.AsyncInferenceStub(channel)
        rng = np.random.default_rng(i)
        raw = {**{f"j{k}.pos": 0.0 for k in range(6)}, "task": "pick up the cube",
               **{c: rng.integers(0, 255, (SIDE, SIDE, 3), dtype=np.uint8) for c in cams}}
        try:
            stub.Ready(pb.Empty())
            stub.SendPolicyInstructions(setup)
            go.wait()
            held = stub.GetActions.future(pb.Empty())  # the receiver thread's call, open meanwhile
            obs = pickle.dumps(TimedObservation(timestamp=time.time(), timestep=0, observation=raw, must_go=True))
            stub.SendObservations(send_bytes_in_chunks(obs, pb.Observation, silent=True))
            reply, deadline = held.result(), time.monotonic() + 60
            while not reply.data and time.monotonic() < deadline:
                reply = stub.GetActions(pb.Empty())
            got.append(len(pickle.loads(reply.data)) if reply.data else 0)
        except grpc.RpcError as e:
            failed.append(f"{e.code()}: {e.details()}")
        finally:
            channel.close()

    try:
        threads = [threading.Thread(target=robot, args=(i,)) for i in range(ROBOTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert failed == [] and got == [4] * ROBOTS
        calls = srv.servicer.stats()["calls"]
        assert not any(calls.get(k) for k in ("receive_slots_full", "receive_timeouts", "peer_calls_refused"))
    finally:
        srv.stop(0)


@pytest.mark.parametrize("transport", ["raw", "jpeg"])
def test_the_gpu_server_takes_the_fleets_batch_under_its_defaults(transport):
    """The GPU server under its defaults (a token, 64 MiB messages, 128 MiB decoded per call):
    one InferBatch carrying all 100 robots' rounds of 3 x 224x224 frames, raw (45 MB on the
    wire) or JPEG (45 MB decoded), is served whole; nothing refused."""
    grpc = pytest.importorskip("grpc")
    from robotserve_ros.core.observation import Observation
    from robotserve_ros.core.types import InferenceRequest
    from robotserve_ros.transport import DEFAULT_MAX_MESSAGE, channel_options, stubs
    from robotserve_ros.transport.gpu_server import GpuServer
    from robotserve_ros.transport.tensors import request_to_pb

    pb, pb_grpc = stubs()
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (SIDE, SIDE, 3), dtype=np.uint8) for _ in range(CAMERAS)]
    reqs = [InferenceRequest(f"robot_{i}/t", 0, observation=Observation(images=frames, joints=np.zeros(6, np.float32)))
            for i in range(ROBOTS)]
    eng = SimulatedEngine(EngineProfile({1: 1.0, 128: 2.0}), chunk_size=8, action_dim=6)
    with GpuServer(eng, "127.0.0.1:0", token="fleet-token") as srv, \
            grpc.insecure_channel(srv.address, options=channel_options(DEFAULT_MAX_MESSAGE)) as ch:
        msg = pb.InferBatchRequest(requests=[request_to_pb(pb, r, transport) for r in reqs])
        reply = pb_grpc.GpuServerStub(ch).InferBatch(msg, timeout=60, metadata=[("authorization", "Bearer fleet-token")])
        assert [c.task_id for c in reply.chunks] == [r.task_id for r in reqs]
        assert srv.counts["requests"] == ROBOTS
        assert not any(srv.counts[k] for k in ("bad_request", "internal", "token_overloaded", "engine_failure", "expired",
                                               "unauthenticated", "peer_calls_refused", "token_calls_refused"))
