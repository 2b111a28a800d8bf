"""Unit tests: the culler's pure decision logic (parametrized tables, an injected clock)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from trainhub.profiles import Profile
from trainhub.services.culler.policy import CullPolicy, Decision, ServerInfo, UtilizationHistory

T0 = datetime(2026, 11, 21, 8, 0, tzinfo=timezone.utc)
GPU1 = Profile(slug="gpu-1", display_name="1 GPU", gpus=1)
GPU2 = Profile(slug="gpu-2", display_name="2 GPUs", gpus=2)
CPU = Profile(slug="cpu", display_name="CPU", gpus=0)
HOUR, MIN = 3600, 60


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def history(series: dict[int, list[tuple[float, float]]], step: float = 5) -> UtilizationHistory:
    """series: device -> [(until_minute, utilisation), ...] sampled every ``step`` minutes from T0."""
    h = UtilizationHistory(retention=24 * HOUR)
    for dev, segments in series.items():
        t = 0.0
        for end, util in segments:
            while t <= end:
                h.record(dev, at(t).timestamp(), util)
                t += step
    return h


def idle_for(minutes: float, devices=(0,)) -> UtilizationHistory:
    return history({d: [(minutes, 0.0)] for d in devices})


def server(**kw) -> ServerInfo:
    base = dict(user="alice", profile=GPU1, devices=(0,), held_since=T0, kernels_busy=False, running_jobs=0)
    base.update(kw)
    return ServerInfo(**base)


def policy(**kw) -> CullPolicy:
    """The profile-timeout clock: release_timeout off unless a case sets it (release_policy: the defaults)."""
    kw.setdefault("cpu_profile", "cpu")
    kw.setdefault("release_timeout", 0)
    kw.setdefault("start_grace_period", 0)  # the walks start at the server's start; the grace has its own tests
    return CullPolicy(**kw)


def release_policy(**kw) -> CullPolicy:
    """The shipped defaults: a release keeps the variables, so the short release clock applies.

    No first-minutes grace (the walks start at the server's start; the grace has its own tests in
    test_culler_habits.py); ServerInfo without habits: the fixed release_timeout clock."""
    kw.setdefault("cpu_profile", "cpu")
    kw.setdefault("start_grace_period", 0)
    return CullPolicy(**kw)


# (id, server overrides, history, now minute, policy overrides, expected action, reason fragment)
CASES = [
    ("idle under warn point", {}, idle_for(110), 109, {}, "none", "not culled: idle 1h49m of 2h00m under 10% on GPU 0"),
    ("idle reaches warn point", {}, idle_for(115), 111, {}, "warn", "will release in 10m"),
    ("warning says the variables are kept", {}, idle_for(115), 111, {}, "warn",
     "your variables will be kept (picklable values; tensors moved to CPU); open files, generators, locks"),
    ("without snapshots the warning says kernel state is lost", {}, idle_for(115), 111,
     {"release_keeps_variables": False}, "warn", "unsaved kernel state (variables, models in memory) will be lost"),
    ("a stop loses kernel state", {}, idle_for(115), 111, {"action": "stop"}, "warn", "will stop in 10m unless a GPU is "
     "used or you press keep; unsaved kernel state"),
    ("warned, period not over", {"warned_at": at(111)}, idle_for(120), 116, {}, "none", "not culled: warned 5m ago"),
    ("warned, period over: release", {"warned_at": at(111)}, idle_for(125), 121, {}, "release", "idle 2h01m under 10% on GPU 0: releasing"),
    ("stop action", {"warned_at": at(111)}, idle_for(125), 121, {"action": "stop"}, "stop", "stopping"),
    ("release without cpu profile falls back to stop", {"warned_at": at(111)}, idle_for(125), 121,
     {"cpu_profile": ""}, "stop", "no CPU profile"),
    ("stale warning (given before the idle run) warns again", {"warned_at": at(5)},
     history({0: [(30, 90.0), (200, 0.0)]}), 150, {}, "warn", "idle 1h55m"),
    ("two GPUs idle", {"profile": GPU2, "devices": (0, 1), "warned_at": at(111)}, idle_for(125, (0, 1)), 121, {},
     "release", "on GPUs 0,1: releasing"),
    ("GPU busy", {}, history({0: [(200, 83.0)]}), 190, {}, "none", "not culled: GPU busy 83%"),
    ("one of two GPUs busy", {"profile": GPU2, "devices": (0, 1)}, history({0: [(200, 0.0)], 1: [(200, 55.0)]}), 190, {},
     "none", "GPU busy 55% on GPU 1"),
    ("was busy until recently", {}, history({0: [(100, 95.0), (200, 0.0)]}), 190, {}, "none", "idle 1h25m of 2h00m"),
    ("kernel executing", {"kernels_busy": True}, idle_for(300), 290, {}, "none", "not culled: kernel executing"),
    ("kernel state unknown", {"kernels_busy": None}, idle_for(300), 290, {}, "none", "kernel state unknown"),
    ("running jobs depend on it", {"running_jobs": 2}, idle_for(300), 290, {}, "none", "running job(s) depend on it (2)"),
    ("jobs unknown", {"running_jobs": None}, idle_for(300), 290, {}, "none", "running jobs unknown"),
    ("keep pressed restarts the clock", {"kept_at": at(250)}, idle_for(300), 290, {}, "none", "idle 40m of 2h00m"),
    ("kernel activity restarts the clock", {"last_activity": at(280)}, idle_for(300), 290, {}, "none", "idle 10m"),
    ("kernel activity ignored when configured", {"last_activity": at(280)}, idle_for(300), 290,
     {"count_kernel_activity": False}, "warn", "idle 4h50m"),
    ("GPUs taken recently", {"held_since": at(200)}, idle_for(300), 290, {}, "none", "idle 1h30m"),
    ("no GPUs held (CPU server)", {"profile": CPU, "devices": ()}, idle_for(300), 290, {}, "none", "no GPUs held"),
    ("CPU profile ignored even holding a device", {"profile": CPU}, idle_for(300), 290, {}, "none", "profile cpu has no idle timeout"),
    ("per-profile timeout shorter", {"warned_at": at(25)}, idle_for(45), 40, {"profile_timeouts": {"gpu-1": 1800}},
     "release", "idle 40m"),
    ("per-profile timeout: other profile keeps default", {"profile": GPU2, "devices": (0, 1)}, idle_for(45, (0, 1)), 40,
     {"profile_timeouts": {"gpu-1": 1800}}, "none", "idle 40m of 2h00m"),
    ("profile timeout 0 = never", {}, idle_for(600), 590, {"profile_timeouts": {"gpu-1": 0}}, "none", "no idle timeout"),
    ("profile's own idle_timeout", {"profile": replace(GPU1, idle_timeout=3600)}, idle_for(65), 55, {}, "warn", "idle 55m"),
    ("default timeout 0 = never", {}, idle_for(600), 590, {"default_timeout": 0}, "none", "no idle timeout"),
    ("unknown profile uses default", {"profile": None}, idle_for(125), 115, {}, "warn", "idle 1h55m"),
    ("pending server", {"pending": "stop"}, idle_for(300), 290, {}, "none", "server pending stop"),
    ("no samples", {}, UtilizationHistory(), 290, {}, "none", "no recent GPU metrics for GPU 0"),
    ("samples stale", {}, idle_for(100), 290, {}, "none", "no recent GPU metrics"),
    ("threshold is configurable", {}, history({0: [(200, 15.0)]}), 190, {"utilization_threshold": 20}, "warn", "under 20%"),
    # nobody connected (browser closed, laptop asleep): away_timeout (1 h) from when someone was last seen
    ("away: nobody connected since the GPU went idle", {"connections": 0, "last_seen": at(0)}, idle_for(60), 50, {},
     "warn", "idle 50m under 10% on GPU 0, nobody connected for 50m: will release in 10m"),
    ("away: warned, period over: release", {"connections": 0, "last_seen": at(0), "warned_at": at(50)}, idle_for(65), 60,
     {}, "release", "nobody connected for 1h00m: releasing"),
    ("away: counted from when last seen", {"connections": 0, "last_seen": at(20)}, idle_for(200), 70, {},
     "warn", "idle 50m under 10% on GPU 0, nobody connected for 50m"),
    ("away: last seen recently, GPU timeout is sooner", {"connections": 0, "last_seen": at(100)}, idle_for(200), 111, {},
     "warn", "idle 1h51m under 10% on GPU 0: will release"),
    ("away: a tab still connected (even hidden) = GPU timeout", {"connections": 1, "last_seen": at(0)}, idle_for(60), 55,
     {}, "none", "idle 55m of 2h00m under 10% on GPU 0"),
    ("away: connections unknown = GPU timeout", {"connections": None, "last_seen": at(0)}, idle_for(60), 55, {},
     "none", "idle 55m of 2h00m"),
    ("away: last seen unknown = GPU timeout", {"connections": 0, "last_seen": None}, idle_for(60), 55, {},
     "none", "idle 55m of 2h00m"),
    ("away: off with away_timeout 0", {"connections": 0, "last_seen": at(0)}, idle_for(60), 55, {"away_timeout": 0},
     "none", "idle 55m of 2h00m"),
    ("away: GPU busy is never culled", {"connections": 0, "last_seen": at(0)}, history({0: [(300, 90.0)]}), 290, {},
     "none", "GPU busy 90%"),
    ("away: executing kernel is never culled", {"connections": 0, "last_seen": at(0), "kernels_busy": True},
     idle_for(300), 290, {}, "none", "kernel executing"),
    ("away: untimed profile never culled", {"connections": 0, "last_seen": at(0)}, idle_for(600), 590,
     {"profile_timeouts": {"gpu-1": 0}}, "none", "no idle timeout"),
    ("away: a shorter profile timeout wins", {"connections": 0, "last_seen": at(0)}, idle_for(60), 25,
     {"profile_timeouts": {"gpu-1": 1800}}, "warn", "idle 25m under 10% on GPU 0: will release"),
    ("away: keep restarts the clock", {"connections": 0, "last_seen": at(0), "kept_at": at(40)}, idle_for(60), 55, {},
     "none", "idle 15m of 1h00m"),
]


@pytest.mark.parametrize(
    "server_kw, hist, minute, policy_kw, action, reason",
    [c[1:] for c in CASES], ids=[c[0] for c in CASES],
)
def test_policy_table(server_kw, hist, minute, policy_kw, action, reason):
    d = policy(**policy_kw).evaluate(server(**server_kw), hist, at(minute))
    assert d.action == action, d.reason
    assert reason in d.reason


def test_gap_in_samples_restarts_idle_clock():
    h = UtilizationHistory()
    for m in range(0, 60, 5):
        h.record(0, at(m).timestamp(), 0)
    for m in range(90, 180, 5):  # 35-minute hole (service down), then idle again
        h.record(0, at(m).timestamp(), 0)
    d = policy(max_sample_gap=15 * MIN).evaluate(server(), h, at(175))
    assert d.action == "none" and "idle 1h25m" in d.reason, d.reason
    assert d.measurements["clock_reset_by"] == "GPU idle since"


def test_decision_measurements_carry_the_numbers():
    d = policy().evaluate(server(warned_at=at(111)), idle_for(125), at(121))
    m = d.measurements
    assert m["utilization"] == {"0": 0.0} and m["timeout_s"] == 7200 and m["idle_s"] == pytest.approx(121 * 60)
    assert m["threshold"] == 10 and d.target_profile == "cpu" and d.acts


def test_clock_seam_used_when_no_now_given():
    p = policy(utcnow=lambda: at(111))
    assert p.evaluate(server(), idle_for(115)).action == "warn"


def test_warn_then_act_sequence_never_skips_warning():
    """Walk a server through time the way the service does: warning first, action 10 min later."""
    p = policy()
    h, warned, actions = UtilizationHistory(), None, []
    for minute in range(0, 180, 5):
        h.record(0, at(minute).timestamp(), 0.0)
        d = p.evaluate(server(warned_at=warned), h, at(minute))
        if d.action == "warn":
            warned = at(minute)
        actions.append((minute, d.action))
        if d.acts:
            break
    acted = [(m, a) for m, a in actions if a not in ("none",)]
    assert acted == [(110, "warn"), (120, "release")]


@pytest.mark.parametrize("dry", [True, False])
def test_dry_run(dry):
    d = asyncio.run(policy(dry_run=dry).decide(server(warned_at=at(111)), idle_for(125), at(121)))
    assert d.action == "release" and d.dry_run is dry
    assert d.reason.startswith("dry run: ") is dry


def _veto(server, decision):
    return None


async def _to_stop(server, decision):
    return replace(decision, action="stop", reason=decision.reason + " (hook: stop)")


def _boom(server, decision):
    raise RuntimeError("hook bug")


def _only_oncall(server, decision):
    return None if server.user == "alice" else decision


@pytest.mark.parametrize(
    "hook, action, reason",
    [
        (_veto, "none", "not culled: vetoed by cull_hook"),
        (_to_stop, "stop", "(hook: stop)"),
        (_boom, "none", "cull_hook failed (hook bug)"),
        (_only_oncall, "none", "vetoed"),
        (lambda s, d: "yes", "none", "cull_hook failed"),
    ],
    ids=["veto", "async override", "exception vetoes", "per-user veto", "bad return vetoes"],
)
def test_cull_hook(hook, action, reason):
    d = asyncio.run(policy(cull_hook=hook).decide(server(warned_at=at(111)), idle_for(125), at(121)))
    assert d.action == action and reason in d.reason


def test_hook_not_called_for_none():
    called = []
    p = policy(cull_hook=lambda s, d: called.append(d) or d)
    asyncio.run(p.decide(server(kernels_busy=True), idle_for(300), at(290)))
    assert called == []


def test_hook_also_sees_warnings():
    d = asyncio.run(policy(cull_hook=_veto).decide(server(), idle_for(115), at(111)))
    assert d.action == "none" and "vetoed" in d.reason


def test_threshold_validated():
    with pytest.raises(Exception, match="0-100"):
        CullPolicy(utilization_threshold=150)


def test_timeout_precedence():
    p = policy(default_timeout=7200, profile_timeouts={"gpu-2": 900})
    assert p.timeout_for(GPU1) == 7200
    assert p.timeout_for(GPU2) == 900
    assert p.timeout_for(replace(GPU1, idle_timeout=1800)) == 1800
    assert p.timeout_for(CPU) is None
    assert policy(profile_timeouts={"cpu": 600}).timeout_for(CPU) == 600
    assert p.timeout_for(None) == 7200


def test_skip_labels():
    assert Decision("none", "not culled: GPU busy 83%").skip_reason == "GPU busy"
    assert Decision("none", "dry run: not culled: kernel executing").skip_reason == "kernel executing"


def test_user_back_during_away_warning_withdraws_it():
    """Warned while nobody was connected; a tab reconnects: the GPU timeout applies again, no warning stands."""
    p = policy()
    h = idle_for(70)
    warned = p.evaluate(server(connections=0, last_seen=at(0)), h, at(50))
    assert warned.action == "warn" and warned.measurements["away"] is True
    back = p.evaluate(server(connections=1, last_seen=at(55), warned_at=at(50)), h, at(55))
    assert back.action == "none" and not back.warning_pending, back.reason
    assert "idle 55m of 2h00m" in back.reason
    # gone again: the away clock restarts from when the tab was last seen, so a new warning comes later
    gone = p.evaluate(server(connections=0, last_seen=at(56), warned_at=at(50)), idle_for(120), at(100))
    assert gone.action == "none" and "idle 44m of 1h00m" in gone.reason, gone.reason
    assert p.evaluate(server(connections=0, last_seen=at(56), warned_at=at(50)), idle_for(120), at(106)).action == "warn"


# -- the idle clock shown in the JupyterLab status bar (CullPolicy.clock) ---------------------------

CLOCK_CASES = [
    # (id, server overrides, history, now minute, policy overrides, running, idle since minute, act at minute)
    ("idle 30 min: acts 2 h into the run", {}, idle_for(30), 30, {}, True, 0, 120),
    ("keep restarts the clock", {"kept_at": at(60)}, idle_for(90), 90, {}, True, 60, 180),
    ("warned: acts a warning period after the warning", {"warned_at": at(111)}, idle_for(115), 115, {}, True, 0, 121),
    ("due: acts now", {"warned_at": at(111)}, idle_for(125), 125, {}, True, 0, 125),
    ("warn point reached, not warned yet", {}, idle_for(115), 115, {}, True, 0, 125),
    ("nobody connected: the away timeout", {"connections": 0, "last_seen": at(0)}, idle_for(30), 30, {}, True, 0, 60),
    ("GPU busy: no clock", {}, history({0: [(30, 80.0)]}), 30, {}, False, None, None),
    ("kernel executing: no clock", {"kernels_busy": True}, idle_for(30), 30, {}, False, None, None),
    ("kernel state unknown: no clock", {"kernels_busy": None}, idle_for(30), 30, {}, False, None, None),
    ("profile without timeout: no clock", {"profile": CPU}, idle_for(30), 30, {}, False, None, None),
]


@pytest.mark.parametrize("server_kw,hist,minute,policy_kw,running,since,act", [c[1:] for c in CLOCK_CASES],
                         ids=[c[0] for c in CLOCK_CASES])
def test_clock_table(server_kw, hist, minute, policy_kw, running, since, act):
    c = policy(**policy_kw).clock(server(**server_kw), hist, at(minute))
    assert c["running"] is running, c
    assert c["idle_since"] == (at(since).isoformat() if since is not None else None)
    assert c["act_at"] == (at(act).isoformat() if act is not None else None)
    assert c["reason"] == policy(**policy_kw).evaluate(server(**server_kw), hist, at(minute)).reason


def test_clock_action_and_dry_run_labels():
    assert policy().clock(server(), idle_for(30), at(30))["action"] == "release"
    assert policy(cpu_profile="").clock(server(), idle_for(30), at(30))["action"] == "stop"
    assert policy(action="stop").clock(server(), idle_for(30), at(30))["action"] == "stop"
    assert policy(dry_run=True).clock(server(), idle_for(30), at(30))["dry_run"] is True


def test_clock_predicts_the_action_the_walk_takes():
    """Every pass's act_at (once the clock runs) names the minute the walk then acts at."""
    p = policy()
    h, warned, predicted = UtilizationHistory(), None, set()
    for minute in range(0, 180, 5):
        h.record(0, at(minute).timestamp(), 0.0)
        c = p.clock(server(warned_at=warned), h, at(minute))
        predicted.add(c["act_at"])
        d = p.evaluate(server(warned_at=warned), h, at(minute))
        if d.action == "warn":
            warned = at(minute)
        if d.acts:
            break
    assert predicted == {at(120).isoformat()} and minute == 120


