"""What the browser tests share: Debian's chromium, logging in to JupyterLab, a private GPU
platform with the culler, scripted GPU utilisation."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"


def require_chromium() -> None:
    """Skip without the browser; install the prebuilt lab extension the tests drive."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed (apt-get install -y chromium)")
    from trainhub.extensions import install_labextension

    install_labextension()


def log_in_to_lab(page, url: str, user: str, password: str) -> None:
    """The hub's login form, then wait for JupyterLab's launcher."""
    page.goto(f"{url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_url(f"**/user/{user}/lab**", timeout=60_000)
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
