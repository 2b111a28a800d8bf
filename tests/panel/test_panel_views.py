"""The trainhub panel as a user sees it, in a real browser (Debian's chromium via Playwright) against
the shared running platform:

- the side panel's tabs are labelled, fit the default sidebar width and wrap (never cut off) in a
  narrow window with a larger UI font; its icons are SVG (JupyterLab LabIcons), no emoji;
- deleting a file and registering a model ask in JupyterLab dialogs, never the browser's own;
- the jobs table (from the side panel and the command palette) sorts by column, filters by state
  as the jobs API does, opens logs and a metrics chart whose points are the API's, and disables its
  TensorBoard buttons with the reason on a server without the TensorBoard extension (a Playwright
  route answers 404 there);
- TensorBoard for two jobs side by side, through the user's own server (trainhub.extensions.tensorboard
  and jupyter-server-proxy): the jobs' real event files, a real TensorBoard in a main-area tab;
- the usage chart draws the usage API's answer per day (bars = data points); an admin switches
  to another user.

Screenshots are written to the test's tmp folder (looked at while developing) and copied to
test-artifacts/browser/<test>/ only when a test fails.
"""

from __future__ import annotations

import json
import re
from datetime import date, timedelta

import pytest
import requests

from browserlab import ARGS, CHROMIUM, Screenshots, log_in_to_lab, open_side_panel, require_chromium, run_command
from waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

USER, PASSWORD = "views-pat", "views-secret-1"
ADMIN, ADMIN_PASSWORD = "views-boss", "views-boss-secret-1"
SCRIPT = """import trainhub
for s in range(1, 6):
    trainhub.log_metrics(step=s, loss={base} / s, acc=0.5 + s / 20)
print('trained {name}')
(trainhub.outputs_dir() / 'weights.bin').write_bytes(b'w')
from torch.utils.tensorboard import SummaryWriter
with SummaryWriter(str(trainhub.tensorboard_dir())) as w:
    for s in range(1, 6):
        w.add_scalar('loss', {base} / s, s)
"""
NAMES = ["views-beta", "views-alpha", "views-gamma"]
DEFAULT, NARROW = {"width": 1400, "height": 900}, {"width": 640, "height": 800}
EMOJI = re.compile("[\u2190-\u2bff\u29c9\U0001f000-\U0001faff]")


@pytest.fixture(scope="module")
def seeded(platform):
    require_chromium()
    platform.cli("users", "add", USER, "--password", PASSWORD)
    platform.cli("users", "add", ADMIN, "--password", ADMIN_PASSWORD, "--admin")
    api = platform.url + "/services/trainhub/api"
    h = {"Authorization": f"token {platform.token(USER)}"}
    scratch = platform.data_dir / "storage" / "users" / USER / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "delete-me.txt").write_text("bye")
    jobs = {}
    for i, name in enumerate(NAMES):
        body = {"name": name, "script": SCRIPT.format(base=i + 1, name=name), "gpus": 0}
        r = requests.post(api + "/jobs", json=body, headers=h, timeout=60)
        assert r.status_code == 201, r.text
        jobs[name] = r.json()["id"]
    r = requests.post(api + "/jobs", json={"name": "views-broken", "script": "raise SystemExit(3)", "gpus": 0}, headers=h, timeout=60)
    assert r.status_code == 201, r.text
    jobs["views-broken"] = r.json()["id"]

    def finished():
        states = [requests.get(f"{api}/jobs/{j}", headers=h, timeout=30).json()["state"] for j in jobs.values()]
        return all(s in ("succeeded", "failed", "cancelled", "lost") for s in states)

    wait_for(finished, timeout=120, what="the seeded jobs to finish")
    # a GPU server, so the usage chart has GPU-hours to show
    platform.spawn(USER, "gpu-1", timeout=180)
    platform.spawn(ADMIN, "cpu", timeout=180)

    def used():
        u = requests.get(api + "/usage", params={"by": "day"}, headers=h, timeout=30).json()
        return u["items"] and u["items"][-1]["gpu_hours_allocated"] > 0

    wait_for(used, timeout=120, interval=1, what="the usage sampler to count the GPU server")
    yield {"api": api, "headers": h, "jobs": jobs}
    platform.stop_server(USER)
    platform.stop_server(ADMIN)


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield b
        finally:
            b.close()


