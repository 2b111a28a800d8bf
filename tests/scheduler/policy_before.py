"""The scheduling policies as they were before the incremental queue (kept verbatim as a test oracle: the lazy reasons and the indexed queue must give the same plans).

``schedule()`` is a pure function of its arguments and the configuration: no I/O, no clock reads,
no randomness, and it never mutates its inputs. One pass walks the queue once, in policy order:

1. CPU-only jobs start unless that would put their user over the CPU worker quota (``quota-cpu``)
   or ``max_cpu_jobs`` are already running (GPUs never block them).
2. A GPU job that can never fit gets ``too-large``; one that would break a user or group quota gets
   ``quota-user``/``quota-group`` and is skipped (it does not block the jobs behind it).
3. Jobs start, best-fit placed, until the first one that does not fit: the *head*. The head gets a
   reservation: the earliest time its gang fits, replaying the running jobs' ends
   (``started_at + time_limit``; unknown limits never end).
4. FIFO stops there (head-of-line blocking). Trainhub may preempt lower-priority preemptible jobs for
   the head, then backfills (EASY): a later job starts now only if it fits now and either ends before
   the reservation or uses GPUs the head does not need at that time.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping, Sequence

from traitlets import Bool, Dict, Float, Integer, Unicode
from traitlets.config import LoggingConfigurable

from trainhub.fmt import fmt_duration

from trainhub.scheduler.model import Allocation, JobRequest, Plan, Quotas, Start, WaitReason
from trainhub.scheduler.placement import FreeIndex, free_gpus, node_ends


class Scheduler(LoggingConfigurable):
    """Decides which pending jobs start now, which running jobs to preempt, and why others wait.

    Subclasses implement :meth:`schedule`. The contract every implementation keeps:

    - pure and deterministic: same arguments and configuration, same :class:`Plan`;
    - never puts more GPUs on a node than ``capacity`` minus the running placements;
    - never lets a user or group hold more than its quota (servers count too);
    - starts whole gangs only: one ``(node, gpus)`` per worker, a worker never spans nodes;
    - every pending job that does not start gets a :class:`WaitReason` with a human message.
    """

    max_cpu_jobs = Integer(
        None,
        allow_none=True,
        config=True,
        help="""Most CPU-only jobs (gpus_per_worker=0) running at once, e.g. 50.
        None = unlimited; 0 = CPU-only jobs never start. GPUs never block CPU-only jobs.""",
    )

    def schedule(
        self,
        now: float,
        pending: Sequence[JobRequest],
        running: Sequence[Allocation],
        capacity: Mapping[str, int],
        quotas: Quotas,
    ) -> Plan:
        """One pass. ``capacity`` is total GPUs per node; free = capacity minus ``running``."""
        raise NotImplementedError

    def base_priority(self, job: JobRequest | Allocation) -> int:
        """The priority before aging (overridden by policies with group defaults)."""
        return job.priority

    def group_priority(self, groups: Sequence[str]) -> int:
        """The priority a job submitted without one gets from its user's groups (0: no group defaults)."""
        return 0

    def level(self, job: JobRequest, now: float) -> int:
        """Effective priority of a queued job (base priority plus aging, if the policy ages)."""
        return self.base_priority(job)

    def requeue_level(self, alloc: Allocation, now: float) -> int:
        """The level a running job would have if preempted and requeued now.

        A job is preempted only for a head whose level is strictly higher, so the head comes first
        in the next pass and the victim cannot take its GPUs back (no preemption ping-pong).
        """
        return self.base_priority(alloc)


def _gpus(n: int) -> str:
    return f"{n} GPU{'' if n == 1 else 's'}"


def _named(request_id: str) -> str:
    """How a message names what it waits behind: job ids get "job "; other requests (a notebook
    server in line: "alice's notebook server") are named by their id."""
    return request_id if " " in request_id else f"job {request_id}"


def _fmt_delay(seconds: float) -> str:
    """A delay rounded up to the second (a promise must not be early): 7s, 1m05s, 2h00m."""
    return fmt_duration(math.ceil(seconds), "units")


