"""The engine's in-memory copy of the queue (``services/jobs/queued.py``) follows the database through
its deltas, read through ``trainhub.db.SQLiteReader`` on SQLite or SQLAlchemy elsewhere, alike."""

from __future__ import annotations

import pytest

from trainhub.services.jobs.queued import QueuedJobs
from trainhub.services.jobs.store import JobStore
from trainhub.states import CANCELLED, QUEUED, RUNNING


def queued_ids(store):
    return sorted(j.id for j in store.in_states(QUEUED) if not j.cancel_requested)


@pytest.mark.parametrize("path", ["sqlite3", "sqlalchemy"])
def test_the_copy_follows_submissions_cancels_and_requeues(tmp_path, path):
    url = f"sqlite:///{tmp_path}/platform.db"
    store = JobStore(url)
    copy = QueuedJobs(url)
    assert copy.reader is not None
    if path == "sqlalchemy":
        copy.reader = None

    def add(n, **kw):
        return [store.create(user="ann", name="j", command="true", gpus=1, workers=1, groups=["lab"], **kw).id for _ in range(n)]

    def sync(full=False):
        copy.apply(copy.fetch(full))
        assert sorted(copy.keys) == queued_ids(store)
        assert sorted(r.id for r in copy.queue) == sorted(copy.keys[i] for i in copy.keys)

    ids = add(5)
    sync()
    request = copy.queue.get(copy.keys[ids[0]])
    assert request.user == "ann" and request.groups == ("lab",) and request.gpus_per_worker == 1 and request.submitted_at > 0
    add(3, priority=4)  # new ids only: the small delta
    sync()
    store.update(ids[1], state=CANCELLED)  # left the queue: the count differs, the ids are compared
    store.update(ids[2], state=RUNNING)
    sync()
    store.update(ids[2], state=QUEUED, attempt=1)  # requeued with an id below the largest seen
    sync()
    assert copy.queue.get(copy.keys[ids[2]]).restarts == 0
    store.update(ids[3], cancel_requested=True)
    sync(full=True)
    assert ids[3] not in copy.keys
