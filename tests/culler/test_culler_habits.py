"""The learned release clock and the first-minutes grace: pure policy tests with the clock seam."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from trainhub.profiles import Profile
from trainhub.services.culler.habits import IdleGap, IdleGapLog, UserHabits, learned_release_clock
from trainhub.services.culler.policy import CullPolicy, ServerInfo, UtilizationHistory

T0 = datetime(2026, 11, 21, 8, 0, tzinfo=timezone.utc)
GPU1 = Profile(slug="gpu-1", display_name="1 GPU", gpus=1)
DAY = 86400.0
KW = dict(floor=300, ceiling=5400, step=300, window=1800, max_per_day=0.3, min_gaps=8)


def at(minute: float) -> datetime:
    return T0 + timedelta(minutes=minute)


def gaps(minutes, away=False, days=5):
    """Gaps of these lengths (minutes), spread over ``days`` days."""
    return [IdleGap(60.0 * m, away=away, ended_at=T0.timestamp() + (i % days) * DAY) for i, m in enumerate(minutes)]


@pytest.mark.parametrize("name, history, away, expected_min", [
    ("too little history: None (the caller's conservative clock)", gaps([5, 10, 200]), False, None),
    ("only long gaps: the floor", gaps([200] * 10), False, 5),
    ("short gaps only: the floor (none outlasts the clock by less than the window)", gaps([5] * 20), False, 5),
    ("many 20-min gaps: a 5-min clock would be reversed daily, so past them", gaps([20] * 10 + [300] * 5), False, 20),
    ("reversal-prone at every clock: the ceiling", gaps([m for m in range(10, 100, 5)] * 3, days=1), False, 90),
    ("a day's worth of reversals is allowed at 0.3/day x 5 days = 1", gaps([20] + [300] * 9), False, 5),
    ("nobody connected: that situation's own gaps", gaps([20] * 10) + gaps([300] * 3, away=True), True, 5),
    ("too few gaps of that situation: all of them", gaps([20] * 10) + gaps([300] * 2, away=True), True, 20),
])
def test_learned_release_clock(name, history, away, expected_min):
    c = learned_release_clock(history, away, **KW)
    assert (None if c is None else c / 60) == expected_min, name


@pytest.mark.parametrize("name, history, expected_min", [
    ("only long gaps: the floor", gaps([200] * 10), 5),
    ("10-min pauses crowd just past a 5-min clock: past them", gaps([10] * 10 + [300] * 5), 10),
    ("mostly long gaps: a few reversals are worth the reclaim (a 0.3/day budget would say 20)",
     gaps([20] * 3 + [300] * 20, days=1), 5),
    ("short gaps only: the floor (nothing to reclaim, nothing reversed)", gaps([5] * 20), 5),
])
def test_priced_release_clock(name, history, expected_min):
    assert learned_release_clock(history, False, **KW, price=3600) / 60 == expected_min, name
    budget = learned_release_clock(history, False, **KW)
    if "budget" in name:
        assert budget / 60 == 20, budget


def test_policy_uses_the_price_when_given():
    h = idle_from(0, 30)
    history = UserHabits(gaps([20] * 3 + [300] * 20, days=1))
    s = server(last_activity=at(0), habits=history)
    priced = policy(start_grace_period=0, reversal_price=3600).evaluate(s, h, at(0))
    budget = policy(start_grace_period=0, reversal_price=0).evaluate(s, h, at(0))
    assert priced.measurements["learned_clock_s"] == 300 and budget.measurements["learned_clock_s"] == 1200


def server(**kw) -> ServerInfo:
    base = dict(user="alice", profile=GPU1, devices=(0,), held_since=T0, kernels_busy=False, running_jobs=0,
                connections=1, last_seen=T0)
    base.update(kw)
    return ServerInfo(**base)


def idle_from(minute: float, to: float) -> UtilizationHistory:
    h = UtilizationHistory()
    m = minute
    while m <= to:
        h.record(0, at(m).timestamp(), 0.0)
        m += 1
    return h


def policy(**kw) -> CullPolicy:
    kw.setdefault("cpu_profile", "cpu")
    return CullPolicy(**kw)


def test_new_user_starts_conservative_then_gets_their_own_clock():
    p = policy(start_grace_period=0)
    h = idle_from(0, 30)
    new = server(last_activity=at(0), habits=UserHabits())
    d = p.evaluate(new, h, at(5))
    assert d.action == "none" and d.measurements["timeout_s"] == 900 and d.measurements["learned_clock_s"] == 900
    assert p.evaluate(new, h, at(10)).action == "warn"  # 15-min clock, 5-min warning
    known = server(last_activity=at(0), habits=UserHabits(gaps([200] * 10)))
    d = p.evaluate(known, h, at(0))
    assert d.action == "warn" and d.measurements["timeout_s"] == 300 and d.measurements["habit_gaps"] == 10
    assert p.evaluate(server(last_activity=at(0), habits=UserHabits(gaps([200] * 10)), warned_at=at(0)), h,
                      at(5)).action == "release"


def test_without_habits_or_learning_the_fixed_clock():
    p = policy(start_grace_period=0)
    h = idle_from(0, 30)
    assert p.evaluate(server(last_activity=at(0)), h, at(0)).measurements["timeout_s"] == 300  # no history fed
    off = policy(start_grace_period=0, learn_release_clock=False)
    assert off.evaluate(server(last_activity=at(0), habits=UserHabits()), h, at(0)).measurements["timeout_s"] == 300


def test_learned_clock_never_exceeds_the_profile_timeout_and_keeps_the_external_use_floor():
    p = policy(start_grace_period=0, new_user_release_timeout=1800, profile_timeouts={"gpu-1": 1200})
    d = p.evaluate(server(last_activity=at(0), habits=UserHabits()), idle_from(0, 30), at(10))
    assert d.measurements["timeout_s"] == 1200 and "release_clock" not in d.measurements  # the profile's own clock
    p = policy(start_grace_period=0)
    hist = UtilizationHistory()
    hist.record(0, at(0).timestamp(), 90.0)
    for m in range(1, 40):
        hist.record(0, at(m).timestamp(), 0.0)
    s = server(external_use_at=at(0), habits=UserHabits(gaps([200] * 10)))
    d = p.evaluate(s, hist, at(10))
    assert d.measurements["timeout_s"] == 1800 and "outside the notebooks" in d.reason


@pytest.mark.parametrize("minute, action, fragment", [
    (0.2, "none", "grace: GPUs taken 12s ago"),  # the new user of the issue: warned 12 s after the start, no more
    (4, "none", "no warning in the first 5m"),
    (5, "warn", "will release in 5m"),
])
def test_no_warning_in_a_servers_first_minutes(minute, action, fragment):
    p = policy(learn_release_clock=False)  # the 5-min clock: without the grace, a warning on the first idle pass
    d = p.evaluate(server(), idle_from(0, 20), at(minute))
    assert d.action == action and fragment in d.reason, d.reason


def test_grace_keeps_the_status_bar_clock_running_and_predicts_the_release():
    p = policy(learn_release_clock=False)
    c = p.clock(server(), idle_from(0, 20), at(1))
    assert c["running"] and c["act_at"] == at(10).isoformat(), c  # warning at 5 min, release 5 min later
    assert policy(learn_release_clock=False, start_grace_period=0).evaluate(server(), idle_from(0, 1), at(0.2)).action == "warn"


def row(minute, action="none", reason="not culled: idle", **m):
    return {"at": at(minute), "user": "alice", "server": "", "action": action, "reason": reason, "measurements": m,
            "acted": action in ("release", "stop", "regain")}


def test_gap_log_learns_gaps_from_decisions():
    log = IdleGapLog()
    # an idle run from minute 0 seen by three passes, ended by a cell at minute 12 (a new idle_since)
    for m in (0, 5, 10):
        log.observe_row(row(m, idle_since=at(0).isoformat(), idle_s=60.0 * m, connections=1))
    log.observe_row(row(15, idle_since=at(12).isoformat(), idle_s=180.0, connections=1))
    # ... then the GPU busy at minute 20 ends the second run
    log.observe_row(row(20, reason="not culled: GPU busy 90%"))
    # a third run, nobody connected, released at 30; the user asks for a GPU again at 50 (restarted 60 s later)
    log.observe_row(row(25, idle_since=at(22).isoformat(), idle_s=180.0, connections=0))
    log.observe_row(row(30, "release", "idle: releasing", idle_since=at(22).isoformat(), idle_s=480.0, connections=0))
    log.observe_row(row(51, "regain", "the user asked for a GPU again", seconds=60))
    h = log.habits("alice")
    assert [(g.length / 60, g.away, g.released) for g in h.gaps] == [(12, False, False), (8, False, False), (28, True, True)]
    assert log.habits("alice") is h  # unchanged: the same object (its clocks memoised)
    assert log.habits("bob").gaps == ()


def test_gap_log_unknown_states_end_nothing_and_a_pass_on_gpus_ends_a_release():
    log = IdleGapLog()
    log.observe_row(row(0, idle_since=at(0).isoformat(), idle_s=0.0, connections=1))
    log.observe_row(row(5, reason="not culled: no recent GPU metrics for GPU 0"))
    log.observe_row(row(10, "release", "releasing", idle_since=at(0).isoformat(), idle_s=600.0, connections=1))
    assert log.habits("alice").gaps == ()
    # no regain row: the server's next pass on GPUs (the next morning) ends the gap
    log.observe_row(row(24 * 60, idle_since=at(24 * 60).isoformat(), idle_s=0.0, connections=1))
    (g,) = log.habits("alice").gaps
    assert g.length == 24 * 3600 and g.released


def test_gap_log_keeps_the_latest_and_drops_old_ones():
    log = IdleGapLog(keep=3, max_age=2 * DAY)
    for i in range(5):
        log.observe_row(row(10 * i, idle_since=at(10 * i).isoformat(), idle_s=0.0))
    assert len(log.habits("alice").gaps) == 3
    log._habits.clear()
    assert log.habits("alice", at(0).timestamp() + 3 * DAY).gaps == ()
