"""Engine profile: generation latency as a function of batch size (seed 000 §3.2.2, §4)."""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np


class EngineProfile:
    """Latency vs batch size, linearly interpolated between measured points.

    The saturation batch is the smallest measured batch whose throughput no larger batch
    beats by more than `gain_tol`: past it latency grows with no throughput to show for it.
    """

    def __init__(self, batch_latency_ms: Mapping[int | str, float], gain_tol: float = 0.05) -> None:
        pts = {}
        for b, ms in batch_latency_ms.items():
            bi = int(b)
            if bi < 1 or str(b).strip() != str(bi):
                raise ValueError(f"batch size must be a positive integer, got {b!r}")
            ms = float(ms)
            if not math.isfinite(ms) or ms <= 0:
                raise ValueError(f"latency at batch {bi} must be a positive number of ms, got {ms!r}")
            pts[bi] = ms
        if 1 not in pts:
            raise ValueError("the profile needs the batch-1 latency")
        self.batches = np.array(sorted(pts), dtype=float)
        self.latencies_ms = np.array([pts[int(b)] for b in self.batches], dtype=float)
        if np.any(np.diff(self.latencies_ms) < 0):
            raise ValueError("latency must not fall as the batch grows")
        self.gain_tol = gain_tol
        self.saturation_batch = self._saturation()
        self._cache: dict[int, float] = {}

    def _saturation(self) -> int:
        thr = self.batches / self.latencies_ms
        for i, b in enumerate(self.batches):
            if np.all(thr[i + 1 :] <= thr[i] * (1 + self.gain_tol)):
                return int(b)
        return int(self.batches[-1])

    def latency_ms(self, batch: int) -> float:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        x, y = self.batches, self.latencies_ms
        if batch <= x[-1] or len(x) == 1:
            return float(np.interp(batch, x, y))
        # Past the last measured point, extend the last segment's slope.
        slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
        return float(y[-1] + slope * (batch - x[-1]))

    def latency_s(self, batch: int) -> float:
        v = self._cache.get(batch)
        if v is None:
            v = self._cache[batch] = self.latency_ms(batch) / 1000.0
        return v

    def throughput(self, batch: int) -> float:
        """Requests per second at this batch size."""
        return batch / self.latency_s(batch)

    def to_dict(self) -> dict[str, float]:
        return {str(int(b)): float(ms) for b, ms in zip(self.batches, self.latencies_ms)}
