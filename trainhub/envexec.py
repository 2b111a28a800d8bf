"""Exec a command with an environment read from an inherited file descriptor.

    python -I -S .../trainhub/envexec.py FD -- cmd [args...]

A job's environment is its user's to choose (``LD_PRELOAD``, ``PYTHONPATH``...), so it must
reach the job only *after* the switch to the user's account: the privileged steps before it
(the launcher's wrapper, bwrap, setpriv, all run by root) run with the platform's own clean
environment, and the job's travels beside them in a memfd (never on a command line, which every
user can read: it holds storage credentials). This step runs as the user, reads the NUL-separated
``KEY=value`` items from ``FD``, closes it and becomes ``cmd`` (looked up on the job's ``PATH``).
Standard library only; run isolated (``-I -S``) so nothing of the caller's environment steers it.
"""

import os
import sys


def read_environment(fd: int) -> dict:
    chunks = []
    os.lseek(fd, 0, os.SEEK_SET)
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    env = {}
    for item in b"".join(chunks).split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key] = value
    return env


def encode_environment(env: dict) -> bytes:
    """The form :func:`read_environment` reads."""
    return b"\0".join(os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items())


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit("usage: envexec.py FD -- cmd [args...]")
    env = read_environment(int(argv[0]))
    cmd = argv[2:]
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        print(f"trainhub: cannot start {cmd[0]!r}: {e}", file=sys.stderr)
        raise SystemExit(127) from None


if __name__ == "__main__":
    main()
