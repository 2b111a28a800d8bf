"""When to warn about, stop or release a GPU notebook server: pure logic with a clock seam.

Nothing here talks to the hub, the ledger or a GPU. The service (and the benchmark)
collect the facts into a :class:`ServerInfo`, feed GPU samples into a
:class:`UtilizationHistory`, and ask :meth:`CullPolicy.evaluate` (or the async
:meth:`CullPolicy.decide`, which also runs the admin's ``cull_hook`` and ``dry_run``).

A server is *GPU-idle* when every device it holds stayed under
``utilization_threshold`` for the whole idle timeout, with no gap in the samples
longer than ``max_sample_gap``. The idle clock also restarts at the latest kernel
activity, at a "keep my GPU" press and when the GPUs were taken. While nobody is
connected to the server (no kernel websocket, no API request: the browser was closed or
the laptop went to sleep), the shorter ``away_timeout`` applies. A release that keeps the kernels' variables is cheap
(the notebook goes on, on the CPU, with its variables), so it has its own, much shorter
clock, ``release_timeout``, with ``release_warning_period`` before it; after GPU use by
something other than a notebook kernel (a script from a terminal, which pauses for
evaluation or checkpoints without the kernel knowing) that clock waits at least
``external_use_timeout``. When the service feeds each user's past idle gaps (:class:`~.habits.IdleGapLog`, learned
from the culler's own decisions, which it keeps in the audit trail), the release clock is the user's own
(:func:`~.habits.learned_release_clock`): the clock that would have paid best over that user's past idle gaps, the
idle time it reclaims less ``reversal_price`` for each gap that ended with the user back within
``reversal_window`` of it (:func:`~.habits.priced_clock`); a user with too little history gets
the conservative ``new_user_release_timeout``. Nothing is warned about or acted on in a server's first
``start_grace_period``. An executing kernel,
running jobs that depend on the server, or anything unknown (kernel state, jobs, GPU
samples) means "not culled": the policy only ever errs towards keeping the GPU.
"""

from __future__ import annotations

import inspect
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from traitlets import Bool, Callable, Dict, Enum, Float, Integer, Unicode, validate
from traitlets.config import LoggingConfigurable

from trainhub.fmt import as_utc, fmt_duration
from trainhub.ledger import server_holder
from trainhub.models import utcnow
from trainhub.profiles import Profile

if TYPE_CHECKING:
    from .habits import UserHabits

NONE, WARN, STOP, RELEASE = "none", "warn", "stop", "release"
ACTIONS = (NONE, WARN, STOP, RELEASE)
#: what a release keeps of each notebook kernel (trainhub.kernels.snapshot), in the warning's words
KEPT_SUMMARY = "picklable values; tensors moved to CPU"


def posix_ts(dt: datetime | None) -> float | None:
    """POSIX seconds of a datetime (naive ones are UTC, as SQLite hands them back); None stays None."""
    return None if dt is None else as_utc(dt).timestamp()


def iso_ts(ts: float | None) -> str | None:
    """An epoch time as the culler's APIs and audit rows write it (None stays None)."""
    return None if ts is None else datetime.fromtimestamp(ts, timezone.utc).isoformat()


def _gpus(devices) -> str:
    return ",".join(str(d) for d in devices)


