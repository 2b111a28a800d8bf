"""A job's metrics file is written by the job's own code: whatever it holds, ingesting it and answering
GET /jobs/{id}/metrics is bounded work and never breaks the API's JSON."""

import json

import pytest

from trainhub.httpapi import dump_json
from trainhub.services.jobs import store as jobstore
from trainhub.services.jobs.store import JobStore, metric_record


@pytest.fixture
def store(tmp_path):
    return JobStore(f"sqlite:///{tmp_path}/platform.db")


def new_job(store):
    return store.create(user="ann", name="m", command="true", gpus=0, workers=1)


@pytest.mark.parametrize("line, record", [
    (b'{"time": 1.5, "step": 3, "values": {"loss": 0.25}}', {"time": 1.5, "step": 3, "values": {"loss": 0.25}}),
    (b'{"time": 1, "step": 2, "values": {"loss": NaN, "acc": Infinity, "ok": 1, "flag": true, "s": "x"}}',
     {"time": 1.0, "step": 2, "values": {"ok": 1.0}}),
    (b'{"time": 1, "step": 1e400, "values": {"big": 1e400, "i": 123456789012345678901234567890}}',
     {"time": 1.0, "step": None, "values": {"i": 1.2345678901234568e29}}),
    (b'{"time": 1, "step": 99999999999999999999, "values": {}}', {"time": 1.0, "step": None, "values": {}}),
    (b'[1, 2]', None), (b'"text"', None), (b'{"values": [1]}', None), (b'not json', None),
])
def test_a_record_keeps_only_finite_numbers(line, record):
    assert metric_record(line) == record


def test_time_outside_what_a_date_can_show_becomes_the_ingest_time():
    rec = metric_record(b'{"time": 1e300, "values": {"x": 1}}')
    assert 1.7e9 < rec["time"] < 4e9


def test_a_record_keeps_at_most_64_values_with_short_names():
    values = {f"v{i}": i for i in range(1000)} | {"n" * 129: 1}
    rec = metric_record(json.dumps({"time": 1, "values": values}).encode())
    assert len(rec["values"]) == 64 and all(len(k) <= 128 for k in rec["values"])


def test_a_huge_file_is_read_in_pieces_and_bounded(store, tmp_path, monkeypatch):
    monkeypatch.setattr(jobstore, "MAX_METRIC_RECORDS", 5000)
    monkeypatch.setattr(jobstore, "METRICS_CHUNK", 64 << 10)
    job = new_job(store)
    f = tmp_path / "metrics-0.jsonl"
    f.write_bytes(b"".join(b'{"time": %d, "step": %d, "values": {"loss": %d}}\n' % (i, i, i) for i in range(20000)))
    passes = 0
    while store.ingest_metrics(job.id, 1, 0, str(f)):
        passes += 1
        assert passes < 100
    assert passes >= 4  # pieces, not the whole file at once (then the rest is passed over)
    got = store.metrics(job.id)
    assert got["total"]["metrics"] == 5000
    events = [e for e in store.events(job.id) if e["kind"] == "metrics-limit"]
    assert len(events) == 1 and "report less often" in events[0]["message"]
    assert not store.ingest_metrics(job.id, 1, 0, str(f))  # nothing more is read, nothing repeated
    assert store.metrics(job.id)["total"]["metrics"] == 5000 and len([e for e in store.events(job.id) if e["kind"] == "metrics-limit"]) == 1


def test_the_metrics_answer_is_thinned_per_worker_keeping_first_and_last(store, tmp_path):
    job = new_job(store)
    for w in (0, 1):
        f = tmp_path / f"metrics-{w}.jsonl"
        f.write_bytes(b"".join(b'{"time": %d, "step": %d, "values": {"loss": %d}}\n' % (i, i, i) for i in range(3000)))
        while store.ingest_metrics(job.id, 1, w, str(f)):
            pass
    full = store.metrics(job.id)
    assert full["total"]["metrics"] == 6000 and len(full["metrics"]) == 6000
    thin = store.metrics(job.id, limit=100)
    assert thin["total"]["metrics"] == 6000 and len(thin["metrics"]) <= 100
    for w in (0, 1):
        steps = [r["step"] for r in thin["metrics"] if r["worker"] == w]
        assert steps[0] == 0 and steps[-1] == 2999 and len(steps) >= 40 and steps == sorted(steps)
    dump_json(thin)  # finite numbers only: valid JSON
