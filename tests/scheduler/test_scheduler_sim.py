"""The simulator: synthetic traces, CSV replay, metrics."""

from __future__ import annotations

import pytest

from trainhub.scheduler import FifoGangScheduler, TrainhubScheduler
from trainhub.scheduler.sim import (
    TraceJob,
    TraceParams,
    generate_trace,
    load_csv,
    simulate,
    uniform_cluster,
    write_csv,
)

CSV = """id,user,group,submit_time,gpus,workers,duration,priority,time_limit
a,alice,vision,0,4,1,100,0,100
b,bob,nlp,1,8,1,10,0,10
c,carol,nlp,2,2,1,50,0,60
d,dave,,3,0,1,5,0,
"""


@pytest.fixture
def csv_trace(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(CSV)
    return load_csv(path)


def test_load_csv(csv_trace):
    assert csv_trace[0] == TraceJob("a", "alice", "vision", 0.0, 4, 1, 100.0, 0, 100.0, False)
    assert csv_trace[3].time_limit is None and csv_trace[3].group == ""
    assert csv_trace[2].request().gpus_per_worker == 2


@pytest.mark.parametrize("policy, delays", [
    # FIFO: b (8 GPUs) waits for a until t=100; c is stuck behind b until b ends at 110.
    (FifoGangScheduler, {"a": 0, "b": 99, "c": 108, "d": 0}),
    # Trainhub: c (ends by 62) backfills ahead of b's reservation at t=100; b is not delayed.
    (lambda: TrainhubScheduler(reserve_after=0), {"a": 0, "b": 99, "c": 0, "d": 0}),
])
def test_csv_replay_exact(csv_trace, policy, delays):
    result = simulate(csv_trace, policy(), {"n0": 8})
    assert {k: r.queueing_delay for k, r in result.records.items()} == delays
    assert result.records["b"].finish == 110
    m = result.metrics()
    assert m["finished"] == 4 and m["longest_wait"] == max(delays.values())


def test_csv_round_trip_and_errors(tmp_path):
    trace = generate_trace(n_jobs=50, capacity_gpus=16, seed=4)
    path = tmp_path / "t.csv"
    write_csv(path, trace)
    again = load_csv(path)
    assert [(j.id, j.gpus, j.workers, j.priority, j.preemptible, j.time_limit is None) for j in again] == [
        (j.id, j.gpus, j.workers, j.priority, j.preemptible, j.time_limit is None) for j in trace]
    bad = tmp_path / "bad.csv"
    bad.write_text("id,user,group,submit_time,gpus,workers,duration,priority,time_limit\nx,u,g,0,3,2,10,0,\n")
    with pytest.raises(ValueError, match="does not split"):
        load_csv(bad)
    bad.write_text("id,user\nx,u\n")
    with pytest.raises(ValueError, match="missing columns"):
        load_csv(bad)


def test_generated_trace_shape():
    trace = generate_trace(TraceParams(n_jobs=3000, capacity_gpus=64, seed=7))
    assert trace == generate_trace(TraceParams(n_jobs=3000, capacity_gpus=64, seed=7))  # seeded
    sizes = [j.gpus for j in trace]
    assert sizes.count(1) / len(sizes) > 0.6  # most jobs use one GPU
    assert set(sizes) <= {1, 2, 4, 8, 16}
    assert all(j.workers == 2 for j in trace if j.gpus == 16)
    durations = sorted(j.duration for j in trace)
    median, mean = durations[len(durations) // 2], sum(durations) / len(durations)
    assert mean > 2 * median  # heavy tail
    submits = [j.submit_time for j in trace]
    assert submits == sorted(submits)


def test_small_trace_both_policies():
    trace = generate_trace(n_jobs=300, capacity_gpus=32, load=1.2, seed=3)
    cluster = uniform_cluster(4)
    results = {}
    for name, policy in [("fifo", FifoGangScheduler()), ("trainhub", TrainhubScheduler())]:
        result = simulate(trace, policy, cluster)
        m = result.metrics()
        assert m["finished"] == 300
        assert 0 < m["allocation_at_saturation"] <= 1 and 0 < m["utilization"] <= 1
        assert m["p95_queueing_delay"] <= m["longest_wait"]
        assert simulate(trace, policy, cluster).metrics() == m  # deterministic
        results[name] = m
    assert results["fifo"]["preemptions"] == 0
    assert results["trainhub"]["mean_queueing_delay"] < results["fifo"]["mean_queueing_delay"]
