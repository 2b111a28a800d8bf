"""Notebook pods gated by Kueue (its pod integration) wait in Kueue's queue with Kueue's reason on the spawn's
progress, bounded by kueue_max_queue_wait rather than start_timeout. The stand-in plays Kueue: the pod is created
with the admission gate, the test writes the Workload owned by it and later admits it by removing the gate."""

from __future__ import annotations

import asyncio

import pytest
from k8s_test_config import NAMESPACE, kube_mode, spawner_config
from kube_standin import PODS, WORKLOADS

from trainhub.kube import kueue

pytestmark = pytest.mark.skipif(
    kube_mode() != "standin",
    reason="plays Kueue through the stand-in (scheduling gates need 1.27+, the Workload CRD Kueue)",
)

QUOTA = ("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor "
         "default-flavor, 1 more needed")


START = 8  # s: the pod must not be given up after it; room for a loaded machine to create and gate the pod


def _config(start_timeout: float, max_wait: int):
    return spawner_config(
        KubeSpawner__start_timeout=start_timeout,
        KubeSpawner__extra_labels={kueue.QUEUE_LABEL: "trainhub"},
        # what Kueue's pod webhook adds to every pod with the queue label
        KubeSpawner__extra_pod_config={"schedulingGates": [{"name": kueue.ADMISSION_GATE}]},
        GPUKubeSpawner__check_gpu_availability=False,
        GPUKubeSpawner__kueue_max_queue_wait=max_wait,
    )


async def _pod(kube, name: str, timeout: float = 20) -> dict:
    for _ in range(int(timeout / 0.05)):
        pod = kube.get(PODS, NAMESPACE, name)
        if pod is not None:
            return pod
        await asyncio.sleep(0.05)
    raise AssertionError(f"pod {name} never created")


async def _queue_workload(kube, pod: dict) -> dict:
    """The Workload Kueue's pod integration makes for ``pod``, not admitted for lack of GPU quota."""
    meta = pod["metadata"]
    return await kube.put_object(WORKLOADS, {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
        "metadata": {
            "name": f"pod-{meta['name']}-3f2a1", "namespace": NAMESPACE,
            "labels": {kueue.QUEUE_LABEL: "trainhub", kueue.JOB_UID_LABEL: meta["uid"]},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"queueName": "trainhub", "podSets": [{"name": "main", "count": 1, "template": {"spec": pod["spec"]}}]},
        "status": {"conditions": [{
            "type": "QuotaReserved", "status": "False", "reason": "Pending", "message": QUOTA,
            "lastTransitionTime": "2026-11-26T03:00:00Z", "observedGeneration": 1}]},
    })