# -- the release clock: a release that keeps the variables comes after release_timeout -------------

RELEASE_CASES = [
    # (id, server overrides, history, now minute, policy overrides, expected action, reason fragment)
    ("first idle pass after a cell: warned at once", {"last_activity": at(100)}, idle_for(100), 100, {}, "warn",
     "idle 0s under 10% on GPU 0: will release in 5m"),
    ("warned, 5 min idle: release", {"last_activity": at(100), "warned_at": at(100)}, idle_for(105), 105, {},
     "release", "idle 5m under 10% on GPU 0: releasing"),
    ("warned, only 4 min idle: not yet", {"last_activity": at(100), "warned_at": at(100)}, idle_for(105), 104, {},
     "none", "release in 1m"),
    ("a cell ran since the warning: the release waits, the warning stands", {"last_activity": at(104),
                                                                            "warned_at": at(100)},
     idle_for(105), 105, {}, "none", "warned 5m ago, idle 1m under 10% on GPU 0; release in 4m"),
    ("a busy GPU never released", {}, history({0: [(100, 90.0)]}), 100, {}, "none", "GPU busy 90%"),
    ("executing kernel never released", {"kernels_busy": True}, idle_for(100), 100, {}, "none", "kernel executing"),
    ("a running job blocks it", {"running_jobs": 1}, idle_for(100), 100, {}, "none", "running job"),
    ("keep restarts the clock", {"kept_at": at(98), "warned_at": at(90)}, idle_for(100), 100, {}, "warn",
     "idle 2m"),
    ("stop loses the kernels' state: the profile timeout", {}, idle_for(100), 100, {"action": "stop"}, "none",
     "idle 1h40m of 2h00m"),
    ("no snapshots: the profile timeout", {}, idle_for(100), 100, {"release_keeps_variables": False}, "none",
     "idle 1h40m of 2h00m"),
    ("no CPU profile (release becomes stop): the profile timeout", {}, idle_for(100), 100, {"cpu_profile": ""},
     "none", "idle 1h40m of 2h00m"),
    ("release_timeout 0: the profile timeout", {}, idle_for(100), 100, {"release_timeout": 0}, "none",
     "idle 1h40m of 2h00m"),
    ("profile without timeout never", {}, idle_for(600), 590, {"profile_timeouts": {"gpu-1": 0}}, "none",
     "no idle timeout"),
    ("a shorter profile timeout wins (with its own warning period)", {"warned_at": at(0)}, idle_for(12), 12,
     {"profile_timeouts": {"gpu-1": 120}}, "release", "idle 12m"),
    ("... and waits out that warning period", {"warned_at": at(0)}, idle_for(12), 5,
     {"profile_timeouts": {"gpu-1": 120}}, "none", "release in 5m"),
    ("GPU used outside the kernels: not after 5 min", {"external_use_at": at(50), "warned_at": at(55)},
     history({0: [(50, 90.0), (100, 0.0)]}), 60, {}, "none", "GPU last used outside the notebooks"),
    ("GPU used outside the kernels: warned at 25 min", {"external_use_at": at(50)},
     history({0: [(50, 90.0), (100, 0.0)]}), 80, {}, "warn", "will release in 5m"),
    ("GPU used outside the kernels: released at 30 min", {"external_use_at": at(50), "warned_at": at(80)},
     history({0: [(50, 90.0), (100, 0.0)]}), 85, {}, "release", "outside the notebooks: releasing"),
    ("a cell ran after the outside use: the 5-min clock", {"external_use_at": at(50), "last_activity": at(52),
                                                           "warned_at": at(55)},
     history({0: [(50, 90.0), (100, 0.0)]}), 60, {}, "release", "idle 5m under 10% on GPU 0: releasing"),
    ("external_use_timeout 0: the 5-min clock", {"external_use_at": at(50), "warned_at": at(55)},
     history({0: [(50, 90.0), (100, 0.0)]}), 60, {"external_use_timeout": 0}, "release", "releasing"),
    ("outside use before the GPUs were taken does not count", {"external_use_at": at(50), "held_since": at(55),
                                                               "warned_at": at(55)},
     history({0: [(50, 90.0), (100, 0.0)]}), 60, {}, "release", "idle 5m"),
]


