"""`make up` as a person runs it: a quiet start, a queued spawn that fails says why, and Ctrl-C stops everything
cleanly, a second Ctrl-C included.

Before: the start logged about five `GET /api/routes` lines a second (the route to the hub was polled through the
proxy's API), the hub logged the jobs service's `GET /hub/api/groups` every 30 s at INFO, a queued spawn ended after
the hub's start_timeout with an empty "Spawn failed: ", and a Ctrl-C reached JupyterHub twice (from the terminal and
from `trainhub up`): "Failed to stop user: ''", a KeyError, tasks destroyed while pending, and a second Ctrl-C an
AttributeError. The terminal's Ctrl-C is a SIGINT to the foreground process group: `os.killpg` below.
"""

from __future__ import annotations

import json
import os
import re
import signal

import pytest
import requests

from waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """
c.Spawner.poll_interval = 2
c.LocalGPUSpawner.max_queue_wait = 15  # longer than the hub's slow_spawn_timeout (10 s): the POST answers 202
c.GPUCuller.check_interval = 3
"""
#: what a stop must never print (in `trainhub up`'s output or the hub's log)
NOT_CLEAN = ("Traceback", "KeyError", "AttributeError", "Failed to stop user", "Task was destroyed but it is pending",
             "Exception ignored", "Error")


@pytest.fixture(scope="module")
def plat(platform_factory):
    p = platform_factory("clean-stop", gpus=1, config=CONFIG)
    yield p


def metric(p, name: str, **labels) -> float:
    """A counter of the hub's /hub/metrics (0 when absent)."""
    r = requests.get(f"{p.url}/hub/metrics", headers={"Authorization": f"token {p.admin_token}"}, timeout=30)
    r.raise_for_status()
    total = 0.0
    for line in r.text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_start_does_not_poll_the_proxys_routes(plat):
    log = plat.log()
    start = log[log.index("Proxy API at"):log.index("JupyterHub is now running")]
    # JupyterHub's own looks at its routes (two at start); `trainhub up` waits for the hub's "now running" line
    assert len(re.findall(r"GET /api/routes", start)) <= 2, start


def test_a_spawn_that_waits_too_long_in_line_says_why(plat):
    """max_queue_wait (15 s here) ends the wait, with the reason in the progress stream (the pending page reads it)."""
    plat.spawn("qa-holder", "gpu-1", timeout=180)
    r = plat.api("POST", "/users/qa-waiter/server", plat.token("qa-waiter"), json={"profile": "gpu-1"})
    assert r.status_code == 202, r.text
    events = []
    with requests.get(f"{plat.url}/hub/api/users/qa-waiter/server/progress", stream=True, timeout=120,
                      headers={"Authorization": f"token {plat.token('qa-waiter')}"}) as stream:
        for line in stream.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                events.append(json.loads(line[5:]))
                if events[-1].get("failed"):
                    break
    failed = events[-1]
    assert failed.get("failed"), events
    assert failed["message"].startswith("Spawn failed: No GPU became free for 1 GPU within 15s in line (last: "), failed
    assert any("in line" in e["message"] for e in events[:-1]), events
    assert plat.server_model("qa-waiter") is None and plat.held_by("qa-waiter") == []


def test_the_services_polling_of_the_hub_is_not_logged_at_info(plat):
    """The jobs service reads the groups every 30 s and the culler lists the users on every pass (while a server holds
    a GPU: qa-holder's): both are counted in the hub's request metrics (so they happened), neither is an INFO line of
    the hub's log any more."""
    counted = {
        "groups": ("jupyterhub.apihandlers.groups.GroupListAPIHandler", "GET /hub/api/groups"),
        "users": ("jupyterhub.apihandlers.users.UserListAPIHandler", "GET /hub/api/users?state=active"),
    }
    for what, (handler, line) in counted.items():
        wait_for(lambda: metric(plat, "jupyterhub_request_duration_seconds_count", handler=handler, method="GET",
                                code="200"), lambda n: n >= 1, what=f"a {what} request by a service", timeout=120)
        infos = [x for x in plat.log().splitlines() if line in x and x.startswith("[I ")]
        assert infos == [], infos
    # users' own requests are still logged as JupyterHub logs them
    plat.api("GET", "/users/nobody-here", plat.token("qa-reader"))
    assert re.search(r"\[W .*404 GET /hub/api/users/nobody-here", plat.log())


def test_ctrl_c_twice_stops_everything_cleanly(plat):
    """Ctrl-C with a server and a kernel running, then Ctrl-C again while it stops: no error anywhere, the server
    stopped by the hub (not ended as a leftover), nothing of the platform left."""
    assert plat.server_model("qa-holder")
    assert "up" in plat.kernel_exec("qa-holder", "print('up')", keep_kernel=True)
    log_before = len(plat.log())
    os.killpg(plat.proc.pid, signal.SIGINT)
    wait_for(lambda: plat.output, lambda out: "SIGINT received, stopping" in out, what="the first Ctrl-C to be taken",
             timeout=30)
    os.killpg(plat.proc.pid, signal.SIGINT)  # the impatient second one, while it stops
    assert plat.proc.wait(timeout=180) == 0
    out, log = plat.output, plat.log()[log_before:]
    assert "already stopping (SIGINT ignored)" in out, out
    for text in NOT_CLEAN:
        assert text not in out, out
        assert text not in log, log
    assert "Received signal SIGTERM, initiating shutdown" in log and "Received signal SIGINT" not in log, log
    assert log.count("initiating shutdown") == 1, log
    assert "Released devices [0] of qa-holder" in log, log  # the hub stopped the server itself
    assert "trainhub: stopped" in out, out
    plat.stop()  # only checks: no process with the instance marker is left
