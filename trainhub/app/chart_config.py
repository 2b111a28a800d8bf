"""The Helm chart's settings as traitlets config, for the services that run inside the cluster.

The chart renders its ``trainhub:`` values into ``trainhub.json`` (a ConfigMap mounted at
``$TRAINHUB_K8S_CONFIG``); the jobs service and the culler both turn it into the same
configuration here, so profiles, quotas, the launcher, the ledger and the GPU metrics source
mean the same in every process. Pure: no Kubernetes client is imported.
"""

from __future__ import annotations

from traitlets.config import Config


def storage_config(c: Config, storage: dict) -> None:
    """The chart's ``storage:`` values on ``c`` (the hub's extraConfig and the services both use this): the area and
    how users' pods get credentials of their own (``storage.credentials``: a role per user, or one role narrowed by a
    session policy, minted by CredentialMinter; or, by name, the platform's key for everyone)."""
    if not storage.get("url"):
        return
    c.StorageConfig.url = storage["url"]
    c.StorageConfig.endpoint_url = storage.get("endpointUrl") or ""
    creds = storage.get("credentials") or {}
    c.CredentialMinter.per_user_roles = bool(creds.get("perUserRoles"))
    c.CredentialMinter.role_arn = creds.get("roleArn") or ""
    if creds.get("duration"):
        c.CredentialMinter.duration = int(creds["duration"])
    c.StorageConfig.share_platform_credentials = bool(creds.get("sharePlatformKey"))


def config_from_chart(data: dict) -> Config:
    """Traitlets config for the jobs service (and the culler) from the Helm chart's ``trainhub.json``.

    ``data`` is the ConfigMap's JSON (``$TRAINHUB_K8S_CONFIG``, rendered from the ``trainhub:``
    values). Sets the profiles and quotas, the storage, the launcher (``jobs.launcher``: ``kubernetes`` selects
    this module's ``KubernetesLauncher``) with its pod settings and Kueue queue, and, when
    ``metrics.prometheusUrl`` is set, ``PrometheusDCGMSource`` as the GPU metrics source.
    """
    c = Config()
    c.ProfileCatalog.profiles = data.get("profiles") or []
    c.ProfileCatalog.default_profile = data.get("defaultProfile") or ""
    c.ProfileCatalog.cpu_profile = data.get("cpuProfile") or ""
    quotas = data.get("quotas") or {}
    c.QuotaPolicy.user_gpu_limit = quotas.get("userGpuLimit")
    c.QuotaPolicy.user_gpu_limits = quotas.get("userGpuLimits") or {}
    c.QuotaPolicy.group_gpu_limits = quotas.get("groupGpuLimits") or {}
    if "userCpuWorkerLimit" in quotas:  # absent: the policy's default (the service's cores, at least 4)
        c.QuotaPolicy.user_cpu_worker_limit = quotas["userCpuWorkerLimit"]
    c.QuotaPolicy.user_cpu_worker_limits = quotas.get("userCpuWorkerLimits") or {}
    # where jobs' outputs, values back and checkpoints go (their area, <user storage>/jobs/<key>): the notebook reads
    # them from there; the platform's credentials come from $AWS_* (the chart's platformCredentialsSecret)
    storage = data.get("storage") or {}
    storage_config(c, storage)
    jobs = data.get("jobs") or {}
    if jobs.get("launcher", "kubernetes") == "kubernetes":
        c.JobsService.launcher_class = "trainhub.services.jobs.kubernetes.KubernetesLauncher"
        k = c.KubernetesLauncher
        if data.get("jobNamespace"):
            k.namespace = data["jobNamespace"]
        pod = jobs.get("pod") or {}
        if pod.get("image"):
            k.image = pod["image"]
        k.service_account = pod.get("serviceAccount") or ""
        k.master_port = int(pod.get("masterPort") or 29500)
        k.backoff_limit = int(pod.get("backoffLimit") or 0)
        k.shm_size = pod.get("shmSize") or ""
        if "securityContext" in pod:
            k.pod_security_context = pod["securityContext"] or {}
        if "containerSecurityContext" in pod:
            k.container_security_context = pod["containerSecurityContext"] or {}
        k.runtime_class_name = pod.get("runtimeClassName") or ""
        k.priority_class_name = pod.get("priorityClassName") or ""
        if "ttlSecondsAfterFinished" in pod:
            k.ttl_seconds_after_finished = pod["ttlSecondsAfterFinished"]
        kueue = data.get("kueue") or {}
        k.kueue_queue = (kueue.get("localQueue") or "") if kueue.get("enabled") else ""
        k.credentials = storage.get("secret") or "managed"  # the notebooks' choice, for the jobs too
        if storage.get("secretNameTemplate"):
            k.credentials_secret_template = storage["secretNameTemplate"]
    # the GPU ledger from the cluster (nodes and pods), for the engine's admission and the culler
    allocator = "trainhub.spawner.k8s_allocator.KubernetesGPUAllocator"
    if jobs.get("launcher", "kubernetes") == "kubernetes":
        c.JobsService.allocator_class = allocator
    c.GPUCuller.allocator_class = allocator
    spawner = data.get("spawner") or {}
    c.KubernetesGPUAllocator.watch_all_namespaces = bool(spawner.get("gpuWatchAllNamespaces", True))
    if data.get("jobNamespace"):
        c.KubernetesGPUAllocator.namespace = data["jobNamespace"]
    culler = data.get("culler") or {}
    if culler.get("idleTimeout") is not None:
        c.CullPolicy.default_timeout = float(culler["idleTimeout"])
    if culler.get("awayTimeout") is not None:
        c.CullPolicy.away_timeout = float(culler["awayTimeout"])
    if culler.get("checkInterval"):
        c.GPUCuller.check_interval = float(culler["checkInterval"])
    if culler.get("action"):
        c.CullPolicy.action = culler["action"]
    for key, trait in (("warningPeriod", "warning_period"), ("releaseTimeout", "release_timeout"),
                       ("releaseWarningPeriod", "release_warning_period"), ("startGracePeriod", "start_grace_period"),
                       ("newUserReleaseTimeout", "new_user_release_timeout"), ("reversalPrice", "reversal_price")):
        if culler.get(key) is not None:
            setattr(c.CullPolicy, trait, float(culler[key]))
    if culler.get("learnReleaseClock") is not None:
        c.CullPolicy.learn_release_clock = bool(culler["learnReleaseClock"])
    # kernels are read through the proxy; inside the cluster the chart's proxy-public Service
    c.GPUCuller.public_url = data.get("publicUrl") or "http://proxy-public"
    metrics = data.get("metrics") or {}
    if metrics.get("prometheusUrl"):
        source = "trainhub.metrics.prometheus.PrometheusDCGMSource"
        c.JobsService.metrics_source_class = source
        # the same settings (config of PrometheusDCGMSource applies to the subclass), resolving
        # server holdings to notebook pods through the culler's KubernetesGPUAllocator
        c.GPUCuller.metrics_class = "trainhub.spawner.k8s_allocator.PodDCGMSource"
        p = c.PrometheusDCGMSource
        p.url = metrics["prometheusUrl"]
        p.selector = metrics.get("selector") or ""
        p.namespace_label = metrics.get("namespaceLabel") or "namespace"
        p.pod_label = metrics.get("podLabel") or "pod"
        p.util_metric = metrics.get("utilMetric") or "DCGM_FI_DEV_GPU_UTIL"
        p.util_scale = float(metrics.get("utilScale") or 1)
        p.max_age = float(metrics.get("maxAge") or 120)
    return c
