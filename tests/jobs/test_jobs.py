"""Batch jobs end to end through a real `trainhub up`: the REST API, gang start, logs,
metrics, outputs, cancel, time limits, retries, failures, isolation between users,
concurrency and a service crash."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
from waiting import wait_for

from trainhub.states import JOB_TERMINAL as TERMINAL
from trainhub.states import SUBMITTED_REASON

pytestmark = pytest.mark.e2e


class Jobs:
    def __init__(self, platform, user, **token_kw):
        self.platform = platform
        self.user = user
        self.url = platform.url + "/services/trainhub/api"
        self.token = platform.token(user, **token_kw)
        self.h = {"Authorization": f"token {self.token}"}

    def submit(self, **spec):
        return requests.post(self.url + "/jobs", json=spec, headers=self.h, timeout=30)

    def run(self, **spec) -> dict:
        r = self.submit(**spec)
        assert r.status_code == 201, r.text
        return r.json()

    def get(self, jid, path="", **kw):
        return requests.get(f"{self.url}/jobs/{jid}{path}", headers=self.h, timeout=30, **kw)

    def cancel(self, jid):
        return requests.delete(f"{self.url}/jobs/{jid}", headers=self.h, timeout=30)

    def wait(self, jid, states=TERMINAL, timeout=60) -> dict:
        return wait_for(lambda: self.get(jid).json(), lambda job: job["state"] in states,
                        what=f"job {jid} to be {'/'.join(sorted(states))}", timeout=timeout,
                        describe=lambda job: f"still {job['state']}: {job['reason']}")

    def considered(self, jid, timeout=30) -> dict:
        """The job once the scheduler has looked at it: its reason is the scheduler's, not the one given at submission."""
        return wait_for(lambda: self.get(jid).json(), lambda job: job["state"] != "queued" or job["reason"] != SUBMITTED_REASON,
                        what=f"a scheduling pass to consider job {jid}", timeout=timeout)

    def logs(self, jid, **params) -> str:
        return self.get(jid, "/logs", params=params).text


@pytest.fixture
def jobs(platform, request):
    def make(user, **kw):
        return Jobs(platform, user, **kw)
    return make


def job_devices(platform, job_id: str) -> list[int]:
    n = int(job_id.split("-")[1])
    return sorted(d["device"] for d in platform.ledger()["devices"] if d["holder"] == f"job:{n}")


def test_job_runs_as_a_gang_with_logs_metrics_outputs(platform, jobs):
    alice = jobs("jobs-alice")
    script = (
        "import os, trainhub\n"
        "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'gpus', os.environ['CUDA_VISIBLE_DEVICES'],"
        " 'master', os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'], 'local', os.environ['LOCAL_RANK'])\n"
        "for step in range(3):\n"
        "    trainhub.log_metrics(step=step, loss=1.0 / (step + 1))\n"
        "if os.environ['RANK'] == '0':\n"
        "    (trainhub.outputs_dir() / 'model.txt').write_text('weights')\n"
    )
    job = alice.run(name="gang", script=script, gpus=1, workers=2)
    assert job["state"] in ("queued", "running") and job["user"] == "jobs-alice"
    done = alice.wait(job["id"])
    assert done["state"] == "succeeded", done
    assert done["reason"] == "all 2 workers exited with code 0"
    assert done["exit_codes"] == [0, 0]
    devices = done["devices"]
    assert len(devices) == 2 and all(len(d) == 1 for d in devices) and devices[0] != devices[1]
    logs = alice.logs(job["id"])
    for rank in (0, 1):
        line = next(l for l in logs.splitlines() if f"[{rank}] rank {rank}" in l)
        assert f"gpus {devices[rank][0]}" in line and "of 2" in line and "master 127.0.0.1" in line
        assert line[:4].isdigit() and line[23] == "Z"  # timestamped
    metrics = alice.get(job["id"], "/metrics").json()["metrics"]
    assert sorted((m["worker"], m["step"], m["values"]["loss"]) for m in metrics) == sorted(
        (w, s, 1.0 / (s + 1)) for w in (0, 1) for s in range(3))
    # outputs synced into the user's storage area, and where they went is shown
    assert done["outputs_url"].endswith(f"/users/jobs-alice/jobs/{job['id']}")
    synced = Path(done["outputs_url"]) / "outputs" / "model.txt"
    assert synced.read_text() == "weights"
    assert (Path(done["outputs_url"]) / "attempt-1" / "worker-0.log").exists()
    assert job_devices(platform, job["id"]) == []  # released


