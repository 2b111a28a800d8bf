"""Trace-driven, event-driven simulator for :class:`~trainhub.scheduler.Scheduler` policies.

The simulator calls the very same ``schedule()`` the service calls, in virtual time: on every
batch of simultaneous events (arrivals, completions) it passes the current queue and allocations,
applies the plan (starts, preemptions) and records what happened. Nothing here reads a clock.

Model assumptions (documented in docs/scheduler.md):

- a job runs for ``duration`` seconds; if its ``time_limit`` is shorter it is killed at the limit;
- a preempted job is requeued at once (grace period 0 by default) with ``restarts + 1``; it keeps
  its progress (checkpointing) but pays ``restart_overhead`` seconds on its next start;
- queueing delay = first start - submit; JCT = finish - submit.
"""

from __future__ import annotations

import csv
import heapq
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .model import Allocation, JobRequest, Quotas
from .policy import Scheduler
from .queue import PendingQueue


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace. ``gpus`` is the job's total; each worker gets ``gpus // workers``."""

    id: str
    user: str
    group: str
    submit_time: float
    gpus: int
    workers: int
    duration: float
    priority: int = 0
    time_limit: float | None = None
    preemptible: bool = False

    def request(self, restarts: int = 0) -> JobRequest:
        return JobRequest(
            id=self.id,
            user=self.user,
            groups=(self.group,) if self.group else (),
            workers=self.workers,
            gpus_per_worker=self.gpus // self.workers if self.gpus else 0,
            priority=self.priority,
            submitted_at=self.submit_time,
            time_limit=self.time_limit,
            preemptible=self.preemptible,
            restarts=restarts,
        )


CSV_COLUMNS = ("id", "user", "group", "submit_time", "gpus", "workers", "duration", "priority", "time_limit")