def new_page(browser, viewport=DEFAULT):
    """A page that records page errors and fails on any browser-native dialog (prompt, confirm, alert)."""
    page = browser.new_page(viewport=viewport)
    page.native_dialogs = []
    page.errors = []

    def native(d):
        page.native_dialogs.append(f"{d.type}: {d.message}")
        d.dismiss()

    page.on("dialog", native)
    page.on("pageerror", lambda e: page.errors.append(f"{e}\n{e.stack}"))
    return page


FONT_SIZE = "() => getComputedStyle(document.documentElement).getPropertyValue('--jp-ui-font-size1').trim()"


def change_ui_font(page, command: str) -> None:
    """A UI font size command. JupyterLab reloads the theme behind its splash screen: wait until the
    new size is applied and the splash is gone (it covers the page, and a second change while it
    fades trips JupyterLab itself)."""
    before = page.evaluate(FONT_SIZE)
    run_command(page, command)
    page.wait_for_function(f"b => ({FONT_SIZE})() !== b", arg=before, timeout=30_000)
    page.wait_for_function("() => !document.getElementById('jupyterlab-splash')", timeout=30_000)


def tab_geometry(panel) -> dict:
    """Boxes of the panel, its tabs and their labels, and whether each label is clipped or covered."""
    return panel.evaluate(
        """p => {
        const box = e => { const r = e.getBoundingClientRect(); return {x: r.x, y: r.y, w: r.width, h: r.height}; };
        return {panel: box(p), tabs: Array.from(p.querySelectorAll('.th-tab')).map(t => {
            const label = t.querySelector('.th-tab-label');
            const lb = box(label);
            const hit = document.elementFromPoint(lb.x + lb.w / 2, lb.y + lb.h / 2);
            const svg = t.querySelector('.th-tab-icon svg');
            return {text: label.textContent, tab: box(t), label: lb,
                    clipped: label.scrollWidth > label.clientWidth + 0.5 || t.scrollWidth > t.clientWidth + 0.5,
                    covered: !(hit && (hit === label || label.contains(hit))),
                    hit: hit ? `${hit.tagName}.${hit.className}#${hit.id}` : null,
                    svg: svg ? box(svg) : null};
        })};
    }"""
    )


def assert_tabs_fit(g: dict) -> set:
    """Every tab inside the panel, not overlapping another, its label inside it, unclipped and on top;
    returns the set of rows (tab tops)."""
    p = g["panel"]
    assert [t["text"] for t in g["tabs"]] == ["Storage", "Datasets", "Models", "Jobs", "Usage"]
    for t in g["tabs"]:
        b, lb = t["tab"], t["label"]
        assert b["x"] >= p["x"] - 0.5 and b["x"] + b["w"] <= p["x"] + p["w"] + 0.5, (t, p)
        assert lb["x"] >= b["x"] - 0.5 and lb["x"] + lb["w"] <= b["x"] + b["w"] + 0.5, t
        assert lb["w"] > 10 and not t["clipped"] and not t["covered"], (t["text"], t["hit"], t)
        assert t["svg"] and t["svg"]["w"] >= 12 and t["svg"]["h"] >= 12, t
    tabs = [t["tab"] for t in g["tabs"]]
    for i, a in enumerate(tabs):
        for b in tabs[i + 1:]:
            overlap_x = min(a["x"] + a["w"], b["x"] + b["w"]) - max(a["x"], b["x"])
            overlap_y = min(a["y"] + a["h"], b["y"] + b["h"]) - max(a["y"], b["y"])
            assert overlap_x <= 0.5 or overlap_y <= 0.5, (a, b)
    return {round(t["y"]) for t in tabs}


