"""The Kubernetes back end's spawner: KubeSpawner driven by trainhub profiles and quotas.

``GPUKubeSpawner`` reads the same ``ProfileCatalog``, ``QuotaPolicy`` and ``StorageConfig``
configuration as the local back end and turns the chosen profile into KubeSpawner settings
(GPU limits under the profile's resource name, node selector, tolerations, image, CPU and
memory). Before anything is created it checks, from shared watch caches of nodes and pods
(one per process, never a list per request):

* the profile exists and the user may use it (400 / 403),
* the user's and their groups' GPU quotas, counting GPUs held by the user's active notebook
  and job pods (403),
* that some node has enough of the profile's GPU resource free (409).

Manifests come from the pure builders in ``trainhub.spawner.k8s_manifests``.
"""

from __future__ import annotations

import asyncio
import copy
import html
import time

from kubernetes_asyncio.client.rest import ApiException
from kubespawner import KubeSpawner
from traitlets import Bool, Instance, Integer, List, Unicode, default

from trainhub.backoff import within
from trainhub.exceptions import InvalidRequest, NoFreeGPUs, ProfileDoesNotFit, TrainhubError
from trainhub.kube import kueue
from trainhub.kube.pods import shm_parts
from trainhub.kube.reflector import GPUPodReflector, NodeReflector
from trainhub.profiles import Profile, ProfileCatalog
from trainhub.quotas import Demand, QuotaPolicy
from trainhub.spawner import k8s_manifests as m
from trainhub.spawner.errors import spawn_refusal
from trainhub.spawner.k8s_storage import KubeStorage

# trait names a profile or the storage mount may set; their configured values are the base
_OVERRIDDEN = (
    "extra_resource_limits", "extra_resource_guarantees", "node_selector", "tolerations", "environment",
    "extra_labels", "extra_annotations", "image", "cpu_limit", "mem_limit", "cpu_guarantee", "mem_guarantee",
    "volumes", "volume_mounts", "init_containers", "extra_containers", "lifecycle_hooks",
)


def _check_profile_option(spawner: "GPUKubeSpawner", user_options: dict) -> None:
    """Default ``apply_user_options`` hook: only checks; load_user_options applies the profile."""
    spawner.resolve_profile(user_options)


