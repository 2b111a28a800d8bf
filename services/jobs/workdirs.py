"""Where the jobs service keeps the working directories sent with jobs (trainhub.workdir archives).

``PUT /workdirs/{sha256}`` streams an archive into ``<jobs_dir>/.workdirs/<user>/<sha256>.tar.gz`` (the
platform's folder, 0700; ``<user>`` is a hash of the name): written piece by piece as it arrives, hashed on the
way, never held whole; past the limits it is dropped and refused. A finished upload must hash to its name and
pass :func:`trainhub.workdir.check_archive` (read as a stream, as the unpacking will) before it is moved into
place; a job spec then names it (``"workdir": "<sha256>"``) and the launcher unpacks it for the job. An archive
is one user's: another's job cannot name it. Archives no job that is still to run names are removed after
``keep`` seconds (at the user's next upload).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from trainhub.exceptions import InvalidRequest, TooLarge
from trainhub.workdir import SHA256, Limits, WorkdirError, check_archive, size_text

FOLDER = ".workdirs"


def user_folder(user: str) -> str:
    """The folder name of ``user``'s archives: a hash (any user name is one safe path component)."""
    return "u-" + hashlib.sha256(user.encode()).hexdigest()[:32]


@dataclass
class ArchiveInfo:
    sha256: str
    size: int  # bytes of the archive
    files: int = 0
    bytes: int = 0  # of the files, unpacked
    entries: int = 0

    def to_dict(self) -> dict:
        return {"sha256": self.sha256, "size": self.size, "files": self.files, "bytes": self.bytes,
                "entries": self.entries}


class Upload:
    """One archive arriving: a temporary file in the user's folder, hashed and counted as pieces are written."""

    def __init__(self, store: "WorkdirStore", user: str, sha256: str):
        self.store, self.user, self.sha256 = store, user, sha256
        folder = store.folder(user, create=True)
        self.tmp = folder / f".{sha256}.{os.getpid()}.{os.urandom(4).hex()}.part"
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.hash = hashlib.sha256()
        self.size = 0
        self.too_big = False

    def write(self, chunk: bytes) -> None:
        """Blocking: call on a worker thread. Past the limit the rest is dropped (the caller answers 413)."""
        if self.too_big or self.fd < 0:
            return
        self.size += len(chunk)
        if self.size > self.store.limits.archive_bytes:
            self.too_big = True
            self.discard()
            return
        self.hash.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(self.fd, view):]

    def discard(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass

    def finish(self) -> ArchiveInfo:
        """Blocking. Check what arrived and move it into place; raises the API's errors (the upload is discarded)."""
        try:
            if self.too_big:
                raise TooLarge(f"the working directory archive is larger than {size_text(self.store.limits.archive_bytes)}; "
                               f"the jobs service takes at most {size_text(self.store.limits.max_bytes)} of files: leave "
                               "out what the job does not need (.trainhubignore, --exclude)")
            if self.fd < 0:
                raise InvalidRequest("the upload was interrupted")
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
            if self.hash.hexdigest() != self.sha256:
                raise InvalidRequest(f"the archive's SHA-256 is {self.hash.hexdigest()}, not {self.sha256} as the path says")
            with open(self.tmp, "rb") as f:
                try:
                    got = check_archive(f, self.store.limits)
                except WorkdirError as e:
                    raise InvalidRequest(str(e)) from None
            info = ArchiveInfo(self.sha256, self.size, got.files, got.bytes, got.entries)
            meta = self.store.path(self.user, self.sha256).with_suffix("").with_suffix(".json")
            meta.write_text(json.dumps(info.to_dict()))
            os.rename(self.tmp, self.store.path(self.user, self.sha256))
            return info
        finally:
            self.discard()


class WorkdirStore:
    """The archives of every user, under ``root`` (the jobs folder's ``.workdirs``)."""

    def __init__(self, root: str | os.PathLike, limits: Limits = Limits(), keep: float = 86400.0):
        self.root, self.limits, self.keep = Path(root), limits, keep

    def folder(self, user: str, create: bool = False) -> Path:
        folder = self.root / user_folder(user)
        if create:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            folder.mkdir(mode=0o700, exist_ok=True)
        return folder

    def path(self, user: str, sha256: str) -> Path:
        if not SHA256.match(sha256 or ""):
            raise InvalidRequest(f"a working directory is named by the SHA-256 of its archive (64 hex digits), not {sha256!r}")
        return self.folder(user) / f"{sha256}.tar.gz"

    def exists(self, user: str, sha256: str) -> bool:
        return self.path(user, sha256).is_file()

    def info(self, user: str, sha256: str) -> ArchiveInfo | None:
        """What was found in a stored archive when it arrived (None: not stored)."""
        path = self.path(user, sha256)
        try:
            st = os.stat(path)
            known = json.loads((self.folder(user) / f"{sha256}.json").read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            known = {}
        return ArchiveInfo(sha256, st.st_size, int(known.get("files", 0)), int(known.get("bytes", 0)),
                           int(known.get("entries", 0)))

    def touch(self, user: str, sha256: str) -> None:
        """A job names it now: its clock for :meth:`prune` starts again."""
        try:
            os.utime(self.path(user, sha256))
        except FileNotFoundError:
            pass

    def receive(self, user: str, sha256: str) -> Upload:
        self.path(user, sha256)  # checks the name
        return Upload(self, user, sha256)

    def prune(self, user: str, keep: set[str], now: float | None = None) -> list[str]:
        """Remove ``user``'s archives untouched for :attr:`keep` seconds that no job still to run names (``keep``:
        the names such jobs use), and leftovers of interrupted uploads; returns the names removed."""
        now = time.time() if now is None else now
        removed = []
        folder = self.folder(user)
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return removed
        for entry in entries:
            name = entry.name
            sha = name.removesuffix(".tar.gz")
            try:
                old = now - entry.stat(follow_symlinks=False).st_mtime > self.keep
            except FileNotFoundError:
                continue
            if old and (name.endswith(".part") or (name.endswith(".tar.gz") and sha not in keep)):
                for path in (entry.path, os.path.join(folder, f"{sha}.json")):
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
                removed.append(name)
        return removed
