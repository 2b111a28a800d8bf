"""Notebook schedules in a real jobs service process object (its SQLite database, its submit path), with the
schedule clock moved by the test: due runs fire as their owner, runs missed meanwhile are reported, a run the
service refuses says why, schedules survive a restart, bad input leaves nothing behind."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import nbformat
import pytest

from trainhub.gpus import simulated_devices
from trainhub.notebookjobs import ENV, job_spec
from trainhub.settings import Runtime

USER = "sched-ann"


def make_service(data_dir, max_queued=1000):
    from trainhub.services.jobs.app import JobsService

    JobsService.clear_instance()
    app = JobsService()
    app.initialize(["--data-dir", str(data_dir)])
    app.max_queued_per_user = max_queued
    from trainhub.services.notebooks.schedules import NotebookSchedules

    app.notebook_schedules = NotebookSchedules(service=app, parent=app, interval=0)
    return app


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    for var in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "TRAINHUB_K8S_CONFIG", "TRAINHUB_CONFIG",
                "JUPYTERHUB_SERVICE_PREFIX"):
        monkeypatch.delenv(var, raising=False)
    Runtime(data_dir=str(tmp_path), devices=[d.to_dict() for d in simulated_devices(1)], simulated=True).save()
    return tmp_path


def spec():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("lr = 0.1")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    return job_spec(nb, "proj/a.ipynb", parameters={"lr": "0.2"}, profile="cpu")


def owner():
    from trainhub.services.notebooks.schedules import Owner

    return Owner(USER)


def jobs_of(app):
    items, total = app.store.list(USER, None, 100, 0)
    return items


def test_due_runs_fire_missed_ones_are_reported_and_schedules_survive_a_restart(data_dir):
    async def first():
        app = make_service(data_dir)
        s = app.notebook_schedules
        # half past an hour first: made in an hour's last minute, 3 h 01 min later would pass four full hours (CI
        # failed so at 22:00)
        await s.move_clock((s.now() + timedelta(hours=1)).replace(minute=30, second=0, microsecond=0))
        made = await s.create(owner(), {"name": "hourly", "schedule": "0 * * * *", "job": spec(),
                                        "notebook": {"input": "proj/a.ipynb"}})
        assert await s.run_pass() == []  # nothing due yet
        await s.move_clock(s.now() + timedelta(hours=3, minutes=1))
        report = await s.run_pass()
        assert len(report) == 1 and len(report[0]["missed"]) == 2 and report[0]["job"], report
        assert await s.run_pass() == []  # a due time is considered once
        return made["id"], report[0]["job"], s.offset

    sid, job_key, offset = asyncio.run(first())

    async def after_restart():
        app = make_service(data_dir)
        s = app.notebook_schedules
        from trainhub.services.notebooks.schedules import parse_key, schedule_dict

        row = s.store.get(parse_key(sid), USER)
        d = schedule_dict(row, s.now())
        assert d["runs"] == 1 and d["missed"] == 2 and "missed 2 run(s)" in d["message"] and d["last_job"] == job_key, d
        jobs = jobs_of(app)
        assert [j.key for j in jobs] == [job_key]
        info = json.loads(jobs[0].env[ENV])
        assert info["schedule"] == sid and info["parameters"] == {"lr": 0.2}, info
        # the restarted service keeps the clock where the admin moved it (its database): nothing is due again, and
        # it never goes back
        assert s.offset == offset, (s.offset, offset)
        assert await s.run_pass() == []
        assert await s.move_clock(s.now() - timedelta(hours=1)) >= s.now() - timedelta(seconds=1)
        assert s.offset == offset
        await s.move_clock(s.now() + timedelta(hours=1))
        report = await s.run_pass()
        assert len(report) == 1 and report[0]["missed"] == [] and report[0]["job"], report

    asyncio.run(after_restart())


def test_a_run_the_service_refuses_says_why_on_the_schedule(data_dir):
    async def go():
        app = make_service(data_dir, max_queued=1)
        s = app.notebook_schedules
        made = await s.create(owner(), {"schedule": "*/5 * * * *", "job": spec()})
        from trainhub.services.jobs.spec import validate_spec

        await app.submit(owner(), validate_spec({"command": "sleep 100"}))  # the owner's one queued job
        await s.move_clock(s.now() + timedelta(minutes=6))
        report = await s.run_pass()
        assert len(report) == 1 and "Too many queued jobs" in report[0]["error"], report
        from trainhub.services.notebooks.schedules import parse_key

        row = s.store.get(parse_key(made["id"]), None)
        # the refused run is missed, as is any earlier due time the moved clock passed
        assert row.missed == 1 + len(report[0]["missed"]) and row.runs == 0, (row.missed, report)
        assert "could not start: Too many queued jobs" in row.message

    asyncio.run(go())


@pytest.mark.parametrize("body, says", [
    ({"schedule": "every day", "job": None}, "is not a cron expression"),
    ({"schedule": "0 3 * * *", "timezone": "Mars/Olympus", "job": None}, "unknown time zone"),
    ({"schedule": "0 3 * * *", "job": {"command": "true", "profile": "gpu-99"}}, "gpu-99"),
    ({"schedule": "0 3 * * *", "job": {"command": "true", "gpus": 9}}, "pool has only 1"),
])
def test_bad_schedules_are_refused_and_nothing_is_stored(data_dir, body, says):
    from trainhub.exceptions import TrainhubError

    async def go():
        app = make_service(data_dir)
        b = dict(body)
        if b["job"] is None:
            b["job"] = spec()
        with pytest.raises(TrainhubError) as e:
            await app.notebook_schedules.create(owner(), b)
        assert says in e.value.message
        assert app.notebook_schedules.store.list(None) == []

    asyncio.run(go())

