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
        # the same layout as torchrun's options: one node of 3 processes (never 3 nodes of one on one machine)
        "PET_NNODES": "1", "PET_NPROC_PER_NODE": "3", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "29500",
    }
    assert set(distenv.TORCHRUN_VARS) <= set(env) and set(distenv.PET_VARS) <= set(env)


def test_a_one_worker_jobs_torchrun_starts_a_process_per_gpu():
    env = distenv.worker_env(rank="0", local_rank=0, group_rank="0", world_size=1, local_world_size=1, group_world_size=1,
                             master_addr="127.0.0.1", master_port=1, gpus_per_worker=4)
    assert (env["PET_NNODES"], env["PET_NODE_RANK"], env["PET_NPROC_PER_NODE"]) == ("1", "0", "4")


def test_kubernetes_layout_matches_torchrun_nnodes():
    index = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    env = distenv.worker_env(rank=index, local_rank=0, group_rank=index, world_size=4, local_world_size=1,
                             group_world_size=4, master_addr="j-0.j", master_port=29500, cores=8.5)
    assert env["RANK"] == env["GROUP_RANK"] == env["ROLE_RANK"] == env["PET_NODE_RANK"] == index
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_WORLD_SIZE"], env["WORLD_SIZE"]) == ("0", "1", "4", "4")
    assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("4", "1")  # 4 nodes (pods) of one process
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


async def trainhub_envs(tmp_path, warm: bool, command: str | None = None, workers: int = 2) -> tuple[dict[int, dict], object]:
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
        job = await store.write(store.create, user="ann", name="env", workers=workers, gpus=0,
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


async def test_torchrun_with_n_processes_as_a_one_worker_jobs_command_runs_as_on_the_machine(tmp_path):
    """An unmodified ``torchrun --nproc_per_node 2 dump.py`` as the command of a one-worker job: torchrun itself is the
    agent, so its 2 processes get what they get under torchrun on the machine (one node: local ranks 0 and 1, group
    rank 0), OMP_NUM_THREADS included (trainhub leaves it to torchrun)."""
    pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0, the CPU build)")
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    theirs = torchrun_envs(tmp_path)
    ours, _ = await trainhub_envs(tmp_path, warm=False, workers=1,
                                  command=f"{torchrun} --nproc_per_node 2 {tmp_path / 'dump.py'}")
    for rank in (0, 1):
        t, o = theirs[rank], ours[rank]
        assert o["_sum"] == 3.0, o  # one group of 2: 1 + 2
        assert (o["WORLD_SIZE"], o["RANK"], o["LOCAL_RANK"], o["GROUP_RANK"], o["LOCAL_WORLD_SIZE"]) == \
            ("2", str(rank), str(rank), "0", "2")
        differ = {k: (t.get(k), o.get(k)) for k in set(t) | set(o)
                  if k not in ("_sum", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE") and t.get(k) != o.get(k)}
        # what differs follows from the options the job's PET_* give torchrun (a master address, hence torchrun's
        # run id "none" for a random one) and the PET_* themselves; the rest is torchrun's doing, as on the machine
        assert set(differ) <= {"MASTER_ADDR", "TORCHELASTIC_RUN_ID", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES",
                               "PET_NODE_RANK", "PET_NPROC_PER_NODE"}, differ
        assert o["OMP_NUM_THREADS"] == t["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("command, refused", [
    ("torchrun --nproc_per_node=2 train.py", True),
    ("cd code && OMP_NUM_THREADS=2 torchrun train.py", True),
    ("python -m torch.distributed.run --nproc-per-node 2 train.py", True),
    ("python train.py", False),
    ("bash run.sh", False),  # what a script does is not seen
])
def test_a_local_job_of_several_workers_that_runs_torchrun_is_refused_with_the_ways_that_work(command, refused):
    from trainhub.exceptions import InvalidRequest
    from trainhub.services.jobs.launcher import Launcher
    from trainhub.services.jobs.local import LocalLauncher
    from trainhub.services.jobs.spec import validate_spec

    assert distenv.runs_torchrun(command) is refused
    launcher = LocalLauncher(data_dir="/nonexistent")
    launcher.check(validate_spec({"command": command, "workers": 1}))  # one worker: torchrun is its agent
    if refused:
        with pytest.raises(InvalidRequest) as e:
            launcher.check(validate_spec({"command": command, "workers": 2}))
        assert "--workers 1 -- torchrun --nproc_per_node=2" in e.value.message and "LOCAL_RANK 0..1" in e.value.message
    else:
        launcher.check(validate_spec({"command": command, "workers": 2}))
    Launcher.check(launcher, validate_spec({"command": command, "workers": 2}))  # Kubernetes: W pods are W nodes