@pytest.mark.parametrize(
    "server_kw, hist, minute, policy_kw, action, reason",
    [c[1:] for c in RELEASE_CASES], ids=[c[0] for c in RELEASE_CASES],
)
def test_release_clock_table(server_kw, hist, minute, policy_kw, action, reason):
    d = release_policy(**policy_kw).evaluate(server(**server_kw), hist, at(minute))
    assert d.action == action, d.reason
    assert reason in d.reason, d.reason


def walk(timeline, p=None, step=5):
    """Replay a hand-made timeline the way the service does, one pass every ``step`` minutes.

    timeline: minute -> (GPU %, kernel executing, a cell ran or printed in the last pass). Returns the
    (minute, action) of every warn and act, stopping at the first act.
    """
    p = p or release_policy()
    h, warned, activity, external, out = UtilizationHistory(retention=24 * HOUR), None, None, None, []
    for minute in sorted(timeline):
        util, busy, ran = timeline[minute]
        now = at(minute)
        h.record(0, now.timestamp(), util)
        if ran:
            activity = now
        if util >= p.utilization_threshold and not busy:
            external = now
        d = p.evaluate(server(kernels_busy=busy, last_activity=activity, warned_at=warned, external_use_at=external),
                       h, now)
        if d.action == "warn":
            warned = now
        elif d.action == "none" and not d.warning_pending:
            warned = None
        if d.action != "none":
            out.append((minute, d.action))
        if d.acts:
            break
    return out


