"""Observations as arrays, and the checks every transport applies before one is queued.

Shared by the ROS server and the gRPC bridge: bytes in, validated numpy arrays out, or a
RequestError that names what was wrong (docs/architecture.md: bad input gets a clear error back).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from .errors import RequestError

# sensor_msgs/Image encodings a policy can take: channels and element type.
ENCODINGS = {
    "rgb8": (3, np.uint8),
    "bgr8": (3, np.uint8),
    "rgba8": (4, np.uint8),
    "mono8": (1, np.uint8),
    "mono16": (1, np.uint16),
    "16UC1": (1, np.uint16),
    "32FC1": (1, np.float32),
}


class BadObservation(RequestError):
    code = "bad_observation"


class PayloadTooLarge(RequestError):
    code = "payload_too_large"


@dataclass
class Observation:
    images: list = field(default_factory=list)  # HxWxC arrays, in camera order
    joints: np.ndarray = field(default_factory=lambda: np.zeros(0))
    instruction: str = ""
    timestep: int = 0  # robot timestep at capture
    stamp: float = 0.0  # capture time on the server's time line


@dataclass(frozen=True)
class ObservationSpec:
    """What the served policy accepts. None means "any"."""

    cameras: Optional[int] = None
    width: Optional[int] = None
    height: Optional[int] = None
    encodings: tuple = ("rgb8", "bgr8", "mono8")
    joints: Optional[int] = None
    max_bytes: int = 8 << 20
    # Limits on the request's other fields (docs/security.md), checked before it is queued.
    max_task_id_bytes: int = 256  # task id, and the other names a request carries (UTF-8 bytes)
    max_instruction_bytes: int = 4096
    max_images: int = 16


def decode_image(i: int, encoding: str, width: int, height: int, step: int, data, spec: ObservationSpec) -> np.ndarray:
    """sensor_msgs/Image fields -> HxWxC array (a view on `data`), or BadObservation."""
    if encoding not in spec.encodings or encoding not in ENCODINGS:
        raise BadObservation(f"image {i}: encoding '{encoding}' not accepted; expected one of {', '.join(spec.encodings)}")
    if spec.width is not None and width != spec.width or spec.height is not None and height != spec.height:
        raise BadObservation(f"image {i}: {width}x{height} but the policy takes {spec.width}x{spec.height}")
    if width < 1 or height < 1:
        raise BadObservation(f"image {i}: empty ({width}x{height})")
    ch, dtype = ENCODINGS[encoding]
    row = width * ch * np.dtype(dtype).itemsize
    if step != row:
        raise BadObservation(f"image {i}: step {step} != width x channels x bytes = {row} (padded rows are not accepted)")
    if len(data) != row * height:
        raise BadObservation(f"image {i}: {len(data)} bytes of data, expected {row * height} for {width}x{height} {encoding}")
    return np.frombuffer(data, dtype=dtype).reshape(height, width, ch)


def check_joints(positions: Sequence[float], spec: ObservationSpec) -> np.ndarray:
    q = np.asarray(positions, dtype=np.float64)
    if spec.joints is not None and q.shape != (spec.joints,):
        raise BadObservation(f"joint state has {q.size} positions, the policy takes {spec.joints}")
    bad = np.flatnonzero(~np.isfinite(q))
    if bad.size:
        raise BadObservation(f"joint state position {int(bad[0])} is {q[bad[0]]}: positions must be finite")
    return q


def check_camera_count(n: int, spec: ObservationSpec) -> None:
    if spec.cameras is not None and n != spec.cameras:
        raise BadObservation(f"{n} camera images, the policy takes {spec.cameras}")


def check_size(nbytes: int, spec: ObservationSpec) -> None:
    if nbytes > spec.max_bytes:
        raise PayloadTooLarge(f"request carries {nbytes} bytes of observation, the server accepts at most {spec.max_bytes}")


def check_stamp(t: float) -> None:
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise BadObservation("observation stamp is not finite")


def check_text(what: str, text: str, cap: int) -> None:
    """A client-sent string within `cap` UTF-8 bytes; the error names the field, never echoes it."""
    n = len(text.encode("utf-8", "surrogatepass"))
    if n > cap:
        raise RequestError(f"{what}: {n} bytes, at most {cap}")


def check_image_count(n: int, spec: ObservationSpec) -> None:
    if n > spec.max_images:
        raise RequestError(f"observation.images: {n} images, at most {spec.max_images}")
