"""The per-user cap on queued jobs (issue 32, ``JobsService.max_queued_per_user``), in the real jobs service.

The pattern closed: one user's flood stalls another's work. Thousands of queued jobs of one user cost every
scheduling pass and every waiting reason; past the cap a submission is refused with 429 and a JSON body
that names the cap, the count and what to do. Only the caller's own jobs in state ``queued`` count.
Sweep trials are jobs of the sweep's creator: they count, and at the cap a sweep's next trial waits
(pending, with the reason) instead of failing the sweep.

The service runs in process (``JobsService.initialize`` over a temporary data dir, 2 simulated GPUs and
no engine loop: nothing starts), its API on a real tornado server; the hub's authentication is replaced
by ``Authorization: token <user name>``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from trainhub.exceptions import TooManyQueued
from trainhub.gpus import simulated_devices
from trainhub.services.jobs.spec import validate_spec
from trainhub.settings import Runtime
from trainhub.states import QUEUED, RUNNING, SUCCEEDED


@pytest.fixture
def make_service(tmp_path, monkeypatch):
    from trainhub.services.jobs.app import JobsService

    for var in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "TRAINHUB_K8S_CONFIG", "TRAINHUB_CONFIG",
                "JUPYTERHUB_SERVICE_PREFIX"):
        monkeypatch.delenv(var, raising=False)
    Runtime(data_dir=str(tmp_path), devices=[d.to_dict() for d in simulated_devices(2)], simulated=True).save()

    def make(cap: int) -> JobsService:
        c = Config()
        c.JobsService.max_queued_per_user = cap
        c.Isolation.allow_shared_account = True  # several users on a platform without isolation
        app = JobsService(config=c)
        app.initialize(["--data-dir", str(tmp_path)])
        return app

    return make


@pytest.fixture
def api(serve_jobs_api):
    """``start(service)`` serves the service's API; returns ``post(user, path="jobs", **spec) -> (status, body)``."""

    def start(service):
        call = serve_jobs_api(service)
        return lambda user, path="jobs", **spec: call(user, "POST", path, spec)

    return start


def caller(name="alice", admin=False):
    return SimpleNamespace(name=name, groups=(), admin=admin, kind="user", scopes=set())


async def queue_jobs(service, user: str, n: int) -> list:
    return [await service.submit(caller(user), validate_spec({"command": "true"})) for _ in range(n)]


async def test_one_users_flood_is_refused_past_the_cap_with_429_naming_the_cap_and_what_to_do(make_service, api):
    """One user's flood stalls another's work: past max_queued_per_user a submission is a 429 whose JSON body
    names the cap, how many the user has queued and what to do; another user still submits."""
    service = make_service(3)
    post = api(service)
    for _ in range(3):
        status, body = await post("alice", command="true")
        assert status == 201, body
    status, body = await post("alice", command="true")
    assert status == 429
    assert body["status"] == 429
    msg = body["message"]
    assert "alice has 3 jobs queued and may have at most 3" in msg, msg
    assert "max_queued_per_user" in msg and "Cancel some queued jobs" in msg and "wait until some of them start" in msg
    assert service.store.list("alice", None, 50, 0)[1] == 3  # nothing was queued
    status, body = await post("bob", command="true")  # the cap is per user
    assert status == 201, body


async def test_only_the_users_queued_jobs_count(make_service):
    """Running, finished and cancelled jobs do not count, nor do other users' queued jobs."""
    service = make_service(2)
    a, b = await queue_jobs(service, "alice", 2)
    await queue_jobs(service, "bob", 5 - 3)
    with pytest.raises(TooManyQueued):
        await queue_jobs(service, "alice", 1)
    service.store.update(a.id, state=RUNNING)
    [c] = await queue_jobs(service, "alice", 1)
    service.store.update(c.id, state=SUCCEEDED)
    service.store.request_cancel(b.id, "alice")  # a queued job cancelled leaves the queue at once
    await queue_jobs(service, "alice", 2)
    with pytest.raises(TooManyQueued) as refused:
        await queue_jobs(service, "alice", 1)
    assert refused.value.details == {"user": "alice", "queued": 2, "limit": 2}
    assert [j.state for j in service.store.list("alice", [QUEUED], 50, 0)[0]] == [QUEUED, QUEUED]


