"""The local launcher: each worker is a process group on this machine.

Layout of a job's folder (``<jobs_dir>/<job key>/``)::

    script.py                    the job's source, for `script` jobs
    attempt-<n>/worker-<r>.log   timestamped output of worker r
    attempt-<n>/worker-<r>.exit  its exit status, written when it ends
    attempt-<n>/metrics-<r>.jsonl
    attempt-<n>/worker-<r>.error.json  $TORCHELASTIC_ERROR_FILE (torch's @record writes a failure there)
    outputs/                     $TRAINHUB_OUTPUTS_DIR, synced to storage

and ``<jobs_dir>/.forkserver.sock`` / ``.forkserver.log``: the warm fork server of `script` jobs
(see forkserver.py; ``warm_start``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from traitlets import Bool, Float, Unicode, default

from trainhub.backoff import WaitTimeout, apoll
from trainhub.distenv import available_cores, worker_env
from trainhub.ledger import pid_alive, process_start_time
from trainhub.procs import HOLDER_VAR, processes_with
from trainhub.settings import DataDir

from . import worker
from .forkserver import SOCKET_NAME, ForkServer, ForkServerError, server_environment
from .launcher import JobView, Launcher, WorkerStatus

WORKER_SCRIPT = os.path.abspath(worker.__file__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def attempt_dir(job_dir: Path, attempt: int) -> Path:
    return job_dir / f"attempt-{attempt}"


class LocalLauncher(Launcher):
    home_dir_template = Unicode(
        help="""Working directory and $HOME of a user's jobs ({username} expanded): the same home as their notebook
        server, so relative paths work. Default: <data_dir>/homes/{username}; "" (no data dir) = the job's folder.""",
    ).tag(config=True)

    @default("home_dir_template")
    def _home_dir_template_default(self):
        return str(DataDir(Path(self.data_dir)).homes / "{username}") if self.data_dir else ""

    warm_start = Bool(True, help="""Start the workers of `script` jobs (Python source) by forking a warm fork server: a
        long-lived interpreter that has already started Python and imported `site`, started on the first such job and
        restarted if it dies. Saves one interpreter start per worker (tens of ms before the first output line). Each
        worker is the fork of a fresh interpreter, never of one that imported torch or CUDA. `command` jobs, jobs whose
        environment changes Python's start-up (PYTHONHASHSEED, PYTHONOPTIMIZE, another locale...) and any fork server
        failure (a warning is logged) take the cold path: `python -u script.py` under the worker.py wrapper.
        False: always cold.""").tag(config=True)
    warm_start_timeout = Float(10.0, help="""Seconds to wait for the fork server to start or answer before starting a
        worker cold. After a failed start the server is not tried again for 60 s.""").tag(config=True)

    def __init__(self, **kw):
        super().__init__(**kw)
        self._forkserver: ForkServer | None = None
        self._forkserver_lock = threading.Lock()
        self._warm_retry_at = 0.0

    def home_dir(self, user: str) -> str:
        return self.home_dir_template.format(username=user) if self.home_dir_template else ""

    def _cwd(self, job: JobView) -> str:
        home = self.home_dir(job.user)
        if home:
            Path(home).mkdir(parents=True, exist_ok=True)
            return home
        return self.job_dir(job)

    async def launch(self, job, devices, env):
        return await asyncio.to_thread(self._launch, job, devices, env)

    def _launch(self, job: JobView, devices: list[list[int]], env: dict) -> dict:
        jdir = Path(self.job_dir(job))
        adir = attempt_dir(jdir, job.attempt)
        adir.mkdir(parents=True, exist_ok=True)
        (jdir / "outputs").mkdir(exist_ok=True)
        if job.script is not None:
            (jdir / "script.py").write_text(job.script)
            cmd = [sys.executable, "-u", str(jdir / "script.py")]
        else:
            cmd = ["/bin/bash", "-c", job.command]
        tag = uuid.uuid4().hex
        port = free_port()
        workers = []
        procs = []
        pgids = []
        warm = job.script is not None and self.warm_start
        cores = available_cores()
        try:
            for rank in range(job.workers):
                visible = ",".join(str(d) for d in devices[rank]) if devices else ""
                wenv = dict(env)
                wenv.update(job.env)
                # what torchrun --nproc_per_node W would give it (trainhub.distenv), OMP_NUM_THREADS its share of the cores
                wenv.update(worker_env(rank=str(rank), local_rank=rank, group_rank="0", world_size=job.workers,
                                       local_world_size=job.workers, group_world_size=1, master_addr="127.0.0.1",
                                       master_port=port, gpus_per_worker=len(devices[rank]) if devices else 0,
                                       cores=cores, error_file=str(adir / f"worker-{rank}.error.json"), user_env=job.env))
                wenv.update({
                    "CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible or "void",
                    "TRAINHUB_METRICS_FILE": str(adir / f"metrics-{rank}.jsonl"),
                    "TRAINHUB_OUTPUTS_DIR": str(jdir / "outputs"),
                    "TRAINHUB_JOB_DIR": str(jdir),
                    "PYTHONUNBUFFERED": "1",
                    HOLDER_VAR: tag,
                })
                log, exit_file = adir / f"worker-{rank}.log", adir / f"worker-{rank}.exit"
                err = adir / f"worker-{rank}.wrapper.err"
                if warm:
                    pid = self._spawn_warm({"script": cmd[-1], "args": [], "env": wenv, "cwd": self._cwd(job), "log": str(log),
                                            "exit_file": str(exit_file), "rank": rank, "wrapper_err": str(err)}, job)
                    if pid is not None:
                        pgids.append(pid)
                        workers.append({"rank": rank, "pid": pid, "started": process_start_time(pid), "log": str(log),
                                        "exit_file": str(exit_file), "start": "warm"})
                        continue
                    warm = False  # the rest of the gang cold too
                # the wrapper by path without site (-S) or its folder on sys.path (-P): it needs only the standard
                # library, and its start-up is on the way to the job's first output line
                wrapper = [sys.executable, "-S", "-P", WORKER_SCRIPT, "--rank", str(rank),
                           "--log", str(log), "--exit-file", str(exit_file), "--cwd", self._cwd(job), "--", *cmd]
                proc = subprocess.Popen(wrapper, env=wenv, start_new_session=True, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=open(err, "ab"))
                procs.append(proc)
                pgids.append(proc.pid)
                workers.append({"rank": rank, "pid": proc.pid, "started": process_start_time(proc.pid),
                                "log": str(log), "exit_file": str(exit_file), "start": "cold"})
        except BaseException:
            for pgid in pgids:  # gang: all or none
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise
        self._children = getattr(self, "_children", {})
        for proc in procs:
            self._children[proc.pid] = proc
        return {"tag": tag, "master_port": port, "attempt": job.attempt, "workers": workers, "dir": str(adir)}

    # -- the warm fork server ----------------------------------------------------------------
    def _spawn_warm(self, request: dict, job: JobView) -> int | None:
        """Fork one worker from the fork server; None (after logging why) when it must start cold."""
        if time.monotonic() < self._warm_retry_at:
            return None
        with self._forkserver_lock:
            if self._forkserver is None:
                jobs_dir = Path(self.jobs_dir)
                jobs_dir.mkdir(parents=True, exist_ok=True)
                self._forkserver = ForkServer(str(jobs_dir / SOCKET_NAME), str(jobs_dir / ".forkserver.log"),
                                              server_environment(os.environ), timeout=self.warm_start_timeout)
            server = self._forkserver
        try:
            return server.spawn(request)
        except ForkServerError as e:
            if e.cold:
                self.log.info("job %s: starting cold: %s", job.key, e)
            else:
                self._warm_retry_at = time.monotonic() + 60.0
                self.log.warning("job %s: warm start failed (%s); starting cold", job.key, e)
            return None
        except Exception as e:
            self.log.warning("job %s: warm start failed (%r); starting cold", job.key, e)
            return None

    async def close(self) -> None:
        """Stop the fork server (running workers are not its to stop: they keep running)."""
        if self._forkserver is not None:
            await asyncio.to_thread(self._forkserver.stop)

    async def poll(self, job, state):
        return await asyncio.to_thread(self._poll, state)

    def _poll(self, state: dict) -> list[WorkerStatus]:
        out = []
        for w in state.get("workers", []):
            child = getattr(self, "_children", {}).get(w["pid"])
            if child is not None and child.poll() is not None:
                self._children.pop(w["pid"], None)
            exit_file = Path(w["exit_file"])
            if exit_file.exists():
                try:
                    code = int(exit_file.read_text().strip() or "1")
                except ValueError:
                    code = 1
                out.append(WorkerStatus(w["rank"], running=False, exit_code=code))
            elif child is not None and child.returncode is None:
                out.append(WorkerStatus(w["rank"], running=True))
            elif child is None and pid_alive(w["pid"], w.get("started")) and not _zombie(w["pid"]):
                out.append(WorkerStatus(w["rank"], running=True))
            else:
                # the wrapper died without writing a status (SIGKILL of the group, machine crash)
                if exit_file.exists():
                    continue
                out.append(WorkerStatus(w["rank"], running=False, exit_code=-9, lost=True))
        return out

    async def terminate(self, job, state, grace):
        pgids = [w["pid"] for w in state.get("workers", [])]
        await asyncio.to_thread(_signal_groups, pgids, signal.SIGTERM)
        try:
            await apoll(lambda: self.poll(job, state), lambda statuses: all(not s.running for s in statuses),
                        what=f"the workers of {job.key} to exit", start=0.1, factor=1.0, timeout=grace)
        except WaitTimeout:
            pass  # the grace period is over: SIGKILL
        await asyncio.to_thread(_signal_groups, pgids, signal.SIGKILL)
        # anything that left the process group (daemonised children) but carries the job's marker
        tag = state.get("tag")
        if tag:
            for pid in await asyncio.to_thread(processes_with, HOLDER_VAR, tag):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    async def adopt(self, job, state):
        statuses = await self.poll(job, state)
        return bool(statuses) and not all(s.lost for s in statuses)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _signal_groups(pgids: list[int], sig: int) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
