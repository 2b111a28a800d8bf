"""Release keeps the variables, end to end in a real `trainhub up` (hub, proxy, culler, servers, kernels):
a notebook's kernel on a GPU server defines variables; the culler releases the server (or the user gives
the GPU back); after the restart on the CPU profile, a kernel for the same notebook has them back, with
a note of what could not be kept. Simulated GPUs scripted through ``gpu-metrics.json`` and short
timeouts (as tests/culler/test_culler.py): a 10 s idle timeout, a 4 s warning, a pass every 2 s.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
import requests
from waiting import wait_for

pytestmark = pytest.mark.e2e

TIMEOUT, WARNING, CHECK = 10, 4, 2
CONFIG = f"""
from trainhub.profiles import DEFAULT_PROFILES

c.QuotaPolicy.user_gpu_limit = 2
c.Spawner.poll_interval = 2
c.CullPolicy.default_timeout = 3600
c.CullPolicy.start_grace_period = 0  # seconds-scale clocks; the first-minutes grace: test_culler_habits.py
c.CullPolicy.warning_period = {WARNING}
c.CullPolicy.profile_timeouts = {{"gpu-1": {TIMEOUT}}}
c.GPUCuller.check_interval = {CHECK}
c.GPUCuller.sample_interval = 1
c.GPUCuller.snapshot_timeout = 60
"""

DEFINE = """
import threading
n = 42
d = {"a": [1, 2, 3], "b": "text"}
base = 100
def make(k):
    return lambda x: x + k + base
add = make(5)
gen = (i for i in range(3))
fh = open("scratch.txt", "w")
lk = threading.Lock()
try:
    import numpy as np
    arr = np.arange(10)
except ImportError:
    arr = list(range(10))
