"""Text for people: durations, sizes, times, tables, jobs, metrics, diagnoses and wait reasons.

The CLI (``trainhub.commands``), the kernel side (``%%train``, its panel and handle), the
services' messages and the scheduler all write these the same way because they all use this
module; none of them imports another's formatting. Pure functions: API dicts in, text out.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

from trainhub.states import PENDING, TRIAL_FINAL, TRIAL_RUNNING, TRIAL_STATES

# -- counts -------------------------------------------------------------------------------------
#: Plurals that are not the word plus "s" (the one table; add a word here, never a ``(s)`` or ``'s' if`` in a message).
IRREGULAR_PLURALS = {"retry": "retries", "process": "processes", "entry": "entries", "child": "children"}


def plural(n, word: str, many: str | None = None) -> str:
    """``1 GPU``, ``2 GPUs``, ``0 retries``, ``1.5 cores``: a count and its noun, the one pluralisation of every
    message (the CLI, the kernel side, the services' texts). ``many``: the plural when it is neither the word plus
    "s" nor in :data:`IRREGULAR_PLURALS`. ``n`` may be a float (``{n:g}`` is shown)."""
    return f"{n:g} {noun(n, word, many)}" if isinstance(n, float) else f"{n} {noun(n, word, many)}"


def noun(n, word: str, many: str | None = None) -> str:
    """The noun alone, singular for exactly one (``noun(3, "trial")`` -> ``trials``)."""
    if n == 1:
        return word
    return many or IRREGULAR_PLURALS.get(word) or word + "s"


# -- durations and sizes --------------------------------------------------------------------------
DURATION_STYLES = ("clock", "units", "coarse")


def fmt_duration(seconds: float | None, style: str = "clock") -> str:
    """The one duration formatter. Negative durations count as 0; fractions of a second are dropped.

    ``clock``: ``1:02:03``, ``02:03`` (``-`` for None): elapsed times in tables and live panels.
    ``units``: ``1h02m``, ``3m05s``, ``45s`` (``unknown`` for None): time limits, delays and grace
    periods in messages. ``coarse``: ``1h02m``, ``3m``, ``45s``: like ``units`` without the seconds
    past a minute (idle times, where seconds are noise).
    """
    if style not in DURATION_STYLES:
        raise ValueError(f"duration style {style!r}: one of {', '.join(DURATION_STYLES)}")
    if seconds is None:
        return "-" if style == "clock" else "unknown"
    s = int(max(seconds, 0))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if style == "clock":
        return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m" if style == "coarse" else f"{m}m{sec:02d}s"
    return f"{sec}s"


def fmt_size(n: float) -> str:
    """Bytes in decimal units: ``512 B``, ``1.5 KB``, ``2.0 GB``, ``3.1 TB``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)  # pragma: no cover - the loop always returns


