"""The stand-in kept honest: the same requests to the real v1.20.2 apiserver and to ``KubeStandin``.

Each test sends one request (or one short scenario) to both over HTTP and compares what a
client can see: status codes, Status ``reason`` and the fields named in its ``causes``,
defaulted fields, what list and watch return, events and final states. Values that differ by
nature (uids, resourceVersions, timestamps, generated names, managedFields, cluster IPs) are
left out of the comparison; fields 1.20 does not know (``completionMode``, ``ipFamilies``,
``podReplacementPolicy``, ``batch.kubernetes.io/*`` labels ...) are compared on their 1.20
subset. The one deliberate difference is asserted as such: ``fieldValidation=Strict``, which
1.20 ignores and the stand-in honours as 1.27+ does.

The real side is the session's control plane (``controlplane`` fixture: nodes gpu-a, gpu-b,
mig-a, cpu-a, gpu-cordoned and the kubelet stand-in); the stand-in gets the same nodes.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import uuid

import aiohttp
import pytest
import pytest_asyncio
from k8s_test_config import NODES, SESSION_NODES
from kube_standin import standin_server

pytestmark = pytest.mark.controlplane


class Api:
    """Raw JSON over HTTP to one API server."""

    def __init__(self, name: str, base: str, headers: dict, ssl_ctx):
        self.name, self.base, self.headers, self.ssl = name, base.rstrip("/"), headers, ssl_ctx
        self.session = aiohttp.ClientSession()

    async def req(self, method: str, path: str, body=None, *, ctype: str = "application/json", params=None):
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.base + path, data=data, params=params, ssl=self.ssl,
                                        headers={**self.headers, "Content-Type": ctype}) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text) if text else None
            except ValueError:
                return resp.status, text

    async def watch(self, path: str, params: dict, *, stop, timeout: float = 30) -> list[dict]:
        """Watch events until ``stop(events)`` is true (or the server ends the stream)."""
        events: list[dict] = []
        q = {**params, "watch": "1", "timeoutSeconds": str(int(timeout))}
        async with self.session.get(self.base + path, params=q, ssl=self.ssl, headers=self.headers,
                                    timeout=aiohttp.ClientTimeout(total=timeout + 5)) as resp:
            async for line in resp.content:
                if line.strip():
                    events.append(json.loads(line))
                    if stop(events):
                        break
        return events

    async def until(self, path: str, predicate, what: str, timeout: float = 30):
        deadline = time.monotonic() + timeout
        while True:
            status, obj = await self.req("GET", path)
            if predicate(status, obj):
                return status, obj
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: timed out waiting for {what}: {status} {json.dumps(obj)[:600]}")
            await asyncio.sleep(0.1)

    async def close(self):
        await self.session.close()


class Both:
    def __init__(self, real: Api, standin: Api, real_kube, kube):
        self.real, self.standin, self.real_kube, self.kube = real, standin, real_kube, kube
        self.apis = (real, standin)

    async def same(self, method: str, path: str, body=None, **kw):
        return await asyncio.gather(*(api.req(method, path, body, **kw) for api in self.apis))

    async def namespace(self) -> str:
        ns = f"diff-{uuid.uuid4().hex[:8]}"
        for status, _ in await self.same("POST", "/api/v1/namespaces", {"metadata": {"name": ns}}):
            assert status == 201
        # pods need the namespace's ServiceAccount token on the real server
        self.real_kube.ensure_namespace(ns)
        return ns

    async def finish(self, api: Api, ns: str, pod: str, code: int):
        """The pod's containers exit with ``code`` (the kubelet stand-ins, each its own way)."""
        if api is self.real:
            await self.real_kube.finish_pod(ns, pod, code)
        else:
            await self.kube.finish_pod(ns, pod, code)


@pytest_asyncio.fixture(scope="module")
async def both(real_kube):
    plane = real_kube.plane
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    real = Api("real 1.20", plane.url, {"Authorization": f"Bearer {plane.tokens['admin']}"}, ctx)
    async with standin_server(jobs=True, job_backoff=0.2) as kube:
        for name in SESSION_NODES:
            kube.add_node(name, **NODES[name])
        standin = Api("stand-in", str(kube.url), {"Authorization": "Bearer standin-token"}, False)
        try:
            yield Both(real, standin, real_kube, kube)
        finally:
            await real.close()
            await standin.close()


