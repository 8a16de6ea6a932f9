"""Import torch (and, through it, torchvision and LeRobot) the same way everywhere.

PyPI's torchvision 0.28.0, the pair of torch 2.13.0, is a CUDA build: beside a CPU-only
torch its compiled ops library (`torchvision/_C.so`) does not load, and its Python side
then fails with `operator torchvision::nms does not exist` (it registers fake kernels for
C++ operators nobody defined). Only then are those two schemas declared first, which lets
it import; the policies only use what works then (resnet backbones, transforms v2,
FrozenBatchNorm2d, roi_align's Python fallback).

Where the compiled ops do load (a matching CUDA torch and torchvision, or a CPU torchvision
wheel) nothing may be declared: the library's own `TORCH_LIBRARY(torchvision, ...)` would
clash with a namespace already defined from Python and abort the process. So the ops
library is loaded first, exactly as torchvision.extension would, and the shim is the
fallback for when that load fails.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from typing import Optional

_shim = None  # the torch.library.Library must stay alive for the schemas to stay defined


def import_torch():
    """torch, with torchvision made importable. Idempotent and cheap after the first call."""
    global _shim
    import torch

    if "torchvision" in sys.modules or _shim is not None:
        return torch
    if not load_torchvision_ops(torch):
        _shim = declare_torchvision_schemas(torch)
    import torchvision  # noqa: F401 - imported here, after the ops library or the shim

    return torch


def torchvision_ops_path() -> Optional[str]:
    """Where torchvision's compiled ops library lies, found as torchvision.extension finds it,
    without importing torchvision (whose import is what fails). None if it is not there."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    loader = (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES)
    for lib_dir in spec.submodule_search_locations:
        ext = importlib.machinery.FileFinder(lib_dir, loader).find_spec("_C")
        if ext is not None and ext.origin:
            return ext.origin
    return None


def load_torchvision_ops(torch, path: Optional[str] = None) -> bool:
    """Load torchvision's own ops library; True when it defines `torchvision::nms`.

    Loading it here first is harmless: torchvision's later load of the same file is the same
    dlopen handle, so its registrations run once."""
    if _torchvision_ops_defined(torch):
        return True
    path = path or torchvision_ops_path()
    if path is None:
        return False
    try:
        torch.ops.load_library(path)
    except (OSError, ImportError, RuntimeError):  # a CUDA build beside a CPU torch: undefined symbols
        return False
    return _torchvision_ops_defined(torch)


def declare_torchvision_schemas(torch):
    """The stand-in for torchvision's missing ops: the two schemas its Python side needs.
    Returns the Library, which must stay alive for the schemas to stay defined."""
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    return lib


def shim_applied() -> bool:
    """Whether this process declared the schemas (torchvision's own ops did not load)."""
    return _shim is not None


def _torchvision_ops_defined(torch) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw("torchvision::nms", "")
        return True
    except RuntimeError:
        return False


def import_lerobot_policies():
    """The `lerobot.policies` package, imported after the torchvision shim. LeRobot's async
    modules write a logs/ folder into the working directory on import; keep it out of the
    checkout by pointing them at a temp dir is the caller's job (see transport)."""
    import_torch()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub at run time
    import lerobot.policies  # noqa: F401

    _allow_state_only_diffusion()
    return sys.modules["lerobot.policies"]


def _allow_state_only_diffusion() -> None:
    """Let LeRobot 0.4.4's DiffusionConfig take `observation.state` as its only input.

    Its `validate_features` asks for a camera or an `observation.environment_state`, yet the
    model conditions on the robot state alone without trouble (global_cond = state): the
    horizon study's state-only policy (models/pushgust_diffusion) needs this to load. The
    check still runs for every config without `observation.state`. Idempotent."""
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

    check = DiffusionConfig.validate_features
    if getattr(check, "_state_only_ok", False):
        return

    def validate_features(self) -> None:
        if not self.image_features and self.env_state_feature is None and self.robot_state_feature is not None:
            return
        check(self)

    validate_features._state_only_ok = True
    DiffusionConfig.validate_features = validate_features
