"""Real-time chunking on LeRobot's SmolVLA (RTC arXiv 2506.07339, docs/rtc_serving.md): the
part of LeRobotEngine (engines/lerobot_engine.py) that turns LeRobot's RTC processor on and
samples a batch whose rows carry their own inference delay d and executed-chunk leftover."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..core.types import InferenceRequest


class LeRobotRTC:
    """Mixed into LeRobotEngine: uses its cfg, policy, post, torch, device, supports_rtc,
    _sample, _captured, _row_gens and _in_rtc."""

    def _enable_rtc(self) -> None:
        """LeRobot's RTC processor on, with the checkpoint's rtc_config where it has one (its
        prefix schedule and guidance cap). Unguided rows are unchanged by it: with no leftover
        its denoise_step is the policy's own."""
        from dataclasses import replace

        from lerobot.policies.rtc.configuration_rtc import RTCConfig

        rc = self.cfg.rtc_config
        self.cfg.rtc_config = replace(rc, enabled=True) if rc is not None else RTCConfig(enabled=True)
        self.policy.config.rtc_config = self.policy.model.config.rtc_config = self.cfg.rtc_config
        self.policy.init_rtc_processor()
        # The updates the horizon policies read are the guided velocity's steps: every step
        # goes through the RTC processor, and the denoiser's own capture stands aside.
        proc, dt = self.policy.model.rtc_processor, -1.0 / self.cfg.num_steps
        unguided = proc.denoise_step

        torch = self.torch

        def denoise_step(*args, **kwargs):
            plain = kwargs.get("original_denoise_step_partial")
            if plain is not None:  # its correction needs no graph through the denoiser: none is built
                kwargs["original_denoise_step_partial"] = lambda x: torch.no_grad()(plain)(x)
            self._in_rtc = True
            try:
                v_t = unguided(*args, **kwargs)
            finally:
                self._in_rtc = False
            self._captured.append(dt * v_t.detach())
            return v_t

        proc.denoise_step = denoise_step
        # The leftover comes in action space; the denoiser works normalized: the post-processor's
        # own statistics map it back (its unnormalizer, run forward).
        self._action_norm = next(st for st in self.post.steps if hasattr(st, "_normalize_action"))

    def _rtc_delay(self, req: InferenceRequest) -> Optional[int]:
        g = req.rtc
        if not self.supports_rtc or g is None or g.delay_steps is None or not len(g.leftover):
            return None
        return int(g.delay_steps)

    def _sample_rtc(self, batch: dict, noise, reqs: Sequence[InferenceRequest], delays: list):
        """LeRobot's RTC guidance (RTC arXiv 2506.07339 §4 in LeRobot's cheaper form: the
        prefix-weighted error without back-propagating through the denoiser) with a d per row.
        Its prefix weights take one delay (and one leftover length) for the whole batch, so the
        rows run in groups of equal (d, leftover length), each group one call; rows without a
        leftover form their own group. Rows do not interact in that correction, so a row comes
        out as it would alone (test_rtc_lerobot.py)."""
        torch = self.torch
        keys: dict = {}
        for i, (r, d) in enumerate(zip(reqs, delays)):
            keys.setdefault(None if d is None else (d, len(r.rtc.leftover)), []).append(i)
        chunks, steps = [None] * len(reqs), [None] * len(reqs)
        for key, rows in keys.items():
            idx = torch.tensor(rows, device=self.device)
            sub = {k: v.index_select(0, idx) for k, v in batch.items()}
            kw = {}
            if key is not None:
                d, k = key
                left = torch.from_numpy(np.stack([reqs[i].rtc.leftover for i in rows]).astype(np.float32))
                left = self._action_norm._normalize_action(left.to(self.device), inverse=False)
                kw = {"inference_delay": d, "prev_chunk_left_over": left, "execution_horizon": k}
            before = len(self._captured)
            gens, self._row_gens = self._row_gens, [self._row_gens[i] for i in rows] if self._row_gens else None
            try:
                out = self._sample(sub, None if noise is None else noise.index_select(0, idx), **kw)
            finally:
                self._row_gens = gens
            got = self._captured[before:]
            del self._captured[before:]
            for j, i in enumerate(rows):
                chunks[i] = out[j]
                steps[i] = [u[j] for u in got]
        if steps[0]:  # the captured updates back in batch order: [B, chunk, dim] per step
            self._captured = [torch.stack([steps[i][t] for i in range(len(reqs))]) for t in range(len(steps[0]))]
        return torch.stack(chunks)
