"""`robotserve bench rtc-live`: how well the server knows the RTC delay d in a live fleet.

The same fleet as `bench fleet-live` (one inference server, simulated SO-101 robots with their
robot clients as ROS 2 processes, config/fleet.yaml unless --config), run twice in a row:
robot clients with `rtc: false`, then with `rtc: true` (docs/rtc_serving.md). The server
predicts each round's d at dispatch (core/rtc_delay.py); each robot records, per chunk, how many
actions it had executed since sending when the chunk came, minus d (d_error). d_error > 0: the
chunk came after the robot passed action d, so execution resumes at a row the inpainting did
not freeze; that fraction is the headline, with the chunks that came after the leftover ran
out (held: the robot stood still). Both runs send with --trigger-actions left (default 20): RTC
inpaints a leftover longer than the delay. Side by side: idle fraction, lateness and chunks/s
with and without RTC (the simulated engine's RTC is a stand-in: what is measured is the
serving side, the wire and the prediction, not the inpainting).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import yaml

from ..cli_types import positive, scratch


def add_arguments(p) -> None:
    p.add_argument("--robots", type=positive(int), default=12)
    p.add_argument("--duration", type=positive(), default=40.0, help="seconds per run, after every robot has started")
    from ..live.params_file import params_file

    p.add_argument("--config", type=params_file, help="ROS params file (default config/fleet.yaml)")
    p.add_argument("--trigger-actions", type=positive(int), default=20,
                   help="both runs: the robots send with this many actions left (RTC inpaints a leftover longer "
                        "than the delay; config/fleet.yaml's expected latency leaves about 3)")
    p.add_argument("--out", default=scratch("rtc_live.json"), help="result JSON (the record: reports/rtc_serving/rtc_live.json)")


def _with_rtc(base: str, rtc: bool, trigger: int, out: Path) -> str:
    cfg = yaml.safe_load(Path(base).read_text())
    cfg.setdefault("/**/robot_client", {}).setdefault("ros__parameters", {}).update(rtc=rtc, trigger_actions=trigger)
    out.write_text(yaml.safe_dump(cfg))
    return str(out)


def _counts_pct(counts: dict, q: float) -> float:
    """The q-th percentile of a {value: count} histogram."""
    if not counts:
        return float("nan")
    vals = np.repeat(np.array(list(counts), float), np.array(list(counts.values()), int))
    return float(np.percentile(vals, q))


def summarize(off: dict, on: dict) -> dict:
    """The two fleet-live results side by side, and the RTC account of the second."""
    rtc = on.get("rtc") or {}
    err, delays = rtc.get("d_error", {}), rtc.get("delays", {})
    n = sum(err.values())

    def side(r):
        return {k: r.get(k) for k in ("chunks_served", "idle_fraction", "lateness_p50_ms", "lateness_p99_ms",
                                      "chunks_per_s_in_window", "lost_chunks", "errors")}

    return {
        "without_rtc": side(off),
        "with_rtc": side(on),
        "rtc": {
            "guided_chunks": rtc.get("guided", 0),
            "held_fraction": rtc["held"] / rtc["guided"] if rtc.get("guided") else None,
            "unguided_chunks": rtc.get("unguided", 0),
            "d_mean": float(sum(k * v for k, v in delays.items()) / max(1, sum(delays.values()))) if delays else None,
            "d_p50": _counts_pct(delays, 50), "d_p90": _counts_pct(delays, 90), "d_max": max(delays) if delays else None,
            "d_error_mean": float(sum(k * v for k, v in err.items()) / n) if n else None,
            "d_error_p50": _counts_pct(err, 50), "d_error_p90": _counts_pct(err, 90),
            "late_fraction": sum(v for k, v in err.items() if k > 0) / n if n else None,
            "early_fraction": sum(v for k, v in err.items() if k < 0) / n if n else None,
            "clamp_held_fraction": rtc.get("clamp_held", 0) / rtc["guided"] if rtc.get("guided") else None,
            "delays": delays, "d_error": err,
        },
        "idle_fraction_ratio_rtc_over_without": (on["idle_fraction"] / off["idle_fraction"]
                                                 if off.get("idle_fraction") else None),
    }


def cli(a) -> int:
    from ..launch_description import default_config
    from .fleet_live import run_fleet_live

    base = a.config or default_config()
    tmp = Path(tempfile.mkdtemp(prefix="robotserve_rtc_live_"))
    load = [round(x, 2) for x in os.getloadavg()]
    runs = {}
    try:
        for rtc in (False, True):
            print(f"[rtc-live] robot clients with rtc: {str(rtc).lower()}", flush=True)
            runs[rtc] = run_fleet_live(tmp / f"rtc_{rtc}.json", robots=a.robots, duration=a.duration,
                                       config=_with_rtc(base, rtc, a.trigger_actions, tmp / f"params_rtc_{rtc}.yaml"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the params files; each run's logs are fleet-live's
    res = {"benchmark": "rtc-live",
           "command": f"robotserve bench rtc-live --robots {a.robots} --duration {a.duration:g} "
                      f"--trigger-actions {a.trigger_actions}"
                      + (f" --config {a.config}" if a.config else ""),
           "machine": runs[True]["machine"], "loadavg_at_start": load, "config": str(base),
           "control_hz": runs[True]["control_hz"], "engine_profile_ms": runs[True]["engine_profile_ms"],
           **summarize(runs[False], runs[True])}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    r = res["rtc"]
    print(f"guided chunks {r['guided_chunks']}, d p50 {r['d_p50']:g} / p90 {r['d_p90']:g} steps; "
          f"d_error p50 {r['d_error_p50']:g} / p90 {r['d_error_p90']:g}; chunk after the robot passed d: "
          f"{r['late_fraction']:.1%}; after the leftover ran out: {r['held_fraction']:.1%}; "
          f"d <= s <= H - d held: {r['clamp_held_fraction']:.1%}")
    w, o = res["without_rtc"], res["with_rtc"]
    print(f"idle fraction {w['idle_fraction']:.3f} without RTC, {o['idle_fraction']:.3f} with; "
          f"chunks/s {w['chunks_per_s_in_window']} vs {o['chunks_per_s_in_window']}")
    print(f"wrote {out}")
    bad = any(runs[k]["lost_chunks"] or runs[k]["processes_failed_during_run"] for k in runs) or not r["guided_chunks"]
    return 1 if bad else 0
