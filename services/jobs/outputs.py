"""Copying a job's outputs and logs to the user's storage area while it runs and at exit.

Small files (logs, metrics, small results) go often; large ones (checkpoints) less
often, so a big checkpoint is not re-uploaded every few seconds; everything goes at
exit. Only files whose size or modification time changed are copied.

A job's ``outputs/`` and ``work/`` are the user's (their job writes there and may put anything there,
links included, and change it while the sync runs), and so is the storage area the copy lands in.
Both are touched only as :class:`~trainhub.boundary.files.UserTree` s of the user (the launcher's
``as_user``): walked through directory descriptors as the user, each file opened once, never through a
symbolic link, and written into the area as the user (atomically, by a rename in its folder). The
platform's own files of the job (logs, metrics) are walked the same way as the platform.
"""

from __future__ import annotations

import os
import time

from traitlets import Callable, Float, Integer, default
from traitlets.config import LoggingConfigurable

from trainhub.boundary.asuser import AsUser
from trainhub.boundary.files import UserTree
from trainhub.storage import StorageConfig

#: folders of a job's folder that are the job's own (outputs/; work/, $TRAINHUB_JOB_DIR of an isolated job): read with
#: the user's rights, as anything in them may be a symbolic link
USER_FOLDERS = ("outputs", "work")
#: the working directory a job was sent with, unpacked (in the job's folder, or in its work/): its code, and whatever the
#: job writes where it runs, stay on the machine; results go to outputs/ (a copy of a project in every job's area would
#: cost the user's storage for nothing)
WORKDIR = "workdir"


class OutputSyncer(LoggingConfigurable):
    small_interval = Float(10.0, help="Seconds between syncs of small files (logs, metrics, small outputs).").tag(config=True)
    large_interval = Float(120.0, help="Seconds between syncs of large files (checkpoints); all files are synced at exit.").tag(config=True)
    large_file_bytes = Integer(16 * 1024 * 1024, help="Files at least this large count as large.").tag(config=True)
    as_user = Callable(help="user -> trainhub.boundary.asuser.AsUser, how the platform acts as that user (the jobs "
                       "service passes its launcher's as_user). Default: the service's own identity.")

    @default("as_user")
    def _as_user_default(self):
        return lambda user: AsUser(user, None)

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
        if not os.path.isdir(job_dir):
            return 0
        seen = self._seen.setdefault(key, {})
        copied = 0
        me = self.as_user(user)
        with _Target(self, user, key, me) as target:
            for top, tree in _job_trees(job_dir, me):
                with tree:
                    skip = (*USER_FOLDERS, WORKDIR) if not top else (WORKDIR,) if top == "work" else ()
                    for page in tree.walk(skip=skip):
                        for e in page:
                            name = e.path.rsplit("/", 1)[-1]
                            rel = f"{top}/{e.path}" if top else e.path
                            if name.endswith((".tmp", ".wrapper.err")):
                                continue
                            sig = (e.size, e.mtime_ns)
                            if seen.get(rel) == sig:
                                continue
                            if e.size >= self.large_file_bytes and not large_due:
                                continue
                            try:
                                src = tree.open(e.path)
                            except OSError as err:  # gone, or swapped for a link since the listing: not copied
                                self.log.info("output sync of job %s skipped %s: %s", key, rel, err.strerror or err)
                                continue
                            try:
                                target.put(src, rel)
                            except Exception as err:  # storage hiccup: try again next round, never lose the local copy
                                self.log.warning("output sync of %s of job %s failed: %s", rel, key, err)
                                continue
                            finally:
                                os.close(src)
                            seen[rel] = sig
                            copied += 1
        if final:
            self._seen.pop(key, None)
            self._last_small.pop(key, None)
            self._last_large.pop(key, None)
        return copied


def _job_trees(job_dir: str, me: AsUser):
    """(prefix, tree) of a job's folder: the platform's part as the platform, outputs/ and work/ as the user."""
    yield "", UserTree(job_dir, None)
    for top in USER_FOLDERS:
        try:
            yield top, me.tree(os.path.join(job_dir, top))
        except (FileNotFoundError, NotADirectoryError):
            continue


class _Target:
    """Where the copies land: the user's local area (as the user, by descriptors) or object storage."""

    def __init__(self, syncer: OutputSyncer, user: str, key: str, me: AsUser):
        self.syncer, self.user, self.key, self.me = syncer, user, key, me
        self.tree: UserTree | None = None
        self.fs = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.tree is not None:
            self.tree.close()

    def put(self, src_fd: int, rel: str) -> None:
        storage = self.syncer.storage
        if storage.is_local:
            if self.tree is None:
                self.tree = self.me.tree(storage.strip(storage.user_url(self.user)))
            self.tree.copy_in(src_fd, f"jobs/{self.key}/{rel}")
            return
        self.fs = self.fs or storage.filesystem(self.user)  # made at the first copy: most passes copy nothing
        self.fs.put_file(f"/proc/self/fd/{src_fd}", f"{storage.strip(self.syncer.target_url(self.user, self.key))}/{rel}")
