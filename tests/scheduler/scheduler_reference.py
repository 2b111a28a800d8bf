"""Deliberately naive reference computations the scheduler tests compare against.

Kept apart from the production code (no shared helpers) so that a bug there is not mirrored here.
"""

from __future__ import annotations

import math

from trainhub.scheduler import Allocation, Plan, Start


def holdings(capacity, allocations):
    """GPUs in use per node."""
    used = dict.fromkeys(capacity, 0)
    for alloc in allocations:
        for node, gpus in alloc.placement:
            if node:
                used[node] += gpus
    return used


def as_allocations(plan: Plan, pending, now):
    """The plan's starts as allocations (what the caller would create)."""
    by_id = {j.id: j for j in pending}
    out = []
    for start in plan.starts:
        job = by_id[start.job_id]
        out.append(Allocation(job.id, job.user, job.groups, start.placement, priority=job.priority,
                              started_at=now, time_limit=job.time_limit, preemptible=job.preemptible))
    return out


def fits(free, workers, gpus_per_worker):
    return sum(f // gpus_per_worker for f in free.values() if f > 0) >= workers


def reservation(now, job, capacity, allocations):
    """Earliest t >= now at which ``job`` fits once every allocation ending by t is gone.

    An allocation's end is started_at + time_limit (never for None), at the earliest ``now``.
    Checks every candidate time from scratch; returns math.inf if it never fits.
    """
    def end(a):
        return math.inf if a.time_limit is None else max(now, a.started_at + a.time_limit)

    for t in sorted({now} | {end(a) for a in allocations if end(a) < math.inf}):
        still = [a for a in allocations if end(a) > t]
        used = holdings(capacity, still)
        free = {n: capacity[n] - used[n] for n in capacity}
        if fits(free, job.workers, job.gpus_per_worker):
            return t
    return math.inf


def start_map(plan: Plan) -> dict[str, Start]:
    return {s.job_id: s for s in plan.starts}
