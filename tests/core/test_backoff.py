"""trainhub.backoff: the one primitive behind every wait loop (a fake clock decides every deadline)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from trainhub.backoff import Backoff, WaitTimeout, apoll, poll


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_pauses_grow_by_factor_up_to_cap_and_reset():
    b = Backoff("x", start=0.1, factor=2.0, cap=0.5)
    assert [round(b.next_delay(), 3) for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    b.reset()
    assert b.next_delay() == 0.1


def test_steady_interval_and_no_cap():
    b = Backoff("x", start=2.0, factor=1.0, cap=None)
    assert [b.next_delay() for _ in range(3)] == [2.0, 2.0, 2.0]
    b = Backoff("x", start=1.0, factor=3.0, cap=None)
    assert [b.next_delay() for _ in range(3)] == [1.0, 3.0, 9.0]


@pytest.mark.parametrize("rng, expected", [(lambda: 0.0, 0.9), (lambda: 0.5, 1.0), (lambda: 1.0, 1.1)])
def test_jitter_spreads_each_pause(rng, expected):
    assert Backoff("x", start=1.0, jitter=0.1, rng=rng).next_delay() == pytest.approx(expected)


def test_the_last_pause_ends_at_the_deadline_then_it_times_out():
    clock = Clock()
    b = Backoff("job j-000001 to end", start=0.4, factor=1.0, timeout=1.0, clock=clock)
    assert b.next_delay() == 0.4 and not b.expired
    clock.now = 0.9
    assert b.next_delay() == pytest.approx(0.1) and b.remaining == pytest.approx(0.1)
    clock.now = 1.0
    assert b.expired
    with pytest.raises(WaitTimeout, match=r"timed out after 1s waiting for job j-000001 to end") as e:
        b.next_delay()
    assert isinstance(e.value, TimeoutError)


@pytest.mark.parametrize("kw", [{"start": -1}, {"factor": 0.5}, {"cap": -1}, {"jitter": 1.0}, {"timeout": -1}])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError, match="need start >= 0"):
        Backoff("x", **kw)


def test_poll_returns_the_first_done_value():
    values = iter([None, {"state": "running"}, {"state": "succeeded"}, {"state": "never read"}])
    seen = []

    def fetch():
        seen.append(next(values))
        return seen[-1]

    done = poll(fetch, lambda v: bool(v) and v["state"] == "succeeded", what="a job to end", start=0.001, factor=1.0)
    assert done == {"state": "succeeded"} and len(seen) == 3


def test_poll_times_out_naming_what_and_keeping_the_last_value():
    clock = Clock()

    def fetch():
        clock.now += 0.6  # each question takes 0.6 s of the fake clock
        return {"state": "queued"}

    with pytest.raises(WaitTimeout) as e:
        poll(fetch, lambda v: False, what="job j-000002 to end", describe=lambda v: f"still {v['state']}",
             start=0.001, factor=1.0, timeout=1.0, clock=clock)
    assert str(e.value) == "timed out after 1s waiting for job j-000002 to end (still queued)"
    assert e.value.last == {"state": "queued"}


def test_poll_passes_exceptions_of_fetch_through():
    def fetch():
        raise RuntimeError("the process exited")

    with pytest.raises(RuntimeError, match="exited"):
        poll(fetch, what="x", start=0.001)


def test_sleep_until_an_event_returns_as_soon_as_it_is_set():
    event = threading.Event()
    event.set()
    assert Backoff("x", start=3600.0).sleep(until=event) is True
    assert Backoff("x", start=0.001).sleep(until=threading.Event()) is False


def test_apoll_awaits_async_fetches():
    async def main():
        answers = iter([1, 2, 3])

        async def fetch():
            return next(answers)

        assert await apoll(fetch, lambda v: v == 3, what="three", start=0.001, factor=1.0) == 3
        assert await apoll(lambda: 7, what="a sync fetch", start=0.001) == 7
        event = asyncio.Event()
        event.set()
        assert await Backoff("x", start=3600.0).asleep(until=event) is True
        clock = Clock()
        with pytest.raises(WaitTimeout, match="waiting for never"):
            await apoll(lambda: clock.__setattr__("now", clock.now + 1), lambda v: False, what="never",
                        start=0.001, timeout=0.5, clock=clock)

    asyncio.run(main())


async def test_wait_event_says_whether_the_event_came():
    from trainhub.backoff import wait_event

    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 10) is True


async def test_a_periodic_loop_stops_even_when_woken_as_it_is_cancelled():
    """asyncio.wait_for on Python 3.11 swallowed a cancellation that came as the event was set: the loop went round
    again and its stop() waited forever (seen as a jobs-engine test hanging until pytest's timeout)."""
    import logging

    from trainhub.loops import PeriodicLoop

    for _ in range(20):
        passes = []

        async def body():
            passes.append(1)

        loop = PeriodicLoop("race", body, 60.0, logging.getLogger("test"))
        loop.start()
        while not passes:
            await asyncio.sleep(0)
        await asyncio.sleep(0)  # the loop waits for its wake now
        loop.wake()  # the wake and the stop's cancel in the same step of the event loop
        started = time.monotonic()
        await asyncio.wait_for(loop.stop(), 2)  # (a hung stop is cut here and returns all the same)
        assert time.monotonic() - started < 1.5, "the loop went round again after its stop"
