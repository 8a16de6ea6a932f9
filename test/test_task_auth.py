"""core/task_auth.py without ROS: a MAC over the whole message binds a task to the robot that
opened it (in its own namespace); another robot's key, a changed byte, an old stamp, a replay,
a different body under a used stamp, a missing or short key are each refused."""
from __future__ import annotations

import pytest

from robotserve_ros.core.task_auth import (NotTaskOwner, TaskBinder, body_mac, in_namespace, key_file_name, new_key,
                                           read_key)

NOW = 1_000.0
NS = int(NOW * 1e9)


@pytest.fixture
def binder(tmp_path):
    for robot in ("/arm1", "/fleet/arm2"):
        (tmp_path / key_file_name(robot)).write_bytes(new_key())
    (tmp_path / key_file_name("/short")).write_bytes(b"abc\n")
    return TaskBinder(str(tmp_path), max_skew_s=5.0)


def check(binder, task, robot, body, seq=NS, kind="infer", bind=True, key_of=None):
    mac = body_mac(binder._key(key_of or robot), kind, body)
    return binder.check(task, robot, kind, seq, body, mac, NOW, bind=bind)


def test_the_robot_that_opens_a_task_owns_it(binder):
    assert check(binder, "arm1/t", "/arm1", b"round 0") is True  # opened now
    assert check(binder, "arm1/t", "/arm1", b"round 1", NS + 1) is False
    with pytest.raises(NotTaskOwner, match="belongs to another robot"):  # a keyed robot, not the owner
        check(binder, "arm1/t", "/fleet/arm2", b"round 1", NS + 2)
    binder.forget("arm1/t")  # the task ended: its name and sequence are free again
    assert check(binder, "arm1/t", "/arm1", b"round 0")


def test_a_robot_opens_tasks_only_in_its_own_namespace(binder):
    """Squatting: an enrolled robot signing another robot's next task id with its own key."""
    with pytest.raises(NotTaskOwner, match="opens tasks named 'fleet/arm2/...'"):
        check(binder, "arm1/task1", "/fleet/arm2", b"round 0")
    assert "arm1/task1" not in binder.owner
    assert check(binder, "fleet/arm2/task1", "/fleet/arm2", b"round 0")
    assert in_namespace("arm1/x", "/arm1") and not in_namespace("arm10/x", "/arm1")
    assert not in_namespace("arm1/", "/arm1") and not in_namespace("/x", "/")


def test_progress_needs_an_open_task(binder):
    with pytest.raises(NotTaskOwner, match="not open"):
        check(binder, "arm1/t", "/arm1", b"done", kind="progress", bind=False)


@pytest.mark.parametrize("what", ["body", "kind", "key", "empty", "old", "ahead", "unknown_robot", "short_key"])
def test_a_mac_that_does_not_fit_is_refused(binder, what):
    body = b"task arm1/t round 3 task_done=False"
    good = body_mac(binder._key("/arm1"), "infer", body)
    args = {"body": ("/arm1", "infer", NS, body.replace(b"False", b"True "), good),
            "kind": ("/arm1", "progress", NS, body, good),
            "key": ("/arm1", "infer", NS, body, body_mac(binder._key("/fleet/arm2"), "infer", body)),
            "empty": ("/arm1", "infer", NS, body, b""),
            "old": ("/arm1", "infer", NS - 6_000_000_000, body, good),
            "ahead": ("/arm1", "infer", NS + 6_000_000_000, body, good),
            "unknown_robot": ("/ghost", "infer", NS, body, good),
            "short_key": ("/short", "infer", NS, body, good)}[what]
    with pytest.raises(NotTaskOwner):
        binder.check("arm1/t", *args, NOW, bind=True)
    assert not binder.owner and not binder.seen


def test_replays_are_refused_and_an_identical_resend_is_not(binder):
    check(binder, "arm1/t", "/arm1", b"round 0")
    check(binder, "arm1/t", "/arm1", b"p1", NS + 10, kind="progress", bind=False)
    check(binder, "arm1/t", "/arm1", b"p2", NS + 20, kind="progress", bind=False)
    with pytest.raises(NotTaskOwner, match="replayed progress"):  # an eavesdropper re-publishing p1
        check(binder, "arm1/t", "/arm1", b"p1", NS + 10, kind="progress", bind=False)
    with pytest.raises(NotTaskOwner, match="different progress under a used auth stamp"):
        check(binder, "arm1/t", "/arm1", b"p2 done", NS + 20, kind="progress", bind=False)
    assert check(binder, "arm1/t", "/arm1", b"p2", NS + 20, kind="progress", bind=False) is False  # re-sent as is
    # kinds keep their own sequence: a request stamped before the last progress still goes
    assert check(binder, "arm1/t", "/arm1", b"round 1", NS + 5) is False
    with pytest.raises(NotTaskOwner, match="replayed infer"):
        check(binder, "arm1/t", "/arm1", b"round 0")


def test_the_kind_and_body_are_kept_apart():
    k = new_key()
    assert body_mac(k, "infer", b"x") != body_mac(k, "progress", b"x")
    assert body_mac(k, "a", b"bc") != body_mac(k, "ab", b"c")


def test_key_files(tmp_path):
    (tmp_path / "k").write_bytes(b"\n")
    with pytest.raises(ValueError, match="at least 16"):
        read_key(str(tmp_path / "k"))
    assert key_file_name("/fleet/arm2") == "fleet.arm2.key"
    with pytest.raises(ValueError, match="not a folder"):
        TaskBinder(str(tmp_path / "none"), 5.0)
