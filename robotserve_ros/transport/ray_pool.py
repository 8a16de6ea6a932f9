"""The `ray` tier: a Ray Serve pool of policy replicas behind one core.Engine (issue 24).

Each replica is a Serve deployment replica that builds one of the project's engines
(`engines.make_engine`: simulated, lerobot, flow, ...) and runs whole batches (`infer`).
Our Runner still orders the requests and forms the batches (Kairos / remaining / FIFO):
the tier has one slot per running replica, and each replica takes one batch at a time
(`max_ongoing_requests=1`), so Serve's router only ever picks an idle replica; it never
queues or reorders our work. Ray owns the replicas' lifecycle: placement by `num_gpus`,
custom resources or `accelerator_type`, health checks, restarts, and autoscaling bounds.

A call whose replica dies fails with ActorDiedError (Ray does not retry it; measured in
shared/notes/ray-vllm-openpi.md): `infer` raises RayTierError, and the Runner's failure
path requeues the batch (core/runner.py `fail`): nothing lost, nothing answered twice.
`attach(runner, tier)` keeps the tier's slot count equal to the replicas Serve reports
RUNNING, so a replica added while serving (by hand or by the autoscaler) gets batches,
and a dead one gets none until Ray has replaced it.

Loopback: with node_ip_address 127.0.0.1 (the default) a cluster this module starts binds
loopback, the driver resolves "127.0.0.1" to loopback (Ray otherwise swaps it for the host's
address), and each replica's inter-deployment gRPC server, which Ray Serve 2.60 binds on
`[::]` with no setting, is bound on 127.0.0.1 instead. Ray pickles the requests between
processes: a Ray cluster is one trust domain (docs/scale-out.md); the project's own wire
(gRPC tiers) carries no pickle.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from ..core.engine import Engine
from ..core.profile import EngineProfile
from ..core.types import ChunkResult, InferenceRequest

log = logging.getLogger("robotserve.ray_pool")

LOOPBACK = "127.0.0.1"
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray takes loopback as the node's own address


def use_loopback() -> None:
    """Make this process and every Ray process it starts take 127.0.0.1 as the node address.

    Ray resolves a "127.0.0.1" cluster address to the host's network address unless its
    cluster mode is off (ray._private.services.get_node_ip_address); the environment covers
    the processes started from here, the constant this one (it is read at call time)."""
    os.environ[_LOOPBACK_ENV] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def _loopback_replica_grpc() -> None:
    """Inside a replica: bind Serve's inter-deployment gRPC server on loopback, not `[::]`
    (ray/serve/_private/replica.py, no setting for it in 2.60). Runs in the replica's
    __init__, which Serve calls before it starts that server."""
    from ray.serve._private import replica

    bind = replica.add_port_to_grpc_server
    if getattr(bind, "robotserve_loopback", False):
        return

    def loopback(server, address):
        return bind(server, address.replace("[::]", LOOPBACK) if address.startswith("[::]") else address)

    loopback.robotserve_loopback = True
    replica.add_port_to_grpc_server = loopback


class RayTierError(RuntimeError):
    """The pool did not serve the batch (its replica died, a timeout, no replica): requeue it.
    `tier_failure` is false where the replica's engine itself raised on the batch (Ray's
    RayTaskError): a request of the batch may be at fault, and the Runner looks for it."""

    def __init__(self, message: str, tier_failure: bool = True) -> None:
        super().__init__(message)
        self.tier_failure = tier_failure


def _engine_raised(e: BaseException) -> bool:
    """Ray's error for an exception the replica's code raised (not its death, not a timeout)."""
    names = {c.__name__ for c in type(e).__mro__}
    return "RayTaskError" in names and not names & {"RayActorError", "ActorDiedError", "ActorUnavailableError"}


class PolicyReplica:
    """One replica: an engine of the project, whole batches in, results out."""

    def __init__(self, make: Callable, engine: str, profile_ms: Optional[Mapping], params: Mapping,
                 loopback: bool) -> None:
        if loopback:
            _loopback_replica_grpc()
        profile = EngineProfile({int(b): float(ms) for b, ms in profile_ms.items()}) if profile_ms else None
        self.engine = make(engine, profile, **dict(params))
        self.served = 0

    def infer(self, batch: Sequence[InferenceRequest]) -> list:
        out = list(self.engine.infer(batch))
        self.served += len(out)
        return out

    def example_observations(self, n: int, seed: int = 0) -> list:
        """Synthetic inputs of the replica's engine (engines' example_observation), for timing."""
        rng = np.random.default_rng(seed)
        return [self.engine.example_observation(rng) for _ in range(n)]

    def profile(self) -> dict:
        p = self.engine.profile
        return {int(b): float(ms) for b, ms in zip(p.batches, p.latencies_ms)}

    def where(self) -> dict:
        """The replica's node and process: tests and benches check placement with it."""
        import ray
        from ray import serve

        ctx = serve.get_replica_context()
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "replica": ctx.replica_id.unique_id, "served": self.served}


