"""Bags without rosbag2: robotserve_ros.bags (rosbags), the bag_player and bag_recorder
nodes as subprocesses on an isolated ROS domain (test/rosutil.py).

The tests write their own bags with rosbags (MCAP and sqlite3): a 96x96 rgb8 camera at
15 Hz and 6-joint JointState at 30 Hz for 1.5 s, every message with its own content.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
from rosutil import requires_rclpy, ros_ctx, start_node  # noqa: F401

pytest.importorskip("rosbags")

from robotserve_ros import bags  # noqa: E402  (no rclpy at import)

CAM_HZ, JS_HZ, SECONDS, SIDE = 15.0, 30.0, 1.5, 96
N_IMAGES, N_JOINTS = int(SECONDS * CAM_HZ), int(SECONDS * JS_HZ)
T0 = 1_700_000_000 * 10**9  # recorded long ago: restamping must show
JOINTS = [f"joint_{k}" for k in range(6)]
PLAYER = "robotserve_ros.nodes.bag_player"
RECORDER = "robotserve_ros.nodes.bag_recorder"


def image_bytes(i: int) -> bytes:
    """Frame i: a gradient shifted by i, with i in its first 4 bytes."""
    data = ((np.arange(SIDE * SIDE * 3, dtype=np.uint32) + 7 * i) % 251).astype(np.uint8)
    data[:4] = np.frombuffer(np.uint32(i).tobytes(), np.uint8)
    return data.tobytes()


def joint_positions(i: int) -> list:
    return [round(0.01 * i + k, 6) for k in range(6)]


def frame_index(data) -> int:
    return int(np.frombuffer(bytes(data[:4]), np.uint32)[0])


def session_messages(ts):
    """(topic, t_ns, rosbags message) of the recorded session, in time order."""
    T = ts.types
    Time, Header = T["builtin_interfaces/msg/Time"], T["std_msgs/msg/Header"]

    def header(t, frame):
        return Header(stamp=Time(sec=t // 10**9, nanosec=t % 10**9), frame_id=frame)

    out = []
    for i in range(N_IMAGES):
        t = T0 + int(i * 1e9 / CAM_HZ)
        out.append(("/camera/image_raw", t, T[bags.IMAGE](
            header=header(t, "camera"), height=SIDE, width=SIDE, encoding="rgb8", is_bigendian=0, step=3 * SIDE,
            data=np.frombuffer(image_bytes(i), np.uint8))))
    for i in range(N_JOINTS):
        t = T0 + int(i * 1e9 / JS_HZ) + 1000
        out.append(("/joint_states", t, T[bags.JOINT_STATE](
            header=header(t, ""), name=JOINTS, position=np.array(joint_positions(i)),
            velocity=np.zeros(0), effort=np.zeros(0))))
    return sorted(out, key=lambda m: m[1])


@pytest.fixture(scope="module")
def session_bags(tmp_path_factory):
    """storage -> path of the session bag directory."""
    root = tmp_path_factory.mktemp("bags")
    ts = bags.make_typestore()
    msgs = session_messages(ts)
    return {st: bags.write_bag(root / f"session_{st}", msgs, storage=st, typestore=ts) for st in bags.STORAGES}


# ----------------------------------------------------------------------------------------
# bags.py alone
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("storage", bags.STORAGES)
def test_write_and_read_a_bag(session_bags, storage):
    path = session_bags[storage]
    assert bags.bag_topics(path) == {"/camera/image_raw": (bags.IMAGE, N_IMAGES), "/joint_states": (bags.JOINT_STATE, N_JOINTS)}
    msgs = bags.read_bag(path)
    assert [m.timestamp for m in msgs] == sorted(m.timestamp for m in msgs)
    images = [m.data for m in msgs if m.topic == "/camera/image_raw"]
    assert [frame_index(im.data) for im in images] == list(range(N_IMAGES))
    assert images[5].data.tobytes() == image_bytes(5) and images[5].header.frame_id == "camera"
    joints = [m.data for m in msgs if m.topic == "/joint_states"]
    assert [list(j.position) for j in joints] == [joint_positions(i) for i in range(N_JOINTS)]
    if storage == "mcap":  # the single .mcap file reads as well as its directory
        assert len(bags.read_bag(next(path.glob("*.mcap")), ["/joint_states"], raw=True)) == N_JOINTS


def test_restamp_cdr_both_byte_orders():
    ts = bags.make_typestore()
    msg = session_messages(ts)[0][2]
    le = bytes(ts.serialize_cdr(msg, bags.IMAGE, little_endian=True))
    be = bytes(ts.serialize_cdr(msg, bags.IMAGE, little_endian=False))
    for raw in (le, be):
        out = bags.restamp_cdr(raw, 12 * 10**9 + 345)
        assert bags.cdr_stamp_ns(out) == 12 * 10**9 + 345 and len(out) == len(raw)
        back = ts.deserialize_cdr(out, bags.IMAGE)
        assert (back.header.stamp.sec, back.header.stamp.nanosec) == (12, 345)
        assert back.data.tobytes() == msg.data.tobytes() and back.header.frame_id == "camera"
    with pytest.raises(ValueError):
        bags.restamp_cdr(b"\x00\x02\x00\x00" + bytes(20), 0)  # not plain CDR


@requires_rclpy
def test_custom_types_interoperate_with_rclpy():
    """rosbags bytes <-> rclpy bytes for this package's messages."""
    from rclpy.serialization import deserialize_message, serialize_message

    from robotserve_ros.msg import ExecutionProgress

    ts = bags.make_typestore()
    m = ExecutionProgress(task_id="robot_3/task7", round_id=4, timestep=123, actions_left=9, control_hz=30.0,
                          idle_s=0.25, chunks=5, task_done=True)
    m.header.stamp.sec, m.task_start.nanosec = 17, 99
    got = ts.deserialize_cdr(serialize_message(m), "robotserve_ros/msg/ExecutionProgress")
    assert (got.task_id, got.round_id, got.timestep, got.chunks, got.task_done, got.idle_s) == ("robot_3/task7", 4, 123, 5, True, 0.25)
    assert (got.header.stamp.sec, got.task_start.nanosec) == (17, 99)
    back = deserialize_message(bytes(ts.serialize_cdr(got, "robotserve_ros/msg/ExecutionProgress")), ExecutionProgress)
    assert back == m


