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
that only the logging loop needs. It takes ``_signal`` (the C module behind ``signal``, which imports
``enum``) and stamps with ``time`` rather than ``datetime``: the two imports were half of the wrapper's
start-up CPU, which every cold job pays.

The warm path (forkserver.py) reuses ``copy_output``, ``wait_exit_code`` and ``write_exit_file``,
so warm and cold workers write the same log lines and exit files.

``--warm FD``: a wrapper of the warm pool of isolated workers (warmpool.py). It starts ``cmd`` (a sandboxed warm
interpreter) at once but learns its rank, log and exit file only when the launcher claims it: one JSON line on the
Unix socket FD, sent just before the interpreter gets its job. It then records the command's output only once the
command's first bytes are ``TAKEN_ON``, which the interpreter writes when it has taken the job on, before any of the
job's code runs (the job cannot write them first); so the first line is read as soon as it is printed, without a
second message from the launcher. End of file on FD first (the launcher let it go, or went away), or on the output
before ``TAKEN_ON`` (the interpreter failed its claim), kills ``cmd`` and exits without a trace. It is started
nicer than the launcher (warmpool.WAIT_NICE, inherited by ``cmd``); the launcher renices the pair back when it claims
them.
"""

import _signal as signal  # see the module docstring
import os
import sys

TAKEN_ON = b"\0trainhub: taken on\n"  # a warm interpreter's first output: it runs the claimed job from here on

#: the longest piece of a line the log holds: a longer line is cut into pieces of at most this many bytes, each a
#: log line of its own ending in ``CONTINUES`` but the last (docs/jobs-local.md, "Long lines")
LINE_CAP = 64 << 10
CONTINUES = b" [line continues]\n"
#: the longest line a worker's log holds: a piece with its time stamp, a rank of up to 10 digits and the marker
MAX_LOG_LINE = LINE_CAP + 64

USAGE = ("usage: worker.py --rank N --log FILE --exit-file FILE [--cwd DIR] [--sandboxed] -- cmd [args...]\n"
         "       worker.py --warm FD [--sandboxed] -- cmd [args...]")


def parse_args(argv: list[str]) -> tuple[dict, list[str]]:
    """``({"rank": int, "log": str, "exit_file": str, "cwd": str | None, "sandboxed": bool, "warm": int | None},
    cmd)``; SystemExit(2) when malformed (with ``--warm``, rank, log and exit file come at claim)."""
    opts = {"--rank": None, "--log": None, "--exit-file": None, "--cwd": None, "--warm": None}
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
    warm = opts["--warm"] is not None
    missing = [f for f in ("--rank", "--log", "--exit-file") if opts[f] is None and not warm]
    if missing or not cmd:
        raise SystemExit(f"{USAGE}\nmissing: {', '.join(missing) or 'the command after --'}")
    try:
        rank = int(opts["--rank"]) if opts["--rank"] is not None else None
        warm_fd = int(opts["--warm"]) if warm else None
    except ValueError:
        raise SystemExit(f"{USAGE}\n--rank and --warm must be numbers") from None
    return {"rank": rank, "log": opts["--log"], "exit_file": opts["--exit-file"], "cwd": opts["--cwd"],
            "sandboxed": sandboxed, "warm": warm_fd}, cmd


def _stamper():
    """``stamp() -> b"2026-01-31T12:00:00.123Z "``, UTC to the millisecond."""
    import time

    def stamp() -> bytes:
        ms = time.time_ns() // 1_000_000
        return (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + ".%03dZ " % (ms % 1000)).encode()
    return stamp


def log_line(log_path: str, rank: int, text: str) -> None:
    """Append one timestamped line of the launcher's own (``trainhub: ...``) to a worker's log."""
    with open(log_path, "ab", buffering=0) as log:
        log.write(_stamper()() + f"[{rank}] {text}\n".encode())


def _cut(data: bytes, at: int, start: int) -> int:
    """Where to end the piece ``data[start:at]``: at ``at``, or before the UTF-8 character ``at`` would split (a run
    of continuation bytes longer than a character's is no text: cut at ``at``)."""
    for back in range(min(4, at - start)):
        if data[at - back] & 0xC0 != 0x80:  # not a continuation byte: a character starts here
            return at - back
    return at


def _pieces(line: bytes, whole: bool) -> list[bytes]:
    """``line`` as log lines' texts of at most ``LINE_CAP`` bytes, each ending in ``CONTINUES`` but the last, which
    ends in a newline if the line is ``whole`` (else it is the start of a line still to come, at most ``LINE_CAP``)."""
    out, pos = [], 0
    while len(line) - pos > LINE_CAP:
        cut = _cut(line, pos + LINE_CAP, pos)
        out.append(line[pos:cut] + CONTINUES)
        pos = cut
    out.append(line[pos:] + b"\n" if whole else line[pos:])
    return out


def copy_output(read_fd: int, log_path: str, rank: int) -> None:
    """Copy the command's output from ``read_fd`` into the log until EOF, each line as ``<ISO time>Z [rank] text``.

    Takes ownership of ``read_fd`` (closed on return). A last line without a newline gets one. A line longer than
    ``LINE_CAP`` bytes is written in pieces of at most ``LINE_CAP`` (cut between UTF-8 characters) as it arrives,
    each a log line of its own ending in ``CONTINUES`` but the last: what is held is one piece at most, so one line
    without a newline (200 MiB of it) costs linear time and bounded memory, and the job never waits on its pipe
    while a growing buffer is joined again and again.
    """
    stamp = _stamper()
    prefix = f"[{rank}] ".encode()
    with open(log_path, "ab", buffering=0) as log, os.fdopen(read_fd, "rb", buffering=0) as out:
        pending = b""  # the start of the current line: at most LINE_CAP bytes
        while True:
            chunk = out.read(65536)
            if not chunk:
                break
            data = pending + chunk if pending else chunk
            lines = data.split(b"\n")
            pending = lines.pop()
            if len(data) <= LINE_CAP or (len(pending) <= LINE_CAP and max(map(len, lines), default=0) <= LINE_CAP):
                texts = [line + b"\n" for line in lines]
            else:  # a line over the cap: at most two pieces of it per read (pending + 64 KiB)
                texts = [text for line in lines for text in _pieces(line, True)]
                *cut, pending = _pieces(pending, False)
                texts += cut
            if texts:
                now = stamp()
                log.write(b"".join(now + prefix + text for text in texts))
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


def wait_claim(fd: int) -> dict | None:
    """The warm wrapper's claim: ``{"rank", "log", "exit_file"}`` read from the socket ``fd`` (closed on return);
    None on end of file or anything else (let go)."""
    import json
    import socket

    data = b""
    with socket.socket(fileno=fd) as s:
        while not data.endswith(b"\n") and len(data) < 1 << 16:
            try:
                chunk = s.recv(1 << 16)
            except OSError:
                return None
            if not chunk:
                break
            data += chunk
    try:
        claim = json.loads(data)
        return {"rank": int(claim["rank"]), "log": str(claim["log"]), "exit_file": str(claim["exit_file"])}
    except (ValueError, KeyError, TypeError):
        return None


def taken_on(read_fd: int) -> bool:
    """Were the command's first bytes ``TAKEN_ON`` (read exactly, so what follows stays in the pipe)?"""
    data = b""
    while len(data) < len(TAKEN_ON):
        chunk = os.read(read_fd, len(TAKEN_ON) - len(data))
        if not chunk:
            return False
        data += chunk
    return data == TAKEN_ON


def _close_all_but(keep: set) -> None:
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)  # a sandbox's bwrap: its pid namespace dies with it
    except ProcessLookupError:
        pass


def main(argv=None) -> int:
    args, cmd = parse_args(sys.argv[1:] if argv is None else argv)
    if args["warm"] is not None:
        os.set_inheritable(args["warm"], False)  # the launcher's line to this wrapper only, never to the command
    else:
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

    if args["warm"] is not None:
        # what the launcher passed for the command (its end of the interpreter's socket) is the command's alone: held
        # here too, the launcher would never see that end close when the interpreter dies
        _close_all_but({0, 1, 2, read_fd, args["warm"]})
        _stamper()  # its imports now, not on the way to the claimed job's first line
        claim = wait_claim(args["warm"]) if error is None else None
        # never claimed, or the claim failed: nothing ran for anyone, nothing is recorded
        if claim is None or not taken_on(read_fd):
            if pid is not None:
                _kill(pid)
                os.close(read_fd)
                wait_exit_code(pid)
            return 0
        args.update(claim)
        log_path, exit_path = os.path.abspath(args["log"]), os.path.abspath(args["exit_file"])

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
