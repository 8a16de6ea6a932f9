"""TimelyLLM (seed 002) around the core: trace replay, the virtual-clock simulator, the live
server (serving core + LLM engine on core/loop.py's LiveDriver); `robotserve bench timely` is bench/timely.py."""
