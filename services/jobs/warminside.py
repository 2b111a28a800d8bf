"""The inside of a warm isolated job worker: an interpreter waiting in a sandbox of no user, claimed once by one
worker of one job, which it then becomes (see warmpool.py for the launcher's side and docs/jobs-local.md).

    python -u .../services/jobs/warminside.py FD

Started by a warm wrapper (``worker.py --warm``) through ``Isolation.command`` with no account and none of the
per-job mounts: as root, in a bwrap sandbox with its own /tmp, /dev/shm, pid and IPC namespaces. It has done what
a ``python -u`` start does (``site``) and imported only the standard-library modules the fork server imports
(never torch, numpy or CUDA). It says ``ready`` on the Unix socket FD and blocks. The claim is one message
(trainhub.boundary.warmsandbox): a JSON spec and the job's mounts as descriptors. In a cold start's order it then attaches
the mounts, enters the working folder, sets the umask, makes ``/proc/<pid>/environ`` the job's environment
(trainhub.boundary.warmsandbox.show_environ), drops to the account (trainhub.boundary.warmsandbox.become), takes on the job's
environment, ``sys.argv`` and ``sys.path`` as ``python -u script.py`` would have them (forkserver.prepare_worker),
answers ``ok``, tells its wrapper it took the job on (``worker.TAKEN_ON``, its first output) and runs the script as
``__main__`` (forkserver.run_script): the interpreter then exits as after ``python -u script.py``. Any failure
answers the error and exits 1 before any of the job's code ran (and before ``TAKEN_ON``, so its wrapper records
nothing): the launcher starts the worker cold. End of file first (the launcher let it go) exits 0.
"""

import os
import socket
import sys
import time

from trainhub.services.jobs.forkserver import prepare_worker, run_script
from trainhub.services.jobs.worker import TAKEN_ON
from trainhub.boundary.warmsandbox import attach_mounts, become, enter_netns, serve_claim, show_environ


def apply_claim(spec: dict, fds: list[int]) -> str:
    """Become the worker ``spec`` describes; returns the script's path."""
    enter_netns(spec, fds)  # the user's own network namespace (trainhub.boundary.network), before anything listens
    attach_mounts(spec.get("mounts", []), fds)
    os.chdir(spec["cwd"])  # bwrap --chdir, as root
    os.umask(spec["umask"])
    show_environ(spec["env"])  # what /proc/<pid>/environ shows: the job's, as envexec's execve gives a cold worker
    if spec.get("uid") is not None:
        become(spec["uid"], spec["gid"])  # setpriv
    script = prepare_worker({"env": spec["env"], "script": spec["script"], "args": spec.get("args", [])})  # envexec
    time.tzset()  # the job's TZ, not the one this interpreter started with
    if not os.path.isfile(script):
        raise FileNotFoundError(f"the job's script {script} is not in the sandbox")
    return script


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[0]))
    import types  # noqa: F401  what run_script needs, imported before the claim (as the fork server does)
    from importlib.machinery import SourceFileLoader  # noqa: F401

    script = serve_claim(sock, apply_claim)  # the launcher starts the worker cold on an error
    os.write(1, TAKEN_ON)  # to the wrapper: the job's output follows (worker.py)
    run_script(script)


if __name__ == "__main__":
    main(sys.argv[1:])
