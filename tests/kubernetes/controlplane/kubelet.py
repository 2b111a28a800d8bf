"""A kubelet stand-in for the real control plane: no container runs, everything above the node does.

It plays the kubelet of every Node labelled ``kubelet.trainhub.io/managed=true`` (tests create
such Nodes through the API, with the capacity they want in ``status``):

* **node status and Leases**: every ``--heartbeat`` seconds it reports the node's conditions
  (``Ready`` True, or False when the node carries the annotation
  ``kubelet.trainhub.io/ready: "false"``; no memory/disk/PID pressure), ``nodeInfo``
  (kubeletVersion v1.20.2), addresses, ``allocatable`` = ``capacity`` when the registrant gave
  none, and renews the node's Lease in ``kube-node-lease``. The node lifecycle controller
  therefore lifts the ``node.kubernetes.io/not-ready`` taint as for a real node;
* **admission** of a pod bound to one of its nodes: a pod whose requests do not fit the node's
  allocatable next to the pods already running there is refused as a real kubelet refuses it
  (phase Failed, reason ``OutOf<resource>``);
* **running** an admitted pod: init containers (classic ones run to completion), then phase
  Running, ``podIP`` (10.244.0.0/16), ``hostIP``, ``startTime``, the four conditions True and
  ready ``containerStatuses`` with image, imageID, containerID, restartCount;
* **pods that ran before**: a pod created with the annotation ``kubelet.trainhub.io/phase:
  Succeeded`` (or ``Failed``) goes straight to that phase (containers exited 0 or 1);
* **exits on request**: a pod annotated ``kubelet.trainhub.io/exit-code: "N"`` has its
  containers exit with code N, once per annotation value (``"N#2"`` asks again) (``restartPolicy`` decides: Never → Succeeded/Failed; OnFailure
  → restarted when N != 0; Always → restarted), as a training process would;
* **graceful deletion**: a pod with a ``deletionTimestamp`` gets SIGTERM; its containers exit
  with 143 at once, or — annotation ``kubelet.trainhub.io/on-sigterm: ignore`` — with 137
  when ``deletionGracePeriodSeconds`` runs out; the terminal phase is written (Failed unless
  every container exited 0), then the kubelet finishes the deletion (DELETE with
  ``gracePeriodSeconds=0`` and a UID precondition), as the real one does.

Not modelled: images, probes, volumes (nothing is mounted), eviction, resource usage, logs,
exec. The kubelet acts with an admin token (one process plays every node; see controlplane.py).

    python kubelet.py --kubeconfig PATH [--heartbeat SECONDS]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ipaddress
import json
import logging
import re
import ssl
import uuid

import aiohttp

MANAGED_LABEL = "kubelet.trainhub.io/managed"
READY_ANNOTATION = "kubelet.trainhub.io/ready"
EXIT_ANNOTATION = "kubelet.trainhub.io/exit-code"
SIGTERM_ANNOTATION = "kubelet.trainhub.io/on-sigterm"
PHASE_ANNOTATION = "kubelet.trainhub.io/phase"
KUBE_VERSION = "v1.20.2"

log = logging.getLogger("kubelet-standin")

_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "m": 1e-3,
           "u": 1e-6, "n": 1e-9}


def quantity(q) -> float:
    if q is None:
        return 0.0
    if isinstance(q, (int, float)):
        return float(q)
    m = re.match(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([A-Za-z]*)$", str(q).strip())
    if not m or m[2] not in _SUFFIX:
        raise ValueError(f"bad quantity {q!r}")
    return float(m[1]) * _SUFFIX[m[2]]


def pod_requests(pod: dict) -> dict[str, float]:
    """Effective requests of a pod, as the scheduler and kubelet count them (max of init containers)."""
    spec = pod.get("spec") or {}
    total: dict[str, float] = {"pods": 1}
    for c in spec.get("containers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[k] = total.get(k, 0) + quantity(v)
    for c in spec.get("initContainers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[k] = max(total.get(k, 0), quantity(v))
    return total


def now() -> str:
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Gone(Exception):
    """A watch answered 410: relist."""


class Kubelet:
    def __init__(self, server: str, token: str, cafile: str | None, heartbeat: float):
        self.server = server.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self.ssl = ssl.create_default_context(cafile=cafile) if cafile else False
        self.heartbeat = heartbeat
        self.nodes: dict[str, dict] = {}
        self.pods: dict[str, dict] = {}  # uid -> latest pod seen
        self.handled: dict[str, str] = {}  # uid -> what we did last ("running", "terminal", ...)
        self.busy: set[str] = set()
        self.ips = iter(ipaddress.ip_network("10.244.0.0/16").hosts())
        self.session: aiohttp.ClientSession | None = None
        self.wake = asyncio.Event()

    # -- HTTP ----------------------------------------------------------------------------------

    async def call(self, method: str, path: str, body=None, *, ctype="application/json", ok=(200, 201)):
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.server + path, data=data, ssl=self.ssl,
                                        headers={**self.headers, "Content-Type": ctype}) as resp:
            text = await resp.text()
            if resp.status not in ok:
                raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status, message=text[:500])
            return json.loads(text) if text else None

    async def list_watch(self, path: str, params: str, on_event) -> None:
        """List then watch ``path`` forever, relisting after 410 Gone or a dropped stream."""
        while True:
            try:
                listing = await self.call("GET", f"{path}?{params}")
                seen = set()
                for item in listing["items"]:
                    seen.add(item["metadata"]["uid"])
                    await on_event("ADDED", item)
                await on_event("SYNC", seen)
                rv = listing["metadata"]["resourceVersion"]
                while True:
                    rv = await self._watch(path, params, rv, on_event)
            except Gone:
                log.info("watch %s: 410 Gone, relisting", path)
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
                log.warning("watch %s: %s; relisting", path, e)
                await asyncio.sleep(0.5)

    async def _watch(self, path, params, rv, on_event) -> str:
        url = f"{self.server}{path}?{params}&watch=1&resourceVersion={rv}&timeoutSeconds=60&allowWatchBookmarks=true"
        async with self.session.get(url, ssl=self.ssl, headers=self.headers,
                                    timeout=aiohttp.ClientTimeout(total=None, sock_read=120)) as resp:
            if resp.status == 410:
                raise Gone()
            if resp.status != 200:
                raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status)
            async for line in resp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise aiohttp.ClientError(str(obj))
                rv = obj["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    await on_event(event["type"], obj)
        return rv

    # -- nodes -----------------------------------------------------------------------------------

    async def on_node(self, kind: str, node) -> None:
        if kind == "SYNC":
            for name in [n for n, obj in self.nodes.items() if obj["metadata"]["uid"] not in node]:
                self.nodes.pop(name, None)
            return
        name = node["metadata"]["name"]
        if kind == "DELETED":
            self.nodes.pop(name, None)
            return
        first = name not in self.nodes
        self.nodes[name] = node
        if first:
            await self.report_node(name)
            self.wake.set()

    async def report_node(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            return
        status = node.get("status") or {}
        ready = (node["metadata"].get("annotations") or {}).get(READY_ANNOTATION, "true").lower() != "false"
        t = now()

        def cond(type_, value, reason, message):
            return {"type": type_, "status": value, "reason": reason, "message": message,
                    "lastHeartbeatTime": t, "lastTransitionTime": t}
        old = {c["type"]: c for c in status.get("conditions") or []}
        conditions = [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            cond("Ready", "True" if ready else "False", "KubeletReady" if ready else "KubeletNotReady",
                 "kubelet is posting ready status" if ready else "container runtime network not ready (stand-in)"),
        ]
        for c in conditions:  # lastTransitionTime moves only when the status changes
            if c["type"] in old and old[c["type"]].get("status") == c["status"]:
                c["lastTransitionTime"] = old[c["type"]].get("lastTransitionTime") or t
        capacity = status.get("capacity") or {"cpu": "32", "memory": "256Gi", "pods": "110"}
        patch = {"status": {
            "conditions": conditions,
            "capacity": capacity,
            "allocatable": status.get("allocatable") or capacity,
            "addresses": [{"type": "InternalIP", "address": self.host_ip(name)}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": uuid.uuid5(uuid.NAMESPACE_DNS, name).hex, "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
                         "bootID": "standin", "kernelVersion": "6.1.0", "osImage": "kubelet stand-in (no containers)",
                         "containerRuntimeVersion": "standin://0", "kubeletVersion": KUBE_VERSION,
                         "kubeProxyVersion": KUBE_VERSION, "operatingSystem": "linux", "architecture": "amd64"},
        }}
        try:
            self.nodes[name] = await self.call("PATCH", f"/api/v1/nodes/{name}/status", patch,
                                               ctype="application/strategic-merge-patch+json")
        except aiohttp.ClientResponseError as e:
            if e.status != 404:
                raise
        await self.renew_lease(name)

    async def renew_lease(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            return
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro_now()}
        try:
            await self.call("PATCH", path, {"spec": spec}, ctype="application/merge-patch+json")
        except aiohttp.ClientResponseError as e:
            if e.status != 404:
                raise
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": name, "namespace": "kube-node-lease", "ownerReferences": [
                         {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}]},
                     "spec": spec}
            await self.call("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", lease, ok=(201, 409))

    def host_ip(self, name: str) -> str:
        names = sorted(self.nodes)
        return f"172.31.0.{(names.index(name) if name in names else 0) + 10}"

    async def heartbeats(self) -> None:
        while True:
            for name in list(self.nodes):
                try:
                    await self.report_node(name)
                except Exception as e:  # noqa: BLE001 - keep beating for the other nodes
                    log.warning("heartbeat %s: %s", name, e)
            await asyncio.sleep(self.heartbeat)

    # -- pods ------------------------------------------------------------------------------------

    async def on_pod(self, kind: str, pod) -> None:
        if kind == "SYNC":
            for uid in [u for u in self.pods if u not in pod]:
                self.pods.pop(uid, None)
                self.handled.pop(uid, None)
            return
        uid = pod["metadata"]["uid"]
        if kind == "DELETED":
            self.pods.pop(uid, None)
            self.handled.pop(uid, None)
            return
        self.pods[uid] = pod
        self.wake.set()

    async def reconcile_loop(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            for uid, pod in list(self.pods.items()):
                if uid in self.busy or pod["spec"].get("nodeName") not in self.nodes:
                    continue
                self.busy.add(uid)
                asyncio.create_task(self._sync_pod(uid))

    async def _sync_pod(self, uid: str) -> None:
        try:
            pod = self.pods.get(uid)
            if pod is not None:
                await self.sync_pod(pod)
        except aiohttp.ClientResponseError as e:
            if e.status not in (404, 409):
                log.warning("pod %s: %s", uid, e)
        except Exception:  # noqa: BLE001
            log.exception("pod %s", uid)
        finally:
            self.busy.discard(uid)
            if self.pods.get(uid) is not pod:
                self.wake.set()  # changed while we worked

    def _path(self, pod: dict) -> str:
        return f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"

    async def sync_pod(self, pod: dict) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        uid = meta["uid"]
        phase = status.get("phase", "Pending")
        annotations = meta.get("annotations") or {}
        if meta.get("deletionTimestamp"):
            if self.handled.get(uid) == "deleting":
                return
            self.handled[uid] = "deleting"
            await self.terminate(pod, graceful=True)
            return
        if phase in ("Succeeded", "Failed"):
            return
        if phase == "Pending" and self.handled.get(uid) is None:
            self.handled[uid] = "admitting"
            refusal = self.admit(pod)
            if refusal:
                reason, message = refusal
                await self.put_status(pod, {"phase": "Failed", "reason": reason, "message": message, "startTime": now()})
                return
            if annotations.get(PHASE_ANNOTATION) in ("Succeeded", "Failed"):
                await self.start(pod, running=False)
                pod = self.pods.get(uid, pod)
                await self.exit_containers(pod, 0 if annotations[PHASE_ANNOTATION] == "Succeeded" else 1, restart=False)
                self.handled[uid] = "terminal"
                return
            await self.start(pod)
            self.handled[uid] = "running"
            return
        request = annotations.get(EXIT_ANNOTATION)
        if phase == "Running" and request is not None and self.handled.get(uid) != f"exited:{request}":
            self.handled[uid] = f"exited:{request}"
            await self.exit_containers(pod, int(request.split("#")[0]))

    def admit(self, pod: dict):
        node = self.nodes[pod["spec"]["nodeName"]]
        alloc = {k: quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
        used: dict[str, float] = {}
        for other in self.pods.values():
            if other is pod or other["metadata"]["uid"] == pod["metadata"]["uid"]:
                continue
            if other["spec"].get("nodeName") != pod["spec"]["nodeName"]:
                continue
            if self.handled.get(other["metadata"]["uid"]) not in ("running",) and not str(
                    self.handled.get(other["metadata"]["uid"], "")).startswith("exited"):
                continue
            if (other.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            for k, v in pod_requests(other).items():
                used[k] = used.get(k, 0) + v
        for k, v in pod_requests(pod).items():
            if v and used.get(k, 0) + v > alloc.get(k, 0) + 1e-9:
                name = k.split("/")[-1] if k in ("cpu", "memory", "pods") else k
                return (f"OutOf{name}", f"Node didn't have enough resource: {k}, requested: {v:g}, "
                        f"used: {used.get(k, 0):g}, capacity: {alloc.get(k, 0):g}")
        return None

    @staticmethod
    def _container_status(c: dict, state: dict, *, ready: bool, restarts: int = 0, last: dict | None = None) -> dict:
        image = c.get("image", "")
        out = {"name": c["name"], "image": image, "imageID": f"docker-pullable://{image}@sha256:{'0' * 64}",
               "containerID": f"containerd://{uuid.uuid4().hex}", "ready": ready, "restartCount": restarts,
               "started": "running" in state, "state": state}
        out["lastState"] = last or {}
        return out

    async def put_status(self, pod: dict, status: dict) -> None:
        # the whole object: a 1.20 apiserver takes labels and annotations from a status update's body too
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"],
                "spec": pod["spec"], "status": {**(pod.get("status") or {}), **status}}
        for attempt in range(5):
            try:
                updated = await self.call("PUT", self._path(pod) + "/status", body)
                self.pods[pod["metadata"]["uid"]] = updated
                return
            except aiohttp.ClientResponseError as e:
                if e.status != 409 or attempt == 4:
                    raise
                fresh = await self.call("GET", self._path(pod))
                if fresh["metadata"]["uid"] != pod["metadata"]["uid"]:
                    return
                pod = fresh
                body["metadata"] = fresh["metadata"]
                body["spec"] = fresh["spec"]
                body["status"] = {**(fresh.get("status") or {}), **status}

    async def start(self, pod: dict, running: bool = True) -> None:
        t = now()
        node = pod["spec"]["nodeName"]
        ip = str(next(self.ips))
        init = [self._container_status(c, {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": t, "finishedAt": t}},
                                       ready=True) for c in pod["spec"].get("initContainers") or []]
        running = [self._container_status(c, {"running": {"startedAt": t}}, ready=True)
                   for c in pod["spec"].get("containers") or []]
        status = {
            "phase": "Running", "hostIP": self.host_ip(node), "podIP": ip, "podIPs": [{"ip": ip}], "startTime": t,
            "qosClass": (pod.get("status") or {}).get("qosClass") or "BestEffort",
            "conditions": [{"type": k, "status": "True", "lastProbeTime": None, "lastTransitionTime": t}
                           for k in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
            "containerStatuses": running,
        }
        if init:
            status["initContainerStatuses"] = init
        if not running:
            # a pod that ran before (annotation kubelet.trainhub.io/phase): keep the status in memory only
            pod["status"] = {**(pod.get("status") or {}), **status}
            return
        await self.put_status(pod, status)

    def _exit_state(self, code: int, reason: str | None = None) -> dict:
        t = now()
        return {"terminated": {"exitCode": code, "reason": reason or ("Completed" if code == 0 else "Error"),
                               "startedAt": t, "finishedAt": t, "containerID": f"containerd://{uuid.uuid4().hex}"}}

    async def exit_containers(self, pod: dict, code: int, restart: bool | None = None) -> None:
        policy = pod["spec"].get("restartPolicy", "Always")
        old = {c["name"]: c for c in (pod.get("status") or {}).get("containerStatuses") or []}
        if restart is None:
            restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        statuses = []
        for c in pod["spec"].get("containers") or []:
            prev = old.get(c["name"], {})
            if restart:
                statuses.append(self._container_status(c, {"running": {"startedAt": now()}}, ready=True,
                                                       restarts=prev.get("restartCount", 0) + 1, last=self._exit_state(code)))
            else:
                statuses.append(self._container_status(c, self._exit_state(code), ready=False,
                                                       restarts=prev.get("restartCount", 0)))
        t = now()
        if restart:
            await self.put_status(pod, {"containerStatuses": statuses})
            return
        await self.put_status(pod, {
            "phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": statuses,
            "conditions": [{"type": k, "status": "False" if k in ("Ready", "ContainersReady") else "True",
                            "lastProbeTime": None, "lastTransitionTime": t,
                            **({"reason": "PodCompleted"} if k in ("Ready", "ContainersReady") else {})}
                           for k in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]})

    async def terminate(self, pod: dict, graceful: bool) -> None:
        meta = pod["metadata"]
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if phase not in ("Succeeded", "Failed") and (pod.get("status") or {}).get("containerStatuses"):
            ignore = (meta.get("annotations") or {}).get(SIGTERM_ANNOTATION, "").lower() == "ignore"
            if ignore:
                await asyncio.sleep(float(meta.get("deletionGracePeriodSeconds") or 0))
                code, reason = 137, "Error"
            else:
                code, reason = 143, "Error"
            fresh = await self.call("GET", self._path(pod))
            if fresh["metadata"]["uid"] != meta["uid"]:
                return
            statuses = [self._container_status(c, self._exit_state(code, reason), ready=False,
                                               restarts=cs.get("restartCount", 0))
                        for c, cs in zip(fresh["spec"].get("containers") or [],
                                         (fresh.get("status") or {}).get("containerStatuses") or [{}] * 99)]
            t = now()
            await self.put_status(fresh, {
                "phase": "Failed", "containerStatuses": statuses,
                "conditions": [{"type": k, "status": "False" if k in ("Ready", "ContainersReady") else "True",
                                "lastProbeTime": None, "lastTransitionTime": t}
                               for k in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]})
        # the kubelet's final word: delete now, only this incarnation of the pod
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta["uid"]}}
        await self.call("DELETE", self._path(pod), body, ok=(200, 202, 404, 409))

    # -- main ------------------------------------------------------------------------------------

    async def run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as self.session:
            await asyncio.gather(
                self.list_watch("/api/v1/nodes", f"labelSelector={MANAGED_LABEL}%3Dtrue", self.on_node),
                self.list_watch("/api/v1/pods", "fieldSelector=spec.nodeName%21%3D", self.on_pod),
                self.heartbeats(),
                self.reconcile_loop(),
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--heartbeat", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    with open(args.kubeconfig) as f:
        config = json.load(f)
    cluster = config["clusters"][0]["cluster"]
    token = config["users"][0]["user"]["token"]
    asyncio.run(Kubelet(cluster["server"], token, cluster.get("certificate-authority"), args.heartbeat).run())


if __name__ == "__main__":
    main()
