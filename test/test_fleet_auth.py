"""Message-bound task auth on serve.Fleet (pure Python, fake engine): every protocol gets it.
A forged body, a replay, a different body under a used stamp, a task squatted in another
robot's namespace or opened by another session are refused with `not_task_owner`, counted,
and the robot they aimed at keeps being served."""
from __future__ import annotations

import pytest

from robotserve_ros.core.types import ExecInfo, HorizonChoice, InferenceRequest
from robotserve_ros.core.task_auth import NotTaskOwner, TaskBinder, body_mac, key_file_name, new_key
from robotserve_ros.serve import Proof
from test_serve_fleet import code_of, fleet_of  # noqa: F401  (fleet_of: the fixture)


def req(task: str, rnd: int) -> InferenceRequest:
    info = ExecInfo(0.0, 0, 10.0) if rnd else None  # rounds after the first carry exec info
    return InferenceRequest(task, rnd, info, HorizonChoice("static", 4.0))


@pytest.fixture
def keys(tmp_path):
    made = {r: new_key() for r in ("/arm1", "/arm2")}
    for r, k in made.items():
        (tmp_path / key_file_name(r)).write_bytes(k)
    return tmp_path, made


class Robot:
    """A robot signing its messages: the body stands for the protocol's serialized message."""

    def __init__(self, fleet, name: str, key: bytes) -> None:
        self.fleet, self.name, self.key = fleet, name, key
        self.session = fleet.session("ros", name)

    def proof(self, kind: str, *fields, stamp_ns=None) -> Proof:
        stamp = stamp_ns if stamp_ns is not None else int(self.fleet.clock.now() * 1e9)
        body = repr((stamp,) + fields).encode()
        return Proof(stamp, body_mac(self.key, kind, body), body, kind)

    def submit(self, task: str, rnd: int, proof=None):
        return self.session.submit(req(task, rnd), proof or self.proof("infer", task, rnd))


def served(fut) -> bool:
    return fut.result(10).task_id is not None


def test_forged_replayed_and_squatted_messages_are_refused_and_the_robot_is_served(fleet_of, keys):
    folder, k = keys
    fleet, eng = fleet_of(binder=TaskBinder(str(folder), max_skew_s=30.0))
    eng.open.set()
    arm1, arm2 = Robot(fleet, "/arm1", k["/arm1"]), Robot(fleet, "/arm2", k["/arm2"])
    first = arm1.proof("infer", "arm1/task0", 0)
    assert served(arm1.submit("arm1/task0", 0, first))
    p_old = arm1.proof("progress", "arm1/task0", "done=False", stamp_ns=int(fleet.clock.now() * 1e9) - 1000)
    p = arm1.proof("progress", "arm1/task0", "done=False")
    fleet.check_owner("arm1/task0", "/arm1", p)  # its own progress: accepted

    # Forged: the robot's own signed progress with task_done flipped, re-published.
    forged = Proof(p.stamp_ns, p.mac, p.body.replace(b"done=False", b"done=True"), "progress")
    # Replayed: an older message of its own; a different body under a used stamp.
    other = Proof(p.stamp_ns, body_mac(k["/arm1"], "progress", b"x"), b"x", "progress")
    for bad, why in ((forged, "does not verify"), (p_old, "replayed progress"), (other, "different progress")):
        with pytest.raises(NotTaskOwner, match=why):
            fleet.check_owner("arm1/task0", "/arm1", bad)
    fleet.check_owner("arm1/task0", "/arm1", p)  # the same message re-sent: idempotent

    # Squatting: arm2 with its own valid key claims arm1's next task, or arm1's open one.
    assert code_of(arm2.submit("arm1/task1", 0)) == "not_task_owner"
    assert code_of(arm2.submit("arm1/task0", 1)) == "not_task_owner"
    # A request whose body was changed under arm1's MAC, and an old request replayed.
    good = arm1.proof("infer", "arm1/task0", 1)
    changed = Proof(good.stamp_ns, good.mac, good.body + b"!", "infer")
    assert code_of(arm1.submit("arm1/task0", 1, changed)) == "not_task_owner"
    assert served(arm1.submit("arm1/task0", 1, good))
    assert served(arm1.submit("arm1/task0", 1, good))  # robots re-send by design: answered, not refused
    assert code_of(arm1.submit("arm1/task0", 2, first)) == "not_task_owner"  # round 0's request replayed

    # Nothing refused touched arm1's tasks: it opens its next task and keeps being served.
    assert served(arm1.submit("arm1/task0", 2)) and served(arm1.submit("arm1/task1", 0))
    assert served(arm2.submit("arm2/task0", 0))
    assert fleet.core_stats()["errors"]["not_task_owner"] == 4
    assert fleet.protocol_stats()["ros"]["refused:not_task_owner"] == 4
    assert fleet.core.stats.last_error["not_task_owner"].startswith("replayed infer")  # what `status` shows


def test_a_refused_first_request_opens_nothing(fleet_of, keys):
    folder, k = keys
    fleet, eng = fleet_of(binder=TaskBinder(str(folder), max_skew_s=30.0), max_waiting=1)
    arm1, arm2 = Robot(fleet, "/arm1", k["/arm1"]), Robot(fleet, "/arm2", k["/arm2"])
    held = arm2.submit("arm2/task0", 0)  # the gate is shut: the one waiting slot is taken
    assert code_of(arm1.submit("arm1/task0", 0)) == "overloaded"
    assert "arm1/task0" not in fleet.binder.owner
    eng.open.set()
    assert served(held) and served(arm1.submit("arm1/task0", 0))


def test_without_keys_a_task_still_belongs_to_the_session_that_opened_it(fleet_of):
    """Every protocol: an openpi connection's task cannot be fed or taken through another
    protocol's session, nor by another robot name of the same protocol."""
    fleet, eng = fleet_of()
    eng.open.set()
    conn = fleet.session("openpi", "10.0.0.1:5000")
    assert served(conn.submit(req("openpi/10.0.0.1:5000#1", 0)))
    for s in (fleet.session("ros", "/x"), fleet.session("openpi", "10.0.0.2:6000")):
        assert code_of(s.submit(req("openpi/10.0.0.1:5000#1", 1))) == "not_task_owner"
    assert served(conn.submit(req("openpi/10.0.0.1:5000#1", 1)))
    assert fleet.protocol_stats()["ros"]["refused:not_task_owner"] == 1
