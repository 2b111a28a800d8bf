"""How many warm server interpreters the hub keeps: a pool that follows demand (docs/isolation.md#warm-servers).

Arrivals (spawns) are the only input; the clock is injected, so tests drive the model with a controlled one. The
target is the largest of three wants, then bounded by the memory budget:

* the floor, ``LocalGPUSpawner.warm_pool_size``, always kept;
* a rush: the floor plus ``per_arrival`` for each spawn of the last ``window`` seconds (users arrive together, so
  the ones who came predict the ones who follow, and the pool grows ahead of them instead of one for one);
* the time of day: what past days saw in the coming ``lead`` seconds, averaged over the days anyone came (the team
  that arrives at 9:00 finds the pool grown at 8:30, before its first spawn).

With no arrival for ``window`` seconds and nothing usual ahead, the want falls back to the floor: the pool shrinks.
Arrival times (no user names) are kept for ``history_days`` in a small JSON file so a hub restart keeps what it
learned.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import time
import uuid
from typing import Callable

DAY = 86400.0


class PoolDemand:
    def __init__(self, floor: int, *, window: float = 900.0, per_arrival: float = 2.0, lead: float = 1800.0,
                 history_days: int = 14, clock: Callable[[], float] = time.time, path: str = ""):
        self.floor, self.window, self.per_arrival, self.lead = floor, window, per_arrival, lead
        self.history_days, self.clock, self.path = history_days, clock, path
        self.arrivals: list[float] = []  # sorted wall-clock times of past spawns
        if path:
            self.arrivals = load_arrivals(path)

    def record(self, when: float | None = None) -> None:
        """A spawn arrived (now, unless ``when``); arrivals older than the history are dropped."""
        when = self.clock() if when is None else when
        bisect.insort(self.arrivals, when)
        del self.arrivals[:bisect.bisect_left(self.arrivals, when - (self.history_days + 1) * DAY)]

    def save(self) -> None:
        """Write the history (blocking: call on a worker thread)."""
        if self.path:
            save_arrivals(self.path, list(self.arrivals))

    def _count(self, start: float, end: float) -> int:
        return bisect.bisect_left(self.arrivals, end) - bisect.bisect_left(self.arrivals, start)

    def recent(self, now: float | None = None) -> int:
        """Spawns in the last ``window`` seconds."""
        now = self.clock() if now is None else now
        return bisect.bisect_right(self.arrivals, now) - bisect.bisect_left(self.arrivals, now - self.window)

    def usual(self, now: float | None = None) -> float:
        """Arrivals expected in the next ``lead`` seconds: the same stretch of each past day (the same clock time,
        24 h apart), averaged over the past days on which anyone arrived."""
        now = self.clock() if now is None else now
        total, days = 0, 0
        for d in range(1, self.history_days + 1):
            then = now - d * DAY
            if self._count(then - DAY / 2, then + DAY / 2) == 0:
                continue  # nobody came within 12 h of then: a weekend or a holiday does not dilute the working days
            days += 1
            total += self._count(then, then + self.lead)
        return total / days if days else 0.0

    def want(self, now: float | None = None) -> tuple[int, str]:
        """The size the pool should have before any budget, and the reason (for the hub's log)."""
        now = self.clock() if now is None else now
        recent = self.recent(now)
        rush = self.floor + math.ceil(self.per_arrival * recent) if recent else 0
        usual = math.ceil(self.usual(now) - 1e-9)
        if rush >= usual and rush > self.floor:
            return rush, f"{recent} spawn(s) in the last {self.window:.0f} s"
        if usual > self.floor:
            return usual, f"{usual} spawn(s) usual in the next {self.lead:.0f} s at this time of day"
        return self.floor, "the floor (warm_pool_size)"


def budget_cap(budget: int, per_interpreter: int) -> int:
    """How many interpreters of ``per_interpreter`` bytes fit in ``budget`` bytes (0 budget: no bound)."""
    if budget <= 0:
        return 1 << 30
    return budget // max(per_interpreter, 1)


def load_arrivals(path: str) -> list[float]:
    """The history file's times; a missing or unreadable file is an empty history (the model learns again)."""
    try:
        with open(path) as f:
            data = json.load(f)
        return sorted(float(t) for t in data.get("arrivals", []))
    except (OSError, ValueError, TypeError, AttributeError):
        return []


def save_arrivals(path: str, arrivals: list[float]) -> None:
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"  # two saves at once each write their own, the later replaces
    with open(tmp, "w") as f:
        json.dump({"arrivals": [round(t, 1) for t in arrivals]}, f)
    os.replace(tmp, path)
