"""The local launcher runs a job in the working directory it was sent with (trainhub.workdir), through the real job
engine and local launcher (no isolation here: the same code path as the user's UserTree without an account; the
accounts and the sandbox are exercised by tests/jobs/test_ddp_tutorial_e2e.py through `trainhub up`).

- script jobs (warm from the fork server) and command jobs (cold) run in the unpacked copy, importing from it;
- a retried attempt runs in the copy its predecessor left (what it wrote there is still there);
- an archive that would leave the folder fails the launch, naming why, and nothing is written outside.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest
from waiting import await_for

from trainhub import workdir as wd


@pytest.fixture
async def engine(tmp_path):
    from trainhub.ledger import LocalGPUAllocator
    from trainhub.quotas import QuotaPolicy
    from trainhub.services.jobs.engine import JobEngine
    from trainhub.services.jobs.local import LocalLauncher
    from trainhub.services.jobs.outputs import OutputSyncer
    from trainhub.services.jobs.store import JobStore
    from trainhub.storage import StorageConfig

    data = tmp_path / "data"
    data.mkdir()
    db = f"sqlite:///{data}/platform.db"
    store = JobStore(db)
    launcher = LocalLauncher(data_dir=str(data), home_dir_template="")
    storage = StorageConfig(url=str(data / "storage"))
    storage.ensure_layout(["ann"])
    eng = JobEngine(store, LocalGPUAllocator(db_url=db, device_list=[]), launcher, QuotaPolicy(), storage,
                    OutputSyncer(storage), tick=0.1)
    yield eng
    await launcher.close()


def sent(engine, user: str, folder) -> dict:
    """``folder`` packed and put in the service's store, as PUT /workdirs does."""
    snap = wd.snapshot(folder)
    upload = engine.launcher.workdir_store.receive(user, snap.sha256)
    upload.write(snap.archive.read())
    info = upload.finish()
    return {"sha256": info.sha256, "files": info.files, "bytes": info.bytes}


async def run(engine, **fields):
    store = engine.store
    job = await store.write(store.create, user="ann", name="wd", gpus=0, workers=1, **fields)

    async def step():
        await engine.run_once()
        return await store.read(store.get, job.id)

    from trainhub.states import JOB_TERMINAL

    job = await await_for(step, lambda j: j.state in JOB_TERMINAL, what="the job to end", timeout=120, interval=0.1,
                          describe=lambda j: f"still {j.state}: {j.reason}")
    jdir = engine.launcher.job_dir(job)
    logs = "".join(p.read_text() for p in sorted(Path(jdir).glob("attempt-*/worker-*.log")))
    return job, logs, jdir


@pytest.fixture
def project(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "datautils.py").write_text("ROWS = [1, 2, 3]\n")
    (folder / "train.py").write_text("import os, sys\nfrom datautils import ROWS\n"
                                     "print('cwd', os.getcwd(), 'path0', sys.path[0], 'args', sys.argv[1:], 'rows', ROWS)\n")
    return folder


async def test_script_and_command_jobs_run_in_the_unpacked_copy(engine, project):
    from trainhub.capture import PATH0_CWD

    workdir = sent(engine, "ann", project)
    job, logs, jdir = await run(engine, command="python train.py --epochs 3", workdir=workdir)
    assert job.state == "succeeded", logs
    assert f"cwd {jdir}/workdir path0 {jdir}/workdir args ['--epochs', '3'] rows [1, 2, 3]" in logs
    # a %%train script (the working directory first on sys.path, as the capture writes it), started warm
    script = f"{PATH0_CWD}\nimport os, sys\nfrom datautils import ROWS\nprint('cwd', os.getcwd(), 'path0', sys.path[0], ROWS)\n"
    job, logs, jdir = await run(engine, script=script, workdir=workdir)
    assert job.state == "succeeded", logs
    assert f"cwd {jdir}/workdir path0 {jdir}/workdir [1, 2, 3]" in logs
    events = await engine.store.read(engine.store.events, job.id)
    assert any(e["kind"] == "workdir" and "2 files" in e["message"] for e in events), events
    # the copy stays on the machine: the output sync leaves it out of the job's storage area (its logs are there)
    area = engine.storage.root() + f"/users/ann/jobs/{job.key}"
    await await_for(lambda: os.path.exists(f"{area}/attempt-1/worker-0.log"), what="the job's log in its storage area",
                    timeout=60)
    assert os.path.exists(f"{area}/script.py") and not os.path.exists(f"{area}/workdir")


async def test_a_retried_attempt_runs_in_the_copy_its_predecessor_left(engine, project):
    (project / "train.py").write_text(
        "import os, sys\nif os.path.exists('snapshot.pt'):\n    print('resuming from', open('snapshot.pt').read())\n"
        "    sys.exit(0)\nopen('snapshot.pt', 'w').write('epoch 1')\nsys.exit(3)\n")
    job, logs, _ = await run(engine, command="python train.py", workdir=sent(engine, "ann", project), retries=1)
    assert job.state == "succeeded" and job.attempt == 2, logs
    assert "resuming from epoch 1" in logs


async def test_an_archive_that_would_leave_the_folder_fails_the_launch_naming_why(engine, project, tmp_path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("../../../escaped.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    workdir = sent(engine, "ann", project)
    # the store's copy replaced behind the service's checks: the launcher checks again as it unpacks
    engine.launcher.workdir_store.path("ann", workdir["sha256"]).write_bytes(gzip.compress(raw.getvalue()))
    job, _, jdir = await run(engine, command="python train.py", workdir=workdir)
    assert job.state == "failed" and "could not start its workers" in job.reason and "leaves the folder" in job.reason
    assert not list(tmp_path.rglob("escaped.py"))
