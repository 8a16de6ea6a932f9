"""The VLM serving core: requests moving through vision encode -> LLM prefill -> LLM decode,
and the schedulers that pick the next forward passes (seed 003, §III-D, §V-A7).

`VLMCore.dispatch()` returns Ops for idle worker slots (`op.slot`); `complete(op)` moves the
op's requests on (core/contract.py's calls; the time is the core's injected clock). The live
path drives these through `core/loop.py`'s LiveDriver (`live.py`), the simulator on the
virtual-clock loop with stage times from a measured profile (sim/nova.py): the same steps.

Schedulers (registry `VLM_SCHEDULERS`):
- `nova`: decode worker beside a front worker (vision or prefill, never both, prefill
  first); the partition follows the pending vision/prefill count (Eq. 5); in-flight decode
  batching: a request that finishes prefill joins the batch after the running one (§III-D);
- `static_partition`: the same pipeline with fixed decode shares (n_v, n_p);
- `fcfs`: one worker, one stage at a time, oldest request first (sequential, vLLM-like);
- `prefill_first`: one worker, vision/prefill first, decode when >= `limit` decode
  requests wait or nothing else does (the paper's PF-Limit, limit 5);
- `chunked_prefill`: one worker, prefill split into chunks batched with every running
  decode under a token budget (Sarathi); vision encode cannot join that batch and runs
  alone.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..clock import Clock, WallClock
from ..registry import Registry
from .partition import PartitionPlan, StageProfile


@dataclass
class VLMRequest:
    rid: str
    arrival: float
    tiles: int = 1
    prompt_tokens: int = 64
    max_tokens: int = 50
    payload: object = None  # engine side: image, prompt ids, KV (live only)
    stage: str = "vision"
    eos: bool = False
    tokens_out: int = 0
    prefilled: int = 0  # prompt positions done (chunked prefill)
    t_vision: tuple = (None, None)
    t_prefill: tuple = (None, None)  # (first chunk start, first token)
    t_done: Optional[float] = None
    decode_busy_s: float = 0.0
    error: Optional[str] = None

    @property
    def latency_s(self) -> float:
        return self.t_done - self.arrival

    def waits(self) -> dict:
        """Per-stage queueing: time ready for a stage but not running in it."""
        vs, ve = self.t_vision
        ps, pe = self.t_prefill
        return {"vision": vs - self.arrival, "prefill": ps - ve,
                "decode": max(0.0, (self.t_done - pe) - self.decode_busy_s)}


@dataclass
class Op:
    kind: str  # vision | prefill | decode | hybrid
    slot: str
    units: int
    front: Optional[VLMRequest] = None  # vision / prefill / the chunk of a hybrid
    batch: list = field(default_factory=list)  # decode members
    chunk: int = 0  # prompt positions prefilled by this op
    corun: bool = False
    start: float = 0.0


def op_time(profile: StageProfile, op: Op) -> float:
    """Seconds an op takes on `profile` (the simulator's engine)."""
    if op.kind == "vision":
        return profile.t_vision(op.units, op.front.tiles, op.corun)
    if op.kind == "prefill":
        return profile.t_prefill(op.units, op.chunk, op.corun)
    t = profile.t_decode(op.units, len(op.batch), op.corun) if op.batch else 0.0
    if op.kind == "hybrid":  # one fused pass on a CPU costs about the sum of its parts
        t += profile.t_prefill(op.units, op.chunk, op.corun)
    return t


class VLMCore:
    """Queues and request state; a scheduler object decides what runs. Thread-safe."""

    def __init__(self, scheduler: "VLMScheduler", total_units: int, clock: Optional[Clock] = None,
                 on_done: Optional[Callable[[VLMRequest], None]] = None) -> None:
        self.sched, self.total, self.on_done = scheduler, int(total_units), on_done
        self.clock = clock or WallClock()
        self.serving: dict = {}  # rid -> request, until it is done
        self.vision_q: deque = deque()
        self.prefill_q: deque = deque()
        self.decode_ready: list = []
        self.running: dict = {}  # slot -> Op
        self.done: list = []
        self.lock = threading.RLock()
        self.ops = 0
        self.decode_batches: list = []

    @property
    def slots(self) -> dict:
        return {s: 1 for s in self.sched.slots}

    def submit(self, req: VLMRequest) -> VLMRequest:
        with self.lock:
            if req.rid in self.serving:
                raise ValueError(f"request id {req.rid!r} is already in progress")
            now = self.clock.now()
            self.serving[req.rid] = req
            req.arrival = now if req.arrival is None else req.arrival
            (self.vision_q if req.tiles > 0 else self.prefill_q).append(req)
            if req.tiles <= 0:
                req.t_vision = (now, now)
                req.stage = "prefill"
            return req

    def pending_front(self) -> int:
        """The paper's load signal: requests in vision encode or LLM prefill (§III-C2)."""
        f = self.running.get("front") or self.running.get("worker")
        busy = 1 if f is not None and f.kind in ("vision", "prefill") else 0
        return len(self.vision_q) + len(self.prefill_q) + busy

    def decoding(self) -> int:
        d = self.running.get("decode")
        return len(self.decode_ready) + (len(d.batch) if d else 0)

    def dispatch(self) -> list:
        with self.lock:
            now = self.clock.now()
            ops = [op for op in self.sched.pick(self, now) if op is not None]
            for op in ops:
                if op.slot in self.running:
                    raise RuntimeError(f"scheduler {self.sched.name} gave busy slot {op.slot} a second op")
                op.start = now
                self.running[op.slot] = op
                if op.front is not None:
                    if op.kind == "vision":
                        op.front.t_vision = (now, None)
                    elif op.front.t_prefill[0] is None:
                        op.front.t_prefill = (now, None)
                for r in op.batch:
                    self.decode_ready.remove(r)
                if op.batch:
                    self.decode_batches.append(len(op.batch))
                self.ops += 1
            return ops

    def complete(self, op: Op, result=None) -> list:
        """The op ended (now, on the core's clock): move its requests on; the engine wrote
        its outputs into the requests' payloads, so `result` is unused. Returns requests
        that finished."""
        finished = []
        with self.lock:
            now = self.clock.now()
            self.running.pop(op.slot, None)
            f = op.front
            if f is not None and f.error is None:
                if op.kind == "vision":
                    f.t_vision = (f.t_vision[0], now)
                    f.stage = "prefill"
                    self.prefill_q.append(f)
                else:
                    f.prefilled += op.chunk
                    if f.prefilled >= f.prompt_tokens:
                        f.t_prefill = (f.t_prefill[0], now)
                        f.tokens_out = 1  # prefill yields the first token (TTFT)
                        f.stage = "decode"
                        self._to_decode(f, now, finished)
                    else:
                        self.prefill_q.appendleft(f)  # a partly prefilled request keeps its turn
            for r in op.batch:
                r.decode_busy_s += now - op.start
                if r.error is None:
                    r.tokens_out += 1
                self._to_decode(r, now, finished)
            if f is not None and f.error is not None:
                self._finish(f, now, finished)
        return finished

    def fail(self, op: Op, reason: str) -> list:
        """The op's engine call raised: its requests end with `reason`, others go on."""
        with self.lock:
            for r in ([op.front] if op.front is not None else []) + list(op.batch):
                r.error = r.error or reason
            return self.complete(op)

    def cancel(self, request_id: str, reason: str = "cancelled") -> bool:
        """Stop serving a request (its sender gave up): a queued request ends now, one inside
        a running op ends when that op completes. True if it was still being served."""
        with self.lock:
            req = self.serving.get(request_id)
            if req is None or req.stage == "done":
                return False
            req.error = req.error or reason
            for q in (self.vision_q, self.prefill_q, self.decode_ready):
                if req in q:
                    q.remove(req)
                    self._finish(req, self.clock.now(), [])
                    break
            return True

    def _to_decode(self, r: VLMRequest, now: float, finished: list) -> None:
        if r.error is not None or r.eos or r.tokens_out >= r.max_tokens:
            self._finish(r, now, finished)
        else:
            self.decode_ready.append(r)

    def _finish(self, r: VLMRequest, now: float, finished: list) -> None:
        r.t_done, r.stage = now, "done"
        self.serving.pop(r.rid, None)
        self.done.append(r)
        finished.append(r)
        if self.on_done is not None:
            self.on_done(r)

    def idle(self) -> bool:
        with self.lock:
            return not (self.vision_q or self.prefill_q or self.decode_ready or self.running)

    def snapshot(self) -> dict:
        with self.lock:
            b = self.decode_batches
            return {"scheduler": self.sched.name, "vision_q": len(self.vision_q), "prefill_q": len(self.prefill_q),
                    "decode_ready": len(self.decode_ready), "running": sorted(self.running), "ops": self.ops,
                    "done": len(self.done), "failed": sum(1 for r in self.done if r.error is not None),
                    "mean_decode_batch": sum(b) / len(b) if b else 0.0}


class VLMScheduler:
    name = "abstract"
    slots: tuple = ("worker",)

    def pick(self, core: VLMCore, now: float) -> list:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"scheduler": self.name}