def _start_ray(address: str, temp_dir: str, local_cpus: float, node_ip_address: str, resources: Mapping) -> bool:
    """Connect to `address`, or start a local one-node cluster ('' address); True if started here."""
    import ray

    if node_ip_address == LOOPBACK:
        use_loopback()
    if ray.is_initialized():
        return False
    kw = {"include_dashboard": False, "log_to_driver": False, "_node_ip_address": node_ip_address}
    if address:
        ray.init(address=address, **kw)
        return False
    if temp_dir:  # Ray looks for its session files under RAY_TMPDIR/ray (ray.cluster_utils too)
        Path(temp_dir, "ray").mkdir(parents=True, exist_ok=True)
        os.environ["RAY_TMPDIR"] = temp_dir
        kw["_temp_dir"] = str(Path(temp_dir, "ray"))
    ray.init(num_cpus=local_cpus, resources=dict(resources) or None, **kw)
    return True


def _deployment_options(replicas: int, min_replicas: int, max_replicas: int, target_ongoing: float,
                        num_cpus: float, num_gpus: float, resources: Optional[Mapping], accelerator_type: str,
                        max_replicas_per_node: int) -> dict:
    """Serve's options for the PolicyReplica deployment: each replica's Ray actor resources, and
    a fixed count or the autoscaler's range (max_replicas > 0)."""
    actor = {"num_cpus": float(num_cpus)}
    if num_gpus:
        actor["num_gpus"] = float(num_gpus)
    if resources:
        actor["resources"] = {str(k): float(v) for k, v in resources.items()}
    if accelerator_type:
        actor["accelerator_type"] = accelerator_type
    opts = {"max_ongoing_requests": 1, "ray_actor_options": actor, "name": "PolicyReplica"}
    if max_replicas_per_node:
        opts["max_replicas_per_node"] = int(max_replicas_per_node)
    if max_replicas:
        opts["autoscaling_config"] = {"min_replicas": min_replicas, "max_replicas": max_replicas,
                                      "initial_replicas": max(min_replicas, 1),
                                      "target_ongoing_requests": target_ongoing}
    else:
        opts["num_replicas"] = replicas
    return opts


