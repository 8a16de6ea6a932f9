"""RTC for clients that send no leftover (issue 28 item 2): the LeRobot and openpi endpoints
rebuild it from their own reply log and the client's timing (core/rtc_rebuild.py) when
started with rtc on; the stand-in engine's chunk then starts with the rebuilt leftover's first
d rows (engines/simulated.py), which is how these tests see what reached the engine."""
from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("websockets")
openpi_client = pytest.importorskip("openpi_client.websocket_client_policy")

from robotserve_ros.transport.openpi.config import EndpointConfig, OpenPiConfig  # noqa: E402
from robotserve_ros.transport.openpi.server import OpenPiServer  # noqa: E402

STATE = np.arange(6, dtype=np.float32)


def openpi_server(**endpoint) -> OpenPiServer:
    return OpenPiServer(OpenPiConfig(engine="simulated", engine_params={"chunk_size": 8, "action_dim": 6},
                                     profile_ms={1: 5.0, 4: 8.0}, endpoint=EndpointConfig(port=0, **endpoint)))


@pytest.mark.parametrize("rtc", [True, False])
def test_openpi_leftover_rebuilt_from_the_last_chunk_and_the_time_since(rtc):
    # 1 Hz: the client has run none of its chunk when it asks again at once, so the leftover is all of it
    srv = openpi_server(rtc=rtc, control_hz=1.0)
    try:
        c = openpi_client.WebsocketClientPolicy("127.0.0.1", srv.port)
        first = c.infer({"observation/state": STATE, "prompt": "pick"})
        second = c.infer({"observation/state": STATE, "prompt": "pick"})
    finally:
        srv.stop()
    said = second["robotserve"]
    if not rtc:
        assert "rtc_delay_steps" not in said
        return
    d = said["rtc_delay_steps"]
    assert d >= 1  # the dispatch and the 5 ms generation, at 1 Hz: one step
    np.testing.assert_array_equal(second["actions"][:d], first["actions"][:d])
    assert d <= len(second["actions"]) <= 8 - d  # s <= H - d: 8 rows asked, at most 8 - d given


def _exec(**kw) -> dict:
    return {"observation/state": STATE, "prompt": "pick", "robotserve/exec": kw}


def test_openpi_rtc_is_a_per_session_option_an_unchanged_client_leaves_off():
    # a server with rtc off: the client that says rtc true gets guided chunks whose first d rows are its
    # rebuilt leftover's; one that says nothing is served as before; one sends its own leftover
    srv = openpi_server(control_hz=1.0)
    try:
        on = openpi_client.WebsocketClientPolicy("127.0.0.1", srv.port)
        plain = openpi_client.WebsocketClientPolicy("127.0.0.1", srv.port)
        own = openpi_client.WebsocketClientPolicy("127.0.0.1", srv.port)
        first = on.infer(_exec(rtc=True))
        second = on.infer({"observation/state": STATE, "prompt": "pick"})  # the option holds for the session
        p1, p2 = plain.infer({"observation/state": STATE}), plain.infer({"observation/state": STATE})
        own.infer({"observation/state": STATE})
        left = np.linspace(-1, 1, 30, dtype=np.float32).reshape(5, 6)
        mine = own.infer(_exec(rtc_leftover=left))
    finally:
        srv.stop()
    d = second["robotserve"]["rtc_delay_steps"]
    assert "rtc_delay_steps" not in first["robotserve"]  # round 0: nothing was running yet
    assert 1 <= d and np.array_equal(second["actions"][:d], first["actions"][:d])
    assert "rtc_delay_steps" not in p2["robotserve"] and not np.array_equal(p2["actions"][:1], p1["actions"][:1])
    dm = mine["robotserve"]["rtc_delay_steps"]
    assert 1 <= dm <= 5 and np.array_equal(mine["actions"][:dm], left[:dm])