def _front_op(core: VLMCore, slot: str, units: int, corun: bool) -> Optional[Op]:
    """FIFO within a stage; prefill before vision (shorter, and it feeds the decode batch, §III-D)."""
    if core.prefill_q:
        r = core.prefill_q.popleft()
        return Op("prefill", slot, units, front=r, chunk=r.prompt_tokens - r.prefilled, corun=corun)
    if core.vision_q:
        return Op("vision", slot, units, front=core.vision_q.popleft(), corun=corun)
    return None


class PipelineScheduler(VLMScheduler):
    """Front worker + decode worker co-running on a partition of the device (§III-D)."""

    slots = ("front", "decode")

    def decode_units(self, core: VLMCore, stage: str) -> int:
        raise NotImplementedError

    def _next_front_stage(self, core: VLMCore) -> Optional[str]:
        f = core.running.get("front")
        if f is not None:
            return f.kind
        return "prefill" if core.prefill_q else ("vision" if core.vision_q else None)

    def pick(self, core: VLMCore, now: float) -> list:
        ops = []
        stage = self._next_front_stage(core)
        decode_active = bool(core.decode_ready) or "decode" in core.running
        d = self.decode_units(core, stage) if stage is not None else core.total
        if "front" not in core.running and stage is not None:
            op = _front_op(core, "front", core.total - d if decode_active else core.total, decode_active)
            ops.append(op)
        if "decode" not in core.running and core.decode_ready:
            # in-flight batching: everyone ready joins; those finishing prefill meanwhile join the next one
            co = "front" in core.running or bool(ops)
            ops.append(Op("decode", "decode", d if co else core.total, batch=list(core.decode_ready), corun=co))
        return ops


