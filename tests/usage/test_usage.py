"""GPU efficiency end to end through a real `trainhub up` (a private platform with a 1 s usage
sampler and a scripted GPU metrics file): an input-bound job is diagnosed through the API and the
CLI, a healthy GPU-bound one is not; usage accounting, its Prometheus export, and authz (a user
never sees another's figures or diagnosis)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from datetime import datetime

import pytest
import requests
from waiting import wait_for

pytestmark = pytest.mark.e2e

INPUT_BOUND_JOB = "import time\nt = time.time()\nwhile time.time() - t < 120:\n    pass\n"  # burns a core, no GPU
GPU_BOUND_JOB = "import time\ntime.sleep(120)\n"  # the script says its GPU is 95 % busy


def config(metrics_file) -> str:
    return f"""
c.QuotaPolicy.user_gpu_limit = 2
c.ScriptedMetricsSource.path = {str(metrics_file)!r}
c.UsageSampler.sample_interval = 1
c.AdvisorThresholds.min_samples = 3
c.AdvisorThresholds.window = 10
# two shared CI cores: a busy loop may get well under a whole core
c.AdvisorThresholds.process_busy_percent = 15
c.AdvisorThresholds.cpu_idle_percent = 3
"""


@pytest.fixture(scope="module")
def plat(platform_factory, tmp_path_factory):
    metrics = tmp_path_factory.mktemp("usage-metrics") / "gpu-metrics.json"
    # device 0 (alice's job, allocated first) reads 5 %, device 1 (bob's) 95 %
    metrics.write_text(json.dumps({"default": {"utilization": 5, "memory_used_mb": 1000},
                                   "devices": {"1": {"utilization": 95, "memory_used_mb": 6000}}}))
    p = platform_factory("usage", config=config(metrics))
    p.metrics_file = metrics
    return p


class API:
    def __init__(self, plat, user, admin=False):
        self.url = plat.url + "/services/trainhub/api"
        self.token = plat.token(user, admin=admin)
        self.h = {"Authorization": f"token {self.token}"}

    def get(self, path, **kw):
        return requests.get(self.url + path, headers=self.h, timeout=30, **kw)

    def submit(self, **spec):
        r = requests.post(self.url + "/jobs", json=spec, headers=self.h, timeout=30)
        assert r.status_code == 201, r.text
        return r.json()

    def wait_running(self, jid, timeout=30):
        def job():
            job = self.get(f"/jobs/{jid}").json()
            assert job["state"] in ("queued", "running"), job
            return job

        return wait_for(job, lambda job: job["state"] == "running" and job["devices"], what=f"job {jid} running on a GPU",
                        timeout=timeout)

    def wait_ended(self, jid, timeout=30):
        return wait_for(lambda: self.get(f"/jobs/{jid}").json(),
                        lambda job: job["state"] in ("cancelled", "failed", "succeeded"), what=f"job {jid} to end",
                        timeout=timeout, interval=0.3)

    def cancel(self, jid):
        requests.delete(f"{self.url}/jobs/{jid}", headers=self.h, timeout=30)


def wait_diagnosis(api, jid, ready, timeout=45):
    def diagnosis():
        r = api.get(f"/jobs/{jid}/diagnosis")
        assert r.status_code == 200, r.text
        return r.json()

    return wait_for(diagnosis, ready, what=f"the expected diagnosis of {jid}", timeout=timeout, interval=0.5,
                    describe=lambda body: json.dumps(body, indent=1))


def accounted_until(plat) -> float:
    """How far the usage sampler's accounting has got (its own clock, POSIX seconds; 0 before its first pass)."""
    db = sqlite3.connect(f"file:{plat.data_dir / 'trainhub.sqlite'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT value FROM usage_state WHERE key = 'accounted_until'").fetchone()
    except sqlite3.OperationalError:  # the table is not there yet
        row = None
    finally:
        db.close()
    return row[0] if row else 0.0


def cli(plat, *args, token):
    return subprocess.run([sys.executable, "-m", "trainhub.cli", *args, "--url", plat.url + "/services/trainhub/api",
                           "--token", token], capture_output=True, text=True, timeout=60)


