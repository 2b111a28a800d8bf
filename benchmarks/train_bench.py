"""%%train cell to the job's first log line, against a plain subprocess launch of the same script.

One run starts a private `trainhub up --gpus 4` (simulated devices; the ``Platform`` helper of
tests/conftest.py) and one IPython kernel (jupyter_client ``KernelManager``) with
``$TRAINHUB_API_URL`` (what the platform gives its notebooks: the jobs service on loopback, see
``Runtime.service_url``) and ``$JUPYTERHUB_API_TOKEN`` set, as in a platform notebook, with
``%load_ext trainhub.kernels``; the first log line is read at the same URL, as the notebook's panel
reads it. Then, alternating, N times each:

* train: send a ``%%train --gpus 1`` cell to the kernel (execute_request) and follow the job's logs
  (``GET /jobs/{id}/logs?follow=true``, which streams each line as it is written; asked every 5 ms
  until the job exists) until its first line arrives; the job id is the next one the service hands
  out (this platform runs nothing else; the name is checked);
* raw: ``subprocess.Popen([python, "-u", script.py])`` of the script that ``%%train`` generates
  for the same cell, timed to its first line on stdout.

One untimed warm-up of each runs first. Each train job is waited for (untimed) before the
next run, so every run starts on an idle queue. The phases of each train run are shown too,
from the job's own timestamps (same clock, same machine): cell -> job created (kernel, magic,
POST), created -> started (engine pass, ledger), started -> first line written (launcher,
worker wrapper, Python start of the job), written -> read back through the API (the follow stream).

The table also says how the train jobs' workers started (from their launch state in the platform
database): "warm" (forked from the fork server, services/jobs/forkserver.py; platforms that do not
isolate users), "warm-isolated" (claimed from the pool of pre-started sandboxed workers,
services/jobs/warmpool.py: platforms that isolate users, as root or with bubblewrap installed, see
docs/jobs-local.md) or "cold" (a new interpreter under the worker wrapper), and the platform's
isolation mode. ``--isolated-pool 0`` measures the cold isolated path (before the pool) on the same
machine.

Targets: train p50 <= 1.0 s and train p50 <= 1.5 x raw p50. Prints a table and PASS/FAIL;
exit status 0 on PASS, 1 on FAIL. Timings are wall-clock on a shared machine: run it on an
otherwise idle one for stable numbers (the ratio against raw, measured in the same run,
absorbs part of the noise).

    .venv/bin/python benchmarks/train_bench.py [--runs 30] [--gpus 1] [--keep] [--isolated-pool N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import requests
from benchcommon import percentile, start_platform

from trainhub.backoff import WaitTimeout
from trainhub.backoff import poll as poll_until  # `poll` is a polling interval below
from trainhub.states import SUCCEEDED, job_is_terminal

CELL_BODY = "print('step 0 loss 1.0', flush=True)\n"


def iso_ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Kernel:
    """An IPython kernel (separate process) driven over ZMQ, as a notebook frontend would."""

    def __init__(self, env: dict, cwd: str):
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env=env, cwd=cwd)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def send(self, code: str) -> str:
        return self.kc.execute(code, store_history=True)

    def reply(self, msg_id: str, timeout: float = 60) -> dict:
        """Wait for the execute_reply of ``msg_id``; raise with the cell's output on error."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id:
                break
        self.drain()
        content = msg["content"]
        if content["status"] != "ok":
            raise SystemExit(f"kernel cell failed: {content.get('ename')}: {content.get('evalue')}")
        return content

    def drain(self) -> list[dict]:
        out = []
        while True:
            try:
                out.append(self.kc.get_iopub_msg(timeout=0.05))
            except Exception:
                return out

    def run(self, code: str, timeout: float = 60) -> dict:
        return self.reply(self.send(code), timeout)

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def raw_first_line(script: Path, cwd: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-u", str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd)
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - t0
    proc.stdout.close()
    proc.wait()
    if not line.strip():
        raise SystemExit("raw launch printed nothing")
    return elapsed


class Api:
    def __init__(self, url: str, token: str):
        self.url = url
        self.s = requests.Session()
        self.s.headers["Authorization"] = f"token {token}"

    def get(self, path: str, **kw):
        return self.s.get(self.url + path, timeout=30, **kw)

    def newest_id(self) -> int:
        items = self.get("/jobs", params={"limit": 1}).json()["items"]
        return int(items[0]["id"].split("-")[1]) if items else 0

    def wait_done(self, key: str, timeout: float = 60) -> dict:
        try:
            return poll_until(lambda: self.get(f"/jobs/{key}").json(), job_is_terminal, what=f"job {key} to end",
                        describe=lambda job: f"still {job['state']}: {job.get('reason')}", start=0.05, factor=1.0,
                        timeout=timeout)
        except WaitTimeout as e:
            raise SystemExit(str(e)) from None


def train_first_line(kernel: Kernel, api: Api, name: str, gpus: int, poll: float = 0.005) -> tuple[float, dict]:
    """Seconds from sending the cell to the first log line readable through the API."""
    key = f"j-{api.newest_id() + 1:06d}"
    cell = f"%%train --gpus {gpus} --name {name}\n{CELL_BODY}"
    t_wall = time.time()
    t0 = time.perf_counter()
    msg_id = kernel.send(cell)

    def follow():
        r = api.get(f"/jobs/{key}/logs", params={"follow": "true"}, stream=True)
        if r.status_code not in (200, 404):
            raise SystemExit(f"GET /jobs/{key}/logs?follow=true: {r.status_code} {r.text[:300]}")
        if r.status_code == 404:
            r.close()
        return r

    try:  # the job exists once the magic's POST is answered: until then, 404
        r = poll_until(follow, lambda r: r.status_code == 200, what=f"job {key} to exist", start=poll, factor=1.0,
                       timeout=60)
    except WaitTimeout:
        raise SystemExit(f"no job {key} within 60 s") from None
    with r:
        first = next((ln for ln in r.iter_lines(chunk_size=None) if ln.strip()), b"").decode()
    if not first:
        raise SystemExit(f"{key} ended without a log line")
    elapsed = time.perf_counter() - t0
    kernel.reply(msg_id)
    job = api.wait_done(key)
    if job["name"] != name:
        raise SystemExit(f"{key} is {job['name']!r}, not this run's job {name!r}: is something else submitting?")
    if job["state"] != SUCCEEDED:
        raise SystemExit(f"{key} {job['state']}: {job['reason']}")
    line_at = iso_ts(first.split(" ", 1)[0])
    phases = {"cell->created": iso_ts(job["created"]) - t_wall, "created->started": iso_ts(job["started"]) - iso_ts(job["created"]),
              "started->line written": line_at - iso_ts(job["started"]), "written->read": (t_wall + elapsed) - line_at,
              "key": key}
    return elapsed, phases


def start_paths(data_dir: Path, keys: list[str]) -> str:
    """How the workers of these jobs started ("warm"/"cold", from their launch state), and the isolation mode."""
    from sqlalchemy import create_engine, select

    from trainhub.services.jobs.models import Job, parse_job_key
    from trainhub.settings import DataDir

    from trainhub.config import load_platform_config
    from trainhub.boundary.isolation import Isolation

    mode = Isolation(config=load_platform_config(data_dir)).mode  # the service's own config, same account
    engine = create_engine(DataDir(data_dir).platform_db_url)
    counts: dict[str, int] = {}
    with engine.connect() as c:
        for state in c.execute(select(Job.launch_state).where(Job.id.in_([parse_job_key(k) for k in keys]))).scalars():
            for w in (state or {}).get("workers", []):
                counts[w.get("start", "?")] = counts.get(w.get("start", "?"), 0) + 1
    engine.dispose()
    text = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    return text + (f" (isolation: {mode})" if mode else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="timed runs of each (default 30)")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs of each %%train job (default 1; 0 = CPU-only)")
    ap.add_argument("--target-p50", type=float, default=1.0, help="seconds (default 1.0)")
    ap.add_argument("--target-ratio", type=float, default=1.5, help="train p50 / raw p50 (default 1.5)")
    ap.add_argument("--keep", action="store_true", help="keep the platform's data dir (logs) and print where")
    ap.add_argument("--isolated-pool", type=int, default=None, metavar="N",
                    help="c.LocalLauncher.isolated_warm_pool_size for this run (0: isolated workers start cold, the path "
                    "before warm isolated workers; default: the platform's default)")
    args = ap.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="train-bench-"))
    platform = kernel = None
    try:
        t = time.monotonic()
        from benchcommon import PLATFORM_CONFIG

        config = PLATFORM_CONFIG + (f"\nc.LocalLauncher.isolated_warm_pool_size = {args.isolated_pool}\n"
                                    if args.isolated_pool is not None else "")
        platform = start_platform("train-bench", root, config=config)
        print(f"platform up at {platform.url} in {time.monotonic() - t:.1f} s", flush=True)
        user = "bench"
        token = platform.token(user)
        from trainhub.settings import Runtime

        # the URL the platform gives its notebooks (the spawner's api_url): the jobs service on loopback
        api_url = Runtime.load(platform.data_dir).service_url("trainhub") + "api"
        api = Api(api_url, token)
        home = root / "home"
        home.mkdir()
        env = dict(os.environ, TRAINHUB_API_URL=api_url, JUPYTERHUB_API_TOKEN=token, JUPYTERHUB_USER=user)
        env.pop("TRAINHUB_DATA_DIR", None)
        kernel = Kernel(env, str(home))
        kernel.run("%load_ext trainhub.kernels")

        from trainhub.kernels.context import build_job_script

        script = root / "script.py"
        script.write_text(build_job_script(CELL_BODY, [], {}).source)

        # warm-up (untimed): first imports in the kernel, first launch of the service
        train_first_line(kernel, api, "warmup", args.gpus)
        raw_first_line(script, str(home))

        train, raw, phases, keys = [], [], [], []
        for i in range(args.runs):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            for which in order:
                if which == 0:
                    t_train, ph = train_first_line(kernel, api, f"bench-{i}", args.gpus)
                    keys.append(ph.pop("key"))
                    train.append(t_train)
                    phases.append(ph)
                else:
                    raw.append(raw_first_line(script, str(home)))
            print(f"  run {i + 1:>3}/{args.runs}: train {train[-1]:.3f} s  raw {raw[-1]:.3f} s", flush=True)

        t50, t95, r50, r95 = (percentile(train, 50), percentile(train, 95), percentile(raw, 50), percentile(raw, 95))
        ratio = t50 / r50 if r50 else float("inf")
        print()
        print(f"{'measure (' + str(args.runs) + ' runs each)':<44}{'p50':>9}{'p95':>9}")
        print(f"{'%%train cell -> first log line via the API':<44}{t50:>8.3f}s{t95:>8.3f}s")
        print(f"{'raw subprocess -> first output line':<44}{r50:>8.3f}s{r95:>8.3f}s")
        print(f"{'ratio train / raw':<44}{ratio:>8.2f}x{(t95 / r95 if r95 else 0):>8.2f}x")
        print(f"{'workers started (train jobs)':<44}{start_paths(platform.data_dir, keys)}")
        print()
        print("phases of the train runs (from the job's timestamps):")
        for name in phases[0]:
            xs = [p[name] for p in phases]
            print(f"  {name:<42}{percentile(xs, 50):>8.3f}s{percentile(xs, 95):>8.3f}s")
        ok_abs, ok_ratio = t50 <= args.target_p50, ratio <= args.target_ratio
        print()
        print(f"target: p50 <= {args.target_p50:.1f} s: {'ok' if ok_abs else 'MISSED'}; "
              f"p50 <= {args.target_ratio:.1f} x raw: {'ok' if ok_ratio else 'MISSED'}")
        print("PASS" if ok_abs and ok_ratio else "FAIL")
        return 0 if ok_abs and ok_ratio else 1
    finally:
        if kernel is not None:
            kernel.close()
        if platform is not None and platform.running:
            platform.stop()
        if args.keep:
            print(f"kept {root}")
        else:
            import shutil

            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
