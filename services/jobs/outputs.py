"""Copying a job's outputs and logs to the user's storage area while it runs and at exit.

Small files (logs, metrics, small results) go often; large ones (checkpoints) less
often, so a big checkpoint is not re-uploaded every few seconds; everything goes at
exit. Only files whose size or modification time changed are copied.

With per-user accounts the copy is made with the user's rights (``user_fs``, the launcher's
``Launcher.user_fs``): files under ``outputs/`` and ``work/`` (the job's own, which may be symbolic links to
anything) are opened as the user, so a link to the platform's secrets or another user's files is
refused by the kernel; the platform's own files of the job (logs, metrics) are read as the
platform; and what lands in a local storage area is written as the user, so it is theirs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

from traitlets import Callable, Float, Integer, default
from traitlets.config import LoggingConfigurable

from trainhub.boundary.accounts import reach
from trainhub.storage import StorageConfig

#: folders of a job's folder that are the job's own (outputs/; work/, $TRAINHUB_JOB_DIR of an isolated job): read with
#: the user's rights, as anything in them may be a symbolic link
USER_FOLDERS = ("outputs", "work")


class OutputSyncer(LoggingConfigurable):
    small_interval = Float(10.0, help="Seconds between syncs of small files (logs, metrics, small outputs).").tag(config=True)
    large_interval = Float(120.0, help="Seconds between syncs of large files (checkpoints); all files are synced at exit.").tag(config=True)
    large_file_bytes = Integer(16 * 1024 * 1024, help="Files at least this large count as large.").tag(config=True)
    user_fs = Callable(help="user -> a context manager in which files are touched with that user's rights "
                       "(the jobs service passes its launcher's user_fs). Default: the service's own rights.")

    @default("user_fs")
    def _user_fs_default(self):
        return lambda user: contextlib.nullcontext()

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
        fs = None  # made at the first file to copy: most passes over a job's outputs copy nothing
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
                    fs = fs or self.storage.filesystem(user)
                    self._copy(fs, user, root, rel, dest)
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

    def _copy(self, fs, user: str, job_dir: Path, rel: str, dest: str) -> None:
        """Open the source with the rights of whoever wrote it (the user for outputs/), write as the user. The user's
        side goes through descriptors of the folders (accounts.reach): their parents may be closed to the user."""
        top, _, rest = rel.partition("/")
        if top in USER_FOLDERS and rest:
            with reach(job_dir / top) as via, self.user_fs(user):
                src = os.open(via / rest, os.O_RDONLY)
        else:  # the platform's own files of the job (logs, metrics): in its folders, which the job cannot change
            src = os.open(job_dir / rel, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            if self.storage.is_local:
                area = self.storage.strip(self.storage.user_url(user))
                rel = os.path.relpath(dest, area)
                with reach(area) as via, self.user_fs(user):
                    target = via / rel
                    os.makedirs(target.parent, exist_ok=True)
                    with os.fdopen(os.dup(src), "rb") as fin, open(target, "wb") as fout:
                        shutil.copyfileobj(fin, fout, 1 << 20)
            else:  # object storage: ownership is the credentials'; fsspec reads the already-opened file
                fs.put_file(f"/proc/self/fd/{src}", dest)
        finally:
            os.close(src)
