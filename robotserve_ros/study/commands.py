"""`robotserve study collect | train | horizon`: the PushGust task and the horizon study."""
from __future__ import annotations

from pathlib import Path


def cmd_collect(a) -> int:
    from .collect import collect, save_demos

    data = collect(a.episodes, seed=a.seed)
    save_demos(a.out, data)
    print(f"wrote {a.out}: {len(data['episode_len'])} demos, {len(data['state'])} frames "
          f"(expert success {data['expert_success']:.1%} over {int(data['attempts'])} attempts)")
    return 0


def cmd_train(a) -> int:
    from .train import TrainConfig, train

    cfg = TrainConfig(steps=a.steps, batch_size=a.batch_size, lr=a.lr, seed=a.seed, threads=a.threads)
    info = train(a.demos, a.out, cfg)
    print(f"wrote {a.out}: {info['params'] / 1e6:.2f}M params, trained in {info['train_wall_s']:.0f} s, "
          f"final loss {info['final_loss']:.4f}")
    return 0


def cmd_train_flow(a) -> int:
    from .train_flow import FlowTrainConfig, train_flow

    cfg = FlowTrainConfig(steps=a.steps, batch_size=a.batch_size, lr=a.lr, seed=a.seed, threads=a.threads)
    info = train_flow(a.demos, a.out, cfg)
    print(f"wrote {a.out}: {info['params'] / 1e6:.2f}M params, trained in {info['train_wall_s']:.0f} s, "
          f"final loss {info['final_loss']:.4f}")
    return 0


def cmd_horizon(a) -> int:
    from .horizon import StudyConfig, run_study, write_reports

    cfg = StudyConfig(
        static_h=tuple(a.static), thresholds=tuple(a.thresholds), seeds=tuple(a.seeds), episodes=a.episodes,
        max_steps=a.max_steps, threads=a.threads, h_min=a.h_min,
    )
    rows, meta = run_study(a.policy, cfg)
    paths = write_reports(rows, meta, Path(a.out), workload_out=a.workload_out, profile=a.profile)
    for r in rows:
        print(f"  {r['policy']:10s} {r['param']:>6g}  success {r['success']:.3f}  mean H {r['mean_horizon']:5.2f}  "
              f"rounds/episode {r['rounds_per_episode']:6.1f}")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def add_parser(sub) -> None:
    """The `study` command group, added to the `robotserve` parser."""
    from ..cli import positive
    st = sub.add_parser("study", help="PushGust (pymunk) task: demos, DiffusionPolicy training, horizon study")
    g = st.add_subparsers(dest="study", required=True)
    c = g.add_parser("collect", help="scripted-expert demonstrations into an npz")
    c.add_argument("--episodes", type=int, default=500, help="successful demos to keep")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", required=True, help="npz path (keep it out of git)")
    c.set_defaults(func=cmd_collect)
    t = g.add_parser("train", help="train a small state-only DiffusionPolicy on the CPU; save_pretrained into --out")
    t.add_argument("--demos", required=True)
    t.add_argument("--out", required=True, help="checkpoint directory (policy + pre/post-processors)")
    t.add_argument("--steps", type=int, default=7000)
    t.add_argument("--batch-size", type=int, default=128)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=1, help="torch threads (1 is kind to a shared CPU)")
    t.set_defaults(func=cmd_train)
    f = g.add_parser("train-flow", help="train a small flow-matching action head (Euler sampling) on the CPU")
    f.add_argument("--demos", required=True)
    f.add_argument("--out", required=True, help="checkpoint directory (config.json + model.safetensors)")
    f.add_argument("--steps", type=positive(int), default=20000)
    f.add_argument("--batch-size", type=positive(int), default=256)
    f.add_argument("--lr", type=float, default=1e-3)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--threads", type=positive(int), default=1, help="torch threads (1 is kind to a shared CPU)")
    f.set_defaults(func=cmd_train_flow)
    h = g.add_parser("horizon", help="success vs mean execution horizon: static H and confidence t (seed 000 Fig. 11)")
    h.add_argument("--policy", required=True, help="checkpoint directory")
    h.add_argument("--out", default="reports/horizon_study.json", help="JSON; .md and .png are written beside it")
    h.add_argument("--static", type=int, nargs="+", default=[1, 2, 4, 6, 8, 12, 16])
    h.add_argument("--thresholds", type=float, nargs="+", default=[0.0, 0.25, 0.5, 1.0, 2.0, 4.0])
    h.add_argument("--h-min", type=int, default=None, help="confidence H_min (default: the smallest static H)")
    h.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    h.add_argument("--episodes", type=int, default=20, help="episodes per seed and configuration")
    h.add_argument("--max-steps", type=int, default=None, help="episode step limit (default: the task's)")
    h.add_argument("--threads", type=int, default=1)
    h.add_argument("--workload-out", help="also write the simulator workload file here")
    h.add_argument("--profile", help="engine profile JSON (`robotserve profile`) for the workload's engine block")
    h.set_defaults(func=cmd_horizon)


__all__ = ["add_parser"]
