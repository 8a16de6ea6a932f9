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

from robotserve_ros.bench.ray import FIXED, SIM_PARAMS, ClosedLoopFleet  # noqa: E402
from robotserve_ros.core.clock import WallClock  # noqa: E402
from robotserve_ros.core.profile import EngineProfile  # noqa: E402
from robotserve_ros.core.schedulers import make_scheduler  # noqa: E402
from robotserve_ros.core.serving import ServingCore, Tier  # noqa: E402
from robotserve_ros.transport.ray_pool import LOOPBACK, RayPool, RayPoolEngine, use_loopback, wait_running  # noqa: E402

LOOPBACK_IPS = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    (tmp / "ray").mkdir()
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAY_AUTH_MODE")}
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
    return {"engine": "simulated", "engine_params": SIM_PARAMS, "resources": {"arm_pool": 1}, **kw}


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
        ray.kill(engine.pool.replica_actors()[0], no_restart=True)
        killed_at = time.monotonic()
        assert wait_for(lambda: engine.failures >= 1, 10), "the kill hit no batch in flight"
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
        served_at_two = fleet.served()
        time.sleep(1.0)
        rate_two = fleet.served() - served_at_two
    finally:
        fleet.stop()
        engine.close()
    # One replica serves at most 8 rounds per 50 ms (160/s): more means both replicas ran batches.
    assert rate_two > 8 / 0.05 * 1.2, f"{rate_two} rounds in 1 s with two replicas"
    assert fleet.lost() == 0 and fleet.duplicated() == 0
