"""Warm starts for isolated job workers: a small pool of pre-started wrapper + sandbox pairs, each claimed once by
one worker of one job (the launcher's side; warminside.py is the inside, trainhub.boundary.warmsandbox the shared mechanics).

A cold isolated worker pays, before its first output line, for the wrapper's interpreter, bwrap, setpriv,
envexec's interpreter and the script's own ``python -u`` start. A pool entry has paid for all but the claim::

    jobs service ─Popen─> python -S -P worker.py --warm CTL --sandboxed -- bwrap ... -- python -u warminside.py FD
                          (the wrapper: its own session,      (as root in a sandbox of no user: site imported,
                           the platform's, outside)            says "ready" on FD and waits)

At launch the launcher claims one per worker: the wrapper gets the worker's rank, log and exit file; the interpreter
gets the job's mounts (``open_tree`` descriptors of what the cold sandbox would bind: home, storage area,
``datasets/`` read-only, the job's ``outputs/``, ``work/``, script and metrics file, the GPU device nodes the ledger
gave it), its umask, account, environment, script and arguments, answers ``ok`` and tells its wrapper it took the job
on (``worker.TAKEN_ON``, its first output); from then on the wrapper is a cold worker's wrapper (timestamps the
output, writes the exit file; its pid is the worker's process group). A failure anywhere discards the entry (nothing
of it ran for the job, nothing is recorded: the wrapper records nothing before ``TAKEN_ON``) and the worker starts
cold.

Nothing passes between users: an entry is claimed at most once and never returns to the pool; the process, its
sandbox, /tmp and memory end with that worker. Before its claim an entry runs platform code only and reads no
user's data. What an interpreter cannot take on after start-up (``STARTUP_VARS``) is compared with the job's
environment first: any difference starts the worker cold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass

from trainhub.boundary.procs import HOLDER_VAR, INSTANCE_VAR, process_tree
from trainhub.boundary.warmsandbox import claim_answer, send_claim, startup_differences

# read by the interpreter, the loader or libc at start-up; PYTHON* but those a started interpreter can honour at
# claim (PYTHONPATH and PYTHONIOENCODING by forkserver.prepare_worker; PYTHONUNBUFFERED: it runs with -u;
# PYTHONBREAKPOINT and PYTHONSTARTUP are read later or never)
STARTUP_VARS = ("PYTHON*", "LD_*", "LANG", "LANGUAGE", "LC_*", "MALLOC_*", "GLIBC_TUNABLES")
HONOURED = {"PYTHONPATH", "PYTHONIOENCODING", "PYTHONUNBUFFERED", "PYTHONBREAKPOINT", "PYTHONSTARTUP"}


WAIT_NICE = 10  # how much nicer than the service entries start and wait: a refill yields to running work


@contextlib.contextmanager
def nicer(steps: int):
    """This thread ``steps`` nicer while within: on Linux a thread's priority is its own, and the processes it starts
    inherit it, from their first instruction. Put back after (where this account may not, the thread stays nicer)."""
    tid = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, tid)
    if steps:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, before + steps))
    try:
        yield
    finally:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, before)
        except OSError:  # raising a priority needs root
            pass


class WarmUnavailable(Exception):
    """This worker starts cold (the message says why)."""


def launch_env() -> dict:
    """The environment of a pool entry (wrapper, bwrap, interpreter): what every isolated worker's privileged steps
    get alike (``local._platform_env`` less the job's own markers), never anything of a user or a job."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": os.environ.get("LANG", "C.UTF-8")}
    if os.environ.get(INSTANCE_VAR):
        env[INSTANCE_VAR] = os.environ[INSTANCE_VAR]
    return env


def refusal(env: dict, launched: dict) -> str:
    """Why a worker with environment ``env`` cannot start from an interpreter launched with ``launched`` ("": it can)."""
    import site

    diff = [k for k in startup_differences(env, launched, STARTUP_VARS) if k not in HONOURED]
    if diff:
        return f"start-up variables differ from the warm interpreters': {', '.join(diff)}"
    if site.ENABLE_USER_SITE:  # outside a venv the user's own site-packages depend on $HOME at start-up
        return "user site-packages are enabled (not a virtualenv)"
    return ""


@dataclass
class Entry:
    """One pre-started wrapper (``proc``) and its sandboxed interpreter."""

    proc: subprocess.Popen
    ctl: socket.socket  # to the wrapper: the worker's rank, log and exit file, once claimed
    claim_sock: socket.socket  # to the interpreter: "ready", then the claim and its answer
    token: str  # the HOLDER_VAR marker in the initial environment of the wrapper, bwrap and the interpreter
    started: float
    ready: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def check_ready(self, timeout: float = 0.0) -> bool:
        """Has the interpreter said ``ready`` (waiting up to ``timeout``)? WarmUnavailable once it said anything else
        or ended."""
        if self.ready:
            return True
        p = select.poll()  # not select(): a busy service's descriptors may pass FD_SETSIZE
        p.register(self.claim_sock, select.POLLIN)
        if not p.poll(max(timeout, 0.0) * 1000):
            return False
        try:
            line = self.claim_sock.recv(64)
        except OSError:
            line = b""
        self.ready = line == b"ready\n"
        if not self.ready:
            raise WarmUnavailable(f"warm interpreter {self.pid} did not start ({line!r})")
        return True

    def renice(self) -> None:
        """Back to the service's own priority (an entry waits ``WAIT_NICE`` nicer): it is claimed, or awaited."""
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        for p in process_tree(self.pid):
            try:
                os.setpriority(os.PRIO_PROCESS, p, nice)
            except OSError:  # ended meanwhile, or not allowed (not root): it keeps running nicer
                pass

    def discard(self) -> None:
        """Let it go: both sockets closed, so the interpreter and the wrapper exit without a trace; the group killed
        in case they cannot."""
        for s in (self.ctl, self.claim_sock):
            try:
                s.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


class WorkerPool:
    """Up to ``size`` entries started with ``argv_for(claim_fd, ctl_fd)``, ``nice`` steps nicer than the pool's owner
    (:meth:`Entry.renice` puts a claimed one back); thread-safe (launches run on threads and on the event loop, refills
    on threads)."""

    def __init__(self, argv_for, env: dict, size: int, log, log_path: str | None = None, nice: int = WAIT_NICE):
        self.argv_for, self.env, self.size, self.log, self.log_path = argv_for, env, size, log, log_path
        self.nice = nice
        self.waiting: list[Entry] = []
        self.claims = 0
        self._lock = threading.Lock()  # held only briefly: ``waiting`` and ``claims``
        self._filling = threading.Lock()
        self._discarded: list[subprocess.Popen] = []
        self.closed = False  # a refill scheduled before close() starts nothing

    def _start(self) -> Entry:
        inside_parent, inside_child = socket.socketpair()
        ctl_parent, ctl_child = socket.socketpair()
        token = uuid.uuid4().hex
        err = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(self.argv_for(inside_child.fileno(), ctl_child.fileno()), env=dict(self.env, **{HOLDER_VAR: token}),
                                    pass_fds=(inside_child.fileno(), ctl_child.fileno()), cwd="/", start_new_session=True,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        except BaseException:
            for s in (inside_parent, ctl_parent):
                s.close()
            raise
        finally:
            inside_child.close()
            ctl_child.close()
            if err is not subprocess.DEVNULL:
                err.close()
        return Entry(proc, ctl_parent, inside_parent, token, time.monotonic())

    def _reap(self) -> None:
        self._discarded = [p for p in self._discarded if p.poll() is None]

    def _drop(self, entry: Entry) -> None:
        entry.discard()
        self._discarded.append(entry.proc)

    def fill(self) -> int:
        """Start entries until ``size`` wait; returns how many were started. The entries start outside the pool's lock
        (a start is a process launch, tens of milliseconds): a launch taking an entry meanwhile, on the event loop
        among others, does not wait for them."""
        started = 0
        with self._filling:  # one fill at a time (each launch schedules one)
            with self._lock:
                if self.closed:
                    return 0
                self._reap()
                for e in [e for e in self.waiting if e.proc.poll() is not None]:
                    self.waiting.remove(e)
                    self._drop(e)
                missing = self.size - len(self.waiting)
            for _ in range(missing):
                try:
                    # nicer from the first instruction (the wrapper's and the interpreters' starts included), so a
                    # refill yields the CPU to the job just started and to the next one's start
                    with nicer(self.nice):
                        entry = self._start()
                except OSError as e:
                    self.log.warning("Could not start a warm job worker: %s", e)
                    break
                with self._lock:
                    if self.closed:  # closed meanwhile: this one goes too
                        self._drop(entry)
                        break
                    self.waiting.append(entry)
                    started += 1
        return started

    def _first_ready(self) -> Entry | None:
        """(Under the lock.) The oldest ready entry, at once; entries found broken on the way are discarded."""
        for e in list(self.waiting):
            try:
                if e.proc.poll() is None and e.check_ready():
                    return e
            except WarmUnavailable as err:
                self.log.warning("%s; discarded", err)
                self.waiting.remove(e)
                self._drop(e)
        return None

    def has_ready(self) -> bool:
        """Is an entry ready now (no wait)?"""
        with self._lock:
            return self._first_ready() is not None

    def take_ready(self) -> Entry | None:
        """A ready entry (the oldest) at once, else None; the entry is out of the pool for good."""
        with self._lock:
            pick = self._first_ready()
            if pick is not None:
                self.waiting.remove(pick)
            return pick

    def take(self, timeout: float) -> Entry | None:
        """A ready entry (the oldest), else the oldest still starting if it becomes ready within ``timeout``, else
        None. The entry is out of the pool for good."""
        pick = self.take_ready()
        if pick is not None:
            return pick
        with self._lock:
            pick = next((e for e in self.waiting if e.proc.poll() is None), None)
            if pick is None:
                return None
            self.waiting.remove(pick)
        try:
            pick.renice()  # awaited now: no longer a background refill
            if pick.check_ready(timeout):
                return pick
        except WarmUnavailable as err:
            self.log.warning("%s; discarded", err)
        with self._lock:
            self._drop(pick)
        return None

    def claim(self, entry: Entry, spec: dict, mounts: list[tuple[str, bool, bool]], worker: dict, timeout: float,
              netns: str | None = None) -> int:
        """Hand ``entry`` its worker (:meth:`hand_over`) and wait for its answer (:meth:`answer`): the wrapper's pid."""
        self.hand_over(entry, spec, mounts, worker, timeout, netns)
        return self.answer(entry, timeout)

    def hand_over(self, entry: Entry, spec: dict, mounts: list[tuple[str, bool, bool]], worker: dict,
                  timeout: float, netns: str | None = None) -> None:
        """``worker`` (rank, log, exit file) to the wrapper, then ``spec``, ``mounts`` and the user's network namespace
        ``netns`` to the interpreter (warminside.apply_claim). Its answer follows (:meth:`answer`, :meth:`answer_async`). Raises WarmUnavailable
        (the entry discarded, nothing recorded: the wrapper records nothing before the interpreter took the job on) on
        any failure."""
        with self._discarding(entry):
            entry.renice()  # the job runs at the service's priority, as a cold worker does
            # the wrapper first: it records the output once the interpreter says it took the job on (worker.TAKEN_ON),
            # so the first line is not held up by a second message from here
            entry.ctl.settimeout(timeout)
            entry.ctl.sendall(json.dumps(worker).encode() + b"\n")
            entry.claim_sock.settimeout(timeout)
            send_claim(entry.claim_sock, spec, mounts, netns)

    def answer(self, entry: Entry, timeout: float) -> int:
        """Wait (blocking) for the interpreter's answer to :meth:`hand_over`: the wrapper's pid (the worker's process
        group), or WarmUnavailable (the entry discarded)."""
        with self._discarding(entry):
            entry.claim_sock.settimeout(timeout)
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = entry.claim_sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
            return self._settle(entry, answer)

    async def answer_async(self, entry: Entry, timeout: float) -> int:
        """:meth:`answer` on the event loop: the interpreter takes on the job (its mounts, account, environment) while
        the loop serves others."""
        loop = asyncio.get_running_loop()
        with self._discarding(entry):
            entry.claim_sock.setblocking(False)
            answer = b""
            async with asyncio.timeout(timeout):
                while not answer.endswith(b"\n"):
                    chunk = await loop.sock_recv(entry.claim_sock, 4096)
                    if not chunk:
                        break
                    answer += chunk
            return self._settle(entry, answer)

    def _settle(self, entry: Entry, answer: bytes) -> int:
        error, notes = claim_answer(answer)
        if error is not None:
            raise WarmUnavailable(error or f"the warm interpreter ended (wrapper code {entry.proc.poll()})")
        for note in notes:  # e.g. its /proc environ could not be set: it runs all the same
            self.log.warning("Warm job worker %s: %s", entry.pid, note)
        entry.claim_sock.close()
        entry.ctl.close()
        with self._lock:
            self.claims += 1
        return entry.pid

    @contextlib.contextmanager
    def _discarding(self, entry: Entry):
        """Any failure within discards ``entry``; errors of the socket or the answer become WarmUnavailable."""
        try:
            yield
        except WarmUnavailable:
            with self._lock:
                self._drop(entry)
            raise
        except (OSError, ValueError) as e:  # TimeoutError among them
            with self._lock:
                self._drop(entry)
            raise WarmUnavailable(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None
        except BaseException:
            with self._lock:
                self._drop(entry)
            raise

    def close(self) -> None:
        """Let every waiting entry go (running workers are not the pool's: they keep running)."""
        with self._lock:
            self.closed = True
            waiting, self.waiting = self.waiting, []
            for e in waiting:
                self._drop(e)
        deadline = time.monotonic() + 2.0
        for p in self._discarded:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self._reap()
