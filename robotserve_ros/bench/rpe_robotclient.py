"""LeRobot's own `RobotClient` (lerobot.async_inference.robot_client, unchanged) as the robots
of the LeRobot protocol rows of `robotserve bench robots-per-engine` (`--lerobot-client
robotclient`): several RobotClients per client process, each driving the project's fake robot
(the `rsfake` LeRobot robot plugin, live/lerobot_plugins) with its own control loop and action
receiver threads, as `async_client` runs them.

RobotClient keeps its own timing: each control tick at fps it executes an action if one is
queued, and sends an observation on every tick while its queue is at or below
chunk_size_threshold x chunk (threshold = trigger / H: it asks with `trigger` actions left, as
the bench's robots do; the server keeps the newest). It reports no round trip, so the bench
reads four of its calls on the client object (instance attributes, its code untouched):
actions_available (once per control tick: a tick that finds nothing queued holds the robot
until the next, the idle time), the fake robot's send_action (an action executed),
send_observation (when the observation of each timestep first went out) and
_aggregate_action_queues (a chunk arrived: its first action's timestep names the observation
it answers; round trip = arrival - that observation's send). One thing is added to its
channel: an option that gives each client its own connection (see _client).
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time

from ..live.mixed import PLUGINS
from .rpe_clients import CAMERA_HW, STATE_DIM


def _client(port: int, i: int, policy_dir: str, horizon: int, trigger: int, hz: float):
    if str(PLUGINS) not in sys.path:
        sys.path.insert(0, str(PLUGINS))
    import lerobot_robot_rsfake  # noqa: F401 - registers the `rsfake` robot type
    from lerobot.async_inference import robot_client
    from lerobot.async_inference.configs import RobotClientConfig
    from lerobot.async_inference.robot_client import RobotClient

    base = robot_client.grpc_channel_options
    if not getattr(base, "own_connection", False):
        # Each RobotClient its own TCP connection, as one per robot computer has: channels of one
        # process share one by default, and a server that knows a client by its connection
        # (robotserve's LeRobot endpoint, as LeRobot's own one-client server) would see one robot.
        def own_connection(*a, **kw):
            return [*base(*a, **kw), ("grpc.use_local_subchannel_pool", 1)]

        own_connection.own_connection = True
        robot_client.grpc_channel_options = own_connection

    cfg = RobotClientConfig(policy_type="act", pretrained_name_or_path=policy_dir,
                            robot=lerobot_robot_rsfake.RsFakeConfig(id=f"robot{i}", joints=STATE_DIM,
                                                                    camera_height=CAMERA_HW[0],
                                                                    camera_width=CAMERA_HW[1], seed=i),
                            actions_per_chunk=horizon, task="pick up the cube", server_address=f"127.0.0.1:{port}",
                            chunk_size_threshold=trigger / horizon, fps=int(round(hz)), aggregate_fn_name="latest_only")
    return RobotClient(cfg)


class Watched:
    """One RobotClient and what the bench reads off it (see the module docstring)."""

    def __init__(self, client) -> None:
        self.c, self.acted, self.sent, self.rts, self.ticks = client, [], {}, [], []
        robot, send, agg = client.robot, client.send_observation, client._aggregate_action_queues
        available = client.actions_available

        def actions_available():  # asked once per control tick, before it executes one
            got = available()
            self.ticks.append((time.time(), got))
            return got

        def send_action(action, _f=robot.send_action):
            self.acted.append(time.time())
            return _f(action)

        def send_observation(obs):
            self.sent.setdefault(obs.get_timestep(), time.time())
            return send(obs)

        def aggregate(timed_actions, fn=None):
            if timed_actions:
                t0 = self.sent.get(timed_actions[0].get_timestep())
                if t0 is not None:
                    self.rts.append((time.time(), time.time() - t0))
            return agg(timed_actions, fn)

        robot.send_action, client.send_observation, client._aggregate_action_queues = \
            send_action, send_observation, aggregate
        client.actions_available = actions_available

    def result(self, start: float, end: float, hz: float) -> dict:
        """Idle = the window's time holding position for want of an action: from each control
        tick that found the queue empty to the next tick (the bench's robots' idle). A slow
        control loop is not idle by this measure; `short_s` says how far the executed actions
        fell short of one per period (the loop's own lateness and idle together)."""
        ticks = [(t, ok) for t, ok in self.ticks if start <= t < end] + [(end, True)]
        idle = sum(b[0] - a[0] for a, b in zip(ticks, ticks[1:]) if not a[1])
        n = sum(1 for t in self.acted if start <= t < end)
        rts = [rt for t, rt in self.rts if start <= t < end]
        task = end - start
        return {"idle_s": idle, "task_s": task, "rt_s": rts, "late_s": 0.0, "short_s": max(0.0, task - n / hz)} \
            if rts else {"error": "no chunk arrived in the window"}


def robotclient_worker(port_of, policy_dir: str, phases, kw, core, q, ready, t_start) -> None:
    """A client process: RobotClients for `phases` ((index, phase) pairs), each started
    (Ready, policy instructions) before the clock, its loop begun at its phase."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    logging.disable(logging.INFO)  # RobotClient logs a line per chunk and observation
    watched, threads, out = [], [], []
    try:
        for i, phase in phases:
            w = Watched(_client(port_of(i), i, policy_dir, kw["horizon"], kw["trigger"], kw["hz"]))
            if not w.c.start():
                raise ConnectionError(f"RobotClient {i} could not reach its server")
            watched.append((w, phase))
        with ready.get_lock():
            ready.value += len(phases)
        while t_start.value == 0.0:
            time.sleep(0.005)
        start, end = t_start.value, t_start.value + kw["window_s"] + kw["max_phase"]
        for w, phase in watched:
            def run(w=w, at=start + phase):
                time.sleep(max(0.0, at - time.time()))
                threading.Thread(target=w.c.receive_actions, daemon=True).start()
                w.c.control_loop(task="pick up the cube")
            threads.append(threading.Thread(target=run, daemon=True))
            threads[-1].start()
        time.sleep(max(0.0, end - time.time()))
        out = [w.result(start + phase, end, kw["hz"]) for w, phase in watched]
    except Exception as e:  # noqa: BLE001 - reported per robot: the row is unfed
        out = [{"error": f"{type(e).__name__}: {e}"}] * len(phases)
    finally:
        logging.disable(logging.CRITICAL)  # its threads' errors as their channels close are the bench's doing
        for w, _ in watched:
            w.c.shutdown_event.set()
            w.c.channel.close()
    q.put(out)
