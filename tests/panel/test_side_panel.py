"""The trainhub JupyterLab side panel in a real browser (Debian's chromium via Playwright)
against a real `trainhub up`: log in, open the panel, browse storage and preview a file,
insert a dataset's loading code into a notebook, promote a model stage, see jobs.
A screenshot goes to the test's tmp folder, and to test-artifacts/browser/side-panel/ when it fails."""

from __future__ import annotations


import pytest
import requests
from waiting import wait_for

from browserlab import ARGS, CHROMIUM, Screenshots, log_in_to_lab, require_chromium

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

USER, PASSWORD = "panel-pat", "panel-secret-1"


@pytest.fixture(scope="module")
def seeded(platform):
    require_chromium()
    platform.cli("users", "add", USER, "--password", PASSWORD)
    api = platform.url + "/services/trainhub/api"
    h = {"Authorization": f"token {platform.token(USER)}"}
    storage = platform.data_dir / "storage"
    notes = storage / "users" / USER / "notes"
    notes.mkdir(parents=True, exist_ok=True)
    (notes / "readme.txt").write_text("hello from the panel test")
    ds = storage / "datasets" / "panel-flowers"
    ds.mkdir(parents=True, exist_ok=True)
    (ds / "a.jpg").write_bytes(b"\xff\xd8" + b"0" * 100)
    r = requests.post(api + "/datasets", json={"name": "panel-flowers", "path": "datasets/panel-flowers",
                                               "format": "images", "description": "flowers"}, headers=h, timeout=60)
    assert r.status_code == 201, r.text
    script = "import trainhub\ntrainhub.log_metrics(step=1, acc=0.875)\n(trainhub.outputs_dir() / 'm.bin').write_bytes(b'w')\n"
    job = requests.post(api + "/jobs", json={"name": "panel-job", "script": script, "gpus": 0}, headers=h, timeout=60).json()
    wait_for(lambda: requests.get(f"{api}/jobs/{job['id']}", headers=h, timeout=30).json()["state"],
             lambda state: state in ("succeeded", "failed"), what="the panel's seeded job to end", timeout=120, interval=0.5)
    r = requests.post(api + "/models", json={"name": "panel-model", "job": job["id"]}, headers=h, timeout=120)
    assert r.status_code == 201, r.text
    platform.spawn(USER, "cpu")
    yield {"api": api, "headers": h, "job": job["id"]}
    platform.stop_server(USER)


def test_side_panel(platform, seeded, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "trainhub" in m.text.lower() else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        shots = Screenshots(page, "side-panel", tmp_path)
        try:
            log_in_to_lab(page, platform.url, USER, PASSWORD)

            # open the panel from its left-area tab
            page.click('.lm-TabBar-tab[data-id="trainhub-panel"]')
            panel = page.locator("#trainhub-panel")
            expect(panel).to_be_visible()

            # Storage: browse into a folder and preview a file
            expect(panel.locator('.th-entry[data-path="notes"]')).to_be_visible(timeout=30_000)
            panel.locator('.th-entry[data-path="notes"] .th-name').click()
            panel.locator('.th-entry[data-path="notes/readme.txt"] .th-name').click()
            expect(panel.locator(".th-preview-text")).to_contain_text("hello from the panel test")
            # the shared datasets area
            panel.locator('.th-toolbar button[data-area="datasets"]').click()
            expect(panel.locator('.th-entry[data-path="panel-flowers"]')).to_be_visible()

            # a notebook to insert code into
            page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)

            # Datasets: insert loading code
            panel.locator('.th-tab[data-section="datasets"]').click()
            panel.locator('.th-dataset[data-name="panel-flowers"] .th-item-head').click()
            panel.locator('.th-dataset[data-name="panel-flowers"] .th-version[data-version="1"] .th-insert').click()
            expect(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .cm-content").filter(
                has_text='TrainhubClient().dataset("panel-flowers", 1)')).to_have_count(1, timeout=15_000)

            # Models: metrics and lineage shown; promote to production
            panel.locator('.th-tab[data-section="models"]').click()
            panel.locator('.th-model[data-name="panel-model"] .th-item-head').click()
            version = panel.locator('.th-model[data-name="panel-model"] .th-model-version[data-version="1"]')
            expect(version.locator(".th-metrics")).to_contain_text("acc=0.875")
            expect(version.locator(".th-job-link")).to_contain_text(seeded["job"])
            version.locator("select.th-stage").select_option("production")
            expect(panel.locator(".th-status")).to_contain_text("panel-model v1 is now production")

            # Jobs
            panel.locator('.th-tab[data-section="jobs"]').click()
            expect(panel.locator(f'.th-job[data-id="{seeded["job"]}"]')).to_contain_text("succeeded")
            panel.locator('.th-tab[data-section="models"]').click()
            panel.locator('.th-model[data-name="panel-model"] .th-item-head').click()
            expect(panel.locator(".th-model-version select.th-stage")).to_have_value("production")

            # Usage: the user's own GPU-hours summary (served by the usage API through the server)
            panel.locator('.th-tab[data-section="usage"]').click()
            expect(panel.locator(".th-usage-total")).to_contain_text("GPU-h held")
            expect(panel.locator("table.th-usage")).to_contain_text("GPU-h used")
            shots.take("usage")
        except Exception:
            shots.save_failure()
            raise
        finally:
            browser.close()
    v = requests.get(seeded["api"] + "/models/panel-model/versions/1", headers=seeded["headers"], timeout=30).json()
    assert v["stage"] == "production"
    assert [(e["user"], e["to"]) for e in v["stage_history"]] == [(USER, "production")]
    assert not errors, errors
