"""The inside of a warm single-user server: an interpreter that imports the server's modules, waits, and is
claimed once, for one server of one user (see trainhub.spawner.warm for the hub's side and docs/isolation.md).

Run as ``python -m trainhub.spawner.warmstart FD MODULE...``, as the platform (root), in a sandbox of no user
when sandboxes are on. It imports the MODULEs, says ``ready`` on the Unix socket FD and blocks. The claim is
one message: a JSON spec and the mount descriptors (``open_tree`` clones of the user's home, storage area,
datasets and device nodes, made by the hub). In this order it then mounts them at their paths, replaces the
environment (``os.environ`` and what ``/proc/<pid>/environ`` shows), the arguments and ``sys.path[0]``, enters
the working folder, drops to the user's account (bounding set emptied, groups cleared, real/effective/saved ids
set, no_new_privs, as ``setpriv`` does for a cold start; dumpable, as its ``execve`` leaves it), answers ``ok``
and runs the module as ``python -m`` would. Any failure answers the error and exits: the hub then starts the
server cold. End of file on the socket before a claim (the hub went away) exits quietly.

Nothing here reads a user's data before the claim, and a process is claimed at most once: what one user's
server does can never reach another user's server through this path.
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
import time

from trainhub.boundary.warmsandbox import attach_mounts, become, claim_notes, enter_netns, serve_claim, show_environ
from trainhub.cpupriority import session_nice, set_session_nice


def apply_claim(spec: dict, fds: list[int]) -> str:
    """Make this process the server ``spec`` describes; returns the module to run."""
    if session_nice():  # the hub had put the pool's imports behind a starting server
        why = set_session_nice(0)
        if why:
            claim_notes.append(f"its session's CPU priority stays lowered: {why}")
    enter_netns(spec, fds)  # the user's own network namespace (trainhub.boundary.network), before anything listens
    attach_mounts(spec.get("mounts", []), fds)
    os.chdir(spec["cwd"])
    os.umask(spec["umask"])
    os.environ.clear()
    os.environ.update(spec["env"])
    show_environ(spec["env"])  # /proc/<pid>/environ too, as a cold start's execve gives it (before dropping root)
    time.tzset()  # the server's TZ, not the one the interpreter started with
    sys.argv = [spec["module"], *spec["args"]]
    sys.path[0] = os.getcwd()  # as `python -m` started in the working folder would have it
    if spec.get("uid") is not None:
        become(spec["uid"], spec["gid"])
    _recompute_import_time_defaults()
    return spec["module"]


def _recompute_import_time_defaults() -> None:
    """Defaults a warm import computed from the environment it had then (no user yet): computed again now.

    JupyterLab's ``LabApp.workspaces_dir`` and ``user_settings_dir`` are computed at class definition,
    i.e. under the interpreter's own $HOME; left alone, a user's workspaces and settings would go there (or
    fail). tests/platform/test_warm_servers.py scans every class the warm imports define for such defaults.
    """
    labapp = sys.modules.get("jupyterlab.labapp")
    if labapp is not None:
        _set_static_default(labapp.LabApp, "workspaces_dir", labapp.get_workspaces_dir())
        _set_static_default(labapp.LabApp, "user_settings_dir", labapp.get_user_settings_dir())


def _set_static_default(cls, name: str, value) -> None:
    """A static trait default, on ``cls`` and its subclasses (traitlets copies it per class at definition)."""
    cls.class_traits()[name].default_value = value
    todo = [cls]
    while todo:
        c = todo.pop()
        if name in getattr(c, "_static_immutable_initial_values", {}):
            c._static_immutable_initial_values[name] = value
        todo.extend(c.__subclasses__())


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[0]))
    for name in argv[1:]:
        __import__(name)
    module = serve_claim(sock, apply_claim)  # the hub starts the server cold on an error
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
