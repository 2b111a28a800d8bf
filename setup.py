"""Package discovery for trainhub's folder-to-namespace mapping, and the Jupyter data files.

The top-level folders (spawner/, kernels/, ...) install as ``trainhub.<folder>``;
setuptools needs every sub-package named, so we walk the tree once here.

The prebuilt JupyterLab panel (extensions/panel) and the config file enabling the server extension
(extensions/jupyter-config/trainhub.json) are also installed as data files under the environment's
prefix, where JupyterLab and jupyter-server look (the same places as
``trainhub.extensions.LABEXTENSION_DEST`` / ``SERVER_CONFIG_DEST``; tests/panel/test_panel_wheel.py
checks a built wheel against them).
"""

import os

from setuptools import setup

ROOTS = {
    "trainhub": "trainhub",
    "trainhub.spawner": "spawner",
    "trainhub.hub_config": "hub_config",
    "trainhub.extensions": "extensions",
    "trainhub.kernels": "kernels",
    "trainhub.services": "services",
}


def find_packages():
    packages = []
    for name, folder in ROOTS.items():
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = [d for d in dirnames if d not in ("node_modules", "__pycache__", "lib", "src") or os.path.exists(os.path.join(dirpath, d, "__init__.py"))]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, folder)
                packages.append(name if rel == "." else name + "." + rel.replace(os.sep, "."))
    return packages


PANEL = "extensions/panel"
LABEXTENSION_DEST = "share/jupyter/labextensions/trainhub-panel"
SERVER_CONFIG = "extensions/jupyter-config/trainhub.json"
SERVER_CONFIG_DEST = "etc/jupyter/jupyter_server_config.d"
# jupyter-scheduler's own config file (an extension app reads jupyter_<name>_config): trainhub as its back end
SCHEDULER_CONFIG = "extensions/jupyter-config/jupyter_jupyter_scheduler_config.json"
SCHEDULER_CONFIG_DEST = "etc/jupyter"


def data_files():
    out = [(SERVER_CONFIG_DEST, [SERVER_CONFIG]), (SCHEDULER_CONFIG_DEST, [SCHEDULER_CONFIG])]
    for dirpath, dirnames, filenames in os.walk(PANEL):
        dirnames.sort()
        rel = os.path.relpath(dirpath, PANEL)
        dest = LABEXTENSION_DEST if rel == "." else f"{LABEXTENSION_DEST}/{rel.replace(os.sep, '/')}"
        files = [f"{dirpath}/{f}".replace(os.sep, "/") for f in sorted(filenames)]
        if files:
            out.append((dest, files))
    return out


setup(packages=find_packages(), data_files=data_files())
