"""The sweep controller: its pure decisions (tables) and its loop in process, on a real SQLite
platform database and real Optuna storage, with a stand-in for the jobs service whose jobs the
tests finish by hand (state + reported metrics), as the engine would."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from waiting import await_for

from trainhub.db import get_engine, sync_mode, write_session
from trainhub.services.jobs.models import JobMetric
from trainhub.services.jobs.store import JobStore
from trainhub.services.sweeps.controller import SweepController
from trainhub.services.sweeps.sampling import ahead_allowed
from trainhub.services.sweeps.trials import failing_fast, metric_points, trial_outcome, trials_to_start
from trainhub.services.sweeps.spec import validate_sweep


@pytest.mark.parametrize("records, expected", [
    ([], []),
    ([{"step": 0, "worker": 0, "values": {"val_loss": 1.0}}, {"step": 1, "worker": 0, "values": {"loss": 2.0}},
      {"step": 2, "worker": 0, "values": {"val_loss": 0.5}}], [(0, 1.0), (2, 0.5)]),
    ([{"step": None, "worker": 0, "values": {"val_loss": 3}}, {"step": None, "worker": 0, "values": {"val_loss": 2}}],
     [(0, 3.0), (1, 2.0)]),
    ([{"step": 0, "worker": 1, "values": {"val_loss": 9.0}}, {"step": 0, "worker": 0, "values": {"val_loss": 1.0}}],
     [(0, 1.0)]),  # the lead worker only
    ([{"step": 0, "worker": 0, "values": {"val_loss": True}}, {"step": 1, "worker": 0, "values": {"val_loss": float("nan")}}], []),
])
def test_metric_points(records, expected):
    assert metric_points(records, "val_loss") == expected


@pytest.mark.parametrize("job_state, points, cancelled, expected", [
    ("succeeded", [(0, 2.0), (1, 1.5)], False, ("complete", 1.5, "val_loss = 1.5 (job j-000001 succeeded)")),
    ("succeeded", [], False, ("failed", None, "metric 'val_loss' was never reported (the trial must call trainhub.report(step=..., val_loss=...))")),
    ("failed", [(0, 1.0)], False, ("failed", None, "job j-000001 failed: worker 0 exited with code 1")),
    ("lost", [], False, ("failed", None, "job j-000001 lost: worker 0 exited with code 1")),
    ("cancelled", [], True, ("cancelled", None, "the sweep was cancelled")),
    ("cancelled", [], False, ("cancelled", None, "its job j-000001 was cancelled: worker 0 exited with code 1")),
])
def test_trial_outcome(job_state, points, cancelled, expected):
    assert trial_outcome(job_state, "worker 0 exited with code 1", "j-000001", points, "val_loss", cancelled) == expected


@pytest.mark.parametrize("n, parallel, started, unfinished, expected", [
    (8, 2, 0, 0, 2), (8, 2, 2, 2, 0), (8, 2, 3, 1, 1), (8, 4, 7, 1, 1), (8, 4, 8, 2, 0), (3, 5, 0, 0, 3), (8, 2, 2, 3, 0),
])
def test_trials_to_start(n, parallel, started, unfinished, expected):
    assert trials_to_start(n, parallel, started, unfinished) == expected


def T(number, state, reason=""):
    return SimpleNamespace(number=number, state=state, reason=reason)


@pytest.mark.parametrize("trials, limit, stops", [
    ([T(0, "failed", "boom"), T(1, "failed", "boom"), T(2, "failed", "boom")], 3, "the first 3 trials failed and none completed (trial 2: boom)"),
    ([T(0, "failed"), T(1, "failed"), T(2, "running")], 3, None),
    ([T(0, "complete"), T(1, "failed"), T(2, "failed"), T(3, "failed")], 3, None),
    ([T(0, "failed", "x")], 1, "the first 1 trials failed and none completed (trial 0: x)"),
    ([T(0, "failed"), T(1, "failed"), T(2, "failed")], 0, None),
])
def test_failing_fast(trials, limit, stops):
    assert failing_fast(trials, limit) == stops


# -- the loop, in process ----------------------------------------------------------------------------
class FakeService:
    """What the controller uses of JobsService: db_url, store, engine.wake(), submit()."""

    def __init__(self, db_url):
        self.db_url = db_url
        self.store = JobStore(db_url)
        self.engine = SimpleNamespace(wake=lambda: None)
        self.submits = 0
        self.specs = []  # every JobSpec submitted

    async def submit(self, caller, spec):
        self.submits += 1
        self.specs.append(spec)
        return await self.store.write(
            self.store.create, name=spec.name, user=caller.name, groups=list(caller.groups), command=spec.command,
            script=spec.script, gpus=spec.gpus or 0, workers=spec.workers, env=spec.env, time_limit=spec.time_limit,
            retries=spec.retries, profile=None, priority=0, preemptible=False,
            submit_key=f"{caller.name}:{spec.submit_key}", sweep_id=spec.sweep_id, params=spec.params, reason="queued")


def finish(service, job_id, state="succeeded", values=(), reason="done"):
    """Play the engine: record metrics (step, value) of 'val_loss' and end (or just run) the job."""
    with write_session(service.db_url) as s:
        for step, v in values:
            s.add(JobMetric(job_id=job_id, worker=0, time=time.time(), step=step, values={"val_loss": v}))
        s.commit()
    service.store.update(job_id, state=state, reason=reason)


@pytest.fixture
def env(tmp_path):
    service = FakeService(f"sqlite:///{tmp_path}/platform.db")
    caller = SimpleNamespace(name="alice", groups=(), admin=False)
    return service, caller


def spec(**kw):
    body = {"script": "import trainhub\ntrainhub.report(step=0, val_loss=1)\n", "trials": 4, "parallel": 2,
            "metric": "val_loss", "mode": "min", "space": {"x": "uniform:0:1"}, "sampler": "random", "seed": 1,
            "pruner": "none"}
    body.update(kw)
    return validate_sweep(body)


async def test_controller_runs_trials_at_most_parallel_and_completes(env):
    service, caller = env
    c = SweepController(service)
    await c.optuna(c.storage)
    sweep = await c.create(caller, spec())
    await c.run_once()
    trials = c.store.trials(sweep.id)
    assert [t.state for t in trials] == ["running", "running"] and service.submits == 2
    jobs = [service.store.get(t.job_id) for t in trials]
    assert [j.params for j in jobs] == [t.params for t in trials]
    assert all(j.env["TRAINHUB_SWEEP_ID"] == sweep.key and j.sweep_id == sweep.id for j in jobs)
    assert [j.submit_key for j in jobs] == [f"alice:sweep-{sweep.id}-trial-0", f"alice:sweep-{sweep.id}-trial-1"]
    await c.run_once()
    assert service.submits == 2  # both slots busy
    finish(service, trials[0].job_id, values=[(0, 0.9), (1, 0.4)])
    finish(service, trials[1].job_id, values=[])  # never reported
    await c.run_once()
    trials = c.store.trials(sweep.id)
    assert [(t.state, t.value) for t in trials[:2]] == [("complete", 0.4), ("failed", None)]
    assert trials[1].reason.startswith("metric 'val_loss' was never reported")
    assert trials[0].intermediate == [[0, 0.9], [1, 0.4]]
    assert len(trials) == 4 and service.submits == 4
    for t in trials[2:]:
        finish(service, t.job_id, values=[(0, 0.2 + t.number)])
    await c.run_once()
    await c.run_once()
    s = c.store.get(sweep.id)
    assert s.state == "completed" and s.reason.startswith("best val_loss = 0.4 (trial 0, j-000001); 3 complete, 1 failed")
    study = await c.optuna(c._study, sweep)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    await c.stop()


async def test_every_trial_runs_in_the_sweeps_working_directory_kept_while_the_sweep_runs(env):
    """A sweep naming a working directory (%%sweep sends the notebook's folder once): every trial's job names it, and
    the sweep keeps it from being pruned (``workdirs_in_use``) until it ends."""
    from trainhub.services import sweeps as sweeps_plugin

    service, caller = env
    sha = "ab" * 32
    c = SweepController(service)
    service.sweeps = c
    await c.optuna(c.storage)
    sweep = await c.create(caller, spec(workdir=sha, trials=3))
    other = await c.create(SimpleNamespace(name="bob", groups=(), admin=False), spec())
    assert sweep.job["workdir"] == sha and other.job["workdir"] is None
    assert sweeps_plugin.workdirs_in_use(service, "alice") == {sha} and sweeps_plugin.workdirs_in_use(service, "bob") == set()
    await c.run_once()
    for _ in range(3):
        for t in c.store.trials(sweep.id):
            if service.store.get(t.job_id).state == "queued":
                finish(service, t.job_id, values=[(0, 0.5)])
        await c.run_once()
    mine = [s for s in service.specs if s.sweep_id == sweep.id]
    assert len(mine) == 3 and {s.workdir for s in mine} == {sha}
    assert {s.workdir for s in service.specs if s.sweep_id == other.id} == {None}
    assert c.store.get(sweep.id).state == "completed"
    assert sweeps_plugin.workdirs_in_use(service, "alice") == set()  # ended: its archive may go once unused
    await c.stop()


async def test_controller_prunes_a_trial_worse_than_the_median(env):
    service, caller = env
    c = SweepController(service, tick=0.05)
    await c.optuna(c.storage)
    sweep = await c.create(caller, spec(pruner="median", startup_trials=1, trials=3))
    await c.run_once()
    a, b = c.store.trials(sweep.id)
    finish(service, a.job_id, values=[(0, 0.1), (1, 0.1), (2, 0.1)])
    finish(service, b.job_id, state="running", values=[(0, 5.0)])
    await c.run_once()  # a's end recorded, its slot refilled; the running trial's new values may wait for ...
    a, b, third = c.store.trials(sweep.id)
    assert (a.state, third.state) == ("complete", "running")
    await asyncio.sleep(c.tick)  # ... the next pass, a tick later at the latest, even if that one submits too
    await c.run_once()
    a, b, third = c.store.trials(sweep.id)
    assert a.state == "complete" and b.state == "pruned" and b.reason.startswith("pruned at step 0: val_loss = 5")
    job = service.store.get(b.job_id)
    assert job.cancel_requested  # the engine stops it and frees its GPUs
    assert third.state == "running"
    await c.stop()


async def test_a_restarted_controller_resumes_without_resubmitting(env):
    service, caller = env
    c = SweepController(service)
    await c.optuna(c.storage)
    sweep = await c.create(caller, spec(trials=3, sampler="tpe", startup_trials=1))  # TPE modelling: nothing asked ahead
    await c.run_once()
    first = c.store.trials(sweep.id)
    finish(service, first[0].job_id, values=[(0, 0.3)])
    # the service dies after asking Optuna and recording a trial, before submitting its job ...
    number, optuna_id, params = await c.optuna(c._ask, sweep)
    c.store.add_trial(sweep_id=sweep.id, number=number, optuna_id=optuna_id, params=params, state="pending")
    # ... and after asking Optuna once more without recording anything
    await c.optuna(c._ask, sweep)
    await c.stop()
    c2 = SweepController(service)  # what start() does, without its loop: passes are driven by hand
    await c2.optuna(c2.storage)
    await c2.reconcile_orphans()
    await c2.run_once()
    trials = c2.store.trials(sweep.id)
    assert [t.number for t in trials] == [0, 1, 2] and trials[0].state == "complete"
    assert trials[2].state == "running" and trials[2].job_id  # the pending one was submitted
    assert service.submits == 3
    study = await c2.optuna(c2._study, sweep)
    assert study.trials[3].state.name == "FAIL"  # the orphan asked before the crash
    # submitting again under the same key returns the same job: a trial never runs twice
    await c2._submit(c2.store.get(sweep.id), trials[2])
    assert len(service.store.list("alice", None, 50, 0)[0]) == 3
    await c2.stop()


async def test_a_trial_asked_ahead_and_an_outcome_not_yet_told_survive_restarts(env):
    """The next trial is asked while its slot is still busy, and a trial's outcome reaches Optuna after its row (and
    after the next trial's submission): a crash in between loses neither. The restart tells Optuna what the rows
    record and adopts the trial asked ahead, so the sweep runs the same trials as without the crashes."""
    service, caller = env
    c = SweepController(service, tick=600.0)  # a pass that submits leaves the rest to a pass 600 s later
    await c.optuna(c.storage)
    sweep = await c.create(caller, spec(trials=3, parallel=1))
    await c.run_once()  # trial 0 submitted; no pass had done the later work yet, so trial 1 is asked ahead at once
    [ahead] = c._ahead[sweep.id]
    assert ahead[0] == 1 and [t.number for t in c.store.trials(sweep.id)] == [0]
    finish(service, c.store.trials(sweep.id)[0].job_id, values=[(0, 0.7), (1, 0.3)])
    await c.run_once()  # trial 0 recorded, trial 1 (the one asked ahead) submitted; Optuna not told yet
    t0, t1 = c.store.trials(sweep.id)
    assert (t0.state, t0.value, t0.intermediate) == ("complete", 0.3, [[0, 0.7], [1, 0.3]])
    assert (t1.number, t1.params, t1.state) == (1, ahead[2], "running") and service.store.get(t1.job_id).params == ahead[2]
    study = await c.optuna(c._study, sweep)
    assert study.trials[0].state.name == "RUNNING"
    await c.stop()  # the service dies

    c2 = SweepController(service, tick=600.0)
    await c2.optuna(c2.storage)
    await c2.reconcile_orphans()
    study = await c2.optuna(c2._study, sweep)
    told = study.trials[0]
    assert (told.state.name, told.value, told.intermediate_values) == ("COMPLETE", 0.3, {0: 0.7, 1: 0.3})
    assert sweep.id not in c2._ahead  # trial 1 has its row: not an orphan
    await c2.run_once()  # nothing to submit: trial 2 is asked ahead
    [ahead] = c2._ahead[sweep.id]
    assert ahead[0] == 2
    await c2.stop()  # and the service dies again

    c3 = SweepController(service, tick=600.0)
    await c3.optuna(c3.storage)
    await c3.reconcile_orphans()
    assert c3._ahead[sweep.id] == [ahead]  # adopted, not failed: same number, same parameters
    finish(service, c3.store.trials(sweep.id)[1].job_id, values=[(0, 0.5)])
    await c3.run_once()
    t2 = c3.store.trials(sweep.id)[2]
    assert (t2.number, t2.params, t2.state) == (2, ahead[2], "running")
    finish(service, t2.job_id, values=[(0, 0.1)])
    await c3.run_once()
    s = c3.store.get(sweep.id)
    assert s.state == "completed" and s.reason.startswith("best val_loss = 0.1 (trial 2")
    study = await c3.optuna(c3._study, sweep)
    assert [(t.number, t.state.name, t.value) for t in study.trials] == [(0, "COMPLETE", 0.3), (1, "COMPLETE", 0.5),
                                                                         (2, "COMPLETE", 0.1)]
    assert service.submits == 3
    await c3.stop()


async def test_from_a_trials_end_to_the_next_ones_submission_no_optuna_call_and_three_writes(env):
    """The path a serial sweep waits on: with the next trial asked ahead, the pass that records the end submits the
    next trial without any Optuna call, in three writes (both trial rows, the job, the job's id on the new row)."""
    service, caller = env
    c = SweepController(service, tick=600.0)
    await c.optuna(c.storage)
    sweep = await c.create(caller, spec(trials=3, parallel=1))
    await c.run_once()  # trial 0 submitted, trial 1 asked ahead
    assert [a[0] for a in c._ahead[sweep.id]] == [1]
    finish(service, c.store.trials(sweep.id)[0].job_id, values=[(0, 0.3)])
    calls, writes = [], []
    optuna, write = c.optuna, service.store.write
    c.optuna = lambda fn, *a, **kw: calls.append(fn.__name__) or optuna(fn, *a, **kw)
    service.store.write = lambda fn, *a, **kw: writes.append(fn.__name__) or write(fn, *a, **kw)
    await c.run_once()
    assert calls == [] and writes == ["record_trials", "create", "update_trial"]
    t0, t1 = c.store.trials(sweep.id)
    assert (t0.state, t1.state, t1.job_id) == ("complete", "running", service.store.get(t1.job_id).id)
    await c.later_work(c.store.get(sweep.id))  # the next quiet pass: Optuna told, trial 2 asked ahead
    assert calls == ["_tell_all", "_ask_many"]
    await c.stop()


async def test_a_parallel_sweep_keeps_a_trial_asked_ahead_for_every_slot(env):
    service, caller = env
    c = SweepController(service, tick=600.0)
    await c.optuna(c.storage)
    sweep = await c.create(caller, spec(trials=5, parallel=2))
    await c.run_once()  # trials 0 and 1 submitted; 2 and 3 asked ahead (5 - 2 left, at most 2)
    ahead = list(c._ahead[sweep.id])
    assert [a[0] for a in ahead] == [2, 3]
    for t in c.store.trials(sweep.id):
        finish(service, t.job_id, values=[(0, 0.5)])
    calls = []
    optuna = c.optuna
    c.optuna = lambda fn, *a, **kw: calls.append(fn.__name__) or optuna(fn, *a, **kw)
    await c.run_once()  # both slots refilled in the same pass, from the trials asked ahead
    assert calls == []
    trials = c.store.trials(sweep.id)
    assert [(t.number, t.params, t.state) for t in trials[2:]] == [(a[0], a[2], "running") for a in ahead]
    await c.later_work(c.store.get(sweep.id))
    assert [a[0] for a in c._ahead[sweep.id]] == [4]  # the one trial left to start
    await c.stop()


@pytest.mark.parametrize("sampler, settings, finished, unfinished, parallel, expected", [
    ("random", {}, 0, 1, 1, 1),
    ("random", {}, 0, 2, 4, 4),  # 6 trials, 2 started: the 4 left
    ("random", {}, 0, 1, 2, 2),  # never more than parallel
    ("grid", {}, 2, 1, 2, 2),
    ("random", {}, 5, 1, 2, 0),  # all 6 trials asked already
    ("tpe", {"startup_trials": 3}, 1, 1, 4, 1),  # even if the running one completes, the next ask is random
    ("tpe", {"startup_trials": 3}, 1, 2, 4, 0),  # it may be the first TPE models
    ("tpe", {"startup_trials": 4}, 0, 1, 4, 3),  # the 3rd ahead: random even if the running one and 2 before it finish
    ("cmaes", {}, 0, 1, 4, 0),
])
def test_ahead_allowed_only_where_the_suggestion_cannot_change(sampler, settings, finished, unfinished, parallel, expected):
    trials = [SimpleNamespace(state="complete") for _ in range(finished)] + \
             [SimpleNamespace(state="running") for _ in range(unfinished)]
    assert ahead_allowed({"sampler": sampler, **settings}, 6, parallel, trials) == expected


async def test_cancel_stops_unfinished_jobs_and_ends_the_sweep(env):
    service, caller = env
    c = SweepController(service)
    await c.optuna(c.storage)
    sweep = await c.create(caller, spec(trials=5))
    await c.run_once()
    trials = c.store.trials(sweep.id)
    for t in trials:
        service.store.update(t.job_id, state="running")
    ahead = [a[0] for a in c._ahead[sweep.id]]
    assert ahead == [2, 3]  # random sampler: the next two asked while both slots are busy
    await c.cancel(c.store.get(sweep.id), "alice")
    assert all(service.store.get(t.job_id).cancel_requested for t in trials)
    await c.run_once()
    assert c.store.get(sweep.id).state == "running"  # its jobs are still stopping
    assert [a[0] for a in c._ahead[sweep.id]] == ahead  # and nothing more is asked ahead
    for t in trials:
        finish(service, t.job_id, state="cancelled", reason="cancelled by alice while running")
    await c.run_once()
    await c.run_once()
    s = c.store.get(sweep.id)
    assert (s.state, s.reason) == ("cancelled", "cancelled by alice")
    assert [t.state for t in c.store.trials(sweep.id)] == ["cancelled", "cancelled"] and service.submits == 2
    study = await c.optuna(c._study, sweep)
    assert [t.state.name for t in study.trials] == ["FAIL"] * 4 and sweep.id not in c._ahead  # those asked ahead too
    await c.stop()


async def test_a_stored_sweep_that_cannot_be_rebuilt_fails_alone_with_its_reason(env):
    """A row written before today's limits (or edited by hand) must not take the controller down on every
    restart: it fails with its reason, its jobs are stopped, and the other sweeps carry on."""
    service, caller = env
    c = SweepController(service)
    await c.optuna(c.storage)
    broken = await c.create(caller, spec(trials=4, sampler="grid", space={"n": "int:1:4"}))
    healthy = await c.create(caller, spec(trials=3))
    await c.run_once()
    running = [t.job_id for t in c.store.trials(broken.id)]
    assert len(running) == 2
    service.store.update(running[0], state="running")
    await c.stop()
    c.store.update(broken.id, space={"n": {"type": "int", "low": 0, "high": 200_000}})  # a grid past the limit
    c2 = SweepController(service)
    await c2.optuna(c2.storage)
    await c2.reconcile_orphans()
    await c2.run_once()
    s = c2.store.get(broken.id)
    assert s.state == "failed" and s.reason.startswith("its stored search space cannot be used: the grid has 200,001 points")
    assert service.store.get(running[0]).cancel_requested and service.store.get(running[1]).state == "cancelled"
    assert {t.state for t in c2.store.trials(broken.id)} == {"cancelled"}
    assert all(t.reason.startswith("the sweep failed: its stored search space") for t in c2.store.trials(broken.id))
    for _ in range(3):  # the healthy sweep carries on: 2 trials, then its third, then it completes
        for t in c2.store.trials(healthy.id):
            if service.store.get(t.job_id).state not in ("succeeded",):
                finish(service, t.job_id, values=[(0, 0.5)])
        await c2.run_once()
    assert c2.store.get(healthy.id).state == "completed" and len(c2.store.trials(healthy.id)) == 3
    await c2.run_once()  # a failed sweep is not looked at again
    assert c2.store.get(broken.id).state == "failed"
    await c2.stop()


async def test_the_end_of_a_trials_job_wakes_the_controller_at_once(env):
    """With a tick far longer than the test, only the engine's end callback can refill the freed slot."""
    service, caller = env
    listeners = []
    service.engine = SimpleNamespace(wake=lambda: None, on_job_end=listeners.append)
    c = SweepController(service, tick=600.0)
    await c.start()
    try:
        assert listeners == [c._job_ended]
        sweep = await c.create(caller, spec(trials=2, parallel=1))
        first = await await_for(lambda: c.read(c.store.trials, sweep.id), lambda ts: len(ts) == 1 and ts[0].job_id,
                                what="the first trial's job", timeout=30)
        job = service.store.get(first[0].job_id)
        finish(service, job.id, values=[(0, 0.5)])
        passes = c.passes
        listeners[0](SimpleNamespace(id=999, sweep_id=None))  # not a trial's job: no pass
        await asyncio.sleep(0.3)
        assert c.passes == passes and len(c.store.trials(sweep.id)) == 1
        listeners[0](job)
        trials = await await_for(lambda: c.read(c.store.trials, sweep.id), lambda ts: len(ts) == 2 and ts[1].job_id,
                                 what="the second trial, started on the callback", timeout=30)
        assert (trials[0].state, trials[0].value) == ("complete", 0.5)
    finally:
        await c.stop()


async def test_optuna_commits_without_an_fsync_of_its_own_and_the_platform_keeps_its_setting(env):
    service, _caller = env
    c = SweepController(service)
    storage = await c.optuna(c.storage)
    with storage.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    with get_engine(service.db_url).connect() as conn:
        # the platform's own setting ($TRAINHUB_DB_SYNC): with full, the trial rows make Optuna's writes durable
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == {"normal": 1, "full": 2}[sync_mode()]
    await c.stop()