def test_tabs_fit_and_icons_are_svg(platform, seeded, browser, tmp_path):
    from playwright.sync_api import expect

    page = new_page(browser, DEFAULT)
    shots = Screenshots(page, "panel-tabs", tmp_path)
    with shots.on_failure():
        log_in_to_lab(page, platform.url, USER, PASSWORD, reset=True)
        panel = open_side_panel(page)
        expect(panel.locator('.th-entry[data-path="scratch"]')).to_be_visible(timeout=30_000)
        g = tab_geometry(panel)
        # JupyterLab's default left sidebar (250 px): one row of five labelled tabs
        assert 240 <= g["panel"]["w"] <= 320, g["panel"]
        assert len(assert_tabs_fit(g)) == 1, g
        # icons are inline SVG LabIcons (storage rows, toolbar), no emoji anywhere in the panel
        expect(panel.locator('.th-entry[data-path="scratch"] .th-name svg')).to_have_count(1)
        for sel in (".th-copy", ".th-delete", ".th-refresh"):
            expect(panel.locator(f"{sel} svg").first).to_be_visible()
        for section in ("storage", "datasets", "models", "jobs", "usage"):
            panel.locator(f'.th-tab[data-section="{section}"]').click()
            expect(panel.locator(f'.th-tab[data-section="{section}"]')).to_have_attribute("aria-selected", "true")
            expect(panel.locator(".th-status")).not_to_have_text(re.compile(r"^(Loading…)?$"), timeout=30_000)
            text = panel.inner_text()
            assert not EMOJI.search(text), (section, EMOJI.findall(text))
            for b in panel.locator(".th-icon-btn").all():
                assert b.locator("svg").count() == 1, b.evaluate("e => e.outerHTML")
        shots.take("default-width")
        # switching on before a section has loaded: the late answer does not land in the new section
        panel.locator('.th-tab[data-section="storage"]').click()
        panel.locator('.th-tab[data-section="usage"]').click()
        expect(panel.locator(".th-usage-total")).to_be_visible(timeout=30_000)
        expect(panel.locator(".th-status")).to_have_text(re.compile(r"^1 day with GPU use$|^\d+ days with GPU use$|no GPU use"))
        expect(panel.locator(".th-entry")).to_have_count(0)

        # a narrow window with a larger UI font: the tabs wrap into rows, still labelled and whole
        for _ in range(4):
            change_ui_font(page, "Increase UI Font Size")
        page.set_viewport_size(NARROW)  # also makes JupyterLab lay out again for the larger top bar
        wait_for(lambda: len({round(t["tab"]["y"]) for t in tab_geometry(panel)["tabs"]}) > 1, timeout=30, what="the tabs to wrap")
        g = tab_geometry(panel)
        rows = assert_tabs_fit(g)
        assert len(rows) >= 2, g
        assert g["panel"]["x"] + g["panel"]["w"] <= NARROW["width"], g["panel"]
        shots.take("narrow-large-font")
        for _ in range(4):
            change_ui_font(page, "Decrease UI Font Size")
    assert not page.native_dialogs and not page.errors, (page.native_dialogs, page.errors)


def test_delete_asks_in_a_jupyterlab_dialog(platform, seeded, browser, tmp_path):
    from playwright.sync_api import expect

    page = new_page(browser, DEFAULT)
    shots = Screenshots(page, "panel-delete", tmp_path)
    target = platform.data_dir / "storage" / "users" / USER / "scratch" / "delete-me.txt"
    with shots.on_failure():
        log_in_to_lab(page, platform.url, USER, PASSWORD, reset=True)
        panel = open_side_panel(page)
        panel.locator('.th-tab[data-section="storage"]').click()
        panel.locator('.th-entry[data-path="scratch"] .th-name').click()
        row = panel.locator('.th-entry[data-path="scratch/delete-me.txt"]')
        row.locator(".th-delete").click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_be_visible()
        expect(dialog.locator(".jp-Dialog-header")).to_have_text("Delete")
        expect(dialog.locator(".jp-Dialog-body")).to_contain_text("scratch/delete-me.txt")
        shots.take("dialog")
        dialog.locator("button.jp-mod-reject").click()  # cancel keeps the file
        expect(dialog).to_have_count(0)
        assert target.exists()
        row.locator(".th-delete").click()
        page.locator(".jp-Dialog button.jp-mod-accept.jp-mod-warn").click()
        expect(row).to_have_count(0, timeout=15_000)
        expect(panel.locator(".th-status")).to_contain_text("deleted scratch/delete-me.txt")
    assert not target.exists()
    assert not page.native_dialogs and not page.errors, (page.native_dialogs, page.errors)