class RayPool:
    """A Serve application of PolicyReplica deployments, reached by handle only (no HTTP proxy).

    make(engine, profile, **engine_params) builds a replica's engine in the replica's process:
    engines.make_engine, passed in (by reference) so this module imports no registry above it.

    replicas: a fixed count; or min_replicas..max_replicas (max > 0) for Serve's autoscaler,
    which adds a replica when more than `target_ongoing` batches are on each. Per replica:
    num_cpus, num_gpus, resources (custom, e.g. {"arm_pool": 1}), accelerator_type ("A100",
    ...), at most max_replicas_per_node on a node (0: no limit). address: an existing cluster
    ("host:port"), or '' to start a local one (local_cpus CPUs, temp_dir its own, nothing
    left behind: close() shuts down what this pool started and nothing else).
    """

    def __init__(
        self,
        engine: str = "simulated",
        engine_params: Optional[Mapping] = None,
        profile: Optional[EngineProfile] = None,
        *,
        make: Callable,
        replicas: int = 1,
        min_replicas: int = 0,
        max_replicas: int = 0,
        target_ongoing: float = 1.0,
        num_cpus: float = 0.0,
        num_gpus: float = 0.0,
        resources: Optional[Mapping] = None,
        accelerator_type: str = "",
        max_replicas_per_node: int = 0,
        address: str = "",
        node_ip_address: str = LOOPBACK,
        temp_dir: str = "",
        local_cpus: float = 2,
        local_resources: Optional[Mapping] = None,
        app: str = "robotserve-pool",
        start_timeout_s: float = 120.0,
    ) -> None:
        if engine == "ray":
            raise ValueError("engine 'ray' cannot be a replica of itself")
        if max_replicas and not 0 <= min_replicas <= max_replicas:
            raise ValueError(f"min_replicas {min_replicas} .. max_replicas {max_replicas} is not a range")
        if not max_replicas and replicas < 1:
            raise ValueError(f"replicas {replicas} is not >= 1")
        import ray  # noqa: F401 (fails here, naming ray, when the extra is not installed)
        from ray import serve

        self.app, self.autoscaling = app, bool(max_replicas)
        self.max_slots = max_replicas if max_replicas else replicas
        self.owns_ray = _start_ray(address, temp_dir, local_cpus, node_ip_address, local_resources or {})
        opts = _deployment_options(replicas, min_replicas, max_replicas, target_ongoing, num_cpus, num_gpus,
                                   resources, accelerator_type, max_replicas_per_node)
        profile_ms = {int(b): float(ms) for b, ms in zip(profile.batches, profile.latencies_ms)} if profile else None
        self._deployment = serve.deployment(PolicyReplica).options(**opts)
        self._args = (make, engine, profile_ms, dict(engine_params or {}), node_ip_address == LOOPBACK)
        try:
            serve.start(proxy_location="Disabled")  # handles only: no HTTP proxy
            self.handle = serve.run(self._deployment.bind(*self._args), name=app, route_prefix=None)
        except Exception:
            self.close()
            raise
        self._infer = self.handle.options(method_name="infer")

    # --- the replicas ---------------------------------------------------------------------
    def running(self) -> int:
        """Replicas Serve reports RUNNING (a dead one is out of it until its replacement starts)."""
        from ray import serve

        app = serve.status().applications.get(self.app)
        if app is None:
            return 0
        return sum(d.replica_states.get("RUNNING", 0) for d in app.deployments.values())

    def scale(self, replicas: int) -> None:
        """A fixed pool to `replicas` while serving (Serve adds or drains replicas; the ones
        running keep running)."""
        from ray import serve

        if self.autoscaling:
            raise ValueError("an autoscaling pool is sized by Serve between its bounds")
        self._deployment = self._deployment.options(num_replicas=replicas)
        self.max_slots = max(self.max_slots, replicas)
        serve.run(self._deployment.bind(*self._args), name=self.app, route_prefix=None)

    def replica_actors(self) -> list:
        """The replicas' actor handles (for fault injection: ray.kill)."""
        import ray

        prefix = f"SERVE_REPLICA::{self.app}#"
        return [ray.get_actor(a["name"], namespace=a["namespace"])
                for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]

    def where(self, timeout_s: float = 10.0) -> dict:
        """One replica's node, pid and id (whichever Serve's router picks)."""
        return self.handle.options(method_name="where").remote().result(timeout_s=timeout_s)

    def profile(self, timeout_s: float = 30.0) -> EngineProfile:
        ms = self.handle.options(method_name="profile").remote().result(timeout_s=timeout_s)
        return EngineProfile({int(b): float(v) for b, v in ms.items()})

    def call(self, batch: Sequence[InferenceRequest], timeout_s: float) -> list:
        return self._infer.remote(list(batch)).result(timeout_s=timeout_s)

    def measure(self, batch_sizes: Sequence[int], repeats: int, timeout_s: float = 60.0) -> EngineProfile:
        """The profile as the Runner sees it: median wall time of a batch through the pool (the
        handle call, pickling, the replica's engine) at each batch size, after one warm-up."""
        sizes = sorted({int(b) for b in batch_sizes})
        obs = self.handle.options(method_name="example_observations").remote(sizes[-1]).result(timeout_s=timeout_s)
        ms: dict = {}
        for k in range(repeats + 1):
            for b in sizes:
                batch = [InferenceRequest(f"profile/robot_{i}", k, observation=obs[i]) for i in range(b)]
                t = time.perf_counter()
                self.call(batch, timeout_s)
                if k:  # the first round warms up
                    ms.setdefault(b, []).append((time.perf_counter() - t) * 1e3)
        med = [float(np.median(ms[b])) for b in sizes]
        return EngineProfile({b: max(med[: i + 1]) for i, b in enumerate(sizes)})  # never falling with batch

    def close(self) -> None:
        """Delete this pool's application; shut Ray down only if this pool started it."""
        import ray
        from ray import serve

        try:
            if ray.is_initialized():
                serve.delete(self.app)
                if self.owns_ray:
                    serve.shutdown()
        except Exception:  # closing must not raise: the cluster may be gone already
            log.exception("deleting the Serve application %s failed", self.app)
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()


