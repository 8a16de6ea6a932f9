"""`robotserve record-dataset BAG --out DIR` (issue 27, item 8): a session bag (camera,
joints, commands, instruction, as bag_recorder records them) becomes a LeRobot dataset that
`LeRobotDataset(repo_id, root=DIR)` (LeRobot 0.4.4) loads offline."""
from __future__ import annotations

import numpy as np
import pytest

from robotserve_ros import bags
from robotserve_ros.cli import main

FPS, SIDE, T0 = 10, 32, 1_700_000_000 * 10**9
JOINTS = [f"joint_{k}" for k in range(6)]
ARM = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"]


def session(ts, ns="/robot_0", seconds=2.0, instructions=("pick up the cube", "put it in the box")):
    """A session: camera 15 Hz (rgb8; pixel value = frame index), joints 30 Hz, a JointTrajectory
    command 30 Hz (joint names in another order than joint_states), one instruction per half."""
    T = ts.types
    Time, Header = T["builtin_interfaces/msg/Time"], T["std_msgs/msg/Header"]
    Duration = T["builtin_interfaces/msg/Duration"]

    def header(t):
        return Header(stamp=Time(sec=t // 10**9, nanosec=t % 10**9), frame_id="")

    out = []
    for k, text in enumerate(instructions):
        t = T0 + int(k * seconds / len(instructions) * 1e9)
        out.append((f"{ns}/instruction", t, T["std_msgs/msg/String"](data=text)))
    for i in range(int(15 * seconds)):
        t = T0 + int(i * 1e9 / 15) + 5
        out.append((f"{ns}/camera/image_raw", t, T[bags.IMAGE](
            header=header(t), height=SIDE, width=SIDE, encoding="rgb8", is_bigendian=0, step=3 * SIDE,
            data=np.full(SIDE * SIDE * 3, i, np.uint8))))
    for i in range(int(30 * seconds)):
        t = T0 + int(i * 1e9 / 30) + 7
        out.append((f"{ns}/joint_states", t, T[bags.JOINT_STATE](
            header=header(t), name=JOINTS, position=np.arange(6.0) + i, velocity=np.zeros(0), effort=np.zeros(0))))
        point = T["trajectory_msgs/msg/JointTrajectoryPoint"](
            positions=np.arange(6.0) * 0.1 + i, velocities=np.zeros(0), accelerations=np.zeros(0), effort=np.zeros(0),
            time_from_start=Duration(sec=0, nanosec=33_000_000))
        out.append((f"{ns}/command", t + 3, T["trajectory_msgs/msg/JointTrajectory"](
            header=header(t), joint_names=ARM, points=[point])))
    return sorted(out, key=lambda m: m[1])


@pytest.fixture
def bag(tmp_path):
    ts = bags.make_typestore()
    return bags.write_bag(tmp_path / "session", session(ts), typestore=ts)


def test_a_session_bag_loads_as_a_lerobot_dataset(bag, tmp_path, capsys, monkeypatch):
    pytest.importorskip("lerobot")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # loads from DIR alone
    out = tmp_path / "ds"
    assert main(["record-dataset", str(bag), "--out", str(out), "--repo-id", "fleet/session", "--fps", str(FPS),
                 "--robot-type", "so101"]) == 0
    assert "2 episode(s)" in capsys.readouterr().out

    from robotserve_ros.engines.torch_env import import_torch

    import_torch()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("fleet/session", root=out)  # offline: root given, nothing fetched
    assert ds.meta.fps == FPS and ds.meta.total_episodes == 2 and ds.meta.robot_type == "so101"
    assert ds.meta.features["observation.state"]["names"] == JOINTS
    assert ds.meta.features["action"]["names"] == ARM  # the command's own joint names
    # the grid starts when camera, joints and command are all seen (T0 + ~10 ms) and holds 2 s at 10 fps
    assert 18 <= len(ds) <= 20
    tasks = {ds[i]["task"] for i in range(len(ds))}
    assert tasks == {"pick up the cube", "put it in the box"}
    f = ds[5]
    assert f["observation.images.camera"].shape == (3, SIDE, SIDE)  # LeRobot's channel-first float image
    # frame 5 at 0.5 s after the start: camera frame ~7 (15 Hz), joints ~15 (30 Hz), a command of the same tick
    state, action = f["observation.state"].numpy(), f["action"].numpy()
    assert np.allclose(state - state[0], np.arange(6.0)) and 13 <= state[0] <= 16
    assert np.allclose(action - action[0], np.arange(6) * 0.1, atol=1e-5) and abs(action[0] - state[0]) <= 1
    pixel = float(f["observation.images.camera"][0, 0, 0]) * 255
    assert 6 <= round(pixel) <= 8
    assert float(ds[1]["timestamp"]) == pytest.approx(1 / FPS)


def test_an_unknown_robot_is_one_line(bag, tmp_path, capsys):
    assert main(["record-dataset", str(bag), "--out", str(tmp_path / "ds"), "--robot", "robot_9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "robot_9" in err[0] and "/robot_0" in err[0] and not (tmp_path / "ds").exists()


def test_a_bag_without_instruction_needs_task(tmp_path, capsys):
    ts = bags.make_typestore()
    bag = bags.write_bag(tmp_path / "b", session(ts, instructions=()), typestore=ts)
    assert main(["record-dataset", str(bag), "--out", str(tmp_path / "ds")]) == 2
    assert "--task" in capsys.readouterr().err
    out = tmp_path / "existing"
    out.mkdir()
    assert main(["record-dataset", str(bag), "--out", str(out), "--task", "x"]) == 2
    assert "exists" in capsys.readouterr().err
