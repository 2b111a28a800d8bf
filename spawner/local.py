"""The local GPU spawner: single-user servers as local processes holding ledger devices.

It extends JupyterHub's ``SimpleLocalProcessSpawner`` with profiles, quotas, the GPU ledger,
the storage environment and isolation (``trainhub.boundary.isolation``): run as root, each user's server
runs as their own Unix account, created on demand (as JupyterHub's ``LocalProcessSpawner`` with
``LocalAuthenticator.create_system_users`` would); with bubblewrap, in a sandbox that sees only
the user's home, storage area, ``datasets/`` and the ledger's device nodes. Scripts choose a
profile exactly as with KubeSpawner: ``user_options = {"profile": "<slug>"}``.

A server is started only once *its own* process listens on its port (``trainhub.boundary.procs.listens``):
an HTTP answer on that port from another process (the port taken meanwhile) never counts as ready.
Devices come back within one ``poll_interval`` whatever happened: the spawner releases them when
its server stops or dies, and a reconciler in the hub frees holdings whose server process is gone
(a release that failed because the database was locked, a crash between allocation and start).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shlex
import signal
import stat
import sys
import uuid
from subprocess import Popen

from jupyterhub.spawner import SimpleLocalProcessSpawner, SpawnException
from jupyterhub.utils import random_port
from traitlets import Bool, Callable, Dict, Instance, Integer, List, Type, Unicode, default

from trainhub.boundary import keeper, procs, userenv
from trainhub.boundary.accounts import Account
from trainhub.boundary.asuser import AsUser
from trainhub.boundary.credentials import CredentialBroker, storage_credentials_broker
from trainhub.boundary.network import GATE_SOCKET_VAR, GateError, UserNetworks
from trainhub.backoff import Backoff, WaitTimeout, apoll
from trainhub.exceptions import InvalidRequest, NoFreeGPUs, QuotaExceeded, TrainhubError
from trainhub.fmt import fmt_duration
from trainhub.boundary.isolation import Isolation
from trainhub.ledger import GPUAllocator, LocalGPUAllocator, server_holder
from trainhub.boundary.procs import HOLDER_VAR, INSTANCE_VAR, terminate_tagged
from trainhub.profiles import Profile, ProfileCatalog
from trainhub.quotas import Demand, QuotaPolicy
from trainhub.serverqueue import GRANTED, QueueView, ServerQueue
from trainhub.storage import StorageConfig

from .errors import spawn_failure, spawn_refusal
from .profile_form import render_form
from .reconcile import starting_holders, reserved_holders, start_ledger_reconciler
from .warm import WarmPool
from .warm_starts import WarmStarts


#: seconds JupyterHub's limit on a start that may wait in line gets beyond start_timeout + max_queue_wait: the
#: spawner's own limits, which say why, come first (LocalGPUSpawner.start)
QUEUE_MARGIN = 60


def fill_warm_pool(config, log) -> WarmPool | None:
    """Start the hub's warm server interpreters now (as the hub starts), so that the first spawn after a start is
    warm too. The pool is the one every spawner of this configuration claims from (``warm.pool_for``: one pool per
    launch command and environment, which come from the configuration alone, never from a user). Needs a running
    loop; None where servers start cold."""
    pool = LocalGPUSpawner(config=config, log=log)._warm_pool()
    if pool is not None:
        pool.fill()
    return pool


def _apply_profile_option(spawner, user_options):
    """JupyterHub's apply_user_options hook: validate the profile before start() (400/403 on error)."""
    spawner.profile_slug = spawner._selected_profile().slug