@dataclass(frozen=True)
class ServerInfo:
    """What the service knows about one running server when it asks the policy.

    ``None`` in kernels_busy / running_jobs means "could not find out": never culled.
    last_activity: latest kernel activity (execution or output), not the hub's proxy
    activity (an open browser tab answers websocket pings, so that never goes idle).
    connections: kernel websockets open now (a JupyterLab tab with a notebook, hidden or
    not); None = unknown. last_seen: the latest sign of someone at the server (a connection
    seen, an API request, kernel or terminal activity); None = unknown.
    kept_at: the user's latest "keep my GPU". warned_at: when the pending warning was given.
    external_use_at: the latest GPU sample at or over the threshold taken while none of the
    server's kernels was executing (GPU work outside the notebooks: a terminal, a script); None = none seen.
    habits: the user's past idle gaps (:class:`UserHabits`, from :class:`IdleGapLog`); None = not learned
    (the fixed ``release_timeout`` applies).
    """

    user: str
    server_name: str = ""
    profile: Profile | None = None
    devices: tuple[int, ...] = ()
    held_since: datetime | None = None
    pending: str | None = None
    kernels_busy: bool | None = False
    kernels: int = 0
    last_activity: datetime | None = None
    connections: int | None = None
    last_seen: datetime | None = None
    running_jobs: int | None = 0
    kept_at: datetime | None = None
    warned_at: datetime | None = None
    external_use_at: datetime | None = None
    habits: UserHabits | None = None

    @property
    def holder(self) -> str:
        return server_holder(self.user, self.server_name)

    @property
    def log_name(self) -> str:
        return f"{self.user}/{self.server_name}" if self.server_name else self.user

    def to_dict(self) -> dict:
        d = asdict(replace(self, habits=None))
        d["profile"] = self.profile.slug if self.profile else None
        d["devices"] = list(self.devices)
        d["habits"] = self.habits.summary() if self.habits is not None else None
        for k in ("held_since", "last_activity", "last_seen", "kept_at", "warned_at", "external_use_at"):
            d[k] = d[k].isoformat() if d[k] else None
        return d


@dataclass(frozen=True)
class Decision:
    """What to do with one server and why.

    action: none | warn | stop | release. reason: one line for logs and users, e.g.
    "not culled: GPU busy 83%". measurements: the numbers the reason rests on.
    warning_pending: (action none) a warning stands and the clock runs on.
    target_profile: for release, the CPU profile the server restarts on.
    """

    action: str
    reason: str
    measurements: dict = field(default_factory=dict)
    dry_run: bool = False
    warning_pending: bool = False
    target_profile: str | None = None

    @property
    def acts(self) -> bool:
        """True for stop and release (the server's GPUs go back to the pool)."""
        return self.action in (STOP, RELEASE)

    @property
    def skip_reason(self) -> str:
        """Short label for the skips counter: "GPU busy", "kernel executing", ..."""
        r = self.reason.removeprefix("dry run: ").removeprefix("not culled: ")
        for label in SKIP_LABELS:
            if r.startswith(label):
                return label
        return "other"

    def to_dict(self) -> dict:
        return asdict(self)


SKIP_LABELS = (
    "no GPUs held", "profile", "server pending", "kernel state unknown", "kernel executing",
    "running jobs unknown", "running job", "no recent GPU metrics", "GPU busy", "idle",
    "warned", "vetoed by cull_hook", "cull_hook failed", "grace",
)


class UtilizationHistory:
    """Rolling window of (time, utilisation %) samples per device, kept by the service.

    Times are POSIX seconds. ``retention`` bounds memory; it must exceed the longest
    idle timeout or idleness is only counted from the oldest sample kept (which errs
    towards keeping the GPU).
    """

    def __init__(self, retention: float = 6 * 3600):
        self.retention = retention
        self._samples: dict[int, deque[tuple[float, float]]] = {}

    def record(self, device: int, at: float, utilization: float) -> None:
        q = self._samples.setdefault(device, deque())
        if q and at < q[-1][0]:
            return  # out of order: ignore
        q.append((at, float(utilization)))
        while q and q[0][0] < at - self.retention:
            q.popleft()

    def forget(self, device: int) -> None:
        """Drop a device's history (its holder changed: the new holder starts fresh)."""
        self._samples.pop(device, None)

    def devices(self) -> list[int]:
        return sorted(self._samples)

    def latest(self, device: int) -> tuple[float, float] | None:
        q = self._samples.get(device)
        return q[-1] if q else None

    def idle_since(self, device: int, threshold: float, max_gap: float) -> float | None:
        """Start of the current run of samples under ``threshold`` with no gap over ``max_gap``.

        None when there are no samples or the latest one is at/over the threshold.
        The start is the first idle sample seen (not the last busy one): the conservative side.
        """
        q = self._samples.get(device)
        if not q or q[-1][1] >= threshold:
            return None
        start = q[-1][0]
        for at, util in reversed(q):
            if util >= threshold or start - at > max_gap:
                break
            start = at
        return start