def rows_in_order(page) -> list[str]:
    return page.locator(".th-jobs-table tbody tr").evaluate_all("rs => rs.map(r => r.dataset.id)")


def test_jobs_table_sorts_filters_and_opens_logs_metrics_register(platform, seeded, browser, tmp_path):
    from playwright.sync_api import expect

    api, h, jobs = seeded["api"], seeded["headers"], seeded["jobs"]
    mine = requests.get(api + "/jobs", params={"limit": 500}, headers=h, timeout=30).json()["items"]
    page = new_page(browser, DEFAULT)
    # this page plays a server without the TensorBoard extension (404 on its route)
    page.route(re.compile(r".*/user/%s/trainhub/tensorboard(\?.*)?$" % USER),
               lambda route: route.fulfill(status=404, content_type="application/json",
                                           body=json.dumps({"status": 404, "message": "Not Found"})))
    shots = Screenshots(page, "jobs-table", tmp_path)
    with shots.on_failure():
        log_in_to_lab(page, platform.url, USER, PASSWORD, reset=True)
        # from the side panel's Jobs section
        panel = open_side_panel(page)
        panel.locator('.th-tab[data-section="jobs"]').click()
        panel.locator(".th-open-jobs").click()
        view = page.locator(".th-jobs-view")
        expect(view.locator(".th-jobs-table tbody tr")).to_have_count(len(mine), timeout=30_000)
        expect(page.locator('.lm-TabBar-tab.lm-mod-current', has_text="Jobs")).to_be_visible()
        # newest first, as the API lists them
        assert rows_in_order(page) == [j["id"] for j in mine]

        # sort by name, both ways; then by state
        view.locator('th[data-key="name"] .th-sort').click()
        expect(view.locator('th[data-key="name"]')).to_have_attribute("aria-sort", "ascending")
        by_name = sorted(mine, key=lambda j: (j["name"].lower(), -int(j["id"][2:])))
        assert rows_in_order(page) == [j["id"] for j in by_name]
        names = view.locator('tbody td[data-key="name"]').all_inner_texts()
        assert names == sorted(names, key=str.lower)
        view.locator('th[data-key="name"] .th-sort').click()
        expect(view.locator('th[data-key="name"]')).to_have_attribute("aria-sort", "descending")
        names = view.locator('tbody td[data-key="name"]').all_inner_texts()
        assert names == sorted(names, key=str.lower, reverse=True)
        expect(view.locator('th[data-key="created"]')).to_have_attribute("aria-sort", "none")
        view.locator('th[data-key="state"] .th-sort').click()
        states = view.locator('tbody td[data-key="state"]').all_inner_texts()
        assert states == sorted(states) and set(states) == {"failed", "succeeded"}
        shots.take("sorted-by-state")

        # filter by state: the rows are exactly what the API lists in that state
        failed = requests.get(api + "/jobs", params={"state": "failed", "limit": 500}, headers=h, timeout=30).json()["items"]
        assert [j["id"] for j in failed] == [jobs["views-broken"]]
        view.locator("select.th-state-filter").select_option("failed")
        expect(view.locator(".th-jobs-table tbody tr")).to_have_count(len(failed))
        assert sorted(rows_in_order(page)) == sorted(j["id"] for j in failed)
        expect(view.locator(".th-status")).to_contain_text("1 failed job shown")
        # a failed job's outputs cannot be registered: the button says why
        reg = view.locator(f'tr[data-id="{jobs["views-broken"]}"] .th-register')
        expect(reg).to_be_disabled()
        expect(reg).to_have_attribute("title", re.compile("succeeded"))
        view.locator("select.th-state-filter").select_option("")
        expect(view.locator(".th-jobs-table tbody tr")).to_have_count(len(mine))
        view.locator(".th-job-search").fill("alpha")
        expect(view.locator(".th-jobs-table tbody tr")).to_have_count(1)
        view.locator(".th-job-search").fill("")

        # TensorBoard on a server without the extension (the route above): disabled with the reason as tooltip
        row = view.locator(f'tr[data-id="{jobs["views-alpha"]}"]')
        tb = row.locator("button.th-tensorboard")
        expect(tb).to_be_disabled()
        expect(tb).to_have_attribute("title", re.compile("TensorBoard is not set up"))
        expect(view.locator("button.th-compare-btn")).to_be_disabled()

        # logs: the API's text
        row.locator(".th-logs").click()
        logs = page.locator(f'.th-logs-view[data-job="{jobs["views-alpha"]}"] .th-log')
        expect(logs).to_contain_text("trained views-alpha", timeout=30_000)
        text = requests.get(f"{api}/jobs/{jobs['views-alpha']}/logs", params={"tail": 2000}, headers=h, timeout=30).text
        assert logs.inner_text().strip() == text.strip()

        # metrics chart: one chart per scalar, its points are the API's (step, value)
        page.locator('.lm-TabBar-tab', has_text="Jobs").first.click()
        row.locator(".th-metrics-btn").click()
        mview = page.locator(f'.th-metrics-view[data-job="{jobs["views-alpha"]}"]')
        expect(mview.locator(".th-metric")).to_have_count(2, timeout=30_000)
        metrics = requests.get(f"{api}/jobs/{jobs['views-alpha']}/metrics", headers=h, timeout=30).json()["metrics"]
        for key in ("acc", "loss"):
            want = sorted((m["step"], m["values"][key]) for m in metrics)
            points = mview.locator(f'.th-metric[data-metric="{key}"] circle.th-point').evaluate_all(
                "cs => cs.map(c => [Number(c.dataset.x), Number(c.dataset.y), Number(c.getAttribute('cy'))])")
            assert [(x, y) for x, y, _ in points] == want
            # drawn where they say: a higher value is higher up (smaller cy)
            by_value = sorted(points, key=lambda p: p[1])
            assert all(a[2] > b[2] for a, b in zip(by_value, by_value[1:]) if a[1] < b[1])
        expect(mview.locator(".th-status")).to_contain_text("2 metrics from 5 reports")
        shots.take("metrics")

        # register a model: a JupyterLab input dialog, not prompt()
        page.locator('.lm-TabBar-tab', has_text="Jobs").first.click()
        row.locator(".th-register").click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog.locator(".jp-Dialog-header")).to_have_text("Register model")
        dialog.locator("input").fill("views-model")
        shots.take("register-dialog")
        dialog.locator("button.jp-mod-accept").click()
        expect(page.locator(".jp-Notification-Toast, .Toastify__toast").filter(has_text="views-model v1")).to_be_visible(timeout=30_000)

        # the same table from the command palette: the open tab comes to the front, not a second one
        page.locator('.lm-TabBar-tab', has_text="Logs").first.click()
        run_command(page, "Open the jobs table")
        expect(page.locator('.lm-TabBar-tab.lm-mod-current', has_text="Jobs")).to_be_visible()
        expect(page.locator(".th-jobs-view")).to_have_count(1)
        shots.take("table")
    v = requests.get(api + "/models/views-model/versions/1", headers=h, timeout=30).json()
    assert v["lineage"]["job"] == jobs["views-alpha"]
    assert not page.native_dialogs and not page.errors, (page.native_dialogs, page.errors)


