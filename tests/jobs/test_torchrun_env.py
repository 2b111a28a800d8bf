"""Every worker gets what ``torchrun`` would give it (trainhub.distenv).

- A table, derived from torch's source (torch/distributed/elastic/agent/server/local_elastic_agent.py
  ``_start_workers``, elastic/multiprocessing/api.py, run.py), for the local layout (one machine,
  W workers = ``torchrun --nproc_per_node W``) and the Kubernetes one (W pods = ``--nnodes W
  --nproc_per_node 1``); no torch needed.
- Live, when torch is installed: the same script, which dumps its environment and joins a gloo
  process group, run under ``torchrun --nproc_per_node 2`` and as a 2-worker job through the real job
  engine and local launcher (warm and cold start); the environments are compared name by name.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from waiting import await_for

from trainhub import distenv

DOCUMENTED_DIFFERENCES = {
    # name: why trainhub's value differs from torchrun's (docs/jobs-local.md, trainhub.distenv)
    "TORCHELASTIC_USE_AGENT_STORE": "no agent beside the workers: rank 0 hosts the store (env://)",
    "TORCHELASTIC_RUN_ID": "the job's key",
    "TORCHELASTIC_ERROR_FILE": "a file in the job's attempt folder",
    "MASTER_ADDR": "127.0.0.1 for torchrun's localhost",
    "MASTER_PORT": "a free port",
    "OMP_NUM_THREADS": "the worker's share of the cores (torchrun: 1)",
}


# -- the table -----------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [0, 1, 2])
def test_local_layout_matches_torchrun_nproc_per_node(rank):
    env = {**distenv.job_env(key="j-000009", attempt=2, retries=3),
           **distenv.worker_env(rank=str(rank), local_rank=rank, group_rank="0", world_size=3, local_world_size=3,
                                group_world_size=1, master_addr="127.0.0.1", master_port=29500, gpus_per_worker=2,
                                cores=12, error_file="/j/attempt-2/worker.error.json")}
    assert env == {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank), "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": "3", "WORLD_SIZE": "3", "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": "3",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RUN_ID": "j-000009",
        "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_ERROR_FILE": "/j/attempt-2/worker.error.json",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "4",  # 12 cores / 3 workers
        "PET_NNODES": "3", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "29500",
    }
    assert set(distenv.TORCHRUN_VARS) <= set(env) and set(distenv.PET_VARS) <= set(env)


def test_kubernetes_layout_matches_torchrun_nnodes():
    index = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    env = distenv.worker_env(rank=index, local_rank=0, group_rank=index, world_size=4, local_world_size=1,
                             group_world_size=4, master_addr="j-0.j", master_port=29500, cores=8.5)
    assert env["RANK"] == env["GROUP_RANK"] == env["ROLE_RANK"] == env["PET_NODE_RANK"] == index
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_WORLD_SIZE"], env["WORLD_SIZE"]) == ("0", "1", "4", "4")
    assert env["OMP_NUM_THREADS"] == "8"  # the pod's CPU limit, one worker per pod
    assert "OMP_NUM_THREADS" not in distenv.worker_env(rank="0", local_rank=0, group_rank="0", world_size=1,
                                                       local_world_size=1, group_world_size=1, master_addr="a",
                                                       master_port=1, cores=None)  # no limit: torch's default


def test_the_users_own_values_are_kept():
    env = distenv.worker_env(rank="0", local_rank=0, group_rank="0", world_size=2, local_world_size=2, group_world_size=1,
                             master_addr="127.0.0.1", master_port=1, cores=16,
                             user_env={"OMP_NUM_THREADS": "3", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})
    assert "OMP_NUM_THREADS" not in env and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env
    assert distenv.omp_threads(2, 4) == 1 and distenv.omp_threads(16, 4) == 4 and distenv.omp_threads(None, 2) is None


# -- live: torchrun against the real engine and local launcher ----------------------------------------
DUMP = r'''
import json, os, sys
import torch.distributed as dist
dist.init_process_group("gloo")  # env:// rendezvous with what the launcher gave
import torch
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
env = {k: v for k, v in os.environ.items() if k in json.loads(os.environ["DUMP_KEYS"])}
env["_sum"] = float(t.item())
out = os.path.join(os.environ["DUMP_DIR"], f"env-{os.environ['RANK']}.json")
with open(out, "w") as f:
    json.dump(env, f)
dist.destroy_process_group()
'''
KEYS = list(distenv.TORCHRUN_VARS) + list(distenv.PET_VARS)


def torchrun_envs(tmp_path) -> dict[int, dict]:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    out = tmp_path / "torchrun"
    out.mkdir()
    (tmp_path / "dump.py").write_text(DUMP)
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    env.update(DUMP_DIR=str(out), DUMP_KEYS=json.dumps(KEYS))
    r = subprocess.run([torchrun, "--nproc_per_node", "2", str(tmp_path / "dump.py")], env=env, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return {rank: json.loads((out / f"env-{rank}.json").read_text()) for rank in (0, 1)}


async def trainhub_envs(tmp_path, warm: bool, command: str | None = None) -> tuple[dict[int, dict], object]:
    from trainhub.ledger import LocalGPUAllocator
    from trainhub.quotas import QuotaPolicy
    from trainhub.services.jobs.engine import JobEngine
    from trainhub.services.jobs.local import LocalLauncher
    from trainhub.services.jobs.outputs import OutputSyncer
    from trainhub.states import JOB_TERMINAL
    from trainhub.storage import StorageConfig

    data = tmp_path / f"data-{'warm' if warm else 'cold'}"
    out = data / "dumps"
    out.mkdir(parents=True)
    db = f"sqlite:///{data}/platform.db"
    from trainhub.services.jobs.store import JobStore

    store = JobStore(db)
    allocator = LocalGPUAllocator(db_url=db, device_list=[])
    launcher = LocalLauncher(data_dir=str(data), warm_start=warm)
    storage = StorageConfig(url=str(data / "storage"))
    engine = JobEngine(store, allocator, launcher, QuotaPolicy(), storage, OutputSyncer(storage), tick=0.1)
    try:
        how = {"command": command} if command else {"script": DUMP}
        job = await store.write(store.create, user="ann", name="env", workers=2, gpus=0,
                                env={"DUMP_DIR": str(out), "DUMP_KEYS": json.dumps(KEYS)}, **how)
        async def step(job_id=job.id):
            await engine.run_once()
            return await store.read(store.get, job_id)

        job = await await_for(step, lambda job: job.state in JOB_TERMINAL, what="the torchrun job to end", timeout=240,
                              interval=0.1, describe=lambda job: f"still {job.state}: {job.reason}")
        logs = "".join(p.read_text() for p in (data / "jobs" / job.key).glob("attempt-1/worker-*.log"))
        assert job.state == "succeeded", (job.reason, logs[-3000:])
        return {rank: json.loads((out / f"env-{rank}.json").read_text()) for rank in (0, 1)}, job
    finally:
        await launcher.close()


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
async def test_a_two_worker_job_gets_what_torchrun_gives(tmp_path, warm):
    pytest.importorskip("torch", reason="torch is not installed: the live comparison with torchrun needs it "
                        "(pip install torch==2.13.0, the CPU build); the table tests above still check the contract")
    theirs = torchrun_envs(tmp_path)
    ours, job = await trainhub_envs(tmp_path, warm)
    for rank in (0, 1):
        t, o = theirs[rank], ours[rank]
        assert t["_sum"] == o["_sum"] == 3.0  # both joined the same 2-process gloo group (1 + 2)
        torchrun_names = set(t) - {"_sum"}
        assert torchrun_names <= set(o), f"torchrun gives {sorted(torchrun_names - set(o))}, trainhub does not"
        assert set(distenv.PET_VARS) <= set(o)
        same = {k: (t[k], o[k]) for k in torchrun_names if k not in DOCUMENTED_DIFFERENCES and t[k] != o[k]}
        assert same == {}, f"rank {rank}: values differ from torchrun's: {same}"
        assert o["TORCHELASTIC_RUN_ID"] == job.key and o["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert o["MASTER_ADDR"] == "127.0.0.1" and t["MASTER_ADDR"] in ("localhost", "127.0.0.1")
        assert o["MASTER_PORT"].isdigit() and o["TORCHELASTIC_ERROR_FILE"].endswith(f"attempt-1/worker-{rank}.error.json")
        cores = distenv.available_cores()
        assert o["OMP_NUM_THREADS"] == str(max(1, cores // 2))
        if cores // 2 <= 1:
            assert o["OMP_NUM_THREADS"] == t["OMP_NUM_THREADS"] == "1"


async def test_a_plain_torchrun_inside_a_job_joins_the_workers_into_one_group(tmp_path):
    """A job whose command is a plain `torchrun train.py` (no options): torchrun reads PET_NNODES, PET_NODE_RANK,
    PET_NPROC_PER_NODE and the master address from the environment, so the 2 workers become 2 nodes of one
    2-process group (world size 2, both ranks see the same all-reduce), never 2 independent single-node runs.
    (`--nproc-per-node=gpu` counts the worker's visible GPUs, which is PET_NPROC_PER_NODE; it needs CUDA.)"""
    pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0, the CPU build)")
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    (tmp_path / "dump.py").write_text(DUMP)
    ours, _ = await trainhub_envs(tmp_path, warm=False, command=f"{torchrun} {tmp_path / 'dump.py'}")
    for rank in (0, 1):
        env = ours[rank]
        assert env["_sum"] == 3.0, env  # one group of 2: 1 + 2
        assert (env["WORLD_SIZE"], env["RANK"], env["GROUP_RANK"], env["LOCAL_RANK"]) == ("2", str(rank), str(rank), "0")
        assert env["GROUP_WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "1"
