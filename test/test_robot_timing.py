"""core/robot_timing.py: when a robot re-sends or gives up an unanswered round."""
import math

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


def test_the_resend_interval_follows_the_measured_queue_wait_rfc6298():
    from robotserve_ros.core.robot_timing import ResendTimer

    t = ResendTimer.for_robot(2.0, 30.0)
    assert t.rto == 2.0  # the first guess until a round is answered
    t.sample(3.0)  # first: SRTT 3, RTTVAR 1.5 -> 3 + 4 x 1.5
    assert t.rto == 9.0
    for _ in range(40):  # a steady queue wait of 3 s: the interval settles just above it
        t.sample(3.0)
    assert 3.0 < t.rto < 3.1
    for _ in range(40):  # a fast server: the floor (a tenth of the first guess) keeps it above a tick
        t.sample(0.01)
    assert t.rto == 0.2
    t.sample(float("nan"))  # (no answer time: nothing learnt)
    assert t.rto == 0.2 and t.samples == 81


def test_a_robot_that_never_resends_stays_so_whatever_it_measures():
    from robotserve_ros.core.robot_timing import ResendTimer

    t = ResendTimer.for_robot(math.inf, 30.0)
    t.sample(1.0)
    assert t.rto == math.inf


def test_a_queued_round_is_not_asked_again_once_the_queue_wait_is_learnt():
    from robotserve_ros.core.robot_timing import OpenRound, ResendTimer

    timer = ResendTimer.for_robot(2.0, 30.0)
    r = OpenRound(timer)
    r.sent(0.0)
    assert r.check(2.1, 99.0, 60.0) == "resend"  # (the timer's interval, not the argument) the guess was short
    r.sent(2.1)
    assert r.check(3.5, 99.0, 60.0) is None  # backed off: 4 s from the re-send
    r.heard_queued()  # the server answered the first call duplicate_request: it was queued
    r.answered(3.5)  # answered 3.5 s after the FIRST send: the queue's wait
    for t0 in (10.0, 20.0, 30.0):  # the next rounds wait as long: none is re-sent
        r = OpenRound(timer)
        r.sent(t0)
        assert all(r.check(t0 + dt, 99.0, 60.0) is None for dt in (1.0, 2.1, 3.0, 3.5))
        r.answered(t0 + 3.5)
    r = OpenRound(timer)
    r.sent(40.0)  # a round whose request or reply was lost: re-sent once the usual wait passed
    assert r.check(40.0 + timer.rto + 0.01, 99.0, 60.0) == "resend" and timer.rto < 7.0


def test_a_lost_round_does_not_teach_the_timer_its_resend_interval_as_a_wait():
    """Karn's rule (RFC 6298 §3) unless the server said the first call got through: a round
    re-sent because its request or reply was lost is answered the interval + a wait after its
    first send, which is not how long the queue makes a round wait."""
    from robotserve_ros.core.robot_loop import RobotLoop

    lp = RobotLoop("r", 30.0, trigger=0, resend_after_s=2.0)
    for k in range(3):  # rounds answered in 75 ms
        lp.sent(k)
        lp.answered(k + 0.075)
    rto = lp.resend_timer.rto
    lp.sent(10.0)  # lost: re-sent at 12.1, answered at once (the server replays its reply)
    assert lp.open_round.check(12.1, 99.0, 60.0) == "resend"
    lp.sent(12.1)
    lp.answered(12.2)
    assert lp.resend_timer.samples == 3 and lp.resend_timer.rto == rto  # not learnt: 2.2 s is no wait
    lp.sent(20.0)  # queued: the re-send finds it there, the server says so
    assert lp.open_round.check(22.1, 99.0, 60.0) == "resend"
    lp.sent(22.1)
    lp.heard_queued()
    lp.answered(23.0)
    assert lp.resend_timer.samples == 4 and lp.resend_timer.rto > rto  # a 3 s wait, learnt


def test_overloaded_refusals_back_off_and_other_errors_do_not():
    from robotserve_ros.core.robot_timing import refusal_backoff

    assert refusal_backoff(0.2, 0) == 0.2
    assert [refusal_backoff(0.2, k) for k in (1, 2, 3)] == [0.4, 0.8, 1.6]
    assert refusal_backoff(0.2, 20) == 30.0


