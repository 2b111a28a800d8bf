"""Error messages: what the user sees when a URL, an index or a shard is wrong."""

from __future__ import annotations

import json

import pytest

from trainhub.data import (
    CorruptShardError,
    DataError,
    EmptySourceError,
    IndexNotFoundError,
    InvalidURLError,
    ShardNotFoundError,
    ShardReader,
    pack,
)


def test_missing_index_says_how_to_fix(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(IndexNotFoundError, match=r"no index\.json at .*empty.*pack the data first"):
        ShardReader(str(tmp_path / "empty"))


def test_missing_index_on_s3(s3_options, s3_bucket):
    with pytest.raises(IndexNotFoundError, match=rf"s3://{s3_bucket}/nothing/index\.json"):
        ShardReader(f"s3://{s3_bucket}/nothing", storage_options=s3_options)


def test_missing_shard_names_the_url(tmp_path, make_samples):
    make_samples(str(tmp_path / "src"), 6, size=100)
    shards = pack(str(tmp_path / "src"), str(tmp_path / "out"), samples_per_shard=2, progress=False)
    (tmp_path / "out" / "shard-000001.tar").unlink()
    reader = ShardReader(str(tmp_path / "out"))
    with pytest.raises(ShardNotFoundError, match="shard-000001.tar does not exist"):
        list(reader)
    with pytest.raises(ShardNotFoundError):
        list(ShardReader([shards[1]]))


def test_corrupt_shard_and_index(tmp_path, make_samples):
    make_samples(str(tmp_path / "src"), 2, size=100)
    pack(str(tmp_path / "src"), str(tmp_path / "out"), progress=False)
    (tmp_path / "out" / "shard-000000.tar").write_bytes(b"not a tar" * 100)
    with pytest.raises(CorruptShardError, match="shard-000000.tar is not a readable tar"):
        list(ShardReader(str(tmp_path / "out")))
    (tmp_path / "out" / "index.json").write_text("{oops")
    with pytest.raises(CorruptShardError, match="not valid JSON"):
        ShardReader(str(tmp_path / "out"))
    (tmp_path / "out" / "index.json").write_text(json.dumps({"shards": []}))
    with pytest.raises(CorruptShardError, match="not a trainhub shard index"):
        ShardReader(str(tmp_path / "out"))


@pytest.mark.parametrize("url, match", [
    ("nosuchproto://bucket/x", "Protocol not known"),
    ("", "empty URL"),
    (42, "expected a URL"),
])
def test_bad_urls(url, match):
    with pytest.raises(InvalidURLError, match=match):
        ShardReader(url)


def test_bad_list_entries():
    with pytest.raises(InvalidURLError, match="bad shard URL"):
        ShardReader(["a.tar", ""])
    with pytest.raises(DataError, match="no shards"):
        ShardReader([])


def test_bad_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINHUB_STORAGE_OPTIONS", "{not json")
    with pytest.raises(InvalidURLError, match="TRAINHUB_STORAGE_OPTIONS is not valid JSON"):
        ShardReader("s3://bucket/x")
    monkeypatch.setenv("TRAINHUB_STORAGE_OPTIONS", "[1]")
    with pytest.raises(InvalidURLError, match="must be a JSON object"):
        ShardReader("s3://bucket/x")


def test_bad_rank(tmp_path, make_samples, monkeypatch):
    make_samples(str(tmp_path / "src"), 2, size=10)
    pack(str(tmp_path / "src"), str(tmp_path / "out"), progress=False)
    with pytest.raises(DataError, match="invalid rank 2 for world size 2"):
        list(ShardReader(str(tmp_path / "out"), rank=2, world_size=2))
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(DataError, match=r"\$RANK must be an integer"):
        list(ShardReader(str(tmp_path / "out")))


def test_pack_errors(tmp_path, make_samples):
    (tmp_path / "empty").mkdir()
    with pytest.raises(EmptySourceError, match="no files to pack"):
        pack(str(tmp_path / "empty"), str(tmp_path / "out"), progress=False)
    with pytest.raises(EmptySourceError):
        pack(str(tmp_path / "missing"), str(tmp_path / "out"), progress=False)
    make_samples(str(tmp_path / "src"), 2, size=10)
    with pytest.raises(InvalidURLError, match="lies inside the source"):
        pack(str(tmp_path / "src"), str(tmp_path / "src" / "shards"), progress=False)
    with pytest.raises(InvalidURLError, match="is a file"):
        pack(str(tmp_path / "src" / "s00000.jpg"), str(tmp_path / "out"), progress=False)
    with pytest.raises(ValueError, match="invalid size"):
        pack(str(tmp_path / "src"), str(tmp_path / "out"), shard_size="big", progress=False)
    with pytest.raises(ValueError, match="samples_per_shard"):
        pack(str(tmp_path / "src"), str(tmp_path / "out"), samples_per_shard=0, progress=False)


def test_reader_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="shuffle_buffer"):
        ShardReader(["a.tar"], shuffle_buffer=-1)
    with pytest.raises(ValueError, match="decode"):
        ShardReader(["a.tar"], decode=3)
