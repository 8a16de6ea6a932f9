"""SLO-aware LLM serving (seed 004, "Kairos" for disaggregated prefill/decode): requests with
TTFT/TPOT SLOs, urgency-ordered prefill, slack-guided decode batching, the core both the live
workers and the simulator drive. Schedulers are (prefill policy, decode policy) pairs."""
from __future__ import annotations

from dataclasses import dataclass

from ..registry import Registry
from ..llm_profile import DecodeLUT, LLMProfile, PrefillProfile
from .decode import ContinuousBatching, DecodePolicy, SlackGuided, tpot_slack
from .prefill import FcfsPrefill, PrefillPolicy, UrgencyPrefill, select_chunks
from .request import BadPrompt, BadSLO, LLMRequest, Overloaded, SLODefaults, SLORequest, resolve_slo
from .serving import DECODE, PREFILL, DecodeItem, PrefillItem, SLOServingCore, StepResult


@dataclass(frozen=True)
class SLOScheduler:
    name: str
    prefill: PrefillPolicy
    decode: DecodePolicy


def _pair(name, prefill_cls, decode_cls, **decode_kw):
    def make(**params) -> SLOScheduler:
        pp = {k: v for k, v in params.items() if k in ("head_candidates",)}
        extra = set(params) - set(pp)
        if extra:
            raise TypeError(f"SLO scheduler '{name}' takes no parameter(s) {sorted(extra)}")
        return SLOScheduler(name, prefill_cls(**pp) if prefill_cls is UrgencyPrefill else prefill_cls(),
                            decode_cls(**decode_kw))

    return make


SLO_SCHEDULERS: Registry[SLOScheduler] = Registry("SLO scheduler")
SLO_SCHEDULERS.register("fcfs_cb", _pair("fcfs_cb", FcfsPrefill, ContinuousBatching))          # DistServe / vLLM
SLO_SCHEDULERS.register("urgency_only", _pair("urgency_only", UrgencyPrefill, ContinuousBatching))
SLO_SCHEDULERS.register("slack_only", _pair("slack_only", FcfsPrefill, SlackGuided))
# The paper's scheduler (§3.1 + §3.2). Not "kairos": that name is seed 000's action scheduler;
# the reports under reports/slo/ predate the rename and call it kairos_slo.
SLO_SCHEDULERS.register("urgency_slack", _pair("urgency_slack", UrgencyPrefill, SlackGuided))
# Algorithm 3 exactly as printed (decode all when no slack, nobody deprioritised): for comparison
SLO_SCHEDULERS.register("urgency_slack_alg3", _pair("urgency_slack_alg3", UrgencyPrefill, SlackGuided, literal=True))


def make_slo_core(scheduler: str, profile: LLMProfile, clock, scheduler_params: dict | None = None, **core_params) -> SLOServingCore:
    s = SLO_SCHEDULERS.create(scheduler, **(scheduler_params or {}))
    return SLOServingCore(s.prefill, s.decode, profile, clock, **core_params)


__all__ = ["SLO_SCHEDULERS", "SLOScheduler", "make_slo_core", "SLOServingCore", "PrefillItem", "DecodeItem",
           "PREFILL", "DECODE", "LLMProfile", "PrefillProfile", "DecodeLUT", "LLMRequest", "SLODefaults", "SLORequest",
           "StepResult",
           "resolve_slo", "BadSLO", "BadPrompt", "Overloaded", "FcfsPrefill", "UrgencyPrefill", "ContinuousBatching",
           "SlackGuided", "PrefillPolicy", "DecodePolicy", "select_chunks", "tpot_slack"]
