"""Warm single-user servers: a small pool of interpreters that have imported the server's modules, each
claimed once, by one spawn, and made that user's server (the hub's side; ``warmstart`` is the inside).

A cold start spends most of its time importing jupyter_server, JupyterLab and their extensions. A warm
interpreter has done that already, as the platform, with no user's data, token or identity; at claim it is
given everything a cold start would get, in a cold start's order: the sandbox's per-user mounts (the home,
storage area, ``datasets/`` and GPU device nodes, passed as ``open_tree`` descriptors and attached inside its
own mount namespace), the environment (token, devices, storage), the arguments, the working folder, then the
user's account. The sandbox it waits in is a cold sandbox minus those mounts (same bwrap arguments from
``Isolation.command``), so its private /tmp, /dev/shm and pid namespace are new and its own.

Why nothing leaks between users: a warm process serves one server and then dies with it (never returned to
the pool once claimed), so no user's code ever runs in a process another user gets; before its claim it runs
only platform code that reads nothing of any user. What cannot be changed after start-up (interpreter and
loader variables such as ``PYTHON*``, ``LD_*``, the locale) is compared with the server's environment, and any
difference, a custom command or ``popen_kwargs``, an empty pool or a failed claim starts the server cold.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import os
import signal
import socket
import subprocess
import uuid
from dataclasses import dataclass, field

from trainhub.backoff import within
from trainhub.boundary.procs import HOLDER_VAR, INSTANCE_VAR, descendants, process_table, tree_rss
from trainhub.cpupriority import BACKGROUND_NICE, set_session_nice
from trainhub.fmt import fmt_size
from trainhub.loops import PeriodicLoop
from trainhub.boundary.warmsandbox import claim_answer, current_umask, send_claim
from trainhub.boundary.warmsandbox import startup_differences as _startup_differences

from .demand import PoolDemand, budget_cap

# what a running interpreter cannot take on later: read by the interpreter, the loader or libc at start-up,
# or by jupyterhub.singleuser when imported
STARTUP_VARS = ("PYTHON*", "LD_*", "LANG", "LANGUAGE", "LC_*", "MALLOC_*", "GLIBC_TUNABLES", "JUPYTERHUB_SINGLEUSER_*")
DEFAULT_IMPORTS = (
    "jupyter_server.serverapp",
    "jupyterlab.labapp",
    "jupyter_lsp",
    "jupyter_server_terminals",
    "notebook_shim.shim",
    "jupyterhub.services.auth",
    # the rest of what a server imports when it starts (the platform's configuration adds trainhub's own server
    # extensions, hub_config.embedded): with them, its imports and ServerApp.initialize took 0.87 CPU s after the claim
    # on the 2-core test machine, 0.15 s, for 27 MB more per waiting interpreter (JUPYTERHUB_SINGLEUSER_*, which
    # jupyterhub.singleuser reads on import, are start-up variables above)
    "jupyterhub.singleuser",
    "jupyter_server_proxy",
    # ... and what loading the extensions imports (jupyter-scheduler's executors pull in nbconvert: 0.23 CPU s alone)
    "jupyter_scheduler.executors",
    "jupyter_scheduler.job_files_manager",
    "jupyter_server.nbconvert",
    "jupyter_server.kernelspecs",
    "jupyter_server.view",
    "jupyter_core.migrate",
    "httpcore",
    "IPython.paths",
    "jinja2.ext",
)
#: bytes one waiting interpreter is assumed to hold until one has been measured (140 MB measured on the 2-core test
#: machine, with its keeper and sandbox)
RSS_ESTIMATE = 150 * 2**20


class WarmUnavailable(Exception):
    """This spawn starts cold (the message says why)."""


def startup_differences(env: dict, launched: dict, patterns=STARTUP_VARS) -> list[str]:
    """Start-up variables whose value in ``env`` differs from the one the warm interpreter started with."""
    return _startup_differences(env, launched, patterns)


@dataclass
class WarmProcess:
    proc: subprocess.Popen
    sock: socket.socket
    token: str  # its HOLDER_VAR marker, in its initial environment: the server's spawn token once claimed
    ready: asyncio.Future = field(default=None)
    waited: float = 0.0  # seconds the spawn that took it waited for its imports (0: it was ready)
    nice: int = 0  # the autogroup niceness the hub last gave its sessions (WarmPool.server_starting)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def discard(self) -> None:
        """Let it go: its socket closed (it exits by itself), its session killed in case it cannot (a sandbox's bwrap:
        its pid namespace dies with it). No wait and no reaping of other children here (this runs on the hub's loop;
        ``procs.terminate`` would block it and reap any child, which a Popen then reads as exit code 0)."""
        try:
            self.sock.close()
        finally:
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


class WarmPool:
    """Warm interpreters started with one launch command and environment (one pool per distinct launch in the hub
    process: :func:`pool_for`). ``size`` is the target: fixed, or, with a :class:`~.demand.PoolDemand`, what demand
    wants within the memory budget (:meth:`retarget`). At most ``parallel`` import at once: on a few cores the first
    of a refill is ready sooner than if all started together, and a rush takes them in order. While a server starts
    (:meth:`server_starting`) the interpreters still importing run behind it: measured on 2 cores, four users
    arriving within half a second waited 2.7-3.7 s for pool hits beside a refill importing at the same priority,
    2.1-2.3 s with the refill behind them."""

    def __init__(self, argv_for, env: dict, size: int, log, ready_timeout: float = 120.0):
        self.argv_for, self.env, self.size, self.log = argv_for, env, size, log
        self.ready_timeout = ready_timeout
        self.waiting: list[WarmProcess] = []
        self.claims = 0
        self.demand: PoolDemand | None = None
        self.budget = 0  # bytes the waiting interpreters may hold together; 0: no bound
        self.parallel = os.cpu_count() or 1
        self.why = "warm_pool_size"  # what set the current size (for the log)
        self.measured: list[int] = []  # resident bytes of the latest interpreters that became ready
        self.loop: PeriodicLoop | None = None
        self.starting = 0  # servers of this pool's spawners starting now, warm or cold
        self._nice_lock: asyncio.Lock | None = None

    # -- size ---------------------------------------------------------------------------------------------------
    def per_interpreter(self) -> int:
        """Resident bytes one waiting interpreter holds: the largest of the latest measured, else the estimate."""
        return max(self.measured[-8:]) if self.measured else RSS_ESTIMATE

    def retarget(self) -> int:
        """The size demand wants now, bounded by the memory budget (a fixed pool keeps its size)."""
        if self.demand is None:
            return self.size
        want, why = self.demand.want()
        cap = budget_cap(self.budget, self.per_interpreter())
        if want > cap:
            why += f"; the memory budget {fmt_size(self.budget)} holds {cap} of {fmt_size(self.per_interpreter())}"
        size = min(want, cap)
        if size != self.size:
            self.log.info("Warm server pool: %d -> %d interpreters (%s)", self.size, size, why)
        self.size, self.why = size, why
        return size

    def arrive(self) -> None:
        """A spawn arrived: demand learns it and the pool grows at once if that raises the target (a rush)."""
        if self.demand is not None:
            self.demand.record()
            self.retarget()
            self.fill()
            if self.demand.path:
                self._saving = asyncio.ensure_future(self._save())

    _saving: asyncio.Future | None = None

    async def _save(self) -> None:
        try:
            await asyncio.to_thread(self.demand.save)
        except OSError as e:  # the model goes on from memory; only a restart would forget
            self.log.warning("Could not keep the warm pool's spawn history in %s: %s", self.demand.path, e)

    def importing(self) -> int:
        return sum(1 for wp in self.waiting if not wp.ready.done())

    def describe(self) -> str:
        """Why a spawn found no interpreter (for the hub's log)."""
        target = f"the pool's target is {self.size} ({self.why})"
        if self.size == 0:
            return target
        return f"{target}, 0 waiting: every one was taken by the spawns before this one ({self.claims} claimed so far)"

    def start_loop(self, interval) -> None:
        """Retarget and fill (or shrink) every ``interval()`` seconds, so the pool grows before the usual arrivals and
        shrinks when idle, whether or not anyone spawns. Needs a running loop; once per pool."""
        if self.loop is None and self.demand is not None:
            async def tick():
                self.retarget()
                self.fill()

            self.loop = PeriodicLoop("trainhub-warm-pool", tick, interval, self.log)
            self.loop.start()

    # -- priority -------------------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def server_starting(self):
        """While a user's server starts, the pool's interpreters that still import run behind it
        (:data:`~trainhub.cpupriority.BACKGROUND_NICE`), so a refill takes only the cores it leaves; they are back at
        0 once no server is starting, so a refill is never starved by other load for long. A claimed interpreter puts
        its own session back to 0 first thing (warmstart.apply_claim)."""
        self.starting += 1
        await self._follow_starts()
        try:
            yield
        finally:
            self.starting -= 1
            await self._follow_starts()

    def _priority_lock(self) -> asyncio.Lock:
        """One change of the interpreters' niceness at a time (made on the loop that uses the pool)."""
        if self._nice_lock is None:
            self._nice_lock = asyncio.Lock()
        return self._nice_lock

    async def _follow_starts(self) -> None:
        async with self._priority_lock():  # the latest count decides, whatever order the changes came in
            nice = BACKGROUND_NICE if self.starting else 0
            todo = [wp for wp in self.waiting if wp.nice != nice and (nice == 0 or not wp.ready.done())]
            for wp in todo:
                wp.nice = nice
            if todo:
                failed = await asyncio.to_thread(renice_sessions, [wp.pid for wp in todo], nice)
                if failed:
                    self.log.debug("Warm server pool: niceness %d not given to every interpreter: %s", nice, failed)

    async def _normal_priority(self, wp: WarmProcess) -> None:
        """``wp`` (taken out of ``waiting``) at niceness 0 before anything of a user reaches it: after any change
        under way (the lock), so none can lower it later; a spawn waiting for its imports has them run at 0."""
        async with self._priority_lock():
            if wp.nice:
                wp.nice = 0
                await asyncio.to_thread(renice_sessions, [wp.pid], 0)

    # -- interpreters ---------------------------------------------------------------------------------------------
    def _launch(self) -> WarmProcess:
        parent, child = socket.socketpair()
        token = uuid.uuid4().hex
        env = dict(self.env, **{HOLDER_VAR: token})
        try:
            proc = subprocess.Popen(self.argv_for(child.fileno()), env=env, pass_fds=[child.fileno()], cwd="/",
                                    start_new_session=True, stdin=subprocess.DEVNULL)
        finally:
            child.close()
        parent.setblocking(False)
        wp = WarmProcess(proc, parent, token)
        wp.ready = asyncio.ensure_future(self._wait_ready(wp))
        if self.starting:  # behind the server starting now, once its sandbox's processes exist
            asyncio.get_running_loop().call_later(0.2, lambda: asyncio.ensure_future(self._follow_starts()))
        return wp

    async def _wait_ready(self, wp: WarmProcess) -> bool:
        loop = asyncio.get_running_loop()
        try:
            line = await within(loop.sock_recv(wp.sock, 64), self.ready_timeout)
        except (asyncio.TimeoutError, OSError):
            line = b""
        if line != b"ready\n":
            self.log.warning("A warm server interpreter (pid %s) did not become ready; discarded", wp.pid)
            if wp in self.waiting:
                self.waiting.remove(wp)
            wp.discard()
            return False
        if self.demand is not None:
            self.measured = (self.measured + [await asyncio.to_thread(tree_rss, wp.pid)])[-8:]
            self.fill()  # the next one of a refill starts as this one is ready (at most ``parallel`` import at once)
        return True

    def fill(self) -> None:
        """Start interpreters until ``size`` wait (at most ``parallel`` importing at once), or end the surplus, the
        newest first (the ones still importing before the ready ones). Needs a running loop."""
        self.waiting = [wp for wp in self.waiting if wp.proc.poll() is None]
        while len(self.waiting) > self.size:
            surplus = next((wp for wp in reversed(self.waiting) if not wp.ready.done()), self.waiting[-1])
            self.waiting.remove(surplus)
            surplus.discard()
        limit = self.parallel if self.demand is not None else self.size
        while len(self.waiting) < self.size and self.importing() < limit:
            try:
                self.waiting.append(self._launch())
            except OSError as e:
                self.log.warning("Could not start a warm server interpreter: %s", e)
                return

    async def take(self) -> WarmProcess | None:
        """A ready interpreter (the oldest), else one still importing (ahead of any cold start), else None."""
        self.waiting = [wp for wp in self.waiting if wp.proc.poll() is None]
        ready = [wp for wp in self.waiting if wp.ready.done() and wp.ready.result()]
        pick = ready[0] if ready else next((wp for wp in self.waiting if not wp.ready.done()), None)
        if pick is None:
            return None
        self.waiting.remove(pick)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await self._normal_priority(pick)
        if not await pick.ready:
            return None
        pick.waited = loop.time() - began
        return pick

    def put_back(self, wp: WarmProcess) -> None:
        """An interpreter taken but not claimed (the spawn went cold before sending anything)."""
        if wp.proc.poll() is None and len(self.waiting) < self.size:
            self.waiting.insert(0, wp)
        else:
            wp.discard()

    async def claim(self, wp: WarmProcess, spec: dict, mounts: list[tuple[str, bool, bool]], timeout: float,
                    netns: str | None = None) -> None:
        """Hand ``wp`` its server: ``spec`` (see warmstart.apply_claim), ``mounts`` as (path, read-only, is a
        folder), attached at the same path inside its sandbox, and the user's network namespace ``netns``. Raises
        WarmUnavailable (``wp`` discarded) on failure."""
        try:
            loop = asyncio.get_running_loop()
            wp.sock.setblocking(True)
            wp.sock.settimeout(timeout)
            await asyncio.to_thread(send_claim, wp.sock, spec, mounts, netns)
            wp.sock.setblocking(False)
            answer = await within(loop.sock_recv(wp.sock, 4096), timeout)
            error, notes = claim_answer(answer)
            if error is not None:
                raise WarmUnavailable(error or f"the warm interpreter exited (code {wp.proc.poll()})")
            for note in notes:  # e.g. its /proc environ could not be set: it runs all the same
                self.log.warning("Warm server interpreter %s: %s", wp.pid, note)
        except WarmUnavailable:
            wp.discard()
            raise
        except (OSError, ValueError, asyncio.TimeoutError) as e:
            wp.discard()
            raise WarmUnavailable(f"{type(e).__name__}: {e}") from None
        except BaseException:
            wp.discard()
            raise
        wp.sock.close()
        self.claims += 1


def renice_sessions(pids: list[int], nice: int) -> str:
    """Give the sessions (autogroups) of ``pids`` and of every process below them the niceness ``nice``: an
    interpreter in a sandbox runs in a session of its own under its keeper's (bwrap --new-session). Returns what
    failed ("" when nothing did); a process gone meanwhile is not a failure."""
    table = process_table()
    groups: dict[str, int] = {}
    for pid in [*pids, *descendants(pids, table)]:
        try:
            with open(f"/proc/{pid}/autogroup") as f:
                groups.setdefault(f.read().split(" nice", 1)[0], pid)
        except OSError:
            continue
    failed = [why for pid in groups.values() if (why := set_session_nice(nice, pid)) and os.path.exists(f"/proc/{pid}")]
    return "; ".join(failed)


_pools: dict[str, WarmPool] = {}


def pool_for(argv_for, env: dict, size: int, log) -> WarmPool:
    """The hub's pool for this launch (command and environment), made on first use."""
    key = json.dumps([argv_for(-1), sorted(env.items())])
    pool = _pools.get(key)
    if pool is None:
        pool = _pools[key] = WarmPool(argv_for, env, size, log)
    if pool.demand is None:
        pool.size = size
    else:
        pool.demand.floor = size
    return pool


def launch_env(env_keep, environment: dict, path: str) -> dict:
    """The environment a warm interpreter starts with: what every server of this hub gets alike (the hub's kept
    variables, the PATH, the platform marker, the static start-up variables of ``Spawner.environment``); never
    a token, a user or a device."""
    env = {k: os.environ[k] for k in env_keep if k in os.environ}
    env["PATH"] = path
    for k, v in environment.items():
        if isinstance(v, str) and any(fnmatch.fnmatchcase(k, p) for p in STARTUP_VARS):
            env[k] = v
    if os.environ.get(INSTANCE_VAR):
        env[INSTANCE_VAR] = os.environ[INSTANCE_VAR]
    return env


def claim_spec(cmd: list[str], env: dict, cwd: str, account, sandboxed: bool) -> dict:
    """What warmstart.apply_claim needs to become the server ``cmd`` (``python -m module args``) would start."""
    env = dict(env)
    if sandboxed:
        env["PWD"] = cwd  # bwrap --chdir sets it in a cold sandbox
    umask = current_umask()
    return {"module": cmd[2], "args": list(cmd[3:]), "env": env, "cwd": cwd, "umask": umask,
            "uid": account.uid if account else None, "gid": account.gid if account else None}


def warm_argv(python: str, fd: int, imports) -> list[str]:
    return [python, "-m", "trainhub.spawner.warmstart", str(fd), *imports]

