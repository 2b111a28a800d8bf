"""WebDataset-compatible tar shards: sample keys, writing and reading.

A sample is the group of files that share a *key*: the path up to the first dot of the
basename (``train/cat001.seg.png`` -> key ``train/cat001``, extension ``seg.png``), the
same rule WebDataset uses. Members of one sample are stored next to each other.
"""

from __future__ import annotations

import io
import tarfile
from typing import Iterator, Mapping

from .exceptions import CorruptShardError


def split_key(name: str) -> tuple[str, str] | None:
    """``"a/b/x.seg.png" -> ("a/b/x", "seg.png")``; ``None`` for names without a key or extension."""
    head, sep, base = name.rpartition("/")
    if not base or base.startswith("."):
        return None
    stem, dot, ext = base.partition(".")
    if not dot or not ext:
        return None
    return (head + sep + stem, ext)


def write_tar(samples: list[tuple[str, Mapping[str, bytes]]]) -> bytes:
    """Serialize ``[(key, {ext: bytes})]`` into one tar archive, byte-for-byte deterministic.

    Members get mtime 0, mode 0444 and no owner, so packing the same input twice gives the
    same shard (and the same checksum). The archive ends after the two zero end blocks,
    without tarfile's padding to a 10 KiB record, which readers do not need.
    """
    buf = io.BytesIO()
    end = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for key, fields in samples:
            for ext in sorted(fields):
                data = fields[ext]
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                info.mtime = 0
                info.mode = 0o444
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))
        end = tar.offset + 2 * tarfile.BLOCKSIZE
    return buf.getvalue()[:end]


def iter_samples(data: bytes, url: str = "") -> Iterator[dict]:
    """Yield ``{"__key__", "__url__", ext: bytes, ...}`` for each sample in a tar archive."""
    view = memoryview(data)
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:")
    except tarfile.TarError as e:
        raise CorruptShardError(f"{url or 'shard'} is not a readable tar file: {e}") from None
    current: dict | None = None
    try:
        for member in tar:
            if not member.isfile():
                continue
            parts = split_key(member.name)
            if parts is None:
                continue  # e.g. __index__ files or names without an extension, as WebDataset does
            key, ext = parts
            if current is None or current["__key__"] != key:
                if current is not None:
                    yield current
                current = {"__key__": key, "__url__": url}
            if ext in current:
                raise CorruptShardError(f"{url or 'shard'}: sample {key!r} has two {ext!r} members")
            start = member.offset_data
            if start + member.size > len(data):
                raise CorruptShardError(f"{url or 'shard'} is truncated inside member {member.name!r}")
            current[ext] = bytes(view[start:start + member.size])
    except tarfile.TarError as e:
        raise CorruptShardError(f"{url or 'shard'} is not a readable tar file: {e}") from None
    finally:
        tar.close()
    if current is not None:
        yield current
