"""Unit tests: trainhub.metrics (scripted source, NVML without a driver, process helpers)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from trainhub.gpus import simulated_devices, GPUDevice
from trainhub.metrics import (
    GPUMetricsSource, MetricsUnavailable, NVMLMetricsSource, ScriptedMetricsSource, default_metrics_class,
)
from trainhub.metrics import process


def sample(src, devices):
    return asyncio.run(src.sample(devices))


def test_scripted_reads_file_every_sample(tmp_path):
    f = tmp_path / "gpu.json"
    src = ScriptedMetricsSource(path=str(f))
    f.write_text(json.dumps({"devices": {"0": {"utilization": 85, "memory_used_mb": 1000}}, "default": {"utilization": 3}}))
    s = sample(src, [0, 1])
    assert s[0].utilization == 85 and s[0].memory_used_mb == 1000 and s[0].simulated
    assert s[1].utilization == 3 and s[1].memory_total_mb == 16384
    f.write_text(json.dumps({"devices": {"1": {"utilization": 50}}}))
    s = sample(src, [0, 1])
    assert s[0].utilization == 0 and s[1].utilization == 50  # no default: 0 %


def test_scripted_missing_file_is_idle(tmp_path):
    s = sample(ScriptedMetricsSource(path=str(tmp_path / "absent.json")), [0, 3])
    assert {d: x.utilization for d, x in s.items()} == {0: 0.0, 3: 0.0}


def test_scripted_path_from_env(tmp_path, monkeypatch):
    f = tmp_path / "m.json"
    f.write_text('{"default": {"utilization": 250}}')
    monkeypatch.setenv("TRAINHUB_GPU_METRICS_FILE", str(f))
    assert sample(ScriptedMetricsSource(), [0])[0].utilization == 100.0  # clamped


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"devices": {"0": {"utilization": "high"}}}'])
def test_scripted_bad_file_raises(tmp_path, text):
    f = tmp_path / "bad.json"
    f.write_text(text)
    with pytest.raises(MetricsUnavailable, match=str(f)):
        sample(ScriptedMetricsSource(path=str(f)), [0])


def test_nvml_without_driver_says_what_to_do():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - a GPU machine
        pynvml.nvmlShutdown()
        s = sample(NVMLMetricsSource(), [0])
        assert 0 <= s[0].utilization <= 100 and not s[0].simulated
        return
    with pytest.raises(MetricsUnavailable, match="ScriptedMetricsSource"):
        sample(NVMLMetricsSource(), [0])


def test_contract_and_default_choice():
    with pytest.raises(NotImplementedError):
        sample(GPUMetricsSource(), [0])
    assert default_metrics_class(simulated_devices(2)) is ScriptedMetricsSource
    assert default_metrics_class([]) is ScriptedMetricsSource
    assert default_metrics_class([GPUDevice(0, "A100", "GPU-x", 40000)]) is NVMLMetricsSource


def test_process_sample():
    if not process.psutil_available():
        assert process.sample_process(os.getpid(), 0.05) is None
        return
    s = process.sample_process(os.getpid(), 0.05)
    assert s.pid == os.getpid() and s.cpu_percent >= 0 and s.processes >= 1
    assert process.sample_process(2**22 + 12345, 0.01) is None  # no such process
