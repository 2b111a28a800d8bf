"""``list_page``: paging through big folders on S3 and local disk."""

from __future__ import annotations

import uuid

import pytest

from trainhub.data import list_page


def _walk(fs, path, limit):
    names, after, pages = [], None, 0
    while True:
        page = list_page(fs, path, limit=limit, after=after)
        names += [e["name"] for e in page.entries]
        pages += 1
        if page.next_after is None:
            return names, pages
        after = page.next_after


@pytest.fixture(scope="module")
def s3_tree(s3_options):
    """One bucket with 250 files, 4 folders and an awkward name, shared by this module."""
    import s3fs

    fs = s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True, **s3_options)
    bucket = "listing-" + uuid.uuid4().hex[:8]
    fs.mkdir(bucket)
    blobs = {f"{bucket}/data/f{i:04d}.bin": b"x" * i for i in range(250)}
    for d in ("a", "m", "z", "f0100"):
        blobs[f"{bucket}/data/{d}/inner{d}.bin"] = b"y"
    blobs[f"{bucket}/data/f0100.bin.extra"] = b"z"
    fs.pipe(blobs)
    return f"{bucket}/data"


@pytest.mark.parametrize("limit", [3, 7, 100, 1000, 2500])
def test_s3_pages_match_ls(s3fs_fs, s3_tree, limit):
    expected = sorted(s3fs_fs.ls(s3_tree, refresh=True))
    names, pages = _walk(s3fs_fs, s3_tree, limit)
    assert len(names) == len(set(names)) == len(expected), "duplicates or missing entries"
    assert sorted(names) == expected
    assert pages == -(-len(expected) // limit) or pages == -(-len(expected) // limit) + 1


def test_s3_entries(s3fs_fs, s3_tree):
    page = list_page(s3fs_fs, "s3://" + s3_tree, limit=3)
    assert [e["name"].rsplit("/", 1)[1] for e in page] == ["a", "f0000.bin", "f0001.bin"]
    assert page.entries[0]["type"] == "directory"
    assert page.entries[2]["type"] == "file" and page.entries[2]["size"] == 1
    assert page.next_after == f"{s3_tree}/f0001.bin"
    # a relative cursor works too
    nxt = list_page(s3fs_fs, s3_tree, limit=1, after="f0001.bin")
    assert nxt.entries[0]["name"] == f"{s3_tree}/f0002.bin"
    # folders are skipped as a whole
    nxt = list_page(s3fs_fs, s3_tree, limit=1, after="f0100/")
    assert nxt.entries[0]["name"] == f"{s3_tree}/f0101.bin"


def test_s3_missing_and_bucket_root(s3fs_fs, s3_tree):
    bucket = s3_tree.split("/")[0]
    assert list_page(s3fs_fs, f"{bucket}/nope").entries == []
    root = list_page(s3fs_fs, bucket)
    assert [e["name"] for e in root] == [s3_tree] and root.next_after is None


def test_local_pages(tmp_path):
    import fsspec

    fs = fsspec.filesystem("file")
    for i in range(23):
        (tmp_path / f"f{i:02d}.txt").write_text("x")
    (tmp_path / "sub").mkdir()
    names, pages = _walk(fs, str(tmp_path), 5)
    assert sorted(names) == sorted(fs.ls(str(tmp_path)))
    assert pages == 5 and len(names) == 24
    assert list_page(fs, str(tmp_path / "missing")).entries == []


def test_limit_validation(s3fs_fs):
    with pytest.raises(ValueError, match="limit"):
        list_page(s3fs_fs, "bucket", limit=0)
