"""The jobs API's reads and submissions go through SQLAlchemy Core (``JobStore.record``/``list``/``create``),
not the ORM the engine uses: they must answer exactly what the ORM's rows would, filter and page the same."""

from __future__ import annotations

import pytest

from trainhub.exceptions import NotFound
from trainhub.services.jobs.store import JobRecord, JobStore, job_to_dict
from trainhub.states import QUEUED, RUNNING, SUCCEEDED


@pytest.fixture
def store(tmp_path):
    return JobStore(f"sqlite:///{tmp_path}/platform.db")


def add(store, user, **kw):
    fields = dict(user=user, name=f"{user}-job", command="true", gpus=0, workers=1)
    fields.update(kw)
    return store.create(**fields)


def test_record_answers_what_the_orm_row_does(store):
    job = add(store, "ann", groups=["lab"], env={"A": "1"}, params={"lr": 0.1}, gpus=2, workers=3, priority=5,
              time_limit=60.0, script="print(1)\n", command=None, sweep_id=7, reason="submitted")
    store.update(job.id, state=RUNNING, devices=[[0, 1], [2, 3], [4, 5]], exit_codes=[0], attempt=1)
    record = store.record(job.id)
    assert isinstance(record, JobRecord) and record.key == job.key
    assert job_to_dict(record, "/api") == job_to_dict(store.get(job.id), "/api")
    assert record.devices == [[0, 1], [2, 3], [4, 5]] and record.env == {"A": "1"} and record.state == RUNNING


def test_record_of_a_missing_job_is_not_found(store):
    with pytest.raises(NotFound, match="job j-000042 not found"):
        store.record(42)


def test_create_returns_the_stored_job_and_its_event(store):
    job = add(store, "ann")
    assert job_to_dict(job) == job_to_dict(store.get(job.id))
    assert job.state == QUEUED and job.env == {} and job.devices == [] and job.created is not None
    assert [e["kind"] for e in store.events(job.id)] == ["submitted"]


def test_create_with_a_used_submit_key_returns_the_first_job(store):
    first = add(store, "ann", name="first", submit_key="ann:k1")
    again = add(store, "ann", name="second", submit_key="ann:k1")
    assert again.id == first.id and again.name == "first"
    assert store.list("ann", None, 10, 0)[1] == 1
    assert [e["kind"] for e in store.events(first.id)] == ["submitted"]


def test_list_filters_pages_and_counts_like_the_query_says(store):
    ids = {}
    for i in range(12):
        user = "ann" if i % 3 else "bob"
        job = add(store, user, sweep_id=1 if i < 4 else None)
        ids[job.id] = user
        if i % 4 == 0:
            store.update(job.id, state=SUCCEEDED)
    ann = sorted((j for j, u in ids.items() if u == "ann"), reverse=True)
    items, total = store.list("ann", None, 3, 2)
    assert total == len(ann) and [j.id for j in items] == ann[2:5]  # newest first
    items, total = store.list(None, None, 100, 0)
    assert total == 12 and [j.id for j in items] == sorted(ids, reverse=True)
    done = [j for j in sorted(ids, reverse=True) if store.get(j).state == SUCCEEDED]
    items, total = store.list(None, [SUCCEEDED], 100, 0)
    assert total == len(done) == 3 and [j.id for j in items] == done
    items, total = store.list("bob", [QUEUED, SUCCEEDED], 100, 0)
    assert total == 4 and {j.user for j in items} == {"bob"}
    items, total = store.list(None, None, 100, 0, sweep_id=1)
    assert total == 4 and sorted(j.id for j in items) == sorted(ids)[:4]
    items, total = store.list("ann", [RUNNING], 100, 0)
    assert (items, total) == ([], 0)
    items, total = store.list("ann", None, 5, 100)
    assert items == [] and total == len(ann)
    for item in store.list(None, None, 100, 0)[0]:
        assert job_to_dict(item) == job_to_dict(store.get(item.id))


@pytest.mark.parametrize("inline", [True, False])
def test_lookup_reads_on_the_loop_only_with_inline_reads(tmp_path, inline):
    import asyncio
    import threading

    store = JobStore(f"sqlite:///{tmp_path}/platform.db", inline_reads=inline)
    job = add(store, "ann")

    def where(job_id):
        return threading.current_thread().name, store.record(job_id).key

    async def main():
        return threading.current_thread().name, await store.lookup(where, job.id), await store.read(where, job.id)

    loop_thread, (looked_up_in, key), (read_in, _) = asyncio.run(main())
    assert key == job.key
    assert (looked_up_in == loop_thread) is inline
    assert read_in.startswith("trainhub-db-read")  # read() always uses a reader thread
