"""LeRobot policies (DiffusionPolicy, SmolVLA, ACT) behind core.Engine, many robots per batch.

A policy directory is a LeRobot checkpoint: `save_pretrained` weights and config plus the
pre/post-processor pipelines saved beside them. One engine serves every robot at once: each
request's observation is preprocessed (normalised, tokenised) by LeRobot's own pipeline,
appended to that task's observation history (n_obs_steps deep, never shared between
tasks), and the histories of a batch are stacked into one forward pass.

Per-step denoising updates (seed 000 §3.1: the confidence horizon policy reads how much
each action still moves per step) are captured without forking LeRobot: the diffusion
noise scheduler's `step` is shadowed on the instance (update = prev_sample - sample), and
SmolVLA's `denoise_step` is wrapped (update = dt * v_t). Initial noise comes from a
generator per row seeded by (seed, task_id, round_id), so a batch gives the same chunks as
its requests served one by one, whatever else is in the batch. Real-time chunking on SmolVLA
(a leftover and a delay per row) is engines/lerobot_rtc.py.
"""
from __future__ import annotations

import json
import zlib
from collections import deque
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..core.engine import Engine
from ..core.observation import BadObservation, Observation, ObservationSpec
from ..core.profile import EngineProfile
from ..core.types import ChunkResult, InferenceRequest
from .lerobot_rtc import LeRobotRTC

SUPPORTED = ("diffusion", "smolvla", "act")
DTYPES = ("fp32", "bf16")
# Used when neither a profile nor a profile file is given: one made-up point (100 ms at
# batch 1), NOT a measurement. Run `robotserve profile` and pass its JSON as profile_file.
NOMINAL_PROFILE_MS = {1: 100.0}


def engine_profile(profile: Optional[EngineProfile], profile_file: Optional[str]) -> tuple[EngineProfile, str]:
    """A policy engine's profile and where it came from: a measured file wins over a given
    profile, and with neither the labelled nominal guess (profile_source "nominal")."""
    if profile_file is not None:
        from ..profiles import load_profile_file

        return load_profile_file(profile_file), f"file {profile_file}"
    if profile is not None:
        return profile, "given"
    return EngineProfile(NOMINAL_PROFILE_MS), "nominal"


PRE_CONFIG = "policy_preprocessor.json"
POST_CONFIG = "policy_postprocessor.json"
WEIGHTS = "model.safetensors"


class PolicyDirError(ValueError):
    """The policy directory is missing or is not a LeRobot checkpoint this engine can load."""

    def __init__(self, policy_dir, what: str) -> None:
        super().__init__(f"policy directory {str(policy_dir)!r}: {what}")
        self.policy_dir = str(policy_dir)


def check_policy_dir(policy_dir) -> dict:
    """The parsed config.json of a loadable checkpoint, or PolicyDirError saying what is wrong.

    Cheap (no torch): run before the slow import so a wrong path fails in milliseconds."""
    d = Path(policy_dir)
    if not d.is_dir():
        raise PolicyDirError(d, "does not exist or is not a directory")
    cfg_file = d / "config.json"
    if not cfg_file.is_file():
        raise PolicyDirError(d, "no config.json (save the policy with policy.save_pretrained(dir))")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PolicyDirError(d, f"config.json is not valid JSON ({e})") from None
    if not isinstance(cfg, dict) or "type" not in cfg:
        raise PolicyDirError(d, "config.json has no policy 'type'")
    if cfg["type"] not in SUPPORTED:
        raise PolicyDirError(d, f"unknown policy type {cfg['type']!r}; this engine serves {', '.join(SUPPORTED)}")
    if not (d / WEIGHTS).is_file():
        raise PolicyDirError(d, f"missing weights file {WEIGHTS}")
    for name in (PRE_CONFIG, POST_CONFIG):
        f = d / name
        if not f.is_file():
            raise PolicyDirError(d, f"missing processor file {name} (save make_pre_post_processors(...) pipelines there)")
        try:
            steps = json.loads(f.read_text()).get("steps", [])
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
            raise PolicyDirError(d, f"{name} is not a processor pipeline ({e})") from None
        for s in steps:
            state = s.get("state_file") if isinstance(s, dict) else None
            if state and not (d / state).is_file():
                raise PolicyDirError(d, f"missing processor state file {state} named in {name}")
    return cfg


