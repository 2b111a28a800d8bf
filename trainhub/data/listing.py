"""Paged folder listings for the storage browser.

``list_page(fs, path, limit, after)`` returns one page of a folder's direct children in
key order, and a cursor for the next page. On S3 it is a single ``ListObjectsV2`` call per
1,000 entries with ``StartAfter``: page 50 of a 100,000-object prefix costs the same as
page 1, and nothing is listed recursively. Other filesystems list the folder once (fsspec's
listings cache applies when the filesystem has one) and slice the sorted result.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from fsspec.asyn import sync

S3_MAX_KEYS = 1000
_AFTER_EVERYTHING = "\U0010ffff"  # sorts after any key under a prefix


@dataclass
class ListPage:
    """One page: ``entries`` are fsspec-style info dicts (``name``, ``size``, ``type``...).

    ``next_after`` is the cursor for the next page (the last entry's name, with a trailing
    ``/`` for folders), or ``None`` on the last page.
    """

    entries: list[dict] = field(default_factory=list)
    next_after: str | None = None

    def __iter__(self):
        return iter(self.entries)

    def __len__(self):
        return len(self.entries)


def _sort_key(entry: dict) -> str:
    name = entry["name"].rstrip("/")
    return name + "/" if entry.get("type") == "directory" else name


def _is_s3(fs) -> bool:
    try:
        import s3fs
    except ImportError:
        return False
    return isinstance(fs, s3fs.S3FileSystem) and not getattr(fs, "version_aware", False)


def list_page(fs, path: str, limit: int = 1000, after: str | None = None) -> ListPage:
    """List at most ``limit`` direct children of ``path`` whose names sort after ``after``.

    ``after`` is a previous page's ``next_after`` (a full name such as
    ``bucket/prefix/file.jpg``, or a name relative to ``path``). Entries come in byte order
    of their keys, folders carrying a trailing-slash sort key as S3 does. A missing folder
    gives an empty first page.
    """
    if isinstance(limit, bool) or int(limit) < 1:
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    limit = int(limit)
    path = fs._strip_protocol(path).rstrip("/")
    if after:
        after = fs._strip_protocol(after) if "://" in after else after
        if path and not after.startswith(path + "/"):
            after = f"{path}/{after.lstrip('/')}"
    if _is_s3(fs) and path:
        return _list_page_s3(fs, path, limit, after)
    return _list_page_generic(fs, path, limit, after)


def _list_page_generic(fs, path: str, limit: int, after: str | None) -> ListPage:
    try:
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        return ListPage()
    entries = sorted(entries, key=_sort_key)
    keys = [_sort_key(e) for e in entries]
    start = bisect.bisect_right(keys, after) if after else 0
    page = entries[start:start + limit]
    more = start + limit < len(entries)
    return ListPage(page, _sort_key(page[-1]) if page and more else None)


def _list_page_s3(fs, path: str, limit: int, after: str | None) -> ListPage:
    bucket, key, _ = fs.split_path(path)
    prefix = key + "/" if key else ""
    start_after = None
    if after:
        _, start_after, _ = fs.split_path(after.rstrip("/"))
        if after.endswith("/"):
            start_after += "/" + _AFTER_EVERYTHING
    entries: list[dict] = []
    truncated = True
    while truncated and len(entries) < limit:
        kwargs = dict(Bucket=bucket, Prefix=prefix, Delimiter="/", MaxKeys=min(S3_MAX_KEYS, limit - len(entries)))
        if start_after:
            kwargs["StartAfter"] = start_after
        resp = sync(fs.loop, fs._call_s3, "list_objects_v2", **kwargs, **fs.req_kw)
        page = []
        for p in resp.get("CommonPrefixes", []):
            page.append({"name": f"{bucket}/{p['Prefix'].rstrip('/')}", "size": 0, "type": "directory",
                         "StorageClass": "DIRECTORY", "_key": p["Prefix"]})
        for c in resp.get("Contents", []):
            if c["Key"] == prefix:  # the folder's own marker object
                continue
            page.append({"name": f"{bucket}/{c['Key']}", "size": c.get("Size", 0), "type": "file",
                         "LastModified": c.get("LastModified"), "ETag": c.get("ETag"),
                         "StorageClass": c.get("StorageClass", "STANDARD"), "_key": c["Key"]})
        page.sort(key=lambda e: e["_key"])
        truncated = bool(resp.get("IsTruncated"))
        if not page:
            break
        entries.extend(page)
        last = page[-1]["_key"]
        start_after = last + _AFTER_EVERYTHING if last.endswith("/") else last
    more = truncated or len(entries) > limit
    entries = entries[:limit]
    for e in entries:
        del e["_key"]
    return ListPage(entries, _sort_key(entries[-1]) if entries and more else None)
