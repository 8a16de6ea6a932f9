"""The Fleet: the one port between every client protocol and the serving core.

A protocol (srv/Infer, openpi, LeRobot gRPC, the GPU server, a test's JSON lines) opens a
`Session` and submits plain InferenceRequests; each submit returns a
concurrent.futures.Future of the round's ChunkReply (or the engine's full ChunkResult for
an `untrimmed` session). The Fleet owns what every protocol used to keep for itself: the one
table of waiting calls keyed by (task, round), reply routing, a re-sent (task, round) (run
once: the newer call gets the reply, the older `duplicate_request` saying where the round is
and when it is expected; an answered one its cached reply; counted `resent` / `replayed` per
protocol), admission (core/admission.py: robots past capacity refused `overloaded` with the
reason), dropping and reaping tasks, `max_waiting`, task authentication and per-protocol counts. A
refusal is a RequestError whose `code` is one of the core's or REFUSALS below; each
protocol maps the code to its own wire. As vLLM v1's EngineCoreClient: one way in, plain
data across it, so the Fleet could live in another process behind the same interface.

Future callbacks run in the thread that answers the round, under the fleet's lock: keep
them short (fill a response, wake a loop); they may submit again (the lock is re-entrant).
"""
from __future__ import annotations

import threading
from collections import Counter, defaultdict
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from ..core.admission import Admission, tier_rounds_per_s
from ..core.errors import Overloaded, RequestError
from ..core.liveness import LastHeard
from ..core.runner import Runner
from ..core.serving import ServingCore
from ..core.types import InferenceRequest

# Refusals the Fleet itself gives (the core's own codes come from core/errors.py).
REFUSALS = ("overloaded", "duplicate_request", "task_dropped", "shutting_down", "engine_failure",
            "not_task_owner", "reply_timeout", "interface_mismatch")


class Refused(RequestError):
    """A refusal with one of REFUSALS as its code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Proof:
    """A message's task-authentication proof (core/task_auth.py): its stamp (the sequence
    number), its MAC, and the bytes the MAC covers (the whole message, MAC field empty)."""

    stamp_ns: int = 0
    mac: bytes = b""
    body: bytes = b""
    kind: str = "infer"


def _settle(fut: Future, result=None, error: Optional[Exception] = None) -> None:
    """Answer a future its caller may have cancelled meanwhile (an asyncio wait that timed out)."""
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    except InvalidStateError:
        pass


@dataclass
class _Call:
    future: Future
    session: "Session"


class Session:
    """One robot's (or one connection's) way into the fleet, under one protocol name."""

    def __init__(self, fleet: "Fleet", protocol: str, robot: str = "", auth: Optional[Proof] = None,
                 untrimmed: bool = False) -> None:
        self.fleet, self.protocol, self.robot, self.auth, self.untrimmed = fleet, protocol, robot, auth, untrimmed
        self.tasks: set = set()  # the tasks it submitted and that are still known

    def submit(self, req: InferenceRequest, proof: Optional[Proof] = None) -> Future:
        """Queue one round; the future gets its reply, or a RequestError (refused, dropped,
        failed). Already done when refused at once or answered from the reply cache."""
        return self.fleet._submit(self, req, proof or self.auth)

    def refuse(self, err: RequestError) -> None:
        """A request refused by the protocol's codec before it reached the fleet: counted."""
        self.fleet.count_error(err, self.protocol, self.robot)

    def withdraw(self, task_id: str, round_id: int) -> None:
        """The caller stopped waiting (its own timeout): the round stays queued, its reply unrouted."""
        with self.fleet.lock:
            call = self.fleet._calls.get((task_id, round_id))
            if call is not None and call.session is self:
                del self.fleet._calls[(task_id, round_id)]

    def drop(self, task_id: str, code: str = "task_dropped", message: str = "the robot left") -> None:
        """One task of this session ends: its queued round, its waiting calls, its engine state go."""
        self.fleet.drop(task_id, code, message)

    def close(self, code: str = "task_dropped", message: str = "the robot left") -> None:
        for t in list(self.tasks):
            self.fleet.drop(t, code, message)


