"""Pure builders for the Kubernetes back end: profile settings, GPU accounting, storage objects.

Nothing here talks to the API server. Inputs are plain dicts (objects as the API serves
them, as the watch caches hold them); outputs are KubeSpawner trait values or manifests as
dicts ready for ``kubernetes_asyncio`` calls. Tests compare whole outputs and validate every
manifest against the Kubernetes OpenAPI schemas.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from typing import Iterable, Mapping
from urllib.parse import urlparse

# names shared with the job launcher (trainhub.kube); the spawner's modules read them here as m.<name>
from trainhub.kube.names import (  # noqa: F401
    JOB_USER_ANNOTATION, NOTEBOOK_USER_ANNOTATION, PROFILE_ANNOTATION, PROFILE_LABEL, SECRET_ENV_KEYS, k8s_name)
from trainhub.profiles import Profile

DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"


# ---------------------------------------------------------------------------------------------
# profiles -> KubeSpawner settings

def profile_overrides(profile: Profile) -> dict:
    """KubeSpawner trait values for one profile.

    Dict values are merged into the admin's configured value and list values appended to it
    (``merge_overrides``), so cluster-wide node selectors and tolerations stay in force.
    A GPU-less profile sets ``NVIDIA_VISIBLE_DEVICES=void``: on a node whose default container
    runtime is nvidia, CUDA images otherwise see every GPU of the node.
    """
    gpus = {profile.gpu_resource: str(profile.gpus)} if profile.gpus else {}
    env = {"TRAINHUB_PROFILE": profile.slug, "TRAINHUB_GPUS": str(profile.gpus)}
    if not profile.gpus:
        env["NVIDIA_VISIBLE_DEVICES"] = "void"
    out = {
        "extra_resource_limits": gpus,
        "extra_resource_guarantees": dict(gpus),
        "node_selector": dict(profile.node_selector),
        "tolerations": [dict(t) for t in profile.tolerations],
        "environment": env,
        "extra_labels": {PROFILE_LABEL: profile.slug},
        "extra_annotations": {PROFILE_ANNOTATION: profile.slug},
    }
    if profile.image:
        out["image"] = profile.image
    if profile.cpu_limit is not None:
        out["cpu_limit"] = float(profile.cpu_limit)
    if profile.mem_limit:
        out["mem_limit"] = profile.mem_limit
    if profile.cpu_guarantee is not None:
        out["cpu_guarantee"] = float(profile.cpu_guarantee)
    if profile.mem_guarantee:
        out["mem_guarantee"] = profile.mem_guarantee
    return out


def merge_overrides(base: Mapping, overrides: Mapping) -> dict:
    """Admin-configured values (``base``) with a profile's overrides on top.

    Dicts merge (the profile wins per key), lists concatenate, anything else is replaced.
    """
    out = {}
    for key, value in overrides.items():
        old = base.get(key)
        if isinstance(value, list) and isinstance(old, dict):
            # KubeSpawner's keyed form of list traits (tolerations, volumes...): values sorted by key
            old = [old[k] for k in sorted(old) if old[k] is not None]
        if isinstance(value, dict) and isinstance(old, dict):
            out[key] = {**old, **value}
        elif isinstance(value, list) and isinstance(old, list):
            out[key] = list(old) + [v for v in value if v not in old]
        else:
            out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# GPU accounting from cached objects

_QTY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([KMGTPE]i|[kMGTPE]|m)?$")
_QTY_FACTOR = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
               "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def parse_quantity(value) -> float:
    """A Kubernetes quantity ("2", "500m", "16Gi") as a number; None/"" = 0."""
    if value in (None, ""):
        return 0
    if isinstance(value, (int, float)):
        return value
    m = _QTY.match(str(value).strip())
    if not m:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    return float(m[1]) * _QTY_FACTOR[m[2]]


def _container_request(container: Mapping, resource: str) -> float:
    res = container.get("resources") or {}
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    # extended resources: requests default to limits and must equal them
    return parse_quantity(requests.get(resource, limits.get(resource)))


def pod_request(pod: Mapping, resource: str) -> int:
    """Effective request of ``resource`` by a pod, as the scheduler counts it.

    Containers and native sidecars (init containers with restartPolicy Always) add up;
    a classic init container only counts when it alone asks for more.
    """
    spec = pod.get("spec") or {}
    running = sum(_container_request(c, resource) for c in spec.get("containers") or [])
    sidecars = 0.0
    init_peak = 0.0
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            sidecars += _container_request(c, resource)
        else:
            init_peak = max(init_peak, sidecars + _container_request(c, resource))
    return int(max(running + sidecars, init_peak))


def pod_is_active(pod: Mapping) -> bool:
    """A pod that holds (or is about to hold) its resources: not Succeeded or Failed."""
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def node_is_ready(node: Mapping) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def tolerates(tolerations: Iterable[Mapping], taint: Mapping) -> bool:
    """Whether ``tolerations`` allow scheduling on a node with ``taint`` (NoSchedule/NoExecute)."""
    if taint.get("effect") not in ("NoSchedule", "NoExecute"):
        return True
    for t in tolerations or ():
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def node_accepts(node: Mapping, node_selector: Mapping | None = None, tolerations: Iterable[Mapping] = ()) -> bool:
    """Whether a pod with this node selector and these tolerations may land on ``node``."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in (node_selector or {}).items()):
        return False
    taints = (node.get("spec") or {}).get("taints") or []
    return all(tolerates(tolerations, t) for t in taints)