def joint_state(req: InferenceRequest, state_dim: int, policy: str) -> np.ndarray:
    """The request's joint state as the policy takes it (float32, state_dim, finite), or BadObservation."""
    obs, who = req.observation, f"task {req.task_id!r}"
    if not isinstance(obs, Observation):
        raise BadObservation(f"{who}: no observation (the {policy} policy needs one)")
    q = np.asarray(obs.joints, dtype=np.float32)
    if q.shape != (state_dim,):
        raise BadObservation(f"{who}: joint state has shape {q.shape}, the policy takes ({state_dim},)")
    if not np.all(np.isfinite(q)):
        raise BadObservation(f"{who}: joint state has non-finite values")
    return q


def _row_seed(seed: int, task_id: str, round_id: int, sample: int = 0) -> int:
    """One 63-bit seed per (engine seed, task, round, sample): the noise of a row never depends
    on which other rows share its batch; a self-consistency replica (sample > 0) draws its own."""
    key = [seed & 0xFFFFFFFF, zlib.crc32(task_id.encode()), round_id & 0xFFFFFFFF]
    words = np.random.SeedSequence(key + ([int(sample) & 0xFFFFFFFF] if sample else []))
    return int(words.generate_state(2, np.uint64)[0] >> np.uint64(1))


class _History:
    __slots__ = ("obs", "last_round")

    def __init__(self, n: int) -> None:
        self.obs: deque = deque(maxlen=n)
        self.last_round: Optional[int] = None


