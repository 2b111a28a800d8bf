"""Variables survive any number of moves, in either direction, end to end in a real `trainhub up` (hub, proxy, jobs
service and its queue, culler, servers under their users' accounts, real kernels): "give my GPU back" and "get a GPU
again" alternate five times; after each, a new kernel for the same notebook has every value back — ints, strings,
lists, dicts, a numpy array, a torch tensor, an instance of a class defined in the notebook, a function, a lambda —
and `%who` lists them. Before, the second move kept nothing: a restored variable was hidden from `%who` and from the
next snapshot.
"""

from __future__ import annotations

import pytest
import requests

from test_release_keeps_variables import decisions, open_notebook, script_gpus
from waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CONFIG = """
c.QuotaPolicy.user_gpu_limit = 2
c.Spawner.poll_interval = 2
c.GPUCuller.check_interval = 2
c.GPUCuller.sample_interval = 1
c.GPUCuller.snapshot_timeout = 60
c.GPUCuller.move_notice_grace = 0
"""
DEFINE = """
import numpy as np
import torch
n = 42
s = "text"
items = [1, [2, 3], "x"]
d = {"a": 1, "b": [1, 2]}
arr = np.arange(6).reshape(2, 3)
t = torch.arange(4.0)
class Point:
    def __init__(self, x):
        self.x = x
    def double(self):
        return self.x * 2
p = Point(21)
def twice(x):
    return 2 * x
sq = lambda x: x * x
print("defined")
"""
CHECK = """
print("check", n, s, items, d, int(arr.sum()), float(t.sum()), p.double(), type(p).__name__, twice(4), sq(5))
print("who", *get_ipython().run_line_magic("who_ls", ""))
"""
EXPECTED = "check 42 text [1, [2, 3], 'x'] {'a': 1, 'b': [1, 2]} 15 6.0 42 Point 8 25"
WHO = ["Point", "arr", "d", "items", "n", "np", "p", "s", "sq", "t", "torch", "twice"]


@pytest.fixture(scope="module")
def plat(platform_factory):
    p = platform_factory("five-moves", gpus=1, config=CONFIG, start=False)
    script_gpus(p, {}, 80)  # busy: only the user's own requests move the server
    p.start(timeout=180)
    yield p


def on(p, user, profile):
    model = p.server_model(user)
    return model if model and model.get("ready") and model["user_options"].get("profile") == profile else None


def test_five_moves_back_and_forth_keep_every_kind_of_value(plat):
    p, user = plat, "five-fay"
    h = {"Authorization": f"token {p.token(user)}"}
    base = f"{p.url}/user/{user}/trainhub/culler"
    p.spawn(user, "gpu-1", timeout=180)
    kid = open_notebook(p, user, "moves.ipynb")
    assert "defined" in p.kernel_exec(user, DEFINE, kernel_id=kid, timeout=180)
    profile = "gpu-1"
    for move in range(1, 6):
        if profile == "gpu-1":  # give my GPU back
            r = requests.post(f"{base}/release", headers=h, timeout=60)
            assert r.status_code == 202, r.text
            profile = "cpu"
        else:  # get a GPU again (the GPU is free: granted at the queue's next pass)
            r = requests.post(f"{base}/regain", headers=h, json={"profile": "gpu-1"}, timeout=60)
            assert r.status_code == 202, r.text
            profile = "gpu-1"
        wait_for(lambda: on(p, user, profile), timeout=240, what=f"move {move}: {user} on {profile}")
        if profile == "gpu-1":
            wait_for(lambda: requests.get(f"{base}/regain", headers=h, timeout=30).json()["request"],
                     lambda q: q and q["state"] == "done", timeout=60, what=f"move {move}: the regain to finish")
        kid = open_notebook(p, user, "moves.ipynb")  # the notebook's new kernel (as JupyterLab's reload makes it)
        out = p.kernel_exec(user, CHECK, kernel_id=kid, timeout=180)
        assert "your variables were restored" in out, (move, out)
        assert EXPECTED in out, (move, out)
        who = next(line.split()[1:] for line in out.splitlines() if line.startswith("who "))
        assert who == WHO, (move, out)
    rows = decisions(p, user)
    assert sorted(r["action"] for r in rows) == ["regain", "regain", "release", "release", "release"], rows
    for row in rows:  # every snapshot kept every value (none was hidden, none lost)
        [kernel] = row["measurements"]["snapshot"]["kernels"]
        assert sorted(kernel["kept"]) == WHO and kernel["not_kept"] == {}, row
    p.stop_server(user)
