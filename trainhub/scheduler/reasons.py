"""Why a job waits: the messages a pass gives, and :class:`Reasons`, the ``Plan.waiting`` that works out the
reasons of the jobs a pass never reached only when someone asks (``GET /jobs/{id}``, ``trainhub jobs why``)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from trainhub.fmt import fmt_duration

from .model import JobRequest, WaitReason
from .queue import PendingQueue


def gpus_text(n: int) -> str:
    return f"{n} GPU{'' if n == 1 else 's'}"


def named(request_id: str) -> str:
    """How a message names what it waits behind: job ids get "job "; other requests (a notebook
    server in line: "alice's notebook server") are named by their id."""
    return request_id if " " in request_id else f"job {request_id}"


def fmt_delay(seconds: float) -> str:
    """A delay rounded up to the second (a promise must not be early): 7s, 1m05s, 2h00m."""
    return fmt_duration(math.ceil(seconds), "units")


def behind(job, need, free_total, cap_total, head, head_prio, head_level, level) -> WaitReason:
    code = "behind"
    msg = f"waiting for {gpus_text(need)}: {free_total} of {cap_total} free; behind {named(head.id)} (priority {head_prio})"
    if level[job.id] == head_level and job.submitted_at < head.submitted_at and job.user != head.user:
        code = "fair-share"
        msg = (
            f"waiting for {gpus_text(need)}: {free_total} of {cap_total} free; behind {named(head.id)} of "
            f"{head.user}, who holds fewer GPUs (fair share)"
        )
    return WaitReason(job.id, code, msg, head.id)


class Reasons(Mapping):
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