def test_custom_type_hash_is_what_rclpy_announces(ros_ctx):
    """The RIHS01 hash rosbags writes into a bag for ExecutionProgress is the one the
    generated type announces on the graph (what ros2 bag would record)."""
    from robotserve_ros.msg import ExecutionProgress

    ros_ctx.node.create_publisher(ExecutionProgress, "/hash_probe", 1)
    infos = ros_ctx.node.get_publishers_info_by_topic("/hash_probe")
    assert infos and str(infos[0].topic_type_hash) == bags.make_typestore().hash_rihs01("robotserve_ros/msg/ExecutionProgress")


# ----------------------------------------------------------------------------------------
# bag_player
# ----------------------------------------------------------------------------------------
def player_args(bag, *params):
    args = [PLAYER, "--ros-args", "-p", f"bag:={bag}"]
    for p in params:
        args += ["-p", p]
    return args


def stamp_s(stamp) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


@pytest.mark.parametrize("storage", bags.STORAGES)
def test_player_plays_every_message_in_order_at_rate(ros_ctx, session_bags, storage):
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image, JointState

    qos = QoSProfile(depth=500, reliability=ReliabilityPolicy.BEST_EFFORT)
    got = {"img": [], "js": []}
    ros_ctx.node.create_subscription(Image, "/robot_0/camera/image_raw", lambda m: got["img"].append((time.monotonic(), m)), qos)
    ros_ctx.node.create_subscription(JointState, "/robot_0/joint_states", lambda m: got["js"].append((time.monotonic(), m)), qos)
    # Nothing may play on the bag's own names.
    stray = ros_ctx.collect(JointState, "/joint_states", qos)
    player = ros_ctx.start_node(player_args(session_bags[storage], "rate:=2.0", "namespace_prefix:=/robot_0",
                                            "exit_when_done:=true", "wait_for_subscribers:=1"))
    assert ros_ctx.wait_for(lambda: not player.running(), 20), player.output()
    ros_ctx.spin(0.3)
    assert player.returncode == 0, player.output()
    images, joints = [m for _, m in got["img"]], [m for _, m in got["js"]]
    assert (len(images), len(joints), len(stray)) == (N_IMAGES, N_JOINTS, 0), player.output()
    # In order, content intact.
    assert [frame_index(m.data) for m in images] == list(range(N_IMAGES))
    for i, m in enumerate(images):
        assert (m.width, m.height, m.encoding, m.step, m.header.frame_id) == (SIDE, SIDE, "rgb8", 3 * SIDE, "camera")
        assert bytes(m.data) == image_bytes(i), f"image {i} differs"
    assert [list(m.position) for m in joints] == [joint_positions(i) for i in range(N_JOINTS)]
    assert all(list(m.name) == JOINTS for m in joints)
    # Restamped at publish: recent, in order, and spread over the played time.
    now = ros_ctx.node.get_clock().now().nanoseconds * 1e-9
    stamps = [stamp_s(m.header.stamp) for m in images + joints]
    assert all(now - 30 < s <= now for s in stamps), "stamps not set to publish time"
    img_stamps = [stamp_s(m.header.stamp) for m in images]
    assert img_stamps == sorted(img_stamps)
    expected = (N_IMAGES - 1) / CAM_HZ / 2.0  # 0.733 s at rate 2
    assert 0.8 * expected < img_stamps[-1] - img_stamps[0] < 1.5 * expected, img_stamps[-1] - img_stamps[0]
    arrivals = sorted(t for lst in got.values() for t, _ in lst)
    assert 0.5 < arrivals[-1] - arrivals[0] < 1.5, arrivals[-1] - arrivals[0]  # loose: the test process's view
    assert "pass 1: played 67 messages" in player.stderr() + player.stdout()


