"""numpy arrays <-> the proto Tensor (bytes, shape, dtype name), and requests/results.

No pickle: a dtype is a name from ALLOWED_DTYPES, the bytes must be exactly shape x itemsize,
and anything else is a BadTensor naming what was wrong (sent back as INVALID_ARGUMENT).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..core.errors import RequestError
from ..core.observation import Observation
from ..core.types import ChunkResult, InferenceRequest

ALLOWED_DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64")
MAX_DIMS = 8


class BadTensor(RequestError):
    code = "bad_tensor"


def encode(pb, a: np.ndarray):
    a = np.asarray(a)
    if a.dtype.name not in ALLOWED_DTYPES:
        raise BadTensor(f"dtype {a.dtype.name} cannot be sent; allowed: {', '.join(ALLOWED_DTYPES)}")
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    return pb.Tensor(data=a.tobytes(), shape=list(a.shape), dtype=a.dtype.name)


def decode(t, what: str = "tensor") -> np.ndarray:
    """A read-only view on the message's bytes, or BadTensor."""
    if t.dtype not in ALLOWED_DTYPES:
        raise BadTensor(f"{what}: dtype '{t.dtype}' not accepted; allowed: {', '.join(ALLOWED_DTYPES)}")
    shape = tuple(t.shape)
    if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
        raise BadTensor(f"{what}: shape {list(shape)} is not a shape (at most {MAX_DIMS} dims, none negative)")
    dt = np.dtype(t.dtype).newbyteorder("<")
    need = math.prod(shape) * dt.itemsize
    if len(t.data) != need:
        raise BadTensor(f"{what}: {len(t.data)} bytes of data, expected {need} for shape {list(shape)} {t.dtype}")
    return np.frombuffer(t.data, dtype=dt).reshape(shape)


def request_to_pb(pb, req: InferenceRequest):
    m = pb.Request(task_id=req.task_id, round_id=int(req.round_id))
    obs = req.observation
    if obs is not None:
        m.has_observation = True
        o = m.observation
        o.images.extend(encode(pb, im) for im in obs.images)
        o.joints.CopyFrom(encode(pb, np.asarray(obs.joints)))
        o.instruction = obs.instruction
        o.timestep = int(obs.timestep)
    return m


def request_from_pb(m) -> InferenceRequest:
    if not m.task_id:
        raise BadTensor("request without a task_id")
    if m.round_id < 0:
        raise BadTensor(f"task '{m.task_id}': round_id {m.round_id} < 0")
    obs: Optional[Observation] = None
    if m.has_observation:
        o = m.observation
        images = [decode(t, f"task '{m.task_id}' image {i}") for i, t in enumerate(o.images)]
        for i, im in enumerate(images):
            if im.ndim != 3:
                raise BadTensor(f"task '{m.task_id}' image {i}: shape {list(im.shape)}, expected HxWxC")
        joints = decode(o.joints, f"task '{m.task_id}' joints") if o.HasField("joints") else np.zeros(0)
        obs = Observation(images=images, joints=joints, instruction=o.instruction, timestep=int(o.timestep))
    return InferenceRequest(task_id=m.task_id, round_id=int(m.round_id), observation=obs)


def result_to_pb(pb, req: InferenceRequest, res: ChunkResult):
    c = pb.Chunk(task_id=req.task_id, round_id=int(req.round_id), actions=encode(pb, res.actions))
    if res.updates is not None:
        c.has_updates = True
        c.updates.CopyFrom(encode(pb, res.updates))
    return c


def result_from_pb(c) -> ChunkResult:
    actions = decode(c.actions, f"task '{c.task_id}' actions")
    updates = decode(c.updates, f"task '{c.task_id}' updates") if c.has_updates else None
    return ChunkResult(actions, updates)

