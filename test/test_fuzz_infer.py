"""Fuzzing the Infer request (hypothesis, bounded examples): every srv/Infer request the
message type can carry (any field, sizes, encodings, NaN/Inf) is either queued by the core
or refused with a RequestError that says what is wrong; nothing else escapes, nothing
hangs, and nothing is allocated beyond the configured payload limit (the observation is a
view on the message's bytes)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rosutil import requires_rclpy

pytestmark = requires_rclpy

U32 = 2**32 - 1
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), st.sampled_from([0.0, -0.0, 1e308, -1e-308]))
f32 = st.floats(allow_nan=True, allow_infinity=True, width=32)
texts = st.one_of(st.text(max_size=40), st.sampled_from(["", "robot_0/task0", "x" * 5000, "ü/\u0000/\ud7ff", " "]))
ENCODINGS = ["rgb8", "bgr8", "mono8", "rgba8", "16UC1", "", "RGB8", "jpeg"]


@st.composite
def images(draw):
    from sensor_msgs.msg import Image

    w = draw(st.one_of(st.integers(0, 24), st.sampled_from([U32, 2**31, 65536])))
    h = draw(st.one_of(st.integers(0, 24), st.sampled_from([U32, 2**31, 65536])))
    enc = draw(st.sampled_from(ENCODINGS))
    channels = {"rgb8": 3, "bgr8": 3, "mono8": 1, "rgba8": 4}.get(enc, 2)
    step = draw(st.one_of(st.just(min(U32, w * channels)), st.integers(0, U32)))
    exact = min(w, 24) * min(h, 24) * channels
    n = draw(st.one_of(st.just(exact), st.integers(0, 4096), st.just(max(0, exact - 1))))
    im = Image(width=w, height=h, encoding=enc, step=step, is_bigendian=draw(st.integers(0, 255)))
    im.data = bytes(draw(st.binary(min_size=0, max_size=16))) * (n // 16) + bytes(n % 16)
    return im


@st.composite
def infer_requests(draw):
    from robotserve_ros.srv import Infer

    r = Infer.Request()
    r.task_id = draw(texts)
    r.round_id = draw(st.one_of(st.integers(0, 3), st.integers(0, U32)))
    o = r.observation
    o.header.stamp.sec = draw(st.one_of(st.integers(0, 2_000_000_000), st.integers(-2**31, 2**31 - 1)))
    o.header.stamp.nanosec = draw(st.integers(0, U32))
    o.timestep = draw(st.one_of(st.integers(0, 1000), st.integers(0, 2**64 - 1)))
    o.images = draw(st.lists(images(), max_size=3))
    o.joint_state.position = draw(st.lists(floats, max_size=12))
    o.joint_state.name = draw(st.lists(st.text(max_size=5), max_size=3))
    o.instruction = draw(texts)
    r.has_exec_info = draw(st.booleans())
    r.exec_info.exec_start.sec = draw(st.integers(-2**31, 2**31 - 1))
    r.exec_info.exec_start.nanosec = draw(st.integers(0, U32))
    r.exec_info.actions_left = draw(st.integers(0, U32))
    r.exec_info.control_hz = draw(f32)
    r.horizon.name = draw(st.one_of(st.sampled_from(["static", "confidence", "", "nope"]), st.text(max_size=10)))
    r.horizon.has_param = draw(st.booleans())
    r.horizon.param = draw(f32)
    r.remaining_rounds = draw(st.integers(0, U32))
    r.refresh_service = draw(texts)
    return r


@pytest.fixture(scope="module")
def server_side():
    """The server's checks (an ObservationSpec like the node's) and a live ServingCore."""
    from robotserve_ros.core.clock import VirtualClock
    from robotserve_ros.core.observation import ObservationSpec
    from robotserve_ros.core.schedulers import make_scheduler
    from robotserve_ros.core.serving import ServingCore, Tier
    from robotserve_ros.profiles import profile_of_record

    spec = ObservationSpec(cameras=None, width=None, height=None, encodings=("rgb8", "bgr8", "mono8"), joints=None,
                           max_bytes=4096)
    clock = VirtualClock(1_000.0)
    core = ServingCore(make_scheduler("kairos"), [Tier("edge", profile_of_record("smolvla_tiny"))], clock,
                       horizon_params={"static": {"h": 10}, "confidence": {"t": 0.4, "h_min": 5}})
    return spec, core


def _ok_or_clear(fn):
    from robotserve_ros.core.errors import RequestError

    try:
        return fn(), None
    except RequestError as e:
        assert e.code and isinstance(e.message, str) and e.message.strip(), (e.code, e.message)
        return None, e


@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(infer_requests())
def test_every_infer_request_is_queued_or_refused_clearly(server_side, msg):
    from robotserve_ros.nodes.convert import request_from_msg

    spec, core = server_side
    req, err = _ok_or_clear(lambda: request_from_msg(msg, spec))
    if err is not None:
        return
    # Accepted: within the limits, and every number the core will compute with is checked there.
    imgs = req.observation.images
    assert sum(np.asarray(i).nbytes for i in imgs) <= spec.max_bytes
    for im in imgs:  # a view on the message's bytes, not a copy
        assert isinstance(im, np.ndarray) and im.ndim == 3
    before = core.stats.submitted
    p, err = _ok_or_clear(lambda: core.submit(req))
    if err is None:
        assert core.stats.submitted == before + 1 and p.replay is None  # a new task each example
        assert math.isfinite(p.deadline) and math.isfinite(req.obs_stamp)
        assert req.exec_info is None or not req.exec_info.problems()
        core.cancel(req.task_id)  # one task at a time: the next example starts clean
    else:
        assert core.stats.errors[err.code] >= 1


@settings(max_examples=60, deadline=2000)
@given(st.integers(4097, 200_000))
def test_a_payload_over_the_limit_is_refused_before_it_is_decoded(server_side, n):
    from sensor_msgs.msg import Image

    from robotserve_ros.core.errors import RequestError
    from robotserve_ros.nodes.convert import request_from_msg
    from robotserve_ros.srv import Infer

    spec, _ = server_side
    r = Infer.Request()
    r.task_id = "t"
    side = int(math.isqrt(n // 3)) + 1
    im = Image(width=side, height=side, encoding="rgb8", step=3 * side)
    im.data = bytes(3 * side * side)
    r.observation.images = [im]
    with pytest.raises(RequestError) as e:
        request_from_msg(r, spec)
    assert e.value.code == "payload_too_large" and str(spec.max_bytes) in e.value.message


def test_the_fuzzed_shape_is_accepted_when_valid(server_side):
    """The generator's well-formed corner is queued (so the fuzz above reaches the core)."""
    from sensor_msgs.msg import Image

    from robotserve_ros.nodes.convert import request_from_msg
    from robotserve_ros.srv import Infer

    spec, core = server_side
    r = Infer.Request()
    r.task_id, r.round_id = "fuzz/valid", 0
    r.observation.header.stamp.sec = 999
    im = Image(width=4, height=3, encoding="rgb8", step=12)
    im.data = bytes(36)
    r.observation.images = [im]
    r.observation.joint_state.position = [0.0] * 6
    r.horizon.name = "confidence"
    p = core.submit(request_from_msg(r, spec))
    assert p.task_id == "fuzz/valid" and p.request.observation.images[0].shape == (3, 4, 3)
    core.cancel("fuzz/valid")
