"""The job engine's event-driven scheduling passes (services/jobs/engine.py, services/jobs/queued.py).

A scheduling pass runs when something changed -- a submission, a cancel, a job that ended or was
requeued -- and otherwise every ``schedule_interval`` seconds. The engine runs against a real
store and GPU ledger (SQLite, 2 simulated GPUs) and a scripted launcher whose workers run until the
test ends them, so nothing here depends on process timing.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest
from waiting import await_for

from trainhub.ledger import LocalGPUAllocator
from trainhub.quotas import QuotaPolicy
from trainhub.services.jobs import engine as engine_mod
from trainhub.services.jobs.engine import JobEngine
from trainhub.services.jobs.launcher import Launcher, WorkerStatus
from trainhub.services.jobs.outputs import OutputSyncer
from trainhub.services.jobs.store import JobStore
from trainhub.states import CANCELLED, QUEUED, RUNNING, SUCCEEDED
from trainhub.storage import StorageConfig


class ScriptedLauncher(Launcher):
    """Workers that run until :meth:`finish` gives them an exit code; SIGTERM ends them at once (-15)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.codes: dict[tuple[str, int], int | None] = {}  # (job key, attempt) -> exit code, None while running
        self.launches: list[tuple[str, int]] = []

    async def launch(self, job, devices, env):
        self.codes[(job.key, job.attempt)] = None
        self.launches.append((job.key, job.attempt))
        return {"dir": None, "workers": [], "attempt": job.attempt}

    async def poll(self, job, state):
        code = self.codes.get((job.key, state.get("attempt", job.attempt)))
        return [WorkerStatus(rank=r, running=code is None, exit_code=code) for r in range(job.workers)]

    async def terminate(self, job, state, grace):
        self.finish(job.key, -15, state.get("attempt", job.attempt))

    async def adopt(self, job, state):
        return (job.key, state.get("attempt", job.attempt)) in self.codes

    def finish(self, key: str, code: int = 0, attempt: int = 1) -> None:
        self.codes[(key, attempt)] = code


class Clock:
    """Stands in for the engine module's ``time``: monotonic time moves only when the test says so."""

    def __init__(self):
        import time

        self._time, self.offset = time, 0.0

    def monotonic(self) -> float:
        return self._time.monotonic() + self.offset

    def time(self) -> float:
        return self._time.time() + self.offset


@pytest.fixture
def make_engine(tmp_path):
    def make(**kw) -> JobEngine:
        db = f"sqlite:///{tmp_path}/platform.db"
        devices = [{"index": i, "name": "A100", "uuid": f"GPU-{i}", "memory_total_mb": 40960, "simulated": True} for i in range(2)]
        launcher = ScriptedLauncher(data_dir=str(tmp_path))
        storage = StorageConfig(url=str(tmp_path / "storage"))
        kw.setdefault("grace_period", 1)
        engine = JobEngine(JobStore(db), LocalGPUAllocator(db_url=db, device_list=devices), launcher,
                           QuotaPolicy(user_gpu_limit=8), storage, OutputSyncer(storage), **kw)
        return engine

    return make


async def submit(engine: JobEngine, user="ann", gpus=2, **kw):
    """What the API's submit does: queue the row, then wake the engine."""
    job = await engine.store.write(engine.store.create, user=user, name="j", command="train", workers=1, gpus=gpus, **kw)
    engine.wake()
    return job


async def state_of(engine, job) -> str:
    return (await engine.store.read(engine.store.get, job.id)).state


async def wait_state(engine, job, state, timeout=10):
    return await await_for(lambda: engine.store.read(engine.store.get, job.id), lambda j: j.state == state,
                           what=f"{job.key} to be {state}", timeout=timeout, describe=lambda j: f"{j.state}: {j.reason}")


async def running_loop(engine):
    """The engine's own loop, with a tick and a schedule_interval far longer than any wait here: only
    the events can make it schedule. Returns once the start's own pass is done."""
    await engine.start()
    await await_for(lambda: engine.schedule_passes, lambda n: n >= 1, what="the engine's first pass", timeout=10)
    return engine


# -- events trigger a pass at once -------------------------------------------------------------------

async def test_a_submission_starts_a_queued_job_without_waiting_for_the_timed_pass(make_engine):
    engine = make_engine(tick=300, schedule_interval=600)
    await running_loop(engine)
    try:
        passes = engine.schedule_passes
        job = await submit(engine)
        await wait_state(engine, job, RUNNING, timeout=10)  # a timed pass is 10 minutes away
        assert engine.schedule_passes > passes
        assert engine.launcher.launches == [(job.key, 1)]
    finally:
        await engine.stop()


