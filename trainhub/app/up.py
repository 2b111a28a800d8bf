"""`trainhub up`: run the whole embedded platform in the foreground.

It prepares the data dir (umask 077: everything it and its services create is the
platform's alone), checks that users can be isolated as configured (``trainhub.boundary.isolation``),
records the runtime facts, starts JupyterHub (which starts the proxy and the platform's
services), prints how to log in and what isolates users, and on Ctrl-C or SIGTERM stops
everything it started: it records the stop (``<data-dir>/platform-stop.json``: the jobs
service then requeues or fails the jobs the stop ended, ``JobEngine.on_platform_stop``),
stops the hub (it stops servers, the proxy and the services), then ends every process
below it and every process carrying this run's marker. It is a child subreaper, so a
process it started cannot leave its tree, however it forks or whatever it does to its
environment; a sandboxed one cannot even leave its sandbox's pid namespace.

A run that did not stop (``trainhub up`` itself killed with SIGKILL) leaves its processes
running; the next start on the same data dir ends them first and records that stop.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import requests

from trainhub import gpus as gpu_inventory
from trainhub.backoff import WaitTimeout, poll
from trainhub.fmt import noun, plural
from trainhub.boundary.procs import INSTANCE_VAR, become_subreaper, descendants, processes_with, terminate_tagged
from trainhub.settings import DataDir, Runtime, StopRecord, read_or_create_secret

from .supervise import HubOutput, SupervisedHub

#: the packages whose folders hold trainhub's code (read-only in every sandbox)
CODE_PACKAGES = ("trainhub", "trainhub.hub_config", "trainhub.spawner", "trainhub.services", "trainhub.extensions",
                 "trainhub.kernels")
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL when the platform stops (JobEngine.grace_period's default)


class UpError(RuntimeError):
    """A problem the user can fix; printed without a traceback."""


def free_port(ip: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def port_available(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip or "0.0.0.0", port))
            return True
        except OSError:
            return False


def is_loopback(ip: str) -> bool:
    if ip in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def find_proxy(dd: DataDir, install: bool = True, out=sys.stdout) -> str:
    """configurable-http-proxy: $TRAINHUB_PROXY_CMD, PATH, or a private npm install in the data dir."""
    explicit = os.environ.get("TRAINHUB_PROXY_CMD")
    candidates = [explicit] if explicit else []
    candidates += [
        shutil.which("configurable-http-proxy"),
        str(Path(sys.prefix) / "node" / "node_modules" / ".bin" / "configurable-http-proxy"),
        str(dd.root / "node" / "node_modules" / ".bin" / "configurable-http-proxy"),
    ]
    for c in candidates:
        if c and os.path.exists(c) and os.access(c, os.X_OK):
            return c
    npm = shutil.which("npm")
    if not install or not npm:
        raise UpError(
            "configurable-http-proxy was not found. Install it with\n"
            "    npm install -g configurable-http-proxy\n"
            "(needs Node.js >= 18), or set TRAINHUB_PROXY_CMD to its path."
        )
    print(f"Installing configurable-http-proxy with npm into {dd.root / 'node'} (first start only)...", file=out, flush=True)
    r = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(dd.root / "node"), "configurable-http-proxy@^5"],
                       capture_output=True, text=True)
    target = dd.root / "node" / "node_modules" / ".bin" / "configurable-http-proxy"
    if r.returncode != 0 or not target.exists():
        raise UpError(f"npm could not install configurable-http-proxy:\n{r.stderr[-2000:]}")
    return str(target)


def code_paths() -> list[str]:
    """Folders of trainhub's packages outside the interpreter and the virtualenv (an editable install)."""
    import importlib.util

    prefixes = [os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix}]
    paths = []
    for name in CODE_PACKAGES:
        spec = importlib.util.find_spec(name)
        for loc in (spec.submodule_search_locations or []) if spec else []:
            real = os.path.realpath(loc)
            if not any(real.startswith(p) for p in prefixes) and real not in paths:
                paths.append(real)
    return paths


