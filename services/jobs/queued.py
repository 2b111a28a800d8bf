"""The engine's in-memory copy of the queued jobs, kept in step with the database by small deltas.

Reading every queued job from the database on each scheduling pass costs O(queue) rows per pass
(a second or more at 100,000 jobs). Instead the engine keeps the queue as a
:class:`~trainhub.scheduler.queue.PendingQueue` and, per pass, asks only for what changed:

- rows queued with an id above the largest seen (new submissions: ids only grow);
- the number of queued rows. When it matches the copy plus the new rows, nothing else changed;
  otherwise (a queued job cancelled, a job requeued) the queued ids are read and compared, and
  only the rows not in the copy are read in full. ``full=True`` forces that comparison.

Only the columns the scheduler needs are read (no JSON blobs, no ORM objects).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import bindparam, func, select

from trainhub.db import SQLiteReader, get_engine
from trainhub.fmt import as_utc
from trainhub.scheduler import JobRequest, PendingQueue
from trainhub.states import QUEUED

from .models import Job, job_key

_COLUMNS = (Job.id, Job.user, Job.groups, Job.workers, Job.gpus, Job.priority, Job.created, Job.time_limit,
            Job.preemptible, Job.attempt)
_QUEUED = (Job.state == QUEUED, Job.cancel_requested.is_(False))
_CHUNK = 500  # ids per IN (...) query
# built once: the per-pass reads go through trainhub.db.SQLiteReader on SQLite, which prepares each once
_ALL = select(*_COLUMNS).where(*_QUEUED)
_NEW = select(*_COLUMNS).where(*_QUEUED, Job.id > bindparam("max_id"))
_COUNT = select(func.count()).select_from(Job).where(*_QUEUED)
_IDS = select(Job.id).where(*_QUEUED)


@dataclass
class Delta:
    rows: list = field(default_factory=list)  # rows to (re)queue
    ids: set[int] | None = None  # when set: exactly the queued ids now (the others left the queue)


def request(row) -> JobRequest:
    """A queued row as the scheduler sees it (ids are the job keys users see: j-000042)."""
    created = row.created
    if created is None:
        submitted = 0.0
    else:
        submitted = as_utc(created).timestamp()
    return JobRequest(id=job_key(row.id), user=row.user, groups=tuple(row.groups or ()), workers=row.workers,
                      gpus_per_worker=row.gpus, priority=row.priority, submitted_at=submitted,
                      time_limit=row.time_limit, preemptible=bool(row.preemptible), restarts=max(row.attempt - 1, 0))


class QueuedJobs:
    """The queued jobs as a :class:`PendingQueue` (``queue``), ids mapped to keys in ``keys``."""

    def __init__(self, db_url: str):
        self.db_url = db_url
        self.queue = PendingQueue()
        self.keys: dict[int, str] = {}  # job id -> key, for the jobs in ``queue``
        self.max_id = 0
        self.loaded = False
        self.reader = SQLiteReader.for_engine(get_engine(db_url))

    def fetch(self, full: bool = False) -> Delta:
        """What changed since the last :meth:`apply` (blocking: on SQLite a few small reads, else run it in a thread)."""
        if self.reader is not None:
            with self.reader.snapshot():
                return self._fetch(self.reader.rows, full)
        with get_engine(self.db_url).connect() as c:
            return self._fetch(lambda stmt, params=None: list(c.execute(stmt, params or {})), full)

    def _fetch(self, rows, full: bool) -> Delta:
        if not self.loaded:
            found = rows(_ALL)
            return Delta(found, {r.id for r in found})
        new = rows(_NEW, {"max_id": self.max_id})
        if not full:
            count = rows(_COUNT)[0][0]
            if count == len(self.keys) + len(new):
                return Delta(new)
        ids = {r[0] for r in rows(_IDS)}
        have = {r.id for r in new}
        missing = sorted(i for i in ids if i not in self.keys and i not in have)
        with get_engine(self.db_url).connect() as c:  # rare (a cancel or requeue): an expanding IN (...)
            for k in range(0, len(missing), _CHUNK):
                new += c.execute(select(*_COLUMNS).where(*_QUEUED, Job.id.in_(missing[k:k + _CHUNK])))
        return Delta(new, ids)

    def apply(self, delta: Delta) -> None:
        if delta.ids is not None:
            for job_id in [i for i in self.keys if i not in delta.ids]:
                self.discard(job_id)
        for row in delta.rows:
            self.queue.add(request(row))
            self.keys[row.id] = job_key(row.id)
            self.max_id = max(self.max_id, row.id)
        self.loaded = True

    def discard(self, job_id: int) -> None:
        """``job_id`` left the queue (started, cancelled)."""
        key = self.keys.pop(job_id, None)
        if key is not None:
            self.queue.remove(key)
