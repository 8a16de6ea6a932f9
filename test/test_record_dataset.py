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


# --- a crafted bag is one line naming its topic and message, and leaves nothing behind ---------
def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header says width x height (a decompression bomb's header), with a tiny body."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def _exit_code(argv) -> int:
    """main()'s exit code, argparse's own refusals (SystemExit) included."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def _spoiled(ts, topic_suffix: str, k: int, make):
    """The session with message k of the topic ending in `topic_suffix` replaced by make(ts, msg)
    (a compressed frame: every camera frame is then sent compressed, one topic one type)."""
    msgs, seen = session(ts), -1
    out = []
    for topic, t, msg in msgs:
        if topic.endswith(topic_suffix):
            seen += 1
            if getattr(make, "compressed", False):
                msg = _compressed(_png(msg))(ts, msg)
            if seen == k:
                msg = make(ts, msg)
        out.append((topic, t, msg))
    return out


def _png(m) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.asarray(m.data, np.uint8).reshape(m.height, m.width, 3)).save(buf, "PNG")
    return buf.getvalue()


def _compressed(data: bytes, fmt: str = "png"):
    def make(ts, m):
        return ts.types[bags.COMPRESSED_IMAGE](header=m.header, format=fmt, data=np.frombuffer(data, np.uint8))
    make.compressed = True
    return make


def _image(**over):
    def make(ts, m):
        f = {k: getattr(m, k) for k in ("header", "height", "width", "encoding", "is_bigendian", "step", "data")}
        return ts.types[bags.IMAGE](**{**f, **over})
    return make


def _no_points(ts, m):
    return ts.types["trajectory_msgs/msg/JointTrajectory"](header=m.header, joint_names=m.joint_names, points=[])


def _nan_joints(ts, m):
    return ts.types[bags.JOINT_STATE](header=m.header, name=m.name, position=np.full(6, np.nan),
                                      velocity=np.zeros(0), effort=np.zeros(0))


CRAFTED = {  # name: (topic suffix, message index, replacement, what the line must say)
    "junk_cdr": ("/joint_states", 3, b"\x00\x01\x00\x00junk", "not a readable sensor_msgs/msg/JointState"),
    "decode_bomb": ("/camera/image_raw", 2, _compressed(_png_claiming(60000, 60000)), "refused undecoded"),
    "big_frame": ("/camera/image_raw", 2, _compressed(_png_claiming(5000, 5000)), "5000x5000"),
    "junk_compressed": ("/camera/image_raw", 1, _compressed(b"\x89PNG not really"), "not a readable image"),
    "short_data": ("/camera/image_raw", 4, _image(data=np.zeros(10, np.uint8)), "image geometry"),
    "step_too_small": ("/camera/image_raw", 0, _image(step=3), "image geometry"),
    "zero_size": ("/camera/image_raw", 5, _image(height=0, data=np.zeros(0, np.uint8)), "image geometry"),
    "encoding": ("/camera/image_raw", 3, _image(encoding="32FC1"), "'32FC1'"),
    "no_points": ("/command", 7, _no_points, "no points"),
    "nan_joints": ("/joint_states", 6, _nan_joints, "finite"),
}


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_a_malformed_bag_is_one_line_naming_topic_and_message_and_leaves_no_output(name, tmp_path, capsys):
    suffix, k, bad, said = CRAFTED[name]
    ts = bags.make_typestore()
    if isinstance(bad, bytes):  # raw CDR on the topic
        msgs, seen = [], -1
        for tp, t, m in session(ts):
            if tp.endswith(suffix):
                seen += 1
                m = bad if seen == k else m
            msgs.append((tp, t, m))
        bag = bags.write_bag(tmp_path / "b", msgs, typestore=ts, msgtypes={f"/robot_0{suffix}": bags.JOINT_STATE})
    else:
        bag = bags.write_bag(tmp_path / "b", _spoiled(ts, suffix, k, bad), typestore=ts)
    out = tmp_path / "out" / "ds"
    assert _exit_code(["record-dataset", str(bag), "--out", str(out), "--task", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"/robot_0{suffix} message {k}:" in err[0] and said in err[0], err[0]
    assert not out.exists() and not list(out.parent.glob("*"))  # no half-written folder, no scratch left


def test_a_session_that_changes_its_image_size_is_refused_whole(tmp_path, capsys):
    ts = bags.make_typestore()
    big = np.zeros(2 * SIDE * 2 * SIDE * 3, np.uint8)
    msgs, seen = [], -1
    for tp, t, m in session(ts):
        if tp.endswith("/camera/image_raw"):
            seen += 1
            if seen >= 20:
                m = _image(height=2 * SIDE, width=2 * SIDE, step=6 * SIDE, data=big)(ts, m)
        msgs.append((tp, t, m))
    bag = bags.write_bag(tmp_path / "b", msgs, typestore=ts)
    assert main(["record-dataset", str(bag), "--out", str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "image size changes" in err[0] and not (tmp_path / "ds").exists()


@pytest.mark.parametrize("fps", ["1e9", "1000000000", "0", "-3", "nan"])
def test_an_out_of_range_fps_is_one_line(bag, tmp_path, capsys, fps):
    assert _exit_code(["record-dataset", str(bag), "--out", str(tmp_path / "ds"), "--fps", fps]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fps" in err[0] and not (tmp_path / "ds").exists()


def test_each_camera_frame_is_decoded_once(bag, monkeypatch):
    """Zero-order hold repeats a frame on many grid points: it is converted once, not per point."""
    from robotserve_ros.transport.lerobot import dataset

    calls = []
    real = dataset.image_array
    monkeypatch.setattr(dataset, "image_array", lambda m, t: calls.append(1) or real(m, t))
    roles = dataset.session_topics(bags.bag_topics(bag), None)
    frames = list(dataset.sample(dataset.decoded(str(bag), roles, None), 100))  # 100 fps: frames repeat
    assert len(frames) > 150 and len(calls) == 30  # 30 camera messages in the 2 s session
