"""The culler on Kubernetes: its unchanged policy over notebook pods, with DCGM utilisation.

``GPUCuller`` is configured as the chart configures it (``config_from_chart``):
``KubernetesGPUAllocator`` as ``allocator_class`` (servers are the notebook pods in the
stand-in's watch caches) and ``PodDCGMSource`` as ``metrics_class`` (its resolver maps a
server holding's devices to the pod's GPU slots; the canned Prometheus of
``test_dcgm_metrics`` answers). Only the hub is a stand-in object (users, kernels, jobs,
stop/start recorded). The policy's clock seam moves time forward between passes.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from datetime import datetime, timedelta, timezone

import pytest
from waiting import await_for
import pytest_asyncio
from k8s_test_config import PROFILES, REAL_KUBECONFIG
from kube_standin import PODS
from test_dcgm_metrics import _gpu, prom  # noqa: F401 - the canned Prometheus fixture
from traitlets.config import Config

from trainhub.services.culler.policy import NONE, RELEASE, WARN
from trainhub.services.culler.service import GPUCuller
from trainhub.spawner.k8s_allocator import KubernetesGPUAllocator, PodDCGMSource

pytestmark = pytest.mark.skipif(bool(REAL_KUBECONFIG), reason="drives pods through the stand-in")

NS = "trainhub-culler-test"


class FakeHub:
    """The culler's HubClient methods, answered from memory."""

    def __init__(self, servers: dict[str, list[str]]):
        self.servers = servers  # user -> server names
        self.calls: list[tuple] = []

    async def list_active_users(self):
        return [{"name": u, "servers": {n: {"url": f"/user/{u}/{n}", "ready": True, "pending": None} for n in names}}
                for u, names in self.servers.items()]

    async def kernels(self, url):
        return [{"id": "k1", "execution_state": "idle", "last_activity": None}]

    async def running_jobs(self, user):
        return 0

    async def stop_server(self, user, name):
        self.calls.append(("stop", user, name))
        return True

    async def wait_stopped(self, user, name, timeout):
        return None

    async def start_server(self, user, name, profile):
        self.calls.append(("start", user, name, profile))


@pytest_asyncio.fixture
async def kube(tmp_path, kube_backend):
    async with kube_backend(nodes=("gpu-a",), namespaces=(NS,)) as kube:
        yield SimpleNamespace(kube=kube, kubeconfig=kube.write_kubeconfig(tmp_path / "kubeconfig", NS))


