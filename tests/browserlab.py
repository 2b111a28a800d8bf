"""What the browser tests share: Debian's chromium, logging in to JupyterLab, a private GPU
platform with the culler, scripted GPU utilisation, the trainhub side panel and the command
palette, screenshots kept under test-artifacts only when a test fails."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "browser"


def require_chromium() -> None:
    """Skip without the browser; install the prebuilt lab extension the tests drive."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed (apt-get install -y chromium)")
    from trainhub.extensions import install_labextension

    install_labextension()


def log_in_to_lab(page, url: str, user: str, password: str, reset: bool = False) -> None:
    """The hub's login form, then wait for JupyterLab's launcher. ``reset``: start from JupyterLab's
    default layout (``/lab?reset``) instead of the one the user's last session left."""
    page.goto(f"{url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_url(f"**/user/{user}/lab**", timeout=60_000)
    if reset:
        page.goto(f"{url}/user/{user}/lab?reset")
    page.wait_for_selector(".jp-LauncherCard", timeout=60_000)


def script_gpus(platform, default: float) -> None:
    """Every simulated GPU at ``default`` % (atomic rewrite: the culler re-reads it every second)."""
    path = Path(platform.data_dir) / "gpu-metrics.json"
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(json.dumps({"devices": {}, "default": {"utilization": default}}))
    os.replace(tmp, path)


def culler_platform(platform_factory, name: str, config: str, user: str, password: str, busy: float = 80):
    """A private one-GPU `trainhub up` with only the culler, and ``user``'s gpu-1 server started.

    The scripted GPU is ``busy`` until the test makes it idle, so nothing is culled while the
    browser is still loading.
    """
    require_chromium()
    p = platform_factory(name, gpus=1, config=config, env={"TRAINHUB_SERVICES": "trainhub-culler"}, start=False)
    script_gpus(p, busy)
    p.start(timeout=180)
    p.cli("users", "add", user, "--password", password)
    p.spawn(user, "gpu-1", timeout=180)
    assert len(p.held_by(user)) == 1
    return p


def open_side_panel(page):
    """The trainhub side panel, opened from its left-area tab unless the restored layout has it open."""
    panel = page.locator("#trainhub-panel")
    if not panel.is_visible():
        page.click('.lm-TabBar-tab[data-id="trainhub-panel"]')
    panel.wait_for(state="visible", timeout=30_000)
    return panel


def run_command(page, label: str) -> None:
    """Run a command from JupyterLab's command palette by its exact label."""
    page.keyboard.press("Control+Shift+C")
    box = page.locator(".lm-CommandPalette-input")
    box.wait_for(state="visible", timeout=15_000)
    box.fill(label)
    item = page.locator(".lm-CommandPalette-item", has=page.locator(".lm-CommandPalette-itemLabel", has_text=label)).first
    item.wait_for(state="visible", timeout=15_000)
    item.click()
    page.locator(".jp-ModalCommandPalette").wait_for(state="hidden", timeout=15_000)


class Screenshots:
    """Screenshots a test takes along the way: written to ``folder`` (the test's tmp_path), copied to
    test-artifacts/browser/<name>/ with one of the failing page only when the test fails."""

    def __init__(self, page, name: str, folder: Path):
        self.page, self.name, self.folder = page, name, Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.taken: list[Path] = []

    def take(self, label: str) -> Path:
        path = self.folder / f"{self.name}-{label}.png"
        self.page.screenshot(path=str(path))
        self.taken.append(path)
        return path

    def save_failure(self) -> Path:
        """Copy the screenshots taken so far and one of the page now to test-artifacts/browser/<name>/."""
        dest = ARTIFACTS / self.name
        dest.mkdir(parents=True, exist_ok=True)
        for p in self.taken:
            shutil.copy(p, dest / p.name)
        try:
            self.page.screenshot(path=str(dest / "failure.png"))
        except Exception:  # the page may be gone; the earlier screenshots are kept
            pass
        return dest

    @contextlib.contextmanager
    def on_failure(self):
        try:
            yield self
        except BaseException:
            self.save_failure()
            raise
