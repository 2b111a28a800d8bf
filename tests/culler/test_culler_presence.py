"""Who is at the server, as a real browser shows it: the fact the culler's away path and the
culler benchmark's activity model rest on, measured on the real stack (JupyterHub, the
configurable-http-proxy, jupyter-server, JupyterLab 4 in Debian's chromium).

1. A user opens a notebook in JupyterLab, then the tab is hidden (``document.hidden``, as when
   another tab or window is in front or the window is minimised) and nobody touches it.
   JupyterLab's polls stand by, yet the hub's ``last_activity`` for the server (all that
   jupyterhub-idle-culler reads) keeps moving: jupyter-server pings the kernel websocket every
   30 s, the browser answers, and the proxy counts that traffic as activity. An open tab keeps
   an activity culler away for as long as the machine is awake.
2. trainhub's culler sees the same tab as an open kernel connection and does not take the
   shorter away timeout, though the GPU is idle (only the long GPU timeout applies).
3. The browser goes away (closed, or a laptop asleep: the server drops the websocket when pings
   go unanswered): nobody is connected, so the idle GPU is warned about and released after
   ``away_timeout``, and the device is back in the ledger.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest
import requests

from browserlab import ARGS, CHROMIUM, culler_platform, log_in_to_lab, script_gpus
from waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

USER, PASSWORD = "present-pat", "present-secret-1"
AWAY, WARNING, CHECK = 30, 10, 2
HIDDEN_FOR = 75  # > two websocket pings (30 s) plus the hub's activity poll (5 s here)
BUSY = 80

CONFIG = f"""
# the culler presence browser test: a 30 s away timeout, a GPU timeout never reached
from trainhub.profiles import DEFAULT_PROFILES

