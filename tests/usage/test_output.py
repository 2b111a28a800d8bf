"""What people read: the `trainhub usage` table, the advisor's text in `trainhub jobs why/show`
and its line in the %%train widget (pure functions fed canned API answers)."""

from __future__ import annotations

from trainhub.commands.usage import format_table
from trainhub.fmt import diagnosis_summary, format_diagnosis
from trainhub.kernels.widget import render_diagnosis
from trainhub.services.usage.advisor import AdvisorThresholds, WorkerSample, diagnose

REPORT = {"since": "2026-11-01", "until": "2026-11-21", "by": "user", "user": None, "scope": "all",
          "items": [{"user": "bob", "gpu_seconds_allocated": 7200.0, "gpu_seconds_used": 6840.0,
                     "gpu_seconds_measured": 7200.0, "utilization": 95.0, "users": 1},
                    {"user": "alice", "gpu_seconds_allocated": 3600.0, "gpu_seconds_used": 180.0,
                     "gpu_seconds_measured": 3600.0, "utilization": 5.0, "users": 1}],
          "totals": {"gpu_seconds_allocated": 10800.0, "gpu_seconds_used": 7020.0, "gpu_seconds_measured": 10800.0,
                     "utilization": 65.0}}


def test_usage_table():
    text = format_table(REPORT)
    lines = text.splitlines()
    assert lines[0] == "GPU usage 2026-11-01 .. 2026-11-21 by user (everyone)"
    assert lines[1].split() == ["USER", "GPU-H", "ALLOC", "GPU-H", "USED", "UTIL", "%", "USERS"]
    assert lines[2].split() == ["bob", "2.00", "1.90", "95", "1"]
    assert lines[3].split() == ["alice", "1.00", "0.05", "5", "1"]
    assert lines[4].split() == ["TOTAL", "3.00", "1.95", "65"]
    empty = format_table(dict(REPORT, items=[], scope="user", user="carol"))
    assert "(carol)" in empty and "no GPU usage recorded" in empty


def body_for(samples_kw, n=8):
    found, summaries = diagnose({0: [WorkerSample(at=float(i), **samples_kw) for i in range(n)]}, AdvisorThresholds())
    return {"id": "j-000001", "state": "running", "samples": n, "min_samples": 6, "sample_interval": 10.0,
            "simulated": True, "diagnoses": [d.to_dict() for d in found], "workers": [w.to_dict() for w in summaries],
            "note": "" if found else "no problem found"}


STARVED = dict(gpu_util=5, gpu_mem_used_mb=1000, gpu_mem_total_mb=16000, cpu_percent=99, cpu_cores=2,
               max_process_cpu_percent=99, iowait_fraction=0.0, read_mb_s=0.0)


def test_diagnosis_text_has_measurements_and_remedies():
    text = format_diagnosis(body_for(STARVED), remedies=True, indent="  ")
    assert text.startswith("  GPU efficiency: input-bound (simulated GPUs")
    assert "[warning] input-bound:" in text
    assert "    - Load data in parallel: raise DataLoader(num_workers=...)" in text
    assert "worker 0: GPU 5%, mem 6%, CPU 99% of 2 cores, I/O wait 0%, read 0.0 MB/s, 8 samples" in text
    short = format_diagnosis(body_for(STARVED), remedies=False)
    assert "DataLoader" not in short.split("measured")[0].split("input-bound:")[0]
    healthy = body_for(dict(STARVED, gpu_util=97))
    assert diagnosis_summary(healthy) == "no problem found"
    waiting = {"samples": 2, "diagnoses": [], "workers": [], "note": "collecting samples: 2 of 6 needed before any diagnosis"}
    assert format_diagnosis(waiting) == "GPU efficiency: collecting samples: 2 of 6 needed before any diagnosis"


def test_widget_line():
    html = render_diagnosis(body_for(STARVED))
    assert "<b style='color:#cf222e'>input-bound</b>" in html and "num_workers" in html
    assert "worker 0: GPU 5%" in html
    assert "no problem found" in render_diagnosis(body_for(dict(STARVED, gpu_util=97)))
    assert render_diagnosis(None) == ""
    assert "&lt;script&gt;" in render_diagnosis({"diagnoses": [{"code": "stalled", "severity": "warning",
                                                               "message": "<script>", "remedies": []}]})
