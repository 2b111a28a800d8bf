"""Process-level measurements (CPU %, I/O wait) for the later usage-accounting work.

Uses psutil when it is installed (it is not a declared trainhub dependency; jupyter
pulls it in on most installs). Without psutil, :func:`psutil_available` is False and
:func:`sample_process` returns None. I/O wait per process is only reported on Linux.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

try:
    import psutil
except ImportError:  # pragma: no cover - depends on the install
    psutil = None


def psutil_available() -> bool:
    return psutil is not None


@dataclass(frozen=True)
class ProcessSample:
    """CPU use of a process and its children over ``interval`` seconds.

    cpu_percent: 100 = one core fully busy. iowait_s: seconds spent waiting for block
    I/O over the interval (Linux; None elsewhere). processes: how many were measured.
    """

    pid: int
    cpu_percent: float
    iowait_s: float | None
    processes: int
    at: float

    def to_dict(self) -> dict:
        return asdict(self)


def _tree(pid: int):
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _times(procs):
    cpu, iowait = 0.0, 0.0
    has_iowait = False
    for p in procs:
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        cpu += t.user + t.system
        if hasattr(t, "iowait"):
            has_iowait = True
            iowait += t.iowait
    return cpu, (iowait if has_iowait else None)


def sample_process(pid: int, interval: float = 1.0) -> ProcessSample | None:
    """Blocking: measure ``pid`` and its children for ``interval`` seconds (run it in a thread).

    Returns None without psutil or when the process is gone.
    """
    if psutil is None:
        return None
    try:
        procs = _tree(pid)
    except psutil.NoSuchProcess:
        return None
    cpu0, io0 = _times(procs)
    t0 = time.monotonic()
    time.sleep(interval)
    cpu1, io1 = _times(procs)
    elapsed = max(time.monotonic() - t0, 1e-6)
    return ProcessSample(
        pid=pid,
        cpu_percent=100.0 * max(cpu1 - cpu0, 0.0) / elapsed,
        iowait_s=None if io0 is None or io1 is None else max(io1 - io0, 0.0),
        processes=len(procs),
        at=time.time(),
    )
