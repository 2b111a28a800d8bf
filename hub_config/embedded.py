"""Hub configuration for the embedded back end, built from the data dir.

Kept as a function (not a flat config file) so tests and the Helm chart's extraConfig
can reuse its parts, and so nothing here runs at import time.
"""

from __future__ import annotations

import os
import sys

from trainhub.config import load_platform_config
from trainhub.hub_config import scopes
from trainhub.ledger import LocalGPUAllocator, pid_alive
from trainhub.metrics.scripted import DEFAULT_SCRIPT_NAME, ENV_SCRIPT
from trainhub.boundary.network import GATE_SOCKET_VAR
from trainhub.boundary.procs import INSTANCE_VAR
from trainhub.settings import DataDir, Runtime, read_or_create_secret


#: how the platform's own processes find its storage credentials (inherited by the services, never by users)
PLATFORM_AWS_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                     "S3_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE",
                     "AWS_SHARED_CREDENTIALS_FILE", "AWS_CA_BUNDLE")


def managed_services(runtime: Runtime, dd: DataDir) -> list[dict]:
    """The platform's own hub services (each module knows how it is started)."""
    env_common = {
        "TRAINHUB_DATA_DIR": str(dd.root),
        INSTANCE_VAR: os.environ.get(INSTANCE_VAR, ""),
        "PYTHONUNBUFFERED": "1",
        # what the services need to find the ledger and the public side of the hub
        "TRAINHUB_DB_URL": dd.platform_db_url,
        "TRAINHUB_PUBLIC_URL": runtime.public_url.rstrip("/"),
    }
    if runtime.service_ports.get("trainhub"):
        env_common["TRAINHUB_API_URL"] = f"{runtime.public_url.rstrip('/')}/services/trainhub/api"
    if os.environ.get("TRAINHUB_CONFIG"):
        env_common["TRAINHUB_CONFIG"] = os.environ["TRAINHUB_CONFIG"]
    # the platform's own: the network gate of users' namespaces, the platform's storage credentials (its key stays in
    # the platform's processes; users get their own, trainhub.boundary.credentials)
    for var in (GATE_SOCKET_VAR, *PLATFORM_AWS_VARS):
        if os.environ.get(var):
            env_common[var] = os.environ[var]
    services = []
    for name, module in (("trainhub", "trainhub.services.jobs"), ("trainhub-culler", "trainhub.services.culler")):
        port = runtime.service_ports.get(name)
        if not port:
            continue
        env = dict(env_common)
        if name == "trainhub-culler":
            # simulated devices: the scripted utilisation file (tests and demos edit it; absent = all idle)
            env[ENV_SCRIPT] = os.environ.get(ENV_SCRIPT) or str(dd.root / DEFAULT_SCRIPT_NAME)
        services.append(
            {
                "name": name,
                "url": f"http://127.0.0.1:{port}",
                "command": [sys.executable, "-m", module, "--port", str(port)],
                "environment": env,
                "oauth_no_confirm": True,
                "oauth_client_allowed_scopes": list(scopes.OAUTH_SCOPES),
                "display": name == "trainhub",
            }
        )
    return services


def service_scopes(name: str) -> list[str]:
    try:
        if name == "trainhub":
            return scopes.JOBS_SERVICE_SCOPES
        if name == "trainhub-culler":
            from trainhub.services.culler import HUB_SCOPES

            return list(HUB_SCOPES)
    except ImportError:
        pass
    return []


def install_kernel_startup(spawner, home) -> None:
    """``LocalGPUSpawner.prepare_home_hook``: %%train and %train load in every kernel of a platform notebook
    (the spawner and the kernel side are independent parts; the hub's configuration wires them)."""
    from trainhub.kernels.startup import install_into

    install_into(home)