print("defined")
"""
CHECK_CODE = "print('values:', n, d['a'], add(1), int(sum(arr)))"


def script_gpus(platform, util: dict[int, float], default: float) -> None:
    path = Path(platform.data_dir) / "gpu-metrics.json"
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(json.dumps({"devices": {str(d): {"utilization": u} for d, u in util.items()},
                               "default": {"utilization": default}}))
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def plat(platform_factory):
    p = platform_factory("release-vars", gpus=2, config=CONFIG, start=False)
    script_gpus(p, {}, 80)  # busy until a test makes its GPU idle
    p.start(timeout=180)
    yield p


def open_notebook(p, user: str, path: str = "work.ipynb") -> str:
    """A JupyterLab-like session for a notebook: its kernel id (the kernel knows the notebook's path)."""
    h = {"Authorization": f"token {p.token(user)}"}
    base = f"{p.url}/user/{user}/api"
    r = requests.put(f"{base}/contents/{path}", headers=h, timeout=30, json={
        "type": "notebook", "format": "json",
        "content": {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}})
    assert r.status_code in (200, 201), r.text
    r = requests.post(f"{base}/sessions", headers=h, timeout=60,
                      json={"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}})
    assert r.status_code == 201, r.text
    return r.json()["kernel"]["id"]


def on_cpu(p, user):
    model = p.server_model(user)
    return model if model and model.get("ready") and model["user_options"].get("profile") == "cpu" else None


def decisions(p, user) -> list[dict]:
    r = requests.get(p.url + "/services/trainhub-culler/api/decisions", params={"user": user, "acted": 1},
                     headers={"Authorization": f"token {p.token(user)}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["items"]


def check_restored(p, user, note_lines):
    kid = open_notebook(p, user)
    out = p.kernel_exec(user, CHECK_CODE, kernel_id=kid, timeout=90)
    assert "values: 42 [1, 2, 3] 106 45" in out, out
    assert "your variables were restored:" in out, out
    for line in note_lines:
        assert line in out, (line, out)
    # the note is shown once; the snapshot was used up
    assert "restored" not in p.kernel_exec(user, "print('again')", kernel_id=kid)
    snaps = Path(p.data_dir) / "homes" / user / ".trainhub" / "snapshots"
    assert [x.name for x in snaps.iterdir()] == [], list(snaps.iterdir())
    # a kernel that belongs to no notebook gets nothing
    assert "NameError" in p.kernel_exec(user, "try:\n    n\nexcept NameError as e:\n    print('NameError')")


def test_idle_release_keeps_a_notebooks_variables(plat):
    p, user = plat, "rv-idle"
    p.token(user)
    p.spawn(user, "gpu-1", timeout=180)
    [device] = p.held_by(user)
    kid = open_notebook(p, user)
    assert "defined" in p.kernel_exec(user, DEFINE, kernel_id=kid, timeout=90)
    script_gpus(p, {device: 0}, 80)

    def warning():
        r = requests.get(p.url + "/services/trainhub-culler/api/warnings",
                         headers={"Authorization": f"token {p.token(user)}"}, timeout=30)
        return r.json()["items"]

    [w] = wait_for(warning, timeout=TIMEOUT + 30, what=f"a warning for {user}")
    assert ("your variables will be kept (picklable values; tensors moved to CPU); open files, generators, locks "
            "and other values that cannot be pickled will not") in w["message"], w
    wait_for(lambda: on_cpu(p, user), timeout=WARNING + 90, what=f"{user} restarted on the cpu profile")
    assert p.held_by(user) == []
    [release] = [r for r in decisions(p, user) if r["action"] == "release"]
    snap = release["measurements"]["snapshot"]
    assert snap["ok"] and snap["saved"] == 1 and snap["failed"] == 0, snap
    [kernel] = snap["kernels"]
    assert kernel["notebook"] == "work.ipynb" and {"n", "d", "add", "arr", "base", "make"} <= set(kernel["kept"])
    assert set(kernel["not_kept"]) == {"gen", "fh", "lk"}, kernel
    assert '"event": "culler.snapshot", "user": "rv-idle"' in p.log()
    check_restored(p, user, ["not kept: fh (open file", "not kept: gen (generator", "not kept: lk (lock)"])


def test_give_my_gpu_back_keeps_the_variables_too(plat):
    p, user = plat, "rv-give"
    p.token(user)
    p.spawn(user, "gpu-1", timeout=180)
    assert len(p.held_by(user)) == 1  # its GPU stays busy: only the user's own request releases it
    kid = open_notebook(p, user)
    assert "defined" in p.kernel_exec(user, DEFINE, kernel_id=kid, timeout=90)
    h = {"Authorization": f"token {p.token(user)}"}
    # nobody gives back another user's GPU; a server without GPUs has nothing to give back
    r = requests.post(p.url + "/services/trainhub-culler/api/release", headers={"Authorization": f"token {p.token('rv-other')}"},
                      json={"user": user}, timeout=30)
    assert r.status_code == 403, r.text
    # through the user's own server (the JupyterLab command's path)
    r = requests.post(f"{p.url}/user/{user}/trainhub/culler/release", headers=h, timeout=60)
    assert r.status_code == 202, r.text
    assert r.json()["profile"] == "cpu" and "variables will be restored" in r.json()["message"], r.json()
    wait_for(lambda: on_cpu(p, user), timeout=120, what=f"{user} restarted on the cpu profile")
    assert p.held_by(user) == []
    [release] = wait_for(lambda: [x for x in decisions(p, user) if x["action"] == "release"], timeout=30,
                         what="the give-back in the audit trail")
    assert release["reason"] == "the user gave the GPU back: releasing" and release["acted"]
    assert release["measurements"]["snapshot"]["saved"] == 1
    check_restored(p, user, ["not kept: gen (generator"])
    r = requests.post(f"{p.url}/user/{user}/trainhub/culler/release", headers=h, timeout=60)
    assert r.status_code == 409 and "holds no GPU" in r.json()["message"], r.text
