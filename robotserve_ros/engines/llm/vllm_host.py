"""The vLLM engine host: run by the vLLM venv's python (`make vllm`), never imported by the
project (its venv has transformers 4, vLLM needs 5). It serves vLLM's async engine (AsyncLLM)
over its stdin/stdout, one JSON object a line (engines/llm/vllm_client.py is the client):

  in:  {"op": "generate", "id": S, "prompt": [token ids], "max_tokens": N, "priority": P,
        "stop": ["\n"] | null, "min_tokens": M, "ignore_eos": bool, "logprobs": K (0: none)}
       {"op": "abort", "id": S}      {"op": "reset_prefix_cache"}      {"op": "shutdown"}
  out: {"ev": "ready", "load_s": x, "vllm": version}
       {"ev": "tokens", "id": S, "tokens": [new ids]}          (streamed, as generated)
         with "logprobs": [[[id, logprob], ...] per new token] (the top K, and the chosen one) when K > 0
       {"ev": "done", "id": S, "finish": "stop"|"length"|"abort", "prompt": n, "cached": n}
       {"ev": "error", "id": S, "message": text}      {"ev": "reset", "ok": bool}

stdio and no port: nothing listens (vLLM's own engine-core link is ZMQ over IPC files in
TMPDIR), token ids in and out, and vLLM's public per-request `priority` and prefix-cache
counts (`num_cached_tokens`) reach the client unchanged. Greedy decoding (temperature 0).
"""
import asyncio
import json
import os
import sys
import time


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--no-prefix-caching", action="store_true")
    a = ap.parse_args()
    # the protocol owns the real stdout; whatever vLLM prints goes to stderr
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    t0 = time.monotonic()
    import vllm
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(model=a.model, dtype=a.dtype, max_model_len=a.max_model_len, max_num_seqs=a.max_num_seqs,
                           enable_prefix_caching=not a.no_prefix_caching, block_size=a.block_size, scheduling_policy="priority",
                           enforce_eager=True, seed=0)
    engine = AsyncLLM.from_engine_args(args)

    def send(obj) -> None:
        proto.write(json.dumps(obj) + "\n")

    async def generate(m) -> None:
        rid = m["id"]
        sp = SamplingParams(temperature=0.0, max_tokens=int(m["max_tokens"]), min_tokens=int(m.get("min_tokens", 0)),
                            stop=m.get("stop") or None, include_stop_str_in_output=True,
                            ignore_eos=bool(m.get("ignore_eos", False)), output_kind=RequestOutputKind.DELTA,
                            detokenize=bool(m.get("stop")), logprobs=int(m.get("logprobs", 0)) or None)
        finish, cached, n_prompt = "abort", 0, len(m["prompt"])
        try:
            async for out in engine.generate({"prompt_token_ids": m["prompt"]}, sp, request_id=rid,
                                             priority=int(m.get("priority", 0))):
                o = out.outputs[0]
                if o.token_ids:
                    ev = {"ev": "tokens", "id": rid, "tokens": list(o.token_ids)}
                    if sp.logprobs:  # tests compare backends by them (vLLM's own check_logprobs_close)
                        ev["logprobs"] = [[[int(t), float(lp.logprob)] for t, lp in pos.items()] for pos in o.logprobs]
                    send(ev)
                if out.num_cached_tokens is not None:
                    cached = int(out.num_cached_tokens)
                if out.finished:
                    finish = o.finish_reason or "stop"
            send({"ev": "done", "id": rid, "finish": finish, "prompt": n_prompt, "cached": cached})
        except asyncio.CancelledError:
            send({"ev": "done", "id": rid, "finish": "abort", "prompt": n_prompt, "cached": cached})
        except Exception as e:  # one bad request answers its sender only
            send({"ev": "error", "id": rid, "message": f"{type(e).__name__}: {e}"})

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        send({"ev": "ready", "load_s": round(time.monotonic() - t0, 2), "vllm": vllm.__version__})
        tasks = {}
        while True:
            line = await reader.readline()
            if not line:
                break
            try:
                m = json.loads(line)
                op = m["op"]
            except (ValueError, KeyError, TypeError):
                send({"ev": "error", "id": None, "message": "bad line"})
                continue
            if op == "generate":
                t = asyncio.ensure_future(generate(m))
                tasks[m["id"]] = t
                t.add_done_callback(lambda _t, rid=m["id"]: tasks.pop(rid, None))
            elif op == "abort":
                await engine.abort(m["id"])
            elif op == "reset_prefix_cache":  # benchmarks: each run starts with a cold cache
                send({"ev": "reset", "ok": bool(await engine.reset_prefix_cache())})
            elif op == "shutdown":
                break
        for t in list(tasks.values()):
            t.cancel()

    try:
        asyncio.run(serve())
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":  # vLLM starts engine subprocesses: the guard is required
    sys.exit(main())
