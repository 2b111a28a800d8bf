"""A `%%train` output in JupyterLab outlives its widget (issue 34), in a real browser (Debian's chromium via
Playwright) against the shared running platform:

- run a `%%train` cell: the live widget shows the job running;
- restart the kernel while the job runs: the widget's model is gone, and the output shows a live view of the job
  from the jobs API (never "Error displaying widget: model not found"), which follows it to "succeeded" and its
  last log line;
- reload the page (a new kernel holds no model of the old one): the saved output is the same live view;
- its "Jobs table" button opens the jobs table on that job, and the static HTML's `lab?trainhub-job=ID` link too;
- a cell run and the page reloaded with its kernel alive: the widget is re-attached (or the live view shown), never
  "model not found".

Screenshots of each step are written to the test's tmp folder (looked at while developing) and copied to
test-artifacts/browser/live-output/ when the test fails.
"""

from __future__ import annotations

import json
import re

import pytest
import requests

from browserlab import ARGS, CHROMIUM, Screenshots, log_in_to_lab, require_chromium, run_command

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

USER, PASSWORD = "live-lou", "live-lou-secret-1"
NOTEBOOK = "live-output.ipynb"
RUNNING_JOB = ("%%train --as job --name live-output\n"
               "import time\n"
               "for i in range(6):\n"
               "    print(f'step {i}', flush=True)\n"
               "    time.sleep(1)\n"
               "print('the last line of the job', flush=True)")
QUICK_JOB = "%%train --wait --as quick --name live-quick\nprint('a quick one', flush=True)"
NOT_FOUND = "model not found"


@pytest.fixture(scope="module")
def lab_user(platform):
    require_chromium()
    platform.cli("users", "add", USER, "--password", PASSWORD)
    platform.spawn(USER, "cpu", timeout=180)
    token = platform.token(USER)
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": src}
                    for src in (RUNNING_JOB, QUICK_JOB)],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    r = requests.put(f"{platform.url}/user/{USER}/api/contents/{NOTEBOOK}", headers={"Authorization": f"token {token}"},
                     data=json.dumps({"type": "notebook", "format": "json", "content": nb}), timeout=60)
    assert r.status_code in (200, 201), r.text
    # start the notebook's own kernel when it opens, without JupyterLab's "Select Kernel" dialog
    r = requests.put(f"{platform.url}/user/{USER}/lab/api/settings/@jupyterlab/notebook-extension:tracker",
                     headers={"Authorization": f"token {token}"}, timeout=60,
                     data=json.dumps({"raw": json.dumps({"autoStartDefaultKernel": True})}))
    assert r.status_code in (200, 204), r.text
    yield {"api": platform.url + "/services/trainhub/api", "headers": {"Authorization": f"token {token}"}}
    platform.stop_server(USER)


def cell(page, n: int):
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell").nth(n)


def run_cell(page, n: int) -> None:
    cell(page, n).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")


def open_notebook(page, url: str, reload: bool = False) -> None:
    """Open (or reload) the notebook and wait for its kernel."""
    if reload:
        page.reload()
    else:
        page.goto(f"{url}/user/{USER}/lab/tree/{NOTEBOOK}")
    page.wait_for_selector(".jp-NotebookPanel .jp-CodeCell", timeout=60_000)
    page.wait_for_function("() => /Python 3.*Idle/.test(document.querySelector('.jp-StatusBar-Widget, #jp-main-statusbar')"
                           "?.textContent || '')", timeout=90_000)


