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
starts a new episode. Images are stored as PNG frames (no video encoder needed).

A bag is outside input: every message is decoded once, as it is read, and checked (image
geometry, a compressed frame's size read from its header before it is decoded, finite
joints, a command with a point); a bad one is one line naming its topic, its index on that
topic and what is wrong (exit 2). The dataset is written into a scratch folder beside --out
and renamed to it only when whole: a refused bag leaves nothing behind."""
from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from ... import bags
from ...cli_types import UsageError, positive

IMAGE_TYPES = (bags.IMAGE, bags.COMPRESSED_IMAGE)
MAX_FPS = 1000  # a dataset's frame rate; a grid finer than the bag's messages only repeats them
MAX_PIXELS = 4096 * 4096  # one camera frame, checked before it is decoded
MAX_FRAMES = 2_000_000  # dataset frames of one bag (duration x fps)
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


class BadMessage(ValueError):
    """One message of the bag that cannot be taken; the caller names its topic and index."""


def image_array(msg, msgtype: str) -> np.ndarray:
    """HxWx3 uint8 RGB of a sensor_msgs Image (rgb8, bgr8, mono8) or CompressedImage
    (BadMessage if its geometry does not hold or it is larger than MAX_PIXELS)."""
    if msgtype == bags.COMPRESSED_IMAGE:
        from PIL import Image

        try:
            im = Image.open(io.BytesIO(bytes(msg.data)))  # reads the header only
            w, h = im.size
            if w < 1 or h < 1 or w * h > MAX_PIXELS:
                raise BadMessage(f"a {w}x{h} frame ({msg.format!r}); at most {MAX_PIXELS} pixels are taken")
            return np.asarray(im.convert("RGB"))
        except BadMessage:
            raise
        except Image.DecompressionBombError:  # PIL's own header check, past twice its limit
            raise BadMessage(f"a frame of more than {MAX_PIXELS} pixels ({msg.format!r}): refused undecoded") from None
        except Exception as e:  # noqa: BLE001 - PIL's errors for junk are many kinds
            raise BadMessage(f"{len(msg.data)} bytes that are not a readable image ({type(e).__name__})") from None
    channels = {"rgb8": 3, "bgr8": 3, "mono8": 1}.get(msg.encoding)
    if channels is None:
        raise BadMessage(f"camera image encoding {msg.encoding!r} is not one of rgb8, bgr8, mono8")
    h, w, step, n = int(msg.height), int(msg.width), int(msg.step), len(msg.data)
    if h < 1 or w < 1 or h * w > MAX_PIXELS or step < w * channels or n != h * step:
        raise BadMessage(f"image geometry {w}x{h} {msg.encoding}, step {step}, {n} bytes of data "
                         f"(needs step >= {w * channels}, data = height x step, at most {MAX_PIXELS} pixels)")
    rows = np.frombuffer(bytes(msg.data), np.uint8).reshape(h, step)
    img = rows[:, : w * channels].reshape(h, w, channels)
    return np.repeat(img, 3, axis=2) if channels == 1 else img[..., ::-1] if msg.encoding == "bgr8" else img


def command_vector(msg, msgtype: str) -> tuple[np.ndarray, list]:
    """(positions, joint names or []) of a command: a JointTrajectory's first point, or the array."""
    if msgtype == COMMAND_TYPES[0]:
        if not len(msg.points):
            raise BadMessage("a JointTrajectory with no points (the action is its first point)")
        q, names = np.asarray(msg.points[0].positions, np.float32), list(msg.joint_names)
    else:
        q, names = np.asarray(msg.data, np.float32), []
    if q.ndim != 1 or not q.size or not np.all(np.isfinite(q)):
        raise BadMessage(f"command positions must be finite numbers, got {q.size} value(s)")
    return q, names


def joint_vector(msg) -> tuple[np.ndarray, list]:
    q = np.asarray(msg.position, np.float32)
    if not q.size or not np.all(np.isfinite(q)):
        raise BadMessage(f"joint positions must be finite numbers, got {q.size} value(s)")
    return q, list(msg.name)


def decoded(bag: str, roles: dict, task: Optional[str]):
    """The bag's messages of `roles`, each deserialized and converted once as it is read:
    (t_ns, role, value); UsageError naming the topic and the message's index on it."""
    ts = bags.make_typestore()
    index: dict = {}
    role_of = {t: r for r, t in roles.items()}
    try:
        for m in bags.iter_bag(bag, list(roles.values()), typestore=ts, raw=True):
            i = index[m.topic] = index.get(m.topic, -1) + 1
            role = role_of[m.topic]
            try:
                msg = ts.deserialize_cdr(m.data, m.msgtype)
                if role == "camera":
                    value = image_array(msg, m.msgtype)
                elif role == "joints":
                    value = joint_vector(msg)
                elif role == "command":
                    value = command_vector(msg, m.msgtype)
                else:
                    value = msg.data if isinstance(msg.data, str) else task
            except BadMessage as e:
                raise UsageError(f"{m.topic} message {i}: {e}") from None
            except Exception as e:  # noqa: BLE001 - junk CDR fails in many ways inside rosbags
                raise UsageError(f"{m.topic} message {i}: not a readable {m.msgtype} ({type(e).__name__})") from None
            yield m.timestamp, role, value
    except bags.BagError as e:
        raise UsageError(str(e)) from None