def reconcile_ledger(c) -> None:
    """On hub start, free devices whose server process is gone (crash, reboot, SIGKILL), then keep doing so every
    ``Spawner.poll_interval`` while the hub runs (``trainhub.spawner.reconcile.start_ledger_reconciler``)."""
    import asyncio
    import logging

    from trainhub.spawner.reconcile import start_ledger_reconciler

    allocator = LocalGPUAllocator(config=c)
    allocator.reconcile(lambda h: h.kind != "server" or pid_alive(h.pid, h.pid_started))
    try:
        asyncio.get_running_loop()  # JupyterHub loads its config inside its event loop
    except RuntimeError:
        return  # (config loaded elsewhere: the spawner starts the loop on its first start)
    interval = float(c.Spawner.poll_interval) if "poll_interval" in c.Spawner else 30.0
    start_ledger_reconciler(allocator, lambda: interval, logging.getLogger("JupyterHub"))


def prefill_warm_servers(c) -> None:
    """On hub start, start the warm server interpreters (``trainhub.spawner.local.fill_warm_pool``) when the
    spawner is trainhub's: the first spawn after a start is then warm too, not only the ones after it."""
    import asyncio
    import logging

    from traitlets.utils.importstring import import_item

    from trainhub.spawner.local import LocalGPUSpawner, fill_warm_pool

    try:
        loop = asyncio.get_running_loop()  # JupyterHub loads its config inside its event loop
    except RuntimeError:
        return
    cls = c.JupyterHub.spawner_class
    if isinstance(cls, str):
        cls = import_item(cls)
    if not (isinstance(cls, type) and issubclass(cls, LocalGPUSpawner)):
        return
    log = logging.getLogger("JupyterHub")

    def fill():
        try:
            fill_warm_pool(c, log)
        except Exception:  # the spawns start cold, as before
            log.warning("Could not start the warm server interpreters at hub start", exc_info=True)

    loop.call_soon(fill)


