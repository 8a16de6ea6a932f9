"""Play camera and joint topics from a rosbag2 bag into live topics, so a robot_client
(or anything else) can be fed from a recording.

    python -m robotserve_ros.nodes.bag_player --ros-args -p bag:=/data/session1 \\
        -p rate:=1.0 -p loop:=true -p namespace_prefix:=/robot_0

Reads real rosbag2 bags with `rosbags` (no rosbag2 install needed): a bag directory
(metadata.yaml with .db3 or .mcap files) or a single .mcap (or .db3) file.

Parameters (BagPlayerConfig; validated at start, a bad value prints one line naming the
parameter and exits 2):
  bag                   path of the bag (required)
  topics                bag topics to play (default: every sensor_msgs/Image and
                        sensor_msgs/JointState topic of the bag)
  rate                  playback speed: 1.0 recorded speed, 2.0 twice as fast (> 0)
  loop                  start over when the bag ends
  namespace_prefix      prepended to the played topic names: "/robot_0" plays the bag's
                        /camera/image_raw on /robot_0/camera/image_raw
  restamp               true (default): header.stamp := the node clock's now at publish,
                        so ages seen downstream are honest; false keeps recorded stamps
  start_paused          start paused; resume with `paused:=false` (set at run time, e.g.
                        `ros2 param set /bag_player paused false`)
  paused                pause / resume at run time (starts as start_paused)
  wait_for_subscribers  before playing, wait until every played topic has this many
                        subscriptions (then 0.25 s more, so they have matched us too); 0 = don't
  start_delay_s         wait this long (node clock) before the first message
  exit_when_done        exit 0 once the bag has played (no loop; 1 if playback failed);
                        default: log a summary and stay up until SIGINT

Timing: message k is published at (t_k - t_first) / rate after the start of the pass, on
the node's clock: with use_sim_time:=true it follows /clock (and waits for /clock to
start); on system time elapsed time is taken from the steady clock, which runs at the
same rate but does not jump when the wall clock is stepped.
A pass with loop starts one mean message interval after the previous pass's last message.
Messages are never dropped: if the player falls behind it publishes as fast as it can and
reports its lateness.

Publishing: the recorded CDR bytes are published as they are (Publisher.publish(bytes)),
with the header stamp rewritten in place when restamping; nothing is deserialized. For a
224x224 rgb8 image that costs ~0.04 ms against ~0.09 ms for deserialize + publish
(measured here), both far below a frame period. sensor_msgs/Image, CompressedImage and
JointState use sensor-data QoS (best effort); other types reliable, depth 100. A topic's
type must be importable here ("pkg/msg/Type" -> pkg.msg.Type).

Playback runs in its own thread on the node clock; the executor only serves parameters.
"""
from __future__ import annotations

import importlib
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data

from .. import bags
from .common import (bad_param, check, declare_config, exit_process, node_options, NodeConfig, param, ParamError,
                     run_nodes)

NODE_NAME = "bag_player"
_NS = 1_000_000_000

_NAME_TOKEN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ----------------------------------------------------------------------------------------
# Parameters (shared with bag_recorder)
# ----------------------------------------------------------------------------------------
def normalize_namespace(name: str, value: str) -> str:
    """"robot_0", "/robot_0/" -> "/robot_0"; "" or "/" -> ""; ParamError if not a name."""
    ns = value.strip().strip("/")
    if not ns:
        return ""
    check(all(_NAME_TOKEN.match(tok) for tok in ns.split("/")), name, value,
          "is not a namespace: tokens of letters, digits and _ separated by /, e.g. /robot_0")
    return "/" + ns


def import_msg_class(msgtype: str):
    """"sensor_msgs/msg/Image" -> the rclpy-generated class (ImportError/AttributeError)."""
    pkg, sub, name = bags.normalize_msgtype(msgtype).split("/")
    return getattr(importlib.import_module(f"{pkg}.{sub}"), name)


def header_first(cls) -> bool:
    fields = list(cls.get_fields_and_field_types().items())
    return bool(fields) and fields[0] == ("header", "std_msgs/Header")


