"""Scheduling policies: the documented base class, the FIFO baseline and trainhub's policy.

``schedule()`` is a pure function of its arguments and the configuration: no I/O, no clock reads,
no randomness, and it never mutates its inputs. One pass walks the queue once, in policy order:

1. CPU-only jobs start unless that would put their user over the CPU worker quota (``quota-cpu``)
   or ``max_cpu_jobs`` are already running (GPUs never block them).
2. A GPU job that can never fit gets ``too-large``; one that would break a user or group quota gets
   ``quota-user``/``quota-group`` and is skipped (it does not block the jobs behind it).
3. Jobs start, placed end-aligned (trainhub; see :mod:`.placement`) or best fit (FIFO), until the
   first one that does not fit: the *head*. The head gets a
   reservation: the earliest time its gang fits, replaying the running jobs' ends
   (``started_at + time_limit``; unknown limits never end).
4. FIFO stops there (head-of-line blocking). Trainhub may preempt lower-priority preemptible jobs for
   the head, then backfills (EASY): a later job starts now only if it fits now and either ends before
   the reservation or uses GPUs the head does not need at that time. With ``preemptible_backfill``
   a preemptible job may also take GPUs held for the head: it *overtook* the head (started while
   the head waited, at no higher priority), so the head preempts it when it needs those GPUs, and
   the reservation counts its GPUs as free from now.

A pass walks the queue in that order only as far as it can start something (the head, then
``backfill_depth`` jobs, then each user's next ``backfill_per_user`` jobs that do not start, so that one
user's long queue that cannot start never hides another user's startable jobs); the reasons of the jobs
it never reaches are worked out on demand (``Plan.waiting``), and with a
:class:`~trainhub.scheduler.queue.PendingQueue` the order itself is kept between passes: a pass costs what
it examines, not the length of the queue.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping, Sequence

from traitlets import Bool, Dict, Enum, Float, Integer
from traitlets.config import LoggingConfigurable

from trainhub.fmt import fmt_duration

from .model import Allocation, JobRequest, Plan, Quotas, Start, WaitReason
from .placement import FreeIndex, free_gpus, node_ends
from .queue import PendingQueue


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
        pending: Sequence[JobRequest] | PendingQueue,
        running: Sequence[Allocation],
        capacity: Mapping[str, int],
        quotas: Quotas,
    ) -> Plan:
        """One pass. ``capacity`` is total GPUs per node; free = capacity minus ``running``.

        ``pending`` may be a :class:`~trainhub.scheduler.queue.PendingQueue` kept across passes (then
        a pass costs what it examines); any other sequence is indexed afresh (O(n log n))."""
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
    """``Plan.waiting``: a read-only mapping job id -> WaitReason for every pending job not started.

    A pass records the reasons it works out on its way (the head, backfill candidates, quota
    refusals). Once it can start no more GPU jobs it stops; every job it did not reach -- often
    all but a few hundred of a long queue -- is explained on first access against the final state
    of the pass, which no longer changes. Jobs queued after the pass are not in it. Converting with
    ``dict(plan.waiting)`` materialises everything.
    """

    __slots__ = ("_done", "_explain", "_queue", "_version", "_started", "_rest", "_count")

    def __init__(self, explain, queue: PendingQueue, started: set):
        self._done: dict[str, WaitReason] = {}
        self._explain = explain
        self._queue = queue
        self._version = queue.version
        self._count = len(queue)
        self._started = started
        self._rest = False  # set when the pass stopped before reaching every job

    def __setitem__(self, job_id: str, reason: WaitReason) -> None:  # used by the pass only
        self._done[job_id] = reason

    def rest_on_demand(self) -> None:
        self._rest = True

    def later(self, job: JobRequest) -> None:
        """Keep ``job``'s place in the order, its reason worked out on access against the final state of the
        pass (a job that waits behind the head while later ones start: "n of m free" is what is left after them)."""
        self._done[job.id] = job

    def _unreached(self, job_id) -> JobRequest | None:
        if not self._rest or job_id in self._started:
            return None
        added = self._queue.added_at(job_id)
        if added is None or added > self._version:
            return None
        return self._queue.get(job_id)

    def __getitem__(self, job_id: str) -> WaitReason:
        reason = self._done.get(job_id)
        if reason is None:
            job = self._unreached(job_id)
            if job is None:
                raise KeyError(job_id)
            reason = self._done[job_id] = self._explain(job)
        elif type(reason) is JobRequest:  # later()
            reason = self._done[job_id] = self._explain(reason)
        return reason

    def __iter__(self):
        """Jobs the pass reached, in the order it did; then the others in the order they were queued."""
        done = list(self._done)
        yield from done
        if self._rest:
            seen = set(done)
            for job_id in self._queue.ids():
                if job_id not in seen and self._unreached(job_id) is not None:
                    yield job_id

    def __len__(self) -> int:
        if not self._rest:
            return len(self._done)
        if self._queue.version == self._version:
            return self._count - len(self._started)
        return sum(1 for _ in self)

    def __contains__(self, job_id) -> bool:
        return job_id in self._done or self._unreached(job_id) is not None

    def __repr__(self) -> str:
        return f"{{{', '.join(f'{k!r}: {v!r}' for k, v in self.items())}}}"


class _Levels(dict):
    """Effective priority per job id, worked out when first asked (a pass asks for few of them)."""

    __slots__ = ("_fn",)

    def __init__(self, fn):
        super().__init__()
        self._fn = fn

    def __missing__(self, job_id):
        value = self[job_id] = self._fn(job_id)
        return value


class _Order:
    """Queue order as an iterator over the queue's sorted lists (see :mod:`.queue`).

    Each lane (a user with fair share on, else one lane for all) yields its jobs by
    ``(-level, submitted_at, id)``: a merge of its priority-class lists, each already in that order.
    With fair share on, lanes sit in a lazy min-heap keyed by
    ``(-level, group GPUs held, user GPUs held, submitted_at, id)`` of their next job. GPU holdings
    only grow during a pass, so a popped key that is stale is pushed back with its current value and
    the pop retried: the job yielded is always the true minimum under the *current* holdings.

    :meth:`per_user` switches a running iteration to a budget per user: from the job just yielded on,
    a user's jobs stop once ``budget`` of them did not start (backfill past its depth looks at every
    user's first jobs, never at all of a long queue). The order of what is still yielded is unchanged;
    without fair share the shared lane is replaced by the users' own lanes past the last job yielded.
    """

    def __init__(self, queue: PendingQueue, level, user_held, group_held, fair_share: bool):
        self.queue = queue
        self.level = level
        self.user_held = user_held
        self.group_held = group_held
        self.fair = fair_share
        self.lanes = queue.lanes(fair_share)
        self.budget: int | None = None  # per user, once per_user() was called
        self.started: set = set()
        self.misses: dict[str, int] = {}  # per user: jobs yielded since per_user() that did not start

    def per_user(self, budget: int, started: set) -> None:
        """From the job last yielded on, yield at most ``budget`` jobs per user that are not in ``started``."""
        self.budget, self.started = budget, started

    def _spent(self, job: JobRequest) -> bool:
        """After ``job`` was yielded under a budget: True when its user's budget is now used up."""
        if job.id in self.started:
            return False
        user = job.user
        n = self.misses[user] = self.misses.get(user, 0) + 1
        return n >= self.budget

    def _lane(self, lists) -> list:
        """A lane's cursor: a heap of ``(-level, submitted_at, id, list index, position)`` of its
        lists' heads (levels do not change within a pass, so the heap never goes stale)."""
        level = self.level
        heap = []
        for i, lst in enumerate(lists):
            submitted, job_id, _job = lst[0]
            heap.append((-level[job_id], submitted, job_id, i, 0))
        heapq.heapify(heap)
        return heap

    def _next(self, lists, lane) -> JobRequest | None:
        """Take the lane's next job (``None`` when the lane is empty)."""
        if not lane:
            return None
        _l, _s, _id, i, k = lane[0]
        lst = lists[i]
        job = lst[k][2]
        k += 1
        if k < len(lst):
            submitted, job_id, _job = lst[k]
            heapq.heapreplace(lane, (-self.level[job_id], submitted, job_id, i, k))
        else:
            heapq.heappop(lane)
        return job

    def __iter__(self) -> Iterator[JobRequest]:
        if not self.fair:
            return self._shared()
        lanes = self.lanes
        cursors = [self._lane(lists) for lists in lanes]
        entry = self._keyer()
        heap = [entry(self._next(lists, cursors[n]), n) for n, lists in enumerate(lanes)]
        heapq.heapify(heap)
        return self._merge(heap, lanes, cursors)

    def _shared(self) -> Iterator[JobRequest]:
        """Without fair share: the one shared lane, then (:meth:`per_user`) the users' own lanes."""
        for lists in self.lanes:
            lane = self._lane(lists)
            while (job := self._next(lists, lane)) is not None:
                yield job
                if self.budget is not None:
                    yield from self._user_lanes_after(job)
                    return

    def _keyer(self):
        """The heap entry of a lane's next job: ``(-level, group GPUs, user GPUs, submitted_at, id, lane, job)``,
        holdings only with fair share (a closure over locals: it runs once per job yielded)."""
        level, user_held, group_held = self.level, self.user_held, self.group_held
        if not self.fair:
            return lambda job, n: (-level[job.id], 0, 0, job.submitted_at, job.id, n, job)

        def entry(job, n):
            groups = job.groups
            if not groups:
                gshare = 0
            elif len(groups) == 1:
                gshare = group_held.get(groups[0], 0)
            else:
                gshare = max(group_held.get(g, 0) for g in groups)
            return (-level[job.id], gshare, user_held.get(job.user, 0), job.submitted_at, job.id, n, job)

        return entry

    def _merge(self, heap, lanes, cursors) -> Iterator[JobRequest]:
        """Yield from the lanes' heap in order. Only the holdings part of an entry can go stale, so only
        that is recomputed when an entry reaches the top."""
        entry, fair = self._keyer(), self.fair
        while heap:
            top = heap[0]
            job, n = top[6], top[5]
            if fair:
                current = entry(job, n)
                if current[1] > top[1] or current[2] > top[2]:
                    heapq.heapreplace(heap, current)
                    continue
            yield job
            if self.budget is not None and self._spent(job):
                heapq.heappop(heap)  # this user's jobs are done for this pass
                continue
            job = self._next(lanes[n], cursors[n])
            if job is not None:
                heapq.heapreplace(heap, entry(job, n))
            else:
                heapq.heappop(heap)

    def _user_lanes_after(self, last: JobRequest) -> Iterator[JobRequest]:
        """Without fair share, once :meth:`per_user` is on: the rest of the shared lane's order, drawn from
        each user's own lane past ``last`` (the same order, by ``(-level, submitted_at, id)``)."""
        skip_user = last.user if self._spent(last) else None
        cut = (-self.level[last.id], last.submitted_at, last.id)
        entry = self._keyer()
        lanes, cursors, heap = [], [], []
        for lists in self.queue.lanes(True):
            if skip_user is not None and lists[0][0][2].user == skip_user:
                continue
            cursor = self._lane(lists)
            while cursor and cursor[0][:3] <= cut:  # yielded before the switch
                self._next(lists, cursor)
            if cursor:
                n = len(lanes)
                lanes.append(lists)
                cursors.append(cursor)
                heap.append(entry(self._next(lists, cursor), n))
        heapq.heapify(heap)
        yield from self._merge(heap, lanes, cursors)


