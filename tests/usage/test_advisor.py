"""The advisor's diagnoses as tables: each code, its negative cases and the sample minimum."""

from __future__ import annotations

import pytest

from trainhub.services.usage.advisor import (INPUT_BOUND, MEMORY_BOUND, STALLED, STRAGGLER, AdvisorThresholds,
                                             WorkerSample, diagnose)


def series(n=8, **kw):
    """n identical samples one second apart (fields of WorkerSample)."""
    step = kw.pop("step_rate", None)
    return [WorkerSample(at=float(i), step=(i * step if step is not None else None), **kw) for i in range(n)]


GPU_BOUND = dict(gpu_util=95, gpu_mem_used_mb=9000, gpu_mem_total_mb=16000, cpu_percent=110, cpu_cores=8,
                 max_process_cpu_percent=100, iowait_fraction=0.0)
CPU_STARVED = dict(gpu_util=5, gpu_mem_used_mb=2000, gpu_mem_total_mb=16000, cpu_percent=790, cpu_cores=8,
                   max_process_cpu_percent=99, iowait_fraction=0.02)
ONE_CORE_LOADER = dict(gpu_util=8, gpu_mem_used_mb=2000, gpu_mem_total_mb=16000, cpu_percent=102, cpu_cores=16,
                       max_process_cpu_percent=99, iowait_fraction=0.0)
IO_STARVED = dict(gpu_util=12, gpu_mem_used_mb=2000, gpu_mem_total_mb=16000, cpu_percent=40, cpu_cores=8,
                  max_process_cpu_percent=30, iowait_fraction=0.7, read_mb_s=3.5)
STUCK = dict(gpu_util=0, gpu_mem_used_mb=3000, gpu_mem_total_mb=16000, cpu_percent=1, cpu_cores=8,
             max_process_cpu_percent=1, iowait_fraction=0.0)
MEM_FULL = dict(gpu_util=35, gpu_mem_used_mb=15500, gpu_mem_total_mb=16000, cpu_percent=100, cpu_cores=8,
                max_process_cpu_percent=60, iowait_fraction=0.0)
MEM_FULL_BUSY = dict(GPU_BOUND, gpu_mem_used_mb=15800)


def codes(workers: dict, **th) -> list[str]:
    t = AdvisorThresholds(**th)
    found, _ = diagnose(workers, t)
    return [d.code for d in found]


@pytest.mark.parametrize("name, workers, expected", [
    ("healthy GPU-bound job", {0: series(**GPU_BOUND)}, []),
    ("healthy, memory full but busy", {0: series(**MEM_FULL_BUSY)}, []),
    ("healthy 2 workers", {0: series(**GPU_BOUND), 1: series(**GPU_BOUND)}, []),
    ("every core busy, GPU idle", {0: series(**CPU_STARVED)}, [INPUT_BOUND]),
    ("one pegged loader process of 16 cores", {0: series(**ONE_CORE_LOADER)}, [INPUT_BOUND]),
    ("waiting on I/O", {0: series(**IO_STARVED)}, [INPUT_BOUND]),
    ("GPU and CPU idle", {0: series(**STUCK)}, [STALLED]),
    ("memory nearly full, low utilisation", {0: series(**MEM_FULL)}, [MEMORY_BOUND]),
    ("memory full and CPU starved: input-bound explains it", {0: series(**dict(CPU_STARVED, gpu_mem_used_mb=15900))},
     [INPUT_BOUND]),
    ("one slow worker by GPU", {0: series(**GPU_BOUND), 1: series(**GPU_BOUND), 2: series(**dict(GPU_BOUND, gpu_util=30))},
     [STRAGGLER]),
    ("one slow worker by steps", {0: series(step_rate=10, **GPU_BOUND), 1: series(step_rate=10, **GPU_BOUND),
                                  2: series(step_rate=3, **GPU_BOUND)}, [STRAGGLER]),
    ("steps even, GPU uneven: steps win", {0: series(step_rate=10, **GPU_BOUND),
                                           1: series(step_rate=10, **dict(GPU_BOUND, gpu_util=40))}, []),
    ("no process figures (Kubernetes): no CPU diagnosis", {0: series(gpu_util=3, gpu_mem_used_mb=1, gpu_mem_total_mb=16000)}, []),
    ("no GPU figures: nothing about GPUs", {0: series(cpu_percent=800, cpu_cores=8, max_process_cpu_percent=100)}, []),
])
def test_diagnoses(name, workers, expected):
    assert codes(workers) == expected, name


