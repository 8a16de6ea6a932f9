"""srv/Generate on the inference server: text requests with TTFT/TPOT SLOs served by the
SLO-aware disaggregated core (seed 004): urgency-ordered prefill on one engine instance,
slack-guided decode batching on another, the KV handed between them (core/slo/workers.py).

Parameters (the server's `generate` section, beside `services: [generate]`):
- service: the srv/Generate name (default /robotserve/generate);
- scheduler: urgency_slack | fcfs_cb | urgency_only | slack_only;
- engine: "smollm2" (the converted SmolLM2-135M, `model_dir` or the build's folder),
  "tiny" (a random-weight tiny Llama: tests) or {name: vllm, vllm: {model, python, threads,
  ...}} (a vLLM engine in its own process: engines/llm/vllm_backend.py, docs/vllm.md);
- profile: the LLM SLO profile of record (robotserve_ros/profiles/NAME.json) the schedulers
  predict with (corrected at run time from observed step times);
- ttft_slo_s / tpot_slo_s / max_tokens: what a request naming 0 inherits;
- max_decode_batch, max_queue (more waiting prefills: OVERLOADED), context_limit,
  chat_template (wrap the prompt in the model's chat template), torch_threads (1: each worker
  one core), timeout_s (an answer not ready by then: ENGINE_FAILURE);
- queue_depth: DDS history depth of the service's request and reply queues (the default 10
  lost 86 of 100 concurrent calls unanswered, issue 29); max_in_flight: calls served at
  once, each holding a server thread until answered; the next is OVERLOADED at once.
A request with images is refused BAD_PROMPT (this service serves text; VLM questions belong
to a VLM service); an SLO < 0 or not finite BAD_DEADLINE; an empty or too long prompt
BAD_PROMPT. Errors are counted and never stop the others.
"""
from __future__ import annotations

import math
import threading
import time
from collections import Counter

from ...core.clock import WallClock
from ...core.errors import RequestError
from ...core.slo import SLO_SCHEDULERS, BadPrompt, BadSLO, LLMProfile, SLODefaults, SLORequest, make_slo_core
from ...core.slo.workers import DisaggregatedWorkers
from ..common import service_qos
from ..convert import fill_status

from ...profiles import PROFILES_DIR as PROFILES


def _engines(engine: str, model_dir: str, dtype: str, threads: int):
    from ...engines.torch_env import import_torch

    torch = import_torch()
    if threads > 0:
        torch.set_num_threads(threads)
    if engine == "tiny":
        from ...engines.llm.engine import LLMEngine
        from ...engines.llm.tiny import ByteTokenizer, tiny_llama

        model = tiny_llama(0)
        return (LLMEngine(model, ByteTokenizer(), max_context=1024, name="tiny-llama"),
                LLMEngine(model, ByteTokenizer(), max_context=1024, name="tiny-llama-decode"))
    from ...engines.llm.engine import live_engines

    return live_engines(model_dir or None, dtype or None)