def configure(c, data_dir: str) -> None:
    dd = DataDir(data_dir)
    runtime = Runtime.load(dd.root)
    c.merge(load_platform_config(dd.root))

    # -- the hub and its proxy --------------------------------------------------
    c.JupyterHub.ip = runtime.ip
    c.JupyterHub.port = runtime.port
    c.JupyterHub.base_url = runtime.base_url
    c.JupyterHub.hub_ip = "127.0.0.1"
    c.JupyterHub.hub_port = runtime.hub_port
    c.JupyterHub.db_url = dd.hub_db_url
    c.JupyterHub.cookie_secret_file = str(dd.cookie_secret)
    c.JupyterHub.pid_file = str(dd.root / "jupyterhub.pid")
    c.JupyterHub.cleanup_servers = True
    c.JupyterHub.cleanup_proxy = True
    c.JupyterHub.last_activity_interval = c.JupyterHub.get("last_activity_interval", 60)
    c.JupyterHub.allow_named_servers = c.JupyterHub.get("allow_named_servers", True)
    c.JupyterHub.named_server_limit_per_user = c.JupyterHub.get("named_server_limit_per_user", 3)
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{runtime.proxy_api_port}"
    c.ConfigurableHTTPProxy.auth_token = read_or_create_secret(dd.proxy_token_file)[0]
    c.ConfigurableHTTPProxy.pid_file = str(dd.root / "proxy.pid")
    proxy_cmd = os.environ.get("TRAINHUB_PROXY_CMD")
    if proxy_cmd:
        c.ConfigurableHTTPProxy.command = [proxy_cmd]

    # -- who may log in ---------------------------------------------------------
    if "authenticator_class" not in c.JupyterHub:
        c.JupyterHub.authenticator_class = "trainhub.hub_config.auth.TrainhubAuthenticator"
        c.Authenticator.allow_all = True  # NativeAuthenticator gates logins by admin approval
        c.NativeAuthenticator.open_signup = False
        c.NativeAuthenticator.minimum_password_length = 8
        c.TrainhubAuthenticator.bootstrap_admin = runtime.admin_user
        c.TrainhubAuthenticator.bootstrap_password_file = str(dd.admin_password_file)
    admins = set(c.Authenticator.get("admin_users", set())) | {runtime.admin_user}
    c.Authenticator.admin_users = admins

    # -- spawner ------------------------------------------------------------------
    if "spawner_class" not in c.JupyterHub:
        c.JupyterHub.spawner_class = "trainhub.spawner.local.LocalGPUSpawner"
    c.LocalGPUSpawner.home_dir_template = str(dd.homes / "{username}")
    if "prepare_home_hook" not in c.LocalGPUSpawner:
        c.LocalGPUSpawner.prepare_home_hook = install_kernel_startup
    if "warm_imports" not in c.LocalGPUSpawner:  # the platform's own server extensions are warm too
        from trainhub.extensions import ENABLED_EXTENSIONS
        from trainhub.spawner.warm import DEFAULT_IMPORTS

        c.LocalGPUSpawner.warm_imports = [*DEFAULT_IMPORTS, *ENABLED_EXTENSIONS]
    if runtime.service_ports.get("trainhub"):
        # notebooks (and their kernels: %%train, the job panel's streams) call the jobs service straight on loopback:
        # every call one process hop and the proxy's CPU less than through the public URL
        c.LocalGPUSpawner.api_url = runtime.service_url("trainhub") + "api"
    c.Spawner.server_token_scopes = c.Spawner.get("server_token_scopes", scopes.SERVER_TOKEN_SCOPES)
    c.Spawner.poll_interval = c.Spawner.get("poll_interval", 10)
    c.Spawner.http_timeout = c.Spawner.get("http_timeout", 60)
    # Spawner.start_timeout: LocalGPUSpawner's own default (listen_timeout + 60 s), which never counts the time a
    # server waits in line for GPUs (LocalGPUSpawner.max_queue_wait bounds that); a fixed 120 s here ended every
    # queued spawn after two minutes with an empty "Spawn failed: "
    server_env = {INSTANCE_VAR: os.environ.get(INSTANCE_VAR, "")}
    if runtime.service_ports.get("trainhub-culler"):
        # where a notebook server reaches the culler's API (warnings, keep) with its own token
        server_env["TRAINHUB_CULLER_URL"] = f"{runtime.public_url.rstrip('/')}/services/trainhub-culler"
    c.Spawner.environment = dict(c.Spawner.get("environment", {}), **server_env)

    # -- scopes, roles, services -------------------------------------------------
    c.JupyterHub.custom_scopes = dict(scopes.CUSTOM_SCOPES, **c.JupyterHub.get("custom_scopes", {}))
    cli_token = read_or_create_secret(dd.cli_token_file)[0]
    services = [{"name": "trainhub-cli", "api_token": cli_token, "display": False}]
    services += managed_services(runtime, dd)
    c.JupyterHub.services = services + list(c.JupyterHub.get("services", []))
    roles = scopes.roles(admins)
    # the CLI acts for whoever can read the data dir, who administers the platform anyway
    # (it must be able to create admins: `trainhub token NAME --admin`)
    roles.append({"name": "admin", "services": ["trainhub-cli"]})
    for svc in services[1:]:
        svc_scopes = service_scopes(svc["name"])
        if svc_scopes:
            roles.append({"name": svc["name"], "scopes": svc_scopes, "services": [svc["name"]]})
    c.JupyterHub.load_roles = roles + list(c.JupyterHub.get("load_roles", []))
    # the services' polling (groups every 30 s, the culler's passes, token checks) at debug level, not INFO
    tornado_settings = dict(c.JupyterHub.get("tornado_settings", {}))
    if "log_function" not in tornado_settings:
        from trainhub.hub_config.accesslog import make_log_function

        tornado_settings["log_function"] = make_log_function(svc["name"] for svc in services)
        c.JupyterHub.tornado_settings = tornado_settings

    reconcile_ledger(c)
    prefill_warm_servers(c)
