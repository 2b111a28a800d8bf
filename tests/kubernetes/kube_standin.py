"""A Kubernetes API stand-in on loopback for tests: kmock 0.8 plus the fixes its gaps need.

kmock's ``KubernetesEmulator`` stores objects and serves list/watch/create/patch/delete over
real HTTP. On its own it falls short of what KubeSpawner and kubernetes-asyncio expect; this
module fills the gaps (each fix is named where it is made):

* watch flag case: kubernetes-asyncio sends ``watch=True``, kmock only matches ``watch=true``;
* server-side fields: ``metadata.namespace`` from the URL, ``uid``, ``resourceVersion``,
  ``creationTimestamp``, ``generateName``, an initial ``status`` for pods and PVCs;
* label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``) and simple field
  selectors (``a.b=c``, ``a.b!=c``) on list and watch;
* watch streams that start from a ``resourceVersion`` (events after it, never a replay of the
  whole store), honour ``timeoutSeconds`` and are filtered by the URL's namespace;
* PUT (replace, 409 on a stale ``resourceVersion``) and PATCH with a merge body, also on the
  ``/status`` subresource, bump ``resourceVersion``;
* garbage collection of dependents through ``ownerReferences`` when an owner is deleted.

``KubeStandin.kubelet()`` plays the scheduler and kubelet: a pending pod is bound to a node
that has room for its extended-resource requests (``nvidia.com/gpu`` ...), matches its
``nodeSelector`` and tolerates its taints, then set Running with ``podIP`` and ready
container statuses. A pod that fits nowhere stays Pending with ``PodScheduled=False``.

Reused by the job launcher's tests (Jobs are stored and watched like any other resource;
the kubelet ignores them, so tests create the Job's pods themselves or extend ``kubelet``).

Usage::

    async with standin_server() as kube:      # kube: KubeStandin, str(kube.url): http://127.0.0.1:port/
        kube.add_node("gpu-a", allocatable={"nvidia.com/gpu": "4"}, labels={...})
        write_kubeconfig(path, kube.url)
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import ipaddress
import itertools
import json
import re
import uuid
from typing import Any, AsyncIterator

import aiohttp.web
import attrs
import kmock
from kmock._internal import enums, rendering

PODS = kmock.resource(group="", version="v1", plural="pods")
NODES = kmock.resource(group="", version="v1", plural="nodes")
JOBS = kmock.resource(group="batch", version="v1", plural="jobs")

_NO_NAMESPACE = object()


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------
# selectors

_REQ_RE = re.compile(
    r"^\s*(?:(?P<not>!)\s*(?P<nkey>[^\s=!,()]+)"
    r"|(?P<key>[^\s=!,()]+)\s*(?:(?P<op>==|=|!=)\s*(?P<val>[^\s,()]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<vals>[^)]*)\))?)\s*$"
)


def _split_selector(selector: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p for p in parts if p.strip()]


def match_label_selector(labels: dict | None, selector: str | None) -> bool:
    """Kubernetes label-selector semantics for one object's labels."""
    labels = labels or {}
    for req in _split_selector(selector or ""):
        m = _REQ_RE.match(req)
        if not m:
            raise ValueError(f"unable to parse requirement: {req!r}")
        if m["nkey"]:
            if m["nkey"] in labels:
                return False
        elif m["op"]:
            has = m["key"] in labels and labels[m["key"]] == m["val"]
            if (m["op"] == "!=") == has:
                return False
        elif m["setop"]:
            vals = {v.strip() for v in m["vals"].split(",")}
            inside = m["key"] in labels and labels[m["key"]] in vals
            if m["setop"] == "in" and not inside:
                return False
            if m["setop"] == "notin" and inside:
                return False
        elif m["key"] not in labels:
            return False
    return True


def _dotted(obj: dict, path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def match_field_selector(obj: dict, selector: str | None) -> bool:
    for req in _split_selector(selector or ""):
        m = re.match(r"^\s*([\w.]+)\s*(==|=|!=)\s*(.*?)\s*$", req)
        if not m:
            raise ValueError(f"unable to parse field requirement: {req!r}")
        value = _dotted(obj, m[1])
        value = "" if value is None else str(value)
        if (m[2] == "!=") == (value == m[3]):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# quantities (only what the kubelet stand-in needs)

_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "m": 1e-3}


