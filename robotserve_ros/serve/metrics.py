"""Prometheus metrics of a Fleet (prometheus_client), what operators of vLLM, Ray Serve and
Triton scrape: served on a loopback port by the inference server (its `metrics` section).

One source of truth: the counters and gauges are read at scrape time from what the core
(ServingStats), the Runner (engine time, backlog integrals) and the Fleet (per-protocol and
per-robot refusals) already count for /diagnostics; nothing is counted twice. The
histograms need every event, which those keep only as recent samples: they are observed by a
batch listener of the Fleet (under its lock, once per completed batch), from the same
replies the core counts as served. core/ does not import this module.

docs/metrics.md lists every metric; docs/grafana/robotserve.json is a dashboard over them.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Optional

# Seconds: a light fleet's round is ms, an overloaded one's tens of seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ROBOT_BUCKETS = (0.025, 0.1, 0.25, 1.0, 2.5, 10.0)  # fewer per robot: a thousand robots' series
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

# (metric name without _total, help, ServingStats field): the core's counters, as served.
CORE_COUNTERS = (
    ("robotserve_rounds_submitted", "Rounds queued (a re-sent round is not a new one)", "submitted"),
    ("robotserve_rounds_served", "Rounds completed with a chunk for a live task", "completed"),
    ("robotserve_rounds_dispatched", "Rounds handed to an engine (a requeued round again)", "dispatched"),
    ("robotserve_batches", "Batches dispatched", "batches"),
    ("robotserve_rounds_requeued", "Rounds put back in the queue after their batch failed", "requeued"),
    ("robotserve_rounds_superseded", "Queued rounds replaced by their robot's newer round", "superseded"),
    ("robotserve_replies_dropped", "Chunks generated for a task dropped meanwhile", "dropped_replies"),
    ("robotserve_rounds_given_up", "Rounds lost: answered with an error after failing max_attempts batches", "given_up"),
    ("robotserve_resent_requests", "Requests for a round still queued or generating (attached, not run twice)",
     "resent_requests"),
    ("robotserve_replies_replayed", "Requests for a round already served, answered from the reply cache",
     "replies_replayed"),
)


# The front end's own counters (the inference server's node_counts: nodes/server_diagnostics.py).
TASKS_ENDED, PROGRESS_REFUSED = "robotserve_tasks_ended", "robotserve_progress_refused"


def robot_label(robot: str) -> str:
    """A robot's label as /diagnostics keys its wait ratio (serve/stats.py)."""
    return (robot or "").lstrip("/") or "(anonymous)"


def _prom():
    """prometheus_client, imported when metrics are served (setup.py declares it)."""
    try:
        import prometheus_client
    except ImportError as e:  # pragma: no cover - an install without it
        raise ValueError("metrics", "needs prometheus_client (pip install prometheus-client), or port -1") from e
    return prometheus_client


class _Families:
    """The metric families of one scrape."""

    def __init__(self) -> None:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self.kinds = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily}
        self.out: list = []

    def add(self, kind: str, name: str, doc: str, value=None, labels=(), rows=()) -> None:
        fam = self.kinds[kind](name, doc, value=value, labels=labels or None)
        for key, v in rows:
            fam.add_metric(list(key), v)
        self.out.append(fam)

    def counter(self, *a, **kw) -> None:
        self.add("counter", *a, **kw)

    def gauge(self, *a, **kw) -> None:
        self.add("gauge", *a, **kw)