@pytest.mark.parametrize("exec_, says, code", [
    ({"rtc": "yes"}, "robotserve/exec.rtc must be true or false", "bad_observation"),
    ({"rtc_leftover": "abc"}, "rtc_leftover must be a 2-D array", "bad_observation"),
    ({"rtc_leftover": np.zeros((2, 4), np.float32)}, "4 values per action, the policy takes 6", "bad_rtc"),
    ({"rtc_leftover": np.full((2, 6), np.nan, np.float32)}, "not finite", "bad_rtc"),
    ({"rtc_leftover": np.zeros((9, 6), np.float32)}, "more than a chunk of 8", "bad_rtc"),
])
def test_openpi_a_bad_rtc_field_is_refused_in_one_line_counted_and_costs_no_one_else(exec_, says, code):
    srv = openpi_server(control_hz=1.0)
    try:
        bad = openpi_client.WebsocketClientPolicy("127.0.0.1", srv.port)
        good = openpi_client.WebsocketClientPolicy("127.0.0.1", srv.port)
        bad.infer({"observation/state": STATE})
        with pytest.raises(Exception) as e:
            bad.infer(_exec(**exec_))
        good.infer(_exec(rtc=True))
        served = good.infer({"observation/state": STATE})
        errors = srv.stats()["core"]["errors"]
    finally:
        srv.stop()
    assert says in str(e.value).splitlines()[-1], str(e.value)  # the server's one line, after the client's prefix
    assert errors.get(code) == 1
    assert served["robotserve"]["rtc_delay_steps"] >= 1


def test_lerobot_leftover_rebuilt_from_the_sessions_timestep():
    pytest.importorskip("grpc")
    pytest.importorskip("lerobot")
    from test_lerobot_compat import Client, timed_obs

    from robotserve_ros.transport.lerobot.config import CompatConfig
    from robotserve_ros.transport.lerobot.protocol import LeRobotCompatServer

    cfg = CompatConfig(port=0, engine="simulated", engine_params={"chunk_size": 8}, profile_ms={1: 5.0, 4: 8.0},
                       get_actions_timeout_s=1.0, policy_dirs=("/policies",), rtc=True)
    srv = LeRobotCompatServer(cfg)
    try:
        a = Client(srv.port)
        a.start()  # 4 actions per chunk
        t0 = time.time()
        a.send(timed_obs(0, stamp=t0))
        first = a.actions()
        assert [x.timestep for x in first] == [0, 1, 2, 3]
        a.send(timed_obs(2, q=np.ones(6), stamp=t0 + 2 / 30))  # two of its four actions ran
        second = a.actions()
        core = next(iter(srv.servicer.groups.values())).core
        (reply,) = core.last_reply.values()
        d = reply.rtc_delay_steps
        assert d is not None and 1 <= d <= 2, d  # at most the 2-row leftover (timesteps 2 and 3)
        rows = np.stack([x.action.numpy() for x in second])
        left = np.stack([x.action.numpy() for x in first])[2:]
        np.testing.assert_array_equal(rows[:d], left[:d])
        a.close()
    finally:
        srv.stop(0)


def _lerobot_server(rtc=False):
    pytest.importorskip("grpc")
    pytest.importorskip("lerobot")
    from robotserve_ros.transport.lerobot.config import CompatConfig
    from robotserve_ros.transport.lerobot.protocol import LeRobotCompatServer

    return LeRobotCompatServer(CompatConfig(port=0, engine="simulated", engine_params={"chunk_size": 8},
                                            profile_ms={1: 5.0, 4: 8.0}, get_actions_timeout_s=1.0,
                                            policy_dirs=("/policies",), rtc=rtc))


