"""The prebuilt panel ships in the Python package and installs without npm."""

from __future__ import annotations

import json

from trainhub.extensions import JPSERVER_EXTENSIONS, LABEXTENSION_NAME, PANEL_DIR, install_labextension


def test_prebuilt_panel_is_shipped_and_small():
    pkg = json.loads((PANEL_DIR / "package.json").read_text())
    assert pkg["name"] == LABEXTENSION_NAME
    load = pkg["jupyterlab"]["_build"]["load"]
    assert (PANEL_DIR / load).exists()
    size = sum(p.stat().st_size for p in (PANEL_DIR / "static").rglob("*") if p.is_file())
    # JupyterLab's own packages come from the host application, so the bundle stays small
    assert size < 200_000, f"bundle is {size} bytes"


def test_install_into_a_prefix_is_idempotent(tmp_path):
    dest = install_labextension(tmp_path)
    assert dest == tmp_path / "share/jupyter/labextensions/trainhub-panel"
    assert json.loads((dest / "package.json").read_text())["name"] == "trainhub-panel"
    conf = json.loads((tmp_path / "etc/jupyter/jupyter_server_config.d/trainhub.json").read_text())
    assert conf == {"ServerApp": {"jpserver_extensions": JPSERVER_EXTENSIONS}}
    scheduler = json.loads((tmp_path / "etc/jupyter/jupyter_jupyter_scheduler_config.json").read_text())
    assert scheduler["SchedulerApp"]["environment_manager_class"] == "trainhub.extensions.notebookjobs.TrainhubEnvironments"
    mtime = (dest / "package.json").stat().st_mtime_ns
    assert install_labextension(tmp_path) == dest
    assert (dest / "package.json").stat().st_mtime_ns == mtime
