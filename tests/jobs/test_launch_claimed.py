"""A start's claim and its launch together (``Launcher.launch_claimed``, services/jobs/local.py): the local launcher
makes the attempt's folders while the engine writes the claim, and starts nothing before the claim is written; a job
that is not claimed (cancelled meanwhile), or whose claim fails, leaves nothing behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from waiting import await_for

from trainhub.exceptions import TrainhubError
from trainhub.services.jobs.launcher import JobView
from trainhub.services.jobs.local import LocalLauncher


def job_view(key: str, attempt: int = 1) -> JobView:
    return JobView(id=int(key.split("-")[1]), key=key, user="alice", name=key, command=None,
                   script="print('first line', flush=True)\n", workers=1, gpus=0, env={}, attempt=attempt, time_limit=None)


def base_env() -> dict:
    return {"PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8")}


@pytest.fixture
async def launcher(tmp_path):
    launcher = LocalLauncher(jobs_dir=str(tmp_path / "jobs"), warm_start=False)
    yield launcher
    await launcher.close()


async def test_the_attempt_is_made_ready_while_the_claim_is_written_and_runs_only_after_it(launcher, tmp_path):
    job = job_view("j-000001")
    adir = tmp_path / "jobs" / job.key / "attempt-1"
    seen = {}

    async def claim():
        # the engine writes the claim on the loop without letting it go (engine._write_now): the staging must run
        # beside it all the same, not once the claim is done
        deadline = time.monotonic() + 10
        while not (tmp_path / "jobs" / job.key / "script.py").exists():
            assert time.monotonic() < deadline, "the attempt was not made ready while the claim was written"
            time.sleep(0.002)
        seen["logs before the claim returned"] = sorted(p.name for p in adir.glob("worker-*"))
        return [[]]

    state = await launcher.launch_claimed(job, claim, base_env())
    assert seen["logs before the claim returned"] == []  # no worker started before the claim
    log = Path(state["workers"][0]["log"])
    await await_for(lambda: log.read_text() if log.exists() else "", lambda text: "first line" in text,
                    what="the job's first line", timeout=20, interval=0.02)


async def test_a_job_not_claimed_leaves_no_folder_and_runs_nothing(launcher, tmp_path):
    job = job_view("j-000002")

    async def claim():
        return None  # cancelled between the pass and the claim

    assert await launcher.launch_claimed(job, claim, base_env()) is None
    assert not (tmp_path / "jobs" / job.key).exists()


async def test_a_claim_that_fails_raises_its_error_and_leaves_no_folder(launcher, tmp_path):
    job = job_view("j-000003")

    async def claim():
        raise TrainhubError("2 GPUs asked, 0 free")

    with pytest.raises(TrainhubError, match="0 free"):
        await launcher.launch_claimed(job, claim, base_env())
    assert not (tmp_path / "jobs" / job.key).exists()


async def test_a_retry_not_claimed_removes_only_its_own_attempt(launcher, tmp_path):
    first = job_view("j-000004")

    async def claim():
        return [[]]

    state = await launcher.launch_claimed(first, claim, base_env())
    log = Path(state["workers"][0]["log"])
    await await_for(lambda: log.read_text() if log.exists() else "", lambda text: "first line" in text,
                    what="attempt 1's first line", timeout=20, interval=0.02)

    async def cancelled():
        return None

    assert await launcher.launch_claimed(job_view("j-000004", attempt=2), cancelled, base_env()) is None
    jdir = tmp_path / "jobs" / "j-000004"
    assert sorted(p.name for p in jdir.iterdir() if p.name.startswith("attempt-")) == ["attempt-1"]
    assert "first line" in log.read_text()


async def test_a_staging_that_fails_fails_the_claimed_start(launcher, tmp_path):
    job = job_view("j-000005")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / job.key).write_text("a file where the job's folder goes")

    async def claim():
        return [[]]

    with pytest.raises(OSError):
        await launcher.launch_claimed(job, claim, base_env())

    async def cancelled():
        return None

    assert await launcher.launch_claimed(job, cancelled, base_env()) is None  # not claimed: its staging error is moot
