"""Random-weight LeRobot policy directories, built on the spot (no hub, no dataset).

For tests (test/lerobot_policies.py re-exports this) and for profiling policies of a given
size without a trained checkpoint:

    make_policy_dir("diffusion", "/tmp/dp", n_obs_steps=2)
    make_policy_dir("smolvla", "/tmp/vla", size="real")      # SmolVLA on a SmolVLM2-500M-shaped VLM
    robotserve make-policy --kind diffusion|act|smolvla --size default|real --out DIR [--set KEY=JSON]

Sizes: `default` is small and quick (what the tests build); `real` is LeRobot 0.4.4's own
default architecture for the kind (REAL below), so timing it says what serving a real
checkpoint costs: the arithmetic does not depend on the weights' values, only on shapes.

Each directory is what a trained checkpoint looks like: `policy.save_pretrained(dir)` plus
the pre/post-processor pipelines from `make_pre_post_processors(cfg, dataset_stats=...)`
saved next to it. SmolVLA also needs a VLM backbone directory (config, tokenizer, image
processor): `make_tiny_vlm_dir` writes a SmolVLM config a few layers deep and a word-level
tokenizer trained on a handful of sentences, so nothing is downloaded.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

STATE_DIM = 6
ACTION_DIM = 6
META_FILE = "robotserve_policy.json"  # how the directory was made: kind, size, random weights


def _torch():
    from robotserve_ros.engines.torch_env import import_lerobot_policies, import_torch

    import_lerobot_policies()
    return import_torch()


def _features(state_dim: int, action_dim: int, cameras: int, image_hw: tuple[int, int]):
    from lerobot.configs.types import FeatureType, PolicyFeature

    inp = {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(state_dim,))}
    for i in range(cameras):
        inp[f"observation.images.cam{i}"] = PolicyFeature(type=FeatureType.VISUAL, shape=(3, *image_hw))
    out = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))}
    return inp, out


def _stats(inp: dict, out: dict) -> dict:
    """Dataset statistics for every feature: non-trivial, so a missing (un)normalisation shows."""
    torch = _torch()
    stats = {}
    for key, f in {**inp, **out}.items():
        if len(f.shape) == 3:  # images: per-channel, broadcast over H, W
            c = f.shape[0]
            mean, std = torch.full((c, 1, 1), 0.45), torch.full((c, 1, 1), 0.25)
            lo, hi = torch.zeros(c, 1, 1), torch.ones(c, 1, 1)
        else:
            n = f.shape[0]
            mean, std = torch.linspace(-0.5, 0.5, n), torch.linspace(0.5, 2.0, n)
            lo, hi = mean - 2 * std, mean + 2 * std
        stats[key] = {"mean": mean, "std": std, "min": lo, "max": hi}
    return stats


# SmolVLM2-500M-Video-Instruct's published shape (SmolVLA's default `vlm_model_name`): a SmolLM2-360M
# text model (32 layers; SmolVLA keeps the first 16) and a SigLIP-B/16 vision tower at 512x512.
SMOLVLM2_500M = {
    "text_config": {"model_type": "llama", "vocab_size": 49280, "hidden_size": 960, "intermediate_size": 2560,
                    "num_hidden_layers": 32, "num_attention_heads": 15, "num_key_value_heads": 5, "head_dim": 64,
                    "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
                    "pad_token_id": 0},
    "vision_config": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                      "num_attention_heads": 12, "image_size": 512, "patch_size": 16},
    "scale_factor": 4,
    "image_seq_len": 64,
}
TINY_VLM = {
    "text_config": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                    "max_position_embeddings": 512, "pad_token_id": 0},
    "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                      "num_attention_heads": 2, "image_size": 64, "patch_size": 16},
    "scale_factor": 2,
    "image_seq_len": 4,
}

# LeRobot 0.4.4's default configs (`size="real"`), with inputs of a real robot: random weights,
# no pretrained backbone (nothing is downloaded). Diffusion: the PushT setup its defaults come
# from (one 96x96 camera, 84x84 crop, DDPM 100 steps, UNet down_dims 512/1024/2048, ~263M).
# ACT: its defaults (dim 512, 4+1 layers, chunk 100, ~52M) with one 480x640 camera. SmolVLA:
# its defaults (chunk 50, 10 flow steps, 16 VLM layers, 512x512 padded images) on SMOLVLM2_500M
# with one camera (~450M).
REAL = {
    "diffusion": dict(cameras=1, image_hw=(96, 96), n_obs_steps=2, scheduler="DDPM", steps=100,
                      config=dict(crop_shape=(84, 84))),
    "act": dict(cameras=1, image_hw=(480, 640), config={}),
    "smolvla": dict(cameras=1, image_hw=(480, 640), steps=10, config={}),
}
SIZES = ("default", "real")


def make_tiny_vlm_dir(path: Path, shape: dict = TINY_VLM) -> Path:
    """A SmolVLM-shaped backbone directory: config + tokenizer + processor, no weights.

    `shape` picks the size (TINY_VLM for unit tests, SMOLVLM2_500M for real-size timing). The
    tokenizer is word-level, trained on a few sentences here; a config vocabulary larger than
    it (the real 49280) keeps the embedding tables at their real size."""
    _torch()
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, SmolVLMConfig
    from transformers.models.smolvlm import SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    specials = ["<pad>", "<unk>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>",
                "<global-img>", "<image>", "<video>"]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = ["pick up the cube", "push the t block to the target", "open the drawer", "place it in the bin"]
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=specials))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        extra_special_tokens={"fake_image_token": "<fake_token_around_image>", "global_image_token": "<global-img>",
                              "image_token": "<image>", "end_of_utterance_token": "<end_of_utterance>"},
    )
    text = dict(shape["text_config"])
    vocab = max(len(fast), int(text.get("vocab_size", 0)))
    text["vocab_size"] = vocab
    side = int(shape["vision_config"]["image_size"])
    cfg = SmolVLMConfig(
        text_config=text,
        vision_config=dict(shape["vision_config"]),
        scale_factor=shape["scale_factor"],
        image_token_id=fast.convert_tokens_to_ids("<image>"),
        vocab_size=vocab,
    )
    cfg.save_pretrained(path)
    image_proc = SmolVLMImageProcessor(do_resize=False, do_image_splitting=False,
                                       max_image_size={"longest_edge": side})
    video_proc = SmolVLMVideoProcessor(max_image_size={"longest_edge": side}, size={"longest_edge": side})
    SmolVLMProcessor(image_processor=image_proc, tokenizer=fast, video_processor=video_proc,
                     image_seq_len=shape["image_seq_len"]).save_pretrained(path)
    return path


def make_sized_policy_dir(kind: str, path: Path, size: str = "default", **kw) -> Path:
    """`make_policy_dir` at a named size; keyword arguments override the size's choices
    (cameras, image_hw, steps, ...; anything else goes to the policy config)."""
    if size not in SIZES:
        raise ValueError(f"size {size!r}: choose one of {', '.join(SIZES)}")
    if kind not in REAL:
        raise ValueError(f"unknown policy kind {kind!r}")
    if size == "default":
        return make_policy_dir(kind, path, **kw)
    preset = {k: v for k, v in REAL[kind].items() if k != "config"}
    config = dict(REAL[kind]["config"])
    args = {**preset, **config, **kw}
    return make_policy_dir(kind, path, real=True, **args)


def make_policy_dir(kind: str, path: Path, *, n_obs_steps: int = 1, cameras: int = 1,
                    image_hw: tuple[int, int] = (32, 32), state_dim: int = STATE_DIM, action_dim: int = ACTION_DIM,
                    scheduler: str = "DDIM", steps: int = 4, seed: int = 0, real: bool = False, **overrides) -> Path:
    """Write a random-weight `kind` policy ("diffusion", "act" or "smolvla") to `path`.

    Defaults keep it tiny (a few hundred thousand parameters, 32x32 images); keyword
    `overrides` go to the policy config, e.g. `down_dims=(64, 128, 256)` for the profile.
    `real=True` starts from LeRobot's own config defaults instead of the tiny ones (see
    make_sized_policy_dir)."""
    torch = _torch()
    from lerobot.policies.factory import make_pre_post_processors

    path = Path(path)
    torch.manual_seed(seed)
    inp, out = _features(state_dim, action_dim, cameras, image_hw)
    if kind == "diffusion":
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

        kw = dict(n_obs_steps=n_obs_steps, noise_scheduler_type=scheduler, num_inference_steps=steps)
        if not real:
            kw.update(horizon=8, n_action_steps=4, down_dims=(16, 32), kernel_size=3, n_groups=4,
                      diffusion_step_embed_dim=16, spatial_softmax_num_keypoints=8, num_train_timesteps=20,
                      crop_shape=None, use_group_norm=True)
        kw.update(overrides)
        cfg = DiffusionConfig(input_features=inp, output_features=out, device="cpu", **kw)
        policy = DiffusionPolicy(cfg)
    elif kind == "act":
        from lerobot.policies.act.configuration_act import ACTConfig
        from lerobot.policies.act.modeling_act import ACTPolicy

        kw = dict(pretrained_backbone_weights=None)  # random backbone: nothing from torchvision's hub
        if not real:
            kw.update(chunk_size=10, n_action_steps=5, dim_model=32, n_heads=2, dim_feedforward=64,
                      n_encoder_layers=1, n_decoder_layers=1, n_vae_encoder_layers=1, latent_dim=8)
        kw.update(overrides)
        cfg = ACTConfig(input_features=inp, output_features=out, device="cpu", **kw)
        policy = ACTPolicy(cfg)
    elif kind == "smolvla":
        from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
        from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

        vlm = make_tiny_vlm_dir(path.parent / f"{path.name}_vlm", SMOLVLM2_500M if real else TINY_VLM)
        kw = dict(num_steps=steps)
        if not real:
            kw.update(chunk_size=10, n_action_steps=5, max_state_dim=8, max_action_dim=8,
                      resize_imgs_with_padding=(64, 64), tokenizer_max_length=16, num_vlm_layers=2,
                      expert_width_multiplier=0.5)
        kw.update(overrides)
        cfg = SmolVLAConfig(input_features=inp, output_features=out, device="cpu", vlm_model_name=str(vlm),
                            load_vlm_weights=False, **kw)
        policy = SmolVLAPolicy(cfg)
    else:
        raise ValueError(f"unknown tiny policy kind {kind!r}")
    policy.save_pretrained(path)
    pre, post = make_pre_post_processors(cfg, dataset_stats=_stats(inp, out))
    pre.save_pretrained(path)
    post.save_pretrained(path)
    (path / META_FILE).write_text(json.dumps({
        "kind": kind, "size": "real" if real else "default", "random_weights": True, "seed": seed,
        "parameters": sum(p.numel() for p in policy.parameters())}, indent=1) + "\n")
    return path


def add_arguments(p, *, positional: bool = False) -> None:
    """The policy-building arguments, shared by `robotserve make-policy` (flags) and
    `python -m robotserve_ros.engines.tiny_policies KIND OUT` (positional)."""
    from ..cli_types import positive, seed

    if positional:
        p.add_argument("kind", choices=tuple(REAL))
        p.add_argument("out")
    else:
        p.add_argument("--kind", required=True, choices=tuple(REAL), help="policy type")
        p.add_argument("--out", required=True, help="policy directory to write (SmolVLA's VLM goes beside it, OUT_vlm)")
    p.add_argument("--size", choices=SIZES, default="default",
                   help="default: small, quick; real: LeRobot's default architecture at real input size")
    p.add_argument("--n-obs-steps", type=positive(int), help="observation steps the policy takes (default: the kind's)")
    p.add_argument("--cameras", type=positive(int), help="camera inputs (default: the kind's)")
    p.add_argument("--image", type=positive(int), help="side of the square camera image")
    p.add_argument("--steps", type=positive(int), help="denoising steps (diffusion, smolvla)")
    p.add_argument("--scheduler", choices=("DDIM", "DDPM"), help="the diffusion policy's noise scheduler")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="policy config field")
    p.set_defaults(func=cli)


CONFIGS = {"diffusion": ("lerobot.policies.diffusion.configuration_diffusion", "DiffusionConfig"),
           "act": ("lerobot.policies.act.configuration_act", "ACTConfig"),
           "smolvla": ("lerobot.policies.smolvla.configuration_smolvla", "SmolVLAConfig")}
_FIXED = {"input_features", "output_features", "device", "vlm_model_name", "load_vlm_weights"}  # it sets these


def settable(kind: str) -> set:
    """What `--set KEY=JSON` may name for `kind`: its LeRobot config's fields and make_policy_dir's keywords."""
    import dataclasses
    import importlib

    _torch()  # LeRobot's configs import torchvision: after the shim
    module, cls = CONFIGS[kind]
    import inspect

    fields = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), cls)) if f.init}
    own = {n for n, p in inspect.signature(make_policy_dir).parameters.items()
           if p.kind is p.KEYWORD_ONLY and n != "real"}
    return (fields - _FIXED) | own


def cli(a) -> int:
    over = {}
    for it in a.set:
        k, sep, v = it.partition("=")
        try:
            if not sep or not k:
                raise ValueError("not KEY=JSON")
            val = json.loads(v)
        except ValueError as e:
            why = str(e) if not sep or not k else 'VALUE is not JSON (a number, true/false, a [list], or a "quoted" string)'
            print(f"robotserve make-policy: --set {it!r}: {why}", file=sys.stderr)
            return 2
        over[k] = tuple(val) if isinstance(val, list) else val
    if over:  # a key neither the policy config nor make_policy_dir takes: named with the ones there are
        known = settable(a.kind)
        wrong = next((k for k in over if k not in known), None)
        if wrong is not None:
            print(f"robotserve make-policy: --set {wrong!r}: not a field of the {a.kind} config; its fields: "
                  f"{', '.join(sorted(known))}", file=sys.stderr)
            return 2
    named = {"n_obs_steps": a.n_obs_steps, "cameras": a.cameras, "steps": a.steps, "scheduler": a.scheduler,
             "image_hw": (a.image, a.image) if a.image else None}
    over.update({k: v for k, v in named.items() if v is not None})
    try:
        d = make_sized_policy_dir(a.kind, Path(a.out), a.size, seed=a.seed, **over)
    except (TypeError, ValueError) as e:  # a --set key or value the policy config refuses (LeRobot names it)
        print(f"robotserve make-policy: {e}", file=sys.stderr)
        return 2
    cfg = json.loads((Path(d) / "config.json").read_text())
    meta = json.loads((Path(d) / META_FILE).read_text())
    print(f"{d}: {a.kind} ({a.size}), {meta['parameters'] / 1e6:.1f}M parameters, random weights, "
          f"chunk {cfg.get('n_action_steps')}")
    return 0


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="write a random-weight LeRobot policy directory")
    add_arguments(ap, positional=True)
    a = ap.parse_args(argv)
    return a.func(a)


if __name__ == "__main__":
    raise SystemExit(main())
