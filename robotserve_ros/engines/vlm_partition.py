"""The partition mechanisms behind core.nova's PartitionMechanism interface (seed 003, §III-B).

A stage worker calls `apply(stage, units)` on its own thread before each forward pass, so a
new partition takes effect at the next pass (§III-D's forward-pass granularity).

- `cpu` (CpuCorePartition): the worker's intra-op thread count (`torch.set_num_threads` is
  per calling thread with OpenMP) and its core affinity (`os.sched_setaffinity(0, ...)` pins
  the calling thread; its OpenMP team inherits the mask when created). The front worker
  takes cores from the low end, decode from the high end, so shares that add up to the
  total are disjoint.
- `green_context` (GreenContextPartition): torch.cuda.green_contexts, one green context per
  (stage, SM count), made current on the worker thread: SMs are a hard partition, changeable
  per forward pass without new processes.
- `mps` (MpsPartition): CUDA MPS active-thread percentage; fixed per process at CUDA init, so
  a repartition means a worker process per share.
Both GPU mechanisms refuse on a machine without a GPU, saying why.
"""
from __future__ import annotations

import os
import shutil
import threading

from ..core.nova.partition import PartitionMechanism, PartitionUnavailable
from ..core.registry import Registry
from .torch_env import import_torch


class CpuCorePartition(PartitionMechanism):
    name = "cpu"
    unit = "cores"

    def __init__(self, cores: list | None = None, pin: bool = True, max_threads: int = 0) -> None:
        """`max_threads` caps a worker's intra-op threads below its cores (0: no cap): on a
        loaded machine an OpenMP team as wide as its cores can run far slower than one thread."""
        self.torch = import_torch()
        self.max_threads = int(max_threads)
        self.cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
        self.pin = pin and hasattr(os, "sched_setaffinity")
        self.applied: dict = {}  # stage -> (threads, cores) last applied, for stats and tests
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        return len(self.cores)

    def cores_for(self, stage: str, units: int) -> list:
        units = max(1, min(int(units), self.total))
        return self.cores[-units:] if stage == "decode" else self.cores[:units]

    def apply(self, stage: str, units: int) -> None:
        units = max(1, min(int(units), self.total))
        cores = self.cores_for(stage, units)
        self.torch.set_num_threads(min(units, self.max_threads) if self.max_threads > 0 else units)
        if self.pin:
            try:
                os.sched_setaffinity(0, cores)  # 0 = the calling thread on Linux
            except OSError:
                self.pin = False
        with self._lock:
            self.applied[stage] = (units, tuple(cores))


def _cuda_reason(torch) -> str | None:
    if not torch.cuda.is_available():
        return (f"no CUDA device here (torch {torch.__version__}, CUDA build: {torch.version.cuda}); "
                "this session was not lent a GPU")
    return None


class GreenContextPartition(PartitionMechanism):
    name = "green_context"
    unit = "SMs"

    def __init__(self, device: int = 0) -> None:
        self.torch = import_torch()
        self.device = device
        self.check()
        self._total = self.torch.cuda.get_device_properties(device).multi_processor_count
        self._ctx: dict = {}
        self._current = threading.local()

    def check(self) -> None:
        torch = import_torch()
        why = _cuda_reason(torch)
        if why:
            raise PartitionUnavailable(f"green_context partition unavailable: {why}")
        from torch.cuda import green_contexts

        if not getattr(green_contexts, "SUPPORTED", False):
            raise PartitionUnavailable("green_context partition unavailable: this PyTorch has no green context support")

    @property
    def total(self) -> int:
        return self._total

    def apply(self, stage: str, units: int) -> None:
        from torch.cuda.green_contexts import GreenContext

        units = max(1, min(int(units), self.total))
        key = (stage, units)
        if key not in self._ctx:
            self._ctx[key] = GreenContext.create(num_sms=units, device_id=self.device)
        prev = getattr(self._current, "ctx", None)
        if prev is not None:
            prev.pop_context()
        self._ctx[key].set_context()
        self._current.ctx = self._ctx[key]


class MpsPartition(PartitionMechanism):
    name = "mps"
    unit = "percent"

    def __init__(self) -> None:
        self.check()

    def check(self) -> None:
        torch = import_torch()
        why = _cuda_reason(torch)
        if why:
            raise PartitionUnavailable(f"mps partition unavailable: {why}")
        if shutil.which("nvidia-cuda-mps-control") is None:
            raise PartitionUnavailable("mps partition unavailable: nvidia-cuda-mps-control is not installed")
        raise PartitionUnavailable("mps partition unavailable: the percentage is fixed per process at CUDA init; "
                                   "run one worker process per share (not built: no GPU to test it on)")

    @property
    def total(self) -> int:
        return 100

    def apply(self, stage: str, units: int) -> None:  # pragma: no cover - refused in check()
        raise PartitionUnavailable("mps partition unavailable")


MECHANISMS: Registry = Registry("partition mechanism")
MECHANISMS.register("cpu", CpuCorePartition)
MECHANISMS.register("green_context", GreenContextPartition)
MECHANISMS.register("mps", MpsPartition)
