"""The culler service process: sample GPUs, ask the policy about every GPU server, act, audit.

Run by JupyterHub as a managed service (``python -m trainhub.services.culler --config
services_config.py`` in the Helm chart). Every ``sample_interval`` it records the utilisation of held
devices; every ``check_interval`` (once at start, then on a timer with jitter) it runs
:meth:`GPUCuller.run_once`, which, for each server holding GPUs in the ledger:

1. asks the server's kernels and status APIs for execution state, kernel activity, open
   kernel connections and the server's own last activity (is anybody there?),
2. asks the jobs service whether the user has running jobs (unknown = don't cull),
3. asks :class:`~trainhub.services.culler.policy.CullPolicy` (plus the admin hook),
4. warns, stops or releases (the server's kernels save their variables, then stop, then start on the
   CPU profile: each notebook's next kernel gets its variables back; :mod:`.moves`, with the users' "keep my GPU"
   and "give my GPU back"),
5. logs the decision as one JSON line and appends it to the ``culler_events`` table.

The reverse move, a released server's "get a GPU again", is :mod:`trainhub.services.culler.regain`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
from dataclasses import replace
from datetime import datetime, timedelta

from prometheus_client import CollectorRegistry, Counter, Gauge
from traitlets import Any, Bool, Float, Instance, Integer, Type, Unicode, default
from traitlets.config import Application

from trainhub.fmt import as_utc
from trainhub.httpapi import MAX_SERVER_BODY_BYTES
from trainhub.ledger import GPUAllocator, Holding, LocalGPUAllocator, server_holder
from trainhub.metrics import GPUMetricsSource, MetricsUnavailable, NVMLMetricsSource, ScriptedMetricsSource
from trainhub.metrics.scripted import default_metrics_class
from trainhub.profiles import ProfileCatalog
from trainhub.services.culler import DECISIONS_SCOPE, KEEP_SCOPE
from trainhub.services.culler.hubclient import HubClient
from trainhub.services.culler.habits import IdleGapLog
from trainhub.services.culler.policy import NONE, WARN, CullPolicy, Decision, ServerInfo, UtilizationHistory, iso_ts
from trainhub.services.culler.moves import MovesMixin
from trainhub.services.culler.observe import ObserveMixin
from trainhub.services.culler.regain import RegainMixin

def parse_holder(holder: str) -> tuple[str, str] | None:
    """"server:alice/gpu" -> ("alice", "gpu"); anything else -> None."""
    if not holder.startswith("server:") or "/" not in holder:
        return None
    user, _, name = holder[len("server:"):].partition("/")
    return user, name


class CullerMetrics:
    """The service's Prometheus counters, on their own registry (no global state)."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.gpu_hours_reclaimed = Counter(
            "trainhub_culler_gpu_hours_reclaimed", "GPU-hours returned to the pool: released devices x time until "
            "the same server held GPUs again (capped by reclaim_accounting_cap)", registry=self.registry)
        self.gpus_released = Counter("trainhub_culler_gpus_released", "Devices returned to the pool by culls", registry=self.registry)
        self.culls = Counter("trainhub_culler_culls", "Servers stopped or released (reason=dry_run: would have been)",
                             ["reason", "action"], registry=self.registry)
        self.warnings = Counter("trainhub_culler_warnings", "Warnings given before a cull", registry=self.registry)
        self.skips = Counter("trainhub_culler_skips", "GPU servers checked and not culled, by reason", ["reason"], registry=self.registry)
        self.errors = Counter("trainhub_culler_errors", "Failures, by stage", ["stage"], registry=self.registry)
        self.pending_warnings = Gauge("trainhub_culler_pending_warnings", "Warnings currently standing", registry=self.registry)
        self.last_pass = Gauge("trainhub_culler_last_pass_timestamp_seconds", "End of the last check pass", registry=self.registry)