class _Reasons(Mapping):
    """``Plan.waiting``: a read-only mapping job id -> WaitReason.

    Once a pass can start no more GPU jobs, the remaining queue (often thousands of jobs) is only
    recorded here; each job's reason is worked out on first access against the final state of the
    pass, which no longer changes. Converting with ``dict(plan.waiting)`` materialises everything.
    """

    __slots__ = ("_done", "_deferred", "_explain")

    def __init__(self, explain):
        self._done: dict[str, WaitReason] = {}
        self._deferred: dict[str, JobRequest] = {}
        self._explain = explain

    def __setitem__(self, job_id: str, reason: WaitReason) -> None:  # used by the pass only
        self._done[job_id] = reason

    def defer(self, job: JobRequest) -> None:
        self._deferred[job.id] = job

    def __getitem__(self, job_id: str) -> WaitReason:
        try:
            return self._done[job_id]
        except KeyError:
            job = self._deferred.pop(job_id)  # KeyError if unknown, as a mapping should
            reason = self._done[job_id] = self._explain(job)
            return reason

    def __iter__(self):
        yield from list(self._done)
        yield from list(self._deferred)

    def __len__(self) -> int:
        return len(self._done) + len(self._deferred)

    def __contains__(self, job_id) -> bool:
        return job_id in self._done or job_id in self._deferred

    def __repr__(self) -> str:
        return f"{{{', '.join(f'{k!r}: {v!r}' for k, v in self.items())}}}"


class _Order:
    """Queue order as an iterator; ``frozen`` switches to a cheap order-agnostic drain.

    With fair share on, users sit in a lazy min-heap keyed by
    ``(-level, group GPUs held, user GPUs held, submitted_at, id)`` of their next job. GPU holdings
    only grow during a pass, so a popped key that is stale is pushed back with its current value and
    the pop retried: the job yielded is always the true minimum under the *current* holdings.
    """

    def __init__(self, jobs, level, user_held, group_held, fair_share: bool):
        self.frozen = False
        self.level = level
        self.user_held = user_held
        self.group_held = group_held
        self.fair = fair_share
        # Entries (-level, submitted_at, id, job): ids are unique, so jobs are never compared.
        if fair_share:
            per_user: dict[str, list] = {}
            for job in jobs:
                entry = (-level[job.id], job.submitted_at, job.id, job)
                lst = per_user.get(job.user)
                if lst is None:
                    per_user[job.user] = [entry]
                else:
                    lst.append(entry)
            for lst in per_user.values():
                lst.sort()
            self.per_user = {user: [e[3] for e in lst] for user, lst in per_user.items()}
        else:
            entries = [(-level[job.id], job.submitted_at, job.id, job) for job in jobs]
            entries.sort()
            self.static = [e[3] for e in entries]

    def _key(self, job):
        groups = job.groups
        if not groups:
            gshare = 0
        elif len(groups) == 1:
            gshare = self.group_held.get(groups[0], 0)
        else:
            gh = self.group_held
            gshare = max(gh.get(g, 0) for g in groups)
        return (-self.level[job.id], gshare, self.user_held.get(job.user, 0), job.submitted_at, job.id)

    def __iter__(self) -> Iterator[JobRequest]:
        if not self.fair:
            yield from self.static
            return
        per_user = self.per_user
        pos = dict.fromkeys(per_user, 0)
        heap = [(self._key(lst[0]), user) for user, lst in per_user.items()]
        heapq.heapify(heap)
        while heap:
            if self.frozen:
                for key, user in heap:
                    yield from per_user[user][pos[user]:]
                return
            key, user = heapq.heappop(heap)
            lst = per_user[user]
            job = lst[pos[user]]
            current = self._key(job)
            if current > key:
                heapq.heappush(heap, (current, user))
                continue
            yield job
            pos[user] += 1
            if pos[user] < len(lst):
                heapq.heappush(heap, (self._key(lst[pos[user]]), user))


