"""The engine core in its own process, pure Python: serve/wire.py's messages, and a
CoreServer (serve/core_process.py) fed by a RemoteFleet (serve/remote.py) over ZMQ."""
from __future__ import annotations

import hashlib
import json
import threading

import msgspec
import numpy as np
import pytest
import zmq

from robotserve_ros.core.clock import WallClock
from robotserve_ros.core.observation import Observation
from robotserve_ros.core.rtc import RtcGuide
from robotserve_ros.core.schedulers import make_scheduler
from robotserve_ros.core.types import ChunkReply, ExecInfo, HorizonChoice, InferenceRequest
from robotserve_ros.serve import Refused, fleet_over, wire
from robotserve_ros.serve.core_process import CoreServer
from robotserve_ros.serve.remote import RemoteFleet

from test_serve_fleet import Gate


def full_request(task="t", rnd=0, max_age=0.5) -> InferenceRequest:
    obs = Observation([np.arange(12, dtype=np.uint8).reshape(2, 2, 3)], np.array([0.5, -1.0]), "pick", 7, 12.5)
    return InferenceRequest(task, rnd, ExecInfo(10.0, 3, 30.0), HorizonChoice("static", 4.0), obs, obs_stamp=12.5,
                            remaining_rounds=4, task_type="k", rtc=RtcGuide(np.ones((2, 3), np.float32), 1),
                            max_obs_age_s=max_age)


def test_a_request_and_a_chunk_cross_the_wire_unchanged():
    r = full_request()
    back = wire.request_in(wire.decode_to_core(wire.encode(wire.Submit(1, "/r", wire.request_out(r)))).req)
    assert (back.task_id, back.round_id, back.exec_info, back.horizon) == (r.task_id, r.round_id, r.exec_info, r.horizon)
    assert np.array_equal(back.observation.images[0], r.observation.images[0])
    assert back.observation.images[0].dtype == np.uint8 and back.observation.joints.tolist() == [0.5, -1.0]
    assert (back.observation.instruction, back.observation.timestep, back.obs_stamp) == ("pick", 7, 12.5)
    assert np.array_equal(back.rtc.leftover, r.rtc.leftover) and back.rtc.delay_steps == 1
    assert (back.remaining_rounds, back.task_type, back.max_obs_age_s) == (4, "k", 0.5)
    c = ChunkReply("t", 3, np.arange(6, dtype=np.float32).reshape(3, 2), 3, "static", 8, "edge", 1.5, None)
    c2 = wire.chunk_in(wire.decode_to_front(wire.encode(wire.Reply(1, wire.chunk_out(c)))).chunk)
    assert np.array_equal(c2.actions, c.actions) and (c2.horizon, c2.tier, c2.reason) == (3, "edge", "static")


@pytest.mark.parametrize("bad", [wire.Arr("|O", [1], b"\0" * 8), wire.Arr("<f4", [3], b"\0" * 8),
                                 wire.Arr("nonsense", [1], b"\0"), wire.Arr("<f4", [-1], b"")])
def test_an_array_that_is_not_plain_numbers_is_refused(bad):
    with pytest.raises(wire.BadWire):
        wire.from_arr(bad)


def test_a_message_that_is_not_ours_does_not_decode():
    with pytest.raises(wire.DecodeError):
        wire.decode_to_core(b"\x93garbage")
    with pytest.raises(wire.DecodeError):  # a known tag with a wrong field type
        wire.decode_to_core(msgspec.msgpack.encode({"type": "Submit", "id": "x", "robot": 1, "req": []}))


@pytest.fixture
def served(tmp_path):
    """A CoreServer on a fake engine's fleet in this process, a RemoteFleet attached to it."""
    tree = {"engine_process": "separate"}
    eng = Gate()
    eng.open.set()
    fleet = fleet_over(eng, make_scheduler("fifo"), WallClock()).start()
    addr = f"ipc://{tmp_path}/core.sock"
    fp = hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()
    ctx = zmq.Context()
    srv = CoreServer(fleet, addr, fp, {"spec": None}, ctx=ctx)
    th = threading.Thread(target=srv.serve, daemon=True)
    th.start()
    lines = []
    remote = RemoteFleet(tree, addr, lambda level, line: lines.append((level, line)))
    yield srv, remote, lines
    remote.close()
    th.join(5)
    fleet.close()
    srv.close()  # its socket closed before its context goes: a context collected with a socket open blocks
    ctx.term()


def test_rounds_go_through_the_core_server_and_come_back(served):
    srv, remote, lines = served
    assert any("attached" in line for _, line in lines)  # it was serving: attached, nothing started
    reply = remote.session("ros", "/r1").submit(full_request("a", max_age=None)).result(timeout=10)
    assert reply.task_id == "a" and reply.actions.shape == (4, 2)  # static h=4 of the engine's 8x2
    assert remote.knows("a") and remote.tasks() == ["a"]
    again = remote.session("ros", "/r2").submit(full_request("a", 1, None))  # another robot's task
    with pytest.raises(Refused) as e:
        again.result(timeout=10)
    assert e.value.code == "not_task_owner"
    st = remote.load_stats(None, {})
    assert st["served"] == 1 and st["protocols"]["ros"] == {"submitted": 1, "served": 1, "refused:not_task_owner": 1} and st["engine_process"] == "separate"


def test_bad_ipc_input_is_refused_and_counted_not_fatal(served):
    srv, remote, _ = served
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(srv.address)
    s.send(b"not msgpack at all")
    bad = wire.Submit(5, "/x", wire.request_out(full_request("b")))
    bad.req.observation.joints.dtype = "|O"  # an object array: never decoded
    s.send(wire.encode(bad))
    m = wire.decode_to_front(s.recv())
    assert isinstance(m, wire.Reply) and m.id == 5 and m.code == "bad_request"
    s.close(0)
    ctx.term()
    assert remote.session("ros", "/r").submit(full_request("c", max_age=None)).result(timeout=10).task_id == "c"
    st = remote.load_stats(None, {})
    assert st["ipc_refused"] == 2 and st["errors"]["bad_request"] == 2


def test_the_core_refreshes_a_stale_observation_through_its_front_end(served):
    """Seed 000 Algorithm 1 lines 20-21 across the process line: the core asks the front end
    that sent the round, whose refresher (the robots' services) answers with a fresher one."""
    srv, remote, _ = served
    eng = srv.fleet.engine
    eng.open.clear()  # the round stays queued while the core asks
    asked = []

    def refresher(reqs):
        asked.extend((r.task_id, r.round_id) for r in reqs)
        return [(Observation([], np.array([9.0, 9.0]), "fresh", 8, 99.0), 99.0) for _ in reqs]

    remote.refresher = refresher
    fut = remote.session("ros", "/r").submit(full_request("s", max_age=None))
    assert remote.knows("s")
    got = srv.refresh([full_request("s", max_age=None), full_request("unknown", max_age=None)])
    assert asked == [("s", 0)]
    assert got[1] is None and got[0][1] == 99.0
    assert got[0][0].instruction == "fresh" and got[0][0].joints.tolist() == [9.0, 9.0]
    eng.open.set()
    assert fut.result(timeout=10).task_id == "s"
