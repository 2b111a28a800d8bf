"""The `trainhub` service process: configuration, components, HTTP server."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import sys
from pathlib import Path

from jupyterhub.services.auth import HubOAuthCallbackHandler
from jupyterhub.utils import url_path_join
from tornado import httpclient, web
from traitlets import Bool, Float, Integer, Type, Unicode, default
from traitlets.config import Application, PyFileConfigLoader

from trainhub import __version__
from trainhub.config import load_platform_config
from trainhub.cpupriority import PLATFORM_NICE, set_session_nice
from trainhub.exceptions import Conflict, NotFound, TooManyQueued
from trainhub.httpapi import MAX_SERVER_BODY_BYTES, log_request
from trainhub.boundary.isolation import Isolation
from trainhub.ledger import GPUAllocator, LocalGPUAllocator
from trainhub.loops import PeriodicLoop
from trainhub.loopwatch import LoopWatch
from trainhub.profiles import ProfileCatalog
from trainhub.quotas import Demand, QuotaPolicy
from trainhub.services.api import make_application
from trainhub.services.contract import BodySchemas
from trainhub.states import QUEUED, SUBMITTED_REASON
from trainhub.settings import DataDir
from trainhub.storage import StorageConfig
from trainhub.workdir import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES, Limits

from .engine import JobEngine, view
from .handlers import default_handlers
from .launcher import Launcher
from .local import LocalLauncher
from .logwatch import LogWatch
from .outputs import OutputSyncer
from .spec import JobSpec
from .store import JobStore
from .workdirs import FOLDER as WORKDIRS_FOLDER, WorkdirStore

OPENAPI_FILE = Path(__file__).with_name("openapi.json")

# Features served by this process besides jobs. Each module defines
#   routes(prefix: str, service) -> list of tornado routes (under <prefix>api/...)
#     (not named `handlers`: importing a `handlers` submodule would replace the attribute)
#   async start(service) / async stop(service)  background work (own loops; stop awaits them)
#   OPENAPI: Path of an OpenAPI fragment ({"paths": ..., "components": {"schemas": ...}})
# and optionally
#   workdirs_in_use(service, user) -> set of SHA-256s  the working directories it will still start jobs in
#     (blocking: called on a reader thread; JobsService.workdirs_in_use)
# A module that is not installed is skipped.
PLUGINS = [
    "trainhub.services.sweeps",
    "trainhub.services.registry",
    "trainhub.services.usage",
    "trainhub.services.notebooks",
]


def load_plugins(names=PLUGINS) -> list:
    import importlib

    mods = []
    for name in names:
        try:
            mods.append(importlib.import_module(name))
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
    return mods


def merged_openapi(plugins, profiles=()) -> dict:
    """The jobs document plus each plugin's fragment: what the service serves. ``profiles`` (the
    catalog's slugs) become the enum of every spec's ``profile``, so the document names the ones that exist."""
    doc = json.loads(OPENAPI_FILE.read_text())
    for mod in plugins:
        frag = json.loads(Path(mod.OPENAPI).read_text())
        doc["paths"].update(frag.get("paths", {}))
        for kind, items in frag.get("components", {}).items():
            doc.setdefault("components", {}).setdefault(kind, {}).update(items)
    if profiles:
        for schema in doc["components"]["schemas"].values():
            prop = schema.get("properties", {}).get("profile")
            if prop is not None and "string" in prop.get("type", ()):
                prop["enum"] = [*profiles, *([None] if "null" in prop["type"] else [])]
    return doc


class GroupDirectory:
    """Users' JupyterHub groups, refreshed from the hub API (for group quotas and priorities)."""

    def __init__(self, log, interval: float = 30.0):
        self.log, self.interval = log, interval
        self.by_user: dict[str, tuple[str, ...]] = {}
        self.url = os.environ.get("JUPYTERHUB_API_URL", "")
        self.token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        self._loop: PeriodicLoop | None = None

    def __call__(self, user: str) -> tuple[str, ...]:
        return self.by_user.get(user, ())

    def learn(self, user: str, groups) -> None:
        self.by_user[user] = tuple(groups)

    async def refresh(self) -> None:
        try:
            r = await httpclient.AsyncHTTPClient().fetch(
                f"{self.url}/groups", headers={"Authorization": f"token {self.token}"}, request_timeout=10)
        except Exception as e:  # the hub restarting: keep what is known, try again next time
            self.log.debug("group refresh failed: %s", e)
            return
        by_user: dict[str, list[str]] = {}
        for g in json.loads(r.body):
            for u in g.get("users", []):
                by_user.setdefault(u, []).append(g["name"])
        self.by_user = {u: tuple(gs) for u, gs in by_user.items()}

    def start(self) -> None:
        """Refresh now and every ``interval`` seconds (only with a hub API URL and token)."""
        if self.url and self.token and self._loop is None:
            self._loop = PeriodicLoop("trainhub-groups", self.refresh, self.interval, self.log, jitter=0.1)
            self._loop.start()

    async def stop(self) -> None:
        if self._loop is not None:
            await self._loop.stop()
            self._loop = None


