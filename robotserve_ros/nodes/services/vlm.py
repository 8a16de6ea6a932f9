"""`vlm`: questions about what a robot sees (srv/Generate), served by Nova's staged VLM on the
inference server (seed 003).

The request's prompt and first image (observation.images[0]) go through vision encode ->
prefill -> batched decode in core.nova's serving core (scheduler `chunked_prefill` by default,
the measured best here, docs/defaults.md; `nova` or any other baseline by the `scheduler`
parameter), driven by the same LiveDriver as every live path. Action chunks keep
their share of the machine: the VLM's stage workers run on `cores` (default: all), with at
most `threads` intra-op threads each and `nice` added to their scheduling priority, and at
most `max_pending` questions are admitted (more get OVERLOADED). A bad request (empty or
over-long prompt, wrong image, impossible deadline) gets its Status code; others go on.

Parameters (the server's `vlm` section): service, shape, scheduler, max_tokens,
max_prompt_words, max_pending, cores, threads, nice, seed.
"""
from __future__ import annotations

import os
import threading
from collections import Counter

from rclpy.callback_groups import ReentrantCallbackGroup

from ...core.errors import RequestError
from ...core.nova import PartitionPlan, StageProfile, VLMCore, VLMRequest, make_vlm_scheduler
from ...core.nova.live import NovaServer
from ...core.nova.serving import VLM_SCHEDULERS
from ...core.observation import ObservationSpec, decode_image
from ...srv import Generate
from ..common import service_qos
from ..convert import fill_status


