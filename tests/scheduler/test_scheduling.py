"""GPU scheduling end to end through a private `trainhub up` (4 simulated GPUs): priorities,
preemption with checkpoint and resume, backfill beside a waiting gang, and why a job waits
(`GET /jobs/{id}/why` and `trainhub jobs why ID`) with the scheduler's exact messages.

The platform reserves GPUs for the head job at once (``reserve_after = 0``), lets every user
hold all 4 GPUs, and kills 2 s after SIGTERM. Each test leaves no job running.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import requests
from waiting import wait_for

from trainhub.states import JOB_TERMINAL as TERMINAL

pytestmark = pytest.mark.e2e

# appended to the shared admin config of tests/conftest.py
SCHED_CONFIG = """
c.TrainhubScheduler.reserve_after = 0
c.JobEngine.grace_period = 2
c.QuotaPolicy.user_gpu_limit = 4
c.QuotaPolicy.user_gpu_limits = {"bigboss": 4, "sched-capped": 2}
"""

# a job that checkpoints on SIGTERM and resumes from its checkpoint when started again
CHECKPOINTING = (
    'ck="$TRAINHUB_JOB_DIR/ckpt"; '
    'if [ -f "$ck" ]; then echo "resumed from $(cat "$ck")"; exit 0; fi; '
    "trap 'echo checkpoint; echo step-7 > \"$ck\"; exit 0' TERM; "
    "echo training; while true; do sleep 0.1; done"
)


class Jobs:
    def __init__(self, platform, user):
        self.url = platform.url + "/services/trainhub/api"
        self.token = platform.token(user)
        self.h = {"Authorization": f"token {self.token}"}

    def run(self, **spec) -> dict:
        r = requests.post(self.url + "/jobs", json=spec, headers=self.h, timeout=30)
        assert r.status_code == 201, r.text
        return r.json()

    def get(self, jid, path="", **kw) -> requests.Response:
        return requests.get(f"{self.url}/jobs/{jid}{path}", headers=self.h, timeout=30, **kw)

    def job(self, jid) -> dict:
        return self.get(jid).json()

    def why(self, jid) -> dict:
        r = self.get(jid, "/why")
        assert r.status_code == 200, r.text
        return r.json()

    def events(self, jid) -> list[str]:
        return [f"{e['kind']}: {e['message']}" for e in self.get(jid, "/events").json()["items"]]

    def cancel(self, jid):
        requests.delete(f"{self.url}/jobs/{jid}", headers=self.h, timeout=30)

    def wait(self, jid, states=TERMINAL, timeout=60) -> dict:
        return wait_for(lambda: self.job(jid), lambda job: job["state"] in states, what=f"job {jid} to be in {states}",
                        timeout=timeout, interval=0.1, describe=lambda job: f"still {job['state']}: {job['reason']}")

    def wait_why(self, jid, code, timeout=20) -> dict:
        """Until the scheduler has explained ``jid`` with ``code`` (a pass runs at least every second)."""
        return wait_for(lambda: self.why(jid), lambda why: why.get("code") == code, what=f"{jid}: wait code {code}",
                        timeout=timeout, interval=0.1)

    def wait_log(self, jid, text, timeout=20) -> str:
        return wait_for(lambda: self.get(jid, "/logs").text, lambda logs: text in logs, what=f"{text!r} in the logs of {jid}",
                        timeout=timeout, interval=0.1)


def cli_why(jobs: Jobs, jid: str) -> str:
    """`trainhub jobs why ID` as a user runs it in a terminal; its stdout."""
    r = subprocess.run([sys.executable, "-m", "trainhub.cli", "jobs", "why", jid, "--url", jobs.url,
                        "--token", jobs.token], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def ts(job: dict, key: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(job[key].replace("Z", "+00:00")).timestamp()


def delay() -> str:
    """The scheduler's rendering of a delay (``_fmt_delay``): 7s, 1m05s, 2h00m."""
    return r"(\d+s|\d+m\d\ds|\d+h\d\dm)"


@pytest.fixture(scope="module")
def sched(platform_factory):
    p = platform_factory("sched", start=False)  # the default admin config, plus ours
    p.config_file.write_text(p.config_file.read_text() + SCHED_CONFIG)
    p.start()
    yield p
    if p.running:
        p.stop()  # asserts nothing of it is left running


@pytest.fixture
def jobs(sched):
    made = []

    def make(user):
        j = Jobs(sched, user)
        made.append(j)
        return j

    yield make
    # leave nothing running for the next test
    for j in made:
        for item in requests.get(j.url + "/jobs", headers=j.h, params={"state": "queued,running"}, timeout=30).json()["items"]:
            j.cancel(item["id"])
    for j in made:
        for item in requests.get(j.url + "/jobs", headers=j.h, params={"state": "queued,running"}, timeout=30).json()["items"]:
            j.wait(item["id"], timeout=30)


