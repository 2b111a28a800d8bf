"""The pending queue kept in scheduling order between passes, so a pass never sorts the whole queue.

A policy orders GPU jobs by effective priority (base priority plus aging), then submit time. Aging
changes levels as time passes, so no single order holds for ever; but among jobs of the same base
priority, an older job always has at least the level of a newer one. The queue therefore keeps one
list per *(lane, priority class)* sorted by ``(submitted_at, id)`` -- lanes are users (fair share)
or one shared lane -- and a pass merges the few list heads of each lane at the current time. Adding
or removing a job is a binary search plus an insert (O(log n) comparisons); a pass costs what it
examines, not the length of the queue.

Used by :meth:`~trainhub.scheduler.policy.Scheduler.schedule` when it is given one (the jobs
service and the simulator keep one across passes); a plain sequence is indexed afresh each pass.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

from .model import JobRequest

ALL = None  # the shared lane (policies without fair share); user lanes are named by strings


def priority_class(job: JobRequest) -> tuple:
    """Jobs in one class share their base priority under any policy: the same own priority and,
    for priority 0 (unset, which group defaults may fill in), the same groups."""
    return (job.priority, job.groups if job.priority == 0 else ())


class PendingQueue:
    """Pending jobs by id, with GPU jobs indexed per lane and priority class; see the module doc.

    ``version`` counts changes, and every job remembers the version it was added at, so a pass's
    lazily explained reasons can tell the jobs it saw from those added since.
    """

    __slots__ = ("_jobs", "_added", "_cpu", "_lanes", "version", "gpu_jobs")

    def __init__(self, jobs: Iterable[JobRequest] = ()):
        self._jobs: dict[str, JobRequest] = {}
        self._added: dict[str, int] = {}
        self._cpu: dict[str, JobRequest] = {}
        # lane (user, or ALL) -> priority class -> [(submitted_at, id, job)] sorted
        self._lanes: dict[str | None, dict[tuple, list]] = {}
        self.version = 0
        self.gpu_jobs = 0
        pending = []
        for job in jobs:
            if job.id in self._jobs:
                raise ValueError(f"job {job.id!r} is twice in the pending jobs")
            self._jobs[job.id] = job
            self._added[job.id] = 0
            if job.gpus_per_worker > 0:
                pending.append(job)
            else:
                self._cpu[job.id] = job
        self.gpu_jobs = len(pending)
        for job in pending:  # bulk: append, then one sort per list
            entry = (job.submitted_at, job.id, job)
            cls = priority_class(job)
            for lane in (job.user, ALL):
                self._lanes.setdefault(lane, {}).setdefault(cls, []).append(entry)
        for classes in self._lanes.values():
            for lst in classes.values():
                lst.sort(key=_entry_key)

    # -- changes ---------------------------------------------------------------------------------
    def add(self, job: JobRequest) -> None:
        """Queue ``job`` (replacing a queued job with the same id)."""
        if job.id in self._jobs:
            self.remove(job.id)
        self.version += 1
        self._jobs[job.id] = job
        self._added[job.id] = self.version
        if job.gpus_per_worker <= 0:
            self._cpu[job.id] = job
            return
        self.gpu_jobs += 1
        entry = (job.submitted_at, job.id, job)
        cls = priority_class(job)
        for lane in (job.user, ALL):
            lst = self._lanes.setdefault(lane, {}).setdefault(cls, [])
            lst.insert(bisect.bisect_right(lst, _entry_key(entry), key=_entry_key), entry)

    def remove(self, job_id: str) -> JobRequest | None:
        """Take ``job_id`` out of the queue (started, cancelled); ``None`` if it was not queued."""
        job = self._jobs.pop(job_id, None)
        if job is None:
            return None
        self.version += 1
        del self._added[job_id]
        if job.gpus_per_worker <= 0:
            del self._cpu[job_id]
            return job
        self.gpu_jobs -= 1
        key = (job.submitted_at, job.id)
        cls = priority_class(job)
        for lane in (job.user, ALL):
            classes = self._lanes[lane]
            lst = classes[cls]
            i = bisect.bisect_left(lst, key, key=_entry_key)
            del lst[i]
            if not lst:
                del classes[cls]
                if not classes:
                    del self._lanes[lane]
        return job

    # -- reading ---------------------------------------------------------------------------------
    def get(self, job_id: str) -> JobRequest | None:
        return self._jobs.get(job_id)

    def added_at(self, job_id: str) -> int | None:
        """The ``version`` at which ``job_id`` was queued (``None``: not queued)."""
        return self._added.get(job_id)

    def __contains__(self, job_id) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[JobRequest]:
        return iter(list(self._jobs.values()))

    def ids(self) -> Iterator[str]:
        return iter(list(self._jobs))

    def cpu_jobs(self) -> list[JobRequest]:
        return list(self._cpu.values())

    def lanes(self, fair_share: bool) -> list[list[list]]:
        """Per lane (each user, or one shared lane), its sorted lists, one per priority class."""
        if not fair_share:
            classes = self._lanes.get(ALL)
            return [list(classes.values())] if classes else []
        return [list(classes.values()) for lane, classes in self._lanes.items() if lane is not ALL]


def _entry_key(entry) -> tuple:
    return entry[0], entry[1]
