"""CPU use and I/O wait of job workers' process trees, from /proc (Linux).

One pass reads ``/proc/<pid>/stat`` of every process once (a few ms for a few hundred
processes), then, for each worker, sums its tree: the processes in the worker's session (the
local launcher starts each worker in a session of its own) plus their descendants. Figures are
deltas between two passes, so the first pass of a worker yields nothing.

I/O wait: ``delayacct_blkio_ticks`` (field 42 of stat) when the kernel keeps delay accounting
(``sysctl kernel.task_delayacct=1``); else a proxy: the share of the tree's runnable processes
that are in uninterruptible sleep (state ``D``, almost always block I/O) at the time of the pass,
which averages to the share of time spent waiting over many passes.
Without /proc (not Linux) every figure is None: the advisor then draws no CPU/I/O diagnosis.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    session: int
    state: str
    cpu_ticks: int  # utime + stime
    blkio_ticks: int
    started: int  # starttime (ticks since boot): tells a reused pid apart


@dataclass(frozen=True)
class TreeSample:
    """What a worker's process tree did since the previous pass."""

    cpu_percent: float  # 100 = one core
    max_process_cpu_percent: float
    cpu_cores: float
    iowait_fraction: float | None
    read_mb_s: float | None
    processes: int


def read_stat(pid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    try:
        rest = raw[raw.rindex(b")") + 2:].split()
        # rest[0] is field 3 (state); field n is rest[n - 3]
        return ProcStat(pid=pid, ppid=int(rest[1]), session=int(rest[3]), state=rest[0].decode(),
                        cpu_ticks=int(rest[11]) + int(rest[12]), blkio_ticks=int(rest[39]) if len(rest) > 39 else 0,
                        started=int(rest[19]))
    except (ValueError, IndexError):
        return None


def scan() -> dict[int, ProcStat]:
    """Every process's stat (those that vanish during the scan are left out)."""
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            st = read_stat(int(name))
            if st is not None:
                out[st.pid] = st
    return out


def tree_of(root: int, procs: dict[int, ProcStat], children: dict[int, list[int]]) -> list[ProcStat]:
    """The root, its session and every descendant."""
    seen: set[int] = set()
    todo = [p.pid for p in procs.values() if p.session == root or p.pid == root]
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in procs:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, ()))
    return [procs[p] for p in seen]


def _read_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            for line in f:
                if line.startswith(b"read_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def allowed_cores(pid: int) -> float:
    try:
        return float(len(os.sched_getaffinity(pid)))
    except (OSError, AttributeError):
        return float(os.cpu_count() or 1)


class TreeSampler:
    """Keeps the previous pass per worker root pid; :meth:`sample` is blocking (run it in a thread)."""

    def __init__(self, read_io: bool = True, clock=time.monotonic):
        self.read_io = read_io
        self.clock = clock
        self._prev: dict[int, tuple[float, dict, int | None]] = {}  # root -> (t, {(pid, started): (cpu, blkio)}, read_bytes)
        self.available = os.path.isdir("/proc/self")

    def sample(self, roots: list[int]) -> dict[int, TreeSample | None]:
        if not self.available or not roots:
            return {r: None for r in roots}
        now = self.clock()
        procs = scan()
        children: dict[int, list[int]] = defaultdict(list)
        for p in procs.values():
            children[p.ppid].append(p.pid)
        out: dict[int, TreeSample | None] = {}
        for root in roots:
            tree = tree_of(root, procs, children) if root in procs else []
            if not tree:
                self._prev.pop(root, None)
                out[root] = None
                continue
            cur = {(p.pid, p.started): (p.cpu_ticks, p.blkio_ticks) for p in tree}
            rb = None
            if self.read_io:
                vals = [_read_bytes(p.pid) for p in tree]
                rb = sum(v for v in vals if v is not None) if any(v is not None for v in vals) else None
            prev = self._prev.get(root)
            self._prev[root] = (now, cur, rb)
            if prev is None or now <= prev[0]:
                out[root] = None
                continue
            dt = now - prev[0]
            deltas, blk = [], []
            for key, (cpu, bl) in cur.items():
                pcpu, pbl = prev[1].get(key, (0, 0))
                deltas.append(max(cpu - pcpu, 0) / CLK_TCK)
                blk.append(max(bl - pbl, 0) / CLK_TCK)
            if any(blk) or any(b for _, b in cur.values()):
                iowait = min(max(blk) / dt, 1.0)
            else:
                active = [p for p in tree if p.state in ("R", "D")]
                iowait = (sum(p.state == "D" for p in active) / len(active)) if active else 0.0
            read_mb_s = None
            if rb is not None and prev[2] is not None:
                read_mb_s = max(rb - prev[2], 0) / dt / 1e6
            out[root] = TreeSample(
                cpu_percent=100.0 * sum(deltas) / dt, max_process_cpu_percent=100.0 * max(deltas) / dt,
                cpu_cores=allowed_cores(root), iowait_fraction=iowait, read_mb_s=read_mb_s, processes=len(tree),
            )
        for gone in set(self._prev) - set(roots):
            self._prev.pop(gone, None)
        return out
