"""`robotserve bench fleet-live --metrics-check`: the server's Prometheus endpoint (its
`metrics` section, serve/metrics.py) scraped during a live fleet, its figures checked against
the Runner's own as /diagnostics shows them.

During the window the endpoint is scraped about every `every_s` (it must answer under load,
and its counters must never go down). After the clients stopped, with the server quiet, two
scrapes that agree with each other bracket a /diagnostics message: that message's served,
batches, re-sent, replayed, given-up rounds and refusals by reason must be the scrape's.
"""
from __future__ import annotations

import time
import urllib.request
from typing import Optional

from ..serve.metrics import parse

# scraped sample -> the /diagnostics key of the same count (serve/stats.py load_stats)
PAIRS = {"robotserve_rounds_served_total": "served", "robotserve_batches_total": "batches",
         "robotserve_resent_requests_total": "resent_requests", "robotserve_replies_replayed_total": "replies_replayed",
         "robotserve_rounds_given_up_total": "given_up"}


def scrape(port: int, host: str = "127.0.0.1", timeout_s: float = 5.0) -> dict:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout_s) as r:
        return parse(r.read().decode())


def counts(scraped: dict) -> dict:
    """The figures compared: PAIRS' diagnostics keys and errors/<reason>, from a scrape."""
    out = {PAIRS[n]: int(v) for (n, lab), v in scraped.items() if n in PAIRS and not lab}
    out.update({f"errors/{dict(lab)['reason']}": int(v) for (n, lab), v in scraped.items()
                if n == "robotserve_refusals_total" and v})
    return out


def from_diagnostics(d: dict) -> dict:
    """The same figures from a /diagnostics message (values are strings there)."""
    out = {k: int(float(d[k])) for k in PAIRS.values() if k in d}
    out.update({k: int(float(v)) for k, v in d.items() if k.startswith("errors/") and float(v)})
    return out


class MetricsCheck:
    """Scrapes while the fleet runs (`during`), compares once it is quiet (`final`)."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s, self.next_at = every_s, 0.0
        self.port: Optional[int] = None
        self.scrapes = 0
        self.failures: list = []  # what went wrong, one line each
        self.served_seen: list = []  # robotserve_rounds_served_total per scrape in the window

    def _port(self, diag: dict) -> Optional[int]:
        if self.port is None and diag.get("metrics_port") not in (None, "-1"):
            self.port = int(diag["metrics_port"])
        return self.port

    def during(self, diag: dict) -> None:
        """Call often in the window: one scrape per every_s."""
        now = time.monotonic()
        if now < self.next_at or self._port(diag) is None:
            return
        self.next_at = now + self.every_s
        try:
            served = counts(scrape(self.port)).get("served", 0)
        except OSError as e:
            self.failures.append(f"scrape during the run failed: {e}")
            return
        self.scrapes += 1
        if self.served_seen and served < self.served_seen[-1]:
            self.failures.append(f"rounds served went down between scrapes: {self.served_seen[-1]} -> {served}")
        self.served_seen.append(served)

    def final(self, listener, tries: int = 5) -> dict:
        """Two equal scrapes around a fresh /diagnostics message; that message must agree."""
        if self._port(listener.last) is None:
            self.failures.append("the server showed no metrics_port in /diagnostics (metrics.port -1?)")
            return self.report(None, None)
        before = after = diag = None
        for _ in range(tries):  # a message computed just before the first scrape may lag it: again
            try:
                before = counts(scrape(self.port))
                n = len(listener.series)
                listener.spin(3.0, until=lambda _d: len(listener.series) > n)
                diag = from_diagnostics(listener.last)
                after = counts(scrape(self.port))
            except OSError as e:
                self.failures.append(f"scrape after the run failed: {e}")
                return self.report(None, None)
            if before == after == diag:
                break
        if before != after:
            self.failures.append(f"the server did not settle in {tries} tries: scrapes {before} then {after}")
        elif diag != after:
            diff = {k: (after.get(k), diag.get(k)) for k in set(after) | set(diag) if after.get(k) != diag.get(k)}
            self.failures.append(f"scraped != /diagnostics (scraped, runner): {diff}")
        return self.report(after, diag)

    def report(self, scraped: Optional[dict], runner: Optional[dict]) -> dict:
        if self.scrapes == 0 and not self.failures:
            self.failures.append("no scrape during the run")
        return {"ok": not self.failures, "port": self.port, "scrapes_during_run": self.scrapes,
                "served_by_scrape": self.served_seen, "scraped": scraped, "runner": runner,
                "failures": self.failures}


def verdict(mc: Optional[dict]) -> bool:
    """Print the check's line (and each failure); True when it passed."""
    mc = mc or {"ok": False, "failures": ["no check made"]}
    print(f"metrics check: {'ok' if mc['ok'] else 'FAILED'} ({mc.get('scrapes_during_run', 0)} scrapes during the "
          f"run; at the end {mc.get('scraped')})")
    for f in mc["failures"]:
        print(f"  {f}")
    return bool(mc["ok"])
