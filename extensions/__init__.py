"""trainhub's Jupyter extensions.

- :mod:`trainhub.extensions.storage`: the jupyter-server extension (storage browser and the
  panel's proxy to the trainhub API).
- :mod:`trainhub.extensions.tensorboard`: the jupyter-server extension opening TensorBoard for jobs.
- :mod:`trainhub.extensions.optunadash`: the jupyter-server extension opening optuna-dashboard on the user's own sweeps.
- :mod:`trainhub.extensions.notebookjobs`: trainhub as jupyter-scheduler's back end ("Create Notebook Job").
- ``panel/``: the prebuilt JupyterLab extension ``trainhub-panel`` (source in ``labextension/``;
  rebuild with ``npm install && npx tsc && jupyter-builder build .`` there).
- ``jupyter-config/trainhub.json``: the jupyter-server config file enabling the server extensions and jupyter-scheduler
  with trainhub's back end (:class:`.notebookjobs.TrainhubSchedulerApp` in place of ``jupyter_scheduler``).

A wheel installs both as data files (``share/jupyter/labextensions/trainhub-panel`` and
``etc/jupyter/jupyter_server_config.d/trainhub.json`` under the environment's prefix, see
setup.py), so ``pip install trainhub`` alone gives every single-user server of that environment
the panel. :func:`install_labextension` puts the same files there from this package (``trainhub
up`` and the tests call it, so an editable checkout with a freshly rebuilt panel is current); no
npm step is needed at install time.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

LABEXTENSION_NAME = "trainhub-panel"
PANEL_DIR = Path(__file__).with_name("panel")
SERVER_EXTENSION = "trainhub.extensions.storage"
TENSORBOARD_EXTENSION = "trainhub.extensions.tensorboard"
OPTUNA_DASHBOARD_EXTENSION = "trainhub.extensions.optunadash"
SERVER_EXTENSIONS = (SERVER_EXTENSION, TENSORBOARD_EXTENSION, OPTUNA_DASHBOARD_EXTENSION)
#: jupyter-scheduler ("Create Notebook Job", the Notebook Jobs list) with trainhub as its back end: its server extension
#: app subclassed so that a refusal keeps its status (:class:`.notebookjobs.TrainhubSchedulerApp`), enabled in place of
#: jupyter-scheduler's own (:data:`REPLACED_EXTENSIONS`, switched off)
SCHEDULER_EXTENSION = "trainhub.extensions.notebookjobs"
ENABLED_EXTENSIONS = (*SERVER_EXTENSIONS, SCHEDULER_EXTENSION)
REPLACED_EXTENSIONS = ("jupyter_scheduler",)
#: ``ServerApp.jpserver_extensions`` as ``jupyter-config/trainhub.json`` sets it
JPSERVER_EXTENSIONS = {**{m: True for m in ENABLED_EXTENSIONS}, **{m: False for m in REPLACED_EXTENSIONS}}
#: The jupyter-server config file enabling :data:`SERVER_EXTENSIONS` (shipped as is in the wheel).
SERVER_CONFIG = Path(__file__).parent / "jupyter-config" / "trainhub.json"
#: Where the panel and the config file go, relative to an environment's prefix.
LABEXTENSION_DEST = Path("share", "jupyter", "labextensions", LABEXTENSION_NAME)
SERVER_CONFIG_DEST = Path("etc", "jupyter", "jupyter_server_config.d", "trainhub.json")
#: jupyter-scheduler's config file (an extension app reads ``jupyter_<name>_config`` from the config path, the
#: server's ``jupyter_server_config.d`` only enables it): ``SchedulerApp.scheduler_class`` and
#: ``environment_manager_class`` name trainhub's back end, :mod:`.notebookjobs`
SCHEDULER_CONFIG = Path(__file__).parent / "jupyter-config" / "jupyter_jupyter_scheduler_config.json"
SCHEDULER_CONFIG_DEST = Path("etc", "jupyter", "jupyter_jupyter_scheduler_config.json")


def _jupyter_labextension_paths():
    return [{"src": "panel", "dest": LABEXTENSION_NAME}]


def _jupyter_server_extension_points():
    return [{"module": m} for m in SERVER_EXTENSIONS]


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
    dest = prefix / LABEXTENSION_DEST
    if _differs(PANEL_DIR, dest):
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(PANEL_DIR, tmp)
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(dest)
    if enable_server_extension:
        for src, rel in ((SERVER_CONFIG, SERVER_CONFIG_DEST), (SCHEDULER_CONFIG, SCHEDULER_CONFIG_DEST)):
            conf = prefix / rel
            conf.parent.mkdir(parents=True, exist_ok=True)
            text = src.read_text()
            if not conf.exists() or conf.read_text() != text:
                conf.write_text(text)
            os.chmod(conf, 0o644)
    _readable_by_all(dest)
    return dest


def _readable_by_all(root: Path) -> None:
    """Every user's server reads the panel (per-user accounts): folders 0755, files 0644, whatever the umask was."""
    os.chmod(root, 0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)


def _differs(src: Path, dest: Path) -> bool:
    if not dest.exists():
        return True
    a = {p.relative_to(src): p.stat().st_size for p in src.rglob("*") if p.is_file()}
    b = {p.relative_to(dest): p.stat().st_size for p in dest.rglob("*") if p.is_file()}
    if a != b:
        return True
    return any((src / rel).read_bytes() != (dest / rel).read_bytes() for rel in a)
