"""Idle-GPU culling benchmark: trainhub's policy vs jupyterhub-idle-culler at Zero-to-JupyterHub defaults.

One command::

    .venv/bin/python benchmarks/culler_bench.py            # 40 users x 7 days, seeds 1-5
    .venv/bin/python benchmarks/culler_bench.py --quick    # 12 users x 3 days (a few seconds)

A seeded simulator writes a 5-minute-resolution trace of notebook sessions (who holds a
GPU server, GPU utilisation, kernel execution, kernel output, user interaction, whether a
JupyterLab tab is open on an awake machine) and replays the same trace through

* trainhub: ``CullPolicy.evaluate`` and ``UtilizationHistory`` imported from
  ``trainhub.services.culler.policy`` (the code the service runs, not a copy), with the
  service's warn-then-act bookkeeping; checked every 5 minutes;
* the activity culler: jupyterhub-idle-culler's rule (cull when the hub's last_activity is
  ``--timeout`` old, checked every ``--cull-every``), Z2JH defaults 3600 s / 600 s.

What feeds the hub's last_activity (jupyter-server 2.x + JupyterLab 4 + configurable-http-proxy):
user requests; kernel output (every iopub message updates the kernel's last_activity); and
any traffic through the proxy. A JupyterLab tab with a notebook open keeps that traffic
going even when hidden: jupyter-server pings the kernel websocket every 30 s, the browser
answers, and the proxy counts it (plus a few polls a minute). tests/culler/
test_culler_presence.py measures this on the real stack. So the activity culler sees a
server as active while a tab is open on an awake machine, and idle once the browser is
closed or the machine sleeps. trainhub sees the same tab as an open kernel connection.
Training started from a terminal (`nohup python train.py &`) produces none of these once
the browser is closed.

The bound is every idle GPU-hour of the trace: what any policy could reclaim. Target, on every
seed 1-5 (the default): trainhub reclaims >= 90 % of the bound with 0 wrongful culls and <= 0.5
quick reversals (released, GPU asked back within 30 min) per user per workday; exit status 0 when
every seed passes, 1 otherwise. Printed per seed: the bound, trainhub's and the activity culler's
share of it, wrongful culls, busy GPU-hours killed and quick returns; each release's charged cost
and what is not charged; the frontier of the policies tried, the ceiling of clocks chosen
knowing the week in advance, and the foresight rows: what a policy that knows when every user
comes back could take (the bound also counts GPU-idle time while the user works in the
notebook, which no release takes without a quick reversal).

Reported: idle GPU-hours reclaimed (GPU-hours the server would have held with every device
under the threshold and no kernel executing, that the culled server did not hold), wrongful
culls (a cull while a kernel was executing or a GPU was busy) and the busy GPU-hours they
killed. Parameters and their defaults are documented in docs/culler.md.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from trainhub.profiles import Profile
from trainhub.services.culler.habits import IdleGapLog
from trainhub.services.culler.policy import NONE, WARN, CullPolicy, ServerInfo, UtilizationHistory

STEP = 300  # seconds per slot
SLOTS_PER_DAY = 86400 // STEP
T0 = datetime(2026, 11, 16, tzinfo=timezone.utc)  # a Monday
THRESHOLD = 10.0


@dataclass
class Params:
    users: int = 40
    days: int = 7
    seed: int = 1
    p_two_gpus: float = 0.3  # share of users on the 2-GPU profile
    p_leave_running: float = 0.65  # server left running at the end of a workday (else the user stops it)
    p_overnight_run: float = 0.2  # a long training run started when leaving
    p_terminal_run: float = 0.3  # ... launched from a terminal (nohup), not from the notebook kernel
    p_silent: float = 0.4  # a notebook training run prints only every 60-120 min (else every few seconds)
    tab_open_day: tuple = (0.5, 0.95)  # per-user range: P(a JupyterLab tab open, machine awake) in an idle or training block
    p_always_on: float = 0.35  # per user: the machine stays awake with JupyterLab open overnight (desktop, docked laptop)
    p_weekend_session: float = 0.15  # per user and weekend day
    block_mix: tuple = (0.40, 0.20, 0.40)  # coding / training in the notebook / idle at desk (reading, meetings)


@dataclass
class Trace:
    """Per-slot ground truth for one user's GPU server (as if no culler ran)."""

    user: str
    gpus: int
    held: list = field(default_factory=list)  # server holds its GPUs
    start: list = field(default_factory=list)  # server (re)started in this slot
    util: list = field(default_factory=list)  # max utilisation over its devices, %
    busy: list = field(default_factory=list)  # a kernel is executing
    output: list = field(default_factory=list)  # kernel produced output (iopub)
    interact: list = field(default_factory=list)  # the user is working in the notebook
    tab_open: list = field(default_factory=list)  # a JupyterLab tab with a notebook is open on an awake machine

    def working(self, t) -> bool:
        return self.busy[t] or self.util[t] >= THRESHOLD


