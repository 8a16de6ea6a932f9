"""ROS messages <-> core types. Pure translation: every decision stays in core."""
from __future__ import annotations

import array
from typing import Optional

import numpy as np

from ..core.errors import BadRtc, RequestError
from ..core.observation import (
    BadObservation,
    Observation,
    ObservationSpec,
    check_camera_count,
    check_image_count,
    check_joints,
    check_size,
    check_text,
    decode_image,
)
from ..core.rtc import RtcGuide
from ..core.types import ChunkReply, ExecInfo, HorizonChoice, InferenceRequest
from ..msg import Status
from ..transport.images import decode_frames
from .common import to_sec, to_time

# Core error code ("unknown_task") -> msg/Status code, read from the message's constants so
# msg/Status.msg stays the one list.
STATUS = {k.lower(): v for k, v in vars(Status).items() if k.isupper() and isinstance(v, int)}


def observation_from_msg(m, spec: ObservationSpec, compressed=()) -> Observation:
    """msg/Observation -> validated arrays (views on the message's bytes); `compressed`:
    srv/Infer's JPEG/PNG cameras, decoded (transport/images.py) in place of m.images."""
    if len(m.images) and len(compressed):
        raise BadObservation("observation.images and compressed_images both carry cameras: send one or the other")
    frames = compressed if len(compressed) else m.images
    check_image_count(len(frames), spec)
    check_text("observation.instruction", m.instruction, spec.max_instruction_bytes)
    check_size(sum(len(im.data) for im in frames) + 8 * len(m.joint_state.position), spec)
    check_camera_count(len(frames), spec)
    images = decode_frames("compressed_images", compressed, spec) or \
        [decode_image(i, im.encoding, im.width, im.height, im.step, im.data, spec) for i, im in enumerate(m.images)]
    joints = check_joints(m.joint_state.position, spec)
    return Observation(images, joints, m.instruction, int(m.timestep), to_sec(m.header.stamp))


def request_from_msg(r, spec: ObservationSpec) -> InferenceRequest:
    """srv/Infer request -> core InferenceRequest; RequestError on anything malformed."""
    if not r.task_id:
        raise RequestError("task_id must be a non-empty string")
    check_text("task_id", r.task_id, spec.max_task_id_bytes)  # before anything keeps it (ledger, caches)
    check_text("horizon.name", r.horizon.name, spec.max_task_id_bytes)
    check_text("refresh_service", r.refresh_service, spec.max_task_id_bytes)
    obs = observation_from_msg(r.observation, spec, r.compressed_images)
    info: Optional[ExecInfo] = None
    if r.has_exec_info:
        e = r.exec_info
        info = ExecInfo(to_sec(e.exec_start), int(e.actions_left), float(e.control_hz))
    hz = HorizonChoice(r.horizon.name, float(r.horizon.param) if r.horizon.has_param else None)
    return InferenceRequest(
        r.task_id,
        int(r.round_id),
        info,
        hz,
        observation=obs,
        obs_stamp=obs.stamp,
        remaining_rounds=int(r.remaining_rounds) or None,
        rtc=rtc_from_msg(r.rtc_leftover, int(r.rtc_leftover_actions)),
    )


def rtc_from_msg(values, rows: int) -> Optional[RtcGuide]:
    """srv/Infer's rtc_leftover (row-major) + its rows -> RtcGuide; None when empty (no RTC).
    Width, finiteness and length against the policy are the core's checks (ServingCore)."""
    if rows == 0 and len(values) == 0:
        return None
    if rows == 0 or len(values) % rows or len(values) == 0:
        raise BadRtc(f"rtc_leftover has {len(values)} values, not a whole number of rtc_leftover_actions={rows} rows")
    return RtcGuide(np.asarray(values, dtype=np.float32).reshape(rows, -1))


def fill_status(status, code: str, message: str = "") -> None:
    status.code = STATUS.get(code, STATUS["internal"])
    status.reason = code
    status.message = message


def fill_chunk(c, reply: ChunkReply, first_timestep: int, stamp: float, joint_names=()) -> None:
    a = np.ascontiguousarray(reply.actions, dtype=np.float32)
    c.header.stamp = to_time(stamp)
    c.task_id = reply.task_id
    c.round_id = reply.round_id
    c.first_timestep = int(first_timestep)
    c.horizon = int(reply.horizon)
    c.action_dim = int(a.shape[1]) if a.ndim == 2 else 1
    c.chunk_len = int(reply.chunk_len)
    c.actions = array.array("f", a.tobytes())
    c.horizon_reason = reply.reason
    c.rtc_delay_steps = -1 if reply.rtc_delay_steps is None else int(reply.rtc_delay_steps)
    if len(joint_names) == c.action_dim:  # names that do not cover the columns would mislead: none then
        c.joint_names = list(joint_names)


def chunk_to_array(c) -> np.ndarray:
    """msg/ActionChunk -> [horizon, action_dim] float32."""
    a = np.asarray(c.actions, dtype=np.float32)
    if a.size != c.horizon * c.action_dim:
        raise ValueError(f"chunk carries {a.size} values, not horizon x action_dim = {c.horizon} x {c.action_dim}")
    return a.reshape(c.horizon, c.action_dim)


def is_namespace(ns: str) -> bool:
    """Whether `ns` is a ROS namespace (a robot's id: check_robot_id refuses any other)."""
    from rclpy.validate_namespace import validate_namespace

    try:
        return bool(validate_namespace(ns))
    except Exception:  # rclpy's InvalidNamespaceException
        return False


def check_robot_id(robot_id: str, max_bytes: int) -> str:
    """A robot's namespace as sent: '' or a ROS namespace (it becomes a /diagnostics key)."""
    if not robot_id:
        return ""
    from rclpy.validate_namespace import validate_namespace

    if len(robot_id.encode()) > max_bytes:
        raise RequestError(f"robot_id: {len(robot_id.encode())} bytes, at most {max_bytes}")
    try:
        validate_namespace(robot_id)
    except Exception:  # rclpy's InvalidNamespaceException, with the name in it: not echoed
        raise RequestError("robot_id is not a ROS namespace") from None
    return robot_id


def check_service_name(name: str) -> None:
    """refresh_service: '' or a name the refresher can make a client for."""
    if name:
        from rclpy.validate_full_topic_name import validate_full_topic_name

        try:
            validate_full_topic_name(name if name.startswith("/") else "/" + name, is_service=True)
        except Exception:
            raise RequestError("refresh_service is not a ROS service name") from None
