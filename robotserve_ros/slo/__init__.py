"""SLO-aware LLM serving around `core/slo` (seed 004): the long-tail request mix, the
virtual-clock simulator and the disaggregated prefill/decode workers (`robotserve bench slo`,
bench/slo.py, drives them)."""
