"""core/robot_timing.py: when a robot re-sends or gives up an unanswered round."""
from robotserve_ros.core.robot_timing import unanswered_action


def test_resend_interval_doubles_per_resend_and_is_capped():
    # first send at 0, resend_after 2 s: re-sent at > 2 s, then > 4 s after that, > 8 s, then every > 16 s (cap 8x)
    assert unanswered_action(1.9, 0.0, 0.0, 2.0, 60.0, resends=0) is None
    assert unanswered_action(2.1, 0.0, 0.0, 2.0, 60.0, resends=0) == "resend"
    assert unanswered_action(2.1 + 3.9, 2.1, 0.0, 2.0, 60.0, resends=1) is None
    assert unanswered_action(2.1 + 4.1, 2.1, 0.0, 2.0, 60.0, resends=1) == "resend"
    assert unanswered_action(10.0 + 15.9, 10.0, 0.0, 2.0, 60.0, resends=5) is None
    assert unanswered_action(10.0 + 16.1, 10.0, 0.0, 2.0, 60.0, resends=5) == "resend"


def test_overdue_counts_from_the_first_send_is_said_once_and_the_round_is_never_given_up():
    assert unanswered_action(30.1, 29.0, 0.0, 2.0, 30.0, resends=3) == "overdue"
    assert unanswered_action(29.9, 29.0, 0.0, 2.0, 30.0, resends=3) is None
    assert unanswered_action(30.1, 29.0, 0.0, 2.0, 30.0, resends=3, overdue_told=True) is None
    # long past the timeout, the round still goes again at its (capped) interval
    assert unanswered_action(300.0, 283.0, 0.0, 2.0, 30.0, resends=9, overdue_told=True) == "resend"


def test_open_round_counts_resends_and_says_overdue_once():
    from robotserve_ros.core.robot_timing import OpenRound

    r = OpenRound()
    r.sent(0.0)
    assert r.check(1.0, 2.0, 30.0) is None
    assert r.check(2.1, 2.0, 30.0) == "resend" and r.resending
    r.sent(2.1)  # the re-send: first send kept, interval doubles
    assert (r.first_sent_at, r.resends, r.resending) == (0.0, 1, False)
    assert r.check(6.0, 2.0, 30.0) is None and r.check(6.2, 2.0, 30.0) == "resend"
    r.sent(6.2)
    assert r.check(14.3, 2.0, 30.0) == "resend"
    r.sent(14.3)  # next re-send due after 16 s (capped 8x)
    assert r.check(30.2, 2.0, 30.0) == "overdue" and r.check(30.25, 2.0, 30.0) is None
    r.resending = False
    r.sent(40.0)  # a new round starts afresh
    assert (r.first_sent_at, r.resends, r.overdue_told) == (40.0, 0, False)
