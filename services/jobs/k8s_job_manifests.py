"""Pure builders for the Kubernetes job launcher: manifests, worker statuses, log lines.

Nothing here talks to the API server. ``make_job`` and ``make_headless_service`` return
manifests as plain dicts ready for ``kubernetes_asyncio`` calls (tests validate them with
``kubernetes_validate`` in strict mode); ``worker_statuses`` maps a Job and its pods as the
API serves them to the launcher contract's ``WorkerStatus`` list; ``split_pod_log`` turns a
pod log read with ``timestamps=true`` into lines of the local launcher's log format and the
metrics lines the in-pod wrapper forwards.

A job attempt on Kubernetes::

    Job <name>             Indexed, completions = parallelism = workers, restartPolicy Never
      pod <name>-<i>-xxxxx hostname <name>-<i>, subdomain <name>, RANK from the completion index
    Service <name>         headless (clusterIP None, publishNotReadyAddresses): MASTER_ADDR is
                           <name>-0.<name>; owned by the Job, so deleting the Job removes it

On an API server without Indexed Jobs or pod failure policies (before 1.21 / 1.26) the same gang runs
in the per-worker form (``per_worker_jobs``): one plain Job ``<name>-w<i>`` per worker, whose pod
template is the Indexed Job's with the completion index written in (the annotation RANK is read from,
the hostname), so pods, environment, logs and statuses look the same; ``combine_worker_jobs`` folds
the worker Jobs back into the one Job that ``worker_statuses`` reads. The Service is owned by every
worker Job and goes with the last.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from datetime import datetime, timezone
from typing import Iterable, Mapping

from trainhub import distenv, workdir
from trainhub.kube.names import COMPONENT_LABEL, JOB_USER_ANNOTATION, PROFILE_LABEL, SECRET_ENV_KEYS, k8s_name
from trainhub.kube.pods import shm_parts

from .launcher import WorkerStatus

JOB_ID_LABEL = "trainhub.io/job-id"
JOB_KEY_LABEL = "trainhub.io/job-key"
JOB_NAME_LABEL = "trainhub.io/job-name"
ATTEMPT_LABEL = "trainhub.io/attempt"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "trainhub-jobs"
COMPONENT = "training-job"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"  # also a pod label from Kubernetes 1.28
WORKER_LABEL = "trainhub.io/worker"  # the rank of a per-worker Job and its pod

# the pods unpack the job's working directory with trainhub.workdir itself (standard library only: the image need not
# have trainhub), its source given in the environment
WORKDIR_PY = Path(workdir.__file__).read_text()
WORKDIR_ARCHIVE = "workdir.tar.gz"  # in the job's storage area

CONTAINER = "worker"
POD_ROOT = "/trainhub"  # emptyDir: script, metrics file, outputs
METRICS_MARK = "::trainhub-metric:: "  # prefix of metrics lines the wrapper copies to stdout

# Keys of the engine's base environment that describe the service's own machine, not the pod.
HOST_ONLY_ENV = ("PATH", "HOME", "TRAINHUB_INSTANCE")

# The container's entry point (POSIX sh: busybox, dash and bash images all work). It runs the
# job's command or script, forwards the metrics file to stdout with METRICS_MARK (the launcher
# splits those lines off the log into metrics-<rank>.jsonl), passes SIGTERM on to the command,
# then copies $TRAINHUB_OUTPUTS_DIR to $TRAINHUB_OUTPUTS_URL/outputs/ with fsspec (when the image
# has python3 + fsspec) and exits with the command's status.
WORKER_SH = r"""
set -u
mkdir -p "$TRAINHUB_OUTPUTS_DIR"
if [ -n "${TRAINHUB_WORKDIR_URL:-}" ]; then
  # the working directory the job was sent with (trainhub.workdir, its source in $TRAINHUB_WORKDIR_PY): the command's cwd
  "${TRAINHUB_PYTHON:-python3}" -c "$TRAINHUB_WORKDIR_PY" unpack "$TRAINHUB_WORKDIR_URL" "$TRAINHUB_JOB_DIR/workdir" \
    $TRAINHUB_WORKDIR_LIMITS || { echo "trainhub: the job's working directory could not be unpacked (the image needs python3, with fsspec for object storage)"; exit 1; }
  cd "$TRAINHUB_JOB_DIR/workdir" || exit 1
