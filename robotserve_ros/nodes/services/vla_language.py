"""`vla_language`: language from the VLA that serves the actions (seed 001, OxyGen).

With the inference server's engine `oxygen` (SmolVLA with a unified KV cache):
- srv/Infer with `language_prompt` set: the round's action chunk comes back as always, the
  reply's `language_id` names the language request started from the same observation's
  prefill; its tokens stream on msg/LanguageOutput (`output_topic`), a few per frame;
- srv/Generate (`generate_service`): a standalone question about an observation (its
  images), or, with no images, about the task's latest served frame; answered whole.

Decoding runs in core/language_frames.py's serving core on core/loop.py's LiveDriver: one
batched round (k tokens for every active request) per action frame, never while an action
batch is in flight. A bad request gets its Status (BAD_PROMPT, UNKNOWN_TASK,
BAD_OBSERVATION, OVERLOADED) and nobody else is affected.

Parameters (the server's `vla_language` section): generate_service, output_topic,
tokens_per_frame (k; default: the engine's), default_max_tokens, idle_frame_s (a round when
no frame came for this long), answer_timeout_s; policy_dir (+ engine keyword parameters)
builds an engine of its own when the server's engine is not oxygen (then no Infer language).
"""
from __future__ import annotations

import threading
import time
from typing import Optional

from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.qos import QoSProfile, ReliabilityPolicy

from ...core.clock import WallClock
from ...core.errors import RequestError
from ...core.language_frames import LanguageFrameCore, LanguageRequest
from ...core.loop import LiveDriver
from ...core.observation import BadObservation
from ...msg import LanguageOutput
from ...srv import Generate
from ..common import service_qos
from ..convert import fill_status, observation_from_msg


class _Waiter:
    __slots__ = ("event", "arrival", "first", "last", "state")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.arrival = time.monotonic()
        self.first: Optional[float] = None
        self.last: Optional[float] = None
        self.state = None


