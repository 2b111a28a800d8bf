"""A Kubernetes API stand-in on loopback for tests: kmock 0.8's HTTP routing and object store, with
the API semantics of a real apiserver and small controllers written here.

Kept honest by ``test_standin_differential.py``, which sends the same requests to the real
v1.20.2 apiserver (``controlplane/``) and to this stand-in and checks that they agree. What
it does, as the apiserver does (``standin_semantics.py`` has the body rules):

* **version**: ``GET /version`` answers ``KubeStandin.version`` (1.30: what the Job controller
  follows), so clients that check the server's version see one that carries Indexed Jobs;
* **requests**: create, get, list, watch, replace (PUT, 409 on a stale ``resourceVersion``),
  patch (JSON merge, strategic merge with the schema's merge keys, JSON patch), delete and
  deletecollection, the ``status`` subresource, ``pods/log``; ``metadata.namespace`` from the
  URL (400 when the body names another); ``uid``, ``resourceVersion``, ``creationTimestamp``,
  ``generateName``; a namespaced object needs its Namespace (404 otherwise; ``default``,
  ``kube-system``, ``kube-public``, ``kube-node-lease`` exist, ``standin_server(namespaces=)``
  adds more);
* **validation, defaulting, admission** (422 bodies shaped like the apiserver's), **unknown
  fields** dropped (``fieldValidation=Strict``: 400, as 1.27+ does; 1.20 ignores it),
  **label and field selectors** (only the fields the apiserver indexes; 400 otherwise);
* **watch** from a ``resourceVersion`` (events after it, never a replay of the whole store),
  ``timeoutSeconds``, filtered by the URL's namespace and selectors; a ``resourceVersion``
  older than the history kept answers an ``ERROR`` event with a 410 ``Expired`` Status;
  ``restart_apiserver()`` ends every watch and forgets the history, as an apiserver restart does;
* **deletion**: graceful for a pod bound to a node (``deletionTimestamp`` +
  ``deletionGracePeriodSeconds``, the kubelet finishes it), at once for others; finalizers
  hold an object; ``preconditions``; ``propagationPolicy`` Background / Foreground / Orphan
  with the per-kind default (Jobs: Orphan, as batch/v1 does) carried out by a **garbage
  collector** (dependents through ``ownerReferences``, ``orphan`` and ``foregroundDeletion``
  finalizers, dangling dependents);
* **controllers**: node lifecycle taints (``not-ready``, ``unschedulable``), the PV binder
  (pre-bound claims), pvc/pv protection, a **scheduler** (extended resources, cpu, memory,
  pods, ``nodeSelector``, taints and tolerations, bound claims; a pod with ``schedulingGates`` stays
  Pending, ``PodScheduled`` False ``SchedulingGated``, until they are removed) and a **kubelet** (admission
  ``OutOf<resource>``, Running/Ready with ``podIP`` and container statuses, graceful
  termination: exit 143 on SIGTERM, or 137 when ``kubelet.trainhub.io/on-sigterm: ignore``
  and the grace period runs out), and a **Job controller** that follows the current upstream
  one for what 1.20 cannot show: Indexed and NonIndexed completion, ``podFailurePolicy``
  (FailJob, Ignore, Count on exit codes and pod conditions), ``backoffLimit`` with the
  exponential re-creation delay (``job_backoff``, 10 s doubling, capped at 6 min),
  ``podReplacementPolicy`` (replacements only once the old pod is Failed when it is
  ``Failed``), ``suspend`` (Kueue), the ``FailureTarget`` / ``SuccessCriteriaMet`` condition
  first and ``Failed`` / ``Complete`` only after every pod has ended, pods deleted gracefully;
* **Kueue's Workload** (``kueue.x-k8s.io/v1beta1`` ``workloads``, namespaced, with ``status``), as a CRD
  is served: stored as sent, no schema; tests play Kueue (gate a pod, write the Workload's conditions,
  remove the gate).

Not modelled: ServiceAccounts and their token volumes, resource quotas, limit ranges, RBAC
(every request is allowed), Pod Security admission, the job-tracking finalizer,
``activeDeadlineSeconds`` of Jobs, ``backoffLimitPerIndex``, ``successPolicy``, dynamic volume
provisioning (claims without a pre-bound volume stay Pending), list pagination, bookmarks.

Usage::

    async with standin_server(namespaces=("ns",)) as kube:  # kube: KubeStandin; str(kube.url)
        kube.add_node("gpu-a", allocatable={"nvidia.com/gpu": "4"}, labels={...})
        kube.write_kubeconfig(path, "ns")
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import ipaddress
import itertools
import json
import uuid
from typing import Any, AsyncIterator

import aiohttp.web
import attrs
import kmock
from kmock._internal import parsing, rendering

from standin_semantics import (  # noqa: F401 - re-exported for tests
    ApiError, PatchError, apply_defaults, invalid, json_patch, match_field_selector, match_label_selector, merge_patch,
    normalize_update, parse_field_selector, parse_label_selector, parse_quantity, prune_unknown, schema_for,
    strategic_merge_patch, validate,
)

_parse_path = parsing.parse_path


def _parse_path_with_namespaces(path: str) -> parsing.ParsedPath:
    """kmock reads ``/api/v1/namespaces[/name[/status]]`` as a namespace prefix (and fails on the
    bare list): they are the namespaces resource itself."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and (len(parts) <= 4 or parts[4] in ("status", "finalize")):
        return parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) > 3 else None,
                                  parts[4] if len(parts) > 4 else None)
    return _parse_path(path)


parsing.parse_path = _parse_path_with_namespaces

PODS = kmock.resource(group="", version="v1", plural="pods")
NODES = kmock.resource(group="", version="v1", plural="nodes")
NAMESPACES = kmock.resource(group="", version="v1", plural="namespaces")
PVCS = kmock.resource(group="", version="v1", plural="persistentvolumeclaims")
PVS = kmock.resource(group="", version="v1", plural="persistentvolumes")
SERVICES = kmock.resource(group="", version="v1", plural="services")
CONFIGMAPS = kmock.resource(group="", version="v1", plural="configmaps")
JOBS = kmock.resource(group="batch", version="v1", plural="jobs")
# Kueue's Workload (a CRD: served only as stored, no schema checks), for its pod integration
WORKLOADS = kmock.resource(group="kueue.x-k8s.io", version="v1beta1", plural="workloads")

