"""The local launcher: each worker is a process group on this machine.

Layout of a job's folder (``<jobs_dir>/<job key>/``)::

    script.py                    the job's source, for `script` jobs
    attempt-<n>/worker-<r>.log   timestamped output of worker r
    attempt-<n>/worker-<r>.exit  its exit status, written when it ends
    attempt-<n>/metrics-<r>.jsonl
    attempt-<n>/worker-<r>.error.json  $TORCHELASTIC_ERROR_FILE (torch's @record writes a failure there)
    outputs/                     $TRAINHUB_OUTPUTS_DIR, synced to storage
    work/                        $TRAINHUB_JOB_DIR of an isolated job (the user's; attempt-<n>-worker-<r>.error.json
                                 there); without isolation $TRAINHUB_JOB_DIR is the job folder itself
    work/workdir/ (or workdir/)  the working directory the job was sent with, unpacked as the user: its cwd
    workdir.unpacked             the platform's mark that the copy is whole (a retry runs in it again)

and ``<jobs_dir>/.forkserver.sock`` / ``.forkserver.log``: the warm fork server of `script` jobs
(see forkserver.py; ``warm_start``).

Isolation (``Launcher.isolation``, set by the jobs service): each worker runs as its user's Unix
account (run as root) and/or in a bubblewrap sandbox that sees the user's home, storage area and
``datasets/``, the job's ``script.py`` (read-only), ``outputs/`` and its own metrics file, and only
the device nodes of its GPUs. The wrapper stays outside as the platform: it writes the log and the
exit file, which the job cannot touch. ``outputs/`` and the metrics files are the user's, the rest
of the job's folder the platform's (0700: without a sandbox 0711, so the account reaches its files).
Isolated `script` workers start warm from their own pool (pooledstart.py over warmpool.py,
``isolated_warm_pool_size``): pre-started wrapper + sandbox pairs, each claimed once and given the job's mounts,
account and environment; ``.warmpool.log`` holds their wrappers' own errors. A fork of the one shared fork server
cannot take a job's account, mount namespace and device set, so isolated workers never use it.
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

from traitlets import Bool, Float, Instance, Integer, TraitError, Unicode, default, validate

from trainhub.boundary import envexec, procs
from trainhub.boundary.accounts import Account, own_dir
from trainhub.boundary.asuser import AsUser
from trainhub.boundary.credentials import storage_credentials_broker
from trainhub.boundary.network import GATE_SOCKET_VAR, UserNetworks
from trainhub.backoff import WaitTimeout, apoll
from trainhub.distenv import available_cores, runs_torchrun, worker_env
from trainhub.exceptions import InvalidRequest
from trainhub.ledger import pid_alive, process_start_time
from trainhub.boundary.procs import HOLDER_VAR, processes_with
from trainhub.settings import DataDir
from trainhub.storage import StorageConfig
from trainhub.workdir import Below, unpack

from . import outputs, warminside, worker
from .forkserver import SOCKET_NAME, ForkServer, ForkServerError, server_environment
from .launcher import JobView, Launcher, WorkerStatus
from .pooledstart import PooledStarts

WORKER_SCRIPT = os.path.abspath(worker.__file__)
WARM_INSIDE_SCRIPT = os.path.abspath(warminside.__file__)
WORK_DIR = "work"  # $TRAINHUB_JOB_DIR of an isolated job: the part of its folder that is the user's
WORKDIR = outputs.WORKDIR  # the working directory a job was sent with, unpacked (in work/ when isolated)


class _NotOnLoop(Exception):
    """This start cannot run on the event loop (LocalLauncher._launch_on_loop): nothing of it started."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def attempt_dir(job_dir: Path, attempt: int) -> Path:
    return job_dir / f"attempt-{attempt}"


