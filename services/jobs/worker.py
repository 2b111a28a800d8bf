"""Runs one worker's command, timestamping its output into the log and recording its exit.

Started by the local launcher in a new session (so it outlives a service restart and the
whole gang can be signalled as a process group). It forwards nothing: a SIGTERM to the
group reaches the command directly; this wrapper keeps draining output until the command
ends, then writes the exit status atomically.

    python -S -P .../services/jobs/worker.py --rank 0 --log L --exit-file E [--cwd D] [--sandboxed] -- cmd args...
    python -m trainhub.services.jobs.worker ...   (the same)

``--sandboxed``: ``cmd`` is a bubblewrap sandbox (``bwrap ... -- [setpriv ...] command``). It starts in a
process group of its own, so a SIGTERM to this wrapper's group does not reach bwrap (which would die at
once and SIGKILL its sandbox); the launcher signals the sandboxed processes themselves. bwrap reports
a command killed by signal N as exit code 128 + N: it is recorded as -N, as for an unsandboxed command.

It stands between a submission and the job's first output line, so it starts the command
before anything else: standard library only, no ``site`` (the launcher runs it with ``-S``),
arguments parsed by hand, the command spawned with ``os.posix_spawnp`` before the imports
that only the logging loop needs.

The warm path (forkserver.py) reuses ``copy_output``, ``wait_exit_code`` and ``write_exit_file``,
so warm and cold workers write the same log lines and exit files.
"""

import os
import signal
import sys

USAGE = "usage: worker.py --rank N --log FILE --exit-file FILE [--cwd DIR] [--sandboxed] -- cmd [args...]"


def parse_args(argv: list[str]) -> tuple[dict, list[str]]:
    """``({"rank": int, "log": str, "exit_file": str, "cwd": str | None, "sandboxed": bool}, cmd)``; SystemExit(2)
    when malformed."""
    opts = {"--rank": None, "--log": None, "--exit-file": None, "--cwd": None}
    sandboxed = False
    i = 0
    while i < len(argv) and argv[i] != "--":
        flag, sep, value = argv[i].partition("=")
        if flag == "--sandboxed" and not sep:
            sandboxed = True
            i += 1
            continue
        if flag not in opts:
            raise SystemExit(f"{USAGE}\nunknown argument {argv[i]!r}")
        if not sep:
            if i + 1 >= len(argv):
                raise SystemExit(f"{USAGE}\n{flag} needs a value")
            i += 1
            value = argv[i]
        opts[flag] = value
        i += 1
    cmd = argv[i + 1:]
    missing = [f for f in ("--rank", "--log", "--exit-file") if opts[f] is None]
    if missing or not cmd:
        raise SystemExit(f"{USAGE}\nmissing: {', '.join(missing) or 'the command after --'}")
    try:
        rank = int(opts["--rank"])
    except ValueError:
        raise SystemExit(f"{USAGE}\n--rank must be a number") from None
    return {"rank": rank, "log": opts["--log"], "exit_file": opts["--exit-file"], "cwd": opts["--cwd"],
            "sandboxed": sandboxed}, cmd


def _stamper():
    from datetime import datetime, timezone

    def stamp() -> bytes:
        return (datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z ").encode()
    return stamp


def log_line(log_path: str, rank: int, text: str) -> None:
    """Append one timestamped line of the launcher's own (``trainhub: ...``) to a worker's log."""
    with open(log_path, "ab", buffering=0) as log:
        log.write(_stamper()() + f"[{rank}] {text}\n".encode())


def copy_output(read_fd: int, log_path: str, rank: int) -> None:
    """Copy the command's output from ``read_fd`` into the log until EOF, each line as ``<ISO time>Z [rank] text``.

    Takes ownership of ``read_fd`` (closed on return). A last line without a newline gets one.
    """
    stamp = _stamper()
    prefix = f"[{rank}] ".encode()
    with open(log_path, "ab", buffering=0) as log, os.fdopen(read_fd, "rb", buffering=0) as out:
        pending = b""
        while True:
            chunk = out.read(65536)
            if not chunk:
                break
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            if lines:
                now = stamp()
                log.write(b"".join(now + prefix + line + b"\n" for line in lines))
        if pending:
            log.write(stamp() + prefix + pending + b"\n")


def wait_exit_code(pid: int) -> int:
    """Wait for child ``pid``; its exit code, negative for a signal (as ``Popen.returncode``)."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:  # pragma: no cover (PEP 475 retries; kept for clarity)
            continue
    return os.waitstatus_to_exitcode(status)


def write_exit_file(exit_path: str, code: int) -> None:
    """Write the exit status atomically (readers see no file or the whole number)."""
    tmp = exit_path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(code))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, exit_path)


def main(argv=None) -> int:
    args, cmd = parse_args(sys.argv[1:] if argv is None else argv)
    log_path, exit_path = os.path.abspath(args["log"]), os.path.abspath(args["exit_file"])

    # stay alive through the group's SIGTERM to record the command's exit (not SIG_IGN: exec would inherit it)
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    pid, error = None, None
    read_fd, write_fd = os.pipe()  # both close-on-exec; dup2 makes the copies on 1 and 2 inheritable
    try:
        if args["cwd"]:
            os.chdir(args["cwd"])
        # Python ignores SIGPIPE and SIGXFSZ: the command gets their defaults (as Popen's restore_signals)
        extra = {"setpgroup": 0} if args["sandboxed"] else {}
        pid = os.posix_spawnp(cmd[0], cmd, os.environ,
                              file_actions=[(os.POSIX_SPAWN_DUP2, write_fd, 1), (os.POSIX_SPAWN_DUP2, write_fd, 2)],
                              setsigdef=(signal.SIGPIPE, signal.SIGXFSZ), **extra)
    except OSError as e:
        error = e
    os.close(write_fd)

    if error is not None:
        log_line(log_path, args["rank"], f"trainhub: cannot start {cmd[:1]}: {error}")
        os.close(read_fd)
        code = 127
    else:
        copy_output(read_fd, log_path, args["rank"])
        code = wait_exit_code(pid)
        if args["sandboxed"] and 128 < code < 128 + 65:
            code = 128 - code  # bwrap's 128 + N for "killed by signal N"
    write_exit_file(exit_path, code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