SIGTERM_ANNOTATION = "kubelet.trainhub.io/on-sigterm"
_RESTART = object()
BUILTIN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
TERMINAL = ("Succeeded", "Failed")
# batch/v1 Jobs orphan their pods when a DELETE names no propagation policy (the REST strategy's default)
ORPHAN_BY_DEFAULT = {("batch", "jobs")}


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _later(seconds: float) -> str:
    return (datetime.datetime.now(tz=datetime.UTC) + datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod_requests(pod: dict) -> dict[str, float]:
    """Effective requests of a pod (sum of containers; max with classic init containers; native
    sidecars add up), as the scheduler counts them. Requests are defaulted from limits."""
    total: dict[str, float] = {"pods": 1}
    spec = pod.get("spec") or {}

    def reqs(c):
        res = c.get("resources") or {}
        return {**(res.get("limits") or {}), **(res.get("requests") or {})}
    for c in spec.get("containers") or []:
        for k, v in reqs(c).items():
            total[k] = total.get(k, 0) + parse_quantity(v)
    sidecars: dict[str, float] = {}
    for c in spec.get("initContainers") or []:
        for k, v in reqs(c).items():
            if c.get("restartPolicy") == "Always":
                sidecars[k] = sidecars.get(k, 0) + parse_quantity(v)
                total[k] = total.get(k, 0) + parse_quantity(v)
            else:
                total[k] = max(total.get(k, 0), sidecars.get(k, 0) + parse_quantity(v))
    return total


def _tolerates(tolerations: list, taint: dict) -> bool:
    if taint.get("effect") not in ("NoSchedule", "NoExecute"):
        return True
    for t in tolerations or []:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _uid_of(obj: dict) -> str:
    return obj.get("metadata", {}).get("uid", "")


# ---------------------------------------------------------------------------------------------
# the emulator

@attrs.define(kw_only=True)
class KubeStandin(kmock.KubernetesEmulator):
    """kmock's emulator with a real apiserver's semantics (see the module docstring)."""

    kubelet_delay: float = 0.02
    # the Job controller's re-creation delay after a counted pod failure: 10 s, doubling, capped at 6 min
    job_backoff: float = 10.0
    job_backoff_max: float = 360.0
    # what GET /version answers: the Job controller here follows the current upstream one
    version: tuple = (1, 30)
    _rv: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    _last_rv: int = attrs.field(default=0, init=False)
    _window_start: int = attrs.field(default=0, init=False)  # a watch from an RV below this: 410
    _log: list = attrs.field(factory=list, init=False)  # (rv, resource, event)
    _watchers: list = attrs.field(factory=list, init=False)  # (resource, queue)
    _watch_queues: set = attrs.field(factory=set, init=False)
    _pod_ips: Any = attrs.field(factory=lambda: iter(ipaddress.ip_network("10.42.0.0/16").hosts()), init=False)
    # pod logs served at pods/<name>/log: {(namespace, pod): [(RFC 3339 nano timestamp, text), ...]}
    pod_logs: dict = attrs.field(factory=dict, init=False)
    _job_state: dict = attrs.field(factory=dict, init=False)  # job uid -> controller bookkeeping
    _kubelet_state: dict = attrs.field(factory=dict, init=False)  # pod uid -> what the kubelet did
    _wake: Any = attrs.field(factory=asyncio.Event, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.resources.load_bundled()
        self.resources[WORKLOADS] = {"kind": "Workload", "namespaced": True, "singular": "workload",
                                     "verbs": ["create", "delete", "deletecollection", "get", "list", "patch",
                                               "update", "watch"], "subresources": ["status"]}
        for ns in BUILTIN_NAMESPACES:
            self.add_namespace(ns)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._last_rv = next(self._rv)
        return str(self._last_rv)

    def _record(self, resource, event: dict) -> None:
        event = copy.deepcopy(event)
        meta = event["object"].setdefault("metadata", {})
        if event["type"] == "DELETED":
            meta["resourceVersion"] = self._next_rv()
        rv = int(meta.get("resourceVersion") or self._next_rv())
        self._log.append((rv, resource, event))
        if len(self._log) > 5000:
            del self._log[:-4000]
            self._window_start = max(self._window_start, self._log[0][0] - 1)
        for res, queue in self._watchers:
            if res is None or res == resource:
                queue.put_nowait((resource, event))
        self._wake.set()

    def _kind_of(self, resource) -> tuple[str, bool]:
        for res in self.resources:
            if res == resource:
                info = self.resources[res]
                return info.kind, bool(info.namespaced)
        return resource.plural.capitalize(), True

    def _api_version(self, resource) -> str:
        return "v1" if resource.group == "" else f"{resource.group}/{resource.version}"

    def recorded_requests(self) -> list:
        """Every request served so far (kmock records them), oldest first."""
        return list(self._requests)

    def write_kubeconfig(self, path, namespace: str = "default") -> str:
        """A kubeconfig for this stand-in (same call as ``RealKube.write_kubeconfig``)."""
        return write_kubeconfig(path, str(self.url).rstrip("/"), namespace)

    def store(self, resource) -> dict[tuple[str | None, str], dict]:
        """Live objects of one resource: {(namespace, name): object}."""
        out = {}
        for (res, ns, name), obj in self._objects.items():
            if res == resource and not obj.deleted:
                out[(ns, name)] = obj.raw
        return out

    def get(self, resource, namespace, name) -> dict | None:
        return self.store(resource).get((namespace, name))

    def _live(self, resource, namespace, name):
        try:
            obj = self._objects[resource, namespace, name]
        except KeyError:
            return None
        return None if obj.deleted else obj

    def _write(self, resource, obj: dict, event: str) -> dict:
        """Store ``obj`` (new or a full replacement) with a new resourceVersion; emit ``event``."""
        meta = obj["metadata"]
        meta["resourceVersion"] = self._next_rv()
        key = (resource, meta.get("namespace"), meta["name"])
        try:
            existing = self._objects[key]
        except KeyError:
            existing = None
        if existing is None:
            self._objects[key] = obj
        else:
            existing.create(obj)
        raw = self._objects[key].raw
        self._record(resource, {"type": event, "object": raw})
        return raw

    def _drop(self, resource, namespace, name) -> dict | None:
        obj = self._live(resource, namespace, name)
        if obj is None:
            return None
        raw = copy.deepcopy(obj.raw)
        obj.delete()
        self._record(resource, {"type": "DELETED", "object": raw})
        return raw

    async def mutate(self, resource, namespace: str | None, name: str, changes: dict) -> dict:
        """Merge ``changes`` into a stored object server-side (status updates) and emit MODIFIED."""
        async with self._lock:
            obj = self._live(resource, namespace, name)
            if obj is None:
                raise KeyError((resource.plural, namespace, name))
            new = merge_patch(obj.raw, changes)
            raw = self._write(resource, new, "MODIFIED")
            return self._after_update(resource, raw)

    async def put_object(self, resource, obj: dict) -> dict:
        """Create an object server-side (nodes, pods of other tenants) as if POSTed (no validation)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        async with self._lock:
            if meta.get("namespace"):
                self._need_namespace(meta["namespace"])
            self._stamp_new(resource, meta.get("namespace"), obj, server_side=True)
            return self._write(resource, obj, "ADDED")

    def add_namespace(self, name: str) -> dict:
        if self._live(NAMESPACES, None, name) is not None:
            return self._live(NAMESPACES, None, name).raw
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        self._stamp_new(NAMESPACES, None, ns)
        raw = self._write(NAMESPACES, ns, "ADDED")
        self._namespace_created(name)
        return raw

    def _namespace_created(self, name: str) -> None:
        """The root-CA publisher (1.20 beta, GA 1.21) puts kube-root-ca.crt in every namespace."""
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt", "namespace": name},
              "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\nstand-in\n-----END CERTIFICATE-----\n"}}
        self._stamp_new(CONFIGMAPS, name, cm)
        self._write(CONFIGMAPS, cm, "ADDED")

    def add_node(self, name: str, *, allocatable: dict, labels: dict | None = None,
                 taints: list | None = None, ready: bool = True, unschedulable: bool = False) -> dict:
        """Synchronous helper for fixtures: a node whose kubelet reports ``allocatable`` and
        ``ready``; the node lifecycle controller's taints are there already."""
        resources = {"cpu": "32", "memory": "256Gi", "pods": "110", **allocatable}
        taints = list(taints or [])
        if not ready:
            taints += [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
                       {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute", "timeAdded": _now()}]
        if unschedulable:
            taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAdded": _now()})
        node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                  **(labels or {})}},
            "spec": {"taints": taints, **({"unschedulable": True} if unschedulable else {})},
            "status": {
                "allocatable": resources, "capacity": resources,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                "reason": "KubeletReady" if ready else "KubeletNotReady",
                                "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}],
                "addresses": [{"type": "InternalIP", "address": f"192.168.0.{len(self.store(NODES)) + 10}"},
                              {"type": "Hostname", "address": name}],
                "nodeInfo": {"kubeletVersion": "v1.33.0-standin", "operatingSystem": "linux", "architecture": "amd64"},
            },
        }
        self._stamp_new(NODES, None, node, server_side=True)
        node["metadata"].setdefault("annotations", {})["standin.trainhub.io/kubelet"] = "true"
        return self._write(NODES, node, "ADDED")

    def _stamp_new(self, resource, url_namespace: str | None, obj: dict, server_side: bool = False) -> None:
        meta = obj.setdefault("metadata", {})
        if url_namespace:
            meta["namespace"] = url_namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(k, None)
        kind, _ = self._kind_of(resource)
        obj.setdefault("apiVersion", self._api_version(resource))
        obj.setdefault("kind", kind)
        status = copy.deepcopy(obj.get("status")) if server_side else None
        if kind == "Node" and server_side:
            return
        taken = {(s.get("spec") or {}).get("clusterIP") for s in self.store(SERVICES).values()}
        apply_defaults(obj, kind, uid=meta["uid"], cluster_ips=taken)
        if status:  # a server-side put keeps the status it was given (pods that ran before)
            obj["status"] = {**(obj.get("status") or {}), **status}

    def _need_namespace(self, namespace: str) -> None:
        ns = self._live(NAMESPACES, None, namespace)
        if ns is None:
            raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                           {"name": namespace, "kind": "namespaces"})
        if ns.raw.get("metadata", {}).get("deletionTimestamp"):
            raise ApiError(403, "Forbidden", f"unable to create new content in namespace {namespace} because it is "
                           "being terminated", {"name": namespace, "kind": "namespaces"})

    # -- request handling ----------------------------------------------------------------------

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is None and request.url.path.rstrip("/") == "/version":
            major, minor = self.version
            return aiohttp.web.json_response({
                "major": str(major), "minor": str(minor), "gitVersion": f"v{major}.{minor}.0-standin",
                "gitCommit": "standin", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.22", "compiler": "gc", "platform": "linux/amd64"})
        if request.resource is None:
            return await super()._handle(request)
        method = str(request.method.value if hasattr(request.method, "value") else request.method).upper()
        try:
            if method == "GET" and str(request.params.get("watch", "")).lower() in ("true", "1"):
                return await self._stream_watch(request)
            if method == "GET" and request.subresource == "log" and request.resource == PODS:
                return self._serve_pod_log(request)
            if method == "GET":
                return await self._serve_get(request)
            if method == "POST" and not request.name:
                return await self._serve_create(request)
            if method == "PUT" and request.name and request.subresource in (None, "status"):
                return await self._serve_replace(request, status_only=request.subresource == "status")
            if method == "PATCH" and request.name and request.subresource in (None, "status"):
                return await self._serve_patch(request, status_only=request.subresource == "status")
            if method == "DELETE" and request.name and not request.subresource:
                return await self._serve_delete(request)
            if method == "DELETE" and not request.name:
                return await self._serve_delete_collection(request)
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        except ApiError as e:
            return aiohttp.web.json_response(e.body(), status=e.code)

    def _warn(self, response: aiohttp.web.StreamResponse, unknown: list[str]) -> aiohttp.web.StreamResponse:
        for path in unknown[:10]:
            response.headers.add("Warning", f'299 - "unknown field \\"{path}\\""')
        return response

    def _check_unknown(self, request, unknown: list[str]) -> None:
        mode = str(request.params.get("fieldValidation", "Warn"))
        if unknown and mode == "Strict":
            fields = ", ".join(f'unknown field "{p}"' for p in unknown)
            raise ApiError(400, "BadRequest", f"strict decoding error: {fields}")

    def _body(self, request) -> Any:
        data = request.data
        if data is None and request.body:
            try:
                data = json.loads(request.body)
            except ValueError as e:
                raise ApiError(400, "BadRequest", f"the body of the request was in an unknown format: {e}") from None
        return data

    async def _serve_get(self, request) -> aiohttp.web.StreamResponse:
        kind, namespaced = self._kind_of(request.resource)
        if request.name:
            obj = self._live(request.resource, request.namespace if namespaced else None, request.name)
            if obj is None:
                raise ApiError(404, "NotFound", f'{request.resource.plural} "{request.name}" not found',
                               {"name": request.name, "kind": request.resource.plural})
            return aiohttp.web.json_response(obj.raw)
        label = request.params.get("labelSelector")
        field = request.params.get("fieldSelector")
        parse_label_selector(label)
        parse_field_selector(field, request.resource.plural)
        async with self._lock:
            items = [obj.raw for (res, ns, name), obj in self._objects.items()
                     if res == request.resource and not obj.deleted and self._selected(request, ns, obj.raw)]
            rv = str(self._last_rv)
        items.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
        return aiohttp.web.json_response({
            "apiVersion": self._api_version(request.resource), "kind": f"{kind}List",
            "metadata": {"resourceVersion": rv}, "items": items,
        })

    async def _serve_create(self, request) -> aiohttp.web.StreamResponse:
        obj = self._body(request)
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")
        obj = copy.deepcopy(obj)
        kind, namespaced = self._kind_of(request.resource)
        meta = obj.setdefault("metadata", {})
        if namespaced:
            if request.namespace is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if meta.get("namespace") and meta["namespace"] != request.namespace:
                raise ApiError(400, "BadRequest",
                               "the namespace of the provided object does not match the namespace sent on the request")
        else:
            meta.pop("namespace", None)
        schema = schema_for(obj.get("apiVersion") or self._api_version(request.resource), obj.get("kind") or kind)
        unknown = prune_unknown(obj, schema) if schema else []
        self._check_unknown(request, unknown)
        async with self._lock:
            if namespaced:
                self._need_namespace(request.namespace)
            obj.pop("status", None) if kind not in ("Node",) else None
            if not meta.get("name") and not meta.get("generateName"):
                validate(obj, kind, request.resource.group)
            self._stamp_new(request.resource, request.namespace if namespaced else None, obj)
            validate(obj, kind, request.resource.group)
            if self._live(request.resource, meta.get("namespace"), meta["name"]) is not None:
                raise ApiError(409, "AlreadyExists", f'{request.resource.plural} "{meta["name"]}" already exists',
                               {"name": meta["name"], **({"group": request.resource.group} if request.resource.group else {}),
                                "kind": request.resource.plural})
            raw = self._write(request.resource, obj, "ADDED")
            if request.resource == NAMESPACES:
                self._namespace_created(meta["name"])
        return self._warn(aiohttp.web.json_response(raw, status=201), unknown)

    async def _serve_replace(self, request, status_only: bool = False) -> aiohttp.web.StreamResponse:
        new = self._body(request)
        if not isinstance(new, dict):
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")
        async with self._lock:
            old = self._current(request)
            raw = await self._update(request, old, copy.deepcopy(new), status_only)
        return raw

    def _current(self, request) -> dict:
        _, namespaced = self._kind_of(request.resource)
        obj = self._live(request.resource, request.namespace if namespaced else None, request.name)
        if obj is None:
            raise ApiError(404, "NotFound", f'{request.resource.plural} "{request.name}" not found',
                           {"name": request.name, **({"group": request.resource.group} if request.resource.group else {}),
                            "kind": request.resource.plural})
        return copy.deepcopy(obj.raw)

    async def _update(self, request, old: dict, new: dict, status_only: bool, unknown=None):
        kind, _ = self._kind_of(request.resource)
        sent_rv = (new.get("metadata") or {}).get("resourceVersion")
        if sent_rv and sent_rv != old["metadata"].get("resourceVersion"):
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {request.resource.plural}'
                           f'{"." + request.resource.group if request.resource.group else ""} "{request.name}": '
                           "the object has been modified; please apply your changes to the latest version and try again",
                           {"name": request.name, "kind": request.resource.plural})
        new_meta = new.get("metadata") or {}
        if new_meta.get("name") not in (None, request.name):
            raise ApiError(400, "BadRequest", "the name of the object "
                           f"({new_meta.get('name')}) does not match the name on the URL ({request.name})")
        schema = schema_for(old.get("apiVersion") or self._api_version(request.resource), old.get("kind") or kind)
        if unknown is None:
            unknown = prune_unknown(new, schema) if schema else []
            self._check_unknown(request, unknown)
        if status_only:
            merged = copy.deepcopy(old)
            merged["status"] = new.get("status", {})
            new = merged
        else:
            new.setdefault("apiVersion", old.get("apiVersion"))
            new.setdefault("kind", old.get("kind"))
            if "status" in old:
                new["status"] = old["status"]  # the main resource never changes status
            meta = new.setdefault("metadata", {})
            for k in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp", "deletionGracePeriodSeconds",
                      "generateName"):
                if k in old["metadata"]:
                    meta[k] = old["metadata"][k]
                else:
                    meta.pop(k, None)
            normalize_update(new, kind)
            if kind == "Secret" and "type" not in new:
                new["type"] = old.get("type")
            validate(new, kind, request.resource.group, old=old)
        raw = self._write(request.resource, new, "MODIFIED")
        raw = self._after_update(request.resource, raw)
        return self._warn(aiohttp.web.json_response(raw), unknown)

    def _after_update(self, resource, raw: dict) -> dict:
        """An object being deleted goes once its last finalizer is gone."""
        meta = raw["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            grace_left = resource == PODS and (raw.get("status") or {}).get("phase") not in TERMINAL \
                and (meta.get("deletionGracePeriodSeconds") or 0) > 0
            if not grace_left:
                self._drop(resource, meta.get("namespace"), meta["name"])
        return raw

    async def _serve_patch(self, request, status_only: bool = False) -> aiohttp.web.StreamResponse:
        ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip()
        body = self._body(request)
        async with self._lock:
            old = self._current(request)
            kind, _ = self._kind_of(request.resource)
            schema = schema_for(old.get("apiVersion") or self._api_version(request.resource), old.get("kind") or kind)
            try:
                if ctype == "application/json-patch+json":
                    if not isinstance(body, list):
                        raise ApiError(400, "BadRequest", "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
                    new = json_patch(old, body)
                elif ctype == "application/merge-patch+json":
                    new = merge_patch(old, body)
                elif ctype == "application/strategic-merge-patch+json":
                    if schema is None:
                        raise ApiError(415, "UnsupportedMediaType",
                                       "the body of the request was in an unknown format - accepted media types "
                                       "include: application/json-patch+json, application/merge-patch+json, "
                                       "application/apply-patch+yaml")
                    new = strategic_merge_patch(old, body, schema)
                else:
                    raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                   "accepted media types include: application/json-patch+json, "
                                   "application/merge-patch+json, application/apply-patch+yaml")
            except PatchError as e:
                if ctype == "application/json-patch+json":
                    raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request",
                                   {}) from None
                raise ApiError(400, "BadRequest", str(e)) from None
            unknown = prune_unknown(new, schema) if schema else []
            self._check_unknown(request, unknown)
            new.setdefault("metadata", {})["resourceVersion"] = old["metadata"]["resourceVersion"] \
                if not (isinstance(body, dict) and (body.get("metadata") or {}).get("resourceVersion")) \
                else body["metadata"]["resourceVersion"]
            if status_only:
                new = {**old, "status": new.get("status", {})}
            return await self._update(request, old, new, status_only=False, unknown=unknown) if not status_only \
                else await self._update(request, old, new, status_only=True, unknown=unknown)

    def _delete_options(self, request) -> dict:
        body = self._body(request) if request.body or request.data else None
        opts = dict(body) if isinstance(body, dict) else {}
        for k in ("gracePeriodSeconds", "propagationPolicy", "orphanDependents"):
            if k in request.params and k not in opts:
                v = request.params[k]
                opts[k] = int(v) if k == "gracePeriodSeconds" else (v.lower() == "true" if k == "orphanDependents" else v)
        return opts

    async def _serve_delete(self, request) -> aiohttp.web.StreamResponse:
        opts = self._delete_options(request)
        async with self._lock:
            current = self._current(request)
            out = self._delete(request.resource, current, opts)
        return aiohttp.web.json_response(out)

    async def _serve_delete_collection(self, request) -> aiohttp.web.StreamResponse:
        opts = self._delete_options(request)
        parse_label_selector(request.params.get("labelSelector"))
        parse_field_selector(request.params.get("fieldSelector"), request.resource.plural)
        async with self._lock:
            doomed = [copy.deepcopy(obj.raw) for (res, ns, name), obj in self._objects.items()
                      if res == request.resource and not obj.deleted and self._selected(request, ns, obj.raw)]
            for obj in doomed:
                self._delete(request.resource, obj, opts)
        kind, _ = self._kind_of(request.resource)
        return aiohttp.web.json_response({"apiVersion": self._api_version(request.resource), "kind": f"{kind}List",
                                          "metadata": {"resourceVersion": str(self._last_rv)}, "items": doomed})

    def _delete(self, resource, current: dict, opts: dict) -> dict:
        """The apiserver's delete: preconditions, graceful pods, finalizers, GC finalizers."""
        meta = current["metadata"]
        pre = opts.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {pre['uid']}, UID in object "
                           f"meta: {meta.get('uid')}", {"name": meta["name"], "kind": resource.plural})
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
            raise ApiError(409, "Conflict", f"Precondition failed: ResourceVersion in precondition: "
                           f"{pre['resourceVersion']}, ResourceVersion in object meta: {meta.get('resourceVersion')}",
                           {"name": meta["name"], "kind": resource.plural})
        kind, _ = self._kind_of(resource)
        if resource == NAMESPACES:
            if not meta.get("deletionTimestamp"):  # the namespace controller empties it, then it goes
                meta["deletionTimestamp"] = _now()
                meta["deletionGracePeriodSeconds"] = 0
                current["status"] = {"phase": "Terminating"}
                return self._write(resource, current, "MODIFIED")
            return current
        policy = opts.get("propagationPolicy")
        if policy is None and opts.get("orphanDependents") is not None:
            policy = "Orphan" if opts["orphanDependents"] else "Background"
        if policy is None:
            policy = "Orphan" if (resource.group, resource.plural) in ORPHAN_BY_DEFAULT else "Background"
        if policy not in ("Orphan", "Background", "Foreground"):
            raise invalid("DeleteOptions", "", "", [("propagationPolicy", "FieldValueNotSupported",
                          f'Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan", "nil"')])
        finalizers = list(meta.get("finalizers") or [])
        if policy == "Orphan" and "orphan" not in finalizers:
            finalizers.append("orphan")
        if policy == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        grace = 0
        if resource == PODS:
            spec, status = current.get("spec") or {}, current.get("status") or {}
            requested = opts.get("gracePeriodSeconds")
            grace = int(spec.get("terminationGracePeriodSeconds", 30) if requested is None else requested)
            if not spec.get("nodeName") or status.get("phase") in TERMINAL:
                grace = 0
            if meta.get("deletionTimestamp"):
                # already terminating: a shorter grace period shortens it, 0 forces the removal
                if grace >= int(meta.get("deletionGracePeriodSeconds") or 0) and grace != 0:
                    return current
        elif meta.get("deletionTimestamp"):
            return current
        if grace > 0 or finalizers:
            meta["deletionTimestamp"] = _later(grace)
            meta["deletionGracePeriodSeconds"] = grace
            meta["finalizers"] = finalizers
            if not finalizers:
                meta.pop("finalizers")
            raw = self._write(resource, current, "MODIFIED")
            if grace == 0 and not finalizers:
                self._drop(resource, meta.get("namespace"), meta["name"])
            return raw
        meta["deletionTimestamp"] = _now()
        meta["deletionGracePeriodSeconds"] = 0
        self._drop(resource, meta.get("namespace"), meta["name"])
        if resource == PODS:
            return current
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": meta["name"], **({"group": resource.group} if resource.group else {}),
                            "kind": resource.plural, "uid": meta.get("uid")}}

    async def remove(self, resource, namespace: str | None, name: str, *, propagation: str = "Background") -> None:
        """Delete an object server-side at once (as ``kubectl delete --grace-period=0 --force``),
        dependents to the garbage collector."""
        async with self._lock:
            obj = self._live(resource, namespace, name)
            if obj is None:
                return
            current = copy.deepcopy(obj.raw)
            current["metadata"].pop("finalizers", None)
            self._delete(resource, current, {"gracePeriodSeconds": 0, "propagationPolicy": propagation})

    def _selected(self, request, namespace, obj) -> bool:
        if request.namespace is not None and namespace != request.namespace:
            return False
        if request.name is not None and obj.get("metadata", {}).get("name") != request.name:
            return False
        if not match_label_selector(obj.get("metadata", {}).get("labels"), request.params.get("labelSelector")):
            return False
        return match_field_selector(obj, request.params.get("fieldSelector"), request.resource.plural)

    # -- watch ---------------------------------------------------------------------------------

    def restart_apiserver(self) -> None:
        """What clients see when the apiserver restarts: every watch ends, and a watch from a
        resourceVersion older than now answers 410 (the new watch cache starts here)."""
        self._window_start = self._last_rv
        for queue in list(self._watch_queues):
            queue.put_nowait(_RESTART)

    async def _stream_watch(self, request) -> aiohttp.web.StreamResponse:
        parse_label_selector(request.params.get("labelSelector"))
        parse_field_selector(request.params.get("fieldSelector"), request.resource.plural)
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        with contextlib.suppress(ConnectionResetError):
            async for event in self._serve_watch(request):
                await response.write(json.dumps(event).encode() + b"\n")
            await response.write_eof()
        return response

    async def _serve_watch(self, request) -> AsyncIterator[dict]:
        timeout = float(request.params.get("timeoutSeconds") or 0) or None
        since = request.params.get("resourceVersion")
        queue: asyncio.Queue = asyncio.Queue()
        async with self._lock:
            if since in (None, "", "0"):
                backlog = [{"type": "ADDED", "object": obj.raw} for (res, ns, name), obj in self._objects.items()
                           if res == request.resource and not obj.deleted]
            elif not since.isdigit():
                raise ApiError(400, "BadRequest", f'invalid resource version: "{since}"')
            elif int(since) < self._window_start:
                yield {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                   "status": "Failure", "reason": "Expired", "code": 410,
                                                   "message": f"too old resource version: {since} ({self._window_start})"}}
                return
            else:
                backlog = [ev for rv, res, ev in self._log if res == request.resource and rv > int(since)]
            entry = (request.resource, queue)
            self._watchers.append(entry)
            self._watch_queues.add(queue)
        try:
            for event in backlog:
                if self._selected(request, event["object"]["metadata"].get("namespace"), event["object"]):
                    yield event
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout if timeout else None
            while True:
                wait = None if deadline is None else deadline - loop.time()
                if wait is not None and wait <= 0:
                    return
                try:
                    item = await asyncio.wait_for(queue.get(), wait)
                except asyncio.TimeoutError:
                    return
                if item is _RESTART:
                    return  # the apiserver went away: the stream ends
                _, event = item
                if self._selected(request, event["object"]["metadata"].get("namespace"), event["object"]):
                    yield event
        finally:
            self._watch_queues.discard(queue)
            with contextlib.suppress(ValueError):
                self._watchers.remove(entry)

    # -- pod logs ------------------------------------------------------------------------------

    def add_log_line(self, namespace: str, pod: str, text: str, ts: str | None = None) -> str:
        """Append a line to a pod's log (served at pods/<name>/log); returns its timestamp."""
        ts = ts or datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
        self.pod_logs.setdefault((namespace, pod), []).append((ts, text))
        return ts

    def _serve_pod_log(self, request) -> aiohttp.web.StreamResponse:
        """GET pods/<name>/log with ``timestamps`` and ``sinceSeconds`` (400 while the container waits)."""
        pod = self.get(PODS, request.namespace, request.name)
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{request.name}" not found', {"name": request.name, "kind": "pods"})
        if not (pod.get("status") or {}).get("containerStatuses"):
            raise ApiError(400, "BadRequest", f'container in pod "{request.name}" is waiting to start')
        lines = self.pod_logs.get((request.namespace, request.name), [])
        since = request.params.get("sinceSeconds")
        if since:
            cutoff = (datetime.datetime.now(tz=datetime.UTC) - datetime.timedelta(seconds=int(since)))
            cutoff_s = cutoff.strftime("%Y-%m-%dT%H:%M:%S")
            lines = [(ts, t) for ts, t in lines if ts[:19] >= cutoff_s]
        stamps = str(request.params.get("timestamps", "")).lower() in ("true", "1")
        body = "".join(f"{ts} {t}\n" if stamps else f"{t}\n" for ts, t in lines)
        return aiohttp.web.Response(text=body, content_type="text/plain")

    # -- controllers ---------------------------------------------------------------------------

    async def _control_loop(self, step, delay: float = 0.0) -> None:
        """Run ``step()`` under the store's lock now and after every change (events batched,
        ``delay`` first); until cancelled."""
        queue: asyncio.Queue = asyncio.Queue()
        entry = (None, queue)
        self._watchers.append(entry)
        try:
            while True:
                if delay:
                    await asyncio.sleep(delay)
                async with self._lock:
                    step()
                await queue.get()
                while not queue.empty():
                    queue.get_nowait()
        finally:
            with contextlib.suppress(ValueError):
                self._watchers.remove(entry)

    async def controllers(self) -> None:
        """Garbage collector, node lifecycle, PV binder, volume protection, namespace cleanup."""
        def step():
            self._collect_garbage()
            self._node_lifecycle()
            self._bind_volumes()
            self._empty_namespaces()
        await self._control_loop(step)

    def _all_live(self) -> list[tuple[Any, dict]]:
        return [(res, obj.raw) for (res, ns, name), obj in list(self._objects.items()) if not obj.deleted]

    def _collect_garbage(self) -> None:
        objects = self._all_live()
        uids = {_uid_of(o): (res, o) for res, o in objects}
        for res, obj in objects:
            meta = obj["metadata"]
            if not meta.get("deletionTimestamp"):
                continue
            fins = meta.get("finalizers") or []
            dependents = [(r, o) for r, o in objects
                          if any(ref.get("uid") == meta["uid"] for ref in o["metadata"].get("ownerReferences") or [])]
            if "orphan" in fins:
                for r, o in dependents:
                    o = copy.deepcopy(o)
                    o["metadata"]["ownerReferences"] = [ref for ref in o["metadata"]["ownerReferences"]
                                                        if ref.get("uid") != meta["uid"]]
                    if not o["metadata"]["ownerReferences"]:
                        del o["metadata"]["ownerReferences"]
                    self._write(r, o, "MODIFIED")
                self._remove_finalizer(res, obj, "orphan")
            elif "foregroundDeletion" in fins:
                blocking = []
                for r, o in dependents:
                    if not o["metadata"].get("deletionTimestamp"):
                        self._delete(r, copy.deepcopy(o), {"propagationPolicy": "Background"})
                    ref = next(x for x in o["metadata"]["ownerReferences"] if x.get("uid") == meta["uid"])
                    if ref.get("blockOwnerDeletion"):
                        blocking.append((r, o["metadata"].get("namespace"), o["metadata"]["name"], _uid_of(o)))
                live = [b for b in blocking if (lambda x: x is not None and _uid_of(x.raw) == b[3])(self._live(*b[:3]))]
                if not live:
                    self._remove_finalizer(res, obj, "foregroundDeletion")
        # dependents whose owners are all gone go too (background deletion)
        for res, obj in self._all_live():
            refs = obj["metadata"].get("ownerReferences") or []
            if refs and not obj["metadata"].get("deletionTimestamp") and all(
                    r.get("uid") not in uids for r in refs):
                self._delete(res, copy.deepcopy(obj), {"propagationPolicy": "Background"})

    def _remove_finalizer(self, resource, obj: dict, finalizer: str) -> None:
        current = self._live(resource, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if current is None:
            return
        new = copy.deepcopy(current.raw)
        new["metadata"]["finalizers"] = [f for f in new["metadata"].get("finalizers") or [] if f != finalizer]
        if not new["metadata"]["finalizers"]:
            del new["metadata"]["finalizers"]
        raw = self._write(resource, new, "MODIFIED")
        self._after_update(resource, raw)

    def _empty_namespaces(self) -> None:
        for (_, name), ns in self.store(NAMESPACES).items():
            if not ns["metadata"].get("deletionTimestamp"):
                continue
            left = [(res, obj) for res, obj in self._all_live() if obj["metadata"].get("namespace") == name]
            for res, obj in left:
                if not obj["metadata"].get("deletionTimestamp"):
                    self._delete(res, copy.deepcopy(obj), {"propagationPolicy": "Background"})
            if not left:
                self._drop(NAMESPACES, None, name)

    # taints the node lifecycle controller owns: (key, effect) -> from the Ready condition / spec
    _CONDITION_TAINTS = {"False": "node.kubernetes.io/not-ready", "Unknown": "node.kubernetes.io/unreachable"}

    def _node_lifecycle(self) -> None:
        """Taints from the Ready condition (NoSchedule and, for eviction, NoExecute) and from
        ``spec.unschedulable``, as the node lifecycle controller keeps them; a node with no Ready
        condition yet carries none of them (admission's not-ready taint is lifted)."""
        owned = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable", "node.kubernetes.io/unschedulable"}
        for (_, name), node in self.store(NODES).items():
            taints = list((node.get("spec") or {}).get("taints") or [])
            ready = next((c.get("status") for c in (node.get("status") or {}).get("conditions") or []
                          if c["type"] == "Ready"), None)
            want = [t for t in taints if t["key"] not in owned]
            key = self._CONDITION_TAINTS.get(ready)
            if key:
                want.append({"key": key, "effect": "NoSchedule"})
                old = next((t for t in taints if t["key"] == key and t.get("effect") == "NoExecute"), None)
                want.append(old or {"key": key, "effect": "NoExecute", "timeAdded": _now()})
            if (node.get("spec") or {}).get("unschedulable"):
                old = next((t for t in taints if t["key"] == "node.kubernetes.io/unschedulable"), None)
                want.append(old or {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAdded": _now()})
            if sorted(map(json.dumps, want)) != sorted(map(json.dumps, taints)):
                new = copy.deepcopy(node)
                new.setdefault("spec", {})["taints"] = want
                if not want:
                    del new["spec"]["taints"]
                self._write(NODES, new, "MODIFIED")

    def _bind_volumes(self) -> None:
        pvs = self.store(PVS)
        pods = [p for p in self.store(PODS).values() if (p.get("status") or {}).get("phase") not in TERMINAL]
        for (ns, name), pvc in self.store(PVCS).items():
            vol = (pvc.get("spec") or {}).get("volumeName")
            if (pvc.get("status") or {}).get("phase") == "Pending" and vol and (None, vol) in pvs:
                pv = pvs[(None, vol)]
                ref = (pv.get("spec") or {}).get("claimRef") or {}
                if ref and (ref.get("name"), ref.get("namespace")) != (name, ns):
                    continue
                if ref.get("uid") and ref["uid"] != _uid_of(pvc):
                    continue
                new_pv = copy.deepcopy(pv)
                new_pv["spec"]["claimRef"] = {"kind": "PersistentVolumeClaim", "namespace": ns, "name": name,
                                              "uid": _uid_of(pvc), "apiVersion": "v1",
                                              "resourceVersion": pvc["metadata"]["resourceVersion"]}
                new_pv["status"] = {"phase": "Bound"}
                self._write(PVS, new_pv, "MODIFIED")
                new_pvc = copy.deepcopy(pvc)
                new_pvc["metadata"].setdefault("annotations", {})["pv.kubernetes.io/bind-completed"] = "yes"
                new_pvc["status"] = {"phase": "Bound", "accessModes": pv["spec"].get("accessModes") or [],
                                     "capacity": pv["spec"].get("capacity") or {}}
                self._write(PVCS, new_pvc, "MODIFIED")
            if pvc["metadata"].get("deletionTimestamp") and "kubernetes.io/pvc-protection" in (pvc["metadata"].get("finalizers") or []):
                used = any(((v.get("persistentVolumeClaim") or {}).get("claimName") == name and p["metadata"].get("namespace") == ns)
                           for p in pods for v in (p.get("spec") or {}).get("volumes") or [])
                if not used:
                    self._remove_finalizer(PVCS, pvc, "kubernetes.io/pvc-protection")
        claims = {(ns, name): pvc for (ns, name), pvc in self.store(PVCS).items()}
        for (_, name), pv in self.store(PVS).items():
            ref = (pv.get("spec") or {}).get("claimRef")
            phase = (pv.get("status") or {}).get("phase")
            if phase == "Pending" and not ref:
                self._write(PVS, {**copy.deepcopy(pv), "status": {"phase": "Available"}}, "MODIFIED")
            elif phase == "Bound" and ref and (ref.get("namespace"), ref.get("name")) not in claims:
                if pv["spec"].get("persistentVolumeReclaimPolicy") == "Delete":
                    self._delete(PVS, copy.deepcopy(pv), {})
                else:
                    self._write(PVS, {**copy.deepcopy(pv), "status": {"phase": "Released"}}, "MODIFIED")
            if pv["metadata"].get("deletionTimestamp") and "kubernetes.io/pv-protection" in (pv["metadata"].get("finalizers") or []):
                if not ref or (ref.get("namespace"), ref.get("name")) not in claims:
                    self._remove_finalizer(PVS, pv, "kubernetes.io/pv-protection")

    # -- scheduler + kubelet -------------------------------------------------------------------

    async def kubelet(self) -> None:
        """Schedule pending pods and play every node's kubelet; runs until cancelled."""
        def step():
            for (ns, name), pod in sorted(self.store(PODS).items(),
                                          key=lambda kv: kv[1]["metadata"].get("creationTimestamp") or ""):
                self._sync_pod(pod)
        await self._control_loop(step, self.kubelet_delay)

    def _sync_pod(self, pod: dict) -> None:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        uid = meta["uid"]
        phase = status.get("phase", "Pending")
        state = self._kubelet_state.setdefault(uid, {})
        if meta.get("deletionTimestamp"):
            self._terminate(pod, state)
            return
        if phase in TERMINAL:
            return
        if not spec.get("nodeName"):
            if spec.get("schedulingGates"):  # 1.27+: the scheduler leaves a gated pod alone
                self._gated(pod)
                return
            self._schedule(pod)
            return
        if phase == "Pending" and not state.get("started"):
            node = self.get(NODES, None, spec["nodeName"])
            if node is None:
                return
            refusal = self._admit(pod, node)
            state["started"] = True
            if refusal:
                self._set_status(pod, {"phase": "Failed", "reason": refusal[0], "message": refusal[1], "startTime": _now()})
                return
            self._start(pod, node)

    def _fits(self, pod: dict, node: dict, exclude_uid: str | None = None) -> str | None:
        """None when ``pod`` fits on ``node`` next to the pods bound there; else the short reason."""
        alloc = {k: parse_quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
        used: dict[str, float] = {}
        for other in self.store(PODS).values():
            if _uid_of(other) in (_uid_of(pod), exclude_uid):
                continue
            if (other.get("spec") or {}).get("nodeName") != node["metadata"]["name"]:
                continue
            if (other.get("status") or {}).get("phase") in TERMINAL:
                continue
            for k, v in _pod_requests(other).items():
                used[k] = used.get(k, 0) + v
        for k, v in _pod_requests(pod).items():
            if v and used.get(k, 0) + v > alloc.get(k, 0) + 1e-9:
                return k
        return None

    def _admit(self, pod: dict, node: dict):
        short = self._fits(pod, node)
        if short:
            name = short if short in ("cpu", "memory", "pods") else short
            return (f"OutOf{name}", f"Pod was rejected: Node didn't have enough resource: {short}")
        return None

    def _schedule(self, pod: dict) -> None:
        spec = pod.get("spec") or {}
        selector = spec.get("nodeSelector") or {}
        tolerations = spec.get("tolerations") or []
        for v in spec.get("volumes") or []:
            claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
            if claim:
                pvc = self.get(PVCS, pod["metadata"].get("namespace"), claim)
                if pvc is None or (pvc.get("status") or {}).get("phase") != "Bound":
                    n = len(self.store(NODES))
                    self._unschedulable(pod, f"0/{n} nodes are available: {n} pod has unbound immediate PersistentVolumeClaims.")
                    return
        nodes = sorted(self.store(NODES).items())
        reasons: dict[str, int] = {}
        for (_, name), node in nodes:
            labels = node["metadata"].get("labels") or {}
            why = None
            if any(labels.get(k) != v for k, v in selector.items()):
                why = "node(s) didn't match Pod's node affinity/selector"
            elif not all(_tolerates(tolerations, t) for t in (node.get("spec") or {}).get("taints") or []):
                taint = next(t for t in node["spec"]["taints"] if not _tolerates(tolerations, t))
                why = f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
            else:  # a cordoned node is tainted node.kubernetes.io/unschedulable: tolerations decide, as upstream
                short = self._fits(pod, node)
                if short:
                    why = f"Insufficient {short}"
            if why is None:
                new = copy.deepcopy(pod)
                new["spec"]["nodeName"] = name
                new.setdefault("status", {})["conditions"] = [{"type": "PodScheduled", "status": "True",
                                                               "lastProbeTime": None, "lastTransitionTime": _now()}]
                self._write(PODS, new, "MODIFIED")
                return
            reasons[why] = reasons.get(why, 0) + 1
        detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
        self._unschedulable(pod, f"0/{len(nodes)} nodes are available: {detail}.")

    def _gated(self, pod: dict) -> None:
        conds = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"]
        if conds and conds[0].get("reason") == "SchedulingGated":
            return
        self._set_status(pod, {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
            "message": "Scheduling is blocked due to non-empty scheduling gates", "lastProbeTime": None,
            "lastTransitionTime": _now()}]})

    def _unschedulable(self, pod: dict, message: str) -> None:
        conds = (pod.get("status") or {}).get("conditions") or []
        if conds and conds[0].get("reason") == "Unschedulable" and conds[0].get("message") == message:
            return
        self._set_status(pod, {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
            "lastProbeTime": None, "lastTransitionTime": _now()}]})

    def _set_status(self, pod: dict, status: dict) -> dict:
        current = self._live(PODS, pod["metadata"].get("namespace"), pod["metadata"]["name"])
        if current is None or _uid_of(current.raw) != _uid_of(pod):
            return pod
        new = copy.deepcopy(current.raw)
        new["status"] = {**(new.get("status") or {}), **status}
        return self._write(PODS, new, "MODIFIED")

    @staticmethod
    def _container_status(c: dict, state: dict, *, ready: bool, restarts: int = 0) -> dict:
        image = c.get("image", "")
        return {"name": c["name"], "image": image, "imageID": f"docker-pullable://{image}",
                "containerID": f"containerd://{uuid.uuid4().hex}", "ready": ready, "started": "running" in state,
                "restartCount": restarts, "state": state, "lastState": {}}

    def _start(self, pod: dict, node: dict) -> None:
        now = _now()
        spec = pod["spec"]
        init = []
        for c in spec.get("initContainers") or []:
            if c.get("restartPolicy") == "Always":  # a native sidecar keeps running
                init.append(self._container_status(c, {"running": {"startedAt": now}}, ready=True))
            else:
                init.append(self._container_status(c, {"terminated": {"exitCode": 0, "reason": "Completed",
                                                                      "startedAt": now, "finishedAt": now}}, ready=True))
        addresses = {a["type"]: a["address"] for a in (node.get("status") or {}).get("addresses") or []}
        ip = str(next(self._pod_ips))
        status = {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": addresses.get("InternalIP", "192.168.0.10"),
            "startTime": now,
            "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                           for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
            "containerStatuses": [self._container_status(c, {"running": {"startedAt": now}}, ready=True)
                                  for c in spec.get("containers") or []],
        }
        if init:
            status["initContainerStatuses"] = init
        self._set_status(pod, status)

    def _exit_statuses(self, pod: dict, code: int, reason: str | None = None) -> list:
        now = _now()
        term = {"exitCode": code, "reason": reason or ("Completed" if code == 0 else "Error"),
                "startedAt": now, "finishedAt": now}
        old = {cs["name"]: cs for cs in (pod.get("status") or {}).get("containerStatuses") or []}
        return [{**old.get(c["name"], self._container_status(c, {}, ready=False)), "ready": False, "started": False,
                 "state": {"terminated": dict(term, containerID=f"containerd://{uuid.uuid4().hex}")}}
                for c in pod["spec"].get("containers") or []]

    def _terminate(self, pod: dict, state: dict) -> None:
        """Graceful termination by the kubelet: SIGTERM, exit 143 (or 137 once the grace period
        runs out when the container ignores SIGTERM), terminal phase, then the final delete."""
        meta, status = pod["metadata"], pod.get("status") or {}
        if status.get("phase") not in TERMINAL and status.get("containerStatuses"):
            ignore = (meta.get("annotations") or {}).get(SIGTERM_ANNOTATION, "").lower() == "ignore"
            if ignore and meta.get("deletionGracePeriodSeconds"):
                if "sigkill_at" not in state:
                    loop = asyncio.get_running_loop()
                    state["sigkill_at"] = loop.time() + float(meta["deletionGracePeriodSeconds"])
                    loop.call_later(float(meta["deletionGracePeriodSeconds"]) + 0.01, self._wake_kubelet)
                    return
                if asyncio.get_running_loop().time() < state["sigkill_at"]:
                    return
                code = 137
            else:
                code = 143
            pod = self._set_status(pod, {"phase": "Failed", "containerStatuses": self._exit_statuses(pod, code),
                                         "conditions": [{"type": t, "status": "False" if t in ("Ready", "ContainersReady") else "True",
                                                         "lastProbeTime": None, "lastTransitionTime": _now()}
                                                        for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]})
        # the kubelet's final word: delete with grace 0; finalizers still hold the pod
        current = self._live(PODS, meta.get("namespace"), meta["name"])
        if current is None or _uid_of(current.raw) != meta["uid"]:
            return
        raw = copy.deepcopy(current.raw)
        if raw["metadata"].get("finalizers"):
            if raw["metadata"].get("deletionGracePeriodSeconds"):
                raw["metadata"]["deletionGracePeriodSeconds"] = 0
                self._write(PODS, raw, "MODIFIED")
            return
        self._drop(PODS, meta.get("namespace"), meta["name"])
        self._kubelet_state.pop(meta["uid"], None)

    def _wake_kubelet(self) -> None:
        for res, queue in self._watchers:
            if res is None:
                queue.put_nowait((None, {"type": "TICK", "object": {"metadata": {}}}))

    async def finish_pod(self, namespace: str, name: str, exit_code: int = 0, *, reason: str | None = None,
                         disruption: bool = False) -> dict:
        """Play the kubelet when the worker container exits: phase Succeeded (0) or Failed; with
        ``disruption`` the pod was evicted (DisruptionTarget condition, phase Failed)."""
        async with self._lock:
            pod = self.get(PODS, namespace, name)
            now = _now()
            conditions = [{"type": t, "status": "False" if t in ("Ready", "ContainersReady") else "True",
                           "lastProbeTime": None, "lastTransitionTime": now}
                          for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]
            if disruption:
                conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                                   "message": "Eviction API: evicting", "lastTransitionTime": now})
            return self._set_status(pod, {
                "phase": "Succeeded" if exit_code == 0 and not disruption else "Failed",
                "containerStatuses": self._exit_statuses(pod, exit_code, reason), "conditions": conditions,
            })

    # -- the Job controller ----------------------------------------------------------------------

    async def job_controller(self) -> None:
        """batch/v1 Jobs as the current upstream controller runs them (module docstring); until cancelled."""
        def step():
            for (ns, name), job in list(self.store(JOBS).items()):
                self._reconcile_job(job)
        await self._control_loop(step)

    def _job_pods(self, uid: str) -> list[dict]:
        return [p for p in self.store(PODS).values()
                if any(r.get("uid") == uid and r.get("controller") for r in p["metadata"].get("ownerReferences") or [])]

    @staticmethod
    def _failure_action(job: dict, pod: dict) -> str:
        policy = (job["spec"].get("podFailurePolicy") or {}).get("rules") or []
        conditions = {c["type"] for c in (pod.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
        for rule in policy:
            for cond in rule.get("onPodConditions") or []:
                if cond["type"] in conditions:
                    return rule["action"]
            codes = rule.get("onExitCodes")
            if codes:
                for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                    if codes.get("containerName") and cs["name"] != codes["containerName"]:
                        continue
                    term = (cs.get("state") or {}).get("terminated")
                    if not term or term.get("exitCode") == 0:
                        continue
                    inside = term.get("exitCode") in codes["values"]
                    if inside == (codes["operator"] == "In"):
                        return rule["action"]
        return "Count"

    @staticmethod
    def _index(pod: dict) -> int | None:
        v = (pod["metadata"].get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
        return int(v) if v is not None else None

    def _job_condition(self, job: dict, kind: str, reason: str | None = None, message: str | None = None) -> dict:
        now = _now()
        return {"type": kind, "status": "True", "lastProbeTime": now, "lastTransitionTime": now,
                **({"reason": reason} if reason else {}), **({"message": message} if message else {})}

    def _reconcile_job(self, job: dict) -> None:
        spec, status = job["spec"], copy.deepcopy(job.get("status") or {})
        meta = job["metadata"]
        if meta.get("deletionTimestamp"):
            return
        uid = meta["uid"]
        state = self._job_state.setdefault(uid, {"counted": set(), "failures": 0, "not_before": 0.0})
        conds = {c["type"]: c for c in status.get("conditions") or [] if c.get("status") == "True"}
        if conds.keys() & {"Complete", "Failed"}:
            return
        loop = asyncio.get_running_loop()
        pods = self._job_pods(uid)
        alive = [p for p in pods if (p.get("status") or {}).get("phase") not in TERMINAL]
        active = [p for p in alive if not p["metadata"].get("deletionTimestamp")]
        terminating = [p for p in alive if p["metadata"].get("deletionTimestamp")]
        indexed = spec.get("completionMode") == "Indexed"
        completions = spec.get("completions")
        new_conditions = list(status.get("conditions") or [])

        # failures, once per pod
        failed = int(status.get("failed") or 0)
        fail_reason = None
        for p in pods:
            if (p.get("status") or {}).get("phase") != "Failed" or _uid_of(p) in state["counted"]:
                continue
            state["counted"].add(_uid_of(p))
            action = self._failure_action(job, p)
            if action == "Ignore":
                continue
            failed += 1
            if action == "FailJob":
                fail_reason = ("PodFailurePolicy", f"Container {self._failed_container(p)} for pod "
                               f"{p['metadata']['namespace']}/{p['metadata']['name']} failed with exit code "
                               f"{self._exit_code(p)} matching FailJob rule at index 0")
            else:
                state["failures"] += 1
                delay = min(self.job_backoff * 2 ** (state["failures"] - 1), self.job_backoff_max)
                state["not_before"] = loop.time() + delay
                loop.call_later(delay + 0.01, self._wake_kubelet)
                if failed > int(spec.get("backoffLimit", 6)):
                    fail_reason = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        succeeded_pods = [p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"]
        if indexed:
            done_idx = {self._index(p) for p in succeeded_pods}
            succeeded = len(done_idx)
        else:
            done_idx = set()
            succeeded = len({_uid_of(p) for p in succeeded_pods}) + int(state.get("succeeded_gone", 0))
        target = conds.get("FailureTarget") or conds.get("SuccessCriteriaMet")
        if target is None:
            if fail_reason:
                new_conditions.append(self._job_condition(job, "FailureTarget", *fail_reason))
                target = new_conditions[-1]
            elif completions is not None and succeeded >= int(completions):
                new_conditions.append(self._job_condition(job, "SuccessCriteriaMet", "CompletionsReached",
                                                          "Reached expected number of succeeded pods"))
                target = new_conditions[-1]
        if target is not None:
            for p in active:  # pods still running when the Job's fate is decided are stopped, gracefully
                self._delete(PODS, copy.deepcopy(p), {"propagationPolicy": "Background"})
            if not alive:
                final = "Failed" if target["type"] == "FailureTarget" else "Complete"
                new_conditions.append(self._job_condition(job, final, target.get("reason"), target.get("message")))
        elif spec.get("suspend"):
            for p in active:
                self._delete(PODS, copy.deepcopy(p), {"propagationPolicy": "Background"})
            if not any(c["type"] == "Suspended" and c["status"] == "True" for c in new_conditions):
                new_conditions = [c for c in new_conditions if c["type"] != "Suspended"]
                new_conditions.append(self._job_condition(job, "Suspended", "JobSuspended", "Job suspended"))
        else:
            new_conditions = [dict(c, status="False", reason="JobResumed", message="Job resumed",
                                   lastTransitionTime=_now()) if c["type"] == "Suspended" and c["status"] == "True" else c
                              for c in new_conditions]
            if loop.time() >= state["not_before"]:
                replace_when_failed = spec.get("podReplacementPolicy", "TerminatingOrFailed") == "Failed"
                busy = active + (terminating if replace_when_failed else [])
                parallelism = int(spec.get("parallelism", 1))
                if indexed:
                    busy_idx = {self._index(p) for p in busy}
                    for idx in range(int(completions)):
                        if len(busy_idx) >= parallelism:
                            break
                        if idx in done_idx or idx in busy_idx:
                            continue
                        self._create_job_pod(job, idx)
                        busy_idx.add(idx)
                else:
                    want = parallelism if completions is None else min(parallelism, int(completions) - succeeded)
                    for _ in range(max(0, want - len(busy))):
                        self._create_job_pod(job, None)
        pods = self._job_pods(uid)
        alive = [p for p in pods if (p.get("status") or {}).get("phase") not in TERMINAL]
        new_status = {
            **status,
            "active": len([p for p in alive if not p["metadata"].get("deletionTimestamp")]),
            "ready": len([p for p in alive if any(c["type"] == "Ready" and c["status"] == "True"
                                                  for c in (p.get("status") or {}).get("conditions") or [])]),
            "terminating": len([p for p in alive if p["metadata"].get("deletionTimestamp")]),
            "succeeded": succeeded, "failed": failed,
            "startTime": status.get("startTime") or (None if spec.get("suspend") else _now()),
            "uncountedTerminatedPods": {},
        }
        if indexed:
            new_status["completedIndexes"] = ",".join(str(i) for i in sorted(done_idx)) or None
        if new_conditions:
            new_status["conditions"] = new_conditions
        if any(c["type"] == "Complete" for c in new_conditions):
            new_status["completionTime"] = _now()
        new_status = {k: v for k, v in new_status.items() if v is not None and not (k in ("active", "failed", "succeeded") and v == 0)}
        if new_status != (job.get("status") or {}):
            new = copy.deepcopy(job)
            new["status"] = new_status
            self._write(JOBS, new, "MODIFIED")
            if any(c["type"] in ("Complete", "Failed") for c in new_conditions):
                self._job_state.pop(uid, None)

    @staticmethod
    def _failed_container(pod: dict) -> str:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if ((cs.get("state") or {}).get("terminated") or {}).get("exitCode"):
                return cs["name"]
        return "main"

    @staticmethod
    def _exit_code(pod: dict) -> int:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            code = ((cs.get("state") or {}).get("terminated") or {}).get("exitCode")
            if code:
                return code
        return 0

    def _create_job_pod(self, job: dict, idx: int | None) -> None:
        tmpl = copy.deepcopy(job["spec"]["template"])
        meta, spec = tmpl.setdefault("metadata", {}), tmpl["spec"]
        jname, ns, juid = job["metadata"]["name"], job["metadata"]["namespace"], job["metadata"]["uid"]
        meta.pop("creationTimestamp", None)
        meta["generateName"] = f"{jname}-{idx}-" if idx is not None else f"{jname}-"
        meta["namespace"] = ns
        labels = meta.setdefault("labels", {})
        labels.update({"batch.kubernetes.io/job-name": jname, "job-name": jname,
                       "batch.kubernetes.io/controller-uid": juid, "controller-uid": juid})
        if idx is not None:
            labels["batch.kubernetes.io/job-completion-index"] = str(idx)
            meta.setdefault("annotations", {})["batch.kubernetes.io/job-completion-index"] = str(idx)
            if spec.get("subdomain"):
                spec["hostname"] = f"{jname}-{idx}"
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": jname, "uid": juid,
                                    "controller": True, "blockOwnerDeletion": True}]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
        self._stamp_new(PODS, ns, pod)
        self._write(PODS, pod, "ADDED")


@contextlib.asynccontextmanager
async def standin_server(*, kubelet: bool = True, jobs: bool = False, namespaces=(),
                         job_backoff: float = 10.0) -> AsyncIterator[KubeStandin]:
    """Run a ``KubeStandin`` on a random loopback port (``str(kube.url)``) with its controllers,
    the scheduler/kubelet task and, with ``jobs=True``, the Job controller; ``namespaces``
    are created (a namespaced object needs its Namespace)."""
    kube = KubeStandin(job_backoff=job_backoff)
    for ns in namespaces:
        kube.add_namespace(ns)
    async with kube, kmock.Server(kube):
        tasks = [asyncio.create_task(kube.controllers())]
        if kubelet:
            tasks.append(asyncio.create_task(kube.kubelet()))
        if jobs:
            tasks.append(asyncio.create_task(kube.job_controller()))
        try:
            yield kube
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def write_kubeconfig(path, server_url: str, namespace: str = "default") -> str:
    """A kubeconfig pointing at ``server_url`` (kubernetes-asyncio needs one to exist)."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": server_url}}],
        "users": [{"name": "standin", "user": {"token": "standin-token"}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin", "namespace": namespace}}],
    }
    with open(path, "w") as f:
        json.dump(config, f)
    return str(path)