def _lerobot_rounds(client, rtc=None) -> tuple:
    """Ready, the policy setup (with the robotserve-rtc header when rtc is given), then two rounds, the
    second sent once two of the first chunk's four actions ran: (first rows, second rows)."""
    from test_lerobot_compat import pb, policy_setup, timed_obs

    from robotserve_ros.transport.lerobot.clients import RTC_HEADER

    client.stub.Ready(pb.Empty())
    client.stub.SendPolicyInstructions(policy_setup(), metadata=[] if rtc is None else [(RTC_HEADER, rtc)])
    t0 = time.time()
    client.send(timed_obs(0, stamp=t0))
    first = client.actions()
    client.send(timed_obs(2, q=np.ones(6), stamp=t0 + 2 / 30))
    second = client.actions()
    return (np.stack([x.action.numpy() for x in first]), np.stack([x.action.numpy() for x in second]))


def test_lerobot_rtc_is_a_per_session_option_an_unchanged_client_leaves_off():
    from test_lerobot_compat import Client

    srv = _lerobot_server(rtc=False)
    try:
        on, plain = Client(srv.port), Client(srv.port)
        first, second = _lerobot_rounds(on, "on")
        _lerobot_rounds(plain)  # LeRobot's own client: no header, the server's rtc (off)
        core = next(iter(srv.servicer.groups.values())).core
        tasks = {c.rtc: c.task_id for c in srv.servicer.clients.values()}
        guided, unguided = core.last_reply[tasks[True]], core.last_reply[tasks[False]]
        on.close()
        plain.close()
    finally:
        srv.stop(0)
    d = guided.rtc_delay_steps
    assert d is not None and 1 <= d <= 2, d  # at most the 2-row leftover (timesteps 2 and 3)
    np.testing.assert_array_equal(second[:d], first[2:][:d])
    assert unguided.rtc_delay_steps is None


def test_lerobot_a_bad_rtc_header_is_refused_naming_it_counted_and_costs_no_one_else():
    import grpc
    from test_lerobot_compat import Client

    srv = _lerobot_server(rtc=False)
    try:
        bad, good = Client(srv.port), Client(srv.port)
        with pytest.raises(grpc.RpcError) as e:
            _lerobot_rounds(bad, "maybe")
        first, second = _lerobot_rounds(good, "on")
        errors = srv.servicer.stats()["protocol_errors"]
        bad.close()
        good.close()
    finally:
        srv.stop(0)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "robotserve-rtc must be one of on, off" in e.value.details() and "maybe" in e.value.details()
    assert errors.get("bad_rtc") == 1
    assert len(second) == 4 and np.array_equal(second[:1], first[2:3])  # the good one is served, guided


def test_the_guide_travels_to_a_remote_gpu_tier_and_its_d_comes_back():
    pytest.importorskip("grpc")
    from robotserve_ros.core import EngineProfile
    from robotserve_ros.core.observation import Observation
    from robotserve_ros.core.rtc import RtcGuide
    from robotserve_ros.core.types import InferenceRequest
    from robotserve_ros.engines.simulated import SimulatedEngine
    from robotserve_ros.transport.gpu_server import GpuServer
    from robotserve_ros.transport.remote_engine import RemoteEngine

    eng = SimulatedEngine(EngineProfile({1: 1.0}), chunk_size=8, action_dim=3)
    left = np.arange(15, dtype=np.float32).reshape(5, 3)
    o = Observation(joints=np.zeros(3, np.float32))
    with GpuServer(eng, "127.0.0.1:0") as srv:
        remote = RemoteEngine(address=srv.address, ping_interval_s=0)
        try:
            got, plain = remote.infer([InferenceRequest("r/t", 1, observation=o, rtc=RtcGuide(left, 2)),
                                       InferenceRequest("r/u", 1, observation=o)])
            with pytest.raises(Exception) as e:  # the wrong width is refused alone, naming the field
                remote.infer([InferenceRequest("r/v", 1, observation=o, rtc=RtcGuide(np.zeros((2, 4), np.float32), 1))])
        finally:
            remote.close()
    assert got.rtc_delay_steps == 2 and plain.rtc_delay_steps is None
    np.testing.assert_array_equal(got.actions[:2], left[:2])
    assert "rtc_leftover" in str(e.value) and "4 values per action" in str(e.value)
