"""Checkpoint and resume end to end through a real `trainhub up` (the shared ``platform``): a job that
saves checkpoints with ``trainhub.save_checkpoint`` is started again with the latest offered
(``trainhub.resume()``) after a failed attempt is retried and after a preemption; the job's events,
``trainhub jobs show`` and the job's log say "resumed from step S"; the checkpoints are in the user's
storage area (the job's ``outputs_url``), the last N kept."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from trainhub.states import JOB_TERMINAL

pytestmark = pytest.mark.e2e

RETRIED = r'''
import sys, trainhub
ck = trainhub.resume()
start = 0 if ck is None else ck.state["step"] + 1
print("start", start, "attempt", trainhub.attempt(), flush=True)
for step in range(start, 6):
    trainhub.save_checkpoint({"step": step}, step, keep=2)
    if step == 3 and trainhub.attempt() == 1:
        sys.exit(3)  # the first attempt dies after step 3
print("done", flush=True)
'''

PREEMPTIBLE = r'''
import signal, sys, time, trainhub
ck = trainhub.resume()
if ck is not None:
    print("continuing after step", ck.step, flush=True)
    sys.exit(0)
step = 0
def stop(*_):
    trainhub.save_checkpoint({"step": step}, step)
    print("checkpoint at", step, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("training", flush=True)
while True:
    step += 1
    time.sleep(0.05)
'''


class API:
    def __init__(self, platform, user):
        self.url = platform.url + "/services/trainhub/api"
        self.h = {"Authorization": f"token {platform.token(user)}"}

    def submit(self, **spec) -> dict:
        r = requests.post(self.url + "/jobs", json=spec, headers=self.h, timeout=30)
        assert r.status_code == 201, r.text
        return r.json()

    def get(self, jid, path=""):
        r = requests.get(f"{self.url}/jobs/{jid}{path}", headers=self.h, timeout=30)
        assert r.status_code == 200, r.text
        return r

    def wait(self, jid, until, what, timeout=120) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            job = self.get(jid).json()
            if until(job):
                return job
            assert time.monotonic() < deadline, f"{what}: job {jid} is {job['state']} ({job['reason']})"
            time.sleep(0.2)

    def events(self, jid) -> list[str]:
        return [f"{e['kind']}: {e['message']}" for e in self.get(jid, "/events").json()["items"]]


def test_a_retried_job_resumes_from_its_latest_checkpoint(platform):
    user = "rt-retry"
    api = API(platform, user)
    job = api.submit(script=RETRIED, retries=1, name="resumable", gpus=0)
    done = api.wait(job["id"], lambda j: j["state"] in JOB_TERMINAL, "the retried job to end")
    logs = api.get(job["id"], "/logs").text
    assert done["state"] == "succeeded" and done["attempt"] == 2, (done, logs)
    lines = [line.split("] ", 1)[1] for line in logs.splitlines()]
    assert "start 0 attempt 1" in lines and "start 4 attempt 2" in lines and lines[-1] == "done"
    assert "trainhub: resumed from step 3 (step-000000000003.pkl)" in lines
    events = api.events(job["id"])
    assert "resumed: resumed from step 3: attempt 2 is offered checkpoint step-000000000003.pkl" in events
    # the checkpoints live in the user's storage area (the job's outputs_url), the last 2 kept
    area = Path(done["outputs_url"])
    assert sorted(p.name for p in (area / "checkpoints").iterdir()) == ["step-000000000004.pkl", "step-000000000005.pkl"]
    r = subprocess.run([sys.executable, "-m", "trainhub.cli", "jobs", "show", job["id"], "--url", api.url, "--token",
                        api.h["Authorization"].split()[1]], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "events:" in r.stdout and "resumed: resumed from step 3: attempt 2 is offered" in r.stdout, r.stdout


def test_a_preempted_job_resumes_from_the_checkpoint_it_saved_on_sigterm(platform):
    low, blocker, high = API(platform, "rt-pre-low"), API(platform, "rt-pre-block"), API(platform, "rt-pre-high")
    free = [d for d in platform.ledger()["devices"] if not d.get("holder")]
    if len(free) < 4:
        pytest.skip(f"needs the platform's 4 GPUs free, {len(free)} are")
    lo = low.submit(script=PREEMPTIBLE, gpus=2, priority=0, preemptible=True, name="preemptible")
    low.wait(lo["id"], lambda j: j["state"] == "running" and "training" in low.get(lo["id"], "/logs").text, "training")
    block = blocker.submit(command="sleep 300", gpus=2, name="blocker")
    try:
        blocker.wait(block["id"], lambda j: j["state"] == "running", "the blocker to run")
        hi = high.submit(command="echo urgent", gpus=2, priority=10, name="urgent")
        high.wait(hi["id"], lambda j: j["state"] == "succeeded", "the urgent job to run (after preempting)")
        resumed = low.wait(lo["id"], lambda j: j["state"] in JOB_TERMINAL, "the preempted job to resume and end", timeout=180)
    finally:
        requests.delete(f"{blocker.url}/jobs/{block['id']}", headers=blocker.h, timeout=30)
    logs = low.get(lo["id"], "/logs").text
    assert resumed["state"] == "succeeded" and resumed["attempt"] == 2, (resumed, logs)
    saved = int(logs.split("checkpoint at ", 1)[1].split()[0])
    assert f"continuing after step {saved}" in logs
    events = low.events(lo["id"])
    assert any(e.startswith("preempt: preempting: job ") for e in events), events
    assert f"resumed: resumed from step {saved}: attempt 2 is offered checkpoint step-{saved:012d}.pkl" in events
