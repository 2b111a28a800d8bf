"""A real DDP training run (torch CPU build, gloo) as a 2-worker trainhub job against `torchrun`.

One run starts a private `trainhub up` (the ``Platform`` helper of tests/conftest.py) and then,
alternating, N times each:

* job: ``POST /jobs`` of benchmarks/ddp_train.py as a `script` job with 2 workers and no GPUs, timed
  from just before the POST until the API answers a terminal state (polled every 50 ms): what a
  user waits for, submission, scheduling, start, training, exit and the service noticing it;
* torchrun: ``torchrun --nproc_per_node 2 benchmarks/ddp_train.py`` as a subprocess, start to exit,
  with ``OMP_NUM_THREADS`` unset (torchrun then sets 1 for its workers).

One untimed warm-up of each runs first (the fork server, the page cache). The script is the same
file; both runs use the same epochs (``--epochs``, default 8). With ``--unset`` it also times the job
the way trainhub started workers before its torchrun parity (``OMP_NUM_THREADS`` = all cores in
every worker, torch's default without the variable) for comparison (not part of the verdict).

Target: median job time <= 1.05 x median torchrun time. Prints a table and PASS/FAIL; exit status 0
on PASS, 1 on FAIL. Timings are wall clock on a shared machine: the alternation and the ratio of
medians measured in the same run absorb part of the noise.

    .venv/bin/python benchmarks/torchrun_bench.py [--runs 5] [--epochs 8] [--unset] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchcommon import start_platform

from trainhub.client import TrainhubClient
from trainhub.distenv import TORCHRUN_VARS, available_cores
from trainhub.fmt import text_table
from trainhub.states import SUCCEEDED, job_is_terminal

SCRIPT = Path(__file__).resolve().with_name("ddp_train.py")


def run_job(client: TrainhubClient, epochs: int, name: str, extra_env: dict | None = None) -> tuple[float, dict]:
    spec = {"script": SCRIPT.read_text(), "workers": 2, "gpus": 0, "name": name,
            "env": {"BENCH_EPOCHS": str(epochs), **(extra_env or {})}}
    t0 = time.perf_counter()
    job = client.submit(spec)
    while not job_is_terminal(job):
        time.sleep(0.05)
        job = client.get(job["id"])
    elapsed = time.perf_counter() - t0
    if job["state"] != SUCCEEDED:
        raise SystemExit(f"job {job['id']} {job['state']}: {job.get('reason')}\n{client.logs(job['id'], tail=30)}")
    return elapsed, job


def run_torchrun(epochs: int, cwd: Path) -> float:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env["BENCH_EPOCHS"] = str(epochs)
    t0 = time.perf_counter()
    r = subprocess.run([torchrun, "--nproc_per_node", "2", str(SCRIPT)], cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"torchrun failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return elapsed


def trained_in(client: TrainhubClient, job_id: str) -> str:
    for line in reversed(client.logs(job_id).splitlines()):
        if "trained in" in line:
            return line.split("] ", 1)[-1]
    return "?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="timed runs of each (default 5)")
    ap.add_argument("--epochs", type=int, default=8, help="epochs of the training script (default 8)")
    ap.add_argument("--target", type=float, default=1.05, help="job median / torchrun median (default 1.05)")
    ap.add_argument("--unset", action="store_true", help="also time the job with OMP_NUM_THREADS = all cores (as before)")
    ap.add_argument("--keep", action="store_true", help="keep the platform's data dir (logs) and print where")
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: pip install torch==2.13.0 (the CPU build; see /work/shared/ENVIRONMENT.md) "
              "or pip install -e '.[bench]'", file=sys.stderr)
        return 1

    root = Path(tempfile.mkdtemp(prefix="torchrun-bench-"))
    platform = None
    try:
        t = time.monotonic()
        platform = start_platform("torchrun-bench", root)
        print(f"platform up at {platform.url} in {time.monotonic() - t:.1f} s; {available_cores()} cores", flush=True)
        client = TrainhubClient(platform.url + "/services/trainhub/api", platform.token("bench"))
        work = root / "torchrun"
        work.mkdir()

        run_job(client, 1, "ddp-warmup")  # untimed: the fork server's start, torch in the page cache
        run_torchrun(1, work)
        jobs, runs, unset, last = [], [], [], None
        for i in range(args.runs):
            for which in ((0, 1) if i % 2 == 0 else (1, 0)):
                if which == 0:
                    t_job, last = run_job(client, args.epochs, f"ddp-{i}")
                    jobs.append(t_job)
                else:
                    runs.append(run_torchrun(args.epochs, work))
            if args.unset:
                unset.append(run_job(client, args.epochs, f"ddp-unset-{i}", {"OMP_NUM_THREADS": str(available_cores())})[0])
            print(f"  run {i + 1}/{args.runs}: job {jobs[-1]:.2f} s  torchrun {runs[-1]:.2f} s"
                  + (f"  job with OMP_NUM_THREADS={available_cores()} {unset[-1]:.2f} s" if unset else ""), flush=True)

        job_med, run_med = statistics.median(jobs), statistics.median(runs)
        ratio = job_med / run_med
        ok = ratio <= args.target
        rows = [["torchrun --nproc_per_node 2", f"{run_med:.2f}", f"{min(runs):.2f}", f"{max(runs):.2f}", "1.00", ""],
                ["trainhub job, 2 workers", f"{job_med:.2f}", f"{min(jobs):.2f}", f"{max(jobs):.2f}", f"{ratio:.3f}",
                 f"<= {args.target:.2f}: {'PASS' if ok else 'FAIL'}"]]
        if unset:
            um = statistics.median(unset)
            rows.append([f"job, OMP_NUM_THREADS={available_cores()} (before)", f"{um:.2f}", f"{min(unset):.2f}",
                         f"{max(unset):.2f}", f"{um / run_med:.3f}", "(information)"])
        print()
        print(f"DDP training, {args.epochs} epochs, gloo, CPU, {args.runs} runs each (wall seconds; ratio of medians)")
        print(text_table(rows, ["run", "median", "min", "max", "ratio", "target"]))
        print(f"last job's own line: {trained_in(client, last['id'])}")
        print()
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        if platform is not None:
            platform.stop()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
