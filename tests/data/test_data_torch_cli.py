"""PyTorch integration (skipped without torch) and the ``trainhub data`` CLI."""

from __future__ import annotations

import json

import pytest

from trainhub.data import ShardReader, pack
from trainhub.data.cli import main


def test_cli_pack_and_info(tmp_path, make_samples, capsys):
    make_samples(str(tmp_path / "src"), 12, size=100)
    rc = main(["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--samples-per-shard", "5", "--no-progress"])
    assert rc == 0
    assert "wrote 3 shard(s)" in capsys.readouterr().out
    assert main(["info", str(tmp_path / "out")]) == 0
    assert "3 shard(s), 12 samples" in capsys.readouterr().out
    assert main(["info", str(tmp_path / "out"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_samples"] == 12


def test_cli_errors(tmp_path, capsys):
    assert main(["info", str(tmp_path)]) == 2
    assert "error: no index.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["pack", "a", "b", "--storage-options", "[1]"])
    assert "must be a JSON object" in capsys.readouterr().err


def test_cli_s3(make_samples, s3_options, s3_bucket, capsys):
    make_samples(f"s3://{s3_bucket}/raw", 4, storage_options=s3_options)
    rc = main(["pack", f"s3://{s3_bucket}/raw", f"s3://{s3_bucket}/sh", "--no-progress",
               "--storage-options", json.dumps(s3_options)])
    assert rc == 0
    capsys.readouterr()
    assert main(["info", f"s3://{s3_bucket}/sh", "--storage-options", json.dumps(s3_options)]) == 0
    assert "4 samples" in capsys.readouterr().out


@pytest.fixture
def packed(tmp_path, make_samples):
    expected = make_samples(str(tmp_path / "src"), 40, size=100)
    pack(str(tmp_path / "src"), str(tmp_path / "out"), samples_per_shard=5, progress=False)  # 8 shards
    return str(tmp_path / "out"), expected


def test_torch_dataloader_workers(packed):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, IterableDataset

    from trainhub.data import TorchShardDataset

    url, expected = packed
    ds = TorchShardDataset(url, shuffle_buffer=4, seed=1)
    assert isinstance(ds, IterableDataset)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    keys = [s["__key__"] for s in loader]
    assert sorted(keys) == sorted(expected) and len(keys) == len(set(keys))

    as_torch = ShardReader(url, shuffle_buffer=4, seed=1).as_torch()
    assert isinstance(as_torch, torch.utils.data.IterableDataset)
    assert [s["__key__"] for s in as_torch] == [s["__key__"] for s in ShardReader(url, shuffle_buffer=4, seed=1)]


def test_torch_distributed_env_split(packed, monkeypatch):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from trainhub.data import TorchShardDataset

    url, expected = packed
    monkeypatch.setenv("WORLD_SIZE", "2")
    seen = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        loader = DataLoader(TorchShardDataset(url), batch_size=None, num_workers=2, multiprocessing_context="fork")
        seen.append({s["__key__"] for s in loader})
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == set(expected)


def test_works_without_torch(tmp_path, make_samples):
    """With torch unimportable, the reader works and TorchShardDataset says what is missing."""
    import subprocess
    import sys

    make_samples(str(tmp_path / "src"), 3, size=10)
    pack(str(tmp_path / "src"), str(tmp_path / "out"), progress=False)
    code = f"""
import sys
sys.modules["torch"] = None  # makes `import torch` raise ImportError
import trainhub.data as d
assert len(list(d.ShardReader({str(tmp_path / "out")!r}))) == 3
try:
    d.TorchShardDataset
except ImportError as e:
    assert "needs PyTorch" in str(e), e
else:
    raise SystemExit("TorchShardDataset imported without torch")
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
