"""Train a small state-only LeRobot DiffusionPolicy on a study task's demonstrations, on the CPU.

The project's own loop (no LeRobot dataset or hub): windows cut from the demo npz the way
LeRobot's delta indices cut them (observation t-n_obs+1..t, actions from t-n_obs+1 over the
horizon, padded past the episode end with `action_is_pad`), normalised by LeRobot's own
preprocessor built from the demos' statistics, DDPM loss from `DiffusionPolicy.forward`,
AdamW with warm-up and cosine decay, and an EMA of the weights (as Diffusion Policy does).
The EMA weights are saved with `save_pretrained`, the pre/post-processors beside them, so
`make_engine("lerobot", policy_dir=...)` loads the directory.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .collect import load_demos
from .tasks import task_family


@dataclass
class OptimConfig:
    """What both trainers (this one and train_flow) set the same way: steps of a batch of
    windows, AdamW with warm-up then cosine decay, an EMA of the weights."""
    steps: int = 6000
    batch_size: int = 128
    lr: float = 1e-3
    warmup: int = 200
    ema_decay: float = 0.995
    seed: int = 0
    threads: int = 1


@dataclass
class TrainConfig(OptimConfig):
    # Policy shape: one observation (the state carries the puck's velocity, and the engine
    # keeps history per round, not per control step), 16 actions per chunk.
    n_obs_steps: int = 1
    horizon: int = 16
    n_action_steps: int = 16
    down_dims: tuple = (64, 128)
    kernel_size: int = 5
    n_groups: int = 8
    diffusion_step_embed_dim: int = 64
    num_train_timesteps: int = 100
    num_inference_steps: int = 10
    extra: dict = field(default_factory=dict)


def allow_state_only_diffusion() -> None:
    """State-only DiffusionPolicy configs load (see engines.torch_env); kept for callers."""
    from ..engines.torch_env import import_lerobot_policies

    import_lerobot_policies()


def dataset_stats(demos: dict) -> dict:
    """LeRobot's stats layout (min/max/mean/std per feature) from the demo frames."""
    from ..engines.torch_env import import_torch

    torch = import_torch()
    out = {}
    for key, arr in (("observation.state", demos["state"]), ("action", demos["action"])):
        a = arr.astype(np.float64)
        lo, hi = a.min(0), a.max(0)
        # A feature constant in the demos (Meta-World's unused object slots) gets a unit range, so
        # a drift at evaluation is not divided by ~0 (as train_flow does).
        hi = np.where(hi - lo < 1e-3, lo + 1.0, hi)
        out[key] = {
            "min": torch.tensor(lo, dtype=torch.float32),
            "max": torch.tensor(hi, dtype=torch.float32),
            "mean": torch.tensor(a.mean(0), dtype=torch.float32),
            "std": torch.tensor(a.std(0) + 1e-6, dtype=torch.float32),
        }
    return out


def make_policy(cfg: TrainConfig, state_dim: int = 8, action_dim: int = 2):
    """A fresh DiffusionPolicy (DDPM training, DDIM sampling) for a task's state and action
    (the defaults: PushGust's)."""
    allow_state_only_diffusion()
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

    pcfg = DiffusionConfig(
        input_features={"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(state_dim,))},
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))},
        device="cpu",
        n_obs_steps=cfg.n_obs_steps,
        horizon=cfg.horizon,
        n_action_steps=cfg.n_action_steps,
        drop_n_last_frames=max(0, cfg.horizon - cfg.n_action_steps - cfg.n_obs_steps + 1),
        down_dims=tuple(cfg.down_dims),
        kernel_size=cfg.kernel_size,
        n_groups=cfg.n_groups,
        diffusion_step_embed_dim=cfg.diffusion_step_embed_dim,
        # Trained with DDPM's noise schedule; DDIM samples the same model in fewer steps.
        noise_scheduler_type="DDIM",
        num_train_timesteps=cfg.num_train_timesteps,
        num_inference_steps=cfg.num_inference_steps,
        **cfg.extra,
    )
    return DiffusionPolicy(pcfg), pcfg