class CullPolicy(LoggingConfigurable):
    """Decides, for one server at a time, between none, warn, stop and release."""

    utilization_threshold = Float(
        10.0,
        help="A device counts as idle while its utilisation is under this many percent (0-100). Default 10.",
    ).tag(config=True)

    default_timeout = Float(
        2 * 3600.0,
        help="""Idle timeout in seconds for GPU profiles that set none (7200 = 2 h).

        Precedence: profile_timeouts[slug], then the profile's own idle_timeout, then this.
        Profiles with gpus=0 are never culled unless profile_timeouts names them. 0 = never cull.
        """,
    ).tag(config=True)

    profile_timeouts = Dict(
        help="""Idle timeout per profile slug in seconds, e.g. {"gpu-1": 7200, "gpu-8": 1800, "gpu-long": 0}.

        0 or None = never cull that profile. Overrides the profile's idle_timeout and default_timeout.
        """,
    ).tag(config=True)

    away_timeout = Float(
        3600.0,
        help="""Idle timeout in seconds while nobody is connected to the server (3600 = 1 h; 0 = off).

        "Nobody connected": no kernel websocket is open (no JupyterLab tab with a notebook,
        visible or hidden, on an awake machine) and no API request, kernel or terminal activity
        for this long. The GPUs must be idle for this long too. Applies only when it acts sooner
        than the profile's timeout, and never to profiles without a timeout. The default matches
        jupyterhub-idle-culler's Z2JH timeout, so an abandoned idle GPU server is released no
        later than that culler would stop it, while a busy one never is.
        """,
    ).tag(config=True)

    warning_period = Float(
        600.0,
        help="""Seconds between the warning and the action (600 = 10 min).

        The warning is given when a server has been idle for (timeout - warning_period); the
        action needs that warning to be at least warning_period old and the server still idle.
        """,
    ).tag(config=True)

    release_timeout = Float(
        300.0,
        help="""Idle timeout in seconds when the action is a release that keeps the kernels' variables
        (300 = 5 min; 0 = off: the profile's timeout applies).

        A release that snapshots the kernels (action "release", a CPU profile, release_keeps_variables)
        costs the user a server restart, not their work: the notebook goes on, on the CPU, with its
        variables. So the GPUs go back after this much GPU idleness with no kernel activity, instead of
        the profile's timeout. Applies only when shorter than the profile's timeout, never to profiles
        without one, and never to a stop (which loses the kernels' state). Everything that stops the
        clock still does: a busy GPU, an executing kernel, running jobs, anything unknown, a keep.
        """,
    ).tag(config=True)

    release_warning_period = Float(
        300.0,
        help="""Seconds between the warning and a release on the release_timeout clock (300 = 5 min).

        With the service's 5-minute passes, a warning period equal to release_timeout means the
        warning stands from the first idle pass and the release comes on the first pass after
        release_timeout: the status bar's countdown and the notification say so.""",
    ).tag(config=True)

    external_use_timeout = Float(
        1800.0,
        help="""Least idle time in seconds before a release on the release_timeout clock when the latest
        GPU use came from outside the notebook kernels (1800 = 30 min; 0 = no such floor).

        A script started from a terminal (nohup python train.py &) uses the GPU with every kernel idle
        and no kernel activity; it pauses for evaluation or checkpoints (a few minutes under the
        threshold) without the kernel knowing, so a 5-minute clock could stop it. GPU use inside a
        kernel is covered by "kernel executing". Never longer than the profile's timeout.""",
    ).tag(config=True)

    learn_release_clock = Bool(
        True,
        help="""Whether the release clock is each user's own, learned from their past idle gaps (the service feeds
        them from its decisions, kept in the audit trail), instead of the fixed release_timeout for everyone.

        The clock is a multiple of learned_clock_step, from release_timeout up to learned_clock_max: the one that
        would have paid best over the user's past idle gaps at reversal_price per release reversed within
        reversal_window (the user back at once), or, with reversal_price 0, the shortest at which those gaps would
        have given at most max_reversals_per_day such reversals per day they used the platform. A user with fewer
        than learned_clock_min_gaps gaps gets new_user_release_timeout. False = release_timeout for everyone.""",
    ).tag(config=True)

    reversal_window = Float(
        1800.0,
        help="""Seconds after a release within which the user's return (a cell, the GPU asked back) counts as
        a quick reversal of it (1800 = 30 min), for the learned release clock.""",
    ).tag(config=True)

    max_reversals_per_day = Float(
        0.3,
        help="""Quick reversals per day a learned release clock may cost a user, judged on their own past idle
        gaps (0.3 = about one release reversed within reversal_window every three days of work; per situation:
        somebody connected, nobody connected). Used when reversal_price is 0. Lower = fewer reversals, GPUs
        held longer.""",
    ).tag(config=True)

    reversal_price = Float(
        3600.0,
        help="""What one quick reversal costs, in seconds of idle GPU time, for the learned release clock (3600 = an
        hour; 0 = off: the per-user budget max_reversals_per_day decides).

        With a price, each user's clock (per situation) is the one that would have paid best over their past idle
        gaps: the idle time a release at that clock reclaims, less this many seconds for each gap the user ended
        within reversal_window after it (a release they would have asked back at once). Higher = fewer reversals,
        GPUs held longer.""",
    ).tag(config=True)

    learned_clock_step = Float(300.0, help="Seconds between the learned release clocks tried (300 = 5 min).").tag(config=True)

    learned_clock_max = Float(
        5400.0,
        help="""Longest learned release clock in seconds (5400 = 90 min), for users whose idle gaps are often
        reversed at any clock. Never longer than the profile's timeout (nor the away_timeout when nobody is connected).""",
    ).tag(config=True)

    learned_clock_min_gaps = Integer(
        8,
        help="""Idle gaps a user needs in their history before their own release clock is used (8; 0 = from the
        first). Gaps in the same situation (somebody connected or nobody) are used when there are this many.""",
    ).tag(config=True)

    new_user_release_timeout = Float(
        900.0,
        help="""Release clock in seconds for a user with too little history for a learned one (900 = 15 min):
        a new user starts conservative. Used only with learn_release_clock and a history fed by the service.""",
    ).tag(config=True)

    start_grace_period = Float(
        300.0,
        help="""Seconds after a server took its GPUs (started, or moved onto GPUs) during which it is never warned
        about, stopped or released (300 = 5 min; 0 = none). A new server's user is reading, opening notebooks
        and loading data: a warning 12 s after the start is noise. The idle clock still counts from the start.""",
    ).tag(config=True)

    action = Enum(
        [RELEASE, STOP],
        default_value=RELEASE,
        help="""What to do with an idle GPU server: "release" restarts it on the CPU-only
        profile (the notebook stays usable, the GPUs go back to the pool), "stop" stops it.
        release falls back to stop when there is no CPU profile.""",
    ).tag(config=True)

    cpu_profile = Unicode(
        "",
        help='Slug of the CPU-only profile used by "release". Empty = ProfileCatalog.cpu() (the service fills it in).',
    ).tag(config=True)

    release_keeps_variables = Bool(
        True,
        help="""Whether a release saves the kernels' variables first (the service sets it from
        GPUCuller.snapshot_on_release); the warning says what will be kept accordingly.""",
    ).tag(config=True)

    dry_run = Bool(
        False, help="Decide, log and audit as usual but never warn users, stop or release anything."
    ).tag(config=True)

    max_sample_gap = Float(
        900.0,
        help="""Longest gap between two GPU samples (seconds) that still counts as continuous idleness.

        A longer gap (the service was down, a metrics read failed) restarts the idle clock;
        a latest sample older than this makes the GPUs "unknown" (not culled). Must exceed
        the service's sample_interval.""",
    ).tag(config=True)

    count_kernel_activity = Bool(
        True,
        help="Restart the idle clock at the latest kernel activity (a cell executed or printed).",
    ).tag(config=True)

    cull_hook = Callable(
        None,
        allow_none=True,
        help="""Admin veto/override, sync or async: hook(server_info, proposed_decision) -> Decision or None.

        Called for every proposed warn, stop or release. Return the decision (or a changed
        one, e.g. dataclasses.replace(d, action="stop")) to go ahead, None to veto. An
        exception vetoes too (and is logged). Example: never touch members of "oncall".
        """,
    ).tag(config=True)

    utcnow = Callable(
        utcnow,
        help="Clock seam: returns the current timezone-aware UTC datetime. Tests move time with it.",
    ).tag(config=True)

    @validate("utilization_threshold")
    def _check_threshold(self, proposal):
        v = proposal["value"]
        if not 0 <= v <= 100:
            raise ValueError(f"utilization_threshold must be 0-100 (percent), not {v}")
        return v

    def kept_text(self) -> str:
        """What the warning says of the kernels' state: exactly what the action keeps."""
        if self.action == RELEASE and self.cpu_profile and self.release_keeps_variables:
            return (f"your variables will be kept ({KEPT_SUMMARY}); open files, generators, locks and other values that "
                    "cannot be pickled will not")
        return "unsaved kernel state (variables, models in memory) will be lost"

    def timeout_for(self, profile: Profile | None) -> float | None:
        """Idle timeout (seconds) for a profile; None = never cull."""
        if profile is not None and profile.slug in self.profile_timeouts:
            t = self.profile_timeouts[profile.slug]
        elif profile is not None and profile.idle_timeout is not None:
            t = profile.idle_timeout
        elif profile is not None and profile.gpus == 0:
            t = None
        else:
            t = self.default_timeout
        return float(t) if t else None

    @property
    def releases_keep_variables(self) -> bool:
        """True when the action is a release that snapshots the kernels (the short clock's condition)."""
        return self.action == RELEASE and bool(self.cpu_profile) and self.release_keeps_variables

    def release_clock(self, server: ServerInfo) -> float | None:
        """The release_timeout clock for ``server`` (seconds), or None when it does not apply.

        At least external_use_timeout while the latest GPU use came from outside the kernels: an
        external use no older than the latest kernel activity, "keep" and the GPUs being taken.
        """
        if not (self.release_timeout and self.releases_keep_variables):
            return None
        timeout = self.learned_clock(server)
        ext = posix_ts(server.external_use_at)
        if ext is not None and self.external_use_timeout:
            later = [posix_ts(x) for x in (server.last_activity if self.count_kernel_activity else None,
                                      server.kept_at, server.held_since) if x is not None]
            if not later or ext >= max(later):
                timeout = max(timeout, self.external_use_timeout)
        return timeout

    def learned_clock(self, server: ServerInfo) -> float:
        """The release clock before the external-use floor: release_timeout, or the user's learned one
        (new_user_release_timeout while their history is too short) when the service feeds ``server.habits``."""
        if not self.learn_release_clock or server.habits is None:
            return self.release_timeout
        away = server.connections == 0
        c = server.habits.clock(away, floor=self.release_timeout, ceiling=max(self.learned_clock_max, self.release_timeout),
                                step=self.learned_clock_step, window=self.reversal_window,
                                max_per_day=self.max_reversals_per_day, min_gaps=self.learned_clock_min_gaps,
                                price=self.reversal_price)
        return max(self.release_timeout, self.new_user_release_timeout if c is None else c)

    # -- decision -----------------------------------------------------------------

    def evaluate(self, server: ServerInfo, history: UtilizationHistory, now: datetime | None = None) -> Decision:
        """The policy's proposal for ``server`` at ``now`` (no hook, no dry run)."""
        now = now or self.utcnow()
        now_ts = now.timestamp()
        thr = self.utilization_threshold
        devices = tuple(server.devices)
        m: dict = {"devices": list(devices), "threshold": thr, "at": now.isoformat()}

        def none(reason, **extra):
            return Decision(NONE, "not culled: " + reason, {**m, **extra})

        if not devices:
            return none("no GPUs held")
        timeout = self.timeout_for(server.profile)
        m["timeout_s"] = timeout
        if not timeout:
            slug = server.profile.slug if server.profile else "?"
            return none(f"profile {slug} has no idle timeout")
        if server.pending:
            return none(f"server pending {server.pending}")

        latest = {d: history.latest(d) for d in devices}
        m["utilization"] = {str(d): (v[1] if v else None) for d, v in latest.items()}
        m["kernels"] = server.kernels
        m["running_jobs"] = server.running_jobs

        if server.kernels_busy is None:
            return none("kernel state unknown (server did not answer)")
        if server.kernels_busy:
            return none("kernel executing")
        if server.running_jobs is None:
            return none("running jobs unknown (jobs service did not answer)")
        if server.running_jobs:
            return none(f"running job(s) depend on it ({server.running_jobs})")

        stale = [d for d, v in latest.items() if v is None or now_ts - v[0] > self.max_sample_gap]
        if stale:
            return none(f"no recent GPU metrics for GPU {_gpus(stale)}")
        busy = {d: v[1] for d, v in latest.items() if v[1] >= thr}
        if busy:
            d, u = max(busy.items(), key=lambda kv: kv[1])
            on = f" on GPU {_gpus(busy)}" if len(devices) > 1 else ""
            return none(f"GPU busy {u:.0f}%{on}")

        # every device is under the threshold now: since when, and what restarted the clock?
        starts = {"GPU idle since": max(history.idle_since(d, thr, self.max_sample_gap) for d in devices)}
        if server.held_since:
            starts["GPUs taken"] = posix_ts(server.held_since)
        if server.kept_at:
            starts["keep pressed"] = posix_ts(server.kept_at)
        if self.count_kernel_activity and server.last_activity:
            starts["kernel activity"] = posix_ts(server.last_activity)
        clock_by, start = max(starts.items(), key=lambda kv: kv[1])
        where = f"under {thr:g}% on GPU{'s' if len(devices) > 1 else ''} {_gpus(devices)}"
        warning_period = self.warning_period
        short = self.release_clock(server)
        if short is not None and short < timeout:
            # a release keeps the variables: the short clock, with its own warning period
            timeout, warning_period = short, self.release_warning_period
            base = self.learned_clock(server)
            m.update(timeout_s=timeout, release_clock=True)
            if server.habits is not None and self.learn_release_clock:
                m.update(learned_clock_s=base, habit_gaps=len(server.habits.gaps))
            if short > base:
                where += ", GPU last used outside the notebooks"
                m["external_use_at"] = iso_ts(posix_ts(server.external_use_at))
        m.update(connections=server.connections, last_seen=iso_ts(posix_ts(server.last_seen)))
        if self.away_timeout and server.connections == 0 and server.last_seen is not None:
            # nobody is there: the shorter timeout, counted from when someone was last seen
            away_start = max(start, posix_ts(server.last_seen))
            if away_start + self.away_timeout < start + timeout:
                if away_start > start:
                    clock_by = "last seen"
                start, timeout = away_start, self.away_timeout
                where += f", nobody connected for {fmt_duration(now_ts - posix_ts(server.last_seen), 'coarse')}"
                m.update(timeout_s=timeout, away=True)
        idle = now_ts - start
        m.update(idle_s=round(idle, 1), idle_since=iso_ts(start), clock_reset_by=clock_by)

        m["warning_period_s"] = warning_period
        warn_after = max(timeout - warning_period, 0.0)
        if idle < warn_after:
            return none(f"idle {fmt_duration(idle, 'coarse')} of {fmt_duration(timeout, 'coarse')} {where}")

        warned = posix_ts(server.warned_at)
        verb = "release" if self.action == RELEASE else "stop"
        # a warning stands until the clock restarts; on the release clock a cell that ran (on the CPU)
        # only postpones the release: the warning of this GPU-idle run stays, so it is not given on every pass
        valid_since = start
        if m.get("release_clock") and clock_by == "kernel activity":
            valid_since = max(v for k, v in starts.items() if k != "kernel activity")
        if warned is None or warned < valid_since:
            held = posix_ts(server.held_since)
            grace_left = (held + self.start_grace_period - now_ts) if (self.start_grace_period and held is not None) else 0
            if grace_left > 0:
                # no warning in a server's first minutes: the clock runs, the warning waits for the grace's end
                act_in = max(timeout - idle, grace_left + warning_period)
                m.update(act_in_s=act_in, grace_s=self.start_grace_period)
                return none(f"grace: GPUs taken {fmt_duration(now_ts - held, 'coarse')} ago, idle "
                            f"{fmt_duration(idle, 'coarse')} {where}; no warning in the first "
                            f"{fmt_duration(self.start_grace_period, 'coarse')}")
            act_in = max(timeout - idle, warning_period)
            m["act_in_s"] = act_in
            return Decision(
                WARN,
                f"idle {fmt_duration(idle, 'coarse')} {where}: will {verb} in {fmt_duration(act_in, 'coarse')} unless a GPU is "
                f"used or you press keep; {self.kept_text()}",
                m,
            )
        m["warned_at"] = iso_ts(warned)
        since_warn = now_ts - warned
        if since_warn < warning_period or idle < timeout:
            act_in = max(warning_period - since_warn, timeout - idle)
            m["act_in_s"] = act_in
            return Decision(
                NONE,
                f"not culled: warned {fmt_duration(since_warn, 'coarse')} ago, idle {fmt_duration(idle, 'coarse')} {where}; "
                f"{verb} in {fmt_duration(act_in, 'coarse')}",
                m,
                warning_pending=True,
            )
        target = self.cpu_profile or None
        if self.action == RELEASE and target:
            return Decision(RELEASE, f"idle {fmt_duration(idle, 'coarse')} {where}: releasing", m, target_profile=target)
        note = "" if self.action == STOP else " (no CPU profile to release to)"
        return Decision(STOP, f"idle {fmt_duration(idle, 'coarse')} {where}: stopping{note}", m)

    def clock(self, server: ServerInfo, history: UtilizationHistory, now: datetime | None = None) -> dict:
        """The idle clock of ``server`` as :meth:`evaluate` sees it at ``now``, for the user's status bar.

        ``running``: every device is under the threshold and nothing stops the clock (a busy GPU or
        kernel, a running job, anything unknown, no timeout), so the server will be acted on at
        ``act_at`` unless something happens. ``act_at`` is when the action can come at the earliest:
        ``timeout`` into the idle run and ``warning_period`` after the warning (due: ``now``).
        """
        now = now or self.utcnow()
        d = self.evaluate(server, history, now)
        m = d.measurements
        running = "idle_s" in m  # set once every check that stops the clock has passed
        out = {
            "running": running, "reason": d.reason, "dry_run": bool(self.dry_run),
            "action": RELEASE if self.action == RELEASE and self.cpu_profile else STOP,
            "timeout_s": m.get("timeout_s"), "idle_since": m.get("idle_since"), "idle_s": m.get("idle_s"),
            "away": bool(m.get("away")), "warned_at": iso_ts(posix_ts(server.warned_at)), "act_at": None,
        }
        if not running:
            return out
        if d.acts:
            act = now.timestamp()
        elif "act_in_s" in m:  # warned, or about to be
            act = now.timestamp() + m["act_in_s"]
        else:  # the warning comes at timeout - warning_period, the action warning_period later
            act = posix_ts(datetime.fromisoformat(m["idle_since"])) + m["timeout_s"]
        out["act_at"] = iso_ts(act)
        return out

    async def decide(self, server: ServerInfo, history: UtilizationHistory, now: datetime | None = None) -> Decision:
        """evaluate(), then the admin's cull_hook (for any action) and dry_run."""
        decision = self.evaluate(server, history, now)
        if decision.action != NONE and self.cull_hook is not None:
            try:
                result = self.cull_hook(server, decision)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as e:
                self.log.exception("cull_hook failed for %s; not culling", server.log_name)
                decision = replace(decision, action=NONE, reason=f"not culled: cull_hook failed ({e})")
            else:
                if result is None:
                    decision = replace(decision, action=NONE, reason=f"not culled: vetoed by cull_hook ({decision.reason})")
                elif not isinstance(result, Decision) or result.action not in ACTIONS:
                    decision = replace(decision, action=NONE, reason=f"not culled: cull_hook failed (returned {result!r})")
                else:
                    decision = result
        if self.dry_run:
            decision = replace(decision, dry_run=True, reason="dry run: " + decision.reason)
        return decision