def gpu_availability(
    nodes: Iterable[Mapping], pods: Iterable[Mapping], resource: str = DEFAULT_GPU_RESOURCE,
    node_selector: Mapping | None = None, tolerations: Iterable[Mapping] = (),
) -> dict:
    """Free units of ``resource``: node allocatable minus the requests of pods bound to each node.

    Only ready, schedulable nodes that accept the given selector and tolerations count.
    Unbound pods asking for the resource are reported as ``pending`` (the scheduler will
    place them first). ``largest_free`` is the most any single node has free: a pod's GPUs
    must all come from one node.
    """
    tolerations = list(tolerations or ())
    per_node = {}
    for node in nodes:
        alloc = parse_quantity(((node.get("status") or {}).get("allocatable") or {}).get(resource))
        if alloc <= 0 or not node_is_ready(node) or not node_accepts(node, node_selector, tolerations):
            continue
        per_node[node["metadata"]["name"]] = {"allocatable": int(alloc), "requested": 0}
    pending = 0
    for pod in pods:
        if not pod_is_active(pod):
            continue
        want = pod_request(pod, resource)
        if not want:
            continue
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name:
            pending += want
        elif node_name in per_node:
            per_node[node_name]["requested"] += want
    for info in per_node.values():
        info["free"] = max(info["allocatable"] - info["requested"], 0)
    total = sum(n["allocatable"] for n in per_node.values())
    requested = sum(n["requested"] for n in per_node.values())
    free = sum(n["free"] for n in per_node.values())
    return {
        "resource": resource,
        "nodes": len(per_node),
        "total": total,
        "requested": requested,
        "free": free,
        "pending": pending,
        "largest_free": max((n["free"] for n in per_node.values()), default=0),
        "per_node": dict(sorted(per_node.items())),
    }


def server_requests(traits: Mapping, gpu_resource: str = DEFAULT_GPU_RESOURCE) -> dict[str, float]:
    """What a notebook pod with these KubeSpawner trait values asks the scheduler for: ``cpu`` (cores) and ``memory``
    (bytes) from the guarantees, else the limits (Kubernetes defaults a request to its limit), plus the extended
    resources (GPUs). Resources it does not ask for are left out."""
    out: dict[str, float] = {}
    cpu = traits.get("cpu_guarantee") or traits.get("cpu_limit")
    if cpu:
        out["cpu"] = float(cpu)
    memory = traits.get("mem_guarantee") or traits.get("mem_limit")
    if memory:
        out["memory"] = float(byte_spec(memory))
    for resource, value in {**(traits.get("extra_resource_limits") or {}),
                            **(traits.get("extra_resource_guarantees") or {})}.items():
        if parse_quantity(value):
            out[resource] = parse_quantity(value)
    return out


def byte_spec(value) -> int:
    """JupyterHub's byte specification ("16G", powers of 1024, as KubeSpawner's mem_limit reads it) or a number."""
    if isinstance(value, (int, float)):
        return int(value)
    m = re.match(r"^([0-9]+(?:\.[0-9]+)?)([KMGT]?)$", str(value).strip())
    if not m:
        return int(parse_quantity(value))
    return int(float(m[1]) * 1024 ** " KMGT".index(m[2] or " "))


