"""The engine core process's wire (serve/core_process.py <-> serve/remote.py): plain-data
msgspec Structs in MessagePack, one tagged union per direction. numpy arrays travel as
their bytes, dtype and shape (no pickle: a message can only ever become these types), and
a dtype other than bool/int/uint/float is refused like any malformed message.
As vLLM v1's EngineCoreRequest/EngineCoreOutputs: plain data across the process line."""
from __future__ import annotations

import os
import queue
from typing import Any, Optional, Union

import msgspec
import numpy as np

from ..core.errors import RequestError
from ..core.observation import Observation
from ..core.rtc import RtcGuide
from ..core.types import ChunkReply, ExecInfo, HorizonChoice, InferenceRequest

WIRE_VERSION = 1  # bumped on any change of the Structs below: a front end and a core of two builds refuse each other


class Arr(msgspec.Struct, array_like=True):
    dtype: str
    shape: list[int]
    data: bytes


class WObs(msgspec.Struct, array_like=True):
    images: list[Arr]
    joints: Arr
    instruction: str
    timestep: int
    stamp: float


class WRequest(msgspec.Struct, array_like=True):
    task_id: str
    round_id: int
    exec_info: Optional[tuple[float, int, float]]
    horizon: tuple[str, Optional[float]]
    observation: Optional[WObs]
    obs_stamp: Optional[float]
    deadline: Optional[float]
    remaining_rounds: Optional[int]
    task_type: Optional[str]
    max_obs_age_s: Optional[float]
    rtc: Optional[tuple[Arr, Optional[int]]]


class WChunk(msgspec.Struct, array_like=True):
    task_id: str
    round_id: int
    actions: Arr
    horizon: int
    reason: str
    chunk_len: int
    tier: str
    generated_at: float
    rtc_delay_steps: Optional[int]


class WProof(msgspec.Struct, array_like=True):
    stamp_ns: int
    mac: bytes
    body: bytes
    kind: str


# --- front end -> core ---------------------------------------------------------------------
class Hello(msgspec.Struct, tag=True):
    """First message of a front end: the config fingerprint it expects the core to run."""
    version: int
    fingerprint: str


class Submit(msgspec.Struct, tag=True):
    id: int
    robot: str
    req: WRequest
    proof: Optional[WProof] = None


class Progress(msgspec.Struct, tag=True):
    """A robot's progress: keeps its task alive; done: the task ends (exec_start, control_hz)."""
    task_id: str
    robot: str
    proof: Optional[WProof]
    done: bool = False
    exec_start: float = 0.0
    control_hz: float = 1.0


class Call(msgspec.Struct, tag=True):
    """A call answered by a Result: one of core_process.CALLS by name."""
    id: int
    name: str
    args: list[Any] = []


class Ping(msgspec.Struct, tag=True):
    id: int


class RefreshReply(msgspec.Struct, tag=True):
    id: int
    fresh: list[Optional[tuple[WObs, float]]]


class Bye(msgspec.Struct, tag=True):
    """The front end leaves; stop: the core process stops too (it was the front end's)."""
    stop: bool = True


# --- core -> front end ---------------------------------------------------------------------
class Reply(msgspec.Struct, tag=True):
    """A submitted round's answer: its chunk, or the refusal's code and message."""
    id: int
    chunk: Optional[WChunk] = None
    code: str = ""
    message: str = ""


class Result(msgspec.Struct, tag=True):
    id: int
    value: Any = None
    code: str = ""
    message: str = ""


class Pong(msgspec.Struct, tag=True):
    """A ping's answer: what the front end shows between pings (the expected queue wait, the
    tasks reaped since the last one, the core's pid)."""
    id: int
    expected_wait_s: float
    reaped: list[str]
    pid: int


class RefreshAsk(msgspec.Struct, tag=True):
    """The core asks the front end for fresher observations of these rounds (seed 000 Alg. 1 l. 20-21)."""
    id: int
    rounds: list[tuple[str, int]]


