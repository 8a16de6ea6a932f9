"""torch_env.import_torch declares the torchvision schema shim only when torchvision's own
compiled ops fail to load. Each case runs in a fresh interpreter (torchvision imports once per
process); test/fixtures/fake_torchvision_ops.py stands in for the ops library of a matching
(CUDA) install, or for one that fails to load."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

from rosutil import REPO_ROOT

if importlib.util.find_spec("torchvision") is None or importlib.util.find_spec("torch") is None:
    # (not importorskip: importing torchvision in this process would need the shim)
    pytest.skip("torch/torchvision not installed", allow_module_level=True)

PRELUDE = f"""
import json, sys
sys.path[:0] = [{str(REPO_ROOT)!r}, {str(REPO_ROOT / 'test' / 'fixtures')!r}]
import torch
import fake_torchvision_ops
"""


def run(body: str) -> dict:
    code = PRELUDE + textwrap.dedent(body)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, cwd=REPO_ROOT)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_ops_that_load_get_no_shim_and_torchvision_uses_them():
    out = run("""
        fake_torchvision_ops.install(torch, loads=True)
        from robotserve_ros.engines import torch_env
        torch_env.import_torch()
        import torchvision
        m = torchvision.models.resnet18(weights=None)
        print(json.dumps({"shim": torch_env.shim_applied(), "has_ops": torchvision.extension._has_ops(),
                          "loaded": fake_torchvision_ops.loaded, "path": torch_env.torchvision_ops_path(),
                          "params": sum(p.numel() for p in m.parameters())}))
    """)
    assert out["shim"] is False and out["has_ops"] is True
    assert out["loaded"] == [out["path"]]  # loaded once, by import_torch, and reused by torchvision
    assert out["params"] > 1_000_000


def test_ops_that_fail_to_load_get_the_shim():
    out = run("""
        fake_torchvision_ops.install(torch, loads=False)
        from robotserve_ros.engines import torch_env
        torch_env.import_torch()
        import torchvision
        torchvision.models.resnet18(weights=None)
        print(json.dumps({"shim": torch_env.shim_applied(), "has_ops": torchvision.extension._has_ops(),
                          "nms": torch._C._dispatch_has_kernel_for_dispatch_key("torchvision::nms", "Meta")}))
    """)
    assert out["shim"] is True and out["has_ops"] is False
    assert out["nms"] is True  # torchvision's fake kernel sits on the shim's schema


def test_the_stand_in_clashes_with_a_shim_declared_first():
    """What the old import_torch did (shim before the ops library) fails against the stand-in:
    the case the fix avoids, so the stand-in can tell the two apart."""
    out = run("""
        fake_torchvision_ops.install(torch, loads=True)
        from robotserve_ros.engines import torch_env
        keep = torch_env.declare_torchvision_schemas(torch)
        try:
            torch.ops.load_library(torch_env.torchvision_ops_path())
            err = None
        except RuntimeError as e:
            err = str(e)
        print(json.dumps({"err": err}))
    """)
    assert out["err"] and "Only a single TORCH_LIBRARY" in out["err"]