def test_tensorboard_compares_two_jobs_through_the_users_server(platform, seeded, browser, tmp_path):
    """Two jobs selected in the jobs table open one real TensorBoard (the user's server gathers their event
    files and serves it through jupyter-server-proxy) in a main-area tab, one run per job."""
    from playwright.sync_api import expect

    from trainhub.tensorboard import run_name

    api, h, jobs = seeded["api"], seeded["headers"], seeded["jobs"]
    posted: list[dict] = []
    page = new_page(browser, DEFAULT)
    page.on("request", lambda req: posted.append(json.loads(req.post_data or "{}"))
            if req.method == "POST" and req.url.split("?")[0].endswith("/trainhub/tensorboard") else None)
    shots = Screenshots(page, "tensorboard", tmp_path)
    a, b = jobs["views-alpha"], jobs["views-gamma"]
    runs = sorted(run_name(requests.get(f"{api}/jobs/{j}", headers=h, timeout=30).json()) for j in (a, b))
    with shots.on_failure():
        log_in_to_lab(page, platform.url, USER, PASSWORD, reset=True)
        run_command(page, "Open the jobs table")
        view = page.locator(".th-jobs-view")
        expect(view.locator(f'tr[data-id="{a}"] button.th-tensorboard')).to_be_enabled(timeout=30_000)
        expect(view.locator("button.th-compare-btn")).to_be_disabled()  # nothing selected yet
        view.locator(f'tr[data-id="{a}"] input.th-select').check()
        view.locator(f'tr[data-id="{b}"] input.th-select').check()
        compare = view.locator("button.th-compare-btn")
        expect(compare).to_have_text("Compare 2 in TensorBoard")
        compare.click()
        tab = page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current")
        expect(tab).to_contain_text("TensorBoard", timeout=120_000)
        frame = page.locator(".th-tensorboard-frame iframe")
        expect(frame).to_have_attribute("src", re.compile(rf"/user/{USER}/proxy/absolute/\d+/"))
        board = page.frame_locator(".th-tensorboard-frame iframe")
        for run in runs:  # TensorBoard's own run list, read from the event files the jobs wrote
            expect(board.get_by_text(run, exact=True).first).to_be_visible(timeout=90_000)
        src = frame.get_attribute("src")
        shots.take("compare")
    assert len(posted) == 1 and sorted(posted[0]["jobs"]) == sorted([a, b]), posted
    shown = requests.get(platform.url + src.split("?")[0].rstrip("/") + "/data/runs", headers=h, timeout=30).json()
    assert sorted(shown) == runs
    assert not page.native_dialogs and not page.errors, (page.native_dialogs, page.errors)


