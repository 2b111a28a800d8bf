"""Sweep throughput: N trials at parallelism P against the same N trials one after another.

One run starts a real `trainhub up --gpus 4` (the `Platform` helper of tests/conftest.py, on free
loopback ports, with a user GPU quota of 4) and runs two sweeps of the same trials through the
sweeps API, the serial one first:

* serial:   ``--trials N --parallel 1``
* parallel: ``--trials N --parallel P``

Each trial is a job on 1 simulated GPU that sleeps ``--work`` seconds (reporting its metric each
step), so what the trials themselves cost does not depend on the 2 shared cores; what is left is
the platform's work: Optuna ask/tell, the job submission, the scheduler, the process start, metric
ingestion and the controller noticing the end.

Prints a table: wall time of each sweep, the speed-up (serial / parallel) against the ideal P,
and the platform overhead per trial: a serial trial's wall time (serial sweep wall / N) minus
the trial's own run time (measured by the trial script itself, from its first line to its last
report, median over the serial trials), split into the job's run overhead (started -> finished
minus its own run time: the start, job started -> the trial's first line, and the end, the trial's
last report -> job finished: process start and exit, exit detection, metric ingestion) and the gap
between one trial's job ending and the next one starting (controller + scheduler); what is left is
the sweep's own start and end. PASS when the speed-up is at
least ``--target`` x P and the overhead per trial is at most ``--overhead-target`` seconds.
Exit status 0 on PASS, 1 on FAIL.

    .venv/bin/python benchmarks/sweep_bench.py [--trials 8] [--parallel 4] [--work 2.0] [--target 0.75]
        [--overhead-target 0.2] [--sampler random|tpe]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import requests
from benchcommon import Platform  # the e2e tests' `trainhub up` driver

from trainhub.backoff import poll
from trainhub.states import COMPLETED, sweep_is_terminal

CONFIG = """
c.QuotaPolicy.user_gpu_limit = 4
"""

TRIAL = """
import time
t0 = time.perf_counter()  # the trial's own run time starts here and ends at its last report
import trainhub

x = trainhub.params()["x"]
steps = 4
for step in range(steps):
    time.sleep({work} / steps)
    extra = {{"own_seconds": time.perf_counter() - t0}} if step == steps - 1 else {{}}
    trainhub.report(step=step, val_loss=(x - 0.5) ** 2 + 1.0 / (step + 1), **extra)