class GPUCuller(ObserveMixin, MovesMixin, RegainMixin, Application):
    """Idle-GPU culler service for trainhub."""

    name = "trainhub-culler"
    description = "Return GPUs of idle notebook servers to the pool; never kill running work."
    aliases = {
        "config": "GPUCuller.config_file", "port": "GPUCuller.port", "data-dir": "GPUCuller.data_dir",
        "log-level": "Application.log_level",
    }
    flags = {"dry-run": ({"CullPolicy": {"dry_run": True}}, "Decide and log, never act.")}

    config_file = Unicode("", help="Extra traitlets Python config file, loaded over the platform config.").tag(config=True)
    data_dir = Unicode(
        help="""Platform data dir (default: $TRAINHUB_DATA_DIR). When set, the platform config is loaded from it
        (trainhub.config.load_platform_config: the ledger's database and devices, then the admin's
        trainhub_config.py or $TRAINHUB_CONFIG), exactly as the hub and the jobs service load it.""",
    ).tag(config=True)
    port = Integer(0, help="Port of the HTTP API on 127.0.0.1. 0 = the port of service_url.").tag(config=True)

    service_name = Unicode(help="Service name in the hub. Default: $JUPYTERHUB_SERVICE_NAME or trainhub-culler.").tag(config=True)
    service_prefix = Unicode(help="URL prefix of the HTTP API. Default: $JUPYTERHUB_SERVICE_PREFIX or /services/trainhub-culler/.").tag(config=True)
    service_url = Unicode(help="Where the HTTP API listens. Default: $JUPYTERHUB_SERVICE_URL; empty = no HTTP API.").tag(config=True)
    hub_api_url = Unicode(help="Default: $JUPYTERHUB_API_URL.").tag(config=True)
    api_token = Unicode(help="Default: $JUPYTERHUB_API_TOKEN.").tag(config=True)
    public_url = Unicode(help="Proxy URL the servers' kernels API is reached through, e.g. http://127.0.0.1:8000. Default: $TRAINHUB_PUBLIC_URL.").tag(config=True)
    jobs_api_url = Unicode(help="trainhub API base URL for GET {url}/jobs?state=running&user=NAME. Default: $TRAINHUB_API_URL; empty = no jobs service (no jobs assumed).").tag(config=True)
    db_url = Unicode(help="Platform database (ledger, audit trail). Default: $TRAINHUB_DB_URL.").tag(config=True)

    check_interval = Float(300.0, help="Seconds between decision passes (300). Each pass is followed by a random jitter of up to 10 %.").tag(config=True)
    sample_interval = Float(60.0, help="Seconds between GPU samples (60); must be under CullPolicy.max_sample_gap.").tag(config=True)
    concurrency = Integer(10, help="Servers handled at once (hub and server requests in flight).").tag(config=True)
    stop_timeout = Float(120.0, help="Seconds to wait for a server to stop before a release restarts it on the CPU profile.").tag(config=True)
    snapshot_on_release = Bool(
        True,
        help="""Before a release, ask the server to save every notebook kernel's variables (POST
        <server>trainhub/snapshot); each notebook's next kernel, on the CPU profile, restores them.
        The release goes on when the snapshot fails or times out (logged and in the audit row).""",
    ).tag(config=True)
    move_notice_grace = Float(
        2.0,
        help="""Seconds between telling a server's open JupyterLab pages that it moves (trainhub/move) and the move's
        first step (the snapshot): the pages save their documents and let go of their kernels meanwhile. Only when the
        server took the notice. 0 = none.""",
    ).tag(config=True)

    snapshot_timeout = Float(
        60.0,
        help="Seconds a release waits for the server's kernels to save their variables (all kernels together).",
    ).tag(config=True)
    start_timeout = Float(
        300.0,
        help="Seconds to wait for a server restarted on a GPU profile (get a GPU again) to be ready.",
    ).tag(config=True)
    regain_max_wait = Float(
        6 * 3600.0,
        help="""Seconds a "get a GPU again" request may wait in line (the server runs on the CPU meanwhile) before
        it is given up, with the scheduler's last reason.""",
    ).tag(config=True)
    regain_heartbeat = Float(
        2.0,
        help="""Seconds between the culler's looks at a waiting "get a GPU again" request (each keeps the request
        alive in the queue; under trainhub.serverqueue.STALE_AFTER).""",
    ).tag(config=True)
    reclaim_accounting_cap = Float(8 * 3600.0, help="Longest time (s) one cull counts towards gpu_hours_reclaimed.").tag(config=True)
    audit_retention_days = Float(30.0, help="Audit rows older than this are deleted (0 = keep forever).").tag(config=True)
    status_max_age = Float(
        5.0,
        help="""Seconds a GPU sample may be old when a user's status bar asks for it (GET api/gpus).

        An older one is refreshed by one sampling pass (the same as the sampling loop's), at most once
        per this many seconds whoever asks; 0 = always answer with the sampling loop's latest.""",
    ).tag(config=True)
    authenticate_prometheus = Bool(True, help="Require a hub token (any user, or the service's) for /metrics.").tag(config=True)
    keep_scope = Unicode(
        KEEP_SCOPE,
        help=f"Scope a user needs (filtered to themselves) to press keep. Default {KEEP_SCOPE}; empty = any user.",
    ).tag(config=True)
    decisions_scope = Unicode(
        DECISIONS_SCOPE,
        help=f"Scope to read the decision log: unfiltered = everyone's, !user=<self> = one's own. Default {DECISIONS_SCOPE}.",
    ).tag(config=True)

    allocator_class = Type(LocalGPUAllocator, klass=GPUAllocator, help="GPU ledger implementation.").tag(config=True)
    metrics_class = Type(
        None, klass=GPUMetricsSource, allow_none=True,
        help="GPU metrics source. None = ScriptedMetricsSource when every pool device is simulated, else NVMLMetricsSource.",
    ).tag(config=True)

    # parts (built in setup() unless injected, e.g. by unit tests)
    policy = Instance(CullPolicy)
    catalog = Instance(ProfileCatalog)
    allocator = Instance(GPUAllocator, allow_none=True)
    metrics_source = Instance(GPUMetricsSource, allow_none=True)
    client = Any(help="HubClient or a stand-in with the same coroutine methods.")
    audit = Any(help="AuditTrail or None (then decisions are only logged).")

    classes = [CullPolicy, ProfileCatalog, LocalGPUAllocator, ScriptedMetricsSource, NVMLMetricsSource, HubClient]

    @default("log_level")
    def _default_log_level(self):
        return logging.INFO  # every decision is logged at INFO

    @default("service_name")
    def _default_service_name(self):
        return os.environ.get("JUPYTERHUB_SERVICE_NAME", "trainhub-culler")

    @default("service_prefix")
    def _default_prefix(self):
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", f"/services/{self.service_name}/")

    @default("service_url")
    def _default_service_url(self):
        return os.environ.get("JUPYTERHUB_SERVICE_URL", "")

    @default("hub_api_url")
    def _default_hub_api(self):
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    @default("api_token")
    def _default_token(self):
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    @default("public_url")
    def _default_public(self):
        return os.environ.get("TRAINHUB_PUBLIC_URL", "")

    @default("jobs_api_url")
    def _default_jobs(self):
        return os.environ.get("TRAINHUB_API_URL", "")

    @default("db_url")
    def _default_db(self):
        return os.environ.get("TRAINHUB_DB_URL", "")

    @default("policy")
    def _default_policy(self):
        return CullPolicy(parent=self)

    @default("catalog")
    def _default_catalog(self):
        return ProfileCatalog(parent=self)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.history = UtilizationHistory()
        self.habits = IdleGapLog()  # each user's past idle gaps, for CullPolicy.learn_release_clock
        self.prom = CullerMetrics()
        self.warned_at: dict[str, datetime] = {}  # holder -> when the standing warning was given
        self.warnings: dict[str, dict] = {}  # holder -> public warning (not in dry run)
        self.kept_at: dict[str, datetime] = {}  # holder -> last "keep my GPU"
        self.released: dict[str, dict] = {}  # holder -> {"at", "devices", "counted_until"} for reclaim accounting
        self.latest: dict[str, dict] = {}  # holder -> latest decision (for the admin view)
        self.culled_at: dict[str, datetime] = {}  # holder -> our last stop/release (guards against acting twice)
        self.dry_run_culled: dict[str, str | None] = {}  # holder -> idle_since of the would-be cull already counted
        self.seen_at: dict[str, datetime] = {}  # holder -> last pass that saw a kernel connection (or first pass)
        self.external_use_at: dict[str, datetime] = {}  # holder -> latest busy GPU sample while no kernel executed
        self._device_holder: dict[int, str] = {}
        self.samples: dict[int, dict] = {}  # device -> latest GPUSample as a dict, "at" on the policy's clock
        self.infos: dict[str, ServerInfo] = {}  # holder -> what the latest pass knew about the server
        self._sampled_at: float | None = None  # policy clock of the latest sampling pass that measured
        self._sampling: asyncio.Lock | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._giving_back: dict[str, asyncio.Task] = {}  # holder -> the user's give-back under way
        self.regains: dict[str, dict] = {}  # holder -> the user's "get a GPU again": its state, latest first
        self._regain_tasks: dict[str, asyncio.Task] = {}  # holder -> that request's task while it runs
        self._regain_wake: dict[str, asyncio.Event] = {}  # holder -> set to make that task look now (a cancel)
        self._queue = None  # trainhub.serverqueue.ServerQueue on the ledger's database, once needed

    # -- setup ---------------------------------------------------------------------

    @default("data_dir")
    def _default_data_dir(self):
        return os.environ.get("TRAINHUB_DATA_DIR", "")

    def initialize(self, argv=None):
        super().initialize(argv)
        if self.data_dir:
            from trainhub.config import load_platform_config

            self.update_config(load_platform_config(self.data_dir))
        if self.config_file:
            self.load_config_file(self.config_file)
        self.update_config(self.cli_config)  # the command line wins over the files

    def setup(self) -> None:
        """Build every part not injected. Raises ValueError with what to configure."""
        self.policy.release_keeps_variables = self.snapshot_on_release
        if not self.policy.cpu_profile:
            cpu = self.catalog.cpu()
            if cpu:
                self.policy.cpu_profile = cpu.slug
        if self.allocator is None:
            kw = {}
            if self.allocator_class is LocalGPUAllocator and "db_url" not in self.config.get("LocalGPUAllocator", {}):
                if not self.db_url:
                    raise ValueError("set TRAINHUB_DB_URL or LocalGPUAllocator.db_url: the culler reads the GPU ledger")
                kw["db_url"] = self.db_url
            self.allocator = self.allocator_class(parent=self, **kw)
        if self.metrics_source is None:
            cls = self.metrics_class or default_metrics_class(self.allocator.devices())
            # per-pod metrics (DCGM): the ledger maps its devices to the pods holding them
            self.metrics_source = cls(parent=self, gpu_targets=self.allocator.gpu_targets)
        if self.client is None:
            if not self.public_url:
                self.log.warning("TRAINHUB_PUBLIC_URL / GPUCuller.public_url not set: kernel state is unknown, nothing will be culled")
            self.client = HubClient(
                parent=self, hub_api_url=self.hub_api_url, api_token=self.api_token,
                public_url=self.public_url, jobs_api_url=self.jobs_api_url,
            )
        if self.audit is None and (self.db_url or getattr(self.allocator, "db_url", "")):
            from trainhub.services.culler.models import AuditTrail

            self.audit = AuditTrail(self.db_url or self.allocator.db_url)
        if self.audit is not None and self.policy.learn_release_clock:
            self._learn_from_audit()
        longest = max([self.policy.default_timeout, *[t or 0 for t in self.policy.profile_timeouts.values()],
                       *[p.idle_timeout or 0 for p in self.catalog.all()]])
        self.history.retention = longest + self.policy.warning_period + 2 * self.check_interval + 3600
        if self.sample_interval >= self.policy.max_sample_gap:
            self.log.warning("sample_interval %ss >= CullPolicy.max_sample_gap %ss: servers will never look idle",
                             self.sample_interval, self.policy.max_sample_gap)

    def _learn_from_audit(self) -> None:
        """Each user's idle gaps from the audit trail's rows (the decisions of earlier runs), so a restart of the
        culler does not make everyone a new user again; a failure only means starting from no history."""
        since = self.policy.utcnow() - timedelta(seconds=self.habits.max_age)
        try:
            rows = self.audit.since(since)
        except Exception:
            self.log.exception("cannot read the audit trail to learn users' idle gaps; starting without history")
            return
        for row in rows:
            try:
                self.habits.observe_row(row)
            except Exception as e:  # one odd row never stops the rest
                self.log.debug("audit row %s not learned from: %r", row.get("id"), e)
        self.log.info("learned idle gaps from %d audit rows", len(rows))

    # -- sampling ------------------------------------------------------------------

    async def _holdings(self) -> list[Holding]:
        return await asyncio.to_thread(self.allocator.holdings)

    async def sample_once(self, holdings: list[Holding] | None = None) -> None:
        """Record the utilisation of every device held by a server."""
        if holdings is None:
            holdings = await self._holdings()
        held = {}
        for h in holdings:
            if h.kind == "server":
                held[h.device] = h.holder
        for d, holder in held.items():
            if self._device_holder.get(d) != holder:
                self.history.forget(d)  # a new holder starts with a clean history
                self.samples.pop(d, None)
        for d in set(self._device_holder) - set(held):
            self.history.forget(d)
            self.samples.pop(d, None)
        self._device_holder = held
        if not held:
            return
        try:
            samples = await self.metrics_source.sample(sorted(held))
        except MetricsUnavailable as e:
            self.prom.errors.labels("metrics").inc()
            self.log.error("GPU metrics unavailable, nothing can look idle: %s", e)
            return
        at = self.policy.utcnow().timestamp()  # the policy's clock, so tests can move time
        for d, s in samples.items():
            self.history.record(d, at, s.utilization)
            self.samples[d] = {**s.to_dict(), "at": at}
        self._sampled_at = at

    # -- one pass ------------------------------------------------------------------

    async def run_once(self) -> list[tuple[ServerInfo, Decision]]:
        """One decision pass over every server holding GPUs; returns what was decided."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.concurrency)
        holdings = await self._holdings()
        await self.sample_once(holdings)
        now = self.policy.utcnow()

        by_holder: dict[str, list[Holding]] = {}
        for h in holdings:
            if h.kind == "server" and parse_holder(h.holder):
                by_holder.setdefault(h.holder, []).append(h)
        self._account_reclaimed(now, set(by_holder))
        for holder in set(self.warned_at) - set(by_holder):
            self._clear_warning(holder)  # the server stopped or gave its GPUs back
        for holder in set(self.dry_run_culled) - set(by_holder):
            del self.dry_run_culled[holder]
        for holder in set(self.seen_at) - set(by_holder):
            del self.seen_at[holder]
        for holder in set(self.external_use_at) - set(by_holder):
            del self.external_use_at[holder]
        for holder in set(self.infos) - set(by_holder):
            del self.infos[holder]
        if not by_holder:
            self.prom.pending_warnings.set(len(self.warnings))
            self.prom.last_pass.set(now.timestamp())
            return []

        try:
            users = await self.client.list_active_users()
        except Exception as e:
            self.prom.errors.labels("list_users").inc()
            self.log.error("cannot list users from the hub (%r); skipping this pass", e, exc_info=self.log.isEnabledFor(logging.DEBUG))
            return []
        servers = {}
        for u in users:
            for name, model in (u.get("servers") or {}).items():
                servers[server_holder(u['name'], name)] = (u, name, model)

        tasks = []
        for holder, hs in sorted(by_holder.items()):
            if holder in self._regain_tasks:
                continue  # GPUs granted for the user's "get a GPU again": the server is being moved onto them
            if holder not in servers:
                self.log.info("not culled %s: holds GPUs %s but the hub lists no active server (ledger reconcile handles it)",
                              holder, [h.device for h in hs])
                continue
            u, name, model = servers[holder]
            tasks.append(self._guarded(u, name, model, hs, now))
        results = [r for r in await asyncio.gather(*tasks) if r]
        self.prom.pending_warnings.set(len(self.warnings))
        self.prom.last_pass.set(now.timestamp())
        await self._write_audit([row for _, _, row in results], f"{len(results)} decisions")
        return [(info, d) for info, d, _ in results]

    async def _guarded(self, user_model, server_name, server_model, holdings, now):
        async with self._semaphore:
            try:
                return await self.handle_server(user_model, server_name, server_model, holdings, now)
            except Exception as e:
                self.prom.errors.labels("server").inc()
                self.log.exception("error handling %s/%s", user_model.get("name"), server_name)
                info = ServerInfo(user=user_model.get("name", "?"), server_name=server_name,
                                  devices=tuple(h.device for h in holdings))
                row = self._row(info, Decision(NONE, f"not culled: error ({e})"), acted=False, error=repr(e))
                return info, Decision(NONE, f"not culled: error ({e})"), row

    async def handle_server(self, user_model, server_name, server_model, holdings, now) -> tuple:
        user = user_model["name"]
        holder = server_holder(user, server_name)
        profile = None
        slug = holdings[0].profile
        if slug:
            try:
                profile = self.catalog.get(slug)
            except Exception:
                self.log.warning("%s holds GPUs under unknown profile %r; using the default timeout", holder, slug)
        pending = server_model.get("pending")
        if pending or not server_model.get("ready", True):
            busy, nkernels, activity, connections, last_seen, jobs = None, 0, None, None, None, None
        else:
            (busy, nkernels, activity, connections), last_request, jobs = await asyncio.gather(
                self._kernel_state(server_model), self._last_request(server_model), self._running_jobs(user))
            last_seen = self._last_seen(holder, connections, last_request, now)
        devices = tuple(sorted(h.device for h in holdings))
        if busy is False:
            self._note_external_use(holder, devices)
        info = ServerInfo(
            user=user, server_name=server_name, profile=profile,
            devices=devices,
            held_since=as_utc(min(h.since for h in holdings)), pending=pending or (None if server_model.get("ready", True) else "not ready"),
            kernels_busy=busy, kernels=nkernels, last_activity=activity, connections=connections, last_seen=last_seen,
            running_jobs=jobs,
            kept_at=self.kept_at.get(holder), warned_at=self.warned_at.get(holder),
            external_use_at=self.external_use_at.get(holder),
            habits=self.habits.habits(user, now.timestamp()) if self.policy.learn_release_clock else None,
        )
        self.infos[holder] = info
        culled = self.culled_at.get(holder)
        if culled is not None and info.held_since <= culled:
            # the same ledger rows as before our stop: the spawner did not free them; never act twice
            self.log.warning("%s still holds GPUs %s in the ledger after the cull at %s; leaving it to ledger reconcile",
                             holder, list(info.devices), culled.isoformat())
            decision = Decision(NONE, f"not culled: GPUs still in the ledger after the cull at {culled.isoformat()} "
                                      "(the spawner did not free them)", {"devices": list(info.devices)})
        else:
            self.culled_at.pop(holder, None)
            decision = await self.policy.decide(info, self.history, now)
        acted, error = False, None
        if decision.action == WARN:
            self.warned_at[holder] = now
            self.prom.warnings.inc()
            if not decision.dry_run:
                act_in = decision.measurements.get("act_in_s", self.policy.warning_period)
                self.warnings[holder] = {
                    "user": user, "server": server_name, "devices": list(info.devices), "message": decision.reason,
                    "action": self.policy.action, "warned_at": now.isoformat(),
                    "act_at": (now + timedelta(seconds=act_in)).isoformat(),
                    "keep_url": f"{self.service_prefix}api/keep",
                }
        elif decision.action == NONE:
            self.prom.skips.labels(decision.skip_reason).inc()
            if not decision.warning_pending:
                self._clear_warning(holder)
        elif decision.acts:
            if decision.dry_run:
                # count a would-be cull once per idle run, not on every pass while it stays idle
                idle_since = decision.measurements.get("idle_since")
                if self.dry_run_culled.get(holder) != idle_since:
                    self.dry_run_culled[holder] = idle_since
                    self.prom.culls.labels("dry_run", decision.action).inc()
            else:
                decision, acted, error = await self.carry_out(info, decision, server_model.get("url") or "",
                                                              cause="gpu_idle", stage=decision.action)
                if acted:
                    # reclaimed GPU time counts from when the action finished (the devices are free by then)
                    done = self.policy.utcnow()
                    self.released[holder] = {"at": done, "devices": len(info.devices), "counted_until": done}
                    self.culled_at[holder] = now
                    self._clear_warning(holder)
        row = self._row(info, decision, acted=acted, error=error)
        self.habits.observe_row({**row, "at": now})
        self._record(holder, row, now)
        return info, decision, row

    def _clear_warning(self, holder: str) -> None:
        self.warned_at.pop(holder, None)
        self.warnings.pop(holder, None)

    def _record(self, holder: str, row: dict, at: datetime) -> None:
        """The decision becomes the server's latest (the admin view) and one JSON line of this log."""
        self.latest[holder] = row
        self.log.info(json.dumps({"event": "culler.decision", **{k: v for k, v in row.items() if k != "at"},
                                  "at": at.isoformat()}, default=str))

    async def _write_audit(self, rows: list[dict], what: str) -> None:
        """Append to the audit trail; a failure is counted and logged (the rows are in this log already)."""
        if self.audit is None:
            return
        try:
            await asyncio.to_thread(self.audit.append, rows)
        except Exception:
            self.prom.errors.labels("audit").inc()
            self.log.exception("cannot write %s to the audit trail (they are in this log)", what)

    def _row(self, info: ServerInfo, d: Decision, *, acted: bool, error: str | None) -> dict:
        return {
            "at": self.policy.utcnow(), "user": info.user, "server": info.server_name, "action": d.action,
            "reason": d.reason, "devices": list(info.devices), "dry_run": d.dry_run, "acted": acted, "error": error,
            "measurements": json.loads(json.dumps({**d.measurements, "server": info.to_dict()}, default=str)),
        }

    def _account_reclaimed(self, now: datetime, holding_now: set[str]) -> None:
        """Count devices x time for culled servers until they hold GPUs again (or the cap)."""
        for holder, r in list(self.released.items()):
            cap_end = r["at"] + timedelta(seconds=self.reclaim_accounting_cap)
            end = min(now, cap_end)
            if end > r["counted_until"]:
                self.prom.gpu_hours_reclaimed.inc(r["devices"] * (end - r["counted_until"]).total_seconds() / 3600)
                r["counted_until"] = end
            if holder in holding_now or end >= cap_end:
                del self.released[holder]

    def warnings_for(self, user: str) -> list[dict]:
        return [w for w in self.warnings.values() if w["user"] == user]

    async def fresh_samples(self) -> None:
        """Make the latest samples at most ``status_max_age`` old: one sampling pass, shared by every caller."""
        if self._sampling is None:
            self._sampling = asyncio.Lock()
        async with self._sampling:
            now = self.policy.utcnow().timestamp()
            if self._sampled_at is not None and now - self._sampled_at <= self.status_max_age:
                return
            await self.sample_once()
            if self._sampled_at is None or self._sampled_at < now:
                self._sampled_at = now  # nothing held or nothing measured: do not retry on every request

    async def gpu_status(self, user: str, server_name: str = "") -> dict:
        """One server's devices (latest samples) and idle clock, from the state the policy decides on.

        Devices are those the sampling pass found held by the server in the ledger; utilisation and
        memory are its latest samples (None when the source could not measure a device). The clock
        re-runs the policy on what the latest pass knew about the server (kernels, jobs, connections)
        with the keep and warning standing now; None before any pass has looked at the server.
        """
        if self.status_max_age > 0:
            await self.fresh_samples()
        holder = server_holder(user, server_name)
        known = {d.index: d for d in await asyncio.to_thread(self.allocator.devices)} if self.allocator is not None else {}
        devices = []
        for index in sorted(d for d, h in self._device_holder.items() if h == holder):
            dev, sample = known.get(index), self.samples.get(index)
            devices.append({
                "index": index, "name": dev.name if dev else None,
                "simulated": bool((dev is not None and dev.simulated) or (sample and sample["simulated"])),
                "utilization": sample["utilization"] if sample else None,
                "memory_used_mb": sample["memory_used_mb"] if sample else None,
                "memory_total_mb": sample["memory_total_mb"] if sample else (dev.memory_total_mb if dev else None),
                "sampled_at": iso_ts(sample["at"]) if sample else None,
            })
        clock, checked_at = None, None
        info = self.infos.get(holder)
        now = self.policy.utcnow()
        if info is not None and devices:
            info = replace(info, kept_at=self.kept_at.get(holder), warned_at=self.warned_at.get(holder))
            clock = self.policy.clock(info, self.history, now)
            row = self.latest.get(holder)
            checked_at = row["at"].isoformat() if row else None
        # "at": the culler's now, so a browser with a wrong clock still counts down right
        return {"user": user, "server": server_name, "at": now.isoformat(), "devices": devices, "clock": clock,
                "checked_at": checked_at, "warning": self.warnings.get(holder)}

    # -- process ---------------------------------------------------------------------

    async def _loop(self, interval: float, fn, what: str) -> None:
        while True:
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.log.exception("%s failed", what)
            await asyncio.sleep(interval * (1 + random.uniform(0, 0.1)))

    async def _prune_audit(self) -> None:
        if self.audit is not None and self.audit_retention_days:
            cutoff = self.policy.utcnow() - timedelta(days=self.audit_retention_days)
            n = await asyncio.to_thread(self.audit.prune, cutoff)
            if n:
                self.log.info("pruned %d audit rows older than %s", n, cutoff.isoformat())

    async def serve(self) -> None:
        self.setup()
        server = None
        if self.service_url:
            from urllib.parse import urlsplit

            from trainhub.services.culler.handlers import make_app

            u = urlsplit(self.service_url)
            host, port = u.hostname or "127.0.0.1", self.port or u.port or 80
            server = make_app(self).listen(port, host, max_body_size=MAX_SERVER_BODY_BYTES)
            self.log.info("trainhub-culler API on http://%s:%s%s", host, port, self.service_prefix)
        p = self.policy
        self.log.info(
            "trainhub-culler: action=%s dry_run=%s default_timeout=%ss profile_timeouts=%s threshold=%s%% "
            "warning_period=%ss check_interval=%ss sample_interval=%ss metrics=%s",
            p.action, p.dry_run, p.default_timeout, p.profile_timeouts, p.utilization_threshold, p.warning_period,
            self.check_interval, self.sample_interval, type(self.metrics_source).__name__,
        )
        tasks = [
            asyncio.create_task(self._loop(self.check_interval, self.run_once, "check pass")),
            asyncio.create_task(self._loop(self.sample_interval, self.sample_once, "GPU sampling")),
            asyncio.create_task(self._loop(86400, self._prune_audit, "audit pruning")),
        ]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
            self.log.info("trainhub-culler stopping")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if server is not None:
                server.stop()
            self.metrics_source.close()
            await asyncio.to_thread(self.allocator.close)

    def start(self):
        asyncio.run(self.serve())


main = GPUCuller.launch_instance
