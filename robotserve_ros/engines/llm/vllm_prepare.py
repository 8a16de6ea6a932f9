"""A vLLM-ready copy of the converted SmolLM2 folder (`make vllm` runs this; stdlib only).

Under transformers 5 (vLLM's venv) the converted folder's `tokenizer_class: LlamaTokenizer`
loads a slow tokenizer whose ids differ from transformers 4.57's and the text comes out
garbled; `PreTrainedTokenizerFast` reads tokenizer.json and gives the same ids
(shared/notes/ray-vllm-openpi.md). The weights are hard-linked where the file system allows.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

TOKENIZER_CLASS = "PreTrainedTokenizerFast"


def prepare_model(src: Path, dst: Path) -> Path:
    src, dst = Path(src), Path(dst)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} is not a converted model folder (run `robotserve llm-convert`)")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if not f.is_file() or f.name == "tokenizer_config.json":
            continue
        target = dst / f.name
        target.unlink(missing_ok=True)
        try:
            os.link(f, target)
        except OSError:
            shutil.copy2(f, target)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = TOKENIZER_CLASS
    cfg.pop("add_prefix_space", None)  # the fast tokenizer takes its pre-tokenizer from tokenizer.json
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return dst


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m robotserve_ros.engines.llm.vllm_prepare SRC_DIR DST_DIR", file=sys.stderr)
        return 2
    try:
        print(prepare_model(Path(argv[0]), Path(argv[1])))
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
