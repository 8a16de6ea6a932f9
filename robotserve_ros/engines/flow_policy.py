"""A small flow-matching action head (the family of SmolVLA and pi0, seed 000 §2.1) in torch.

Conditional flow matching (rectified flow): a chunk x_1 of normalised actions, Gaussian
noise x_0, x_t = (1 - t) x_0 + t x_1; the network predicts the velocity x_1 - x_0 from
(state, x_t, t). Sampling integrates dx/dt = v with `num_steps` Euler steps from noise,
the loop SmolVLA's `VLAFlowMatching.sample_actions` runs, so every step's per-action update
is dt * v (what seed 000 §3.1's confidence rule reads).

A checkpoint directory holds `config.json` ({"type": "flow_matching", shapes, statistics})
and `model.safetensors`; `FlowEngine` (flow_engine.py) serves it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

FLOW_TYPE = "flow_matching"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"


def _torch():
    from .torch_env import import_torch

    return import_torch()


def build_net(cfg: dict):
    """The velocity network: an MLP with residual blocks over [state, x_t, sin/cos(t)]."""
    torch = _torch()
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(d)
            self.ff = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))

        def forward(self, x):
            return x + self.ff(self.norm(x))

    class VelocityNet(nn.Module):
        def __init__(self, c: dict) -> None:
            super().__init__()
            self.chunk, self.action_dim = int(c["chunk"]), int(c["action_dim"])
            self.t_dim = int(c.get("time_dim", 32))
            d = int(c["hidden"])
            # Training-time RTC (arXiv 2512.05964): the net also reads which actions are a clean,
            # executed prefix (a 0/1 mask over the chunk).
            self.prefix_cond = bool(c.get("prefix_cond", False))
            extra = self.chunk if self.prefix_cond else 0
            self.inp = nn.Linear(int(c["state_dim"]) + self.chunk * self.action_dim + self.t_dim + extra, d)
            self.blocks = nn.Sequential(*[Block(d) for _ in range(int(c["blocks"]))])
            self.out = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, self.chunk * self.action_dim))

        def time_embedding(self, t):
            half = self.t_dim // 2
            freqs = torch.exp(torch.arange(half, dtype=t.dtype, device=t.device) * (-math.log(1000.0) / max(half - 1, 1)))
            ang = t[:, None] * 1000.0 * freqs[None]
            return torch.cat([ang.sin(), ang.cos()], -1)

        def forward(self, state, x_t, t, prefix_mask=None):
            parts = [state, x_t.flatten(1), self.time_embedding(t)]
            if self.prefix_cond:
                parts.append(prefix_mask if prefix_mask is not None else x_t.new_zeros(x_t.shape[0], self.chunk))
            h = torch.cat(parts, -1)
            return self.out(self.blocks(torch.nn.functional.silu(self.inp(h)))).view(-1, self.chunk, self.action_dim)

    return VelocityNet(cfg)


class Normaliser:
    """Min-max to [-1, 1] per dimension, from the demonstrations' statistics (as LeRobot's MIN_MAX)."""

    def __init__(self, lo, hi) -> None:
        self.lo = np.asarray(lo, np.float32)
        self.span = np.maximum(np.asarray(hi, np.float32) - self.lo, 1e-6)

    def norm(self, x):
        return 2.0 * (x - self.lo) / self.span - 1.0

    def unnorm(self, x):
        return (x + 1.0) * 0.5 * self.span + self.lo


def sample_chunks(net, state_n, noise, num_steps: int, capture: list | None = None):
    """Euler integration from noise (t=0) to actions (t=1); appends dt * v per step to `capture`."""
    torch = _torch()
    x = noise
    dt = 1.0 / num_steps
    for i in range(num_steps):
        t = torch.full((x.shape[0],), i * dt, dtype=x.dtype, device=x.device)
        upd = dt * net(state_n, x, t)
        if capture is not None:
            capture.append(upd)
        x = x + upd
    return x


RTC_FORMS = ("paper", "lerobot")
RTC_MAX_GUIDANCE = 5.0  # beta, the guidance weight clip (RTC paper §4.3 and App. A: beta = 5)
RTC_MASKS = ("soft", "hard", "linear")
# LeRobot 0.4.4's RTCConfig defaults (lerobot/policies/rtc/configuration_rtc.py): the `lerobot`
# form is served with these unless an option overrides them.
LEROBOT_RTC_DEFAULTS = {"mask": "linear", "max_guidance": 10.0, "execution_horizon": 10}


def rtc_prefix_weights(d: int, k: int, horizon: int, mask: str = "soft", end: int | None = None) -> np.ndarray:
    """RTC's soft mask W over a chunk of `horizon` actions (Black et al. 2025, §4.2, eq. 5), for a
    leftover of k actions of which the first d are executed while this chunk is generated:
    1 for i < d (frozen), c_i (e^c_i - 1) / (e - 1) with c_i = (k - i) / (k - d + 1) for
    d <= i < k (the paper's H - s is the leftover's length k), 0 beyond the leftover.
    d = 0 is a mask like any other: nothing frozen, the whole leftover weighted by c_i.
    mask "hard": 1 on the first d only (§4.2's hard-masking ablation). mask "linear": c_i itself
    (LeRobot's LINEAR schedule; its EXP schedule is "soft"). end: the weighted region stops at
    min(k, end) (LeRobot's execution_horizon), the whole leftover when None."""
    if mask not in RTC_MASKS:
        raise ValueError(f"rtc mask {mask!r}: known {', '.join(RTC_MASKS)}")
    k = max(0, min(int(k), int(horizon)))
    if end is not None:
        k = min(k, max(0, int(end)))
    d = max(0, min(int(d), k))
    w = np.zeros(int(horizon), np.float32)
    w[:d] = 1.0
    if mask == "hard":
        return w
    c = (k - np.arange(d, k, dtype=np.float64)) / (k - d + 1)
    w[d:k] = c if mask == "linear" else c * np.expm1(c) / np.expm1(1.0)
    return w


def rtc_guidance_weight(t: float, beta: float) -> float:
    """min(beta, (1 - t) / (t r_t^2)) with r_t^2 = (1 - t)^2 / (t^2 + (1 - t)^2) (§4.1, eq. 2-4;
    t = 0 is noise, where the ratio is infinite and the clip holds)."""
    if t <= 0.0:
        return float(beta)
    return float(min(beta, (t * t + (1 - t) ** 2) / (t * (1 - t)))) if t < 1.0 else 0.0


def sample_chunks_guided(net, state_n, noise, num_steps: int, target, weights, form: str = "paper",
                         beta: float = RTC_MAX_GUIDANCE, capture: list | None = None):
    """sample_chunks with RTC's guided inpainting (§4.1): the velocity of every Euler step gets
    w(t) * (Y - A1_hat)^T diag(W) dA1_hat/dA_t, A1_hat = A_t + (1 - t) v(A_t, t) the one-step
    estimate of the final chunk, Y the leftover (normalised, zero-padded) and W per row
    ([B, chunk]: a row of zeros is unguided, so each row has its own d).

    form "paper": the vector-Jacobian product back-propagates through the denoiser (torch
    autograd, one backward per step). form "lerobot": LeRobot 0.4.4's cheaper correction (its
    v_t is computed before x_t requires grad, so dA1_hat/dA_t is the identity): the
    prefix-weighted error itself, no backward. Rows share one forward pass either way, so an
    unguided row's velocity is the unguided batch's, and its guidance term is exactly zero."""
    torch = _torch()
    if form not in RTC_FORMS:
        raise ValueError(f"rtc form {form!r}: known {', '.join(RTC_FORMS)}")
    x = noise
    dt = 1.0 / num_steps
    wmask = weights[:, :, None].to(x.dtype)
    for i in range(num_steps):
        t = i * dt
        tt = torch.full((x.shape[0],), t, dtype=x.dtype, device=x.device)
        gw = rtc_guidance_weight(t, beta)
        if form == "paper":
            with torch.enable_grad():
                xg = x.detach().clone().requires_grad_(True)
                v = net(state_n, xg, tt)
                a1 = xg + (1.0 - t) * v
                err = (target - a1.detach()) * wmask
                (vjp,) = torch.autograd.grad(a1, xg, err)
            v = v.detach()
        else:
            v = net(state_n, x, tt)
            vjp = (target - (x + (1.0 - t) * v)) * wmask
        upd = dt * (v + gw * vjp)
        if capture is not None:
            capture.append(upd)
        x = x + upd
    return x


def sample_chunks_prefix(net, state_n, noise, num_steps: int, prefix, mask, capture: list | None = None):
    """Training-time RTC's inference (arXiv 2512.05964): Euler integration as sample_chunks, but
    the actions under `mask` ([B, chunk], 1 on each row's first d) are the clean executed prefix
    `prefix` at every step, and the net is told so; no guidance, one forward per step."""
    torch = _torch()
    m = mask[:, :, None].to(noise.dtype)
    x = noise * (1 - m) + prefix * m
    dt = 1.0 / num_steps
    for i in range(num_steps):
        t = torch.full((x.shape[0],), i * dt, dtype=x.dtype, device=x.device)
        upd = dt * net(state_n, x, t, mask) * (1 - m)
        if capture is not None:
            capture.append(upd)
        x = x + upd
    return x


def save_flow_policy(out_dir, net, cfg: dict) -> Path:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}, str(out / WEIGHTS))
    (out / CONFIG).write_text(json.dumps({"type": FLOW_TYPE, **cfg}, indent=1) + "\n")
    return out


def read_flow_config(policy_dir) -> dict:
    """The checkpoint's config, or ValueError naming what is wrong (cheap: no torch)."""
    d = Path(policy_dir)
    f = d / CONFIG
    if not f.is_file():
        raise ValueError(f"policy directory {str(d)!r}: no {CONFIG}")
    try:
        cfg = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"policy directory {str(d)!r}: {CONFIG} is not valid JSON ({e})") from None
    if not isinstance(cfg, dict) or cfg.get("type") != FLOW_TYPE:
        raise ValueError(f"policy directory {str(d)!r}: not a {FLOW_TYPE} checkpoint (type {cfg.get('type')!r})")
    missing = [k for k in ("state_dim", "action_dim", "chunk", "hidden", "blocks", "num_steps", "state_min",
                           "state_max", "action_min", "action_max") if k not in cfg]
    if missing:
        raise ValueError(f"policy directory {str(d)!r}: {CONFIG} lacks {', '.join(missing)}")
    if not (d / WEIGHTS).is_file():
        raise ValueError(f"policy directory {str(d)!r}: missing weights file {WEIGHTS}")
    return cfg


def load_flow_policy(policy_dir):
    """(net in eval mode, config) from a checkpoint directory."""
    from safetensors.torch import load_file

    cfg = read_flow_config(policy_dir)
    net = build_net(cfg)
    net.load_state_dict(load_file(str(Path(policy_dir) / WEIGHTS)))
    net.eval()
    return net, cfg
