"""End-aligned placement: long jobs share nodes, the others drain whole for gang jobs."""

from __future__ import annotations

import math

import pytest
from traitlets import TraitError

from trainhub.scheduler import Allocation, FifoGangScheduler, JobRequest, Quotas, TrainhubScheduler
from trainhub.scheduler.placement import SCAN_LIMIT, FreeIndex, node_ends
from trainhub.scheduler.sim import TraceJob, simulate


def test_pick_prefers_a_node_whose_work_outlasts_the_job_then_the_latest_horizon_then_empty_nodes():
    free = {"short": 1, "long": 3, "medium": 5, "empty": 8}
    ends = {"short": 100.0, "long": 10_000.0, "medium": 2_000.0}
    index = FreeIndex(free, 8, dict(ends))
    assert index.pick(1) == "short"  # no end given: best fit, as before
    assert index.pick(1, 50.0) == "short"  # covered by every busy node: the fullest
    assert index.pick(1, 5_000.0) == "long"  # only "long" outlasts it
    assert index.pick(1, 50_000.0) == "long"  # none does: the least extension
    assert index.pick(4, 50_000.0) == "medium"  # "long" cannot hold 4; busy beats empty
    assert index.pick(6, 50.0) == "empty"
    assert index.pick(1, math.inf) == "long"  # no time limit: the latest horizon


def test_place_extends_the_horizon_it_records():
    ends = {"a": 100.0}
    index = FreeIndex({"a": 4, "b": 8}, 8, ends)
    assert index.place(1, 8, 500.0) == ["b"]
    assert ends == {"a": 100.0, "b": 500.0}
    assert index.place(1, 2, 400.0) == ["a"] and ends["a"] == 400.0  # no node covers 400 with room: latest horizon
    assert index.place(1, 2, 300.0) == ["a"] and ends["a"] == 400.0


def test_node_ends_takes_the_latest_limit_and_no_limit_is_for_ever():
    running = [
        Allocation("x", "u", (), (("a", 1),), started_at=10.0, time_limit=100.0),
        Allocation("y", "u", (), (("a", 1), ("b", 2)), started_at=0.0, time_limit=50.0),
        Allocation("s", "u", (), (("c", 1),), kind="server"),
        Allocation("cpu", "u", (), (("", 0),), started_at=0.0, time_limit=1.0),
    ]
    assert node_ends(running) == {"a": 110.0, "b": 50.0, "c": math.inf}


def test_scan_is_bounded_on_large_clusters():
    nodes = {f"n{i:04d}": 1 for i in range(10 * SCAN_LIMIT)}
    ends = {n: float(i) for i, n in enumerate(nodes)}  # no node outlasts the job
    index = FreeIndex(nodes, 8, ends)
    assert index.pick(1, 1e9) == f"n{SCAN_LIMIT - 1:04d}"  # the latest among the first SCAN_LIMIT seen


def test_schedule_puts_a_long_job_beside_long_work_not_on_a_node_about_to_drain():
    running = [
        Allocation("drains", "u", (), (("n0", 7),), started_at=0.0, time_limit=100.0),
        Allocation("forever", "u", (), (("n1", 6),), started_at=0.0, time_limit=None),
    ]
    job = JobRequest("day", "v", workers=1, gpus_per_worker=1, submitted_at=1.0, time_limit=86_400.0)
    capacity = {"n0": 8, "n1": 8}
    assert TrainhubScheduler().schedule(1.0, [job], running, capacity, Quotas()).starts[0].placement == (("n1", 1),)
    # best fit (the FIFO baseline's placement, and trainhub's before) pins the draining node for a day
    assert TrainhubScheduler(placement="best-fit").schedule(1.0, [job], running, capacity, Quotas()).starts[0].placement == (("n0", 1),)
    assert FifoGangScheduler().schedule(1.0, [job], running, capacity, Quotas()).starts[0].placement == (("n0", 1),)


@pytest.mark.parametrize("placement, big_delay", [("end-aligned", 98.0), ("best-fit", 4999.0)])
def test_a_gang_gets_the_node_that_drains(placement, big_delay):
    trace = [
        TraceJob("drains", "u", "", 0.0, 7, 1, 100.0, time_limit=100.0),
        TraceJob("forever", "u", "", 0.0, 6, 1, 10_000.0),
        TraceJob("small", "v", "", 1.0, 1, 1, 5_000.0, time_limit=5_000.0),
        TraceJob("big", "w", "", 2.0, 8, 1, 100.0, time_limit=100.0),
    ]
    result = simulate(trace, TrainhubScheduler(placement=placement), {"n0": 8, "n1": 8})
    assert result.records["small"].queueing_delay == 0.0
    assert result.records["big"].queueing_delay == big_delay


def test_unknown_placement_is_refused():
    with pytest.raises(TraitError):
        TrainhubScheduler(placement="worst-fit")
