"""Stale observations refreshed from the robots (seed 000 Algorithm 1 lines 20-21), for the
inference server's core, two ways:
- a topic (`refresh_topic`, issue 26): robots publish their newest observation as an
  srv/Infer request (task id, round, robot, auth) with sensor-data QoS; one subscription
  keeps the latest per task, read at dispatch: no client and no call per robot;
- srv/FetchObservation: one pooled client per robot's refresh service, a whole batch asked at
  once and waited for within one deadline. A client lives while a task names its service: a
  name no task uses any more is destroyed (issue 29: a robot naming a new service each round
  made a client per name, never freed).
The topic's observation is used when it is newer than the queued one; else the service."""
from __future__ import annotations

import threading
import time
from collections import deque

from ..core.errors import RequestError
from ..srv import FetchObservation, Infer
from .convert import observation_from_msg
from .deferred import resolve_queued_responses


class ObservationRefresher:
    """The core's refresher: `refresher(reqs)` -> per request (observation, stamp), or None
    for a robot that cannot answer in time (its round goes with the observation it has).
    `services[task_id]` names the robot's refresh service (set by the server per request)."""

    def __init__(self, node, spec, timeout_s: float, callback_group, topic: str = "", topic_depth: int = 1000,
                 verify=None) -> None:
        self.node, self.spec, self.timeout_s, self.group = node, spec, timeout_s, callback_group
        self.services: dict = {}  # task id -> its robot's FetchObservation service
        self.clients: dict = {}  # service name -> client (rclpy's Node keeps its own _clients)
        self.lock = threading.Lock()  # refreshes run from two threads (refresh ahead)
        self.durations_s: deque = deque(maxlen=1024)  # one batch's refresh, call to return
        # Rounds whose robot did not answer a refresh in time (oldest first, bounded): asked
        # ahead and failed, it is not asked again at dispatch, where the engine would wait.
        self._no_refresh: dict = {}
        self.ages_s: deque = deque(maxlen=1024)  # a refreshed observation's age when handed to the batch
        # The topic: latest message per task (only tasks the server holds: bounded by its ledger).
        # `verify(msg)` raises RequestError for a message not from the task's robot (task auth).
        self.latest: dict = {}
        self.verify = verify
        self.topic_used = self.topic_refused = 0
        if topic:
            from rclpy.qos import HistoryPolicy, QoSProfile, qos_profile_sensor_data

            # Sensor-data QoS (best effort, volatile), but one history for all robots' writers:
            # keep-last 1 on a keyless topic would keep one robot's message, not one per robot.
            qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=topic_depth,
                             reliability=qos_profile_sensor_data.reliability,
                             durability=qos_profile_sensor_data.durability)
            node.create_subscription(Infer.Request, topic, self._on_observation, qos, callback_group=callback_group)

    def _on_observation(self, m) -> None:
        if m.task_id in self.services:  # a task the server holds (use() ran): the newest wins
            self.latest[m.task_id] = m

    def use(self, task_id: str, name: str) -> None:
        """Task `task_id` names `name` as its refresh service ('' none) from now on."""
        old = self.services.get(task_id)
        self.services[task_id] = name
        if old and old != name:
            self._reap(old)

    def forget(self, task_id: str) -> None:
        self.latest.pop(task_id, None)
        old = self.services.pop(task_id, None)
        if old:
            self._reap(old)

    def _reap(self, name: str) -> None:
        """Destroy the client of `name` once no task names it (O(tasks), on a change only)."""
        if name in self.services.values():
            return
        with self.lock:
            cli = self.clients.pop(name, None)
        if cli is not None:
            try:
                self.node.destroy_client(cli)  # a call on it in flight times out in _collect
            except Exception:  # the node is shutting down
                pass

    def __call__(self, reqs) -> list:
        """The topic's newest observation where it is newer than the queued one; the others
        all asked at once, all waited for within one timeout_s, so a slow or silent robot
        costs the batch at most that, never the engine one timeout per robot."""
        t0 = time.monotonic()
        try:
            got = [self._from_topic(req) for req in reqs]
            asked = [(i, req) for i, (req, g) in enumerate(zip(reqs, got)) if g is None]
            if asked:
                for (i, _), res in zip(asked, self._collect([r for _, r in asked], [self._ask(r) for _, r in asked],
                                                            t0 + self.timeout_s)):
                    got[i] = res
            now = self.node.get_clock().now().nanoseconds * 1e-9
            self.ages_s.extend(now - g[1] for g in got if g is not None)
            return got
        finally:
            self.durations_s.append(time.monotonic() - t0)

    def _from_topic(self, req):
        m = self.latest.get(req.task_id)
        if m is None:
            return None
        try:
            if self.verify is not None:
                self.verify(m)
            obs = observation_from_msg(m.observation, self.spec)
        except RequestError:  # not the task's robot, or malformed: not used, counted
            self.latest.pop(req.task_id, None)
            self.topic_refused += 1
            return None
        if req.obs_stamp is not None and obs.stamp <= req.obs_stamp:
            return None  # nothing newer than what the round carries
        self.topic_used += 1
        return obs, obs.stamp

    def _ask(self, req):
        name = self.services.get(req.task_id)
        if not name or (req.task_id, req.round_id) in self._no_refresh:  # it just failed to answer for this round
            return None
        with self.lock:
            cli = self.clients.get(name)
            if cli is None:
                cli = self.clients[name] = self.node.create_client(FetchObservation, name, callback_group=self.group)
        if not cli.service_is_ready():
            return None
        done = threading.Event()
        fut = cli.call_async(FetchObservation.Request(task_id=req.task_id, round_id=req.round_id))

        def answered(_, cli=cli, done=done) -> None:
            done.set()
            resolve_queued_responses(cli)  # a batch's other replies on this client: no wake-up each

        fut.add_done_callback(answered)
        return cli, fut, done

    def _collect(self, reqs, calls, end: float) -> list:
        out = []
        for req, call in zip(reqs, calls):
            if call is None:
                out.append(None)
                continue
            cli, fut, done = call
            res = fut.result() if done.wait(max(0.0, end - time.monotonic())) else None
            if res is None or not res.ok:
                try:
                    cli.remove_pending_request(fut)
                except Exception:  # reaped meanwhile (_reap): nothing pending on it any more
                    pass
                with self.lock:
                    self._no_refresh[(req.task_id, req.round_id)] = True
                    while len(self._no_refresh) > 1024:
                        self._no_refresh.pop(next(iter(self._no_refresh)))
                out.append(None)
                continue
            try:
                obs = observation_from_msg(res.observation, self.spec)
            except RequestError:
                out.append(None)
                continue
            out.append((obs, obs.stamp))
        return out
