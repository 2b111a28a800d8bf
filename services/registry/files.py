"""File work of the registries (blocking; always called on a worker thread).

- :func:`scan` walks a prefix page by page, reporting progress, and returns size, count
  and a fingerprint of the listing (names, sizes, ETags or mtimes).
- :func:`copy_tree` copies a job's outputs into the immutable model area
  (server-side copies on S3) and writes ``MANIFEST.json`` beside them.
- :func:`write_bundle` streams a model version as a tar.gz bundle a serving system can load.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from typing import Callable

from fsspec.asyn import sync

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
    else:
        if not fs.exists(path):
            return
        for root, dirs, files in fs.walk(path, detail=True):
            # symbolic links are not followed: a link inside a registered folder must not carry in
            # files from elsewhere (another user's area, the platform's secrets)
            for name in [n for n, info in dirs.items() if info.get("islink")]:
                del dirs[name]
            page = []
            for name, info in files.items():
                if info.get("islink"):
                    continue
                full = info.get("name") or f"{root}/{name}"
                rel = full[len(path):].lstrip("/")
                page.append((rel, int(info.get("size") or 0), str(info.get("mtime") or info.get("ETag") or "")))
            if page:
                yield page


def scan(fs, path: str, progress: Callable[[int, int], None] | None = None) -> dict:
    """Size, file count and fingerprint of everything under ``path``."""
    entries = []
    size = 0
    last = 0.0
    for page in iter_files(fs, path):
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


def copy_tree(fs, src: str, dst: str, manifest: dict) -> tuple[list[dict], int]:
    """Copy every file under ``src`` to ``dst/files/``; write ``dst/MANIFEST.json``.

    Counted first (listing only), so a folder of more than :data:`MAX_MODEL_FILES` files is refused
    before anything is copied."""
    src, dst = src.rstrip("/"), dst.rstrip("/")
    count = 0
    for page in iter_files(fs, src):
        count += len(page)
        if count > MAX_MODEL_FILES:
            raise TooManyFiles(f"{src} holds more than {MAX_MODEL_FILES} files; a model version holds at most "
                               f"{MAX_MODEL_FILES} (pack them, e.g. into a tar or safetensors shards, or register "
                               "the folder as a dataset)")
    files = []
    for page in iter_files(fs, src):
        for rel, size, _tag in page:
            target = f"{dst}/files/{rel}"
            if not _is_s3(fs):
                fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            fs.copy(f"{src}/{rel}", target)
            files.append({"path": rel, "size": size})
    if not files:
        raise FileNotFoundError(f"no files under {src}")
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
