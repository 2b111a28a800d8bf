"""Packing a prefix of many small files into WebDataset-style tar shards.

``pack(src, dst)`` lists ``src`` once, groups files into samples by key (see
:mod:`trainhub.data.tario`), cuts the sorted samples into shards of about ``shard_size``
bytes, reads the source files concurrently (one batched ``fs.cat`` per chunk on async
filesystems such as s3fs, a thread pool elsewhere), and writes ``shard-000000.tar``, ...
plus ``index.json`` under ``dst``. The same input always gives the same shards.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping

from trainhub.fmt import parse_size

from .exceptions import DataError, EmptySourceError, InvalidURLError
from .progress import Progress
from .storage import full_url, is_async, join, protocol_name, url_to_fs
from .tario import split_key, write_tar

log = logging.getLogger(__name__)

INDEX_NAME = "index.json"
INDEX_FORMAT = "trainhub.shards"
INDEX_VERSION = 1
SHARD_TEMPLATE = "shard-{:06d}.tar"

def _tar_bytes(size: int) -> int:
    """Bytes a member of ``size`` bytes takes in a tar (header plus padded data)."""
    return 512 + -(-size // 512) * 512


@dataclass
class _Shard:
    name: str
    samples: list[tuple[str, dict[str, tuple[str, int]]]] = field(default_factory=list)
    est_bytes: int = 1024  # end-of-archive blocks

    @property
    def data_bytes(self) -> int:
        return sum(size for _, fields in self.samples for _, size in fields.values())


def _plan(samples, shard_size: int, samples_per_shard: int | None) -> list[_Shard]:
    shards: list[_Shard] = []
    current = None
    for key, fields in samples:
        cost = sum(_tar_bytes(size) for _, size in fields.values())
        if current is None or (current.samples and (
                current.est_bytes + cost > shard_size
                or (samples_per_shard is not None and len(current.samples) >= samples_per_shard))):
            current = _Shard(SHARD_TEMPLATE.format(len(shards)))
            shards.append(current)
        current.samples.append((key, fields))
        current.est_bytes += cost
    return shards


def _list_source(fs, path: str) -> tuple[list[tuple[str, dict[str, tuple[str, int]]]], list[str]]:
    """Samples under ``path`` sorted by key, and the relative names that were skipped."""
    try:
        found = fs.find(path, detail=True)
    except FileNotFoundError:
        found = {}
    prefix = path.rstrip("/") + "/"
    grouped: dict[str, dict[str, tuple[str, int]]] = {}
    skipped: list[str] = []
    for name, info in found.items():
        if info.get("type", "file") != "file":
            continue
        rel = name[len(prefix):] if name.startswith(prefix) else name.rsplit("/", 1)[-1]
        parts = split_key(rel)
        if parts is None:
            skipped.append(rel)
            continue
        key, ext = parts
        grouped.setdefault(key, {})[ext] = (name, int(info.get("size") or 0))
    return sorted(grouped.items()), sorted(skipped)


def _reader(fs, workers: int):
    """A function ``read(paths) -> {path: bytes}`` that reads many files concurrently."""
    if is_async(fs):
        def read(paths):
            out = fs.cat(paths, on_error="raise")
            if len(paths) == 1 and not isinstance(out, dict):
                out = {paths[0]: out}
            return out
        return read, None
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trainhub-pack-read")

    def read(paths):
        return dict(zip(paths, pool.map(fs.cat_file, paths)))
    return read, pool


def pack(
    src_url: str,
    dst_url: str,
    shard_size: int | str = "256MB",
    samples_per_shard: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    *,
    workers: int = 16,
    chunk_files: int = 128,
) -> list[str]:
    """Pack every file under ``src_url`` into tar shards under ``dst_url``.

    Parameters
    ----------
    src_url, dst_url:
        Local folders or fsspec URLs (``s3://bucket/prefix``). ``dst_url`` must not lie
        inside ``src_url``.
    shard_size:
        Target shard size, bytes or a string such as ``"256MB"`` / ``"1GiB"``. A shard is
        closed before a sample would push it past this size; a single larger sample gets a
        shard of its own.
    samples_per_shard:
        Optional cap on samples per shard (``None``: no cap).
    storage_options:
        fsspec options for both URLs (e.g. ``{"endpoint_url": ..., "key": ..., "secret": ...}``);
        ``None`` reads ``$TRAINHUB_STORAGE_OPTIONS`` for remote URLs.
    progress:
        Show a progress bar on stderr (tqdm when installed).
    workers:
        Reading threads for filesystems without an async API (local disk, ...).
    chunk_files:
        Files fetched per batched read.

    Returns the URLs of the shards written, in order. ``index.json`` next to them lists
    each shard's name, sample count and size, so readers never have to list the bucket.
    """
    shard_bytes = parse_size(shard_size)
    if samples_per_shard is not None and (isinstance(samples_per_shard, bool) or int(samples_per_shard) < 1):
        raise ValueError(f"samples_per_shard must be a positive integer or None, got {samples_per_shard!r}")
    src_fs, src_path = url_to_fs(src_url, storage_options)
    dst_fs, dst_path = url_to_fs(dst_url, storage_options)
    if protocol_name(src_fs) == protocol_name(dst_fs) and (
            dst_path == src_path or dst_path.startswith(src_path.rstrip("/") + "/")):
        raise InvalidURLError(f"destination {dst_url!r} lies inside the source {src_url!r}; pick a folder outside it")
    if src_fs.isfile(src_path):
        raise InvalidURLError(f"source {src_url!r} is a file; pass the folder or prefix that holds the samples")

    samples, skipped = _list_source(src_fs, src_path)
    if skipped:
        log.warning("pack: skipped %d file(s) without a key.extension name under %s (first: %s)",
                    len(skipped), src_url, skipped[0])
    if not samples:
        raise EmptySourceError(f"no files to pack under {src_url!r} (does the prefix exist and hold files named key.ext?)")
    shards = _plan(samples, shard_bytes, samples_per_shard)
    total_data = sum(s.data_bytes for s in shards)

    try:
        dst_fs.makedirs(dst_path, exist_ok=True)
    except Exception:  # object stores have no folders; a missing bucket surfaces on the first write
        if protocol_name(dst_fs) in ("file", "local"):
            raise
    read, read_pool = _reader(src_fs, workers)
    bar = Progress(total_data, desc=f"packing {len(samples)} samples into {len(shards)} shard(s)",
                   unit="B", enabled=progress)
    lock = threading.Lock()

    def build(shard: _Shard) -> dict:
        paths = [p for _, fields in shard.samples for p, _ in fields.values()]
        data: dict[str, bytes] = {}
        for i in range(0, len(paths), chunk_files):
            chunk = paths[i:i + chunk_files]
            try:
                data.update(read(chunk))
            except FileNotFoundError as e:
                raise DataError(f"a source file vanished while packing {src_url!r}: {e}") from e
            with lock:
                bar.update(sum(len(data[p]) for p in chunk))
        members = [(key, {ext: data[p] for ext, (p, _) in fields.items()}) for key, fields in shard.samples]
        blob = write_tar(members)
        dst_fs.pipe_file(join(dst_fs, dst_path, shard.name), blob)
        return {
            "name": shard.name,
            "samples": len(shard.samples),
            "bytes": len(blob),
            "data_bytes": sum(len(v) for v in data.values()),
            "first_key": shard.samples[0][0],
            "last_key": shard.samples[-1][0],
        }

    # Two shards in flight: one being read while the previous one is written.
    try:
        with ThreadPoolExecutor(max_workers=min(2, len(shards)), thread_name_prefix="trainhub-pack") as pool:
            entries = list(pool.map(build, shards))
    finally:
        bar.close()
        if read_pool is not None:
            read_pool.shutdown(wait=False, cancel_futures=True)

    extensions: dict[str, int] = {}
    for _, fields in samples:
        for ext in fields:
            extensions[ext] = extensions.get(ext, 0) + 1
    index = {
        "format": INDEX_FORMAT,
        "version": INDEX_VERSION,
        "source": full_url(src_fs, src_path),
        "total_samples": sum(e["samples"] for e in entries),
        "total_bytes": sum(e["bytes"] for e in entries),
        "total_data_bytes": sum(e["data_bytes"] for e in entries),
        "extensions": dict(sorted(extensions.items())),
        "skipped_files": len(skipped),
        "shards": entries,
    }
    dst_fs.pipe_file(join(dst_fs, dst_path, INDEX_NAME), (json.dumps(index, indent=1) + "\n").encode())
    dst_fs.invalidate_cache(dst_path)
    return [full_url(dst_fs, join(dst_fs, dst_path, e["name"])) for e in entries]