def pick(obj, *paths):
    """{path: value} for dotted paths (list indexes as numbers); None where absent."""
    out = {}
    for path in paths:
        cur = obj
        for part in path.split("."):
            if isinstance(cur, list) and part.isdigit():
                cur = cur[int(part)] if int(part) < len(cur) else None
            elif isinstance(cur, dict):
                cur = cur.get(part)
            else:
                cur = None
        out[path] = cur
    return out


def error_shape(status: int, body) -> tuple:
    """What a client can act on: code, reason, the fields named by the causes."""
    if not isinstance(body, dict) or body.get("kind") != "Status":
        return (status, None, None)
    causes = sorted({c.get("field") for c in (body.get("details") or {}).get("causes") or []} - {None})
    return (status, body.get("reason"), causes or None)


def pod(name, **spec):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}], **spec}}


def job(name, **spec):
    template = spec.pop("template", None) or {"spec": {"restartPolicy": "Never", "containers": [
        {"name": "c", "image": "busybox:1.36"}], "nodeSelector": {"kubernetes.io/hostname": "cpu-a"}}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {"template": template, **spec}}


NOWHERE = {"nodeSelector": {"trainhub.io/nowhere": "true"}}  # a pod that stays Pending on both


# ---------------------------------------------------------------------------------------------
# validation