class Fleet:
    """A ServingCore and its Runner (built by serve/build.py), and the sessions on them.

    max_waiting: at most this many calls wait for their rounds (OVERLOADED past it);
    binder: a core.task_auth.TaskBinder (every message proves its robot by a MAC over its whole
    body, in sequence; the first request opens the task, in its robot's namespace). Without
    one, a task still belongs to the protocol and robot of the session that opened it;
    task_timeout_s: a task not heard from for this long is dropped by reap();
    admission: a core.admission.Admission (a new robot past capacity is refused)."""

    def __init__(self, core: ServingCore, engines: Mapping[str, object], *, max_waiting: Optional[int] = None,
                 binder=None, task_timeout_s: Optional[float] = None, now: Optional[Callable[[], float]] = None,
                 lock=None, admission: Optional[Admission] = None, **runner_kw) -> None:
        self.lock = lock or threading.RLock()  # guards the core, the calls and the sessions; re-entrant
        self._core, self.engines = core, dict(engines)
        self.clock = core.clock
        self._runner = Runner(core, self.engines, self._on_replies, lock=self.lock, on_given_up=self._given_up,
                              **runner_kw)
        self.max_waiting, self.binder, self.admission = max_waiting, binder, admission
        self.heard = LastHeard(task_timeout_s, now or core.clock.now) if task_timeout_s else None
        self._calls: dict = {}  # (task_id, round_id) -> _Call: the one table of waiting calls
        self._owner: dict = {}  # task id -> its Session
        self.counts: dict = defaultdict(Counter)  # protocol -> submitted / served / refused:<code>
        # (robot, refused:<code> / resent / replayed / given_up) -> its sessions' requests (the metrics' per robot)
        self.robot_counts: Counter = Counter()
        self.mix: Counter = Counter()  # batches by the protocols of the robots in them
        self.batch_listeners: list = []  # (replies, dispatch, results) after every batch, under the lock

    @property
    def core(self) -> ServingCore:
        """The core itself, for tests and benches that look inside; front ends use the methods below."""
        return self._core

    # --- life ---------------------------------------------------------------------------------
    def start(self) -> "Fleet":
        self._runner.start()
        return self

    def close(self) -> None:
        with self.lock:
            for key in list(self._calls):
                self._answer(key, error=Refused("shutting_down", "the server is shutting down"))
        self._runner.close()

    def session(self, protocol: str, robot: str = "", auth: Optional[Proof] = None, untrimmed: bool = False) -> Session:
        return Session(self, protocol, robot, auth, untrimmed)

    # --- rounds in ------------------------------------------------------------------------------
    def _submit(self, s: Session, req: InferenceRequest, proof: Optional[Proof]) -> Future:
        fut: Future = Future()
        key = (req.task_id, req.round_id)
        with self.lock:
            try:
                opened = self._admit(s, req, proof, key)
            except RequestError as e:  # refused before the core saw it: counted there too
                self._count(e)
                return self._refused(s, req, fut, e)
            try:
                self.counts[s.protocol]["submitted"] += 1
                self._runner.submit(req, then=lambda p: self._register(s, key, fut, p, req))
            except RequestError as e:  # counted by the core
                if self.admission is not None and req.task_id not in self._core.ledger.tasks:
                    self.admission.forget(s.robot or req.task_id)  # a refused round 0 admits nobody
                return self._refused(s, req, fut, e, opened)
        return fut

    def _admit(self, s: Session, req: InferenceRequest, proof: Optional[Proof], key: tuple) -> bool:
        """A task is its opener's: the same protocol and robot (every protocol), and with a
        binder the robot proven by a MAC over the message, in sequence (core/task_auth.py).
        True: this request opened its task in the binder."""
        owner = self._owner.get(req.task_id)
        if owner is not None and (owner.protocol, owner.robot) != (s.protocol, s.robot):
            raise Refused("not_task_owner", f"task {req.task_id!r} was opened by another robot")
        opened = self.binder is not None and self._check_owner(req.task_id, s.robot, proof, bind=True)
        if self.max_waiting is not None and len(self._calls) >= self.max_waiting and key not in self._calls:
            if opened:
                self.binder.forget(req.task_id)
            raise Overloaded(f"{self.max_waiting} calls are waiting for their rounds; send it again later")
        if self.admission is not None and self.admission.active and req.task_id not in self._core.ledger.tasks:
            why = self.admission.refuse(s.robot or req.task_id, self.clock.now())
            if why is not None:
                if opened:
                    self.binder.forget(req.task_id)
                raise Overloaded(f"robot {s.robot or req.task_id!r} not admitted: {why}")
        return opened

    def _refused(self, s: Session, req: InferenceRequest, fut: Future, e: RequestError, opened: bool = False) -> Future:
        self.counts[s.protocol]["refused:" + e.code] += 1
        self.robot_counts[(s.robot, "refused:" + e.code)] += 1
        if opened and req.task_id not in self._core.ledger.tasks:
            self.binder.forget(req.task_id)  # a refused first request opens nothing
        fut.set_exception(e)
        return fut

    def _register(self, s: Session, key: tuple, fut: Future, pending, req: InferenceRequest) -> None:
        """Under the lock, before any batch can take the round."""
        task = key[0]
        self._owner[task] = s
        s.tasks.add(task)
        if self.heard is not None:
            self.heard.heard(task)
        if pending.replay is not None:  # a re-sent round already answered: its cached reply
            self.counts[s.protocol]["replayed"] += 1
            self.robot_counts[(s.robot, "replayed")] += 1
            _settle(fut, pending.replay)
            return
        if pending.request is not req:  # a re-send of a round still queued or generating: run once,
            self.counts[s.protocol]["resent"] += 1  # the newest call gets the reply (an older may be abandoned)
            self.robot_counts[(s.robot, "resent")] += 1
            self._answer(key, error=Refused("duplicate_request", f"round {key[1]} was sent again while "
                                            f"{self._where(pending)}: its reply goes to the newer call"))
        elif self.admission is not None:
            self.admission.round(s.robot or task, pending.arrival)
        self._calls[key] = _Call(fut, s)

    def expected_wait_s(self) -> float:
        """How long a round sent now should wait for its chunk: the rounds queued ahead at the
        rate the tiers serve at their batch limits (their engine profiles), plus one batch."""
        with self.lock:
            tiers, rate = self._core.tiers, tier_rounds_per_s(self._core.tiers)
            batch_s = max(t.profile.latency_s(t.batch_limit) for t in tiers)
            return len(self._core.pending) / rate + batch_s if rate > 0 else batch_s

    def _where(self, p) -> str:
        """Under the lock: where a re-sent round is, and when the queue should serve it."""
        core = self._core
        if core.pending.get(p.task_id) is not p:
            return "generating"
        ahead = sum(1 for q in core.pending.values() if q.seq < p.seq)  # in arrival order: the scheduler's may differ
        rate = tier_rounds_per_s(core.tiers)
        return f"queued behind {ahead} (expected in about {ahead / rate:.2f} s)" if rate > 0 else f"queued behind {ahead}"

    def _check_owner(self, task_id: str, robot: str, proof: Optional[Proof], bind: bool) -> bool:
        p = proof or Proof()
        return self.binder.check(task_id, robot, p.kind, p.stamp_ns, p.body, p.mac, self.clock.now(), bind=bind)

    def check_owner(self, task_id: str, robot: str, proof: Optional[Proof]) -> None:
        """A message about an open task (progress, a fresh observation) is its robot's, and
        not a replay: NotTaskOwner (a `not_task_owner` refusal) if not."""
        if self.binder is not None:
            with self.lock:
                self._check_owner(task_id, robot, proof, bind=False)

    def count_error(self, err: RequestError, protocol: str = "?", robot: str = "") -> None:
        with self.lock:
            self._count(err)
            self.counts[protocol]["refused:" + err.code] += 1
            self.robot_counts[(robot, "refused:" + err.code)] += 1

    def _count(self, err: RequestError) -> None:
        """Under the lock: a refusal by kind, and its reason as the newest of its kind (what
        `up` and `status` show the operator)."""
        self._core.stats.errors[err.code] += 1
        self._core.stats.last_error[err.code] = str(err)

    # --- replies out (engine threads, under the lock) ----------------------------------------------
    def _answer(self, key: tuple, reply=None, error: Optional[Exception] = None) -> None:
        call = self._calls.pop(key, None)
        if call is not None:
            if error is None:
                self.counts[call.session.protocol]["served"] += 1
            _settle(call.future, reply, error)

    def _on_replies(self, replies, d, results) -> None:
        if d.requests:  # (none: every row's observation was too old, nothing ran)
            self.mix["+".join(sorted({self.protocol_of(p.task_id) for p in d.requests}))] += 1
        full = {(p.task_id, p.request.round_id): r for p, r in zip(d.requests, results)}
        for r in replies:
            key = (r.task_id, r.round_id)
            call = self._calls.get(key)
            self._answer(key, reply=full.get(key) if call is not None and call.session.untrimmed else r)
        for listener in self.batch_listeners:
            listener(replies, d, results)

    def _given_up(self, pendings, exc) -> None:
        """Rounds the engine failed alone (a RequestError: the engine's own code and reason) or
        in max_attempts batches end their calls with the error."""
        for p in pendings:
            rid = p.request.round_id
            self.robot_counts[(self.robot_of(p.task_id), "given_up")] += 1
            if isinstance(exc, RequestError):
                error = Refused(exc.code, f"round {rid}: {exc.message}")
            else:
                error = Refused("engine_failure", f"round {rid} failed {p.failures} batches ({type(exc).__name__}); "
                                                  "send it again")
            self._answer((p.task_id, rid), error=error)

    def protocol_of(self, task_id: str) -> str:
        s = self._owner.get(task_id)
        return s.protocol if s is not None else "?"

    def robot_of(self, task_id: str) -> str:
        """The robot of the session that submitted the task ('' anonymous or unknown)."""
        s = self._owner.get(task_id)
        return s.robot if s is not None else ""

    # --- tasks ---------------------------------------------------------------------------------
    def knows(self, task_id: str) -> bool:
        with self.lock:
            return task_id in self._core.ledger.tasks

    def generating(self, task_id: str) -> bool:
        with self.lock:
            return self._core.generating(task_id)

    def queued(self, task_id: str) -> bool:
        with self.lock:
            return task_id in self._core.pending

    def tasks(self) -> list:
        with self.lock:
            return list(self._core.ledger.tasks)

    def wait_ratio(self, task_id: str) -> float:
        with self.lock:
            ledger = self._core.ledger
            return ledger.wait_ratio(task_id, self.clock.now()) if task_id in ledger.tasks else 0.0

    def touch(self, task_id: str) -> None:
        """The task's robot was heard (progress): not reaped for task_timeout_s."""
        if self.heard is not None:
            with self.lock:
                self.heard.heard(task_id)

    def finish(self, task_id: str, exec_info, code: str = "task_dropped", message: str = "task finished"):
        """The robot reports its task done: the ledger closes it (its record returned), then it is dropped."""
        with self.lock:
            rec = self._core.finish_task(task_id, exec_info)
            self.drop(task_id, code, message)
            return rec

    def drop(self, task_id: str, code: str = "task_dropped", message: str = "the task was dropped") -> None:
        """The task goes: its queued round, its waiting calls (answered `code`), its engine state."""
        with self.lock:
            self._core.cancel(task_id)
            for eng in {id(e): e for e in self.engines.values()}.values():
                forget = getattr(eng, "forget", None)
                if forget is not None:
                    forget(task_id)
            if self.heard is not None:
                self.heard.forget(task_id)
            if self.binder is not None:
                self.binder.forget(task_id)
            s = self._owner.pop(task_id, None)
            if s is not None:
                s.tasks.discard(task_id)
            if self.admission is not None and (s is None or not s.robot):  # (a robot keeps its place across tasks)
                self.admission.forget(task_id)
            for key in [k for k in self._calls if k[0] == task_id]:
                self._answer(key, error=Refused(code, message))

    def reap(self) -> list:
        """Drop the tasks not heard from for task_timeout_s; returns their ids."""
        if self.heard is None:
            return []
        with self.lock:
            gone = self.heard.silent()
            t = self.heard.timeout_s
            for tid in gone:
                if self.admission is not None and tid in self._owner:  # its robot is gone: its place too
                    self.admission.forget(self._owner[tid].robot or tid)
                self.drop(tid, "task_dropped", f"task '{tid}' was reaped after {t} s of silence")
        return gone

    def drop_all(self, code: str, message: str) -> None:
        with self.lock:
            for tid in list(self._core.ledger.tasks):
                self.drop(tid, code, message)

    # --- what the fleet shows ---------------------------------------------------------------------
    def waiting(self) -> int:
        with self.lock:
            return len(self._calls)

    def protocol_stats(self) -> dict:
        with self.lock:
            return {p: dict(c) for p, c in self.counts.items()}

    def batches_by_protocols(self) -> dict:
        with self.lock:
            return dict(self.mix)

    def core_stats(self) -> dict:
        """The core's counts in plain data (batches, served, errors, mean batch)."""
        with self.lock:
            s = self._core.stats
            return {"tasks": len(self._core.ledger.tasks), "batches": s.batches, "served": s.completed,
                    "mean_batch": s.dispatched / s.batches if s.batches else 0.0, "requeued": s.requeued,
                    "errors": dict(s.errors), "obs_age_mean_s": s.obs_age_sum / s.obs_age_n if s.obs_age_n else 0.0,
                    "obs_age_max_s": s.obs_age_max, "refreshes": s.refreshes, "refresh_failures": s.refresh_failures,
                    "engine_failures": sum(self._runner.failures.values()), "busy_s": sum(self._runner.busy_s.values()),
                    "dispatched": s.dispatched, "busy_s_by_tier": dict(self._runner.busy_s),
                    "failures_by_tier": dict(self._runner.failures), "rows_failed": self._runner.rows_failed,
                    "admitted": self.admission.admitted() if self.admission is not None else None,
                    "admission_refused": self.admission.refused if self.admission is not None else 0}

    def observe(self, observer) -> None:
        """A stage observer (core/runner.py STAGES)."""
        self._runner.observe(observer)

    def attach_pool(self, pool, tier: str) -> None:
        """A Ray pool engine whose tier's slots follow its running replicas (transport/ray_pool.py)."""
        pool.attach(self._runner, tier)

    # --- the steps, for a simulator that drives them on its virtual clock (no threads) ----------
    def dispatch_now(self) -> list:
        """The batches the core hands out now: none while nothing waits or every slot is busy."""
        with self.lock:
            if not self._core.pending or not any(t.free for t in self._core.tiers):
                return []
        return self._runner.dispatch()

    def begin(self, d) -> float:
        return self._runner.begin(d)

    def run_engine(self, d) -> list:
        return self._runner.engines[d.tier].infer([p.request for p in d.requests])

    def finish_batch(self, d, results: list, started: float) -> bool:
        return self._runner.finish(d, results, started)

    def fail_batch(self, d, exc: Exception, started: float) -> None:
        self._runner.fail(d, exc, started)

    def end_cooldown(self, tier: str) -> None:
        self._runner.end_cooldown(tier)