def largest_fit(nodes: Iterable[Mapping], requests: Mapping[str, float], node_selector: Mapping | None = None,
                tolerations: Iterable[Mapping] = ()) -> dict:
    """Whether any ready, schedulable node a pod may land on (selector, tolerations) could ever hold ``requests``: its
    allocatable, not what is free now (a full node frees up; a small one never grows). ``{"fits", "nodes", "largest"}``
    where ``largest`` is the most any such node offers of each requested resource."""
    tolerations = list(tolerations or ())
    largest: dict[str, float] = {r: 0.0 for r in requests}
    fits, count = False, 0
    for node in nodes:
        if not node_is_ready(node) or not node_accepts(node, node_selector, tolerations):
            continue
        count += 1
        alloc = (node.get("status") or {}).get("allocatable") or {}
        offered = {r: parse_quantity(alloc.get(r)) for r in requests}
        for r, v in offered.items():
            largest[r] = max(largest[r], v)
        if all(offered[r] >= want for r, want in requests.items()):
            fits = True
    return {"fits": fits, "nodes": count, "largest": largest}


def describe_resources(amounts: Mapping[str, float]) -> str:
    """"2 CPUs, 23.6 GiB of memory and 1 nvidia.com/gpu" for a requests or allocatable mapping."""
    parts = []
    for r, v in amounts.items():
        if r == "cpu":
            parts.append(f"{v:g} CPU{'s' if v != 1 else ''}")
        elif r == "memory":
            parts.append(f"{v / 2**30:.3g} GiB of memory")
        else:
            parts.append(f"{v:g} {r}")
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def can_place(availability: Mapping, count: int) -> bool:
    """Whether ``count`` units fit on one node once pending pods have had their share."""
    if count <= 0:
        return True
    return availability["largest_free"] >= count and availability["free"] - availability["pending"] >= count


def pod_owner(pod: Mapping) -> str | None:
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    return ann.get(JOB_USER_ANNOTATION) or ann.get(NOTEBOOK_USER_ANNOTATION)


def gpu_holdings(pods: Iterable[Mapping], resources: Iterable[str], exclude: Iterable[str] = ()) -> Counter:
    """GPUs held per user by active notebook and job pods (``resources``: the GPU resource names).

    ``exclude``: "namespace/name" keys of pods not to count (the server being restarted).
    A MIG slice counts as one unit, like a profile's ``gpus``.
    """
    resources = sorted(set(resources))
    skip = set(exclude)
    held: Counter = Counter()
    for pod in pods:
        meta = pod.get("metadata") or {}
        if f"{meta.get('namespace')}/{meta.get('name')}" in skip or not pod_is_active(pod):
            continue
        user = pod_owner(pod)
        if not user:
            continue
        n = sum(pod_request(pod, r) for r in resources)
        if n:
            held[user] += n
    return held


def reservation_pod(namespace: str, name: str, user: str, resource: str, count: int) -> dict:
    """An unbound pod standing for a spawn that passed its checks but is not in the cache yet."""
    return {
        "metadata": {"namespace": namespace, "name": name, "annotations": {NOTEBOOK_USER_ANNOTATION: user}},
        "spec": {"containers": [{"name": "notebook", "resources": {"limits": {resource: str(count)}}}]},
        "status": {"phase": "Pending"},
    }


# ---------------------------------------------------------------------------------------------
# storage: credentials

def split_secret_env(env: Mapping[str, str]) -> tuple[dict, dict]:
    """(plain, secret) halves of ``StorageConfig.env_for``: credentials go to the secret half."""
    plain, secret = {}, {}
    for k, v in env.items():
        (secret if k in SECRET_ENV_KEYS else plain)[k] = v
    return plain, secret


def secret_env_refs(secret_name: str, keys: Iterable[str], optional: bool = False) -> dict:
    """KubeSpawner ``environment`` entries reading ``keys`` from a Secret (no values in the pod spec)."""
    return {
        k: {"valueFrom": {"secretKeyRef": {"name": secret_name, "key": k, "optional": optional}}}
        for k in keys
    }


def make_storage_secret(name: str, namespace: str, data: Mapping[str, str], labels: Mapping | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "type": "Opaque",
        "stringData": dict(data),
    }


# ---------------------------------------------------------------------------------------------
# storage: CSI (static PV + PVC per user prefix and one for the datasets)