def end_leftovers(dd: DataDir, out=sys.stderr) -> None:
    """A previous run on this data dir that never stopped (SIGKILL): refuse if it still runs, else end what it
    left and record that stop, so its jobs are requeued (or failed) as after any platform stop."""
    try:
        old = Runtime.load(dd.root)
    except (FileNotFoundError, ValueError, TypeError):
        return
    if old.pid and old.pid != os.getpid() and _is_trainhub_up(old.pid):
        raise UpError(f"trainhub up (pid {old.pid}) is already running on {dd.root}; stop it first")
    if not old.instance:
        return
    record = StopRecord.load(dd)
    if processes_with(INSTANCE_VAR, old.instance):
        began = time.time()
        ended = terminate_tagged(INSTANCE_VAR, old.instance, grace=STOP_GRACE)
        print(f"trainhub: ended {plural(ended, 'process')} left by the previous run, which did not stop", file=out, flush=True)
        StopRecord(old.instance, began, "did not stop cleanly").save(dd)
    elif record is None or record.instance != old.instance:
        StopRecord(old.instance, time.time(), "did not stop cleanly").save(dd)


def _is_trainhub_up(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(b"trainhub" in a for a in cmd) and b"up" in cmd


def prepare(args, out=sys.stdout) -> tuple[DataDir, Runtime, str | None]:
    """Everything before the hub starts; returns (data dir, runtime, new admin password or None)."""
    dd = DataDir(Path(args.data_dir))
    dd.ensure()
    end_leftovers(dd)
    try:
        spec = gpu_inventory.parse_gpus_flag(args.gpus)
    except ValueError as e:
        raise UpError(str(e)) from None
    devices = gpu_inventory.discover(spec)

    storage = args.storage or str(dd.default_storage)
    if "://" not in storage or storage.startswith("file://"):
        storage = str(Path(storage.removeprefix("file://")).expanduser().resolve())
    elif not storage.startswith("s3://"):
        raise UpError(f"--storage must be a local folder or s3://bucket/prefix, not {storage!r}")

    if not port_available(args.ip, args.port):
        raise UpError(f"port {args.port} on {args.ip} is in use: pick another with --port")

    password, created = read_or_create_secret(dd.admin_password_file, 12)
    new_password = password if created else None

    service_ports = {"trainhub": free_port(), "trainhub-culler": free_port()}
    runtime = Runtime(
        data_dir=str(dd.root), ip=args.ip, port=args.port, hub_port=args.hub_port or free_port(),
        proxy_api_port=free_port(), service_ports=service_ports, gpus=spec, storage=storage,
        admin_user=args.admin_user, pid=os.getpid(), devices=[d.to_dict() for d in devices],
        simulated=any(d.simulated for d in devices), started_at=datetime.now(timezone.utc).isoformat(),
        instance=uuid.uuid4().hex, code_paths=code_paths(),
    )
    _enable_available_services(runtime)
    runtime.save()

    from trainhub.config import load_platform_config
    from trainhub.boundary.isolation import Isolation
    from trainhub.storage import StorageConfig

    config = load_platform_config(dd.root)
    # before anything opens them: a damaged database is the admin's to restore (the message says how), not a hub
    # that exits with a driver's traceback in its log
    from trainhub.db import DatabaseDamaged, check_database, sqlite_file

    try:
        for url in (config.LocalGPUAllocator.get("db_url") or dd.platform_db_url, dd.hub_db_url):
            if sqlite_file(url):
                check_database(sqlite_file(url))
    except DatabaseDamaged as e:
        raise UpError(str(e)) from None
    isolation = Isolation(config=config)
    problems = isolation.problems()
    if problems:
        raise UpError("users cannot be isolated as configured:\n  " + "\n  ".join(problems))
    if isolation.mode == "accounts":  # no sandbox: accounts reach their homes through the data dir
        dd.ensure(traversable=True)
    # storage must be reachable before anyone spawns, and users must be able to get credentials of their own
    try:
        StorageConfig(config=config).ensure_layout()
    except Exception as e:
        raise UpError(f"storage {storage} is not usable: {e}") from None
    from trainhub.boundary.credentials import credentials_problem

    problem = credentials_problem(StorageConfig(config=config), parent=isolation)
    if problem:
        raise UpError(problem)
    return dd, runtime, new_password


def start_gate(dd: DataDir, runtime: Runtime):
    """The network gate (trainhub.boundary.network), when users get namespaces of their own: a thread of this process,
    which lives as long as the platform. Returns it, or None (the machine's network for everyone)."""
    from urllib.parse import urlparse

    from trainhub.boundary.isolation import Isolation
    from trainhub.boundary.network import Gate, GateError, UserNetwork, platform_prefix
    from trainhub.config import load_platform_config
    from trainhub.storage import StorageConfig

    config = load_platform_config(dd.root)
    net = UserNetwork(config=config)
    isolation = Isolation(config=config)
    problems = net.problems(isolation.use_accounts)
    if problems:
        raise UpError("users' networks cannot be separated as configured:\n  " + "\n  ".join(problems))
    if not net.wanted(isolation.use_accounts):
        return None
    ports = [runtime.hub_port, runtime.port, *runtime.service_ports.values()]
    endpoint = urlparse(StorageConfig(config=config).endpoint_url or "")
    if endpoint.hostname and is_loopback(endpoint.hostname) and endpoint.port:
        ports.append(endpoint.port)  # an S3 endpoint on this machine (MinIO, moto) is the platform's too
    net.forward_ports = ports + [p for p in net.forward_ports if p not in ports]
    run_dir = dd.root / "run"
    run_dir.mkdir(mode=0o700, exist_ok=True)
    gate = Gate(net, str(run_dir / "gate.sock"), platform_prefix(str(dd.root)))
    try:
        gate.start_thread()
    except GateError as e:
        raise UpError(f"{e}; set c.UserNetwork.enabled = 'off' to run without per-user networks") from None
    return gate


def _enable_available_services(runtime: Runtime) -> None:
    """Only start services whose code is installed (each arrives with its own issue).

    ``$TRAINHUB_SERVICES`` (comma-separated names, or ``none``) narrows the set, e.g.
    ``TRAINHUB_SERVICES=trainhub`` runs the jobs API without the idle-GPU culler.
    """
    import importlib.util

    modules = {"trainhub": "trainhub.services.jobs", "trainhub-culler": "trainhub.services.culler"}
    wanted = os.environ.get("TRAINHUB_SERVICES")
    if wanted is not None:
        names = {n.strip() for n in wanted.split(",") if n.strip() and n.strip() != "none"}
        unknown = names - set(modules)
        if unknown:
            raise UpError(f"TRAINHUB_SERVICES names unknown {noun(len(unknown), 'service')} {sorted(unknown)}; known: {sorted(modules)}")
        for name in set(modules) - names:
            runtime.service_ports.pop(name, None)
    for name, module in modules.items():
        if name not in runtime.service_ports:
            continue
        try:
            found = importlib.util.find_spec(module + ".__main__") is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            runtime.service_ports.pop(name, None)


def _install_notebook_extensions() -> None:
    """The side panel and the storage server extension, into this environment (idempotent)."""
    from trainhub.extensions import install_labextension

    old = os.umask(0o022)  # installed into the environment every user's server reads (not the data dir)
    try:
        install_labextension()
    except OSError as e:
        print(f"WARNING: could not install the trainhub JupyterLab panel into {sys.prefix}: {e}\n"
              "         notebooks work, but without the side panel and storage browser", file=sys.stderr, flush=True)
    finally:
        os.umask(old)


def wait_http(url: str, proc: subprocess.Popen, what: str, timeout: float, exited_hint: str = "",
              headers: dict | None = None, ready=lambda r: r.status_code == 200) -> None:
    """Wait until ``url`` answers as ``ready`` says (200); UpError if ``proc`` exits first or time runs out."""

    def answers() -> bool:
        if proc.poll() is not None:
            raise UpError(f"{what} exited with code {proc.returncode} while starting{exited_hint}")
        try:
            return ready(requests.get(url, timeout=2, headers=headers))
        except requests.RequestException:
            return False

    try:
        poll(answers, what=f"{what} at {url}", start=0.2, factor=1.0, timeout=timeout)
    except WaitTimeout:
        raise UpError(f"{what} did not answer at {url} within {timeout:.0f} s") from None


#: seconds between two looks at the proxy's routes while waiting for a hub that does not log at INFO (it will not say
#: it runs): each look is a line in the proxy's log
ROUTES_POLL = 5.0


def wait_for_hub(runtime: Runtime, proc: subprocess.Popen, output: HubOutput | None = None, timeout: float = 90) -> None:
    """The hub answers on its own port, the proxy routes to it, then the public URL answers.

    Asking the public URL before the hub's route exists makes the proxy log a red 404 per attempt, and asking the
    proxy's API for its routes logs a line per request (it was five a second): a hub that logs at INFO says when
    it runs (``output``, from the output pump), and only a hub that does not is looked at through the proxy's
    routes, every ``ROUTES_POLL`` seconds.
    """
    hint = f"; see {Path(runtime.data_dir) / 'logs' / 'jupyterhub.log'}"
    wait_http(f"http://127.0.0.1:{runtime.hub_port}/hub/api/", proc, "JupyterHub", timeout, exited_hint=hint)
    token = read_or_create_secret(DataDir(runtime.data_dir).proxy_token_file)[0]
    routes = f"http://127.0.0.1:{runtime.proxy_api_port}/api/routes"
    output = output or HubOutput()
    deadline = time.monotonic() + timeout
    while not output.running.wait(min(ROUTES_POLL, max(0.0, deadline - time.monotonic()))):
        if proc.poll() is not None:
            raise UpError(f"JupyterHub exited with code {proc.returncode} while starting{hint}")
        if time.monotonic() >= deadline:
            raise UpError(f"the proxy's route to JupyterHub did not appear at {routes} within {timeout:.0f} s{hint}")
        if output.logs_info.is_set():
            continue  # it will say so
        try:
            r = requests.get(routes, timeout=2, headers={"Authorization": f"token {token}"})
            if r.status_code == 200 and "/" in r.json():
                break
        except (requests.RequestException, ValueError):
            pass
    wait_http(runtime.public_url.rstrip("/") + "/hub/api/", proc, "JupyterHub", timeout, exited_hint=hint)
    platform_priority(DataDir(runtime.data_dir), proc.pid)


def platform_priority(dd: DataDir, hub_pid: int) -> None:
    """The hub and the proxy it started (its pid file) get the jobs service's CPU priority, ``JobsService.session_nice``
    (trainhub.cpupriority): every API call passes through the proxy, and every spawn through the hub, whose own work
    (accounts, network, mounts, the claim of a warm server) otherwise waited behind the servers it was starting
    (measured on 2 cores: the fourth of four users asking at once waited 0.9 s before the hub claimed a warm server
    for him). Called after each start of the hub (a new hub may start a new proxy). Said on stderr when it cannot be
    set as root; not tried below 0 without root."""
    from trainhub.config import load_platform_config
    from trainhub.cpupriority import PLATFORM_NICE, set_session_nice

    nice = load_platform_config(dd.root).JobsService.get("session_nice", PLATFORM_NICE)
    if not nice or (nice < 0 and os.geteuid() != 0):
        return
    pids = {"hub": hub_pid}
    try:
        pids["proxy"] = int((dd.root / "proxy.pid").read_text().strip())
    except (OSError, ValueError):
        pass  # an external proxy, or none started here
    for what, pid in pids.items():
        why = set_session_nice(nice, pid)
        if why:
            print(f"trainhub: the {what}'s CPU priority is unchanged: {why}", file=sys.stderr, flush=True)


def cli_command(data_dir, args: str, *, env=None, which=shutil.which, script: str | None = None) -> str:
    """``trainhub ARGS`` as it must be typed in a shell to reach this platform, for the banner: ``trainhub`` when that
    name on PATH is this environment's script, else the script's absolute path (``make up`` runs
    ``.venv/bin/trainhub``, which is not on PATH); with ``--data-dir DIR`` after the command unless the CLI's default
    (``$TRAINHUB_DATA_DIR``, else ``./.trainhub`` from here) is this platform's data dir. ``script``: this
    environment's ``trainhub`` (default: beside its Python)."""
    import shlex

    env = os.environ if env is None else env
    script = script or os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "trainhub")
    found = which("trainhub", path=env.get("PATH"))
    try:
        same = bool(found) and os.path.samefile(found, script)
    except OSError:
        same = False
    command = f"{'trainhub' if same else shlex.quote(script)} {args}"
    default = Path(env.get("TRAINHUB_DATA_DIR") or ".trainhub").expanduser().resolve()
    if default != Path(data_dir).expanduser().resolve():
        command += f" --data-dir {shlex.quote(str(Path(data_dir).expanduser().resolve()))}"
    return command