def test_player_starts_paused_and_resumes_on_the_paused_parameter(ros_ctx, session_bags):
    from rclpy.parameter import Parameter
    from rclpy.parameter_client import AsyncParameterClient
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import JointState

    joints = ros_ctx.collect(JointState, "/joint_states", QoSProfile(depth=500, reliability=ReliabilityPolicy.BEST_EFFORT))
    player = ros_ctx.start_node(player_args(session_bags["mcap"], "topics:=[/joint_states]", "start_paused:=true",
                                            "rate:=4.0", "exit_when_done:=true", "wait_for_subscribers:=1"))
    params = AsyncParameterClient(ros_ctx.node, "bag_player")
    assert ros_ctx.wait_for(params.services_are_ready, 15), player.output()
    ros_ctx.spin(0.6)
    assert joints == [] and player.running(), player.output()
    fut = params.set_parameters([Parameter("paused", value=False)])
    assert ros_ctx.wait_for(fut.done, 5) and fut.result().results[0].successful
    assert ros_ctx.wait_for(lambda: not player.running(), 10), player.output()
    ros_ctx.spin(0.2)
    assert player.returncode == 0 and len(joints) == N_JOINTS, player.output()
    assert [list(m.position) for m in joints] == [joint_positions(i) for i in range(N_JOINTS)]
    assert "resumed" in player.stderr()


# ----------------------------------------------------------------------------------------
# A recording feeds a real robot client; bag_recorder records the session
# ----------------------------------------------------------------------------------------
def server_args():
    args = ["robotserve_ros.nodes.inference_server", "--ros-args"]
    for p in ["engine.batch_sizes:=[1,2,4]", "engine.latency_ms:=[40.0,45.0,50.0]", f"obs_width:={SIDE}",
              f"obs_height:={SIDE}", "obs_joints:=6", "obs_encodings:=[rgb8]"]:
        args += ["-p", p]
    return args


