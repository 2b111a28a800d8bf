"""Finding and ending the processes a platform started, without trusting parent links.

Single-user servers start kernels in new sessions, and a crashed server leaves them
re-parented, so a process tree walk misses them. Every process the platform starts
carries marker variables in its environment (inherited by its children); cleanup
finds processes by marker through /proc (Linux).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal

from trainhub.backoff import WaitTimeout, poll

log = logging.getLogger("trainhub.procs")

INSTANCE_VAR = "TRAINHUB_INSTANCE"  # one per `trainhub up`
HOLDER_VAR = "TRAINHUB_HOLDER"  # one per server / job


def processes_with(var: str, value: str) -> list[int]:
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
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except OSError:
        return False


def terminate(pids: list[int], grace: float = 5.0, sig: int = signal.SIGTERM) -> list[int]:
    """Send ``sig`` (SIGTERM), wait up to ``grace`` seconds, then SIGKILL what is left.

    Returns the pids that had to be killed.
    """
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    def all_gone() -> bool:
        _reap()
        return not any(_alive(p) for p in pids)

    try:
        poll(all_gone, what=f"processes {pids} to exit", start=0.05, factor=1.0, timeout=grace)
    except WaitTimeout:
        pass  # the grace period is over: SIGKILL what is left
    killed = [p for p in pids if _alive(p)]
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _reap()
    return killed


def terminate_tagged(var: str, value: str, grace: float = 5.0) -> int:
    """End every process carrying ``var=value``; returns how many there were."""
    pids = processes_with(var, value)
    if pids:
        killed = terminate(pids, grace)
        log.info("ended %d process(es) tagged %s=%s (%d needed SIGKILL)", len(pids), var, value, len(killed))
    return len(pids)


def _reap() -> None:
    """Collect exited children (we may be a subreaper for orphans)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux PR_SET_CHILD_SUBREAPER) so none escape to init."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except Exception:  # pragma: no cover - non-Linux
        return False
