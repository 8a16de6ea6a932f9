"""Random-weight LeRobot policy directories, built on the spot (no hub, no dataset).

For tests (test/lerobot_policies.py re-exports this) and for profiling policies of a given
size without a trained checkpoint:

    make_policy_dir("diffusion", "/tmp/dp", n_obs_steps=2)
    python -m robotserve_ros.engines.tiny_policies diffusion /tmp/dp --set down_dims=[64,128,256]

Each directory is what a trained checkpoint looks like: `policy.save_pretrained(dir)` plus
the pre/post-processor pipelines from `make_pre_post_processors(cfg, dataset_stats=...)`
saved next to it. SmolVLA also needs a VLM backbone directory (config, tokenizer, image
processor): `make_tiny_vlm_dir` writes a SmolVLM config a few layers deep and a word-level
tokenizer trained on a handful of sentences, so nothing is downloaded.
"""
from __future__ import annotations

import json
from pathlib import Path

STATE_DIM = 6
ACTION_DIM = 6


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


def make_tiny_vlm_dir(path: Path) -> Path:
    """A SmolVLM-shaped backbone small enough for a unit test: config + tokenizer + processor."""
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
    vocab = len(fast)
    cfg = SmolVLMConfig(
        text_config={"model_type": "llama", "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                     "max_position_embeddings": 512, "pad_token_id": 0},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 64, "patch_size": 16},
        scale_factor=2,
        image_token_id=fast.convert_tokens_to_ids("<image>"),
        vocab_size=vocab,
    )
    cfg.save_pretrained(path)
    image_proc = SmolVLMImageProcessor(do_resize=False, do_image_splitting=False, max_image_size={"longest_edge": 64})
    video_proc = SmolVLMVideoProcessor(max_image_size={"longest_edge": 64}, size={"longest_edge": 64})
    SmolVLMProcessor(image_processor=image_proc, tokenizer=fast, video_processor=video_proc,
                     image_seq_len=4).save_pretrained(path)
    return path


def make_policy_dir(kind: str, path: Path, *, n_obs_steps: int = 1, cameras: int = 1,
                    image_hw: tuple[int, int] = (32, 32), state_dim: int = STATE_DIM, action_dim: int = ACTION_DIM,
                    scheduler: str = "DDIM", steps: int = 4, seed: int = 0, **overrides) -> Path:
    """Write a random-weight `kind` policy ("diffusion", "act" or "smolvla") to `path`.

    Defaults keep it tiny (a few hundred thousand parameters, 32x32 images); keyword
    `overrides` go to the policy config, e.g. `down_dims=(64, 128, 256)` for the profile."""
    torch = _torch()
    from lerobot.policies.factory import make_pre_post_processors

    path = Path(path)
    torch.manual_seed(seed)
    inp, out = _features(state_dim, action_dim, cameras, image_hw)
    if kind == "diffusion":
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

        kw = dict(n_obs_steps=n_obs_steps, horizon=8, n_action_steps=4, down_dims=(16, 32), kernel_size=3,
                  n_groups=4, diffusion_step_embed_dim=16, spatial_softmax_num_keypoints=8,
                  noise_scheduler_type=scheduler, num_train_timesteps=20, num_inference_steps=steps,
                  crop_shape=None, use_group_norm=True)
        kw.update(overrides)
        cfg = DiffusionConfig(input_features=inp, output_features=out, device="cpu", **kw)
        policy = DiffusionPolicy(cfg)
    elif kind == "act":
        from lerobot.policies.act.configuration_act import ACTConfig
        from lerobot.policies.act.modeling_act import ACTPolicy

        kw = dict(chunk_size=10, n_action_steps=5, dim_model=32, n_heads=2, dim_feedforward=64,
                  n_encoder_layers=1, n_decoder_layers=1, n_vae_encoder_layers=1, latent_dim=8,
                  pretrained_backbone_weights=None)
        kw.update(overrides)
        cfg = ACTConfig(input_features=inp, output_features=out, device="cpu", **kw)
        policy = ACTPolicy(cfg)
    elif kind == "smolvla":
        from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
        from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

        vlm = make_tiny_vlm_dir(path.parent / f"{path.name}_vlm")
        kw = dict(chunk_size=10, n_action_steps=5, num_steps=steps, max_state_dim=8, max_action_dim=8,
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
    return path


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="write a random-weight LeRobot policy directory")
    ap.add_argument("kind", choices=("diffusion", "act", "smolvla"))
    ap.add_argument("out")
    ap.add_argument("--n-obs-steps", type=int, default=1)
    ap.add_argument("--cameras", type=int, default=1)
    ap.add_argument("--image", type=int, default=32, help="side of the square camera image")
    ap.add_argument("--steps", type=int, default=4, help="denoising steps (diffusion, smolvla)")
    ap.add_argument("--scheduler", default="DDIM")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="policy config field")
    a = ap.parse_args(argv)
    over = {}
    for it in a.set:
        k, _, v = it.partition("=")
        val = json.loads(v)
        over[k] = tuple(val) if isinstance(val, list) else val
    d = make_policy_dir(a.kind, Path(a.out), n_obs_steps=a.n_obs_steps, cameras=a.cameras,
                        image_hw=(a.image, a.image), steps=a.steps, scheduler=a.scheduler, seed=a.seed, **over)
    print(d)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
