"""JupyterLab in chromium: right-click a notebook → Create Notebook Job → a GPU profile, trainhub's fields in
"Additional options" (GPUs per worker, workers, time limit: the profile's defaults shown, a value past its bounds
refused in the form) and a parameter → Create; the job runs through trainhub with what the fields said and the
Notebook Jobs list shows it completed; the executed notebook is next to the input with the parameter's effect.
Screenshots in test-artifacts/browser/create-notebook-job/."""

from __future__ import annotations

import re
import shutil

import pytest
import requests

from browserlab import ARGS, ARTIFACTS, CHROMIUM, Screenshots, log_in_to_lab, require_chromium
from test_notebook_jobs_e2e import API, notebook, outputs_text

USER = "nbjobs-web"
PASSWORD = "nbjobs-web-pass-1"


def test_create_notebook_job_from_the_file_browser(platform, tmp_path):
    require_chromium()
    from playwright.sync_api import expect, sync_playwright

    platform.cli("users", "add", USER, "--password", PASSWORD)
    platform.spawn(USER, "cpu")
    headers = {"Authorization": f"token {platform.token(USER)}"}
    base = f"{platform.url}/user/{USER}"
    requests.put(f"{base}/api/contents/web", json={"type": "directory"}, headers=headers, timeout=60)
    r = requests.put(f"{base}/api/contents/web/report.ipynb", headers=headers, timeout=60,
                     json={"type": "file", "format": "text", "content": notebook()})
    assert r.status_code in (200, 201), r.text
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            shots = Screenshots(page, "create-notebook-job", tmp_path)
            try:
                with shots.on_failure():
                    log_in_to_lab(page, platform.url, USER, PASSWORD, reset=True)
                    page.goto(f"{base}/lab/tree/web")
                    item = page.locator(".jp-DirListing-item", has_text="report.ipynb").first
                    item.wait_for(timeout=60_000)
                    item.click(button="right")
                    # jupyter-scheduler 2.12 labels it "Create Job" (the docs call it "Create Notebook Job")
                    page.locator(".lm-Menu-item", has_text=re.compile(r"^Create (Notebook )?Job$")).first.click()
                    name = page.get_by_label("Job name")
                    name.wait_for(timeout=60_000)
                    shots.take("1-form")
                    name.fill("from-the-browser")
                    # the environments are the user's profiles
                    page.get_by_label("Environment").click()
                    options = page.get_by_role("option")
                    assert sorted(options.all_inner_texts()) == ["cpu", "gpu-1", "gpu-2"]  # not the research group's gpu-4
                    page.get_by_role("option", name="gpu-2", exact=True).click()
                    # the picked profile's output formats and compute types (the other profiles) follow
                    expect(page.get_by_text("Output formats")).to_be_visible()
                    # trainhub's fields, with the profile's defaults and bounds (GET /profiles)
                    page.get_by_text("Additional options").click()
                    gpus, workers, limit = (page.get_by_label(n, exact=True) for n in ("GPUs per worker", "Workers", "Time limit"))
                    expect(gpus).to_have_value("2", timeout=30_000)
                    expect(workers).to_have_value("1")
                    expect(page.get_by_text("gpu-2: 2 by default, at most 4")).to_be_visible()
                    create = page.get_by_role("button", name="Create", exact=True)
                    gpus.fill("9")
                    expect(page.get_by_text("GPUs per worker must be from 0 to 4, not 9 on gpu-2")).to_be_visible()
                    expect(create).to_be_disabled()  # the form holds a job that could never start
                    limit.fill("soon")
                    expect(page.get_by_text("Time limit: give seconds (3600) or a duration like")).to_be_visible()
                    shots.take("2-refused")
                    gpus.fill("1")
                    workers.fill("2")
                    limit.fill("30m")
                    expect(create).to_be_enabled()
                    page.get_by_role("button", name="Add new parameter").click()
                    page.get_by_placeholder("Name", exact=True).last.fill("lr")
                    page.get_by_placeholder("Value", exact=True).last.fill("0.75")
                    page.get_by_placeholder("Value", exact=True).last.press("Tab")  # the form checks a field as it leaves it
                    shots.take("3-filled")
                    create.click()
                    # the Notebook Jobs list, the new job in it, until it completed
                    row = page.locator("tr", has_text="from-the-browser").first
                    row.wait_for(timeout=60_000)
                    shots.take("4-list")
                    for _ in range(60):
                        if "Completed" in row.inner_text():
                            break
                        if "Failed" in row.inner_text():
                            pytest.fail(row.inner_text())
                        page.wait_for_timeout(2000)
                        reload = page.get_by_role("button", name="Reload")
                        if reload.count():
                            reload.first.click()
                    expect(row).to_contain_text("Completed", timeout=5_000)
                    shots.take("5-completed")
            finally:
                browser.close()
        jobs = requests.get(f"{platform.url}{API}/jobs", headers=headers, timeout=60).json()["items"]
        job = next(j for j in jobs if j["name"] == "from-the-browser")
        job = requests.get(f"{platform.url}{API}/jobs/{job['id']}", headers=headers, timeout=60).json()
        assert job["state"] == "succeeded", job
        # what the form's fields said: 1 GPU per worker on gpu-2 (its default is 2), 2 workers, 30 minutes
        assert (job["profile"], job["gpus"], job["workers"], job["time_limit"]) == ("gpu-2", 1, 2, 1800), job
        assert len(job["devices"]) == 2 and all(len(d) == 1 for d in job["devices"]), job
        executed = requests.get(f"{base}/api/contents/web/report-{job['id']}.ipynb", headers=headers, timeout=60)
        assert "LR IS 0.75" in outputs_text(executed.json()["content"])
        html = requests.get(f"{base}/api/contents/web/report-{job['id']}.html", headers=headers, timeout=60)
        assert html.status_code == 200  # both formats were ticked, as the form has them by default
        second = requests.get(f"{base}/api/contents/web/report-{job['id']}-worker1.ipynb", headers=headers, timeout=60)
        assert "LR IS 0.75" in outputs_text(second.json()["content"])  # the second worker's run, beside the first's
    finally:
        dest = ARTIFACTS / "create-notebook-job"
        dest.mkdir(parents=True, exist_ok=True)
        for p in tmp_path.glob("*.png"):
            shutil.copy(p, dest / p.name)
        platform.stop_server(USER)
