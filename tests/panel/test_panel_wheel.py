"""A non-editable install ships the side panel: the wheel `pip wheel .` builds holds the prebuilt
panel and the server-extension config twice, as package data (what ``install_labextension``
copies) and as data files under the environment's prefix (what JupyterLab and jupyter-server read
after a plain ``pip install``, e.g. in a Kubernetes single-user image), and the build gives no
"would be ignored" warning. The wheel is built once per module from a copy of the source tree
(about 5 s), without build isolation, so no network is needed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from trainhub.extensions import (LABEXTENSION_DEST, LABEXTENSION_NAME, PANEL_DIR, SERVER_CONFIG, SERVER_CONFIG_DEST,
                                 JPSERVER_EXTENSIONS, SCHEDULER_CONFIG, SCHEDULER_CONFIG_DEST)

REPO = Path(__file__).resolve().parents[2]
# what the build reads: the project files and the folders that install as trainhub.*
SOURCES = ("pyproject.toml", "setup.py", "README.md", "trainhub", "spawner", "hub_config", "extensions", "kernels", "services")
ROOTS = {"trainhub": "trainhub", "spawner": "trainhub/spawner", "hub_config": "trainhub/hub_config",
         "extensions": "trainhub/extensions", "kernels": "trainhub/kernels", "services": "trainhub/services"}
SKIP = shutil.ignore_patterns("node_modules", "__pycache__", "*.egg-info", "lib", "tsconfig.tsbuildinfo", "build")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import setuptools

    major = int(setuptools.__version__.split(".")[0])
    assert major >= 77, (f"setuptools {setuptools.__version__} is too old to build trainhub (pyproject needs >= 77): "
                         "pip install -e '.[test]'")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        p = REPO / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=SKIP)
        else:
            shutil.copy2(p, src / name)
    out = tmp / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-v",
                        "-w", str(out), str(src)], capture_output=True, text=True, timeout=300, cwd=tmp)
    log = r.stdout + r.stderr
    assert r.returncode == 0, f"pip wheel failed ({r.returncode}):\n{log[-5000:]}"
    wheels = list(out.glob("trainhub-*.whl"))
    assert len(wheels) == 1, os.listdir(out)
    return wheels[0], log, tmp


def test_build_gives_no_package_data_warning(built):
    _, log, _ = built
    assert "would be ignored" not in log, log[log.find("would be ignored") - 2000:][:3000]
    assert "absent from the `packages` configuration" not in log


def test_wheel_holds_the_panel_and_the_server_config(built):
    path, _, _ = built
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        version = path.name.split("-")[1]
        data = f"trainhub-{version}.data/data"
        panel_files = sorted(p.relative_to(PANEL_DIR).as_posix() for p in PANEL_DIR.rglob("*") if p.is_file())
        load = json.loads((PANEL_DIR / "package.json").read_text())["jupyterlab"]["_build"]["load"]
        assert load in panel_files and "package.json" in panel_files
        for rel in panel_files:
            want = (PANEL_DIR / rel).read_bytes()
            # package data, for install_labextension
            assert z.read(f"trainhub/extensions/panel/{rel}") == want, rel
            # data file, where JupyterLab looks after a plain pip install
            assert z.read(f"{data}/{LABEXTENSION_DEST.as_posix()}/{rel}") == want, rel
        shipped = {n for n in names if n.startswith(f"{data}/{LABEXTENSION_DEST.as_posix()}/")}
        assert len(shipped) == len(panel_files), sorted(shipped)
        conf = z.read(f"{data}/{SERVER_CONFIG_DEST.as_posix()}").decode()
        assert conf == SERVER_CONFIG.read_text() == z.read("trainhub/extensions/jupyter-config/trainhub.json").decode()
        assert json.loads(conf) == {"ServerApp": {"jpserver_extensions": JPSERVER_EXTENSIONS}}
        scheduler = z.read(f"{data}/{SCHEDULER_CONFIG_DEST.as_posix()}").decode()
        assert scheduler == SCHEDULER_CONFIG.read_text()
        assert json.loads(scheduler)["SchedulerApp"]["scheduler_class"] == "trainhub.extensions.notebookjobs.TrainhubNotebookScheduler"


def test_wheel_keeps_every_module_and_api_document(built):
    """Listing package data explicitly (include-package-data off) loses no module or OpenAPI file."""
    path, _, _ = built
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
    want = set()
    for folder, namespace in ROOTS.items():
        for p in (REPO / folder).rglob("*"):
            if "node_modules" in p.parts or "__pycache__" in p.parts or not p.is_file():
                continue
            if p.suffix == ".py" or p.name == "openapi.json":
                if not (p.parent / "__init__.py").exists():
                    continue  # not in a package (none today)
                want.add(f"{namespace}/{p.relative_to(REPO / folder).as_posix()}")
    assert want, "no source files found"
    assert sorted(want - names) == []


def test_installed_wheel_is_found_by_jupyterlab_and_jupyter_server(built):
    """pip install of the wheel into a fresh prefix: JupyterLab's discovery finds the panel,
    jupyter-server's config enables the server extension, and install_labextension works from
    the installed package (no source tree)."""
    from jupyter_server.extension.config import ExtensionConfigManager
    from jupyterlab_server.config import get_federated_extensions

    path, _, tmp = built
    prefix = tmp / "prefix"
    # --ignore-installed: else pip first uninstalls the trainhub of the environment running the tests
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed",
                        "--prefix", str(prefix), str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    exts = get_federated_extensions([str(prefix / LABEXTENSION_DEST.parent)])
    assert LABEXTENSION_NAME in exts, exts
    ext = exts[LABEXTENSION_NAME]
    assert (Path(ext["ext_path"]) / ext["jupyterlab"]["_build"]["load"]).is_file()
    manager = ExtensionConfigManager(read_config_path=[str(prefix / "etc" / "jupyter")])
    assert manager.get_jpserver_extensions() == JPSERVER_EXTENSIONS

    site = Path(sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)}))
    assert (site / "trainhub" / "extensions" / "__init__.py").is_file()
    other = tmp / "other-prefix"
    code = ("import sys, trainhub.extensions as e; assert e.__file__.startswith(sys.argv[1]), e.__file__; "
            "print(e.install_labextension(sys.argv[2]))")
    # -S and cwd: neither this venv's editable install nor the checkout's trainhub/ folder answers the import
    r = subprocess.run([sys.executable, "-S", "-c", code, str(site), str(other)], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=str(site)), cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (other / LABEXTENSION_DEST / "package.json").read_bytes() == (PANEL_DIR / "package.json").read_bytes()
    assert (other / SERVER_CONFIG_DEST).read_text() == SERVER_CONFIG.read_text()
    assert (other / SCHEDULER_CONFIG_DEST).read_text() == SCHEDULER_CONFIG.read_text()
