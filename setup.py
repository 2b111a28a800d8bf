"""Package discovery for trainhub's folder-to-namespace mapping.

The top-level folders (spawner/, kernels/, ...) install as ``trainhub.<folder>``;
setuptools needs every sub-package named, so we walk the tree once here.
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


setup(packages=find_packages())