def test_replayed_bag_drives_a_robot_client_and_the_session_is_recorded(ros_ctx, session_bags, tmp_path):
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import JointState

    from robotserve_ros.msg import ExecutionProgress

    out = tmp_path / "session_rec"
    progress = ros_ctx.collect(ExecutionProgress, "/robotserve/progress",
                               QoSProfile(depth=500, reliability=ReliabilityPolicy.RELIABLE))
    played = ros_ctx.collect(JointState, "/robot_0/joint_states", QoSProfile(depth=500, reliability=ReliabilityPolicy.BEST_EFFORT))
    recorder = ros_ctx.start_node([RECORDER, "--ros-args", "-p", f"output:={out}", "-p",
                                   "topics:=[/robotserve/progress, /robot_0/joint_states]"])
    ros_ctx.start_node(server_args())
    # The bag as a single .mcap file, looping: the client sees live sensors all along.
    mcap_file = next(session_bags["mcap"].glob("*.mcap"))
    player = ros_ctx.start_node(player_args(mcap_file, "loop:=true", "namespace_prefix:=/robot_0"))
    client = ros_ctx.start_node(["robotserve_ros.nodes.robot_client", "--robots", "1", "--ros-args", "-p", "task_actions:=20",
                                 "-p", "image_topics:=[camera/image_raw]", "-p", "expected_latency_s:=0.08"])
    chunked = lambda: [m for m in progress if m.chunks > 0 and m.task_id.startswith("robot_0/")]  # noqa: E731
    done = lambda: [m for m in progress if m.task_done]  # noqa: E731
    assert ros_ctx.wait_for(lambda: len(chunked()) >= 3 and len(done()) >= 1 and len(played) > N_JOINTS + 10, 60), (
        f"progress {len(progress)}, played {len(played)}\n{client.output()}\n{player.output()}")
    # (Which task is the first seen done depends on how fast discovery was: not asserted.)
    assert done()[0].task_id.startswith("robot_0/task") and done()[0].timestep >= 20
    # Looped: more joint states than one pass holds, positions only from the bag.
    known = {tuple(joint_positions(i)) for i in range(N_JOINTS)}
    assert all(tuple(m.position) in known for m in played)
    # The recorder finds topics by polling the graph: on a loaded machine it can subscribe to
    # the progress topic late. Stop the client only once it listens and a few more reports
    # (2 Hz) went out, so the recording has some to read back.
    assert ros_ctx.wait_for(lambda: ros_ctx.node.count_subscribers("/robotserve/progress") >= 2, 30)
    seen = len(progress)
    assert ros_ctx.wait_for(lambda: len(progress) >= seen + 3, 15)
    assert client.stop() == 0, client.output()
    ros_ctx.spin(0.3)
    assert recorder.stop() == 0, recorder.output()
    assert player.stop() == 0, player.output()

    # The recording reads back with rosbags, custom type and all.
    assert sorted(p.name for p in out.iterdir()) == ["metadata.yaml", f"{out.name}.mcap"]
    topics = bags.bag_topics(out)
    assert topics["/robotserve/progress"][0] == "robotserve_ros/msg/ExecutionProgress"
    assert topics["/robot_0/joint_states"][1] > 0
    rec = bags.read_bag(out, ["/robotserve/progress"])  # deserialized with make_typestore()'s registered type
    assert rec and all(type(m.data).__name__ == "robotserve_ros__msg__ExecutionProgress" for m in rec)
    live = {(m.task_id, m.header.stamp.sec, m.header.stamp.nanosec): m for m in progress}
    matched = 0
    for r in (m.data for m in rec):
        m = live.get((r.task_id, r.header.stamp.sec, r.header.stamp.nanosec))
        if m is None:
            continue
        matched += 1
        assert (r.round_id, r.timestep, r.actions_left, r.chunks, r.task_done) == (m.round_id, m.timestep, m.actions_left, m.chunks, m.task_done)
        assert math.isclose(r.idle_s, m.idle_s) and math.isclose(r.control_hz, m.control_hz)
        assert (r.task_start.sec, r.task_start.nanosec, r.exec_start.sec) == (m.task_start.sec, m.task_start.nanosec, m.exec_start.sec)
    assert matched >= 3, (len(rec), len(progress))
    assert any(m.data.chunks > 0 and m.data.task_id.startswith("robot_0/task") for m in rec)
    assert any(m.data.task_done for m in rec)


