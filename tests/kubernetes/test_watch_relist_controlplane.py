"""Watches across an apiserver restart: 410 Gone and the relist, on the real control plane and on
the stand-in alike.

When kube-apiserver restarts, every watch ends and its new watch cache starts at the current
revision: a client that watches again from the resourceVersion it last saw is answered with an
ERROR event carrying a 410 ``Expired`` Status, and must list again. The real side is a control
plane of this module's own (restarting the session's would disturb the other tests); the
stand-in's ``restart_apiserver()`` does what a restart does. The GPU ledger's caches
(``trainhub.spawner.k8s_caches``) must come back with the cluster's current pods either way.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time

import aiohttp
import pytest
import pytest_asyncio
from k8s_test_config import NODES, PROFILES
from kube_standin import PODS, standin_server
from traitlets.config import Config

pytestmark = pytest.mark.controlplane

NS = "relist-test"


@pytest.fixture(scope="module")
def own_plane(controlplane, tmp_path_factory):
    from controlplane import ControlPlane
    from real_kube import RealKube

    plane = ControlPlane(tmp_path_factory.mktemp("own-plane"), bin_dir=controlplane.bin_dir).start()
    try:
        kube = RealKube(plane)
        kube.add_node("gpu-a", **NODES["gpu-a"])
        kube.ensure_namespace(NS)
        yield kube
    finally:
        plane.stop()


@pytest_asyncio.fixture(params=["real", "standin"])
async def backend(request, tmp_path):
    """(kube, restart(), raw_watch(rv) -> first event, list_count(path))"""
    if request.param == "real":
        kube = request.getfixturevalue("own_plane")
        plane = kube.plane
        ctx = ssl.create_default_context(cafile=str(plane.ca_file))
        headers = {"Authorization": f"Bearer {plane.tokens['admin']}"}
        base = plane.url

        async def restart():
            await asyncio.to_thread(plane.restart_apiserver)
        yield kube, restart, (base, headers, ctx), tmp_path
        for (ns, name) in list(kube.store(PODS)):
            await kube.remove(PODS, ns, name)
        return
    async with standin_server(namespaces=(NS,)) as kube:
        kube.add_node("gpu-a", **NODES["gpu-a"])

        async def restart():
            kube.restart_apiserver()
        yield kube, restart, (str(kube.url).rstrip("/"), {}, False), tmp_path


def notebook_pod(user: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"jupyter-{user}", "namespace": NS,
                         "labels": {"component": "singleuser-server", "hub.jupyter.org/username": user},
                         "annotations": {"hub.jupyter.org/username": user}},
            "spec": {"containers": [{"name": "notebook", "image": "busybox",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}


async def until(fn, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(fn)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def first_event(base, headers, ctx, path, rv) -> dict:
    async with aiohttp.ClientSession() as s:
        async with s.get(base + path, params={"watch": "1", "resourceVersion": rv, "timeoutSeconds": "5"},
                         headers=headers, ssl=ctx) as resp:
            async for line in resp.content:
                if line.strip():
                    return json.loads(line)
    return {}


async def test_a_watch_from_before_a_restart_is_410_and_the_ledger_relists(backend):
    from trainhub.spawner.k8s_allocator import KubernetesGPUAllocator

    kube, restart, (base, headers, ctx), tmp_path = backend
    await kube.put_object(PODS, notebook_pod("alice"))
    c = Config()
    c.ProfileCatalog.profiles = PROFILES
    c.ProfileCatalog.default_profile = "cpu"
    allocator = KubernetesGPUAllocator(config=c, kubeconfig=kube.write_kubeconfig(tmp_path / "kubeconfig", NS))
    try:
        def holders():
            return {h.holder for h in allocator.holdings()}
        await until(lambda: holders() == {"server:alice/"}, "alice's pod in the ledger")

        def pod_lists():
            return sum(1 for r in kube.recorded_requests() if str(r.method).upper().endswith("GET")
                       and str(r.params.get("watch", "")).lower() not in ("true", "1")
                       and str(r.url.path).rstrip("/").endswith("/pods"))
        lists = pod_lists()
        async with aiohttp.ClientSession() as s:
            async with s.get(base + f"/api/v1/namespaces/{NS}/pods", headers=headers, ssl=ctx) as resp:
                old_rv = (await resp.json())["metadata"]["resourceVersion"]
        # history moves on, then the apiserver restarts
        async with aiohttp.ClientSession() as s:
            async with s.post(base + f"/api/v1/namespaces/{NS}/configmaps", json={"metadata": {"name": "tick"}},
                              headers=headers, ssl=ctx) as resp:
                assert resp.status == 201
        await restart()
        event = await first_event(base, headers, ctx, f"/api/v1/namespaces/{NS}/pods", old_rv)
        assert event["type"] == "ERROR" and (event["object"]["code"], event["object"]["reason"]) == (410, "Expired"), event
        assert event["object"]["message"].startswith(f"too old resource version: {old_rv} (")
        # the cluster changes; the ledger must come back with what is there now
        await kube.remove(PODS, NS, "jupyter-alice")
        await kube.put_object(PODS, notebook_pod("bob"))
        await until(lambda: holders() == {"server:bob/"}, "the ledger after the restart")
        assert pod_lists() > lists, "the ledger's pod cache did not list again after the restart"
    finally:
        await asyncio.to_thread(allocator.close)
