"""The warm server pool follows demand (trainhub.spawner.demand, trainhub.spawner.warm.WarmPool): the demand model with
a controlled clock, then a real pool of interpreters growing at arrivals, bounded by a memory budget measured from
their own resident memory, and shrinking when idle. The whole path through a real `trainhub up` (several users at
once, the pool refilling) is tests/platform/test_warm_rush.py."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from datetime import datetime, timedelta

import pytest
from traitlets import TraitError

from trainhub.boundary.isolation import Isolation
from trainhub.boundary.procs import tree_rss
from trainhub.spawner.demand import DAY, PoolDemand, budget_cap, load_arrivals
from trainhub.spawner.warm import WarmPool, launch_env, warm_argv
from waiting import await_for


class Clock:
    def __init__(self, when: datetime):
        self.now = when.timestamp()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def at(day: int, hour: int, minute: int = 0) -> float:
    """Local clock time ``hour:minute`` on day ``day`` of a fixed week (Monday 2026-11-16 is day 0)."""
    return (datetime(2026, 11, 16) + timedelta(days=day, hours=hour, minutes=minute)).timestamp()


def test_with_no_arrival_the_pool_keeps_its_floor():
    clock = Clock(datetime(2026, 11, 16, 9))
    d = PoolDemand(2, clock=clock)
    assert d.want() == (2, "the floor (warm_pool_size)")
    assert PoolDemand(0, clock=clock).want()[0] == 0


def test_a_rush_grows_the_target_with_each_arrival_and_it_falls_back_once_the_window_passes():
    clock = Clock(datetime(2026, 11, 16, 14))
    d = PoolDemand(2, window=600, per_arrival=2, lead=0, clock=clock)
    wants = []
    for _ in range(4):
        d.record()
        wants.append(d.want()[0])
        clock.advance(10)
    assert wants == [4, 6, 8, 10]
    assert d.want()[1] == "4 spawn(s) in the last 600 s"
    clock.advance(600 - 40 + 15)  # the first two arrivals are older than the window now
    assert d.recent() == 2 and d.want()[0] == 6
    clock.advance(60)
    assert d.recent() == 0 and d.want() == (2, "the floor (warm_pool_size)")  # idle: back to the floor
    assert PoolDemand(2, per_arrival=0, lead=0, clock=clock).want()[0] == 2  # no rush term


def test_the_usual_morning_arrivals_grow_the_pool_before_the_first_spawn_of_the_day():
    """Ten users came between 9:00 and 9:45 on each of five weekdays (none at the weekend): on Monday at 8:40 the
    pool wants what the next 30 minutes saw on the working days, not diluted by the empty weekend; at 14:00, or
    with no history, only its floor."""
    clock = Clock(datetime(2026, 11, 16))
    d = PoolDemand(2, window=900, per_arrival=2, lead=1800, history_days=14, clock=clock)
    for day in range(5):  # Monday..Friday of the first week
        for i in range(10):
            d.record(at(day, 9, 4 * i + 1))  # 9:01, 9:05, ..., 9:37
    clock.now = at(7, 8, 40)  # Monday of the next week, 8:40: [8:40, 9:10) held 3 arrivals a day (9:01, 9:05, 9:09)
    assert d.usual() == pytest.approx(3.0)
    assert d.want() == (3, "3 spawn(s) usual in the next 1800 s at this time of day")
    clock.now = at(7, 9, 0)  # [9:00, 9:30): 8 a day
    assert d.want()[0] == 8
    clock.now = at(7, 14, 0)
    assert d.usual() == 0 and d.want()[0] == 2
    # the same arrivals seen on one day only: the average is over the days anyone came
    one = PoolDemand(2, lead=1800, clock=Clock(datetime(2026, 11, 17)))
    for i in range(10):
        one.record(at(0, 9, 4 * i + 1))
    one.clock.now = at(1, 9, 0)
    assert one.usual() == pytest.approx(8.0)
    # a rush at the usual time takes the larger of the two
    clock.now = at(7, 8, 40)
    d.record()
    assert d.want() == (4, "1 spawn(s) in the last 900 s")


def test_history_older_than_its_days_is_dropped_and_kept_across_a_restart(tmp_path):
    path = tmp_path / "arrivals.json"
    clock = Clock(datetime(2026, 11, 16, 9))
    d = PoolDemand(2, history_days=3, clock=clock, path=str(path))
    d.record(clock.now - 10 * DAY)
    d.record(clock.now - 1 * DAY)
    d.record()
    assert len(d.arrivals) == 2  # ten days ago is beyond three days of history
    d.save()
    again = PoolDemand(2, history_days=3, clock=clock, path=str(path))
    assert again.arrivals == pytest.approx(d.arrivals, abs=0.1)
    assert "user" not in path.read_text()  # times only
    path.write_text("{not json")
    assert load_arrivals(str(path)) == [] and load_arrivals(str(tmp_path / "missing.json")) == []
    path.write_text(json.dumps({"arrivals": "x"}))
    assert load_arrivals(str(path)) == []


def test_budget_cap():
    assert budget_cap(0, 100) > 10**6  # no bound
    assert budget_cap(1000, 100) == 10
    assert budget_cap(250, 100) == 2
    assert budget_cap(50, 100) == 0


def test_the_memory_budget_and_the_other_options_are_checked_with_a_clear_message():
    from trainhub.spawner.local import LocalGPUSpawner

    assert LocalGPUSpawner(warm_pool_memory_budget="8G").warm_pool_memory_budget == 8 * 10**9
    assert LocalGPUSpawner(warm_pool_memory_budget="1GiB").warm_pool_memory_budget == 2**30
    assert LocalGPUSpawner(warm_pool_memory_budget=0).warm_pool_memory_budget == 0
    with pytest.raises(TraitError, match=r"warm_pool_memory_budget: invalid size 'lots'.*such as 256MB"):
        LocalGPUSpawner(warm_pool_memory_budget="lots")
    with pytest.raises(TraitError, match="warm_pool_window must be zero or more, not -1"):
        LocalGPUSpawner(warm_pool_window=-1)
    with pytest.raises(TraitError, match="warm_pool_parallel_starts must be more than zero, not 0"):
        LocalGPUSpawner(warm_pool_parallel_starts=0)


def plain_pool(floor: int, clock, **demand) -> WarmPool:
    """A real pool of interpreters importing only ``json`` (no sandbox, the test's own account), following demand."""
    iso = Isolation(sandbox="none", user_accounts=False)
    pool = WarmPool(lambda fd: iso.command(warm_argv(sys.executable, fd, ["json"]), account=None, cwd="/"),
                    launch_env(["LANG"], {}, "/usr/bin:/bin"), floor, logging.getLogger("test-warm-demand"))
    pool.demand = PoolDemand(floor, clock=clock, **demand)
    return pool


def alive(pool: WarmPool) -> int:
    return sum(1 for wp in pool.waiting if wp.proc.poll() is None)


def test_a_real_pool_grows_at_arrivals_within_its_budget_measures_itself_and_shrinks_when_idle(caplog):
    caplog.set_level(logging.INFO, "test-warm-demand")
    clock = Clock(datetime(2026, 11, 16, 14))

    async def scenario():
        pool = plain_pool(1, clock, window=300, per_arrival=2, lead=0)
        pool.parallel = 2
        try:
            pool.retarget()
            pool.fill()
            assert pool.size == 1 and len(pool.waiting) == 1
            first = await pool.take()
            assert first is not None and first.waited >= 0
            # it measured itself: the interpreter's own resident memory, as /proc shows it
            assert len(pool.measured) == 1 and pool.measured[0] > 1_000_000
            assert pool.per_interpreter() == pool.measured[0]
            first.discard()

            pool.budget = int(pool.per_interpreter() * 4.5)  # room for 4
            pool.arrive()  # 1 + 2 x 1 = 3
            assert pool.size == 3 and len(pool.waiting) <= 2  # at most `parallel` import at once
            await await_for(lambda: [wp for wp in pool.waiting if wp.ready.done()], lambda r: len(r) == 3,
                            what="the pool refilled to 3 ready", timeout=60)
            pool.arrive()  # 1 + 2 x 2 = 5 wanted, the budget holds 4
            assert pool.size == 4
            assert "the memory budget" in pool.why and "holds 4" in pool.why
            await await_for(lambda: sum(wp.ready.done() for wp in pool.waiting), lambda n: n == 4,
                            what="the pool at its budget", timeout=60)
            held = sum(tree_rss(wp.pid) for wp in pool.waiting)
            assert held <= pool.budget * 1.1, (held, pool.budget)  # what the budget bounds, measured again now

            clock.advance(301)  # nobody came for the window: back to the floor, the surplus ended
            gone = pool.waiting[1:]
            pool.retarget()
            pool.fill()
            assert pool.size == 1 and len(pool.waiting) == 1
            await await_for(lambda: [wp.proc.poll() for wp in gone], lambda codes: None not in codes,
                            what="the surplus interpreters to exit", timeout=30)
        finally:
            for wp in pool.waiting:
                wp.discard()

    asyncio.run(scenario())
    assert "Warm server pool: 1 -> 3 interpreters (1 spawn(s) in the last 300 s)" in caplog.text
    assert "-> 1 interpreters (the floor (warm_pool_size))" in caplog.text


def test_the_periodic_check_grows_the_pool_before_the_usual_arrivals_without_any_spawn():
    """No spawn at all: the pool's own loop sees the usual morning coming and starts interpreters ahead of it."""
    clock = Clock(datetime(2026, 11, 16))

    async def scenario():
        pool = plain_pool(0, clock, lead=1800)
        pool.parallel = 3
        for day in range(3):
            for minute in (1, 5, 9):
                pool.demand.record(at(day, 9, minute))
        clock.now = at(3, 8, 45)
        pool.start_loop(lambda: 0.05)
        try:
            await await_for(lambda: sum(wp.ready.done() for wp in pool.waiting), lambda n: n == 3,
                            what="three interpreters started ahead of the usual arrivals", timeout=60)
            assert pool.size == 3 and "usual" in pool.why
            clock.now = at(3, 13, 0)  # the morning passed: the loop shrinks the pool back to its floor
            await await_for(lambda: len(pool.waiting), lambda n: n == 0, what="the pool back to 0", timeout=30)
        finally:
            await pool.loop.stop()
            for wp in pool.waiting:
                wp.discard()

    asyncio.run(scenario())


def test_a_budget_too_small_for_one_interpreter_empties_the_pool_and_a_miss_says_why():
    clock = Clock(datetime(2026, 11, 16, 9))

    async def scenario():
        pool = plain_pool(2, clock, lead=0)
        pool.budget = 1000
        pool.arrive()
        assert pool.size == 0 and pool.waiting == []
        assert await pool.take() is None
        return pool.describe()

    why = asyncio.run(scenario())
    assert why.startswith("the pool's target is 0 (1 spawn(s) in the last 900 s; the memory budget 1.0 KB holds 0 of ")
    assert "taken" not in why
