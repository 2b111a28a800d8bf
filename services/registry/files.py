"""File work of the registries (blocking; always called on a worker thread).

A registration reads a folder that a user controls. On the local storage it is read as a
:class:`~trainhub.boundary.files.UserTree` (:class:`TreeSource`): as that user, one folder after the
other through the descriptors of their parents, never following a link, opening each file once and
copying from that open file, so nothing the user swaps in between the listing and the copy can carry
another user's or the platform's files into a model. On S3 (:class:`FsSource`) there are no links and
a key is read with the platform's key, under the caller's own prefix (checked before).

- :func:`scan` walks a source page by page, reporting progress, and returns size, count
  and a fingerprint of the listing (names, sizes, ETags or mtimes).
- :func:`copy_tree` copies a source into the immutable model area
  (server-side copies on S3) and writes ``MANIFEST.json`` beside them.
- :func:`write_bundle` streams a model version as a tar.gz bundle a serving system can load.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import tarfile
import time
from typing import Callable

from fsspec.asyn import sync

from trainhub.boundary.files import UserTree

BUNDLE_FORMAT = "trainhub-model-bundle/1"


def _is_s3(fs) -> bool:
    try:
        import s3fs
    except ImportError:
        return False
    return isinstance(fs, s3fs.S3FileSystem)


def iter_files(fs, path: str):
    """Yield pages (lists) of ``(relative name, size, tag)`` for every file under ``path``."""
    path = path.rstrip("/")
    if _is_s3(fs):
        bucket, key, _ = fs.split_path(path)
        prefix = key + "/" if key else ""
        token = None
        while True:
            kw = dict(Bucket=bucket, Prefix=prefix, MaxKeys=1000)
            if token:
                kw["ContinuationToken"] = token
            resp = sync(fs.loop, fs._call_s3, "list_objects_v2", **kw, **fs.req_kw)
            page = [(c["Key"][len(prefix):], int(c.get("Size", 0)), str(c.get("ETag", "")))
                    for c in resp.get("Contents", []) if c["Key"] != prefix and not c["Key"].endswith("/")]
            if page:
                yield page
            if not resp.get("IsTruncated"):
                return
            token = resp.get("NextContinuationToken")
    else:  # a local folder is a user's tree: read it through TreeSource, never walked by path as the platform
        raise TypeError(f"{type(fs).__name__} is not object storage: read local folders with TreeSource")


class FsSource:
    """Files under ``path`` of an fsspec filesystem (S3: no links; read with the platform's key)."""

    def __init__(self, fs, path: str):
        self.fs, self.path = fs, path.rstrip("/")

    def pages(self):
        return iter_files(self.fs, self.path)

    def copy_file(self, rel: str, size: int, dst_fs, target: str, budget: int) -> int:
        """Copy one listed file; returns its size."""
        if type(dst_fs) is type(self.fs):
            if size > budget:
                raise TooLarge(_too_large(self, budget))
            self.fs.copy(f"{self.path}/{rel}", target)  # server-side on S3: an object does not grow
            return size
        with self.fs.open(f"{self.path}/{rel}", "rb") as src, dst_fs.open(target, "wb") as out:
            return _copy_stream(src, out, budget)

    def __str__(self):
        return self.path


class TreeSource:
    """Files under ``rel`` of a local folder, read as its owner through descriptors (trainhub.boundary.files)."""

    def __init__(self, tree: UserTree, rel: str = ""):
        self.tree, self.rel = tree, rel.strip("/")

    def pages(self):
        for page in self.tree.walk(self.rel):
            yield [(e.path, e.size, str(e.mtime_ns)) for e in page]

    def copy_file(self, rel: str, size: int, dst_fs, target: str, budget: int) -> int:
        """Copy one listed file from the descriptor it is opened with (as the owner); returns the bytes copied."""
        fd = self.tree.open(f"{self.rel}/{rel}" if self.rel else rel)
        with open(fd, "rb") as src:
            if not _is_s3(dst_fs):
                dst_fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            with dst_fs.open(target, "wb") as out:
                return _copy_stream(src, out, budget)

    def __str__(self):
        return os.path.join(self.tree.root, self.rel)


def _copy_stream(src, out, budget: int) -> int:
    total = 0
    while True:
        chunk = src.read(1 << 20)
        if not chunk:
            return total
        total += len(chunk)
        if total > budget:
            raise TooLarge(_too_large(getattr(src, "name", "the source"), budget, growing=True))
        out.write(chunk)


def _too_large(source, limit: int, growing: bool = False) -> str:
    what = "grew past" if growing else "holds more than"
    return (f"{source} {what} {limit / (1 << 30):.1f} GiB; a model version holds at most that much "
            "(Registry.max_model_bytes): register a smaller folder, or the data as a dataset")


def scan(source, progress: Callable[[int, int], None] | None = None) -> dict:
    """Size, file count and fingerprint of everything in ``source`` (FsSource or TreeSource)."""
    entries = []
    size = 0
    last = 0.0
    for page in source.pages():
        entries.extend(page)
        size += sum(e[1] for e in page)
        now = time.monotonic()
        if progress and now - last > 0.2:
            progress(len(entries), size)
            last = now
    entries.sort()
    h = hashlib.sha256()
    for name, sz, tag in entries:
        h.update(f"{name}\0{sz}\0{tag}\n".encode())
    if progress:
        progress(len(entries), size)
    return {"size": size, "file_count": len(entries), "fingerprint": h.hexdigest()}


MAX_MODEL_FILES = 10_000  # a model version's file list lives in its row and in every answer about it


class TooManyFiles(ValueError):
    pass


DEFAULT_MAX_MODEL_BYTES = 200 << 30  # Registry.max_model_bytes


class TooLarge(ValueError):
    """A model version larger than the registry takes (counted by listing, and again while copying: a file that
    keeps growing while it is copied cannot make the copy endless)."""


class SourceChanged(ValueError):
    """A listed file became a link, a folder or a special file before it was copied (links are never followed)."""


def copy_tree(source, fs, dst: str, manifest: dict, max_bytes: int = DEFAULT_MAX_MODEL_BYTES) -> tuple[list[dict], int]:
    """Copy every file of ``source`` to ``dst/files/`` of ``fs`` (the platform's model area); write
    ``dst/MANIFEST.json``.

    Counted first (listing only), so a folder of more than :data:`MAX_MODEL_FILES` files is refused
    before anything is copied. Each file is copied from the one descriptor it was opened with; a file
    that changed or vanished since the listing is recorded with the size actually copied."""
    dst = dst.rstrip("/")
    count = listed = 0
    for page in source.pages():
        count += len(page)
        listed += sum(size for _rel, size, _tag in page)
        if listed > max_bytes:
            raise TooLarge(_too_large(source, max_bytes))
        if count > MAX_MODEL_FILES:
            raise TooManyFiles(f"{source} holds more than {MAX_MODEL_FILES} files; a model version holds at most "
                               f"{MAX_MODEL_FILES} (pack them, e.g. into a tar or safetensors shards, or register "
                               "the folder as a dataset)")
    files = []
    budget = max_bytes
    for page in source.pages():
        for rel, size, _tag in page:
            target = f"{dst}/files/{rel}"
            try:
                copied = source.copy_file(rel, size, fs, target, budget)
            except FileNotFoundError:
                continue  # gone since the listing
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.EINVAL, errno.EXDEV):
                    raise SourceChanged(f"{rel} in {source} changed while it was copied (it is now a symbolic link, a "
                                        "folder or a special file; links are never followed): register it again once "
                                        "nothing writes there") from None
                raise
            files.append({"path": rel, "size": int(copied)})
            budget -= copied
    if not files:
        raise FileNotFoundError(f"no files under {source}")
    files.sort(key=lambda f: f["path"])
    total = sum(f["size"] for f in files)
    doc = dict(manifest, files=files, size=total)
    fs.pipe(f"{dst}/MANIFEST.json", json.dumps(doc, indent=2).encode())
    return files, total


