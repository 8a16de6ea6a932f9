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
