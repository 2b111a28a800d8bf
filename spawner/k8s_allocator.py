"""The GPU ledger on Kubernetes: ``KubernetesGPUAllocator``, derived from cluster state.

The local ledger is a database table; on a cluster the truth is in the API server. This
allocator reads two shared list-and-watch caches (``trainhub.kube.reflector.NodeReflector`` and
``GPUPodReflector``: one per process, never a list per call) and answers the
``GPUAllocator`` contract from them:

* ``devices()``: one virtual ``GPUDevice`` per allocatable unit of the configured GPU
  resources on every Ready, schedulable node the pool's node selector and tolerations
  accept, indexed in (node name, resource, slot) order;
* ``holdings()``: active notebook pods (KubeSpawner's ``component=singleuser-server`` and
  ``hub.jupyter.org/username``/``servername``) and trainhub job pods (label
  ``trainhub.io/job-id``, annotation ``trainhub.io/username``) that request those resources,
  as ``server:<user>/<name>`` and ``job:<id>`` holdings on slots of their node (a pod keeps its
  slots while it lives), plus reservations made by ``allocate()`` whose pods do not exist yet;
* ``allocate()``: the quota check and the capacity check (free slots minus the demand of
  unbound GPU pods; with ``per_worker``, every worker must fit on one node) and the
  reservation are one step under a lock, so two admissions in this process cannot both take
  the last GPUs; the reservation is replaced by the holder's pods as they appear;
* ``reconcile()``: drops reservations whose pods never came (``reservation_timeout``).

Holdings outside the pool (a pod on a cordoned node, an unbound pod) get negative device
indices: they count for quotas and the culler but are not devices of the pool.

The caches run on an event loop of their own in a daemon thread, because the contract is
synchronous and its callers use it from the event loop (``devices()``) and from worker
threads (``holdings()``, ``allocate()`` through ``asyncio.to_thread``). Kubernetes modules
are imported only when the caches start, so importing this module needs no
kubernetes-asyncio.

Limit: the lock is per process. The hub's ``GPUKubeSpawner`` and the jobs service admit
separately; between an admission in one process and its pod reaching the other's cache
(normally well under a second) both may pass. The Kubernetes scheduler never over-commits a
node: the late pod stays Pending until GPUs are free.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Mapping

from traitlets import Bool, Dict, Float, Instance, List, Unicode, default

from trainhub.exceptions import InvalidRequest, NoFreeGPUs, TrainhubError
from trainhub.fmt import as_utc
from trainhub.gpus import GPUDevice
from trainhub.ledger import GPUAllocator, Holding, _model_ok, job_holder, server_holder
from trainhub.metrics.prometheus import GPUTarget, PrometheusDCGMSource
from trainhub.profiles import Profile, ProfileCatalog
from trainhub.quotas import Demand, QuotaPolicy
from trainhub.spawner import k8s_manifests as m

# KubeSpawner's pod labels and annotations (kubespawner.spawner._build_pod_labels/_annotations)
COMPONENT_LABELS = ("component", "app.kubernetes.io/component")
NOTEBOOK_COMPONENT = "singleuser-server"
SERVERNAME_ANNOTATION = "hub.jupyter.org/servername"
JOB_ID_LABEL = "trainhub.io/job-id"  # k8s_job_manifests.JOB_ID_LABEL (kept import-light)
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU feature discovery
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB


@dataclass
class Reservation:
    holder: str
    kind: str
    user: str
    profile: str | None
    devices: list[int]
    since: datetime
    created: float = field(default_factory=time.monotonic)


@dataclass
class Ledger:
    """One computed view of the cluster: pool slots, who holds what, free slots, pending demand."""

    devices: list[GPUDevice]
    slots: list[tuple[str, str, int]]  # index -> (node, resource, slot)
    holdings: list[Holding]
    occupied: set[int]  # pool indices taken by any pod (trainhub's or not) or a reservation
    pending: Counter  # resource -> units wanted by unbound active pods
    targets: dict[int, GPUTarget]
    pod_holders: Counter  # holder -> GPUs its active pods request


# ---------------------------------------------------------------------------------------------
# pure parts (inputs: object dicts as the caches hold them)

def pod_holder(pod: Mapping) -> tuple[str, str, str] | None:
    """(kind, holder, user) of a trainhub notebook or job pod, None for anything else."""
    meta = pod.get("metadata") or {}
    labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}
    if labels.get(JOB_ID_LABEL):
        user = ann.get(m.JOB_USER_ANNOTATION) or ann.get(m.NOTEBOOK_USER_ANNOTATION)
        return ("job", job_holder(labels[JOB_ID_LABEL]), user) if user else None
    notebook = any(labels.get(k) == NOTEBOOK_COMPONENT for k in COMPONENT_LABELS)
    user = ann.get(m.NOTEBOOK_USER_ANNOTATION)
    if user and (notebook or not ann.get(m.JOB_USER_ANNOTATION)):
        return "server", server_holder(user, ann.get(SERVERNAME_ANNOTATION) or ""), user
    user = ann.get(m.JOB_USER_ANNOTATION)
    if user:  # a job pod without trainhub's job label (made by hand or another tool)
        return "job", f"job:{meta.get('namespace')}/{meta.get('name')}", user
    return None


def _parse_time(value: str | None) -> datetime:
    if not value:
        return datetime.now(timezone.utc)
    dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return as_utc(dt)


def pod_since(pod: Mapping) -> datetime:
    return _parse_time((pod.get("status") or {}).get("startTime") or (pod.get("metadata") or {}).get("creationTimestamp"))


def pool_nodes(nodes: Iterable[Mapping], resources: Iterable[str], node_selector: Mapping | None,
               tolerations: Iterable[Mapping]) -> dict[str, Mapping]:
    """Ready, schedulable nodes the selector and tolerations accept that offer any of ``resources``."""
    out = {}
    for node in nodes:
        alloc = (node.get("status") or {}).get("allocatable") or {}
        if not any(m.parse_quantity(alloc.get(r)) > 0 for r in resources):
            continue
        if m.node_is_ready(node) and m.node_accepts(node, node_selector, tolerations):
            out[node["metadata"]["name"]] = node
    return dict(sorted(out.items()))


def pool_devices(nodes: Mapping[str, Mapping], resources: Iterable[str]) -> tuple[list[GPUDevice], list[tuple[str, str, int]]]:
    """Virtual devices, one per allocatable unit, indexed in (node name, resource, slot) order."""
    devices, slots = [], []
    for name, node in sorted(nodes.items()):
        labels = (node.get("metadata") or {}).get("labels") or {}
        alloc = (node.get("status") or {}).get("allocatable") or {}
        for resource in sorted(set(resources)):
            n = int(m.parse_quantity(alloc.get(resource)))
            product = labels.get(GPU_PRODUCT_LABEL) if resource == m.DEFAULT_GPU_RESOURCE else None
            try:
                memory = int(labels.get(GPU_MEMORY_LABEL) or 0) if product else 0
            except ValueError:
                memory = 0
            for slot in range(n):
                index = len(devices)
                devices.append(GPUDevice(
                    index=index, name=f"{product or resource} on {name}", uuid=f"k8s://{name}/{resource}/{slot}",
                    memory_total_mb=memory,
                ))
                slots.append((name, resource, slot))
    return devices, slots


def compute_ledger(nodes: Iterable[Mapping], pods: Iterable[Mapping], *, resources: list[str],
                   node_selector: Mapping | None, tolerations: list, reservations: Mapping[str, Reservation],
                   memo: dict) -> Ledger:
    """Pool, holdings and occupancy from cached nodes and pods plus this process's reservations.

    ``memo`` ({pod uid: (node, {resource: [slots]})}) keeps a pod on the slots it was given
    first; it is pruned to the pods seen here.
    """
    nodes = list(nodes)
    pool = pool_nodes(nodes, resources, node_selector, tolerations)
    devices, slots = pool_devices(pool, resources)
    index_of = {s: i for i, s in enumerate(slots)}
    all_nodes = {n["metadata"]["name"]: n for n in nodes}
    capacity = {(name, r): int(m.parse_quantity(((node.get("status") or {}).get("allocatable") or {}).get(r)))
                for name, node in all_nodes.items() for r in resources}
    taken: dict[tuple[str, str], set[int]] = defaultdict(set)
    active = []
    for pod in pods:
        if not m.pod_is_active(pod):
            continue
        want = {r: m.pod_request(pod, r) for r in resources}
        if any(want.values()):
            active.append((pod, want))
    seen = set()
    # pods keep the slots they had; new pods take the lowest free slots, oldest first
    def order(item):
        pod = item[0]
        meta = pod.get("metadata") or {}
        return (meta.get("uid") not in memo, meta.get("creationTimestamp") or "", meta.get("namespace") or "", meta.get("name") or "")

    placed = []  # (pod, want, node, {resource: [slot]})
    for pod, want in sorted(active, key=order):
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        uid, node = meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}", spec.get("nodeName")
        seen.add(uid)
        got: dict[str, list[int]] = {}
        if node:
            old_node, old = memo.get(uid, (None, {}))
            for r, n in want.items():
                if not n:
                    continue
                keep = [s for s in old.get(r, []) if s not in taken[node, r]][:n] if old_node == node else []
                free = (s for s in range(capacity.get((node, r), 0)) if s not in taken[node, r] and s not in keep)
                mine = keep + [s for _, s in zip(range(n - len(keep)), free)]
                taken[node, r].update(mine)
                got[r] = mine
            memo[uid] = (node, got)
        placed.append((pod, want, node, got))
    for uid in set(memo) - seen:
        del memo[uid]

    occupied = {index_of[(node, r, s)] for (node, r), ss in taken.items() for s in ss if (node, r, s) in index_of}
    pending: Counter = Counter()
    holdings, targets = [], {}
    pod_holders: Counter = Counter()
    outside = iter(range(-1, -10**9, -1))  # indices of GPUs outside the pool
    for pod, want, node, got in placed:
        meta = pod.get("metadata") or {}
        if not node:
            for r, n in want.items():
                pending[r] += n
        owner = pod_holder(pod)
        if owner is None:
            continue
        kind, holder, user = owner
        profile = ((meta.get("annotations") or {}).get(m.PROFILE_ANNOTATION)
                   or (meta.get("labels") or {}).get(m.PROFILE_LABEL))
        since = pod_since(pod)
        devs = []
        for r in sorted(want):
            if not want[r]:
                continue
            ss = got.get(r) or []
            devs += [index_of.get((node, r, s), None) for s in ss]
            devs += [None] * (want[r] - len(ss))
        devs = [d if d is not None else next(outside) for d in devs]
        pod_holders[holder] += len(devs)
        for slot, d in enumerate(devs):
            holdings.append(Holding(d, holder, kind, user, profile, since))
            targets[d] = GPUTarget(meta.get("namespace") or "", meta.get("name") or "", slot)

    # reservations: the part of each not yet covered by its holder's pods
    for holder, res in sorted(reservations.items()):
        remaining = len(res.devices) - pod_holders.get(holder, 0)
        if remaining <= 0:
            continue
        mine = [d for d in res.devices if d not in occupied]
        mine += [d.index for d in devices if d.index not in occupied and d.index not in mine]
        mine = mine[:remaining]
        mine += [next(outside) for _ in range(remaining - len(mine))]
        for d in mine:
            occupied.add(d)
            holdings.append(Holding(d, holder, res.kind, res.user, res.profile, res.since))
    holdings.sort(key=lambda h: (h.device < 0, abs(h.device)))
    return Ledger(devices, slots, holdings, occupied, pending, targets, pod_holders)


def place_workers(free_by_node: Mapping[str, list[int]], workers: int, per_worker: int) -> list[int] | None:
    """Devices for ``workers`` gangs of ``per_worker`` units, each on one node (fullest node first), or None."""
    free = {n: list(ds) for n, ds in free_by_node.items()}
    chosen = []
    for _ in range(workers):
        fits = [n for n, ds in free.items() if len(ds) >= per_worker]
        if not fits:
            return None
        # best fit: the node with the fewest free units that still fits keeps big holes for big asks
        node = min(fits, key=lambda n: (len(free[n]), n))
        chosen += free[node][:per_worker]
        free[node] = free[node][per_worker:]
    return chosen


# ---------------------------------------------------------------------------------------------
# the caches, on an event loop of their own

class _Caches:
    """Node and pod reflectors running on a daemon thread's event loop."""

    def __init__(self, allocator: "KubernetesGPUAllocator"):
        self.allocator = allocator
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.nodes = self.pods = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="trainhub-k8s-ledger", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._main())
        finally:
            # kubespawner's shared client (no kubeconfig given) leaves a task that closes it when cancelled
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _main(self) -> None:
        from trainhub.kube.reflector import GPUPodReflector, NodeReflector

        a = self.allocator
        self._stop = asyncio.Event()
        api_client = None
        try:
            api = None
            if a.kubeconfig:
                from kubernetes_asyncio import client, config

                cfg = client.Configuration()
                await config.load_kube_config(config_file=a.kubeconfig, client_configuration=cfg)
                api_client = client.ApiClient(configuration=cfg)
                api = client.CoreV1Api(api_client)
            else:
                from kubespawner.clients import load_config

                await asyncio.to_thread(load_config)  # in-cluster ServiceAccount, else $KUBECONFIG
            self.nodes = NodeReflector(parent=a, omit_namespace=True, api=api)
            self.pods = GPUPodReflector(parent=a, namespace=a.namespace, omit_namespace=a.watch_all_namespaces, api=api)
            await asyncio.gather(self.nodes.start(), self.pods.start())
        except BaseException as e:  # noqa: BLE001 - reported to every caller
            self.error = e
            a.log.error("GPU ledger: cannot watch nodes and pods (%s); the Kubernetes ledger is unavailable", e)
            self.ready.set()
            if api_client is not None:
                await api_client.close()
            return
        self.ready.set()
        await self._stop.wait()
        await asyncio.gather(self.nodes.stop(), self.pods.stop(), return_exceptions=True)
        if api_client is not None:
            await api_client.close()

    def snapshot(self, timeout: float) -> tuple[list[dict], list[dict]]:
        if not self.ready.wait(timeout):
            raise RuntimeError(f"GPU ledger: the node and pod caches did not load within {timeout:g}s")
        if self.error is not None:
            raise RuntimeError(f"GPU ledger: the node and pod caches failed: {self.error}")
        # list() of a dict view runs under the GIL: a consistent copy while the watch thread writes
        return list(self.nodes.resources.values()), list(self.pods.resources.values())

    def close(self, timeout: float = 10) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)