async def test_a_finished_job_frees_its_gpus_and_the_next_queued_job_starts_at_once(make_engine):
    engine = make_engine(tick=0.05, schedule_interval=600)
    await running_loop(engine)
    try:
        first = await submit(engine, user="ann")
        await wait_state(engine, first, RUNNING)
        second = await submit(engine, user="bob")  # both GPUs are taken: it waits
        await await_for(lambda: engine.why(second.id), lambda w: w is not None and w.code == "no-gpus",
                        what="the second job's wait reason", timeout=10)
        assert await state_of(engine, second) == QUEUED
        engine.launcher.finish(first.key, 0)
        await wait_state(engine, first, SUCCEEDED)
        await wait_state(engine, second, RUNNING)
    finally:
        await engine.stop()


async def test_a_cancelled_running_job_frees_its_gpus_and_the_next_queued_job_starts(make_engine):
    engine = make_engine(tick=0.05, schedule_interval=600)
    await running_loop(engine)
    try:
        first = await submit(engine, user="ann")
        await wait_state(engine, first, RUNNING)
        second = await submit(engine, user="bob")
        await await_for(lambda: engine.why(second.id), lambda w: w is not None, what="a pass over the second job", timeout=10)
        await engine.store.write(engine.store.request_cancel, first.id, "ann")  # what DELETE /jobs/{id} does
        engine.wake()
        await wait_state(engine, first, CANCELLED)
        await wait_state(engine, second, RUNNING)
    finally:
        await engine.stop()


