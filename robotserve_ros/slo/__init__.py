"""SLO-aware LLM serving around `core/slo` (seed 004): the long-tail request mix, the
virtual-clock simulator, the disaggregated prefill/decode workers, the LLM profiler and
`robotserve bench slo` (bench/slo.py)."""
