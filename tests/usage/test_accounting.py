"""GPU-seconds accounting checked against scripted timelines, and the report shapes."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from trainhub.services.usage.accounting import (Interval, UsageRow, account, aggregate, prometheus_text, to_csv)

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=timezone.utc).timestamp()
MIDNIGHT = datetime(2026, 11, 21, tzinfo=timezone.utc).timestamp()


def iv(device, holder, start, end, user="alice", kind="job", profile="gpu-1"):
    return Interval(device, holder, kind, user, profile, start, end)


def test_scripted_timeline_sums_exactly():
    # alice's job holds GPU 0 for 100 s; samples every 10 s: 50 % for 5 samples, then 100 %, then 0 %
    samples = {0: [(T0 + 10 * i, 50.0) for i in range(1, 6)] + [(T0 + 10 * i, 100.0) for i in range(6, 9)]
               + [(T0 + 90, 0.0), (T0 + 100, 0.0)]}
    out = account([iv(0, "job:1", T0, T0 + 100)], samples, since=T0 - 50, until=T0 + 500)
    f = out[("2026-11-20", "alice", "job", "gpu-1", "job:1")]
    assert f.allocated == pytest.approx(100.0)
    assert f.used == pytest.approx(50 * 0.5 + 30 * 1.0)
    assert f.measured == pytest.approx(100.0)


def test_several_holders_devices_and_unmeasured_time():
    samples = {0: [(T0 + 30, 100.0), (T0 + 60, 20.0)],  # no sample after T0+60
               1: [(T0 + 60, 80.0)]}
    intervals = [iv(0, "server:bob/", T0, T0 + 90, user="bob", kind="server", profile="gpu-1"),
                 iv(1, "job:7", T0 + 30, None, user="carol", profile=None)]  # still held
    out = account(intervals, samples, since=T0, until=T0 + 90)
    bob = out[("2026-11-20", "bob", "server", "gpu-1", "server:bob/")]
    assert (bob.allocated, bob.measured) == (90.0, 60.0)  # the last 30 s have no sample: unmeasured
    assert bob.used == pytest.approx(30 * 1.0 + 30 * 0.2)
    carol = out[("2026-11-20", "carol", "job", None, "job:7")]
    assert (carol.allocated, carol.measured) == (60.0, 30.0)
    assert carol.used == pytest.approx(30 * 0.8)


def test_max_gap_limits_what_one_sample_stands_for():
    # the service was down for an hour: one sample at the end may only stand for 60 s
    out = account([iv(0, "job:1", T0, T0 + 3600)], {0: [(T0 + 3600, 100.0)]}, since=T0, until=T0 + 3600, max_gap=60)
    f = out[("2026-11-20", "alice", "job", "gpu-1", "job:1")]
    assert (f.allocated, f.measured, f.used) == (3600.0, 60.0, 60.0)


def test_split_at_utc_midnight():
    samples = {0: [(MIDNIGHT - 60 + 30 * i, 40.0) for i in range(1, 5)]}  # every 30 s, -30 .. +60
    out = account([iv(0, "job:2", MIDNIGHT - 60, MIDNIGHT + 60)], samples, since=0, until=MIDNIGHT + 3600)
    before, after = out[("2026-11-20", "alice", "job", "gpu-1", "job:2")], out[("2026-11-21", "alice", "job", "gpu-1", "job:2")]
    assert (before.allocated, after.allocated) == (60.0, 60.0)
    assert before.used == pytest.approx(24.0) and after.used == pytest.approx(24.0)


def test_window_clipping_adds_up():
    """Accounting in consecutive windows (what the sampler does) sums to accounting all at once."""
    samples = {0: [(T0 + 7 * i, (i * 37) % 101) for i in range(1, 40)], 1: [(T0 + 11 * i, 60.0) for i in range(1, 30)]}
    intervals = [iv(0, "job:1", T0 + 3, T0 + 200), iv(1, "server:bob/", T0, T0 + 250, user="bob", kind="server")]
    whole = account(intervals, samples, since=T0, until=T0 + 300, max_gap=30)
    parts: dict = {}
    edges = [T0, T0 + 13, T0 + 50, T0 + 51, T0 + 120, T0 + 300]
    for a, b in zip(edges, edges[1:]):
        for k, f in account(intervals, samples, since=a, until=b, max_gap=30).items():
            parts.setdefault(k, type(f)()).add(f)
    assert whole.keys() == parts.keys()
    for k in whole:
        assert parts[k].allocated == pytest.approx(whole[k].allocated)
        assert parts[k].used == pytest.approx(whole[k].used)
        assert parts[k].measured == pytest.approx(whole[k].measured)


ROWS = [
    UsageRow("2026-11-20", "alice", "job", "gpu-1", "job:1", ("ml",), 100.0, 55.0, 100.0),
    UsageRow("2026-11-21", "alice", "server", "gpu-1", "server:alice/", ("ml",), 50.0, 5.0, 50.0),
    UsageRow("2026-11-21", "bob", "job", "gpu-2", "job:2", ("ml", "vision"), 200.0, 180.0, 200.0),
    UsageRow("2026-11-21", "carol", "job", None, "job:3", (), 10.0, 0.0, 0.0),
]


def _by(items, key):
    return {i[key]: i for i in items}


def test_aggregate_by_each_key():
    users = _by(aggregate(ROWS, "user"), "user")
    assert users["alice"]["gpu_seconds_allocated"] == 150.0 and users["alice"]["gpu_seconds_used"] == 60.0
    assert users["alice"]["utilization"] == 40.0
    assert users["carol"]["utilization"] is None  # nothing measured
    assert [i["user"] for i in aggregate(ROWS, "user")] == ["bob", "alice", "carol"]  # largest first
    groups = _by(aggregate(ROWS, "group"), "group")
    assert groups["ml"]["gpu_seconds_allocated"] == 350.0 and groups["ml"]["users"] == 2
    assert groups["vision"]["gpu_seconds_allocated"] == 200.0 and groups["(none)"]["users"] == 1
    profiles = _by(aggregate(ROWS, "profile"), "profile")
    assert profiles["gpu-1"]["gpu_seconds_allocated"] == 150.0 and profiles["(none)"]["gpu_seconds_allocated"] == 10.0
    days = aggregate(ROWS, "day")
    assert [d["day"] for d in days] == ["2026-11-20", "2026-11-21"] and days[1]["gpu_seconds_allocated"] == 260.0
    assert _by(aggregate(ROWS, "kind"), "kind")["server"]["gpu_hours_allocated"] == round(50 / 3600, 4)
    with pytest.raises(ValueError):
        aggregate(ROWS, "colour")


def test_csv_and_prometheus():
    text = to_csv(aggregate(ROWS, "user"))
    assert text.splitlines()[0].startswith("user,gpu_seconds_allocated,gpu_seconds_used")
    assert len(text.splitlines()) == 4
    prom = prometheus_text(ROWS, {("j-000001", "alice"): ["input-bound"]})
    assert 'trainhub_gpu_seconds_allocated_total{user="alice",profile="gpu-1",kind="job"} 100.000' in prom
    assert 'trainhub_gpu_seconds_used_total{user="bob",profile="gpu-2",kind="job"} 180.000' in prom
    assert 'trainhub_gpu_seconds_allocated_total{user="carol",profile="",kind="job"} 10.000' in prom
    assert "# TYPE trainhub_gpu_seconds_used_total counter" in prom
    assert 'trainhub_job_diagnosis{job="j-000001",user="alice",code="input-bound"} 1' in prom
