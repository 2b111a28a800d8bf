"""This server's GPUs in JupyterLab's status bar (plugin ``trainhub:gpu-status``) in a real browser
(Debian's chromium via Playwright) against a private `trainhub up` with only the culler:

a user logs in through the form into JupyterLab on a gpu-1 server whose simulated GPU is scripted busy
(``<data-dir>/gpu-metrics.json``): the status bar shows the device as simulated with the culler's
utilisation and memory and no countdown. The GPU goes idle: the culler's clock runs and the status bar
says how long it has been idle and when the GPU is released, with a "keep" link; pressing it restarts
the culler's clock (a ``keep`` row in its audit trail, the idle time shown starts again from zero).

The plugin polls every 5 s; the test sets the ``localStorage`` key ``trainhub:gpustatus:poll-ms`` to
1000 before JupyterLab loads. Screenshots (tmp_path; test-artifacts/browser/gpu-status/ on failure):
the busy and the idle status bar at the default 1400 px width.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

import pytest
import requests

from browserlab import ARGS, CHROMIUM, Screenshots, culler_platform, log_in_to_lab
from waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

USER, PASSWORD = "status-stella", "status-secret-1"
# the warning would come at TIMEOUT - WARNING = 90 s of idleness: the keep comes well before
TIMEOUT, WARNING, CHECK = 150, 60, 2
BUSY = 80

CONFIG = f"""
# the status bar browser test: seconds instead of hours
from trainhub.profiles import DEFAULT_PROFILES

c.QuotaPolicy.user_gpu_limit = 2
c.Spawner.poll_interval = 2
c.ProfileCatalog.profiles = DEFAULT_PROFILES
c.CullPolicy.default_timeout = 3600
c.CullPolicy.start_grace_period = 0  # seconds-scale clocks; the first-minutes grace: test_culler_habits.py
c.CullPolicy.warning_period = {WARNING}
c.CullPolicy.profile_timeouts = {{"gpu-1": {TIMEOUT}}}
c.GPUCuller.check_interval = {CHECK}
c.GPUCuller.sample_interval = 1
"""


def script(platform, utilization: float, memory_used_mb: float) -> None:
    """Every simulated GPU at ``utilization`` % with ``memory_used_mb`` MiB in use (atomic rewrite)."""
    path = Path(platform.data_dir) / "gpu-metrics.json"
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(json.dumps({"devices": {}, "default": {"utilization": utilization, "memory_used_mb": memory_used_mb}}))
    os.replace(tmp, path)


def idle_seconds(text: str) -> int | None:
    """The idle time the status bar shows while it is under a minute ("idle 12 s")."""
    m = re.search(r"idle (\d+) s\b", text)
    return int(m.group(1)) if m else None


@pytest.fixture(scope="module")
def lab_platform(platform_factory):
    p = culler_platform(platform_factory, "gpu-status", CONFIG, USER, PASSWORD, busy=BUSY)
    yield p
    if p.running:
        p.stop()


def test_status_bar_shows_the_gpu_and_the_culler_clock(lab_platform, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    p = lab_platform
    culler = p.url + "/services/trainhub-culler"
    admin = {"Authorization": f"token {p.admin_token}"}
    [device] = p.held_by(USER)
    script(p, BUSY, 2150)
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.add_init_script("window.localStorage.setItem('trainhub:gpustatus:poll-ms', '1000');")
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "trainhub" in m.text.lower() else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        shots = Screenshots(page, "gpu-status", tmp_path)
        try:
            with shots.on_failure():
                log_in_to_lab(page, p.url, USER, PASSWORD, reset=True)
                item = page.locator("#jp-main-statusbar .th-gpustatus")
                text = item.locator(".th-gpustatus-text")
                keep = item.get_by_role("button", name="keep")

                # busy: the device, labelled simulated, with the culler's numbers; no countdown, no keep
                expect(text).to_have_text(f"GPU {device} (sim) {BUSY}% · 2.1/16 GiB", timeout=60_000)
                expect(keep).to_be_hidden()
                assert "simulated" in (item.get_attribute("title") or "")
                assert "not culled: GPU busy 80%" in item.get_attribute("title")
                shots.take("busy")

                # idle: the culler's clock runs; the status bar counts it and offers keep
                script(p, 0, 2150)
                expect(text).to_contain_text(f"GPU {device} (sim) 0% · 2.1/16 GiB · idle ", timeout=30_000)
                expect(text).to_contain_text(re.compile(r"idle \d+ s, released in \d+ min —$"), timeout=10_000)
                expect(keep).to_be_visible()
                # the numbers of the culler's own answer (the same clock the status bar reads)
                own = requests.get(culler + "/api/gpus", params={"server": ""},
                                   headers={"Authorization": f"token {p.token(USER)}"}, timeout=30).json()
                assert own["clock"]["running"] and own["clock"]["action"] == "release" and own["can_keep"], own
                assert [(d["index"], d["simulated"]) for d in own["devices"]] == [(device, True)]
                before = wait_for(lambda: idle_seconds(text.inner_text()), lambda s: s is not None and s >= 8,
                                  what="the status bar idle for 8 s or more", timeout=60, interval=0.5)
                assert "restarts without GPUs" in item.get_attribute("title")
                shots.take("idle")

                # keep: the culler's clock restarts, the status bar shows it
                keep.click()
                wait_for(lambda: idle_seconds(text.inner_text()), lambda s: s is not None and s < before,
                         what=f"the idle time shown to restart (was {before} s)", timeout=30, interval=0.3)
                expect(keep).to_be_visible()
                shots.take("kept")
        finally:
            browser.close()

    rows = requests.get(culler + "/api/decisions", params={"user": USER, "limit": 1000}, headers=admin,
                        timeout=30).json()["items"]
    keeps = [(r["user"], r["server"], r["acted"]) for r in rows if r["action"] == "keep"]
    assert keeps == [(USER, "", True)], rows
    assert not [r for r in rows if r["action"] in ("warn", "release", "stop")], rows
    assert p.held_by(USER) == [device]
    assert not errors, errors
