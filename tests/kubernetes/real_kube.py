"""``RealKube``: the real v1.20 control plane behind the same small interface tests use on the
stand-in (``KubeStandin``), so one test body runs on both.

=====================================  =====================================================
stand-in (``kube_standin.KubeStandin``)  here (real kube-apiserver + controllers + kubelet.py)
=====================================  =====================================================
``add_node(name, allocatable=...)``     POST a Node labelled for the kubelet stand-in, PATCH its
                                        status; wait until the kubelet reports it (Ready or not)
                                        and the node lifecycle controller has settled its taints
``put_object(PODS, pod)``               POST; a pod given a terminal ``status.phase`` is
                                        annotated so the kubelet writes that phase (a pod that
                                        ran before the test)
``store(resource)``, ``get(...)``       LIST / GET
``remove(resource, ns, name)``          DELETE, ``gracePeriodSeconds=0``, background propagation
``finish_pod(ns, name, code)``          annotation ``kubelet.trainhub.io/exit-code`` → the
                                        kubelet ends the containers with that code
``mutate(resource, ns, name, changes)`` merge PATCH (``/status`` for a ``status`` change)
``recorded_requests()``                 the apiserver's audit log (test clients only)
``write_kubeconfig(path, namespace)``   an admin kubeconfig (token + CA)
=====================================  =====================================================

The calls block (urllib, no event loop needed): they are short, and the apiserver is another
process, so nothing in the test's loop is waited on.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from types import SimpleNamespace

import yarl

MANAGED_LABEL = "kubelet.trainhub.io/managed"
READY_ANNOTATION = "kubelet.trainhub.io/ready"
EXIT_ANNOTATION = "kubelet.trainhub.io/exit-code"
PHASE_ANNOTATION = "kubelet.trainhub.io/phase"

_NAMESPACED = {"nodes": False, "persistentvolumes": False, "namespaces": False, "clusterroles": False,
               "clusterrolebindings": False}

_VERB_METHOD = {"get": "GET", "list": "GET", "watch": "GET", "create": "POST", "update": "PUT", "patch": "PATCH",
                "delete": "DELETE", "deletecollection": "DELETE"}


def resource_path(resource, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
    """The REST path of a kmock resource (``group``, ``version``, ``plural``) or a (group, version, plural)."""
    group, version, plural = (resource.group, resource.version, resource.plural) if hasattr(resource, "plural") else resource
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    if namespace and _NAMESPACED.get(plural, True):
        base += f"/namespaces/{namespace}"
    path = f"{base}/{plural}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


class ApiError(Exception):
    def __init__(self, status: int, body):
        self.status, self.body = status, body
        super().__init__(f"{status}: {body.get('message') if isinstance(body, dict) else body}")


class RealKube:
    def __init__(self, plane):
        self.plane = plane
        self.url = plane.url
        self._clients = iter(range(10**6))
        self.last_user = None

    # -- HTTP ----------------------------------------------------------------------------------

    def call(self, method: str, path: str, body=None, *, ok=(200, 201, 202), ctype="application/json", token=None):
        status, out = self.plane.request(method, path, body, content_type=ctype, token=token)
        if status not in ok:
            raise ApiError(status, out)
        return out

    def write_kubeconfig(self, path, namespace: str = "default") -> str:
        """An admin kubeconfig with an identity of its own (``test-client-N``, in ``system:masters``),
        so ``recorded_requests`` can tell its requests from other clients'."""
        from controlplane import CLIENT_IDENTITIES

        n = next(self._clients)
        if n >= CLIENT_IDENTITIES:
            raise RuntimeError(f"more than {CLIENT_IDENTITIES} kubeconfigs asked of one control plane")
        self.last_user = f"test-client-{n}"
        return self.plane.kubeconfig(path=path, namespace=namespace, token=self.plane.tokens[f"client-{n}"],
                                     name=self.last_user)

    # -- objects -------------------------------------------------------------------------------

    def store(self, resource) -> dict[tuple[str | None, str], dict]:
        items = self.call("GET", resource_path(resource))["items"]
        return {(o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in items
                if not o["metadata"].get("deletionTimestamp")}

    def get(self, resource, namespace, name) -> dict | None:
        status, out = self.plane.request("GET", resource_path(resource, namespace, name))
        return out if status == 200 else None

    async def put_object(self, resource, obj: dict) -> dict:
        obj = json.loads(json.dumps(obj))
        meta = obj.setdefault("metadata", {})
        phase = (obj.get("status") or {}).get("phase")
        if resource.plural == "pods" and phase in ("Succeeded", "Failed"):
            meta.setdefault("annotations", {})[PHASE_ANNOTATION] = phase
        self.ensure_namespace(meta.get("namespace"))
        return self.call("POST", resource_path(resource, meta.get("namespace")), obj)

    async def mutate(self, resource, namespace, name, changes: dict) -> dict:
        sub = "status" if set(changes) == {"status"} else None
        return self.call("PATCH", resource_path(resource, namespace, name, sub), changes,
                         ctype="application/merge-patch+json")

    async def remove(self, resource, namespace, name) -> None:
        self.call("DELETE", resource_path(resource, namespace, name),
                  {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                   "propagationPolicy": "Background"}, ok=(200, 202, 404))

    async def finish_pod(self, namespace, name, exit_code: int = 0, *, reason=None, disruption: bool = False) -> dict:
        if disruption:
            raise NotImplementedError("1.20 has no DisruptionTarget pod condition (1.26+): stand-in only")
        pod = self.get(_PODS, namespace, name)
        prev = ((pod or {}).get("metadata", {}).get("annotations") or {}).get(EXIT_ANNOTATION)
        value = str(exit_code) if prev is None else f"{exit_code}#{time.monotonic_ns()}"
        self.call("PATCH", resource_path(_PODS, namespace, name),
                  {"metadata": {"annotations": {EXIT_ANNOTATION: value}}}, ctype="application/merge-patch+json")

        def exited():
            p = self.get(_PODS, namespace, name)
            for cs in (p or {}).get("status", {}).get("containerStatuses") or []:
                for state in (cs.get("state") or {}, cs.get("lastState") or {}):
                    if (state.get("terminated") or {}).get("exitCode") == exit_code and \
                            cs.get("restartCount", 0) >= _restarts(pod, cs["name"]):
                        return p
            return None
        return await asyncio.to_thread(self.wait_for, exited, f"pod {namespace}/{name} to exit with {exit_code}")

    def ensure_namespace(self, namespace: str | None, timeout: float = 60) -> None:
        """Create ``namespace`` if missing and wait until pods can be created in it (its default
        ServiceAccount and token exist: ServiceAccount admission refuses pods before that)."""
        if not namespace:
            return
        status, _ = self.plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        if status not in (201, 409):
            raise ApiError(status, _)

        def ready():
            sa = self.get(("", "v1", "serviceaccounts"), namespace, "default")
            return sa and sa.get("secrets")
        self.wait_for(ready, f"the default ServiceAccount token in {namespace}", timeout)

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A token for a ServiceAccount from the TokenRequest API (as a pod's projected token)."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds}}
        return self.call("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body)["status"]["token"]

    def kubeconfig_for_token(self, path, token: str, namespace: str = "default", name: str = "sa") -> str:
        return self.plane.kubeconfig(path=path, token=token, namespace=namespace, name=name)

    # -- nodes ---------------------------------------------------------------------------------

    def add_node(self, name: str, *, allocatable: dict, labels: dict | None = None, taints: list | None = None,
                 ready: bool = True, unschedulable: bool = False, timeout: float = 60) -> dict:
        resources = {"cpu": "32", "memory": "256Gi", "pods": "110", **allocatable}
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                     MANAGED_LABEL: "true", **(labels or {})},
            "annotations": {READY_ANNOTATION: "true" if ready else "false"}},
            "spec": {"taints": taints or [], **({"unschedulable": True} if unschedulable else {})}}
        status, out = self.plane.request("POST", "/api/v1/nodes", node)
        if status == 409:
            raise ApiError(status, out)
        if status != 201:
            raise ApiError(status, out)
        self.call("PATCH", f"/api/v1/nodes/{name}/status",
                  {"status": {"capacity": resources, "allocatable": resources}},
                  ctype="application/merge-patch+json")

        def settled():
            n = self.get(_NODES, None, name)
            if not n:
                return None
            cond = {c["type"]: c["status"] for c in (n.get("status") or {}).get("conditions") or []}
            keys = {t["key"] for t in n["spec"].get("taints") or []}
            if cond.get("Ready") != ("True" if ready else "False"):
                return None
            if ready and "node.kubernetes.io/not-ready" in keys:
                return None
            if not ready and "node.kubernetes.io/not-ready" not in keys:
                return None
            if unschedulable and "node.kubernetes.io/unschedulable" not in keys:
                return None
            return n
        return self.wait_for(settled, f"node {name} to settle", timeout)

    def remove_node(self, name: str) -> None:
        self.call("DELETE", f"/api/v1/nodes/{name}", ok=(200, 404))

    # -- audit ---------------------------------------------------------------------------------

    def recorded_requests(self, user: str | None = None) -> list:
        """Requests of one test client (``user``; default: the one of the latest
        ``write_kubeconfig``), oldest first, from the audit log, shaped like kmock's recorded
        requests: ``.method``, ``.url`` (``.path``), ``.params``."""
        user = user or self.last_user
        out = []
        with open(self.plane.audit_log) as f:
            for line in f:
                ev = json.loads(line)
                if ev.get("user", {}).get("username") != user:
                    continue
                verb = ev.get("verb")
                stage = ev.get("stage")
                if (verb == "watch") != (stage == "ResponseStarted"):
                    continue
                url = yarl.URL(ev["requestURI"])
                params = dict(url.query)
                if verb == "watch":
                    params["watch"] = "true"
                out.append(SimpleNamespace(method=_VERB_METHOD.get(verb, verb.upper()), url=url, params=params,
                                           user=ev.get("user", {}).get("username")))
        return out

    # -- waiting -------------------------------------------------------------------------------

    def wait_for(self, fn, what: str, timeout: float = 30):
        deadline = time.monotonic() + timeout
        while True:
            self.plane.check_alive()
            value = fn()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.05)


def _restarts(pod, container: str) -> int:
    for cs in (pod or {}).get("status", {}).get("containerStatuses") or []:
        if cs["name"] == container:
            return cs.get("restartCount", 0)
    return 0


_PODS = ("", "v1", "pods")
_NODES = ("", "v1", "nodes")


def quote(s: str) -> str:
    return urllib.parse.quote(s, safe="")
