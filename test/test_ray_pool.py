"""The ray tier (transport/ray_pool.py) on a two-node Ray cluster on this machine, loopback only.

One module-scoped cluster (ray.cluster_utils.Cluster): a head node and a worker node that
alone has the custom resource `arm_pool`. RAY_AUTH_MODE=disabled: Ray 2.60's token auth
writes a token to ~/.ray, outside the test's own folders, and every node must share it;
the cluster is reachable on 127.0.0.1 only, which is what keeps it private here.
Never `ray stop` (it ends every Ray process on the machine): the fixture shuts down only
the cluster it started.
"""
from __future__ import annotations

import os
import threading
import time

import psutil
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install .[ray])")

from ray import serve  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from rosutil import requires_rclpy, ros_ctx  # noqa: E402,F401 (the fixture)

from robotserve_ros.bench.ray import FIXED, SIM_PARAMS, ClosedLoopFleet  # noqa: E402
from robotserve_ros.core.clock import WallClock  # noqa: E402
from robotserve_ros.engines import make_engine  # noqa: E402
from robotserve_ros.core.profile import EngineProfile  # noqa: E402
from robotserve_ros.core.schedulers import make_scheduler  # noqa: E402
from robotserve_ros.core.serving import ServingCore, Tier  # noqa: E402
from robotserve_ros.transport.ray_pool import LOOPBACK, RayPool, RayPoolEngine, use_loopback, wait_running  # noqa: E402

LOOPBACK_IPS = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    (tmp / "ray").mkdir()
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAY_AUTH_MODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    os.environ.update(RAY_TMPDIR=str(tmp), RAY_AUTH_MODE="disabled")
    use_loopback()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    node = {"node_ip_address": LOOPBACK, "num_cpus": 1}
    c = Cluster(initialize_head=True, head_node_args={**node, "temp_dir": str(tmp / "ray"), "include_dashboard": False})
    worker = c.add_node(**node, resources={"arm_pool": 4})
    ray.init(address=c.address, _node_ip_address=LOOPBACK, log_to_driver=False)
    serve.start(proxy_location="Disabled")
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    try:
        yield {"cluster": c, "worker": worker, "started": started}
    finally:
        serve.shutdown()
        ray.shutdown()
        c.shutdown()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def pool_kw(**kw):
    return {"engine": "simulated", "engine_params": SIM_PARAMS, "resources": {"arm_pool": 1}, "make": make_engine, **kw}


def test_replicas_are_placed_by_a_custom_resource_and_everything_listens_on_loopback(cluster):
    pool = RayPool(profile=FIXED, replicas=2, app="placed", **pool_kw(engine_params={**SIM_PARAMS, "realtime": False}))
    try:
        assert not pool.owns_ray  # it joined the fixture's cluster, started none
        assert wait_running(pool, 2, 30)
        refs = [pool.handle.options(method_name="where").remote() for _ in range(12)]
        seen = [r.result(timeout_s=10) for r in refs]
        assert {w["node_id"] for w in seen} == {cluster["worker"].node_id}
        assert cluster["worker"].node_id != cluster["cluster"].head_node.node_id
        procs = [psutil.Process()] + [p for p in psutil.Process().children(recursive=True)]
        assert len(procs) > len(cluster["started"]) >= 3  # gcs, raylets, ... and the replicas
        wide = []
        for p in procs:
            try:
                conns = p.net_connections(kind="inet")
            except psutil.NoSuchProcess:
                continue
            wide += [(p.pid, p.name(), c.laddr) for c in conns if c.status == psutil.CONN_LISTEN
                     and c.laddr.ip not in LOOPBACK_IPS]
        assert not wide, f"Ray processes listen beyond loopback: {wide}"
    finally:
        pool.close()


def fleet_on_pool(engine: RayPoolEngine, robots: int, slots: int) -> ClosedLoopFleet:
    core = ServingCore(make_scheduler("fifo"), [Tier("pool", engine.profile, slots=slots)], WallClock())
    fleet = ClosedLoopFleet(core, {"pool": engine}, robots, retry_pause_s=0.05, max_attempts=10)
    fleet.runner.start()  # its slot threads first (one per slot), then the slots follow the replicas
    engine.attach(fleet.runner, "pool")
    return fleet