async def test_between_events_only_the_timed_pass_schedules(make_engine, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(engine_mod, "time", clock)
    engine = make_engine(schedule_interval=10)
    holder = await submit(engine, user="ann")
    await engine.run_once(schedule=None)
    assert await state_of(engine, holder) == RUNNING
    waiting = await submit(engine, user="bob")
    await engine.run_once(schedule=None)  # the submission: a pass
    first = engine._plan
    assert engine.why(waiting.id).code == "no-gpus"
    passes = engine.schedule_passes
    for _ in range(5):  # ticks with nothing new: no pass
        clock.offset += 1
        await engine.run_once(schedule=None)
    assert engine.schedule_passes == passes and engine._plan is first
    clock.offset += 5.5  # schedule_interval since the last pass: a timed pass (aging, estimates move)
    await engine.run_once(schedule=None)
    assert engine.schedule_passes == passes + 1 and engine._plan is not first
    await engine.run_once(schedule=None)
    assert engine.schedule_passes == passes + 1
    clock.offset += 10
    await engine.run_once(schedule=None)
    assert engine.schedule_passes == passes + 2


async def test_the_timed_pass_ages_waiting_jobs(make_engine, monkeypatch):
    """A lower-priority job that has waited long enough overtakes a newer higher-priority one at the next
    timed pass: aging moves with time, with no event to trigger it."""
    clock = Clock()
    monkeypatch.setattr(engine_mod, "time", clock)
    engine = make_engine(schedule_interval=10)
    engine.scheduler.aging_interval = 600
    holder = await submit(engine, user="ann")
    await engine.run_once(schedule=None)
    now = datetime.now(timezone.utc)
    old = await submit(engine, user="bob", priority=0, created=now - timedelta(seconds=900))  # level 1 now
    new = await submit(engine, user="cat", priority=2, created=now)  # level 2 now
    await engine.run_once(schedule=None)
    assert engine._plan.head == new.key
    passes = engine.schedule_passes
    clock.offset += 400  # old: 1300 s waited, level 2 (and submitted first); new: 400 s, still 2
    await engine.run_once(schedule=None)
    assert engine.schedule_passes == passes + 1  # the timed pass, nothing else changed
    assert engine._plan.head == old.key
    assert engine.why(new.id).code == "behind"
    assert await state_of(engine, holder) == RUNNING


# -- the in-memory queue follows the database ---------------------------------------------------------

async def test_a_job_cancelled_while_queued_never_starts(make_engine):
    engine = make_engine(schedule_interval=600)
    holder = await submit(engine, user="ann")
    await engine.run_once(schedule=None)
    gone = await submit(engine, user="bob")
    kept = await submit(engine, user="cat")
    await engine.run_once(schedule=None)
    assert {gone.id, kept.id} == set(engine._queued.keys)
    await engine.store.write(engine.store.request_cancel, gone.id, "bob")
    engine.wake()
    await engine.run_once(schedule=None)
    assert set(engine._queued.keys) == {kept.id}
    engine.launcher.finish(holder.key, 0)
    for _ in range(3):
        await engine.run_once(schedule=None)
    assert await state_of(engine, gone) == CANCELLED
    assert await state_of(engine, kept) == RUNNING
    assert gone.key not in {k for k, _ in engine.launcher.launches}


async def test_a_cancel_and_a_submission_between_two_passes_are_both_seen(make_engine):
    """The queue's row count stays the same (one left, one came): the delta sync must still drop the
    cancelled job."""
    engine = make_engine(schedule_interval=600)
    holder = await submit(engine, user="ann")
    await engine.run_once(schedule=None)
    gone = await submit(engine, user="bob")
    await engine.run_once(schedule=None)
    await engine.store.write(engine.store.request_cancel, gone.id, "bob")
    new = await submit(engine, user="cat")
    await engine.run_once(schedule=None)
    assert set(engine._queued.keys) == {new.id}
    engine.launcher.finish(holder.key, 0)
    for _ in range(3):
        await engine.run_once(schedule=None)
    assert await state_of(engine, new) == RUNNING and await state_of(engine, gone) == CANCELLED


async def test_a_requeued_job_is_scheduled_again(make_engine):
    engine = make_engine(schedule_interval=600)
    job = await submit(engine, user="ann", retries=1)
    await engine.run_once(schedule=None)
    assert await state_of(engine, job) == RUNNING and job.id not in engine._queued.keys
    engine.launcher.finish(job.key, 1)  # attempt 1 fails: requeued for its retry
    await engine.run_once(schedule=None)  # sees the end, requeues
    await engine.run_once(schedule=None)  # the requeue's pass
    again = await engine.store.read(engine.store.get, job.id)
    assert again.state == RUNNING and again.attempt == 2, again.reason
    assert engine.launcher.launches == [(job.key, 1), (job.key, 2)]


async def test_a_job_put_back_in_the_queue_by_another_process_is_scheduled_again(make_engine):
    """The engine did not requeue it itself: the delta sync finds it by the queued row count."""
    engine = make_engine(schedule_interval=600)
    job = await submit(engine, user="ann")
    await engine.run_once(schedule=None)
    assert await state_of(engine, job) == RUNNING
    await engine.run_once(schedule=None)
    # elsewhere: its attempt is given up and the job is queued again
    engine.launcher.finish(job.key, -9)
    await engine.store.write(engine.store.update, job.id, state=QUEUED, devices=[], launch_state={})
    await asyncio.to_thread(engine.allocator.release, f"job:{job.id}")
    await engine.run_once(schedule=None)
    again = await engine.store.read(engine.store.get, job.id)
    assert again.state == RUNNING and again.attempt == 2
    assert engine.launcher.launches == [(job.key, 1), (job.key, 2)]


async def test_a_start_while_another_writer_holds_the_lock_waits_on_a_thread_not_on_the_loop(make_engine, tmp_path):
    """A job's devices and claim are written on the event loop only when the write lock is free at once; held by
    another process, the start waits for it on a worker thread and the loop goes on serving."""
    import sqlite3
    import threading
    import time

    engine = make_engine(tick=300, schedule_interval=600)
    await running_loop(engine)
    try:
        job = await submit(engine)
        await wait_state(engine, job, RUNNING)  # the lock free: a start as usual
        second = await engine.store.write(engine.store.create, user="bob", name="j", command="train", workers=1, gpus=0)
        taken, release = threading.Event(), threading.Event()

        def hold():
            other = sqlite3.connect(tmp_path / "platform.db", isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            taken.set()
            release.wait(10)
            other.execute("COMMIT")
            other.close()

        holder = threading.Thread(target=hold)
        holder.start()
        assert await asyncio.to_thread(taken.wait, 5)
        engine.wake()
        late, step = 0.0, 0.01
        for _ in range(40):  # 0.4 s of the loop's own timers while the start waits for the lock
            before = time.monotonic()
            await asyncio.sleep(step)
            late = max(late, time.monotonic() - before - step)
        assert await state_of(engine, second) == QUEUED  # it could not be claimed yet
        release.set()
        await wait_state(engine, second, RUNNING)
        await asyncio.to_thread(holder.join)
        assert late < 0.2, f"the event loop stalled {late:.3f} s while the start waited for the lock"
    finally:
        await engine.stop()


@pytest.mark.parametrize("policy, state", [("requeue", QUEUED), ("fail", "failed")])
async def test_a_job_whose_start_the_platform_stop_cut_short_is_the_stops_not_lost(make_engine, tmp_path, monkeypatch,
                                                                                     policy, state):
    """Claimed (running) in a run of the platform that then stopped before the job's launch was recorded: the stop
    ended whatever of it had started, so the next start requeues it (or fails it, ``on_platform_stop``)."""
    import time

    from trainhub.boundary.procs import INSTANCE_VAR
    from trainhub.settings import DataDir, StopRecord

    monkeypatch.setenv(INSTANCE_VAR, "the-run-before")
    engine = make_engine(on_platform_stop=policy)
    never = asyncio.Event()

    async def launch_until_stopped(job, devices, env):
        await never.wait()

    engine.launcher.launch = launch_until_stopped
    job = await submit(engine)
    launching = asyncio.create_task(engine.run_once())
    await wait_state(engine, job, RUNNING)  # claimed; its launch under way
    launching.cancel()  # the platform's stop ends the service in the middle of it
    await asyncio.gather(launching, return_exceptions=True)
    claimed = await engine.store.read(engine.store.get, job.id)
    assert claimed.launch_state == {"dir": None, "workers": [], "instance": "the-run-before"}
    StopRecord("the-run-before", time.time(), "stopped").save(DataDir(tmp_path))
    monkeypatch.setenv(INSTANCE_VAR, "the-next-run")
    restarted = make_engine(on_platform_stop=policy)
    await restarted.recover()
    after = await restarted.store.read(restarted.store.get, job.id)
    assert after.state == state and "while it started" in after.reason, after.reason
    assert restarted.allocator.holdings() == []  # its devices are back in the pool


# -- a start: the claim, then the launch -------------------------------------------------------------------

async def test_gpus_taken_between_the_pass_and_the_claim_leave_the_job_queued_with_the_reason(make_engine, monkeypatch):
    from trainhub.exceptions import TrainhubError

    engine = make_engine(schedule_interval=600)
    allocate = engine.allocator.allocate
    taken = []

    def raced(*a, **kw):  # a notebook server took the GPUs after the pass chose this job
        if not taken:
            taken.append(1)
            raise TrainhubError("2 GPUs asked, 0 free")
        return allocate(*a, **kw)

    monkeypatch.setattr(engine.allocator, "allocate", raced)
    job = await submit(engine)
    await engine.run_once(schedule=None)
    row = await engine.store.read(engine.store.get, job.id)
    assert (row.state, row.reason) == (QUEUED, "2 GPUs asked, 0 free")
    assert engine.launcher.launches == [] and engine.allocator.holdings() == []
    await engine.run_once(schedule=True)  # the next pass starts it
    assert await state_of(engine, job) == RUNNING and engine.launcher.launches == [(job.key, 1)]


async def test_a_launch_that_fails_after_the_claim_fails_the_job_and_frees_its_gpus(make_engine, monkeypatch):
    from trainhub.exceptions import TrainhubError

    engine = make_engine(schedule_interval=600)

    async def broken(job, devices, env):  # e.g. its folder cannot be made: the claim was written all the same
        raise TrainhubError("no space left on device")

    monkeypatch.setattr(engine.launcher, "launch", broken)
    job = await submit(engine)
    await engine.run_once(schedule=None)
    row = await engine.store.read(engine.store.get, job.id)
    assert row.state == "failed" and "could not start its workers: no space left on device" in row.reason
    assert engine.allocator.holdings() == []


async def test_a_restart_by_the_platform_spends_no_retry(make_engine):
    """Attempt 1 is preempted (requeued by the platform), attempt 2 fails: its one retry is still there, and the
    messages count the restart in the attempts ("of 3"); attempt 3 fails: no retries left."""
    from trainhub.fmt import REQUEUED

    engine = make_engine(schedule_interval=600)
    job = await submit(engine, user="ann", retries=1)
    await engine.run_once(schedule=None)
    assert await state_of(engine, job) == RUNNING
    running = await engine.store.read(engine.store.get, job.id)
    await engine._end_attempt(running, QUEUED, f"preempted: a higher-priority job needed its GPUs{REQUEUED}", requeue=True)
    await engine.run_once(schedule=None)
    assert (await engine.store.read(engine.store.get, job.id)).attempt == 2
    engine.launcher.finish(job.key, 1, attempt=2)
    await engine.run_once(schedule=None)  # sees the end: a retry, not the end of the job
    await engine.run_once(schedule=None)
    again = await engine.store.read(engine.store.get, job.id)
    assert again.state == RUNNING and again.attempt == 3, again.reason
    events = [e["message"] for e in await engine.store.read(engine.store.events, job.id)]
    assert "worker 0 exited with code 1; retrying (attempt 3 of 3)" in events, events
    engine.launcher.finish(job.key, 1, attempt=3)
    await engine.run_once(schedule=None)
    done = await engine.store.read(engine.store.get, job.id)
    assert done.state == "failed" and done.reason == "worker 0 exited with code 1 (attempt 3 of 3; no retries left)"