def manifest_for(version: dict) -> dict:
    """The bundle's MANIFEST.json: everything a serving system needs to load the version."""
    return {
        "format": BUNDLE_FORMAT,
        "name": version["name"], "version": version["version"], "stage": version.get("stage", "none"),
        "created": version.get("created"), "created_by": version.get("created_by"),
        "description": version.get("description", ""),
        "metrics": version.get("metrics", {}), "params": version.get("params", {}),
        "lineage": version.get("lineage", {}),
        "files_dir": "files/",
        "files": version.get("files", []),
        "size": version.get("size", 0),
    }


def write_bundle(fs, version: dict, out) -> None:
    """Write ``MANIFEST.json``, ``metadata.json`` and ``files/...`` as a tar.gz to file object ``out``."""
    base = version["url"]
    base = fs._strip_protocol(base).rstrip("/")
    manifest = manifest_for(version)
    digests = []
    with tarfile.open(fileobj=out, mode="w|gz") as tar:
        for f in version.get("files", []):
            with fs.open(f"{base}/files/{f['path']}", "rb") as src:
                reader = _HashingReader(src)
                info = tarfile.TarInfo(f"files/{f['path']}")
                info.size, info.mtime, info.mode = int(f["size"]), int(time.time()), 0o644
                tar.addfile(info, reader)
            digests.append(dict(f, sha256=reader.hash.hexdigest()))
        manifest["files"] = digests
        _add(tar, "metadata.json", json.dumps(version, indent=2).encode())
        _add(tar, "MANIFEST.json", json.dumps(manifest, indent=2).encode())


class _HashingReader:
    def __init__(self, f):
        self.f, self.hash = f, hashlib.sha256()

    def read(self, n=-1):
        data = self.f.read(n)
        self.hash.update(data)
        return data


def _add(tar, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))
