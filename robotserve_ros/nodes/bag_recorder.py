"""Record topics of a session to a rosbag2 bag (MCAP by default), without rosbag2.

    python -m robotserve_ros.nodes.bag_recorder --ros-args -p output:=/data/run1 \\
        -p topics:="['/robotserve/progress', '/diagnostics', '/robot_0/joint_states']"

Parameters (BagRecorderConfig; validated at start, a bad value prints one line naming the
parameter and exits 2):
  output              path of the bag directory to create; an existing path is refused
  topics              topics to record (default /robotserve/progress and /diagnostics);
                      relative names resolve in the node's namespace
  storage             mcap (default) or sqlite3
  discovery_period_s  how often to look for the types of topics not yet subscribed (0.25)

Topics need not exist at start: their types are discovered from the ROS graph
(get_topic_names_and_types) on a timer and each is subscribed once its type is known.
Subscriptions are raw (serialized bytes, never deserialized), and the bytes go straight
into the bag with the receive time on the node clock. QoS: sensor_msgs/Image,
CompressedImage and JointState best effort (depth 100); other topics follow their
publishers when discovered: best effort if any publisher is, transient local if all are,
else reliable; depth 100.

Types: the bag stores each topic's full .msg definition and RIHS01 hash (rosbags
generates them from its typestore: ROS 2 Kilted plus this package's messages from msg/
or share/robotserve_ros/msg; another custom type is found as
<prefix>/share/<pkg>/msg/<Type>.msg, else its topic is skipped with a warning), so the
bag reads back anywhere, with rosbags or ros2 bag.

Writing happens in a writer thread fed by a queue: the executor never waits on the disk,
and SIGINT (which interrupts the main thread anywhere) cannot cut a write in half.
SIGINT/SIGTERM drain the queue and close the bag (metadata.yaml and the MCAP summary are
written then: a recorder killed with SIGKILL leaves a bag without them).
"""
from __future__ import annotations

import queue
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, Set

from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

from .. import bags
from .bag_player import final_log, import_msg_class
from .common import (bad_param, check, check_one_of, declare_config, exit_process, node_options, NodeConfig, param,
                     run_nodes)

NODE_NAME = "bag_recorder"
_STOP = object()


@dataclass(frozen=True)
class BagRecorderConfig(NodeConfig):
    output: str = param("", "path of the bag directory to create; must not exist (required)")
    topics: tuple[str, ...] = param(("/robotserve/progress", "/diagnostics"),
                                    "topics to record (relative names resolve in the node's namespace)")
    storage: str = param("mcap", f"one of {', '.join(bags.STORAGES)}")
    discovery_period_s: float = param(0.25, "seconds between looks for topics not yet subscribed, > 0")

    def check(self) -> None:
        check(self.output != "", "output", self.output, "is required: the path of the bag directory to create")
        check(len(self.topics) > 0, "topics", self.topics, "is empty: name at least one topic")
        check_one_of("storage", self.storage, bags.STORAGES)
        check(self.discovery_period_s > 0, "discovery_period_s", self.discovery_period_s, "is not > 0")