def sample(values, fps: float):
    """Frames (t_ns, {role: latest value}) on a 1/fps grid from when camera, joints and
    command have all been seen; each topic holds its latest value (zero-order hold).
    `values`: (t_ns, role, value) in time order, as decoded() gives them."""
    latest: dict = {}
    step = int(round(1e9 / fps))
    next_t = last = None
    for t, role, value in values:
        last = t
        while next_t is not None and t > next_t:  # every grid point before this message
            yield next_t, dict(latest)
            next_t += step
        latest[role] = value
        if next_t is None and {"camera", "joints", "command"} <= set(latest):
            next_t = t
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
    if not 0 < fps <= MAX_FPS:
        raise UsageError(f"--fps {fps!r}: must be a whole number from 1 to {MAX_FPS}")
    frames = []
    for t, latest in sample(decoded(bag, roles, task), fps):
        (state, state_names), (action, action_names) = latest["joints"], latest["command"]
        frames.append((t, latest["camera"], state, state_names, action, action_names, latest.get("instruction", task)))
        if len(frames) > MAX_FRAMES:
            raise UsageError(f"{bag}: more than {MAX_FRAMES} frames at --fps {fps}: give a lower --fps")
    if not frames:
        raise UsageError(f"{bag}: no moment where camera, joints and command had all been recorded")
    _, img, state, state_names, action, action_names, _ = frames[0]
    for t, *f in frames:
        if f[1].shape != state.shape or f[3].shape != action.shape or f[0].shape != img.shape:
            raise UsageError(f"{bag}: at {t} ns the joint count, command length or image size changes "
                             f"({f[1].shape[0]} joints, {f[3].shape[0]} commands, image {f[0].shape}; first "
                             f"{state.shape[0]}, {action.shape[0]}, {img.shape}): one session per bag")
    features = {
        "observation.images.camera": {"dtype": "image", "shape": img.shape, "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": state.shape,
                              "names": state_names or [f"joint_{i}" for i in range(len(state))]},
        "action": {"dtype": "float32", "shape": action.shape,
                   "names": action_names or state_names[: len(action)] or [f"joint_{i}" for i in range(len(action))]},
    }
    if len(features["action"]["names"]) != len(action):
        features["action"]["names"] = [f"joint_{i}" for i in range(len(action))]
    if len(features["observation.state"]["names"]) != len(state):
        features["observation.state"]["names"] = [f"joint_{i}" for i in range(len(state))]
    return _write(out, repo_id, fps, features, frames, robot_type, roles)


def _write(out: str, repo_id: str, fps: int, features: dict, frames: list, robot_type, roles) -> dict:
    """The dataset, written whole into a scratch folder beside `out`, then renamed to it."""
    import shutil
    import tempfile

    from ...engines.torch_env import import_torch

    import_torch()  # torchvision's CPU shim before LeRobot imports it (docs/building.md)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    final = Path(out)
    final.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
    try:
        root = scratch / "dataset"  # LeRobot creates its root itself
        ds = LeRobotDataset.create(repo_id, fps, features, root=root, robot_type=robot_type, use_videos=False)
        episodes, current = 0, None
        for _, img, st, _, act, _, instruction in frames:
            if current is not None and instruction != current:
                ds.save_episode()
                episodes += 1
            current = instruction
            ds.add_frame({"observation.images.camera": img, "observation.state": st, "action": act,
                          "task": instruction})
        ds.save_episode()
        ds.finalize()
        root.rename(final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"repo_id": repo_id, "root": str(out), "episodes": episodes + 1, "frames": len(frames), "fps": fps,
            "topics": roles, "features": {k: list(v["shape"]) for k, v in features.items()}}


def add_arguments(p) -> None:
    p.add_argument("bag", help="a rosbag2 directory (MCAP or sqlite3), e.g. from bag_recorder")
    p.add_argument("--out", required=True, help="dataset root to create (must not exist)")
    p.add_argument("--repo-id", default=None, help="the dataset's repo_id (default local/<bag name>)")
    p.add_argument("--robot", help="the robot namespace to take (default: the only one in the bag)")
    p.add_argument("--fps", type=positive(int), default=15, help=f"frames per second of the dataset, 1 to {MAX_FPS} "
                   "(default: %(default)s)")
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