def days(since: str, until: str) -> list[str]:
    d0, d1 = date.fromisoformat(since), date.fromisoformat(until)
    return [(d0 + timedelta(n)).isoformat() for n in range((d1 - d0).days + 1)]


def assert_chart_is(page, usage: dict) -> None:
    """The usage view's bars are the API's figures, one pair per day of the period, drawn to scale."""
    bars = page.locator(".th-usage-view rect.th-bar").evaluate_all(
        "rs => rs.map(r => [r.dataset.key, r.dataset.series, Number(r.dataset.value), Number(r.getAttribute('height'))])")
    by_day = {r["day"]: r for r in usage["items"]}
    want = []
    for d in days(usage["since"], usage["until"]):
        r = by_day.get(d, {})
        want += [(d, "held", r.get("gpu_hours_allocated", 0)), (d, "used", r.get("gpu_hours_used", 0))]
    assert [(k, s, v) for k, s, v, _ in bars] == want
    drawn = [(v, hgt) for _, _, v, hgt in bars if v > 0]
    assert drawn, "no bar above zero"
    ratio = drawn[0][1] / drawn[0][0]
    assert all(abs(hgt - v * ratio) <= 0.2 for v, hgt in drawn), drawn


def test_usage_chart_shows_the_api_figures_and_admins_switch_user(platform, seeded, browser, tmp_path):
    from playwright.sync_api import expect

    is_day_usage = lambda r: "/trainhub/api/usage" in r.url and "by=day" in r.url  # noqa: E731
    page = new_page(browser, DEFAULT)
    shots = Screenshots(page, "usage-chart", tmp_path)
    with shots.on_failure():
        log_in_to_lab(page, platform.url, USER, PASSWORD, reset=True)
        with page.expect_response(is_day_usage) as answer:
            run_command(page, "Open the GPU usage chart")
        usage = answer.value.json()
        view = page.locator(".th-usage-view")
        expect(view.locator("rect.th-bar").first).to_be_attached(timeout=30_000)
        assert usage["user"] == USER and usage["scope"] == "user"
        assert len(days(usage["since"], usage["until"])) == 30
        assert_chart_is(page, usage)
        expect(view.locator(".th-usage-user-field")).to_be_hidden()  # a user sees only their own
        expect(view.locator(".th-usage-total")).to_contain_text(f"({USER})")
        shots.take("user")
        # a shorter period asks the API again
        with page.expect_response(is_day_usage) as answer:
            view.locator("select.th-period").select_option("7")
        week = answer.value.json()
        assert len(days(week["since"], week["until"])) == 7
        expect(view.locator(".th-bar-group")).to_have_count(7)
        assert_chart_is(page, week)
    assert not page.native_dialogs and not page.errors, (page.native_dialogs, page.errors)

    page = new_page(browser, DEFAULT)
    shots = Screenshots(page, "usage-chart-admin", tmp_path)
    with shots.on_failure():
        log_in_to_lab(page, platform.url, ADMIN, ADMIN_PASSWORD, reset=True)
        panel = open_side_panel(page)
        panel.locator('.th-tab[data-section="usage"]').click()
        expect(panel.locator(".th-usage-total")).to_contain_text(f"({ADMIN})", timeout=30_000)
        with page.expect_response(is_day_usage) as answer:
            panel.locator(".th-open-usage").click()
        assert answer.value.json()["user"] == ADMIN  # an admin's own figures first
        view = page.locator(".th-usage-view")
        select = view.locator("select.th-usage-user")
        expect(select).to_be_visible()
        expect(select.locator(f'option[value="{USER}"]')).to_have_count(1)
        with page.expect_response(is_day_usage) as answer:
            select.select_option(USER)
        usage = answer.value.json()
        assert usage["user"] == USER and usage["scope"] == "user"
        expect(view).to_have_attribute("data-user", USER)
        assert_chart_is(page, usage)
        shots.take("admin-picks-user")
    assert not page.native_dialogs and not page.errors, (page.native_dialogs, page.errors)


