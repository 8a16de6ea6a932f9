"""What a light fleet run with fault injection reports (`bench fleet-live --light --fault-drop P`,
live/fault.py; issue 38's targets): the rounds whose request or reply was dropped (lost
rounds), whether each was asked for again and served, how long from the drop to the served
reply against the queue wait the robot expected at the drop + 100 ms, and the re-sends against
the lost rounds + 5 % of all requests."""
from __future__ import annotations

from collections import Counter

from ..live.processes import pct

SLACK_S = 0.1  # the budget: a lost round is served within its expected queue wait + 100 ms
RESEND_SHARE = 0.05  # re-sends beyond the lost rounds: at most 5 % of all requests


def _dist(xs: list) -> dict:
    return {"n": len(xs), "p50": round(pct(xs, 50), 1), "p99": round(pct(xs, 99), 1),
            "max": round(max(xs), 1) if xs else None}


def fault_summary(accounts: list, fault_drop: float, fault_seed: int, requests: int, resent: int) -> dict:
    """`fault_drop`, `lost_rounds` and `fault` (the figures above) from the robots' accounts
    (nodes/client_account.py: each lost round [task, round, kind of the first drop, drop time,
    expected queue wait s, re-send interval s, first re-send time, served time, drops])."""
    dropped, lost = Counter(), []
    for a in accounts:
        dropped.update(a.get("dropped", {}))
        lost += a.get("lost_rounds", [])
    served = [x for x in lost if x[7] is not None]
    resent_lost = [x for x in lost if x[6] is not None]
    budget = {id(x): 1000 * (x[4] + SLACK_S) for x in lost}  # ms, per lost round
    to_served = {id(x): 1000 * (x[7] - x[3]) for x in served}
    by_kind = {kind: _dist([to_served[id(x)] for x in served if x[2] == kind]) for kind in ("request", "reply")}
    over = [to_served[id(x)] - budget[id(x)] for x in served if to_served[id(x)] > budget[id(x)]]
    limit = len(lost) + RESEND_SHARE * requests
    return {
        "fault_drop": fault_drop,
        "fault_seed": fault_seed,
        "lost_rounds": len(lost),
        "fault": {
            "dropped_requests": dropped.get("request", 0),
            "dropped_replies": dropped.get("reply", 0),
            "lost_rounds_by_first_drop": dict(Counter(x[2] for x in lost)),
            "lost_rounds_dropped_again": sum(x[8] > 1 for x in lost),
            "lost_rounds_resent": len(resent_lost),
            "lost_rounds_served": len(served),
            # served without a re-send: the answer to an earlier call of the round came after all
            "lost_rounds_served_without_resend": sum(x[6] is None for x in served),
            "every_lost_round_served": len(served) == len(lost),
            "every_lost_round_resent_and_served": all(x[6] is not None and x[7] is not None for x in lost),
            "lost_rounds_unserved_sample": [x[:2] for x in lost if x[7] is None][:20],
            "budget": f"the queue wait the robot expected at the drop (the server's queue_wait) + {1000 * SLACK_S:g} ms",
            "expected_wait_ms_at_drop": _dist([1000 * x[4] for x in lost]),
            "resend_interval_ms_at_drop": _dist([1000 * x[5] for x in lost]),
            "drop_to_resend_ms": _dist([1000 * (x[6] - x[3]) for x in resent_lost]),
            "drop_to_served_ms": _dist(list(to_served.values())),
            "drop_to_served_ms_by_first_drop": by_kind,
            "served_within_budget": len(served) - len(over),
            "served_over_budget": len(over),
            "over_budget_by_ms": _dist(over),
            "resends_vs_lost_rounds": {"resent_requests": resent, "lost_rounds": len(lost), "requests": requests,
                                       "limit": round(limit, 1), "met": resent <= limit,
                                       "rule": f"re-sends <= lost rounds + {RESEND_SHARE:.0%} of requests"},
            "note": "drops while the fleet runs (none in the settle); each robot's n-th request and the reply "
                    "to it are dropped by a hash of (seed, robot, n) (live/fault.py)",
        },
    }


def fault_lines(res: dict) -> list:
    """The summary lines of a run with fault injection (none without)."""
    f = res.get("fault")
    if not f:
        return []
    rv, ds = f["resends_vs_lost_rounds"], f["drop_to_served_ms"]
    return [f"fault drop {res['fault_drop']:g}: lost rounds {res['lost_rounds']} (requests {f['dropped_requests']}, "
            f"replies {f['dropped_replies']}), re-sent {f['lost_rounds_resent']}, served {f['lost_rounds_served']}; "
            f"drop to served p50 {ds['p50']} ms, p99 {ds['p99']} ms, within expected wait + 100 ms "
            f"{f['served_within_budget']}, over {f['served_over_budget']}; re-sends {rv['resent_requests']} "
            f"<= {rv['limit']}: {rv['met']}"]
