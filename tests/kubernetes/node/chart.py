"""Installing the Helm chart on the real node: ``helm template`` rendered for Kubernetes 1.29 (the chart's floor;
``helm install`` refuses the 1.20 server by the chart's ``kubeVersion``), applied with ``kubectl apply``.

The default values plus ``helm/trainhub/examples/bare-node.yaml`` (the node's own overrides: no DNS, no
kube-proxy, no registry), plus what only the test knows (the API server's port, extra values of a test). Objects
whose API the 1.20 server does not serve are not applied and are reported (the JupyterHub chart's
user-placeholder PodDisruptionBudget is ``policy/v1``, 1.21+; its placeholders are 0 by default, so it
protects nothing).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CHART = ROOT / "helm" / "trainhub"
NODE_VALUES = CHART / "examples" / "bare-node.yaml"
GET_HELM = ROOT / "tests" / "kubernetes" / "tools" / "get-helm.sh"
RELEASE = "trainhub"
NAMESPACE = "trainhub"  # the one bare-node.yaml's host aliases name (trainhub-jobs.trainhub.svc)
RENDER_FOR = "1.29.0"


def tools() -> Path:
    """The folder of helm and kubectl (tools/get-helm.sh: fetched once, checksum-verified)."""
    proc = subprocess.run(["bash", str(GET_HELM)], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{GET_HELM} failed: {proc.stderr[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


@dataclass
class Install:
    namespace: str
    applied: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "Kind/name (apiVersion not served by the server)"


def render(namespace: str, values: list[Path] = (), sets: dict | None = None) -> list[dict]:
    """The chart's objects for ``namespace`` with the default values plus ``values`` files and ``--set-string``s."""
    args = [str(tools() / "helm"), "template", RELEASE, str(CHART), "--namespace", namespace,
            "--kube-version", RENDER_FOR]
    for v in values:
        args += ["-f", str(v)]
    for k, v in (sets or {}).items():
        args += ["--set-string", f"{k}={v}"]
    proc = subprocess.run(args, capture_output=True, text=True,
                          env={**os.environ, "HELM_CACHE_HOME": os.environ.get("HELM_CACHE_HOME", "/tmp/trainhub-helm-cache")})
    if proc.returncode:
        raise RuntimeError(f"helm template failed: {proc.stderr[-3000:]}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def served(plane, api_version: str) -> bool:
    """Whether the API server serves ``api_version`` (discovery)."""
    path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    status, _ = plane.request("GET", path)
    return status == 200


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(tools() / "kubectl"), "--kubeconfig", kubeconfig, *args], input=stdin,
                          capture_output=True, text=True, timeout=300)
    if check and proc.returncode:
        raise RuntimeError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return proc


def install(plane, kubeconfig: str, namespace: str, objects: list[dict]) -> Install:
    """``kubectl apply`` the objects the server serves; the rest is reported in ``skipped``."""
    out = Install(namespace)
    cache: dict[str, bool] = {}
    for obj in objects:
        version = obj["apiVersion"]
        if version not in cache:
            cache[version] = served(plane, version)
        if cache[version]:
            out.applied.append(obj)
        else:
            out.skipped.append(f"{obj['kind']}/{obj['metadata']['name']} ({version} is not served by this API server)")
    stream = "\n---\n".join(json.dumps(o) for o in out.applied)
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=stream)
    return out


def delete(kubeconfig: str, namespace: str, objects: list[dict]) -> None:
    """Delete what ``install`` applied (cluster-scoped objects too), not waiting for the pods."""
    stream = "\n---\n".join(json.dumps(o) for o in objects)
    kubectl(kubeconfig, "delete", "-n", namespace, "--ignore-not-found", "--wait=false", "-f", "-", stdin=stream,
            check=False)