async def _until(predicate, timeout: float = 15) -> None:
    for _ in range(int(timeout / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


async def _collect(spawner, into: list) -> None:
    async for event in spawner.progress():
        into.append(event.get("message"))


async def test_gated_pod_is_queued_with_kueues_reason_and_does_not_time_out(make_spawner, cluster):
    kube = cluster.kube
    spawner = make_spawner("kq-wait", options={"profile": "gpu-1"}, config=_config(start_timeout=START, max_wait=120))
    loop = asyncio.get_running_loop()
    began = loop.time()
    started = spawner.start()
    # JupyterHub reads start_timeout right after start() and cancels the spawn after it (User.spawn)
    hub_limit = spawner.start_timeout
    assert hub_limit == START + 120
    spawn = asyncio.ensure_future(asyncio.wait_for(started, hub_limit))
    messages: list = []
    progress = asyncio.ensure_future(_collect(spawner, messages))

    pod = await _pod(kube, spawner.pod_name)
    assert pod["spec"]["schedulingGates"] == [{"name": kueue.ADMISSION_GATE}]
    # before Kueue has written its Workload
    await _until(lambda: f"Queued by Kueue: {kueue.NO_REASON}" in messages or spawn.done())
    assert not spawn.done(), spawn.exception()
    workload = await _queue_workload(kube, pod)
    await _until(lambda: f"Queued by Kueue: {QUOTA}" in messages or spawn.done())
    assert not spawn.done(), spawn.exception()
    await asyncio.sleep(max(0.0, began + 2 * START + 1 - loop.time()))  # well past start_timeout
    assert not spawn.done(), spawn.exception() if spawn.done() else None
    live = kube.get(PODS, NAMESPACE, spawner.pod_name)
    assert live["status"]["phase"] == "Pending" and not live["spec"].get("nodeName")
    assert live["status"]["conditions"][0]["reason"] == "SchedulingGated"

    # Kueue admits: the Workload's conditions turn True and the gate goes; the scheduler and kubelet take over
    await kube.mutate(WORKLOADS, NAMESPACE, workload["metadata"]["name"], {"status": {"conditions": [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "Quota reserved in ClusterQueue gpu",
         "lastTransitionTime": "2026-11-26T03:01:00Z"},
        {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "The workload is admitted",
         "lastTransitionTime": "2026-11-26T03:01:00Z"}]}})
    await kube.mutate(PODS, NAMESPACE, spawner.pod_name, {"spec": {"schedulingGates": None}})
    url = await asyncio.wait_for(spawn, 20)
    assert url.startswith("http://")
    assert kube.get(PODS, NAMESPACE, spawner.pod_name)["status"]["phase"] == "Running"
    assert spawner.start_timeout == START  # the configured value again
    await asyncio.wait_for(progress, 10)  # progress ends with the spawn
    assert messages.count(f"Queued by Kueue: {QUOTA}") == 1  # shown when it changes, not every poll


async def test_kueue_max_queue_wait_fails_the_spawn_with_the_reason(make_spawner, cluster):
    kube = cluster.kube
    spawner = make_spawner("kq-expire", options={"profile": "gpu-1"}, config=_config(start_timeout=1, max_wait=3))
    started = spawner.start()
    spawn = asyncio.ensure_future(asyncio.wait_for(started, spawner.start_timeout))
    await _queue_workload(kube, await _pod(kube, spawner.pod_name))
    with pytest.raises(TimeoutError, match=r"still queued by Kueue after 3 s: couldn't assign flavors .* 1 more needed"):
        await asyncio.wait_for(spawn, 20)
    assert spawner.start_timeout == 1


async def test_without_kueue_start_timeout_still_applies(make_spawner, cluster):
    """A pod gated by something else, with no Kueue queue label: start_timeout as before, no Kueue line."""
    config = _config(start_timeout=1, max_wait=120)
    config.KubeSpawner.extra_labels = {}
    config.KubeSpawner.extra_pod_config = {"schedulingGates": [{"name": "example.com/other"}]}
    spawner = make_spawner("kq-none", options={"profile": "gpu-1"}, config=config)
    started = spawner.start()
    assert spawner.start_timeout == 1
    with pytest.raises(TimeoutError, match="did not start in 1 seconds"):
        await asyncio.wait_for(started, 20)


def test_reason_from_workload_conditions():
    pod = {"metadata": {"uid": "u1"}, "spec": {"schedulingGates": [{"name": kueue.ADMISSION_GATE}]}}
    assert kueue.gated(pod) and not kueue.gated({"spec": {"schedulingGates": [{"name": "other"}]}})
    owned = {"metadata": {"ownerReferences": [{"kind": "Pod", "uid": "u1"}]},
             "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "message": QUOTA}]}}
    labelled = {"metadata": {"labels": {kueue.JOB_UID_LABEL: "u1"}},
                "status": {"conditions": [{"type": "Admitted", "status": "False", "reason": "Evicted"}]}}
    other = {"metadata": {"ownerReferences": [{"kind": "Pod", "uid": "u2"}]}}
    assert kueue.workload_of(pod, [other, owned]) is owned
    assert kueue.workload_of(pod, [other, labelled]) is labelled
    assert kueue.workload_of(pod, [other]) is None
    assert kueue.reason(owned) == QUOTA and kueue.reason(labelled) == "Evicted"
    assert kueue.reason(None) == kueue.NO_REASON and kueue.reason({"status": {}}) == kueue.NO_REASON
    assert kueue.duration(6 * 3600) == "6 h" and kueue.duration(5400) == "90 min" and kueue.duration(3) == "3 s"