def test_input_bound_diagnosed_healthy_not_and_usage_accounted(plat):
    alice, bob, admin = API(plat, "usage-alice"), API(plat, "usage-bob"), API(plat, plat.admin_user, admin=True)
    starved = alice.submit(name="starved", script=INPUT_BOUND_JOB, gpus=1)
    a_job = alice.wait_running(starved["id"])
    assert a_job["devices"] == [[0]]
    healthy = bob.submit(name="healthy", script=GPU_BOUND_JOB, gpus=1)
    b_job = bob.wait_running(healthy["id"])
    assert b_job["devices"] == [[1]]
    try:
        body = wait_diagnosis(alice, starved["id"], lambda b: any(d["code"] == "input-bound" for d in b["diagnoses"]))
        (d,) = [d for d in body["diagnoses"] if d["code"] == "input-bound"]
        w0 = d["measurements"]["worker_0"]
        assert w0["gpu_util"] == pytest.approx(5.0) and w0["samples"] >= 3
        assert w0["max_process_cpu_percent"] >= 15
        assert any("DataLoader" in r for r in d["remedies"])
        assert body["simulated"] is True and body["state"] == "running"

        # the healthy GPU-bound job: as many samples, no warning
        hb = wait_diagnosis(bob, healthy["id"], lambda b: b["samples"] >= 3)
        assert hb["diagnoses"] == [], hb
        assert hb["workers"][0]["gpu_util"] == pytest.approx(95.0)

        # authz: another user's diagnosis is not found; an admin may read it
        assert bob.get(f"/jobs/{starved['id']}/diagnosis").status_code == 404
        assert admin.get(f"/jobs/{starved['id']}/diagnosis").status_code == 200

        # the CLI says why
        r = cli(plat, "jobs", "why", starved["id"], token=alice.token)
        assert r.returncode == 0, r.stderr
        assert "input-bound" in r.stdout and "num_workers" in r.stdout and "worker 0: GPU 5%" in r.stdout
        r = cli(plat, "jobs", "show", healthy["id"], token=bob.token)
        assert r.returncode == 0 and "GPU efficiency: no problem found" in r.stdout, r.stdout
    finally:
        alice.cancel(starved["id"])
        bob.cancel(healthy["id"])
    ended = [api.wait_ended(jid) for api, jid in ((alice, starved["id"]), (bob, healthy["id"]))]
    # a pass after the release closes the accounting of both jobs: wait until the sampler has accounted past
    # both ends, then for one more pass
    last_end = max(datetime.fromisoformat(j["finished"].replace("Z", "+00:00")).timestamp() for j in ended)
    closing = wait_for(lambda: accounted_until(plat), lambda t: t > last_end,
                       what="the usage accounting past both jobs' ends", timeout=30)
    wait_for(lambda: accounted_until(plat), lambda t: t > closing, what="one more usage pass", timeout=30)

    # usage: alice sees herself only, bob's figures are refused to her
    mine = alice.get("/usage", params={"by": "holder"}).json()
    mine_by_day = alice.get("/usage", params={"by": "day"}).json()["items"]
    assert mine["scope"] == "user" and mine["user"] == "usage-alice"
    holders = {i["holder"]: i for i in mine["items"]}
    n = int(starved["id"].split("-")[1])
    assert set(holders) == {f"job:{n}"}
    job_row = holders[f"job:{n}"]
    assert job_row["gpu_seconds_allocated"] >= 3
    assert job_row["gpu_seconds_used"] == pytest.approx(0.05 * job_row["gpu_seconds_measured"], rel=0.01)
    assert alice.get("/usage", params={"user": "usage-bob"}).status_code == 403
    # a long range costs only the days stored in it; a malformed day is refused
    long = alice.get("/usage", params={"since": "2000-01-01", "by": "day"})
    assert long.status_code == 200 and long.json()["items"] == mine_by_day, long.text
    r = alice.get("/usage", params={"since": "2026-11-24T00:00"})
    assert r.status_code == 400 and "expected a date YYYY-MM-DD" in r.json()["message"], r.text
    assert alice.get("/usage/metrics").status_code == 403
    assert {i["user"] for i in bob.get("/usage").json()["items"]} == {"usage-bob"}

    # admins see everyone, by user and as Prometheus counters
    everyone = {i["user"]: i for i in admin.get("/usage").json()["items"]}
    assert {"usage-alice", "usage-bob"} <= set(everyone)
    b = everyone["usage-bob"]
    assert b["gpu_seconds_used"] == pytest.approx(0.95 * b["gpu_seconds_measured"], rel=0.01)
    prom = admin.get("/usage/metrics")
    assert prom.status_code == 200 and prom.headers["Content-Type"].startswith("text/plain")
    assert 'trainhub_gpu_seconds_allocated_total{user="usage-alice",profile="",kind="job"}' in prom.text
    assert 'trainhub_gpu_seconds_used_total{user="usage-bob"' in prom.text

    # the CLI: a table of one's own figures, CSV, JSON
    r = cli(plat, "usage", "--by", "user", token=alice.token)
    assert r.returncode == 0, r.stderr
    assert "usage-alice" in r.stdout and "usage-bob" not in r.stdout
    r = cli(plat, "usage", "--format", "csv", "--by", "day", token=admin.token)
    assert r.returncode == 0 and r.stdout.startswith("day,gpu_seconds_allocated"), r.stdout + r.stderr
    r = cli(plat, "usage", "--user", "usage-bob", token=alice.token)
    assert r.returncode != 0 and "your own" in r.stderr
    # a finished job keeps its last diagnosis
    done = alice.get(f"/jobs/{starved['id']}/diagnosis").json()
    assert done["state"] == "cancelled" and "input-bound" in [d["code"] for d in done["diagnoses"]]