class KubernetesGPUAllocator(GPUAllocator):
    """The GPU ledger from the cluster's nodes and pods (see the module docstring).

    Select it with ``c.JobsService.allocator_class`` and ``c.GPUCuller.allocator_class`` =
    ``"trainhub.spawner.k8s_allocator.KubernetesGPUAllocator"`` (the Helm chart does it through
    ``config_from_chart``). Needs list/watch on nodes and on pods (all namespaces, or
    ``namespace`` with ``watch_all_namespaces = False``).
    """

    gpu_resources = List(
        Unicode(),
        help="""Resource names whose units are the pool's devices and count as held GPUs. Empty (default):
        nvidia.com/gpu plus every profile's gpu_resource (a MIG slice is one unit), as the spawner's quota.""",
    ).tag(config=True)

    node_selector = Dict(help="Only nodes with these labels are in the pool ({} = any node).").tag(config=True)

    tolerations = List(
        Dict(), default_value=None, allow_none=True,
        help="""Taints of pool nodes must be tolerated by these, e.g. [{"key": "nvidia.com/gpu", "operator":
        "Exists", "effect": "NoSchedule"}]. None (default): the tolerations of every GPU profile, so nodes some
        profile may land on count; [] = untainted nodes only.""",
    ).tag(config=True)

    namespace = Unicode(
        "default",
        help="Namespace whose pods count when watch_all_namespaces is False (the jobs' and notebooks' namespace).",
    ).tag(config=True)

    watch_all_namespaces = Bool(
        True,
        help="""Watch pods of every namespace (needs a ClusterRole with list/watch on pods). False: only `namespace`,
        so GPUs used in other namespaces look free.""",
    ).tag(config=True)

    kubeconfig = Unicode(
        "", help="kubeconfig file. Empty: the in-cluster ServiceAccount, else $KUBECONFIG / ~/.kube/config.",
    ).tag(config=True)

    reservation_timeout = Float(
        300.0,
        help="""Seconds an admission (allocate) is counted while none of its pods exists; reconcile() drops it
        afterwards. Cover image pulls and Kueue admission delays, not the whole run (pods take over).""",
    ).tag(config=True)

    cache_timeout = Float(
        30.0, help="Seconds a call waits for the first list of nodes and pods before it fails.",
    ).tag(config=True)

    catalog = Instance(ProfileCatalog, help="Profiles (c.ProfileCatalog): a job's GPU resource, node selector and tolerations.")

    @default("catalog")
    def _catalog_default(self):
        return ProfileCatalog(parent=self)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._lock = threading.RLock()
        self._reservations: dict[str, Reservation] = {}
        self._memo: dict = {}
        self._caches: _Caches | None = None
        self._start_lock = threading.Lock()

    # -- configuration ------------------------------------------------------------------

    def _profiles(self) -> list[Profile]:
        try:
            return self.catalog.all()
        except Exception:  # no profiles configured
            return []

    def resources(self) -> list[str]:
        if self.gpu_resources:
            return sorted(set(self.gpu_resources))
        return sorted({m.DEFAULT_GPU_RESOURCE} | {p.gpu_resource for p in self._profiles() if p.gpus})

    def pool_tolerations(self) -> list[dict]:
        if self.tolerations is not None:
            return list(self.tolerations)
        out = []
        for p in self._profiles():
            for t in p.tolerations if p.gpus else ():
                if dict(t) not in out:
                    out.append(dict(t))
        return out

    # -- caches ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the node and pod caches (on first use otherwise)."""
        with self._start_lock:
            if self._caches is None:
                self._caches = _Caches(self)

    def close(self) -> None:
        """Stop the caches (the allocator is not used afterwards)."""
        with self._start_lock:
            caches, self._caches = self._caches, None
        if caches is not None:
            caches.close()

    def _ledger(self) -> Ledger:
        self.start()
        nodes, pods = self._caches.snapshot(self.cache_timeout)
        with self._lock:
            return compute_ledger(
                nodes, pods, resources=self.resources(), node_selector=self.node_selector,
                tolerations=self.pool_tolerations(), reservations=dict(self._reservations), memo=self._memo,
            )

    # -- the contract ----------------------------------------------------------------------

    def devices(self) -> list[GPUDevice]:
        return self._ledger().devices

    def holdings(self) -> list[Holding]:
        return self._ledger().holdings

    def free_devices(self, gpu_model: str | None = None) -> list[GPUDevice]:
        ledger = self._ledger()
        return [d for d in ledger.devices if d.index not in ledger.occupied and _model_ok(d, gpu_model)]

    def allocate(self, holder, *, kind, user, count, profile=None, gpu_model=None, quota: QuotaPolicy | None = None,
                 user_groups=(), group_members=None, per_worker: int | None = None):
        """Admit ``count`` GPUs for ``holder`` (see the module docstring).

        ``per_worker``: GPUs of each pod of a gang (count = workers x per_worker); each must fit
        on one node. None: only the total is checked.
        """
        if count < 0:
            raise InvalidRequest(f"GPU count must be 0 or more, not {count}")
        self.start()
        try:
            nodes, pods = self._caches.snapshot(self.cache_timeout)
        except RuntimeError as e:
            raise NoFreeGPUs(f"The GPU inventory is unavailable ({e}); try again shortly.", requested=count) from None
        prof = None
        if profile:
            try:
                prof = self.catalog.get(profile)
            except TrainhubError:
                prof = None
        with self._lock:
            # re-allocation for the same holder (a retry) replaces what it had; kept if this one fails
            previous = self._reservations.pop(holder, None)
            if count == 0:
                return []
            try:
                chosen = self._admit(holder, nodes, pods, prof, kind=kind, user=user, count=count, profile=profile,
                                     gpu_model=gpu_model, quota=quota, user_groups=user_groups,
                                     group_members=group_members, per_worker=per_worker)
            except BaseException:
                if previous is not None:
                    self._reservations[holder] = previous
                raise
        self.log.info("GPU allocate holder=%s user=%s devices=%s (reserved until its pods appear)", holder, user, chosen)
        return chosen

    def _admit(self, holder, nodes, pods, prof, *, kind, user, count, profile, gpu_model, quota, user_groups,
               group_members, per_worker) -> list[int]:
        """The checks and the reservation; runs under ``self._lock``."""
        ledger = compute_ledger(
            nodes, pods, resources=self.resources(), node_selector=self.node_selector,
            tolerations=self.pool_tolerations(), reservations=self._reservations, memo=self._memo,
        )
        if quota is not None:
            per_user = Counter(h.user for h in ledger.holdings)
            quota.admit(Demand(user, tuple(user_groups), 1, count, kind),
                        quota.status(user, user_groups, per_user, group_members or {}))
        pool = self._pool_for(ledger, nodes, prof, gpu_model)
        free = [d for d in pool if d.index not in ledger.occupied]
        resource = prof.gpu_resource if prof else m.DEFAULT_GPU_RESOURCE
        # unbound pods the scheduler will place first
        usable = max(len(free) - ledger.pending.get(resource, 0), 0)
        what = f"{gpu_model} GPUs" if gpu_model else "GPUs"
        if usable < count:
            if len(pool) < count:
                raise NoFreeGPUs(
                    f"Asked for {count} {what} but this platform has only {len(pool)}.",
                    requested=count, free=usable, total=len(pool),
                )
            raise NoFreeGPUs(
                f"Not enough free {what}: asked for {count}, {usable} of {len(pool)} free. "
                "Try again when a server or job stops, or pick a smaller profile.",
                requested=count, free=usable, total=len(pool),
            )
        if per_worker and per_worker > 0 and count % per_worker == 0:
            by_node: dict[str, list[int]] = defaultdict(list)
            for d in free:
                by_node[ledger.slots[d.index][0]].append(d.index)
            chosen = place_workers(by_node, count // per_worker, per_worker)
            if chosen is None:
                raise NoFreeGPUs(
                    f"Not enough free {what} on single nodes: {count // per_worker} worker(s) need {per_worker} each "
                    f"on one node; {usable} of {len(pool)} free in all. "
                    "Try again when a server or job stops, or pick a smaller profile.",
                    requested=count, free=usable, total=len(pool),
                )
        else:
            chosen = [d.index for d in free[:count]]
        self._reservations[holder] = Reservation(holder, kind, user, profile, chosen, datetime.now(timezone.utc))
        return chosen

    def _pool_for(self, ledger: Ledger, nodes: list[dict], prof: Profile | None, gpu_model: str | None) -> list[GPUDevice]:
        if prof is None:
            return [d for d in ledger.devices if _model_ok(d, gpu_model)
                    and ledger.slots[d.index][1] == m.DEFAULT_GPU_RESOURCE]
        by_name = {n["metadata"]["name"]: n for n in nodes}
        selector = {**self.node_selector, **dict(prof.node_selector)}
        tolerations = list(prof.tolerations)
        ok_nodes = {name for name in {s[0] for s in ledger.slots}
                    if m.node_accepts(by_name.get(name) or {}, selector, tolerations)}
        return [d for d in ledger.devices if _model_ok(d, gpu_model or prof.gpu_model)
                and ledger.slots[d.index][1] == prof.gpu_resource and ledger.slots[d.index][0] in ok_nodes]

    def release(self, holder):
        with self._lock:
            res = self._reservations.pop(holder, None)
        devices = list(res.devices) if res else []
        if devices:
            self.log.info("GPU release holder=%s devices=%s (reservation dropped)", holder, devices)
        return devices

    def reconcile(self, is_alive):
        """Drop reservations that timed out without pods or whose holder ``is_alive`` says is gone."""
        ledger = self._ledger()
        now = time.monotonic()
        released = []
        with self._lock:
            for holder, res in list(self._reservations.items()):
                mine = [h for h in ledger.holdings if h.holder == holder]
                has_pods = ledger.pod_holders.get(holder, 0) > 0
                expired = not has_pods and now - res.created > self.reservation_timeout
                if expired or (mine and not is_alive(mine[0])):
                    del self._reservations[holder]
                    released += mine
                    self.log.warning("GPU reconcile: dropped the reservation of %s (%s)", holder,
                                     "no pods after %gs" % self.reservation_timeout if expired else "holder is gone")
        return released

    # -- for the DCGM metrics source -----------------------------------------------------------

    def gpu_targets(self, devices: list[int]) -> dict[int, GPUTarget]:
        """Held devices → the pod and GPU slot holding them; a resolver for ``PrometheusDCGMSource``.

        Never waits: before the caches have loaded it returns {} (unknown, never idle).
        """
        if self._caches is None or not self._caches.ready.is_set() or self._caches.error is not None:
            return {}
        targets = self._ledger().targets
        return {d: targets[d] for d in devices if d in targets}


class PodDCGMSource(PrometheusDCGMSource):
    """``PrometheusDCGMSource`` whose resolver defaults to its parent's allocator's ``gpu_targets``.

    For the culler on Kubernetes (``c.GPUCuller.metrics_class``): the culler builds its metrics
    source with ``parent=`` itself after its allocator, so with ``KubernetesGPUAllocator`` as the
    allocator a server holding's devices map to its notebook pod's GPUs with no extra wiring.
    An explicitly configured ``resolver`` wins.
    """

    @default("resolver")
    def _resolver_default(self):
        return getattr(getattr(self.parent, "allocator", None), "gpu_targets", None)
