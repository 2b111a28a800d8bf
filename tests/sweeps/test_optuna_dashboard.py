"""optuna-dashboard under the prefix of the user's server (trainhub.extensions.optunadash.serve), as a real process
on a copy of studies: its page, bundle and API answer under the prefix, the absolute paths it writes are moved under
it, and nothing answers outside it."""

from __future__ import annotations

import subprocess
import sys

import optuna
import pytest
import requests
from waiting import wait_for

from trainhub.extensions.optunadash.serve import REWRITES, rewrite

optuna.logging.set_verbosity(optuna.logging.WARNING)
PREFIX = "/user/alice/proxy/absolute/{port}/"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dashboard(tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = optuna.create_study(storage=url, study_name="s-000007", direction="minimize")
    study.optimize(lambda t: (t.suggest_float("x", -1, 1)) ** 2, n_trials=3)
    port = free_port()
    prefix = PREFIX.format(port=port)
    proc = subprocess.Popen([sys.executable, "-m", "trainhub.extensions.optunadash.serve", "--port", str(port),
                             "--prefix", prefix, url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def up():
        assert proc.poll() is None, proc.stdout.read().decode()
        try:
            return requests.get(base + prefix + "api/meta", timeout=5).status_code == 200
        except requests.ConnectionError:
            return False

    wait_for(up, what="optuna-dashboard to answer", timeout=60)
    yield base, prefix
    proc.terminate()
    proc.wait(10)


def test_the_dashboard_answers_under_the_servers_prefix(dashboard):
    base, prefix = dashboard
    page = requests.get(base + prefix + "dashboard", timeout=10)
    assert page.status_code == 200 and "Optuna Dashboard" in page.text
    assert f'src="{prefix}static/bundle.js"' in page.text
    bundle = requests.get(base + prefix + "static/bundle.js", headers={"Accept-Encoding": "gzip"}, timeout=30).text
    assert f'url_prefix:"{prefix}dashboard"' in bundle and f'(null!=e?e:"{prefix.rstrip("/")}")' in bundle
    studies = requests.get(base + prefix + "api/studies", timeout=10).json()["study_summaries"]
    assert [s["study_name"] for s in studies] == ["s-000007"]
    detail = requests.get(f"{base}{prefix}api/studies/{studies[0]['study_id']}", timeout=10).json()
    assert len(detail["trials"]) == 3
    root = requests.get(base + prefix, timeout=10, allow_redirects=False)
    assert root.status_code in (302, 303) and root.headers["Location"].endswith(prefix + "dashboard")
    assert requests.get(base + "/api/studies", timeout=10).status_code == 404  # nothing outside the prefix


def test_every_rewrite_finds_its_text_in_the_installed_dashboard():
    """A new optuna-dashboard that moved its absolute paths fails here, not in a user's browser."""
    from pathlib import Path

    import optuna_dashboard

    root = Path(optuna_dashboard.__file__).parent
    texts = {"index.html": (root / "index.html").read_text(), "bundle.js": (root / "public" / "bundle.js").read_text()}
    for kind, pairs in REWRITES.items():
        for old, _new in pairs:
            assert old in texts[kind], (kind, old)
        assert rewrite(kind, texts[kind], "/p/") != texts[kind]