class JobsService(Application):
    name = "trainhub"
    description = "The trainhub jobs API, run by JupyterHub as a managed service."
    version = __version__

    port = Integer(0, help="Port to listen on. Default: from $JUPYTERHUB_SERVICE_URL.").tag(config=True)
    ip = Unicode(help="""Address to listen on. Default: the host of $JUPYTERHUB_SERVICE_URL (`trainhub up`: 127.0.0.1; the
        Helm chart: 0.0.0.0, so its Service reaches the pod), else 127.0.0.1.""").tag(config=True)

    @default("ip")
    def _ip_default(self):
        from urllib.parse import urlsplit

        return urlsplit(os.environ.get("JUPYTERHUB_SERVICE_URL", "")).hostname or "127.0.0.1"
    data_dir = Unicode(help="Platform data dir. Default: $TRAINHUB_DATA_DIR.").tag(config=True)
    db_url = Unicode(help="Platform database URL. Default: the ledger's (LocalGPUAllocator.db_url).").tag(config=True)
    allocator_class = Type(LocalGPUAllocator, klass=GPUAllocator, help="GPU ledger implementation.").tag(config=True)
    launcher_class = Type(LocalLauncher, klass=Launcher, help="Job launcher (local processes or Kubernetes Jobs).").tag(config=True)
    metrics_source_class = Type(None, allow_none=True, help="GPU metrics source (default: NVML for real devices, the scripted source for simulated ones).").tag(config=True)
    inline_reads = Bool(True, help="""Answer the API's small reads (one job, a page of the listing) on the event loop when the
        platform database is SQLite (WAL: a reader never waits for a writer): 0.1-0.4 ms each, cheaper than the two
        thread switches of a reader thread, which on a loaded machine are each a wait for a core. A job start's devices
        and claim (about 2 ms of writes) and a submission's insert are then written there too when SQLite's write
        lock is free at once (``trainhub.db.write_now``), else on a thread. False, or another database: every read
        and write on a thread.""").tag(config=True)
    switch_interval = Float(0.0005, help="""Seconds a thread may hold Python's GIL while another waits for it
        (``sys.setswitchinterval``; Python's default 0.005). The service's threads do short database work (a start's
        devices and claim, a submission's insert) while the event loop serves requests: with the default a start
        waited up to 5 ms per hand-over for the loop to let go (a %%train start's claim 18-37 ms at load 4-7, 7-8 ms
        with 0.0005). The price: about 10 % more service CPU per API call under 50 concurrent clients (3.3-3.5 ms ->
        3.8-3.9 ms, same runs alternating). 0 keeps Python's default.""").tag(config=True)
    session_nice = Integer(PLATFORM_NICE, help="""The CPU priority of the service's session against every other session on the
        machine (Linux autogroup niceness, -20..19; trainhub.cpupriority), e.g. -10: each of users' jobs and servers runs
        in a session of its own and otherwise weighs as much as the jobs API, which then waits for a core behind them on
        a busy machine (measured at load 11-14 on 2 cores: a request's own time p50 35-141 ms for 1-3 ms of CPU; 3.6 ms
        with -10). `trainhub up` gives the hub's and the proxy's sessions the same. Below 0 needs CAP_SYS_NICE (root); where it is not
        allowed, or the kernel has no autogroups, nothing changes and the reason is logged. 0 = leave it.""").tag(config=True)
    freeze_after_start = Bool(True, help="""Once the service is up, collect once and move what is left, the imports'
        and the set-up's objects, out of reach of the cycle collector's later passes (``gc.freeze``). Each full
        collection walked them all: about 0.1 s during which no request was served (120-128 ms with 10,000 jobs queued,
        about once per phase of the load benchmark). The price: a reference cycle among those objects that becomes
        garbage later is not collected.""").tag(config=True)
    stall_log_threshold = Float(0.1, help="""Seconds the event loop may be held up before the service logs it (warning)
        with where its thread was, e.g. 0.1; every delay is also counted (loop lag, the cycle collector's pauses, the
        requests' own time: ``GET {api}/service/stalls``, admins; trainhub.loopwatch). 0 = no watch, nothing counted.
        The watch costs a heartbeat on the loop and a watchdog thread's look every 50 ms.""").tag(config=True)
    max_queued_per_user = Integer(1000, help="""Most jobs one user may have queued at once, e.g. 1000; a submission
        past it is refused with 429 (cancel some queued jobs or wait until some start). Sweep trials are jobs of the
        sweep's creator and count; at the cap a sweep's next trial waits instead of failing. Admins are not exempt:
        each queued job costs every scheduling pass and the database alike, whoever queued it. Only state "queued"
        counts (running jobs are bounded by GPU quotas); submissions in flight count too, so a burst cannot pass it.
        0 = no cap.""").tag(config=True)
    max_workdir_bytes = Integer(DEFAULT_MAX_BYTES, help="""Most bytes of files (unpacked) a job's working directory
        may hold (PUT /workdirs/{sha256}; %%train and `trainhub jobs submit --workdir` send it, trainhub.workdir). A
        bigger one is refused (413) before it is stored; the senders check the same limits first and name what weighs
        most.""").tag(config=True)
    max_workdir_files = Integer(DEFAULT_MAX_FILES, help="""Most files, folders and links a job's working directory may
        hold.""").tag(config=True)
    workdir_keep = Float(86400.0, help="""Seconds an uploaded working directory is kept after it was last sent or named
        by a job, once no queued or running job names it (removed at its owner's next upload).""").tag(config=True)
    config_file = Unicode("", help="Extra traitlets Python config file, loaded over the platform config (the Helm chart passes "
                          "its services_config.py, which applies trainhub.app.chart_config to trainhub.json). Empty = none.").tag(config=True)

    aliases = {"port": "JobsService.port", "data-dir": "JobsService.data_dir", "log-level": "Application.log_level",
               "config": "JobsService.config_file"}

    @default("data_dir")
    def _data_dir(self):
        return os.environ.get("TRAINHUB_DATA_DIR", "")

    def initialize(self, argv=None):
        super().initialize(argv)
        if not self.data_dir:
            raise SystemExit("trainhub service: set TRAINHUB_DATA_DIR or --data-dir")
        self.dd = DataDir(Path(self.data_dir))
        # what `trainhub up` recorded in the data dir; a service the Helm chart runs has no `trainhub up` (its data dir
        # is only its state): its --config file is its whole configuration
        if not self.config_file or self.dd.runtime_file.exists():
            self.update_config(load_platform_config(self.dd.root))
        if self.config_file:  # the Helm chart's values (profiles, quotas, the Kubernetes launcher, DCGM metrics)
            path = Path(self.config_file)
            if not path.is_file():
                raise SystemExit(f"trainhub service: --config {path} is not a file")
            self.update_config(PyFileConfigLoader(path.name, str(path.parent)).load_config())
        self.log.setLevel(self.log_level)
        self.db_url = self.db_url or self.config.LocalGPUAllocator.get("db_url") or self.dd.platform_db_url
        self.store = JobStore(self.db_url, inline_reads=self.inline_reads)
        self.allocator = self.allocator_class(parent=self)
        self.quota = QuotaPolicy(parent=self)
        self.catalog = ProfileCatalog(parent=self)
        self.storage = StorageConfig(parent=self)
        self.isolation = Isolation(parent=self)
        self.launcher = self.launcher_class(parent=self, data_dir=str(self.dd.root), isolation=self.isolation)
        self.workdirs = WorkdirStore(Path(self.launcher.jobs_dir) / WORKDIRS_FOLDER,
                                     Limits(self.max_workdir_bytes, self.max_workdir_files), self.workdir_keep)
        self.launcher.workdir_store = self.workdirs
        self.syncer = OutputSyncer(self.storage, parent=self, as_user=self.launcher.as_user)
        self.groups = GroupDirectory(self.log)
        self.loopwatch: LoopWatch | None = None
        self._submitting: dict[str, int] = {}  # user -> submissions being written (check_queued counts them)
        public = os.environ.get("TRAINHUB_PUBLIC_URL", "").rstrip("/")
        self.service_prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/trainhub/")
        self.api_prefix = url_path_join(self.service_prefix, "api/")
        self.engine = JobEngine(self.store, self.allocator, self.launcher, self.quota, self.storage, self.syncer,
                                catalog=self.catalog, metrics_source=self._metrics_source(), groups_of=self.groups, parent=self,
                                api_url=(public + self.api_prefix.rstrip("/")) if public else "")
        self.logwatch = LogWatch()
        # an attempt's end wakes its log followers at once (they look at the job's state)
        self.engine.on_job_end(lambda job: self.logwatch.notify(self.launcher.job_dir(view(job))))
        self.plugins = load_plugins()
        doc = merged_openapi(self.plugins, [p.slug for p in self.catalog.all()])
        self.openapi_text = json.dumps(doc, indent=2)
        self.contract = BodySchemas(doc)

    def _metrics_source(self):
        cls = self.metrics_source_class
        if cls is None:
            try:
                from trainhub.metrics.scripted import default_metrics_class
            except ImportError:
                return None
            cls = default_metrics_class(self.allocator.devices())
        try:
            # DCGM reports per pod: the launcher maps ledger devices to the pods holding them
            return cls(parent=self, gpu_targets=self.launcher.gpu_targets)
        except Exception as e:
            self.log.warning("no GPU metrics source: %s", e)
            return None

    def engine_view(self, job):
        return view(job)

    def check(self, caller, spec: JobSpec, kind: str = "job"):
        """Refuse a spec that could never run: its profile (400/403), the pool size (400), then
        admission (``QuotaPolicy.admit``, 403): the caller's and their groups' GPU quotas and the
        caller's CPU worker quota. Returns ``(profile or None, gpus per worker)``. ``kind``
        ("job" or "trial") names the thing in messages ("this job", "each trial")."""
        self.isolation.check_user(caller.name)  # a platform that cannot isolate users serves one (403)
        profile = None
        if spec.profile:
            profile = self.catalog.resolve(spec.profile, caller.groups, caller.admin)
        gpus = spec.gpus if spec.gpus is not None else (profile.gpus if profile else 0)
        demand = Demand(caller.name, tuple(caller.groups), spec.workers, gpus, kind)
        pool = self.pool(profile)
        if demand.gpus > len(pool):  # the request is well formed: the pool, which an admin may grow, is the conflict
            raise Conflict(
                f"{demand.what} needs {demand.gpus} GPUs ({spec.workers} worker(s) × {gpus}) but the pool has only {len(pool)}; "
                "ask for fewer workers or GPUs per worker"
            )
        self.quota.admit(demand)
        self.launcher.check(spec)
        return profile, gpus

    def pool(self, profile=None) -> list:
        """The GPUs a job on ``profile`` may get (its ``gpu_model``'s, or all): the bound of a job's GPUs in all."""
        pool = self.allocator.devices()
        if profile and profile.gpu_model:
            pool = [d for d in pool if profile.gpu_model.lower() in d.name.lower()]
        return pool

    async def check_queued(self, user: str, submit_key: str | None = None, own: int = 0) -> None:
        """Refuse (429, :class:`~trainhub.exceptions.TooManyQueued`) one more queued job of ``user`` at
        ``max_queued_per_user``: one user's flood must not cost every pass and everyone's waiting reasons. The
        jobs of ``user`` in state queued are counted (the ``(user, state)`` index), with the other submissions still
        being written (``own``: this one's, already counted in ``_submitting``). A retry of a submission already
        made (its ``submit_key``) is not refused: it queues nothing."""
        cap = self.max_queued_per_user
        if cap <= 0:
            return
        _items, queued = await self.store.lookup(self.store.list, user, [QUEUED], 0, 0)
        queued += self._submitting.get(user, 0) - own
        if queued < cap:
            return
        if submit_key and await self.store.read(self._submitted, f"{user}:{submit_key}"):
            return
        raise TooManyQueued(
            f"Too many queued jobs: {user} has {queued} jobs queued and may have at most {cap} at once "
            f"(JobsService.max_queued_per_user). Cancel some queued jobs (trainhub jobs cancel ID, or DELETE "
            f"/jobs/ID) or wait until some of them start, then submit again.",
            user=user, queued=queued, limit=cap)

    def _submitted(self, key: str) -> bool:
        """Whether a job was made with this (user-prefixed) submit_key (blocking: on a reader thread)."""
        from sqlalchemy import select

        from .models import Job

        with self.store.engine.connect() as c:
            return c.execute(select(Job.id).where(Job.submit_key == key)).first() is not None

    async def own_workdir(self, caller, sha256: str) -> dict:
        """The working directory ``sha256`` a job or a sweep names, which must be the caller's own upload (another
        user's archive is not found under their name): ``{"sha256", "files", "bytes"}``, its unused time reset; 404
        (:class:`NotFound`: the resource the spec names is not there; send it, then submit again) when it is not."""
        info = await asyncio.to_thread(self.workdirs.info, caller.name, sha256)
        if info is None:
            raise NotFound(f"no working directory {sha256} is stored for {caller.name} (never sent, or "
                           f"removed after {self.workdir_keep:.0f} s unused): PUT /workdirs/{sha256} first")
        await asyncio.to_thread(self.workdirs.touch, caller.name, sha256)
        return {"sha256": info.sha256, "files": info.files, "bytes": info.bytes}

    async def workdirs_in_use(self, user: str) -> set[str]:
        """The working directories of ``user`` that jobs still to run name: those of the queued and running jobs, and
        those the plugins will still start jobs in (a running sweep's trials): not pruned however long unused."""
        keep = await self.store.read(self.store.workdirs_in_use, user)
        for mod in self.plugins:
            more = getattr(mod, "workdirs_in_use", None)
            if more is not None:
                keep |= await self.store.read(more, self, user)
        return keep

    async def submit(self, caller, spec: JobSpec):
        """Check a spec against profiles, the pool, the caller's quota and queued-job cap, then queue it."""
        profile, gpus = self.check(caller, spec)
        workdir = await self.own_workdir(caller, spec.workdir) if spec.workdir else None
        # counted (check_queued) from before its count until its row is written: concurrent submissions cannot
        # all pass the cap, whether the count is read on the loop or on a thread
        self._submitting[caller.name] = self._submitting.get(caller.name, 0) + 1
        try:
            await self.check_queued(caller.name, spec.submit_key, own=1)
            self.groups.learn(caller.name, caller.groups)
            priority = spec.priority
            if priority is None:
                priority = self.engine.scheduler.group_priority(caller.groups)
            job = await self.store.write_now(  # on the loop when SQLite's write lock is free: one hop less per submission
                self.store.create, name=spec.name, user=caller.name, groups=list(caller.groups), command=spec.command,
                script=spec.script, gpus=gpus, workers=spec.workers, env=spec.env, time_limit=spec.time_limit,
                retries=spec.retries, profile=profile.slug if profile else None, priority=priority,
                preemptible=spec.preemptible, submit_key=(f"{caller.name}:{spec.submit_key}" if spec.submit_key else None),
                sweep_id=spec.sweep_id, params=spec.params, reason=SUBMITTED_REASON, workdir=workdir,
            )
        finally:
            left = self._submitting[caller.name] - 1
            if left:
                self._submitting[caller.name] = left
            else:
                del self._submitting[caller.name]
        self.log.info("job %s submitted by %s: %d worker(s) × %d GPU(s)", job.key, caller.name, spec.workers, gpus)
        self.engine.wake()
        return job

    def make_app(self) -> web.Application:
        handlers = default_handlers(self.service_prefix, self)
        for mod in self.plugins:
            handlers += mod.routes(self.service_prefix, self)
        handlers.append((url_path_join(self.service_prefix, "oauth_callback"), HubOAuthCallbackHandler))
        return make_application(handlers, cookie_secret=os.urandom(32), xsrf_cookies=False, log_function=self._log_request)

    def _log_request(self, handler) -> None:
        """The access log (``trainhub.httpapi.log_request``), each request's own time counted by the loop watch."""
        if self.loopwatch is not None:
            self.loopwatch.request(handler.request.request_time())
        log_request(handler)

    def tune_interpreter(self) -> None:
        """The process-wide knobs the service wants (``switch_interval``, ``session_nice``); called as it starts."""
        if self.switch_interval > 0:
            sys.setswitchinterval(self.switch_interval)
        if self.session_nice:
            why = set_session_nice(self.session_nice)
            if why:
                self.log.info("CPU priority of the jobs service unchanged: %s", why)
            else:
                self.log.info("the jobs service's session runs at autogroup niceness %d", self.session_nice)

    def settle_heap(self) -> None:
        """``freeze_after_start``: called once the service is up."""
        if self.freeze_after_start:
            gc.collect()
            gc.freeze()
            self.log.info("%d objects of the start-up out of the cycle collector's passes", gc.get_freeze_count())

    async def start_async(self):
        self.tune_interpreter()
        await asyncio.to_thread(self.allocator.start)  # cluster-state ledgers warm their watch caches
        await self.engine.start()
        for mod in self.plugins:
            await mod.start(self)
        port = self.port or int(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:0").rsplit(":", 1)[1].split("/")[0])
        self.http = self.make_app().listen(port, self.ip, max_body_size=MAX_SERVER_BODY_BYTES)
        self.groups.start()
        self.settle_heap()
        if self.stall_log_threshold > 0:
            self.loopwatch = LoopWatch(self.log, stall=self.stall_log_threshold)
            self.loopwatch.start()
        self.log.info("trainhub jobs API listening on %s:%d%s", self.ip, port, self.api_prefix)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        self.log.info("trainhub jobs API stopping (running jobs keep running and are re-adopted on restart)")
        self.http.stop()
        if self.loopwatch is not None:
            self.loopwatch.stop()
        await self.groups.stop()
        for mod in reversed(self.plugins):
            await mod.stop(self)
        await self.engine.stop()
        self.logwatch.close()
        await asyncio.to_thread(self.allocator.close)

    def start(self):
        asyncio.run(self.start_async())


def main(argv=None):
    logging.basicConfig(format="[%(levelname).1s %(asctime)s %(name)s] %(message)s", level=logging.INFO)
    app = JobsService.instance()
    app.initialize(argv)
    app.start()
