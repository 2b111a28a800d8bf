"""Scheduling policies: the documented base class, the FIFO baseline and trainhub's policy.

``schedule()`` is a pure function of its arguments and the configuration: no I/O, no clock reads,
no randomness, and it never mutates its inputs. Every policy runs the same pass (:mod:`.passes`, where
its steps are written down) over the queue in its order (:mod:`.order`); the policies differ in the
levels they give jobs and the options they run the pass with. Why a job waits: :mod:`.reasons`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from traitlets import Bool, Dict, Enum, Float, Integer
from traitlets.config import LoggingConfigurable

from .model import Allocation, JobRequest, Plan, Quotas
from .order import Levels, QueueOrder
from .passes import Pass, as_queue, run_pass
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


class FifoGangScheduler(Scheduler):
    """Baseline: strict FIFO by submit time, best-fit gang placement, head-of-line blocking.

    No backfill, no preemption, no priorities. Jobs that can never start (too large, over quota)
    are skipped rather than blocking everyone behind them.
    """

    def schedule(self, now, pending, running, capacity, quotas):
        queue = as_queue(pending)
        level = Levels(lambda job_id: 0)
        p = Pass(self, now, queue, running, capacity, quotas, level)
        p.start_cpu_jobs(queue.cpu_jobs())
        order = QueueOrder(queue, level, {}, {}, fair_share=False)
        return run_pass(p, order, backfill=False, preemption=False, backfill_depth=0)


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

        level = Levels(level_of)
        p = Pass(self, now, queue, running, capacity, quotas, level)
        p.start_cpu_jobs(queue.cpu_jobs())
        order = QueueOrder(queue, level, p.user_held, p.group_held, self.fair_share)
        return run_pass(
            p, order,
            backfill=self.backfill and self.backfill_depth > 0,
            preemption=self.preemption,
            backfill_depth=self.backfill_depth,
            reserve_after=self.reserve_after,
            preemptible_backfill=self.preemptible_backfill and self.preemption and self.backfill,
            backfill_per_user=self.backfill_per_user,
        )
