"""`trainhub datasets` and `trainhub models` against the in-process registry."""

from __future__ import annotations

import argparse
import json
import tarfile

import pytest

from trainhub.cli import CommandError
from trainhub.commands import datasets, models


def run(registry, *argv, user="alice"):
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command")
    datasets.add_parser(sub)
    models.add_parser(sub)
    args = p.parse_args([*argv, "--url", registry.url, "--token", user])
    return args.func(args)


# the CLI is storage-agnostic: one backend is enough
pytestmark = pytest.mark.parametrize("registry", ["local"], indirect=True)


def test_datasets_cli(registry, capsys):
    registry.storage_write("datasets/text/a.txt", b"abc")
    assert run(registry, "datasets", "register", "corpus", "datasets/text", "--format", "text", "--meta", "lang=en") == 0
    assert "registered corpus v1" in capsys.readouterr().out
    run(registry, "datasets", "list", "--search", "corp")
    out = capsys.readouterr().out
    assert "corpus" in out and "v1" in out and "alice" in out
    run(registry, "datasets", "show", "corpus", "1", "--json")
    v = json.loads(capsys.readouterr().out)
    assert v["metadata"] == {"lang": "en"} and v["file_count"] == 1
    with pytest.raises(CommandError, match="only the owner"):
        run(registry, "datasets", "deprecate", "corpus", "1", user="bob")
    run(registry, "datasets", "deprecate", "corpus", "1", "--message", "old")
    assert "deprecated corpus v1" in capsys.readouterr().out


def test_models_cli(registry, capsys, tmp_path):
    job = registry.finished_job("alice", metrics=[{"acc": 0.7}])
    assert run(registry, "models", "register", "net", "--job", job.key, "--metric", "f1=0.5") == 0
    assert "registered net v1" in capsys.readouterr().out
    run(registry, "models", "stage", "net", "1", "staging", "--comment", "ok")
    assert "net v1 is now staging" in capsys.readouterr().out
    run(registry, "models", "show", "net", "staging")
    out = capsys.readouterr().out
    assert "acc=0.7" in out and "f1=0.5" in out and "alice: none -> staging  ok" in out
    run(registry, "models", "export", "net", "1", "-o", str(tmp_path))
    path = capsys.readouterr().out.strip()
    with tarfile.open(path) as tar:
        assert "MANIFEST.json" in tar.getnames()
    with pytest.raises(CommandError, match="give --job"):
        run(registry, "models", "register", "net")
    run(registry, "models", "list")
    assert "staging:v1" in capsys.readouterr().out
