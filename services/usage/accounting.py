"""GPU-seconds accounting: a pure function over a timeline, plus the report shapes.

A timeline is allocation intervals (one device held by one holder from ``start`` to ``end``)
and utilisation samples per device. A sample ``(t, u)`` covers the time since the device's
previous sample (NVML reports utilisation over its last sample period; the sampler measures
at the end of each accounting window), but never more than ``max_gap`` seconds back. Time not
covered by any sample is *allocated* and *unmeasured*: it adds nothing to *used*.

For each allocated second: ``allocated += 1``; if covered by a sample of utilisation u %:
``measured += 1`` and ``used += u / 100``. Seconds are split at UTC midnight, so every figure
belongs to one day.
"""

from __future__ import annotations

import bisect
import csv
import io
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

from trainhub.fmt import clip

DAY = 86400.0
BY = ("user", "group", "profile", "day", "kind", "holder")


@dataclass(frozen=True)
class Interval:
    """One device held by one holder; times are POSIX seconds (end None = still held at ``until``)."""

    device: int
    holder: str
    kind: str
    user: str
    profile: str | None
    start: float
    end: float | None


@dataclass
class Figures:
    allocated: float = 0.0
    used: float = 0.0
    measured: float = 0.0

    def add(self, other: "Figures") -> None:
        self.allocated += other.allocated
        self.used += other.used
        self.measured += other.measured


Key = tuple  # (day "YYYY-MM-DD", user, kind, profile, holder)


def day_of(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).date().isoformat()


def _split_days(a: float, b: float):
    """[a, b) cut at UTC midnights: yields (day, a_i, b_i)."""
    while a < b:
        midnight = (a // DAY + 1) * DAY
        e = min(b, midnight)
        yield day_of(a), a, e
        a = e


def account(intervals, samples: dict[int, list[tuple[float, float]]], *, since: float, until: float,
            max_gap: float | None = None) -> dict[Key, Figures]:
    """GPU-seconds allocated / used / measured per (day, user, kind, profile, holder) in [since, until).

    ``samples``: {device: [(t, utilisation 0-100), ...]} sorted by t. Pure: same timeline, same sums.
    """
    out: dict[Key, Figures] = defaultdict(Figures)
    times = {d: [t for t, _ in s] for d, s in samples.items()}
    for iv in intervals:
        a = max(iv.start, since)
        b = min(iv.end if iv.end is not None else until, until)
        if b <= a:
            continue
        for day, da, db in _split_days(a, b):
            f = out[(day, iv.user, iv.kind, iv.profile, iv.holder)]
            f.allocated += db - da
            used, measured = _covered(samples.get(iv.device, []), times.get(iv.device, []), da, db, max_gap)
            f.used += used
            f.measured += measured
    return dict(out)


def _covered(series, ts, a: float, b: float, max_gap) -> tuple[float, float]:
    """Utilisation-weighted and measured seconds of [a, b) under ``series``."""
    used = measured = 0.0
    i = bisect.bisect_right(ts, a)  # first sample strictly after a covers a
    prev = ts[i - 1] if i > 0 else float("-inf")
    while i < len(ts):
        t, u = series[i]
        lo = prev if max_gap is None else max(prev, t - max_gap)
        lo, hi = max(lo, a), min(t, b)
        if hi > lo:
            measured += hi - lo
            used += (hi - lo) * min(max(u, 0.0), 100.0) / 100.0
        if t >= b:
            break
        prev = t
        i += 1
    return used, measured


# -- reports ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UsageRow:
    """A stored rollup row (what the sampler writes), with the user's groups when it was written."""

    day: str
    user: str
    kind: str
    profile: str | None
    holder: str
    groups: tuple
    allocated: float
    used: float
    measured: float


def aggregate(rows, by: str) -> list[dict]:
    """Rows summed by ``by`` (user, group, profile, day, kind, holder), largest allocation first.

    By group, a user in several groups counts in each; users in none are under "(none)".
    """
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}, not {by!r}")
    sums: dict[str, Figures] = defaultdict(Figures)
    users: dict[str, set] = defaultdict(set)
    for r in rows:
        if by == "group":
            keys = list(r.groups) or ["(none)"]
        else:
            keys = [getattr(r, by) or "(none)"]
        for k in keys:
            sums[k].add(Figures(r.allocated, r.used, r.measured))
            users[k].add(r.user)
    items = []
    for k, f in sums.items():
        items.append({
            by: k,
            "gpu_seconds_allocated": round(f.allocated, 3),
            "gpu_seconds_used": round(f.used, 3),
            "gpu_seconds_measured": round(f.measured, 3),
            "gpu_hours_allocated": round(f.allocated / 3600, 4),
            "gpu_hours_used": round(f.used / 3600, 4),
            "utilization": round(100 * f.used / f.measured, 1) if f.measured else None,
            "users": len(users[k]),
        })
    if by == "day":
        items.sort(key=lambda x: x["day"])
    else:
        items.sort(key=lambda x: (-x["gpu_seconds_allocated"], str(x[by])))
    return items


def parse_day(text: str | None, default: date | None = None) -> date | None:
    """``YYYY-MM-DD`` (the document's ``format: date``); None = ``default``; anything else, "" too, a ValueError."""
    if text is None:
        return default
    try:
        if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text):
            raise ValueError(text)
        return date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"expected a date YYYY-MM-DD, got {clip(text, 40)!r}") from None


def since_default(today: date, days: int = 30) -> date:
    return today - timedelta(days=days - 1)


def to_csv(items: list[dict]) -> str:
    if not items:
        return ""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(items[0].keys()), lineterminator="\n")
    w.writeheader()
    w.writerows(items)
    return buf.getvalue()


def _label(v) -> str:
    return str(v if v is not None else "").replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus_text(rows, diagnoses: dict | None = None) -> str:
    """Prometheus exposition of the totals per (user, profile, kind), plus current diagnoses.

    ``diagnoses``: {(job key, user): [codes]} of running jobs.
    """
    tot: dict[tuple, Figures] = defaultdict(Figures)
    for r in rows:
        tot[(r.user, r.profile or "", r.kind)].add(Figures(r.allocated, r.used, r.measured))
    lines = []
    for name, attr, help_ in (
        ("trainhub_gpu_seconds_allocated_total", "allocated", "GPU-seconds held by notebook servers and jobs."),
        ("trainhub_gpu_seconds_used_total", "used", "GPU-seconds actually used (allocated seconds weighted by utilisation)."),
        ("trainhub_gpu_seconds_measured_total", "measured", "Allocated GPU-seconds for which utilisation was measured."),
    ):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} counter"]
        for (user, profile, kind), f in sorted(tot.items()):
            lines.append(f'{name}{{user="{_label(user)}",profile="{_label(profile)}",kind="{_label(kind)}"}} '
                         f"{getattr(f, attr):.3f}")
    if diagnoses is not None:
        name = "trainhub_job_diagnosis"
        lines += [f"# HELP {name} 1 for each advisor diagnosis a running job has now.", f"# TYPE {name} gauge"]
        for (job, user), codes in sorted(diagnoses.items()):
            for code in codes:
                lines.append(f'{name}{{job="{_label(job)}",user="{_label(user)}",code="{_label(code)}"}} 1')
    return "\n".join(lines) + "\n"