_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str) -> int:
    """``"256MB" -> 256_000_000``, ``"1GiB" -> 2**30``, ``4096 -> 4096``. Must be > 0."""
    if isinstance(value, bool):
        raise ValueError(f"invalid size {value!r}")
    if isinstance(value, int):
        size = value
    else:
        m = _SIZE_RE.match(str(value))
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise ValueError(f"invalid size {value!r}: use bytes or a number with a unit such as 256MB, 1GiB, 500KB")
        size = int(float(m.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"size must be positive, got {value!r}")
    return size


def fmt_number(v, digits: int = 6, none: str = "-") -> str:
    """A table cell: floats with ``digits`` significant digits, None as ``none``, anything else as str."""
    if v is None:
        return none
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


# -- times ----------------------------------------------------------------------------------------
def as_utc(dt: datetime) -> datetime:
    """``dt`` with its zone; a naive one is UTC (SQLite hands datetimes back naive; the platform stores UTC)."""
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def parse_time(value) -> datetime | None:
    """An ISO 8601 time from the API (``...Z`` or an offset; naive = UTC) as an aware datetime;
    None when empty or not a time."""
    if not value:
        return None
    try:
        t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return as_utc(t)


def elapsed_seconds(job: dict, now: datetime | None = None) -> float | None:
    """Run time so far (started -> finished/now); None before the job started."""
    start = parse_time(job.get("started"))
    if start is None:
        return None
    end = parse_time(job.get("finished")) or now or datetime.now(timezone.utc)
    return max(0.0, (end - start).total_seconds())


# -- tables ---------------------------------------------------------------------------------------
def clip(text, width: int) -> str:
    """At most ``width`` characters; a cut text ends in "…" so nobody reads half a reason as a whole one."""
    text = "" if text is None else str(text)
    return text if len(text) <= width else text[:max(width - 1, 0)].rstrip() + "…"


def text_table(rows: list[list], header: list[str]) -> str:
    """Plain-text columns, left-aligned, two spaces apart, no trailing blanks."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows])


# -- jobs -----------------------------------------------------------------------------------------
def fmt_devices(job: dict) -> str:
    """``2 GPUs x 2 workers (devices 0,1 | 2,3)``."""
    gpus, workers = job.get("gpus"), job.get("workers") or 1
    text = f"{plural(gpus, 'GPU') if gpus is not None else '? GPUs'} x {plural(workers, 'worker')}"
    devices = job.get("devices")
    if devices:
        text += " (devices " + " | ".join(",".join(str(d) for d in w) or "-" for w in devices) + ")"
    return text


def state_text(job: dict, sep: str = " ") -> str:
    """``running (running on GPU 0)``: the state and, when it says more than the state, the reason."""
    state, reason = job.get("state"), (job.get("reason") or "").strip()
    return f"{state}{sep}({reason})" if reason and reason != state else f"{state}"


def format_job(job: dict, events: list[dict] | None = None) -> str:
    """A job as lines of ``field: value`` (``trainhub jobs show``, ``%train status`` without widgets); with the
    job's ``events`` the attempt line also tells restarts by the platform from retries."""
    lines = [f"{job['id']}  {job.get('name') or ''}".rstrip(),
             f"  state:    {state_text(job)}",
             f"  user:     {job.get('user', '')}",
             f"  gpus:     {fmt_devices(job)}" + (f", profile {job['profile']}" if job.get("profile") else ""),
             "  run:      " + (job.get("command") or f"python script.py ({plural(len((job.get('script') or '').splitlines()), 'line')})"),
             f"  created:  {job.get('created') or '-'}",
             f"  started:  {job.get('started') or '-'}",
             f"  finished: {job.get('finished') or '-'}",
             f"  elapsed:  {fmt_duration(elapsed_seconds(job))}"]
    if job.get("attempt") or job.get("retries"):
        lines.append(f"  attempt:  {attempt_text(job, events)}")
    if job.get("exit_codes"):
        lines.append(f"  exit codes: {job['exit_codes']}")
    if job.get("time_limit"):
        lines.append(f"  time limit: {job['time_limit']}")
    if job.get("env"):
        lines.append("  env:      " + " ".join(f"{k}={v}" for k, v in job["env"].items()))
    for key in ("outputs_url", "outputs_path"):
        if job.get(key):
            lines.append(f"  {key.replace('_', ' ')}: {job[key]}")
    return "\n".join(lines)


#: How the jobs engine ends the message of an attempt it stopped and put back in the queue without spending a retry
#: (the platform stopped, a higher-priority job preempted it, a gang could not be placed): see :func:`restart_causes`.
REQUEUED = "; requeued"
_RESTART_CAUSES = (("platform ", "a platform stop"), ("preempted", "a preemption"))


def restart_causes(events: list[dict] | None) -> list[str]:
    """Why each earlier attempt of a job was restarted by the platform rather than retried after a failure, oldest
    first ("a platform stop", "a preemption", "a stall"), from its events (kind "queued", message ending in
    :data:`REQUEUED`). These attempts do not count against the job's ``retries``."""
    out = []
    for e in events or []:
        message = e.get("message") or ""
        if e.get("kind") == "queued" and message.endswith(REQUEUED):
            out.append(next((cause for prefix, cause in _RESTART_CAUSES if message.startswith(prefix)), "a stall"))
    return out


def attempt_text(job: dict, events: list[dict] | None = None) -> str:
    """The attempt line: ``2 of 3`` (retries + 1), and with restarts by the platform, which the retries do not pay
    for, how many and why: ``2 of 2 (0 retries allowed; 1 restart after a platform stop, not counted against them)``.
    ``events`` None (not read): the retries only, no "of"."""
    attempt, retries = job.get("attempt") or 1, job.get("retries") or 0
    if events is None:
        return f"{attempt} ({plural(retries, 'retry')} allowed)"
    causes = restart_causes(events)
    text = f"{attempt} of {retries + 1 + len(causes)}"
    if not causes:
        return text
    kinds = list(dict.fromkeys(causes))
    why = (f"after {kinds[0]}" if len(kinds) == 1
           else "(" + ", ".join(f"{causes.count(c)} after {c}" for c in kinds) + ")")
    return f"{text} ({plural(retries, 'retry')} allowed; {plural(len(causes), 'restart')} {why}, not counted against the retries)"


_RESUMED = re.compile(r"resumed from step \d+")


def resumed_from(events: list[dict], reason: str | None = None) -> str:
    """"resumed from step S" of the job's last resume, from its events (kind "resumed") or, for a running
    attempt, its reason ("running on GPU 0; resumed from step S"); "" when it did not resume."""
    if reason:
        m = _RESUMED.search(reason)
        return m.group(0) if m else ""
    for e in reversed(events or []):
        if e.get("kind") == "resumed":
            m = _RESUMED.search(e.get("message", ""))
            if m:
                return m.group(0)
    return ""


def format_events(events: list[dict], indent: str = "  ") -> str:
    """A job's events as lines ``<time> <kind>: <message>`` (``trainhub jobs show``)."""
    return "\n".join(f"{indent}{(e.get('time') or '')[:19]} {e.get('kind')}: {e.get('message')}" for e in events or [])


def metrics_rows(metrics: dict) -> tuple[list[str], list[dict]]:
    """Flatten the API's metrics records into rows {step, worker, time, <metric>...} and the column names."""
    names: list[str] = []
    rows = []
    for rec in (metrics or {}).get("metrics", []):
        row = {"step": rec.get("step"), "worker": rec.get("worker", 0), "time": rec.get("time")}
        for k, v in (rec.get("values") or {}).items():
            if k not in names:
                names.append(k)
            row[k] = v
        rows.append(row)
    return ["step", "worker", "time", *names], rows


def last_log_line(text: str) -> str:
    """The last non-blank line of a log text ('' when there is none)."""
    for line in reversed((text or "").splitlines()):
        if line.strip():
            return line
    return ""


# -- why a queued job waits (GET /jobs/{id}/why; codes: trainhub.scheduler.WAIT_CODES) ------------
WAIT_CODE_MEANINGS = {
    "too-large": "the job can never fit the cluster",
    "quota-user": "starting it would put you over your GPU quota; it starts when your other jobs or servers free GPUs",
    "quota-group": "starting it would put one of your groups over its GPU quota",
    "quota-cpu": "starting it would put you over your quota of CPU-only worker processes; it starts when your other CPU-only jobs end",
    "cpu-limit": "every CPU-only job slot is taken",
    "no-gpus": "first in line, waiting for enough GPUs to be free at once",
    "behind": "a job ahead of it in the queue is waiting for GPUs",
    "fair-share": "a job of a user holding fewer GPUs goes first (fair share)",
    "reserved": "GPUs are free but held for the job first in line",
}


def wait_reason_text(job: dict, why: dict, now: float | None = None) -> str:
    """Why a queued job waits: the scheduler's message first (verbatim), then its code and what it
    means, the job it waits behind and that job's reserved start."""
    lines = [f"{job['id']} is queued: {why.get('message') or job.get('reason') or 'waiting for the scheduler'}"]
    code = why.get("code")
    if code:
        lines.append(f"  code:        {code}" + (f" ({WAIT_CODE_MEANINGS[code]})" if code in WAIT_CODE_MEANINGS else ""))
    if why.get("blocking_job"):
        lines.append(f"  waiting for: {why['blocking_job']} (trainhub jobs show {why['blocking_job']})")
    start, label = why.get("reserved_start"), "starts by:  "
    if not isinstance(start, (int, float)):
        start, label = why.get("estimated_start"), "expected:   "
    if isinstance(start, (int, float)):
        at = datetime.fromtimestamp(start, timezone.utc)
        wait = start - (time.time() if now is None else now)
        lines.append(f"  {label} {at.strftime('%Y-%m-%d %H:%M:%S UTC')}"
                     + (f" (in {fmt_duration(wait)})" if wait > 0 else " (due now)"))
    if not code:
        lines.append("  (no scheduling pass has explained it yet; the reason above is the job's last recorded one)")
    return "\n".join(lines)


# -- the GPU efficiency advisor (GET /jobs/{id}/diagnosis) -------------------------------------
def _num(v, unit="", nd=0):
    return "?" if v is None else f"{v:.{nd}f}{unit}"


def measurement_line(w: dict) -> str:
    """'worker 0: GPU 5%, mem 12%, CPU 98% of 2 cores (busiest process 97%), I/O wait 0%, 8 samples'."""
    parts = [f"GPU {_num(w.get('gpu_util'), '%')}"]
    if w.get("mem_fraction") is not None:
        parts.append(f"mem {_num(100 * w['mem_fraction'], '%')}")
    if w.get("cpu_percent") is not None:
        cpu = f"CPU {_num(w['cpu_percent'], '%')}"
        if w.get("cpu_cores"):
            cpu += f" of {plural(float(w['cpu_cores']), 'core')}"
        if w.get("max_process_cpu_percent") is not None and w.get("max_process_cpu_percent") != w.get("cpu_percent"):
            cpu += f" (busiest process {_num(w['max_process_cpu_percent'], '%')})"
        parts.append(cpu)
    if w.get("iowait_fraction") is not None:
        parts.append(f"I/O wait {_num(100 * w['iowait_fraction'], '%')}")
    if w.get("read_mb_s") is not None:
        parts.append(f"read {_num(w['read_mb_s'], ' MB/s', 1)}")
    if w.get("step_rate") is not None:
        parts.append(f"{w['step_rate']:.3g} steps/s")
    parts.append(plural(w.get("samples", 0), "sample"))
    return f"worker {w.get('rank', '?')}: " + ", ".join(parts)


def diagnosis_summary(body: dict) -> str:
    """One line: the codes found, or why there are none yet."""
    found = body.get("diagnoses") or []
    if found:
        return "; ".join(d["code"] for d in found)
    return body.get("note") or "no problem found"


def format_diagnosis(body: dict, remedies: bool = True, indent: str = "") -> str:
    """The advisor's diagnoses with their measurements (and remedies), as ``trainhub jobs why/show`` print them."""
    lines = []
    found = body.get("diagnoses") or []
    sim = " (simulated GPUs: utilisation is scripted)" if body.get("simulated") else ""
    head = f"GPU efficiency: {diagnosis_summary(body)}{sim}"
    if body.get("note") and found:
        head += f" — {body['note']}"
    lines.append(indent + head)
    for d in found:
        lines.append(f"{indent}  [{d['severity']}] {d['message']}")
        if remedies:
            for r in d.get("remedies") or []:
                lines.append(f"{indent}    - {r}")
    workers = body.get("workers") or []
    if workers:
        lines.append(f"{indent}  measured (means over the last {plural(max(w.get('samples', 0) for w in workers), 'sample')}, "
                     f"every {body.get('sample_interval', '?')}s):")
        for w in workers:
            lines.append(f"{indent}    {measurement_line(w)}")
    return "\n".join(lines)


# -- sweeps ---------------------------------------------------------------------------------------
def sweep_progress(sweep: dict) -> str:
    """``3/10 trials done, 2 complete, 1 pruned, 4 running``."""
    p = sweep.get("progress") or {}
    n = sweep.get("trials", "?")
    parts = [f"{p.get('done', 0)}/{n} {noun(n, 'trial')} done"]
    for key in (s for s in TRIAL_STATES if s in TRIAL_FINAL):  # complete, pruned, failed, cancelled
        if p.get(key):
            parts.append(f"{p[key]} {key}")
    running = p.get(TRIAL_RUNNING, 0) + p.get(PENDING, 0)
    parts.append(f"{running} running")
    return ", ".join(parts)
