"""The robot client's parameters (nodes/robot_client.py): each field of RobotClientConfig is
a ROS parameter with its help as description; `check` names a bad value in one line."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import check_image_transport
from ..core.action_queue import AGGREGATES
from .common import NodeConfig, check, check_one_of, param

COMMAND_TYPES = ("trajectory", "trajectory_chunk", "position")


@dataclass(frozen=True)
class RobotClientConfig(NodeConfig):
    service: str = param("/robotserve/infer", "the srv/Infer service of the inference server")
    progress_topic: str = param("/robotserve/progress", "where execution progress is published")
    queue_topic: str = param("/robotserve/queue_wait", "where the server says how long a round sent now waits "
                                                    "(std_msgs/Float64, s): no re-send before it; '' = not heard")
    robot_name: str = param("", "the robot's name in task ids (default: the node's namespace, or its name)")
    control_hz: float = param(30.0, "control rate: actions executed per second, > 0")
    image_topics: tuple[str, ...] = param(("camera/image_raw",), "camera topics, one image each per observation")
    joint_topic: str = param("joint_states", "the robot's sensor_msgs/JointState topic")
    command_topic: str = param("command", "where actions are sent")
    command_type: str = param("trajectory", "trajectory (a one-point trajectory_msgs/JointTrajectory per tick), "
                              "trajectory_chunk (the queued actions as one multi-point JointTrajectory, re-sent "
                              "when a chunk is blended in: for a ros2_control JointTrajectoryController) or "
                              "position (std_msgs/Float64MultiArray per tick)")
    task_source: str = param("parameters", "parameters (tasks from instruction/task_actions/workload, started "
                             "on activation) or action (only RunTask goals on ~/run_task; holds in between)")
    # Not checked here: a policy registered on the server (register_horizon_policy) is unknown to this process.
    horizon_policy: str = param("confidence", "the execution horizon policy the server applies to our rounds")
    horizon_param: float = param(-1.0, "the horizon policy's knob (< 0: the server's default)")
    trigger_actions: int = param(-1, "send the next round when this many actions are left "
                                 "(< 0: from expected_latency_s and control_hz, core.robot_timing)")
    expected_latency_s: float = param(0.1, "expected round trip of a request, >= 0 (sets the trigger point)")
    aggregate: str = param("weighted_average", f"how a new chunk blends into queued actions: one of {', '.join(AGGREGATES)}")
    instruction: str = param("", "the language instruction sent with each observation")
    task_actions: int = param(300, "actions per task when no workload is replayed, > 0")
    # Trace replay: tasks drawn (seeded, per robot) from a built-in workload; each round asks
    # for the recorded horizon of `horizon_mode`.
    workload: str = param("", "a built-in workload whose tasks are replayed ('' = off)")
    horizon_mode: str = param("dynamic", "with workload: the recorded horizons to ask for, static or dynamic")
    mix_seed: int = param(0, "with workload: seed of the task draw")
    tasks: int = param(0, "tasks to run, >= 0 (0 = run forever)")
    # 100 robots x 5 Hz already swamped the server.
    progress_hz: float = param(2.0, "progress publication rate (liveness), > 0")
    # A safety net for answers that never come, not a latency bound: an overloaded machine
    # delivers replies seconds late, and a timed-out round's late answer is thrown away.
    request_timeout_s: float = param(30.0, "a round unanswered this long is reported overdue (still re-sent), > 0")
    # A reply lost on the way (an RMW drop, a server restart) must not freeze the robot: the
    # same (task, round) goes again; the server attaches it to the round it already holds or
    # answers it from its reply cache, and never generates a round twice.
    # The first guess only: from the first answer on, the interval follows the reply times the
    # robot measured (RFC 6298, core/robot_timing.ResendTimer), so a round queued on a busy
    # server is not asked for again.
    resend_after_s: float = param(0.0, "re-send an unanswered round after this many s until the first answer, "
                                       "then after the measured reply time + 4 x its deviation, doubling per "
                                       "re-send, >= 0 (0: 20 x expected_latency_s, at least 2 s)")
    retry_s: float = param(0.2, "pause before resending after an error (doubled per OVERLOADED in a row), > 0")
    stats_file: str = param("", "write the client's account here on shutdown; '{robot}' -> the robot's name; '' = off")
    image_transport: str = param("raw", "how camera frames go in srv/Infer: raw (sensor_msgs/Image as received), "
                                 "jpeg or png (sensor_msgs/CompressedImage, encoded here; docs/transport.md)")
    image_quality: int = param(90, "jpeg quality 1..100 (png: compression level 0..9)")
    rtc: bool = param(False, "real-time chunking: send the unexecuted leftover with each request and start each "
                              "chunk at the action d the server inpainted from (docs/rtc_serving.md)")
    task_key_file: str = param("", "this robot's task key, the file the server has as <robot id>.key in its "
                                   "task_auth.key_dir: requests and progress carry its HMAC; '' = unsigned")

    @property
    def first_resend_s(self) -> float:
        """The re-send interval until the robot's first answer (resend_after_s; 0: from expected_latency_s)."""
        return self.resend_after_s or max(2.0, 20 * self.expected_latency_s)

    def check(self) -> None:
        from ..sim.workloads import builtin_names

        check_one_of("command_type", self.command_type, COMMAND_TYPES)
        check_one_of("task_source", self.task_source, ("parameters", "action"))
        check_one_of("aggregate", self.aggregate, AGGREGATES)
        check_image_transport(self.image_transport, self.image_quality)
        check_one_of("horizon_mode", self.horizon_mode, ("static", "dynamic"))
        if self.workload:
            check_one_of("workload", self.workload, builtin_names())
        check(self.horizon_policy != "", "horizon_policy", self.horizon_policy, "is empty")
        for name in ("control_hz", "task_actions", "progress_hz", "request_timeout_s", "retry_s"):
            check(getattr(self, name) > 0, name, getattr(self, name), "is not > 0")
        for name in ("expected_latency_s", "tasks", "resend_after_s"):
            check(getattr(self, name) >= 0, name, getattr(self, name), "is not >= 0")