async def notebook_pod(kube, user, server, gpus=1):
    """A notebook pod as KubeSpawner makes it (labels, annotations, GPU limits)."""
    name = f"jupyter-{user}-{server}" if server else f"jupyter-{user}"
    await kube.kube.put_object(PODS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS,
                     "labels": {"component": "singleuser-server", "app.kubernetes.io/component": "singleuser-server",
                                "hub.jupyter.org/username": user, "hub.jupyter.org/servername": server},
                     "annotations": {"hub.jupyter.org/username": user, "hub.jupyter.org/servername": server,
                                     "trainhub.io/profile": "gpu-1"}},
        "spec": {"containers": [{"name": "notebook", "image": "busybox",
                                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    })
    return name


def make_culler(kube, prom, clock) -> GPUCuller:
    c = Config()
    c.ProfileCatalog.profiles = PROFILES
    c.ProfileCatalog.default_profile = "cpu"
    c.GPUCuller.allocator_class = KubernetesGPUAllocator
    c.GPUCuller.metrics_class = PodDCGMSource
    c.KubernetesGPUAllocator.kubeconfig = kube.kubeconfig
    c.PodDCGMSource.url = prom.url
    c.CullPolicy.default_timeout = 600.0
    c.CullPolicy.warning_period = 300.0
    c.CullPolicy.release_timeout = 0  # this clock's warning, then release (the 5-min release clock: tests/culler)
    c.CullPolicy.start_grace_period = 0  # the walk starts at the pod's start; the grace: tests/culler/test_culler_habits.py
    c.CullPolicy.utcnow = clock
    return GPUCuller(config=c, client=FakeHub({"alice": ["gpu"], "bob": ["gpu"]}))


async def test_idle_notebook_pod_is_warned_then_released_busy_one_kept(kube, prom):
    idle_pod = await notebook_pod(kube, "alice", "gpu")
    busy_pod = await notebook_pod(kube, "bob", "gpu")
    _gpu(NS, idle_pod, 0, 0, 500, 40000, prom)
    _gpu(NS, busy_pod, 2, 80, 30000, 10000, prom)
    now = [datetime.now(timezone.utc) + timedelta(seconds=2)]  # after the pods' startTime
    culler = make_culler(kube, prom, lambda: now[0])
    culler.setup()
    try:
        assert isinstance(culler.allocator, KubernetesGPUAllocator)
        # the metrics source found the allocator's resolver by itself (no hook in the service)
        assert culler.metrics_source.resolver == culler.allocator.gpu_targets

        async def holds_both():
            hs = await asyncio.to_thread(culler.allocator.holdings)
            return {h.holder for h in hs} == {"server:alice/gpu", "server:bob/gpu"}
        await await_for(holds_both, what="the allocator to see both notebook pods", timeout=10)

        first = {i.user: d for i, d in await culler.run_once()}
        assert first["alice"].action == NONE and first["alice"].reason.startswith("not culled: idle 0s of 10m")
        assert first["bob"].action == NONE and first["bob"].reason == "not culled: GPU busy 80%"

        now[0] += timedelta(seconds=400)
        second = {i.user: d for i, d in await culler.run_once()}
        assert second["alice"].action == WARN and "will release in" in second["alice"].reason
        assert second["bob"].reason == "not culled: GPU busy 80%"
        assert culler.warnings_for("alice")[0]["devices"] == list(second["alice"].measurements["devices"])

        now[0] += timedelta(seconds=400)
        third = {i.user: d for i, d in await culler.run_once()}
        assert third["alice"].action == RELEASE and third["alice"].target_profile == "cpu"
        assert third["bob"].action == NONE
        assert culler.client.calls == [("stop", "alice", "gpu"), ("start", "alice", "gpu", "cpu")]
        # the DCGM query asked for the notebook pods by namespace and name
        assert f'namespace=~"{NS}"' in prom.queries[-1] and idle_pod in prom.queries[-1]
    finally:
        await asyncio.to_thread(culler.allocator.close)


async def test_a_pod_without_fresh_dcgm_series_is_never_idle(kube, prom):
    await notebook_pod(kube, "carol", "")
    now = [datetime.now(timezone.utc) + timedelta(seconds=2)]
    culler = make_culler(kube, prom, lambda: now[0])
    culler.client = FakeHub({"carol": [""]})
    culler.setup()
    try:
        await await_for(lambda: asyncio.to_thread(culler.allocator.holdings), what="the allocator to see carol's pod",
                        timeout=10)
        for _ in range(3):
            (info, decision), = await culler.run_once()
            assert decision.action == NONE and decision.reason.startswith("not culled: no recent GPU metrics")
            now[0] += timedelta(seconds=400)
        assert culler.client.calls == []
    finally:
        await asyncio.to_thread(culler.allocator.close)


# ---------------------------------------------------------------------------------------------
# the chart's wiring: configmap.yaml's services_config.py over trainhub.json


@pytest.mark.parametrize("prometheus", ["http://prometheus:9090", ""])
def test_chart_culler_config_selects_the_kubernetes_ledger(prometheus, tmp_path, monkeypatch):
    import json

    from test_helm_chart import CHART, config_json, load_yaml, services_config_py

    from trainhub.metrics.prometheus import PrometheusDCGMSource

    values = load_yaml(CHART / "values.yaml")
    values["trainhub"]["metrics"]["prometheusUrl"] = prometheus
    values["trainhub"]["culler"].update(idleTimeout=1800, awayTimeout=900, checkInterval=120, action="stop")
    (tmp_path / "trainhub.json").write_text(json.dumps(config_json(values)))
    (tmp_path / "services_config.py").write_text(services_config_py())
    monkeypatch.setenv("TRAINHUB_K8S_CONFIG", str(tmp_path / "trainhub.json"))
    culler = GPUCuller()
    culler.initialize(["--config", str(tmp_path / "services_config.py")])
    assert culler.allocator_class is KubernetesGPUAllocator
    assert culler.policy.default_timeout == 1800 and culler.policy.action == "stop" and culler.check_interval == 120
    assert culler.policy.away_timeout == 900
    assert culler.public_url == "http://proxy-public"
    if prometheus:
        assert culler.metrics_class is PodDCGMSource and issubclass(PodDCGMSource, PrometheusDCGMSource)
        assert PodDCGMSource(config=culler.config).url == prometheus
    else:
        assert culler.metrics_class is None  # NVML: unavailable in the pod, so nothing ever looks idle