class _Pass:
    """State of one scheduling pass (built fresh per call: nothing survives between passes)."""

    def __init__(self, policy: Scheduler, now, pending, running, capacity, quotas, level):
        self.policy = policy
        self.now = now
        self.running = running
        self.capacity = capacity
        self.quotas = quotas
        self.level = level
        self.cap_total = sum(capacity.values())
        self.kmax = max(capacity.values(), default=0)
        # placement is shared with the policy under test (trainhub.scheduler.placement), not part of what
        # this oracle checks: both place end-aligned when the policy's `placement` says so
        self.aligned = getattr(policy, "placement", "best-fit") == "end-aligned"
        self.free = FreeIndex(free_gpus(capacity, running), self.kmax, node_ends(running) if self.aligned else None)
        self.user_held: dict[str, int] = {}
        self.group_held: dict[str, int] = {}
        self.cpu_running = 0
        self.cpu_held: dict[str, int] = {}  # CPU-only workers running per user
        for alloc in running:
            gpus = alloc.gpus
            if gpus:
                self.user_held[alloc.user] = self.user_held.get(alloc.user, 0) + gpus
                for grp in alloc.groups:
                    self.group_held[grp] = self.group_held.get(grp, 0) + gpus
            elif alloc.kind == "job":
                self.cpu_running += 1
                self.cpu_held[alloc.user] = self.cpu_held.get(alloc.user, 0) + len(alloc.placement)
        self.starts: list[Start] = []
        self.started_jobs: list[JobRequest] = []
        self.waiting = _Reasons(self.explain)
        self.head: JobRequest | None = None  # set by _run when the first job does not fit
        self.slots_cache: dict[int, int] = {}

    # -- checks ------------------------------------------------------------------------------
    def too_large(self, job: JobRequest) -> WaitReason | None:
        g, w = job.gpus_per_worker, job.workers
        slots = self.slots_cache.get(g)
        if slots is None:
            slots = self.slots_cache[g] = sum(c // g for c in self.capacity.values())
        if slots >= w:
            return None
        if g > self.kmax:
            msg = f"needs {g} GPUs per worker but the largest node has {self.kmax}"
        elif w * g > self.cap_total:
            msg = f"needs {w * g} GPUs but the cluster has {self.cap_total}"
        else:
            msg = f"needs {w} workers of {g} GPUs but the nodes can hold only {slots} such workers"
        return WaitReason(job.id, "too-large", msg)

    def quota(self, job: JobRequest, need: int) -> WaitReason | None:
        """The admission rule (trainhub.quotas.Quotas) against what is held in this pass."""
        refusal = self.quotas.gpu_refusal(job.user, job.groups, need, self.user_held.get(job.user, 0), self.group_held)
        return None if refusal is None else WaitReason(job.id, refusal.code, refusal.wait_message)

    def explain(self, job: JobRequest) -> WaitReason:
        """The reason for a job queued behind the head once nothing more can start."""
        need = job.workers * job.gpus_per_worker
        head = self.head
        return self.too_large(job) or self.quota(job, need) or _behind(
            job, need, self.free.total, self.cap_total, head, self.policy.base_priority(head),
            self.level[head.id], self.level)

    # -- actions -----------------------------------------------------------------------------
    def start(self, job: JobRequest, nodes: list[str], backfill: bool = False) -> None:
        g = job.gpus_per_worker
        self.starts.append(Start(job.id, tuple((n, g) for n in nodes), backfill))
        self.started_jobs.append(job)
        need = job.workers * g
        self.user_held[job.user] = self.user_held.get(job.user, 0) + need
        for grp in job.groups:
            self.group_held[grp] = self.group_held.get(grp, 0) + need

    def start_cpu_jobs(self, jobs: list[JobRequest]) -> None:
        limit = self.policy.max_cpu_jobs
        jobs.sort(key=lambda j: (-self.level.get(j.id, 0), j.submitted_at, j.id))
        for job in jobs:
            held = self.cpu_held.get(job.user, 0)
            refusal = self.quotas.cpu_refusal(job.user, job.workers, held)
            if refusal is not None:
                self.waiting[job.id] = WaitReason(job.id, refusal.code, refusal.wait_message)
                continue
            if limit is not None and self.cpu_running >= limit:
                self.waiting[job.id] = WaitReason(
                    job.id, "cpu-limit",
                    f"waiting for a CPU-only job slot: {self.cpu_running} of {limit} running",
                )
                continue
            self.cpu_running += 1
            self.cpu_held[job.user] = held + job.workers
            self.starts.append(Start(job.id, tuple(("", 0) for _ in range(job.workers))))
            self.started_jobs.append(job)

    # -- reservation -------------------------------------------------------------------------
    def releases(self, victims: Sequence[Allocation]) -> list[tuple[float, str, tuple]]:
        """``(end, rank, id, placement)`` of everything that will free GPUs, clamped to now.

        ``victims`` (rank 0) come before what merely ends at the same time, overdue jobs clamped to now
        included: a head that preempts must fit on its victims' GPUs, not on those of a job past its
        limit that is still running (else backfill could take what the victims free)."""
        now = self.now
        victim_ids = {v.id for v in victims}
        out = [(now, 0, v.id, v.placement) for v in victims]
        for alloc in self.running:
            end = alloc.end
            if end is not None and alloc.id not in victim_ids:
                out.append((end if end > now else now, 1, alloc.id, alloc.placement))
        for start, job in zip(self.starts, self.started_jobs):
            if job.time_limit is not None and job.gpus:
                out.append((now + job.time_limit, 1, job.id, start.placement))
        out.sort()
        return out

    def reservation(self, job: JobRequest, victims: Sequence[Allocation] = ()):
        """Earliest time ``job``'s gang fits if nothing else starts: ``(time | None, free then)``."""
        g, w = job.gpus_per_worker, job.workers
        free = dict(self.free.free)
        slots = sum(f // g for f in free.values())
        if slots >= w:
            return self.now, free
        for end, _rank, _id, placement in self.releases(victims):
            for node, x in placement:
                if x and node in free:
                    old = free[node]
                    free[node] = old + x
                    slots += (old + x) // g - old // g
            if slots >= w:
                return end, free
        return None, free

    # -- preemption --------------------------------------------------------------------------
    def choose_victims(self, head: JobRequest) -> list[Allocation]:
        """An irreducible set of lower-priority preemptible jobs whose GPUs let ``head`` fit now.

        First the single smallest job that suffices; otherwise greedily add candidates (lowest
        priority, then fewest GPUs, then most recently started = least work lost) until the head
        fits, and drop again any victim the head does not need.
        """
        hp = self.policy.base_priority(head)
        base = self.policy.base_priority
        head_level = self.level[head.id]
        requeue_level = self.policy.requeue_level
        now = self.now
        cands = [
            a for a in self.running
            if a.kind == "job" and a.preemptible and a.gpus > 0 and base(a) < hp
            and requeue_level(a, now) < head_level
        ]
        if not cands:
            return []
        g, w = head.gpus_per_worker, head.workers
        free = dict(self.free.free)
        slots = sum(f // g for f in free.values())

        def delta(alloc, sign):
            d = 0
            for node, x in alloc.placement:
                if x and node in free:
                    old = free[node]
                    free[node] = old + sign * x
                    d += (old + sign * x) // g - old // g
            return d

        def gain(alloc):  # slots won by freeing alloc alone, leaving `free` unchanged
            d = delta(alloc, +1)
            delta(alloc, -1)
            return d

        by_size = sorted(cands, key=lambda a: (a.gpus, base(a), -a.started_at, a.id))
        for alloc in by_size:
            if slots + gain(alloc) >= w:
                return [alloc]
        chosen = []
        for alloc in sorted(cands, key=lambda a: (base(a), a.gpus, -a.started_at, a.id)):
            slots += delta(alloc, +1)
            chosen.append(alloc)
            if slots >= w:
                break
        else:
            return []  # even preempting everything eligible would not make room
        for alloc in reversed(chosen[:-1]):
            d = delta(alloc, -1)
            if slots + d >= w:
                slots += d
                chosen.remove(alloc)
            else:
                delta(alloc, +1)
        return chosen


class FifoGangScheduler(Scheduler):
    """Baseline: strict FIFO by submit time, best-fit gang placement, head-of-line blocking.

    No backfill, no preemption, no priorities. Jobs that can never start (too large, over quota)
    are skipped rather than blocking everyone behind them.
    """

    def schedule(self, now, pending, running, capacity, quotas):
        level = dict.fromkeys((j.id for j in pending), 0)
        p = _Pass(self, now, pending, running, capacity, quotas, level)
        p.start_cpu_jobs([j for j in pending if j.gpus_per_worker <= 0])
        order = _Order([j for j in pending if j.gpus_per_worker > 0], level, {}, {}, fair_share=False)
        return _run(p, order, backfill=False, preemption=False, backfill_depth=0)


class TrainhubScheduler(Scheduler):
    """Priorities with aging, fair share, EASY backfill, preemption, best-fit gang placement.

    Queue order: effective priority (highest first), then the GPUs held by the job's groups and its
    user (fewest first, recomputed as jobs start within the pass), then submit time.
    """

    group_priorities = Dict(
        value_trait=Integer(),
        config=True,
        help="""Default priority per group, e.g. {"prod": 10, "students": -5}. Applies to jobs and
        running allocations whose own priority is 0 (the unset value); with several groups the
        highest wins. Groups not listed default to 0.""",
    )
    aging_interval = Float(
        3600.0,
        config=True,
        help="""Seconds of waiting that raise a job's effective priority by one level, e.g. 3600
        (one level per hour). 0 = no aging (low-priority jobs can then starve behind a steady
        stream of higher-priority ones).""",
    )
    aging_max = Integer(
        None,
        allow_none=True,
        config=True,
        help="""Cap on the levels gained by aging, e.g. 10. None = no cap (every job eventually
        reaches the front: the starvation bound).""",
    )
    fair_share = Bool(
        True,
        config=True,
        help="""Order jobs of equal effective priority by the GPUs their groups, then their user,
        currently hold (fewest first) before submit time. False = submit time only.""",
    )
    backfill = Bool(
        True,
        config=True,
        help="""EASY backfill: when the head job cannot start, later jobs may start if they cannot
        delay the head's reserved start. Only jobs with a time_limit can end before it.""",
    )
    backfill_depth = Integer(
        1000,
        config=True,
        help="""How many queued jobs behind the head are examined for backfill per pass, e.g. 1000.
        Bounds the cost of a pass on long queues; 0 = no backfill.""",
    )
    backfill_per_user = Integer(0, config=True, help="as trainhub.scheduler.policy.TrainhubScheduler.backfill_per_user")
    reserve_after = Float(
        3600.0,
        config=True,
        help="""Seconds the head job must have waited before GPUs are held for its reservation, e.g.
        3600. Until then any later job with a time limit that fits may start (greedy), which keeps
        GPUs busy while large gangs wait; afterwards only backfill that cannot delay the head.
        0 = reserve at once (pure EASY backfill). Slurm's bf_min_age_reserve is the same idea.""",
    )
    placement = Unicode("best-fit", config=True, help="as trainhub.scheduler.policy.TrainhubScheduler.placement")
    preemption = Bool(
        True,
        config=True,
        help="""Preempt running jobs marked preemptible whose priority is lower than the head
        job's base priority when that makes room for it. Servers are never preempted.""",
    )

    def base_priority(self, job):
        if job.priority or not self.group_priorities:
            return job.priority
        gp = self.group_priorities
        return max((gp.get(g, 0) for g in job.groups), default=0)

    def group_priority(self, groups):
        """The highest ``group_priorities`` entry among ``groups`` (0 when none is listed)."""
        gp = self.group_priorities
        return max([int(gp[g]) for g in groups if g in gp] or [0])

    def _aged(self, base: int, waited: float) -> int:
        interval = self.aging_interval
        if interval > 0 and waited >= interval:
            age = int(waited // interval)
            return base + (age if self.aging_max is None else min(age, self.aging_max))
        return base

    def level(self, job, now):
        return self._aged(self.base_priority(job), now - job.submitted_at)

    def requeue_level(self, alloc, now):
        since = alloc.started_at if alloc.submitted_at is None else alloc.submitted_at
        return self._aged(self.base_priority(alloc), now - since)

    def schedule(self, now, pending, running, capacity, quotas):
        interval, cap = self.aging_interval, self.aging_max
        level = {}
        base = self.base_priority if self.group_priorities else None  # (traits are slow to read)
        for job in pending:
            lv = job.priority if base is None else base(job)
            if interval > 0:
                age = int((now - job.submitted_at) // interval)
                if age > 0:
                    lv += age if cap is None else min(age, cap)
            level[job.id] = lv
        p = _Pass(self, now, pending, running, capacity, quotas, level)
        p.start_cpu_jobs([j for j in pending if j.gpus_per_worker <= 0])
        gpu_jobs = [j for j in pending if j.gpus_per_worker > 0]
        order = _Order(gpu_jobs, level, p.user_held, p.group_held, self.fair_share)
        return _run(
            p, order,
            backfill=self.backfill and self.backfill_depth > 0,
            preemption=self.preemption,
            backfill_depth=self.backfill_depth,
            reserve_after=self.reserve_after,
            backfill_per_user=self.backfill_per_user,
        )


def _end(p, job):
    if not p.aligned:
        return None
    return math.inf if job.time_limit is None else p.now + job.time_limit


def _run(
    p: _Pass, order: _Order, *, backfill: bool, preemption: bool, backfill_depth: int, reserve_after: float = 0.0,
    backfill_per_user: int = 0,
) -> Plan:
    """Walk the GPU jobs in ``order``; see the module docstring.

    (Added with issue 32, eagerly: past ``backfill_depth`` the walk goes on through the whole order, and a
    user's jobs are deferred once ``backfill_per_user`` of theirs examined since did not start.)"""
    free = p.free
    waiting = p.waiting
    now = p.now
    head: JobRequest | None = None
    head_prio = 0
    head_level = 0
    victims: list[Allocation] = []
    res_time: float | None = None
    long_free: FreeIndex | None = None  # per node: min(free now, spare at the reservation)
    spare: dict[str, int] = {}
    scanned = 0
    level = p.level
    cap_total = p.cap_total

    per_user = False
    misses: dict[str, int] = {}
    last = None  # (job, starts before it) examined past the depth

    queue = iter(order)
    for job in queue:
        if per_user:
            if last is not None and len(p.starts) == last[1]:
                misses[last[0].user] = misses.get(last[0].user, 0) + 1
            last = None
            if misses.get(job.user, 0) >= backfill_per_user:
                waiting.defer(job)
                continue
            last = (job, len(p.starts))
        need = job.workers * job.gpus_per_worker
        reason = p.too_large(job) or p.quota(job, need)
        if reason is not None:
            waiting[job.id] = reason
            continue

        if head is None:
            nodes = free.place(job.workers, job.gpus_per_worker, _end(p, job))
            if nodes is not None:
                p.start(job, nodes)
                continue
            # The head: first job in order that does not fit.
            head = p.head = job
            head_prio = p.policy.base_priority(job)
            head_level = level[job.id]
            if preemption:
                victims = p.choose_victims(job)
            res_time, free_then = p.reservation(job, victims)
            msg = f"waiting for {_gpus(need)}: {free.total} of {cap_total} free"
            hold_off = reserve_after - (now - job.submitted_at)
            estimate = None
            if victims:
                msg += "; preempting " + ", ".join(v.id for v in victims) + " to make room"
            elif res_time is None:
                msg += "; no start time can be promised (the GPUs it needs are held without a time limit)"
            elif backfill and hold_off > 0:
                estimate = res_time
                msg += (f"; expected to start in about {_fmt_delay(res_time - now)} (running work's time limits), "
                        f"GPUs will be reserved for it once it has waited {_fmt_delay(reserve_after)}")
                res_time = None  # not protected yet: backfill is unconstrained (but needs a time limit)
            else:
                msg += f"; expected to start in {_fmt_delay(res_time - now)} at the latest"
            waiting[job.id] = WaitReason(job.id, "no-gpus", msg, None, res_time,
                                         res_time if estimate is None else estimate)
            if backfill:
                if res_time is not None:
                    held = _reserve_placement(free_then, free.free, job.workers, job.gpus_per_worker)
                    spare = {n: f - held.get(n, 0) for n, f in free_then.items()}
                    long_free = FreeIndex({n: min(f, spare[n]) for n, f in free.free.items()}, p.kmax, free.ends)
            else:
                order.frozen = True
            continue

        # Behind the head.
        if backfill and scanned >= backfill_depth and backfill_per_user and free.total and not per_user:
            per_user = True
            last = (job, len(p.starts))
        if not backfill or (scanned >= backfill_depth and not per_user) or free.total == 0:
            # Nothing else can start: record the rest of the queue, explained on demand.
            order.frozen = True
            waiting[job.id] = _behind(job, need, free.total, cap_total, head, head_prio, head_level, level)
            for rest in queue:
                waiting.defer(rest)
            break
        scanned += 1
        if not free.fits(job.workers, job.gpus_per_worker):
            waiting.defer(job)  # (issue 32: explained with what is free once the pass is done)
            continue
        limit = job.time_limit
        if limit is not None and (res_time is None or now + limit <= res_time):
            # Ends before the head's reservation (or nothing is reserved): any free GPUs will do.
            nodes = free.place(job.workers, job.gpus_per_worker, _end(p, job))
            if long_free is not None:
                for n in nodes:
                    long_free.set(n, min(free.free[n], spare[n]))
            p.start(job, nodes, backfill=True)
            continue
        # May run past the reservation: only on GPUs the head will not need then.
        # ... and, placed end-aligned, only beside work that lasts as long (no node kept from draining)
        nodes = long_free.place(job.workers, job.gpus_per_worker, _end(p, job), extend=False) if long_free is not None else None
        if nodes is None:
            if long_free is not None and long_free.fits(job.workers, job.gpus_per_worker):
                msg = (f"{_gpus(need)} {'is' if need == 1 else 'are'} free but held for {_named(head.id)} (reserved to start in "
                       f"{_fmt_delay(res_time - now)}) or on nodes left to drain for large jobs: this job "
                       + ("has no time limit" if limit is None else f"may run {_fmt_delay(limit)}")
                       + ", longer than the work running there")
            elif limit is None:
                msg = (f"{_gpus(need)} {'is' if need == 1 else 'are'} free but held for {_named(head.id)}; a job without a time limit "
                       "may only use GPUs that job will not need")
            else:
                msg = (f"{_gpus(need)} {'is' if need == 1 else 'are'} free but held for {_named(head.id)}, reserved to start in "
                       f"{_fmt_delay(res_time - now)}; this job's time limit of {_fmt_delay(limit)} "
                       "would delay it")
            waiting[job.id] = WaitReason(job.id, "reserved", msg, head.id, res_time)
            continue
        g = job.gpus_per_worker
        for n in nodes:
            spare[n] -= g
            free.set(n, free.free[n] - g)
        p.start(job, nodes, backfill=True)

    return Plan(
        starts=tuple(p.starts),
        preempt=tuple(v.id for v in victims),
        waiting=waiting,
        head=head.id if head is not None else None,
    )


def _behind(job, need, free_total, cap_total, head, head_prio, head_level, level) -> WaitReason:
    code = "behind"
    msg = f"waiting for {_gpus(need)}: {free_total} of {cap_total} free; behind {_named(head.id)} (priority {head_prio})"
    if level[job.id] == head_level and job.submitted_at < head.submitted_at and job.user != head.user:
        code = "fair-share"
        msg = (
            f"waiting for {_gpus(need)}: {free_total} of {cap_total} free; behind {_named(head.id)} of "
            f"{head.user}, who holds fewer GPUs (fair share)"
        )
    return WaitReason(job.id, code, msg, head.id)


def _reserve_placement(free_then: Mapping[str, int], free_now: Mapping[str, int], workers: int, g: int) -> dict[str, int]:
    """Where the head's gang goes at its reserved start, chosen to leave the most GPUs for backfill.

    Every node that fits a worker at the reservation is a candidate; each worker takes the one whose
    GPUs are least usable *now* (busy until then), so that currently free GPUs stay available to
    long backfill jobs; ties go to the best fit at the reservation, then node order.
    """
    spare = dict(free_then)
    held: dict[str, int] = {}
    for _ in range(workers):
        best = None
        best_key = None
        for node, x in spare.items():
            if x < g:
                continue
            f = free_now.get(node, 0)
            loss = min(f, x) - min(f, x - g)
            key = (loss, x)
            if best_key is None or key < best_key:
                best, best_key = node, key
        if best is None:
            break
        spare[best] -= g
        held[best] = held.get(best, 0) + g
    return held