fi
: > "$TRAINHUB_METRICS_FILE"
tail -n +1 -f "$TRAINHUB_METRICS_FILE" 2>/dev/null | while IFS= read -r line; do printf '%s%s\n' "$TRAINHUB_METRICS_MARK" "$line"; done &
forwarder=$!
if [ -n "${TRAINHUB_JOB_SCRIPT:-}" ]; then
  printf '%s' "$TRAINHUB_JOB_SCRIPT" > "$TRAINHUB_JOB_DIR/script.py"
  set -- "${TRAINHUB_PYTHON:-python3}" -u "$TRAINHUB_JOB_DIR/script.py"
elif command -v bash >/dev/null 2>&1; then
  set -- bash -c "$TRAINHUB_JOB_COMMAND"
else
  set -- sh -c "$TRAINHUB_JOB_COMMAND"
fi
child=
# the trap is set before the command starts, so a SIGTERM right after start-up is passed on too
trap 'if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; fi' TERM INT
"$@" &
child=$!
wait "$child"; code=$?
while kill -0 "$child" 2>/dev/null; do wait "$child"; code=$?; done
trap - TERM INT
sleep 2  # let the forwarder copy the last metrics lines
kill "$forwarder" 2>/dev/null
if [ -n "${TRAINHUB_OUTPUTS_URL:-}" ] && [ -n "$(ls -A "$TRAINHUB_OUTPUTS_DIR" 2>/dev/null)" ]; then
  "${TRAINHUB_PYTHON:-python3}" - <<'EOF' || echo "trainhub: outputs were not copied to $TRAINHUB_OUTPUTS_URL (needs python3 with fsspec in the image)"
import json, os
import fsspec
src, url = os.environ["TRAINHUB_OUTPUTS_DIR"], os.environ["TRAINHUB_OUTPUTS_URL"].rstrip("/") + "/outputs"
fs, root = fsspec.core.url_to_fs(url, **json.loads(os.environ.get("TRAINHUB_STORAGE_OPTIONS") or "{}"))
for d, _, names in os.walk(src):
    for n in names:
        p = os.path.join(d, n)
        dest = root + "/" + os.path.relpath(p, src).replace(os.sep, "/")
        if "file" in fs.protocol or "local" in fs.protocol:
            fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(p, dest)
print("trainhub: outputs copied to " + url)
EOF
fi
exit "$code"
""".strip()


def job_name(key: str, attempt: int) -> str:
    """Name of an attempt's Job and Service ("trainhub-j-000042-a1"); short enough for pod hostnames."""
    return k8s_name("trainhub", key, f"a{attempt}", max_len=52)


def job_labels(job_id: int, key: str, attempt: int, name: str, profile: str | None = None) -> dict:
    labels = {
        MANAGED_BY_LABEL: MANAGED_BY, COMPONENT_LABEL: COMPONENT, JOB_ID_LABEL: str(job_id),
        JOB_KEY_LABEL: key, ATTEMPT_LABEL: str(attempt), JOB_NAME_LABEL: name,
    }
    if profile:
        labels[PROFILE_LABEL] = k8s_name(profile)
    return labels


def env_list(env: Mapping[str, object]) -> list[dict]:
    """Container ``env`` entries: strings become values, dicts are taken as ``valueFrom`` sources."""
    out = []
    for k, v in env.items():
        if isinstance(v, Mapping):
            out.append({"name": k, "valueFrom": dict(v)})
        else:
            out.append({"name": k, "value": str(v)})
    return out


