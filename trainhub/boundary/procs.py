"""Finding and ending the processes a platform started, by what they cannot change.

Single-user servers start kernels in new sessions, jobs may ``setsid``, daemonise or exec
without the platform's environment: environment markers and process groups are the
process's own to change. What a process cannot change is its ancestry: `trainhub up` is a
child subreaper, so everything it started, however it forked, stays its descendant (orphans
are re-parented to it, not to init); and a sandboxed server or job lives in a pid namespace
that dies with its ``bwrap`` (``--die-with-parent``). Shutdown and cancel therefore end
**process trees** read from /proc (Linux), with environment markers only as a second net for
processes left by an earlier run that did not stop.

Sandboxes: ``bwrap`` itself dies on SIGTERM and takes its whole namespace with it at once
(SIGKILL), which would deny a job its grace period. :func:`terminate` therefore sends the
polite signal to the sandboxed processes and spares the ``bwrap`` processes, which exit with
their command; only the final SIGKILL reaches them.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
from dataclasses import dataclass
from typing import Iterable

from trainhub.backoff import WaitTimeout, poll

log = logging.getLogger("trainhub.boundary.procs")

INSTANCE_VAR = "TRAINHUB_INSTANCE"  # one per `trainhub up`
HOLDER_VAR = "TRAINHUB_HOLDER"  # one per server / job
SANDBOX_EXE = "bwrap"  # processes running this binary are sandbox holders (see the module docstring)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    state: str


def read_proc(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
        return Proc(pid, int(rest[1]), int(rest[2]), rest[0].decode())
    except (OSError, IndexError, ValueError):
        return None


def process_table() -> dict[int, Proc]:
    """Every live process (zombies included; those that vanish while reading are left out)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            p = read_proc(int(entry))
            if p is not None:
                table[p.pid] = p
    return table


def process_tree(pid: int) -> list[int]:
    """``pid`` and the processes below it, from /proc/<pid>/task/<pid>/children (a few reads, not a /proc scan)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def tree_rss(root: int) -> int:
    """Resident memory of ``root`` and every process below it, in bytes (/proc/<pid>/statm; processes that end
    meanwhile count 0): what a warm interpreter with its keeper and sandbox holds while it waits."""
    page, total = os.sysconf("SC_PAGE_SIZE"), 0
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
    return total


def descendants(roots: Iterable[int], table: dict[int, Proc] | None = None) -> list[int]:
    """Every process below ``roots`` in the parent tree (not the roots themselves)."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    found, todo = [], list(roots)
    seen = set(todo)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                found.append(child)
                todo.append(child)
    return found


def tree_and_groups(roots: Iterable[int], table: dict[int, Proc] | None = None) -> list[int]:
    """``roots``, their descendants and the members of their process groups (a group leader's
    daemonised children), each once."""
    table = process_table() if table is None else table
    roots = [r for r in roots if r]
    out = dict.fromkeys(r for r in roots if r in table)
    out.update(dict.fromkeys(descendants(roots, table)))
    groups = set(roots)
    out.update(dict.fromkeys(p.pid for p in table.values() if p.pgid in groups))
    return list(out)


