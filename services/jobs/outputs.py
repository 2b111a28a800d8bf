"""Copying a job's outputs and logs to the user's storage area while it runs and at exit.

Small files (logs, metrics, small results) go often; large ones (checkpoints) less
often, so a big checkpoint is not re-uploaded every few seconds; everything goes at
exit. Only files whose size or modification time changed are copied.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from traitlets import Float, Integer
from traitlets.config import LoggingConfigurable

from trainhub.storage import StorageConfig


class OutputSyncer(LoggingConfigurable):
    small_interval = Float(10.0, help="Seconds between syncs of small files (logs, metrics, small outputs).").tag(config=True)
    large_interval = Float(120.0, help="Seconds between syncs of large files (checkpoints); all files are synced at exit.").tag(config=True)
    large_file_bytes = Integer(16 * 1024 * 1024, help="Files at least this large count as large.").tag(config=True)

    def __init__(self, storage: StorageConfig, **kwargs):
        super().__init__(**kwargs)
        self.storage = storage
        self._seen: dict[str, dict[str, tuple]] = {}  # job key -> path -> (size, mtime)
        self._last_small: dict[str, float] = {}
        self._last_large: dict[str, float] = {}

    def target_url(self, user: str, key: str) -> str:
        return f"{self.storage.user_url(user)}/jobs/{key}"

    def due(self, key: str, now: float | None = None) -> bool:
        now = now or time.monotonic()
        return now - self._last_small.get(key, 0) >= self.small_interval

    def sync(self, user: str, key: str, job_dir: str, final: bool = False) -> int:
        """Copy changed files; returns how many were copied. Runs on a worker thread."""
        now = time.monotonic()
        large_due = final or now - self._last_large.get(key, 0) >= self.large_interval
        self._last_small[key] = now
        if large_due:
            self._last_large[key] = now
        fs = self.storage.filesystem(user)
        target = self.storage.strip(self.target_url(user, key))
        seen = self._seen.setdefault(key, {})
        copied = 0
        root = Path(job_dir)
        if not root.exists():
            return 0
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                if name.endswith((".tmp", ".wrapper.err")):
                    continue
                path = Path(dirpath) / name
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                sig = (st.st_size, st.st_mtime_ns)
                rel = path.relative_to(root).as_posix()
                if seen.get(rel) == sig:
                    continue
                if st.st_size >= self.large_file_bytes and not large_due:
                    continue
                dest = f"{target}/{rel}"
                try:
                    if self.storage.is_local:
                        os.makedirs(os.path.dirname(dest), exist_ok=True)
                    fs.put_file(str(path), dest)
                except Exception as e:  # storage hiccup: try again next round, never lose the local copy
                    self.log.warning("output sync of %s to %s failed: %s", path, dest, e)
                    continue
                seen[rel] = sig
                copied += 1
        if final:
            self._seen.pop(key, None)
            self._last_small.pop(key, None)
            self._last_large.pop(key, None)
        return copied