def test_two_workers_rendezvous_over_master_addr(jobs):
    """A torch-free all-reduce: rank 0 listens on MASTER_ADDR:MASTER_PORT, rank 1 joins."""
    script = (
        "import os, socket, time\n"
        "rank, port = int(os.environ['RANK']), int(os.environ['MASTER_PORT'])\n"
        "value = (rank + 1) * 10\n"
        "if rank == 0:\n"
        "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "    s.bind((os.environ['MASTER_ADDR'], port)); s.listen(1); c, _ = s.accept()\n"
        "    other = int(c.recv(16)); c.sendall(str(value).encode()); total = value + other\n"
        "else:\n"
        "    for _ in range(100):\n"
        "        try:\n"
        "            c = socket.create_connection((os.environ['MASTER_ADDR'], port)); break\n"
        "        except OSError: time.sleep(0.1)\n"
        "    c.sendall(str(value).encode()); total = value + int(c.recv(16))\n"
        "print('allreduce', total)\n"
    )
    bob = jobs("jobs-rdv")
    job = bob.run(name="rendezvous", script=script, workers=2, gpus=0)
    done = bob.wait(job["id"])
    assert done["state"] == "succeeded", bob.logs(job["id"])
    assert bob.logs(job["id"]).count("allreduce 30") == 2


def test_users_never_see_or_touch_each_others_jobs(platform, jobs):
    owner, other = jobs("iso-owner"), jobs("iso-other")
    admin = jobs("iso-admin", admin=True)
    job = owner.run(command="sleep 20", name="private")
    for path in ("", "/logs", "/metrics", "/events", "/why"):
        r = other.get(job["id"], path)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["message"] == f"job {job['id']} not found"
    assert other.cancel(job["id"]).status_code == 404
    listed = requests.get(other.url + "/jobs", headers=other.h).json()
    assert all(j["user"] == "iso-other" for j in listed["items"])
    r = requests.get(other.url + "/jobs", params={"user": "iso-owner"}, headers=other.h)
    assert r.status_code == 403
    # the admin sees and may cancel it
    everyone = requests.get(admin.url + "/jobs", params={"user": "iso-owner"}, headers=admin.h).json()
    assert [j["id"] for j in everyone["items"]] == [job["id"]]
    assert admin.cancel(job["id"]).status_code == 202
    done = owner.wait(job["id"])
    assert done["state"] == "cancelled" and "iso-admin" in done["reason"]
    # no token, bad token
    assert requests.get(owner.url + "/jobs").status_code in (401, 403)
    assert requests.get(owner.url + "/jobs", headers={"Authorization": "token nope"}).status_code in (401, 403)


def test_cancel_running_job_stops_its_processes_and_frees_gpus(platform, jobs):
    u = jobs("jobs-cancel")
    job = u.run(command="echo started; sleep 60", gpus=1)
    u.wait(job["id"], states={"running"})
    wait_for(lambda: u.logs(job["id"]), lambda text: "started" in text, what="'started' in the job's log", timeout=20)
    assert len(job_devices(platform, job["id"])) == 1
    r = u.cancel(job["id"])
    assert r.status_code == 202
    done = u.wait(job["id"], timeout=30)
    assert done["state"] == "cancelled"
    assert done["reason"] == "cancelled by jobs-cancel while running"
    assert job_devices(platform, job["id"]) == []
    # a queued job is cancelled at once
    assert u.cancel(job["id"]).status_code == 202  # idempotent on terminal jobs


def test_time_limit_sigterm_then_sigkill_after_grace(jobs):
    u = jobs("jobs-timelimit")
    job = u.run(command="trap 'echo got TERM' TERM; while true; do sleep 0.2; done", time_limit="2s")
    done = u.wait(job["id"], timeout=45)
    assert done["state"] == "failed"
    assert done["reason"].startswith("exceeded its time limit of 2s")
    assert "got TERM" in u.logs(job["id"])  # SIGTERM first, SIGKILL after the grace period


