"""`robotserve record-dataset BAG --out DIR`: a recorded session (rosbag2, as bag_recorder
writes it) as a LeRobot dataset (LeRobot 0.4.x, format v3.0) that
`LeRobotDataset(repo_id, root=DIR)` loads offline: fleet runs become training data.

Per robot namespace NS (the only one in the bag, or --robot):
  NS/camera/image_raw   sensor_msgs/Image or CompressedImage -> observation.images.camera
  NS/joint_states       sensor_msgs/JointState (position)   -> observation.state (names: joint names)
  NS/command            trajectory_msgs/JointTrajectory (first point) or
                        std_msgs/Float64MultiArray           -> action
  NS/instruction        std_msgs/String (optional)           -> task (else --task)

LeRobot datasets are sampled at one fps; a bag is not. Frames are taken on a grid of 1/fps
from the first moment camera, joints and command have all been seen, each topic holding
its latest message (zero-order hold), as rosetta's bag converter does. A new instruction
starts a new episode. Images are stored as PNG frames (no video encoder needed)."""
from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from ... import bags
from ...cli_types import UsageError, positive

IMAGE_TYPES = (bags.IMAGE, bags.COMPRESSED_IMAGE)
COMMAND_TYPES = ("trajectory_msgs/msg/JointTrajectory", "std_msgs/msg/Float64MultiArray")
STRING = "std_msgs/msg/String"


def session_topics(topics: dict, robot: Optional[str]) -> dict:
    """{'camera', 'joints', 'command', 'instruction'} -> topic of one robot of the bag."""
    robots = sorted(t.rsplit("/joint_states", 1)[0] for t, (mt, _) in topics.items()
                    if t.endswith("/joint_states") and mt == bags.JOINT_STATE)
    if robot is not None:
        ns = "/" + robot.strip("/") if robot.strip("/") else ""
        if ns not in robots:
            raise UsageError(f"--robot {robot!r}: the bag has no {ns}/joint_states (robots in it: "
                             f"{', '.join(r or '/' for r in robots) or 'none'})")
    elif len(robots) == 1:
        ns = robots[0]
    else:
        raise UsageError(f"the bag has {'no' if not robots else 'several'} robots' joint_states "
                         f"({', '.join(r or '/' for r in robots) or 'none'}): name one with --robot")
    want = {"camera": (f"{ns}/camera/image_raw", IMAGE_TYPES), "joints": (f"{ns}/joint_states", (bags.JOINT_STATE,)),
            "command": (f"{ns}/command", COMMAND_TYPES), "instruction": (f"{ns}/instruction", (STRING,))}
    out = {}
    for role, (topic, types) in want.items():
        if topic in topics and topics[topic][0] in types:
            out[role] = topic
        elif role != "instruction":
            raise UsageError(f"the bag has no {topic} ({' or '.join(types)}): record it (bag_recorder topics)")
    return out


def image_array(msg, msgtype: str) -> np.ndarray:
    """HxWx3 uint8 RGB of a sensor_msgs Image (rgb8, bgr8, mono8) or CompressedImage."""
    if msgtype == bags.COMPRESSED_IMAGE:
        from PIL import Image

        return np.asarray(Image.open(io.BytesIO(bytes(msg.data))).convert("RGB"))
    channels = {"rgb8": 3, "bgr8": 3, "mono8": 1}.get(msg.encoding)
    if channels is None:
        raise UsageError(f"camera image encoding {msg.encoding!r} is not one of rgb8, bgr8, mono8")
    rows = np.frombuffer(bytes(msg.data), np.uint8).reshape(msg.height, msg.step)
    img = rows[:, : msg.width * channels].reshape(msg.height, msg.width, channels)
    return np.repeat(img, 3, axis=2) if channels == 1 else img[..., ::-1] if msg.encoding == "bgr8" else img


def command_vector(msg, msgtype: str) -> tuple[np.ndarray, list]:
    """(positions, joint names or []) of a command: a JointTrajectory's first point, or the array."""
    if msgtype == COMMAND_TYPES[0]:
        if not len(msg.points):
            return np.zeros(0, np.float32), list(msg.joint_names)
        return np.asarray(msg.points[0].positions, np.float32), list(msg.joint_names)
    return np.asarray(msg.data, np.float32), []


def sample(messages, roles: dict, fps: float):
    """Frames (t_ns, {role: latest message}) on a 1/fps grid from when camera, joints and
    command have all been seen; each topic holds its latest message (zero-order hold)."""
    role_of = {t: r for r, t in roles.items()}
    latest: dict = {}
    step = int(round(1e9 / fps))
    next_t = last = None
    for m in messages:
        last = m.timestamp
        while next_t is not None and m.timestamp > next_t:  # every grid point before this message
            yield next_t, dict(latest)
            next_t += step
        latest[role_of[m.topic]] = (m.msgtype, m.data)
        if next_t is None and {"camera", "joints", "command"} <= set(latest):
            next_t = m.timestamp
    while next_t is not None and next_t <= last:  # the grid points up to the last message, none after it
        yield next_t, dict(latest)
        next_t += step