def wait_for(cond, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_a_replica_killed_mid_batch_loses_nothing_and_runs_nothing_twice(cluster):
    slow = EngineProfile({1: 300.0, 8: 300.0})  # long batches: the kill lands inside one
    engine = RayPoolEngine(slow, replicas=2, app="killed", **pool_kw())
    fleet = fleet_on_pool(engine, robots=16, slots=2)
    try:
        assert wait_running(engine.pool, 2, 30)
        fleet.start()
        assert wait_for(lambda: fleet.served() >= 32, 30)
        # both slots inside a batch when the replica dies (on a loaded machine the robots may leave
        # the pool idle for a moment, and a kill then hits nothing: seen once with two suites at once)
        assert wait_for(lambda: fleet.runner.running["pool"] >= 2, 30), "the pool never had two batches in flight"
        ray.kill(engine.pool.replica_actors()[0], no_restart=True)
        killed_at = time.monotonic()
        # Generous: on a loaded machine Ray takes seconds to see the actor die and fail its call.
        assert wait_for(lambda: engine.failures >= 1, 30), "the kill hit no batch in flight"
        assert wait_for(lambda: fleet.all_served_since(killed_at + 0.5), 30), "some robot was not served again"
    finally:
        fleet.stop()
        engine.close()
    assert fleet.lost() == 0
    assert fleet.duplicated() == 0
    assert fleet.runner.failures["pool"] >= 1  # the failed batch went through the Runner's failure path


def test_a_replica_added_while_serving_gets_batches(cluster):
    engine = RayPoolEngine(FIXED, replicas=1, app="grown", **pool_kw())
    fleet = fleet_on_pool(engine, robots=16, slots=2)
    try:
        assert wait_running(engine.pool, 1, 30)
        fleet.start()
        assert wait_for(lambda: fleet.served() >= 16, 20)
        assert fleet.runner.core.tier("pool").slots == 1
        engine.pool.scale(2)
        assert wait_for(lambda: fleet.runner.core.tier("pool").slots == 2, 30), "the second replica never got a slot"
        # Each replica counts the rounds it served; Serve's router spreads `where` calls over both.
        served: dict = {}

        def both_served() -> bool:
            w = engine.pool.where()
            served[w["replica"]] = w["served"]
            return len(served) == 2 and min(served.values()) > 0

        assert wait_for(both_served, 30), f"rounds served per replica: {served}"
    finally:
        fleet.stop()
        engine.close()
    assert fleet.lost() == 0 and fleet.duplicated() == 0


@requires_rclpy
def test_the_inference_server_serves_robots_from_a_ray_pool(cluster, ros_ctx, tmp_path):
    """The real node with a `ray` tier joining the fixture's cluster: a burst overflows the
    slow edge onto the pool's replicas (on the worker node); every call answered once."""
    import math

    import yaml
    from diagnostic_msgs.msg import DiagnosticArray
    from test_nodes import SERVICE, Caller, make_request

    from robotserve_ros.srv import Infer

    robots = 12
    params = {
        "engine": {"batch_sizes": [1, 2, 4], "latency_ms": [300.0, 320.0, 340.0]},
        "obs_width": 96, "obs_height": 96, "obs_joints": 6, "obs_encodings": ["rgb8"], "diagnostics_hz": 5.0,
        "ray_tiers": ["pool"],
        # The burst below sends 12 calls at once from one client; the server's default queue keeps
        # the last 10 (robots re-send an unanswered round themselves, a test client does not).
        "infer_queue": {"depth": 32},
        "pool": {"replicas": 2, "resources": {"arm_pool": 1}, "address": cluster["cluster"].address},
    }
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump({"inference_server": {"ros__parameters": params}}))
    srv = ros_ctx.start_node(["robotserve_ros.nodes.inference_server", "--ros-args", "--params-file", str(path)])
    diags = ros_ctx.collect(DiagnosticArray, "/diagnostics", 10)
    # The node builds the pool (serve.run) before it offers the service.
    infer = ros_ctx.node.create_client(Infer, SERVICE)
    assert ros_ctx.wait_for(lambda: infer.service_is_ready() or not srv.running(), 90) and srv.running(), srv.output()
    c = Caller(ros_ctx)
    assert c.call(make_request("warmup/task0", 0)).status.reason == "ok", srv.output()
    futs = [c.send(make_request(f"robot_{i}/task0", 0)) for i in range(robots)]
    assert ros_ctx.wait_for(lambda: all(f.done() for f in futs), 30), srv.output()
    for i, f in enumerate(futs):
        res = f.result()
        assert res.status.reason == "ok", res.status.message
        assert (res.chunk.task_id, res.chunk.round_id) == (f"robot_{i}/task0", 0)
        assert all(math.isfinite(x) for x in res.chunk.actions)

    def served():
        for m in reversed(diags):
            vals = {kv.key: kv.value for kv in m.status[0].values}
            if vals.get("served") == str(robots + 1):
                return vals
        return None

    assert ros_ctx.wait_for(lambda: served() is not None, 5), "diagnostics never counted every reply"
    vals = served()
    by_tier = {k.split("/", 1)[1]: int(v) for k, v in vals.items() if k.startswith("served_by_tier/")}
    assert by_tier.get("pool", 0) >= 1 and sum(by_tier.values()) == robots + 1, vals
    apps = [a for a in serve.status().applications if a.startswith("robotserve-pool-")]
    assert apps, "the node's pool is not in the cluster"
    assert srv.stop() == 0, srv.output()
    assert not set(apps) & set(serve.status().applications)  # the node deleted its application on shutdown


