"""What the culler learns of each user: their past idle gaps, and the release clock that would have paid best.

The history is the culler's own decisions, in order (live, or replayed from the audit trail at start), so it needs
nothing the platform does not already keep; the policy (:mod:`.policy`) asks it for a user's clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import datetime

from .policy import NONE, RELEASE, STOP, posix_ts


@dataclass(frozen=True)
class IdleGap:
    """One past run of GPU idleness on a user's server, as the culler's passes saw it.

    length: seconds from the start of the idle run (the idle clock's start) to the user's return (a cell
    ran, the GPU was used, the user asked for a GPU again after a release, the server held GPUs again).
    away: nobody was connected at the run's last pass (the browser closed, the machine asleep).
    released: the run ended in a release (its length then counts to the user's return).
    ended_at: when it ended (the days a user used the platform are the dates their gaps ended on).
    """

    length: float
    away: bool = False
    released: bool = False
    ended_at: float = 0.0  # POSIX seconds


class UserHabits:
    """One user's idle gaps (oldest first), immutable, with the clocks computed from them memoised."""

    __slots__ = ("gaps", "_memo")

    def __init__(self, gaps=()):
        self.gaps: tuple[IdleGap, ...] = tuple(gaps)
        self._memo: dict = {}

    def clock(self, away: bool, **kw) -> float | None:
        key = (away, *sorted(kw.items()))
        if key not in self._memo:
            self._memo[key] = learned_release_clock(self.gaps, away, **kw)
        return self._memo[key]

    def summary(self) -> dict:
        return {"gaps": len(self.gaps), "away_gaps": sum(g.away for g in self.gaps)}


def learned_release_clock(gaps, away: bool, *, floor: float, ceiling: float, step: float, window: float,
                          max_per_day: float, min_gaps: int, min_same: int = 3, price: float = 0.0) -> float | None:
    """The user's own release clock (seconds) from their past idle gaps; None = too little history.

    With a ``price`` (seconds), :func:`priced_clock` of those gaps. Without, the shortest clock c (floor,
    floor + step, ..., ceiling) at which the user's past gaps would have given at most ``max_per_day`` quick
    reversals per day they used the platform: gaps longer than c (a release at c
    would have ended them) that ended with the user back within ``window`` of c. The days are the distinct
    UTC dates the gaps ended on. Gaps in the same situation (nobody connected, or someone connected) are used
    when there are ``min_same`` of them, else all the user's gaps; fewer than ``min_gaps`` in all: None.
    When no clock up to ``ceiling`` is that safe, ``ceiling``.
    """
    gaps = list(gaps)
    if len(gaps) < min_gaps or step <= 0:
        return None
    days = len({int(g.ended_at // 86400) for g in gaps}) or 1
    same = [g.length for g in gaps if g.away == away]
    lengths = same if len(same) >= min_same else [g.length for g in gaps]
    if price > 0:
        return priced_clock(lengths, floor=floor, ceiling=ceiling, step=step, window=window, price=price)
    c = floor
    while c < ceiling:
        if sum(c < x <= c + window for x in lengths) <= max_per_day * days:
            return c
        c += step
    return ceiling


def priced_clock(lengths, *, floor: float, ceiling: float, step: float, window: float, price: float) -> float:
    """The clock c (floor, floor + step, ..., ceiling) that would have paid best over these past gap lengths:
    the idle seconds a release at c reclaims (each gap longer than c, from c to its end) less ``price`` seconds
    for each quick reversal (a gap that ended within ``window`` after c). The shortest of equals.

    One price for all users and situations, not one reversal budget per user: where a user's gaps are mostly
    long (the browser closed, the server left for the night) the clock stays short even if some reversals come
    with it, and where short gaps crowd just past a clock (a coder's 10-minute pauses) it moves past them."""
    best_c, best = floor, None
    c = floor
    while c <= ceiling:
        value = sum(max(0.0, x - c) for x in lengths) - price * sum(c < x <= c + window for x in lengths)
        if best is None or value > best:
            best, best_c = value, c
        c += step
    return best_c


# what ends an idle run: the user (or their work) is back. Unknown states (no metrics, no answer) end nothing.
_RETURN_REASONS = ("kernel executing", "GPU busy", "running job")


class IdleGapLog:
    """Each user's past idle gaps, learned from the culler's decisions in order (live, or replayed from the
    audit trail's rows at start): the history :attr:`CullPolicy.learn_release_clock` chooses clocks from.

    Per server, a run of passes with the same ``idle_since`` is one idle run. It ends when the clock restarts
    (a new ``idle_since``: a cell ran, keep was pressed, the GPUs were taken again), when a pass finds the GPU or
    a kernel busy, or, after a release or stop, at the user's "get a GPU again" (an audit row ``regain``) or the
    server's next pass on GPUs. ``keep`` gaps per user (the latest), none older than ``max_age`` seconds.
    """

    def __init__(self, keep: int = 300, max_age: float = 28 * 86400):
        self.keep, self.max_age = keep, max_age
        self._runs: dict[tuple[str, str], dict] = {}  # (user, server) -> the open run
        self._gaps: dict[str, deque] = {}  # user -> deque of (ended at, IdleGap)
        self._habits: dict[str, UserHabits] = {}

    def _close(self, user: str, run: dict, end: float) -> None:
        length = max(end - run["since"], run["idle"])
        q = self._gaps.setdefault(user, deque())
        q.append((end, IdleGap(length, away=run["away"], released=run["released"] is not None, ended_at=end)))
        while len(q) > self.keep:
            q.popleft()
        self._habits.pop(user, None)

    def observe(self, user: str, server: str, at: float, action: str, measurements: dict, *, acted: bool = True) -> None:
        """Take in one decision (an audit row: its time, action, and measurements; ``reason`` via measurements
        is not needed: a pass that found the server idle carries ``idle_since``/``idle_s``)."""
        key = (user, server)
        run = self._runs.get(key)
        if action == "regain":
            if run is not None and run["released"] is not None:
                self._close(user, run, at - float(measurements.get("seconds") or 0))  # asked at, not restarted at
                del self._runs[key]
            return
        since = measurements.get("idle_since")
        if run is not None and run["released"] is not None:
            # a pass on GPUs again after a release or stop: the user got GPUs back by then
            self._close(user, run, at)
            del self._runs[key]
            run = None
        if since is None:
            if run is not None and measurements.get("returned"):
                self._close(user, run, at)
                del self._runs[key]
            return
        since_ts = posix_ts(datetime.fromisoformat(since))
        if run is not None and since_ts != run["since"]:
            self._close(user, run, since_ts)  # the clock restarted then
            run = None
        if run is None:
            run = self._runs[key] = {"since": since_ts, "idle": 0.0, "away": False, "released": None}
        run["idle"] = max(run["idle"], float(measurements.get("idle_s") or 0.0))
        run["away"] = measurements.get("connections") == 0
        if action in (STOP, RELEASE) and acted:
            run["released"] = at

    def habits(self, user: str, now: float | None = None) -> UserHabits:
        """The user's gaps as the policy takes them (the same object until they change)."""
        h = self._habits.get(user)
        if h is None:
            q = self._gaps.get(user, ())
            if now is not None:
                while q and q[0][0] < now - self.max_age:
                    q.popleft()
            h = self._habits[user] = UserHabits(g for _, g in q)
        return h

    def observe_row(self, row: dict) -> None:
        """Take in one audit row (``CullerEvent.to_dict()`` or the service's row dict)."""
        at = row["at"]
        at = posix_ts(at if isinstance(at, datetime) else datetime.fromisoformat(at))
        m = dict(row.get("measurements") or {})
        if row.get("action") == NONE and str(row.get("reason", "")).removeprefix("dry run: ").removeprefix(
                "not culled: ").startswith(_RETURN_REASONS):
            m["returned"] = True
        self.observe(row["user"], row.get("server") or "", at, row.get("action") or NONE, m,
                     acted=bool(row.get("acted", True)) and not row.get("dry_run"))