def secret_refs(secret_name: str, keys: Iterable[str] = SECRET_ENV_KEYS, optional: bool = True) -> dict:
    """``valueFrom`` sources reading credentials from a Secret (``optional``: it may lack a key or be absent)."""
    return {k: {"secretKeyRef": {"name": secret_name, "key": k, "optional": optional}} for k in keys}


def credentials_secret_name(job_name: str) -> str:
    return f"{job_name}-credentials"


def make_credentials_secret(*, name: str, namespace: str, labels: Mapping[str, str], values: Mapping[str, str],
                            owner: Mapping, owners: Iterable[Mapping] = ()) -> dict:
    """The attempt's own copy of the user's storage credentials, in the job namespace, owned by the Job (it
    goes when the Job goes; with ``owners``, the per-worker form's Jobs, when the last goes): job pods never
    depend on a Secret the hub may not have written there."""
    refs = [_owner(o) for o in [owner, *owners] if o]
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels), "ownerReferences": refs},
        "stringData": dict(values),
    }


def _owner(job: Mapping) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
            "controller": False, "blockOwnerDeletion": False}


def worker_env(*, name: str, workers: int, master_port: int, base_env: Mapping[str, str], user_env: Mapping[str, str],
               command: str | None, script: str | None, outputs_url: str | None = None, gpus: int = 0,
               python: str = "python3", secret_name: str | None = None, cpu_limit: float | None = None,
               secret_keys: Iterable[str] = SECRET_ENV_KEYS, secret_optional: bool = True,
               workdir_url: str | None = None, workdir_limits: workdir.Limits = workdir.Limits()) -> dict:
    """The environment of every pod of the attempt (RANK comes from the pod's completion index).

    ``cpu_limit``: the pod's CPU limit (cores), which sizes OMP_NUM_THREADS; None leaves it unset. ``workdir_url``:
    the archive of the job's working directory, which the pod unpacks (within ``workdir_limits``) and runs in.

    Credentials in ``base_env`` (``AWS_*``) are replaced by references to ``secret_name`` when
    one is given, so no credential value appears in the Job; without one they stay plain values.
    """
    import json

    env: dict = {}
    for k, v in base_env.items():
        if k in HOST_ONLY_ENV or (secret_name and k in SECRET_ENV_KEYS):
            continue
        env[k] = v
    if secret_name and "TRAINHUB_STORAGE_OPTIONS" in env:
        try:
            opts = json.loads(env["TRAINHUB_STORAGE_OPTIONS"])
        except ValueError:
            opts = {}
        env["TRAINHUB_STORAGE_OPTIONS"] = json.dumps({k: v for k, v in opts.items() if k not in ("key", "secret", "token")})
    env.update(user_env)
    index = {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}
    # what torchrun --nnodes W --nproc_per_node 1 --node_rank i would give it (trainhub.distenv)
    env.update(distenv.worker_env(rank=index, local_rank=0, group_rank=index, world_size=workers, local_world_size=1,
                                  group_world_size=workers, master_addr=f"{name}-0.{name}", master_port=master_port,
                                  gpus_per_worker=gpus, error_file=f"{POD_ROOT}/error.json",
                                  # a torchrun inside sets OMP_NUM_THREADS for its own processes (as on a machine)
                                  cores=None if distenv.runs_torchrun(command) else cpu_limit,
                                  user_env=user_env))
    env.update({
        "NODE_RANK": index,
        "TRAINHUB_JOB_DIR": POD_ROOT, "TRAINHUB_METRICS_FILE": f"{POD_ROOT}/metrics.jsonl",
        "TRAINHUB_OUTPUTS_DIR": f"{POD_ROOT}/outputs", "TRAINHUB_METRICS_MARK": METRICS_MARK,
        "TRAINHUB_PYTHON": python, "PYTHONUNBUFFERED": "1",
    })
    if not gpus:
        env["NVIDIA_VISIBLE_DEVICES"] = "void"  # nodes whose default runtime is nvidia show every GPU otherwise
    if outputs_url:
        env["TRAINHUB_OUTPUTS_URL"] = outputs_url
    if script is not None:
        env["TRAINHUB_JOB_SCRIPT"] = script
    else:
        env["TRAINHUB_JOB_COMMAND"] = command or ""
    if workdir_url:
        env.update(TRAINHUB_WORKDIR_URL=workdir_url, TRAINHUB_WORKDIR_PY=WORKDIR_PY,
                   TRAINHUB_WORKDIR_LIMITS=f"{workdir_limits.max_bytes} {workdir_limits.max_files}")
    if secret_name:
        env.update(secret_refs(secret_name, secret_keys, secret_optional))
    return env