"""


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def run_sweep(api: str, headers: dict, *, trials: int, parallel: int, work: float, name: str,
              sampler: str = "random") -> dict:
    body = {"name": name, "script": TRIAL.format(work=work), "gpus": 1, "trials": trials, "parallel": parallel,
            "metric": "val_loss", "mode": "min", "sampler": sampler, "seed": 0, "pruner": "none",
            "space": {"x": "uniform:0:1"}}
    if sampler == "tpe":
        body["startup_trials"] = 2  # past its random start from the third trial: the next one is asked when a slot frees
    t0 = time.monotonic()
    r = requests.post(api + "/sweeps", json=body, headers=headers, timeout=60)
    if r.status_code != 201:
        raise SystemExit(f"sweep not created: {r.status_code} {r.text}")
    sid = r.json()["id"]
    peak = 0

    def fetch():
        nonlocal peak
        s = requests.get(f"{api}/sweeps/{sid}", headers=headers, timeout=30).json()
        peak = max(peak, s["progress"]["running"] + s["progress"]["pending"])
        return s

    s = poll(fetch, sweep_is_terminal, what=f"sweep {sid} to end", start=0.1, factor=1.0)
    wall = time.monotonic() - t0
    if s["state"] != COMPLETED or s["progress"]["complete"] != trials:
        raise SystemExit(f"sweep {sid} ended {s['state']}: {s['reason']}")
    items = requests.get(f"{api}/sweeps/{sid}/trials", headers=headers, timeout=30).json()["items"]
    jobs = [requests.get(f"{api}/jobs/{t['job_id']}", headers=headers, timeout=30).json() for t in items]
    jobs.sort(key=lambda j: ts(j["started"]))
    own, last = zip(*[own_seconds(api, headers, j["id"]) for j in jobs])
    run_over = [ts(j["finished"]) - ts(j["started"]) - o for j, o in zip(jobs, own)]
    start = [t - o - ts(j["started"]) for j, o, t in zip(jobs, own, last)]
    end = [ts(j["finished"]) - t for j, t in zip(jobs, last)]
    gaps = [ts(b["started"]) - ts(a["finished"]) for a, b in zip(jobs, jobs[1:])]
    return {"id": sid, "wall": wall, "peak": peak, "run_overhead": statistics.median(run_over),
            "start": statistics.median(start), "end": statistics.median(end),
            "gap": statistics.median(gaps) if gaps else 0.0, "own": statistics.median(own)}


def own_seconds(api: str, headers: dict, job_id: str) -> tuple[float, float]:
    """The trial's own run time, as the trial script reported it (metric ``own_seconds``), and the time of that
    last report (the record's time stamp, taken by the trial's process on this machine's clock)."""
    metrics = requests.get(f"{api}/jobs/{job_id}/metrics", headers=headers, timeout=30).json()["metrics"]
    found = [m for m in metrics if "own_seconds" in m.get("values", {})]
    if not found:
        raise SystemExit(f"job {job_id} reported no own_seconds metric: {metrics[-3:]}")
    return float(found[-1]["values"]["own_seconds"]), ts(found[-1]["time"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=8, help="trials per sweep (default 8)")
    ap.add_argument("--parallel", type=int, default=4, help="parallelism of the parallel sweep (default 4, <= 4 GPUs)")
    ap.add_argument("--work", type=float, default=2.0, help="seconds each trial works (sleeps) (default 2.0)")
    ap.add_argument("--target", type=float, default=0.75, help="PASS when speed-up >= target x parallel (default 0.75)")
    ap.add_argument("--overhead-target", type=float, default=0.2,
                    help="PASS when platform overhead per trial <= this many seconds (default 0.2)")
    ap.add_argument("--sampler", choices=("random", "tpe"), default="random",
                    help="the sweeps' sampler (default random: its next trial is asked ahead; tpe with 2 startup trials: "
                    "asked when a slot frees, after Optuna is told the outcome)")
    ap.add_argument("--keep", action="store_true", help="keep the platform's data dir (logs)")
    args = ap.parse_args(argv)
    if not 1 <= args.parallel <= 4:
        raise SystemExit("--parallel must be 1..4 (the platform has 4 simulated GPUs)")

    tmp = Path(tempfile.mkdtemp(prefix="sweep-bench-"))
    platform = Platform("sweep-bench", tmp / "data", gpus=4, config=CONFIG)
    print(f"starting trainhub up in {tmp} ...", file=sys.stderr)
    platform.start()
    try:
        api = platform.url + "/services/trainhub/api"
        headers = {"Authorization": f"token {platform.token('bench')}"}
        # warm-up: the first trial pays for cold caches (imports, Optuna's tables)
        run_sweep(api, headers, trials=1, parallel=1, work=0.2, name="warmup")
        serial = run_sweep(api, headers, trials=args.trials, parallel=1, work=args.work, name="serial", sampler=args.sampler)
        par = run_sweep(api, headers, trials=args.trials, parallel=args.parallel, work=args.work, name="parallel",
                        sampler=args.sampler)
    finally:
        platform.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}", file=sys.stderr)

    n, p, w = args.trials, args.parallel, args.work
    speedup = serial["wall"] / par["wall"]
    overhead = serial["wall"] / n - serial["own"]
    ideal_par = -(-n // p) * w
    rows = [
        ("sweep", "trials", "parallel", "wall s", "ideal s", "peak unfinished"),
        (f"serial {serial['id']}", str(n), "1", f"{serial['wall']:.1f}", f"{n * w:.1f}", str(serial["peak"])),
        (f"parallel {par['id']}", str(n), str(p), f"{par['wall']:.1f}", f"{ideal_par:.1f}", str(par["peak"])),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    for r in rows:
        print("  ".join(c.ljust(wd) for c, wd in zip(r, widths)))
    print()
    print(f"speed-up (serial / parallel): {speedup:.2f}x  (ideal {p}x, efficiency {speedup / p:.0%})")
    print(f"trial's own run time (script's first line -> last report, median; work {w:.2f} s): {serial['own']:.2f} s")
    print(f"platform overhead per trial (serial wall / N - own run time): {overhead:.2f} s")
    print(f"  job run overhead (started -> finished - own run time, median): {serial['run_overhead']:.2f} s")
    print(f"    start (job started -> trial's first line, median): {serial['start']:.2f} s")
    print(f"    end (trial's last report -> job finished, median): {serial['end']:.2f} s")
    print(f"  between trials (previous job end -> next job start, median): {serial['gap']:.2f} s")
    ok_speed = speedup >= args.target * p and par["peak"] <= p
    ok_overhead = overhead <= args.overhead_target
    print(f"target: speed-up >= {args.target} x {p} = {args.target * p:.2f}x and never more than {p} unfinished: "
          f"{'PASS' if ok_speed else 'FAIL'}")
    print(f"target: platform overhead per trial <= {args.overhead_target:.2f} s: {overhead:.2f} s "
          f"{'PASS' if ok_overhead else 'FAIL'}")
    ok = ok_speed and ok_overhead
    print(f"overall: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