def s3_bucket_prefix(url: str) -> tuple[str, str]:
    """("bucket", "a/b/") for s3://bucket/a/b (the prefix ends with "/" unless empty)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("s3", "s3a"):
        raise ValueError(f"storage URL {url!r} is not an s3:// URL; the Kubernetes mounts need one")
    prefix = parsed.path.strip("/")
    return parsed.netloc, (prefix + "/") if prefix else ""


def mountpoint_mount_options(prefix: str, read_only: bool, uid: int | None, gid: int | None,
                             region: str | None = None, endpoint_url: str | None = None) -> list[str]:
    """Mount options for the Mountpoint for Amazon S3 CSI driver (s3.csi.aws.com)."""
    opts = ["allow-other"]
    opts.append("read-only" if read_only else "allow-delete")
    if prefix:
        opts.append(f"prefix {prefix}")
    if uid is not None:
        opts.append(f"uid={uid}")
    if gid is not None:
        opts.append(f"gid={gid}")
    if region:
        opts.append(f"region {region}")
    if endpoint_url:
        opts.append(f"endpoint-url {endpoint_url}")
    return opts


def make_csi_pv(
    name: str, *, driver: str, volume_handle: str, claim_namespace: str, claim_name: str,
    volume_attributes: Mapping[str, str] | None = None, mount_options: Iterable[str] = (),
    read_only: bool = False, capacity: str = "1Ti", node_publish_secret: tuple[str, str] | None = None,
    labels: Mapping | None = None,
) -> dict:
    """A statically provisioned CSI PersistentVolume, pre-bound to one claim."""
    csi = {"driver": driver, "volumeHandle": volume_handle, "volumeAttributes": dict(volume_attributes or {})}
    if read_only:
        csi["readOnly"] = True
    if node_publish_secret:
        csi["nodePublishSecretRef"] = {"namespace": node_publish_secret[0], "name": node_publish_secret[1]}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {
            "capacity": {"storage": capacity},
            "accessModes": ["ReadOnlyMany" if read_only else "ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "mountOptions": list(mount_options),
            "claimRef": {"namespace": claim_namespace, "name": claim_name},
            "csi": csi,
        },
    }


def make_bound_pvc(name: str, namespace: str, volume_name: str, *, read_only: bool = False,
                   capacity: str = "1Ti", labels: Mapping | None = None) -> dict:
    """A claim bound by name to a statically provisioned volume."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {
            "accessModes": ["ReadOnlyMany" if read_only else "ReadWriteMany"],
            "storageClassName": "",
            "volumeName": volume_name,
            "resources": {"requests": {"storage": capacity}},
        },
    }


def csi_pod_storage(home_claim: str, datasets_claim: str, mount_root: str) -> dict:
    """KubeSpawner ``volumes``/``volume_mounts`` for the CSI mode (datasets read-only)."""
    return {
        "volumes": [
            {"name": "trainhub-home", "persistentVolumeClaim": {"claimName": home_claim}},
            {"name": "trainhub-datasets", "persistentVolumeClaim": {"claimName": datasets_claim, "readOnly": True}},
        ],
        "volume_mounts": [
            {"name": "trainhub-home", "mountPath": f"{mount_root}/home"},
            {"name": "trainhub-datasets", "mountPath": f"{mount_root}/datasets", "readOnly": True},
        ],
        "init_containers": [],
    }


# ---------------------------------------------------------------------------------------------
# storage: FUSE sidecars (rclone mount) sharing a mount through Bidirectional propagation

def _rclone_mount(remote: str, path: str, *, read_only: bool, uid: int | None, gid: int | None,
                  endpoint_url: str | None) -> list[str]:
    cmd = ["rclone", "mount", remote, path, "--allow-other", "--s3-env-auth", "--s3-provider",
           "Other" if endpoint_url else "AWS", "--dir-cache-time", "30s", "--vfs-cache-mode",
           "minimal" if read_only else "writes"]
    if endpoint_url:
        cmd += ["--s3-endpoint", endpoint_url]
    if read_only:
        cmd.append("--read-only")
    if uid is not None:
        cmd += ["--uid", str(uid)]
    if gid is not None:
        cmd += ["--gid", str(gid)]
    return cmd


