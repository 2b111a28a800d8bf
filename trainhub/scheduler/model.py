"""Value types exchanged with a :class:`~trainhub.scheduler.policy.Scheduler`.

All of them are frozen dataclasses: a scheduling pass reads them and returns new ones, it never
mutates its inputs. Times are seconds (epoch or virtual, the scheduler does not care which, as long
as ``now``, ``submitted_at`` and ``started_at`` use the same clock).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainhub.quotas import Quotas  # the admission rule's limits: the scheduler's quota view

__all__ = ["WAIT_CODES", "Allocation", "JobRequest", "Placement", "Plan", "Quotas", "Start", "WaitReason"]

Placement = tuple[tuple[str, int], ...]
"""One ``(node, gpus)`` entry per worker. CPU-only workers use node ``""`` (not pinned)."""

#: Wait-reason codes, in the order a job meets them.
WAIT_CODES = (
    "too-large",  # can never fit the cluster (more GPUs per worker than any node, or in total)
    "quota-user",  # starting it would put the user over their GPU quota
    "quota-group",  # starting it would put one of its groups over the group cap
    "quota-cpu",  # CPU-only job: starting it would put the user over their CPU worker quota
    "cpu-limit",  # CPU-only job and Scheduler.max_cpu_jobs are already running (extension)
    "no-gpus",  # the first blocked job in queue order: not enough free GPUs now
    "behind",  # a job earlier in queue order is waiting for GPUs
    "fair-share",  # as "behind", but the job ahead is there because its user holds fewer GPUs
    "reserved",  # GPUs are free now but held for the head job's reservation
)


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A queued job: ``workers`` gang-scheduled workers of ``gpus_per_worker`` GPUs each."""

    id: str
    user: str
    groups: tuple[str, ...] = ()
    workers: int = 1
    gpus_per_worker: int = 0
    priority: int = 0
    submitted_at: float = 0.0
    time_limit: float | None = None
    preemptible: bool = False
    restarts: int = 0

    @property
    def gpus(self) -> int:
        """Total GPUs of the gang."""
        return self.workers * self.gpus_per_worker if self.gpus_per_worker > 0 else 0


@dataclass(frozen=True, slots=True)
class Allocation:
    """Something holding GPUs now: a running job (``kind="job"``) or a notebook server."""

    id: str
    user: str
    groups: tuple[str, ...]
    placement: Placement
    kind: str = "job"
    priority: int = 0
    started_at: float = 0.0
    time_limit: float | None = None
    preemptible: bool = False
    submitted_at: float | None = None  # extension: when its job was queued (None = started_at)

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.placement)

    @property
    def end(self) -> float | None:
        """Latest time it can still hold its GPUs (``None`` = unknown, e.g. servers)."""
        return None if self.time_limit is None else self.started_at + self.time_limit


@dataclass(frozen=True, slots=True)
class Start:
    """Start job ``job_id`` now on ``placement`` (all workers of the gang)."""

    job_id: str
    placement: Placement
    backfill: bool = False  # extension: started in a gap ahead of a blocked head job


@dataclass(frozen=True, slots=True)
class WaitReason:
    """Why a pending job did not start in this pass; ``message`` is meant for the user."""

    job_id: str
    code: str
    message: str
    blocking_job: str | None = None
    reserved_start: float | None = None  # a promise: GPUs are held for it from then
    estimated_start: float | None = None  # not a promise: when running work's time limits free the GPUs (= reserved_start when reserved)


@dataclass(frozen=True)
class Plan:
    """The result of one pass. ``preempt``: job ids to stop (SIGTERM, grace, requeue)."""

    starts: tuple[Start, ...] = ()
    preempt: tuple[str, ...] = ()
    waiting: Mapping[str, WaitReason] = field(default_factory=dict)
    head: str | None = None  # extension: the blocked job that holds the reservation, if any
