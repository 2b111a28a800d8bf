"""Moves are invisible to the person at the notebook, in a real browser (Debian's chromium via Playwright) against a
private `trainhub up` with one simulated GPU, the jobs service (the queue) and the culler.

A user works in a notebook on a gpu-1 server, runs "Give my GPU back" from the command palette, then "Get a GPU
again". Each move shows one notice with its progress (plugin `trainhub:server-move`), JupyterLab's "Server
unavailable or unreachable... Restart?" never appears (plugin `trainhub:connection-lost`; before, it came up to five
times per move), the page reconnects by itself, and the notebook's variables are back in its new kernel, listed by
`%who`, after each move.

Screenshots (always written, to look at): test-artifacts/browser/moves/*.png.
"""

from __future__ import annotations

import pytest
import requests

from browserlab import ARGS, ARTIFACTS, CHROMIUM, log_in_to_lab, require_chromium, script_gpus
from waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(900)]

USER, PASSWORD = "mover-maya", "mover-secret-1"
SHOTS = ARTIFACTS / "moves"
CONFIG = """
c.QuotaPolicy.user_gpu_limit = 2
c.Spawner.poll_interval = 2
c.GPUCuller.check_interval = 2
c.GPUCuller.sample_interval = 1
c.GPUCuller.snapshot_timeout = 60
"""
DEFINE = """n = 42
s = "text"
items = [1, [2, 3]]
d = {"a": 1}
import numpy as np
arr = np.arange(5)
class P:
    def __init__(self, x):
        self.x = x
p = P(3)
sq = lambda x: x * x
print("defined")"""
CHECK = """print("check", n, s, items, d, arr.sum(), p.x, sq(4))
%who"""
WHO = ["P", "arr", "d", "items", "n", "np", "p", "s", "sq"]
#: records every JupyterLab dialog and every notification that ever shows, across reloads (sessionStorage)
WATCH = """
(() => {
  const seen = (key, text) => {
    const all = JSON.parse(sessionStorage.getItem(key) || '[]');
    if (all[all.length - 1] !== text) { all.push(text); sessionStorage.setItem(key, JSON.stringify(all)); }
  };
  new MutationObserver(() => {
    document.querySelectorAll('.jp-Dialog').forEach(d => seen('test:dialogs', d.innerText.slice(0, 200)));
    document.querySelectorAll('.Toastify__toast').forEach(t => seen('test:toasts', t.innerText.slice(0, 300)));
  }).observe(document, { childList: true, subtree: true, characterData: true });
})();
"""


@pytest.fixture(scope="module")
def plat(platform_factory):
    require_chromium()
    p = platform_factory("moves-browser", gpus=1, config=CONFIG, start=False)
    script_gpus(p, 80)  # busy: the culler releases nothing by itself here
    p.start(timeout=180)
    p.cli("users", "add", USER, "--password", PASSWORD)
    p.spawn(USER, "gpu-1", timeout=180)
    yield p


def profile_of(p) -> str | None:
    model = p.server_model(USER)
    return model["user_options"].get("profile") if model and model.get("ready") else None


def run_cell(page, code: str, expect_text: str, timeout_s: float = 120) -> str:
    """A new cell at the end of the notebook, typed as is and run; its output once it shows ``expect_text``."""
    from playwright.sync_api import expect

    kernel_ready(page)
    nb = page.locator(".jp-NotebookPanel").first
    nb.locator(".jp-Cell").last.click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")  # a new cell below, in command mode
    cell = nb.locator(".jp-Cell").nth(nb.locator(".jp-Cell").count() - 1)  # (running it adds another below)
    cell.locator(".cm-content").click()
    page.keyboard.insert_text(code)
    page.keyboard.press("Shift+Enter")
    out = cell.locator(".jp-OutputArea")
    expect(out).to_contain_text(expect_text, timeout=timeout_s * 1000)
    return out.inner_text()


def kernel_ready(page) -> None:
    """The notebook's kernel is connected and idle (a cell run before that is not run at all)."""
    from playwright.sync_api import expect

    expect(page.locator(".jp-StatusBar-Widget").filter(has_text="Python 3 (ipykernel) | Idle").first).to_be_visible(
        timeout=120_000)


def palette(page, label: str) -> None:
    """Run a command from the palette, opened from the View menu (in a notebook in command mode the palette's
    shortcut's keys are taken by the notebook too, which closes the palette again)."""
    page.locator(".lm-MenuBar-itemLabel", has_text="View").click()
    page.locator(".lm-Menu-itemLabel", has_text="Activate Command Palette").click()
    box = page.locator(".lm-CommandPalette-input")
    box.wait_for(state="visible", timeout=15_000)
    box.fill(label)
    item = page.locator(".lm-CommandPalette-item", has=page.locator(".lm-CommandPalette-itemLabel", has_text=label)).first
    item.click()
    page.locator(".jp-ModalCommandPalette").wait_for(state="hidden", timeout=15_000)


def dismiss_news(page) -> None:
    news = page.locator(".Toastify__toast").filter(has_text="official Jupyter news")
    if news.count():
        news.get_by_role("button", name="No", exact=True).click()


def reconnected(page) -> bool:
    """The page reloaded by itself (the marker set before the move is gone) and shows the notebook again."""
    from playwright.sync_api import Error

    try:
        return page.evaluate("() => !window.__beforeMove && !!document.querySelector('.jp-NotebookPanel .jp-Cell')")
    except Error:  # the page is navigating (the reload itself)
        return False


