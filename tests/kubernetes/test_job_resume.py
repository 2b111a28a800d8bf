"""Checkpoint and resume on Kubernetes: the same contract as on one machine. The real job engine drives
the Kubernetes launcher against the API stand-in; storage is a local folder the "pods" (this test)
write checkpoints to, as a pod would through fsspec. A failed attempt is retried as a new Indexed Job
whose pods get the latest checkpoint offered (``TRAINHUB_RESUME_URL``/``_STEP``), the job's storage
area, its attempt and torchrun's restart count; the job's events say "resumed from step S"."""

from __future__ import annotations

import pytest
import pytest_asyncio
from test_job_launcher import JOBS, NS, job_kubeconfig, kube, make_launcher, running_pods, until  # noqa: F401

from k8s_test_config import REAL_KUBECONFIG
from trainhub import jobarea
from trainhub.services.jobs import k8s_job_manifests as jm

pytestmark = pytest.mark.skipif(bool(REAL_KUBECONFIG), reason="drives pod phases through the stand-in")


@pytest_asyncio.fixture
async def engine(make_launcher, tmp_path):
    from trainhub.ledger import LocalGPUAllocator
    from trainhub.quotas import QuotaPolicy
    from trainhub.services.jobs.engine import JobEngine
    from trainhub.services.jobs.outputs import OutputSyncer
    from trainhub.services.jobs.store import JobStore
    from trainhub.storage import StorageConfig

    db = f"sqlite:///{tmp_path}/platform.db"
    devices = [{"index": i, "name": "A100", "uuid": f"GPU-{i}", "memory_total_mb": 40960, "simulated": True} for i in range(4)]
    launcher = make_launcher()
    storage = StorageConfig(url=str(tmp_path / "storage"))
    return JobEngine(JobStore(db), LocalGPUAllocator(db_url=db, device_list=devices), launcher, QuotaPolicy(), storage,
                     OutputSyncer(storage), catalog=launcher.catalog, grace_period=2)


async def run_until(engine, job_id, check, what):
    async def step():
        await engine.run_once()
        job = await engine.store.read(engine.store.get, job_id)
        return job if check(job) else None
    return await until(step, timeout=15, what=what)


def pod_env(kube, name) -> dict:
    (container,) = kube.get(JOBS, NS, name)["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


async def test_a_retried_job_is_offered_its_latest_checkpoint(kube, engine, tmp_path):
    job = await engine.store.write(engine.store.create, user="alice", name="train", command="python train.py",
                                   workers=2, gpus=1, profile="gpu-1", retries=1)
    first = await run_until(engine, job.id, lambda j: j.state == "running", "attempt 1 running")
    name1 = first.launch_state["name"]
    env1 = pod_env(kube, name1)
    area_url = str(tmp_path / "storage" / "users" / "alice" / "jobs" / job.key)
    assert env1["TRAINHUB_JOB_URL"] == area_url == first.outputs_url  # the area the API shows as outputs_url
    assert (env1["TRAINHUB_JOB_ATTEMPT"], env1["TORCHELASTIC_RESTART_COUNT"], env1["TORCHELASTIC_MAX_RESTARTS"]) == ("1", "0", "1")
    assert "TRAINHUB_RESUME_URL" not in env1
    assert env1["ROLE_RANK"] == env1["RANK"] and env1["LOCAL_WORLD_SIZE"] == "1" and env1["OMP_NUM_THREADS"] == "4"
    # rank 0 "saves" two checkpoints into the job's storage area, then a pod fails
    area = jobarea.Area(area_url, {})
    for step in (40, 80):
        area.write_bytes(f"checkpoints/{jobarea.checkpoint_name(step, 'bytes')}", b"state")
    pods = await running_pods(kube, name1, 2)
    await kube.finish_pod(NS, pods[1]["metadata"]["name"], 1)
    second = await run_until(engine, job.id, lambda j: j.state == "running" and j.attempt == 2, "attempt 2 running")
    name2 = second.launch_state["name"]
    assert name2 == jm.job_name(job.key, 2) != name1
    env2 = pod_env(kube, name2)
    assert env2["TRAINHUB_RESUME_URL"] == f"{area_url}/checkpoints/step-000000000080.bin"
    assert env2["TRAINHUB_RESUME_STEP"] == "80" and env2["TRAINHUB_JOB_URL"] == area_url
    assert (env2["TRAINHUB_JOB_ATTEMPT"], env2["TORCHELASTIC_RESTART_COUNT"]) == ("2", "1")
    assert second.reason.endswith("; resumed from step 80")
    events = await engine.store.read(engine.store.events, job.id)
    resumed = [e["message"] for e in events if e["kind"] == "resumed"]
    assert resumed == ["resumed from step 80: attempt 2 is offered checkpoint step-000000000080.bin"]
    for pod in (await running_pods(kube, name2, 2)).values():
        await kube.finish_pod(NS, pod["metadata"]["name"], 0)
    done = await run_until(engine, job.id, lambda j: j.state == "succeeded", "success")
    assert done.attempt == 2