def fuse_sidecar_pod_storage(
    *, image: str, home_url: str, datasets_url: str, mount_root: str, secret_name: str | None,
    endpoint_url: str | None = None, uid: int | None = 1000, gid: int | None = 100,
    resources: Mapping | None = None, native: bool = True, credentials: tuple[dict, Mapping] | None = None,
) -> dict:
    """Native sidecars (init containers with restartPolicy Always) running ``rclone mount``.

    The sidecars mount the user's prefix and the datasets (read-only) inside an emptyDir with
    Bidirectional propagation (this needs a privileged container and /dev/fuse); the notebook
    sees them through HostToContainer propagation. A startup probe holds the notebook back
    until the mount is there. Credentials come from the Secret by ``envFrom``; with ``credentials``
    (``(volume mount, environment)``: the user's own, ``trainhub.kube.credentials``) from the Secret's files
    instead, which rclone's AWS SDK reads through the config's ``credential_process`` as the notebook does.

    ``native=False``, for API servers without native sidecars (before 1.28, which drop
    ``restartPolicy`` from init containers and then refuse their probes): the same containers as
    ordinary containers of the pod (``extra_containers``), the pattern before native sidecars.
    Nothing then holds the notebook back until the mount is there (it appears in the notebook
    within seconds of its start) and nothing orders their stop.
    """
    mounts = []
    for which, url, read_only in (("home", home_url, False), ("datasets", datasets_url, True)):
        bucket, prefix = s3_bucket_prefix(url + "/")
        path = f"{mount_root}/{which}"
        remote = f":s3:{bucket}/{prefix.rstrip('/')}"
        script = f"mkdir -p {shlex.quote(path)} && exec " + shlex.join(
            _rclone_mount(remote, path, read_only=read_only, uid=uid, gid=gid, endpoint_url=endpoint_url))
        container = {
            "name": f"trainhub-storage-{which}",
            "image": image,
            **({"restartPolicy": "Always"} if native else {}),
            "command": ["sh", "-c", script],
            "securityContext": {"privileged": True},
            "volumeMounts": [{"name": "trainhub-storage", "mountPath": mount_root, "mountPropagation": "Bidirectional"}],
            "startupProbe": {
                "exec": {"command": ["sh", "-c", f"grep -qs ' {path} ' /proc/mounts"]},
                "periodSeconds": 1, "failureThreshold": 120,
            },
            "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", f"fusermount -uz {shlex.quote(path)} || umount -l {shlex.quote(path)} || true"]}}},
        }
        if secret_name:
            container["envFrom"] = [{"secretRef": {"name": secret_name}}]
        if credentials is not None:
            creds_mount, creds_env = credentials
            container["volumeMounts"].append(dict(creds_mount))
            container["env"] = [{"name": k, "value": v} for k, v in sorted(creds_env.items()) if k.startswith("AWS_")]
        if resources:
            container["resources"] = dict(resources)
        mounts.append(container)
    return {
        "volumes": [{"name": "trainhub-storage", "emptyDir": {}}],
        "volume_mounts": [{"name": "trainhub-storage", "mountPath": mount_root, "mountPropagation": "HostToContainer"}],
        ("init_containers" if native else "extra_containers"): mounts,
    }


def storage_link_hooks(target: str, name: str) -> dict:
    """KubeSpawner ``lifecycle_hooks``: a postStart hook linking ``$HOME/<name>`` to ``target`` (the storage mount),
    unless the home holds something by that name. It always exits 0: a failed postStart hook kills the container."""
    link = '"${HOME:-/home/jovyan}"/' + shlex.quote(name)
    script = f'[ -e {link} ] || [ -L {link} ] || ln -s {shlex.quote(target)} {link}; exit 0'
    return {"postStart": {"exec": {"command": ["sh", "-c", script]}}}


def storage_paths_env(mount_root: str) -> dict:
    """Where the mounts are inside the notebook (both mount modes use the same layout)."""
    return {"TRAINHUB_STORAGE_PATH": f"{mount_root}/home", "TRAINHUB_DATASETS_PATH": f"{mount_root}/datasets"}


KERNEL_CONFIG_PATH = "/etc/ipython/ipython_kernel_config.py"


def kernel_config_parts(config_map: str) -> tuple[list[dict], list[dict]]:
    """(volumes, volume mounts) putting the ConfigMap's ipython_kernel_config.py where every kernel of the
    image reads it (IPython's system config path), read-only; nothing for an empty name."""
    if not config_map:
        return [], []
    volume = {"name": "trainhub-kernel-config", "configMap": {"name": config_map, "optional": True,
                                                              "items": [{"key": "ipython_kernel_config.py",
                                                                         "path": "ipython_kernel_config.py"}]}}
    mount = {"name": "trainhub-kernel-config", "mountPath": KERNEL_CONFIG_PATH,
             "subPath": "ipython_kernel_config.py", "readOnly": True}
    return [volume], [mount]
