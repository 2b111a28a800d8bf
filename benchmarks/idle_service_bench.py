"""The idle jobs service's CPU with 10,000 queued jobs that cannot start.

One run starts a private `trainhub up --gpus 4` (the e2e tests' ``Platform`` driver), has one job
hold all 4 GPUs (``sleep``, no time limit), then queues ``--queued`` (10,000) GPU jobs of 200 users
(1-4 GPUs each, half with a time limit) straight into the platform database in one transaction, as
if submitted over time, and one more through the API (which wakes the engine). Nothing can start.
Once the engine has seen the whole queue and settled (``--settle`` s), the jobs service process's
CPU time (user + system, /proc) is read over ``--window`` (25) seconds: that is what the platform
pays for a deep queue when nothing happens.

The same platform is then restarted with ``c.JobEngine.schedule_interval = 1`` -- a scheduling pass
every second, the cadence of the engine before passes became event-driven (every tick) -- and
measured the same way, as the baseline of the same run (the holder job is requeued by the restart
and starts again first: it was submitted first).

Target: <= 0.05 cores (``--target``) for the service as configured by default. Prints the table
and PASS/FAIL; exit status 0 on PASS, 1 on FAIL.

    .venv/bin/python benchmarks/idle_service_bench.py [--queued 10000] [--window 25] [--settle 15]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import requests
from benchcommon import PLATFORM_CONFIG, Platform
from jobs_load_bench import cpu_seconds, service_pids
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from trainhub.backoff import poll
from trainhub.db import get_engine
from trainhub.services.jobs.models import Job
from trainhub.settings import DataDir
from trainhub.states import QUEUED

BASELINE = "\nc.JobEngine.schedule_interval = 1.0  # the baseline: a scheduling pass every tick\n"


def queue_jobs(data_dir: Path, n: int, seed: int = 1) -> None:
    """``n`` queued GPU jobs in one transaction, all submitted after the holder job (which a restart requeues:
    it must still come first)."""
    rnd = random.Random(seed)
    now = datetime.now(timezone.utc)
    rows = []
    for i in range(n):
        rows.append(dict(name=f"q{i}", user=f"idle-{rnd.randrange(200)}", groups=[], state=QUEUED, reason="submitted",
                         command="true", gpus=rnd.choice((1, 1, 2, 2, 4)), workers=1, env={},
                         time_limit=rnd.choice((None, 600.0, 3600.0, 4 * 3600.0)), retries=0, attempt=0, priority=0,
                         preemptible=rnd.random() < 0.2, devices=[], exit_codes=[], launch_state={}, params={},
                         cancel_requested=False, created=now + timedelta(milliseconds=i / 10)))
    with Session(get_engine(DataDir(data_dir).platform_db_url)) as s:
        s.execute(insert(Job), rows)
        s.commit()


class Api:
    def __init__(self, platform: Platform, user: str):
        self.url = platform.url + "/services/trainhub/api"
        self.s = requests.Session()
        self.s.headers["Authorization"] = f"token {platform.token(user)}"

    def run(self, **spec) -> str:
        r = self.s.post(self.url + "/jobs", json=spec, timeout=60)
        r.raise_for_status()
        return r.json()["id"]

    def job(self, jid: str) -> dict:
        return self.s.get(f"{self.url}/jobs/{jid}", timeout=60).json()

    def why(self, jid: str) -> dict:
        return self.s.get(f"{self.url}/jobs/{jid}/why", timeout=60).json()


def measure(platform: Platform, holder_id: str | None, args) -> tuple[float, dict]:
    """Settle, then the jobs service's CPU over the window: (cores, details)."""
    boss, user = Api(platform, "bigboss"), Api(platform, "idle-probe")
    if holder_id is None:
        holder_id = boss.run(command="sleep 3600", gpus=4, name="holder")
    poll(lambda: boss.job(holder_id), lambda j: j["state"] == "running", what="the holder job to run", timeout=120,
         describe=lambda j: f"{j['state']}: {j['reason']}")
    probe = user.run(command="true", gpus=1, name="probe")  # wakes the engine: the queue is read
    why = poll(lambda: user.why(probe), lambda w: "code" in w, what="a pass to explain the last job", timeout=120)
    time.sleep(args.settle)
    pids = service_pids(platform.data_dir)
    pid = pids["jobs service"]
    c0, t0 = cpu_seconds(pid), time.monotonic()
    load0 = os.getloadavg()[0]
    time.sleep(args.window)
    used, wall = cpu_seconds(pid) - c0, time.monotonic() - t0
    with Session(get_engine(DataDir(platform.data_dir).platform_db_url)) as s:
        queued = s.scalar(select(func.count()).select_from(Job).where(Job.state == QUEUED))
    assert boss.job(holder_id)["state"] == "running", "the holder job stopped during the window"
    return used / wall, {"cpu_s": used, "wall_s": wall, "queued": queued, "why": why.get("code"),
                         "load": f"{load0:.1f} -> {os.getloadavg()[0]:.1f}", "holder": holder_id}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queued", type=int, default=10_000, help="jobs queued that cannot start (default 10000)")
    ap.add_argument("--window", type=float, default=25.0, help="seconds of CPU measurement (default 25)")
    ap.add_argument("--settle", type=float, default=15.0, help="seconds after the queue is seen before measuring (default 15)")
    ap.add_argument("--target", type=float, default=0.05, help="cores (default 0.05)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the schedule_interval=1 run")
    ap.add_argument("--keep", action="store_true", help="keep the platform's data dir (logs)")
    args = ap.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="idle-service-bench-"))
    platform = Platform("idle-service-bench", root / "data", config=PLATFORM_CONFIG)
    results = {}
    try:
        t = time.monotonic()
        platform.start()
        print(f"platform up at {platform.url} in {time.monotonic() - t:.1f} s", flush=True)
        holder = Api(platform, "bigboss").run(command="sleep 3600", gpus=4, name="holder")
        queue_jobs(platform.data_dir, args.queued)
        print(f"{args.queued} jobs queued; settling {args.settle:.0f} s, measuring {args.window:.0f} s ...", flush=True)
        results["default"] = measure(platform, holder, args)
        if not args.no_baseline:
            platform.stop()
            platform.config_file.write_text(PLATFORM_CONFIG + BASELINE)
            platform.start()
            print("baseline: restarted with schedule_interval = 1 s ...", flush=True)
            results["baseline"] = measure(platform, holder, args)
    finally:
        if platform.running:
            platform.stop(check_orphans=False)
        if not args.keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"data kept in {root}")

    print()
    print(f"{'jobs service, idle':<44}{'queued':>8}{'CPU s':>8}{'wall s':>8}{'cores':>8}")
    names = {"default": "event-driven (schedule_interval 10 s)", "baseline": "baseline: a pass every 1 s"}
    for key, (cores, d) in results.items():
        print(f"{names[key]:<44}{d['queued']:>8}{d['cpu_s']:>8.2f}{d['wall_s']:>8.1f}{cores:>8.3f}")
    cores, d = results["default"]
    ok = cores <= args.target and d["queued"] >= args.queued
    if "baseline" in results:
        base = results["baseline"][0]
        print(f"ratio to the baseline: {cores / base:.2f}x" if base > 0 else "baseline used no CPU")
    print(f"machine load average {d['load']} on {os.cpu_count()} cores")
    print(f"target: <= {args.target:.2f} cores with {args.queued} queued: {cores:.3f} -> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
