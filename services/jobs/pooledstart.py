"""Isolated workers started from the warm pool: the local launcher's side of warmpool.py.

The launcher (local.py) decides how each worker starts; this module owns the pool of pre-started wrapper + sandbox
pairs it starts isolated `script` workers from: making it (as the jobs service starts, or at first use), claiming one
entry per worker with the job's mounts, account, devices, environment and script, and refilling it after a launch.
Its settings are the launcher's (``isolated_warm_pool_size``, ``isolated_warm_claim_timeout``,
``isolated_refill_delay``), read at each use.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

from trainhub.boundary.accounts import Account
from trainhub.boundary.warmsandbox import current_umask, sandbox_mounts

from .launcher import JobView
from .warmpool import WarmUnavailable, WorkerPool, launch_env, refusal


class PooledStarts:
    """The pool of isolated workers of one :class:`~.local.LocalLauncher` (``launcher``: its settings, isolation,
    jobs folder and log); each entry is ``worker_script`` (the wrapper) around ``inside_script`` in a sandbox."""

    def __init__(self, launcher, worker_script: str, inside_script: str):
        self.launcher = launcher
        self.worker_script, self.inside_script = worker_script, inside_script
        self.pool: WorkerPool | None = None
        self._lock = threading.Lock()
        self._said_cold = False

    def get(self) -> WorkerPool | None:
        """The pool (made and filled on first use), or None where isolated workers start cold."""
        launcher = self.launcher
        if launcher.isolated_warm_pool_size <= 0:
            return None
        if launcher.isolation.use_sandbox and os.geteuid() != 0:
            if not self._said_cold:
                self._said_cold = True
                launcher.log.info("isolated workers start cold: an unprivileged sandbox cannot take on mounts made "
                                  "outside it")
            return None
        # the lock only to make it (the first fill holds it, and a launch on the loop must not wait for it after)
        if self.pool is None:
            with self._lock:
                if self.pool is None:
                    self.pool = self._filled()  # once filled: until then a launch on a thread waits here
        self.pool.size = launcher.isolated_warm_pool_size
        return self.pool

    def _filled(self) -> WorkerPool:
        isolation = self.launcher.isolation
        sandboxed = isolation.use_sandbox
        python, wrapper, inside_script = sys.executable, self.worker_script, self.inside_script

        def argv_for(claim_fd: int, ctl_fd: int) -> list[str]:
            inside = isolation.command([python, "-u", inside_script, str(claim_fd)], account=None, cwd="/")
            return [python, "-S", "-P", wrapper, "--warm", str(ctl_fd),
                    *(["--sandboxed"] if sandboxed else []), "--", *inside]

        jobs_dir = Path(self.launcher.jobs_dir)
        jobs_dir.mkdir(parents=True, exist_ok=True)
        pool = WorkerPool(argv_for, launch_env(), self.launcher.isolated_warm_pool_size, self.launcher.log,
                          str(jobs_dir / ".warmpool.log"))
        pool.fill()
        return pool

    def ready(self) -> bool:
        """Is an entry ready to be claimed now (nothing to wait for)?"""
        pool = self.pool
        return pool is not None and pool.size > 0 and pool.has_ready()

    def claim(self, job: JobView, rank: int, cmd: list[str], wenv: dict, cwd: str,
              account: Account | None, rw: list[str], ro: list[str], devices: list[int], adir: Path,
              log: str, exit_file: str, handed: list | None = None,
              netns: str | None = None) -> tuple[subprocess.Popen, str] | None:
        """Start worker ``rank`` from the pool: (its wrapper, the wrapper's marker), or None (after logging why) when
        it must start cold. With ``handed`` (a start on the event loop), only a ready entry, and the claim only handed
        over: the entry is appended to ``handed`` and the caller awaits its answer (:meth:`answer`)."""
        launcher, pool = self.launcher, self.pool
        why = refusal(wenv, pool.env)
        if why:
            if handed is None:  # (on the loop: said by the thread's start)
                launcher.log.info("job %s: worker %d starts cold: %s", job.key, rank, why)
            return None
        sandboxed = launcher.isolation.use_sandbox
        # what the cold sandbox of this worker would bind beyond the warm one's (Isolation.sandbox_argv's rw/ro/devices)
        mounts = sandbox_mounts(rw + [str(adir / f"metrics-{rank}.jsonl")], ro,
                                launcher.isolation.device_nodes(devices)) if sandboxed else []
        spec = {"script": cmd[-1], "args": [], "env": wenv, "cwd": os.path.realpath(cwd) if sandboxed else cwd,
                "umask": current_umask(), "uid": account.uid if account else None,
                "gid": account.gid if account else None}
        worker_files = {"rank": rank, "log": log, "exit_file": exit_file}
        timeout = launcher.isolated_warm_claim_timeout
        # from here on the pool discards the entry on any failure
        entry = pool.take_ready() if handed is not None else pool.take(timeout)
        if entry is None:
            if handed is None:
                launcher.log.info("job %s: worker %d starts cold: no warm worker waiting", job.key, rank)
            return None
        try:
            if handed is not None:
                pool.hand_over(entry, spec, mounts, worker_files, timeout, netns)
                handed.append(entry)
                return entry.proc, entry.token
            pid = pool.claim(entry, spec, mounts, worker_files, timeout, netns)
        except WarmUnavailable as e:
            self.failed(job, rank, e, cold=handed is None)  # (on the loop: the thread's start tries again)
            return None
        self.started(job, rank, pid)
        return entry.proc, entry.token

    async def answer(self, job: JobView, entry) -> bool:
        """Await the answer to a claim handed over on the loop: True once the worker took the job on, False (logged)
        when it refused or failed (the entry is discarded; nothing of the job started)."""
        try:
            await self.pool.answer_async(entry, self.launcher.isolated_warm_claim_timeout)
        except WarmUnavailable as e:
            self.failed(job, 0, e)
            return False
        self.started(job, 0, entry.pid)
        return True

    def failed(self, job: JobView, rank: int, error: WarmUnavailable, cold: bool = True) -> None:
        self.launcher.log.warning("job %s: worker %d%s: the warm worker failed its claim (%s)", job.key, rank,
                                  " starts cold" if cold else "", error)

    def started(self, job: JobView, rank: int, pid: int) -> None:
        self.launcher.log.info("job %s: worker %d started warm (pooled worker %d, claim %d)", job.key, rank, pid,
                               self.pool.claims)

    def refill_later(self) -> None:
        """After a launch (on the loop): start the entries it took again, ``isolated_refill_delay`` later and on a
        thread of their own, so their start-up does not slow the job just started."""
        if self.pool is not None:
            asyncio.get_running_loop().call_later(self.launcher.isolated_refill_delay, self._refill_in_thread)

    def _refill_in_thread(self) -> None:
        threading.Thread(target=self._refill, name="trainhub-warm-pool-refill", daemon=True).start()

    def _refill(self) -> None:
        if self.pool is not None:
            self.pool.fill()

    def close(self) -> None:
        """Let the waiting entries go (claimed workers keep running)."""
        if self.pool is not None:
            self.pool.close()
