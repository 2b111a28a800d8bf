"""The usage sampler in process: a scripted timeline of allocations and GPU samples through
passes of the real loop body, against a real platform database; process sampling of a busy child."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import datetime, timezone

import pytest
from waiting import wait_for

from trainhub.db import write_session
from trainhub.metrics import ScriptedMetricsSource
from trainhub.models import GPUAllocationRecord
from trainhub.services.usage.procsample import CLK_TCK, TreeSampler, read_stat
from trainhub.services.usage.sampler import UsageSampler

T0 = datetime(2026, 11, 21, 9, 0, tzinfo=timezone.utc).timestamp()


class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def dt(ts):
    return datetime.fromtimestamp(ts, timezone.utc)


@pytest.fixture
def env(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'platform.sqlite'}"
    metrics = tmp_path / "gpu-metrics.json"
    clock = Clock(T0)
    sampler = UsageSampler(db_url=db_url, metrics_source=ScriptedMetricsSource(path=str(metrics)), clock=clock,
                           groups_of=lambda u: ("ml",) if u == "alice" else ())
    sampler.max_sample_gap = 60

    def script(util: dict):
        metrics.write_text(json.dumps({"devices": {str(d): {"utilization": u} for d, u in util.items()}}))

    def record(device, holder, user, start, end=None, kind="job", profile="gpu-1"):
        with write_session(db_url) as s:
            s.add(GPUAllocationRecord(device=device, holder=holder, kind=kind, user=user, profile=profile,
                                      start=dt(start), end=dt(end) if end else None))
            s.commit()

    def close(holder, end):
        with write_session(db_url) as s:
            for r in s.query(GPUAllocationRecord).filter_by(holder=holder, end=None):
                r.end = dt(end)
            s.commit()

    return sampler, clock, script, record, close


def run(sampler, clock, at):
    clock.t = at
    asyncio.run(sampler.run_once())


def by_holder(sampler):
    return {r.holder: r for r in sampler.all_rows()}


def test_passes_account_a_scripted_timeline(env):
    sampler, clock, script, record, close = env
    record(0, "server:alice/", "alice", T0 - 20, kind="server")  # held before the first pass
    script({0: 50})
    run(sampler, clock, T0)  # first pass ever: counts from the allocation's start, unmeasured beyond 60 s
    record(1, "job:1", "bob", T0 + 5)
    script({0: 50, 1: 100})
    run(sampler, clock, T0 + 10)
    script({0: 0, 1: 80})
    run(sampler, clock, T0 + 20)
    close("job:1", T0 + 25)  # released between passes: its last 5 s still count
    script({0: 100, 1: 0})
    run(sampler, clock, T0 + 30)
    rows = by_holder(sampler)
    alice, bob = rows["server:alice/"], rows["job:1"]
    assert alice.allocated == pytest.approx(50.0)  # T0-20 .. T0+30
    assert alice.used == pytest.approx(20 * 0.5 + 10 * 0.5 + 10 * 0.0 + 10 * 1.0)
    assert alice.measured == pytest.approx(50.0)
    assert alice.groups == ("ml",) and alice.kind == "server" and alice.day == "2026-11-21"
    assert bob.allocated == pytest.approx(20.0)  # T0+5 .. T0+25
    assert bob.used == pytest.approx(5 * 1.0 + 10 * 0.8 + 5 * 0.0)
    # nothing is counted twice: another pass with no time passed adds nothing
    run(sampler, clock, T0 + 30)
    assert by_holder(sampler)["server:alice/"].allocated == pytest.approx(50.0)


def test_restart_gap_is_allocated_but_unmeasured(env, tmp_path):
    sampler, clock, script, record, close = env
    record(0, "job:9", "carol", T0)
    script({0: 100})
    run(sampler, clock, T0 + 10)
    # a new sampler on the same database (a service restart) an hour later
    later = UsageSampler(db_url=sampler.db_url, metrics_source=sampler.metrics_source, clock=clock)
    later.max_sample_gap = 60
    run(later, clock, T0 + 3610)
    row = by_holder(later)["job:9"]
    assert row.allocated == pytest.approx(3610.0)
    assert row.measured == pytest.approx(10.0 + 60.0) and row.used == pytest.approx(70.0)


def test_metrics_unavailable_counts_allocation_only(env, tmp_path):
    sampler, clock, script, record, close = env
    record(2, "job:3", "dave", T0)
    (tmp_path / "gpu-metrics.json").write_text("{not json")
    run(sampler, clock, T0)
    run(sampler, clock, T0 + 30)
    row = by_holder(sampler)["job:3"]
    assert (row.allocated, row.used, row.measured) == (30.0, 0.0, 0.0)


def test_tree_sampler_measures_a_busy_child():
    busy = subprocess.Popen([sys.executable, "-c", "import os\nos.setsid()\nwhile True: pass"])
    try:
        # the sampler's clock seam: the two passes are `elapsed` seconds apart on its clock, whatever the wall says
        elapsed = 10.0
        passes = iter([100.0, 100.0 + elapsed])
        s = TreeSampler(clock=lambda: next(passes))
        ticks0 = read_stat(busy.pid).cpu_ticks
        assert s.sample([busy.pid]) == {busy.pid: None}  # first pass: nothing to compare with
        # shared CI cores: wait until the child got 0.3 s of CPU, however long that takes
        wait_for(lambda: read_stat(busy.pid).cpu_ticks - ticks0, lambda ticks: ticks >= 0.3 * CLK_TCK,
                 what="0.3 s of CPU used by the busy child", timeout=120, interval=0.1)
        m = s.sample([busy.pid])[busy.pid]
        ticks1 = read_stat(busy.pid).cpu_ticks
        assert m is not None and m.processes == 1
        assert m.cpu_percent / 100 * elapsed >= 0.25  # the CPU seconds it used, seen by the sampler
        assert m.cpu_percent / 100 * elapsed <= (ticks1 - ticks0) / CLK_TCK + 0.01  # and no more than it used
        assert m.max_process_cpu_percent == pytest.approx(m.cpu_percent)
        assert m.cpu_cores >= 1 and 0.0 <= m.iowait_fraction <= 1.0
    finally:
        busy.kill()
        busy.wait()
    assert TreeSampler().sample([busy.pid]) == {busy.pid: None}  # gone
