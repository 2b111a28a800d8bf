"""The jobs API's reads and submissions go through SQLAlchemy Core (``JobStore.record``/``list``/``create``),
not the ORM the engine uses, and on SQLite its reads go straight through the ``sqlite3`` module
(``trainhub.db.SQLiteReader``): both must answer exactly what the ORM's rows would, filter and page the same."""

from __future__ import annotations

import pytest

from trainhub.exceptions import NotFound
from trainhub.services.jobs.store import JobRecord, JobStore, job_to_dict
from trainhub.states import QUEUED, RUNNING, SUCCEEDED


@pytest.fixture(params=["sqlite3", "sqlalchemy"])
def store(tmp_path, request):
    store = JobStore(f"sqlite:///{tmp_path}/platform.db")
    assert store.fast_reads is not None
    if request.param == "sqlalchemy":
        store.fast_reads = None  # the path every other database takes
    return store


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
    assert store.list("bob", [SUCCEEDED, QUEUED, QUEUED, SUCCEEDED], 100, 0)[1] == 4  # repeats count once
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


def test_the_sqlite3_reads_answer_what_sqlalchemy_reads(tmp_path):
    """Every column of every row, through both paths: the same values and types (dates, JSON, nulls)."""
    fast = JobStore(f"sqlite:///{tmp_path}/platform.db")
    slow = JobStore(f"sqlite:///{tmp_path}/platform.db")
    slow.fast_reads = None
    plain = add(fast, "ann")
    full = add(fast, "bob", groups=["lab", "x"], env={"K": "v" * 50}, params={"lr": 1e-3, "opt": "adam", "n": [1, 2]},
               gpus=1, workers=2, priority=-3, time_limit=0.5, script="print('é')\n", command=None, sweep_id=3,
               preemptible=True, submit_key="bob:1", reason="submitted")
    fast.update(full.id, state=RUNNING, devices=[[0], [1]], exit_codes=[0, -9], attempt=2, launch_state={"dir": "/x", "workers": []},
                cancel_requested=True)
    fast.update(plain.id, state=SUCCEEDED, finished=fast.get(plain.id).created)
    for job_id in (plain.id, full.id):
        a, b = fast.record(job_id), slow.record(job_id)
        for name in JobRecord.__slots__:
            assert getattr(a, name) == getattr(b, name) and type(getattr(a, name)) is type(getattr(b, name)), name
    for args in (("bob", [RUNNING], 10, 0), (None, None, 1, 1), (None, None, 10, 0, 3)):
        (fa, ft), (sa, st) = fast.list(*args), slow.list(*args)
        assert ft == st and [job_to_dict(j) for j in fa] == [job_to_dict(j) for j in sa]
    for states in ([RUNNING], [SUCCEEDED, RUNNING], [QUEUED]):
        assert [job_to_dict(j) for j in fast.in_states(*states)] == [job_to_dict(j) for j in slow.in_states(*states)]
