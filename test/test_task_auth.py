"""core/task_auth.py without ROS: the per-task MAC binds a task to its first robot; another
robot's key, a changed field, an old stamp, a missing or short key are each refused."""
from __future__ import annotations

import pytest

from robotserve_ros.core.task_auth import NotTaskOwner, TaskBinder, key_file_name, new_key, read_key, task_mac

NOW = 1_000.0


@pytest.fixture
def binder(tmp_path):
    for robot in ("/arm1", "/fleet/arm2"):
        (tmp_path / key_file_name(robot)).write_bytes(new_key())
    (tmp_path / key_file_name("/short")).write_bytes(b"abc\n")
    return TaskBinder(str(tmp_path), max_skew_s=5.0)


def mac(binder, robot, task, rnd, stamp_ns):
    return task_mac(binder._key(robot), task, rnd, stamp_ns)


def test_first_robot_owns_the_task(binder):
    ns = int(NOW * 1e9)
    assert binder.check("t", 0, "/arm1", ns, mac(binder, "/arm1", "t", 0, ns), NOW, bind=True) == "/arm1"
    assert binder.check("t", 1, "/arm1", ns, mac(binder, "/arm1", "t", 1, ns), NOW, bind=False) == "/arm1"
    with pytest.raises(NotTaskOwner, match="belongs to another robot"):  # a keyed robot, not the owner
        binder.check("t", 1, "/fleet/arm2", ns, mac(binder, "/fleet/arm2", "t", 1, ns), NOW, bind=False)
    binder.forget("t")  # the task ended: the name is free again
    assert binder.check("t", 0, "/fleet/arm2", ns, mac(binder, "/fleet/arm2", "t", 0, ns), NOW, bind=True)


@pytest.mark.parametrize("what", ["round", "task", "stamp", "key", "empty", "old", "unknown_robot", "short_key"])
def test_a_mac_that_does_not_fit_is_refused(binder, what):
    ns = int(NOW * 1e9)
    good = mac(binder, "/arm1", "t", 3, ns)
    args = {"round": ("t", 4, "/arm1", ns, good), "task": ("u", 3, "/arm1", ns, good),
            "stamp": ("t", 3, "/arm1", ns + 1, good),
            "key": ("t", 3, "/arm1", ns, mac(binder, "/fleet/arm2", "t", 3, ns)),
            "empty": ("t", 3, "/arm1", ns, b""),
            "old": ("t", 3, "/arm1", ns - 6_000_000_000, mac(binder, "/arm1", "t", 3, ns - 6_000_000_000)),
            "unknown_robot": ("t", 3, "/ghost", ns, good), "short_key": ("t", 3, "/short", ns, good)}[what]
    with pytest.raises(NotTaskOwner):
        binder.check(*args, NOW, bind=True)
    assert "t" not in binder.owner and "u" not in binder.owner


def test_length_prefix_keeps_fields_apart():
    k = new_key()
    assert task_mac(k, "a1", 2, 3) != task_mac(k, "a", 12, 3)


def test_key_files(tmp_path):
    (tmp_path / "k").write_bytes(b"\n")
    with pytest.raises(ValueError, match="at least 16"):
        read_key(str(tmp_path / "k"))
    assert key_file_name("/fleet/arm2") == "fleet.arm2.key"
    with pytest.raises(ValueError, match="not a folder"):
        TaskBinder(str(tmp_path / "none"), 5.0)