class RayPoolEngine(Engine):
    """The pool as the Runner and the placement see it: one tier of `slots` slots (one per
    replica), the replicas' engine profile (fetched from a replica, as a GPU server's is), or
    with measure_repeats > 0 that profile measured through the pool at its batch sizes.

    call_timeout_s: a batch not answered within it fails (RayTierError) and is requeued.
    """

    name = "ray"

    def __init__(self, profile: Optional[EngineProfile] = None, *, engine: str = "simulated",
                 engine_params: Optional[Mapping] = None, call_timeout_s: float = 30.0,
                 sync_interval_s: float = 0.25, measure_repeats: int = 0, **pool) -> None:
        if call_timeout_s <= 0 or sync_interval_s <= 0 or measure_repeats < 0:
            raise ValueError("call_timeout_s and sync_interval_s must be > 0, measure_repeats >= 0")
        self.pool = RayPool(engine, engine_params, profile, **pool)
        self.call_timeout_s, self.sync_interval_s = call_timeout_s, sync_interval_s
        try:
            self.profile = profile or self.pool.profile()
            self.engine_profile = self.profile  # the replicas' engine's own
            if measure_repeats:  # the slots as placement should see them: Ray's cost included
                self.profile = self.pool.measure(self.profile.batches, measure_repeats, call_timeout_s)
        except Exception:
            self.pool.close()
            raise
        self.calls = self.failures = 0
        self._stop = threading.Event()
        self._syncer: Optional[threading.Thread] = None

    @property
    def slots(self) -> int:
        """Slot threads the Runner starts for the tier: the most replicas it may have."""
        return self.pool.max_slots

    def infer(self, batch: Sequence[InferenceRequest]) -> list[ChunkResult]:
        self.calls += 1
        try:
            out = self.pool.call(batch, self.call_timeout_s)
        except Exception as e:  # ActorDiedError, a timeout, an engine fault in the replica
            self.failures += 1
            raise RayTierError(f"Ray pool {self.pool.app}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                               tier_failure=not _engine_raised(e)) from None
        if len(out) != len(batch):
            raise RayTierError(f"Ray pool {self.pool.app} returned {len(out)} results for {len(batch)} requests")
        return out

    # --- slots follow the replicas ---------------------------------------------------------
    def sync(self, runner, tier: str) -> int:
        """Set the tier's slots to the replicas running now (at most the slot threads)."""
        n = min(self.pool.running(), self.slots)
        if runner.set_slots(tier, n):
            log.info("ray tier %s: %d replica(s) running", tier, n)
        return n

    def attach(self, runner, tier: str) -> None:
        """Keep the tier's slots equal to the running replicas while the runner serves."""
        self.sync(runner, tier)

        def loop() -> None:
            while not self._stop.wait(self.sync_interval_s):
                try:
                    self.sync(runner, tier)
                except Exception:  # the controller busy or restarting: keep the slots as they are
                    log.debug("ray tier %s: replica count unavailable", tier, exc_info=True)

        self._syncer = threading.Thread(target=loop, name=f"ray-sync-{tier}", daemon=True)
        self._syncer.start()

    def close(self) -> None:
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join(timeout=2.0)
        self.pool.close()


def wait_running(pool: RayPool, n: int, timeout_s: float = 60.0) -> bool:
    """Until `n` replicas run (True) or the time is up (False)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pool.running() >= n:
            return True
        time.sleep(0.2)
    return False


__all__ = ["LOOPBACK", "PolicyReplica", "RayPool", "RayPoolEngine", "RayTierError", "use_loopback", "wait_running"]