class VlaLanguageService:
    def __init__(self, node, *, generate_service: str = "/robotserve/generate",
                 output_topic: str = "/robotserve/language", tokens_per_frame: Optional[int] = None,
                 default_max_tokens: Optional[int] = None, idle_frame_s: float = 0.05,
                 answer_timeout_s: float = 60.0, policy_dir: Optional[str] = None, **engine_params) -> None:
        from ...engines.oxygen import OxyGenEngine

        self.node = node
        eng = getattr(node, "engine", None)
        self.own_engine = not isinstance(eng, OxyGenEngine)
        if self.own_engine:
            if not policy_dir:
                raise ValueError("vla_language: the server's engine is not 'oxygen'; give policy_dir (a SmolVLA "
                                 "checkpoint) for an engine of its own")
            eng = OxyGenEngine(policy_dir=policy_dir, **engine_params)
        elif policy_dir or engine_params:
            raise ValueError(f"vla_language: the server's oxygen engine serves it; policy_dir/"
                             f"{sorted(engine_params)} belong in the server's engine section")
        if tokens_per_frame is not None:
            if int(tokens_per_frame) < 1:
                raise ValueError(f"tokens_per_frame must be >= 1, got {tokens_per_frame}")
            eng.kv.k = int(tokens_per_frame)
        if default_max_tokens is not None:
            if int(default_max_tokens) < 1:
                raise ValueError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
            eng.default_max_tokens = int(default_max_tokens)
        for name, v in (("answer_timeout_s", answer_timeout_s), ("idle_frame_s", idle_frame_s)):
            if not v > 0:
                raise ValueError(f"{name} must be > 0, got {v}")
        self.engine, self.answer_timeout_s = eng, float(answer_timeout_s)
        self.spec = getattr(node, "spec", None) or eng.observation_spec
        self.lock = threading.Lock()
        self.waiters: dict = {}  # language id -> _Waiter (Generate calls and Infer-started requests)
        self.errors: dict = {}
        self.served = {"infer_language": 0, "generate": 0, "tokens": 0}
        self.core = LanguageFrameCore(WallClock(), has_work=self._has_work, decode_round=self._round,
                                      publish=self._publish, idle_frame_s=idle_frame_s,
                                      admit=lambda q: eng.start_language(q.task_id, q.prompt, q.max_tokens,
                                                                         observation=q.observation),
                                      drop=lambda rid, reason: eng.cancel_language(rid))
        self.driver = LiveDriver.for_core(self.core, self.core.run, poll_s=min(0.05, idle_frame_s / 2),
                                          name="vla_language", on_crash=self._crashed)
        self.core.set_kick(self.driver.kick)
        eng.action_listeners.append(self._on_action)
        group = ReentrantCallbackGroup()
        self.pub = node.create_publisher(LanguageOutput, output_topic,
                                         QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
        self.srv = node.create_service(Generate, generate_service, self._on_generate, qos_profile=service_qos(),
                                       callback_group=group)
        node.serve_language(self)  # srv/Infer's language fields (the server's public hook)
        self.driver.start()

    # --- the action path ------------------------------------------------------------------
    def _on_action(self, phase: str) -> None:
        if phase == "start":
            self.core.action_started()
        else:
            self.core.action_ended()

    def attach(self, req, prompt: str, max_tokens: int) -> str:
        """srv/Infer asked for language with this round: the id its reply carries."""
        st = self.engine.request_language(req.task_id, req.round_id, prompt, max_tokens)
        with self.lock:
            self.waiters[st.rid] = _Waiter()
            self.served["infer_language"] += 1
        return st.rid

    def cancel(self, req, rid: str) -> None:
        """The round failed before it was served: its language request goes too."""
        self.engine.cancel_language(rid, req.task_id, req.round_id)
        with self.lock:
            self.waiters.pop(rid, None)

    # --- srv/Generate ---------------------------------------------------------------------
    def _on_generate(self, request, response):
        w = _Waiter()
        try:
            obs = None
            if len(request.observation.images):
                obs = observation_from_msg(request.observation, self.spec)
            st = self.core.submit(LanguageRequest(request.task_id, request.prompt, int(request.max_tokens), obs),
                                  then=lambda st: self._wait_for(st.rid, w))
        except (RequestError, BadObservation) as e:
            code = getattr(e, "code", "bad_observation")
            self._count(code)
            fill_status(response.status, code, getattr(e, "message", str(e)))
            return response
        limit = float(request.deadline_s) if request.deadline_s > 0 else self.answer_timeout_s
        if not w.event.wait(limit):
            self.core.cancel(st.rid, "deadline")
            with self.lock:
                self.waiters.pop(st.rid, None)
            self._count("deadline")
            fill_status(response.status, "bad_deadline", f"no answer within {limit:.3g} s; the request was ended")
            return response
        st = w.state
        if st.reason not in ("eos", "length"):
            fill_status(response.status, st.reason or "internal", st.error or f"ended: {st.reason}")
            return response
        fill_status(response.status, "ok")
        response.text = self.engine.decode_text(st.tokens)
        response.prompt_tokens = int(st.prompt_tokens)
        response.output_tokens = len(st.tokens)
        response.ttft_s = (w.first or w.last) - w.arrival
        response.tpot_s = ((w.last - w.first) / (len(st.tokens) - 1)) if len(st.tokens) > 1 else 0.0
        response.latency_s = w.last - w.arrival
        return response

    def _wait_for(self, rid: str, w) -> None:
        with self.lock:
            self.waiters[rid] = w
            self.served["generate"] += 1

    # --- decoding (the LiveDriver's decode slot) ------------------------------------------
    def _has_work(self) -> bool:
        return len(self.engine.kv) > 0

    def _round(self) -> list:
        out = self.engine.decode_frame()
        return out + [(st, None) for st in self.engine.take_failed()]

    def _publish(self, results) -> None:
        now = time.monotonic()
        for st, new in results:
            with self.lock:
                w = self.waiters.get(st.rid)
                if w is not None:
                    if new and w.first is None:
                        w.first = now
                    w.last = now
                    if st.finished:
                        w.state = st
                        self.waiters.pop(st.rid, None)
            m = LanguageOutput()
            m.header.stamp = self.node.get_clock().now().to_msg()
            m.task_id, m.language_id = st.task_id, st.rid
            m.text = self.engine.decode_text(new or [])
            m.output_tokens = len(st.tokens)
            m.finished = bool(st.finished)
            if new is None or st.reason not in ("", "eos", "length"):
                self._count(st.reason or "internal")
                fill_status(m.status, st.reason or "internal", st.error or st.reason)
            else:
                fill_status(m.status, "ok")
                self.served["tokens"] += len(new)
            self.pub.publish(m)
            if w is not None and st.finished:
                w.event.set()

    def _crashed(self, slot, item, exc) -> None:
        """A decode round failed: end every active request with INTERNAL (others' actions go on)."""
        self.node.get_logger().error(f"vla_language: decode round failed: {exc!r}")
        for st in self.engine.kv.active():
            self.engine.kv.remove(st.rid, "engine_failure")
            st.error = f"the decode round failed ({type(exc).__name__})"
            self._publish([(st, None)])

    def _count(self, code: str) -> None:
        with self.lock:
            self.errors[code] = self.errors.get(code, 0) + 1

    # --- the server's view ----------------------------------------------------------------
    def stats(self) -> dict:
        kv = self.engine.kv
        return {"active": len(kv), "kv_bytes": kv.kv_bytes(), "avg_decode_batch": round(kv.avg_decode_batch(), 3),
                "tokens_per_frame": kv.k, **self.served, **self.core.counts,
                **{f"errors/{k}": v for k, v in self.errors.items()}}

    def close(self) -> None:
        self.driver.close()
        if getattr(self.node, "language", None) is self:
            self.node.serve_language(None)
        with self.lock:
            waiting = list(self.waiters.items())
            self.waiters.clear()
        for st in self.engine.kv.active():
            self.engine.kv.remove(st.rid, "shutting_down")
            st.error = "the server is shutting down"
        for rid, w in waiting:
            if w.state is None:
                from ...core.kv_manager import LanguageState

                w.state = LanguageState(rid=rid, task_id="", max_tokens=0, prompt_tokens=0, finished=True,
                                        reason="shutting_down", error="the server is shutting down")
            w.event.set()
        if self.own_engine:
            self.engine.close()