class GPUKubeSpawner(KubeStorage, KubeSpawner):
    """KubeSpawner with trainhub profiles, GPU quotas, live GPU availability and storage mounts (:mod:`.k8s_storage`)."""

    # Spawns of this process between their capacity check and their pod reaching the cache:
    # {"namespace/pod": (monotonic time, stand-in pod)}. Entries leave on their own (pod seen,
    # start failed, server stopped, or start_timeout passed); nothing needs resetting.
    _reservations: dict = {}

    catalog = Instance(ProfileCatalog, help="The profile catalog (configured as c.ProfileCatalog).")
    quota = Instance(QuotaPolicy, help="GPU quotas (configured as c.QuotaPolicy).")

    @default("catalog")
    def _catalog_default(self):
        return ProfileCatalog(parent=self)

    @default("quota")
    def _quota_default(self):
        return QuotaPolicy(parent=self)

    check_gpu_availability = Bool(
        True,
        help="""Refuse a spawn (409) when no ready node has the profile's GPUs free, judged from the
        node and pod caches. Set False where a cluster autoscaler or Kueue should hold the pod
        Pending until capacity appears instead.""",
    ).tag(config=True)

    check_node_fit = Bool(
        True,
        help="""Refuse a spawn at once (400) when no ready node the profile may use could ever hold its pod: its
        CPU and memory guarantees (or limits, which Kubernetes takes as requests when no guarantee is set) and GPUs
        against each node's allocatable, not what is free now. Such a pod would stay Pending forever ("Insufficient
        cpu") with nothing telling the user why; the spawn page shows the profile as unavailable with the reason.
        Set False where a cluster autoscaler adds bigger nodes on demand.""",
    ).tag(config=True)

    gpu_watch_all_namespaces = Bool(
        True,
        help="""Watch pods in every namespace to compute free GPUs per node (needs a ClusterRole
        with list/watch on pods; the Helm chart grants it). False: only this namespace's pods are
        counted, so GPUs used by other namespaces look free.""",
    ).tag(config=True)

    gpu_quota_resources = List(
        Unicode(),
        help="""Resource names that count against GPU quotas. Empty (default): nvidia.com/gpu plus
        every profile's gpu_resource (a MIG slice counts as one unit).""",
    ).tag(config=True)

    shm_size = Unicode(
        "1Gi",
        help="""Size of the memory-backed /dev/shm of notebook pods (counts against the pod's memory); empty = the
        container runtime's 64 MiB, which PyTorch DataLoader workers outgrow at once ("bus error").""",
    ).tag(config=True)

    api_url = Unicode(
        "",
        help="""URL of the trainhub jobs API as notebook pods reach it, given to them as $TRAINHUB_API_URL (the
        %%train magics and the trainhub client use it), e.g. http://trainhub-jobs.NAMESPACE.svc:8080/services/trainhub/api.
        The Helm chart sets it (and lets notebook pods through to the jobs service); empty = not set.""",
    ).tag(config=True)

    kernel_config_map = Unicode(
        "",
        help="""ConfigMap whose key ipython_kernel_config.py is mounted at /etc/ipython/ipython_kernel_config.py
        (IPython's system-wide config) so every kernel loads %%train when $TRAINHUB_API_URL is set. The Helm
        chart makes one, trainhub-kernel-config, and sets it; empty = no mount.""",
    ).tag(config=True)

    kueue_max_queue_wait = Integer(
        6 * 3600,
        help="""Seconds a notebook pod may wait gated by Kueue (the kueue.x-k8s.io/admission scheduling gate, Kueue's
        pod integration) before the spawn fails with Kueue's reason. Time spent gated does not count against
        start_timeout, which still bounds the rest (creating the pod, pulling, starting). Applies when notebook pods
        carry Kueue's queue label (kueue.x-k8s.io/queue-name in extra_labels, as the Helm chart's
        kueue.manageNotebooks sets); 0 turns the Kueue wait off (gated time counts against start_timeout).""",
    ).tag(config=True)

    # ---- profiles -----------------------------------------------------------------------------

    def _user_groups(self) -> list[str]:
        return sorted(g.name for g in getattr(self.user, "groups", None) or [])

    def _group_members(self) -> dict[str, list[str]]:
        return {g.name: [u.name for u in getattr(g, "users", None) or []] for g in getattr(self.user, "groups", None) or []}

    def _is_admin(self) -> bool:
        return bool(getattr(self.user, "admin", False))

    def resolve_profile(self, user_options: dict | None) -> Profile:
        """The profile named in ``user_options["profile"]`` (default if none), or SpawnException 400/403."""
        options = user_options or {}
        slug = options.get("profile")
        try:
            if slug is not None and not isinstance(slug, str):
                raise InvalidRequest(f"user_options.profile must be a string, not {type(slug).__name__}")
            return self.catalog.resolve(slug, self._user_groups(), self._is_admin())
        except TrainhubError as e:
            raise spawn_refusal(e) from None

    # ---- caches -------------------------------------------------------------------------------

    async def _ensure_gpu_caches(self):
        """Start (once per process) the node and pod caches; returns (node_reflector, pod_reflector)."""
        nodes, pods = await asyncio.gather(
            self._start_reflector(kind="trainhub-nodes", reflector_class=NodeReflector, omit_namespace=True),
            self._start_reflector(
                kind="trainhub-pods", reflector_class=GPUPodReflector, omit_namespace=self.gpu_watch_all_namespaces,
            ),
        )
        return nodes, pods

    def quota_resources(self) -> list[str]:
        if self.gpu_quota_resources:
            return list(self.gpu_quota_resources)
        return sorted({m.DEFAULT_GPU_RESOURCE} | {p.gpu_resource for p in self.catalog.all()})

    def _own_key(self) -> str:
        return f"{self.namespace}/{self.pod_name}"

    def _cached_pods(self, pod_cache: dict) -> list[dict]:
        """Pods in the cache plus spawns of this process not yet there, minus this server's own pod."""
        now = time.monotonic()
        out = [p for key, p in pod_cache.items() if key != self._own_key()]
        for key, (since, fake) in list(GPUKubeSpawner._reservations.items()):
            if key in pod_cache or now - since > max(self.start_timeout, 60):
                GPUKubeSpawner._reservations.pop(key, None)
            elif key != self._own_key():
                out.append(fake)
        return out

    def _availability(self, nodes: dict, pods: list[dict], profile: Profile) -> dict:
        over = m.merge_overrides(self._base(), m.profile_overrides(profile))
        return m.gpu_availability(
            list(nodes.values()), pods, profile.gpu_resource,
            node_selector=over["node_selector"], tolerations=over["tolerations"],
        )

    async def gpu_availability(self, profile: Profile) -> dict:
        """Free units of the profile's GPU resource on nodes it may land on (from the caches)."""
        nodes, pods = await self._ensure_gpu_caches()
        return self._availability(nodes.nodes, self._cached_pods(pods.pods), profile)

    async def gpu_holdings(self):
        """GPUs held per user by active notebook and job pods (this server's own pod not counted)."""
        _, pods = await self._ensure_gpu_caches()
        return m.gpu_holdings(self._cached_pods(pods.pods), self.quota_resources())

    def node_fit(self, nodes: dict, profile: Profile) -> dict:
        """Whether some node the profile may use could ever hold its pod (``largest_fit``), with its ``requests``."""
        base = self._base()
        traits = {**base, **m.merge_overrides(base, m.profile_overrides(profile))}
        requests = m.server_requests(traits, profile.gpu_resource)
        fit = m.largest_fit(list(nodes.values()), requests, traits.get("node_selector"), traits.get("tolerations") or [])
        return {**fit, "requests": requests}

    @staticmethod
    def fit_problem(profile: Profile, fit: dict) -> ProfileDoesNotFit | None:
        """The refusal for a profile no node can ever hold (None when one can)."""
        if fit["fits"]:
            return None
        wants = m.describe_resources(fit["requests"]) if fit["requests"] else "its pod"
        if not fit["nodes"]:
            where = "there is no ready node this profile may use"
        else:
            where = f"the most any node it may use offers is {m.describe_resources(fit['largest'])}"
        return ProfileDoesNotFit(
            f"Profile {profile.display_name!r} needs {wants} for each server, and no node can hold that: {where}. "
            "Pick another profile, or ask an admin to change this one or to add a bigger node.",
            profile=profile.slug, requests=fit["requests"], largest=fit["largest"])

    async def check_capacity(self, profile: Profile) -> None:
        """Node fit, quota and availability checks for ``profile``; raises SpawnException 400 / 403 / 409.

        Passing reserves the GPUs in this process until the pod shows up in the cache, so two
        spawns started together cannot both take the last GPUs.
        """
        if self.check_node_fit:
            nodes, _ = await self._ensure_gpu_caches()
            problem = self.fit_problem(profile, self.node_fit(nodes.nodes, profile))
            if problem:
                raise spawn_refusal(problem)
        if not profile.gpus:
            return
        nodes, pod_cache = await self._ensure_gpu_caches()
        # no await from here to the reservation: check and reserve are one step on the event loop
        pods = self._cached_pods(pod_cache.pods)
        holdings = m.gpu_holdings(pods, self.quota_resources())
        status = self.quota.status(self.user.name, self._user_groups(), holdings, self._group_members())
        try:
            self.quota.admit(Demand.server(self.user.name, self._user_groups(), profile.gpus), status)
            if self.check_gpu_availability:
                avail = self._availability(nodes.nodes, pods, profile)
                if not m.can_place(avail, profile.gpus):
                    if not avail["nodes"]:
                        why = f"no ready node this profile may use offers {profile.gpu_resource}"
                    else:
                        why = (f"{avail['free']} of {avail['total']} {profile.gpu_resource} free"
                               f" (at most {avail['largest_free']} on one node"
                               + (f", {avail['pending']} wanted by pending pods" if avail["pending"] else "") + ")")
                    raise NoFreeGPUs(
                        f"Not enough free GPUs for profile {profile.slug!r}: it needs {profile.gpus}, {why}. "
                        "Try again when a server or job stops, or pick a smaller profile.",
                        requested=profile.gpus, free=avail["free"], total=avail["total"],
                    )
        except TrainhubError as e:
            raise spawn_refusal(e) from None
        GPUKubeSpawner._reservations[self._own_key()] = (
            time.monotonic(),
            m.reservation_pod(self.namespace, self.pod_name, self.user.name, profile.gpu_resource, profile.gpus),
        )

    # ---- Kueue: a gated pod is queued, not late --------------------------------------------------

    def kueue_managed(self) -> bool:
        """Whether Kueue may gate this server's pod (its queue label is configured) and the wait is on."""
        return self.kueue_max_queue_wait > 0 and kueue.QUEUE_LABEL in (self.extra_labels or {})

    def start(self):
        future = super().start()
        self._kueue_queued = None  # Kueue's reason while the pod is gated, for progress()
        if self.kueue_managed():
            # JupyterHub reads start_timeout right after start() returns and cancels the spawn after it: give it
            # the queue wait too; _kueue_guard enforces both limits separately and _start restores the value.
            self._pod_start_timeout = self.start_timeout
            self.start_timeout = self._pod_start_timeout + self.kueue_max_queue_wait
        return future

    async def _start(self):
        try:
            if getattr(self, "_pod_start_timeout", None) is None:
                return await super()._start()
            return await self._start_guarded(self._pod_start_timeout)
        except BaseException:
            GPUKubeSpawner._reservations.pop(self._own_key(), None)
            raise
        finally:
            if getattr(self, "_pod_start_timeout", None) is not None:
                self.start_timeout, self._pod_start_timeout = self._pod_start_timeout, None
            self._kueue_queued = None

    async def _start_guarded(self, pod_timeout: float):
        """KubeSpawner's start next to a guard that times gated and other time apart; the first to end wins."""
        start = asyncio.ensure_future(super()._start())
        guard = asyncio.ensure_future(self._kueue_guard(pod_timeout, self.kueue_max_queue_wait))
        try:
            await asyncio.wait({start, guard}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (start, guard):
                if not task.done():
                    task.cancel()
            await asyncio.gather(start, guard, return_exceptions=True)
        if start.done() and not start.cancelled() and start.exception() is None:
            return start.result()
        if start.done() and not start.cancelled():
            raise start.exception()
        raise guard.exception()

    async def _kueue_guard(self, pod_timeout: float, max_wait: float) -> None:
        """Raise TimeoutError when the pod was gated longer than max_wait, or otherwise pending past pod_timeout."""
        loop = asyncio.get_running_loop()
        key = self._own_key()
        last = loop.time()
        active = queued = 0.0
        next_lookup = 0.0
        while True:
            await asyncio.sleep(min(kueue.POLL_SECONDS, max(pod_timeout, 0.1)))
            now = loop.time()
            reflector = self.pod_reflector
            pod = reflector.pods.get(key) if reflector is not None else None
            if pod is not None and kueue.gated(pod):
                queued += now - last
                if self._kueue_queued is None or now >= next_lookup:
                    self._kueue_queued = await self.kueue_reason(pod)
                    next_lookup = now + kueue.LOOKUP_SECONDS
                if queued > max_wait:
                    raise TimeoutError(f"pod {key} still queued by Kueue after {kueue.duration(max_wait)}: {self._kueue_queued}")
            else:
                active += now - last
                self._kueue_queued = None
                if active > pod_timeout:
                    raise TimeoutError(f"pod {key} did not start in {pod_timeout} seconds!")
            last = now

    async def kueue_reason(self, pod: dict) -> str:
        """Kueue's reason for holding ``pod``, from its Workload's conditions; a generic line when none is readable."""
        from kubespawner.clients import shared_client

        api = shared_client("CustomObjectsApi")
        meta = pod.get("metadata") or {}
        try:
            resp = await within(api.list_namespaced_custom_object(
                kueue.GROUP, kueue.VERSION, meta.get("namespace") or self.namespace, kueue.WORKLOADS,
            ), self.k8s_api_request_timeout)
        except (ApiException, asyncio.TimeoutError) as e:
            self.log.debug("trainhub: reading Kueue workloads for %s failed: %s", self._own_key(), e)
            return kueue.NO_REASON
        workload = kueue.workload_of(pod, resp.get("items") or [])
        return kueue.reason(workload)

    def kueue_message(self) -> str | None:
        """The progress line while the pod is queued by Kueue, else None."""
        reason = getattr(self, "_kueue_queued", None)
        return f"Queued by Kueue: {reason}" if reason else None

    async def progress(self):
        """KubeSpawner's events, plus "Queued by Kueue: <reason>" each time Kueue's reason changes."""
        if not self.kueue_managed():
            async for event in super().progress():
                yield event
            return
        events: asyncio.Queue = asyncio.Queue()

        async def pump(inner):
            try:
                async for event in inner:
                    await events.put(event)
            finally:
                events.put_nowait(None)

        task = asyncio.ensure_future(pump(super().progress()))
        shown, inner_done = None, False
        try:
            while True:
                try:
                    event = await within(events.get(), kueue.POLL_SECONDS)
                except asyncio.TimeoutError:
                    event = False
                if event is None:
                    inner_done = True
                elif event:
                    yield event
                message = self.kueue_message()
                if message and message != shown:
                    yield {"message": message}
                shown = message
                future = self._start_future
                if inner_done and (future is None or future.done()):
                    return
        finally:
            task.cancel()

    async def poll(self):
        """KubeSpawner's poll; while the server runs, its user's own storage credentials are minted again when due."""
        status = await super().poll()
        if status is None:
            await self.refresh_storage_credentials()
        return status

    async def stop(self, now=False):
        GPUKubeSpawner._reservations.pop(self._own_key(), None)
        result = await super().stop(now=now)
        others = [s for s in (getattr(self.user, "spawners", None) or {}).values() if s is not self and s.active]
        if self.storage_volume_cleanup == "server-stopped" and not others:
            await self.remove_user_storage_objects()
        return result

    async def delete_forever(self):
        await super().delete_forever()
        if self.storage_volume_cleanup != "never" and not self.name:  # named servers share the user's objects
            await self.remove_user_storage_objects()

    # ---- applying a profile -------------------------------------------------------------------

    def _base(self) -> dict:
        if not hasattr(self, "_trainhub_base"):
            self._trainhub_base = {name: copy.deepcopy(getattr(self, name)) for name in _OVERRIDDEN}
        return self._trainhub_base

    def apply_profile(self, profile: Profile) -> None:
        """Set this spawner's traits from the configured values plus the profile and storage mount."""
        base = self._base()
        overrides = m.profile_overrides(profile)
        overrides.update(self.storage_pod_fragments())
        shm_volumes, shm_mounts = shm_parts(self.shm_size)
        kernel_volumes, kernel_mounts = m.kernel_config_parts(self.kernel_config_map)
        overrides["volumes"] = [*overrides.get("volumes", []), *shm_volumes, *kernel_volumes]
        overrides["volume_mounts"] = [*overrides.get("volume_mounts", []), *shm_mounts, *kernel_mounts]
        merged = m.merge_overrides(base, overrides)
        for name in _OVERRIDDEN:
            setattr(self, name, copy.deepcopy(merged.get(name, base[name])))
        self.trainhub_profile = profile

    async def load_user_options(self):
        """Resolve and check the profile, apply it, prepare storage objects; nothing else is created first.

        KubeSpawner calls this at the top of ``_start``, so every HTTPError raised here reaches
        the REST API caller and the spawn page before a pod exists.
        """
        profile = self.resolve_profile(self.user_options)
        await self.check_capacity(profile)
        if self.storage_mount == "fuse-sidecar" and self.storage_enabled:
            self._native_sidecars = await self.native_sidecars()
        self.apply_profile(profile)
        self.log.info("trainhub: %s starts with profile %s (%d x %s)", self.user.name, profile.slug, profile.gpus, profile.gpu_resource)
        await self.ensure_storage_objects()

    @default("apply_user_options")
    def _apply_user_options_default(self):
        # JupyterHub (5.3+) runs this before start(): refuse a bad profile as early as possible
        return _check_profile_option

    # ---- spawn form ---------------------------------------------------------------------------

    @default("options_form")
    def _options_form_default(self):
        return self._render_profile_form

    async def _render_profile_form(self, spawner=None) -> str:
        profiles = self.catalog.for_user(self._user_groups(), self._is_admin())
        holdings = await self.gpu_holdings()
        quota = self.quota.status(self.user.name, self._user_groups(), holdings, self._group_members())
        remaining = quota.remaining
        default = self.catalog.default().slug
        current = (self.user_options or {}).get("profile") or default
        rows = []
        nodes = None
        if self.check_node_fit:
            nodes, _ = await self._ensure_gpu_caches()
        for p in profiles:
            if p.gpus:
                avail = await self.gpu_availability(p)
                free = f"{avail['free']} of {avail['total']} free"
                ok = m.can_place(avail, p.gpus) or not self.check_gpu_availability
                within = remaining is None or remaining >= p.gpus
                note = "" if within else f" — over your quota ({remaining} left)"
                gpu_text = f"{p.gpus} × {p.gpu_resource} · {free}{note}"
            else:
                ok, within, gpu_text = True, True, "no GPU"
            problem = self.fit_problem(p, self.node_fit(nodes.nodes, p)) if nodes is not None else None
            if problem:
                ok = False
                gpu_text += f" — cannot start: {problem.message}"
            disabled = "" if (ok and within) else " disabled"
            checked = " checked" if p.slug == current and not disabled else ""
            rows.append(
                f'<label class="trainhub-profile{" unavailable" if disabled else ""}">'
                f'<input type="radio" name="profile" value="{html.escape(p.slug)}"{checked}{disabled}> '
                f"<strong>{html.escape(p.display_name)}</strong> "
                f'<span class="trainhub-gpus">{html.escape(gpu_text)}</span>'
                f"<br><small>{html.escape(p.description)}</small></label>"
            )
        quota_text = "" if remaining is None else f"<p>GPUs held: {quota.held}; you may take {remaining} more.</p>"
        return '<div class="trainhub-profiles">' + quota_text + "".join(rows) + "</div>"

    def options_from_form(self, formdata):
        value = (formdata or {}).get("profile") or [""]
        slug = value[0] if isinstance(value, list) else value
        profile = self.resolve_profile({"profile": slug or None})
        return {"profile": profile.slug}

    def get_env(self):
        env = super().get_env()
        env.update(self.storage_env())
        if self.api_url:
            env["TRAINHUB_API_URL"] = self.api_url
        return env

    async def _k8s_request(self, what: str, call, *args, **kwargs):
        """One API call with a timeout, retried with capped exponential backoff on 5xx/429/timeouts."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.k8s_api_request_retry_timeout
        delay = 0.2
        while True:
            try:
                return await within(call(*args, **kwargs), self.k8s_api_request_timeout)
            except ApiException as e:
                if e.status < 500 and e.status != 429:
                    raise
                err = e
            except asyncio.TimeoutError as e:
                err = e
            if loop.time() + delay > deadline:
                self.log.error("trainhub: %s failed after retries: %s", what, err)
                raise err
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5)