def make_job(
    *, name: str, namespace: str, labels: Mapping[str, str], user: str, workers: int, image: str, env: Mapping,
    gpus: int = 0, gpu_resource: str = "nvidia.com/gpu", cpu_limit: float | None = None, mem_limit: str | None = None,
    cpu_request: float | None = None, mem_request: str | None = None,
    node_selector: Mapping | None = None, tolerations: Iterable[Mapping] = (), time_limit: float | None = None,
    deadline_margin: float = 0, backoff_limit: int = 0, grace: int = 30, service_account: str = "",
    queue_name: str = "", ttl_after_finished: int | None = None, image_pull_secrets: Iterable[str] = (),
    shm_size: str | None = "1Gi", pod_security_context: Mapping | None = None,
    container_security_context: Mapping | None = None, runtime_class_name: str = "", priority_class_name: str = "",
    credentials_volume: tuple[Mapping, Mapping] | None = None,
) -> dict:
    """An Indexed ``batch/v1`` Job running one pod per worker, all-or-nothing.

    ``credentials_volume``: (volume, mount) of the attempt's Secret holding its user's own storage credentials as
    files (``trainhub.kube.credentials``).

    ``podFailurePolicy``: a pod disrupted by the cluster (eviction, preemption, node drain:
    condition ``DisruptionTarget``) is replaced without counting against ``backoffLimit``; a
    non-zero exit of the worker container fails the whole Job at once, so the engine decides
    about retries (a new attempt, a new Job). With ``queue_name`` the Job is created suspended
    with Kueue's queue label; Kueue admits the whole gang by unsuspending it.
    """
    limits: dict = {}
    if gpus:
        limits[gpu_resource] = str(gpus)
    if cpu_limit is not None:
        limits["cpu"] = _cpu(cpu_limit)
    if mem_limit:
        limits["memory"] = str(mem_limit)
    requests: dict = {}
    if gpus:
        requests[gpu_resource] = str(gpus)
    # the profile's guarantees are the requests (without them Kubernetes requests the limits)
    if cpu_request is not None:
        requests["cpu"] = _cpu(cpu_request)
    if mem_request:
        requests["memory"] = str(mem_request)
    resources: dict = {"limits": limits} if limits else {}
    if requests:
        resources["requests"] = requests
    container = {
        "name": CONTAINER,
        "image": image,
        "command": ["sh", "-c", WORKER_SH, "trainhub-worker"],
        "env": env_list(env),
        "ports": [{"name": "rendezvous", "containerPort": int(env.get("MASTER_PORT", 29500))}],
        "volumeMounts": [{"name": "trainhub", "mountPath": POD_ROOT}],
        "resources": resources,
    }
    if container_security_context:
        container["securityContext"] = dict(container_security_context)
    shm_volumes, shm_mounts = shm_parts(shm_size)
    volumes = [{"name": "trainhub", "emptyDir": {}}, *shm_volumes]
    container["volumeMounts"] += shm_mounts
    if credentials_volume is not None:
        volumes.append(dict(credentials_volume[0]))
        container["volumeMounts"].append(dict(credentials_volume[1]))
    pod_spec: dict = {
        "restartPolicy": "Never",
        "subdomain": name,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": int(grace),
        "containers": [container],
        "volumes": volumes,
    }
    if pod_security_context:
        pod_spec["securityContext"] = dict(pod_security_context)
    if runtime_class_name:
        pod_spec["runtimeClassName"] = runtime_class_name
    if priority_class_name:
        pod_spec["priorityClassName"] = priority_class_name
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    tolerations = [dict(t) for t in tolerations]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in image_pull_secrets]
    job_labels_ = dict(labels)
    if queue_name:
        job_labels_[KUEUE_QUEUE_LABEL] = queue_name
    spec: dict = {
        "completionMode": "Indexed",
        "completions": workers,
        "parallelism": workers,
        "backoffLimit": int(backoff_limit),
        "podFailurePolicy": {"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "NotIn", "values": [0]}},
        ]},
        "suspend": bool(queue_name),
        "template": {
            "metadata": {"labels": dict(labels), "annotations": {JOB_USER_ANNOTATION: user}},
            "spec": pod_spec,
        },
    }
    if time_limit:
        spec["activeDeadlineSeconds"] = int(math.ceil(time_limit + deadline_margin))
    if ttl_after_finished is not None:
        spec["ttlSecondsAfterFinished"] = int(ttl_after_finished)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": job_labels_,
                     "annotations": {JOB_USER_ANNOTATION: user}},
        "spec": spec,
    }