class FleetCollector:
    """The counters and gauges of one fleet, read under its lock at every scrape.
    node_counts: more counters of the front end, () -> {name: (help, {labels tuple: value}, label names)}."""

    def __init__(self, fleet, node_counts: Optional[Callable[[], dict]] = None) -> None:
        self.fleet, self.node_counts = fleet, node_counts

    def describe(self):
        return []  # no fixed description: families are built at collect time

    def collect(self):
        fams = _Families()
        with self.fleet.lock:
            self._core(fams)
            self._load(fams)
            self._robots(fams)
        for name, (doc, rows, labels) in (self.node_counts() if self.node_counts else {}).items():
            fams.counter(name, doc, labels=labels, rows=sorted(rows.items()))
        return fams.out

    def _core(self, fams: _Families) -> None:
        f, s = self.fleet, self.fleet.core.stats
        for name, doc, attr in CORE_COUNTERS:
            fams.counter(name, doc, getattr(s, attr))
        fams.counter("robotserve_refusals", "Requests refused, by reason (the error code sent back)", labels=("reason",),
                     rows=[((k,), v) for k, v in sorted(s.errors.items())])
        fams.counter("robotserve_observation_refreshes", "Stale observations refreshed at dispatch, by outcome",
                     labels=("outcome",), rows=[(("ok",), s.refreshes), (("failed",), s.refresh_failures),
                                                (("skipped",), s.refresh_skipped)])
        fams.counter("robotserve_protocol_requests", "Requests per client protocol, by outcome (and refusal reason)",
                     labels=("protocol", "outcome", "reason"), rows=_protocol_rows(f.counts))
        per_robot: dict = {}  # kind -> Counter of label tuples ('/r1' and 'r1' are one robot)
        for (rb, what), v in f.robot_counts.items():
            kind, _, code = what.partition(":")
            per_robot.setdefault(kind, Counter())[(robot_label(rb), code) if code else (robot_label(rb),)] += v
        fams.counter("robotserve_robot_refusals", "Per robot: requests refused, by reason", labels=("robot", "reason"),
                     rows=sorted(per_robot.get("refused", {}).items()))
        for kind, name, doc in (("resent", "robotserve_robot_resent_requests", "Per robot: requests for a round still "
                                 "queued or generating"),
                                ("replayed", "robotserve_robot_replies_replayed", "Per robot: requests answered from "
                                 "the reply cache"),
                                ("given_up", "robotserve_robot_rounds_given_up", "Per robot: rounds lost after "
                                 "max_attempts failed batches")):
            fams.counter(name, doc, labels=("robot",), rows=sorted(per_robot.get(kind, {}).items()))

    def _load(self, fams: _Families) -> None:
        f, core, r = self.fleet, self.fleet.core, self.fleet._runner
        r.account()  # the backlog integrals up to now
        tiers = [t.name for t in core.tiers]  # every tier's series from the start, 0 until it counts

        def per_tier(counts) -> list:
            return [((t,), counts.get(t, 0)) for t in tiers]

        fams.counter("robotserve_engine_busy_seconds", "Engine time per tier (slot-seconds inside engine.infer)",
                     labels=("tier",), rows=per_tier(r.busy_s))
        fams.counter("robotserve_engine_failures", "Batches a tier failed (requeued)", labels=("tier",),
                     rows=per_tier(r.failures))
        fams.counter("robotserve_backlogged_seconds", "Time more rounds waited than one full batch of every slot",
                     r.backlogged_s)
        fams.counter("robotserve_engine_busy_while_backlogged_seconds", "Engine slot-seconds while backlogged, per tier",
                     labels=("tier",), rows=per_tier(r.busy_backlogged_s))
        fams.counter("robotserve_late_replies_discarded", "Engine replies for batches requeued meanwhile", r.late_replies)
        fams.gauge("robotserve_queue_length", "Rounds queued now", len(core.pending))
        fams.gauge("robotserve_batches_in_flight", "Batches generating now", len(core.inflight))
        fams.gauge("robotserve_tasks", "Tasks known to the ledger now", len(core.ledger.tasks))
        fams.gauge("robotserve_waiting_calls", "Calls waiting for their round's reply now", f.waiting())
        fams.gauge("robotserve_engine_slots_running", "Tier slots inside engine.infer now", labels=("tier",),
                   rows=per_tier(r.running))
        fams.gauge("robotserve_refresh_success_ratio", "Recent share of refreshes answered in time",
                   core.refresh_gate.success)

    def _robots(self, fams: _Families) -> None:
        core = self.fleet.core
        waits = _robot_waits(core.ledger, self.fleet, core.clock.now())
        fams.gauge("robotserve_robot_wait_ratio", "Per robot: time waiting for chunks over its task's lifetime "
                   "(Kairos Eq. 1; the largest of its live tasks)", labels=("robot",),
                   rows=[((k,), v[0]) for k, v in sorted(waits.items())])
        fams.gauge("robotserve_robot_wait_seconds", "Per robot: seconds its live tasks spent idle, waiting for chunks",
                   labels=("robot",), rows=[((k,), v[1]) for k, v in sorted(waits.items())])


