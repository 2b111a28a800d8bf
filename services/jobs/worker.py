"""Runs one worker's command, timestamping its output into the log and recording its exit.

Started by the local launcher in a new session (so it outlives a service restart and the
whole gang can be signalled as a process group). It forwards nothing: a SIGTERM to the
group reaches the command directly; this wrapper keeps draining output until the command
ends, then writes the exit status atomically.

    python -m trainhub.services.jobs.worker --rank 0 --log L --exit-file E -- cmd args...
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from datetime import datetime, timezone


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="trainhub-worker")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--exit-file", required=True)
    p.add_argument("--cwd", default=None)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd

    # stay alive through the group's SIGTERM to record the command's exit (not SIG_IGN: exec would inherit it)
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    prefix = f"[{args.rank}] ".encode()
    with open(args.log, "ab", buffering=0) as log:
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=args.cwd,
                                    restore_signals=True)
        except OSError as e:
            log.write(f"{_stamp()} ".encode() + prefix + f"trainhub: cannot start {cmd[:1]}: {e}\n".encode())
            code = 127
        else:
            for line in iter(proc.stdout.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                log.write(_stamp().encode() + b" " + prefix + line)
            code = proc.wait()
    tmp = args.exit_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(code))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, args.exit_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