class LocalGPUSpawner(WarmStarts, SimpleLocalProcessSpawner):
    allocator_class = Type(
        LocalGPUAllocator,
        klass=GPUAllocator,
        help="GPU allocator (the ledger). The Kubernetes back end replaces it with cluster state.",
    ).tag(config=True)

    home_dir_template = Unicode(
        "",
        help="Home of each user's server; {username} is expanded. Default: <data-dir>/homes/{username}.",
    ).tag(config=True)

    api_url = Unicode(
        "",
        help="URL of the trainhub jobs API given to servers as $TRAINHUB_API_URL (e.g. http://127.0.0.1:8000/services/trainhub/api).",
    ).tag(config=True)

    link_storage = Unicode(
        "storage",
        help="Name of the link in the home folder to the user's storage area (local-folder storage only). Empty = no link.",
    ).tag(config=True)

    prepare_home_hook = Callable(
        None,
        allow_none=True,
        help="Called as hook(spawner, home) once the server's home folder exists, before the server starts (sync, on "
        "a worker thread). ``home`` is a trainhub.boundary.files.UserTree of the home: it reads and writes as the "
        "user, through descriptors, never following a link (home.write_bytes('.config/x', b'...'), home.makedirs, "
        "home.read_bytes, home.names). `trainhub up` sets it to install the IPython startup file that loads %%train "
        "in every kernel (trainhub.hub_config.embedded.install_kernel_startup). None = nothing.",
    ).tag(config=True)

    user_environment = Bool(
        True,
        help="Give each user a Python environment of their own, layered on the platform's (trainhub.boundary.userenv): "
        "~/.trainhub/venv, made or brought up to date at each server start. In the server's terminals `python` and "
        "`pip` are that environment's (`pip install X` and `pip install --user X` persist in the home), notebook "
        "kernels run it, and `trainhub` is the platform's command; jobs see the same packages. False: terminals, "
        "kernels and jobs use the platform's environment, where users cannot install anything.",
    ).tag(config=True)

    queue_when_full = Bool(
        True,
        help="A GPU server whose devices are all held (or whose user or group is at its quota) waits in line, in the "
        "jobs service's scheduling passes with the queued jobs, instead of failing with 409/403. Needs the jobs "
        "service (api_url set). A request with user_options {\"wait\": false} is refused at once as before.",
    ).tag(config=True)

    max_queue_wait = Integer(
        6 * 3600,
        help="Seconds a server may wait in line for GPUs before its spawn gives up with the reason.",
    ).tag(config=True)

    listen_timeout = Integer(
        120,
        help="Seconds a started server has to listen on its port. Spawner.start_timeout defaults to this plus 60 s.",
    ).tag(config=True)

    gate_socket = Unicode(
        help="""Unix socket of the network gate (trainhub.boundary.network, run by `trainhub up` as root): each user's
        servers then run in that user's own network namespace, listen on its loopback, and are exposed to the proxy by
        the gate. Empty: servers share the machine's network. Default: $TRAINHUB_GATE_SOCKET.""",
    ).tag(config=True)

    @default("gate_socket")
    def _gate_socket_default(self):
        return os.environ.get(GATE_SOCKET_VAR, "")

    credentials_env = Dict(help="The variables that lead the server's S3 clients to its user's own credentials (state).")
    netns = Unicode("", help="The network namespace the server runs in (state; empty: the machine's).")
    netns_env = Dict(help="Variables of the server's namespace (its egress proxy; state).")
    inner_port = Integer(0, help="The port the server listens on inside its namespace (state; the proxy uses the gate's).")

    devices = List(help="Device indices this server holds (state).")
    _queued: QueueView | None = None  # while this spawn waits in line
    _in_line_since: float | None = None  # loop time this spawn joined the line (None: not in line)
    _in_line_seconds = 0.0  # time this spawn spent in line so far
    profile_slug = Unicode("", help="Profile this server was started with (state).")
    spawn_token = Unicode("", help="Marker in the server's environment to find its processes (state).")
    sandboxed = Bool(False, help="The server runs in a bubblewrap sandbox (state): signals go to the processes inside.")

    catalog = Instance(ProfileCatalog)
    quota = Instance(QuotaPolicy)
    storage = Instance(StorageConfig)
    allocator = Instance(GPUAllocator)
    isolation = Instance(Isolation)
    account = Instance(Account, allow_none=True, help="The Unix account the server runs as (None: the hub's).")

    @default("catalog")
    def _catalog(self):
        return ProfileCatalog(parent=self)

    @default("quota")
    def _quota(self):
        return QuotaPolicy(parent=self)

    @default("storage")
    def _storage(self):
        return StorageConfig(parent=self)

    @default("allocator")
    def _allocator(self):
        return self.allocator_class(parent=self)

    @default("isolation")
    def _isolation(self):
        return Isolation(parent=self)

    @default("start_timeout")
    def _default_start_timeout(self):
        # the start itself: home, network, credentials, the server listening (the time in line is max_queue_wait's)
        return self.listen_timeout + 60

    @default("home_dir")
    def _default_home_dir(self):
        template = self.home_dir_template or os.path.join(os.environ.get("TRAINHUB_DATA_DIR", "/tmp"), "homes", "{username}")
        return template.format(username=self.user.name)

    @default("cmd")
    def _default_cmd(self):
        # the hub's interpreter: no PATH lookup, the same virtualenv as the hub
        return [sys.executable, "-m", "jupyterhub.singleuser"]

    @default("options_form")
    def _default_options_form(self):
        return self._render_options_form

    @default("apply_user_options")
    def _default_apply_user_options(self):
        return _apply_profile_option

    @default("default_url")
    def _default_url(self):
        return "/lab"

    # -- who the user is -------------------------------------------------
    def _groups(self) -> list[str]:
        return [g.name for g in self.user.groups]

    def _group_members(self) -> dict[str, list[str]]:
        return {g.name: [u.name for u in g.users] for g in self.user.groups}

    @property
    def _is_admin(self) -> bool:
        return bool(self.user.admin)

    @property
    def holder(self) -> str:
        return server_holder(self.user.name, self.name)

    # -- spawn page --------------------------------------------------------
    async def _render_options_form(self, spawner=None):
        profiles = self.catalog.for_user(self._groups(), self._is_admin)
        devices = self.allocator.devices()
        holdings = await asyncio.to_thread(self.allocator.holdings)
        held = {h.device for h in holdings}
        rows = []
        for p in profiles:
            pool = [d for d in devices if not p.gpu_model or p.gpu_model.lower() in d.name.lower()]
            rows.append((p, sum(d.index not in held for d in pool), len(pool)))
        from collections import Counter

        status = self.quota.status(self.user.name, self._groups(), Counter(h.user for h in holdings), self._group_members())
        simulated = any(d.simulated for d in devices)
        return render_form(rows, status, self.catalog.default().slug, simulated, queue=self._queue_open)

    def options_from_form(self, formdata):
        slug = (formdata.get("profile") or [""])[0]
        wait = bool(formdata.get("wait"))
        try:
            profile = self.catalog.resolve(slug or None, self._groups(), self._is_admin)
            try:
                self._precheck(profile)
            except TrainhubError as e:
                if not self._may_wait(e, wait):
                    raise
        except TrainhubError as e:
            # JupyterHub shows the form again with this message
            raise ValueError(e.message) from None
        return {"profile": profile.slug, "wait": wait}

    def _precheck(self, profile: Profile) -> None:
        """Fast, non-binding check for the form; the binding one runs under the ledger lock in start()."""
        if not profile.gpus:
            return
        from collections import Counter

        holdings = [h for h in self.allocator.holdings() if h.holder != self.holder]
        status = self.quota.status(self.user.name, self._groups(), Counter(h.user for h in holdings), self._group_members())
        self.quota.admit(Demand.server(self.user.name, self._groups(), profile.gpus), status)
        pool = [d for d in self.allocator.devices() if not profile.gpu_model or profile.gpu_model.lower() in d.name.lower()]
        free = [d for d in pool if d.index not in {h.device for h in holdings}]
        if len(free) < profile.gpus:
            raise NoFreeGPUs(f"Not enough free GPUs for {profile.display_name}: {len(free)} free, {profile.gpus} needed.",
                             requested=profile.gpus, free=len(free), total=len(pool))

    # -- lifecycle --------------------------------------------------------
    def _selected_profile(self) -> Profile:
        """The requested profile, checked; refusals are SpawnExceptions (400 / 403)."""
        try:
            options = self.user_options or {}
            if not isinstance(options, dict):
                raise InvalidRequest('user_options must be a JSON object such as {"profile": "gpu-1"}')
            unknown = set(options) - {"profile", "wait"}
            if unknown:
                raise InvalidRequest(f'Unknown user_options {sorted(unknown)}; this spawner takes '
                                     '{"profile": "<slug>", "wait": true|false}.')
            if not isinstance(options.get("wait", True), bool):
                raise InvalidRequest("wait must be true (wait in line when no GPU is free) or false (refuse at once)")
            slug = options.get("profile")
            if slug is not None and not isinstance(slug, str):
                raise InvalidRequest("profile must be a string")
            return self.catalog.resolve(slug, self._groups(), self._is_admin)
        except TrainhubError as e:
            raise spawn_refusal(e) from None

    def start(self):
        """Start the server; time spent waiting in line for GPUs does not count against ``start_timeout``.

        JupyterHub reads ``start_timeout`` right after this returns and cancels the spawn once it has passed. So for
        a spawn that may wait in line, its limit is raised to ``start_timeout + max_queue_wait`` (and a margin) for
        this spawn, and the configured value is back once the start ends; the spawner enforces both limits itself,
        each failing with its reason: the line's (``max_queue_wait``, "No GPU became free ... in line (last: ...)")
        and the start's (``start_timeout`` of time not in line). JupyterHub's own timeout, which names no reason
        ("Spawn failed: "), never comes first. The Kubernetes spawner does the same for Kueue's queue.
        """
        limit = self.start_timeout
        if self._queue_open:
            self.start_timeout = limit + self.max_queue_wait + QUEUE_MARGIN
        return self._start_within(limit)  # a coroutine: JupyterHub wraps it in a task after reading start_timeout

    async def _start_within(self, limit: float):
        loop = asyncio.get_running_loop()
        began = loop.time()
        self._in_line_since, self._in_line_seconds = None, 0.0
        task = asyncio.ensure_future(self._start())
        try:
            while True:
                in_line = self._in_line_since is not None
                active = loop.time() - began - self._in_line_seconds - (loop.time() - self._in_line_since if in_line else 0)
                if active > limit:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    message = (f"The server of {self.user.name} did not start within {fmt_duration(limit, 'units')} "
                               "(time waiting in line for GPUs not counted); see the hub's log.")
                    exc = SpawnException(message, status_code=500, reason="timeout",
                                         log_message=f"start of {self._log_name} passed start_timeout={limit}")
                    exc.jupyterhub_message = message
                    raise exc
                done, _ = await asyncio.wait({task}, timeout=1.0 if in_line else max(0.05, limit - active))
                if done:
                    return task.result()
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        finally:
            self.start_timeout = limit

    async def _start(self):
        profile = self._selected_profile()
        try:
            self.isolation.check_user(self.user.name)
            self.account = await asyncio.to_thread(self.isolation.account, self.user.name)
        except TrainhubError as e:
            raise spawn_refusal(e) from None
        self._ensure_reconciler()
        pool = self._warm_pool()
        if pool is not None:  # demand learns of this spawn; a rush grows the pool now, not after this server is up
            pool.arrive()
        starting_holders.add(self.holder)
        try:
            try:
                devices = await asyncio.to_thread(
                    self.allocator.allocate,
                    self.holder,
                    kind="server",
                    user=self.user.name,
                    count=profile.gpus,
                    profile=profile.slug,
                    gpu_model=profile.gpu_model,
                    quota=self.quota,
                    user_groups=self._groups(),
                    group_members=self._group_members(),
                )
            except TrainhubError as e:  # JupyterHub logs the refusal ("Not starting ...") and stops nothing
                if not self._may_wait(e, (self.user_options or {}).get("wait", True)):
                    raise spawn_refusal(e) from None
                devices = await self._wait_in_line(profile, e)
            self.devices = devices
            self.profile_slug = profile.slug
            self.spawn_token = uuid.uuid4().hex
            self.cpu_limit = profile.cpu_limit
            try:
                # from here to listening the pool's refill runs behind this server (WarmPool.server_starting)
                async with pool.server_starting() if pool is not None else contextlib.nullcontext():
                    await self._place_in_network()
                    cred_folders = await self._storage_credentials()
                    rw, ro = await asyncio.to_thread(self._prepare_home)
                    ro += cred_folders
                    result = await self._start_process(rw, ro)
                await asyncio.to_thread(self.allocator.set_pid, self.holder, self.pid)
            except BaseException as e:
                await self._kill_started()
                await asyncio.to_thread(self.allocator.release, self.holder)
                self.devices = []
                if isinstance(e, Exception) and not isinstance(e, SpawnException):
                    self.log.exception("Start of %s failed", self._log_name)
                    raise spawn_failure(self.user.name, e) from e
                raise
        finally:
            starting_holders.discard(self.holder)
        self.log.info(
            "Started %s profile=%s devices=%s pid=%s as %s (%s, %s)", self._log_name, profile.slug, devices, self.pid,
            self.account.name if self.account else "the hub's account", self.isolation.mode,
            "warm" if self.started_warm else "cold",
        )
        return result

    # -- the user's own network namespace (trainhub.boundary.network) ------------------------------------
    def _networks(self) -> UserNetworks | None:
        return UserNetworks.from_environment(self.gate_socket) if self.gate_socket else None

    async def _place_in_network(self) -> None:
        """Run this server in its user's own network namespace (with per-user accounts and the gate only)."""
        networks = self._networks()
        self.netns, self.netns_env, self.inner_port = "", {}, 0
        if networks is None or self.account is None:
            return
        try:
            self.netns, env = await asyncio.to_thread(networks.place, self.account.name)
        except GateError as e:
            raise RuntimeError(f"the network namespace of {self.user.name} could not be made: {e}") from None
        self.netns_env = env

    async def _expose(self, port: int) -> tuple[str, int]:
        """Where the proxy reaches the server listening on ``port``: in its namespace through the gate."""
        if not self.netns:
            return (self.ip or "127.0.0.1", port)
        self.inner_port = port
        host_port = await asyncio.to_thread(self._networks().client.expose, os.path.basename(self.netns), port)
        return ("127.0.0.1", host_port)

    async def _unexpose(self) -> None:
        networks = self._networks()
        port, self.inner_port = self.inner_port, 0
        if networks is not None and port and self.netns:
            try:
                await asyncio.to_thread(networks.client.unexpose, os.path.basename(self.netns), port)
            except GateError as e:
                self.log.warning("%s: the gate's port to the server stays open (%s)", self._log_name, e)

    # -- the user's own storage credentials (trainhub.boundary.credentials) ------------------------------
    def _broker(self) -> CredentialBroker | None:
        return storage_credentials_broker(self.storage, parent=self)

    async def _storage_credentials(self) -> list[str]:
        """With S3: the user's own short-lived credentials file made current; returns the folder the sandbox shows
        read-only (the server's variables point at it). Nothing on local storage."""
        broker = self._broker()
        self.credentials_env = {}
        if broker is None:
            return []
        files = await asyncio.to_thread(broker.ensure, self.user.name, self.account)
        self.credentials_env = files.env(sandboxed=False)  # the folder is bound at its own path
        self._credentials_kept = True
        return [files.folder]

    # -- waiting in line for GPUs (trainhub.serverqueue; the jobs engine grants) -------------------------
    @property
    def _queue_open(self) -> bool:
        return bool(self.queue_when_full and self.api_url)

    def _may_wait(self, e: TrainhubError, wait: bool) -> bool:
        """Wait only for what others will give back: GPUs held by others, a group's share held by its other
        members; never for more than the pool or a quota could ever give, nor for one's own quota (a 403 that
        says which of one's own servers or jobs to stop is the faster way)."""
        if not (self._queue_open and wait):
            return False
        if isinstance(e, NoFreeGPUs):
            return e.details.get("total", 0) >= e.details.get("requested", 1)
        return isinstance(e, QuotaExceeded) and e.details.get("code") == "quota-group" and e.details.get("held") is not None

    async def _wait_in_line(self, profile: Profile, refusal: TrainhubError) -> list[int]:
        queue = ServerQueue(self.allocator.db_url)
        await asyncio.to_thread(queue.enqueue, self.holder, user=self.user.name, groups=self._groups(), gpus=profile.gpus,
                                profile=profile.slug, gpu_model=profile.gpu_model, reason=refusal.message)
        self.log.info("%s waits in line for %d GPU(s): %s", self._log_name, profile.gpus, refusal.message)
        self._queued = QueueView(profile.display_name, profile.gpus)
        loop = asyncio.get_running_loop()
        self._in_line_since = loop.time()  # not counted against start_timeout (start())
        pause = Backoff(f"GPUs for {self._log_name}", start=0.5, factor=1.0, timeout=self.max_queue_wait)
        granted = False
        try:
            while True:
                r = await asyncio.to_thread(queue.heartbeat, self.holder)
                if r is None:
                    raise spawn_refusal(NoFreeGPUs("The request for GPUs was dropped from the queue; start the server again."))
                self._queued.update(r, await asyncio.to_thread(self._free_profiles))
                if r.state == GRANTED:
                    granted = True
                    self.log.info("%s: GPUs %s assigned after waiting in line", self._log_name, list(r.devices))
                    return list(r.devices)
                try:
                    await pause.asleep()
                except WaitTimeout:
                    raise spawn_refusal(NoFreeGPUs(
                        f"No GPU became free for {profile.display_name} within {fmt_duration(self.max_queue_wait, 'units')} "
                        f"in line (last: {r.reason}). Pick a smaller profile or try again later.")) from None
        except BaseException:
            if not granted:  # a granted request's devices are released by start()'s own cleanup
                await asyncio.to_thread(self.allocator.release, self.holder)
            raise
        finally:
            self._in_line_seconds += loop.time() - self._in_line_since
            self._in_line_since = None
            await asyncio.to_thread(queue.withdraw, self.holder)
            self._queued.done = True

    def _free_profiles(self) -> list[tuple[str, str]]:
        """The profiles this user could start at once (the way out of the line), as (slug, display name)."""
        held = {h.device for h in self.allocator.holdings()}
        free = [d for d in self.allocator.devices() if d.index not in held]
        out = []
        for p in self.catalog.for_user(self._groups(), self._is_admin):
            if len([d for d in free if not p.gpu_model or p.gpu_model.lower() in d.name.lower()]) >= p.gpus:
                out.append((p.slug, p.display_name))
        return out

    async def progress(self):
        """JupyterHub's progress events (spawn page, REST API): while in line, the position, the
        reason, the estimate and the profiles free now, each time they change."""
        last = None
        while self._spawn_pending:
            q = self._queued
            if q is not None:
                event = q.event()
                if event != last:
                    yield event
                    last = event
                if q.done:
                    break
            await asyncio.sleep(0.5)
        yield {"progress": 60, "message": "Starting the server..."}

    async def _start_process(self, rw: list[str], ro: list[str]):
        """Start the server (warm when it can, sandboxed and as the user's account, as configured) and wait until
        it listens."""
        self.sandboxed = self.isolation.use_sandbox
        pool = self._warm_pool()
        try:
            for attempt in range(3):
                if self.port == 0 or attempt:
                    self.port = random_port()
                self.started_warm = pool is not None and attempt == 0 and await self._start_warm(pool, rw, ro)
                if not self.started_warm:
                    self._start_cold(rw, ro)
                port = self.port
                try:
                    # a warm server listens within 1-2 s: checked every 0.1 s at most (a check is a few ms of CPU), so a
                    # rush's users are not kept up to 0.5 s past it (hub logs: "Started" 0.1-0.4 s after the server's
                    # first activity call)
                    await apoll(lambda: asyncio.to_thread(self._listening, port), what=f"the server of {self._log_name} to listen on port {port}",
                                start=0.05 if not self.started_warm else 0.02, factor=1.5,
                                cap=0.5 if not self.started_warm else 0.1, timeout=self.listen_timeout)
                    return await self._expose(port)
                except _ServerExited as e:
                    # in its own namespace only the user's own processes can hold the port: try another once more
                    taken = self.netns or await asyncio.to_thread(procs.listening_inodes, port)
                    self.proc, self.pid = None, 0
                    if taken and attempt < 2:  # another process took the port meanwhile: a new port, once more
                        self.log.warning("%s: port %d was taken by another process; retrying on another port", self._log_name, port)
                        continue
                    raise RuntimeError(f"the server of {self._log_name} exited with code {e.code} before listening on "
                                       f"port {port}; see the hub's log") from None
                except WaitTimeout:
                    raise RuntimeError(f"the server of {self._log_name} did not listen on port {port} within "
                                       f"{self.listen_timeout} s") from None
        finally:
            if pool is not None:
                pool.fill()  # after the server is up (or failed): the next interpreter does not slow this one

    def _start_cold(self, rw: list[str], ro: list[str]) -> None:
        env = self.get_env()
        cmd = list(self.cmd) + self.get_args()
        # under a keeper: the server outlives a restart of the hub (trainhub.boundary.keeper)
        argv = keeper.argv(self.isolation.command(cmd, account=self.account, cwd=self.home_dir, rw=rw, ro=ro,
                                                  devices=self.devices, netns=self.netns or None))
        self.log.info("Spawning %s", " ".join(shlex.quote(a) for a in argv))
        kwargs = dict(start_new_session=True)
        kwargs.update(self.popen_kwargs)
        kwargs["env"] = env
        # without a sandbox (bwrap --chdir does it there) start in the home, as SimpleLocalProcessSpawner does
        kwargs["preexec_fn"] = None if self.sandboxed else functools.partial(os.chdir, self.home_dir)
        self.proc = Popen(argv, **kwargs)
        self.pid = self.proc.pid

    def _listening(self, port: int) -> bool:
        code = self.proc.poll()
        if code is not None:
            raise _ServerExited(code)
        return procs.listens([self.pid, *procs.descendants([self.pid])], port)

    async def _kill_started(self) -> None:
        """A start that failed after Popen: end what it started."""
        if self.pid:
            await asyncio.to_thread(procs.terminate, [self.pid], 2.0)
        self.proc, self.pid = None, 0

    def _ensure_reconciler(self) -> None:
        """Start, once per hub process, the loop that frees devices of servers that are gone (the hub's config
        starts it at hub start already: ``start_ledger_reconciler``)."""
        start_ledger_reconciler(self.allocator, lambda: self.poll_interval, self.log)

    async def _signal(self, sig):
        """Signals other than 0 and SIGKILL go to the processes inside a sandbox: bwrap itself would die at once and
        take the server with it, without the clean stop (kernels shut down) that SIGINT asks for."""
        if not self.sandboxed or sig in (0, signal.SIGKILL):
            return await super()._signal(sig)
        if not await super()._signal(0):
            return False
        await asyncio.to_thread(procs.signal_all, procs.sandbox_commands(self.pid), sig)
        return True

    async def poll(self):
        status = await super().poll()
        if status is not None and self.spawn_token:
            # the server died (crash, kill): give its devices and stray kernels back
            await self._cleanup()
        elif status is None and self.credentials_env and not self._credentials_kept:
            await self._keep_credentials()
        return status

    _credentials_kept = False  # this hub refreshes the server's storage credentials (set at start or first poll)

    async def _keep_credentials(self) -> None:
        """A server this hub did not start (it lived on through a restart of the hub): its user's storage credentials
        are refreshed from now on, as for a server started here."""
        broker = self._broker()
        if broker is None:
            return
        try:
            account = self.account or await asyncio.to_thread(self.isolation.account, self.user.name)
            await asyncio.to_thread(broker.ensure, self.user.name, account)
            self._credentials_kept = True
        except Exception as e:  # the next poll tries again; the file keeps its credentials meanwhile
            self.log.warning("Could not refresh the storage credentials of %s: %s", self._log_name, e)

    async def stop(self, now=False):
        pid = self.pid
        await super().stop(now=now)
        if pid and self.sandboxed:  # nothing of the sandbox may outlive the server
            await asyncio.to_thread(procs.terminate, [pid], 1.0)
        await self._cleanup()

    async def _cleanup(self):
        await self._unexpose()
        token, self.spawn_token = self.spawn_token, ""
        if token:
            await asyncio.to_thread(terminate_tagged, HOLDER_VAR, token, 3.0)
        try:
            if not self.devices and self.holder in await asyncio.to_thread(reserved_holders, self.allocator):
                # a CPU server stopping for its restart on GPUs granted in the queue: those are the next start's
                self.log.info("Leaving the GPUs reserved for the restart of %s in the ledger", self._log_name)
                released = []
            else:
                released = await asyncio.to_thread(self.allocator.release, self.holder)
        except Exception as e:  # a locked database: the hub's ledger reconciler frees them within one poll
            self.log.warning("Could not release the devices of %s now (%s); the ledger reconciler will", self._log_name, e)
            released = []
        if released:
            self.log.info("Released devices %s of %s", released, self._log_name)
        self.devices = []

    def get_state(self):
        state = super().get_state()
        state.update(devices=list(self.devices), profile=self.profile_slug, spawn_token=self.spawn_token,
                     sandboxed=self.sandboxed, started_warm=self.started_warm, netns=self.netns,
                     netns_env=dict(self.netns_env), inner_port=self.inner_port,
                     credentials_env=dict(self.credentials_env))
        return state

    def load_state(self, state):
        super().load_state(state)
        self.devices = state.get("devices", [])
        self.profile_slug = state.get("profile", "")
        self.spawn_token = state.get("spawn_token", "")
        self.sandboxed = bool(state.get("sandboxed", False))
        self.started_warm = bool(state.get("started_warm", False))
        self.netns = state.get("netns", "")
        self.netns_env = dict(state.get("netns_env") or {})
        self.inner_port = int(state.get("inner_port") or 0)
        self.credentials_env = dict(state.get("credentials_env") or {})

    def clear_state(self):
        super().clear_state()

    # -- environment --------------------------------------------------------
    def get_args(self):
        args = super().get_args()
        if os.geteuid() == 0 and self.account is None and "--allow-root" not in args:
            # jupyter-server refuses root without it; JupyterHub then only reports a timeout
            args.append("--allow-root")
        return args

    def get_env(self):
        env = super().get_env()
        visible = ",".join(str(d) for d in self.devices)
        env.update(self.storage.env_for(self.user.name, credentials_env=self.credentials_env))
        env["CUDA_VISIBLE_DEVICES"] = visible
        env["NVIDIA_VISIBLE_DEVICES"] = visible if self.devices else "void"
        env["TRAINHUB_GPUS"] = visible
        env["TRAINHUB_PROFILE"] = self.profile_slug
        if self.api_url:
            env["TRAINHUB_API_URL"] = self.api_url
        env.update(self.netns_env)  # the egress proxy of the user's namespace
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", os.defpath)
        if self.user_environment:  # python, pip and the user's packages first; the platform's commands after them
            env.update(userenv.server_env(os.path.realpath(self.home_dir), env))
        # the platform's markers last: no Spawner.environment entry or user option replaces them
        env[HOLDER_VAR] = self.spawn_token
        if os.environ.get(INSTANCE_VAR):
            env[INSTANCE_VAR] = os.environ[INSTANCE_VAR]
        return env

    def _prepare_home(self) -> tuple[list[str], list[str]]:
        """The home (and the storage area) made the user's, the hook and the links written as the user (through
        descriptors: trainhub.boundary.files); returns the (read-write, read-only) paths of the sandbox. Blocking."""
        rw, ro = self.isolation.user_areas(self.storage, self.user.name, self.account, self.home_dir)
        with AsUser(self.user.name, self.account, self.isolation).tree(self.home_dir) as home:
            if self.prepare_home_hook is not None:  # e.g. %%train and %train load in every kernel of a platform notebook
                self.prepare_home_hook(self, home)
            if self.user_environment:
                userenv.install(home, os.path.realpath(self.home_dir))
            if self.storage.url and self.storage.is_local and self.link_storage:
                for name, url in ((self.link_storage, self.storage.user_url(self.user.name)),
                                  ("datasets", self.storage.datasets_url())):
                    link_home(home, name, self.storage.strip(url))
        return rw, ro


def link_home(home, name: str, target: str) -> None:
    """``~/<name>`` -> ``target`` (a folder of the storage), unless the user keeps a file or folder of their own
    by that name; a link of theirs elsewhere is replaced."""
    try:
        st = home.stat(name)
    except FileNotFoundError:
        home.symlink(target, name)
        return
    if not stat.S_ISLNK(st.st_mode):
        return
    if home.readlink(name) != target:
        home.unlink(name)
        home.symlink(target, name)


class _ServerExited(Exception):
    def __init__(self, code):
        super().__init__(code)
        self.code = code
