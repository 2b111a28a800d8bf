"""The API stand-in itself, through kubernetes-asyncio: what the job launcher will rely on."""

from __future__ import annotations

import asyncio

import pytest
from k8s_test_config import NAMESPACE, REAL_KUBECONFIG

pytestmark = pytest.mark.skipif(bool(REAL_KUBECONFIG), reason="checks the stand-in, not a cluster")


async def test_jobs_create_list_watch_delete(cluster):
    from kubernetes_asyncio import client, watch
    from kubespawner.clients import shared_client

    batch = shared_client("BatchV1Api")
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train-1", "labels": {"app.kubernetes.io/component": "trainhub-job", "run": "1"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}},
    }
    created = await batch.create_namespaced_job(NAMESPACE, job)
    assert created.metadata.namespace == NAMESPACE and created.metadata.uid and created.metadata.resource_version
    listed = await batch.list_namespaced_job(NAMESPACE, label_selector="app.kubernetes.io/component=trainhub-job,run in (1,2)")
    assert [j.metadata.name for j in listed.items] == ["train-1"]
    assert (await batch.list_namespaced_job("elsewhere")).items == []

    events = []

    async def follow():
        w = watch.Watch()
        async with w.stream(batch.list_namespaced_job, namespace=NAMESPACE, resource_version=listed.metadata.resource_version,
                            timeout_seconds=2) as stream:
            async for event in stream:
                events.append((event["type"], event["object"].metadata.name))
                if event["type"] == "DELETED":
                    return

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.1)
    await batch.patch_namespaced_job_status("train-1", NAMESPACE, {"status": {"active": 1}})
    # background propagation: a plain delete of a batch/v1 Job orphans its pods (``orphan`` finalizer, more events)
    await batch.delete_namespaced_job("train-1", NAMESPACE, propagation_policy="Background")
    await asyncio.wait_for(task, 5)
    assert events == [("MODIFIED", "train-1"), ("DELETED", "train-1")]  # nothing replayed from before


async def test_unschedulable_pod_stays_pending_and_owned_objects_go(cluster):
    from kube_standin import PODS
    from kubespawner.clients import shared_client

    core = shared_client("CoreV1Api")
    pod = {"metadata": {"name": "too-big"}, "spec": {"containers": [
        {"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "64"}}}]}}
    created = await core.create_namespaced_pod(NAMESPACE, pod)
    svc = {"metadata": {"name": "too-big", "ownerReferences": [
        {"apiVersion": "v1", "kind": "Pod", "name": "too-big", "uid": created.metadata.uid}]},
        "spec": {"ports": [{"port": 80}]}}
    await core.create_namespaced_service(NAMESPACE, svc)
    for _ in range(100):
        status = cluster.kube.get(PODS, NAMESPACE, "too-big")["status"]
        if status.get("conditions"):
            break
        await asyncio.sleep(0.02)
    assert status["phase"] == "Pending"
    assert status["conditions"][0]["reason"] == "Unschedulable"
    await core.delete_namespaced_pod("too-big", NAMESPACE)
    names = [s.metadata.name for s in (await core.list_namespaced_service(NAMESPACE)).items]
    assert "too-big" not in names  # garbage-collected with its owner


async def test_replace_conflicts_on_stale_resource_version(cluster):
    from kubernetes_asyncio.client.rest import ApiException
    from kubespawner.clients import shared_client

    core = shared_client("CoreV1Api")
    cm = await core.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    fresh = await core.replace_namespaced_config_map("cm", NAMESPACE, {"metadata": {"name": "cm"}, "data": {"a": "2"}})
    assert fresh.data == {"a": "2"} and fresh.metadata.uid == cm.metadata.uid
    stale = {"metadata": {"name": "cm", "resourceVersion": cm.metadata.resource_version}, "data": {"a": "3"}}
    with pytest.raises(ApiException) as err:
        await core.replace_namespaced_config_map("cm", NAMESPACE, stale)
    assert err.value.status == 409
    await core.delete_namespaced_config_map("cm", NAMESPACE)
