"""trainhub's Jupyter extensions.

- :mod:`trainhub.extensions.storage`: the jupyter-server extension (storage browser and the
  panel's proxy to the trainhub API).
- ``panel/``: the prebuilt JupyterLab extension ``trainhub-panel`` (source in ``labextension/``;
  rebuild with ``npm install && npx tsc && jupyter-builder build .`` there).

:func:`install_labextension` puts both where a single-user server in this Python environment
finds them; ``trainhub up`` and CI call it, so no npm step is needed at install time.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

LABEXTENSION_NAME = "trainhub-panel"
PANEL_DIR = Path(__file__).with_name("panel")
SERVER_EXTENSION = "trainhub.extensions.storage"


def _jupyter_labextension_paths():
    return [{"src": "panel", "dest": LABEXTENSION_NAME}]


def _jupyter_server_extension_points():
    return [{"module": SERVER_EXTENSION}]


def install_labextension(prefix: str | os.PathLike | None = None, enable_server_extension: bool = True) -> Path:
    """Copy the prebuilt panel to ``<prefix>/share/jupyter/labextensions/trainhub-panel``.

    With ``enable_server_extension`` also writes
    ``<prefix>/etc/jupyter/jupyter_server_config.d/trainhub.json`` enabling the storage
    server extension for every server started from this environment. Idempotent: the copy
    is replaced only when the built files changed. Returns the labextension folder.
    """
    prefix = Path(prefix or sys.prefix)
    if not (PANEL_DIR / "package.json").exists():
        raise FileNotFoundError(f"the prebuilt panel is missing at {PANEL_DIR}; build it in {PANEL_DIR.parent / 'labextension'}")
    dest = prefix / "share" / "jupyter" / "labextensions" / LABEXTENSION_NAME
    if _differs(PANEL_DIR, dest):
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(PANEL_DIR, tmp)
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(dest)
    if enable_server_extension:
        conf = prefix / "etc" / "jupyter" / "jupyter_server_config.d" / "trainhub.json"
        conf.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"ServerApp": {"jpserver_extensions": {SERVER_EXTENSION: True}}}, indent=2) + "\n"
        if not conf.exists() or conf.read_text() != text:
            conf.write_text(text)
    return dest


def _differs(src: Path, dest: Path) -> bool:
    if not dest.exists():
        return True
    a = {p.relative_to(src): p.stat().st_size for p in src.rglob("*") if p.is_file()}
    b = {p.relative_to(dest): p.stat().st_size for p in dest.rglob("*") if p.is_file()}
    if a != b:
        return True
    return any((src / rel).read_bytes() != (dest / rel).read_bytes() for rel in a)
