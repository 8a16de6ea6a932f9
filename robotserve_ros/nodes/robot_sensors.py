"""The robot client's sensors (nodes/robot_client.py): the latest camera frames and joint
state, the observation made of them (for srv/Infer, the cameras encoded as JPEG/PNG when
image_transport says so; for FetchObservation, the server's refresh, always raw), and the
round's Infer request around it."""
from __future__ import annotations

import numpy as np
from sensor_msgs.msg import Image, JointState

from ..srv import Infer
from .common import sign, to_time
from .rtc_client import fill_leftover


class RobotSensors:
    """Mixed into RobotClientNode: uses its config, clock, queue, images, joints, encoder,
    instruction, task and round state."""

    def _on_image(self, i: int, m: Image) -> None:
        self.images[i] = m

    def _on_joints(self, m: JointState) -> None:
        self.joints = m

    def _sensors_ready(self) -> bool:
        return self.joints is not None and all(im is not None for im in self.images)

    def _fill_observation(self, obs) -> None:
        obs.header.stamp = to_time(self.clock.now())
        obs.timestep = self.queue.timestep
        obs.images = list(self.images)  # forwarded as received: no copy, no re-encode
        obs.joint_state = self.joints
        obs.instruction = self.instruction

    def _waiting_for(self) -> str:
        """What keeps the task from its next round, for a human ('' when nothing does)."""
        if not self.cli.service_is_ready():
            return (f"waiting for {self.cli.srv_name}: no inference server offers it (not started, or not "
                    "configured and active)")
        if not self._sensors_ready():
            c = self.config
            missing = [t for t, im in zip(c.image_topics, self.images) if im is None]
            missing += [c.joint_topic] if self.joints is None else []
            return f"waiting for the robot's sensors: nothing yet on {', '.join(missing)}"
        return ""

    def _on_fetch(self, request, response):
        if request.task_id != self.task_id or not self._sensors_ready():
            response.ok = False
            return response
        self._fill_observation(response.observation)
        response.ok = True
        return response

    def _infer_request(self, now: float):
        """The srv/Infer request of the open round: the observation (cameras encoded when
        image_transport says so), the execution info, the horizon asked for, RTC's leftover
        and the task's signature."""
        r = Infer.Request()
        r.task_id, r.round_id = self.task_id, self.round
        self._fill_observation(r.observation)
        if self.encoder is not None:  # the cameras as JPEG/PNG instead (the refresh service still sends raw)
            r.compressed_images, r.observation.images = self.encoder.encode(r.observation.images), []
        r.has_exec_info = self.round > 0
        r.exec_info.exec_start = to_time(self.exec_start)
        r.exec_info.actions_left = len(self.queue)
        r.exec_info.control_hz = float(self.hz)
        if self.rounds:  # trace replay: the recorded round where the new motion starts
            # New motion begins where the queue ends; the chunk's first len(queue) rows
            # overlap queued actions (blended, or stale by arrival), then H_k new ones follow.
            k = int(np.searchsorted(self.cum_rounds, self.queue.timestep + len(self.queue), side="right")) - 1
            k = min(max(k, 0), len(self.rounds) - 1)
            r.horizon.name, r.horizon.has_param = "static", True
            r.horizon.param = float(len(self.queue) + self.rounds[k])
            r.remaining_rounds = len(self.rounds) - k
        else:
            r.horizon.name, r.horizon.has_param, r.horizon.param = self.horizon
        r.refresh_service = self.fetch_name
        if self.rtc is not None:
            fill_leftover(r, self.queue.queued())
        r.robot_id = self.robot_id
        if self.task_key is not None:
            r.auth_stamp = self.stamps(now)
            sign(r, self.task_key, "infer")
        return r