def test_retries_rerun_failed_attempts(jobs):
    u = jobs("jobs-retry")
    script = (
        "import os, pathlib\n"
        "f = pathlib.Path(os.environ['TRAINHUB_JOB_DIR']) / 'count'\n"
        "n = int(f.read_text()) + 1 if f.exists() else 1\n"
        "f.write_text(str(n)); print('attempt', n)\n"
        "raise SystemExit(0 if n >= 3 else 7)\n"
    )
    job = u.run(script=script, retries=2, name="flaky")
    done = u.wait(job["id"], timeout=60)
    assert done["state"] == "succeeded" and done["attempt"] == 3
    logs = u.logs(job["id"])
    assert "attempt 1" in logs and "attempt 2" in logs and "attempt 3" in logs
    kinds = [e["message"] for e in u.get(job["id"], "/events").json()["items"]]
    assert any("retrying (attempt 2 of 3)" in m for m in kinds)
    # out of retries: failed, with the reason
    job = u.run(command="exit 4", retries=1)
    done = u.wait(job["id"], timeout=60)
    assert done["state"] == "failed" and done["attempt"] == 2
    assert done["reason"] == "worker 0 exited with code 4 (attempt 2 of 2; no retries left)"


def test_one_worker_failing_stops_the_gang(jobs):
    u = jobs("jobs-gangfail")
    job = u.run(command='if [ "$RANK" = 1 ]; then sleep 0.5; exit 3; fi; sleep 600', workers=2)
    done = u.wait(job["id"], timeout=120)
    assert done["state"] == "failed"
    assert done["reason"] == "worker 1 exited with code 3"
    assert done["exit_codes"][1] == 3 and done["exit_codes"][0] != 0
    # worker 0 was stopped, not waited for: the engine said so, and it ended by a signal, not by finishing its sleep
    events = [e["message"] for e in u.get(job["id"], "/events").json()["items"]]
    assert "worker 1 exited with code 3: stopping the other workers" in events, events
    assert done["exit_codes"][0] < 0, done["exit_codes"]


def test_gang_waits_for_all_gpus_and_quota_is_shared_with_servers(platform, jobs):
    hog, waiter = jobs("gang-hog"), jobs("gang-waiter")
    big = hog.run(command="sleep 60", gpus=1, workers=2, name="hog")  # 2 of 4
    hog.wait(big["id"], states={"running"})
    other = jobs("gang-other").run(command="sleep 60", gpus=1, name="other")  # 3 of 4
    jobs("gang-other").wait(other["id"], states={"running"})
    gang = waiter.run(command="echo go", gpus=1, workers=2, name="gang")
    queued = waiter.considered(gang["id"])  # a scheduling pass has decided about it (it would have started it by now)
    assert queued["state"] == "queued"
    assert "GPU" in queued["reason"] and queued["reason"] != SUBMITTED_REASON, queued["reason"]
    assert job_devices(platform, gang["id"]) == []  # no partial start
    why = waiter.get(gang["id"], "/why").json()
    assert why["state"] == "queued" and why["message"]
    hog.cancel(big["id"])
    done = waiter.wait(gang["id"], timeout=40)
    assert done["state"] == "succeeded" and len(done["devices"]) == 2
    jobs("gang-other").cancel(other["id"])
    jobs("gang-other").wait(other["id"])