def timeline(*segments, step=5):
    """segments: (minutes, GPU %, kernel executing, a cell ran on every pass) in order, from minute 0."""
    out, t = {}, 0
    for length, util, busy, ran in segments:
        for _ in range(0, length, step):
            out[t] = (util, busy, ran)
            t += step
    return out


def test_walk_coding_on_the_cpu_keeps_the_gpu_then_reading_releases_it():
    """Cells run on every pass (GPU idle): warned once, never released; then reading: released 5 min after the
    last cell, on the first pass without one."""
    events = walk(timeline((60, 0.0, False, True), (60, 0.0, False, False)))
    assert events == [(0, "warn"), (60, "release")]


def test_walk_notebook_training_with_dips_is_never_released():
    """A training cell executing for hours, with 10-minute evaluation dips: the kernel is busy throughout."""
    segs = [(30, 90.0, True, False), (10, 2.0, True, False)] * 8
    assert walk(timeline(*segs)) == []


def test_walk_terminal_run_with_dips_is_never_released_then_freed_after_30_min():
    """A script from a terminal (kernels idle, GPU busy) pauses 15 min at a time: kept; when it ends, released
    external_use_timeout (30 min) after its last busy sample."""
    segs = [(5, 0.0, False, True)] + [(40, 95.0, False, False), (15, 3.0, False, False)] * 6 + [(120, 0.0, False, False)]
    tl = timeline(*segs)
    events = walk(tl)
    idle_from = max(m for m, (u, _, _) in tl.items() if u >= 10) + 5  # the first idle sample after the run
    # the starting cell (GPU idle) warns at once; the 15-min pauses never reach the 30-min floor
    assert events == [(0, "warn"), (idle_from + 25, "warn"), (idle_from + 30, "release")], events
    # with stop as the action (kernel state lost), the long profile timeout (2 h) applies instead
    assert walk(tl, release_policy(action="stop")) == [(idle_from + 110, "warn"), (idle_from + 120, "stop")]


