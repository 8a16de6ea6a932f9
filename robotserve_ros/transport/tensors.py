"""numpy arrays <-> the proto Tensor (bytes, shape, dtype name), and requests/results.

No pickle: a dtype is a name from ALLOWED_DTYPES, every dimension and the element count are
bounded by the message limit before anything is allocated, the bytes must be exactly
shape x itemsize, ids and strings are length-limited, joint values must be finite. Anything
else is a RequestError naming the field (`requests[3].observation.joints`), sent back as
INVALID_ARGUMENT; a message never echoes more than a short, escaped prefix of what was sent.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..core.errors import RequestError
from ..core.observation import ENCODINGS, BadObservation, Observation, ObservationSpec
from ..core.rtc import RtcGuide
from ..core.types import ChunkResult, InferenceRequest
from . import DEFAULT_MAX_MESSAGE
from .images import DecodeBudget, compressible, decode_frames, encode_frame

ALLOWED_DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64")
MAX_DIMS = 8


class BadTensor(RequestError):
    code = "bad_tensor"


class BadField(RequestError):
    code = "bad_request"


@dataclass(frozen=True)
class Limits:
    """What one InferBatch call may carry (the GPU server's options)."""

    max_id_bytes: int = 256  # task_id
    max_text_bytes: int = 4096  # instruction
    max_images: int = 16  # cameras per observation
    max_call_requests: int = 1024  # requests per call: each becomes a queued task
    max_elements: int = DEFAULT_MAX_MESSAGE  # a message of N bytes holds at most N elements
    # What every compressed frame of one call may decode to together (100 robots x 3 cameras of
    # 224x224 rgb8 take 45 MB): a small file of zeros claims many bytes decoded.
    max_call_decoded_bytes: int = 128 << 20


def shown(s, n: int = 32) -> str:
    """A short, escaped rendering of client-sent text for an error message: never the bytes
    themselves (no control characters, no megabytes echoed back or into a log)."""
    out = ascii(s[:n])
    return out if len(s) <= n else f"{out}... ({len(s)} long)"


def log_failure(log, what: str) -> None:
    """The exception being handled, logged on one line with its text escaped: an exception's
    message may carry client-sent strings (a key, a path), which must not forge log lines."""
    import sys
    import traceback

    e = sys.exc_info()[1]
    tb = "".join(traceback.format_tb(e.__traceback__)) if e is not None else ""
    log.error("%s: %s; traceback: %s", what, shown(repr(e), 300), ascii(tb))


def encode(pb, a: np.ndarray):
    a = np.asarray(a)
    if a.dtype.name not in ALLOWED_DTYPES:
        raise BadTensor(f"dtype {a.dtype.name} cannot be sent; allowed: {', '.join(ALLOWED_DTYPES)}")
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    return pb.Tensor(data=a.tobytes(), shape=list(a.shape), dtype=a.dtype.name)


def decode(t, what: str = "tensor", limits: Limits = Limits()) -> np.ndarray:
    """A read-only view on the message's bytes, or BadTensor naming `what`."""
    if t.dtype not in ALLOWED_DTYPES:
        raise BadTensor(f"{what}.dtype: {shown(t.dtype)} not accepted; allowed: {', '.join(ALLOWED_DTYPES)}")
    shape = tuple(t.shape)
    if len(shape) > MAX_DIMS:
        raise BadTensor(f"{what}.shape: {len(shape)} dims, at most {MAX_DIMS}")
    cap = limits.max_elements
    for i, d in enumerate(shape):
        if d < 0 or d > cap:
            raise BadTensor(f"{what}.shape[{i}]: {d} is not a size in 0..{cap}")
    # Empty dimensions do not make the others free: numpy refuses a shape whose non-zero
    # dimensions overflow, so they are bounded too (exact Python integers, no overflow here).
    if math.prod(max(d, 1) for d in shape) > cap:
        raise BadTensor(f"{what}.shape: more than {cap} elements")
    dt = np.dtype(t.dtype).newbyteorder("<")
    need = math.prod(shape) * dt.itemsize
    if len(t.data) != need:
        raise BadTensor(f"{what}.data: {len(t.data)} bytes, expected {need} for shape {list(shape)} {t.dtype}")
    return np.frombuffer(t.data, dtype=dt).reshape(shape)


def request_to_pb(pb, req: InferenceRequest, image_transport: str = "raw", quality: int = 90):
    """image_transport jpeg/png: uint8 cameras of 1 or 3 channels go as CompressedFrame
    (their channel order kept), the rest as raw Tensors; one kind per observation."""
    m = pb.Request(task_id=req.task_id, round_id=int(req.round_id))
    obs = req.observation
    if obs is not None:
        m.has_observation = True
        o = m.observation
        if image_transport != "raw" and all(compressible(im) for im in obs.images):
            o.compressed_images.extend(pb.CompressedFrame(format=f, data=d) for f, d in (
                encode_frame(im, "rgb8" if im.shape[2] == 3 else "mono8", image_transport, quality) for im in obs.images))
        else:
            o.images.extend(encode(pb, im) for im in obs.images)
        o.joints.CopyFrom(encode(pb, np.asarray(obs.joints)))
        o.instruction = obs.instruction
        o.timestep = int(obs.timestep)
    g = req.rtc
    if g is not None and g.delay_steps is not None:
        m.has_rtc, m.rtc_delay_steps = True, int(g.delay_steps)
        m.rtc_leftover.CopyFrom(encode(pb, np.asarray(g.leftover, np.float32)))
    return m


def _text(s: str, what: str, cap: int) -> None:
    n = len(s.encode("utf-8", "surrogatepass"))
    if n > cap:
        raise BadField(f"{what}: {n} bytes, at most {cap}")


def request_from_pb(m, index: int = 0, limits: Limits = Limits(), spec: Optional[ObservationSpec] = None,
                    call_budget: Optional[DecodeBudget] = None) -> InferenceRequest:
    """The index-th request of a call, validated; errors name `requests[index].<field>`.
    `spec`: the policy's observation spec, which compressed frames are checked against;
    `call_budget`: the bytes every compressed frame of the call may decode to together."""
    at = f"requests[{index}]"
    if not m.task_id:
        raise BadField(f"{at}.task_id: empty")
    _text(m.task_id, f"{at}.task_id", limits.max_id_bytes)
    if m.round_id < 0:
        raise BadField(f"{at}.round_id: {m.round_id} < 0")
    obs: Optional[Observation] = None
    if m.has_observation:
        o = m.observation
        _text(o.instruction, f"{at}.observation.instruction", limits.max_text_bytes)
        if len(o.images) > limits.max_images:
            raise BadField(f"{at}.observation.images: {len(o.images)} images, at most {limits.max_images}")
        if len(o.compressed_images) > limits.max_images:
            raise BadField(f"{at}.observation.compressed_images: {len(o.compressed_images)} images, at most {limits.max_images}")
        if len(o.images) and len(o.compressed_images):
            raise BadField(f"{at}.observation: images and compressed_images both carry cameras; send one or the other")
        # Decoded against the policy's spec (size checked from the header first); without one,
        # no frame may claim more elements than a message of the server's limit could carry.
        bound = spec or ObservationSpec(encodings=("rgb8", "mono8"), max_bytes=limits.max_elements)
        images = decode_frames(f"{at}.observation.compressed_images", o.compressed_images, bound, call_budget)
        for i, t in enumerate(o.images):
            where = f"{at}.observation.images[{i}]"
            im = decode(t, where, limits)
            if im.ndim != 3 or 0 in im.shape:
                raise BadTensor(f"{where}.shape: {list(im.shape)}, expected HxWxC, none empty")
            images.append(im)
        joints = np.zeros(0, np.float32)
        if o.HasField("joints"):
            joints = decode(o.joints, f"{at}.observation.joints", limits)
            if joints.ndim != 1:
                raise BadTensor(f"{at}.observation.joints.shape: {list(joints.shape)}, expected one dimension")
            if joints.dtype.kind == "f":
                bad = np.flatnonzero(~np.isfinite(joints))
                if bad.size:
                    raise BadObservation(f"{at}.observation.joints[{int(bad[0])}]: {joints[bad[0]]}, joint values must be finite")
        obs = Observation(images=images, joints=joints, instruction=o.instruction, timestep=int(o.timestep))
    rtc = None
    if m.has_rtc:
        left = decode(m.rtc_leftover, f"{at}.rtc_leftover", limits)
        rtc = RtcGuide(left.astype(np.float32) if left.dtype.kind == "f" else left, int(m.rtc_delay_steps))
        problems = rtc.problems()
        if left.dtype.kind != "f":
            problems.append(f"rtc leftover must be float, got {left.dtype.name}")
        if problems:
            raise BadField(f"{at}.rtc_leftover: " + "; ".join(problems))
    return InferenceRequest(task_id=m.task_id, round_id=int(m.round_id), observation=obs, rtc=rtc)


def check_spec(obs: Optional[Observation], spec: ObservationSpec, index: int = 0) -> None:
    """What the engine's policy takes (its observation_spec), checked before the request is
    queued: found only by the engine, a bad observation would fail every call in its batch."""
    at = f"requests[{index}].observation"
    if obs is None:
        raise BadObservation(f"{at}: missing (has_observation false), the policy needs one")
    if spec.cameras is not None and len(obs.images) != spec.cameras:
        raise BadObservation(f"{at}.images: {len(obs.images)} images, the policy takes {spec.cameras}")
    kinds = {(ENCODINGS[e][0], np.dtype(ENCODINGS[e][1]).name) for e in spec.encodings if e in ENCODINGS}
    for i, im in enumerate(obs.images):
        h, w, c = im.shape
        if spec.width is not None and w != spec.width or spec.height is not None and h != spec.height:
            raise BadObservation(f"{at}.images[{i}]: {w}x{h}, the policy takes {spec.width}x{spec.height}")
        if (c, im.dtype.name) not in kinds:
            raise BadObservation(f"{at}.images[{i}]: {c} channels of {im.dtype.name}, the policy takes one of {', '.join(spec.encodings)}")
    if spec.joints is not None and obs.joints.shape != (spec.joints,):
        raise BadObservation(f"{at}.joints: {obs.joints.size} values, the policy takes {spec.joints}")
    nbytes = sum(im.nbytes for im in obs.images) + obs.joints.nbytes
    if nbytes > spec.max_bytes:
        raise BadObservation(f"{at}: {nbytes} bytes, the policy's server accepts at most {spec.max_bytes}")


def check_rtc(req: InferenceRequest, engine, index: int = 0) -> None:
    """A request's RTC leftover against the hosted engine's action width and chunk length."""
    g, dim, chunk = req.rtc, getattr(engine, "action_dim", None), getattr(engine, "chunk_len", None)
    if g is None:
        return
    problems = g.sent_problems(dim)
    if chunk is not None and len(g.leftover) > chunk:
        problems.append(f"{len(g.leftover)} actions, more than a chunk of {chunk}")
    if problems:
        raise BadField(f"requests[{index}].rtc_leftover: " + "; ".join(problems))


def result_to_pb(pb, req: InferenceRequest, res: ChunkResult):
    """The engine's full result (untrimmed: the edge's horizon policy trims it)."""
    c = pb.Chunk(task_id=req.task_id, round_id=int(req.round_id), actions=encode(pb, res.actions))
    if res.updates is not None:
        c.has_updates = True
        c.updates.CopyFrom(encode(pb, res.updates))
    if res.initial_noise is not None:
        c.has_initial_noise = True
        c.initial_noise.CopyFrom(encode(pb, res.initial_noise))
    if res.rtc_delay_steps is not None:
        c.has_rtc, c.rtc_delay_steps = True, int(res.rtc_delay_steps)
    return c


def result_from_pb(c, index: int = 0) -> ChunkResult:
    at = f"chunks[{index}]"
    actions = decode(c.actions, f"{at}.actions")
    updates = decode(c.updates, f"{at}.updates") if c.has_updates else None
    noise = decode(c.initial_noise, f"{at}.initial_noise") if c.has_initial_noise else None
    return ChunkResult(actions, updates, noise, rtc_delay_steps=int(c.rtc_delay_steps) if c.has_rtc else None)