def parse_quantity(q: Any) -> float:
    if q is None:
        return 0
    if isinstance(q, (int, float)):
        return q
    m = re.match(r"^([0-9.]+)([A-Za-z]*)$", str(q).strip())
    if not m or m[2] not in _SUFFIX:
        raise ValueError(f"bad quantity {q!r}")
    return float(m[1]) * _SUFFIX[m[2]]


def _pod_requests(pod: dict) -> dict[str, float]:
    """Effective requests per resource (limits stand in for missing requests, as in the API)."""
    total: dict[str, float] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for k, v in merged.items():
            total[k] = total.get(k, 0) + parse_quantity(v)
    for c in (pod.get("spec") or {}).get("initContainers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        sidecar = c.get("restartPolicy") == "Always"
        for k, v in merged.items():
            # native sidecars add up; classic init containers take the max
            total[k] = total.get(k, 0) + parse_quantity(v) if sidecar else max(total.get(k, 0), parse_quantity(v))
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


# ---------------------------------------------------------------------------------------------
# the emulator

class _RecordingBus:
    """Stands in for kmock's per-resource bus: stamps each event and fans it out to watchers."""

    def __init__(self, standin: "KubeStandin", resource):
        self.standin = standin
        self.resource = resource

    async def put(self, event: dict) -> None:
        self.standin._record(self.resource, event)


class _Buses(dict):
    def __init__(self, standin):
        super().__init__()
        self.standin = standin

    def __missing__(self, resource):
        bus = self[resource] = _RecordingBus(self.standin, resource)
        return bus


@attrs.define(kw_only=True)
class KubeStandin(kmock.KubernetesEmulator):
    """kmock's emulator with the fixes listed in the module docstring."""

    kubelet_delay: float = 0.02
    _rv: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    _last_rv: int = attrs.field(default=0, init=False)
    _log: list = attrs.field(factory=list, init=False)  # (rv, resource, event)
    _watchers: list = attrs.field(factory=list, init=False)  # (resource, queue)
    _pod_ips: Any = attrs.field(factory=lambda: iter(ipaddress.ip_network("10.42.0.0/16").hosts()), init=False)
    # pod logs served at pods/<name>/log: {(namespace, pod): [(RFC 3339 nano timestamp, text), ...]}
    pod_logs: dict = attrs.field(factory=dict, init=False)
    _job_failures_seen: set = attrs.field(factory=set, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._buses = _Buses(self)
        self.resources.load_bundled()

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
        del self._log[:-2000]
        for res, queue in self._watchers:
            if res == resource:
                queue.put_nowait(event)

    def write_kubeconfig(self, path, namespace: str = "default") -> str:
        """A kubeconfig for this stand-in (same call as ``RealKube.write_kubeconfig``)."""
        return write_kubeconfig(path, str(self.url).rstrip("/"), namespace)

    def recorded_requests(self) -> list:
        """Every request served so far (kmock records them), oldest first."""
        return list(self._requests)

    def store(self, resource) -> dict[tuple[str | None, str], dict]:
        """Live objects of one resource: {(namespace, name): object}."""
        out = {}
        for (res, ns, name), obj in self._objects.items():
            if res == resource and not obj.deleted:
                out[(ns, name)] = obj.raw
        return out

    def get(self, resource, namespace, name) -> dict | None:
        return self.store(resource).get((namespace, name))

    async def mutate(self, resource, namespace: str | None, name: str, changes: dict) -> dict:
        """Merge ``changes`` into a stored object server-side (status updates) and emit MODIFIED."""
        async with self._lock:
            obj = self._objects[resource, namespace, name]
            changes = copy.deepcopy(changes)
            changes.setdefault("metadata", {})["resourceVersion"] = self._next_rv()
            obj.patch(changes)
            raw = obj.raw
            self._record(resource, {"type": "MODIFIED", "object": raw})
            return raw

    async def put_object(self, resource, obj: dict) -> dict:
        """Create an object server-side (nodes, pods of other tenants) as if POSTed."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        self._stamp_new(resource, meta.get("namespace"), obj)
        async with self._lock:
            self._objects[resource, meta.get("namespace"), meta["name"]] = obj
            self._record(resource, {"type": "ADDED", "object": obj})
        return obj

    def add_node(self, name: str, *, allocatable: dict, labels: dict | None = None,
                 taints: list | None = None, ready: bool = True, unschedulable: bool = False) -> dict:
        """Synchronous helper for fixtures: a node with the given allocatable resources."""
        node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints or [], **({"unschedulable": True} if unschedulable else {})},
            "status": {
                "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", **allocatable},
                "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", **allocatable},
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
        self._stamp_new(NODES, None, node)
        self._objects[NODES, None, name] = node
        self._record(NODES, {"type": "ADDED", "object": node})
        return node

    def _stamp_new(self, resource, url_namespace: str | None, obj: dict) -> None:
        meta = obj.setdefault("metadata", {})
        if url_namespace:
            meta["namespace"] = url_namespace  # fix: kmock keeps the object's own (often absent) namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = self._next_rv()
        meta["creationTimestamp"] = _now()
        if resource.plural == "pods":
            obj.setdefault("status", {"phase": "Pending", "conditions": []})
        elif resource.plural == "persistentvolumeclaims":
            obj.setdefault("status", {"phase": "Bound"})
        elif resource.plural == "persistentvolumes":
            obj.setdefault("status", {"phase": "Bound" if (obj.get("spec") or {}).get("claimRef") else "Available"})

    # -- request handling ----------------------------------------------------------------------

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is None:
            return await super()._handle(request)

        method = str(request.method.value if hasattr(request.method, "value") else request.method).upper()
        if method == "GET" and str(request.params.get("watch", "")).lower() in ("true", "1"):
            # fix: kubernetes-asyncio sends watch=True, kmock matches only watch=true
            return await self._stream_watch(attrs.evolve(request, action=enums.action.WATCH))

        if method == "GET" and request.subresource == "log" and request.resource == PODS:
            return self._serve_pod_log(request)  # added for the job launcher's tests
        if method == "PUT" and request.name and not request.subresource:
            return await self._serve_replace(request)
        if method == "PUT" and request.subresource == "status":
            return await self._serve_replace(request, status_only=True)
        if method == "PATCH" and request.name and request.subresource in (None, "status"):
            return await self._serve_patch(request, status_only=request.subresource == "status")

        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            if request.namespace is None and self._is_namespaced(request.resource):
                raise kmock.KubernetesError(status=400, reason="BadRequest", message="namespace required")
            self._stamp_new(request.resource, request.namespace, request.data)

        deleted_uid = None
        if request.action == enums.action.DELETE and request.name:
            current = self.get(request.resource, request.namespace, request.name)
            deleted_uid = current and current.get("metadata", {}).get("uid")

        response = await super()._handle(request)
        if deleted_uid:
            await self._collect_garbage(deleted_uid)
        return response

    def _is_namespaced(self, resource) -> bool:
        for res in self.resources:
            if res == resource:
                info = self.resources[res]
                return bool(info.namespaced)
        return True

    async def _serve_replace(self, request, status_only: bool = False) -> aiohttp.web.StreamResponse:
        async with self._lock:
            key = (request.resource, request.namespace, request.name)
            if key not in self._objects or self._objects[key].deleted:
                return self._status(404, "NotFound", f"{request.resource.plural} {request.name!r} not found")
            old = self._objects[key].raw
            new = copy.deepcopy(request.data or {})
            sent_rv = (new.get("metadata") or {}).get("resourceVersion")
            if sent_rv and sent_rv != old["metadata"].get("resourceVersion"):
                return self._status(409, "Conflict", "the object has been modified; please apply your changes to the latest version")
            if status_only:
                new = {**copy.deepcopy(old), "status": new.get("status", {})}
            meta = new.setdefault("metadata", {})
            for k in ("uid", "creationTimestamp", "namespace", "name"):
                if k in old["metadata"]:
                    meta[k] = old["metadata"][k]
            meta["resourceVersion"] = self._next_rv()
            if not status_only and "status" in old and "status" not in new:
                new["status"] = old["status"]
            self._objects[key].create(new)
            self._record(request.resource, {"type": "MODIFIED", "object": new})
        return aiohttp.web.json_response(new)

    async def _serve_patch(self, request, status_only: bool = False) -> aiohttp.web.StreamResponse:
        """Merge patch (strategic-merge bodies are treated as merge patches: lists are replaced)."""
        if not isinstance(request.data, dict):
            return self._status(415, "UnsupportedMediaType", "the stand-in supports merge patches (a JSON object) only")
        async with self._lock:
            key = (request.resource, request.namespace, request.name)
            if key not in self._objects or self._objects[key].deleted:
                return self._status(404, "NotFound", f"{request.resource.plural} {request.name!r} not found")
            changes = copy.deepcopy(request.data)
            if status_only:
                changes = {"status": changes.get("status", {})}
            changes.pop("metadata", None) if status_only else None
            meta = changes.setdefault("metadata", {})
            for k in ("uid", "creationTimestamp", "namespace", "name"):
                meta.pop(k, None)
            meta["resourceVersion"] = self._next_rv()
            self._objects[key].patch(changes)
            raw = self._objects[key].raw
            self._record(request.resource, {"type": "MODIFIED", "object": raw})
        return aiohttp.web.json_response(raw)

    @staticmethod
    def _status(code: int, reason: str, message: str) -> aiohttp.web.StreamResponse:
        return aiohttp.web.json_response({
            "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
            "code": code, "reason": reason, "message": message,
        }, status=code)

    async def _collect_garbage(self, owner_uid: str) -> None:
        """Fix: kmock has no garbage collector; delete dependents of a deleted owner."""
        doomed = []
        async with self._lock:
            for (res, ns, name), obj in list(self._objects.items()):
                if obj.deleted:
                    continue
                refs = obj.raw.get("metadata", {}).get("ownerReferences") or []
                if any(r.get("uid") == owner_uid for r in refs):
                    raw = obj.raw
                    obj.delete()
                    self._record(res, {"type": "DELETED", "object": raw})
                    doomed.append(raw["metadata"].get("uid"))
        for uid in doomed:
            if uid:
                await self._collect_garbage(uid)

    def _selected(self, request, namespace, obj) -> bool:
        if request.namespace is not None and namespace != request.namespace:
            return False
        if request.name is not None and obj.get("metadata", {}).get("name") != request.name:
            return False
        if not match_label_selector(obj.get("metadata", {}).get("labels"), request.params.get("labelSelector")):
            return False
        return match_field_selector(obj, request.params.get("fieldSelector"))

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        async with self._lock:
            items = [
                obj.raw for (res, ns, name), obj in self._objects.items()
                if res == request.resource and not obj.deleted and self._selected(request, ns, obj.raw)
            ]
            rv = str(self._last_rv)
        kind = None
        for res in self.resources:
            if res == request.resource:
                kind = self.resources[res].kind
        return {
            "apiVersion": "v1" if request.resource.group == "" else f"{request.resource.group}/{request.resource.version}",
            "kind": f"{kind or 'Object'}List",
            "metadata": {"resourceVersion": rv},
            "items": sorted(items, key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"])),
        }

    async def _stream_watch(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        try:
            async for event in self._serve_watch(request):
                if isinstance(event, dict):
                    await response.write(json.dumps(event).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        await response.write_eof()
        return response

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""  # send the headers now
        timeout = float(request.params.get("timeoutSeconds") or 0) or None
        since = request.params.get("resourceVersion")
        queue: asyncio.Queue = asyncio.Queue()
        async with self._lock:
            if since in (None, "", "0"):
                # fix: no resourceVersion = start with the current state as ADDED events
                backlog = [
                    {"type": "ADDED", "object": obj.raw} for (res, ns, name), obj in self._objects.items()
                    if res == request.resource and not obj.deleted
                ]
            else:
                backlog = [ev for rv, res, ev in self._log if res == request.resource and rv > int(since)]
            entry = (request.resource, queue)
            self._watchers.append(entry)
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
                    event = await asyncio.wait_for(queue.get(), wait)
                except asyncio.TimeoutError:
                    return
                # fix: filter on the URL's namespace (kmock filters on the object's own)
                if self._selected(request, event["object"]["metadata"].get("namespace"), event["object"]):
                    yield event
        finally:
            with contextlib.suppress(ValueError):
                self._watchers.remove(entry)

    # -- scheduler + kubelet -------------------------------------------------------------------

    async def kubelet(self) -> None:
        """Bind pending pods to nodes with room and run them; runs until cancelled."""
        queue: asyncio.Queue = asyncio.Queue()
        entry = (PODS, queue)
        self._watchers.append(entry)
        try:
            for (ns, name), pod in self.store(PODS).items():
                queue.put_nowait({"type": "ADDED", "object": pod})
            while True:
                event = await queue.get()
                if event["type"] == "DELETED":
                    # pods that did not fit may fit now
                    for (ns, name), pod in self.store(PODS).items():
                        if pod.get("status", {}).get("phase") == "Pending" and not pod["spec"].get("nodeName"):
                            await self._try_run(pod)
                    continue
                pod = event["object"]
                if pod.get("status", {}).get("phase", "Pending") == "Pending":
                    await asyncio.sleep(self.kubelet_delay)
                    current = self.get(PODS, pod["metadata"].get("namespace"), pod["metadata"]["name"])
                    if current and current["metadata"]["uid"] == pod["metadata"]["uid"]:
                        await self._try_run(current)
        finally:
            with contextlib.suppress(ValueError):
                self._watchers.remove(entry)

    def _node_for(self, pod: dict) -> str | None:
        want = {k: v for k, v in _pod_requests(pod).items() if "/" in k}  # extended resources
        used: dict[str, dict[str, float]] = {}
        for (ns, name), other in self.store(PODS).items():
            node = (other.get("spec") or {}).get("nodeName")
            if node and other.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                for k, v in _pod_requests(other).items():
                    used.setdefault(node, {})[k] = used.get(node, {}).get(k, 0) + v
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        tolerations = (pod.get("spec") or {}).get("tolerations") or []
        for (_, name), node in sorted(self.store(NODES).items()):
            labels = node["metadata"].get("labels") or {}
            if any(labels.get(k) != v for k, v in selector.items()):
                continue
            if node.get("spec", {}).get("unschedulable"):
                continue
            if not all(_tolerates(tolerations, t) for t in node.get("spec", {}).get("taints") or []):
                continue
            alloc = node.get("status", {}).get("allocatable") or {}
            if all(parse_quantity(alloc.get(k, 0)) - used.get(name, {}).get(k, 0) >= v for k, v in want.items()):
                return name
        return None

    async def _try_run(self, pod: dict) -> None:
        ns, name = pod["metadata"].get("namespace"), pod["metadata"]["name"]
        node = pod["spec"].get("nodeName") or self._node_for(pod)
        if node is None:
            await self.mutate(PODS, ns, name, {"status": {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/N nodes are available: insufficient resources.",
            }]}})
            return
        now = _now()

        def status(c, ready=True):
            return {
                "name": c["name"], "image": c.get("image", ""), "imageID": f"docker-pullable://{c.get('image', '')}",
                "ready": ready, "started": True, "restartCount": 0, "containerID": f"containerd://{uuid.uuid4().hex}",
                "state": {"running": {"startedAt": now}},
            }

        await self.mutate(PODS, ns, name, {
            "spec": {"nodeName": node},
            "status": {
                "phase": "Running", "podIP": str(next(self._pod_ips)), "hostIP": "192.168.0.10", "startTime": now,
                "conditions": [{"type": t, "status": "True", "lastTransitionTime": now}
                               for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
                "containerStatuses": [status(c) for c in pod["spec"].get("containers") or []],
                "initContainerStatuses": [status(c, c.get("restartPolicy") == "Always")
                                          for c in pod["spec"].get("initContainers") or []],
            },
        })


    # -- additions for the job launcher: pod logs, finishing pods, a Job controller -----------------

    def add_log_line(self, namespace: str, pod: str, text: str, ts: str | None = None) -> str:
        """Append a line to a pod's log (served at pods/<name>/log); returns its timestamp."""
        ts = ts or datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
        self.pod_logs.setdefault((namespace, pod), []).append((ts, text))
        return ts

    def _serve_pod_log(self, request) -> aiohttp.web.StreamResponse:
        """GET pods/<name>/log with ``timestamps`` and ``sinceSeconds`` (400 while the container waits)."""
        pod = self.get(PODS, request.namespace, request.name)
        if pod is None:
            return self._status(404, "NotFound", f"pods {request.name!r} not found")
        if not (pod.get("status") or {}).get("containerStatuses"):
            return self._status(400, "BadRequest", f"container in pod {request.name!r} is waiting to start")
        lines = self.pod_logs.get((request.namespace, request.name), [])
        since = request.params.get("sinceSeconds")
        if since:
            cutoff = (datetime.datetime.now(tz=datetime.UTC) - datetime.timedelta(seconds=int(since)))
            cutoff_s = cutoff.strftime("%Y-%m-%dT%H:%M:%S")
            lines = [(ts, t) for ts, t in lines if ts[:19] >= cutoff_s]
        stamps = str(request.params.get("timestamps", "")).lower() in ("true", "1")
        body = "".join(f"{ts} {t}\n" if stamps else f"{t}\n" for ts, t in lines)
        return aiohttp.web.Response(text=body, content_type="text/plain")

    async def finish_pod(self, namespace: str, name: str, exit_code: int = 0, *, reason: str | None = None,
                         disruption: bool = False) -> dict:
        """Play the kubelet when the worker container exits: phase Succeeded (0) or Failed."""
        pod = self.get(PODS, namespace, name)
        now = _now()
        term = {"exitCode": exit_code, "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                "startedAt": now, "finishedAt": now}
        statuses = [{**cs, "ready": False, "started": False, "state": {"terminated": term}}
                    for cs in (pod.get("status") or {}).get("containerStatuses") or []]
        conditions = [{"type": "Ready", "status": "False", "lastTransitionTime": now}]
        if disruption:
            conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                               "lastTransitionTime": now})
        return await self.mutate(PODS, namespace, name, {"status": {
            "phase": "Succeeded" if exit_code == 0 and not disruption else "Failed",
            "containerStatuses": statuses, "conditions": conditions,
        }})

    async def remove(self, resource, namespace: str | None, name: str) -> None:
        """Delete an object server-side (as a controller would), with garbage collection."""
        async with self._lock:
            key = (resource, namespace, name)
            if key not in self._objects or self._objects[key].deleted:
                return
            obj = self._objects[key]
            raw = obj.raw
            obj.delete()
            self._record(resource, {"type": "DELETED", "object": raw})
        await self._collect_garbage(raw["metadata"]["uid"])

    async def job_controller(self) -> None:
        """A small batch/v1 Job controller for Indexed Jobs; runs until cancelled.

        Creates one pod per missing index (hostname <job>-<index>, the completion-index
        annotation and label, an ownerReference), none while ``spec.suspend`` (Kueue not yet
        admitted; suspending deletes active pods), applies ``podFailurePolicy`` (Ignore on
        DisruptionTarget → replacement; FailJob on exit codes; otherwise counts against
        ``backoffLimit``), deletes the remaining pods of a failed Job, and keeps ``status``
        (active, succeeded, failed, completedIndexes, Complete/Failed conditions) current.
        Not modelled: activeDeadlineSeconds, podReplacementPolicy, backoffLimitPerIndex.
        """
        queue: asyncio.Queue = asyncio.Queue()
        entries = [(JOBS, queue), (PODS, queue)]
        self._watchers.extend(entries)
        try:
            queue.put_nowait(None)
            while True:
                await queue.get()
                while not queue.empty():
                    queue.get_nowait()
                for (ns, name), job in list(self.store(JOBS).items()):
                    try:
                        await self._reconcile_job(ns, name)
                    except KeyError:
                        pass  # deleted meanwhile
        finally:
            for entry in entries:
                with contextlib.suppress(ValueError):
                    self._watchers.remove(entry)

    def _job_pods(self, uid: str) -> list[dict]:
        return [p for p in self.store(PODS).values()
                if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]

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
                    if not term:
                        continue
                    inside = term.get("exitCode") in codes["values"]
                    if inside == (codes["operator"] == "In"):
                        return rule["action"]
        return "Count"

    async def _reconcile_job(self, ns: str, name: str) -> None:
        job = self.get(JOBS, ns, name)
        if job is None:
            return
        spec, status = job["spec"], job.get("status") or {}
        conds = {c["type"] for c in status.get("conditions") or [] if c.get("status") == "True"}
        uid = job["metadata"]["uid"]
        pods = self._job_pods(uid)
        active = [p for p in pods if p["status"].get("phase") not in ("Succeeded", "Failed")]
        if conds & {"Complete", "Failed"}:
            for p in active:
                if conds & {"Failed"}:
                    await self.remove(PODS, ns, p["metadata"]["name"])
            return
        if spec.get("suspend"):
            for p in active:
                await self.remove(PODS, ns, p["metadata"]["name"])
            if status.get("active"):
                await self.mutate(JOBS, ns, name, {"status": {"active": 0}})
            return
        completions = int(spec.get("completions") or 1)
        failed = int(status.get("failed") or 0)
        fail_reason = None
        for p in pods:
            if p["status"].get("phase") != "Failed" or p["metadata"]["uid"] in self._job_failures_seen:
                continue
            self._job_failures_seen.add(p["metadata"]["uid"])
            action = self._failure_action(job, p)
            if action == "FailJob":
                fail_reason = ("PodFailurePolicy", f"Container worker for pod {ns}/{p['metadata']['name']} failed")
            elif action == "Count":
                failed += 1
                if failed > int(spec.get("backoffLimit", 6)):
                    fail_reason = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        succeeded_idx = set()
        by_index: dict[int, list] = {}
        for p in pods:
            idx = int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
            by_index.setdefault(idx, []).append(p)
            if p["status"].get("phase") == "Succeeded":
                succeeded_idx.add(idx)
        now = _now()
        new_status = {"active": len(active), "succeeded": len(succeeded_idx), "failed": failed,
                      "completedIndexes": ",".join(str(i) for i in sorted(succeeded_idx)) or None,
                      "startTime": status.get("startTime") or now}
        if fail_reason:
            for p in active:
                await self.remove(PODS, ns, p["metadata"]["name"])
            new_status.update(active=0, conditions=[
                {"type": "FailureTarget", "status": "True", "reason": fail_reason[0], "message": fail_reason[1], "lastTransitionTime": now},
                {"type": "Failed", "status": "True", "reason": fail_reason[0], "message": fail_reason[1], "lastTransitionTime": now}])
        elif len(succeeded_idx) >= completions:
            new_status.update(completionTime=now, conditions=[
                {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                {"type": "Complete", "status": "True", "lastTransitionTime": now}])
        else:
            for idx in range(completions):
                if idx in succeeded_idx or any(p["status"].get("phase") not in ("Succeeded", "Failed") for p in by_index.get(idx, [])):
                    continue
                await self._create_job_pod(job, idx)
                new_status["active"] += 1
        if any(status.get(k) != v for k, v in new_status.items()):
            await self.mutate(JOBS, ns, name, {"status": new_status})

    async def _create_job_pod(self, job: dict, idx: int) -> None:
        tmpl = copy.deepcopy(job["spec"]["template"])
        meta, spec = tmpl.setdefault("metadata", {}), tmpl["spec"]
        jname, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        meta["name"] = f"{jname}-{idx}-{uuid.uuid4().hex[:5]}"
        meta["namespace"] = ns
        meta.setdefault("labels", {}).update({
            "batch.kubernetes.io/job-completion-index": str(idx), "batch.kubernetes.io/job-name": jname,
            "job-name": jname, "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
        })
        meta.setdefault("annotations", {})["batch.kubernetes.io/job-completion-index"] = str(idx)
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": jname,
                                    "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
        if spec.get("subdomain"):
            spec["hostname"] = f"{jname}-{idx}"
        await self.put_object(PODS, tmpl)


@contextlib.asynccontextmanager
async def standin_server(*, kubelet: bool = True, jobs: bool = False) -> AsyncIterator[KubeStandin]:
    """Run a ``KubeStandin`` on a random loopback port (``str(kube.url)``), with the kubelet task
    and, with ``jobs=True``, the Job controller task."""
    kube = KubeStandin()
    async with kube, kmock.Server(kube):
        tasks = [asyncio.create_task(kube.kubelet())] if kubelet else []
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