def _default_profile(total: int) -> StageProfile:
    """Shape-only profile for the partition plan when none was measured: compute-bound front
    stages (1/units), memory-bound decode (flat above a third of the units)."""
    units = range(1, total + 1)
    sat = max(1, total // 3)
    return StageProfile(total=total, vision={u: 0.2 / u for u in units}, prefill={u: (0.005 / u, 0.0005 / u)
                                                                              for u in units},
                        decode={u: {1: 0.015 * max(1.0, sat / u), 8: 0.02 * max(1.0, sat / u)} for u in units},
                        measured=False, note="default shape-only profile of the vlm service")


class VlmService:
    def __init__(self, node, *, service: str = "/robotserve/vlm/generate", shape: str = "tiny",
                 scheduler: str = "chunked_prefill", max_tokens: int = 40, max_prompt_words: int = 256, max_pending: int = 16,
                 cores=None, threads: int = 1, nice: int = 5, seed: int = 0, image_max_side: int = 2048) -> None:
        from ...engines import make_engine
        from ...engines.vlm import SHAPES, StageExecutor
        from ...engines.vlm_partition import CpuCorePartition

        if shape not in SHAPES:
            raise ValueError(f"vlm shape {shape!r}: choose one of {', '.join(SHAPES)}")
        if scheduler not in VLM_SCHEDULERS:
            raise ValueError(f"vlm scheduler {scheduler!r}: choose one of {', '.join(VLM_SCHEDULERS.names())}")
        for name, v in (("max_tokens", max_tokens), ("max_prompt_words", max_prompt_words),
                        ("max_pending", max_pending), ("threads", threads)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"vlm {name} must be a whole number >= 1, got {v!r}")
        self.node, self.max_tokens, self.max_words, self.max_pending = node, max_tokens, max_prompt_words, max_pending
        self.nice = int(nice)
        allowed = sorted(os.sched_getaffinity(0))
        cores = allowed if cores is None else [int(c) for c in cores]
        if not cores or any(c not in allowed for c in cores):
            raise ValueError(f"vlm cores {cores!r}: choose from {allowed}")
        self.mech = CpuCorePartition(cores=cores, max_threads=threads)
        self.vlm = make_engine("vlm", None, shape=shape, seed=seed)
        self.executor = StageExecutor(self.vlm, self.mech)
        total = max(2, self.mech.total)
        plan = PartitionPlan(_default_profile(total), tokens=max_tokens)
        self.core = VLMCore(make_vlm_scheduler(scheduler, plan), total)
        self.server = NovaServer(self.core, self._execute).start()
        self.spec = ObservationSpec(max_bytes=3 * image_max_side * image_max_side)
        self.image_max_side = image_max_side
        self.counts: Counter = Counter()
        self.latencies: list = []
        self._lock = threading.Lock()
        self._pending: dict = {}
        self._closing = False
        self._seq = 0
        self._niced: set = set()
        self.srv = node.create_service(Generate, service, self._on_generate, qos_profile=service_qos(),
                                       callback_group=ReentrantCallbackGroup())

    def _execute(self, op) -> None:
        tid = threading.get_native_id()
        if self.nice and tid not in self._niced:  # below the action-chunk runner's threads
            try:
                os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + self.nice))
            except OSError:
                pass
            self._niced.add(tid)
        self.executor(op)

    def _refuse(self, response, code: str, message: str):
        with self._lock:
            self.counts[code] += 1
        fill_status(response.status, code, message)
        return response

    def _on_generate(self, request, response):
        if self._closing:
            return self._refuse(response, "shutting_down", "the vlm service is stopping")
        prompt = request.prompt
        words = prompt.split()
        if not words:
            return self._refuse(response, "bad_prompt", "prompt is empty")
        if len(words) > self.max_words:
            return self._refuse(response, "bad_prompt", f"prompt has {len(words)} words, at most {self.max_words}")
        if not (request.deadline_s >= 0 and request.ttft_slo_s >= 0 and request.tpot_slo_s >= 0):
            return self._refuse(response, "bad_deadline", "deadline_s and SLOs must be >= 0")
        max_tokens = int(request.max_tokens) or self.max_tokens
        if max_tokens > self.max_tokens:
            return self._refuse(response, "bad_request", f"max_tokens {max_tokens} > the server's {self.max_tokens}")
        image = None
        if request.observation.images:
            im = request.observation.images[0]
            try:
                if max(im.width, im.height) > self.image_max_side:
                    raise RequestError(f"image is {im.width}x{im.height}, at most {self.image_max_side} a side")
                image = decode_image(0, im.encoding, im.width, im.height, im.step, im.data, self.spec)
            except RequestError as e:
                return self._refuse(response, getattr(e, "code", "bad_observation"), e.message)
            if image.shape[-1] == 1:
                image = image.repeat(3, axis=-1)
            elif im.encoding == "bgr8":
                image = image[..., ::-1]
        with self._lock:
            if len(self._pending) >= self.max_pending:
                self.counts["overloaded"] += 1
                fill_status(response.status, "overloaded", f"{len(self._pending)} questions in progress, "
                                                           f"at most {self.max_pending}")
                return response
            f = self.executor.request_fields(image, prompt)
            self._seq += 1
            req = VLMRequest(f"{request.request_id}#{self._seq}", None, tiles=f["tiles"],
                             prompt_tokens=f["prompt_tokens"], max_tokens=max_tokens, payload=f["payload"])
            self._pending[id(req)] = req
        ev = self.server.submit(req)
        ev.wait(request.deadline_s if request.deadline_s > 0 else None)
        with self._lock:
            self._pending.pop(id(req), None)
        if not ev.is_set():
            self.server.cancel(req, "deadline")  # no more work on an answer nobody waits for
            return self._refuse(response, "task_dropped", f"not answered within deadline_s {request.deadline_s}")
        if req.error is not None:
            code = "shutting_down" if req.error == "shutting_down" else "engine_failure"
            return self._refuse(response, code, req.error)
        seq = req.payload["seq"]
        fill_status(response.status, "ok")
        response.text = self.vlm.detokenize(seq.tokens)
        response.prompt_tokens = req.prompt_tokens
        response.output_tokens = len(seq.tokens)
        response.ttft_s = req.t_prefill[1] - req.arrival
        response.tpot_s = (req.t_done - req.t_prefill[1]) / max(1, len(seq.tokens) - 1)
        response.latency_s = req.latency_s
        with self._lock:
            self.counts["ok"] += 1
            self.latencies = (self.latencies + [req.latency_s])[-200:]
        return response

    def stats(self) -> dict:
        with self._lock:
            lat = sorted(self.latencies)
            return {"answered": self.counts["ok"], "refused": sum(v for k, v in self.counts.items() if k != "ok"),
                    "in_progress": len(self._pending), "scheduler": self.core.sched.name,
                    "avg_latency_s": round(sum(lat) / len(lat), 4) if lat else 0.0,
                    "max_latency_s": round(lat[-1], 4) if lat else 0.0,
                    **{f"refused_{k}": v for k, v in self.counts.items() if k != "ok"}}

    def close(self) -> None:
        self._closing = True
        self.server.close("shutting_down")  # waiting calls return SHUTTING_DOWN