def banner(runtime: Runtime, new_password: str | None, dd: DataDir, gate=None) -> str:
    from trainhub.config import load_platform_config
    from trainhub.gpus import GPUDevice
    from trainhub.boundary.isolation import Isolation

    lines = ["", f"trainhub is running at {runtime.public_url}"]
    n = len(runtime.devices)
    kind = "simulated " if runtime.simulated else ""
    lines.append(f"  GPU pool: {plural(n, kind + 'device')}" + (" (no NVIDIA driver found; --gpus N simulates N devices)" if n == 0 else ""))
    lines.append(f"  Storage:  {runtime.storage}")
    isolation = Isolation(config=load_platform_config(dd.root))
    lines += isolation.describe([GPUDevice(**d) for d in runtime.devices], run_as=_whoami())
    if gate is not None:
        out = (f"an HTTP(S) proxy to the internet (not to this machine or private networks) at "
               f"127.0.0.1:{gate.config.egress_port}" if gate.config.egress else "no way to the internet")
        lines.append(f"  Network: each user's processes in their own network namespace; the platform's ports "
                     f"{', '.join(map(str, sorted(set(gate.config.forward_ports))))} reach them through the gate, and {out}")
    elif os.geteuid() == 0:
        lines.append("  Network: shared: every user's process can connect to every other's listening ports "
                     "(c.UserNetwork.enabled = 'off', or iproute2 missing: apt-get install iproute2)")
    if new_password:
        lines.append(f"  Log in as '{runtime.admin_user}' with password: {new_password}")
        lines.append(f"  (shown once; it is also saved, readable only by you, in {dd.admin_password_file})")
    else:
        lines.append(f"  Log in as '{runtime.admin_user}'; the password is in {dd.admin_password_file}")
    lines.append(f"  Add users: {cli_command(dd.root, 'users add NAME')}   |   API token: {cli_command(dd.root, 'token NAME')}"
                 f"   |   GPU pool: {cli_command(dd.root, 'status')}")
    lines.append("  Press Ctrl-C to stop everything.")
    return "\n".join(lines) + "\n"