class NovaScheduler(PipelineScheduler):
    name = "nova"

    def __init__(self, plan: PartitionPlan) -> None:
        self.plan = plan
        self.history: list = []  # (pending, stage, decode units) per decision

    def decode_units(self, core: VLMCore, stage: str) -> int:
        p = core.pending_front()
        d = self.plan.decode_units(stage, p)  # Eq. 5
        self.history.append((p, stage, d))
        return d

    def describe(self) -> dict:
        return {"scheduler": self.name, **self.plan.describe()}


class StaticPartitionScheduler(PipelineScheduler):
    name = "static_partition"

    def __init__(self, n_v: int, n_p: int) -> None:
        self.n_v, self.n_p = int(n_v), int(n_p)

    def decode_units(self, core: VLMCore, stage: str) -> int:
        return self.n_v if stage == "vision" else self.n_p

    def describe(self) -> dict:
        return {"scheduler": self.name, "n_v": self.n_v, "n_p": self.n_p}


class OneWorkerScheduler(VLMScheduler):
    """The sequential baselines: one worker with the whole device, one op at a time."""

    def pick(self, core: VLMCore, now: float) -> list:
        return [] if "worker" in core.running else self.pick_idle(core)

    def pick_idle(self, core: VLMCore) -> list:
        raise NotImplementedError