class LocalLauncher(Launcher):
    gate_socket = Unicode(
        help="""Unix socket of the network gate (trainhub.boundary.network, run by `trainhub up` as root): the workers of
        an isolated job run in their user's own network namespace. Empty: the machine's network. Default:
        $TRAINHUB_GATE_SOCKET.""",
    ).tag(config=True)

    @default("gate_socket")
    def _gate_socket_default(self):
        return os.environ.get(GATE_SOCKET_VAR, "")

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
        failure (a warning is logged) take the cold path: `python -u script.py` under the worker.py wrapper. Where
        users are isolated, the same server forks the worker.py wrapper of each worker that starts cold (its sandbox,
        account switch and command start as before): one interpreter start less per cold isolated worker.
        False: always cold.""").tag(config=True)
    warm_start_timeout = Float(10.0, help="""Seconds to wait for the fork server to start or answer before starting a
        worker cold. After a failed start the server is not tried again for 60 s.""").tag(config=True)

    isolated_warm_pool_size = Integer(2, help="""Isolated `script` workers (users' accounts and/or sandboxes, see
        docs/isolation.md) start from a pool of this many pre-started wrappers, each with an interpreter waiting in a
        sandbox of no user (site imported, nothing heavy), started with the first such job: at launch one is claimed
        per worker and given the job's mounts, account, devices, environment and script (docs/jobs-local.md). Each is
        claimed at most once and refilled after the launch. An empty pool, a job whose environment changes Python's start-up, an unprivileged
        sandbox (not root) and any failed claim (logged) start the worker cold. 0: isolated workers always start
        cold. Ignored when warm_start is False.""").tag(config=True)
    isolated_warm_claim_timeout = Float(5.0, help="""Seconds a pooled isolated worker has to become ready (if it is
        still starting) and to take on its job before the worker starts cold.""").tag(config=True)
    isolated_refill_delay = Float(0.1, help="""Seconds after a launch before the pool of isolated workers starts the
        entries it handed out again (their start-up competes for the CPU with the job just started).""").tag(config=True)

    @validate("isolated_warm_pool_size", "isolated_warm_claim_timeout", "isolated_refill_delay")
    def _not_negative(self, proposal):
        if proposal["value"] < 0 or (proposal["trait"].name == "isolated_warm_claim_timeout" and proposal["value"] == 0):
            raise TraitError(f"LocalLauncher.{proposal['trait'].name} must be "
                             f"{'positive' if proposal['trait'].name == 'isolated_warm_claim_timeout' else 'zero or more'}, "
                             f"not {proposal['value']}")
        return proposal["value"]

    storage = Instance(StorageConfig, help="The platform's storage (users' areas are made theirs and bound into sandboxes).")

    @default("storage")
    def _storage_default(self):
        return StorageConfig(parent=self)

    def __init__(self, **kw):
        super().__init__(**kw)
        self._forkserver: ForkServer | None = None
        self._forkserver_lock = threading.Lock()
        self._warm_retry_at = 0.0
        self._pooled = PooledStarts(self, WORKER_SCRIPT, WARM_INSIDE_SCRIPT)  # the warm pool of isolated workers
        self._on_exit = None  # watch_exits' callback
        self._exit_fds: dict[int, int] = {}  # wrapper pid -> its pidfd, watched on the loop
        self._watched: set[int] = set()  # wrapper pids ever watched (each is watched once: no wake loops)
        self._namespaces: dict[str, tuple[str, dict]] = {}  # account -> its network namespace and variables

    def home_dir(self, user: str) -> str:
        return self.home_dir_template.format(username=user) if self.home_dir_template else ""

    def check(self, spec) -> None:
        """On one machine the W workers of a job are torchrun's W processes of one node (trainhub plays its agent):
        a torchrun inside each would be another agent of that node. Refused, with the two ways that work."""
        if spec.workers > 1 and runs_torchrun(spec.command):
            w = spec.workers
            raise InvalidRequest(
                f"this job runs torchrun in each of its {w} workers: on one machine the {w} workers already are "
                f"torchrun's {w} processes of one node (each gets RANK, LOCAL_RANK 0..{w - 1}, WORLD_SIZE, MASTER_ADDR... "
                f"as under torchrun --nproc_per_node={w}), so a torchrun inside each would start another node on the same "
                f"machine. Either run the script itself in {w} workers (--workers {w} -- python train.py ...), or let one "
                f"worker run torchrun (--workers 1 -- torchrun --nproc_per_node={w} train.py ...)")

    @property
    def isolating(self) -> bool:
        """Workers run as their user's account or in a sandbox."""
        return self.isolation is not None and (self.isolation.use_accounts or self.isolation.use_sandbox)

    def _credentials(self, user: str, account: Account | None, ro: list[str]) -> dict:
        """With S3: the user's own short-lived credentials file made current (trainhub.boundary.credentials), its folder
        added to the sandbox's read-only ``ro``; returns the variables that lead S3 clients to it."""
        broker = storage_credentials_broker(self.storage, parent=self) if self.storage is not None else None
        if broker is None:
            return {}
        files = broker.ensure(user, account)
        ro.append(files.folder)
        return files.env(sandboxed=False)  # bound at its own path

    def _network(self, account: Account | None) -> tuple[str | None, dict]:
        """(the user's network namespace, its variables) for an isolated job's workers: all of them in one, so they
        meet on its loopback (trainhub.boundary.network); (None, {}) without the gate or an account."""
        networks = UserNetworks.from_environment(self.gate_socket) if self.gate_socket else None
        if networks is None or account is None:
            return None, {}
        known = self._namespaces.get(account.name)
        if known is None or not os.path.exists(known[0]):  # asked once per user (a start on the loop must not wait)
            known = self._namespaces[account.name] = networks.place(account.name)
        return known

    def _cwd(self, job: JobView) -> str:
        home = self.home_dir(job.user)
        if home:
            Path(home).mkdir(parents=True, exist_ok=True)
            return home
        return self.job_dir(job)

    def _prepare(self, job: JobView, jdir: Path, adir: Path, account: Account | None) -> tuple[list[str], list[str], str]:
        """The job's folders and the user's areas, owned as the isolation says; returns the sandbox's read-write
        and read-only paths and the workers' working directory."""
        walk = 0o711 if account is not None and not self.isolation.use_sandbox else 0o700
        for folder in (Path(self.jobs_dir), jdir, adir):
            os.chmod(folder, walk)
        outputs = own_dir(jdir / "outputs", account, 0o700)
        work = own_dir(jdir / WORK_DIR, account, 0o700)
        rw, ro = [str(outputs), str(work)], []
        home = self.home_dir(job.user)
        if home:
            areas_rw, areas_ro = self.isolation.user_areas(self.storage, job.user, account, home)
            rw += areas_rw
            ro += areas_ro
        cwd = home or str(work)
        if job.script is not None:
            script = jdir / "script.py"
            if account is not None:
                os.chown(script, account.uid, account.gid)
            ro.append(str(script))
        for rank in range(job.workers):
            metrics = adir / f"metrics-{rank}.jsonl"
            fd = os.open(metrics, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            if account is not None:
                os.fchown(fd, account.uid, account.gid)
            os.close(fd)
        return rw, ro, cwd

    async def launch(self, job, devices, env):
        # the working directory it was sent with, unpacked as its user before anything of it starts (on a thread)
        workdir = await asyncio.to_thread(self._workdir, job) if job.workdir else None
        try:
            state = await self._launch_on_loop(job, devices, env, workdir) if self._starts_on_loop(job) else None
            if state is None:
                state = await asyncio.to_thread(self._launch, job, devices, env, workdir=workdir)
        finally:
            self._pooled.refill_later()  # after the claim: the next entries do not slow this start
        self._watch(state)
        return state

    def _workdir(self, job: JobView) -> str:
        """Unpack the working directory ``job`` was sent with into its folder, as its user (trainhub.workdir through the
        user's UserTree: by descriptors, never following a link, within the limits); returns the folder, the workers'
        cwd. Isolated: ``work/workdir`` (the user's part of the job folder, bound into the sandbox); else ``workdir``.
        Unpacked once per job: a retried attempt finds the copy its predecessors left (a ``snapshot.pt`` written
        there resumes), marked whole by the platform's ``workdir.unpacked`` beside it."""
        jdir = Path(self.job_dir(job))
        jdir.mkdir(parents=True, exist_ok=True)
        work, account = jdir, None
        if self.isolating:
            account = self.isolation.account(job.user)
            work = own_dir(jdir / WORK_DIR, account, 0o700)
        target = work / WORKDIR
        marker = jdir / f"{WORKDIR}.unpacked"  # the platform's: the job cannot forge it
        if marker.exists():
            return str(target)
        archive = self.workdir_archive(job)
        with AsUser(job.user, account).tree(work) as tree, open(archive, "rb") as f:
            if tree.exists(WORKDIR):  # an attempt that died while unpacking: start again
                tree.rmtree(WORKDIR)
            tree.makedirs(WORKDIR, 0o755)
            got = unpack(f, Below(tree, WORKDIR), self.workdir_store.limits)
        marker.write_text(f"{job.workdir}\n")
        self.log.info("job %s: working directory %s unpacked (%d files, %d bytes)", job.key, target, got.files, got.bytes)
        return str(target)

    def _starts_on_loop(self, job: JobView) -> bool:
        """Does ``job`` start on the event loop? A one-worker script job of a user whose account exists, with a pooled
        worker ready: its start is a few file operations and two messages (no process to start, nothing to wait for
        but the worker's answer, which is awaited). On a worker thread the same start waits for the GIL beside the log
        follows that open as a job starts, and the follows wait for the start."""
        if not (job.workers == 1 and job.script is not None and self.warm_start and self.isolating
                and self._pooled.ready()):
            return False
        if storage_credentials_broker(self.storage, parent=self) is not None:
            return False  # minting a user's storage credentials may call STS: not on the loop
        return not self.isolation.use_accounts or self.isolation.accounts.lookup(job.user) is not None

    async def _launch_on_loop(self, job: JobView, devices: list[list[int]], env: dict,
                              workdir: str | None = None) -> dict | None:
        """:meth:`_launch` on the loop with the worker's claim awaited; None when it must start on a thread after all
        (nothing started: no entry ready any more, or one the job cannot take); a claim that fails starts it cold."""
        handed: list = []
        try:
            state = self._launch(job, devices, env, handed=handed, workdir=workdir)
        except _NotOnLoop:
            return None
        entry = handed[0]
        if not await self._pooled.answer(job, entry):
            self._children.pop(entry.pid, None)
            return await asyncio.to_thread(self._launch, job, devices, env, pooled=False, workdir=workdir)
        return state

    # -- exit events: a pidfd per wrapper, readable once the wrapper (which writes the exit file first) has ended ----
    def watch_exits(self, callback) -> None:
        self._on_exit = callback

    def _watch(self, state: dict, running=None) -> None:
        """Watch the exit of each worker's wrapper (``running``: only these ranks) on the event loop. A wrapper that
        has already ended calls back at once. Without pidfds (old kernels) nothing is watched: the periodic pass."""
        if self._on_exit is None or not hasattr(os, "pidfd_open"):
            return
        loop = asyncio.get_running_loop()
        for w in state.get("workers", []):
            pid = w["pid"]
            if pid in self._watched or (running is not None and w["rank"] not in running):
                continue
            self._watched.add(pid)
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:  # ended (and reaped) already
                loop.call_soon(self._on_exit)
                continue
            except OSError as e:  # ENOSYS, EMFILE...: this one is found by the periodic pass
                self.log.debug("cannot watch worker %s: %s", pid, e)
                continue
            self._exit_fds[pid] = fd
            loop.add_reader(fd, self._exited, pid)

    def _exited(self, pid: int) -> None:
        self._unwatch([pid])
        if self._on_exit is not None:
            self._on_exit()

    def _unwatch(self, pids) -> None:
        for pid in pids:
            fd = self._exit_fds.pop(pid, None)
            if fd is not None:
                try:
                    asyncio.get_running_loop().remove_reader(fd)
                finally:
                    os.close(fd)

    def _launch(self, job: JobView, devices: list[list[int]], env: dict, *, pooled: bool = True,
                handed: list | None = None, workdir: str | None = None) -> dict:
        """Start the job's workers. ``pooled=False``: isolated workers start cold. ``handed`` (on the loop, one worker):
        its pooled worker's claim is only handed over (the entry appended to ``handed``, the caller awaits its
        answer), and _NotOnLoop is raised where it would start any other way. ``workdir``: the unpacked working
        directory (:meth:`_workdir`), the workers' cwd instead of the home."""
        jdir = Path(self.job_dir(job))
        adir = attempt_dir(jdir, job.attempt)
        adir.mkdir(parents=True, exist_ok=True)
        (jdir / "outputs").mkdir(exist_ok=True)
        if job.script is not None:
            (jdir / "script.py").write_text(job.script)
            cmd = [sys.executable, "-u", str(jdir / "script.py")]
        else:
            cmd = ["/bin/bash", "-c", job.command]
        account, rw, ro, cwd = None, [], [], self._cwd(job)
        # the job's own folder: the job folder itself, or (isolated) its sub-folder the user owns: the rest of the job
        # folder (logs, exit files) is the platform's, which the job must not be able to replace
        work = jdir / WORK_DIR if self.isolating else jdir
        netns, netns_env = None, {}
        if self.isolating:
            account = self.isolation.account(job.user)
            rw, ro, cwd = self._prepare(job, jdir, adir, account)
            netns, netns_env = self._network(account)
        if workdir:
            cwd = workdir  # inside work/, which the sandbox binds read-write
        cred_env = self._credentials(job.user, account, ro)
        tag = uuid.uuid4().hex
        port = free_port()
        workers = []
        procs_ = []
        pgids = []
        warm = job.script is not None and self.warm_start
        pool = None
        if warm and self.isolating:
            warm = False
            pool = self._pooled.get() if pooled else None  # None: the workers (the rest of a gang) start cold
        # a torchrun inside sets OMP_NUM_THREADS for its processes as it does on a machine (1 each, unless set)
        cores = None if runs_torchrun(job.command) else available_cores()
        try:
            for rank in range(job.workers):
                visible = ",".join(str(d) for d in devices[rank]) if devices else ""
                # the job's variables, then the platform's: no job spec replaces TRAINHUB_* (the instance marker among them)
                wenv = dict(env)
                wenv.update(cred_env)  # the user's own storage credentials (never the platform's key)
                wenv.update(netns_env)  # the egress proxy of the user's namespace (a job may set its own)
                wenv.update(job.env)
                wenv.update({k: v for k, v in env.items() if k.startswith("TRAINHUB_")})
                # what torchrun --nproc_per_node W would give it (trainhub.distenv), OMP_NUM_THREADS its share of the cores
                wenv.update(worker_env(rank=str(rank), local_rank=rank, group_rank="0", world_size=job.workers,
                                       local_world_size=job.workers, group_world_size=1, master_addr="127.0.0.1",
                                       master_port=port, gpus_per_worker=len(devices[rank]) if devices else 0,
                                       cores=cores, user_env=job.env,
                                       error_file=str((work / f"{adir.name}-worker-{rank}.error.json") if self.isolating
                                                      else adir / f"worker-{rank}.error.json")))
                wenv.update({
                    "CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible or "void",
                    "TRAINHUB_METRICS_FILE": str(adir / f"metrics-{rank}.jsonl"),
                    "TRAINHUB_OUTPUTS_DIR": str(jdir / "outputs"),
                    "TRAINHUB_JOB_DIR": str(work),
                    "PYTHONUNBUFFERED": "1",
                    HOLDER_VAR: tag,
                })
                log, exit_file = adir / f"worker-{rank}.log", adir / f"worker-{rank}.exit"
                err = adir / f"worker-{rank}.wrapper.err"
                if pool is not None:
                    started = self._pooled.claim(job, rank, cmd, wenv, cwd, account, rw, ro,
                                                 devices[rank] if devices else [], adir, str(log), str(exit_file),
                                                 handed, netns=netns)
                    if started is not None:
                        entry_proc, holder = started
                        procs_.append(entry_proc)
                        pgids.append(entry_proc.pid)
                        workers.append({"rank": rank, "pid": entry_proc.pid, "started": process_start_time(entry_proc.pid),
                                        "log": str(log), "exit_file": str(exit_file), "start": "warm-isolated",
                                        "holder": holder})
                        continue
                    pool = None  # the rest of the gang cold too
                if handed is not None:
                    raise _NotOnLoop
                if warm:
                    request = {"script": cmd[-1], "args": [], "env": wenv, "cwd": cwd, "log": str(log),
                               "exit_file": str(exit_file), "rank": rank, "wrapper_err": str(err)}
                    pid = self._from_fork_server(job, lambda server: server.spawn(request))
                    if pid is not None:
                        pgids.append(pid)
                        workers.append({"rank": rank, "pid": pid, "started": process_start_time(pid), "log": str(log),
                                        "exit_file": str(exit_file), "start": "warm"})
                        continue
                    warm = False  # the rest of the gang cold too
                run, wrapper_env, env_fd = cmd, wenv, None
                if self.isolating:
                    # the job's environment reaches it only as its user (envexec): the wrapper, bwrap and setpriv run as
                    # the platform with its own environment (LD_PRELOAD & co. of a job must never steer a root process)
                    wrapper_env = _platform_env(wenv)
                    env_fd = envexec.environment_fd(wenv)
                    run = self.isolation.command(
                        envexec.command(env_fd, cmd, wenv, wrapper_env), account=account, cwd=cwd,
                        rw=rw + [str(adir / f"metrics-{rank}.jsonl")], ro=ro, devices=devices[rank] if devices else [],
                        netns=netns,
                    )
                sandboxed = self.isolating and self.isolation.use_sandbox
                # the wrapper by path without site (-S) or its folder on sys.path (-P): it needs only the standard
                # library, and its start-up is on the way to the job's first output line
                args = ["--rank", str(rank), "--log", str(log), "--exit-file", str(exit_file), "--cwd", cwd,
                        *(["--sandboxed"] if sandboxed else []), "--", *run]
                try:
                    pid = None
                    if env_fd is not None and self.warm_start:
                        # an isolated worker's wrapper forked instead of started (the command chain starts cold all the
                        # same): one interpreter start less per cold isolated worker
                        pid = self._from_fork_server(job, lambda server: server.wrap(args, wrapper_env, str(err), env_fd))
                    forked = pid is not None
                    if not forked:
                        proc = subprocess.Popen([sys.executable, "-S", "-P", WORKER_SCRIPT, *args], env=wrapper_env,
                                                start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                stderr=open(err, "ab"), pass_fds=(env_fd,) if env_fd is not None else ())
                        procs_.append(proc)
                        pid = proc.pid
                finally:
                    if env_fd is not None:
                        os.close(env_fd)
                pgids.append(pid)
                workers.append({"rank": rank, "pid": pid, "started": process_start_time(pid), "log": str(log),
                                "exit_file": str(exit_file), "start": "cold", **({"wrapper": "forked"} if forked else {})})
        except BaseException:
            for pgid in pgids:  # gang: all or none
                procs.signal_all(procs.tree_and_groups([pgid]), signal.SIGKILL)
            raise
        self._children = getattr(self, "_children", {})
        for proc in procs_:
            self._children[proc.pid] = proc
        state = {"tag": tag, "master_port": port, "attempt": job.attempt, "workers": workers, "dir": str(adir)}
        if os.environ.get(procs.INSTANCE_VAR):
            state["instance"] = os.environ[procs.INSTANCE_VAR]  # the platform run it started in (see JobEngine.recover)
        return state

    # -- the warm pool of isolated workers (warmpool.py) ---------------------------------------
    async def start(self) -> None:
        # where users are isolated, the pool fills as the service starts, so the first `script` job starts warm
        # too (its entries wait nicer than running work)
        if self.isolating and self.warm_start:
            await asyncio.to_thread(self._pooled.get)
            # and the fork server, which forks the wrappers of isolated workers that start cold: started now, not
            # within the first such job's launch
            await asyncio.to_thread(self._from_fork_server, None, lambda server: server.start())

    # -- the warm fork server ----------------------------------------------------------------
    def _from_fork_server(self, job: JobView | None, fork) -> int | None:
        """``fork(server)`` (a worker, or an isolated worker's wrapper, forked by the fork server; with no ``job``, the
        server's start): its pid, or None (after logging why) when it must start cold."""
        if time.monotonic() < self._warm_retry_at:
            return None
        with self._forkserver_lock:
            if self._forkserver is None:
                jobs_dir = Path(self.jobs_dir)
                jobs_dir.mkdir(parents=True, exist_ok=True)
                self._forkserver = ForkServer(str(jobs_dir / SOCKET_NAME), str(jobs_dir / ".forkserver.log"),
                                              server_environment(os.environ), timeout=self.warm_start_timeout)
            server = self._forkserver
        who = f"job {job.key}" if job is not None else "the jobs service"
        try:
            return fork(server)
        except ForkServerError as e:
            if e.cold:
                self.log.info("%s: starting cold: %s", who, e)
            else:
                self._warm_retry_at = time.monotonic() + 60.0
                self.log.warning("%s: warm start failed (%s); starting cold", who, e)
            return None
        except Exception as e:
            self.log.warning("%s: warm start failed (%r); starting cold", who, e)
            return None

    async def close(self) -> None:
        """Stop the fork server and let the pool's waiting workers go (running workers keep running)."""
        self._unwatch(list(self._exit_fds))
        await asyncio.to_thread(self._pooled.close)
        if self._forkserver is not None:
            await asyncio.to_thread(self._forkserver.stop)

    async def poll(self, job, state):
        # on the loop: a look at small local files (exit files) and /proc that never blocks, cheaper than the trip to
        # a worker thread it used to make for each running job on every pass
        statuses = self._poll(state)
        self._watch(state, {s.rank for s in statuses if s.running})  # re-adopted workers, or a launch watched before
        return statuses

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
        """SIGTERM to every process of the workers (their trees and groups; inside a sandbox, the sandboxed
        processes: the sandbox's bwrap is spared so they get their grace), SIGKILL after ``grace``."""
        pids = _live_wrappers(state)
        await asyncio.to_thread(_signal_trees, pids, signal.SIGTERM)
        try:
            await apoll(lambda: self.poll(job, state), lambda statuses: all(not s.running for s in statuses),
                        what=f"the workers of {job.key} to exit", start=0.1, factor=1.0, timeout=grace)
        except WaitTimeout:
            pass  # the grace period is over: SIGKILL
        await asyncio.to_thread(_signal_trees, pids, signal.SIGKILL)
        await self._kill_tagged(state)

    async def _kill_tagged(self, state: dict) -> None:
        """Anything that left the workers' trees and groups (re-parented daemons without a sandbox) but still carries
        the job's marker."""
        tags = [state.get("tag")] + [w.get("holder") for w in state.get("workers", [])]  # holder: a warm-isolated one's
        for tag in filter(None, tags):
            for pid in await asyncio.to_thread(processes_with, HOLDER_VAR, tag):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    async def cleanup(self, job, state):
        """The attempt has ended: nothing of it may keep running (a daemon it left, a worker of a gang that
        vanished) or keep holding its devices."""
        ended = [w["pid"] for w in state.get("workers", [])]
        self._unwatch(ended)
        self._watched.difference_update(ended)
        pids = _live_wrappers(state)
        if pids:
            await asyncio.to_thread(_signal_trees, pids, signal.SIGKILL, True)
        await self._kill_tagged(state)

    async def adopt(self, job, state):
        statuses = await self.poll(job, state)
        found = bool(statuses) and not all(s.lost for s in statuses)
        if found:  # its user's storage credentials are refreshed by this service from now on
            await asyncio.to_thread(self._keep_credentials, job.user)
        return found

    def _keep_credentials(self, user: str) -> None:
        broker = storage_credentials_broker(self.storage, parent=self) if self.storage is not None else None
        if broker is None:
            return
        try:
            broker.ensure(user, self.isolation.account(user) if self.isolating else None)
        except Exception as e:  # the file keeps its credentials; the next launch of the user's tries again
            self.log.warning("Could not refresh the storage credentials of %s: %s", user, e)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _platform_env(job_env: dict) -> dict:
    """The environment of the privileged steps of an isolated worker: nothing the job chose, but the markers that
    find its processes."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    for key in (procs.INSTANCE_VAR, HOLDER_VAR, "TRAINHUB_JOB_ID"):
        if key in job_env:
            env[key] = job_env[key]
    return env


def _live_wrappers(state: dict) -> list[int]:
    """The workers' wrapper pids that are still those processes (a pid of an ended wrapper may belong to another
    process by now: never signal by it)."""
    return [w["pid"] for w in state.get("workers", []) if pid_alive(w["pid"], w.get("started"))]


def _signal_trees(pids: list[int], sig: int, below_only: bool = False) -> None:
    """``sig`` to each wrapper's tree and process group (``below_only``: not to the wrappers themselves, whose
    exit status the engine may still have to read)."""
    targets = procs.tree_and_groups(pids)
    if below_only:
        targets = [p for p in targets if p not in pids]
    procs.signal_all(targets, sig)
