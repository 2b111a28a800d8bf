"""The chart's own RBAC on a real apiserver: rendered by the real helm, applied to the v1.20
control plane (RBAC authorization only), and exercised as the chart's ServiceAccounts with
tokens from the TokenRequest API.

* the **hub** account (Z2JH's ``hub`` Role plus trainhub's additions) runs a real
  GPUKubeSpawner spawn, in a process of its own, with the S3 CSI storage of
  ``examples/s3-csi.yaml``: Secret create-then-replace, PersistentVolume, claims, pod, watch;
* the **trainhub-jobs** account (the launcher's Role and the ledger's ClusterRole) makes the
  calls the launcher makes (Jobs, Services, pods, pods/log) and runs the real
  KubernetesGPUAllocator, which lists and watches nodes and pods of every namespace;
* what neither may do is refused (403): secrets for the launcher, other namespaces, deleting
  nodes, creating pods as the launcher.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kube_tools import CHART, KUBE_LOWEST, render_chart
from k8s_test_config import PROFILES

pytestmark = pytest.mark.controlplane

RELEASE_NS = "trainhub"
EXAMPLE = CHART / "examples" / "s3-csi.yaml"
RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
_PATHS = {"ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
          "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
          "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
          "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
          "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"}


@pytest.fixture(scope="module")
def chart(real_kube):
    """Apply the rendered RBAC objects; {account: token}."""
    objects = [o for o in render_chart(EXAMPLE, KUBE_LOWEST, namespace=RELEASE_NS) if o["kind"] in RBAC_KINDS]
    real_kube.ensure_namespace(RELEASE_NS)
    applied = []
    for obj in objects:
        ns = obj["metadata"].get("namespace") or RELEASE_NS
        if obj["kind"].startswith("Cluster"):
            obj["metadata"].pop("namespace", None)
        else:
            real_kube.ensure_namespace(ns)
        status, body = real_kube.plane.request("POST", _PATHS[obj["kind"]].format(ns=ns), obj)
        assert status in (201, 409), (obj["kind"], obj["metadata"]["name"], body)
        applied.append((obj["kind"], obj["metadata"]["name"]))
    accounts = [name for kind, name in applied if kind == "ServiceAccount"]
    tokens = {a: real_kube.service_account_token(RELEASE_NS, a) for a in accounts}
    return {"applied": applied, "tokens": tokens}


def as_account(real_kube, token):
    def call(method, path, body=None, ctype="application/json"):
        return real_kube.plane.request(method, path, body, token=token, content_type=ctype)
    return call


def test_the_rendered_rbac_applies(chart):
    kinds = {k for k, _ in chart["applied"]}
    assert kinds == set(RBAC_KINDS)
    assert {"hub", "trainhub-jobs"} <= set(chart["tokens"])
    assert ("Role", "trainhub-launcher") in chart["applied"] and ("ClusterRole", "trainhub-ledger-trainhub") in chart["applied"]


def test_the_launcher_account_can_do_what_the_launcher_does_and_no_more(chart, real_kube):
    call = as_account(real_kube, chart["tokens"]["trainhub-jobs"])
    ns = f"/api/v1/namespaces/{RELEASE_NS}"
    batch = f"/apis/batch/v1/namespaces/{RELEASE_NS}"
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "rbac-check"},
           "spec": {"parallelism": 0, "template": {"spec": {"restartPolicy": "Never",
                                                            "containers": [{"name": "w", "image": "busybox"}]}}}}
    assert call("POST", f"{batch}/jobs", job)[0] == 201
    assert call("GET", f"{batch}/jobs/rbac-check")[0] == 200
    assert call("GET", f"{batch}/jobs?watch=1&timeoutSeconds=1")[0] == 200
    svc = {"metadata": {"name": "rbac-check"}, "spec": {"clusterIP": "None", "ports": [{"port": 29500}]}}
    assert call("POST", f"{ns}/services", svc)[0] == 201
    assert call("GET", f"{ns}/pods")[0] == 200
    assert call("GET", f"{ns}/pods/none/log")[0] == 404  # allowed; the pod is missing
    # each attempt's credentials Secret: created (owned by its Job), its values patched when minted again, never
    # read back, listed or deleted
    secret = {"metadata": {"name": "rbac-check-credentials"}, "stringData": {"credentials.json": "{}"}}
    assert call("POST", f"{ns}/secrets", secret)[0] == 201
    patched = call("PATCH", f"{ns}/secrets/rbac-check-credentials", {"stringData": {"credentials.json": "{\"Version\": 1}"}},
                   "application/merge-patch+json")
    assert patched[0] == 200, patched
    stored = real_kube.plane.request("GET", f"{ns}/secrets/rbac-check-credentials")[1]
    assert base64.b64decode(stored["data"]["credentials.json"]).decode() == '{"Version": 1}'
    for method, path, body in (("GET", f"{ns}/secrets/rbac-check-credentials", None), ("GET", f"{ns}/secrets", None),
                               ("DELETE", f"{ns}/secrets/rbac-check-credentials", None)):
        status, answer = call(method, path, body, "application/merge-patch+json" if method == "PATCH" else "application/json")
        assert status == 403, (method, path, status, answer)
    assert call("DELETE", f"{batch}/jobs/rbac-check", {"propagationPolicy": "Foreground", "gracePeriodSeconds": 3})[0] == 200
    assert call("DELETE", f"{ns}/services/rbac-check")[0] == 200
    # the ledger's ClusterRole: nodes and every namespace's pods, read only
    assert call("GET", "/api/v1/nodes")[0] == 200 and call("GET", "/api/v1/pods")[0] == 200
    refused = [
        ("GET", f"{ns}/secrets", None),
        ("POST", f"{ns}/pods", {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
        ("DELETE", f"{ns}/pods/x", None), ("POST", "/apis/batch/v1/namespaces/default/jobs", job),
        ("PATCH", f"{batch}/jobs/rbac-check", {"spec": {"suspend": False}}), ("DELETE", "/api/v1/nodes/gpu-a", None),
        ("POST", f"{ns}/pods/x/exec", None),
    ]
    for method, path, body in refused:
        status, answer = call(method, path, body, "application/merge-patch+json" if method == "PATCH" else "application/json")
        assert status == 403, (method, path, status, answer)


def test_the_ledger_runs_as_the_jobs_account(chart, real_kube, tmp_path):
    from traitlets.config import Config

    from trainhub.spawner.k8s_allocator import KubernetesGPUAllocator

    kubeconfig = real_kube.kubeconfig_for_token(tmp_path / "kubeconfig", chart["tokens"]["trainhub-jobs"],
                                                RELEASE_NS, "trainhub-jobs")
    c = Config()
    c.ProfileCatalog.profiles = PROFILES
    c.ProfileCatalog.default_profile = "cpu"
    allocator = KubernetesGPUAllocator(config=c, kubeconfig=kubeconfig)
    try:
        devices = allocator.devices()
        nodes = {d.uuid.split("/")[2] for d in devices}
        assert {"gpu-a", "gpu-b", "mig-a"} <= nodes and "gpu-cordoned" not in nodes
        assert allocator.holdings() == [] or all(h.holder for h in allocator.holdings())
    finally:
        allocator.close()


def test_the_hub_account_spawns_with_csi_storage(chart, real_kube):
    overrides = {
        "KubeSpawner__namespace": RELEASE_NS,
        "GPUKubeSpawner__storage_mount": "csi",
        "StorageConfig__url": "s3://acme-trainhub/prod", "StorageConfig__key": "AKIAEXAMPLE",
        "StorageConfig__secret": "s3cr3t", "StorageConfig__endpoint_url": "https://rgw.example.org",
        # what the hub's Role allows, with the Secret's AWS_* form (its own-credentials form: test_spawner.py)
        "StorageConfig__share_platform_credentials": True,
    }
    kubeconfig = real_kube.kubeconfig_for_token(Path(real_kube.plane.workdir) / "kubeconfig-hub", chart["tokens"]["hub"],
                                                RELEASE_NS, "hub")
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    script = Path(__file__).parent / "spawn_once.py"
    results = []
    for _ in range(2):  # the second spawn finds the Secret and replaces it (the Role's "update")
        proc = subprocess.run([sys.executable, str(script), "rbac-user", "gpu-1", json.dumps(overrides)],
                              capture_output=True, text=True, env=env, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    for result in results:
        assert "error" not in result, result
        assert result["url"].startswith("http://") and result["namespace"] == RELEASE_NS
    admin = real_kube.plane.request
    secrets = admin("GET", f"/api/v1/namespaces/{RELEASE_NS}/secrets")[1]["items"]
    assert any(s["metadata"]["name"].startswith("trainhub-storage-") for s in secrets)
    pvs = admin("GET", "/api/v1/persistentvolumes")[1]["items"]
    assert any((pv["spec"].get("csi") or {}).get("driver") == "s3.csi.aws.com" for pv in pvs)
    # the hub may not act outside its namespace
    call = as_account(real_kube, chart["tokens"]["hub"])
    assert call("POST", "/api/v1/namespaces/default/pods",
                {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "x"}]}})[0] == 403
    assert call("DELETE", "/api/v1/nodes/gpu-a")[0] == 403
    assert call("GET", "/api/v1/nodes")[0] == 200
