"""Keeps a user's server alive through a restart of the hub.

    python -I -S .../trainhub/boundary/keeper.py -- cmd [args...]

A sandbox dies with its parent (bwrap ``--die-with-parent``: nothing of a user may outlive the platform), and
the hub is the parent of what it starts. The hub therefore starts each server (and each warm interpreter that
may become one) through this small process: the keeper forks ``cmd`` (the ``nsenter``/``bwrap``/``setpriv`` chain)
in a process group of its own, waits for it and exits with its status. If the hub dies, the keeper lives on,
adopted by ``trainhub up`` (a child subreaper), and so does the server; the restarted hub finds it by its pid
(the keeper's, in the spawner's state) and its port (the gate's). Killing the keeper (SIGKILL) ends the sandbox
at once, as killing bwrap did; a signal the keeper gets otherwise goes to the command's group. Every descriptor
the keeper inherits goes to the command (a warm interpreter's socket). Standard library only.
"""

import os
import signal
import sys


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") + 1 >= len(argv):
        sys.stderr.write("usage: keeper.py -- cmd [args...]\n")
        return 2
    cmd = argv[argv.index("--") + 1:]
    child = os.fork()
    if child == 0:
        try:
            os.setpgid(0, 0)
            os.execvp(cmd[0], cmd)
        except OSError as e:
            sys.stderr.write(f"keeper: cannot run {cmd[0]}: {e}\n")
        os._exit(127)

    def forward(signum, _frame):
        try:
            os.killpg(child, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    while True:
        try:
            _pid, status = os.waitpid(child, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            return 1
        if os.WIFEXITED(status):
            return os.WEXITSTATUS(status)
        if os.WIFSIGNALED(status):
            return 128 + os.WTERMSIG(status)


def argv(cmd: list[str]) -> list[str]:
    """``cmd`` run under a keeper (the same interpreter, no site, nothing of the caller's environment steering it)."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), "--", *cmd]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