class LeRobotEngine(LeRobotRTC, Engine):
    """Serve a LeRobot checkpoint to many robots at once.

    profile: the engine profile (latency vs batch) the scheduler reads. `profile_file` (the
    JSON `robotserve profile` writes) takes precedence when given. With neither, the engine
    uses NOMINAL_PROFILE_MS, a labelled one-point guess (`profile_source == "nominal"`),
    not a measurement.
    """

    name = "lerobot"
    # SmolVLA checkpoints get LeRobot's RTC processor (supports_rtc); a subclass that decodes
    # its own way (oxygen) says False and keeps the checkpoint's rtc_config untouched.
    rtc_capable = True

    def __init__(self, profile: Optional[EngineProfile] = None, *, policy_dir: str, device: str = "cpu",
                 compile: bool = False, seed: int = 0, profile_file: Optional[str] = None, dtype: str = "fp32",
                 cuda_graphs: bool = False) -> None:
        """dtype "bf16": the network runs under bfloat16 autocast (weights stay fp32; matmuls and
        convolutions in bf16). Casting the weights instead fails in LeRobot 0.4.4's code (fp32
        sinusoidal step embeddings and state projections meet bf16 Linear layers).
        compile: torch.compile the network each denoising step runs. cuda_graphs (CUDA only):
        the same in mode "reduce-overhead", which replays each batch size as a CUDA graph."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        raw_cfg = check_policy_dir(policy_dir)
        self.profile, self.profile_source = engine_profile(profile, profile_file)
        self.policy_dir, self.policy_type, self.seed = str(policy_dir), raw_cfg["type"], int(seed)

        from .torch_env import import_lerobot_policies, import_torch

        import_lerobot_policies()
        self.torch = torch = import_torch()
        from lerobot.configs.policies import PreTrainedConfig
        from lerobot.configs.types import FeatureType
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors

        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device")
        if cuda_graphs and not device.startswith("cuda"):
            raise ValueError(f"cuda_graphs needs device cuda, not {device!r}")
        self.device = torch.device(device)
        try:
            cfg = PreTrainedConfig.from_pretrained(self.policy_dir)
            cfg.device = str(self.device)
            self.policy = get_policy_class(cfg.type).from_pretrained(self.policy_dir, config=cfg, strict=True)
            over = {"device_processor": {"device": str(self.device)}}
            self.pre, self.post = make_pre_post_processors(
                cfg, pretrained_path=self.policy_dir, preprocessor_overrides=over)
        except (OSError, RuntimeError, KeyError, TypeError, ValueError, ImportError) as e:
            raise PolicyDirError(self.policy_dir, f"cannot load the {raw_cfg['type']} checkpoint: {e}") from e
        self.policy.to(self.device).eval()
        self.cfg = cfg
        self.dtype, self.cuda_graphs = dtype, bool(cuda_graphs)

        self.state_key = "observation.state"
        feats = cfg.input_features
        if self.state_key not in feats:
            raise PolicyDirError(self.policy_dir, "the policy has no observation.state input")
        self.state_dim = int(feats[self.state_key].shape[0])
        # Cameras in config order; SmolVLA's padding "empty cameras" are filled by the policy.
        self.image_keys = [k for k, f in feats.items() if f.type is FeatureType.VISUAL and "empty_camera" not in k]
        self.image_shapes = [tuple(int(x) for x in feats[k].shape) for k in self.image_keys]
        other = [k for k, f in feats.items() if k != self.state_key and f.type is not FeatureType.VISUAL]
        if other:
            raise PolicyDirError(self.policy_dir, f"input features this engine cannot fill: {other}")
        self.action_dim = int(cfg.output_features["action"].shape[0])
        self.n_obs_steps = int(cfg.n_obs_steps)
        self.chunk_len = int(cfg.n_action_steps)
        self._hist: dict[str, _History] = {}
        self._captured: list = []
        self._row_gens: Optional[list] = None
        self._in_rtc = False
        self._install_capture()
        self.supports_rtc = self.rtc_capable and self.policy_type == "smolvla" and hasattr(cfg, "rtc_config")
        if self.supports_rtc:
            self._enable_rtc()
        if compile or cuda_graphs:
            self._compile("reduce-overhead" if cuda_graphs else None)

    # --- public --------------------------------------------------------------------------
    @property
    def observation_spec(self) -> ObservationSpec:
        """What the policy takes, for the server's checks before a request is queued."""
        hw = {s[1:] for s in self.image_shapes}
        (h, w), = hw if len(hw) == 1 else {(None, None)}
        return ObservationSpec(cameras=len(self.image_keys), width=w, height=h, encodings=("rgb8",),
                               joints=self.state_dim)

    def example_observation(self, rng: np.random.Generator) -> Observation:
        """A random observation of the right shapes (for profiling and tests)."""
        images = [rng.integers(0, 256, (s[1], s[2], s[0]), dtype=np.uint8) for s in self.image_shapes]
        joints = rng.standard_normal(self.state_dim).astype(np.float32)
        return Observation(images=images, joints=joints, instruction="pick up the cube")

    def forget(self, task_id: str) -> None:
        """Drop the task's observation history (its episode ended)."""
        self._hist.pop(task_id, None)

    def infer(self, batch: Sequence[InferenceRequest]) -> list[ChunkResult]:
        if not batch:
            return []
        torch = self.torch
        raws = [self._to_raw(r) for r in batch]  # validate everything before touching history
        delays = [self._rtc_delay(r) for r in batch]
        # LeRobot's RTC takes an autograd step inside (torch.enable_grad), which inference mode forbids
        guided = any(d is not None for d in delays)
        with torch.no_grad() if guided else torch.inference_mode():
            rows = [self._append(r, raw) for r, raw in zip(batch, raws)]
            gens = [torch.Generator().manual_seed(_row_seed(self.seed, r.task_id, r.round_id, r.sample)) for r in batch]
            model_batch = self._stack(rows)
            noise = self._initial_noise(gens)
            self._captured = []
            self._row_gens = gens
            try:
                if self.cuda_graphs:
                    torch.compiler.cudagraph_mark_step_begin()  # a new round: earlier graph outputs are done with
                with self._autocast():
                    if guided:
                        chunk = self._sample_rtc(model_batch, noise, batch, delays)
                    else:
                        chunk = self._sample(model_batch, noise)  # normalized [B, chunk, action_dim]
            finally:
                self._row_gens = None
            actions = self.post(chunk.float().clone())
        actions = actions.detach().to("cpu", torch.float32).numpy()
        updates = x_t = None
        if self._captured:
            sl = self._chunk_slice()
            updates = torch.stack(self._captured, 1)[:, :, sl, : self.action_dim].float().cpu().numpy()
            x_t = noise[:, sl, : self.action_dim].float().cpu().numpy()
        self._captured = []
        out = []
        for i in range(len(batch)):
            out.append(ChunkResult(
                np.ascontiguousarray(actions[i]),
                None if updates is None else np.ascontiguousarray(updates[i]),
                initial_noise=None if x_t is None else np.ascontiguousarray(x_t[i]),
                state=np.asarray(batch[i].observation.joints, np.float32).copy(),
                task_id=batch[i].task_id, round_id=batch[i].round_id, rtc_delay_steps=delays[i],
            ))
        return out

    def close(self) -> None:
        self._hist.clear()
        self.policy = self.pre = self.post = None

    def _autocast(self):
        import contextlib

        if self.dtype == "bf16":
            return self.torch.autocast(device_type=self.device.type, dtype=self.torch.bfloat16)
        return contextlib.nullcontext()

    # --- observations --------------------------------------------------------------------
    def _to_raw(self, req: InferenceRequest) -> dict:
        """Core Observation -> LeRobot's raw observation dict (unbatched), or BadObservation."""
        torch = self.torch
        obs = req.observation
        who = f"task {req.task_id!r}"
        q = joint_state(req, self.state_dim, self.policy_type)
        images = list(obs.images or [])
        if len(images) != len(self.image_keys):
            raise BadObservation(f"{who}: {len(images)} camera images, the policy takes {len(self.image_keys)} "
                                 f"({', '.join(self.image_keys) or 'none'})")
        raw = {self.state_key: torch.from_numpy(q.copy())}
        for i, (key, (c, h, w), img) in enumerate(zip(self.image_keys, self.image_shapes, images)):
            img = np.asarray(img)
            if img.dtype != np.uint8 or img.shape != (h, w, c):
                raise BadObservation(f"{who}: image {i} ({key}) is {img.dtype} {img.shape}, "
                                     f"the policy takes uint8 {(h, w, c)} (HxWxC)")
            # HWC uint8 -> CHW float in [0, 1], as LeRobot's environment wrappers hand it over.
            raw[key] = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))).float().div_(255.0)
        raw["task"] = obs.instruction or ""
        return raw

    def _append(self, req: InferenceRequest, raw: dict) -> _History:
        """Preprocess (LeRobot's pipeline) and add to the task's history, once per round."""
        h = self._hist.get(req.task_id)
        if req.sample and h is not None and h.last_round == req.round_id and h.obs:
            return h  # a self-consistency replica: the history its request just extended
        pre = self.pre(raw)
        if self.policy_type == "diffusion" and self.image_keys:
            # DiffusionPolicy.select_action stacks the cameras into one key before queueing.
            pre["observation.images"] = self.torch.stack([pre[k] for k in self.image_keys], dim=-4)
        if h is None or (h.last_round is not None and req.round_id < h.last_round):
            h = self._hist[req.task_id] = _History(self.n_obs_steps)  # new task, or it restarted
        if h.last_round == req.round_id and h.obs:
            h.obs[-1] = pre  # the same round served again (requeue): refresh, do not append twice
        else:
            while len(h.obs) < self.n_obs_steps - 1:  # first observation fills the history (LeRobot's populate_queues)
                h.obs.append(pre)
            h.obs.append(pre)
            h.last_round = req.round_id
        return h

    def _stack(self, rows: list) -> dict:
        torch = self.torch
        if self.policy_type == "diffusion":
            keys = [self.state_key] + (["observation.images"] if self.image_keys else [])
            return {k: torch.cat([torch.stack([o[k] for o in h.obs], dim=1) for h in rows]) for k in keys}
        latest = [h.obs[-1] for h in rows]
        out = {k: torch.cat([o[k] for o in latest]) for k in [self.state_key, *self.image_keys]}
        if self.policy_type == "smolvla":
            from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS

            n = max(o[OBS_LANGUAGE_TOKENS].shape[1] for o in latest)
            tok, mask = [], []
            for o in latest:  # right-pad to the longest instruction, as the tokenizer would
                t, m = o[OBS_LANGUAGE_TOKENS], o[OBS_LANGUAGE_ATTENTION_MASK]
                pad = n - t.shape[1]
                tok.append(torch.nn.functional.pad(t, (0, pad), value=self._pad_id))
                mask.append(torch.nn.functional.pad(m, (0, pad), value=0))
            out[OBS_LANGUAGE_TOKENS], out[OBS_LANGUAGE_ATTENTION_MASK] = torch.cat(tok), torch.cat(mask)
        return out

    # --- sampling ------------------------------------------------------------------------
    def _noise_shape(self) -> Optional[tuple]:
        c = self.cfg
        if self.policy_type == "diffusion":
            return (c.horizon, self.action_dim)
        if self.policy_type == "smolvla":
            return (c.chunk_size, c.max_action_dim)
        return None

    def _initial_noise(self, gens: list):
        shape = self._noise_shape()
        if shape is None:
            return None
        torch = self.torch
        dtype = next(self.policy.parameters()).dtype
        # Drawn on the CPU from each row's generator: the same numbers on cpu and cuda.
        return torch.cat([torch.randn((1, *shape), generator=g, dtype=dtype) for g in gens]).to(self.device)

    def _chunk_slice(self) -> slice:
        start = self.n_obs_steps - 1 if self.policy_type == "diffusion" else 0
        return slice(start, start + self.chunk_len)

    def _sample(self, batch: dict, noise, **rtc):
        p = self.policy
        if self.policy_type == "diffusion":
            return p.diffusion.generate_actions(batch, noise=noise)
        if self.policy_type == "smolvla":
            return p.predict_action_chunk(batch, noise=noise, **rtc)[:, : self.chunk_len]
        return p.predict_action_chunk(batch)[:, : self.chunk_len]

    def _install_capture(self) -> None:
        """Record each denoising step's per-action update on the instance, LeRobot unforked."""
        if self.policy_type == "diffusion":
            sched = self.policy.diffusion.noise_scheduler
            orig = sched.step

            def step(model_output, timestep, sample, *args, **kwargs):
                if self._row_gens is not None and kwargs.get("generator") is None:
                    kwargs["generator"] = self._row_gens  # DDPM's per-step noise, per row too
                out = orig(model_output, timestep, sample, *args, **kwargs)
                self._captured.append(out.prev_sample - sample)
                return out

            sched.step = step
        elif self.policy_type == "smolvla":
            model = self.policy.model
            orig = model.denoise_step
            dt = -1.0 / self.cfg.num_steps  # the Euler step of VLAFlowMatching.sample_actions

            def denoise_step(*args, **kwargs):
                v_t = orig(*args, **kwargs)
                if not self._in_rtc:  # (under RTC the processor's wrapper captures the guided step)
                    self._captured.append(dt * v_t)
                return v_t

            model.denoise_step = denoise_step
            tok = getattr(model.vlm_with_expert.processor, "tokenizer", None)
            self._pad_id = int(getattr(tok, "pad_token_id", None) or 0)

    def _compile(self, mode: Optional[str] = None) -> None:
        """torch.compile the network each sampling step runs (not the Python sampling loop).
        mode "reduce-overhead" records CUDA graphs: one per batch size, so not dynamic."""
        torch, p = self.torch, self.policy
        kw = {"mode": mode, "dynamic": False} if mode else {"dynamic": True}
        if self.policy_type == "diffusion":
            p.diffusion.unet = torch.compile(p.diffusion.unet, **kw)
        elif self.policy_type == "smolvla":
            p.model.vlm_with_expert = torch.compile(p.model.vlm_with_expert, **kw)
        else:
            p.model = torch.compile(p.model, **kw)
