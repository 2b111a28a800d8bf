"""The order in which one pass meets the queue: effective priority, fair share, submit time, drawn lazily from
the :class:`~trainhub.scheduler.queue.PendingQueue`'s sorted lists (a pass costs what it examines)."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from .model import JobRequest
from .queue import PendingQueue


class Levels(dict):
    """Effective priority per job id, worked out when first asked (a pass asks for few of them)."""

    __slots__ = ("_fn",)

    def __init__(self, fn):
        super().__init__()
        self._fn = fn

    def __missing__(self, job_id):
        value = self[job_id] = self._fn(job_id)
        return value


class QueueOrder:
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