def test_recorder_finds_topics_that_appear_later(ros_ctx, tmp_path):
    """Started before anyone publishes: subscribes once the type shows up in the graph;
    sqlite3 storage; the bag reads back even with a typestore that never heard of the
    custom type (rosbag2 bags carry their definitions)."""
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from rosbags.typesys import Stores, get_typestore

    from robotserve_ros.msg import ExecutionProgress

    out = tmp_path / "late"
    recorder = ros_ctx.start_node([RECORDER, "--ros-args", "-p", f"output:={out}", "-p", "storage:=sqlite3",
                                   "-p", "discovery_period_s:=0.1"])
    assert ros_ctx.wait_for(lambda: "bag_recorder" in ros_ctx.node.get_node_names(), 15), recorder.output()
    ros_ctx.spin(0.3)  # it has looked and found neither topic
    progress = ros_ctx.publisher(ExecutionProgress, "/robotserve/progress", QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
    diags = ros_ctx.publisher(DiagnosticArray, "/diagnostics", 10)
    assert ros_ctx.wait_for(lambda: progress.get_subscription_count() and diags.get_subscription_count(), 10), recorder.output()
    sent = []
    for i in range(12):
        m = ExecutionProgress(task_id=f"robot_{i % 3}/task{i}", round_id=i, timestep=1000 + i, actions_left=i % 5,
                              control_hz=30.0, idle_s=0.125 * i, chunks=i + 1, task_done=i == 11)
        m.header.stamp.sec, m.task_start.sec, m.exec_start.nanosec = 100 + i, 50, 7 * i
        progress.publish(m)
        sent.append(m)
    diags.publish(DiagnosticArray(status=[DiagnosticStatus(name="robotserve", message="ok")]))
    ros_ctx.spin(0.5)
    assert recorder.stop() == 0, recorder.output()
    assert (out / "metadata.yaml").is_file() and list(out.glob("*.db3"))

    bare = get_typestore(Stores.ROS2_KILTED)
    assert "robotserve_ros/msg/ExecutionProgress" not in bare.fielddefs
    rec = [m.data for m in bags.read_bag(out, ["/robotserve/progress"], typestore=bare)]
    assert len(rec) == len(sent), recorder.output()
    assert [(r.task_id, r.round_id, r.timestep, r.actions_left, r.idle_s, r.chunks, r.task_done) for r in rec] == [
        (m.task_id, m.round_id, m.timestep, m.actions_left, m.idle_s, m.chunks, m.task_done) for m in sent]
    assert [(r.header.stamp.sec, r.task_start.sec, r.exec_start.nanosec) for r in rec] == [
        (m.header.stamp.sec, m.task_start.sec, m.exec_start.nanosec) for m in sent]
    d = bags.read_bag(out, ["/diagnostics"])
    assert len(d) == 1 and d[0].data.status[0].name == "robotserve"


# ----------------------------------------------------------------------------------------
# Bad parameters
# ----------------------------------------------------------------------------------------
@requires_rclpy
def test_bad_parameters_exit_2_naming_the_parameter(session_bags, tmp_path):
    existing = tmp_path / "already_here"
    existing.mkdir()
    bag = session_bags["mcap"]
    cases = {
        "missing bag": (player_args(tmp_path / "no_such_bag"), ["parameter 'bag'", "no_such_bag", "no such file"]),
        "rate 0": (player_args(bag, "rate:=0.0"), ["parameter 'rate'", "> 0"]),
        "topic not in bag": (player_args(bag, "topics:=[/nope]"), ["parameter 'topics'", "/nope", "/camera/image_raw"]),
        "existing output": ([RECORDER, "--ros-args", "-p", f"output:={existing}"], ["parameter 'output'", "exists already"]),
    }
    procs = {what: start_node(args) for what, (args, _) in cases.items()}  # side by side: they only start
    for what, proc in procs.items():
        code = proc.wait(timeout=30)
        err = proc.stderr()
        assert code == 2, f"{what}: exit {code}\n{proc.output()}"
        for text in cases[what][1]:
            assert text in err, f"{what}: {text!r} not in {err!r}"
        assert "Traceback" not in err, err
    assert list(existing.iterdir()) == []  # untouched
