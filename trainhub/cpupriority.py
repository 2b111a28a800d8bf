"""The platform's control plane runs ahead of users' work for the CPU (Linux autogroups).

Linux (``CONFIG_SCHED_AUTOGROUP``, on by default in most distributions' kernels) shares the CPU between *sessions*
first, then between the processes inside one: a process's own niceness only weighs against its own session. Each of
the platform's processes (the hub, the proxy, the jobs service) and each user's job and server runs in a session of
its own, so on a busy machine the jobs API got the same share as any one job, kernel or neighbour's process, and
waited for a core behind all of them: measured at load 11-14 on 2 cores, a request's own time in the service had a
p50 of 35-141 ms for 1-3 ms of CPU, and its event loop was held up about 30 % of the time with its thread using an
eighth of that as CPU. A session's own weight is its autogroup niceness (``/proc/<pid>/autogroup``).

The decision: the API that users (and admins stopping a runaway job) depend on must answer while their work fills the
cores, so the jobs service and the proxy in front of it ask for :data:`PLATFORM_NICE` (``JobsService.session_nice``),
and users' jobs and servers keep the default. It costs users' work little: the platform's processes use a few tenths
of a core at most. Lowering a niceness needs CAP_SYS_NICE (root, as ``trainhub up`` runs for isolation); without it,
or without autogroups (a Kubernetes pod's CPU share is its cgroup's, set by its requests), nothing changes and the
reason is logged.

The other way round, work nobody waits for runs behind: a warm server interpreter importing for the pool
(trainhub.spawner.warm) asks for :data:`BACKGROUND_NICE` while a user's server starts, so the server it would
slow gets the cores; raising a niceness needs no privilege, and the interpreter (or the hub) lowers it back to 0.
"""

from __future__ import annotations

import errno
import os
import time

#: the autogroup niceness the platform's services ask for (each step about 1.25x the CPU weight of the one above)
PLATFORM_NICE = -10

#: the autogroup niceness of work that waits for idle cores (a warm interpreter importing while a server starts)
BACKGROUND_NICE = 19

AUTOGROUP_SWITCH = "/proc/sys/kernel/sched_autogroup_enabled"


def autogroups_enabled() -> bool:
    """Whether this kernel shares the CPU by session (autogroups on), so that a session's niceness means anything."""
    try:
        with open(AUTOGROUP_SWITCH) as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def set_session_nice(nice: int, pid: int | None = None, tries: int = 5) -> str | None:
    """Give the session (autogroup) of ``pid`` (None: this process) the niceness ``nice``. Returns None when it was
    set, else why not (no autogroups, not allowed, the process is gone): the caller logs it, nothing else changes.
    Without CAP_SYS_ADMIN the kernel takes one such change per 0.1 s machine-wide (EAGAIN): tried ``tries`` times."""
    try:
        with open(AUTOGROUP_SWITCH) as f:
            if f.read().strip() != "1":
                return "the kernel's autogroups are off (the CPU is shared by process, not by session)"
    except OSError:
        return "this kernel has no autogroups"
    path = f"/proc/{pid or 'self'}/autogroup"
    for attempt in range(max(1, tries)):
        try:
            with open(path, "w") as f:
                f.write(str(int(nice)))
            return None
        except PermissionError:
            return f"not allowed to set {path} to {nice} (a niceness below 0 needs CAP_SYS_NICE, e.g. root)"
        except OSError as e:
            if e.errno != errno.EAGAIN or attempt == max(1, tries) - 1:
                return f"could not set {path} to {nice}: {e.strerror or e}"
            time.sleep(0.05)
    return None


def session_nice(pid: int | None = None) -> int | None:
    """The autogroup niceness of ``pid``'s session (None: this process), or None where there is none to read."""
    try:
        with open(f"/proc/{pid or 'self'}/autogroup") as f:
            return int(f.read().rsplit("nice", 1)[1])
    except (OSError, ValueError, IndexError):
        return None