def test_a_gpu_server_fronts_a_pool_with_a_slot_per_replica(cluster):
    """`gpu-server --engine ray`: the region's server behind the WAN runs its batches on the pool."""
    from robotserve_ros.core.types import InferenceRequest
    from robotserve_ros.transport.gpu_server import GpuServer
    from robotserve_ros.transport.remote_engine import RemoteEngine

    engine = RayPoolEngine(FIXED, replicas=2, app="fronted", **pool_kw())
    assert wait_running(engine.pool, 2, 30)
    srv = GpuServer(engine, "127.0.0.1:0")
    remote = None
    try:
        assert srv.servicer.core.tier("engine").slots == 2
        remote = RemoteEngine(address=srv.address, ping_interval_s=0)
        out = remote.infer([InferenceRequest(f"t{i}", 0) for i in range(12)])
        assert [o.actions.shape for o in out] == [(8, 2)] * 12
        assert srv.counts["batches"] >= 2  # 12 requests: more than one batch of 8, over the replicas
    finally:
        if remote is not None:
            remote.close()
        srv.stop(None)
        engine.close()


def test_the_tier_profile_can_be_measured_through_the_pool(cluster):
    """measure_repeats: placement plans with what a batch costs through Ray, not the engine alone."""
    engine = RayPoolEngine(FIXED, replicas=1, app="measured", measure_repeats=2, **pool_kw())
    try:
        assert engine.engine_profile is FIXED
        assert list(engine.profile.batches) == [1, 8]
        # the 50 ms sleep plus Ray's call: more than the engine alone, far less than a timeout
        assert all(50.0 < ms < 2000.0 for ms in engine.profile.latencies_ms), engine.profile.latencies_ms
    finally:
        engine.close()


def test_the_rtc_guide_travels_to_a_replica_and_its_d_comes_back(cluster):
    """A Ray tier hands the requests to its replicas as objects: each row's RTC guide (leftover and the d
    the edge's dispatcher set) reaches the replica's engine, and the d it used comes back; a row without a
    guide stays unguided in the same batch (engines/simulated.py: the first d rows are the leftover's)."""
    import numpy as np

    from robotserve_ros.core.rtc import RtcGuide
    from robotserve_ros.core.types import InferenceRequest

    dim = SIM_PARAMS.get("action_dim", 2)
    engine = RayPoolEngine(FIXED, replicas=1, app="rtc", **pool_kw())
    try:
        assert wait_running(engine.pool, 1, 30)
        left = np.arange(5 * dim, dtype=np.float32).reshape(5, dim) + 100
        guided, plain = engine.infer([InferenceRequest("r/g", 1, rtc=RtcGuide(left, 3)), InferenceRequest("r/p", 1)])
    finally:
        engine.close()
    assert guided.rtc_delay_steps == 3 and plain.rtc_delay_steps is None
    np.testing.assert_array_equal(guided.actions[:3], left[:3])
    assert not np.array_equal(plain.actions[:3], left[:3])
