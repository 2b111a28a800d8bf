"""What a sweep's trials' jobs mean for the sweep: pure decisions (tests feed them plain values).

The metric's points from the API's records, a trial's outcome from its job's end, how many trials to start, and
when a sweep whose first trials all failed should stop. The controller (controller.py) acts on them.
"""

from __future__ import annotations

import math

from trainhub.states import CANCELLED, COMPLETE, PRUNED, SUCCEEDED, TRIAL_CANCELLED, TRIAL_FAILED, TRIAL_FINAL


def metric_points(records: list[dict], metric: str) -> list[tuple[int, float]]:
    """``[(step, value), ...]`` of ``metric`` from the API's metrics records, lead worker only
    (rank 0 when present); a record without a step gets its position among the metric's records."""
    workers = {r.get("worker", 0) for r in records}
    lead = 0 if 0 in workers or not workers else min(workers)
    points = []
    for rec in records:
        if rec.get("worker", 0) != lead:
            continue
        v = (rec.get("values") or {}).get(metric)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        step = rec.get("step")
        points.append((int(step) if step is not None else len(points), float(v)))
    return points


def never_reported(metric: str) -> str:
    return (f"metric {metric!r} was never reported (the trial must call "
            f"trainhub.report(step=..., {metric}=...))")


def trial_outcome(job_state: str, job_reason: str, job_id: str, points: list, metric: str,
                  sweep_cancelled: bool = False) -> tuple[str, float | None, str]:
    """(trial state, value, reason) for a trial whose job ended in ``job_state``."""
    if job_state == SUCCEEDED:
        if not points:
            return TRIAL_FAILED, None, never_reported(metric)
        value = points[-1][1]
        return COMPLETE, value, f"{metric} = {value:.6g} (job {job_id} succeeded)"
    if job_state == CANCELLED:
        why = "the sweep was cancelled" if sweep_cancelled else f"its job {job_id} was cancelled: {job_reason}"
        return TRIAL_CANCELLED, None, why
    return TRIAL_FAILED, None, f"job {job_id} {job_state}: {job_reason}"


def trials_to_start(n_trials: int, parallel: int, started: int, unfinished: int) -> int:
    """How many new trials to ask for: fill the free slots, never beyond ``n_trials`` in all."""
    return max(0, min(parallel - unfinished, n_trials - started))


def failing_fast(trials: list, limit: int) -> str | None:
    """A reason to stop the sweep when its first ``limit`` finished trials all failed (the trial code
    is broken: running the rest would only burn GPU time); None otherwise."""
    if limit <= 0:
        return None
    finished = [t for t in trials if t.state in TRIAL_FINAL]
    if any(t.state in (COMPLETE, PRUNED) for t in finished):
        return None
    failed = [t for t in finished if t.state == TRIAL_FAILED]
    if len(failed) >= limit:
        last = max(failed, key=lambda t: t.number)
        return f"the first {len(failed)} trials failed and none completed (trial {last.number}: {last.reason})"
    return None