def test_higher_priority_starts_first_when_gpus_free_up(jobs):
    holder, low, high = jobs("prio-holder"), jobs("prio-low"), jobs("prio-high")
    block = holder.run(command="sleep 300", gpus=4, name="block")
    holder.wait(block["id"], {"running"})
    lo = low.run(command="sleep 0.5", gpus=4, priority=0, name="low")
    hi = high.run(command="sleep 0.5", gpus=4, priority=5, name="high")  # submitted later
    # the higher priority is the head; the earlier low-priority job waits behind it
    head = high.wait_why(hi["id"], "no-gpus")
    assert head["message"] == ("waiting for 4 GPUs: 0 of 4 free; no start time can be promised "
                               "(the GPUs it needs are held without a time limit)")
    behind = low.wait_why(lo["id"], "behind")
    assert behind["message"] == f"waiting for 4 GPUs: 0 of 4 free; behind job {hi['id']} (priority 5)"
    assert behind["blocking_job"] == hi["id"]
    assert low.job(lo["id"])["reason"] == behind["message"]  # the job's reason says the same
    out = cli_why(low, lo["id"]).splitlines()
    assert out[0] == f"{lo['id']} is queued: {behind['message']}"
    assert out[1].split()[:2] == ["code:", "behind"]
    assert out[2].split()[:3] == ["waiting", "for:", hi["id"]]
    holder.cancel(block["id"])
    hi_done, lo_done = high.wait(hi["id"]), low.wait(lo["id"])
    assert hi_done["state"] == lo_done["state"] == "succeeded"
    assert ts(hi_done, "started") < ts(lo_done, "started")
    assert ts(lo_done, "started") >= ts(hi_done, "finished") - 0.5  # it waited for the GPUs high held


def test_preemption_checkpoints_requeues_and_resumes(jobs):
    low, high = jobs("pre-low"), jobs("pre-high")
    lo = low.run(command=CHECKPOINTING, gpus=4, priority=0, preemptible=True, name="preemptible")
    low.wait(lo["id"], {"running"})
    low.wait_log(lo["id"], "training")
    hi = high.run(command="echo urgent; sleep 1", gpus=4, priority=10, name="urgent")
    done = high.wait(hi["id"], timeout=40)
    assert done["state"] == "succeeded", done
    resumed = low.wait(lo["id"], timeout=40)
    assert resumed["state"] == "succeeded", resumed
    assert resumed["attempt"] == 2  # the restart count: requeued once, started again
    logs = low.get(lo["id"], "/logs").text
    lines = [line.split("] ", 1)[1] for line in logs.splitlines()]
    lines = [line for line in lines if line != "Terminated"]  # bash reporting its killed `sleep`
    assert lines == ["training", "checkpoint", "resumed from step-7"], logs
    events = low.events(lo["id"])
    reason = f"job {hi['id']} (higher priority) needed its GPUs"
    assert f"preempt: preempting: {reason}; SIGTERM with 2s grace" in events
    assert f"queued: preempted: {reason}; requeued" in events
    assert sum(e.startswith("started:") for e in events) == 2
    # high ran in between: low's second attempt started once high was done with the GPUs
    assert ts(resumed, "started") >= ts(done, "finished") - 0.5


def test_backfill_runs_short_job_while_gang_waits(jobs):
    occ, gang, small = jobs("bf-occupant"), jobs("bf-gang"), jobs("bf-small")
    o = occ.run(command="sleep 300", gpus=2, time_limit=40, name="occupant")
    occ.wait(o["id"], {"running"})
    g = gang.run(command="echo gang $RANK", gpus=2, workers=2, name="gang")  # needs all 4
    head = gang.wait_why(g["id"], "no-gpus")
    assert re.fullmatch(rf"waiting for 4 GPUs: 2 of 4 free; expected to start in {delay()} at the latest",
                        head["message"]), head
    assert head["reserved_start"] == pytest.approx(ts(occ.job(o["id"]), "started") + 40, abs=1.5)
    # a later small job that ends before the reservation starts in the gap (backfill)
    s = small.run(command="echo backfilled", gpus=1, time_limit=5, name="short")
    s_done = small.wait(s["id"], timeout=30)
    assert s_done["state"] == "succeeded"
    assert gang.job(g["id"])["state"] == "queued"  # still waiting for its whole gang
    # a later job that would run past the reservation may not use the reserved GPUs
    long_ = small.run(command="echo long", gpus=1, time_limit=3600, name="long")
    why = small.wait_why(long_["id"], "reserved")
    assert re.fullmatch(rf"1 GPU is free but held for job {g['id']}, reserved to start in {delay()}; "
                        r"this job's time limit of 1h00m would delay it", why["message"]), why
    assert why["blocking_job"] == g["id"]
    unbounded = small.run(command="echo unbounded", gpus=1, name="unbounded")
    why = small.wait_why(unbounded["id"], "reserved")
    assert why["message"] == (f"1 GPU is free but held for job {g['id']}; a job without a time limit "
                              "may only use GPUs that job will not need")
    # once the occupant goes, the gang starts first, whole
    occ.cancel(o["id"])
    g_done = gang.wait(g["id"], timeout=30)
    assert g_done["state"] == "succeeded" and len(g_done["devices"]) == 2
    assert ts(g_done, "started") < ts(small.wait(long_["id"]), "started")


def test_why_names_quota_and_cli_prints_it(sched, jobs):
    capped = jobs("sched-capped")  # may hold 2 GPUs
    first = capped.run(command="sleep 300", gpus=1, name="holds-one")
    capped.wait(first["id"], {"running"})
    second = capped.run(command="true", gpus=2, name="over-quota")
    why = capped.wait_why(second["id"], "quota-user")
    assert why["message"] == "over quota: sched-capped holds 1 of 2 GPUs and this job needs 2"
    assert why["state"] == "queued" and why["blocking_job"] is None
    # the CLI shows the same
    out = cli_why(capped, second["id"]).splitlines()
    assert out[0] == f"{second['id']} is queued: {why['message']}"
    assert out[1].split()[:2] == ["code:", "quota-user"]
    # a running job has no wait reason
    running = capped.why(first["id"])
    assert running["state"] == "running" and "code" not in running
