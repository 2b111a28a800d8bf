"""KubernetesGPUAllocator against the API stand-in, through the real kubernetes-asyncio client.

A stand-in of its own (module scope, so other modules' pods do not change the counts):
two tainted A100 nodes (4 + 2 GPUs), a MIG node (2 slices), a CPU node, and GPU nodes that
must not count (cordoned, not Ready, a taint no profile tolerates). The allocator watches it
from its cache thread; tests create pods over HTTP and wait for the caches to see them.
Skipped against a real cluster (the tests count every GPU of the cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest
from waiting import await_for
import pytest_asyncio
from k8s_test_config import GPU_TYPE_LABEL, MIG, PROFILES, REAL_KUBECONFIG, TEST_IMAGE
from kube_standin import JOBS, PODS
from traitlets.config import Config

from trainhub.exceptions import NoFreeGPUs, QuotaExceeded
from trainhub.ledger import LocalGPUAllocator
from trainhub.quotas import QuotaPolicy
from trainhub.metrics.prometheus import GPUTarget
from trainhub.spawner.k8s_allocator import KubernetesGPUAllocator, place_workers, pod_holder

pytestmark = pytest.mark.skipif(bool(REAL_KUBECONFIG), reason="counts every GPU of the stand-in cluster")

NS = "trainhub-ledger-test"
TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
TOLERATE_ALL = [{"operator": "Exists"}]
# what GPU pods tolerate (a blanket toleration would let a real scheduler use the cordoned, not-ready
# and reserved nodes, whose GPUs the ledger rightly does not count)
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


@pytest_asyncio.fixture(scope="module")
async def kube(kube_backend):
    # gpu-a 4 + gpu-b 2 (tainted A100), mig-a (2 slices), cpu-a, and GPU nodes that must not count:
    # gpu-cordoned, gpu-notready, gpu-reserved (a taint no profile tolerates); see conftest.NODES
    async with kube_backend(nodes=("gpu-a", "gpu-b", "mig-a", "cpu-a", "gpu-cordoned", "gpu-notready", "gpu-reserved"),
                            jobs=True, namespaces=(NS,)) as kube:
        yield kube


@pytest.fixture(scope="module")
def ledger_kubeconfig(kube, tmp_path_factory):
    return kube.write_kubeconfig(tmp_path_factory.mktemp("ledgerkube") / "config", NS)


@pytest_asyncio.fixture
async def make_allocator(kube, ledger_kubeconfig):
    made = []

    def factory(**traits):
        c = Config()
        c.ProfileCatalog.profiles = PROFILES
        c.ProfileCatalog.default_profile = "cpu"
        allocator = KubernetesGPUAllocator(config=c, kubeconfig=ledger_kubeconfig, **traits)
        made.append(allocator)
        return allocator

    yield factory
    for allocator in made:
        await asyncio.to_thread(allocator.close)
    for resource in (JOBS, PODS):
        for (ns, name) in list(kube.store(resource)):
            await kube.remove(resource, ns, name)


async def add_pod(kube, name, gpus=1, *, user=None, server=None, job_id=None, resource="nvidia.com/gpu",
                  node=None, phase=None, tolerations=TOLERATE_GPU, profile=None):
    """A pod as KubeSpawner (user + server) or the job launcher (user + job_id) would make it."""
    labels, annotations = {}, {}
    if server is not None:
        labels.update({"component": "singleuser-server", "app.kubernetes.io/component": "singleuser-server",
                       "hub.jupyter.org/username": user, "hub.jupyter.org/servername": server})
        annotations["hub.jupyter.org/username"] = user
        if server:
            annotations["hub.jupyter.org/servername"] = server
    elif job_id is not None:
        labels.update({"trainhub.io/job-id": str(job_id), "app.kubernetes.io/managed-by": "trainhub-jobs"})
        annotations["trainhub.io/username"] = user
    if profile:
        annotations["trainhub.io/profile"] = profile
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": TEST_IMAGE,
                                 "resources": {"limits": {resource: str(gpus)} if gpus else {}}}],
                 "tolerations": tolerations, **({"nodeName": node} if node else {})},
        **({"status": {"phase": phase}} if phase else {}),  # a finished pod: the kubelet leaves it alone
    }
    await kube.put_object(PODS, pod)


async def until(fn, what, timeout=10.0):
    return await await_for(lambda: asyncio.to_thread(fn), what=what, timeout=timeout)


def by_holder(holdings):
    out = {}
    for h in holdings:
        out.setdefault(h.holder, []).append(h)
    return out


async def running(kube, *names):
    def check():
        pods = kube.store(PODS)
        return all((pods.get((NS, n)) or {}).get("status", {}).get("phase") == "Running" for n in names)
    await until(check, f"pods {names} running")


# ---------------------------------------------------------------------------------------------


async def test_devices_are_the_schedulable_gpus_of_ready_tolerated_nodes(make_allocator):
    allocator = make_allocator()
    devices = await asyncio.to_thread(allocator.devices)
    assert [(d.index, d.uuid) for d in devices] == [
        (0, "k8s://gpu-a/nvidia.com/gpu/0"), (1, "k8s://gpu-a/nvidia.com/gpu/1"), (2, "k8s://gpu-a/nvidia.com/gpu/2"),
        (3, "k8s://gpu-a/nvidia.com/gpu/3"), (4, "k8s://gpu-b/nvidia.com/gpu/0"), (5, "k8s://gpu-b/nvidia.com/gpu/1"),
        (6, f"k8s://mig-a/{MIG}/0"), (7, f"k8s://mig-a/{MIG}/1"),
    ]
    assert devices[0].name == "NVIDIA-A100-SXM4-40GB on gpu-a" and devices[0].memory_total_mb == 40960
    assert devices[4].name == "nvidia.com/gpu on gpu-b" and not devices[4].simulated
    # the pool's own settings: one resource, no tolerations (every GPU node here is tainted but mig-a)
    only_gpu = make_allocator(gpu_resources=["nvidia.com/gpu"], tolerations=[])
    assert await asyncio.to_thread(only_gpu.devices) == []
    tolerated = make_allocator(gpu_resources=["nvidia.com/gpu"], tolerations=TOLERATE_ALL, node_selector={GPU_TYPE_LABEL: "a100"})
    assert [d.uuid.split("/")[2] for d in await asyncio.to_thread(tolerated.devices)] == ["gpu-a"] * 4 + ["gpu-b"] * 2


async def test_no_list_per_call(kube, make_allocator):
    def requests_(watch: bool, kind: str):
        return sum(1 for r in kube.recorded_requests() if str(r.method).upper().endswith("GET")
                   and (str(r.params.get("watch", "")).lower() in ("true", "1")) == watch
                   and str(r.url.path).rstrip("/").endswith(kind))

    def lists():
        return requests_(False, "/nodes") + requests_(False, "/pods")

    watches = requests_(True, "/nodes"), requests_(True, "/pods")  # of earlier tests' reflectors
    allocator = make_allocator()
    await asyncio.to_thread(allocator.devices)
    # the reflectors' watch loops list once more as they start, then watch: wait for this allocator's watches
    # (a real apiserver records a watch when it ends: after the reflector's timeout_seconds, 10 s)
    await until(lambda: requests_(True, "/nodes") > watches[0] and requests_(True, "/pods") > watches[1],
                what="the node and pod watches", timeout=90)
    before = lists()
    for _ in range(5):
        await asyncio.to_thread(allocator.devices)
        await asyncio.to_thread(allocator.holdings)
    assert lists() == before


async def test_holdings_from_notebook_and_job_pods(kube, make_allocator):
    allocator = make_allocator()
    await add_pod(kube, "jupyter-alice-gpu", 1, user="alice", server="gpu", profile="gpu-1")
    await add_pod(kube, "jupyter-carol", 1, user="carol", server="", resource=MIG)
    await add_pod(kube, "trainhub-j-000007-a1-0-x", 2, user="bob", job_id=7)
    await add_pod(kube, "other-tenant", 1)  # no trainhub owner: takes a GPU, holds nothing
    await add_pod(kube, "old-job-pod", 1, user="bob", job_id=6, node="gpu-b", phase="Succeeded")
    await running(kube, "jupyter-alice-gpu", "jupyter-carol", "trainhub-j-000007-a1-0-x", "other-tenant")
    holdings = await until(lambda: (lambda h: h if len(h) == 4 else None)(allocator.holdings()), "4 holdings")
    held = by_holder(holdings)
    assert sorted(held) == ["job:7", "server:alice/gpu", "server:carol/"]
    (alice,) = held["server:alice/gpu"]
    assert (alice.kind, alice.user, alice.profile) == ("server", "alice", "gpu-1")
    assert alice.since.tzinfo is not None
    assert [(h.kind, h.user) for h in held["job:7"]] == [("job", "bob")] * 2
    assert held["server:carol/"][0].device in (6, 7)  # a MIG slice on mig-a
    devices = {d.index: d for d in await asyncio.to_thread(allocator.devices)}
    pod = kube.get(PODS, NS, "jupyter-alice-gpu")
    assert devices[alice.device].uuid.startswith(f"k8s://{pod['spec']['nodeName']}/nvidia.com/gpu/")
    assert len({h.device for h in holdings}) == 4  # never two holders on one device
    # the other tenant's GPU is taken but nobody's holding
    free = await asyncio.to_thread(allocator.free_devices)
    assert len(free) == 8 - 4 - 1
    # stable: the same pods keep the same devices
    assert sorted(await asyncio.to_thread(allocator.holdings), key=lambda h: h.device) == sorted(holdings, key=lambda h: h.device)
    # the culler's resolver: server devices -> the pod and its GPU slot
    targets = allocator.gpu_targets([alice.device, 99])
    assert targets == {alice.device: GPUTarget(NS, "jupyter-alice-gpu", 0)}


def _local_ledger(tmp_path, total, held: dict[str, int]):
    devices = [{"index": i, "name": "A100", "uuid": f"GPU-{i}", "memory_total_mb": 40960, "simulated": True} for i in range(total)]
    local = LocalGPUAllocator(db_url=f"sqlite:///{tmp_path}/ledger.db", device_list=devices)
    for user, n in held.items():
        local.allocate(f"job:{user}", kind="job", user=user, count=n)
    return local


def _error(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except (QuotaExceeded, NoFreeGPUs) as e:
        return type(e).__name__, e.message
    raise AssertionError("no error")


async def test_allocate_refuses_over_quota_and_over_capacity_like_the_local_ledger(kube, make_allocator, tmp_path):
    allocator = make_allocator()
    await add_pod(kube, "trainhub-j-000008-a1-0-x", 3, user="bob", job_id=8)
    await until(lambda: len(allocator.holdings()) == 3, "bob's job pod")
    local = _local_ledger(tmp_path, 6, {"bob": 3})  # the same picture: 6 nvidia.com/gpu, bob holds 3
    quota = QuotaPolicy(user_gpu_limit=4)
    for ledger in (allocator, local):
        ledger.quota_kw = dict(kind="job", user="bob", quota=quota)
    args = ("job:9",)
    assert await asyncio.to_thread(_error, allocator.allocate, *args, count=2, **allocator.quota_kw) == \
        _error(local.allocate, *args, count=2, **local.quota_kw)
    assert "GPU quota exceeded: bob holds 3 of 4 GPUs and asked for 2 more." in _error(local.allocate, *args, count=2, **local.quota_kw)[1]
    group = QuotaPolicy(group_gpu_limits={"students": 4})
    kw = dict(kind="job", user="dan", quota=group, user_groups=("students",), group_members={"students": ["bob", "dan"]})
    assert await asyncio.to_thread(_error, allocator.allocate, "job:10", count=2, **kw) == _error(local.allocate, "job:10", count=2, **kw)
    for count in (4, 7):  # 3 of 6 free; more than the pool
        expected = _error(local.allocate, "job:11", kind="job", user="eve", count=count)
        assert await asyncio.to_thread(_error, allocator.allocate, "job:11", kind="job", user="eve", count=count) == expected
    assert expected[1] == "Asked for 7 GPUs but this platform has only 6."
    # nothing held after a refusal
    assert sorted(by_holder(await asyncio.to_thread(allocator.holdings))) == ["job:8"]
    # a profile narrows the pool to its resource and nodes: MIG slices are not nvidia.com/gpu
    assert (await asyncio.to_thread(_error, allocator.allocate, "job:12", kind="job", user="eve", count=3,
                                    profile="mig-small"))[1] == "Asked for 3 GPUs but this platform has only 2."
    assert len(await asyncio.to_thread(allocator.allocate, "job:12", kind="job", user="eve", count=2, profile="mig-small")) == 2


async def test_reservations_count_until_the_pods_exist(kube, make_allocator):
    allocator = make_allocator()
    devices = await asyncio.to_thread(allocator.allocate, "job:20", kind="job", user="bob", count=2, profile="gpu-1",
                                      quota=QuotaPolicy(user_gpu_limit=3))
    assert len(devices) == 2 and set(devices) <= set(range(6))
    held = by_holder(await asyncio.to_thread(allocator.holdings))
    assert sorted(h.device for h in held["job:20"]) == sorted(devices)
    assert {(h.kind, h.user, h.profile) for h in held["job:20"]} == {("job", "bob", "gpu-1")}
    # the reservation counts for the quota and for capacity
    with pytest.raises(QuotaExceeded, match="holds 2 of 3"):
        await asyncio.to_thread(allocator.allocate, "job:21", kind="job", user="bob", count=2, quota=QuotaPolicy(user_gpu_limit=3))
    with pytest.raises(NoFreeGPUs, match="asked for 5, 4 of 6 free"):
        await asyncio.to_thread(allocator.allocate, "job:21", kind="job", user="bob", count=5)
    # one worker's pod appears: the reservation covers the other; then both: the pods are the holding
    await add_pod(kube, "trainhub-j-000020-a1-0-x", 1, user="bob", job_id=20)
    await until(lambda: len(allocator.gpu_targets(list(range(8)))) == 1, "worker 0 in the cache")
    assert len(by_holder(await asyncio.to_thread(allocator.holdings))["job:20"]) == 2
    await add_pod(kube, "trainhub-j-000020-a1-1-x", 1, user="bob", job_id=20)
    await until(lambda: len(allocator.gpu_targets(list(range(8)))) == 2, "worker 1 in the cache")
    held = by_holder(await asyncio.to_thread(allocator.holdings))["job:20"]
    assert len(held) == 2 and {allocator.gpu_targets([h.device])[h.device].pod for h in held} == {
        "trainhub-j-000020-a1-0-x", "trainhub-j-000020-a1-1-x"}
    # release drops the reservation; the pods still hold their GPUs until they are gone
    await asyncio.to_thread(allocator.release, "job:20")
    assert len(by_holder(await asyncio.to_thread(allocator.holdings))["job:20"]) == 2
    assert await asyncio.to_thread(allocator.release, "job:20") == []  # idempotent


async def test_reconcile_drops_reservations_without_pods(make_allocator):
    allocator = make_allocator(reservation_timeout=0.0)
    await asyncio.to_thread(allocator.allocate, "job:30", kind="job", user="bob", count=1)
    await asyncio.to_thread(allocator.allocate, "server:ann/", kind="server", user="ann", count=1)
    released = await asyncio.to_thread(allocator.reconcile, lambda h: True)
    assert {h.holder for h in released} == {"job:30", "server:ann/"}
    assert await asyncio.to_thread(allocator.holdings) == []
    allocator.reservation_timeout = 3600
    await asyncio.to_thread(allocator.allocate, "job:31", kind="job", user="bob", count=1)
    assert await asyncio.to_thread(allocator.reconcile, lambda h: True) == []
    assert [h.holder for h in await asyncio.to_thread(allocator.reconcile, lambda h: h.holder != "job:31")] == ["job:31"]


async def test_concurrent_allocates_cannot_over_admit(make_allocator):
    allocator = make_allocator()
    await asyncio.to_thread(allocator.devices)  # caches loaded
    barrier = threading.Barrier(2)

    def take(holder, user, count, quota=None):
        barrier.wait()
        try:
            return allocator.allocate(holder, kind="job", user=user, count=count, quota=quota)
        except (NoFreeGPUs, QuotaExceeded) as e:
            return e

    # capacity: 6 nvidia.com/gpu, two asks of 4
    results = await asyncio.gather(asyncio.to_thread(take, "job:40", "bob", 4), asyncio.to_thread(take, "job:41", "eve", 4))
    assert sorted(type(r).__name__ for r in results) == ["NoFreeGPUs", "list"]
    await asyncio.to_thread(allocator.release, "job:40")
    await asyncio.to_thread(allocator.release, "job:41")
    # quota: one user, limit 2, two asks of 2
    quota = QuotaPolicy(user_gpu_limit=2)
    barrier.reset()
    results = await asyncio.gather(asyncio.to_thread(take, "job:42", "bob", 2, quota), asyncio.to_thread(take, "job:43", "bob", 2, quota))
    assert sorted(type(r).__name__ for r in results) == ["QuotaExceeded", "list"]
    assert len({h.device for h in await asyncio.to_thread(allocator.holdings)}) == 2


async def test_gang_workers_must_fit_on_one_node_each(make_allocator):
    allocator = make_allocator()
    # gpu-a 4 + gpu-b 2 free: three workers of 2 fit (2 + 1), two workers of 3 do not (only gpu-a has 3)
    chosen = await asyncio.to_thread(allocator.allocate, "job:50", kind="job", user="bob", count=6, per_worker=2, profile="gpu-1")
    assert len(chosen) == 6
    await asyncio.to_thread(allocator.release, "job:50")
    with pytest.raises(NoFreeGPUs, match="on single nodes: 2 worker"):
        await asyncio.to_thread(allocator.allocate, "job:51", kind="job", user="bob", count=6, per_worker=3, profile="gpu-1")
    assert await asyncio.to_thread(allocator.holdings) == []


@pytest.mark.parametrize("free,workers,per,expected", [
    ({"a": [0, 1, 2, 3], "b": [4, 5]}, 1, 2, [4, 5]),  # best fit keeps the big node whole
    ({"a": [0, 1, 2, 3], "b": [4, 5]}, 2, 3, None),
    ({"a": [0, 1, 2, 3], "b": [4, 5]}, 3, 2, [4, 5, 0, 1, 2, 3]),
    ({"a": [0], "b": [1]}, 2, 1, [0, 1]),
    ({}, 1, 1, None),
])
def test_place_workers(free, workers, per, expected):
    assert place_workers(free, workers, per) == expected


@pytest.mark.parametrize("meta,expected", [
    ({"labels": {"component": "singleuser-server"}, "annotations": {"hub.jupyter.org/username": "a@x.org", "hub.jupyter.org/servername": "gpu"}},
     ("server", "server:a@x.org/gpu", "a@x.org")),
    ({"labels": {"app.kubernetes.io/component": "singleuser-server"}, "annotations": {"hub.jupyter.org/username": "a"}},
     ("server", "server:a/", "a")),
    ({"labels": {"trainhub.io/job-id": "12"}, "annotations": {"trainhub.io/username": "b"}}, ("job", "job:12", "b")),
    ({"namespace": "ml", "name": "p", "annotations": {"trainhub.io/username": "b"}}, ("job", "job:ml/p", "b")),
    ({"labels": {"trainhub.io/job-id": "12"}}, None),
    ({"labels": {"app": "other"}}, None),
])
def test_pod_holder(meta, expected):
    assert pod_holder({"metadata": meta}) == expected


def test_import_needs_no_kubernetes_client():
    import subprocess
    import sys

    code = ("import sys; import trainhub.spawner.k8s_allocator as k; "
            "assert 'kubernetes_asyncio' not in sys.modules and 'kubespawner' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# the real job engine and Kubernetes launcher admitting through this ledger


@pytest.mark.kube_api("1.21", "the launcher's Indexed Job (completionMode) and pod failure policy")
async def test_engine_admits_jobs_through_the_kubernetes_ledger(kube, make_allocator, ledger_kubeconfig, tmp_path):
    from trainhub.services.jobs.engine import JobEngine
    from trainhub.services.jobs.kubernetes import KubernetesLauncher
    from trainhub.services.jobs.outputs import OutputSyncer
    from trainhub.services.jobs.store import JobStore
    from trainhub.storage import StorageConfig

    allocator = make_allocator()
    await asyncio.to_thread(allocator.devices)  # caches loaded before the engine's first pass
    c = Config()
    c.ProfileCatalog.profiles = PROFILES
    c.ProfileCatalog.default_profile = "cpu"
    launcher = KubernetesLauncher(config=c, kubeconfig=ledger_kubeconfig, namespace=NS, image=TEST_IMAGE,
                                  jobs_dir=str(tmp_path / "jobs"), log_interval=0.05, request_timeout=5, retry_timeout=5)
    storage = StorageConfig()
    store = JobStore(f"sqlite:///{tmp_path}/platform.db")
    engine = JobEngine(store, allocator, launcher, QuotaPolicy(user_gpu_limit=4), storage, OutputSyncer(storage),
                       catalog=launcher.catalog, grace_period=2)
    try:
        big = await store.write(store.create, user="alice", name="big", command="train", workers=2, gpus=2, profile="gpu-2")
        small = await store.write(store.create, user="alice", name="small", command="train", workers=1, gpus=1, profile="gpu-1")

        async def state(job_id):
            await engine.run_once()
            return (await store.read(store.get, job_id)).state

        await await_for(lambda: state(big.id), lambda st: st == "running", what="the big job to run", timeout=20)
        job = await store.read(store.get, big.id)
        assert job.state == "running"
        held = by_holder(await asyncio.to_thread(allocator.holdings))
        assert len(held[f"job:{big.id}"]) == 4 and f"job:{small.id}" not in held
        # the second job would pass alice's quota of 4: it waits
        await engine.run_once()
        assert (await store.read(store.get, small.id)).state == "queued"
        # the Job's pods take over from the reservation
        name = job.launch_state["name"]

        def pods_hold():
            targets = allocator.gpu_targets([h.device for h in allocator.holdings()])
            return {t.pod for t in targets.values()} if len(targets) == 4 else None
        pods = await until(pods_hold, "the job's pods holding its GPUs")
        assert all(p.startswith(name) for p in pods) and len(pods) == 2
        async def finish_workers():
            # the workers exit (again, if the stand-in's kubelet raced a late Pending event and set one Running)
            for pod in pods:
                if (kube.get(PODS, NS, pod) or {}).get("status", {}).get("phase") == "Running":
                    await kube.finish_pod(NS, pod, 0)
            return await state(big.id), await state(small.id)

        with contextlib.suppress(AssertionError):  # the assertions below say what was seen instead
            await await_for(finish_workers, lambda states: states == ("succeeded", "running"),
                            what="big to succeed and small to run", timeout=20)
        assert (await store.read(store.get, big.id)).state == "succeeded", (
            [(n, p["status"].get("phase")) for (_, n), p in kube.store(PODS).items()], kube.store(JOBS))
        assert (await store.read(store.get, small.id)).state == "running"
        held = by_holder(await asyncio.to_thread(allocator.holdings))
        assert f"job:{big.id}" not in held and len(held[f"job:{small.id}"]) == 1
    finally:
        await launcher.close()


async def test_a_refused_reallocation_keeps_the_earlier_reservation(make_allocator):
    allocator = make_allocator()
    first = await asyncio.to_thread(allocator.allocate, "job:60", kind="job", user="bob", count=2)
    with pytest.raises(NoFreeGPUs, match="only 6"):
        await asyncio.to_thread(allocator.allocate, "job:60", kind="job", user="bob", count=7)
    assert sorted(h.device for h in await asyncio.to_thread(allocator.holdings)) == sorted(first)
    # a successful one replaces it
    assert len(await asyncio.to_thread(allocator.allocate, "job:60", kind="job", user="bob", count=1)) == 1
    assert len(await asyncio.to_thread(allocator.holdings)) == 1