def test_quota_refusals_and_bad_specs_say_why(jobs):
    u = jobs("jobs-bad")
    r = u.submit(command="true", gpus=3)
    assert r.status_code == 403
    assert r.json()["message"].startswith("GPU quota exceeded: this job needs 3 GPUs") and "your quota is 2" in r.json()["message"]
    r = u.submit(command="true", gpus=1, workers=5)
    assert r.status_code == 409 and "pool has only 4" in r.json()["message"]
    r = u.submit(command="true", gpus=99)  # the pool's size, not a fixed bound of the spec's
    assert r.status_code == 409 and "needs 99 GPUs" in r.json()["message"] and "pool has only 4" in r.json()["message"]
    cases = [
        ({"gpus": 1}, "exactly one of 'command'"),
        ({"command": "x", "script": "y"}, "exactly one of 'command'"),
        ({"command": "x", "workers": 0}, "workers must be between 1 and 64"),
        ({"command": "x", "time_limit": "soon"}, "is not a duration"),
        ({"command": "x", "bogus": 1}, "unknown field(s) ['bogus']"),
        ({"command": "x", "sweep_id": 1}, "sweep_id is set by the sweeps service"),  # not even one's own
        # what the kernel would refuse at exec: refused now, never stored to fail later
        ({"command": "echo a\x00b"}, "NUL byte"),
        ({"command": "x", "env": {"A": "b\x00"}}, "NUL byte"),
        ({"command": "x" * 200_000}, "command is longer than 32,000 characters"),
        ({"command": "x", "env": {"BIG": "v" * 200_000}}, "env BIG is longer"),
        ({"command": "x", "env": {f"V{i}": "v" for i in range(101)}}, "env has 101 variables; at most 100"),
        ({"command": "x", "env": {"A": True}}, "env A must be a string or number"),
        ({"command": "x", "gpus": "1"}, "gpus must be a whole number"),
        ({"command": "x", "time_limit": -5}, "time_limit must be 0 (no limit)"),
        ({"command": "x", "name": "n" * 129}, "name 'nnn"),
        # what the document does not allow, after the checks above: the document's own words
        ({"command": "x", "submit_key": 5}, "'submit_key': 5 is not of type"),
        ({"command": "x", "params": {"1bad": 1}}, "'1bad' does not match"),
        ({"command": "x", "env": {"RANK": "3"}}, "env RANK is set by trainhub"),
        ({"command": "x", "params": {"p": "v" * 200_000}}, "params are longer than the 128 KiB"),
        ({"command": "x", "profile": "p" * 10_000}, "profile must be a profile slug"),
        ({"command": "x", "profile": "nope"}, "Unknown profile 'nope'"),
        ({"command": "x", "profile": "gpu-4"}, "limited to the groups research"),
    ]
    for spec, message in cases:
        r = u.submit(**spec)
        assert 400 <= r.status_code < 500 and message in r.json()["message"], (spec, r.text)
    r = requests.post(u.url + "/jobs", data="{not json", headers=u.h)
    assert r.status_code == 400 and "not valid JSON" in r.json()["message"]
    # numbers JSON cannot carry back, nesting without bound, offsets past 64 bits: 400, nothing stored
    for raw, message in ((b'{"command": "x", "priority": 1e999}', "too large"), (b'{"command": "x", "gpus": NaN}', "JSON allows"),
                         (b'{"command": "x", "env": ' + b'{"A": ' * 50 + b'1' + b'}' * 51, "nests deeper")):
        r = requests.post(u.url + "/jobs", data=raw, headers=u.h)
        assert r.status_code == 400 and message in r.json()["message"], r.text
    r = requests.get(u.url + "/jobs", params={"offset": str(2**64)}, headers=u.h)
    assert r.status_code == 400 and "2**63" in r.json()["message"], r.text
    listed = requests.get(u.url + "/jobs", headers=u.h).json()
    assert listed["total"] == 0  # nothing was submitted by any of these