class FcfsScheduler(OneWorkerScheduler):
    """Sequential, one stage at a time, the oldest request's next stage first."""
    name = "fcfs"

    def pick_idle(self, core: VLMCore) -> list:
        cands = []
        if core.decode_ready:
            cands.append((min(r.arrival for r in core.decode_ready), 0))
        if core.prefill_q:
            cands.append((core.prefill_q[0].arrival, 1))
        if core.vision_q:
            cands.append((core.vision_q[0].arrival, 2))
        if not cands:
            return []
        _, which = min(cands)
        if which == 0:
            return [Op("decode", "worker", core.total, batch=list(core.decode_ready))]
        if which == 1:
            r = core.prefill_q.popleft()
            return [Op("prefill", "worker", core.total, front=r, chunk=r.prompt_tokens - r.prefilled)]
        return [Op("vision", "worker", core.total, front=core.vision_q.popleft())]


class PrefillFirstScheduler(OneWorkerScheduler):
    """PF-Limit (§V-A7): vision/prefill first; decode once `limit` requests wait for it."""
    name = "prefill_first"

    def __init__(self, limit: int = 5) -> None:
        self.limit = int(limit)

    def pick_idle(self, core: VLMCore) -> list:
        if core.decode_ready and (len(core.decode_ready) >= self.limit or not (core.prefill_q or core.vision_q)):
            return [Op("decode", "worker", core.total, batch=list(core.decode_ready))]
        op = _front_op(core, "worker", core.total, False)
        return [op] if op else []


class ChunkedPrefillScheduler(OneWorkerScheduler):
    """Sarathi-style hybrid batches: every running decode plus a prefill chunk, under a token budget."""
    name = "chunked_prefill"

    def __init__(self, budget: int = 128) -> None:
        self.budget = int(budget)

    def pick_idle(self, core: VLMCore) -> list:
        batch = list(core.decode_ready)
        if core.prefill_q:
            r = core.prefill_q.popleft()
            chunk = min(r.prompt_tokens - r.prefilled, max(1, self.budget - len(batch)))
            return [Op("hybrid", "worker", core.total, front=r, batch=batch, chunk=chunk)]
        if core.vision_q:  # the vision encoder shares no weights with the LLM: it runs alone (§II-C1)
            return [Op("vision", "worker", core.total, front=core.vision_q.popleft())]
        if batch:
            return [Op("decode", "worker", core.total, batch=batch)]
        return []

    def describe(self) -> dict:
        return {"scheduler": self.name, "budget": self.budget}


VLM_SCHEDULERS: Registry = Registry("vlm scheduler")
VLM_SCHEDULERS.register("nova", NovaScheduler)
VLM_SCHEDULERS.register("static_partition", StaticPartitionScheduler)
VLM_SCHEDULERS.register("fcfs", FcfsScheduler)
VLM_SCHEDULERS.register("prefill_first", PrefillFirstScheduler)
VLM_SCHEDULERS.register("chunked_prefill", ChunkedPrefillScheduler)


def make_vlm_scheduler(name: str, plan: PartitionPlan, **params) -> VLMScheduler:
    """A scheduler by name; nova takes the plan, static_partition the plan's n0 unless given."""
    if name == "nova":
        return VLM_SCHEDULERS.create(name, plan=plan, **params)
    if name == "static_partition":
        params.setdefault("n_v", plan.n0_v)
        params.setdefault("n_p", plan.n0_p)
    return VLM_SCHEDULERS.create(name, **params)
