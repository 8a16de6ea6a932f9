"""Train the flow-matching action head (engines/flow_policy.py) on a study task's demos, on the CPU.

Same windows as the DiffusionPolicy trainer (train.Windows: observation t, actions t..t+15,
padded past the episode end with the last action), min-max normalisation from the demos,
the conditional flow-matching loss ||v(x_t, t) - (x_1 - x_0)||^2 with t ~ U(0, 1), AdamW with
warm-up and cosine decay and an EMA of the weights; the EMA weights are saved.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .collect import load_demos
from .tasks import task_family
from .train import OptimConfig, Windows, fit


@dataclass
class FlowTrainConfig(OptimConfig):
    steps: int = 8000
    batch_size: int = 256
    warmup: int = 300
    ema_decay: float = 0.998
    chunk: int = 16
    hidden: int = 256
    blocks: int = 3
    num_steps: int = 10  # Euler steps at inference (SmolVLA's default)
    # Training-time RTC (arXiv 2512.05964; LeRobot's rtc_training_config min/max delay): > 0 trains
    # with the first d ~ U{0..prefix_max_delay} actions given clean (flow time 1) as conditioning
    # and left out of the loss; 0 is the plain head.
    prefix_max_delay: int = 0


def train_flow(demos_path, out_dir, cfg: FlowTrainConfig, log=print) -> dict:
    from ..engines.flow_policy import Normaliser, build_net, save_flow_policy
    from ..engines.torch_env import import_torch

    torch = import_torch()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    demos = load_demos(demos_path)
    st, ac = demos["state"].astype(np.float32), demos["action"].astype(np.float32)
    fam = task_family(demos["task"])
    net_cfg = {
        "task": fam.name, "control_hz": fam.control_hz, "state_dim": fam.state_dim, "action_dim": fam.action_dim,
        "chunk": cfg.chunk, "hidden": cfg.hidden, "blocks": cfg.blocks, "num_steps": cfg.num_steps,
        "prefix_cond": cfg.prefix_max_delay > 0, "prefix_max_delay": int(cfg.prefix_max_delay),
        "state_min": st.min(0).tolist(), "state_max": st.max(0).tolist(),
        "action_min": ac.min(0).tolist(), "action_max": ac.max(0).tolist(),
    }
    # A feature constant in the demos (Meta-World's unused second-object slots) would be scaled by
    # 1e-6 and explode on any drift at evaluation: give it a unit range instead.
    lo, hi = st.min(0), st.max(0)
    net_cfg["state_max"] = np.where(hi - lo < 1e-3, lo + 1.0, hi).tolist()
    sn = Normaliser(net_cfg["state_min"], net_cfg["state_max"])
    an = Normaliser(net_cfg["action_min"], net_cfg["action_max"])
    win = Windows(demos, 1, cfg.chunk, 0)
    state = torch.from_numpy(sn.norm(st)[win.obs_idx[:, 0]])
    chunks = torch.from_numpy(an.norm(ac)[win.act_idx])
    net = build_net(net_cfg)

    def batch_loss(rows):
        x1, s = chunks[rows], state[rows]
        x0 = torch.randn_like(x1)
        t = torch.rand(cfg.batch_size)
        xt = (1 - t[:, None, None]) * x0 + t[:, None, None] * x1
        if cfg.prefix_max_delay <= 0:
            return torch.nn.functional.mse_loss(net(s, xt, t), x1 - x0)
        d = torch.randint(0, cfg.prefix_max_delay + 1, (cfg.batch_size,))
        mask = (torch.arange(cfg.chunk)[None] < d[:, None]).to(xt.dtype)
        xt = xt * (1 - mask[:, :, None]) + x1 * mask[:, :, None]  # the prefix is clean
        err = (net(s, xt, t, mask) - (x1 - x0)) ** 2 * (1 - mask[:, :, None])
        return err.sum() / ((1 - mask).sum() * x1.shape[-1])

    final, final_loss, wall, n_params = fit(torch, net, batch_loss, cfg, len(win), log, "train-flow")
    out = save_flow_policy(out_dir, final, net_cfg)
    info = {
        "task": fam.name, "family": "flow_matching", "demos": str(demos_path),
        "episodes": int(len(demos["episode_len"])), "frames": int(len(st)), "params": n_params,
        "train_wall_s": round(wall, 1), "final_loss": final_loss,
        "config": dict(cfg.__dict__),
    }
    (Path(out) / "train_info.json").write_text(json.dumps(info, indent=1) + "\n")
    return info
