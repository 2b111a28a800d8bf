"""Pattern 6 of issue 32, "the hub is a single point of failure": SIGKILL of JupyterHub no longer takes the platform
down. `trainhub up` starts the hub again (trainhub.app.supervise); a user's server lives on through it (same process,
its kernel's variables intact, reached through the proxy again), a running job keeps running and keeps its progress,
and the ledger still shows each device held once, by the same holders.
"""

from __future__ import annotations

import os
import signal

import pytest
import requests

from test_isolation import User
from waiting import wait_for

pytestmark = pytest.mark.e2e

JOB = """
import os, pathlib, time
flag = pathlib.Path(os.environ["HOME"], "go-on")
step = 0
while not flag.exists():
    print("step", step, flush=True)
    step += 1
    time.sleep(0.5)
print("finished after step", step, flush=True)
"""


def _hub_pid(platform) -> int:
    """The JupyterHub process below this platform's `trainhub up`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            env = open(f"/proc/{entry}/environ", "rb").read()
        except OSError:
            continue
        if b"jupyterhub" in cmd and b"-m" in cmd and f"TRAINHUB_DATA_DIR={platform.data_dir}".encode() in env:
            found.append(int(entry))
    assert len(found) == 1, found
    return found[0]


def test_a_killed_hub_comes_back_and_servers_and_jobs_live_on(platform_factory):
    p = platform_factory("supervised")
    alice = User(p, "sup-alice")
    p.spawn("sup-alice", "gpu-1")
    held = p.held_by("sup-alice")
    assert len(held) == 1
    kernel = requests.post(f"{p.url}/user/sup-alice/api/kernels", json={"name": "python3"},
                           headers={"Authorization": f"token {p.token('sup-alice')}"}, timeout=60).json()["id"]
    assert "set" in p.kernel_exec("sup-alice", "x = 42; print('set')", kernel_id=kernel)
    server_pid = p.api("GET", "/users/sup-alice").json()["servers"][""]["state"]["pid"]
    job = alice.submit(script=JOB, name="long", gpus=1)
    wait_for(lambda: alice.logs(job["id"]), lambda text: "step 3" in text, what="the job's first steps", timeout=120)
    old_hub = _hub_pid(p)

    os.kill(old_hub, signal.SIGKILL)

    wait_for(lambda: "starting it again" in p.output, bool, what="trainhub up to restart the hub", timeout=60)
    new_hub = wait_for(lambda: _hub_pid(p) if _try(lambda: p.api("GET", "/users/sup-alice").status_code) == 200 else None,
                       lambda pid: pid is not None, what="the hub to answer again", timeout=120)
    assert new_hub != old_hub and p.running
    # the same server process, its kernel's variables intact, reached through the proxy again
    model = p.api("GET", "/users/sup-alice").json()["servers"][""]
    assert model["ready"] and model["state"]["pid"] == server_pid
    assert wait_for(lambda: _try(lambda: p.kernel_exec("sup-alice", "print(x)", kernel_id=kernel, timeout=30)),
                    lambda out: out and out.strip() == "42", what="the kernel through the new proxy", timeout=90)
    # the ledger: the same device held by the same server, the job's own, nothing held twice
    assert p.held_by("sup-alice") and held[0] in p.held_by("sup-alice")
    devices = [d["device"] for d in p.ledger()["devices"] if d["user"]]
    assert len(devices) == len(set(devices)) == 2, p.ledger()
    # the job kept running and kept its progress
    before = alice.logs(job["id"]).count("step ")
    wait_for(lambda: alice.logs(job["id"]).count("step "), lambda n: n > before + 2, what="the job's next steps", timeout=120)
    (p.data_dir / "homes" / "sup-alice" / "go-on").write_text("")
    done = alice.wait(job["id"], timeout=120)
    logs = alice.logs(job["id"])
    assert done["state"] == "succeeded" and done["attempt"] == 1, (done, logs[-1500:])
    assert "step 0" in logs and "finished after step" in logs
    p.stop_server("sup-alice")


def _try(fn):
    try:
        return fn()
    except Exception:
        return None