ToCore = Union[Hello, Submit, Progress, Call, Ping, RefreshReply, Bye]
ToFront = Union[Reply, Result, Pong, RefreshAsk]
encode = msgspec.msgpack.Encoder().encode
decode_to_core = msgspec.msgpack.Decoder(ToCore).decode
decode_to_front = msgspec.msgpack.Decoder(ToFront).decode
DecodeError = msgspec.DecodeError  # (msgspec.ValidationError is one)


class BadWire(RequestError):
    code = "bad_request"


class Outbox:
    """What other threads give a ZMQ socket's own thread to send (sockets are not thread-safe):
    a queue, and a pipe whose read end the socket's poller watches to wake up."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self.wake_r, self._wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self._wake_w, False)

    def put(self, item) -> None:
        self._q.put(item)
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:  # the pipe is full of wake-ups: the loop is awake anyway
            pass

    def wait(self, poller, timeout_ms: int, send) -> dict:
        """Poll, then `send` each queued item; returns what the poll found ready."""
        ready = dict(poller.poll(timeout=timeout_ms))
        if self.wake_r in ready:
            try:
                os.read(self.wake_r, 65536)
            except BlockingIOError:
                pass
        while not self._q.empty():
            send(self._q.get())
        return ready

    def close(self) -> None:
        os.close(self.wake_r)
        os.close(self._wake_w)


_KINDS = "biuf"  # bool, int, uint, float: no object, void or string arrays off the wire


def arr(a) -> Arr:
    a = np.ascontiguousarray(a)
    return Arr(a.dtype.str, list(a.shape), a.tobytes())


def from_arr(w: Arr) -> np.ndarray:
    try:
        dt = np.dtype(w.dtype)
    except TypeError as e:
        raise BadWire(f"array dtype {w.dtype!r}: {e}") from None
    if dt.kind not in _KINDS or any(n < 0 for n in w.shape) or int(np.prod(w.shape)) * dt.itemsize != len(w.data):
        raise BadWire(f"array {w.dtype} {w.shape} of {len(w.data)} bytes is not a plain numeric array")
    return np.frombuffer(w.data, dtype=dt).reshape(w.shape)


def obs_out(o: Observation) -> WObs:
    return WObs([arr(i) for i in o.images], arr(o.joints), o.instruction, int(o.timestep), float(o.stamp))


def obs_in(w: WObs) -> Observation:
    return Observation([from_arr(i) for i in w.images], from_arr(w.joints), w.instruction, w.timestep, w.stamp)


def request_out(r: InferenceRequest) -> WRequest:
    e = r.exec_info
    return WRequest(r.task_id, r.round_id, (e.exec_start, e.actions_left, e.control_hz) if e is not None else None,
                    (r.horizon.policy, r.horizon.param), obs_out(r.observation) if r.observation is not None else None,
                    r.obs_stamp, r.deadline, r.remaining_rounds, r.task_type, r.max_obs_age_s,
                    (arr(r.rtc.leftover), r.rtc.delay_steps) if r.rtc is not None else None)


def request_in(w: WRequest) -> InferenceRequest:
    return InferenceRequest(w.task_id, w.round_id, ExecInfo(*w.exec_info) if w.exec_info is not None else None,
                            HorizonChoice(*w.horizon), obs_in(w.observation) if w.observation is not None else None,
                            w.obs_stamp, w.deadline, w.remaining_rounds, w.task_type,
                            rtc=RtcGuide(from_arr(w.rtc[0]), w.rtc[1]) if w.rtc is not None else None,
                            max_obs_age_s=w.max_obs_age_s)


def chunk_out(c: ChunkReply) -> WChunk:
    return WChunk(c.task_id, c.round_id, arr(c.actions), c.horizon, c.reason, c.chunk_len, c.tier, c.generated_at,
                  c.rtc_delay_steps)


def chunk_in(w: WChunk) -> ChunkReply:
    return ChunkReply(w.task_id, w.round_id, from_arr(w.actions), w.horizon, w.reason, w.chunk_len, w.tier,
                      w.generated_at, w.rtc_delay_steps)


def proof_out(p) -> Optional[WProof]:
    return WProof(p.stamp_ns, p.mac, p.body, p.kind) if p is not None else None
