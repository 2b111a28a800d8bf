"""Pack + read round trips, index contents, rank/worker splitting, shuffling (local and S3)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest

from trainhub.data import INDEX_NAME, ShardReader, pack, parse_size
from trainhub.data.tario import split_key


def _by_key(samples):
    out = {}
    for s in samples:
        assert s["__key__"] not in out, "sample seen twice"
        out[s["__key__"]] = {k: v for k, v in s.items() if not k.startswith("__")}
    return out


@pytest.mark.parametrize("value, expected", [
    (4096, 4096), ("4096", 4096), ("256MB", 256_000_000), ("1GiB", 2**30), ("500kb", 500_000),
    ("1.5MiB", int(1.5 * 2**20)), ("2 GB", 2 * 10**9),
])
def test_parse_size(value, expected):
    assert parse_size(value) == expected


@pytest.mark.parametrize("value", ["", "abc", "12XB", 0, -5, "-1MB", True])
def test_parse_size_rejects(value):
    with pytest.raises(ValueError):
        parse_size(value)


@pytest.mark.parametrize("name, expected", [
    ("cat001.jpg", ("cat001", "jpg")),
    ("train/cat001.seg.png", ("train/cat001", "seg.png")),
    ("a.b/c.txt", ("a.b/c", "txt")),
    ("noext", None),
    (".hidden", None),
    ("dir/", None),
])
def test_split_key(name, expected):
    assert split_key(name) == expected


def test_round_trip_local(tmp_path, make_samples):
    expected = make_samples(str(tmp_path / "src"), 50, size=3000)
    (tmp_path / "src" / "README").write_text("no extension: skipped")
    shards = pack(str(tmp_path / "src"), str(tmp_path / "out"), shard_size="20KB", progress=False)
    assert len(shards) > 3
    assert [os.path.basename(s) for s in shards] == [f"shard-{i:06d}.tar" for i in range(len(shards))]
    for s in shards:
        assert os.path.getsize(s) <= 20_000 or tarfile.open(s).getnames().__len__() == 2

    got = list(ShardReader(str(tmp_path / "out")))
    assert [s["__key__"] for s in got] == sorted(expected)  # no shuffle: stored order
    assert _by_key(got) == expected
    assert all(s["__url__"] in shards for s in got)


def test_shards_are_plain_webdataset_tars(tmp_path, make_samples):
    make_samples(str(tmp_path / "src"), 5)
    [shard] = pack(str(tmp_path / "src"), str(tmp_path / "out"), progress=False)
    with tarfile.open(shard) as tar:
        names = tar.getnames()
        assert names == [f"s{i:05d}.{ext}" for i in range(5) for ext in ("jpg", "json")]
        assert json.load(tar.extractfile("s00003.json")) == {"i": 3}


def test_pack_is_deterministic(tmp_path, make_samples):
    make_samples(str(tmp_path / "src"), 30)
    digests = []
    for out in ("a", "b"):
        shards = pack(str(tmp_path / "src"), str(tmp_path / out), shard_size="8KB", progress=False)
        digests.append([hashlib.sha256(open(s, "rb").read()).hexdigest() for s in shards])
    assert digests[0] == digests[1]
    assert (tmp_path / "a" / INDEX_NAME).read_bytes() != b""
    a = json.loads((tmp_path / "a" / INDEX_NAME).read_text())
    b = json.loads((tmp_path / "b" / INDEX_NAME).read_text())
    assert a == b


def test_index_contents(tmp_path, make_samples):
    make_samples(str(tmp_path / "src"), 23, size=500)
    shards = pack(str(tmp_path / "src"), str(tmp_path / "out"), samples_per_shard=5, progress=False)
    index = json.loads((tmp_path / "out" / INDEX_NAME).read_text())
    assert index["format"] == "trainhub.shards" and index["version"] == 1
    assert index["total_samples"] == 23
    assert [s["samples"] for s in index["shards"]] == [5, 5, 5, 5, 3]
    assert [s["name"] for s in index["shards"]] == [os.path.basename(s) for s in shards]
    assert [s["bytes"] for s in index["shards"]] == [os.path.getsize(s) for s in shards]
    assert index["total_bytes"] == sum(os.path.getsize(s) for s in shards)
    assert index["extensions"] == {"jpg": 23, "json": 23}
    assert index["shards"][0]["first_key"] == "s00000" and index["shards"][-1]["last_key"] == "s00022"
    assert index["source"] == str(tmp_path / "src")
    assert ShardReader(str(tmp_path / "out")).total_samples == 23
    # the index file itself can be given, and so can a brace pattern or a list
    assert len(list(ShardReader(str(tmp_path / "out" / INDEX_NAME)))) == 23
    assert len(list(ShardReader(str(tmp_path / "out" / "shard-{000000..000004}.tar")))) == 23
    assert len(list(ShardReader(shards[:2]))) == 10


def test_nested_keys(tmp_path):
    src = tmp_path / "src"
    for sub in ("train/cats", "train/dogs"):
        (src / sub).mkdir(parents=True)
        for i in range(3):
            (src / sub / f"{i}.txt").write_text(f"{sub}/{i}")
            (src / sub / f"{i}.cls").write_text(str(i))
    pack(str(src), str(tmp_path / "out"), progress=False)
    got = list(ShardReader(str(tmp_path / "out"), decode="basic"))
    assert [s["__key__"] for s in got] == [f"train/{a}/{i}" for a in ("cats", "dogs") for i in range(3)]
    assert got[4]["txt"] == "train/dogs/1" and got[4]["cls"] == 1


@pytest.mark.parametrize("world_size, num_workers", [(1, 1), (2, 1), (3, 2), (4, 3)])
def test_split_across_ranks_and_workers(tmp_path, make_samples, world_size, num_workers):
    expected = make_samples(str(tmp_path / "src"), 60, size=200)
    pack(str(tmp_path / "src"), str(tmp_path / "out"), samples_per_shard=4, progress=False)  # 15 shards
    seen = []
    for rank in range(world_size):
        for wid in range(num_workers):
            reader = ShardReader(str(tmp_path / "out"), rank=rank, world_size=world_size,
                                 worker_info=(wid, num_workers), shuffle_buffer=8, seed=3)
            seen.append([s["__key__"] for s in reader])
    flat = [k for part in seen for k in part]
    assert len(flat) == len(set(flat)), "parts overlap"
    assert set(flat) == set(expected), "parts do not cover the data set"


def test_rank_from_environment(tmp_path, make_samples, monkeypatch):
    make_samples(str(tmp_path / "src"), 8, size=100)
    pack(str(tmp_path / "src"), str(tmp_path / "out"), samples_per_shard=2, progress=False)  # 4 shards
    monkeypatch.setenv("WORLD_SIZE", "2")
    parts = []
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        parts.append({s["__key__"] for s in ShardReader(str(tmp_path / "out"))})
    assert parts[0].isdisjoint(parts[1]) and len(parts[0]) == len(parts[1]) == 4


def test_shuffle_is_deterministic_by_seed_and_epoch(tmp_path, make_samples):
    make_samples(str(tmp_path / "src"), 80, size=100)
    pack(str(tmp_path / "src"), str(tmp_path / "out"), samples_per_shard=10, progress=False)

    def order(seed, epoch=0, buf=20, prefetch=3):
        reader = ShardReader(str(tmp_path / "out"), shuffle_buffer=buf, seed=seed, prefetch=prefetch)
        reader.set_epoch(epoch)
        return [s["__key__"] for s in reader]

    plain = [s["__key__"] for s in ShardReader(str(tmp_path / "out"))]
    a = order(1)
    assert a == order(1) == order(1, prefetch=0)
    assert sorted(a) == sorted(plain) and a != plain
    assert order(2) != a
    assert order(1, epoch=1) != a and order(1, epoch=1) == order(1, epoch=1)


def test_decode_options(tmp_path, make_samples):
    make_samples(str(tmp_path / "src"), 3, size=10)
    pack(str(tmp_path / "src"), str(tmp_path / "out"), progress=False)
    s = next(iter(ShardReader(str(tmp_path / "out"), decode={"json": json.loads})))
    assert s["json"] == {"i": 0} and isinstance(s["jpg"], bytes)
    s = next(iter(ShardReader(str(tmp_path / "out"), decode=lambda s: {**s, "n": len(s["jpg"])})))
    assert s["n"] == 10
    import numpy as np

    src = tmp_path / "np"
    src.mkdir()
    buf = io.BytesIO()
    np.save(buf, np.arange(6).reshape(2, 3))
    (src / "a.npy").write_bytes(buf.getvalue())
    pack(str(src), str(tmp_path / "np_out"), progress=False)
    [s] = list(ShardReader(str(tmp_path / "np_out"), decode="basic"))
    assert s["npy"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_early_stop_does_not_hang(tmp_path, make_samples):
    make_samples(str(tmp_path / "src"), 40, size=100)
    pack(str(tmp_path / "src"), str(tmp_path / "out"), samples_per_shard=2, progress=False)
    it = iter(ShardReader(str(tmp_path / "out"), prefetch=4))
    assert next(it)["__key__"] == "s00000"
    it.close()


def test_progress_output(tmp_path, make_samples, capsys):
    make_samples(str(tmp_path / "src"), 3)
    pack(str(tmp_path / "src"), str(tmp_path / "out"), progress=True)
    assert "packing 3 samples" in capsys.readouterr().err


def test_round_trip_s3(tmp_path, make_samples, s3_options, s3_bucket, s3fs_fs):
    expected = make_samples(f"s3://{s3_bucket}/raw", 40, storage_options=s3_options, size=2000)
    shards = pack(f"s3://{s3_bucket}/raw", f"s3://{s3_bucket}/shards", shard_size="16KB",
                  storage_options=s3_options, progress=False)
    assert shards[0] == f"s3://{s3_bucket}/shards/shard-000000.tar" and len(shards) > 3
    index = json.loads(s3fs_fs.cat_file(f"{s3_bucket}/shards/{INDEX_NAME}"))
    assert index["total_samples"] == 40 and len(index["shards"]) == len(shards)
    assert index["source"] == f"s3://{s3_bucket}/raw"
    reader = ShardReader(f"s3://{s3_bucket}/shards", storage_options=s3_options, prefetch=3)
    assert _by_key(reader) == expected
    # local -> S3 and S3 -> local also work
    pack(f"s3://{s3_bucket}/shards", str(tmp_path / "copy"), storage_options=s3_options, progress=False)
    assert sorted(os.listdir(tmp_path / "copy")) == [INDEX_NAME, "shard-000000.tar"]


def test_s3_options_from_environment(make_samples, s3_options, s3_bucket, monkeypatch):
    make_samples(f"s3://{s3_bucket}/raw", 4, storage_options=s3_options)
    monkeypatch.setenv("TRAINHUB_STORAGE_OPTIONS", json.dumps(s3_options))
    pack(f"s3://{s3_bucket}/raw", f"s3://{s3_bucket}/sh", progress=False)
    assert len(list(ShardReader(f"s3://{s3_bucket}/sh"))) == 4


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_tar_parser_matches_tarfile(fmt):
    from trainhub.data.tario import iter_members

    names = ["a.txt", "x/" * 60 + "long.txt", "ünïcode.bin", "e.jpg", "empty.txt"]
    if fmt == tarfile.USTAR_FORMAT:
        names[1] = "x/" * 60 + "p.txt"  # ustar: long paths go through the prefix field
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for i, name in enumerate(names):
            data = bytes([i]) * (0 if name == "empty.txt" else 700 * i + 1)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        d = tarfile.TarInfo("folder")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
    blob = buf.getvalue()
    expected = [(m.name, m.offset_data, m.size) for m in tarfile.open(fileobj=io.BytesIO(blob)) if m.isfile()]
    assert list(iter_members(blob)) == expected


def test_truncated_shard(tmp_path, make_samples):
    from trainhub.data import CorruptShardError

    make_samples(str(tmp_path / "src"), 4, size=5000)
    [shard] = pack(str(tmp_path / "src"), str(tmp_path / "out"), progress=False)
    blob = open(shard, "rb").read()
    open(shard, "wb").write(blob[:9000])
    with pytest.raises(CorruptShardError, match="shard-000000.tar is truncated"):
        list(ShardReader(str(tmp_path / "out")))


def test_reader_pickles_and_repr(tmp_path, make_samples):
    import pickle

    make_samples(str(tmp_path / "src"), 4, size=10)
    pack(str(tmp_path / "src"), str(tmp_path / "out"), progress=False)
    reader = ShardReader(str(tmp_path / "out"), decode="basic", shuffle_buffer=2, seed=5)
    clone = pickle.loads(pickle.dumps(reader))
    assert [s["json"] for s in clone] == [s["json"] for s in reader]
    assert "1 shards, samples=4" in repr(reader)


def test_progress_without_tqdm(monkeypatch):
    import sys

    from trainhub.data.progress import Progress

    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    out = io.StringIO()
    with Progress(2 * 2**20, desc="packing", stream=out) as bar:
        bar.update(2**20)
        bar.update(2**20)
    assert "packing: 100.0% (2.0/2.0 MiB" in out.getvalue()
    assert out.getvalue().endswith("\n")


def test_shuffle_initial_starts_sooner_and_keeps_every_sample(tmp_path, make_samples):
    import random

    from trainhub.data.reader import _shuffled

    expected = make_samples(str(tmp_path / "src"), 30)
    pack(str(tmp_path / "src"), str(tmp_path / "out"), shard_size="4KB", progress=False)
    url = str(tmp_path / "out")

    def keys(**kw):
        return [s["__key__"] for s in ShardReader(url, shuffle_buffer=8, seed=2, **kw)]

    early = keys(shuffle_initial=2)
    assert sorted(early) == sorted(expected) and early == keys(shuffle_initial=2)
    assert early != keys()
    assert keys(shuffle_initial=8) == keys(shuffle_initial=50) == keys()  # initial >= buffer: the plain buffer
    with pytest.raises(ValueError, match="shuffle_initial"):
        ShardReader(url, shuffle_buffer=8, shuffle_initial=0)

    def first_after(initial):
        consumed = []

        def source():
            for i in range(100):
                consumed.append(i)
                yield i
        out = _shuffled(source(), 8, random.Random(0), initial)
        first = next(out)
        n = len(consumed)
        assert sorted([first, *out]) == list(range(100))
        return n

    assert first_after(None) == 9 and first_after(2) == 4


def test_default_prefetch_is_one_shard_per_dataloader_worker(tmp_path, make_samples, monkeypatch):
    """Several DataLoader workers already download in parallel: by default each keeps one shard
    ahead, a reader in one process (or a lone worker) four; an explicit prefetch is kept as given."""
    from trainhub.data import reader as reader_mod

    make_samples(str(tmp_path / "raw"), 40, size=200)
    pack(str(tmp_path / "raw"), str(tmp_path / "out"), shard_size="2KB", progress=False)
    seen = []
    real = reader_mod.ShardReader._prefetched
    monkeypatch.setattr(reader_mod.ShardReader, "_prefetched",
                        lambda self, urls, fetcher: (seen.append(self._ahead()), real(self, urls, fetcher))[1])

    def ahead(**kw):
        seen.clear()
        assert len(list(ShardReader(str(tmp_path / "out"), **kw))) > 0
        return seen[-1]

    assert ahead() == reader_mod.PREFETCH == 4
    assert ahead(worker_info=(0, 1)) == 4
    assert ahead(worker_info=(1, 3)) == reader_mod.WORKER_PREFETCH == 1
    assert ahead(worker_info=(1, 3), prefetch=3) == 3
    assert ahead(prefetch=0) == 0
    with pytest.raises(ValueError, match="prefetch must be >= 0 or None"):
        ShardReader(str(tmp_path / "out"), prefetch=-1)
