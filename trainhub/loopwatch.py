"""What holds up a service's event loop, measured while it serves: the loop's lateness, the cycle collector's pauses,
the requests' own time, and where the loop thread was when it stalled.

An asyncio service answers every request on one thread: whatever keeps that thread from its loop for 100 ms (a full
collection of a large heap, a write waiting for the disk, a pass over a long queue, or a machine whose cores are all
taken) is 100 ms more on every call in flight. :class:`LoopWatch` tells these apart as they happen:

* a heartbeat on the loop every ``interval`` seconds measures how late it ran (the loop's lag) and how much CPU the
  loop thread used meanwhile: a stall with little CPU is time spent waiting for a core (or for the GIL), one with as
  much CPU as wall time is the service's own work;
* a watchdog thread samples the loop thread's stack once the heartbeat is ``stall`` seconds overdue, so each stall
  is logged (warning) with where the loop was;
* ``gc.callbacks`` time every collection, by generation;
* :meth:`request` counts the requests' own time (tornado's ``request_time``: from the first byte read to the last
  written).

:meth:`snapshot` returns the counts since start as a JSON-able dict (the jobs service serves it to admins at
``GET {api}/service/stalls``; benchmarks/jobs_load_bench.py prints the difference over each phase).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import threading
import time
from collections import deque

#: lateness/duration thresholds the counts are kept for, in ms
THRESHOLDS_MS = (20, 50, 200)


def _where(frame, depth: int = 6) -> str:
    """The innermost ``depth`` frames of a stack, innermost last: ``file:line function < ...``."""
    parts = []
    while frame is not None and len(parts) < depth:
        code = frame.f_code
        parts.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return " < ".join(parts)


class _Counter:
    """count, total and max of durations, and how many passed each of THRESHOLDS_MS."""

    def __init__(self):
        self.count, self.total, self.max = 0, 0.0, 0.0
        self.over = dict.fromkeys(THRESHOLDS_MS, 0)

    def add(self, seconds: float) -> None:
        ms = seconds * 1000.0
        self.count += 1
        self.total += ms
        if ms > self.max:
            self.max = ms
        for t in THRESHOLDS_MS:
            if ms > t:
                self.over[t] += 1

    def to_dict(self) -> dict:
        return {"count": self.count, "total_ms": round(self.total, 1), "max_ms": round(self.max, 1),
                "over_ms": {str(t): n for t, n in self.over.items()}}


class LoopWatch:
    """See the module docstring. ``start()`` on the loop's thread, ``stop()`` at the end."""

    def __init__(self, log: logging.Logger, interval: float = 0.05, stall: float = 0.1, keep: int = 20):
        self.log, self.interval, self.stall = log, interval, stall
        self.lag = _Counter()  # how late each heartbeat ran
        self.lag_cpu_ms = 0.0  # the loop thread's CPU during the late heartbeats' intervals (> 20 ms late)
        self.requests = _Counter()
        self.gc = {gen: _Counter() for gen in range(3)}
        self.gc_cpu_ms = 0.0
        self.stalls: deque = deque(maxlen=keep)  # the latest stalls: when, how long, CPU, where
        self.started = time.time()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id = 0
        self._handle = None
        self._due = 0.0
        self._cpu = 0.0
        self._sampled: str | None = None  # where the loop was in the current stall (watchdog -> heartbeat)
        self._gc_start = (0.0, 0.0)
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    # -- running -----------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread_id = threading.get_ident()
        gc.callbacks.append(self._on_gc)
        self._cpu = time.thread_time()
        self._due = time.monotonic() + self.interval
        self._handle = self._loop.call_at(self._loop.time() + self.interval, self._beat)
        self._watchdog = threading.Thread(target=self._watch, name="trainhub-loopwatch", daemon=True)
        self._watchdog.start()

    def stop(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _beat(self) -> None:
        now, cpu = time.monotonic(), time.thread_time()
        late = max(0.0, now - self._due)
        self.lag.add(late)
        used = (cpu - self._cpu) * 1000.0
        if late > 0.02:
            self.lag_cpu_ms += used
        if late >= self.stall:
            where = self._sampled or "(not sampled)"
            self.stalls.append({"at": time.time() - late, "ms": round(late * 1000.0, 1), "loop_cpu_ms": round(used, 1),
                                "where": where})
            self.log.warning("event loop held up %.0f ms (its thread used %.0f ms of CPU meanwhile%s); it was at %s",
                             late * 1000.0, used, ": waiting for a core or the GIL" if used < late * 500.0 else "",
                             where)
        self._sampled = None
        self._cpu = cpu
        self._due = now + self.interval
        self._handle = self._loop.call_at(self._loop.time() + self.interval, self._beat)

    def _watch(self) -> None:
        """The watchdog thread: where is the loop thread when the heartbeat is overdue (once per stall)."""
        while not self._stop.wait(self.interval / 2):
            if self._sampled is None and time.monotonic() - self._due > self.stall:
                frame = sys._current_frames().get(self._thread_id)
                self._sampled = _where(frame) if frame is not None else "(no frame)"

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = (time.perf_counter(), time.thread_time())
        else:
            t0, c0 = self._gc_start
            self.gc[info["generation"]].add(time.perf_counter() - t0)
            self.gc_cpu_ms += (time.thread_time() - c0) * 1000.0

    def request(self, seconds: float) -> None:
        """One request served, ``seconds`` its own time."""
        self.requests.add(seconds)

    # -- reading -------------------------------------------------------------------
    def snapshot(self) -> dict:
        return {
            "since": self.started,
            "interval_ms": self.interval * 1000.0,
            "loop_lag": {**self.lag.to_dict(), "loop_cpu_ms_when_late": round(self.lag_cpu_ms, 1)},
            "gc": {**{str(gen): c.to_dict() for gen, c in self.gc.items()}, "cpu_ms": round(self.gc_cpu_ms, 1),
                   "frozen": gc.get_freeze_count()},
            "requests": self.requests.to_dict(),
            "process_cpu_s": round(time.process_time(), 3),
            "stalls": list(self.stalls),
        }