def worker_job_name(name: str, rank: int) -> str:
    """The Job of worker ``rank`` in the per-worker form ("trainhub-j-000042-a1-w0")."""
    return f"{name}-w{rank}"


def per_worker_jobs(job: Mapping) -> list[dict]:
    """``make_job``'s Indexed Job as one plain Job per worker (completions = parallelism = 1), for API servers that
    lack Indexed Jobs (1.21) or pod failure policies (1.26) and would silently drop those fields.

    Each pod template is the Indexed one with the worker's index written in: the completion-index annotation
    (``RANK``, ``NODE_RANK`` and ``GROUP_RANK`` read it through the downward API, ``pod_index`` too) and the
    hostname ``<name>-<rank>`` the Job controller gives Indexed pods, so ``MASTER_ADDR`` and the logs are the same.
    What is lost with ``podFailurePolicy``: a pod evicted or preempted fails its worker (``backoffLimit`` counts it)
    instead of being replaced; the engine then stops the gang and retries the job as for any failure. The engine,
    not the Job controller, stops the other workers when one fails. ``suspend`` (Kueue) has no per-worker form.
    """
    import copy

    name = job["metadata"]["name"]
    workers = int(job["spec"]["completions"])
    out = []
    for rank in range(workers):
        j = copy.deepcopy(dict(job))
        j["metadata"]["name"] = worker_job_name(name, rank)
        j["metadata"]["labels"][WORKER_LABEL] = str(rank)
        spec = j["spec"]
        for key in ("completionMode", "podFailurePolicy", "suspend"):
            spec.pop(key, None)
        spec["completions"] = spec["parallelism"] = 1
        template = spec["template"]
        template["metadata"].setdefault("annotations", {})[INDEX_ANNOTATION] = str(rank)
        template["metadata"]["labels"][WORKER_LABEL] = str(rank)
        template["spec"]["hostname"] = f"{name}-{rank}"
        out.append(j)
    return out


def combine_worker_jobs(jobs: Mapping[int, Mapping | None], workers: int) -> dict | None:
    """The worker Jobs of the per-worker form ({rank: Job or None}) as the one Job ``worker_statuses`` reads: None
    when none exists; ``Failed`` once any worker's Job failed, ``Complete`` once every worker's completed;
    ``completedIndexes`` the ranks whose Job completed."""
    present = {r: j for r, j in jobs.items() if j is not None}
    if not present:
        return None
    done = sorted(r for r, j in present.items() if job_finished(j) == "Complete")
    failed = [j for j in present.values() if job_finished(j) == "Failed"]
    conditions = []
    if failed:
        conditions.append(dict(_conditions(failed[0])["Failed"]))
    elif len(done) == workers:
        conditions.append({"type": "Complete", "status": "True"})
    return {"metadata": {"name": "+".join(j["metadata"]["name"] for j in present.values())},
            "status": {"conditions": conditions, "completedIndexes": ",".join(map(str, done))}}