def record_dataset(bag: str, out: str, repo_id: str, *, robot: Optional[str] = None, fps: int = 15,
                   task: Optional[str] = None, robot_type: Optional[str] = None) -> dict:
    """Write the dataset; returns a summary (episodes, frames, features, topics)."""
    try:
        topics = bags.bag_topics(bag)
    except bags.BagError as e:
        raise UsageError(str(e)) from None
    roles = session_topics(topics, robot)
    if "instruction" not in roles and not task:
        raise UsageError(f"the bag has no {roles['joints'].rsplit('/', 1)[0]}/instruction (std_msgs/String): "
                         "give the task with --task TEXT")
    frames = []
    for t, latest in sample(bags.iter_bag(bag, list(roles.values())), roles, fps):
        state_msg = latest["joints"][1]
        action, action_names = command_vector(*latest["command"][::-1])
        instruction = latest["instruction"][1].data if "instruction" in latest else task
        frames.append((t, image_array(latest["camera"][1], latest["camera"][0]),
                       np.asarray(state_msg.position, np.float32), list(state_msg.name), action, action_names,
                       instruction))
    if not frames:
        raise UsageError(f"{bag}: no moment where camera, joints and command had all been recorded")
    _, img, state, state_names, action, action_names, _ = frames[0]
    if any(f[2].shape != state.shape or f[4].shape != action.shape or f[1].shape != img.shape for f in frames):
        raise UsageError(f"{bag}: the joint count, command length or image size changes during the session")
    features = {
        "observation.images.camera": {"dtype": "image", "shape": img.shape, "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": state.shape,
                              "names": state_names or [f"joint_{i}" for i in range(len(state))]},
        "action": {"dtype": "float32", "shape": action.shape,
                   "names": action_names or state_names[: len(action)] or [f"joint_{i}" for i in range(len(action))]},
    }
    if len(features["action"]["names"]) != len(action):
        features["action"]["names"] = [f"joint_{i}" for i in range(len(action))]

    from ...engines.torch_env import import_torch

    import_torch()  # torchvision's CPU shim before LeRobot imports it (docs/building.md)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset.create(repo_id, fps, features, root=out, robot_type=robot_type, use_videos=False)
    episodes, current = 0, None
    for _, img, st, _, act, _, instruction in frames:
        if current is not None and instruction != current:
            ds.save_episode()
            episodes += 1
        current = instruction
        ds.add_frame({"observation.images.camera": img, "observation.state": st, "action": act, "task": instruction})
    ds.save_episode()
    ds.finalize()
    return {"repo_id": repo_id, "root": str(out), "episodes": episodes + 1, "frames": len(frames), "fps": fps,
            "topics": roles, "features": {k: list(v["shape"]) for k, v in features.items()}}


def add_arguments(p) -> None:
    p.add_argument("bag", help="a rosbag2 directory (MCAP or sqlite3), e.g. from bag_recorder")
    p.add_argument("--out", required=True, help="dataset root to create (must not exist)")
    p.add_argument("--repo-id", default=None, help="the dataset's repo_id (default local/<bag name>)")
    p.add_argument("--robot", help="the robot namespace to take (default: the only one in the bag)")
    p.add_argument("--fps", type=positive(int), default=15, help="frames per second of the dataset")
    p.add_argument("--task", help="the instruction, when the bag has no <robot>/instruction topic")
    p.add_argument("--robot-type", help="robot_type of the dataset's metadata, e.g. so101")


def cli(a) -> int:
    if not Path(a.bag).is_dir():
        raise UsageError(f"bag {a.bag!r}: no such bag directory")
    if Path(a.out).exists():
        if not a.force:
            raise UsageError(f"--out {a.out!r} exists already; give a new folder, or add --force to write over it")
        import shutil

        shutil.rmtree(a.out)  # LeRobot writes a dataset into a folder that is not there yet
    repo_id = a.repo_id or f"local/{Path(a.bag).resolve().name}"
    res = record_dataset(a.bag, a.out, repo_id, robot=a.robot, fps=a.fps, task=a.task, robot_type=a.robot_type)
    print(f"wrote {res['frames']} frames in {res['episodes']} episode(s) to {res['root']} (repo_id {repo_id}); "
          f"from {', '.join(res['topics'].values())}", file=sys.stdout)
    return 0
