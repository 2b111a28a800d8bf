"""The local GPU spawner: single-user servers as local processes holding ledger devices.

It extends JupyterHub's ``SimpleLocalProcessSpawner`` (users need no Unix account)
with profiles, quotas, the GPU ledger and the storage environment. Scripts choose a
profile exactly as with KubeSpawner: ``user_options = {"profile": "<slug>"}``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

from jupyterhub.spawner import SimpleLocalProcessSpawner
from traitlets import Callable, Instance, List, Type, Unicode, default

from trainhub.exceptions import InvalidRequest, NoFreeGPUs, TrainhubError
from trainhub.ledger import GPUAllocator, LocalGPUAllocator, server_holder
from trainhub.procs import HOLDER_VAR, terminate_tagged
from trainhub.profiles import Profile, ProfileCatalog
from trainhub.quotas import Demand, QuotaPolicy
from trainhub.storage import StorageConfig

from .errors import spawn_refusal
from .profile_form import render_form


def _apply_profile_option(spawner, user_options):
    """JupyterHub's apply_user_options hook: validate the profile before start() (400/403 on error)."""
    spawner.profile_slug = spawner._selected_profile().slug


class LocalGPUSpawner(SimpleLocalProcessSpawner):
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
        help="Called as hook(spawner, home: pathlib.Path) once the server's home folder exists, before the server "
        "starts (sync). `trainhub up` sets it to install the IPython startup file that loads %%train in every kernel "
        "(trainhub.hub_config.embedded.install_kernel_startup). None = nothing.",
    ).tag(config=True)

    devices = List(help="Device indices this server holds (state).")
    profile_slug = Unicode("", help="Profile this server was started with (state).")
    spawn_token = Unicode("", help="Marker in the server's environment to find its processes (state).")

    catalog = Instance(ProfileCatalog)
    quota = Instance(QuotaPolicy)
    storage = Instance(StorageConfig)
    allocator = Instance(GPUAllocator)

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
        return render_form(rows, status, self.catalog.default().slug, simulated)

    def options_from_form(self, formdata):
        slug = (formdata.get("profile") or [""])[0]
        try:
            profile = self.catalog.resolve(slug or None, self._groups(), self._is_admin)
            self._precheck(profile)
        except TrainhubError as e:
            # JupyterHub shows the form again with this message
            raise ValueError(e.message) from None
        return {"profile": profile.slug}

    def _precheck(self, profile: Profile) -> None:
        """Fast, non-binding check for the form; the binding one runs under the ledger lock in start()."""
        if not profile.gpus:
            return
        from collections import Counter

        holdings = [h for h in self.allocator.holdings() if h.holder != self.holder]
        status = self.quota.status(self.user.name, self._groups(), Counter(h.user for h in holdings), self._group_members())
        self.quota.admit(Demand.server(self.user.name, self._groups(), profile.gpus), status)
        free = [d for d in self.allocator.devices()
                if d.index not in {h.device for h in holdings}
                and (not profile.gpu_model or profile.gpu_model.lower() in d.name.lower())]
        if len(free) < profile.gpus:
            raise NoFreeGPUs(f"Not enough free GPUs for {profile.display_name}: {len(free)} free, {profile.gpus} needed.")

    # -- lifecycle --------------------------------------------------------
    def _selected_profile(self) -> Profile:
        """The requested profile, checked; refusals are SpawnExceptions (400 / 403)."""
        try:
            options = self.user_options or {}
            if not isinstance(options, dict):
                raise InvalidRequest('user_options must be a JSON object such as {"profile": "gpu-1"}')
            unknown = set(options) - {"profile"}
            if unknown:
                raise InvalidRequest(f'Unknown user_options {sorted(unknown)}; this spawner takes {{"profile": "<slug>"}}.')
            slug = options.get("profile")
            if slug is not None and not isinstance(slug, str):
                raise InvalidRequest("profile must be a string")
            return self.catalog.resolve(slug, self._groups(), self._is_admin)
        except TrainhubError as e:
            raise spawn_refusal(e) from None

    async def start(self):
        profile = self._selected_profile()
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
            raise spawn_refusal(e) from None
        self.devices = devices
        self.profile_slug = profile.slug
        self.spawn_token = uuid.uuid4().hex
        self.cpu_limit = profile.cpu_limit
        try:
            self._prepare_home()
            result = await super().start()
        except BaseException:
            await asyncio.to_thread(self.allocator.release, self.holder)
            self.devices = []
            raise
        await asyncio.to_thread(self.allocator.set_pid, self.holder, self.pid)
        self.log.info(
            "Started %s profile=%s devices=%s pid=%s", self._log_name, profile.slug, devices, self.pid
        )
        return result

    async def poll(self):
        status = await super().poll()
        if status is not None and self.spawn_token:
            # the server died (crash, kill): give its devices and stray kernels back
            await self._cleanup()
        return status

    async def stop(self, now=False):
        await super().stop(now=now)
        await self._cleanup()

    async def _cleanup(self):
        token, self.spawn_token = self.spawn_token, ""
        if token:
            await asyncio.to_thread(terminate_tagged, HOLDER_VAR, token, 3.0)
        released = await asyncio.to_thread(self.allocator.release, self.holder)
        if released:
            self.log.info("Released devices %s of %s", released, self._log_name)
        self.devices = []

    def get_state(self):
        state = super().get_state()
        state.update(devices=list(self.devices), profile=self.profile_slug, spawn_token=self.spawn_token)
        return state

    def load_state(self, state):
        super().load_state(state)
        self.devices = state.get("devices", [])
        self.profile_slug = state.get("profile", "")
        self.spawn_token = state.get("spawn_token", "")

    def clear_state(self):
        super().clear_state()

    # -- environment --------------------------------------------------------
    def get_args(self):
        args = super().get_args()
        if os.geteuid() == 0 and "--allow-root" not in args:
            # jupyter-server refuses root without it; JupyterHub then only reports a timeout
            args.append("--allow-root")
        return args

    def get_env(self):
        env = super().get_env()
        visible = ",".join(str(d) for d in self.devices)
        env["CUDA_VISIBLE_DEVICES"] = visible
        env["NVIDIA_VISIBLE_DEVICES"] = visible if self.devices else "void"
        env["TRAINHUB_GPUS"] = visible
        env["TRAINHUB_PROFILE"] = self.profile_slug
        env[HOLDER_VAR] = self.spawn_token
        if self.api_url:
            env["TRAINHUB_API_URL"] = self.api_url
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", os.defpath)
        env.update(self.storage.env_for(self.user.name))
        return env

    def _prepare_home(self):
        home = Path(self.home_dir)
        home.mkdir(parents=True, exist_ok=True)
        if self.prepare_home_hook is not None:  # e.g. %%train and %train load in every kernel of a platform notebook
            self.prepare_home_hook(self, home)
        if not self.storage.url:
            return
        self.storage.ensure_layout([self.user.name])
        if not (self.storage.is_local and self.link_storage):
            return
        for name, url in ((self.link_storage, self.storage.user_url(self.user.name)), ("datasets", self.storage.datasets_url())):
            link, target = home / name, Path(self.storage.strip(url))
            if link.is_symlink() and Path(os.readlink(link)) == target:
                continue
            if link.is_symlink():
                link.unlink()
            if not link.exists():
                link.symlink_to(target, target_is_directory=True)
