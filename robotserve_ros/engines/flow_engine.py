"""The flow-matching action head (flow_policy.py) behind core.Engine, many robots per batch.

State-only (the observation's joints). Each row's initial noise comes from a generator
seeded by (seed, task_id, round_id, sample), as in the LeRobot engine, so a batch gives
the same chunks as its requests served one by one; `sample` > 0 is a self-consistency
replica of the same request (other noise, same observation). Every Euler step's update
dt * v is returned per action (seed 000 §3.1), in the normalised action space.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..core.engine import Engine
from ..core.observation import Observation, ObservationSpec
from ..core.profile import EngineProfile
from ..core.types import ChunkResult, InferenceRequest
from .lerobot_engine import _row_seed, engine_profile, joint_state


class FlowEngine(Engine):
    name = "flow"

    def __init__(self, profile: Optional[EngineProfile] = None, *, policy_dir: str, device: str = "cpu",
                 seed: int = 0, profile_file: Optional[str] = None) -> None:
        from .flow_policy import Normaliser, load_flow_policy, read_flow_config

        read_flow_config(policy_dir)  # a wrong directory fails before torch loads
        self.profile, self.profile_source = engine_profile(profile, profile_file)
        from .torch_env import import_torch

        self.torch = torch = import_torch()
        self.device = torch.device(device)
        self.net, self.cfg = load_flow_policy(policy_dir)
        self.net.to(self.device)
        self.policy_dir, self.seed, self.policy_type = str(policy_dir), int(seed), "flow_matching"
        self.state_dim, self.action_dim = int(self.cfg["state_dim"]), int(self.cfg["action_dim"])
        self.chunk_len, self.num_steps = int(self.cfg["chunk"]), int(self.cfg["num_steps"])
        self.sn = Normaliser(self.cfg["state_min"], self.cfg["state_max"])
        self.an = Normaliser(self.cfg["action_min"], self.cfg["action_max"])

    @property
    def observation_spec(self) -> ObservationSpec:
        return ObservationSpec(cameras=0, width=None, height=None, encodings=("rgb8",), joints=self.state_dim)

    def example_observation(self, rng: np.random.Generator) -> Observation:
        return Observation(joints=rng.uniform(-1, 1, self.state_dim).astype(np.float32))

    def _state(self, req: InferenceRequest) -> np.ndarray:
        return joint_state(req, self.state_dim, "flow")

    def infer(self, batch: Sequence[InferenceRequest]) -> list[ChunkResult]:
        if not batch:
            return []
        from .flow_policy import sample_chunks

        torch = self.torch
        q = np.stack([self._state(r) for r in batch])  # validate everything first
        shape = (1, self.chunk_len, self.action_dim)
        noise = torch.cat([torch.randn(shape, generator=torch.Generator().manual_seed(
            _row_seed(self.seed, r.task_id, r.round_id, getattr(r, "sample", 0)))) for r in batch])
        cap: list = []
        with torch.inference_mode():
            s = torch.from_numpy(self.sn.norm(q).astype(np.float32)).to(self.device)
            x = sample_chunks(self.net, s, noise.to(self.device), self.num_steps, cap)
        xn = x.float().cpu().numpy()
        acts = self.an.unnorm(xn).astype(np.float32)
        ups = torch.stack(cap, 1).float().cpu().numpy()  # [B, steps, chunk, dim]
        x0 = noise.numpy()
        return [ChunkResult(np.ascontiguousarray(acts[i]), np.ascontiguousarray(ups[i]),
                            initial_noise=np.ascontiguousarray(x0[i]), state=q[i].copy(),
                            task_id=batch[i].task_id, round_id=batch[i].round_id)
                for i in range(len(batch))]

    def close(self) -> None:
        self.net = None
