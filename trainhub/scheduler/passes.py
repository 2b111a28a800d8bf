"""One scheduling pass, shared by every policy (the policies in :mod:`.policy` choose its options).

A pass is as pure as ``schedule()`` (no I/O, no clock reads, no randomness, its inputs never mutated) and
walks the queue once, in policy order:

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

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .model import Allocation, JobRequest, Plan, Start, WaitReason
from .order import QueueOrder
from .placement import FreeIndex, free_gpus, node_ends
from .queue import PendingQueue
from .reasons import Reasons, behind, fmt_delay, gpus_text, named

if TYPE_CHECKING:
    from .policy import Scheduler


def as_queue(pending) -> PendingQueue:
    """``pending`` as an indexed queue: as given when it is one, else indexed now (O(n log n))."""
    return pending if isinstance(pending, PendingQueue) else PendingQueue(pending)


class Pass:
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
        self.waiting = Reasons(self.explain, queue, self.started_ids)
        self.head: JobRequest | None = None  # set by run_pass when the first job does not fit
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
        return self.too_large(job) or self.quota(job, need) or behind(
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


def run_pass(
    p: Pass, order: QueueOrder, *, backfill: bool, preemption: bool, backfill_depth: int, reserve_after: float = 0.0,
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

    def start_on_free(job: JobRequest) -> None:
        """Backfill ``job`` onto any free GPUs; ``long_free`` (once the head is reserved) keeps only what is left."""
        nodes = free.place(job.workers, job.gpus_per_worker, p.end_of(job))
        if long_free is not None:
            for n in nodes:
                long_free.set(n, min(free.free[n], spare[n]))
        p.start(job, nodes, backfill=True)

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
            msg = f"waiting for {gpus_text(need)}: {free.total} of {cap_total} free"
            hold_off = reserve_after - (now - job.submitted_at)
            estimate = None
            if victims:
                msg += "; preempting " + ", ".join(v.id for v in victims) + " to make room"
            elif res_time is None:
                msg += "; no start time can be promised (the GPUs it needs are held without a time limit)"
            elif backfill and hold_off > 0:
                estimate = res_time
                msg += (f"; expected to start in about {fmt_delay(res_time - now)} (running work's time limits), "
                        f"GPUs will be reserved for it once it has waited {fmt_delay(reserve_after)}")
                res_time = None  # not protected yet: backfill is unconstrained (but needs a time limit)
            else:
                msg += f"; expected to start in {fmt_delay(res_time - now)} at the latest"
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
                waiting[job.id] = behind(job, need, free.total, cap_total, head, head_prio, head_level, level)
                waiting.rest_on_demand()
                break
            # Past the depth: every user's next jobs, a few each (this one first), not the rest of the queue.
            per_user = True
            order.per_user(backfill_per_user, p.started_ids)
            waiting.rest_on_demand()
        elif not backfill or free.total == 0:
            waiting[job.id] = behind(job, need, free.total, cap_total, head, head_prio, head_level, level)
            waiting.rest_on_demand()
            break
        scanned += 1
        if not free.fits(job.workers, job.gpus_per_worker):
            waiting.later(job)  # behind the head, with what is free once the pass is done
            continue
        limit = job.time_limit
        if limit is not None and (res_time is None or now + limit <= res_time):
            # Ends before the head's reservation (or nothing is reserved): any free GPUs will do.
            start_on_free(job)
            continue
        # May run past the reservation: only on GPUs the head will not need then.
        # ... and, placed end-aligned, only beside work that lasts as long (no node kept from draining)
        nodes = long_free.place(job.workers, job.gpus_per_worker, p.end_of(job), extend=False) if long_free is not None else None
        if (nodes is None and preemptible_backfill and not victims and job.preemptible
                and p.policy.base_priority(job) <= head_prio):
            # It overtakes the head, which preempts it when it needs these GPUs (see Pass.overtakers);
            # not while the head is about to start (victims being preempted for it now).
            start_on_free(job)
            continue
        if nodes is None:
            if long_free is not None and long_free.fits(job.workers, job.gpus_per_worker):
                msg = (f"{gpus_text(need)} {'is' if need == 1 else 'are'} free but held for {named(head.id)} (reserved to start in "
                       f"{fmt_delay(res_time - now)}) or on nodes left to drain for large jobs: this job "
                       + ("has no time limit" if limit is None else f"may run {fmt_delay(limit)}")
                       + ", longer than the work running there")
            elif limit is None:
                msg = (f"{gpus_text(need)} {'is' if need == 1 else 'are'} free but held for {named(head.id)}; a job without a time limit "
                       "may only use GPUs that job will not need")
            else:
                msg = (f"{gpus_text(need)} {'is' if need == 1 else 'are'} free but held for {named(head.id)}, reserved to start in "
                       f"{fmt_delay(res_time - now)}; this job's time limit of {fmt_delay(limit)} "
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
