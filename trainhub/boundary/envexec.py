"""Exec a command with an environment read from an inherited file descriptor.

    python -I -S .../trainhub/boundary/envexec.py FD -- cmd [args...]

A job's environment is its user's to choose (``LD_PRELOAD``, ``PYTHONPATH``...), so it must
reach the job only *after* the switch to the user's account: the privileged steps before it
(the launcher's wrapper, bwrap, setpriv, all run by root) run with the platform's own clean
environment, and the job's travels beside them in a memfd (never on a command line, which every
user can read: it holds storage credentials). This step runs as the user, reads the NUL-separated
``KEY=value`` items from ``FD``, closes it and becomes ``cmd`` (looked up on the job's ``PATH``).
Standard library only; run isolated (``-I -S``) so nothing of the caller's environment steers it.

A command job's step is bash instead (:data:`BASH_STEP`, chosen by :func:`command`): its command runs under
``/bin/bash -c`` anyway, and a shell that reads the items, exports them and execs that bash costs about a third of
an interpreter's start (2.5 against 8 ms of CPU here), paid by every cold isolated job.
"""

import os
import sys

# $1 = FD, then the command: drop what the shell was started with, export each item (a name of a shell variable:
# see bash_can_carry), close FD and become the command. `export` takes the value as it is (no expansion).
BASH_STEP = """fd=$1; shift
for v in $(compgen -e); do unset -v "$v"; done
while IFS= read -r -d '' -u "$fd" kv || [[ -n $kv ]]; do export -- "$kv" || exit 127; kv=; done
exec {fd}<&-
exec -- "$@"
"""

# bash's own variables: assigning them fails (readonly) or changes the shell that runs BASH_STEP; SHLVL too (bash's
# `exec` passes it on lowered by one)
_BASH_OWN = {"BASHOPTS", "BASHPID", "DIRSTACK", "ENV", "EPOCHREALTIME", "EPOCHSECONDS", "EUID", "FUNCNAME", "GROUPS",
             "HISTCMD", "IFS", "LINENO", "OPTERR", "OPTIND", "POSIXLY_CORRECT", "PPID", "RANDOM", "SECONDS", "SHELLOPTS",
             "SHLVL", "SRANDOM", "UID"}
_LOCALE = ("LANG", "LANGUAGE", "LC_")  # bash applies these as they are assigned (a broken one: a warning of its own)


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


def environment_fd(env: dict) -> int:
    """A memfd holding ``env`` (:func:`encode_environment`), read from its start by whoever inherits it."""
    fd = os.memfd_create("trainhub-job-env", 0)
    try:
        os.write(fd, encode_environment(env))
        os.lseek(fd, 0, os.SEEK_SET)  # the offset is shared with the child: BASH_STEP reads from here
    except BaseException:
        os.close(fd)
        raise
    return fd


def bash_can_carry(env: dict, shell_env: dict) -> bool:
    """Whether BASH_STEP, started with ``shell_env``, hands on ``env`` exactly as this module's ``main``: every name
    is a shell variable's and none is bash's own, and the locale is the one the shell already has."""
    for key, value in env.items():
        if not (key.isascii() and key.isidentifier()) or key in _BASH_OWN or key.startswith("BASH"):
            return False
        if key.startswith(_LOCALE) and shell_env.get(key) != value:
            return False
    return not any(k.startswith(_LOCALE) and k not in env for k in shell_env)


def command(fd: int, cmd: list[str], env: dict, shell_env: dict) -> list[str]:
    """The argv that, run as the user, takes on the environment ``env`` held in ``fd`` and becomes ``cmd``:
    BASH_STEP for a ``/bin/bash -c`` command it can carry, else this module under the platform's interpreter."""
    if cmd[:2] == ["/bin/bash", "-c"] and bash_can_carry(env, shell_env):
        return ["/bin/bash", "-c", BASH_STEP, "trainhub-envexec", str(fd), *cmd]
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(fd), "--", *cmd]


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
