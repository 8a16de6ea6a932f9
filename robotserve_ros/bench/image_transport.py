"""`robotserve bench image-transport`: what JPEG camera frames save on the wire and what they
cost (issue 26 item 3), on sim_robot's rendered frames (a fixed, seeded image source).

Measured side by side in one run, per round of one robot (one camera, as sim_robot has):
  bytes_per_round_raw / _jpeg / _png   the serialized srv/Infer request (CDR, what DDS
                                       carries) with the camera as sensor_msgs/Image vs as
                                       CompressedImage; the joint state and ids are the same
  decode_ms_p50 / p99                  the server's decode per frame (transport/images.py:
                                       header check against the policy, then OpenCV)
  encode_ms_p50                        the robot's encode per frame
  action_max_abs_diff                  max |a_raw - a_jpeg| of the tiny random-weight SmolVLA
                                       (the lerobot engine) on the same frames, raw vs JPEG,
                                       the same noise (the engine seeds it by task and round)
Targets: >= 5x fewer bytes per round, decode < 2 ms median per frame.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from ..cli_types import UsageError, positive, scratch, seed

TARGET_RATIO, TARGET_DECODE_MS = 5.0, 2.0


def add_arguments(p) -> None:
    p.add_argument("--out", default=scratch("jpeg.json"), help="result JSON (the record: reports/live/jpeg.json)")
    p.add_argument("--frames", type=positive(int), default=120, help="rendered frames measured")
    p.add_argument("--size", type=positive(int), default=224, help="side of the square camera frame")
    p.add_argument("--quality", type=positive(int), default=90, help="JPEG quality, 1..100")
    p.add_argument("--policy-frames", type=positive(int), default=8, help="frames the tiny SmolVLA acts on, raw vs JPEG")
    p.add_argument("--seed", type=seed, default=0, help="seed of the robot's motion (and the policy's weights)")


def sim_frames(n: int, size: int, seed_: int) -> tuple[list, list]:
    """n frames of a simulated SO-101 moving to seeded random targets, rendered at size x size
    by sim_robot's renderer (15 Hz camera), and its joint positions at each."""
    from ..sim.robots import make_robot, render

    robot, rng = make_robot("so101", seed=seed_), np.random.default_rng(seed_)
    frames, joints = [], []
    for k in range(n):
        if k % 10 == 0:
            robot.command(rng.uniform(robot.lower, robot.upper))
        robot.step(1 / 15)
        frames.append(render(robot, size, size))
        joints.append(robot.positions())
    return frames, joints


def _infer_bytes(frame: np.ndarray, joints: np.ndarray, transport: str, quality: int) -> int:
    """Serialized size of one srv/Infer request carrying `frame` as robot_client sends it."""
    from rclpy.serialization import serialize_message
    from sensor_msgs.msg import Image

    from ..srv import Infer
    from ..transport.images import FrameEncoder

    h, w, _ = frame.shape
    im = Image(height=h, width=w, encoding="rgb8", step=3 * w)
    im.data = frame.tobytes()
    r = Infer.Request(task_id="robot_0/task0", round_id=1, robot_id="/robot_0")
    r.observation.joint_state.position = [float(x) for x in joints]
    if transport == "raw":
        r.observation.images = [im]
    else:
        r.compressed_images = FrameEncoder(transport, quality).encode([im])
    return len(serialize_message(r))


def _ms(xs) -> dict:
    a = np.asarray(xs) * 1e3
    return {"p50": round(float(np.median(a)), 4), "p99": round(float(np.percentile(a, 99)), 4)}


def _policy_diff(frames: list, joints: list, quality: int, seed_: int, size: int) -> dict:
    """The tiny SmolVLA on raw vs JPEG (and PNG: lossless, so 0) frames, the same noise."""
    from ..core.observation import Observation, ObservationSpec
    from ..core.types import InferenceRequest
    from ..engines import make_engine
    from ..engines.tiny_policies import STATE_DIM, make_policy_dir
    from ..transport.images import decode_frame, encode_frame

    spec = ObservationSpec(width=size, height=size, encodings=("rgb8",))
    with tempfile.TemporaryDirectory(prefix="robotserve_jpeg_") as tmp:
        d = make_policy_dir("smolvla", Path(tmp) / "vla", image_hw=(size, size), seed=seed_)
        eng = make_engine("lerobot", None, policy_dir=str(d), seed=seed_)
        try:
            out = {"raw": [], "jpeg": [], "png": []}
            for k, (f, q) in enumerate(zip(frames, joints)):
                state = np.resize(np.asarray(q, np.float32), STATE_DIM)
                for kind in out:
                    img = f if kind == "raw" else decode_frame("bench", *encode_frame(f, "rgb8", kind, quality if kind == "jpeg" else 3), spec)
                    obs = Observation(images=[img], joints=state, instruction="pick up the cube")
                    # same task and round: the engine draws the same initial noise (lerobot_engine._row_seed)
                    out[kind].append(eng.infer([InferenceRequest(task_id="bench", round_id=k, observation=obs)])[0].actions)
        finally:
            eng.close()
    raw = np.stack(out["raw"])
    return {"action_max_abs_diff": float(np.max(np.abs(raw - np.stack(out["jpeg"])))),
            "action_max_abs_diff_png": float(np.max(np.abs(raw - np.stack(out["png"])))),
            "action_max_abs_raw": float(np.max(np.abs(raw))),
            "action_shape": list(raw.shape[1:])}