c.QuotaPolicy.user_gpu_limit = 2
c.Spawner.poll_interval = 2
c.ProfileCatalog.profiles = DEFAULT_PROFILES
c.CullPolicy.default_timeout = 7200
c.CullPolicy.start_grace_period = 0  # seconds-scale clocks; the first-minutes grace: test_culler_habits.py
c.CullPolicy.release_timeout = 0  # presence against the long GPU clock (the short release clock has its own tests)
c.CullPolicy.away_timeout = {AWAY}
c.CullPolicy.warning_period = {WARNING}
c.GPUCuller.check_interval = {CHECK}
c.GPUCuller.sample_interval = 1
c.JupyterHub.last_activity_interval = 5
"""

HIDE = """() => {
    Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'hidden'});
    Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});
    document.dispatchEvent(new Event('visibilitychange'));
}"""


def ts(value: str | None) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else 0.0


@pytest.fixture(scope="module")
def presence_platform(platform_factory):
    # the GPU is busy until the notebook is open: nobody is connected before that
    p = culler_platform(platform_factory, "culler-presence", CONFIG, USER, PASSWORD, busy=BUSY)
    yield p
    if p.running:
        p.stop()


def latest_decision(p) -> dict:
    r = requests.get(p.url + "/services/trainhub-culler/api/decisions", params={"user": USER, "limit": 1},
                     headers={"Authorization": f"token {p.admin_token}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["items"][0]


def connected_kernel(p, timeout: float = 60) -> dict:
    """Wait until the notebook's kernel is up with the tab's websocket connected."""
    def kernels():
        r = requests.get(f"{p.url}/user/{USER}/api/kernels", params={"no_track_activity": 1},
                         headers={"Authorization": f"token {p.token(USER)}"}, timeout=30)
        return r.json() if r.status_code == 200 else [r.status_code]

    def ready(kernels):
        return [k for k in kernels if isinstance(k, dict) and k["connections"] >= 1 and k["execution_state"] == "idle"]

    return ready(wait_for(kernels, ready, what="a connected idle kernel", timeout=timeout, interval=0.5))[0]


def culler_pid(p) -> int:
    from trainhub.boundary.procs import INSTANCE_VAR, processes_with

    pids = [pid for pid in processes_with(INSTANCE_VAR, p.instance)
            if b"trainhub.services.culler" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(pids) == 1, pids
    return pids[0]


def hub_last_activity(p) -> float:
    model = p.server_model(USER, token=p.admin_token)
    return ts(model["last_activity"])


def test_hidden_tab_stays_connected_closed_browser_is_released(presence_platform):
    from playwright.sync_api import sync_playwright

    p = presence_platform
    devices = p.held_by(USER)
    requests_seen: list[tuple[float, str]] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        log_in_to_lab(page, p.url, USER, PASSWORD)
        page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
        connected_kernel(p)

        # the GPU idles; the tab goes to the background and nobody touches it. The culler's own
        # kernels/status polling goes through the proxy too: it is paused while the hub's view is measured
        script_gpus(p, 0)
        page.on("request", lambda r: requests_seen.append((time.time(), r.url)))
        page.evaluate(HIDE)
        culler = culler_pid(p)
        os.kill(culler, signal.SIGSTOP)
        try:
            hidden_at = time.time()
            seen = []  # (seconds since hidden, hub last_activity - hidden_at)

            def activity():
                seen.append((round(time.time() - hidden_at), round(hub_last_activity(p) - hidden_at, 1)))
                return seen[-1][1]

            # what jupyterhub-idle-culler reads kept moving (websocket pings every 30 s, plus a few polls a
            # minute): the hub's last_activity reaches HIDDEN_FOR - 30 s after hiding, the tab still hidden
            wait_for(activity, lambda since_hidden: since_hidden >= HIDDEN_FOR - 30,
                     what="the hub's last_activity to move on with the tab hidden", timeout=HIDDEN_FOR + 90,
                     interval=5, describe=lambda _: f"(t, hub last_activity - hidden_at) seen: {seen}")
        finally:
            os.kill(culler, signal.SIGCONT)
        resumed_at = time.time()
        polls = [(round(t - hidden_at), u.split("/user/")[-1].split("?")[0]) for t, u in requests_seen]
        print(f"\nhidden tab: (t, hub last_activity) {seen}\nits HTTP requests: {polls}")
        assert seen[-1][1] >= HIDDEN_FOR - 30, f"the hub's last_activity stopped with the tab hidden: {seen}"

        # a culler pass after it resumed that measured the idle GPU and who is connected
        d = wait_for(lambda: latest_decision(p),
                     lambda d: ts(d["at"]) > resumed_at and "idle_s" in d["measurements"],
                     what="a culler decision measuring the idle GPU after it resumed", timeout=10 * CHECK + 30)
        # trainhub's culler counted the tab as present: GPU idle for longer than away_timeout, no warning
        assert d["action"] == "none" and "of 2h00m" in d["reason"], d
        assert d["measurements"]["server"]["connections"] >= 1, d
        assert not d["measurements"].get("away"), d
        assert p.held_by(USER) == devices
        browser.close()
    closed_at = time.time()

    # nobody connected: warned, then released to the CPU profile within away_timeout (+ passes)
    def decisions():
        r = requests.get(p.url + "/services/trainhub-culler/api/decisions", params={"user": USER, "limit": 1000},
                         headers={"Authorization": f"token {p.admin_token}"}, timeout=30)
        return r.json()["items"]

    def releases(rows):
        return [row for row in rows if row["action"] == "release" and row["acted"]]

    rows = wait_for(decisions, releases, what="the released GPU of the closed browser", timeout=AWAY + 90, interval=1,
                    describe=lambda rows: f"latest decisions: {rows[:3]}")
    released = releases(rows)
    released_after = time.time() - closed_at
    (release,) = released
    assert p.held_by(USER) == []
    assert release["measurements"]["away"] is True and "nobody connected" in release["reason"], release
    assert release["measurements"]["server"]["connections"] == 0
    assert release["devices"] == devices
    assert [row for row in rows if row["action"] == "warn" and "nobody connected" in row["reason"]]
    print(f"\n[culler presence] hidden {HIDDEN_FOR} s: hub last_activity {seen[-1][1]:.0f} s after hiding; "
          f"closed browser released after {released_after:.0f} s (away_timeout {AWAY} s)")