class Windows:
    """Every training window of the demos, as index arrays into the frame arrays."""

    def __init__(self, demos: dict, n_obs: int, horizon: int, drop_last: int) -> None:
        ep = demos["episode_index"]
        starts = np.searchsorted(ep, np.arange(ep.max() + 1))
        ends = np.append(starts[1:], len(ep)) - 1  # last frame of each episode
        t = np.arange(len(ep))
        keep = t <= ends[ep] - drop_last
        t = t[keep]
        s, e = starts[ep[t]], ends[ep[t]]
        obs_idx = t[:, None] + np.arange(1 - n_obs, 1)[None]
        act_idx = t[:, None] + np.arange(1 - n_obs, 1 - n_obs + horizon)[None]
        self.obs_idx = np.clip(obs_idx, s[:, None], e[:, None])
        self.act_pad = (act_idx < s[:, None]) | (act_idx > e[:, None])
        self.act_idx = np.clip(act_idx, s[:, None], e[:, None])

    def __len__(self) -> int:
        return len(self.obs_idx)


def fit(torch, model, batch_loss, cfg: OptimConfig, n_windows: int, log, what: str, betas=(0.9, 0.999),
        weight_decay: float = 1e-5):
    """The loop both trainers run: batches of windows drawn at random, `batch_loss(rows)` their
    loss, AdamW with linear warm-up then cosine decay, gradients clipped at 10, an EMA of the
    weights. Returns (the EMA model, the mean of the last 200 losses, wall s, parameters)."""
    rng = np.random.default_rng(cfg.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=betas, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: min(1.0, (k + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * min(k, cfg.steps) / cfg.steps)))
    ema = torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(cfg.ema_decay))
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{what}: {n_windows} windows, {n_params / 1e6:.2f}M params, "
        f"{cfg.steps} steps of batch {cfg.batch_size}, {cfg.threads} thread(s)")
    t0 = time.time()
    losses = []
    for k in range(cfg.steps):
        loss = batch_loss(torch.from_numpy(rng.integers(0, n_windows, cfg.batch_size)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
        sched.step()
        ema.update_parameters(model)
        losses.append(loss.item())
        if (k + 1) % max(1, cfg.steps // 20) == 0 or k == 0:
            log(f"  step {k + 1:6d}/{cfg.steps}  loss {np.mean(losses[-200:]):.4f}  {time.time() - t0:6.0f}s")
    return ema.module, float(np.mean(losses[-200:])), time.time() - t0, int(n_params)


def train(demos_path, out_dir, cfg: TrainConfig, log=print) -> dict:
    from ..engines.torch_env import import_torch

    torch = import_torch()
    from lerobot.policies.factory import make_pre_post_processors

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    demos = load_demos(demos_path)
    fam = task_family(demos["task"])
    stats = dataset_stats(demos)
    policy, pcfg = make_policy(cfg, fam.state_dim, fam.action_dim)
    pre, post = make_pre_post_processors(pcfg, dataset_stats=stats)
    win = Windows(demos, cfg.n_obs_steps, cfg.horizon, pcfg.drop_n_last_frames)
    state = torch.from_numpy(demos["state"])
    action = torch.from_numpy(demos["action"])
    obs_idx, act_idx = torch.from_numpy(win.obs_idx), torch.from_numpy(win.act_idx)
    act_pad = torch.from_numpy(win.act_pad)

    def batch_loss(rows):
        batch = {
            "observation.state": state[obs_idx[rows]],
            "action": action[act_idx[rows]],
            "action_is_pad": act_pad[rows],
        }
        batch = pre(batch)  # LeRobot's normaliser: state and action to [-1, 1] (MIN_MAX)
        # compute_loss asserts a camera or environment-state key is present; the model never
        # reads this one (the config has no such feature), so an empty one satisfies it.
        batch["observation.environment_state"] = state.new_zeros(cfg.batch_size, cfg.n_obs_steps, 0)
        return policy.forward(batch)[0]

    final, final_loss, wall, n_params = fit(torch, policy, batch_loss, cfg, len(win), log, "train",
                                            betas=(0.95, 0.999), weight_decay=1e-6)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final.eval()
    final.save_pretrained(out)
    pre.save_pretrained(out)
    post.save_pretrained(out)
    info = {
        "task": fam.name,
        "control_hz": fam.control_hz,
        "demos": str(demos_path),
        "episodes": int(len(demos["episode_len"])),
        "frames": int(len(demos["state"])),
        "params": n_params,
        "train_wall_s": round(wall, 1),
        "final_loss": final_loss,
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.__dict__.items()},
    }
    (out / "train_info.json").write_text(json.dumps(info, indent=1) + "\n")
    return info