async def test_cap_zero_is_no_cap(make_service):
    service = make_service(0)
    await queue_jobs(service, "alice", 12)
    assert service.store.list("alice", [QUEUED], 50, 0)[1] == 12


async def test_admins_are_not_exempt(make_service):
    """Every queued job costs each pass and the database alike, whoever queued it."""
    service = make_service(1)
    await service.submit(caller("root", admin=True), validate_spec({"command": "true"}))
    with pytest.raises(TooManyQueued):
        await service.submit(caller("root", admin=True), validate_spec({"command": "true"}))


async def test_a_retry_of_a_submission_already_queued_is_not_refused(make_service):
    """The same submit_key (a client's retry, a sweep's trial submitted again) queues nothing: it answers the job."""
    service = make_service(1)
    first = await service.submit(caller(), validate_spec({"command": "true", "submit_key": "k1"}))
    again = await service.submit(caller(), validate_spec({"command": "true", "submit_key": "k1"}))
    assert again.id == first.id
    with pytest.raises(TooManyQueued):
        await service.submit(caller(), validate_spec({"command": "true", "submit_key": "k2"}))


async def test_concurrent_submissions_cannot_pass_the_cap_together(make_service, monkeypatch):
    """Submissions whose rows are still being written count: a burst stops at the cap even when each insert
    waits on a thread (another writer holding the lock) after its count was read."""
    service = make_service(5)
    write_now = service.store.write_now

    async def slow_write(fn, *a, **kw):
        await asyncio.sleep(0.05)
        return await write_now(fn, *a, **kw)

    monkeypatch.setattr(service.store, "write_now", slow_write)
    results = await asyncio.gather(*(service.submit(caller(), validate_spec({"command": "true"})) for _ in range(12)),
                                   return_exceptions=True)
    assert sum(not isinstance(r, Exception) for r in results) == 5
    assert all(isinstance(r, TooManyQueued) for r in results if isinstance(r, Exception))
    assert service.store.list("alice", [QUEUED], 50, 0)[1] == 5 and service._submitting == {}


async def test_a_sweep_is_refused_at_the_cap_and_its_trials_wait_for_room(make_service, api):
    """Sweep trials are queued jobs of the sweep's creator: POST /sweeps at the cap is a 429; a running sweep whose
    next trial meets the cap keeps that trial pending (the reason says why) and submits it once there is room."""
    from trainhub.services.sweeps.controller import SweepController
    from trainhub.services.sweeps.spec import validate_sweep

    service = make_service(3)
    post = api(service)
    jobs = await queue_jobs(service, "alice", 3)
    sweep_body = {"script": "import trainhub\ntrainhub.report(step=0, val_loss=1)\n", "trials": 4, "parallel": 2, "metric": "val_loss", "mode": "min",
                  "space": {"x": "uniform:0:1"}, "sampler": "random", "seed": 1, "pruner": "none"}
    status, body = await post("alice", "sweeps", **sweep_body)
    assert status == 429 and "alice has 3 jobs queued" in body["message"], body

    service.store.request_cancel(jobs[0].id, "alice")  # room for one trial
    c = SweepController(service)
    try:
        await c.optuna(c.storage)
        sweep = await c.create(caller(), validate_sweep(sweep_body))
        await c.run_once()
        trials = c.store.trials(sweep.id)
        assert [t.state for t in trials] == ["running", "pending"]
        assert trials[1].reason.startswith("waiting to submit its job: Too many queued jobs: alice has 3 jobs queued")
        assert c.store.get(sweep.id).state == "running"  # the sweep goes on
        service.store.request_cancel(jobs[1].id, "alice")
        await c.run_once()
        trials = c.store.trials(sweep.id)
        assert [t.state for t in trials] == ["running", "running"]
        assert service.store.list("alice", [QUEUED], 50, 0)[1] == 3
    finally:
        await c.stop()