def test_empty_registries_say_how_to_register(platform, seeded, browser, tmp_path):
    """Issue 34: the Datasets and Models tabs of an empty registry say how to fill it, with the exact command, notebook
    call and panel action (the registries answer empty through a Playwright route: the shared platform's have entries).
    The commands shown parse with the real `trainhub` CLI."""
    from playwright.sync_api import expect

    from trainhub.cli import build_parser

    page = new_page(browser, DEFAULT)
    empty = json.dumps({"items": [], "total": 0})
    page.route(re.compile(r".*/trainhub/api/(datasets|models)(\?[^/]*)?$"),
               lambda route: route.fulfill(status=200, content_type="application/json", body=empty))
    shots = Screenshots(page, "panel-empty-registries", tmp_path)
    with shots.on_failure():
        log_in_to_lab(page, platform.url, USER, PASSWORD, reset=True)
        panel = open_side_panel(page)
        panel.locator('.th-tab[data-section="datasets"]').click()
        hint = panel.locator(".th-empty-hint")
        expect(hint).to_contain_text("No datasets registered yet")
        codes = hint.locator(".th-code")
        expect(codes.nth(0)).to_have_text(f"trainhub datasets register mnist users/{USER}/data/mnist --format images")
        expect(codes.nth(1)).to_contain_text(f'TrainhubClient().register_dataset("mnist", "users/{USER}/data/mnist", format="images")')
        expect(panel.locator(".th-status")).to_have_text("0 datasets")
        shots.take("datasets")
        cli = codes.nth(0).inner_text().split()[1:]
        panel.locator('.th-tab[data-section="models"]').click()
        hint = panel.locator(".th-empty-hint")
        expect(hint).to_contain_text("No models registered yet")
        expect(hint).to_contain_text("the Register button of a succeeded job")
        expect(hint).to_contain_text('job.register_model("resnet")')
        expect(hint.locator(".th-code").nth(1)).to_have_text("trainhub models register resnet --job j-000042")
        shots.take("models")
        models_cli = hint.locator(".th-code").nth(1).inner_text().split()[1:]
        # a search that finds nothing is not an empty registry
        box = panel.locator(".th-search")
        box.fill("no-such-model")
        box.press("Enter")
        expect(panel.locator(".th-empty")).to_have_text('No model matches "no-such-model".')
        expect(panel.locator(".th-empty-hint")).to_have_count(0)
    parser = build_parser()
    args = parser.parse_args(cli)
    assert (args.name, args.path, args.format) == ("mnist", f"users/{USER}/data/mnist", "images")
    args = parser.parse_args(models_cli)
    assert (args.name, args.job) == ("resnet", "j-000042")
    assert not page.native_dialogs and not page.errors, (page.native_dialogs, page.errors)
