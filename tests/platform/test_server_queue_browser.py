"""A GPU server asked for from the spawn page while every GPU is held: the page shows its place in
line, the reason and the way out, live, and the server starts by itself when a GPU frees."""

from __future__ import annotations

import pytest
from browserlab import ARGS, CHROMIUM, Screenshots, require_chromium
from test_platform import pool_is_free

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

USER, PASSWORD = "queue-quinta", "quinta-secret-1"


def test_the_spawn_page_shows_the_place_in_line_and_starts_by_itself(platform, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    require_chromium()
    pool_is_free(platform)
    platform.cli("users", "add", USER, "--password", PASSWORD)
    platform.spawn("queue-h1", "gpu-2")
    platform.spawn("queue-h2", "gpu-2")
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            shots = Screenshots(page, "server-queue", tmp_path)
            with shots.on_failure():
                page.goto(f"{platform.url}/hub/login")
                page.fill("#username_input", USER)
                page.fill("#password_input", PASSWORD)
                page.click("#login_submit")
                page.wait_for_url("**/hub/spawn**", timeout=60_000)
                row = page.locator('.trainhub-profile[data-profile="gpu-1"]')
                expect(row).to_contain_text("all busy: it will wait in line")
                expect(page.locator("#trainhub-wait")).to_be_checked()
                row.locator("input").check()
                shots.take("form")
                page.locator('form input[type="submit"], form button[type="submit"]').first.click()
                message = page.locator("#progress-message")
                expect(message).to_contain_text("in line for 1 GPU, number 1 of 1 waiting for GPUs", timeout=60_000)
                expect(message).to_contain_text("Free now:")
                shots.take("waiting")
                assert platform.api("GET", f"/users/{USER}").json()["pending"] == "spawn"
                platform.stop_server("queue-h1")
                page.wait_for_url(f"**/user/{USER}/**", timeout=120_000)
                assert len(platform.held_by(USER)) == 1
            browser.close()
    finally:
        for user in (USER, "queue-h1", "queue-h2"):
            platform.stop_server(user)


SWITCHER, SWITCHER_PASSWORD = "queue-sami", "sami-secret-1"


def test_a_free_profile_on_the_waiting_page_is_a_button_that_starts_the_server_on_it(platform, tmp_path):
    """Issue 34: "Free now: CPU only" was text. It is a button: the wait stops and the server starts on CPU only at
    once, through the hub's own spawn URL with the profile option."""
    from playwright.sync_api import expect, sync_playwright

    require_chromium()
    pool_is_free(platform)
    platform.cli("users", "add", SWITCHER, "--password", SWITCHER_PASSWORD)
    platform.spawn("queue-h3", "gpu-2")
    platform.spawn("queue-h4", "gpu-2")
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            shots = Screenshots(page, "server-queue-switch", tmp_path)
            with shots.on_failure():
                page.goto(f"{platform.url}/hub/login")
                page.fill("#username_input", SWITCHER)
                page.fill("#password_input", SWITCHER_PASSWORD)
                page.click("#login_submit")
                page.wait_for_url("**/hub/spawn**", timeout=60_000)
                page.locator('.trainhub-profile[data-profile="gpu-1"] input').check()
                page.locator('form input[type="submit"], form button[type="submit"]').first.click()
                message = page.locator("#progress-message")
                expect(message).to_contain_text("in line for 1 GPU", timeout=60_000)
                start_cpu = message.locator('button.trainhub-start-free[data-profile="cpu"]')
                expect(start_cpu).to_have_text("Start CPU only now")
                shots.take("waiting-with-buttons")
                start_cpu.click()
                page.wait_for_url(f"**/user/{SWITCHER}/**", timeout=120_000)
                page.wait_for_selector(".jp-LauncherCard", timeout=60_000)
                shots.take("started-on-cpu")
            browser.close()
        model = platform.server_model(SWITCHER)
        assert model and model["ready"] and model["user_options"]["profile"] == "cpu", model
        assert platform.held_by(SWITCHER) == []
        assert not errors, errors
    finally:
        for user in (SWITCHER, "queue-h3", "queue-h4"):
            platform.stop_server(user)