def run(out: Path, frames: int = 120, size: int = 224, quality: int = 90, policy_frames: int = 8, seed_: int = 0) -> dict:
    from ..core.observation import ObservationSpec
    from ..machine import machine_info
    from ..transport.images import decode_frame, encode_frame

    machine = machine_info()
    imgs, joints = sim_frames(frames, size, seed_)
    spec = ObservationSpec(width=size, height=size, encodings=("rgb8",))
    size_of = {t: [_infer_bytes(f, q, t, quality if t == "jpeg" else 3) for f, q in zip(imgs, joints)] for t in ("raw", "jpeg", "png")}
    enc_s, dec_s, frame_bytes = [], [], []
    for f in imgs:
        t = time.perf_counter()
        fmt, data = encode_frame(f, "rgb8", "jpeg", quality)
        enc_s.append(time.perf_counter() - t)
        frame_bytes.append(len(data))
        decode_frame("bench", fmt, data, spec)  # warm (first-touch) pass
        t = time.perf_counter()
        decode_frame("bench", fmt, data, spec)
        dec_s.append(time.perf_counter() - t)
    raw_b, jpeg_b, png_b = (float(np.mean(size_of[t])) for t in ("raw", "jpeg", "png"))
    dec, enc = _ms(dec_s), _ms(enc_s)
    res = {
        "benchmark": "image-transport",
        "command": f"robotserve bench image-transport --out {out} --frames {frames} --size {size} --quality {quality} "
                   f"--policy-frames {policy_frames} --seed {seed_}",
        "source": f"sim_robot's renderer (sim/robots.py render), so101 seed {seed_}, {size}x{size} rgb8, one camera",
        "frames": frames, "quality": quality,
        "bytes_per_round_raw": round(raw_b, 1),
        "bytes_per_round_jpeg": round(jpeg_b, 1),
        "bytes_per_round_png": round(png_b, 1),
        "ratio_raw_over_jpeg": round(raw_b / jpeg_b, 2),
        "jpeg_frame_bytes_p50": float(np.median(frame_bytes)),
        "decode_ms_p50": dec["p50"], "decode_ms_p99": dec["p99"],
        "encode_ms_p50": enc["p50"], "encode_ms_p99": enc["p99"],
        **_policy_diff(imgs[:policy_frames], joints[:policy_frames], quality, seed_, size),
        "policy_frames": policy_frames,
        "policy": "tiny random-weight SmolVLA (engines/tiny_policies.py), lerobot engine, cpu",
        "targets": {"ratio_raw_over_jpeg_min": TARGET_RATIO, "decode_ms_p50_max": TARGET_DECODE_MS},
        "machine": machine,
    }
    res["met"] = {"bytes": res["ratio_raw_over_jpeg"] >= TARGET_RATIO, "decode": res["decode_ms_p50"] < TARGET_DECODE_MS}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    return res


def cli(a) -> int:
    if a.size < 8:
        raise UsageError(f"--size {a.size}: the renderer draws at least 8x8")
    if not 1 <= a.quality <= 100:
        raise UsageError(f"--quality {a.quality}: a JPEG quality is 1..100")
    if a.policy_frames > a.frames:
        raise UsageError(f"--policy-frames {a.policy_frames}: at most --frames ({a.frames})")
    r = run(Path(a.out), a.frames, a.size, a.quality, a.policy_frames, a.seed)
    print(f"bytes per round: raw {r['bytes_per_round_raw']:.0f}, jpeg q{a.quality} {r['bytes_per_round_jpeg']:.0f} "
          f"({r['ratio_raw_over_jpeg']}x, target >= {TARGET_RATIO:g}x), png {r['bytes_per_round_png']:.0f}")
    print(f"decode per frame: p50 {r['decode_ms_p50']} ms (target < {TARGET_DECODE_MS:g}), p99 {r['decode_ms_p99']} ms; "
          f"encode p50 {r['encode_ms_p50']} ms")
    print(f"tiny SmolVLA, raw vs jpeg: max |action diff| {r['action_max_abs_diff']:.4g} "
          f"(actions up to {r['action_max_abs_raw']:.3g}; png {r['action_max_abs_diff_png']:.3g})")
    print(f"wrote {a.out}")
    return 0 if all(r["met"].values()) else 1