def is_sandbox(pid: int) -> bool:
    """True for a ``bwrap`` process (the outer one, or the init of its pid namespace)."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")) == SANDBOX_EXE
    except OSError:
        return False


def processes_with(var: str, value: str) -> list[int]:
    """Processes whose *initial* environment holds ``var=value`` (a process can drop or rewrite its
    own: use for leftovers and strays, never as the only way to find what must stop)."""
    needle = f"{var}={value}".encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, PermissionError):
            continue
        if needle in env:
            found.append(pid)
    return found


def _alive(pid: int) -> bool:
    p = read_proc(pid)
    return p is not None and p.state not in ("Z", "X")


def signal_all(pids: Iterable[int], sig: int, spare_sandboxes: bool = True) -> list[int]:
    """Send ``sig`` to each pid (sandbox processes spared unless ``spare_sandboxes`` is False or the
    signal is SIGKILL); returns the pids signalled."""
    sent = []
    for pid in pids:
        if spare_sandboxes and sig != signal.SIGKILL and is_sandbox(pid):
            continue
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return sent


def terminate(pids: list[int], grace: float = 5.0, sig: int = signal.SIGTERM, tree: bool = True) -> list[int]:
    """Send ``sig`` (SIGTERM) to ``pids`` and, with ``tree``, to their descendants and process groups;
    wait up to ``grace`` seconds, then SIGKILL what is left (sandboxes included).

    Returns the pids that had to be killed.
    """
    targets = tree_and_groups(pids) if tree else list(pids)
    signal_all(targets, sig)

    def all_gone() -> bool:
        _reap()
        return not any(_alive(p) for p in targets)

    try:
        poll(all_gone, what=f"processes {targets} to exit", start=0.05, factor=1.0, timeout=grace)
    except WaitTimeout:
        pass  # the grace period is over: SIGKILL what is left
    # anything forked meanwhile below a target is still below it
    left = [p for p in (tree_and_groups(targets) if tree else targets) if _alive(p)]
    signal_all(left, signal.SIGKILL)
    _reap()
    return left


def stop_child(proc: subprocess.Popen | None, grace: float = 5.0) -> None:
    """End a child this process started and holds as a ``Popen``: SIGTERM, SIGKILL after ``grace`` seconds, reaped
    either way (its exit status stays with the ``Popen``). Nothing for None or one that has ended."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def terminate_tagged(var: str, value: str, grace: float = 5.0, also: Iterable[int] = ()) -> int:
    """End every process carrying ``var=value``, the process trees below them and below ``also``;
    returns how many processes there were."""
    roots = list(dict.fromkeys([*processes_with(var, value), *also]))
    targets = tree_and_groups(roots) if roots else []
    targets = [p for p in targets if p != os.getpid() and _alive(p)]
    if targets:
        killed = terminate(targets, grace, tree=True)
        log.info("ended %d process(es) tagged %s=%s or below them (%d needed SIGKILL)", len(targets), var, value, len(killed))
    return len(targets)


def _reap() -> None:
    """Collect exited children (we may be a subreaper for orphans)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def reap_adopted(skip=()) -> list[int]:
    """Collect the exited children of this process but ``skip`` (children someone else waits for: a Popen's). A
    child subreaper adopts the keepers of a hub that died; unreaped, their servers would look alive for ever."""
    me = os.getpid()
    reaped = []
    for p in process_table().values():
        if p.ppid == me and p.state == "Z" and p.pid not in skip:
            try:
                if os.waitpid(p.pid, os.WNOHANG)[0]:
                    reaped.append(p.pid)
            except ChildProcessError:
                continue
    return reaped


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux PR_SET_CHILD_SUBREAPER) so none escape to init."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except Exception:  # pragma: no cover - non-Linux
        return False


# -- who listens where ---------------------------------------------------------------------------
def listening_inodes(port: int, pid: int | None = None) -> set[int]:
    """Socket inodes listening on TCP ``port`` (any address, IPv4 or IPv6) in this process's network namespace, or
    in ``pid``'s (a server in its user's own namespace: trainhub.boundary.network)."""
    inodes = set()
    base = f"/proc/{pid}/net" if pid else "/proc/net"
    for table in (f"{base}/tcp", f"{base}/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(int(fields[9]))
        except OSError:
            continue
    return inodes


def listens(pids: Iterable[int], port: int) -> bool:
    """True when one of ``pids`` holds a socket listening on TCP ``port`` in its own network namespace (tells our
    server apart from another process that happens to answer on the same port)."""
    pids = list(pids)
    inodes: set[int] = set()
    namespaces: set[str] = set()
    for pid in pids:
        try:
            ns = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            continue
        if ns not in namespaces:
            namespaces.add(ns)
            inodes |= listening_inodes(port, pid)
    if not namespaces:
        inodes = listening_inodes(port)
    if not inodes:
        return False
    wanted = {f"socket:[{i}]" for i in inodes}
    inspected = False
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        inspected = True
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return True
            except OSError:
                continue
    # none of them could be inspected (another user's processes without root): someone listens, that must do
    return not inspected


def sandbox_commands(pid: int, table: dict[int, Proc] | None = None) -> list[int]:
    """The commands a sandbox runs: processes below ``pid`` whose parent is a sandbox process (the
    sandbox's init) and that are not one themselves. For ``pid`` not a sandbox: ``[pid]``."""
    table = process_table() if table is None else table
    if not is_sandbox(pid):
        # a server's keeper (trainhub.boundary.keeper) above its sandbox: look through it
        kids = [p for p, proc in table.items() if proc.ppid == pid]
        if len(kids) != 1 or not is_sandbox(kids[0]):
            return [pid]
        pid = kids[0]
    below = descendants([pid], table)
    holders = {pid} | {p for p in below if is_sandbox(p)}
    return [p for p in below if p not in holders and table[p].ppid in holders]