def test_a_train_output_outlives_its_widget(platform, lab_user, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("pageerror", lambda e: errors.append(str(e)))
        shots = Screenshots(page, "live-output", tmp_path)
        with shots.on_failure():
            log_in_to_lab(page, platform.url, USER, PASSWORD)
            open_notebook(page, platform.url)

            # 1. the cell runs: the live widget, the job running
            run_cell(page, 0)
            out = cell(page, 0).locator(".th-live-output")
            expect(out).to_have_attribute("data-showing", "widget", timeout=90_000)
            expect(out.locator(".widget-html").first).to_contain_text("running", timeout=60_000)
            job_id = out.get_attribute("data-trainhub-id")
            assert re.fullmatch(r"j-\d+", job_id or ""), job_id
            shots.take("1-widget-running")
            # the platform's JupyterLab does not ask users about Jupyter's news (announcements plugin disabled by the
            # panel's package.json): by now the toast would show
            expect(page.get_by_text("official Jupyter news")).to_have_count(0)

            # 2. the kernel restarts while the job runs: a live view of the job from the API, not "model not found"
            run_command(page, "Restart Kernel…")
            page.locator(".jp-Dialog .jp-mod-accept").click()
            expect(out).to_have_attribute("data-showing", "card", timeout=60_000)
            card = out.locator(".th-live-card")
            expect(card).to_contain_text(job_id)
            shots.take("2-after-restart")
            expect(card.locator(".th-live-state")).to_have_text("succeeded", timeout=90_000)
            expect(card.locator(".th-live-log")).to_contain_text("the last line of the job")
            expect(card.locator(".th-live-note")).to_contain_text("final: read from the jobs API")
            expect(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")).not_to_contain_text(NOT_FOUND)
            shots.take("3-restart-followed-to-the-end")

            # 3. saved and reloaded (the new kernel holds no model of the old one): the same live view
            page.keyboard.press("Control+s")
            page.wait_for_timeout(500)  # paces the save before the reload; the checks below wait for what they need
            open_notebook(page, platform.url, reload=True)
            out = cell(page, 0).locator(".th-live-output")
            expect(out).to_have_attribute("data-showing", "card", timeout=60_000)
            expect(out.locator(".th-live-state")).to_have_text("succeeded", timeout=60_000)
            expect(out.locator(".th-live-log")).to_contain_text("the last line of the job")
            expect(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")).not_to_contain_text(NOT_FOUND)
            shots.take("4-after-reload")

            # 4. "Jobs table": the table on this job
            out.locator(".th-live-jobs").click()
            table = page.locator(".th-jobs-view")
            expect(table.locator(f'tr.th-job-row[data-id="{job_id}"]')).to_be_visible(timeout=30_000)
            expect(table.locator("tr.th-job-row")).to_have_count(1)
            expect(table.locator(".th-job-search")).to_have_value(job_id)
            shots.take("5-jobs-table")

            # 5. a cell run with this kernel, the page reloaded with the kernel alive: re-attached, never "not found"
            page.locator(".jp-NotebookPanel .lm-TabBar-tab, .lm-DockPanel-tabBar .lm-TabBar-tab").filter(
                has_text=NOTEBOOK).first.click()
            run_cell(page, 1)
            quick = cell(page, 1).locator(".th-live-output")
            expect(quick).to_have_attribute("data-showing", "widget", timeout=90_000)
            expect(quick.locator(".widget-html").first).to_contain_text("succeeded", timeout=90_000)
            page.keyboard.press("Control+s")
            page.wait_for_timeout(500)  # paces the save before the reload
            open_notebook(page, platform.url, reload=True)
            quick = cell(page, 1).locator(".th-live-output")
            expect(quick).to_have_attribute("data-showing", "widget", timeout=60_000)  # the kernel's widget, re-attached
            expect(quick.locator(".widget-html").first).to_contain_text("succeeded")
            expect(quick).to_contain_text("a quick one")
            expect(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")).not_to_contain_text(NOT_FOUND)
            # the first cell's widget was made by the kernel before the restart: still the live view
            expect(cell(page, 0).locator(".th-live-output")).to_have_attribute("data-showing", "card")
            shots.take("6-reloaded-with-the-kernel-alive")

            # 6. the static HTML's link opens the jobs table on the job
            page.goto(f"{platform.url}/user/{USER}/lab?trainhub-job={job_id}")
            table = page.locator(".th-jobs-view")
            expect(table.locator(f'tr.th-job-row[data-id="{job_id}"]')).to_be_visible(timeout=60_000)
            expect(table.locator(".th-job-search")).to_have_value(job_id)
            shots.take("7-link-to-the-jobs-table")
        browser.close()
    saved = requests.get(f"{platform.url}/user/{USER}/api/contents/{NOTEBOOK}", headers=lab_user["headers"], timeout=30)
    outputs = saved.json()["content"]["cells"][1]["outputs"]
    data = [o["data"] for o in outputs if "data" in o and "application/vnd.trainhub.job+json" in o["data"]]
    assert data and "succeeded" in data[0]["text/plain"] and "a quick one" in data[0]["text/plain"], outputs
    assert not errors, errors


SWEEP_NOTEBOOK = "live-sweep.ipynb"


def test_a_sweep_output_shows_a_live_view_with_its_optuna_dashboard_link(platform, lab_user, tmp_path):
    """A saved ``%%sweep`` output (its static bundle, no widget model: as after a kernel restart) opens as the live view
    of the sweep read from the API, with "Trials in the jobs table" and "Open in Optuna dashboard", whose href is the
    kernel widget's: ``<server>/trainhub/optuna/open?sweep=ID`` (kernels/sweep.py ``sweep_links``)."""
    from playwright.sync_api import expect, sync_playwright

    from trainhub.kernels.sweep import SWEEP_MIME, sweep_links, sweep_static_bundle

    api, headers = lab_user["api"], lab_user["headers"]
    r = requests.post(f"{api}/sweeps", headers=headers, timeout=60, json={
        "name": "live-sweep", "script": "import trainhub\ntrainhub.report(step=0, loss=trainhub.params()['x'])\n",
        "gpus": 0, "trials": 1, "metric": "loss", "mode": "min", "space": {"x": "uniform:0:1"}})
    assert r.status_code == 201, r.text
    sweep = r.json()
    sid = sweep["id"]
    links = sweep_links(sweep, f"/user/{USER}/")
    bundle = sweep_static_bundle(sweep, [], links)
    nb = {"cells": [{"cell_type": "code", "execution_count": 1, "metadata": {}, "source": "%%sweep ...",
                     "outputs": [{"output_type": "display_data", "metadata": {}, "data": bundle}]}],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    r = requests.put(f"{platform.url}/user/{USER}/api/contents/{SWEEP_NOTEBOOK}", headers=headers, timeout=60,
                     data=json.dumps({"type": "notebook", "format": "json", "content": nb}))
    assert r.status_code in (200, 201), r.text
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("pageerror", lambda e: errors.append(str(e)))
        shots = Screenshots(page, "live-sweep", tmp_path)
        with shots.on_failure():
            log_in_to_lab(page, platform.url, USER, PASSWORD, reset=True)  # the first test left its notebooks open
            page.goto(f"{platform.url}/user/{USER}/lab/tree/{SWEEP_NOTEBOOK}")
            out = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .th-live-output").first
            expect(out).to_have_attribute("data-showing", "card", timeout=90_000)
            expect(out).to_have_attribute("data-trainhub-id", sid)
            card = out.locator(".th-live-card")
            expect(card).to_contain_text(sid)
            expect(card.locator(".th-live-jobs")).to_be_visible()
            link = card.locator("a.th-live-optuna")
            expect(link).to_have_text("Open in Optuna dashboard")
            href = link.get_attribute("href")
            assert href.endswith(links["optuna_dashboard"]), (href, links)  # the kernel widget's URL, on this server
            assert href == f"{platform.url}/user/{USER}/trainhub/optuna/open?sweep={sid}", href
            expect(link).to_have_attribute("target", "_blank")
            expect(card.locator(".th-live-state")).to_have_text("completed", timeout=90_000)  # followed from the API
            expect(card.locator("a.th-live-optuna")).to_have_attribute("href", href)  # still there once it ended
            shots.take("1-sweep-live-view")
        browser.close()
    assert bundle[SWEEP_MIME]["links"]["optuna_dashboard"] == links["optuna_dashboard"]
    assert not errors, errors
