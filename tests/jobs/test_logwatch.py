"""LogWatch: a follow of a job's logs wakes when the job's folder changes (inotify), not on a timer.

Each wait below has a fallback of 60 s, so a wake that does not come fails the test (asyncio.wait_for at 10 s)
instead of passing on the timer."""

from __future__ import annotations

import asyncio

import pytest

from trainhub.services.jobs.logwatch import LogWatch
from waiting import await_for

pytestmark = pytest.mark.asyncio

SLOW = 60.0  # a follower's timeout and the watch's fallback: never reached when the wake works


async def woken(follower, action=None) -> None:
    """``follower`` waits (it has run to its wait and not returned), then ``action`` wakes it."""
    task = asyncio.create_task(follower.changed(SLOW))
    for _ in range(5):  # the task runs to its wait: nothing in between waits for anything else
        await asyncio.sleep(0)
    assert not task.done()
    if action is not None:
        action()
    await asyncio.wait_for(task, 10)


async def test_a_follower_wakes_as_the_job_folder_its_attempt_and_its_log_appear(tmp_path):
    watch = LogWatch(fallback=SLOW)
    job = tmp_path / "j-000001"
    with watch.follow(str(job)) as follower:
        await woken(follower, job.mkdir)  # queued: the job's folder appears at its launch
        # a folder newly watched returns at once (what was written in it before its watch is read then)
        await asyncio.wait_for(follower.changed(SLOW), 10)
        attempt = job / "attempt-1"
        await woken(follower, attempt.mkdir)
        await asyncio.wait_for(follower.changed(SLOW), 10)
        log = attempt / "worker-0.log"
        await woken(follower, lambda: log.write_text("first\n"))
        await woken(follower, lambda: log.open("a").write("second\n"))
    assert watch._dir_wd == {} and watch._followers == {}  # watches go with the last follower
    watch.close()


async def test_a_change_while_the_follower_was_busy_is_not_lost(tmp_path):
    watch = LogWatch(fallback=SLOW)
    attempt = tmp_path / "j-000002" / "attempt-1"
    attempt.mkdir(parents=True)
    with watch.follow(str(attempt.parent)) as follower:  # watches what is there from the start
        (attempt / "worker-0.log").write_text("written while the follower wrote lines out\n")
        await await_for(lambda: follower.event.is_set(), what="the write to be seen")  # before the follower waits
        await asyncio.wait_for(follower.changed(SLOW), 10)
    watch.close()


async def test_the_engine_wakes_followers_and_only_those_of_the_job(tmp_path):
    watch = LogWatch(fallback=SLOW)
    a, b = tmp_path / "j-000003", tmp_path / "j-000004"
    a.mkdir()
    b.mkdir()
    with watch.follow(str(a)) as fa, watch.follow(str(b)) as fb:
        await woken(fa, lambda: watch.notify(str(a)))
        assert not fb.event.is_set()  # another job's end is not this follower's business (notify sets at once)
        await woken(fb, lambda: (b / "attempt-1").mkdir())
    watch.close()


async def test_two_followers_share_a_watch_and_it_ends_with_the_last(tmp_path):
    watch = LogWatch(fallback=SLOW)
    job = tmp_path / "j-000005"
    job.mkdir()
    with watch.follow(str(job)) as one:
        with watch.follow(str(job)) as two:
            assert watch._dir_wd[job][1] == 2
            t1 = asyncio.create_task(one.changed(SLOW))
            await woken(two, lambda: (job / "attempt-1").mkdir())
            await asyncio.wait_for(t1, 10)
        assert watch._dir_wd[job][1] == 1
    assert job not in watch._dir_wd
    watch.close()


async def test_without_inotify_a_follower_falls_back_to_the_timer(tmp_path):
    watch = LogWatch(fallback=0.05)
    watch._broken = True  # as where inotify is missing or its limits are reached
    job = tmp_path / "j-000006"
    job.mkdir()
    with watch.follow(str(job)) as follower:
        await asyncio.wait_for(follower.changed(SLOW), 10)  # the fallback, not the 60 s asked for
    watch.close()


async def test_what_a_follow_does_not_read_wakes_no_follower(tmp_path):
    """A job's start writes its script, outputs/, work/, metrics and exit files: none is a log line, and each wake of
    every follower would be on the way to the first one."""
    watch = LogWatch(fallback=SLOW)
    job = tmp_path / "j-000005"
    attempt = job / "attempt-1"
    attempt.mkdir(parents=True)
    with watch.follow(str(job)) as follower:
        (job / "script.py").write_text("print('hi')\n")
        (job / "outputs").mkdir()
        (attempt / "metrics-0.jsonl").write_text("{}\n")
        (attempt / "worker-0.exit").write_text("0")
        (attempt / "worker-0.wrapper.err").write_text("")
        log = attempt / "worker-0.log"
        log.write_text("a line\n")  # the one that counts, written last: the events come in order
        await await_for(lambda: follower.event.is_set(), what="the log line to be seen")
        watch._read()  # the events still queued, if any
        follower.event.clear()
        await asyncio.sleep(0.05)
        watch._read()
        assert not follower.event.is_set()  # nothing else woke it
        (attempt / "metrics-0.jsonl").write_text("{}\n{}\n")
        await asyncio.sleep(0.05)
        watch._read()
        assert not follower.event.is_set()
        await woken(follower, lambda: log.open("a").write("another\n"))
    watch.close()
