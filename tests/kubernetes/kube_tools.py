"""The real Kubernetes tools the tests use, obtained on demand and cached outside the clone:

* ``helm_binary()``: helm v4.1.4 from ``tools/get-helm.sh`` (checksum-verified);
* ``render_chart(values_file, kube_version)``: ``helm template`` of helm/trainhub;

A tool that cannot be had fails the test loudly (``pytest.fail``), so CI never passes by skipping.
A developer opts out explicitly: ``TRAINHUB_SKIP_HELM=1`` skips the helm tests,
``TRAINHUB_SKIP_CONTROLPLANE=1`` the tests that need the real control plane (built and started
by ``conftest.py`` with ``controlplane/``).
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CHART = ROOT / "helm" / "trainhub"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
GET_HELM = HERE / "tools" / "get-helm.sh"


# The chart's supported range: Chart.yaml says kubeVersion ">=1.29.0-0" (Z2JH 4.4.0: ">=1.28.0-0"),
# with no upper bound; 1.37 is the newest Kubernetes whose schemas kubernetes-validate 1.37.0 carries.
KUBE_LOWEST = "1.29.0"
KUBE_HIGHEST = "1.37.0"
# kinds of CustomResourceDefinitions the chart renders, for which no schema is bundled
CRD_KINDS = {("kueue.x-k8s.io/v1beta1", "LocalQueue")}


def _opted_out(var: str) -> bool:
    return os.environ.get(var, "").lower() in ("1", "true", "yes")


@functools.cache
def _helm() -> str:
    proc = subprocess.run(["bash", str(GET_HELM)], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{GET_HELM} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return str(Path(proc.stdout.strip().splitlines()[-1]) / "helm")


def helm_binary() -> str:
    if _opted_out("TRAINHUB_SKIP_HELM"):
        pytest.skip("TRAINHUB_SKIP_HELM is set")
    try:
        return _helm()
    except RuntimeError as e:
        pytest.fail(f"helm is needed for the chart tests and could not be obtained ({e}); "
                    "set TRAINHUB_SKIP_HELM=1 to skip them on purpose", pytrace=False)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True,
                          env={**os.environ, "HELM_CACHE_HOME": os.environ.get("HELM_CACHE_HOME", "/tmp/trainhub-helm-cache")})
    if check and proc.returncode:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}\n{proc.stdout[-2000:]}")
    return proc


@functools.cache
def _render(values_file: str | None, kube_version: str, namespace: str, sets: tuple = ()) -> str:
    args = ["template", "trainhub", str(CHART), "--namespace", namespace, "--kube-version", kube_version]
    if values_file:
        args += ["-f", values_file]
    for s in sets:
        args += ["--set", s]
    return helm(*args).stdout


def render_chart(values_file: Path | None = None, kube_version: str = KUBE_HIGHEST, namespace: str = "trainhub",
                 sets: tuple = ()) -> list[dict]:
    """The objects ``helm template`` renders (documents that are empty dropped)."""
    text = _render(str(values_file) if values_file else None, kube_version, namespace, tuple(sets))
    return [doc for doc in yaml.safe_load_all(text) if doc]