def load_csv(path) -> list[TraceJob]:
    """Read a trace: columns ``id,user,group,submit_time,gpus,workers,duration,priority,time_limit``.

    ``gpus`` is the job's total GPUs and must divide evenly by ``workers``; an empty ``time_limit``
    means unknown, an empty ``priority`` 0. An optional ``preemptible`` column (true/false/1/0) is
    read when present. Rows are returned sorted by submit time.
    """
    jobs = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = set(CSV_COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        for lineno, row in enumerate(reader, start=2):
            gpus, workers = int(row["gpus"]), int(row["workers"] or 1)
            if workers < 1 or gpus < 0 or gpus % workers:
                raise ValueError(f"{path}:{lineno}: gpus={gpus} does not split over workers={workers}")
            limit = (row.get("time_limit") or "").strip()
            jobs.append(TraceJob(
                id=row["id"],
                user=row["user"],
                group=row["group"] or "",
                submit_time=float(row["submit_time"]),
                gpus=gpus,
                workers=workers,
                duration=float(row["duration"]),
                priority=int(row["priority"] or 0),
                time_limit=float(limit) if limit else None,
                preemptible=(row.get("preemptible") or "").strip().lower() in ("1", "true", "yes"),
            ))
    jobs.sort(key=lambda j: (j.submit_time, j.id))
    return jobs


def write_csv(path, jobs: Iterable[TraceJob]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS + ("preemptible",))
        for j in jobs:
            w.writerow([j.id, j.user, j.group, f"{j.submit_time:.3f}", j.gpus, j.workers, f"{j.duration:.3f}",
                        j.priority, "" if j.time_limit is None else f"{j.time_limit:.3f}", int(j.preemptible)])


# -- synthetic traces --------------------------------------------------------------------------

#: GPUs per job and their probabilities (most jobs use one GPU; see docs/scheduler.md).
DEFAULT_SIZES: Mapping[int, float] = {1: 0.70, 2: 0.10, 4: 0.09, 8: 0.07, 16: 0.04}


@dataclass
class TraceParams:
    """Parameters of :func:`generate_trace`; defaults and their sources are in docs/scheduler.md."""

    n_jobs: int = 2000
    capacity_gpus: int = 128
    load: float = 1.0  # mean offered load: arrival rate × mean GPU-seconds / capacity
    sizes: Mapping[int, float] = field(default_factory=lambda: dict(DEFAULT_SIZES))
    gpus_per_node: int = 8  # jobs above this are split into workers of this size
    duration_median: float = 1200.0  # seconds, log-normal median
    duration_sigma: float = 1.8  # log-normal shape (heavy tail)
    duration_max: float = 7 * 86400.0
    diurnal_amplitude: float = 0.6  # arrival rate × (1 + a·sin(2πt/day))
    users: int = 24
    groups: int = 4
    user_zipf: float = 1.1  # user activity ∝ 1 / rank^s: a few users submit most jobs
    high_priority_fraction: float = 0.1  # jobs submitted with priority 5
    preemptible_fraction: float = 0.3  # of the priority-0 jobs
    no_limit_fraction: float = 0.1  # jobs without a time limit (cannot backfill)
    limit_overestimate: tuple[float, float] = (1.2, 4.0)  # time_limit = duration × U(a, b)
    seed: int = 0


def generate_trace(params: TraceParams | None = None, **overrides) -> list[TraceJob]:
    """A synthetic multi-tenant trace: diurnal Poisson arrivals, log-normal durations, 1–16 GPUs."""
    p = params or TraceParams()
    if overrides:
        p = TraceParams(**{**p.__dict__, **overrides})
    rng = random.Random(p.seed)
    sizes, weights = zip(*sorted(p.sizes.items()))
    user_w = [1 / (r + 1) ** p.user_zipf for r in range(p.users)]
    users = [f"user{u:02d}" for u in range(p.users)]

    shapes = []
    for _ in range(p.n_jobs):
        gpus = rng.choices(sizes, weights)[0]
        duration = min(p.duration_max, max(30.0, rng.lognormvariate(math.log(p.duration_median), p.duration_sigma)))
        shapes.append((gpus, duration))
    mean_gpu_seconds = sum(g * d for g, d in shapes) / len(shapes)
    rate = p.load * p.capacity_gpus / mean_gpu_seconds  # jobs per second, on average

    jobs = []
    t = 0.0
    peak = rate * (1 + p.diurnal_amplitude)
    for i, (gpus, duration) in enumerate(shapes):
        while True:  # thinning: a Poisson process at the peak rate, kept with rate(t)/peak
            t += rng.expovariate(peak)
            if rng.random() * peak <= rate * (1 + p.diurnal_amplitude * math.sin(2 * math.pi * t / 86400)):
                break
        u = rng.choices(range(p.users), user_w)[0]
        high = rng.random() < p.high_priority_fraction
        limit = None
        if rng.random() >= p.no_limit_fraction:
            limit = math.ceil(duration * rng.uniform(*p.limit_overestimate) / 60) * 60
        workers = max(1, gpus // p.gpus_per_node) if gpus > p.gpus_per_node else 1
        jobs.append(TraceJob(
            id=f"j{i:05d}",
            user=users[u],
            group=f"group{u % p.groups}",
            submit_time=round(t, 3),
            gpus=gpus,
            workers=workers,
            duration=round(duration, 3),
            priority=5 if high else 0,
            time_limit=limit,
            preemptible=(not high) and rng.random() < p.preemptible_fraction,
        ))
    return jobs


# -- simulation --------------------------------------------------------------------------------


@dataclass
class JobRecord:
    job: TraceJob
    first_start: float | None = None
    finish: float | None = None
    restarts: int = 0

    @property
    def queueing_delay(self) -> float | None:
        return None if self.first_start is None else self.first_start - self.job.submit_time

    @property
    def jct(self) -> float | None:
        return None if self.finish is None else self.finish - self.job.submit_time


@dataclass
class SimResult:
    records: dict[str, JobRecord]
    makespan: float
    busy_gpu_seconds: float  # over the whole run
    saturated_busy_gpu_seconds: float  # while some GPU job was queued
    saturated_capacity_seconds: float
    capacity: int
    passes: int
    preemptions: int

    def metrics(self) -> dict[str, float]:
        delays = sorted(r.queueing_delay for r in self.records.values() if r.queueing_delay is not None)
        jcts = [r.jct for r in self.records.values() if r.jct is not None]
        n = len(delays)
        return {
            "jobs": float(len(self.records)),
            "finished": float(len(jcts)),
            "allocation_at_saturation": (
                self.saturated_busy_gpu_seconds / self.saturated_capacity_seconds
                if self.saturated_capacity_seconds else 1.0
            ),
            "utilization": self.busy_gpu_seconds / (self.capacity * self.makespan) if self.makespan else 0.0,
            "mean_queueing_delay": sum(delays) / n if n else 0.0,
            "p95_queueing_delay": delays[min(n - 1, math.ceil(0.95 * n) - 1)] if n else 0.0,
            "mean_jct": sum(jcts) / len(jcts) if jcts else 0.0,
            "longest_wait": delays[-1] if n else 0.0,
            "makespan": self.makespan,
            "preemptions": float(self.preemptions),
        }


def simulate(
    trace: Sequence[TraceJob],
    scheduler: Scheduler,
    capacity: Mapping[str, int],
    quotas: Quotas | None = None,
    restart_overhead: float = 60.0,
    max_passes_per_event: int = 4,
) -> SimResult:
    """Replay ``trace`` through ``scheduler`` on ``capacity`` until every startable job finishes.

    Jobs the scheduler never starts (too large, over quota forever) stay unfinished in the records.
    """
    quotas = quotas or Quotas()
    cap_total = sum(capacity.values())
    by_id = {j.id: j for j in trace}
    records = {j.id: JobRecord(j) for j in trace}
    events: list[tuple[float, int, str, str, int]] = []  # (time, seq, kind, job id, epoch)
    seq = 0
    for j in trace:
        events.append((j.submit_time, seq, "arrive", j.id, 0))
        seq += 1
    heapq.heapify(events)

    pending = PendingQueue()  # kept across passes, as the jobs service does
    running: dict[str, Allocation] = {}
    remaining: dict[str, float] = {j.id: j.duration for j in trace}
    run_started: dict[str, float] = {}
    epoch: dict[str, int] = {}  # bumps on preemption so stale completion events are ignored
    used = 0
    last_t = trace[0].submit_time if trace else 0.0
    busy = sat_busy = sat_cap = 0.0
    passes = preemptions = 0

    def stop(job_id: str) -> None:
        nonlocal used
        alloc = running.pop(job_id)
        used -= alloc.gpus

    while events:
        now = events[0][0]
        dt = now - last_t
        busy += used * dt
        if pending.gpu_jobs:
            sat_busy += used * dt
            sat_cap += cap_total * dt
        last_t = now
        while events and events[0][0] == now:
            _, _, kind, job_id, ep = heapq.heappop(events)
            if kind == "arrive":
                pending.add(by_id[job_id].request())
            elif kind == "finish" and epoch.get(job_id, 0) == ep and job_id in running:
                stop(job_id)
                records[job_id].finish = now
        for _ in range(max_passes_per_event):
            if not pending:
                break
            plan = scheduler.schedule(now, pending, list(running.values()), capacity, quotas)
            passes += 1
            for start in plan.starts:
                req = pending.remove(start.job_id)
                tj = by_id[req.id]
                rec = records[req.id]
                if rec.first_start is None:
                    rec.first_start = now
                alloc = Allocation(
                    id=req.id, user=req.user, groups=req.groups, placement=start.placement, kind="job",
                    priority=req.priority, started_at=now, time_limit=req.time_limit, preemptible=req.preemptible,
                    submitted_at=req.submitted_at,
                )
                running[req.id] = alloc
                used += alloc.gpus
                run_started[req.id] = now
                work = remaining[req.id] + (restart_overhead if req.restarts else 0.0)
                if tj.time_limit is not None:
                    work = min(work, tj.time_limit)
                heapq.heappush(events, (now + work, seq, "finish", req.id, epoch.get(req.id, 0)))
                seq += 1
            for job_id in plan.preempt:
                if job_id not in running:
                    continue
                stop(job_id)
                preemptions += 1
                epoch[job_id] = epoch.get(job_id, 0) + 1
                rec = records[job_id]
                rec.restarts += 1
                elapsed = now - run_started[job_id]
                remaining[job_id] = max(0.0, remaining[job_id] - elapsed)
                pending.add(by_id[job_id].request(restarts=rec.restarts))
            if not plan.preempt:
                break
    return SimResult(
        records=records,
        makespan=last_t - (trace[0].submit_time if trace else 0.0),
        busy_gpu_seconds=busy,
        saturated_busy_gpu_seconds=sat_busy,
        saturated_capacity_seconds=sat_cap,
        capacity=cap_total,
        passes=passes,
        preemptions=preemptions,
    )


def uniform_cluster(nodes: int, gpus_per_node: int = 8) -> dict[str, int]:
    """``{"node000": 8, ...}``"""
    return {f"node{i:03d}": gpus_per_node for i in range(nodes)}
