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
    code = bench.main(["--quick"])
    out = capsys.readouterr().out
    assert "ratio (trainhub / activity culler" in out and "bound (every idle GPU-hour" in out
    rows = [line.split() for line in out.splitlines() if line.strip().endswith(("PASS", "FAIL")) and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4, 5], out  # one verdict row per seed
    for r in rows:  # trainhub's share of the bound, 0 wrongful culls, quick reversals per user per workday: the verdict agrees
        share, wrongful, reversals = float(r[2].rstrip("%")), int(r[5].split("/")[0]), float(r[-2])
        assert r[-1] == ("PASS" if share >= 90 and wrongful == 0 and reversals <= 0.5 else "FAIL"), r
    assert "not charged:" in out and "frontier over seeds 1, 2, 3, 4, 5" in out and "ceiling 1 h" in out
    assert "foresight, 0 reversals" in out and "knows every return" in out
    assert all(name in out for name in ("fixed 5 min", "fixed 60 min", "learned budget 0.3/day", bench.DEFAULT))
    final = [line for line in out.splitlines() if line.startswith("target: >= 90 % of the bound")][0]
    assert code == (0 if final.split(": ")[-1].startswith("PASS") else 1), out
    assert all(r[-1] == "PASS" for r in rows) == final.endswith("PASS")
    import trainhub.services.culler.policy as policy

    assert bench.CullPolicy is policy.CullPolicy and bench.UtilizationHistory is policy.UtilizationHistory


def test_trainhub_never_kills_work_and_wins_where_tabs_stay_open():
    bench = load()
    p = bench.Params(users=8, days=3, seed=7)
    closed = bench.Params(**{**p.__dict__, "tab_open_day": (0.0, 0.0), "p_always_on": 0.0})
    opened = bench.Params(**{**p.__dict__, "tab_open_day": (1.0, 1.0), "p_always_on": 1.0})
    runs = {name: bench.run(q) for name, q in (("closed", closed), ("open", opened), ("default", p))}
    for name, out in runs.items():
        assert out["trainhub"].wrongful == 0, name
    assert runs["closed"]["activity"].wrongful > 0  # silent training and terminal runs killed
    for name in ("default", "open"):
        assert runs[name]["trainhub"].idle_gpu_h_reclaimed > runs[name]["activity"].idle_gpu_h_reclaimed, name
    # an open tab (hidden or not) keeps the activity culler away; trainhub still frees the idle GPUs
    assert runs["open"]["activity"].idle_gpu_h_reclaimed < runs["closed"]["activity"].idle_gpu_h_reclaimed
    assert runs["open"]["trainhub"].idle_gpu_h_reclaimed > 0
    # without the away path (and the learned clock, which learns per situation: connected or not), trainhub's
    # decisions do not depend on open tabs at all
    off = {"away_timeout": 0, "learn_release_clock": False}
    assert (bench.run(closed, policy_kw=off)["trainhub"].idle_gpu_h_reclaimed
            == bench.run(opened, policy_kw=off)["trainhub"].idle_gpu_h_reclaimed)


def test_release_clocks_trade_reclaim_for_reversals_and_a_stop_reclaims_less():
    """The fixed 5-min clock (the default before issue 35) reaches >= 90 % of the bound at ~3 quick reversals per user
    per workday; the learned (priced) default cuts those under the target's 0.5 while reclaiming less; neither kills
    busy work.
    With action "stop" (kernel state lost: the long profile timeout) the same trace stays well under either."""
    bench = load()
    p = bench.Params(users=12, days=7, seed=2)
    out = bench.run(p, frontier=True)
    fixed5, learned = out["frontier"]["fixed 5 min"], out["frontier"][bench.DEFAULT]
    assert learned.idle_gpu_h_reclaimed == out["trainhub"].idle_gpu_h_reclaimed  # the default is the learned one
    assert fixed5.idle_gpu_h_reclaimed >= bench.TARGET_SHARE * out["idle_gpu_h"]
    assert bench.per_user_day(out, fixed5.restarts_within_30m) > 1
    assert bench.per_user_day(out, learned.restarts_within_30m) <= bench.TARGET_REVERSALS
    assert learned.idle_gpu_h_reclaimed >= 0.8 * out["idle_gpu_h"]
    for r in (fixed5, learned):
        assert r.wrongful == 0 and r.busy_gpu_h_killed == 0
    # the ceiling (clocks chosen knowing the week): a dearer reversal buys fewer reversals with less reclaim
    shares, reversals = [sh for _, sh, _ in out["ceiling"]], [rev for _, _, rev in out["ceiling"]]
    assert shares == sorted(shares, reverse=True) and reversals == sorted(reversals, reverse=True), out["ceiling"]
    assert reversals[-1] < reversals[0] and shares[-1] < shares[0]
    stop = bench.run(p, policy_kw={"action": "stop"})
    assert bench.share(stop, "trainhub") < 0.80 and stop["trainhub"].wrongful == 0
    costs = bench.charged_h(out, fixed5)
    assert costs["restart"] > 0 and costs["lost state"] > 0 and costs["wait"] >= 0


def test_foresight_bounds_every_policy_and_accounts_for_the_whole_bound():
    """The foresight rows are upper bounds: no policy of the frontier that kills no work passes the one with its number
    of quick reversals, and the stretches between returns hold the whole bound (none of it is left out of them)."""
    import random

    bench = load()
    p = bench.Params(users=12, days=7, seed=2)
    out = bench.run(p, frontier=True)
    rows = {label: (share, reversals) for label, share, reversals in out["foresight"]}
    zero, budget = rows["foresight, 0 reversals"], rows["foresight, best moment"]
    assert zero[0] < budget[0] <= 1 and 0 < budget[1] <= bench.TARGET_REVERSALS
    assert rows["foresight, 10 min quiet"][0] < rows["foresight, 5 min quiet"][0] < budget[0]
    assert all(rev <= bench.TARGET_REVERSALS for _, rev in rows.values())
    for name, r in out["frontier"].items():
        assert r.busy_gpu_h_killed == 0, name
        reversals = bench.per_user_day(out, r.restarts_within_30m)
        if reversals <= bench.TARGET_REVERSALS:
            assert r.idle_gpu_h_reclaimed / out["idle_gpu_h"] <= budget[0], (name, r, budget)
        if reversals == 0:
            assert r.idle_gpu_h_reclaimed / out["idle_gpu_h"] <= zero[0], (name, r, zero)
    rng = random.Random(p.seed)
    traces = [bench.make_trace(f"user{i:02d}", p, rng) for i in range(p.users)]
    covered = sum(tr.gpus * slots for tr in traces for slots, _ in bench.return_stretches(tr)) * bench.STEP / 3600
    assert 0.99 * out["idle_gpu_h"] <= covered <= out["idle_gpu_h"] + 1e-9
