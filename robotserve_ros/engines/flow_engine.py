"""The flow-matching action head (flow_policy.py) behind core.Engine, many robots per batch.

State-only (the observation's joints). Each row's initial noise comes from a generator
seeded by (seed, task_id, round_id, sample), as in the LeRobot engine, so a batch gives
the same chunks as its requests served one by one; `sample` > 0 is a self-consistency
replica of the same request (other noise, same observation). Every Euler step's update
dt * v is returned per action (seed 000 §3.1), in the normalised action space.

Real-time chunking (core/rtc.py; Black et al. 2025, §4): a request whose rtc guide has a
leftover and a delay d >= 0 is generated as a guided inpainting of that leftover, each row
with its own d and leftover inside one batch (flow_policy.sample_chunks_guided). `rtc_form`
picks the paper's guidance ("paper", a vector-Jacobian product through the velocity network)
or LeRobot's cheaper form ("lerobot", the prefix-weighted error alone, with LeRobot 0.4.4's defaults:
linear schedule, beta 10, execution_horizon 10); `rtc_mask` the paper's soft mask over the whole
leftover, a hard one over the first d actions (§4.2) or LeRobot's linear one. d = 0 is guided like
any other d (nothing frozen, the leftover softly weighted); an empty leftover is unguided.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..core.engine import Engine
from ..core.observation import BadObservation, Observation, ObservationSpec
from ..core.profile import EngineProfile
from ..core.types import ChunkResult, InferenceRequest
from .lerobot_engine import _row_seed, engine_profile, joint_state


class FlowEngine(Engine):
    name = "flow"
    supports_rtc = True

    def __init__(self, profile: Optional[EngineProfile] = None, *, policy_dir: str, device: str = "cpu",
                 seed: int = 0, profile_file: Optional[str] = None, rtc_form: str = "paper",
                 rtc_max_guidance: Optional[float] = None, rtc_mask: Optional[str] = None,
                 rtc_execution_horizon: Optional[int] = None) -> None:
        from .flow_policy import (LEROBOT_RTC_DEFAULTS, RTC_FORMS, RTC_MASKS, RTC_MAX_GUIDANCE, Normaliser,
                                  load_flow_policy, read_flow_config)

        if rtc_form not in RTC_FORMS:
            raise ValueError(f"rtc_form {rtc_form!r}: known {', '.join(RTC_FORMS)}")
        # Unset options take the form's own defaults: the paper's (soft mask, beta 5, the whole
        # leftover) or LeRobot 0.4.4's RTCConfig (linear schedule, beta 10, execution_horizon 10).
        lr = rtc_form == "lerobot"
        if rtc_max_guidance is None:
            rtc_max_guidance = LEROBOT_RTC_DEFAULTS["max_guidance"] if lr else RTC_MAX_GUIDANCE
        if rtc_mask is None:
            rtc_mask = LEROBOT_RTC_DEFAULTS["mask"] if lr else "soft"
        if rtc_execution_horizon is None and lr:
            rtc_execution_horizon = LEROBOT_RTC_DEFAULTS["execution_horizon"]
        if not rtc_max_guidance > 0:
            raise ValueError(f"rtc_max_guidance must be > 0, got {rtc_max_guidance}")
        if rtc_mask not in RTC_MASKS:
            raise ValueError(f"rtc_mask {rtc_mask!r}: known {', '.join(RTC_MASKS)}")
        if rtc_execution_horizon is not None and int(rtc_execution_horizon) < 1:
            raise ValueError(f"rtc_execution_horizon must be >= 1, got {rtc_execution_horizon}")
        self.rtc_form, self.rtc_max_guidance, self.rtc_mask = rtc_form, float(rtc_max_guidance), rtc_mask
        self.rtc_execution_horizon = None if rtc_execution_horizon is None else int(rtc_execution_horizon)

        read_flow_config(policy_dir)  # a wrong directory fails before torch loads
        self.profile, self.profile_source = engine_profile(profile, profile_file)
        from .torch_env import import_torch

        self.torch = torch = import_torch()
        self.device = torch.device(device)
        self.net, self.cfg = load_flow_policy(policy_dir)
        self.net.to(self.device)
        # Served, never trained: RTC's vector-Jacobian product then records the x_t path only.
        self.net.requires_grad_(False)
        self.policy_dir, self.seed, self.policy_type = str(policy_dir), int(seed), "flow_matching"
        self.state_dim, self.action_dim = int(self.cfg["state_dim"]), int(self.cfg["action_dim"])
        self.chunk_len, self.num_steps = int(self.cfg["chunk"]), int(self.cfg["num_steps"])
        # A head trained with training-time RTC (arXiv 2512.05964) takes the executed prefix as
        # conditioning: served with the request's d, no guidance (rtc_form and mask unused).
        self.prefix_cond = bool(self.cfg.get("prefix_cond", False))
        self.sn = Normaliser(self.cfg["state_min"], self.cfg["state_max"])
        self.an = Normaliser(self.cfg["action_min"], self.cfg["action_max"])

    @property
    def observation_spec(self) -> ObservationSpec:
        return ObservationSpec(cameras=0, width=None, height=None, encodings=("rgb8",), joints=self.state_dim)

    def example_observation(self, rng: np.random.Generator) -> Observation:
        return Observation(joints=rng.uniform(-1, 1, self.state_dim).astype(np.float32))

    def _state(self, req: InferenceRequest) -> np.ndarray:
        return joint_state(req, self.state_dim, "flow")

    def _rtc_rows(self, batch) -> Optional[tuple]:
        """(targets [B, chunk, dim] normalised, weights [B, chunk], d per row or None) for a batch
        with at least one guided row; None when no row is guided (the unguided path, unchanged)."""
        from .flow_policy import rtc_prefix_weights

        H, A = self.chunk_len, self.action_dim
        tgt = np.zeros((len(batch), H, A), np.float32)
        w = np.zeros((len(batch), H), np.float32)
        used: list = [None] * len(batch)
        for i, r in enumerate(batch):
            g = r.rtc
            if g is None:
                continue
            bad = g.problems(A)
            if bad:
                raise BadObservation(f"{r.task_id} round {r.round_id}: " + "; ".join(bad))
            if g.delay_steps is None:
                continue  # no d set: nothing to freeze, generated freely
            k = min(int(g.leftover.shape[0]), H)
            d = min(int(g.delay_steps), k)
            used[i] = d
            if self.prefix_cond:
                if d >= 1:  # the first d leftover actions are the clean prefix, nothing else
                    tgt[i, :d] = self.an.norm(g.leftover[:d].astype(np.float32))
                    w[i, :d] = 1.0
            elif k >= 1:
                # d = 0 is guided like any other d (the leftover's soft weights, nothing frozen).
                # The leftover is in action space: the network denoises normalised actions.
                tgt[i, :k] = self.an.norm(g.leftover[:k].astype(np.float32))
                w[i] = rtc_prefix_weights(d, k, H, self.rtc_mask, self.rtc_execution_horizon)
        if not w.any():
            return None, used
        return (tgt, w), used

    def infer(self, batch: Sequence[InferenceRequest]) -> list[ChunkResult]:
        if not batch:
            return []
        from .flow_policy import sample_chunks, sample_chunks_guided, sample_chunks_prefix

        torch = self.torch
        q = np.stack([self._state(r) for r in batch])  # validate everything first
        guide, used = self._rtc_rows(batch)
        shape = (1, self.chunk_len, self.action_dim)
        noise = torch.cat([torch.randn(shape, generator=torch.Generator().manual_seed(
            _row_seed(self.seed, r.task_id, r.round_id, getattr(r, "sample", 0)))) for r in batch])
        cap: list = []
        if guide is None:
            with torch.inference_mode():
                s = torch.from_numpy(self.sn.norm(q).astype(np.float32)).to(self.device)
                x = sample_chunks(self.net, s, noise.to(self.device), self.num_steps, cap)
        elif self.prefix_cond:
            with torch.inference_mode():
                s = torch.from_numpy(self.sn.norm(q).astype(np.float32)).to(self.device)
                tgt, w = (torch.from_numpy(a).to(self.device) for a in guide)
                x = sample_chunks_prefix(self.net, s, noise.to(self.device), self.num_steps, tgt, w, cap)
        else:
            with torch.no_grad():
                s = torch.from_numpy(self.sn.norm(q).astype(np.float32)).to(self.device)
                tgt, w = (torch.from_numpy(a).to(self.device) for a in guide)
                x = sample_chunks_guided(self.net, s, noise.to(self.device), self.num_steps, tgt, w,
                                         self.rtc_form, self.rtc_max_guidance, cap)
        xn = x.float().cpu().numpy()
        acts = self.an.unnorm(xn).astype(np.float32)
        ups = torch.stack(cap, 1).float().cpu().numpy()  # [B, steps, chunk, dim]
        x0 = noise.numpy()
        return [ChunkResult(np.ascontiguousarray(acts[i]), np.ascontiguousarray(ups[i]),
                            initial_noise=np.ascontiguousarray(x0[i]), state=q[i].copy(),
                            task_id=batch[i].task_id, round_id=batch[i].round_id, rtc_delay_steps=used[i])
                for i in range(len(batch))]

    def close(self) -> None:
        self.net = None
