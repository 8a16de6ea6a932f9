"""Import torch (and, through it, torchvision and LeRobot) the same way everywhere.

PyPI's torchvision 0.28.0, the pair of torch 2.13.0, is a CUDA build: beside a CPU-only
torch its import fails with `operator torchvision::nms does not exist`, because its Python
side registers fake kernels for C++ operators the CPU torch never defined. Declaring those
two schemas first lets it import; the policies only use what works then (resnet backbones,
transforms v2, FrozenBatchNorm2d, roi_align's Python fallback). With a matching torch and
torchvision (a CUDA machine, or a CPU torchvision wheel) nothing is declared.
"""
from __future__ import annotations

import os
import sys

_shim = None  # the torch.library.Library must stay alive for the schemas to stay defined


def import_torch():
    """torch, with torchvision made importable. Idempotent and cheap after the first call."""
    global _shim
    import torch

    if "torchvision" in sys.modules or _shim is not None:
        return torch
    if not _torchvision_ops_defined(torch):
        _shim = torch.library.Library("torchvision", "DEF")
        _shim.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _shim.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision  # noqa: F401 - imported here so the shim is in place first

    return torch


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