class BagRecorderNode(Node):
    def __init__(self, name: str = NODE_NAME, namespace: str = "", **kw) -> None:
        super().__init__(name, namespace=namespace, **node_options(kw))
        c = self.config = declare_config(self, BagRecorderConfig)
        try:
            self.wanted = sorted({self.resolve_topic_name(t.strip()) for t in c.topics})
        except Exception as e:  # noqa: BLE001 - rclpy raises several kinds for bad names
            raise bad_param("topics", c.topics, f"are not valid topic names ({e})") from None
        try:
            self.typestore = bags.make_typestore()
        except bags.BagError as e:
            self.get_logger().warning(f"{e}; recording standard message types only")
            from rosbags.typesys import Stores, get_typestore

            self.typestore = get_typestore(Stores.ROS2_KILTED)
        self.counts: Counter = Counter()
        self.subs: Dict[str, Any] = {}
        self.types: Dict[str, str] = {}
        self.skipped: Set[str] = set()
        self.failed: Set[str] = set()  # set by the writer thread
        self._q: "queue.SimpleQueue" = queue.SimpleQueue()
        self._conns: Dict[str, Any] = {}  # writer thread only
        self._writer_error = None
        self._close_error = None
        self._closed = False
        # The writer lives in its thread: rosbags' sqlite3 storage may only be used by the
        # thread that opened it. Opening it is the last thing that can fail here.
        self.writer = None
        self._opened = threading.Event()
        self._thread = threading.Thread(target=self._write_loop, name="bag_writer", daemon=True)
        self._thread.start()
        self._opened.wait()
        if self.writer is None:
            self._thread.join()
            raise bad_param("output", c.output, f"cannot be written: {self._writer_error}")
        self.get_logger().info(f"recording {', '.join(self.wanted)} to {c.output} ({c.storage})")
        self._timer = self.create_timer(c.discovery_period_s, self._discover)
        self._discover()

    # -- discovery (executor thread) ---------------------------------------------------------
    def _qos_for(self, topic: str, msgtype: str) -> QoSProfile:
        if msgtype in bags.SENSOR_TYPES:
            return QoSProfile(depth=100, reliability=ReliabilityPolicy.BEST_EFFORT)
        pubs = self.get_publishers_info_by_topic(topic)
        best_effort = any(i.qos_profile.reliability == ReliabilityPolicy.BEST_EFFORT for i in pubs)
        latched = bool(pubs) and all(i.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL for i in pubs)
        return QoSProfile(depth=100,
                          reliability=ReliabilityPolicy.BEST_EFFORT if best_effort else ReliabilityPolicy.RELIABLE,
                          durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE)

    def _discover(self) -> None:
        for topic in self.failed - self.skipped:  # the writer could not add it
            self.skipped.add(topic)
            sub = self.subs.pop(topic, None)
            if sub is not None:
                self.destroy_subscription(sub)
        pending = [t for t in self.wanted if t not in self.subs and t not in self.skipped]
        if not pending:
            self._timer.cancel()
            return
        graph = dict(self.get_topic_names_and_types())
        for topic in pending:
            types = graph.get(topic)
            if not types:
                continue
            msgtype = bags.normalize_msgtype(types[0])
            if len(types) > 1:
                self.get_logger().warning(f"{topic} has several types {types}; recording {msgtype}")
            try:
                cls = import_msg_class(msgtype)
            except (ImportError, AttributeError, ValueError) as e:
                self.get_logger().warning(f"not recording {topic}: its type {msgtype} is not importable here ({e})")
                self.skipped.add(topic)
                continue
            if msgtype not in self.typestore.fielddefs and bags.find_msg_file(msgtype) is None:
                self.get_logger().warning(f"not recording {topic}: no .msg definition of {msgtype} found "
                                          f"(looked in <prefix>/share/<pkg>/msg)")
                self.skipped.add(topic)
                continue
            qos = self._qos_for(topic, msgtype)
            self.types[topic] = msgtype
            self._q.put(("add", topic, msgtype))  # before any of its messages
            self.subs[topic] = self.create_subscription(
                cls, topic, lambda data, t=topic: self._q.put((t, self.get_clock().now().nanoseconds, data)),
                qos, raw=True)
            self.get_logger().info(f"recording {topic} ({msgtype}, "
                                   f"{'best effort' if qos.reliability == ReliabilityPolicy.BEST_EFFORT else 'reliable'}"
                                   f"{', transient local' if qos.durability == DurabilityPolicy.TRANSIENT_LOCAL else ''})")

    # -- writer thread ------------------------------------------------------------------------
    def _write_loop(self) -> None:
        try:
            self.writer = bags.open_writer(self.config.output, self.config.storage)
        except bags.BagError as e:
            self._writer_error = e
        finally:
            self._opened.set()
        if self.writer is None:
            return
        while True:
            item = self._q.get()
            if item is _STOP:
                break
            if self._writer_error is not None:
                continue  # drain without writing
            try:
                if item[0] == "add":
                    _, topic, msgtype = item
                    if msgtype not in self.typestore.fielddefs:
                        missing = bags.register_types(self.typestore, [msgtype])
                        if missing:
                            self.get_logger().warning(f"not recording {topic}: types not found: {', '.join(missing)}")
                            self.failed.add(topic)
                            continue
                    self._conns[topic] = self.writer.add_connection(topic, msgtype, typestore=self.typestore)
                else:
                    topic, stamp, data = item
                    conn = self._conns.get(topic)
                    if conn is not None:
                        self.writer.write(conn, stamp, data)
                        self.counts[topic] += 1
            except Exception as e:  # noqa: BLE001 - disk full, bad type ...: stop writing, say so
                self._writer_error = e
                self.get_logger().error(f"writing {self.config.output} failed, no longer recording: {e!r}")
        try:
            self.writer.close()  # the bag's summary and metadata.yaml
        except Exception as e:  # noqa: BLE001
            self._writer_error = self._close_error = e

    def close(self) -> None:
        """Drain the queue, write the bag's summary and metadata (run_nodes calls this)."""
        if self._closed:
            return
        self._closed = True
        for sub in list(self.subs.values()):
            self.destroy_subscription(sub)  # nothing more gets queued
        self.subs.clear()
        self._q.put(_STOP)
        self._thread.join()
        if self._close_error is not None:
            final_log(self, f"ERROR: closing {self.config.output} failed: {self._close_error!r}")
            return
        total = sum(self.counts.values())
        per_topic = ", ".join(f"{t}: {self.counts[t]}" for t in self.wanted if t in self.types) or "no topic seen"
        final_log(self, f"wrote {total} messages to {self.config.output} ({per_topic})")


def main(argv=None) -> int:
    return run_nodes(lambda: [BagRecorderNode()], argv)


if __name__ == "__main__":
    exit_process(main())