def test_both_moves_keep_the_variables_with_one_notice_and_no_restart_dialog(plat):
    from playwright.sync_api import expect, sync_playwright

    p = plat
    SHOTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.add_init_script(WATCH)
        page = context.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            log_in_to_lab(page, p.url, USER, PASSWORD, reset=True)
            dismiss_news(page)
            # a named notebook (an Untitled one's "rename on first save" races with the file browser's listing)
            r = requests.put(f"{p.url}/user/{USER}/api/contents/moves.ipynb", timeout=30, json={
                "type": "notebook", "format": "json", "content": {
                    "cells": [], "nbformat": 4, "nbformat_minor": 5,
                    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}}}},
                headers={"Authorization": f"token {p.token(USER)}"})
            assert r.status_code in (200, 201), r.text
            page.goto(f"{p.url}/user/{USER}/lab/tree/moves.ipynb")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell .cm-content", timeout=60_000)
            nb = page.locator(".jp-NotebookPanel").first
            kernel_ready(page)
            nb.locator(".jp-Cell .cm-content").first.click()
            page.keyboard.insert_text(DEFINE)
            page.keyboard.press("Shift+Enter")
            expect(nb.locator(".jp-OutputArea").first).to_contain_text("defined", timeout=120_000)
            page.keyboard.press("Control+s")
            page.screenshot(path=str(SHOTS / "0-on-gpu.png"))

            # -- Give my GPU back ------------------------------------------------------------------------------
            page.evaluate("() => { window.__beforeMove = true; }")
            palette(page, "Give my GPU back (restart on CPU, keep variables)")
            notice = page.locator(".Toastify__toast").filter(has_text="Moving this server onto the CPU (cpu)")
            expect(notice).to_be_visible(timeout=30_000)
            page.wait_for_timeout(800)  # the toast's slide-in animation (for the screenshot only)
            page.screenshot(path=str(SHOTS / "1-release-in-progress.png"))
            wait_for(lambda: reconnected(page), what="the page to reconnect by itself after the release", timeout=240,
                     interval=0.5)
            assert profile_of(p) == "cpu" and p.held_by(USER) == []
            done = page.locator(".Toastify__toast").filter(has_text="This server now runs on the CPU (cpu)")
            expect(done).to_be_visible(timeout=30_000)
            out = run_cell(page, CHECK, "check 42")
            assert "your variables were restored" in out and "check 42 text [1, [2, 3]] {'a': 1} 10 3 16" in out, out
            assert WHO in [line.split() for line in out.splitlines()], out  # %who
            page.wait_for_timeout(800)
            page.screenshot(path=str(SHOTS / "2-after-release.png"))

            # -- Get a GPU again -------------------------------------------------------------------------------
            page.evaluate("() => { window.__beforeMove = true; }")
            palette(page, "Get a GPU again (wait in line, restart on GPUs, keep variables)")
            page.get_by_role("button", name="Ask").click()
            notice = page.locator(".Toastify__toast").filter(has_text="gpu-1")
            expect(notice.first).to_be_visible(timeout=30_000)
            moving = page.locator(".Toastify__toast").filter(has_text="Moving this server onto gpu-1")
            expect(moving).to_be_visible(timeout=60_000)
            page.wait_for_timeout(800)
            page.screenshot(path=str(SHOTS / "3-regain-in-progress.png"))
            wait_for(lambda: reconnected(page), what="the page to reconnect by itself after the regain", timeout=240,
                     interval=0.5)
            assert profile_of(p) == "gpu-1" and p.held_by(USER) == [0]
            expect(page.locator(".Toastify__toast").filter(has_text="This server now runs on gpu-1")).to_be_visible(
                timeout=30_000)
            out = run_cell(page, CHECK + "\nimport os; print('visible', os.environ['CUDA_VISIBLE_DEVICES'])", "visible")
            assert "your variables were restored" in out and "check 42 text [1, [2, 3]] {'a': 1} 10 3 16" in out, out
            assert WHO in [line.split() for line in out.splitlines()] and "visible 0" in out, out
            page.wait_for_timeout(800)
            page.screenshot(path=str(SHOTS / "4-after-regain.png"))

            dialogs = page.evaluate("() => JSON.parse(sessionStorage.getItem('test:dialogs') || '[]')")
            toasts = page.evaluate("() => JSON.parse(sessionStorage.getItem('test:toasts') || '[]')")
        except Exception:
            page.screenshot(path=str(SHOTS / "failure.png"))
            raise
        finally:
            browser.close()
    # JupyterLab never offered to restart a server trainhub moved, nor said a kernel died; the only dialog was the
    # user's own choice of a GPU profile
    assert [d for d in dialogs if "1 GPU (gpu-1)" not in d] == [], dialogs
    assert not [t for t in toasts if "unavailable" in t.lower() or "restart it" in t.lower()], toasts
    assert errors == [], errors
    rows = requests.get(p.url + "/services/trainhub-culler/api/decisions", params={"user": USER, "acted": 1},
                        headers={"Authorization": f"token {p.token(USER)}"}, timeout=30).json()["items"]
    assert {r["action"] for r in rows} == {"release", "regain"}, rows
