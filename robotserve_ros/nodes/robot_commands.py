"""The robot client's commands (nodes/robot_client.py): an action as a one-point
JointTrajectory or a Float64MultiArray position command each tick, or the queued actions as
one multi-point JointTrajectory (trajectory_chunk, for a ros2_control JointTrajectoryController);
a chunk's joint names mapped onto /joint_states by name, never onto the wrong joints."""
from __future__ import annotations

import numpy as np
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from .common import to_time


class JointCommands:
    """Mixed into RobotClientNode: uses its config, clock, hz, queue, joints, cmd publisher,
    chunk_names and cmd_index."""

    def _command(self, a: np.ndarray) -> None:
        kind = self.config.command_type
        if kind == "trajectory_chunk":
            return  # the controller executes the trajectory sent with the chunk (_send_trajectory)
        if kind == "trajectory":
            m = JointTrajectory()
            m.joint_names = self._command_names(len(a))
            pt = JointTrajectoryPoint(positions=[float(x) for x in a[: len(m.joint_names) or len(a)]])
            pt.time_from_start.nanosec = int(1e9 / self.hz)
            m.points = [pt]
        else:  # by name when the chunk names its columns: in /joint_states order
            m = Float64MultiArray(data=[float(x) for x in (a[self.cmd_index] if self.cmd_index is not None else a)])
        self.cmd.publish(m)

    def _command_names(self, n: int) -> list:
        if self.chunk_names is not None:
            return list(self.chunk_names)
        return list(self.joints.name)[:n] if self.joints is not None else []  # unnamed chunk: by position

    def _send_trajectory(self) -> None:
        """trajectory_chunk: everything queued as one JointTrajectory, point i due (i+1) ticks from now."""
        q = self.queue.queued()
        if not q:
            return
        m = JointTrajectory()
        m.header.stamp = to_time(self.clock.now())
        m.joint_names = self._command_names(len(q[0]))
        for i, a in enumerate(q):
            pt = JointTrajectoryPoint(positions=[float(x) for x in a])
            ns = int(round((i + 1) * 1e9 / self.hz))
            pt.time_from_start.sec, pt.time_from_start.nanosec = ns // 1_000_000_000, ns % 1_000_000_000
            m.points.append(pt)
        self.cmd.publish(m)

    def _map_joints(self, names: list) -> str:
        """Map a chunk's joint names onto the robot's; '' when they map, else why not."""
        if self.chunk_names is not None and names != self.chunk_names:
            return f"joint names {names} differ from this task's earlier chunks' {self.chunk_names}"
        have = list(self.joints.name) if self.joints is not None else []
        missing = [n for n in names if n not in have]
        if missing or len(set(names)) != len(names):
            return (f"joint names {missing} are not in {self.config.joint_topic} ({have})" if missing
                    else f"joint names {names} repeat a joint")
        self.chunk_names = list(names)
        self.cmd_index = np.array([names.index(n) for n in have if n in names])
        return ""
