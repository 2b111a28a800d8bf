"""`trainhub sweeps create` argument handling (no service: mistakes never reach it) and the
OpenAPI fragment against the routes."""

from __future__ import annotations

import json
import re

import pytest

from trainhub.cli import build_parser, main


def parse(*argv):
    return build_parser().parse_args(["sweeps", *argv])


def test_create_body_from_flags_and_the_script_dict(tmp_path):
    from trainhub.commands.sweeps import body_from_args

    script = tmp_path / "train_net.py"
    script.write_text("import trainhub\nsearch_space = {'opt': ['adam', 'sgd']}\n"
                      "trainhub.report(step=0, val_loss=trainhub.params()['lr'])\n")
    body = body_from_args(parse("create", str(script), "--trials", "6", "--parallel", "3", "--metric", "val_loss",
                                "--mode", "min", "--param", "lr=loguniform:1e-4:1", "--gpus", "1", "--seed", "4"))
    assert body["name"] == "train_net" and body["gpus"] == 1 and body["seed"] == 4 and body["parallel"] == 3
    assert body["space"] == {"lr": {"type": "loguniform", "low": 1e-4, "high": 1.0},
                             "opt": {"type": "choice", "values": ["adam", "sgd"]}}
    assert "check_metric" not in body and body["script"] == script.read_text()


@pytest.mark.parametrize("extra, message", [
    (["--param", "lr=uniform:2:1"], "trainhub sweeps: error: --param lr=uniform:2:1: empty range: LOW (2) must be less than HIGH (1)"),
    (["--param", "lr=beta:1:2"], "trainhub sweeps: error: --param lr=beta:1:2: unknown distribution 'beta'"),
    ([], "trainhub sweeps: error: the search space is empty"),
    (["--param", "lr=uniform:0:1", "--metric", "acc"], "never reports 'acc'"),
])
def test_create_mistakes_exit_2_before_any_request(tmp_path, capsys, extra, message):
    script = tmp_path / "t.py"
    script.write_text("import trainhub\ntrainhub.report(val_loss=1)\n")
    argv = ["sweeps", "create", str(script), "--trials", "2", "--metric", "val_loss", "--mode", "min",
            "--url", "http://127.0.0.1:9/none", "--token", "t", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_exclude_without_a_workdir_is_a_usage_error(tmp_path, capsys):
    assert main(["sweeps", "create", "--command", "true", "--trials", "2", "--metric", "val_loss", "--mode", "min",
                 "--param", "x=uniform:0:1", "--exclude", "data/", "--url", "http://127.0.0.1:9/none", "--token", "t"]) == 2
    assert "give --workdir DIR too" in capsys.readouterr().err


def test_mode_is_required(tmp_path, capsys):
    assert main(["sweeps", "create", "--command", "true", "--trials", "2", "--metric", "val_loss",
                 "--param", "x=uniform:0:1", "--url", "http://127.0.0.1:9/none", "--token", "t"]) == 2
    assert "--mode is required: min or max (does a smaller or a larger val_loss win?)" in capsys.readouterr().err


def test_openapi_fragment_matches_the_routes():
    import trainhub.services.sweeps as plugin

    routes = set()
    for pattern, *_ in plugin.routes("/services/trainhub/", None):
        path = pattern.split("/api", 1)[1]
        routes.add(re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", path).replace("/?", "") or "/")
    doc = json.loads(plugin.OPENAPI.read_text())
    assert routes == set(doc["paths"]) == {"/sweeps", "/sweeps/{id}", "/sweeps/{id}/trials"}
    refs = set(re.findall(r'"#/components/schemas/(\w+)"', plugin.OPENAPI.read_text()))
    assert refs <= set(doc["components"]["schemas"])


def test_with_a_workdir_the_script_runs_from_the_copy(tmp_path, capsys):
    from trainhub.commands.sweeps import body_from_args

    (tmp_path / "src").mkdir()
    script = tmp_path / "src" / "trial.py"
    script.write_text("import trainhub\ntrainhub.report(val_loss=trainhub.params()['lr'])\n")
    body = body_from_args(parse("create", str(script), "--workdir", str(tmp_path), "--trials", "2", "--metric", "val_loss",
                                "--mode", "min", "--param", "lr=uniform:0:1"))
    assert body["command"] == "python src/trial.py" and "script" not in body and body["name"] == "trial"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert main(["sweeps", "create", str(script), "--workdir", str(outside), "--trials", "2", "--metric", "val_loss",
                 "--mode", "min", "--param", "lr=uniform:0:1", "--url", "http://127.0.0.1:9/none", "--token", "t"]) == 2
    assert f"{script} is not inside --workdir {outside}" in capsys.readouterr().err
