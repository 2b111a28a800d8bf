"""What every worker of an attempt gets from the engine (services/jobs/attemptenv.py): its variables,
its storage area and the checkpoint it is offered, with and without the platform's storage."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from services.jobs.attemptenv import AttemptEnv, resume_vars
from services.jobs.launcher import JobView
from services.jobs.local import LocalLauncher
from trainhub.jobarea import Area, checkpoint_name
from trainhub.storage import StorageConfig


def _job(**kw) -> JobView:
    base = dict(id=7, key="j-000007", user="ann", name="train-cifar", command="python t.py", script=None, workers=2,
                gpus=1, env={}, attempt=2, time_limit=None, params={"lr": 0.1}, profile="gpu-1")
    return JobView(**{**base, **kw})


def test_variables_of_an_attempt_without_storage(tmp_path):
    launcher = LocalLauncher(jobs_dir=str(tmp_path / "jobs"), home_dir_template="/home/{username}")
    env = AttemptEnv(launcher, StorageConfig(url="")).base(_job(), retries=3, api_url="http://hub/services/jobs/api")
    assert env["TRAINHUB_JOB_ID"] == "j-000007" and env["TRAINHUB_JOB_NAME"] == "train-cifar"
    assert env["TRAINHUB_USER"] == "ann" and env["TRAINHUB_JOB_ATTEMPT"] == "2" and env["TRAINHUB_PROFILE"] == "gpu-1"
    assert json.loads(env["TRAINHUB_PARAMS"]) == {"lr": 0.1}
    assert env["HOME"] == "/home/ann" and env["TRAINHUB_API_URL"] == "http://hub/services/jobs/api"
    # the user's own environment first (trainhub.boundary.userenv: pip install [--user]), then the platform's commands
    assert env["PATH"].split(os.pathsep)[:3] == ["/home/ann/.trainhub/venv/bin", "/home/ann/.local/bin",
                                                 os.path.dirname(sys.executable)]
    py = f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert env["PYTHONPATH"] == f"/home/ann/.local/lib/{py}/site-packages:/home/ann/.trainhub/venv/lib/{py}/site-packages"
    assert env["TORCHELASTIC_RESTART_COUNT"] == "1" and env["TORCHELASTIC_MAX_RESTARTS"] == "3"
    # no storage: the area is the job's own folder, and no storage variable is set
    assert env["TRAINHUB_JOB_URL"] == str(tmp_path / "jobs" / "j-000007")
    assert not any(k.startswith("TRAINHUB_STORAGE") for k in env)
    bare = AttemptEnv(LocalLauncher(jobs_dir=str(tmp_path / "jobs")), StorageConfig(url="")).base(
        _job(profile=None, params={}), retries=0)
    assert "HOME" not in bare and "TRAINHUB_API_URL" not in bare and "TRAINHUB_PROFILE" not in bare
    assert "PYTHONPATH" not in bare and bare["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert bare["TRAINHUB_PARAMS"] == "{}"


def test_area_and_checkpoint_on_the_platforms_storage(tmp_path):
    storage = StorageConfig(url=str(tmp_path / "storage"))
    attempt = AttemptEnv(LocalLauncher(jobs_dir=str(tmp_path / "jobs")), storage)
    job = _job()
    env = attempt.base(job, retries=1)
    assert env["TRAINHUB_JOB_URL"] == f"{storage.user_url('ann')}/jobs/j-000007"
    assert env["TRAINHUB_STORAGE_URL"] == storage.user_url("ann")
    assert asyncio.run(attempt.resume_point(job, env)) is None  # nothing saved yet
    area = Area(env["TRAINHUB_JOB_URL"])
    for step in (5, 40, 12):
        area.write_bytes(f"checkpoints/{checkpoint_name(step, 'bytes')}", b"w" * step)
    area.write_bytes("checkpoints/step-000000000099.bin.tmp-123", b"half")  # a save under way is not offered
    found = asyncio.run(attempt.resume_point(job, env))
    assert found.step == 40 and found.url.endswith(checkpoint_name(40, "bytes"))
    assert resume_vars(found) == {"TRAINHUB_RESUME_URL": found.url, "TRAINHUB_RESUME_STEP": "40"}


def test_an_unreadable_area_raises_for_the_engine_to_report(tmp_path):
    attempt = AttemptEnv(LocalLauncher(jobs_dir=str(tmp_path / "jobs")), StorageConfig(url=""))
    with pytest.raises(ValueError, match="nosuchprotocol"):
        asyncio.run(attempt.resume_point(_job(), {"TRAINHUB_JOB_URL": "nosuchprotocol://bucket/jobs/j-000007"}))