def make_headless_service(*, name: str, namespace: str, labels: Mapping[str, str], port: int,
                          owner: Mapping | None = None, owners: Iterable[Mapping] = ()) -> dict:
    """The headless Service giving each pod the DNS name ``<hostname>.<name>`` (rank 0 = MASTER_ADDR).

    ``owner``: the created Job (``metadata.name``/``uid``); the Service then goes with it. ``owners``: the worker
    Jobs of the per-worker form; the Service goes with the last of them.
    """
    meta: dict = {"name": name, "namespace": namespace, "labels": dict(labels)}
    refs = [_owner(o) for o in ([owner] if owner else []) + list(owners)]
    if refs:
        meta["ownerReferences"] = refs
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # ranks resolve each other before any is Ready
            "selector": {JOB_NAME_LABEL: name},
            "ports": [{"name": "rendezvous", "port": int(port), "targetPort": int(port), "protocol": "TCP"}],
        },
    }


def _cpu(value: float) -> str:
    value = float(value)
    return str(int(value)) if value.is_integer() else f"{int(round(value * 1000))}m"


# ---------------------------------------------------------------------------------------------
# statuses

def _conditions(obj: Mapping | None) -> dict:
    return {c.get("type"): c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c.get("status") == "True"}


def job_finished(job: Mapping | None) -> str | None:
    """"Complete", "Failed" or None (still active, suspended or absent)."""
    conds = _conditions(job)
    for kind in ("Failed", "Complete"):
        if kind in conds:
            return kind
    return None


def pod_index(pod: Mapping) -> int | None:
    meta = pod.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(INDEX_ANNOTATION, (meta.get("labels") or {}).get(INDEX_ANNOTATION))
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def unschedulable(pod: Mapping) -> str | None:
    """The scheduler's message for a pod it could not place ("0/3 nodes are available: 3 Insufficient
    nvidia.com/gpu."), or None when it is placed or not yet looked at."""
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return c.get("message") or "unschedulable"
    return None