def make_trace(name: str, p: Params, rng: random.Random) -> Trace:
    n = p.days * SLOTS_PER_DAY
    tr = Trace(name, 2 if rng.random() < p.p_two_gpus else 1)
    for attr in ("held", "start", "busy", "output", "interact", "tab_open"):
        setattr(tr, attr, [False] * n)
    tr.util = [0.0] * n
    open_day = rng.uniform(*p.tab_open_day)
    open_night = rng.random() < p.p_always_on
    running = False

    def slots(minutes_lo, minutes_hi):
        return max(1, int(rng.uniform(minutes_lo, minutes_hi) * 60 // STEP))

    def training(t, length, *, notebook, silent, tab_open, watch=0.1):
        every = slots(60, 120) if silent else 1
        for k in range(t, min(t + length, n)):
            tr.held[k] = True
            tr.util[k] = rng.uniform(70, 99) if rng.random() > 0.05 else rng.uniform(0, 9)  # eval/checkpoint dips
            tr.busy[k] = notebook
            tr.output[k] = notebook and ((k - t) % every == 0)
            tr.tab_open[k] = tab_open
            glance = rng.random()  # drawn either way, so traces differ only in presence across scenarios
            tr.interact[k] = tab_open and glance < watch
        tr.interact[t] = True  # the user started it

    def session(t, end):
        nonlocal running
        if not running:
            tr.start[t] = running = True
        while t < end:
            kind = rng.choices(("code", "train", "idle"), p.block_mix)[0]
            if kind == "code":
                length = slots(20, 90)
                for k in range(t, min(t + length, end)):
                    tr.held[k] = tr.tab_open[k] = True
                    tr.interact[k] = rng.random() < 0.8
                    if tr.interact[k] and rng.random() < 0.3:  # a quick GPU cell
                        tr.util[k] = rng.uniform(20, 90)
                        tr.busy[k] = tr.output[k] = True
                    tr.output[k] = tr.output[k] or tr.interact[k]  # cells run, results printed
            elif kind == "train":
                length = slots(60, 300)
                training(t, min(length, end - t), notebook=True, silent=rng.random() < p.p_silent,
                         tab_open=rng.random() < open_day)
            else:
                length = slots(30, 150)
                tab_open = rng.random() < open_day
                for k in range(t, min(t + length, end)):
                    tr.held[k] = True
                    tr.tab_open[k] = tab_open
            t += length
        return t

    for day in range(p.days):
        base = day * SLOTS_PER_DAY
        weekend = day % 7 >= 5
        t_end = base + SLOTS_PER_DAY
        if weekend:
            if rng.random() < p.p_weekend_session:
                arrive = base + int(rng.uniform(10, 15) * 3600 // STEP)
                leave = arrive + slots(90, 240)
            else:
                arrive = leave = None
        else:
            arrive = base + int(rng.gauss(9, 0.75) * 3600 // STEP)
            leave = base + int(rng.gauss(18, 1.0) * 3600 // STEP)
        t = base
        if arrive is not None:
            # before arrival: whatever was left from the night (running idle or a run finishing)
            for k in range(t, arrive):
                if running and not tr.held[k]:
                    tr.held[k] = True
                    tr.tab_open[k] = open_night
            t = session(arrive, leave)
            # evening: an overnight run, leave it running idle, or stop it
            if rng.random() < p.p_overnight_run and t < t_end:
                terminal = rng.random() < p.p_terminal_run
                training(t, slots(240, 840), notebook=not terminal, silent=terminal or rng.random() < p.p_silent,
                         tab_open=open_night)
                running = True
            else:
                running = rng.random() < p.p_leave_running  # else the user stops the server
        # the rest of the day (and nights, weekends): a server left running holds its GPUs idle
        for k in range(t, t_end):
            if running and not tr.held[k]:
                tr.held[k] = True
                tr.tab_open[k] = open_night
    # a held slot without a server start before it is impossible: mark the first of each run
    for k in range(n):
        if tr.held[k] and (k == 0 or not tr.held[k - 1]):
            tr.start[k] = True
    return tr


@dataclass
class Result:
    name: str
    culls: int = 0
    wrongful: int = 0
    idle_gpu_h_reclaimed: float = 0.0
    busy_gpu_h_killed: float = 0.0
    restarts_within_30m: int = 0  # quick reversals: released, then the GPU asked back within 30 min
    returns: int = 0  # releases after which the user came back to the server (and asked for a GPU again)
    gpu_wait_h: float = 0.0  # user-hours waiting for a free GPU on return (the pool model; filled by run())


class Replay:
    """Walk one trace slot by slot; the subclass decides when to cull."""

    name = "?"

    def __init__(self, tr: Trace):
        self.tr = tr
        self.result = Result(self.name)
        self.holding = [False] * len(tr.held)  # the server holds its GPUs under this culler
        self.return_slots: list[int] = []  # slots where the user, back after a cull, asks for a GPU again

    def run(self) -> Result:
        tr, r = self.tr, self.result
        culled_at = None  # slot of the cull while the GPUs stay free
        for t in range(len(tr.held)):
            if culled_at is not None:
                # the user gets a GPU server again when they come back (or the server restarts)
                if not tr.held[t] or tr.interact[t] or tr.start[t]:
                    if tr.held[t] and t - culled_at <= 30 * 60 // STEP:
                        r.restarts_within_30m += 1
                    if tr.held[t]:
                        r.returns += 1
                        self.return_slots.append(t)
                        self.returned(t, t - culled_at)
                    culled_at = None
                    if tr.held[t]:
                        self.reset(t)
                else:
                    if tr.working(t):
                        r.busy_gpu_h_killed += tr.gpus * STEP / 3600
                    else:
                        r.idle_gpu_h_reclaimed += tr.gpus * STEP / 3600
                    continue
            if not tr.held[t]:
                continue
            self.holding[t] = True
            if tr.start[t]:
                self.reset(t)
            if self.observe(t):
                r.culls += 1
                if tr.working(t):
                    r.wrongful += 1
                    r.busy_gpu_h_killed += tr.gpus * STEP / 3600
                else:
                    r.idle_gpu_h_reclaimed += tr.gpus * STEP / 3600
                culled_at = t
        return r

    def reset(self, t):
        raise NotImplementedError

    def returned(self, t, after_slots):
        """The user asked for a GPU again in slot t, ``after_slots`` after the cull."""

    def observe(self, t) -> bool:
        """Take in slot t; True = cull now."""
        raise NotImplementedError


class ActivityCuller(Replay):
    """jupyterhub-idle-culler: cull when now - last_activity >= timeout, checked every cull_every."""

    name = "jupyterhub-idle-culler"

    def __init__(self, tr, timeout=3600, cull_every=600):
        super().__init__(tr)
        self.timeout_slots = timeout // STEP
        self.every = max(1, cull_every // STEP)

    def reset(self, t):
        self.last_activity = t  # the server's start counts as activity

    def observe(self, t):
        tr = self.tr
        if tr.interact[t] or tr.tab_open[t] or tr.output[t]:  # requests, websocket pings, kernel output
            self.last_activity = t
        return t % self.every == 0 and t - self.last_activity >= self.timeout_slots


class TrainhubCuller(Replay):
    """trainhub's CullPolicy, as the service drives it (warn, then act after warning_period)."""

    name = "trainhub"

    def __init__(self, tr, policy: CullPolicy, habits: IdleGapLog | None = None):
        super().__init__(tr)
        self.policy = policy
        self.profile = Profile(slug=f"gpu-{tr.gpus}", display_name="", gpus=tr.gpus)
        self.history = None
        # the service's history of each user's idle gaps, fed with the same decisions it would audit
        self.habits = habits if habits is not None else IdleGapLog()

    @staticmethod
    def at(t) -> datetime:
        return T0 + timedelta(seconds=t * STEP)

    def reset(self, t):
        self.history = UtilizationHistory(retention=6 * 3600)
        self.held_since = self.last_seen = self.at(t)
        self.warned_at = None
        self.last_kernel_activity = None
        self.external_use_at = None

    def observe(self, t):
        tr, now = self.tr, self.at(t)
        self.history.record(0, now.timestamp(), tr.util[t])
        if tr.output[t] or tr.interact[t]:
            self.last_kernel_activity = now
        if tr.tab_open[t] or tr.interact[t] or tr.output[t]:
            self.last_seen = now  # the service: a kernel connection seen, or the server's own last_activity
        if tr.util[t] >= self.policy.utilization_threshold and not tr.busy[t]:
            self.external_use_at = now  # the service: a busy GPU sample while no kernel executes
        info = ServerInfo(
            user=tr.user, profile=self.profile, devices=(0,), held_since=self.held_since,
            kernels_busy=tr.busy[t], last_activity=self.last_kernel_activity, running_jobs=0, warned_at=self.warned_at,
            connections=int(tr.tab_open[t]), last_seen=self.last_seen, external_use_at=self.external_use_at,
            habits=self.habits.habits(tr.user, now.timestamp()) if self.policy.learn_release_clock else None,
        )
        d = self.policy.evaluate(info, self.history, now)
        self.habits.observe_row({"at": now, "user": tr.user, "server": "", "action": d.action, "reason": d.reason,
                                 "measurements": d.measurements, "acted": d.acts})
        if d.action == WARN:
            self.warned_at = now
        elif d.action == NONE and not d.warning_pending:
            self.warned_at = None
        return d.acts

    def returned(self, t, after_slots):
        # the audit row of the user's "get a GPU again" (its wait for a GPU is not part of the gap)
        self.habits.observe_row({"at": self.at(t), "user": self.tr.user, "server": "", "action": "regain",
                                 "reason": "", "measurements": {"seconds": 0}, "acted": True})


def baseline_idle_gpu_h(traces) -> tuple[float, float]:
    held = sum(tr.gpus for tr in traces for t in range(len(tr.held)) if tr.held[t]) * STEP / 3600
    idle = sum(tr.gpus for tr in traces for t in range(len(tr.held)) if tr.held[t] and not tr.working(t)) * STEP / 3600
    return held, idle


@dataclass
class Costs:
    """What a release costs the user when they come back, charged by the replay (the culler's price)."""

    move_s: float = 60.0  # the move back onto a GPU (snapshot, stop, start, restore): the user waits for it
    unpicklable: float = 0.25  # share of released sessions holding state a snapshot cannot keep (open files, generators, data loaders)
    rebuild_min: float = 10.0  # minutes of work to rebuild that state (re-run the cells that made it)
    pool_headroom: float = 0.10  # the GPU pool: the trace's peak of GPUs at work at once, plus this share


NOT_CHARGED = ("the warning's interruption and the user's context switch; a snapshot that fails outright; "
               "slower CPU work while released; the release move itself (the user is away); a wait's knock-on "
               "on other users (the pool is replayed once: waiting users do not delay each other); fresh server "
               "starts that find the pool full (only returns after a release wait); the GPUs the culler frees "
               "for others (the benefit side)")

FIXED_CLOCKS = (5, 10, 15, 30, 60)  # minutes: the fixed release clocks of the frontier (the old default: 5, no grace)
PRICES = (0.5, 2)  # hours: the prices of a quick reversal tried beside the default's (CullPolicy.reversal_price)
DEFAULT = "priced 1 h (default)"


def frontier_policies() -> dict:
    """The policies of the frontier: fixed clocks (the pre-issue-35 policy, release_timeout varied), the learned clock
    with a per-user reversal budget (the first learned default, with its 15-min grace and 30-min new-user clock), and
    the priced learned clock at a few prices (the default: the policy's own defaults)."""
    fixed = {f"fixed {m} min": {"learn_release_clock": False, "start_grace_period": 0, "release_timeout": 60.0 * m}
             for m in FIXED_CLOCKS}
    budget = {"learned budget 0.3/day": {"reversal_price": 0, "max_reversals_per_day": 0.3, "start_grace_period": 900,
                                         "new_user_release_timeout": 1800}}
    priced = {f"priced {h:g} h": {"reversal_price": 3600.0 * h} for h in PRICES}
    return {**fixed, **budget, **priced, DEFAULT: {}}


def idle_gaps(tr: Trace) -> list[tuple[int, bool, bool]]:
    """The trace's idle runs as a clock sees them: (length in slots, nobody connected at its start, ended by the user's
    return). A run starts at the first quiet held slot (no GPU work, kernel output or interaction) and ends at the next
    slot that is not quiet, a server start or the server's end."""
    out, start, away = [], None, False
    for t in range(len(tr.held) + 1):
        quiet = t < len(tr.held) and tr.held[t] and not (tr.working(t) or tr.output[t] or tr.interact[t] or tr.start[t])
        if quiet and start is None:
            start, away = t, not tr.tab_open[t]
        elif not quiet and start is not None:
            out.append((t - start, away, t < len(tr.held) and tr.held[t] and not tr.start[t]))
            start = None
    return out


CEILING_PRICES = (0.25, 0.5, 1, 2)  # hours per quick reversal


def ceiling(traces, p: Params, idle_gpu_h: float) -> list[tuple[float, float, float]]:
    """What any clock chosen per user and situation (somebody connected or not) could do on this trace if it knew the
    whole week in advance: for each price (hours per quick reversal), every (user, situation) gets the clock of 5-90 min
    that pays best on its own gaps of the week. (price, share of the bound, reversals per user per workday). Releases
    at the clock with no warning, grace or external-use floor: an upper bound for the learned clocks, not a policy."""
    window = 30 * 60 // STEP
    rows = []
    for price in CEILING_PRICES:
        reclaimed = reversals = 0.0
        for tr in traces:
            for away in (False, True):
                gaps = [(n, back) for n, a, back in idle_gaps(tr) if a == away]
                best = None
                for c in range(1, 90 * 60 // STEP + 1):
                    rec = sum(max(0, n - c + 1) for n, _ in gaps) * STEP / 3600
                    rev = sum(1 for n, back in gaps if back and c <= n < c + window)
                    if best is None or rec - price * rev > best[0]:
                        best = (rec - price * rev, rec, rev)
                reclaimed += tr.gpus * best[1]
                reversals += best[2]
        rows.append((price, reclaimed / idle_gpu_h, reversals / p.users / workdays(p)))
    return rows


def return_stretches(tr: Trace) -> list[tuple[int, bool]]:
    """What a release can take at best between two of the user's return events (an interaction, a server start, the
    server's end: the replay's "back"): ``(slots, quick)`` for the idle slots after the stretch's last GPU work (a
    release before it would kill work), ``quick`` when even a release at the first of them is asked back within 30 min.
    Releasing later in a stretch only takes less and makes a quick reversal likelier, so this is each stretch's best."""
    n, window, out = len(tr.held), 30 * 60 // STEP, []
    first = last_work = None
    for t in range(n + 1):
        back = t == n or not tr.held[t] or tr.interact[t] or tr.start[t]
        if back and first is not None:
            release = first if last_work is None else last_work + 1
            if t > release:
                out.append((t - release, t < n and tr.held[t] and t - release <= window))
            first = None
        if t < n and tr.held[t]:
            if first is None:
                first, last_work = t, None
            if tr.working(t):
                last_work = t
    return out


def foresight(traces, p: Params, idle_gpu_h: float) -> list[tuple[str, float, float]]:
    """Upper bounds no policy can pass, from policies that know when every user comes back (not policies):
    - releasing at the best slot of every stretch between returns, with 0 quick reversals and with the target's
      budget of them spent on the largest stretches that would reverse (the most any policy can reclaim there);
    - releasing only after 5 or 10 min of quiet (no work, output or interaction), as any policy that waits to see
      a gap must, in every gap that will not reverse and, within the same budget, the largest that will.
    ``(label, share of the bound, quick reversals per user per workday)``."""
    window, budget = 30 * 60 // STEP, int(TARGET_REVERSALS * p.users * workdays(p))

    def best(options) -> tuple[float, float]:  # (GPU-h, quick) per release: all that do not reverse, then the budget
        free = sum(h for h, quick in options if not quick)
        spent = sorted((h for h, quick in options if quick), reverse=True)[:budget]
        return (free + sum(spent)) / idle_gpu_h, len(spent) / p.users / workdays(p)

    stretches = [(tr.gpus * slots * STEP / 3600, quick) for tr in traces for slots, quick in return_stretches(tr)]
    rows = [("foresight, 0 reversals", sum(h for h, quick in stretches if not quick) / idle_gpu_h, 0.0),
            ("foresight, best moment", *best(stretches))]
    for quiet in (1, 2):
        gaps = [(tr.gpus * (n - quiet + 1) * STEP / 3600, back and n - quiet + 1 <= window)
                for tr in traces for n, _, back in idle_gaps(tr) if n >= quiet]
        rows.append((f"foresight, {quiet * STEP // 60} min quiet", *best(gaps)))
    return rows


def workdays(p: Params) -> int:
    return sum(1 for d in range(p.days) if d % 7 < 5) or 1


def pool_size(traces, costs: Costs) -> int:
    working = [sum(tr.gpus for tr in traces if tr.held[t] and tr.working(t)) for t in range(len(traces[0].held))]
    return max(1, int(max(working) * (1 + costs.pool_headroom) + 0.999))


def charge(replays, pool: int) -> float:
    """User-hours waiting for a free GPU on return: the pool holds ``pool`` GPUs; the others' holdings under the same
    culler occupy it; a returning user waits until enough are free."""
    n = len(replays[0].holding)
    occ = [0] * n
    for rp in replays:
        for t in range(n):
            if rp.holding[t]:
                occ[t] += rp.tr.gpus
    wait_h = 0.0
    for rp in replays:
        g = rp.tr.gpus
        waited_total = 0
        for t in rp.return_slots:
            w = t
            while w < n and occ[w] - (g if rp.holding[w] else 0) + g > pool:
                w += 1
            waited_total += w - t
        rp.result.gpu_wait_h = waited_total * STEP / 3600
        wait_h += rp.result.gpu_wait_h
    return wait_h


def total(rs) -> Result:
    return Result(
        rs[0].name,
        culls=sum(r.culls for r in rs), wrongful=sum(r.wrongful for r in rs),
        idle_gpu_h_reclaimed=sum(r.idle_gpu_h_reclaimed for r in rs),
        busy_gpu_h_killed=sum(r.busy_gpu_h_killed for r in rs),
        restarts_within_30m=sum(r.restarts_within_30m for r in rs),
        returns=sum(r.returns for r in rs), gpu_wait_h=sum(r.gpu_wait_h for r in rs),
    )


def run(p: Params, timeout=3600, cull_every=600, policy_kw=None, *, frontier=False, costs: Costs | None = None) -> dict:
    costs = costs or Costs()
    rng = random.Random(p.seed)
    traces = [make_trace(f"user{i:02d}", p, rng) for i in range(p.users)]
    pool = pool_size(traces, costs)

    def trainhub(kw):
        policy = CullPolicy(cpu_profile="cpu", max_sample_gap=2 * STEP, **kw)
        habits = IdleGapLog()  # one platform: one history for all its users
        replays = [TrainhubCuller(tr, policy, habits) for tr in traces]
        for rp in replays:
            rp.run()
        charge(replays, pool)
        return total([rp.result for rp in replays])

    activity = [ActivityCuller(tr, timeout, cull_every) for tr in traces]
    for rp in activity:
        rp.run()
    charge(activity, pool)
    held, idle = baseline_idle_gpu_h(traces)
    out = {"held_gpu_h": held, "idle_gpu_h": idle, "pool": pool, "users": p.users, "workdays": workdays(p),
           "costs": costs, "trainhub": trainhub(policy_kw or {}), "activity": total([rp.result for rp in activity])}
    if frontier:
        out["frontier"] = {name: trainhub({**(policy_kw or {}), **kw}) for name, kw in frontier_policies().items()}
        out["ceiling"] = ceiling(traces, p, idle)
        out["foresight"] = foresight(traces, p, idle)
    return out


def per_user_day(out: dict, n: float) -> float:
    return n / out["users"] / out["workdays"]


def charged_h(out: dict, r: Result) -> dict:
    """The user-hours a culler's releases cost: the move back, the wait for a GPU, the state rebuilt."""
    c = out["costs"]
    return {"restart": r.returns * c.move_s / 3600, "wait": r.gpu_wait_h,
            "lost state": r.returns * c.unpicklable * c.rebuild_min / 60}


def cost_table(out: dict, rows: dict) -> str:
    c = out["costs"]
    lines = [f"charged per release the user comes back to: the move back {c.move_s:g} s; the wait for a GPU "
             f"(pool {out['pool']} GPUs = peak at work x {1 + c.pool_headroom:g}); "
             f"{100 * c.unpicklable:g} % of sessions lose state a snapshot cannot keep, {c.rebuild_min:g} min to rebuild",
             f"{'policy':<24} {'% of bound':>10} {'releases':>9} {'reversals':>10} {'wrongful':>9} "
             f"{'restart h':>10} {'GPU wait h':>11} {'lost state h':>13} {'user-h/user/wd':>15}",
             f"{'':<24} {'':>10} {'/user/wd':>9} {'/user/wd':>10}"]
    for name, r in rows.items():
        ch = charged_h(out, r)
        lines.append(f"{name:<24} {100 * r.idle_gpu_h_reclaimed / out['idle_gpu_h']:>9.1f}% "
                     f"{per_user_day(out, r.culls):>9.2f} {per_user_day(out, r.restarts_within_30m):>10.2f} "
                     f"{r.wrongful:>9} {ch['restart']:>10.1f} {ch['wait']:>11.1f} {ch['lost state']:>13.1f} "
                     f"{per_user_day(out, sum(ch.values())):>15.2f}")
    lines.append("not charged: " + NOT_CHARGED)
    return "\n".join(lines)


def table(out: dict, p: Params, timeout, cull_every, policy: CullPolicy) -> str:
    rt = policy.release_timeout if policy.releases_keep_variables else 0
    rule = (f"the best paid over their past at {policy.reversal_price / 3600:g} h per quick reversal" if policy.reversal_price
            else f"<= {policy.max_reversals_per_day:g} reversals/day in their past")
    learned = (f"each user's own clock from {rt / 60:g} to {policy.learned_clock_max / 60:g} min learned from their idle gaps "
               f"({rule}; new users {policy.new_user_release_timeout / 60:g} min)"
               if policy.learn_release_clock else f"{rt / 60:g} min idle")
    grace = f", none in a server's first {policy.start_grace_period / 60:g} min" if policy.start_grace_period else ""
    clock = (f"release (keeps variables) after {learned} (warning {policy.release_warning_period / 60:g} min{grace}; "
             f"{policy.external_use_timeout / 60:g} min after GPU use outside the kernels), " if rt else "")
    lines = [
        f"trace: {p.users} users x {p.days} days, seed {p.seed}, 5-min slots; GPU-hours held {out['held_gpu_h']:.0f}, "
        f"of which idle (all devices < {THRESHOLD:g}%, no kernel executing) {out['idle_gpu_h']:.0f}",
        f"trainhub: {clock}profile timeout {policy.default_timeout / 3600:g} h (nobody connected: "
        f"{policy.away_timeout / 3600:g} h), warning {policy.warning_period / 60:g} min, "
        f"threshold {policy.utilization_threshold:g}%, checked every 5 min | "
        f"activity culler: timeout {timeout} s, every {cull_every} s",
        "",
        f"{'policy':<24} {'culls':>6} {'idle GPU-h reclaimed':>21} {'% of bound':>11} {'wrongful culls':>15} "
        f"{'busy GPU-h killed':>18} {'back <30 min':>13}",
    ]
    for key in ("trainhub", "activity"):
        r = out[key]
        lines.append(
            f"{r.name:<24} {r.culls:>6} {r.idle_gpu_h_reclaimed:>21.1f} {100 * share(out, key):>10.1f}% {r.wrongful:>15} "
            f"{r.busy_gpu_h_killed:>18.1f} {r.restarts_within_30m:>13}"
        )
    a = out["activity"].idle_gpu_h_reclaimed
    ratio = out["trainhub"].idle_gpu_h_reclaimed / a if a else float("inf")
    bound = out["idle_gpu_h"] / a if a else float("inf")
    lines += ["", f"bound (every idle GPU-hour of the trace, what any policy could reclaim): {out['idle_gpu_h']:.1f} GPU-h "
              f"= {bound:.2f}x the activity culler",
              f"ratio (trainhub / activity culler, idle GPU-hours reclaimed): {ratio:.2f}x", ""]
    rows = {"trainhub": out["trainhub"], "jupyterhub-idle-culler": out["activity"]}
    if "frontier" in out:
        rows = {**out["frontier"], "jupyterhub-idle-culler": out["activity"]}
    lines.append(cost_table(out, rows))
    if "ceiling" in out:
        lines.append(CEILING_NOTE + ": " + "; ".join(f"{price:g} h per reversal: {100 * sh:.1f}% at {rev:.2f}"
                                                     for price, sh, rev in out["ceiling"]))
    if "foresight" in out:
        lines.append(FORESIGHT_NOTE + ": " + "; ".join(f"{label.removeprefix('foresight, ')}: {100 * sh:.1f}% at {rev:.2f}"
                                                       for label, sh, rev in out["foresight"]))
    return "\n".join(lines)


CEILING_NOTE = ("ceiling (a clock per user and situation chosen knowing the whole week, no warning or grace; "
                "% of bound at reversals/user/wd)")
FORESIGHT_NOTE = ("foresight (knows when every user comes back: what no policy can pass; the bound also counts "
                  "GPU-idle time while the user works in the notebook; % of bound at reversals/user/wd)")


def share(out: dict, key: str) -> float:
    """The part of the bound (every idle GPU-hour of the trace) that ``key`` reclaimed."""
    return out[key].idle_gpu_h_reclaimed / out["idle_gpu_h"] if out["idle_gpu_h"] else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="12 users x 3 days")
    ap.add_argument("--users", type=int)
    ap.add_argument("--days", type=int)
    ap.add_argument("--seeds", type=int, nargs="+", default=list(TARGET_SEEDS),
                    help="trace seeds; the target must hold on each (default 1 2 3 4 5)")
    ap.add_argument("--seed", type=int, help="one seed only (same as --seeds N)")
    ap.add_argument("--timeout", type=int, default=3600, help="activity culler timeout (Z2JH default 3600 s)")
    ap.add_argument("--cull-every", type=int, default=600, help="activity culler interval (Z2JH default 600 s)")
    ap.add_argument("--gpu-timeout", type=float, help="trainhub CullPolicy.default_timeout (s; default: the policy's)")
    ap.add_argument("--away-timeout", type=float, help="trainhub CullPolicy.away_timeout (s; 0 = off; default: the policy's)")
    ap.add_argument("--release-timeout", type=float,
                    help="trainhub CullPolicy.release_timeout (s; 0 = off; default: the policy's)")
    ap.add_argument("--release-warning-period", type=float, help="trainhub CullPolicy.release_warning_period (s)")
    ap.add_argument("--max-reversals-per-day", type=float, help="trainhub CullPolicy.max_reversals_per_day")
    ap.add_argument("--reversal-price", type=float, help="trainhub CullPolicy.reversal_price (s; 0 = the per-user budget)")
    ap.add_argument("--fixed-clock", action="store_true", help="trainhub with learn_release_clock off (release_timeout for all)")
    ap.add_argument("--external-use-timeout", type=float, help="trainhub CullPolicy.external_use_timeout (s; 0 = off)")
    ap.add_argument("--tab-open-day", type=float, nargs=2, metavar=("LO", "HI"),
                    help="per-user range of P(JupyterLab tab open on an awake machine) in a daytime block, default 0.5 0.95")
    ap.add_argument("--always-on", type=float,
                    help="share of users whose machine stays awake with JupyterLab open overnight (0.35)")
    ap.add_argument("--no-frontier", action="store_true", help="only the shipped policy, not the fixed clocks beside it")
    ap.add_argument("--move-s", type=float, default=Costs.move_s, help="seconds of the move back onto a GPU (60)")
    ap.add_argument("--unpicklable", type=float, default=Costs.unpicklable,
                    help="share of released sessions whose state a snapshot cannot keep (0.25)")
    ap.add_argument("--rebuild-min", type=float, default=Costs.rebuild_min, help="minutes to rebuild that state (10)")
    ap.add_argument("--pool-headroom", type=float, default=Costs.pool_headroom,
                    help="GPU pool = peak GPUs at work at once x (1 + this) (0.1)")
    ap.add_argument("--sensitivity", action="store_true", help="also vary how often tabs stay open (low, default, high)")
    args = ap.parse_args(argv)

    p = Params(users=12, days=3) if args.quick else Params()
    if args.users:
        p.users = args.users
    if args.days:
        p.days = args.days
    if args.tab_open_day:
        p.tab_open_day = tuple(args.tab_open_day)
    if args.always_on is not None:
        p.p_always_on = args.always_on
    seeds = [args.seed] if args.seed is not None else args.seeds

    # only what is given on the command line: otherwise the policy's own (shipped) defaults
    policy_kw = {k: v for k, v in {
        "default_timeout": args.gpu_timeout, "away_timeout": args.away_timeout,
        "release_timeout": args.release_timeout, "release_warning_period": args.release_warning_period,
        "external_use_timeout": args.external_use_timeout, "max_reversals_per_day": args.max_reversals_per_day,
        "reversal_price": args.reversal_price,
        "learn_release_clock": False if args.fixed_clock else None,
    }.items() if v is not None}
    policy = CullPolicy(cpu_profile="cpu", **policy_kw)
    costs = Costs(args.move_s, args.unpicklable, args.rebuild_min, args.pool_headroom)
    t0 = time.perf_counter()
    outs = {}
    for seed in seeds:
        p.seed = seed
        outs[seed] = run(p, args.timeout, args.cull_every, policy_kw, frontier=not args.no_frontier, costs=costs)
        print(table(outs[seed], p, args.timeout, args.cull_every, policy))
        print()
    if not args.no_frontier:
        print(frontier_table(outs))
    print(f"({time.perf_counter() - t0:.1f} s)")
    if args.sensitivity:
        p.seed = seeds[0]
        print(f"\nsensitivity to how often a JupyterLab tab stays open on an awake machine (seed {p.seed}):")
        print(f"{'tab open by day':>16} {'always on':>10} {'trainhub GPU-h':>15} {'activity GPU-h':>15} {'bound GPU-h':>12} "
              f"{'trainhub %':>11} {'activity %':>11} {'wrongful t/a':>13}")
        for day, night in (((0.2, 0.6), 0.15), ((0.5, 0.95), 0.35), ((0.8, 1.0), 0.6)):
            q = Params(**{**p.__dict__, "tab_open_day": day, "p_always_on": night})
            o = run(q, args.timeout, args.cull_every, policy_kw)
            print(f"{str(day):>16} {night:>10} {o['trainhub'].idle_gpu_h_reclaimed:>15.1f} "
                  f"{o['activity'].idle_gpu_h_reclaimed:>15.1f} {o['idle_gpu_h']:>12.1f} {100 * share(o, 'trainhub'):>10.1f}% "
                  f"{100 * share(o, 'activity'):>10.1f}% {o['trainhub'].wrongful:>6}/{o['activity'].wrongful:<6}")
    return verdict(outs)


TARGET_SHARE = 0.90  # of the bound: every idle GPU-hour of the trace
TARGET_REVERSALS = 0.5  # quick reversals (released, GPU asked back within 30 min) per user per workday, at most
TARGET_SEEDS = (1, 2, 3, 4, 5)


def meets(out: dict, r: Result) -> bool:
    return (r.idle_gpu_h_reclaimed >= TARGET_SHARE * out["idle_gpu_h"] and r.wrongful == 0
            and per_user_day(out, r.restarts_within_30m) <= TARGET_REVERSALS)


def frontier_table(outs: dict) -> str:
    """Per policy tried: the worst seed's share of the bound and reversals per user per workday, and the charged
    user-hours per user per workday; which policies meet the target on every seed."""
    names = list(next(iter(outs.values()))["frontier"])
    lines = [f"frontier over seeds {', '.join(map(str, outs))} (worst seed for each column):",
             f"{'policy':<24} {'% of bound':>10} {'reversals/user/wd':>18} {'charged user-h/user/wd':>23} "
             f"{'wrongful':>9}  target"]
    for name in names:
        rs = [(o, o["frontier"][name]) for o in outs.values()]
        share_min = min(r.idle_gpu_h_reclaimed / o["idle_gpu_h"] for o, r in rs)
        rev_max = max(per_user_day(o, r.restarts_within_30m) for o, r in rs)
        cost_max = max(per_user_day(o, sum(charged_h(o, r).values())) for o, r in rs)
        ok = all(meets(o, r) for o, r in rs)
        lines.append(f"{name:<24} {100 * share_min:>9.1f}% {rev_max:>18.2f} {cost_max:>23.2f} "
                     f"{max(r.wrongful for _, r in rs):>9}  {'meets' if ok else 'misses'}")
    for key, label, note in (("ceiling", lambda price: f"ceiling {price:g} h", "knows the week in advance"),
                             ("foresight", str, "knows every return: no policy passes it")):
        if all(key in o for o in outs.values()):  # bounds, not policies: worst seed of each, no costs charged
            for i, (first, _, _) in enumerate(next(iter(outs.values()))[key]):
                share_min = min(o[key][i][1] for o in outs.values())
                rev_max = max(o[key][i][2] for o in outs.values())
                lines.append(f"{label(first):<24} {100 * share_min:>9.1f}% {rev_max:>18.2f} {'':>23} {'':>9}  ({note})")
    return "\n".join(lines)


def verdict(outs: dict) -> int:
    """Per seed: the bound, each culler's share of it, PASS/FAIL against the target; 0 when every seed passes."""
    print(f"\ntarget: trainhub reclaims >= {100 * TARGET_SHARE:g} % of the bound on every seed, 0 wrongful culls, "
          f"<= {TARGET_REVERSALS:g} quick reversals per user per workday")
    print(f"{'seed':>5} {'bound GPU-h':>12} {'trainhub':>9} {'activity':>9} {'ratio':>7} {'wrongful t/a':>13} "
          f"{'busy GPU-h killed t/a':>22} {'back <30 min t/a':>17} {'reversals/user/wd':>18}  verdict")
    ok_all = True
    for seed, out in outs.items():
        t, a = out["trainhub"], out["activity"]
        ok = meets(out, t)
        ok_all = ok_all and ok
        ratio = t.idle_gpu_h_reclaimed / a.idle_gpu_h_reclaimed if a.idle_gpu_h_reclaimed else float("inf")
        print(f"{seed:>5} {out['idle_gpu_h']:>12.1f} {100 * share(out, 'trainhub'):>8.1f}% {100 * share(out, 'activity'):>8.1f}% "
              f"{ratio:>6.2f}x {t.wrongful:>6}/{a.wrongful:<6} {t.busy_gpu_h_killed:>10.1f}/{a.busy_gpu_h_killed:<11.1f} "
              f"{t.restarts_within_30m:>8}/{a.restarts_within_30m:<8} {per_user_day(out, t.restarts_within_30m):>18.2f}  "
              f"{'PASS' if ok else 'FAIL'}")
    missing = [s for s in TARGET_SEEDS if s not in outs]
    note = f" (seeds {', '.join(map(str, missing))} not run)" if missing else ""
    print(f"target: >= {100 * TARGET_SHARE:g} % of the bound on every seed, 0 wrongful culls, <= {TARGET_REVERSALS:g} "
          f"reversals/user/workday: "
          f"{'PASS' if ok_all else 'FAIL'}{note}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
