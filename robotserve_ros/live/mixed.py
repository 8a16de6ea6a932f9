"""Unchanged LeRobot RobotClients driving a fake robot (the `rsfake` LeRobot robot plugin in
lerobot_plugins/, on PYTHONPATH so LeRobot's own plugin discovery finds it): what the LeRobot
tests and `robotserve bench mixed-fleet` start."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

PLUGINS = Path(__file__).resolve().parent / "lerobot_plugins"
REPO = Path(__file__).resolve().parents[2]


def start_robot_client(work: Path, i: int, port: int, kind: str, path: Path, env=None, fps: int = 30) -> tuple:
    """LeRobot's robot_client as robot{i} on 127.0.0.1:port; its executed actions go to
    work/robot{i}.jsonl, its log to work/robot{i}.log. (process, record path)"""
    name = f"robot{i}"
    rec = work / f"{name}.jsonl"
    env = dict(env if env is not None else os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(REPO)]),
               HF_HUB_OFFLINE="1", HF_LEROBOT_HOME=str(work / "hf"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "lerobot.async_inference.robot_client", "--robot.type=rsfake", f"--robot.id={name}",
           f"--robot.record_path={rec}", f"--robot.seed={i}", "--task=pick up the cube",
           f"--server_address=127.0.0.1:{port}", f"--policy_type={kind}", f"--pretrained_name_or_path={path}",
           "--actions_per_chunk=4", "--chunk_size_threshold=0.5", "--aggregate_fn_name=latest_only", f"--fps={fps}"]
    log = open(work / f"{name}.log", "w")
    # cwd: LeRobot's client writes a logs/ folder where it starts
    return subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True), rec


def executed(rec: Path) -> np.ndarray:
    """The actions the fake robot executed, one row each."""
    if not rec.exists():
        return np.zeros((0, 6), np.float32)
    return np.array([json.loads(line)["action"] for line in rec.read_text().splitlines() if line.endswith("}")],
                    np.float32).reshape(-1, 6)
