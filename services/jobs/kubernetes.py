"""The Kubernetes launcher: each job attempt is an Indexed ``batch/v1`` Job plus a headless Service.

Select it with ``c.TrainhubService.launcher_class = "trainhub.services.jobs.kubernetes.KubernetesLauncher"``
(see docs/kubernetes.md). What it does, against the contract in ``launcher.py``:

* ``launch``: one Job per attempt (``k8s_job_manifests.make_job``): ``completions = parallelism =
  workers``, ``completionMode: Indexed``, one pod per worker with ``RANK`` from its completion
  index, ``MASTER_ADDR=<job>-0.<job>`` through the headless Service (``make_headless_service``,
  owned by the Job), GPU limits under the profile's resource name, the profile's node selector,
  tolerations, image, CPU and memory, ``activeDeadlineSeconds`` from the time limit (a backstop:
  the engine stops overdue jobs itself), ``backoffLimit`` and a ``podFailurePolicy``. Pods carry
  the ``trainhub.io/username`` annotation, so the hub's quota check counts their GPUs. With
  ``kueue_queue`` set, the Job is created suspended with Kueue's queue label and Kueue admits
  the whole gang; otherwise the engine's own admission (scheduler + ledger) decided already.
* ``poll``: from two list-and-watch caches (this launcher's Jobs and their pods, selected by the
  ``app.kubernetes.io/managed-by=trainhub-jobs`` label) — no API call per poll, except a direct
  read when a Job is missing from the cache (just created, or gone). Worker logs are read from
  the pods API into ``<job_dir>/attempt-N/worker-R.log`` in the local launcher's format (``k8s_logs``),
  so the engine's log, metrics and output-sync code works unchanged.
* ``terminate``: delete the Job with ``propagationPolicy: Foreground`` and
  ``gracePeriodSeconds = grace`` (pods get SIGTERM, SIGKILL after the grace period).
* ``adopt``: after a restart, find the attempt's Job again (by name, from the cache).
* ``cleanup``: delete the Job (background propagation); the Service goes with it.

Outputs: each pod copies ``$TRAINHUB_OUTPUTS_DIR`` to ``<outputs_url>/outputs/`` with fsspec when
its command ends (see ``WORKER_SH``); logs and metrics reach storage through the engine's usual
output sync of the local job folder.

Older API servers: before 1.26 (pod failure policies; Indexed Jobs: 1.21) the server would accept the
Indexed Job and silently drop those fields. ``job_form = "auto"`` (the default) then runs each attempt in
the per-worker form instead (``k8s_job_manifests.per_worker_jobs``: one plain Job per worker, the same
pods); ``"indexed"`` refuses such a server with the reason.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from traitlets import Any, Dict, Enum, Float, Instance, Integer, List, Unicode, default

from trainhub.backoff import Backoff, WaitTimeout, apoll, within
from trainhub.boundary.asuser import storage_tree
from trainhub.boundary.credentials import CredentialMinter
from trainhub.exceptions import InvalidRequest, TrainhubError
from trainhub.fmt import fmt_duration
from trainhub.kube import credentials as kc
from trainhub.kube.names import SECRET_ENV_KEYS
from trainhub.metrics.prometheus import GPUTarget
from trainhub.notebookjobs import notebook_info
from trainhub.profiles import ProfileCatalog
from trainhub.storage import StorageConfig

from . import k8s_job_manifests as jm
from .k8s_logs import PodLogs, log_resume_points
from .launcher import JobView, Launcher, WorkerStatus

if TYPE_CHECKING:
    from trainhub.kube.reflector import JobReflector, PodReflector

_NS_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass
class _Run:
    """What this process knows about one attempt (rebuilt by ``adopt`` after a restart)."""

    terminating: bool = False
    last: list = field(default_factory=list)
    cursors: dict = field(default_factory=dict)  # pod uid -> where its log was read up to (k8s_logs)
    resume: dict = field(default_factory=dict)  # rank -> ts_key: lines up to it are in the log already
    done: set = field(default_factory=set)  # pod uids whose final log was read
    next_read: dict = field(default_factory=dict)  # pod uid -> monotonic time of the next read
    unplaced_since: float | None = None  # monotonic time since which some pod of the gang has been unschedulable
    credentials_expire: datetime | None = None  # when the Secret's own credentials end (None: unknown, mint again)
    credentials_retry_at: float = 0.0  # monotonic time before which a failed refresh is not tried again


CREDENTIALS_RETRY = 60  # seconds between two tries at a failed refresh of an attempt's credentials
MIN_SERVER_VERSION = (1, 26)  # the Indexed form: completionMode Indexed (1.21), podFailurePolicy (beta, on by default: 1.26)


class KubernetesLauncher(PodLogs, Launcher):
    """Runs each job attempt as an Indexed Job (see the module docstring)."""

    namespace = Unicode(
        help="""Namespace of the training Jobs. Default: $TRAINHUB_JOB_NAMESPACE (the Helm chart sets it),
        else this pod's own namespace, else "default".""",
    ).tag(config=True)

    @default("namespace")
    def _namespace_default(self):
        if os.environ.get("TRAINHUB_JOB_NAMESPACE"):
            return os.environ["TRAINHUB_JOB_NAMESPACE"]
        try:
            with open(_NS_FILE) as f:
                return f.read().strip()
        except OSError:
            return "default"

    kubeconfig = Unicode(
        "",
        help="""kubeconfig file to use. Empty: the in-cluster ServiceAccount when running in a pod
        ($KUBERNETES_SERVICE_HOST set), else $KUBECONFIG / ~/.kube/config.""",
    ).tag(config=True)

    image = Unicode(help="Image of job pods when the job's profile names none (needs sh; python3 for script jobs, fsspec to copy outputs). Default: $TRAINHUB_JOB_IMAGE (the Helm chart sets it).").tag(config=True)

    @default("image")
    def _image_default(self):
        return os.environ.get("TRAINHUB_JOB_IMAGE", "")
    image_pull_secrets = List(Unicode(), help="Names of image pull Secrets for job pods.").tag(config=True)
    service_account = Unicode("", help="ServiceAccount of job pods; empty = the namespace's default. Its token is not mounted.").tag(config=True)
    python = Unicode("python3", help="Python interpreter in the job image, for `script` jobs and the outputs copy.").tag(config=True)
    kueue_queue = Unicode(
        "",
        help="""Kueue LocalQueue for job Jobs, e.g. "trainhub". Set: Jobs are created suspended with the
        kueue.x-k8s.io/queue-name label and Kueue admits each gang by unsuspending it. Empty: no Kueue;
        the jobs service's own admission (scheduler and GPU ledger) decides.""",
    ).tag(config=True)
    node_selector = Dict(help="Node selector for every job pod; the profile's node_selector is merged over it.").tag(config=True)
    tolerations = List(Dict(), help="Tolerations for every job pod; the profile's are appended.").tag(config=True)
    master_port = Integer(29500, help="Rendezvous port (MASTER_PORT) on rank 0, published by the headless Service.").tag(config=True)
    backoff_limit = Integer(
        0,
        help="""Job backoffLimit: failed pods Kubernetes retries inside one attempt. 0 (default): a failure
        ends the attempt and the engine's retries (the job's `retries`) start a new Job. Disruptions
        (eviction, node drain) never count; their pods are replaced.""",
    ).tag(config=True)
    deadline_margin = Float(
        60.0,
        help="""Seconds added to a job's time limit for activeDeadlineSeconds. The engine stops overdue jobs
        gracefully itself; the deadline is the cluster's backstop when the service is down.""",
    ).tag(config=True)
    ttl_seconds_after_finished = Integer(
        86400, allow_none=True,
        help="Finished Jobs the service has not cleaned up are deleted by Kubernetes after this many seconds (None = never).",
    ).tag(config=True)
    termination_grace = Integer(30, help="terminationGracePeriodSeconds of job pods when Kubernetes itself stops them.").tag(config=True)
    shm_size = Unicode("1Gi", help="Size of the memory-backed /dev/shm of job pods; empty = the runtime's 64 MiB.").tag(config=True)
    pod_security_context = Dict(
        {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 100, "fsGroup": 100,
         "seccompProfile": {"type": "RuntimeDefault"}},
        help="""securityContext of job pods. The default meets the "restricted" Pod Security Standard together
        with container_security_context (uid 1000, gid 100: the Jupyter images' jovyan:users), so a namespace
        enforcing it admits job pods. {} = the image's user (root in many images).""",
    ).tag(config=True)
    container_security_context = Dict(
        {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        help="securityContext of the worker container (restricted: no privilege escalation, every capability dropped).",
    ).tag(config=True)
    runtime_class_name = Unicode(
        "", help='RuntimeClass of job pods, e.g. "nvidia" where the GPU runtime is not the nodes\' default; empty = none.',
    ).tag(config=True)
    priority_class_name = Unicode(
        "", help="PriorityClass of job pods (Kubernetes' own preemption and eviction order); empty = none.",
    ).tag(config=True)
    credentials = Enum(
        ["managed", "existing", "none"],
        "managed",
        help="""How job pods get the user's AWS_* storage credentials (the ones the jobs service holds for the
        user). "managed": each attempt gets its own Secret in the job namespace, written by the launcher and owned by
        the Job (deleted with it), read by required secretKeyRef: no value in the Job, and nothing depends on the
        hub having written a Secret there or the user having started a notebook. "existing": read (required) from
        the Secret named by credentials_secret_template in the job namespace, made by someone else (for example an
        external-secrets operator). "none": plain values in the Job (development only).""",
    ).tag(config=True)
    credentials_secret_template = Unicode(
        "trainhub-storage-{username}",
        help="""The Secret of credentials="existing"; {username} is KubeSpawner's safe slug of the user name.""",
    ).tag(config=True)
    modify_job_hook = Any(
        None,
        help="""Callable (sync or async) `hook(launcher, job_view, manifest) -> manifest` to change a Job
        before it is created (extra volumes, a priority class, Kueue's priority label...).""",
    ).tag(config=True)
    gang_timeout = Float(
        300.0,
        help="""Without Kueue nothing places a multi-pod job all at once: when some pod of an attempt has been
        unschedulable this many seconds (while the others may hold their GPUs), the attempt is stopped and the job
        requeued with the scheduler's message, not counted against its retries. With Kueue (kueue_queue) Kueue
        admits gangs whole and this is not used. 0 = never.""",
    ).tag(config=True)
    job_form = Enum(
        ["auto", "indexed", "per-worker"],
        "auto",
        help="""How an attempt's gang is made. "indexed": one Indexed Job with a pod failure policy (Kubernetes 1.26+;
        an older server is refused with the reason, as it would drop those fields silently). "per-worker": one plain
        Job per worker with the same pods (any Kubernetes; an evicted pod fails its worker instead of being replaced,
        and Kueue cannot admit it). "auto" (default): indexed on 1.26 and newer, per-worker before.""",
    ).tag(config=True)
    request_timeout = Float(10.0, help="Seconds one API request may take.").tag(config=True)
    retry_timeout = Float(30.0, help="Seconds a failing request (5xx, 429, timeout) is retried, with capped exponential backoff.").tag(config=True)

    catalog = Instance(ProfileCatalog, help="Profiles (c.ProfileCatalog): GPU resource, node selector, tolerations, image, CPU and memory of a job.")

    @default("catalog")
    def _catalog_default(self):
        return ProfileCatalog(parent=self)

    storage = Instance(StorageConfig, help="The platform's storage (c.StorageConfig): the credentials job pods get.")

    @default("storage")
    def _storage_default(self):
        return StorageConfig(parent=self)

    @property
    def own_credentials(self) -> bool:
        """Whether job pods get their user's own minted credentials, as files of the attempt's Secret
        (``credentials = "managed"``, S3 storage, the platform's key not shared on purpose): trainhub.kube.credentials."""
        return self.credentials == "managed" and kc.pods_get_own_credentials(self.storage)

    def _pod_credentials(self) -> kc.PodCredentials:
        if self._pod_creds is None:
            self._pod_creds = kc.PodCredentials(self.storage, CredentialMinter(parent=self))
        return self._pod_creds

    def _storage_credentials(self, job: JobView, env: dict) -> dict:
        """``env`` with the credentials job pods get. Their user's own (:attr:`own_credentials`): the variables that
        point at the mounted Secret's config, and no AWS key at all. Otherwise ("existing" or "none", or the platform's
        key shared on purpose) the AWS_* values of the old delivery: the admin's user_credentials_hook or else the
        platform's key."""
        if not self.storage.url or self.storage.protocol != "s3":
            return env
        if self.own_credentials:
            own = self._pod_credentials().env(job.user)
            return {**{k: v for k, v in env.items() if k not in SECRET_ENV_KEYS}, **own}  # own: its AWS_CONFIG_FILE
        if any(env.get(k) for k in SECRET_ENV_KEYS):
            return env
        old = self.storage.env_for(job.user, platform_credentials=True)
        return {**env, **{k: old[k] for k in SECRET_ENV_KEYS if old.get(k)}}

    async def _refresh_credentials(self, job: JobView, name: str, run: _Run) -> None:
        """A running attempt's credentials minted again once due (after a restart: at the first poll), into its Secret.
        A failure is logged and tried again a minute later at the earliest (never an STS call at every poll); the
        pods keep what they read until then."""
        from kubernetes_asyncio.client.rest import ApiException

        if not self.own_credentials or not self._pod_credentials().due(run.credentials_expire):
            return
        if time.monotonic() < run.credentials_retry_at:
            return
        secret_name = jm.credentials_secret_name(name)
        try:
            data, expires = await asyncio.to_thread(self._pod_credentials().secret_data, job.user)
            # a merge patch of its values: the owners stay, and the service never reads a Secret
            await self._request(f"patch secret {secret_name}", self._core.patch_namespaced_secret, secret_name,
                                self.namespace, {"stringData": data},
                                _content_type="application/merge-patch+json")
        except Exception as e:
            run.credentials_retry_at = time.monotonic() + CREDENTIALS_RETRY
            what = f"{e.status} {e.reason}" if isinstance(e, ApiException) else str(e)
            self.log.warning("kubernetes: refreshing the storage credentials of job %s failed (%s); trying again in "
                             "%d s", job.key, what, CREDENTIALS_RETRY)
            return
        run.credentials_expire = expires
        self.log.info("kubernetes: storage credentials of job %s refreshed (valid until %s)", job.key, expires.isoformat())

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._api_client = None
        self._core = self._batch = None
        self._jobs_cache: JobReflector | None = None
        self._pods_cache: PodReflector | None = None
        self._runs: dict[str, _Run] = {}
        self._pod_creds: kc.PodCredentials | None = None
        self._devices: dict[int, tuple[str, int, int]] = {}  # ledger device -> (job name, rank, slot)
        self._lock = asyncio.Lock()
        self.form = "indexed"  # the form new attempts get, decided from the server's version at connect
        self.server_version = ""

    def check(self, spec) -> None:
        """A notebook job (``trainhub.notebookjobs``) runs in a pod of its own, which never sees the notebook server's
        home: only one whose notebook lies in the user's storage area can put its outputs where the user reads them
        (the server shows that area through its storage mount). Refused at submission, with what to do, otherwise."""
        info = notebook_info({"env": spec.env})
        if info is None:
            return
        if not self.storage.url:
            raise InvalidRequest(
                "notebook jobs on Kubernetes put the executed notebook into your storage area, and this platform has no "
                "storage configured (StorageConfig.url; the chart's trainhub.storage.url): ask an admin to set it up")
        if not info.get("storage"):
            raise InvalidRequest(
                f"{info['input']} is in your notebook server's own home folder, which a job's pod on Kubernetes cannot "
                "see, so the executed notebook could not come back next to it. Move the notebook into your storage area "
                "(the 'storage' folder of your home, mounted from object storage) and create the job from there")

    # -- API plumbing -------------------------------------------------------------------------

    async def _connect(self) -> None:
        if self._api_client is not None:
            return
        async with self._lock:
            if self._api_client is not None:
                return
            from kubernetes_asyncio import client, config

            from trainhub.kube.reflector import JobReflector, PodReflector

            cfg = client.Configuration()
            if not self.kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config(client_configuration=cfg)
            else:
                await config.load_kube_config(config_file=self.kubeconfig or None, client_configuration=cfg)
            api_client = client.ApiClient(configuration=cfg)
            try:
                await self._check_server_version(client.VersionApi(api_client))
            except BaseException:
                await api_client.close()
                raise
            core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
            # the one watch cache (kubespawner's reflector), on this launcher's own API client
            caches = dict(parent=self, namespace=self.namespace, labels={jm.MANAGED_BY_LABEL: jm.MANAGED_BY},
                          request_timeout=max(int(self.request_timeout), 1))
            jobs, pods = JobReflector(api=batch, **caches), PodReflector(api=core, **caches)
            try:
                await within(asyncio.gather(jobs.start(), pods.start()), self.retry_timeout)
            except BaseException:
                await asyncio.gather(jobs.stop(), pods.stop(), return_exceptions=True)
                await api_client.close()
                raise
            self._core, self._batch = core, batch
            self._jobs_cache, self._pods_cache = jobs, pods
            self._api_client = api_client

    async def _ready(self) -> None:
        await self._connect()

    async def _check_server_version(self, version_api) -> None:
        """Refuse, with the reason, an API server older than the Job features this launcher relies on.

        An older apiserver accepts the Job and silently drops ``completionMode`` (1.21) and
        ``podFailurePolicy`` (1.26): the gang would run as plain pods without ranks or the disruption
        rule. Failing at the first job, loudly, is better than a job that runs wrong.
        """
        info = await self._request("read the server's version", version_api.get_code)
        major = int(re.sub(r"\D.*", "", str(info.major)) or 0)
        minor = int(re.sub(r"\D.*", "", str(info.minor)) or 0)
        self.server_version = info.git_version
        if (major, minor) >= MIN_SERVER_VERSION:
            self.form = "per-worker" if self.job_form == "per-worker" else "indexed"
            return
        need = ".".join(map(str, MIN_SERVER_VERSION))
        if self.job_form == "indexed":
            raise TrainhubError(
                f"the Kubernetes API server is {info.git_version}; trainhub's Indexed Jobs need Kubernetes {need} or newer "
                "(Indexed Jobs: 1.21, pod failure policy: 1.26). Upgrade the cluster, set "
                'KubernetesLauncher.job_form = "auto" (one Job per worker), or run jobs with the local launcher '
                "(JobsService.launcher_class)")
        if self.kueue_queue:
            raise TrainhubError(
                f"the Kubernetes API server is {info.git_version}: Kueue admits a gang as one suspended Indexed Job, which "
                f"needs Kubernetes {need} or newer. Upgrade the cluster or turn Kueue off (KubernetesLauncher.kueue_queue)")
        self.form = "per-worker"
        self.log.info("kubernetes: the API server is %s (before %s): attempts run as one Job per worker", info.git_version, need)

    async def close(self) -> None:
        """Stop the watch caches and close the HTTP session (call when the service stops)."""
        for cache in (self._jobs_cache, self._pods_cache):
            if cache:
                await cache.stop()
        self._jobs_cache = self._pods_cache = None
        if self._api_client is not None:
            await self._api_client.close()
        self._api_client = None

    async def _request(self, what: str, call, *args, **kwargs):
        """One API call with a timeout, retried with capped exponential backoff on 5xx, 429 and timeouts.

        Other errors (404, 409, 4xx) are raised at once for the caller to handle on purpose.
        """
        from kubernetes_asyncio.client.rest import ApiException

        pause = Backoff(f"kubernetes: {what}", start=0.2, cap=5.0, jitter=0.5, timeout=self.retry_timeout)
        while True:
            try:
                return await within(call(*args, **kwargs), self.request_timeout)
            except ApiException as e:
                if e.status < 500 and e.status != 429:
                    raise
                err: Exception = e
            except (asyncio.TimeoutError, OSError) as e:
                err = e
            try:
                await pause.asleep()
            except WaitTimeout:
                self.log.error("kubernetes: %s failed after retries: %s", what, err)
                raise err from None

    async def _read_job(self, name: str) -> dict | None:
        from kubernetes_asyncio.client.rest import ApiException

        try:
            job = await self._request(f"read job {name}", self._batch.read_namespaced_job, name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            self.log.exception("kubernetes: reading job %s failed", name)
            raise
        return self._api_client.sanitize_for_serialization(job)

    # -- the contract ---------------------------------------------------------------------------

    def _profile(self, job: JobView):
        if not job.profile:
            return None
        try:
            return self.catalog.get(job.profile)
        except TrainhubError as e:
            self.log.warning("job %s: %s; using the launcher's defaults", job.key, e.message)
            return None

    def _secret_name(self, user: str) -> str | None:
        if self.credentials != "existing" or not self.credentials_secret_template:
            return None
        try:
            from kubespawner.slugs import safe_slug

            slug = safe_slug(user)
        except ImportError:  # pragma: no cover - kubespawner is in the kubernetes extra
            from trainhub.kube.names import k8s_name

            slug = k8s_name(user)
        return self.credentials_secret_template.format(username=slug)

    def _outputs_url(self, job: JobView, env: dict) -> str | None:
        # the engine's OutputSyncer.target_url: <user storage URL>/jobs/<key>
        return env.get("TRAINHUB_OUTPUTS_URL") or (
            f"{env['TRAINHUB_STORAGE_URL'].rstrip('/')}/jobs/{job.key}" if env.get("TRAINHUB_STORAGE_URL") else None)

    def stage_workdir(self, job: JobView, outputs_url: str | None) -> str:
        """Copy the archive of the working directory ``job`` was sent with to its storage area
        (``<outputs_url>/workdir.tar.gz``), where every pod fetches and unpacks it (WORKER_SH); returns that URL.
        Blocking. A local-folder storage is written as the area's owner by descriptors (trainhub.boundary)."""
        if not outputs_url:
            raise TrainhubError(f"job {job.key} was sent with a working directory, but the jobs service has no storage "
                                "to hand it to its pods (c.StorageConfig.url)")
        archive = self.workdir_archive(job)
        url = f"{outputs_url.rstrip('/')}/{jm.WORKDIR_ARCHIVE}"
        fd = os.open(archive, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if self.storage.url and self.storage.is_local:
                tree, rel = storage_tree(self.storage, None, self.storage.strip(outputs_url))
                with tree:
                    tree.copy_in(fd, f"{rel}/{jm.WORKDIR_ARCHIVE}" if rel else jm.WORKDIR_ARCHIVE)
            else:
                self.storage.filesystem(job.user).put_file(f"/proc/self/fd/{fd}", self.storage.strip(url))
        finally:
            os.close(fd)
        return url

    def build_manifests(self, job: JobView, devices: list[list[int]], env: dict, outputs_url: str | None = None,
                        workdir_url: str | None = None) -> tuple[dict, dict]:
        """(Job, Service) for this attempt; the Service gets its owner reference once the Job exists. ``workdir_url``:
        where the pods fetch the job's working directory (:meth:`stage_workdir`)."""
        profile = self._profile(job)
        name = jm.job_name(job.key, job.attempt)
        gpus = len(devices[0]) if devices and devices[0] else job.gpus
        image = (profile.image if profile and profile.image else None) or self.image
        if not image:
            raise TrainhubError("no image for the job's pods: set KubernetesLauncher.image or the profile's image")
        labels = jm.job_labels(job.id, job.key, job.attempt, name, job.profile)
        if not outputs_url:
            outputs_url = self._outputs_url(job, env)
        secret_name, secret_keys = self._secret_name(job.user), SECRET_ENV_KEYS
        credentials_volume = None
        if self.own_credentials:  # the Secret's files, mounted: no key in the environment
            secret_name, credentials_volume = None, kc.volume_parts(jm.credentials_secret_name(name))
        elif self.credentials == "managed":
            secret_keys = sorted(k for k in SECRET_ENV_KEYS if env.get(k))
            secret_name = jm.credentials_secret_name(name) if secret_keys else None
        wenv = jm.worker_env(
            name=name, workers=job.workers, master_port=self.master_port, base_env=env, user_env=job.env,
            command=job.command, script=job.script, outputs_url=outputs_url,
            gpus=gpus, python=self.python, secret_name=secret_name, secret_keys=secret_keys, secret_optional=False,
            cpu_limit=profile.cpu_limit if profile else None, workdir_url=workdir_url,
            workdir_limits=self.workdir_store.limits,
        )
        node_selector = {**self.node_selector, **(profile.node_selector if profile else {})}
        tolerations = list(self.tolerations) + [dict(t) for t in (profile.tolerations if profile else ()) if dict(t) not in self.tolerations]
        manifest = jm.make_job(
            name=name, namespace=self.namespace, labels=labels, user=job.user, workers=job.workers, image=image,
            env=wenv, gpus=gpus, gpu_resource=profile.gpu_resource if profile else "nvidia.com/gpu",
            cpu_limit=profile.cpu_limit if profile else None, mem_limit=profile.mem_limit if profile else None,
            cpu_request=profile.cpu_guarantee if profile else None, mem_request=profile.mem_guarantee if profile else None,
            node_selector=node_selector, tolerations=tolerations, time_limit=job.time_limit,
            deadline_margin=self.deadline_margin, backoff_limit=self.backoff_limit, grace=self.termination_grace,
            service_account=self.service_account, queue_name=self.kueue_queue,
            ttl_after_finished=self.ttl_seconds_after_finished, image_pull_secrets=self.image_pull_secrets,
            shm_size=self.shm_size or None, pod_security_context=self.pod_security_context,
            container_security_context=self.container_security_context,
            runtime_class_name=self.runtime_class_name, priority_class_name=self.priority_class_name,
            credentials_volume=credentials_volume,
        )
        service = jm.make_headless_service(name=name, namespace=self.namespace, labels=labels, port=self.master_port)
        return manifest, service

    async def launch(self, job: JobView, devices: list[list[int]], env: dict) -> dict:
        from kubernetes_asyncio.client.rest import ApiException

        await self._connect()
        jdir = Path(self.job_dir(job))
        adir = jdir / f"attempt-{job.attempt}"
        await asyncio.to_thread(_prepare_dir, jdir, adir, job)
        env = self._storage_credentials(job, env)
        minted = None
        if self.own_credentials:  # minted before anything is created: a refusal says what to set, and no pod starts
            minted = await asyncio.to_thread(self._pod_credentials().secret_data, job.user)
        workdir_url = None
        if job.workdir:
            workdir_url = await asyncio.to_thread(self.stage_workdir, job, self._outputs_url(job, env))
        manifest, service = self.build_manifests(job, devices, env, workdir_url=workdir_url)
        if self.modify_job_hook is not None:
            out = self.modify_job_hook(self, job, manifest)
            manifest = (await out) if asyncio.iscoroutine(out) else (out or manifest)
        name = manifest["metadata"]["name"]
        form = self.form
        manifests = [manifest] if form == "indexed" else jm.per_worker_jobs(manifest)
        created_jobs = []
        try:
            for m in manifests:
                created_jobs.append(await self._create_job(m))
        except BaseException:
            for made in created_jobs:  # gang: all or nothing
                await self._delete_job(made["metadata"]["name"], "Background", None)
            raise
        owner, owners = (created_jobs[0], []) if form == "indexed" else (None, created_jobs)
        values = minted[0] if minted else {k: env[k] for k in SECRET_ENV_KEYS if env.get(k)}
        await self._create_credentials(name, values, service["metadata"]["labels"], owner, owners, form)
        service = jm.make_headless_service(name=name, namespace=self.namespace, labels=service["metadata"]["labels"],
                                           port=self.master_port, owner=owner, owners=owners)
        try:
            await self._request(f"create service {name}", self._core.create_namespaced_service, self.namespace, service)
        except ApiException as e:
            if e.status != 409:
                self.log.exception("kubernetes: creating service %s failed; deleting job %s", name, name)
                await self._delete_jobs(name, form, job.workers, "Background", None)  # gang: all or nothing
                raise
        self._runs[name] = _Run(credentials_expire=minted[1] if minted else None)
        self._remember_devices(name, devices)
        self.log.info("kubernetes: job %s: %s %s/%s created (%d worker(s)%s)", job.key,
                      "Job" if form == "indexed" else "one Job per worker,", self.namespace, name, job.workers,
                      f", queued in Kueue queue {self.kueue_queue}" if self.kueue_queue else "")
        return {
            "kind": "kubernetes", "name": name, "namespace": self.namespace, "form": form,
            "uid": created_jobs[0]["metadata"].get("uid"),
            "attempt": job.attempt, "dir": str(adir), "kueue_queue": self.kueue_queue or None,
            "workers": [{"rank": r, "devices": list(devices[r]) if devices else []} for r in range(job.workers)],
        }

    async def _create_job(self, manifest: dict) -> dict:
        """Create one Job; one that exists already (a launch interrupted by a restart) is this attempt's and is adopted."""
        from kubernetes_asyncio.client.rest import ApiException

        name = manifest["metadata"]["name"]
        try:
            # Strict: a field this server does not know is an error, never silently dropped (1.27+; older servers
            # ignore it, which is why the form is chosen from the server's version)
            created = await self._request(f"create job {name}", self._batch.create_namespaced_job, self.namespace, manifest,
                                          field_validation="Strict")
            return self._api_client.sanitize_for_serialization(created)
        except ApiException as e:
            if e.status != 409:
                self.log.exception("kubernetes: creating job %s failed", name)
                raise
            self.log.info("kubernetes: job %s exists already; adopting it", name)
            created = await self._read_job(name)
            if created is None:
                raise
            return created

    async def _create_credentials(self, name: str, values: dict, labels: dict, created: dict | None, owners: list,
                                  form: str) -> None:
        """The attempt's credentials Secret with ``values`` (the user's own minted files, or the AWS_* keys of the old
        delivery), right after its Job (owned by it, so it goes with it; pods that start first wait for it, as kubelet
        retries a missing Secret). Refused: the Job goes too (a job must never run without the credentials it was
        given)."""
        from kubernetes_asyncio.client.rest import ApiException

        if self.credentials != "managed" or not values:
            return
        secret = jm.make_credentials_secret(name=jm.credentials_secret_name(name), namespace=self.namespace,
                                            labels=labels, values=values, owner=created, owners=owners)
        try:
            await self._request(f"create secret {secret['metadata']['name']}", self._core.create_namespaced_secret,
                                self.namespace, secret)
        except ApiException as e:
            if e.status == 409:  # an adopted attempt: written before the restart
                return
            self.log.error("kubernetes: creating the credentials Secret of job %s failed (%s %s); deleting the job",
                           name, e.status, e.reason)
            await self._delete_jobs(name, form, len(owners) or 1, "Background", None)
            raise TrainhubError(f"could not give job {name} its storage credentials: the jobs service may not create "
                                f"Secrets in namespace {self.namespace} ({e.status} {e.reason}); see the launcher Role "
                                "or set KubernetesLauncher.credentials") from None

    def _name(self, job: JobView, state: dict) -> str:
        return state.get("name") or jm.job_name(job.key, state.get("attempt") or job.attempt)

    def _job_pods(self, name: str) -> list[dict]:
        return [p for p in self._pods_cache.resources.values()
                if ((p.get("metadata") or {}).get("labels") or {}).get(jm.JOB_NAME_LABEL) == name]

    @staticmethod
    def _job_names(name: str, form: str, workers: int) -> list[str]:
        return [name] if form == "indexed" else [jm.worker_job_name(name, r) for r in range(workers)]

    async def _current(self, name: str, form: str = "indexed", workers: int = 1) -> dict | None:
        """The attempt's Job (the per-worker form's Jobs folded into one), from the cache; read directly when missing
        there (just created, or gone)."""
        jobs = {}
        for rank, n in enumerate(self._job_names(name, form, workers)):
            obj = self._jobs_cache.get(n)
            jobs[rank] = obj if obj is not None else await self._read_job(n)
        return jobs[0] if form == "indexed" else jm.combine_worker_jobs(jobs, workers)

    async def poll(self, job: JobView, state: dict) -> list[WorkerStatus]:
        await self._ready()
        name = self._name(job, state)
        run = self._runs.setdefault(name, _Run())
        obj = await self._current(name, state.get("form") or "indexed", job.workers)
        pods = self._job_pods(name)
        await self._collect_logs(job, state, pods, run)
        if obj is not None and jm.job_finished(obj) is None:
            await self._refresh_credentials(job, name, run)
        if obj is None and not pods and run.last:
            # gone after we saw it: deleted by terminate (SIGTERM), by hand or by the TTL controller
            code = -15 if run.terminating else -9
            return [s if not s.running else WorkerStatus(s.rank, running=False, exit_code=code, lost=not run.terminating)
                    for s in run.last]
        statuses = jm.worker_statuses(obj, pods, job.workers)
        if obj is not None:
            run.last = statuses
        return statuses

    async def stalled(self, job: JobView, state: dict) -> str | None:
        if self.kueue_queue or self.gang_timeout <= 0:
            return None
        name = self._name(job, state)
        run = self._runs.setdefault(name, _Run())
        unplaced = [p for p in self._job_pods(name) if jm.unschedulable(p)]
        if not unplaced:
            run.unplaced_since = None
            return None
        now = time.monotonic()
        if run.unplaced_since is None:
            run.unplaced_since = now
        if now - run.unplaced_since < self.gang_timeout:
            return None
        pod = unplaced[0]
        placed = job.workers - len(unplaced)
        return (f"only {placed} of {job.workers} workers could be placed on the cluster for "
                f"{fmt_duration(self.gang_timeout, 'units')} (worker {jm.pod_index(pod)}: {jm.unschedulable(pod)})")

    async def terminate(self, job: JobView, state: dict, grace: float) -> None:
        await self._ready()
        name = self._name(job, state)
        run = self._runs.setdefault(name, _Run())
        run.terminating = True
        await self._collect_logs(job, state, self._job_pods(name), run, force=True)
        form = state.get("form") or "indexed"
        await self._delete_jobs(name, form, job.workers, "Foreground", int(math.ceil(grace)))

        async def gone() -> bool:
            pods = self._job_pods(name)
            await self._collect_logs(job, state, pods, run)
            return not pods and all(self._jobs_cache.get(n) is None for n in self._job_names(name, form, job.workers))

        try:
            await apoll(gone, what=f"job {name}'s pods to end", start=min(self.log_interval, 0.5), factor=1.0,
                        timeout=grace + 30)
        except WaitTimeout:
            self.log.warning("kubernetes: %s still has pods %.0fs after its deletion", name, grace + 30)

    async def _delete_jobs(self, name: str, form: str, workers: int, propagation: str, grace: int | None) -> bool:
        """Delete the attempt's Job, or each worker's Job in the per-worker form; whether any was there."""
        found = False
        for n in self._job_names(name, form, workers):
            found = await self._delete_job(n, propagation, grace) or found
        return found

    async def _delete_job(self, name: str, propagation: str, grace: int | None) -> bool:
        from kubernetes_asyncio.client.rest import ApiException

        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        try:
            await self._request(f"delete job {name}", self._batch.delete_namespaced_job, name, self.namespace, body=body)
        except ApiException as e:
            if e.status == 404:
                return False
            self.log.exception("kubernetes: deleting job %s failed", name)
            raise
        return True

    async def adopt(self, job: JobView, state: dict) -> bool:
        await self._ready()
        name = self._name(job, state)
        obj = await self._current(name, state.get("form") or "indexed", job.workers)
        if obj is None:
            self.log.warning("kubernetes: job %s: Job %s/%s is gone", job.key, self.namespace, name)
            return False
        run = self._runs.setdefault(name, _Run())
        adir = state.get("dir")
        if adir:
            run.resume = await asyncio.to_thread(log_resume_points, Path(adir), job.workers)
        self._remember_devices(name, [w.get("devices") or [] for w in state.get("workers") or []])
        return True

    async def cleanup(self, job: JobView, state: dict) -> None:
        name = state.get("name")
        if not name:
            return
        await self._connect()
        await self._delete_jobs(name, state.get("form") or "indexed", job.workers, "Background", None)
        self._runs.pop(name, None)
        self._devices = {d: t for d, t in self._devices.items() if t[0] != name}

    # -- GPU targets for the DCGM metrics source --------------------------------------------------

    def _remember_devices(self, name: str, devices: list[list[int]]) -> None:
        for rank, devs in enumerate(devices or []):
            for slot, d in enumerate(devs or []):
                self._devices[d] = (name, rank, slot)

    def gpu_targets(self, devices: list[int]) -> dict[int, GPUTarget]:
        """Ledger devices of running jobs → the pod and GPU slot holding them (from the pod cache).

        Give it to ``PrometheusDCGMSource.resolver`` so the engine's GPU samples come from DCGM.
        """
        out = {}
        if self._pods_cache is None:
            return out
        for d in devices:
            where = self._devices.get(d)
            if not where:
                continue
            name, rank, slot = where
            pods = [p for p in self._job_pods(name) if jm.pod_index(p) == rank
                    and (p.get("status") or {}).get("phase") == "Running"]
            if pods:
                out[d] = GPUTarget(self.namespace, pods[0]["metadata"]["name"], slot)
        return out

def _prepare_dir(jdir: Path, adir: Path, job: JobView) -> None:
    adir.mkdir(parents=True, exist_ok=True)
    (jdir / "outputs").mkdir(exist_ok=True)
    if job.script is not None:
        (jdir / "script.py").write_text(job.script)
