"""Fixtures for the Kubernetes back end, against a stand-in API server or a real cluster.

By default the tests talk over HTTP on loopback to ``KubeStandin`` (kmock with fixes plus a
fake scheduler/kubelet, see ``kube_standin.py``) through the real kubernetes-asyncio client
and the real KubeSpawner. With ``TRAINHUB_TEST_KUBECONFIG=/path/to/kubeconfig`` they run
against that cluster instead (see ``.github/workflows/k3s-e2e.yml``): the first node is
labelled and given fake extended resources (``nvidia.com/gpu``, a MIG slice) through the node
status subresource, the documented way to advertise extended resources by hand.

Fixtures:

* ``cluster`` (session): a ``Cluster`` — ``.real``, ``.namespace``, ``.kube`` (the stand-in or
  None), ``await .pods()`` ({name: pod dict} in the test namespace), ``await .read(kind, name)``
  (kind: pod, secret, pvc, pv; None if absent), ``await .add_user_pod(name, user, resources,
  job=True, node=None)`` (a running pod holding GPUs for a user), ``await .delete_pod(name)``,
  ``await .wait_for_cache(predicate)`` (on the spawner's pod cache), ``.count_requests(fragment)``
  (list requests served, stand-in only). Constants and ``spawner_config(**Section__name)`` live
  in ``k8s_test_config.py``.
* ``kubeconfig`` (session): the kubeconfig file in use (written to tmp for the stand-in).
* ``make_spawner``: factory ``make_spawner(user="alice", groups=(), admin=False, options=None,
  **traits)`` returning a ``GPUKubeSpawner`` configured with the test profiles; spawners it
  made are stopped at teardown. The reflectors are stopped at session end
  (``KubeSpawner._stop_all_reflectors()``), without which teardown hangs.
* ``validate_k8s``: ``validate_k8s(obj)`` checks a dict or client model with
  ``kubernetes_validate`` (strict) for Kubernetes 1.29.0 and 1.37.0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytest_asyncio

sys.path.insert(0, str(Path(__file__).parent))

from kube_standin import PODS, standin_server, write_kubeconfig  # noqa: E402

from k8s_test_config import (  # noqa: E402
    GPU_TYPE_LABEL, MIG, NAMESPACE, REAL_KUBECONFIG, TEST_IMAGE, spawner_config,
)


class Cluster:
    def __init__(self, kube, namespace: str):
        self.kube = kube
        self.namespace = namespace
        self.real = kube is None

    def _api(self):
        from kubespawner.clients import shared_client

        return shared_client("CoreV1Api")

    def _dict(self, model) -> dict:
        return self._api().api_client.sanitize_for_serialization(model)

    async def pods(self) -> dict[str, dict]:
        if self.kube is not None:
            return {name: pod for (ns, name), pod in self.kube.store(PODS).items() if ns == self.namespace}
        resp = await self._api().list_namespaced_pod(self.namespace)
        return {p.metadata.name: self._dict(p) for p in resp.items}

    async def read(self, kind: str, name: str):
        """A namespaced object (secret, pvc) or a PV as a dict, or None."""
        from kubernetes_asyncio.client.rest import ApiException

        api = self._api()
        call = {
            "secret": lambda: api.read_namespaced_secret(name, self.namespace),
            "pvc": lambda: api.read_namespaced_persistent_volume_claim(name, self.namespace),
            "pv": lambda: api.read_persistent_volume(name),
            "pod": lambda: api.read_namespaced_pod(name, self.namespace),
        }[kind]
        try:
            return self._dict(await call())
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    async def add_user_pod(self, name: str, user: str, resources: dict, *, job: bool = True, node: str | None = None):
        """A running pod holding ``resources`` for ``user`` (a trainhub job pod by default)."""
        from trainhub.kube.names import JOB_USER_ANNOTATION, NOTEBOOK_USER_ANNOTATION

        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace,
                         "annotations": {JOB_USER_ANNOTATION if job else NOTEBOOK_USER_ANNOTATION: user}},
            "spec": {
                "containers": [{"name": "main", "image": TEST_IMAGE, "command": ["sleep", "3600"],
                                "resources": {"limits": dict(resources)}}],
                "tolerations": [{"operator": "Exists"}],
                **({"nodeName": node} if node else {}),
            },
        }
        await self._api().create_namespaced_pod(self.namespace, pod)
        await self.wait_for_cache(lambda pods: f"{self.namespace}/{name}" in pods)

    async def delete_pod(self, name: str):
        from kubernetes_asyncio.client.rest import ApiException

        with contextlib.suppress(ApiException):
            await self._api().delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        await self.wait_for_cache(lambda pods: f"{self.namespace}/{name}" not in pods)

    async def wait_for_cache(self, predicate, timeout: float = 20):
        from kubespawner import KubeSpawner

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            refl = [r for (kind, _), r in KubeSpawner.reflectors.items() if kind == "trainhub-pods"]
            if not refl or predicate(refl[0].pods):
                return
            await asyncio.sleep(0.02)
        raise AssertionError("pod cache did not catch up")

    def count_requests(self, path_fragment: str) -> int:
        """List requests (GET without watch) whose path contains ``path_fragment`` (stand-in only)."""
        return sum(
            1 for r in self.kube.recorded_requests()
            if path_fragment in str(r.url.path) and str(r.method).upper().endswith("GET")
            and str(r.params.get("watch", "")).lower() not in ("true", "1")
        )


async def _prepare_real_cluster(namespace: str):
    """Label the first node and advertise fake GPUs on it (status subresource, JSON patch)."""
    from kubernetes_asyncio import client
    from kubespawner.clients import shared_client

    api = shared_client("CoreV1Api")
    nodes = (await api.list_node()).items
    node = nodes[0].metadata.name
    await api.patch_node(node, {"metadata": {"labels": {GPU_TYPE_LABEL: "a100"}}})
    patch = [
        {"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "4"},
        {"op": "add", "path": "/status/capacity/nvidia.com~1mig-1g.10gb", "value": "2"},
    ]
    await api.patch_node_status(node, patch)  # a list body goes out as application/json-patch+json
    with contextlib.suppress(client.ApiException):
        await api.create_namespace({"metadata": {"name": namespace}})
    await asyncio.sleep(2)  # the kubelet copies capacity to allocatable


@pytest.fixture(scope="session")
def kubeconfig(tmp_path_factory):
    return REAL_KUBECONFIG or str(tmp_path_factory.mktemp("kube") / "config")


def _use_kubeconfig(path: str) -> None:
    # kubernetes-asyncio reads $KUBECONFIG once, at import; KubeSpawner loads the default file
    from kubernetes_asyncio.config import kube_config

    os.environ["KUBECONFIG"] = path
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = path


@pytest_asyncio.fixture(scope="session")
async def cluster(kubeconfig):
    from kubespawner import KubeSpawner

    if REAL_KUBECONFIG:
        _use_kubeconfig(REAL_KUBECONFIG)
        from kubespawner.clients import load_config

        load_config()
        await _prepare_real_cluster(NAMESPACE)
        yield Cluster(None, NAMESPACE)
        await KubeSpawner._stop_all_reflectors()
        return
    async with standin_server() as kube:
        # two A100 nodes (4 + 2 GPUs, tainted), one MIG node, one CPU node, one cordoned GPU node
        taint = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
        kube.add_node("gpu-a", allocatable={"nvidia.com/gpu": "4"}, labels={GPU_TYPE_LABEL: "a100"}, taints=taint)
        kube.add_node("gpu-b", allocatable={"nvidia.com/gpu": "2"}, labels={GPU_TYPE_LABEL: "a100"}, taints=taint)
        kube.add_node("mig-a", allocatable={MIG: "2"}, labels={GPU_TYPE_LABEL: "a100-mig"})
        kube.add_node("cpu-a", allocatable={})
        kube.add_node("gpu-cordoned", allocatable={"nvidia.com/gpu": "8"}, labels={GPU_TYPE_LABEL: "a100"},
                      taints=taint, unschedulable=True)
        write_kubeconfig(kubeconfig, str(kube.url).rstrip("/"), NAMESPACE)
        _use_kubeconfig(kubeconfig)
        from kubespawner.clients import load_config

        load_config()  # tests may use shared clients before any spawner loads the config
        try:
            yield Cluster(kube, NAMESPACE)
        finally:
            await KubeSpawner._stop_all_reflectors()


class FakeGroup(SimpleNamespace):
    pass


def _make_user(name: str, groups=(), admin=False, group_members=None):
    user = SimpleNamespace(name=name, id=abs(hash(name)) % 10**6, url=f"/user/{name}/", admin=admin)
    members = group_members or {}
    user.groups = [
        FakeGroup(name=g, users=[SimpleNamespace(name=u) for u in sorted(set(members.get(g, ())) | {name})])
        for g in groups
    ]
    return user


@pytest_asyncio.fixture
async def make_spawner(cluster):
    from trainhub.spawner.kubernetes import GPUKubeSpawner

    made = []

    def factory(user="alice", groups=(), admin=False, options=None, group_members=None, config=None, **traits):
        spawner = GPUKubeSpawner(
            _mock=True, user=_make_user(user, groups, admin, group_members), config=config or spawner_config(), **traits,
        )
        spawner.user_options = dict(options or {})
        made.append(spawner)
        return spawner

    yield factory
    for spawner in made:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(spawner.stop(now=True), 30)
    for spawner in made:
        with contextlib.suppress(Exception):
            await cluster.wait_for_cache(lambda pods, s=spawner: f"{s.namespace}/{s.pod_name}" not in pods)


@pytest.fixture
def validate_k8s():
    import kubernetes_validate
    from kubespawner.clients import shared_client

    def check(obj):
        # the shared client's ApiClient: a fresh ApiClient() would open an aiohttp session
        data = obj if isinstance(obj, dict) else shared_client("CoreV1Api").api_client.sanitize_for_serialization(obj)
        for version in ("1.29.0", "1.37.0"):
            kubernetes_validate.validate(data, version, strict=True)
        return data

    return check