def _protocol_rows(counts) -> list:
    rows = []
    for proto, c in sorted(counts.items()):
        for key, v in sorted(c.items()):
            outcome, _, reason = key.partition(":")
            rows.append(((proto, outcome, reason), v))
    return rows


def _robot_waits(ledger, fleet, now: float) -> dict:
    """robot label -> (largest wait ratio of its live tasks, their summed wait seconds)."""
    out: dict = {}
    for t in ledger.tasks:
        key = robot_label(fleet.robot_of(t))
        ratio, secs = out.get(key, (0.0, 0.0))
        out[key] = (max(ratio, ledger.wait_ratio(t, now)), secs + ledger.total_wait(t, now))
    return out


class BatchFeed:
    """The histograms, observed once per completed batch (a Fleet batch listener, under its
    lock), on the core's clock: from the replies the core counts as served."""

    def __init__(self, fleet, registry, per_robot: bool = True) -> None:
        from prometheus_client import Counter as PromCounter, Histogram

        self.fleet, self.per_robot = fleet, per_robot
        h = lambda name, doc, buckets, labels=(): Histogram(name, doc, labels, registry=registry, buckets=buckets)  # noqa: E731
        self.latency = h("robotserve_round_latency_seconds", "A round from queued to its chunk ready "
                         "(the core's clock; requeues included)", LATENCY_BUCKETS)
        self.queue_wait = h("robotserve_queue_wait_seconds", "A served round's wait from queued to its "
                            "(last) dispatch", LATENCY_BUCKETS)
        self.staleness = h("robotserve_observation_age_seconds", "Age of the observation a chunk was "
                           "generated from, when the chunk was ready", LATENCY_BUCKETS)
        self.batch = h("robotserve_batch_size", "Rounds per completed batch", BATCH_BUCKETS)
        self.robot_latency = h("robotserve_robot_round_latency_seconds", "Per robot: a round from queued to its "
                               "chunk ready", ROBOT_BUCKETS, ("robot",)) if per_robot else None
        self.robot_served = PromCounter("robotserve_robot_rounds_served", "Per robot: rounds served with a chunk",
                                    ("robot",), registry=registry) if per_robot else None

    def __call__(self, replies, d, results) -> None:
        self.batch.observe(len(d.requests))
        by_key = {(p.task_id, p.request.round_id): p for p in d.requests}
        for r in replies:
            p = by_key.get((r.task_id, r.round_id))
            if p is None:
                continue
            lat = max(0.0, r.generated_at - p.arrival)
            self.latency.observe(lat)
            self.queue_wait.observe(max(0.0, d.started - p.arrival))
            if p.request.obs_stamp is not None:
                self.staleness.observe(max(0.0, r.generated_at - p.request.obs_stamp))
            if self.per_robot:
                robot = robot_label(self.fleet.robot_of(r.task_id))
                self.robot_latency.labels(robot).observe(lat)
                self.robot_served.labels(robot).inc()


class MetricsServer:
    """A fleet's metrics on http://address:port/metrics (a daemon thread of prometheus_client).
    port 0: a free port, read back from `.port`."""

    def __init__(self, fleet, port: int = 0, address: str = "127.0.0.1", per_robot: bool = True,
                 node_counts: Optional[Callable[[], dict]] = None) -> None:
        prom = _prom()
        prom.disable_created_metrics()  # no *_created series: half the per-robot series, nothing lost
        self.registry = prom.CollectorRegistry(auto_describe=False)
        self.registry.register(FleetCollector(fleet, node_counts))
        self.feed = BatchFeed(fleet, self.registry, per_robot)
        self.fleet = fleet
        try:
            self._httpd, self._thread = prom.start_http_server(port, addr=address, registry=self.registry)
        except OSError as e:  # the port taken, an address not of this host
            raise ValueError("metrics.port", f"cannot listen on {address}:{port}: {e.strerror or e}") from e
        fleet.batch_listeners.append(self.feed)
        self.address, self.port, self._closed = address, self._httpd.server_port, False

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/metrics"

    def text(self) -> str:
        """The exposition a scrape gets (tests, the bench)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self.fleet.lock:
            if self.feed in self.fleet.batch_listeners:
                self.fleet.batch_listeners.remove(self.feed)
        self._httpd.shutdown()
        self._httpd.server_close()


def parse(text: str) -> dict:
    """A scrape as {(sample name, ((label, value), ...)): value} (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}