def container_exit(pod: Mapping, container: str = CONTAINER) -> int | None:
    """Exit code of the worker container, or None when it has not terminated (OOMKilled → -9)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") != container:
            continue
        term = (cs.get("state") or {}).get("terminated")
        if term is None:
            return None
        if term.get("reason") == "OOMKilled":
            return -9
        if term.get("signal"):
            return -int(term["signal"])
        return int(term.get("exitCode", 1))
    return None


def completed_indexes(spec: str | None) -> set[int]:
    """"0,2-4" → {0, 2, 3, 4} (``status.completedIndexes``)."""
    out: set[int] = set()
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _newest(pods: list[Mapping]) -> Mapping:
    # an active replacement wins over the failed pod it replaces; then the newest
    def key(p):
        active = (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        meta = p.get("metadata") or {}
        return (active, meta.get("creationTimestamp") or "", int(meta.get("resourceVersion") or 0))
    return max(pods, key=key)


def worker_statuses(job: Mapping | None, pods: Iterable[Mapping], workers: int) -> list[WorkerStatus]:
    """One ``WorkerStatus`` per index from the Job (None: not found) and its pods.

    Running: the pod is pending, running, being replaced after a disruption, or not created yet
    while the Job is active or suspended (Kueue has not admitted it). Ended: the worker
    container's exit code; an index whose pod the Job controller removed when the Job failed reads
    -15 (stopped with SIGTERM), or running while another index shows a real failure (the engine then
    records that failure as the reason and terminates the gang); with no Job and no pod the worker
    is lost.
    """
    by_index: dict[int, list] = {}
    for pod in pods:
        idx = pod_index(pod)
        if idx is not None:
            by_index.setdefault(idx, []).append(pod)
    finished = job_finished(job)
    done = completed_indexes(((job or {}).get("status") or {}).get("completedIndexes"))
    out: list[WorkerStatus] = []
    removed: list[int] = []
    for rank in range(workers):
        candidates = by_index.get(rank)
        if not candidates:
            if job is None:
                out.append(WorkerStatus(rank, running=False, exit_code=-9, lost=True))
            elif finished:
                if rank in done:
                    out.append(WorkerStatus(rank, running=False, exit_code=0))
                else:
                    removed.append(rank)
                    out.append(WorkerStatus(rank, running=False, exit_code=-15))
            else:
                out.append(WorkerStatus(rank, running=True))
            continue
        pod = _newest(candidates)
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Succeeded":
            out.append(WorkerStatus(rank, running=False, exit_code=container_exit(pod) or 0))
        elif phase == "Failed":
            code = container_exit(pod)
            if "DisruptionTarget" in _conditions(pod) and job is not None and not finished:
                out.append(WorkerStatus(rank, running=True))  # the Job controller replaces it
            else:
                out.append(WorkerStatus(rank, running=False, exit_code=-9 if code is None else code, lost=code is None))
        else:
            out.append(WorkerStatus(rank, running=True))
    if removed and any(not s.running and s.exit_code and s.rank not in removed for s in out):
        # Another index failed: show the removed ones as running until the engine stops the gang, so
        # it sees the real failure first and names it (it blames the lowest failed rank otherwise).
        out = [WorkerStatus(s.rank, running=True) if s.rank in removed else s for s in out]
    return out


# ---------------------------------------------------------------------------------------------
# logs

_K8S_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def local_timestamp(k8s_ts: str) -> str:
    """"2026-11-21T20:15:15.123456789Z" → "2026-11-21T20:15:15.123Z" (the local log format)."""
    m = _K8S_TS.match(k8s_ts)
    if not m:
        return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    base, frac, zone = m.groups()
    if zone != "Z":
        dt = datetime.fromisoformat(f"{base}{zone}").astimezone(timezone.utc)
        base = dt.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{(frac or '0').ljust(3, '0')[:3]}Z"


def ts_key(k8s_ts: str) -> tuple:
    """Sortable form of a log timestamp (nanosecond resolution)."""
    m = _K8S_TS.match(k8s_ts)
    if not m:
        return ("", 0)
    base, frac, zone = m.groups()
    if zone != "Z":
        base = datetime.fromisoformat(f"{base}{zone}").astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return (base, int((frac or "0").ljust(9, "0")[:9]))


def split_pod_log(text: str, rank: int, after: tuple | None = None, skip_at_after: int = 0):
    """Lines of a ``timestamps=true`` pod log → (log lines, metrics lines, last key, lines at last key).

    Log lines come out as ``<ISO time> [rank] text\\n`` (the local launcher's format); lines that
    carry ``METRICS_MARK`` come out as the bare JSON line for ``metrics-<rank>.jsonl``. Lines at or
    before ``after`` were taken by an earlier read: those before it are dropped, and of those at it
    the first ``skip_at_after``.
    """
    log, metrics = [], []
    last, at_last = after, skip_at_after
    seen_at_after = 0
    for raw in text.splitlines():
        if not raw:
            continue
        ts, _, body = raw.partition(" ")
        key = ts_key(ts)
        if after is not None:
            if key < after:
                continue
            if key == after:
                seen_at_after += 1
                if seen_at_after <= skip_at_after:
                    continue
        if key == last:
            at_last += 1
        else:
            last, at_last = key, 1
        if body.startswith(METRICS_MARK):
            metrics.append(body[len(METRICS_MARK):] + "\n")
        else:
            log.append(f"{local_timestamp(ts)} [{rank}] {body}\n")
    return log, metrics, last, at_last
