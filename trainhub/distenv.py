"""What every worker of a job gets that ``torchrun`` would give it, for the local and Kubernetes launchers.

``torchrun`` (``torch.distributed.run``; its ``LocalElasticAgent._start_workers`` and
``start_processes``) gives each worker process, for torch 2.13::

    RANK LOCAL_RANK GROUP_RANK ROLE_RANK ROLE_NAME LOCAL_WORLD_SIZE WORLD_SIZE GROUP_WORLD_SIZE
    ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS
    TORCHELASTIC_RUN_ID TORCHELASTIC_USE_AGENT_STORE TORCHELASTIC_ERROR_FILE
    TORCHELASTIC_SIGNALS_TO_HANDLE TORCH_NCCL_ASYNC_ERROR_HANDLING (1 unless set)
    OMP_NUM_THREADS (1 when nproc_per_node > 1, unless set)

A trainhub job's layout maps onto torchrun's: on one machine, W workers are
``torchrun --nproc_per_node W`` (one node: one group, local ranks 0..W-1); on Kubernetes, W pods of one worker
are ``torchrun --nnodes W --nproc_per_node 1 --node_rank i`` (W nodes, a group of one each). The values differ
from torchrun's on purpose in three places:

- ``TORCHELASTIC_USE_AGENT_STORE=False``: no agent runs beside the workers, so rank 0 hosts the
  rendezvous store, as with ``init_process_group("env://")`` outside torchrun ("True" would make
  every rank wait for an agent's store that does not exist);
- ``TORCHELASTIC_RUN_ID`` is the job's key and ``TORCHELASTIC_RESTART_COUNT`` the attempt minus one,
  ``TORCHELASTIC_MAX_RESTARTS`` the job's retries;
- ``OMP_NUM_THREADS`` is the worker's share of the cores (``cores // local workers``, at least 1)
  where torchrun puts 1: the same on a machine with as many cores as workers, more threads on a
  bigger one. A value the job's spec sets (``--env OMP_NUM_THREADS=N``) is kept, as torchrun keeps
  the one it inherits.

Also the ``PET_*`` variables (``torchrun``'s own options from the environment, as Kubeflow's
PyTorchJob sets them), the same layout said as torchrun's options: ``PET_NNODES`` (the nodes: 1 on one
machine, the workers on Kubernetes), ``PET_NODE_RANK`` (the worker's node: 0 on one machine, its rank
on Kubernetes), ``PET_NPROC_PER_NODE`` (the processes of a node: the workers on one machine; where a node
holds one worker, its GPUs, at least 1), ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``. So
``torchrun train.py`` as the command of a one-worker job starts one process per GPU of the worker, and on
Kubernetes each pod is a node of the job's group. On one machine the workers of a W-worker job already
are torchrun's W processes (trainhub plays its agent): a torchrun inside each would be a second agent of
the same node, so the local launcher refuses such a job (:func:`runs_torchrun`; docs/jobs-local.md,
"torchrun").
"""

from __future__ import annotations

import os
import re

# the variables torchrun's agent sets for each worker (torch/distributed/elastic/agent/server/local_elastic_agent.py,
# torch/distributed/elastic/multiprocessing/api.py and run.py)
TORCHRUN_VARS = (
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS",
)
PET_VARS = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torchrun's --signals-to-handle default


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def omp_threads(cores: float | None, local_workers: int) -> int | None:
    """A worker's share of ``cores`` among ``local_workers`` workers on the same machine (at least 1);
    None when the cores are not known (then OMP_NUM_THREADS is left to the runtime's default)."""
    if not cores:
        return None
    return max(1, int(cores // max(1, local_workers)))


def job_env(*, key: str, attempt: int, retries: int) -> dict[str, str]:
    """The torchrun variables that are the same for every worker of an attempt."""
    return {
        "ROLE_NAME": "default",
        "TORCHELASTIC_RUN_ID": key,
        "TORCHELASTIC_RESTART_COUNT": str(max(0, attempt - 1)),
        "TORCHELASTIC_MAX_RESTARTS": str(max(0, retries)),
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": SIGNALS_TO_HANDLE,
    }


def worker_env(*, rank, local_rank, group_rank, world_size: int, local_world_size: int, group_world_size: int,
               master_addr: str, master_port: int, gpus_per_worker: int = 0, cores: float | None = None,
               error_file: str | None = None, user_env=None) -> dict:
    """One worker's torchrun variables (plus ``PET_*`` and ``OMP_NUM_THREADS``).

    ``rank``/``group_rank`` may be any value the launcher's environment format takes (the Kubernetes
    launcher passes a ``fieldRef`` to the pod's completion index). ``cores``: the cores the worker's
    machine (or pod limit) has for this job, shared by its ``local_world_size`` workers. What
    ``user_env`` (the job spec's ``env``) sets for ``OMP_NUM_THREADS`` and
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` is kept: those two are left out here.
    """
    user_env = user_env or {}
    env = {
        "RANK": rank, "LOCAL_RANK": str(local_rank), "GROUP_RANK": group_rank, "ROLE_RANK": rank,
        "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_WORLD_SIZE": str(group_world_size), "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
        "PET_NNODES": str(group_world_size), "PET_NODE_RANK": group_rank,
        "PET_NPROC_PER_NODE": str(local_world_size if local_world_size > 1 else max(1, gpus_per_worker)),
        "PET_MASTER_ADDR": master_addr, "PET_MASTER_PORT": str(master_port),
    }
    if error_file:
        env["TORCHELASTIC_ERROR_FILE"] = error_file
    if "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in user_env:
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    threads = omp_threads(cores, local_world_size)
    if threads is not None and "OMP_NUM_THREADS" not in user_env:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")"}
_WRAPPERS = {"env", "exec", "time", "nice", "nohup", "command", "stdbuf", "setsid"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def runs_torchrun(command: str | None) -> bool:
    """Does the shell ``command`` start torchrun (``torchrun ...``, ``python -m torch.distributed.run`` or
    ``.launch``), as one of its simple commands? What a command line says only: a script that runs torchrun
    itself is not seen."""
    import shlex

    if not command or "torch" not in command:
        return False
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return False
    segment: list[str] = []
    for token in tokens + [";"]:
        if token in _OPERATORS or set(token) <= set("&|;()"):
            if _segment_runs_torchrun(segment):
                return True
            segment = []
        else:
            segment.append(token)
    return False


def _segment_runs_torchrun(words: list[str]) -> bool:
    i = 0
    while i < len(words):  # NAME=value assignments, env/exec/nice... with their options
        word = words[i]
        if _ASSIGNMENT.match(word) or os.path.basename(word) in _WRAPPERS or (i > 0 and (word[:1] == "-" or word.isdigit())):
            i += 1
            continue
        break
    if i >= len(words):
        return False
    program = os.path.basename(words[i])
    if program == "torchrun":
        return True
    if program.startswith("python"):
        rest = words[i + 1:]
        for j, word in enumerate(rest):
            if word == "-m" and j + 1 < len(rest):
                return rest[j + 1] in TORCHRUN_MODULES
            if word.startswith("-m") and len(word) > 2:
                return word[2:] in TORCHRUN_MODULES
            if not word.startswith("-"):
                return False  # a script: python train.py
    return False