def test_fewer_samples_than_minimum_give_nothing():
    assert codes({0: series(n=5, **CPU_STARVED)}, min_samples=6) == []
    assert codes({0: series(n=6, **CPU_STARVED)}, min_samples=6) == [INPUT_BOUND]
    # a straggler needs every worker ready
    w = {0: series(**GPU_BOUND), 1: series(n=2, **dict(GPU_BOUND, gpu_util=10))}
    assert codes(w, min_samples=6) == []


def test_only_the_window_counts():
    # was starved long ago, GPU-bound for the whole recent window
    old = series(n=30, **CPU_STARVED)
    recent = [WorkerSample(at=100.0 + i, **GPU_BOUND) for i in range(10)]
    assert codes({0: old + recent}, window=10) == []
    assert codes({0: old + recent}, window=40) == [INPUT_BOUND]


@pytest.mark.parametrize("th, expected", [
    ({}, [INPUT_BOUND]),
    ({"gpu_idle_percent": 4}, []),  # 5 % no longer counts as idle
    ({"process_busy_percent": 0}, []),  # only 6 % of 16 cores: the single-process rule turned off
])
def test_thresholds_are_configurable(th, expected):
    assert codes({0: series(**ONE_CORE_LOADER)}, **th) == expected


def test_input_bound_carries_measurements_and_remedies():
    t = AdvisorThresholds()
    found, summaries = diagnose({0: series(**CPU_STARVED), 1: series(**GPU_BOUND)}, t)
    assert [x.code for x in found] == [INPUT_BOUND, STRAGGLER]  # the starved worker also holds the other back
    d = found[0]
    assert d.code == INPUT_BOUND and d.severity == "warning" and d.workers == [0]
    m = d.measurements["worker_0"]
    assert m["gpu_util"] == 5 and m["cpu_percent"] == 790 and m["cpu_cores"] == 8 and m["samples"] == 8
    assert m["cpu_fraction"] == pytest.approx(0.988, abs=1e-3)
    text = " ".join(d.remedies)
    assert "CPU cores" in text and "num_workers" in text and "binary" in text
    assert "trainhub.data" not in text  # I/O was not the problem
    assert "worker 0" in d.message and "CPU" in d.message
    assert [s.rank for s in summaries] == [0, 1]

    (d,), _ = diagnose({0: series(**IO_STARVED)}, t)
    text = " ".join(d.remedies)
    assert "trainhub.data" in text and "shards" in text
    assert "CPU cores" not in text
    assert d.measurements["worker_0"]["iowait_fraction"] == 0.7 and d.measurements["worker_0"]["read_mb_s"] == 3.5


def test_straggler_names_the_slow_worker():
    t = AdvisorThresholds()
    (d,), _ = diagnose({0: series(step_rate=10, **GPU_BOUND), 1: series(step_rate=2, **GPU_BOUND),
                        2: series(step_rate=9, **GPU_BOUND)}, t)
    assert d.code == STRAGGLER and d.workers == [1]
    assert d.measurements["compared_by"] == "step_rate"
    assert d.measurements["worker_1"]["step_rate"] == pytest.approx(2.0)


def test_stalled_multi_worker_mentions_collectives():
    (d,), _ = diagnose({0: series(**STUCK), 1: series(**STUCK)}, AdvisorThresholds())
    assert d.code == STALLED and d.workers == [0, 1]
    assert any("collective" in r for r in d.remedies)