def final_log(node: Node, text: str) -> None:
    """Log at shutdown: after SIGINT rclpy has shut the context down, and the logger would
    add a "Failed to publish log message to rosout" complaint to every line."""
    if node.context.ok():
        node.get_logger().info(text)
    else:
        print(f"[INFO] [{node.get_name()}]: {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class BagPlayerConfig(NodeConfig):
    bag: str = param("", "path of a rosbag2 bag directory or a .mcap file (required)")
    topics: Optional[tuple[str, ...]] = param(None, "bag topics to play (default: every Image and JointState topic)")
    rate: float = param(1.0, "playback speed, > 0 (1.0 = as recorded)")
    loop: bool = param(False, "start over when the bag ends")
    namespace_prefix: str = param("", "a namespace such as /robot_0, prepended to played topic names")
    restamp: bool = param(True, "header.stamp := the node clock's now at publish (false: keep recorded stamps)")
    start_paused: bool = param(False, "start paused (resume with paused:=false at run time)")
    wait_for_subscribers: int = param(0, "subscriptions each played topic must have before playing, >= 0")
    start_delay_s: float = param(0.0, "seconds (node clock) to wait before the first message, >= 0")
    exit_when_done: bool = param(False, "exit once the bag has played (no loop)")

    def check(self) -> None:
        check(self.bag != "", "bag", self.bag, "is required: the path of a rosbag2 bag directory or a .mcap file")
        check(self.rate > 0, "rate", self.rate, "is not > 0")
        check(self.wait_for_subscribers >= 0, "wait_for_subscribers", self.wait_for_subscribers, "is not >= 0")
        check(self.start_delay_s >= 0, "start_delay_s", self.start_delay_s, "is not >= 0")
        normalize_namespace("namespace_prefix", self.namespace_prefix)


class PlaybackDone(KeyboardInterrupt):
    """Raised in the executor (via a guard condition) to end run_nodes() with status 0."""


# ----------------------------------------------------------------------------------------
# The node
# ----------------------------------------------------------------------------------------
class BagPlayerNode(Node):
    def __init__(self, name: str = NODE_NAME, namespace: str = "", **kw) -> None:
        super().__init__(name, namespace=namespace, **node_options(kw))
        c = self.config = declare_config(self, BagPlayerConfig)
        self.prefix = normalize_namespace("namespace_prefix", c.namespace_prefix)
        self.rate = c.rate
        # Not configuration but a control, settable at run time: it starts as start_paused.
        self._paused = self.declare_parameter(
            "paused", c.start_paused, ParameterDescriptor(description="pause / resume playback")).value
        self.add_on_set_parameters_callback(self._on_set_parameters)

        try:
            self.reader = bags.open_bag(c.bag)
        except bags.BagError as e:
            raise bad_param("bag", c.bag, f"cannot be read: {e}") from None
        try:
            self._setup_topics()
        except BaseException:
            self.reader.close()
            raise

        self.stats: Counter = Counter()
        self.passes = 0
        self.max_late_ns = 0
        self.sum_late_ns = 0
        self.done = False
        self.failed = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._t0 = 0  # timeline ns (see _now) at which the current pass's first message is due
        self._done_gc = self.create_guard_condition(self._on_done)
        self._thread = threading.Thread(target=self._play, name="bag_player", daemon=True)
        self._thread.start()

    # -- set-up ----------------------------------------------------------------------------
    def _setup_topics(self) -> None:
        c = self.config
        available = {t: info.msgtype for t, info in self.reader.topics.items()}
        counts = {t: info.msgcount for t, info in self.reader.topics.items()}
        listing = ", ".join(f"{t} ({mt})" for t, mt in sorted(available.items())) or "none"
        if c.topics is None:
            selected = sorted(t for t, mt in available.items() if mt in bags.DEFAULT_PLAY_TYPES)
            if not selected:
                raise ParamError(f"parameter 'topics': not set, and bag {c.bag!r} has no sensor_msgs/Image or "
                                 f"JointState topic; name the topics to play (the bag has: {listing})")
        else:
            selected = ["/" + t.strip().lstrip("/") for t in c.topics]
            unknown = [t for t in selected if t not in available]
            check(selected and not unknown, "topics", c.topics,
                  f"{'names topics not in the bag: ' + ', '.join(unknown) if unknown else 'is empty'} "
                  f"(the bag has: {listing})")
        self.topics = selected
        self.out_names: Dict[str, str] = {}
        self.pubs: Dict[str, Any] = {}
        self.restamped: Dict[str, bool] = {}
        reliable = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        for t in selected:
            mt = available[t]
            try:
                cls = import_msg_class(mt)
            except (ImportError, AttributeError, ValueError) as e:
                raise ParamError(f"parameter 'topics': {t} has type {mt}, which cannot be imported here ({e}); "
                                 f"install its package or leave the topic out") from None
            out = self.prefix + t
            qos = qos_profile_sensor_data if mt in bags.SENSOR_TYPES else reliable
            self.out_names[t] = out
            self.pubs[t] = self.create_publisher(cls, out, qos)
            self.restamped[t] = c.restamp and header_first(cls)
        self.conns = [conn for conn in self.reader.connections if conn.topic in self.pubs]
        self.total = sum(counts[t] for t in selected)
        self._check_hashes()
        self.get_logger().info(
            f"playing {self.total} messages of {c.bag} at rate {self.rate:g}"
            + (" (loop)" if c.loop else "") + ": "
            + ", ".join(f"{t} -> {self.out_names[t]}" if self.out_names[t] != t else t for t in selected)
            + (" [paused]" if self._paused else ""))

    def _check_hashes(self) -> None:
        """Warn when the bag's type hash differs from the installed type's: the recorded
        bytes may then not decode on the subscriber side."""
        for c in self.conns:
            if not c.digest or not c.digest.startswith("RIHS01_"):
                continue  # older bags carry no (or an MD5) hash
            for info in self.get_publishers_info_by_topic(self.out_names[c.topic]):
                if info.node_name == self.get_name() and str(info.topic_type_hash) not in ("", c.digest):
                    self.get_logger().warning(
                        f"{c.topic}: the bag's {c.msgtype} ({c.digest[:19]}...) differs from the installed "
                        f"definition ({str(info.topic_type_hash)[:19]}...); subscribers may fail to decode it")

    def _on_set_parameters(self, params: List[Parameter]) -> SetParametersResult:
        for prm in params:
            if prm.name == "paused":
                if not isinstance(prm.value, bool):
                    return SetParametersResult(successful=False, reason="paused must be true or false")
                self._paused = prm.value
                self.get_logger().info("paused" if prm.value else "resumed")
                self._wake.set()
        return SetParametersResult(successful=True)

    # -- playback thread ------------------------------------------------------------------
    def _now(self) -> int:
        """Timeline time (ns): the node clock on sim time, else the steady clock (same rate
        as system time, immune to wall-clock steps). Stamps use the node clock."""
        clock = self.get_clock()
        return clock.now().nanoseconds if clock.ros_time_is_active else time.monotonic_ns()

    def _sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _wait_until(self, offset_ns: int) -> bool:
        """Until the node clock reaches self._t0 + offset_ns, holding while paused (which
        shifts the timeline). False if stopped."""
        sim = self.get_clock().ros_time_is_active
        while not self._stop.is_set():
            if self._paused:
                began = self._now()
                while self._paused and not self._stop.is_set():
                    self._sleep(0.1)
                self._t0 += self._now() - began
                continue
            left = self._t0 + offset_ns - self._now()
            if left <= 0:
                late = -left
                self.max_late_ns = max(self.max_late_ns, late)
                self.sum_late_ns += late
                return True
            # On sim time the clock may run faster than wall time: check it often.
            self._sleep(min(left / _NS, 0.01) if sim else left / _NS)
        return False

    def _wait_ready(self) -> bool:
        clock = self.get_clock()
        if clock.ros_time_is_active and self._now() == 0:
            self.get_logger().info("use_sim_time: waiting for /clock")
            while self._now() == 0:
                if self._stop.is_set():
                    return False
                self._sleep(0.02)
        n = self.config.wait_for_subscribers
        if n > 0:
            short = lambda: [t for t in self.topics if self.pubs[t].get_subscription_count() < n]  # noqa: E731
            if short():
                self.get_logger().info(f"waiting for {n} subscriber(s) on {', '.join(self.out_names[t] for t in short())}")
            while short():
                if self._stop.is_set():
                    return False
                self._sleep(0.02)
            self._sleep(0.25)  # let the subscriptions match us too before the first message
        if self.config.start_delay_s > 0:
            self._t0 = self._now()
            if not self._wait_until(int(self.config.start_delay_s * _NS)):
                return False
        return not self._stop.is_set()

    def _play(self) -> None:
        try:
            if not self._wait_ready():
                return
            self.max_late_ns = self.sum_late_ns = 0  # count lateness of messages only
            start = self._now()
            while True:
                wall0 = time.monotonic()
                before = sum(self.stats.values())
                span = self._pass(start)
                if span is None:
                    return  # stopped
                self.passes += 1
                n = sum(self.stats.values()) - before
                if self.passes == 1 or not self.config.loop:
                    self._log_pass(n, span, time.monotonic() - wall0)
                if not self.config.loop or n == 0:
                    break
                gap = span // max(1, n - 1) if n > 1 else _NS // 10  # one mean interval
                start = max(self._t0 + int((span + gap) / self.rate), self._now())
            self.done = True
            if self.config.exit_when_done:
                time.sleep(0.1)  # let the last messages go out before we leave
                self._done_gc.trigger()
        except Exception as e:  # noqa: BLE001 - reported, never silent
            # SIGINT shuts the rclpy context down before run_nodes() calls close(): a publish
            # in that window fails with "context is invalid", which is a stop, not a failure.
            if not self._stop.is_set() and self.context.ok():
                self.failed = True
                self.get_logger().error(f"playback failed: {e!r}")
                if self.config.exit_when_done:
                    self._done_gc.trigger()

    def _pass(self, start_ns: int) -> Optional[int]:
        """Play the bag once starting at start_ns (node clock). Returns the bag time span
        played (ns), or None if stopped."""
        self._t0 = start_ns
        first = last = None
        for conn, stamp, data in self.reader.messages(connections=self.conns):
            if first is None:
                first = stamp
            last = stamp
            if not self._wait_until(int((stamp - first) / self.rate)):
                return None
            topic = conn.topic
            if type(data) is not bytes:
                data = bytes(data)
            if self.restamped[topic]:
                data = bags.restamp_cdr(data, self.get_clock().now().nanoseconds)
            self.pubs[topic].publish(data)
            self.stats[topic] += 1
        return 0 if first is None else last - first

    def _log_pass(self, n: int, span_ns: int, wall_s: float) -> None:
        played = sum(self.stats.values())
        mean_late = self.sum_late_ns / played / 1e6 if played else 0.0
        per_topic = ", ".join(f"{self.out_names[t]}: {c}" for t, c in sorted(self.stats.items()))
        self.get_logger().info(
            f"pass {self.passes}: played {n} messages in {wall_s:.3f} s (bag span {span_ns / _NS:.3f} s at rate "
            f"{self.rate:g} -> {span_ns / _NS / self.rate:.3f} s"
            f"{' of sim time' if self.get_clock().ros_time_is_active else ''}); lateness max {self.max_late_ns / 1e6:.1f} ms, "
            f"mean {mean_late:.2f} ms; totals {per_topic}"
            + ("" if self.config.loop or self.config.exit_when_done else "; done, staying up until SIGINT"))

    def _on_done(self) -> None:
        raise PlaybackDone()

    def close(self) -> None:
        """Stop the playback thread and close the bag (run_nodes calls this)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        try:
            self.reader.close()
        except Exception:  # noqa: BLE001 - already closed
            pass
        if self.passes != 1 or not self.done:
            played = sum(self.stats.values())
            final_log(self, f"stopped after {played} messages ({self.passes} full passes)")


def main(argv=None) -> int:
    """Exit status: 0 (stopped, or done with exit_when_done), 2 (bad parameter), 1 (the bag
    could not be played to the end with exit_when_done)."""
    nodes: List[BagPlayerNode] = []

    def make():
        nodes.append(BagPlayerNode())
        return nodes

    code = run_nodes(make, argv)
    return 1 if code == 0 and nodes and nodes[0].failed else code


if __name__ == "__main__":
    exit_process(main())
