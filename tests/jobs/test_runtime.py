"""trainhub.runtime: the in-job API, inside (env set) and outside a job."""

from __future__ import annotations

import json

import pytest

import trainhub
from trainhub import runtime


def test_log_metrics_in_a_job_appends_json_lines(tmp_path, monkeypatch):
    f = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("TRAINHUB_METRICS_FILE", str(f))
    rec = trainhub.log_metrics(step=3, loss=0.4, ok=True)
    trainhub.report(acc=0.9)
    lines = [json.loads(x) for x in f.read_text().splitlines()]
    assert lines[0] == rec and lines[0]["step"] == 3 and lines[0]["values"] == {"loss": 0.4, "ok": 1}
    assert lines[1]["step"] is None and lines[1]["values"] == {"acc": 0.9}
    assert isinstance(lines[0]["time"], float)


def test_outside_a_job_metrics_stay_in_memory(monkeypatch):
    monkeypatch.delenv("TRAINHUB_METRICS_FILE", raising=False)
    before = len(runtime.logged_metrics())
    rec = trainhub.log_metrics(step=1, loss=float("nan"))
    assert rec["values"] == {"loss": "nan"}
    assert runtime.logged_metrics()[before:] == [rec]


def test_bad_values():
    with pytest.raises(TypeError, match="at least one metric"):
        trainhub.log_metrics(step=1)
    with pytest.raises(TypeError, match="must be numbers"):
        trainhub.log_metrics(loss="low")


def test_numpy_scalars():
    np = pytest.importorskip("numpy")
    assert trainhub.log_metrics(loss=np.float32(0.5), n=np.int64(3))["values"] == {"loss": 0.5, "n": 3}


def test_params_and_outputs_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINHUB_PARAMS", raising=False)
    assert trainhub.params() == {}
    monkeypatch.setenv("TRAINHUB_PARAMS", '{"lr": 0.1}')
    assert trainhub.params() == {"lr": 0.1}
    monkeypatch.setenv("TRAINHUB_PARAMS", "[1]")
    with pytest.raises(ValueError, match="JSON object"):
        trainhub.params()
    monkeypatch.delenv("TRAINHUB_OUTPUTS_DIR", raising=False)
    tmp_out = trainhub.outputs_dir()
    assert tmp_out.is_dir() and trainhub.outputs_dir() == tmp_out
    monkeypatch.setenv("TRAINHUB_OUTPUTS_DIR", str(tmp_path / "out"))
    assert trainhub.outputs_dir() == tmp_path / "out" and (tmp_path / "out").is_dir()


def test_lazy_reexports_only():
    assert "log_metrics" in dir(trainhub)
    with pytest.raises(AttributeError):
        trainhub.nope  # noqa: B018