def test_walk_keep_or_a_gpu_cell_withdraws_the_warning():
    tl = timeline((5, 0.0, False, True), (5, 60.0, True, True), (20, 0.0, False, False))
    # warned at the first idle pass, the GPU cell withdraws it, warned again at the next idle pass, released 5 min on
    assert walk(tl) == [(0, "warn"), (10, "warn"), (15, "release")]
    # a keep restarts the clock and withdraws the warning: the next idle pass warns anew
    d = release_policy().evaluate(server(last_activity=at(0), warned_at=at(0), kept_at=at(3)), idle_for(10), at(5))
    assert d.action == "warn" and "idle 2m" in d.reason, d.reason


def test_clock_on_the_release_clock_predicts_the_release():
    p = release_policy()
    h = idle_for(10)
    c = p.clock(server(last_activity=at(3)), h, at(5))  # not warned yet: a warning period from now
    assert c["running"] and c["timeout_s"] == 300 and c["act_at"] == at(10).isoformat(), c
    c = p.clock(server(last_activity=at(3), warned_at=at(2)), h, at(5))  # warned: 5 min after the last cell
    assert c["act_at"] == at(8).isoformat(), c
    assert p.evaluate(server(last_activity=at(3), warned_at=at(2)), h, at(8)).action == "release"