INVALID = {
    "pod without containers": ("pods", pod("a", containers=[])),
    "pod with an upper-case name": ("pods", pod("A_b")),
    "pod without a name": ("pods", {"metadata": {}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
    "container without an image": ("pods", pod("a", containers=[{"name": "c"}])),
    "duplicate container names": ("pods", pod("a", containers=[{"name": "c", "image": "x"}, {"name": "c", "image": "y"}])),
    "bad restartPolicy": ("pods", pod("a", restartPolicy="Sometimes")),
    "requests above limits": ("pods", pod("a", containers=[{"name": "c", "image": "x", "resources": {
        "limits": {"cpu": "1"}, "requests": {"cpu": "2"}}}])),
    "GPU requests unlike limits": ("pods", pod("a", containers=[{"name": "c", "image": "x", "resources": {
        "limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}}}])),
    "mount of a missing volume": ("pods", pod("a", containers=[{"name": "c", "image": "x", "volumeMounts": [
        {"name": "nope", "mountPath": "/x"}]}])),
    "init container with a startupProbe": ("pods", pod("a", initContainers=[{"name": "i", "image": "x", "startupProbe": {
        "exec": {"command": ["true"]}}}])),
    "Job with restartPolicy Always": ("jobs", job("j", template={"spec": {"restartPolicy": "Always",
                                                                          "containers": [{"name": "c", "image": "x"}]}})),
    "Job with negative counts": ("jobs", job("j", parallelism=-2, backoffLimit=-1, completions=-3)),
    "Job selector not matching its template": ("jobs", job("j", manualSelector=True, selector={"matchLabels": {"a": "b"}},
                                                           template={"metadata": {"labels": {"a": "c"}}, "spec": {
                                                               "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}})),
    "Service with a DNS-1123 but not DNS-1035 name": ("services", {"metadata": {"name": "1svc"}, "spec": {"ports": [{"port": 80}]}}),
}


@pytest.mark.parametrize("case", list(INVALID))
async def test_validation_errors_agree(both, case):
    ns = await both.namespace()
    plural, body = INVALID[case]
    group = "/apis/batch/v1" if plural == "jobs" else "/api/v1"
    real, standin = await both.same("POST", f"{group}/namespaces/{ns}/{plural}", body)
    assert error_shape(*real)[0] == 422, real
    assert error_shape(*standin) == error_shape(*real), (standin, real)


async def test_namespace_rules_agree(both):
    ns = await both.namespace()
    mismatch = {**pod("a"), "metadata": {"name": "a", "namespace": "other"}}
    real, standin = await both.same("POST", f"/api/v1/namespaces/{ns}/pods", mismatch)
    assert error_shape(*real) == error_shape(*standin) == (400, "BadRequest", None)
    real, standin = await both.same("POST", "/api/v1/namespaces/no-such-namespace/configmaps", {"metadata": {"name": "a"}})
    assert error_shape(*real) == error_shape(*standin) == (404, "NotFound", None)
    assert real[1]["message"] == standin[1]["message"] == 'namespaces "no-such-namespace" not found'
    await both.same("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "a"}})
    real, standin = await both.same("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "a"}})
    assert error_shape(*real) == error_shape(*standin) == (409, "AlreadyExists", None)
    real, standin = await both.same("GET", f"/api/v1/namespaces/{ns}/configmaps/none")
    assert error_shape(*real) == error_shape(*standin) == (404, "NotFound", None)


async def test_updates_that_cannot_change_agree(both):
    ns = await both.namespace()
    for api in both.apis:
        assert (await api.req("POST", f"/api/v1/namespaces/{ns}/pods", pod("p", **NOWHERE)))[0] == 201
        assert (await api.req("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job("j", suspend=True)))[0] == 201
    merge = "application/merge-patch+json"
    cases = [
        ("PATCH", f"/api/v1/namespaces/{ns}/pods/p", {"spec": {"restartPolicy": "Never"}}, merge),
        ("PATCH", f"/api/v1/namespaces/{ns}/pods/p", {"spec": {"containers": [{"name": "c", "image": "busybox:1.37"}]}},
         "application/strategic-merge-patch+json"),  # allowed: the image
        ("PATCH", f"/apis/batch/v1/namespaces/{ns}/jobs/j", {"spec": {"completions": 3}}, merge),
        ("PATCH", f"/apis/batch/v1/namespaces/{ns}/jobs/j", {"spec": {"parallelism": 0}}, merge),  # allowed
        ("PUT", f"/api/v1/namespaces/{ns}/pods/p", {**pod("p", **NOWHERE), "metadata": {"name": "p", "resourceVersion": "1"}},
         "application/json"),  # stale resourceVersion
    ]
    for method, path, body, ctype in cases:
        real, standin = await both.same(method, path, body, ctype=ctype)
        assert error_shape(*real)[:2] == error_shape(*standin)[:2], (method, path, body, real, standin)
        if real[0] == 422:
            assert error_shape(*real) == error_shape(*standin)


# ---------------------------------------------------------------------------------------------
# defaulting and admission


async def test_pod_defaults_agree(both):
    ns = await both.namespace()
    body = pod("p", **NOWHERE)
    body["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}}
    body["spec"]["containers"].append({"name": "side", "image": "busybox", "ports": [{"containerPort": 80}],
                                       "env": [{"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]})
    real, standin = await both.same("POST", f"/api/v1/namespaces/{ns}/pods", body)
    assert real[0] == standin[0] == 201
    paths = ["spec.restartPolicy", "spec.terminationGracePeriodSeconds", "spec.dnsPolicy", "spec.schedulerName",
             "spec.securityContext", "spec.enableServiceLinks", "spec.serviceAccountName", "spec.serviceAccount",
             "spec.priority", "spec.preemptionPolicy", "spec.tolerations", "status.phase", "status.qosClass"]
    for i in (0, 1):
        paths += [f"spec.containers.{i}.{k}" for k in ("terminationMessagePath", "terminationMessagePolicy",
                                                       "imagePullPolicy", "resources", "ports", "env")]
    assert pick(standin[1], *paths) == pick(real[1], *paths)


async def test_other_defaults_agree(both):
    ns = await both.namespace()
    cases = [
        (f"/apis/batch/v1/namespaces/{ns}/jobs", job("j", suspend=True),
         ["spec.parallelism", "spec.completions", "spec.backoffLimit", "spec.template.spec", "status"]),
        (f"/api/v1/namespaces/{ns}/services", {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}], "selector": {"a": "b"}}},
         ["spec.type", "spec.sessionAffinity", "spec.ports", "status"]),
        (f"/api/v1/namespaces/{ns}/services", {"metadata": {"name": "h"}, "spec": {"clusterIP": "None", "ports": [{"port": 80}]}},
         ["spec.clusterIP", "spec.clusterIPs", "spec.type", "spec.ports"]),
        (f"/api/v1/namespaces/{ns}/persistentvolumeclaims", {"metadata": {"name": "c"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": ""}},
         ["spec.volumeMode", "metadata.finalizers", "status"]),
        ("/api/v1/persistentvolumes", {"metadata": {"name": f"pv-{ns}"}, "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/x"}}},
         ["spec.persistentVolumeReclaimPolicy", "spec.volumeMode", "spec.hostPath", "metadata.finalizers"]),
        (f"/api/v1/namespaces/{ns}/secrets", {"metadata": {"name": "s"}, "stringData": {"k": "v"}, "data": {"d": "eA=="}},
         ["data", "stringData", "type"]),
        ("/api/v1/nodes", {"metadata": {"name": f"n-{ns}"}}, ["spec.taints"]),
        ("/api/v1/namespaces", {"metadata": {"name": f"{ns}-x"}}, ["spec", "status"]),
    ]
    for path, body, paths in cases:
        real, standin = await both.same("POST", path, body)
        assert real[0] == standin[0] == 201, (path, real, standin)
        assert pick(standin[1], *paths) == pick(real[1], *paths), path
    for api in both.apis:  # a PV without a claim becomes Available
        await api.until(f"/api/v1/persistentvolumes/pv-{ns}", lambda s, o: (o.get("status") or {}).get("phase") == "Available",
                        "the PV to be Available")
        await api.req("DELETE", f"/api/v1/nodes/n-{ns}")


async def test_job_labels_and_selector_agree_on_the_120_subset(both):
    ns = await both.namespace()
    real, standin = await both.same("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job("j", suspend=True))
    for _, obj in (real, standin):
        uid = obj["metadata"]["uid"]
        legacy = {"controller-uid": uid, "job-name": "j"}
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert {k: labels[k] for k in legacy} == legacy
        assert {k: obj["metadata"]["labels"][k] for k in legacy} == legacy
        selector = obj["spec"]["selector"]["matchLabels"]
        assert all(labels.get(k) == v for k, v in selector.items()) and uid in selector.values()


async def test_unknown_fields_are_dropped_and_strict_is_the_one_known_difference(both):
    ns = await both.namespace()
    body = {"metadata": {"name": "cm"}, "data": {"a": "1"}, "bogus": {"x": 1}}
    real, standin = await both.same("POST", f"/api/v1/namespaces/{ns}/configmaps", body)
    assert real[0] == standin[0] == 201 and "bogus" not in real[1] and "bogus" not in standin[1]
    body = pod("p", **NOWHERE)
    body["spec"]["containers"][0]["bogus"] = 2
    body["spec"]["completionMode"] = "Indexed"
    real, standin = await both.same("POST", f"/api/v1/namespaces/{ns}/pods", body)
    assert real[0] == standin[0] == 201
    for _, obj in (real, standin):
        assert "bogus" not in obj["spec"]["containers"][0] and "completionMode" not in obj["spec"]
    # fieldValidation=Strict: 1.20 ignores the parameter (drops silently); the stand-in refuses as 1.27+ does
    body = {"metadata": {"name": "cm2"}, "bogus": 1}
    real = await both.real.req("POST", f"/api/v1/namespaces/{ns}/configmaps", body, params={"fieldValidation": "Strict"})
    standin = await both.standin.req("POST", f"/api/v1/namespaces/{ns}/configmaps", body, params={"fieldValidation": "Strict"})
    assert real[0] == 201 and "bogus" not in real[1]
    assert error_shape(*standin) == (400, "BadRequest", None) and 'unknown field "bogus"' in standin[1]["message"]


# ---------------------------------------------------------------------------------------------
# selectors


async def test_label_and_field_selectors_agree(both):
    ns = await both.namespace()
    for api in both.apis:
        for name, labels in (("a", {"app": "x", "tier": "1"}), ("b", {"app": "y"}), ("c", {"tier": "2"})):
            await api.req("POST", f"/api/v1/namespaces/{ns}/pods",
                          {**pod(name, **NOWHERE), "metadata": {"name": name, "labels": labels}})
    selectors = [("labelSelector", s) for s in ("app=x", "app!=x", "app", "!app", "tier in (1,2),app", "tier notin (1)",
                                                  "app==y,tier")]
    selectors += [("fieldSelector", s) for s in ("metadata.name=b", "metadata.name!=b", "status.phase=Pending",
                                                  "spec.nodeName=", "spec.restartPolicy=Always,metadata.name=c")]
    for key, value in selectors:
        real, standin = await both.same("GET", f"/api/v1/namespaces/{ns}/pods", params={key: value})
        names = [sorted(i["metadata"]["name"] for i in r[1]["items"]) for r in (real, standin)]
        assert real[0] == standin[0] == 200 and names[0] == names[1], (key, value, names)
    for key, value in (("fieldSelector", "spec.containers=x"), ("fieldSelector", "status.podIPx=1"),
                       ("labelSelector", "app in x"), ("labelSelector", "a b c")):
        real, standin = await both.same("GET", f"/api/v1/namespaces/{ns}/pods", params={key: value})
        assert error_shape(*real) == error_shape(*standin) == (400, "BadRequest", None), (key, value)
        if key == "fieldSelector":
            assert real[1]["message"] == standin[1]["message"]


# ---------------------------------------------------------------------------------------------
# patches


async def test_patches_agree(both):
    ns = await both.namespace()
    svc = {"metadata": {"name": "s", "labels": {"a": "1"}, "finalizers": ["x.io/one"]},
           "spec": {"ports": [{"name": "http", "port": 80}], "selector": {"app": "a"}}}
    smp, merge, jp = ("application/strategic-merge-patch+json", "application/merge-patch+json",
                      "application/json-patch+json")
    for api in both.apis:
        assert (await api.req("POST", f"/api/v1/namespaces/{ns}/services", svc))[0] == 201
        assert (await api.req("POST", f"/api/v1/namespaces/{ns}/pods", pod("p", **NOWHERE)))[0] == 201
    path = f"/api/v1/namespaces/{ns}/services/s"
    steps = [
        (path, {"spec": {"ports": [{"name": "metrics", "port": 9090}]}}, smp),         # merged by port
        (path, {"metadata": {"finalizers": ["x.io/two"], "labels": {"a": None, "b": "2"}}}, smp),  # union; null deletes
        (path, {"spec": {"ports": [{"port": 80, "$patch": "delete"}]}}, smp),
        (path, {"spec": {"selector": {"app": None, "role": "web"}}}, merge),
        (path, {"metadata": {"finalizers": ["x.io/three"]}}, merge),                      # a merge patch replaces lists
        (path, [{"op": "add", "path": "/metadata/labels/c", "value": "3"},
                {"op": "replace", "path": "/spec/sessionAffinity", "value": "ClientIP"}], jp),
        (path, [{"op": "test", "path": "/metadata/labels/c", "value": "nope"}], jp),     # 422
        (path, [{"op": "remove", "path": "/metadata/labels/zzz"}], jp),                  # 422
        (f"/api/v1/namespaces/{ns}/pods/p", {"spec": {"tolerations": [{"key": "k", "operator": "Exists"}]}}, smp),
        (f"/api/v1/namespaces/{ns}/pods/p", {"metadata": {"annotations": {"k": "v"}},
                                             "spec": {"containers": [{"name": "c", "image": "busybox:1.37"}]}}, smp),
        (f"/api/v1/namespaces/{ns}/pods/none", {"metadata": {"labels": {"a": "b"}}}, merge),  # 404
    ]
    for p, body, ctype in steps:
        real, standin = await both.same("PATCH", p, body, ctype=ctype)
        assert error_shape(*real)[:2] == error_shape(*standin)[:2], (body, real, standin)
        if real[0] == 200:
            fields = ["metadata.labels", "metadata.finalizers", "metadata.annotations", "spec.ports", "spec.selector",
                      "spec.sessionAffinity", "spec.tolerations", "spec.containers.0.image"]
            assert pick(standin[1], *fields) == pick(real[1], *fields), body
    for api in both.apis:  # let the service go
        await api.req("PATCH", path, {"metadata": {"finalizers": None}}, ctype=merge)


# ---------------------------------------------------------------------------------------------
# deletion


def _state(event: dict) -> tuple:
    obj = event["object"]
    exits = [((cs.get("state") or {}).get("terminated") or {}).get("exitCode")
             for cs in (obj.get("status") or {}).get("containerStatuses") or []]
    return (event["type"], (obj.get("status") or {}).get("phase"), bool(obj["metadata"].get("deletionTimestamp")),
            tuple(e for e in exits if e is not None))


async def test_graceful_pod_deletion_agrees(both):
    ns = await both.namespace()
    body = pod("p", nodeSelector={"kubernetes.io/hostname": "cpu-a"})
    for api in both.apis:
        await api.req("POST", f"/api/v1/namespaces/{ns}/pods", body)
        await api.req("POST", f"/api/v1/namespaces/{ns}/pods", pod("pending", **NOWHERE))
    path = f"/api/v1/namespaces/{ns}/pods/p"
    rvs = []
    for api in both.apis:
        _, obj = await api.until(path, lambda s, o: (o.get("status") or {}).get("phase") == "Running", "Running")
        rvs.append(obj["metadata"]["resourceVersion"])

    async def delete_and_watch(api, rv):
        watcher = asyncio.create_task(api.watch(f"/api/v1/namespaces/{ns}/pods", {
            "resourceVersion": rv, "fieldSelector": "metadata.name=p"}, stop=lambda ev: ev[-1]["type"] == "DELETED"))
        await asyncio.sleep(0.3)
        status, obj = await api.req("DELETE", path)
        events = await asyncio.wait_for(watcher, 40)
        return status, obj, events
    (rs, robj, rev), (ss, sobj, sev) = await asyncio.gather(*(delete_and_watch(a, rv) for a, rv in zip(both.apis, rvs)))
    assert rs == ss == 200
    assert pick(robj, "metadata.deletionGracePeriodSeconds") == pick(sobj, "metadata.deletionGracePeriodSeconds") == {
        "metadata.deletionGracePeriodSeconds": 30}
    dedup = [[s for i, s in enumerate(seq) if i == 0 or s != seq[i - 1]] for seq in ([_state(e) for e in rev], [_state(e) for e in sev])]
    assert dedup[0] == dedup[1], dedup
    assert dedup[0][-1] == ("DELETED", "Failed", True, (143,))
    # an unbound pod and gracePeriodSeconds=0 go at once
    real, standin = await both.same("DELETE", f"/api/v1/namespaces/{ns}/pods/pending")
    for status, obj in (real, standin):
        assert status == 200 and obj["metadata"]["deletionGracePeriodSeconds"] == 0
    real, standin = await both.same("GET", f"/api/v1/namespaces/{ns}/pods/pending")
    assert real[0] == standin[0] == 404
    real, standin = await both.same("DELETE", f"/api/v1/namespaces/{ns}/configmaps/none")
    assert error_shape(*real) == error_shape(*standin) == (404, "NotFound", None)
    real, standin = await both.same("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "c"}})
    real, standin = await both.same("DELETE", f"/api/v1/namespaces/{ns}/configmaps/c",
                                    {"preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}})
    assert error_shape(*real) == error_shape(*standin) == (409, "Conflict", None)
    real, standin = await both.same("DELETE", f"/api/v1/namespaces/{ns}/configmaps/c", {"propagationPolicy": "Sideways"})
    assert error_shape(*real) == error_shape(*standin) and real[0] == 422, (real, standin)
    real, standin = await both.same("DELETE", f"/api/v1/namespaces/{ns}/configmaps/c")
    assert real[0] == standin[0] == 200 and real[1]["kind"] == standin[1]["kind"] == "Status"


@pytest.mark.parametrize("policy", ["Background", "Foreground", "Orphan", None])
async def test_propagation_policies_agree(both, policy):
    ns = await both.namespace()
    finals = []
    for api in both.apis:
        _, owner = await api.req("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "owner"}})
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"],
               "blockOwnerDeletion": True}
        for name in ("dep-1", "dep-2"):
            status, _ = await api.req("POST", f"/api/v1/namespaces/{ns}/configmaps",
                                      {"metadata": {"name": name, "labels": {"dep": "1"}, "ownerReferences": [ref]}})
            assert status == 201
        body = {"propagationPolicy": policy} if policy else None
        status, resp = await api.req("DELETE", f"/api/v1/namespaces/{ns}/configmaps/owner", body)
        immediate = (status, resp.get("kind"), sorted((resp.get("metadata") or {}).get("finalizers") or []))
        await api.until(f"/api/v1/namespaces/{ns}/configmaps/owner", lambda s, o: s == 404, "the owner to go")

        def settled(s, o):
            names = sorted(i["metadata"]["name"] for i in o["items"])
            return names == [] if policy in ("Background", "Foreground", None) else names == ["dep-1", "dep-2"] and \
                not any(i["metadata"].get("ownerReferences") for i in o["items"])
        _, left = await api.until(f"/api/v1/namespaces/{ns}/configmaps?labelSelector=dep%3D1", settled, "the dependents")
        finals.append((immediate, sorted(i["metadata"]["name"] for i in left["items"])))
    assert finals[0] == finals[1]


async def test_a_job_orphans_its_pods_by_default_and_a_dangling_dependent_goes(both):
    ns = await both.namespace()
    finals = []
    for api in both.apis:
        _, j = await api.req("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job("j"))
        await api.until(f"/api/v1/namespaces/{ns}/pods?labelSelector=job-name%3Dj", lambda s, o: len(o["items"]) == 1,
                        "the Job's pod")
        status, resp = await api.req("DELETE", f"/apis/batch/v1/namespaces/{ns}/jobs/j")
        await api.until(f"/apis/batch/v1/namespaces/{ns}/jobs/j", lambda s, o: s == 404, "the Job to go")
        _, pods = await api.until(f"/api/v1/namespaces/{ns}/pods?labelSelector=job-name%3Dj",
                                  lambda s, o: o["items"] and not o["items"][0]["metadata"].get("ownerReferences"),
                                  "the pod orphaned")
        ghost = {"apiVersion": "v1", "kind": "ConfigMap", "name": "ghost", "uid": str(uuid.uuid4())}
        await api.req("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "dangling", "ownerReferences": [ghost]}})
        await api.until(f"/api/v1/namespaces/{ns}/configmaps/dangling", lambda s, o: s == 404, "the dangling dependent to go")
        finals.append((status, resp["metadata"].get("finalizers"), len(pods["items"])))
    assert finals[0] == finals[1] == (200, ["orphan"], 1)


# ---------------------------------------------------------------------------------------------
# nodes and scheduling


async def test_node_taints_and_scheduling_agree(both):
    ns = await both.namespace()
    name = f"n-{ns}"
    results = []
    for api in both.apis:
        _, node = await api.req("POST", "/api/v1/nodes", {"metadata": {"name": name, "labels": {"only": ns}}})
        created = node["spec"]["taints"]
        await api.req("PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": True}},
                      ctype="application/merge-patch+json")
        _, node = await api.until(f"/api/v1/nodes/{name}", lambda s, o: any(
            t["key"] == "node.kubernetes.io/unschedulable" for t in o["spec"].get("taints") or []), "the cordon taint")
        keys = sorted((t["key"], t["effect"]) for t in node["spec"]["taints"])
        await api.req("POST", f"/api/v1/namespaces/{ns}/pods", pod("p", nodeSelector={"only": ns}))
        _, p = await api.until(f"/api/v1/namespaces/{ns}/pods/p", lambda s, o: (o.get("status") or {}).get("conditions"),
                               "the scheduler's verdict")
        cond = p["status"]["conditions"][0]
        results.append((created, keys, p["status"]["phase"], p["spec"].get("nodeName"),
                        (cond["type"], cond["status"], cond.get("reason"))))
        await api.req("DELETE", f"/api/v1/nodes/{name}")
    assert results[0] == results[1]
    assert results[0][0] == [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
    assert results[0][4] == ("PodScheduled", "False", "Unschedulable")


async def test_extended_resources_schedule_and_overflow_agree(both):
    ns = await both.namespace()
    gpu = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
           "nodeSelector": {"kubernetes.io/hostname": "gpu-b"}}
    outcome = []
    for api in both.apis:
        for name, n in (("two", 2), ("one-more", 1)):
            body = pod(name, **gpu)
            body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(n)}}
            await api.req("POST", f"/api/v1/namespaces/{ns}/pods", body)
        _, two = await api.until(f"/api/v1/namespaces/{ns}/pods/two", lambda s, o: o["status"].get("phase") == "Running", "two Running")
        _, more = await api.until(f"/api/v1/namespaces/{ns}/pods/one-more", lambda s, o: o["status"].get("conditions"), "verdict")
        # a pod bound by hand to a full node: the kubelet refuses it (OutOf<resource>)
        body = pod("forced", nodeName="gpu-b")
        body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
        await api.req("POST", f"/api/v1/namespaces/{ns}/pods", body)
        _, forced = await api.until(f"/api/v1/namespaces/{ns}/pods/forced", lambda s, o: o["status"].get("phase") == "Failed",
                                    "the kubelet's refusal")
        outcome.append((two["spec"]["nodeName"], more["status"]["phase"], more["status"]["conditions"][0].get("reason"),
                        forced["status"].get("reason")))
        for name in ("two", "one-more", "forced"):
            await api.req("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", {"gracePeriodSeconds": 0})
    assert outcome[0] == outcome[1] == ("gpu-b", "Pending", "Unschedulable", "OutOfnvidia.com/gpu")


# ---------------------------------------------------------------------------------------------
# Jobs (NonIndexed: what 1.20 runs)


@pytest.mark.parametrize("exit_code", [0, 3])
async def test_a_job_runs_to_its_end_alike(both, exit_code):
    ns = await both.namespace()
    ends = []
    for api in both.apis:
        await api.req("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job("j", backoffLimit=0))
        _, pods = await api.until(f"/api/v1/namespaces/{ns}/pods?labelSelector=job-name%3Dj",
                                  lambda s, o: o["items"] and o["items"][0]["status"].get("phase") == "Running", "the pod Running")
        p = pods["items"][0]
        ref = p["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["controller"], ref["blockOwnerDeletion"]) == ("Job", True, True)
        assert p["metadata"]["name"].startswith("j-")
        await both.finish(api, ns, p["metadata"]["name"], exit_code)
        _, j = await api.until(f"/apis/batch/v1/namespaces/{ns}/jobs/j", lambda s, o: any(
            c["type"] in ("Complete", "Failed") for c in (o.get("status") or {}).get("conditions") or []), "the Job's end")
        conds = {c["type"]: c.get("reason") for c in j["status"]["conditions"]}
        final = "Complete" if "Complete" in conds else "Failed"
        # a Failed condition's reason is compared; Complete has one only since 1.31 (CompletionsReached)
        ends.append((final, conds[final] if final == "Failed" else None, j["status"].get("succeeded"), j["status"].get("failed"),
                     j["status"].get("active"), bool(j["status"].get("completionTime"))))
    assert ends[0] == ends[1], ends
    assert ends[0][0] == ("Complete" if exit_code == 0 else "Failed")


# ---------------------------------------------------------------------------------------------
# watch


async def test_watch_from_a_resource_version_agrees(both):
    ns = await both.namespace()
    seen = []
    for api in both.apis:
        await api.req("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "before", "labels": {"x": "1"}}})
        _, listed = await api.req("GET", f"/api/v1/namespaces/{ns}/configmaps")
        rv = listed["metadata"]["resourceVersion"]
        watcher = asyncio.create_task(api.watch(f"/api/v1/namespaces/{ns}/configmaps", {"resourceVersion": rv, "labelSelector": "x"},
                                                stop=lambda ev: ev[-1]["type"] == "DELETED"))
        await asyncio.sleep(0.3)
        await api.req("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "after", "labels": {"x": "1"}}})
        await api.req("PATCH", f"/api/v1/namespaces/{ns}/configmaps/after", {"data": {"k": "v"}},
                      ctype="application/merge-patch+json")
        await api.req("DELETE", f"/api/v1/namespaces/{ns}/configmaps/after")
        events = await asyncio.wait_for(watcher, 20)
        seen.append([(e["type"], e["object"]["metadata"]["name"], (e["object"].get("data") or {}).get("k")) for e in events])
        # from "0": the current state first, as ADDED
        initial = await api.watch(f"/api/v1/namespaces/{ns}/configmaps", {"resourceVersion": "0", "labelSelector": "x"},
                                  stop=lambda ev: True)
        seen.append([(e["type"], e["object"]["metadata"]["name"]) for e in initial])
    assert seen[0] == seen[2] and seen[1] == seen[3]
    assert seen[0] == [("ADDED", "after", None), ("MODIFIED", "after", "v"), ("DELETED", "after", "v")]
    assert seen[1] == [("ADDED", "before")]