def test_an_oversized_body_is_refused_before_it_is_read_or_stored(jobs):
    u = jobs("jobs-huge")
    body = json.dumps({"command": "true", "env": {"PAD": "x" * (9 << 20)}})
    r = requests.post(u.url + "/jobs", data=body, headers={**u.h, "Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413 and "at most 8,388,608 bytes" in r.json()["message"], r.text[:300]
    r = requests.post(u.url + "/jobs", data=b"{" + b" " * (17 << 20) + b"}", headers=u.h, timeout=60)
    assert r.status_code == 413 and "17,825,794 bytes" in r.json()["message"]

    def chunked():  # no Content-Length: refused once the bound is passed
        for _ in range(10):
            yield b" " * (1 << 20)
    r = requests.post(u.url + "/jobs", data=chunked(), headers=u.h, timeout=60)
    assert r.status_code == 413 and "passes the bound; at most 8,388,608" in r.json()["message"]
    assert requests.get(u.url + "/jobs", headers=u.h, timeout=30).json()["total"] == 0


def test_logs_follow_streams_while_running(jobs):
    u = jobs("jobs-follow")
    job = u.run(command="for i in 1 2 3 4 5; do echo line $i; sleep 0.4; done")
    with requests.get(f"{u.url}/jobs/{job['id']}/logs", params={"follow": 1}, headers=u.h, stream=True, timeout=60) as r:
        seen, t_first = [], None
        for line in r.iter_lines():
            if line:
                seen.append(line.decode())
                t_first = t_first or time.monotonic()
    assert [l.split("] ", 1)[1] for l in seen] == [f"line {i}" for i in range(1, 6)]
    assert u.get(job["id"]).json()["state"] == "succeeded"


def test_a_large_log_streams_whole_and_tail_is_bounded(jobs):
    u = jobs("jobs-biglog")
    job = u.run(command="python -c \"[print('x' * 1000, i) for i in range(3000)]\"")
    u.wait(job["id"])
    with requests.get(f"{u.url}/jobs/{job['id']}/logs", headers=u.h, stream=True, timeout=60) as r:
        lines = [line.decode() for line in r.iter_lines() if line]
    assert len(lines) == 3000 and [int(line.rsplit(" ", 1)[1]) for line in lines] == list(range(3000))
    # a follow from the start catches up in shares (on the service's loop) and ends with the job
    with requests.get(f"{u.url}/jobs/{job['id']}/logs", params={"follow": 1}, headers=u.h, stream=True, timeout=60) as r:
        assert [line.decode() for line in r.iter_lines() if line] == lines
    tail = u.logs(job["id"], tail=2).splitlines()
    assert [line.rsplit(" ", 1)[1] for line in tail] == ["2998", "2999"]
    r = u.get(job["id"], "/logs", params={"tail": 10 ** 12})
    assert r.status_code == 400 and "at most 100000" in r.json()["message"]


def test_list_filters_and_pages(jobs):
    u = jobs("jobs-pages")
    ids = [u.run(command="true", name=f"p{i}")["id"] for i in range(5)]
    for jid in ids:
        u.wait(jid)
    page = requests.get(u.url + "/jobs", params={"limit": 2, "offset": 1}, headers=u.h).json()
    assert page["total"] == 5 and page["limit"] == 2 and [j["id"] for j in page["items"]] == ids[::-1][1:3]
    ok = requests.get(u.url + "/jobs", params={"state": "succeeded,failed"}, headers=u.h).json()
    assert ok["total"] == 5
    assert requests.get(u.url + "/jobs", params={"state": "sleeping"}, headers=u.h).status_code == 400


def test_200_concurrent_submissions_none_lost_or_duplicated(platform, jobs):
    users = [jobs(f"burst-{i}") for i in range(4)]

    def submit(i):
        u = users[i % 4]
        r = u.submit(command="true", name=f"burst{i}", submit_key=f"k{i}", gpus=1 if i % 10 == 0 else 0)
        return i, r.status_code, r.json().get("id")

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(submit, range(200)))
    assert all(code == 201 for _, code, _ in results), [r for r in results if r[1] != 201][:3]
    ids = [jid for _, _, jid in results]
    assert len(set(ids)) == 200
    # an idempotent retry of a submission returns the same job, not a new one
    again = users[0].submit(command="true", name="burst0", submit_key="k0")
    assert again.json()["id"] == results[0][2]
    total = sum(requests.get(u.url + "/jobs", headers=u.h, params={"limit": 1}).json()["total"] for u in users)
    assert total == 200
    def states_checking_quota() -> list:
        states = []
        for u in users:
            page = requests.get(u.url + "/jobs", headers=u.h, params={"limit": 500}).json()["items"]
            states += [j["state"] for j in page]
        held = platform.ledger()
        per_user = {}
        for d in held["devices"]:
            if d["user"]:
                per_user[d["user"]] = per_user.get(d["user"], 0) + 1
        assert all(n <= 2 for n in per_user.values()), per_user  # quota held throughout
        return states

    states = wait_for(states_checking_quota, lambda states: all(s in TERMINAL for s in states),
                      what="all 200 jobs to end", timeout=240, interval=1,
                      describe=lambda states: f"{sum(s not in TERMINAL for s in states)} not ended")
    assert states.count("succeeded") == 200


def test_service_crash_keeps_queued_jobs_and_readopts_running_ones(platform, jobs):
    u = jobs("jobs-crash")
    running = u.run(command="for i in $(seq 1 20); do echo tick $i; sleep 0.5; done", gpus=1, workers=2)
    u.wait(running["id"], states={"running"})
    queued = u.run(command="echo after", gpus=2)  # waits: the user's quota (2) is in use
    u.considered(queued["id"])  # a scheduling pass has held it back
    assert u.get(queued["id"]).json()["state"] == "queued"
    pids = [p for p in subprocess.check_output(["pgrep", "-f", "trainhub.services.jobs"], text=True).split()]
    mine = [int(p) for p in pids if f"TRAINHUB_DATA_DIR={platform.data_dir}".encode() in Path(f"/proc/{p}/environ").read_bytes()]
    assert len(mine) == 1
    os.kill(mine[0], signal.SIGKILL)
    # JupyterHub restarts its managed service; running workers kept going meanwhile
    def answers():
        try:
            return u.get(running["id"]).status_code
        except requests.RequestException as e:
            return repr(e)

    wait_for(answers, lambda status: status == 200, what="the jobs service to come back", timeout=90, interval=0.5)
    first = u.wait(running["id"], timeout=60)
    second = u.wait(queued["id"], timeout=60)
    assert first["state"] == "succeeded", first
    assert second["state"] == "succeeded", second
    assert u.logs(running["id"]).count("tick") == 40  # nothing lost while the service was down
    kinds = [e["kind"] for e in u.get(running["id"], "/events").json()["items"]]
    assert "adopted" in kinds


def test_openapi_document_is_served_and_matches_the_routes(platform):
    from trainhub.services.jobs.app import load_plugins, merged_openapi
    from trainhub.services.jobs.handlers import default_handlers

    served = requests.get(platform.url + "/services/trainhub/api/openapi.json").json()
    plugins = load_plugins()
    profiles = served["components"]["schemas"]["JobSpec"]["properties"]["profile"]["enum"]
    assert {"cpu", "gpu-1"} <= set(profiles)  # the platform's profiles, filled in when served
    checked_in = merged_openapi(plugins, [x for x in profiles if x is not None])
    assert served == checked_in
    import re

    from unittest import mock

    routes = set()
    service = mock.MagicMock()  # handlers only capture it; no request is served here
    patterns = default_handlers("/services/trainhub/", service)
    for mod in plugins:
        if hasattr(mod, "routes"):
            patterns += mod.routes("/services/trainhub/", service)
    for pattern, *_ in patterns:
        if "/api" not in pattern:
            continue
        path = pattern.split("/api", 1)[1]
        path = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", path)  # named groups -> {name}
        path = re.sub(r"\(j-\\d\+\|\\d\+\)", "{id}", path).replace("/?", "") or "/"
        routes.add(path)
    assert routes == set(checked_in["paths"]), (routes ^ set(checked_in["paths"]))


def test_train_magic_in_a_spawned_server_uses_its_own_token(platform, jobs):
    """In a real platform server: %%train is loaded by itself and the server's token may submit."""
    user = "magic-server"
    token = platform.token(user)
    platform.spawn(user, "cpu", token=token)
    try:
        code = (
            "get_ipython().run_cell('def helper(x):\\n    return x * 21\\n', store_history=True)\n"
            "print('loaded' if 'train' in get_ipython().magics_manager.magics['cell'] else 'missing')\n"
            "h = get_ipython().run_cell_magic('train', '--wait --name from-server', 'print(\"answer\", helper(2))')\n"
            "print('state', h.status)\n"
        )
        out = platform.kernel_exec(user, code, token=token)
        assert "loaded" in out, out
        assert "state succeeded" in out, out
    finally:
        platform.stop_server(user, token=token)
    u = jobs(user)
    listed = requests.get(u.url + "/jobs", headers=u.h).json()["items"]
    job = next(j for j in listed if j["name"] == "from-server")
    assert "answer 42" in u.logs(job["id"])


def test_notebooks_reach_the_service_on_loopback_with_the_same_checks(platform, jobs):
    """The URL the spawner gives notebooks ($TRAINHUB_API_URL) is the service itself, not the proxy: it answers
    the same API, a token it knows only for its own jobs, and nothing without one."""
    from traitlets.config import Config

    from trainhub.hub_config.embedded import configure
    from trainhub.settings import Runtime

    runtime = Runtime.load(platform.data_dir)
    c = Config()
    configure(c, str(platform.data_dir))
    direct = c.LocalGPUSpawner.api_url
    assert direct == runtime.service_url("trainhub") + "api" and not direct.startswith(platform.url)
    alice, bob = jobs("direct-alice"), jobs("direct-bob")
    job = alice.run(command="echo via loopback")
    r = requests.get(f"{direct}/jobs/{job['id']}", headers=alice.h, timeout=30)
    assert r.status_code == 200 and r.json()["id"] == job["id"]
    assert requests.get(f"{direct}/jobs/{job['id']}", headers=bob.h, timeout=30).status_code == 404
    assert requests.get(f"{direct}/jobs", timeout=30).status_code in (401, 403)
    alice.wait(job["id"])
    with requests.get(f"{direct}/jobs/{job['id']}/logs", params={"follow": 1}, headers=alice.h, stream=True,
                      timeout=60) as r:
        assert [line.decode().split("] ", 1)[1] for line in r.iter_lines() if line] == ["via loopback"]
