"""The idle-GPU warning in JupyterLab (plugin ``trainhub:culler-notification``) in a real browser
(Debian's chromium via Playwright) against a private `trainhub up` with fast culler settings:

a user logs in through the form into JupyterLab on a gpu-1 server and types into a notebook; the
scripted metrics (``<data-dir>/gpu-metrics.json``) make the GPU idle; the culler warns; the
notification appears with "Keep my GPU" and "Save all", and the notebook was saved automatically;
clicking "Keep my GPU" shows the culler's answer, dismisses the warning, records a ``keep`` in the
culler's audit trail, and the server keeps its GPU. Still idle, it is warned again (a new notification);
when the GPU gets busy the warning is withdrawn and the notification goes away.

The plugin polls every 30 s; the test sets the ``localStorage`` key ``trainhub:culler:poll-ms`` to
1000 before JupyterLab loads. The warning period is 60 s so there is time to click.
A screenshot of the warning is saved as test-artifacts/browser/culler-notification.png.
"""

from __future__ import annotations

from datetime import datetime

import pytest
import requests

from browserlab import ARGS, ARTIFACTS, CHROMIUM, culler_platform, log_in_to_lab, script_gpus
from waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

USER, PASSWORD = "nagged-nina", "nagged-secret-1"
# the warning comes at TIMEOUT - WARNING = 15 s of idleness; after a keep, again 15 s later
TIMEOUT, WARNING, CHECK = 75, 60, 2
BUSY = 80
MARK = "print('saved by the culler warning')"

CONFIG = f"""
# the culler notification browser test: seconds instead of hours, a long warning to click in
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


@pytest.fixture(scope="module")
def lab_platform(platform_factory):
    p = culler_platform(platform_factory, "culler-notify", CONFIG, USER, PASSWORD, busy=BUSY)
    yield p
    if p.running:
        p.stop()


def test_keep_my_gpu_from_the_notification(lab_platform):
    from playwright.sync_api import expect, sync_playwright

    p = lab_platform
    culler = p.url + "/services/trainhub-culler"
    admin = {"Authorization": f"token {p.admin_token}"}
    mine = {"Authorization": f"token {p.token(USER)}"}
    devices = p.held_by(USER)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.add_init_script("window.localStorage.setItem('trainhub:culler:poll-ms', '1000');")
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "trainhub" in m.text.lower() else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            log_in_to_lab(page, p.url, USER, PASSWORD)

            # unsaved work in a notebook
            page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell .cm-content", timeout=60_000)
            page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first.click()
            page.keyboard.type(MARK)
            expect(page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first).to_contain_text(MARK)
            path = page.locator(".jp-NotebookPanel").first.get_attribute("data-jp-path") or ""

            # the GPU goes idle: the culler warns within TIMEOUT + a pass; the plugin polls every second
            script_gpus(p, 0)
            keep_button = page.get_by_role("button", name="Keep my GPU")
            expect(keep_button).to_be_visible(timeout=(TIMEOUT - WARNING + 40) * 1000)
            toast = page.locator(".Toastify__toast").filter(has=keep_button)
            expect(toast).to_contain_text(f"GPU {devices[0]}")
            expect(toast.get_by_role("button", name="Save all")).to_be_visible()
            warnings = requests.get(culler + "/api/warnings", headers=mine, timeout=30).json()["items"]
            assert [(w["user"], w["server"]) for w in warnings] == [(USER, "")], warnings
            news = page.locator(".Toastify__toast").filter(has_text="official Jupyter news")
            if news.count():
                news.get_by_role("button", name="No", exact=True).click()
            page.wait_for_timeout(1500)  # the toast's slide-in animation
            page.screenshot(path=str(ARTIFACTS / "culler-notification.png"))

            # docmanager:save-all ran once when the warning appeared
            if not path:
                path = "Untitled.ipynb"
            def saved_sources():
                r = requests.get(f"{p.url}/user/{USER}/api/contents/{path}", headers=mine, timeout=30)
                assert r.status_code == 200, r.text
                return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                        for c in r.json()["content"]["cells"]]

            wait_for(saved_sources, lambda sources: MARK in sources, what="the notebook saved on the warning",
                     timeout=30, interval=0.5)

            keep_button.click()
            expect(page.locator(".Toastify__toast").filter(has_text="Idle clock restarted")).to_be_visible(timeout=15_000)
            expect(page.get_by_role("button", name="Keep my GPU")).to_have_count(0, timeout=10_000)
            # withdrawn at the culler too: no warning from before the keep is left (a new one would come only
            # TIMEOUT - WARNING after the keep, with a warned_at after it)
            [keep] = [row for row in requests.get(culler + "/api/decisions", params={"user": USER, "limit": 1000},
                                                  headers=admin, timeout=30).json()["items"] if row["action"] == "keep"]
            left = requests.get(culler + "/api/warnings", headers=mine, timeout=30).json()["items"]
            assert [w for w in left if datetime.fromisoformat(w["warned_at"]) <= datetime.fromisoformat(keep["at"])] == []
            page.screenshot(path=str(ARTIFACTS / "culler-notification-kept.png"))

            # still idle: the culler warns again (a new warned_at: a new notification); once the GPU is
            # busy the warning disappears from the culler and the notification is dismissed
            expect(page.get_by_role("button", name="Keep my GPU")).to_have_count(1, timeout=(TIMEOUT - WARNING + 30) * 1000)
            script_gpus(p, BUSY)
            expect(page.get_by_role("button", name="Keep my GPU")).to_have_count(0, timeout=30_000)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "culler-notification-failure.png"))
            raise
        finally:
            browser.close()

    # the keep reached the culler for this user's default server; the GPU is still held
    r = requests.get(culler + "/api/decisions", params={"user": USER, "limit": 1000}, headers=admin, timeout=30)
    assert r.status_code == 200, r.text
    rows = r.json()["items"]
    keeps = [row for row in rows if row["action"] == "keep"]
    assert [(k["user"], k["server"], k["acted"]) for k in keeps] == [(USER, "", True)], rows
    assert not [row for row in rows if row["acted"] and row["action"] in ("release", "stop")], rows
    assert p.held_by(USER) == devices
    model = p.server_model(USER)
    assert model and model["ready"]
    assert not errors, errors