def test_a_robot_loop_asks_an_overloaded_server_less_and_less_often_and_learns_the_wait():
    from robotserve_ros.core.robot_loop import RobotLoop

    lp = RobotLoop("r", 10.0, trigger=0, resend_after_s=2.0, retry_s=0.2)
    lp.sent(0.0)
    lp.refused(0.1, "overloaded")
    lp.sent(lp.retry_at)
    lp.refused(1.0, "overloaded")
    assert abs(lp.retry_at - 1.8) < 1e-9  # 0.2 x 2^2: the second refusal in a row
    lp.sent(2.0)
    lp.refused(2.1, "bad_observation")  # another error: the plain pause again
    assert abs(lp.retry_at - 2.3) < 1e-9
    lp.sent(3.0)
    lp.answered(6.0)  # answered 3 s after its first send: the loop's interval learnt it
    assert lp.resend_timer.samples == 1 and lp.resend_timer.rto > 3.0
    lp.next_task(7.0)
    assert lp.open_round.timer is lp.resend_timer  # kept across tasks


def test_before_its_first_answer_a_robot_waits_as_long_as_the_server_says_its_queue_takes():
    from robotserve_ros.core.robot_timing import OpenRound, QueueHint, ResendTimer

    hint = QueueHint(fresh_s=3.0)
    timer = ResendTimer.for_robot(2.0, 10.0, hint)
    assert timer.interval(0.0) == 2.0  # nothing heard: the first guess
    hint.heard(6.0, 0.5)  # 300 robots started at once: a round sent now waits ~6 s
    r = OpenRound(timer)
    r.sent(1.0)
    assert r.check(3.1, 99.0, 60.0) is None  # not at 2 s
    hint.heard(6.0, 5.0)  # (the server says it again and again)
    assert r.check(7.1, 99.0, 60.0) is None  # nor at 6 s
    assert r.check(7.25, 99.0, 60.0) == "resend"  # 6 s + one control period + 100 ms: lost, asked again
    assert timer.interval(8.5) == 2.0  # the server's word 3.5 s old: not taken
    hint.heard(float("nan"), 9.0)
    hint.heard(-1.0, 9.0)  # (nonsense is not heard)
    assert timer.interval(9.0) == 2.0


def test_a_wait_the_server_announced_is_not_learnt_as_margin_and_a_wait_it_keeps_missing_is():
    from robotserve_ros.core.robot_timing import OpenRound, QueueHint, ResendTimer

    hint = QueueHint(fresh_s=100.0)
    timer = ResendTimer.for_robot(2.0, 10.0, hint)
    hint.heard(6.0, 0.0)  # start-up: 100 robots behind one queue, the server says 6 s
    r = OpenRound(timer)
    r.sent(0.0)
    r.answered(6.3)  # as announced, 0.3 s more
    hint.heard(0.1, 7.0)  # the queue has drained
    # RFC 6298 on the whole 6.3 s would re-send no sooner than 6.3 + 4 x 3.15 = 18.9 s
    assert timer.interval(7.0) < 1.5
    r.sent(7.0)
    assert r.check(8.6, 99.0, 60.0) == "resend"  # lost: asked again within ~1.5 s
    # a server whose word is 2 s short every time: its rounds are not asked for again
    late = ResendTimer.for_robot(2.0, 10.0, hint)
    for k in range(12):
        hint.heard(1.0, 10.0 * k)
        r = OpenRound(late)
        r.sent(10.0 * k)
        r.answered(10.0 * k + 3.0)
    assert late.interval(120.0) > 3.0


def test_resend_due_at_is_when_check_first_says_resend():
    """The time a driver that waits (not ticks) sleeps until: check() says "resend" just after it, not before."""
    from robotserve_ros.core.robot_timing import OpenRound, ResendTimer

    for timer in (None, ResendTimer.for_robot(2.0, 50.0)):
        r = OpenRound(timer)
        r.sent(10.0)
        for _ in range(3):  # each re-send doubles the interval
            due = r.resend_due_at(r.sent_at, 2.0)
            assert r.check(due - 1e-6, 2.0, 30.0) in (None, "overdue")
            assert r.check(due + 1e-6, 2.0, 30.0) == "resend"
            r.sent(due + 1e-6)