class _Pass:
    """State of one scheduling pass (built fresh per call: nothing survives between passes)."""

    def __init__(self, policy: Scheduler, now, queue: PendingQueue, running, capacity, quotas, level):
        self.policy = policy
        self.queue = queue
        self.now = now
        self.running = running
        self.capacity = capacity
        self.quotas = quotas
        self.level = level
        self.cap_total = sum(capacity.values())
        self.kmax = max(capacity.values(), default=0)
        # end-aligned placement (TrainhubScheduler.placement); None: best fit by free count only
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
        self.started_ids: set[str] = set()
        self.waiting = _Reasons(self.explain, queue, self.started_ids)
        self.head: JobRequest | None = None  # set by _run when the first job does not fit
        self.overtake = False  # preemptible jobs that overtook the head may be preempted for it (preemptible_backfill)
        self.slots_cache: dict[int, int] = {}

    # -- checks ------------------------------------------------------------------------------
    def end_of(self, job: JobRequest) -> float | None:
        """The job's latest end for end-aligned placement (``inf`` without a time limit); ``None``: best fit."""
        if not self.aligned:
            return None
        return math.inf if job.time_limit is None else self.now + job.time_limit

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
        self.started_ids.add(job.id)
        need = job.workers * g
        self.user_held[job.user] = self.user_held.get(job.user, 0) + need
        for grp in job.groups:
            self.group_held[grp] = self.group_held.get(grp, 0) + need

    def start_cpu_jobs(self, jobs: list[JobRequest]) -> None:
        limit = self.policy.max_cpu_jobs
        jobs.sort(key=lambda j: (-self.level[j.id], j.submitted_at, j.id))
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
            self.started_ids.add(job.id)

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
    def overtakers(self, head: JobRequest) -> list[Allocation]:
        """Running preemptible jobs that overtook ``head``: started after it was queued, at no higher base
        priority and level, and queued behind it again once preempted (so it is no ping-pong); [] unless
        ``overtake``. The head may preempt them whatever their priority, and its reservation counts their GPUs
        as free from now."""
        if not self.overtake:
            return []
        base, requeue_level, now = self.policy.base_priority, self.policy.requeue_level, self.now
        hp, hl = base(head), self.level[head.id]
        fair = getattr(self.policy, "fair_share", False)
        out = []
        for a in self.running:
            if a.kind != "job" or not a.preemptible or a.gpus <= 0 or a.started_at <= head.submitted_at or base(a) > hp:
                continue
            lv = requeue_level(a, now)
            if lv > hl:
                continue
            if lv == hl:  # equal level: it must come after the head in queue order once requeued
                since = a.started_at if a.submitted_at is None else a.submitted_at
                mine = (self._shares(a.user, a.groups, a.gpus) if fair else ()) + (since, a.id)
                theirs = (self._shares(head.user, head.groups, 0) if fair else ()) + (head.submitted_at, head.id)
                if mine <= theirs:
                    continue
            out.append(a)
        return out

    def _shares(self, user: str, groups, minus: int) -> tuple[int, int]:
        """(group GPUs held, user GPUs held) as fair share orders them, less ``minus`` GPUs given back."""
        g = max((self.group_held.get(x, 0) - minus for x in groups), default=0)
        return g, self.user_held.get(user, 0) - minus

    def choose_victims(self, head: JobRequest, overtakers: Sequence[Allocation] = ()) -> list[Allocation]:
        """An irreducible set of lower-priority preemptible jobs (or ``overtakers`` of the head) whose GPUs
        let ``head`` fit now.

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
        known = {a.id for a in cands}
        cands += [a for a in overtakers if a.id not in known]
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
        queue = as_queue(pending)
        level = _Levels(lambda job_id: 0)
        p = _Pass(self, now, queue, running, capacity, quotas, level)
        p.start_cpu_jobs(queue.cpu_jobs())
        order = _Order(queue, level, {}, {}, fair_share=False)
        return _run(p, order, backfill=False, preemption=False, backfill_depth=0)


class TrainhubScheduler(Scheduler):
    """Priorities with aging, fair share, EASY backfill, preemption, end-aligned gang placement.

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
    backfill_per_user = Integer(
        1,
        config=True,
        help="""Once ``backfill_depth`` jobs behind the head were examined, backfill goes on through each
        user's own next jobs in queue order until this many of that user's did not start (jobs that start
        do not count), then passes that user over for the rest of the pass, e.g. 4. So one user's queue that
        cannot start, however long, never keeps another user's startable jobs waiting while GPUs are free,
        and a pass examines at most depth + users x this jobs (plus those it starts). 0 = stop at the depth,
        as before issue 32 (the rest of the queue only gets the next pass's depth).""",
    )
    reserve_after = Float(
        3600.0,
        config=True,
        help="""Seconds the head job must have waited before GPUs are held for its reservation, e.g.
        3600. Until then any later job with a time limit that fits may start (greedy), which keeps
        GPUs busy while large gangs wait; afterwards only backfill that cannot delay the head.
        0 = reserve at once (pure EASY backfill). Slurm's bf_min_age_reserve is the same idea.""",
    )
    placement = Enum(
        ["end-aligned", "best-fit"],
        "end-aligned",
        config=True,
        help="""Where a job's workers go among the nodes that hold them. "end-aligned": on a node whose
        running work (by time limits; none = for ever) already lasts at least as long as the job's time
        limit, fewest free GPUs first, else on the node whose work lasts longest, so long jobs share
        nodes and the others drain whole for gang jobs. "best-fit": the node with the fewest free
        GPUs, whatever runs there (the FIFO baseline's placement).""",
    )
    preemption = Bool(
        True,
        config=True,
        help="""Preempt running jobs marked preemptible whose priority is lower than the head
        job's base priority when that makes room for it. Servers are never preempted.""",
    )
    preemptible_backfill = Bool(
        False,
        config=True,
        help="""Let preemptible jobs backfill GPUs held for the head's reservation (with or without a
        time limit): the head preempts them when it needs those GPUs, as it does any preemptible job
        that overtook it at no higher priority. Keeps GPUs busy while a large gang waits. Needs
        ``backfill`` and ``preemption``. False: only jobs that end before the reservation or use GPUs
        the head will not need may backfill (the default until the open issue in docs/scheduler.md is
        settled).""",
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
        queue = as_queue(pending)
        interval, cap = self.aging_interval, self.aging_max
        base = self.base_priority if self.group_priorities else None  # (traits are slow to read)
        get = queue.get

        def level_of(job_id):
            job = get(job_id)
            lv = job.priority if base is None else base(job)
            if interval > 0:
                age = int((now - job.submitted_at) // interval)
                if age > 0:
                    lv += age if cap is None else min(age, cap)
            return lv

        level = _Levels(level_of)
        p = _Pass(self, now, queue, running, capacity, quotas, level)
        p.start_cpu_jobs(queue.cpu_jobs())
        order = _Order(queue, level, p.user_held, p.group_held, self.fair_share)
        return _run(
            p, order,
            backfill=self.backfill and self.backfill_depth > 0,
            preemption=self.preemption,
            backfill_depth=self.backfill_depth,
            reserve_after=self.reserve_after,
            preemptible_backfill=self.preemptible_backfill and self.preemption and self.backfill,
            backfill_per_user=self.backfill_per_user,
        )


def as_queue(pending) -> PendingQueue:
    """``pending`` as an indexed queue: as given when it is one, else indexed now (O(n log n))."""
    return pending if isinstance(pending, PendingQueue) else PendingQueue(pending)


def _run(
    p: _Pass, order: _Order, *, backfill: bool, preemption: bool, backfill_depth: int, reserve_after: float = 0.0,
    preemptible_backfill: bool = False, backfill_per_user: int = 0,
) -> Plan:
    """Walk the GPU jobs in ``order``; see the module docstring.

    Backfill examines ``backfill_depth`` jobs behind the head in order, then (``backfill_per_user`` > 0)
    goes on through every user's own next jobs, at most ``backfill_per_user`` per user that do not
    start: so that a user whose queue cannot start, however long, never keeps another user's startable
    jobs behind the depth while GPUs are free."""
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
    per_user = False  # past backfill_depth: each user's next jobs only (order.per_user)
    level = p.level
    cap_total = p.cap_total
    p.overtake = preemptible_backfill

    queue = iter(order)
    for job in queue:
        need = job.workers * job.gpus_per_worker
        reason = p.too_large(job) or p.quota(job, need)
        if reason is not None:
            waiting[job.id] = reason
            continue

        if head is None:
            nodes = free.place(job.workers, job.gpus_per_worker, p.end_of(job))
            if nodes is not None:
                p.start(job, nodes)
                continue
            # The head: first job in order that does not fit.
            head = p.head = job
            head_prio = p.policy.base_priority(job)
            head_level = level[job.id]
            overtakers = p.overtakers(job)
            if preemption:
                victims = p.choose_victims(job, overtakers)
            chosen = {v.id for v in victims}
            res_time, free_then = p.reservation(job, victims + [a for a in overtakers if a.id not in chosen])
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
            continue

        # Behind the head.
        if scanned >= backfill_depth and not per_user:
            if not backfill or free.total == 0 or not backfill_per_user:
                # Nothing else can start: record the rest of the queue, explained on demand.
                waiting[job.id] = _behind(job, need, free.total, cap_total, head, head_prio, head_level, level)
                waiting.rest_on_demand()
                break
            # Past the depth: every user's next jobs, a few each (this one first), not the rest of the queue.
            per_user = True
            order.per_user(backfill_per_user, p.started_ids)
            waiting.rest_on_demand()
        elif not backfill or free.total == 0:
            waiting[job.id] = _behind(job, need, free.total, cap_total, head, head_prio, head_level, level)
            waiting.rest_on_demand()
            break
        scanned += 1
        if not free.fits(job.workers, job.gpus_per_worker):
            waiting.later(job)  # behind the head, with what is free once the pass is done
            continue
        limit = job.time_limit
        if limit is not None and (res_time is None or now + limit <= res_time):
            # Ends before the head's reservation (or nothing is reserved): any free GPUs will do.
            nodes = free.place(job.workers, job.gpus_per_worker, p.end_of(job))
            if long_free is not None:
                for n in nodes:
                    long_free.set(n, min(free.free[n], spare[n]))
            p.start(job, nodes, backfill=True)
            continue
        # May run past the reservation: only on GPUs the head will not need then.
        # ... and, placed end-aligned, only beside work that lasts as long (no node kept from draining)
        nodes = long_free.place(job.workers, job.gpus_per_worker, p.end_of(job), extend=False) if long_free is not None else None
        if (nodes is None and preemptible_backfill and not victims and job.preemptible
                and p.policy.base_priority(job) <= head_prio):
            # It overtakes the head, which preempts it when it needs these GPUs (see _Pass.overtakers);
            # not while the head is about to start (victims being preempted for it now).
            nodes = free.place(job.workers, job.gpus_per_worker, p.end_of(job))
            if long_free is not None:
                for n in nodes:
                    long_free.set(n, min(free.free[n], spare[n]))
            p.start(job, nodes, backfill=True)
            continue
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
