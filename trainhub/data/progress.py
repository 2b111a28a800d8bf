"""A progress bar that uses tqdm when it is installed and a plain stderr line otherwise."""

from __future__ import annotations

import sys
import time


class Progress:
    """``Progress(total, desc, unit)``; ``update(n)``; ``close()``. Disabled -> no output."""

    def __init__(self, total: int, desc: str = "", unit: str = "B", enabled: bool = True, stream=None):
        self.total = total
        self.desc = desc
        self.unit = unit
        self.enabled = enabled
        self.n = 0
        self._bar = None
        self._stream = stream or sys.stderr
        self._last = 0.0
        self._start = time.monotonic()
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            tqdm = None
        if tqdm is not None:
            scale = unit == "B"
            self._bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=scale, unit_divisor=1024 if scale else 1000,
                             file=self._stream, dynamic_ncols=True, leave=True)

    def update(self, n: int) -> None:
        self.n += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= 0.5 or self.n >= self.total:
            self._last = now
            self._print()

    def _print(self, end: str = "\r") -> None:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        pct = 100.0 * self.n / self.total if self.total else 100.0
        if self.unit == "B":
            done = f"{self.n / 2**20:.1f}/{self.total / 2**20:.1f} MiB, {self.n / 2**20 / elapsed:.1f} MiB/s"
        else:
            done = f"{self.n}/{self.total} {self.unit}"
        self._stream.write(f"{self.desc}: {pct:5.1f}% ({done})" + end)
        self._stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            self._print(end="\n")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