def _whoami() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def run(args, out=sys.stdout) -> int:
    os.umask(0o077)  # the data dir, databases, logs and job folders are the platform's alone
    if not is_loopback(args.ip) and not (args.ssl_cert and args.ssl_key) and not args.insecure:
        print(
            f"WARNING: trainhub will listen on {args.ip} over plain HTTP: passwords and tokens cross the network unencrypted.\n"
            "         Use --ssl-cert/--ssl-key, put it behind a TLS proxy, or pass --insecure to acknowledge this.",
            file=sys.stderr, flush=True,
        )
    if args.config:  # every check below reads the admin's configuration too, not only the hub
        os.environ["TRAINHUB_CONFIG"] = str(Path(args.config).resolve())
    dd, runtime, new_password = prepare(args, out)
    proxy = find_proxy(dd, out=out)
    _install_notebook_extensions()
    instance = runtime.instance
    env = dict(os.environ)
    env.update({
        "TRAINHUB_DATA_DIR": str(dd.root),
        INSTANCE_VAR: instance,
        "TRAINHUB_PROXY_CMD": proxy,
        "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", os.defpath),
        "PYTHONUNBUFFERED": "1",
    })
    if args.config:
        env["TRAINHUB_CONFIG"] = str(Path(args.config).resolve())
    gate = start_gate(dd, runtime)
    if gate is not None:
        from trainhub.boundary.network import GATE_SOCKET_VAR

        env[GATE_SOCKET_VAR] = gate.socket_path
    from trainhub.hub_config import CONFIG_FILE

    cmd = [sys.executable, "-m", "jupyterhub", "-f", CONFIG_FILE]
    if args.ssl_cert and args.ssl_key:
        cmd += [f"--JupyterHub.ssl_cert={args.ssl_cert}", f"--JupyterHub.ssl_key={args.ssl_key}"]
    if args.debug:
        cmd.append("--debug")
    become_subreaper()
    log_path = dd.logs / "jupyterhub.log"
    log_file = open(log_path, "ab")
    sinks = [log_file] + ([] if args.quiet else [sys.stdout.buffer])
    hub = SupervisedHub(cmd, env, str(dd.root), sinks)
    stopping = threading.Event()

    def on_signal(signum, _frame):
        if stopping.is_set():
            print(f"\ntrainhub: already stopping ({signal.Signals(signum).name} ignored): servers, kernels and jobs are "
                  "being ended", file=sys.stderr, flush=True)
            return
        stopping.set()
        print(f"\ntrainhub: {signal.Signals(signum).name} received, stopping...", file=sys.stderr, flush=True)
        hub.signal(signal.SIGTERM)

    # the hub runs in a session of its own (SupervisedHub.start): these signals reach it only from here, once (a
    # closed terminal's SIGHUP too: the hub no longer gets it from the terminal)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    hub.start()
    if stopping.is_set():  # a signal before the hub started
        hub.signal(signal.SIGTERM)
    code = 1
    try:
        try:
            wait_for_hub(runtime, hub.proc, hub.output)
        except UpError:
            stopping.set()
            raise
        print(banner(runtime, new_password, dd, gate), file=out, flush=True)
        # until the hub exits for a stop (Ctrl-C or SIGTERM above ask it to); a hub that dies otherwise is started
        # again, with the servers and jobs it left running (docs/isolation.md, "What survives what")
        code = hub.supervise(stopping, lambda proc, output: wait_for_hub(runtime, proc, output), instance)
    finally:
        # first the record (the jobs service must not take the stop's SIGTERMs for its jobs' own failures)
        StopRecord(instance, time.time(), "stopped").save(dd)
        hub.stop()
        # whatever the hub left behind (kernels, jobs, a proxy after a hub crash): everything below this process,
        # and anything with this run's marker that is not (re-parented above it some other way)
        leftovers = terminate_tagged(INSTANCE_VAR, instance, grace=STOP_GRACE, also=descendants([os.getpid()]))
        if gate is not None:  # the namespaces last: nothing runs in them any more
            gate.stop()
        hub.join_output()
        log_file.close()
        print("trainhub: stopped" + (f" ({leftovers} leftover process(es) ended)" if leftovers else ""), file=sys.stderr, flush=True)
    return 0 if stopping.is_set() else code
