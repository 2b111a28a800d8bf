"""Fixtures for the Kubernetes back end: the API stand-in, the real v1.20 control plane, or a cluster.

Three modes (``k8s_test_config.kube_mode()``):

* ``standin`` (default): the tests talk over HTTP on loopback to ``KubeStandin`` (kmock with
  fixes plus a fake scheduler/kubelet/Job controller, see ``kube_standin.py``) through the real
  kubernetes-asyncio client and the real KubeSpawner.
* ``real`` (``pytest --kube=real`` or ``TRAINHUB_TEST_KUBE=real``): the same tests against the
  real kube-apiserver, kube-controller-manager and kube-scheduler v1.20.2 plus the kubelet
  stand-in (``controlplane/``), one control plane for the session, its nodes made through the
  API (``real_kube.RealKube`` offers the stand-in's helper methods). Tests that need what 1.20
  cannot carry are skipped there with the reason (``STANDIN_ONLY`` below, marker
  ``kube_api``); they run on the stand-in in the default mode.
* ``cluster`` (``TRAINHUB_TEST_KUBECONFIG=/path/to/kubeconfig``): an existing cluster (see
  ``.github/workflows/k3s-e2e.yml``): the first node is labelled and given fake extended
  resources (``nvidia.com/gpu``, a MIG slice) through the node status subresource.

Tests marked ``controlplane`` (the differential test, the chart's RBAC, watch/relist, graceful
deletion and garbage collection) always run against the real control plane, in every mode, so
the default ``pytest`` run covers them. The control plane is built before the first test when
the session needs it (``controlplane/build.sh``, cached in ``~/.cache/trainhub/kube-1.20.2``);
a build failure fails those tests loudly. ``TRAINHUB_SKIP_CONTROLPLANE=1`` skips them on purpose.

Fixtures:

* ``cluster`` (session): a ``Cluster`` — ``.real`` (an external cluster), ``.mode``,
  ``.namespace``, ``.kube`` (the stand-in, a ``RealKube``, or None), ``await .pods()`` ({name: pod dict} in the test namespace), ``await .read(kind, name)``
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
* ``controlplane`` (session): the running ``controlplane.ControlPlane`` (started on first use).
* ``real_kube`` (session): a ``RealKube`` on it, with the session's nodes (``NODES``).
* ``kube_backend``: ``async with kube_backend(nodes=..., jobs=False) as kube`` — a fresh
  stand-in with those nodes in the default mode; in ``real`` mode the shared ``RealKube`` with
  every pod and Job of the test namespaces deleted first (nodes are shared by the session).
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
sys.path.insert(0, str(Path(__file__).parent / "controlplane"))  # controlplane.py, the starter

from kube_standin import JOBS, PODS, standin_server  # noqa: E402

from k8s_test_config import (  # noqa: E402
    CONTROL_PLANE_VERSION, GPU_TYPE_LABEL, NAMESPACE, NODES, REAL_KUBECONFIG, SESSION_NODES, TEST_IMAGE, kube_mode,
    spawner_config,
)


# Whole modules that stay on the stand-in in ``real`` mode, and why (what 1.20 cannot carry).
STANDIN_ONLY = {
    "test_job_launcher.py": "Indexed Jobs (completionMode, 1.21+), podFailurePolicy (1.26+) and suspend (Kueue, "
                            "1.21+) are dropped by the 1.20 API server; the launcher's tests run on the stand-in",
    "test_standin.py": "checks the stand-in itself",
}
# fixtures that put a test on a Kubernetes back end (others are pure unit tests)
BACKEND_FIXTURES = {"cluster", "kube", "make_spawner", "kube_backend", "real_kube", "controlplane"}


def pytest_configure(config):
    config.addinivalue_line("markers", "controlplane: runs against the real v1.20 control plane in every mode")
    config.addinivalue_line("markers", "kube_api(version, why): needs Kubernetes >= version (e.g. '1.21') for "
                                       "`why`; skipped on the 1.20 control plane, runs on the stand-in")


_BUILD_ERROR: list[str] = []


def _needs_api(item) -> tuple | None:
    marker = item.get_closest_marker("kube_api")
    if marker:
        version, why = marker.args
        if tuple(int(x) for x in version.split(".")) > CONTROL_PLANE_VERSION:
            return version, why
    return None


def pytest_collection_modifyitems(config, items):
    mode = kube_mode()
    here = Path(__file__).parent
    kube_items = [i for i in items if Path(str(i.fspath)).is_relative_to(here)]
    deselected, needs_plane = [], False
    for item in kube_items:
        uses_backend = bool(BACKEND_FIXTURES & set(getattr(item, "fixturenames", ())))
        if item.get_closest_marker("controlplane"):
            needs_plane = True
            continue
        if mode != "real":
            continue
        if not uses_backend:
            deselected.append(item)  # a unit test: the default run has it
            continue
        why = STANDIN_ONLY.get(Path(str(item.fspath)).name)
        need = _needs_api(item)
        if why or need:
            reason = why or f"needs Kubernetes >= {need[0]} ({need[1]}); the 1.20 control plane cannot carry it"
            item.add_marker(pytest.mark.skip(reason=f"stand-in only: {reason}"))
            continue
        needs_plane = True
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [i for i in items if i not in deselected]
    if needs_plane and not _opted_out() and not config.option.collectonly:
        # built here, before any test starts, so the first build (about 14 min) never meets a test timeout
        from controlplane import ControlPlaneError, ensure_built

        try:
            ensure_built()
        except ControlPlaneError as e:
            _BUILD_ERROR.append(str(e))


def _opted_out() -> bool:
    return os.environ.get("TRAINHUB_SKIP_CONTROLPLANE", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def controlplane(tmp_path_factory):
    from controlplane import ControlPlane, cache_dir

    if _opted_out():
        pytest.skip("TRAINHUB_SKIP_CONTROLPLANE is set")
    if _BUILD_ERROR:
        pytest.fail("the real control plane could not be built; set TRAINHUB_SKIP_CONTROLPLANE=1 to skip its tests "
                    "on purpose:\n" + _BUILD_ERROR[0], pytrace=False)
    plane = ControlPlane(tmp_path_factory.mktemp("controlplane"), bin_dir=cache_dir() / "bin").start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def real_kube(controlplane):
    from real_kube import RealKube

    kube = RealKube(controlplane)
    for name in SESSION_NODES:
        kube.add_node(name, **NODES[name])
    return kube


def _ensure_nodes(kube, names) -> None:
    existing = {name for (_, name) in kube.store(_NODES_RES)}
    for name in names:
        if name not in existing:
            kube.add_node(name, **NODES[name])


async def _clean_namespaces(kube, keep=("kube-system", "kube-public", "kube-node-lease", "default")) -> None:
    for resource in (JOBS, PODS):
        for (ns, name) in list(kube.store(resource)):
            if ns not in keep:
                await kube.remove(resource, ns, name)
    kube.wait_for(lambda: not [k for k in kube.store(PODS) if k[0] not in keep], "the test pods to go", 60)


@pytest.fixture(scope="session")
def kube_backend(request):
    """``async with kube_backend(nodes=[...], jobs=False) as kube``: see the module docstring."""

    @contextlib.asynccontextmanager
    async def backend(nodes=tuple(NODES), jobs: bool = False, namespaces=()):
        if kube_mode() == "real":
            kube = request.getfixturevalue("real_kube")
            _ensure_nodes(kube, nodes)
            await _clean_namespaces(kube)
            for ns in namespaces:
                kube.ensure_namespace(ns)
            yield kube
            return
        async with standin_server(jobs=jobs, namespaces=namespaces) as kube:
            for name in nodes:
                kube.add_node(name, **NODES[name])
            yield kube

    return backend


class Cluster:
    def __init__(self, kube, namespace: str, mode: str = "standin"):
        self.kube = kube
        self.namespace = namespace
        self.mode = mode
        self.real = kube is None  # an external cluster: no fake nodes or storage of ours

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
        """List requests (GET without watch) whose path contains ``path_fragment`` (the stand-in's
        record, or the real apiserver's audit log)."""
        return sum(
            1 for r in self.kube.recorded_requests(**({"user": self.user} if self.mode == "real" else {}))
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


_NODES_RES = ("", "v1", "nodes")


@pytest.fixture(scope="session")
def kubeconfig(tmp_path_factory):
    return REAL_KUBECONFIG or str(tmp_path_factory.mktemp("kube") / "config")


def _use_kubeconfig(path: str) -> None:
    # kubernetes-asyncio reads $KUBECONFIG once, at import; KubeSpawner loads the default file
    from kubernetes_asyncio.config import kube_config

    os.environ["KUBECONFIG"] = path
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = path


@pytest_asyncio.fixture(scope="session")
async def cluster(kubeconfig, request):
    from kubespawner import KubeSpawner

    if kube_mode() == "real":
        kube = request.getfixturevalue("real_kube")
        kube.ensure_namespace(NAMESPACE)
        kube.write_kubeconfig(kubeconfig, NAMESPACE)
        _use_kubeconfig(kubeconfig)
        from kubespawner.clients import load_config

        load_config()
        try:
            cluster = Cluster(kube, NAMESPACE, "real")
            cluster.user = kube.last_user
            yield cluster
        finally:
            await KubeSpawner._stop_all_reflectors()
        return
    if REAL_KUBECONFIG:
        _use_kubeconfig(REAL_KUBECONFIG)
        from kubespawner.clients import load_config

        load_config()
        await _prepare_real_cluster(NAMESPACE)
        yield Cluster(None, NAMESPACE, "cluster")
        await KubeSpawner._stop_all_reflectors()
        return
    async with standin_server(namespaces=(NAMESPACE,)) as kube:
        # two A100 nodes (4 + 2 GPUs, tainted), one MIG node, one CPU node, one cordoned GPU node
        for name in SESSION_NODES:
            kube.add_node(name, **NODES[name])
        kube.write_kubeconfig(kubeconfig, NAMESPACE)
        _use_kubeconfig(kubeconfig)
        from kubespawner.clients import load_config

        load_config()  # tests may use shared clients before any spawner loads the config
        try:
            yield Cluster(kube, NAMESPACE, "standin")
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