class GenerateService:
    def __init__(self, node, *, service: str = "/robotserve/generate", scheduler: str = "urgency_slack",
                 engine: str | dict = "smollm2", model_dir: str = "", dtype: str = "", profile: str = "smollm2_135m_slo",
                 ttft_slo_s: float = 8.0, tpot_slo_s: float = 0.5, max_tokens: int = 64, max_decode_batch: int = 16,
                 max_queue: int = 256, context_limit: int = 0, chat_template: bool = True, torch_threads: int = 1,
                 timeout_s: float = 300.0, queue_depth: int = 1000, max_in_flight: int = 32) -> None:
        from rclpy.callback_groups import ReentrantCallbackGroup

        from ...srv import Generate

        if scheduler not in SLO_SCHEDULERS:
            raise ValueError(f"scheduler {scheduler!r}: one of {', '.join(SLO_SCHEDULERS.names())}")
        from ...engines.llm.vllm_backend import VLLMEngine, VLLMWorkers, vllm_config

        vcfg = vllm_config(engine)
        if vcfg is None and engine not in ("smollm2", "tiny"):
            raise ValueError(f"engine {engine!r}: one of smollm2, tiny")
        pf = PROFILES / f"{profile}.json"
        if not pf.is_file():
            raise ValueError(f"profile {profile!r}: no {pf}")
        for name, v in (("queue_depth", queue_depth), ("max_in_flight", max_in_flight)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
        if max_in_flight >= getattr(getattr(node, "config", None), "threads", max_in_flight + 1):
            raise ValueError(f"max_in_flight {max_in_flight} is not < the server's threads: a call past it "
                             "must find a thread to be answered OVERLOADED")
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        defaults = SLODefaults(float(ttft_slo_s), float(tpot_slo_s), int(max_tokens))  # ValueError names a bad one
        self.node, self.chat_template, self.timeout_s = node, bool(chat_template), float(timeout_s)
        if vcfg:
            self.pe = self.de = VLLMEngine(**vcfg.host_params())
        else:
            self.pe, self.de = _engines(engine, model_dir, dtype, int(torch_threads))
        self._waiters: dict = {}
        self._lock = threading.Lock()
        self.max_in_flight = max_in_flight
        self._in_flight = threading.BoundedSemaphore(max_in_flight)
        self.errors: Counter = Counter()
        self.answered = 0
        self.core = make_slo_core(scheduler, LLMProfile.load(pf), WallClock(), defaults=defaults,
                                  max_decode_batch=int(max_decode_batch), chunk_tokens=0, max_queue=int(max_queue),
                                  context_limit=int(context_limit) or self.pe.max_context - 1,
                                  kv_handover_in_core=False, on_done=self._on_done)
        self.workers = (VLLMWorkers(self.core, self.pe, scheduler) if vcfg
                        else DisaggregatedWorkers(self.core, self.pe, self.de)).start()
        self.scheduler = scheduler
        self._srv = node.create_service(Generate, service, self._on_generate, qos_profile=service_qos(queue_depth),
                                        callback_group=ReentrantCallbackGroup())

    # --- requests (executor threads) -------------------------------------------------------
    def _on_generate(self, request, response):
        if not self._in_flight.acquire(blocking=False):
            self.errors["overloaded"] += 1
            fill_status(response.status, "overloaded",
                        f"{self.max_in_flight} requests are being served; send it again later")
            return response
        try:
            return self._serve(request, response)
        finally:
            self._in_flight.release()

    def _serve(self, request, response):
        t_in = time.monotonic()
        try:
            rid, ids = self._admit(request)
        except RequestError as e:
            self.errors[e.code] += 1
            fill_status(response.status, e.code, e.message)
            return response
        done = self._waiters[rid]
        if not done.wait(self.timeout_s):
            with self._lock:  # nobody waits any more: the core forgets it when it ends (_on_done)
                self._waiters.pop(rid, None)
            self.core.forget(rid)  # (or now, if it ended just as the wait ran out)
            self.errors["engine_failure"] += 1
            fill_status(response.status, "engine_failure", f"no answer within {self.timeout_s} s")
            return response
        r = self.core.requests.get(rid)
        with self._lock:
            self._waiters.pop(rid, None)
        self.core.forget(rid)
        if r is None or r.failed:
            reason = r.failed if r is not None else "internal"
            code = "shutting_down" if reason == "shutting_down" else "engine_failure"
            self.errors[code] += 1
            fill_status(response.status, code, str(reason))
            return response
        fill_status(response.status, "ok")
        response.text = self.de.decode_text(r.tokens)
        response.prompt_tokens, response.output_tokens = len(ids), r.n_gen
        response.ttft_s, response.tpot_s = float(r.ttft_s), float(r.tpot_s)
        response.latency_s = float(r.done_s - r.arrival_s)
        self.answered += 1
        return response

    def _admit(self, m):
        if m.observation.images:
            raise BadPrompt("this service answers text only: a request with images is a VLM question")
        if not m.prompt.strip():
            raise BadPrompt("the prompt is empty")
        if not m.request_id:
            raise BadPrompt("request_id must be a non-empty string")
        dl = float(m.deadline_s)
        if not math.isfinite(dl) or dl < 0:
            raise BadSLO(f"deadline_s must be >= 0 (0 = none), got {dl!r}")
        ids = self.pe.chat_prompt(m.prompt) if self.chat_template else self.pe.encode(m.prompt)
        rid = f"{m.task_id}/{m.request_id}"
        ev = threading.Event()
        with self._lock:
            if rid in self._waiters:
                raise BadPrompt(f"request {m.request_id!r} of task {m.task_id!r} is already being served")
            self._waiters[rid] = ev
        try:
            self.core.submit(SLORequest(rid, len(ids), int(m.max_tokens), float(m.ttft_slo_s), float(m.tpot_slo_s), ids))
        except Exception:
            with self._lock:
                self._waiters.pop(rid, None)
            raise
        self.workers.kick()
        return rid, ids

    def _on_done(self, r) -> None:
        ev = self._waiters.get(r.req_id)
        if ev is not None:
            ev.set()
        else:  # its caller gave up (timeout_s): nothing keeps its record
            self.core.forget(r.req_id)

    # --- server hooks ---------------------------------------------------------------------------
    def stats(self) -> dict:
        s = self.core.snapshot()
        s.update({"scheduler": self.scheduler, "answered": self.answered, "errors": dict(self.errors),
                  "kv_handover_ms_mean": round(self.workers.stats()["kv_handover_ms_mean"], 3)})
        return s

    def close(self) -> None:
        self.core.close("shutting_down")
        self.workers.close()
        getattr(self.pe, "close", lambda: None)()  # the vLLM process
        try:
            self.node.destroy_service(self._srv)
        except Exception:
            pass
