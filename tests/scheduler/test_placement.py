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


def test_place_without_extending_only_uses_nodes_whose_work_lasts_as_long():
    ends = {"short": 100.0, "long": 10_000.0}
    index = FreeIndex({"short": 4, "long": 2, "empty": 8}, 8, ends)
    assert index.place(1, 2, 5_000.0, extend=False) == ["long"]
    assert index.place(1, 2, 5_000.0, extend=False) is None  # "short" and "empty" would be kept from draining
    assert index.free == {"short": 4, "long": 0, "empty": 8} and ends == {"short": 100.0, "long": 10_000.0}
    assert index.place(2, 2, 50.0, extend=False) == ["short", "short"]
    assert index.place(1, 2, 5_000.0) == ["empty"]  # extend=True: any node, the least extension first


def _draining_cluster():
    """n1 frees at 500 for the 8-GPU head; n3 (3 free) drains at 600; n2 (4 free) runs for ever."""
    capacity = {"n0": 8, "n1": 8, "n2": 8, "n3": 8}
    running = [
        Allocation("a", "u", (), (("n0", 8),), started_at=0.0, time_limit=1000.0),
        Allocation("b", "u", (), (("n1", 6),), started_at=0.0, time_limit=500.0),
        Allocation("c", "u", (), (("n2", 4),), started_at=0.0, time_limit=None),
        Allocation("d", "u", (), (("n3", 5),), started_at=0.0, time_limit=600.0),
    ]
    head = JobRequest("head", "h", workers=1, gpus_per_worker=8, submitted_at=0.0, time_limit=3600.0)
    return capacity, running, head


def test_backfill_past_the_reservation_does_not_pin_a_draining_node():
    capacity, running, head = _draining_cluster()
    long = JobRequest("long", "v", workers=1, gpus_per_worker=1, submitted_at=1.0, time_limit=10_000.0)
    new = TrainhubScheduler(reserve_after=0).schedule(10.0, [head, long], running, capacity, Quotas())
    assert new.head == "head" and new.waiting["head"].reserved_start == 500.0
    assert new.starts[0].placement == (("n2", 1),)  # beside the work that runs for ever
    old = TrainhubScheduler(reserve_after=0, placement="best-fit").schedule(10.0, [head, long], running, capacity, Quotas())
    assert old.starts[0].placement == (("n3", 1),)  # best fit: n3 then stays busy until 10,010 instead of 600


def test_backfill_past_the_reservation_waits_when_only_draining_nodes_are_left():
    capacity, running, head = _draining_cluster()
    running[2] = Allocation("c", "u", (), (("n2", 8),), started_at=0.0, time_limit=None)  # n2 full
    long = JobRequest("long", "v", workers=1, gpus_per_worker=1, submitted_at=1.0, time_limit=10_000.0)
    short = JobRequest("short", "v", workers=1, gpus_per_worker=1, submitted_at=2.0, time_limit=300.0)
    plan = TrainhubScheduler(reserve_after=0).schedule(10.0, [head, long, short], running, capacity, Quotas())
    assert [s.job_id for s in plan.starts] == ["short"]  # ends before the reservation: anywhere
    reason = plan.waiting["long"]
    assert reason.code == "reserved" and reason.blocking_job == "head"
    assert "left to drain for large jobs" in reason.message and "may run 2h46m," in reason.message
    old = TrainhubScheduler(reserve_after=0, placement="best-fit").schedule(10.0, [head, long, short], running, capacity, Quotas())
    assert {s.job_id for s in old.starts} == {"long", "short"}
