"""Smoke test: the benchmark runs on the service's policy code and trainhub never culls busy work."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "culler_bench.py"


def load():
    spec = importlib.util.spec_from_file_location("culler_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_quick_benchmark(capsys):
    bench = load()
    assert bench.main(["--quick"]) == 0  # exit code 1 would mean a wrongful trainhub cull
    out = capsys.readouterr().out
    assert "ratio (trainhub / activity culler" in out
    import trainhub.services.culler.policy as policy

    assert bench.CullPolicy is policy.CullPolicy and bench.UtilizationHistory is policy.UtilizationHistory


def test_trainhub_ignores_tab_visibility_and_never_kills_work():
    bench = load()
    p = bench.Params(users=8, days=3, seed=7)
    hidden = bench.run(bench.Params(**{**p.__dict__, "visible_idle": (0.0, 0.0), "p_visible_overnight": 0.0}))
    shown = bench.run(bench.Params(**{**p.__dict__, "visible_idle": (1.0, 1.0), "p_visible_overnight": 1.0}))
    assert hidden["trainhub"].wrongful == shown["trainhub"].wrongful == 0
    assert hidden["trainhub"].idle_gpu_h_reclaimed == shown["trainhub"].idle_gpu_h_reclaimed > 0
    assert shown["activity"].idle_gpu_h_reclaimed < hidden["activity"].idle_gpu_h_reclaimed
