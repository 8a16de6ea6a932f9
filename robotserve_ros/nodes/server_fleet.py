"""Where the inference server's fleet lives (`engine_process`): inline, the engines, tiers,
core and Runner in this process (serve/build.py); separate, in an engine core process of
their own (serve/core_process.py) that a RemoteFleet (serve/remote.py) speaks to over ZMQ.
The node is the same ROS front end either way: srv/Infer, progress, diagnostics."""
from __future__ import annotations

import os
from types import SimpleNamespace

from ..config import ConfigError, flatten, unflatten
from ..core.observation import ObservationSpec
from ..core.types import ExecInfo
from ..serve import build_tiers, server_fleet
from ..serve.progress import apply_progress
from .common import ParamError, to_sec
from .infer_call import proof_of


def engine_side(node, c):
    """(what the fleet is built over, the engine or its facts): a TierSet inline; separate, the
    RemoteFleet itself, the core process started (or attached to) here. Both have close()."""
    try:
        if c.engine_process == "separate":
            return _remote(node, c)
        tiers = build_tiers(c, node.clock)
        return tiers, tiers.engine
    except ConfigError:
        raise
    except ValueError as e:  # a bad tier, an unreachable server, a bad placement knob, a core that cannot start
        where, what = e.args if len(e.args) == 2 else ("remote_tiers", str(e))
        raise ParamError(where, f"cannot build it: {what}") from e


def _remote(node, c):
    from ..serve.remote import RemoteFleet, core_address

    tree = unflatten({k: v for k, (v, _) in flatten(c).items()})
    key = f"{os.environ.get('ROS_DOMAIN_ID', '0')}|{node.get_fully_qualified_name()}|{c.service}"
    fleet = RemoteFleet(tree, core_address(key), lambda level, line: _log(node, level, line), auth=bool(c.task_auth.key_dir))
    f = fleet.facts
    spec = ObservationSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in f["spec"].items()}) \
        if f["spec"] else None
    engine = SimpleNamespace(observation_spec=spec, action_dim=f["action_dim"], chunk_len=f["chunk_len"],
                             action_names=f["action_names"], profile=SimpleNamespace(saturation_batch=f["saturation_batch"]))
    return fleet, engine


def _log(node, level: str, line: str) -> None:
    """rclpy fixes a call site's severity: one site per level."""
    if level == "error":
        node.get_logger().error(line)
    elif level == "warning":
        node.get_logger().warning(line)
    else:
        node.get_logger().info(line)


def node_fleet(node, c, built, scheduler):
    """The fleet over engine_side's `built`: inline, the core and Runner (refresh ahead: the
    next batch's stale observations fetched while the current one generates); separate,
    the RemoteFleet, its refresh asks answered by the node's refresher."""
    if getattr(built, "remote", False):
        built.refresher = node.refresher
        return built
    from ..core.task_auth import TaskBinder

    try:
        binder = TaskBinder(c.task_auth.key_dir, c.task_auth.max_skew_s) if c.task_auth.key_dir else None
    except ValueError as e:
        built.close()
        raise ParamError("task_auth.key_dir", str(e)) from None
    try:
        return server_fleet(
            c, node.clock, built, scheduler=scheduler, refresher=node.refresher, binder=binder, observer=node.trace,
            on_error=lambda d, e: node.get_logger().error(
                f"tier {d.tier} failed a batch of {len(d.requests)}: {e!r}; requeued"))
    except ValueError as e:  # a horizon knob the policy does not take: say which
        raise ParamError(*e.args) from e


def on_progress(node, m) -> None:
    """A robot's progress: its task kept alive, or ended (serve/progress.py). Separate, the
    core applies and counts it; the node forgets what it keeps of an ended task."""
    done = ExecInfo(to_sec(m.exec_start), 0, float(m.control_hz) or 1.0) if m.task_done else None
    proof = proof_of(m, m.header.stamp, "progress")
    if getattr(node.fleet, "remote", False):
        node.fleet.progress(m.task_id, m.robot_id, proof, done)
        if done is not None:
            with node.lock:
                node._forget(m.task_id)
        return
    with node.lock:
        out = apply_progress(node.fleet, m.task_id, m.robot_id, proof, done)
        if isinstance(out, str):  # a topic has no reply: counted (progress_refused on /diagnostics)
            node.progress_refused[out] += 1
        elif out is not None:
            node.finished["tasks"] += 1
            node.finished["wait_sum"] += out.closed_wait
            node._forget(m.task_id)
