""""Get a GPU again" keeps the variables, end to end in a real `trainhub up` (hub, proxy, jobs service and
its queue, culler, servers, kernels): a user's CPU server asks for a GPU while the only (simulated) GPU is
held; the request waits in line with its position while the server goes on running on the CPU; when the GPU
is freed, the kernels save their variables, the server restarts on the GPU profile, and a kernel for the same
notebook has them back, with the GPU visible to it.
"""

from __future__ import annotations

import pytest
import requests
from test_release_keeps_variables import CHECK_CODE, DEFINE, check_restored, decisions, open_notebook, on_cpu, script_gpus
from waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """
c.QuotaPolicy.user_gpu_limit = 2
c.Spawner.poll_interval = 2
c.GPUCuller.check_interval = 2
c.GPUCuller.sample_interval = 1
c.GPUCuller.snapshot_timeout = 60
"""


@pytest.fixture(scope="module")
def plat(platform_factory):
    p = platform_factory("regain-vars", gpus=1, config=CONFIG, start=False)
    script_gpus(p, {}, 80)  # every GPU busy: the culler releases nothing here
    p.start(timeout=180)
    yield p


def on_profile(p, user, slug):
    model = p.server_model(user)
    return model if model and model.get("ready") and model["user_options"].get("profile") == slug else None


def test_get_a_gpu_again_waits_in_line_on_the_cpu_then_restores_the_variables(plat):
    p, user, hog = plat, "rg-user", "rg-hog"
    p.token(user)
    p.spawn(hog, "gpu-1", timeout=180)  # the only GPU
    p.spawn(user, "cpu", timeout=180)
    kid = open_notebook(p, user)
    assert "defined" in p.kernel_exec(user, DEFINE, kernel_id=kid, timeout=90)
    h = {"Authorization": f"token {p.token(user)}"}
    regain = f"{p.url}/user/{user}/trainhub/culler/regain"

    r = requests.get(regain, headers=h, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["request"] is None and {"gpu-1", "gpu-2"} <= {x["slug"] for x in r.json()["profiles"]}, r.json()
    # nobody asks for another user's server; a profile the platform cannot ever give is refused at once
    r = requests.post(p.url + "/services/trainhub-culler/api/regain", json={"user": user, "profile": "gpu-1"},
                      headers={"Authorization": f"token {p.token('rg-other')}"}, timeout=30)
    assert r.status_code == 403, r.text
    r = requests.post(regain, headers=h, json={"profile": "gpu-2"}, timeout=30)
    assert r.status_code == 409 and "this platform has 1" in r.json()["message"], r.text
    r = requests.post(regain, headers=h, json={"profile": "cpu"}, timeout=30)
    assert r.status_code == 400 and "has no GPU" in r.json()["message"], r.text

    r = requests.post(regain, headers=h, json={"profile": "gpu-1"}, timeout=30)
    assert r.status_code == 202, r.text
    assert r.json()["state"] == "waiting" and "running on the CPU" in r.json()["message"], r.json()
    # in line, with its position and the scheduler's reason, while the server runs on the CPU
    req = wait_for(lambda: requests.get(regain, headers=h, timeout=30).json()["request"],
                   lambda q: q and q["position"] == 1, timeout=60, what="the request's position in line")
    assert req["state"] == "waiting" and req["reason"] and req["reason"] != "waiting for the scheduler's next pass", req
    assert on_cpu(p, user)
    assert "values: 42 [1, 2, 3] 106 45" in p.kernel_exec(user, CHECK_CODE, kernel_id=kid, timeout=60)
    r = requests.post(regain, headers=h, json={"profile": "gpu-1"}, timeout=30)
    assert r.status_code == 409 and "already waiting" in r.json()["message"], r.text

    p.stop_server(hog)  # the GPU frees: the request's turn
    wait_for(lambda: on_profile(p, user, "gpu-1"), timeout=180, what=f"{user} restarted on gpu-1")
    assert p.held_by(user) == [0] and p.held_by(hog) == []
    done = wait_for(lambda: requests.get(regain, headers=h, timeout=30).json()["request"],
                    lambda q: q and q["state"] == "done", timeout=60, what="the move to finish")
    assert done["devices"] == [0], done
    [row] = wait_for(lambda: [x for x in decisions(p, user) if x["action"] == "regain"], timeout=30,
                     what="the move in the audit trail")
    assert row["reason"].startswith("the user asked for a GPU again: restarted on gpu-1") and row["acted"], row
    snap = row["measurements"]["snapshot"]
    assert snap["ok"] and snap["saved"] == 1 and set(snap["kernels"][0]["not_kept"]) == {"gen", "fh", "lk"}, snap
    check_restored(p, user, ["not kept: fh (open file", "not kept: gen (generator", "not kept: lk (lock)"])
    assert "visible: 0" in p.kernel_exec(user, "import os; print('visible:', os.environ['CUDA_VISIBLE_DEVICES'])")
    # the GPU the server took over is its own now: a GPU server has nothing more to ask for
    r = requests.post(regain, headers=h, json={"profile": "gpu-1"}, timeout=30)
    assert r.status_code == 409 and "already holds GPUs" in r.json()["message"], r.text
    p.stop_server(user)
    assert p.held_by(user) == []


def test_a_request_withdrawn_while_in_line_leaves_the_server_on_the_cpu(plat):
    p, user, hog = plat, "rg-cancel", "rg-hog2"
    p.token(user)
    p.spawn(hog, "gpu-1", timeout=180)
    p.spawn(user, "cpu", timeout=180)
    h = {"Authorization": f"token {p.token(user)}"}
    regain = f"{p.url}/user/{user}/trainhub/culler/regain"
    assert requests.post(regain, headers=h, json={}, timeout=30).status_code == 202  # the smallest GPU profile
    r = requests.delete(regain, headers=h, timeout=30)
    assert r.status_code == 200 and "stays on the CPU" in r.json()["message"], r.text
    wait_for(lambda: requests.get(regain, headers=h, timeout=30).json()["request"],
             lambda q: q and q["state"] == "cancelled", timeout=30, what="the withdrawal")
    p.stop_server(hog)
    assert on_cpu(p, user) and p.held_by(user) == []
    assert requests.delete(regain, headers=h, timeout=30).status_code == 409
    p.stop_server(user)
