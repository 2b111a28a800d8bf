"""Shared fixtures for every test of the project.

End-to-end fixtures run the real platform: ``trainhub up`` as a subprocess (JupyterHub,
configurable-http-proxy, single-user servers and kernels as real processes) on free
loopback ports, with 4 simulated GPUs.

Fixtures
--------
- ``platform`` (session): one shared running platform, a :class:`Platform`. Its admin
  config (``PLATFORM_CONFIG`` below) sets ``QuotaPolicy.user_gpu_limit = 2``
  (``bigboss`` may hold 4), a CPU worker quota of 2 for ``adm-cpu`` (the others get the
  default), ``Spawner.poll_interval = 2`` and adds a profile ``gpu-4``
  (4 GPUs) restricted to the group ``research``. Tests leave it as they found it: they
  stop the servers they start (use distinct user names per test). Attributes and
  helpers:

  - ``url``: public base URL, no trailing slash (``http://127.0.0.1:PORT``);
    the jobs API of other features is at ``platform.url + "/services/trainhub/api"``.
  - ``data_dir`` (Path), ``port``, ``config_file`` (Path), ``admin_user``,
    ``admin_password``, ``instance`` (the ``TRAINHUB_INSTANCE`` marker), ``outputs``
    (stdout+stderr text of each start, in order).
  - ``token(user, admin=False, groups=())``: an API token via ``trainhub token`` (cached).
  - ``cli(*args, check=True)``: run ``trainhub ARGS --data-dir DATA_DIR``; returns
    ``subprocess.CompletedProcess``.
  - ``api(method, path, token=None, **kw)``: ``requests`` against ``/hub/api`` + path
    (token default: the admin's); never raises on HTTP status.
  - ``spawn(user, profile, token=None, timeout=120)``: start the user's default server,
    wait until ready, return the user model; raises :class:`SpawnFailed` (with
    ``.response``) when the POST is refused.
  - ``stop_server(user, token=None, timeout=60)``: stop it and wait until gone.
  - ``stop_all_servers()``: stop every running server (cleanup helper).
  - ``ledger()``: ``trainhub status --json`` parsed; ``held_by(user)``: devices of a user.
  - ``login(user, password)``: a ``requests.Session`` logged in through the login form.
  - ``kernel_exec(user, code, token=None, kernel_id=None)``: start a kernel in the user's server
    (or use kernel ``kernel_id``), run ``code`` over the kernel websocket, return its stdout (a
    kernel it started is deleted afterwards).
  - ``restart()``: stop (SIGTERM) and start again on the same data dir and ports.
  - ``stop(sig=SIGTERM)``: stop and assert no process with its instance marker is left.
  - ``log()``: the hub log text (``<data_dir>/logs/jupyterhub.log``).
- ``platform_factory`` (session): ``platform_factory(name, gpus=4, storage="",
  config=PLATFORM_CONFIG, env=None, start=True)`` -> a private :class:`Platform` for tests
  that restart, interrupt or reconfigure one (stopped at session end if still running).
- ``shell``: a real in-process ``IPython.core.interactiveshell.InteractiveShell`` (in-memory
  history, ``IPYTHONDIR`` in a temporary folder, namespace and history reset around each test) with
  the ``trainhub.kernels`` extension loaded (used by the %%train and %%sweep magic tests).
- ``s3_server`` (session): a real ``moto_server`` on a free loopback port; an object with
  ``endpoint``, ``key``, ``secret``, ``env`` (AWS_* variables) and ``make_bucket(name)``.
- ``jobs_api``: an in-process stand-in for the jobs service speaking docs/jobs-api.md
  (tests/jobs_contract_server.py's ``ServerThread``, one per session, reset per test): ``.url``,
  ``.token``, ``.service`` (``posts``, ``jobs``, ``fail_gets``). Jobs run as real local subprocesses.

Layout (docs: tests/README.md): one folder per feature; tiers are markers, set by
``pytest_collection_modifyitems`` below: ``e2e`` (uses ``platform``/``platform_factory``, a real
``trainhub up``), ``browser`` (drives chromium through tests/browserlab.py), ``kube`` (tests/kubernetes/),
``unit`` (none of the others). Shared helper modules live at the top of tests/, which is on ``sys.path``.

On failure, each platform's data-dir logs and start outputs are copied to
``test-artifacts/<platform name>/``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# shared helper modules (browserlab, jobs_contract_server, storageserver, waiting, ...) import by name from any folder
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from waiting import wait_for  # noqa: E402
ARTIFACTS = REPO / "test-artifacts"

PLATFORM_CONFIG = """
# admin config used by the end-to-end tests
from trainhub.profiles import DEFAULT_PROFILES

c.QuotaPolicy.user_gpu_limit = 2
c.QuotaPolicy.user_gpu_limits = {"bigboss": 4}
c.QuotaPolicy.user_cpu_worker_limits = {"adm-cpu": 2}
c.Spawner.poll_interval = 2
c.ProfileCatalog.profiles = DEFAULT_PROFILES + [
    {"slug": "gpu-4", "display_name": "4 GPUs", "description": "Whole-node runs.", "gpus": 4,
     "allowed_groups": ["research"]},
]
"""


def free_port(ip: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def processes_with(var: str, value: str) -> list[int]:
    from trainhub.boundary.procs import processes_with as find

    pids = []
    for pid in find(var, value):
        try:  # zombies are gone for our purposes
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    continue
        except OSError:
            continue
        pids.append(pid)
    return pids


def describe_pids(pids) -> str:
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "?"
        out.append(f"{pid}: {cmd[:200]}")
    return "; ".join(out)


class SpawnFailed(AssertionError):
    def __init__(self, message, response=None):
        super().__init__(message)
        self.response = response


class Platform:
    """A `trainhub up` subprocess and helpers to drive it (see the module docstring)."""

    def __init__(self, name: str, data_dir: Path, *, gpus: int = 4, storage: str = "",
                 config: str | None = PLATFORM_CONFIG, env: dict | None = None, extra_args=()):
        self.name = name
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.gpus = gpus
        self.storage = storage
        self.env = dict(os.environ, **(env or {}))
        self.env.pop("TRAINHUB_DATA_DIR", None)
        self.env.pop("TRAINHUB_CONFIG", None)
        self.env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + self.env.get("PATH", os.defpath)
        self.extra_args = list(extra_args)
        self.config_file = None
        if config is not None:
            self.config_file = self.data_dir.parent / f"{self.data_dir.name}-config.py"
            self.config_file.write_text(config)
        self.admin_user = "admin"
        self.proc: subprocess.Popen | None = None
        self.instance: str | None = None
        self.outputs: list[str] = []
        self._out_path: Path | None = None
        self._tokens: dict = {}
        self.failed = False

    # -- process ---------------------------------------------------------------
    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "trainhub.cli", "up", "--data-dir", str(self.data_dir),
               "--gpus", str(self.gpus), "--port", str(self.port), "--quiet"]
        if self.storage:
            cmd += ["--storage", self.storage]
        if self.config_file:
            cmd += ["--config", str(self.config_file)]
        return cmd + self.extra_args

    def start(self, timeout: float = 120) -> "Platform":
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self._out_path = self.data_dir.parent / f"{self.data_dir.name}-up-{len(self.outputs) + 1}.out"
        out = open(self._out_path, "wb")
        self.outputs.append("")
        self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=str(REPO), start_new_session=True)
        out.close()
        def up() -> bool:
            self._refresh_output()
            if self.proc.poll() is not None:
                raise RuntimeError(f"trainhub up exited with {self.proc.returncode}:\n{self.outputs[-1][-3000:]}\n"
                                   f"--- hub log ---\n{self.log()[-4000:]}")
            if "trainhub is running at" in self.outputs[-1]:
                try:
                    return requests.get(self.url + "/hub/api/", timeout=2).status_code == 200
                except requests.RequestException:
                    pass
            return False

        try:
            wait_for(up, what=f"trainhub up ({self.name}) to answer", timeout=timeout,
                     describe=lambda _: f"output:\n{self.outputs[-1][-3000:]}")
        except AssertionError as e:
            self.failed = True
            raise RuntimeError(str(e)) from None
        self.instance = self._find_instance()
        self._tokens.clear()
        return self

    def _refresh_output(self) -> str:
        if self._out_path and self._out_path.exists():
            self.outputs[-1] = self._out_path.read_text(errors="replace")
        return self.outputs[-1] if self.outputs else ""

    @property
    def output(self) -> str:
        """Output of the latest start."""
        return self._refresh_output()

    def _find_instance(self) -> str | None:
        pid_file = self.data_dir / "jupyterhub.pid"

        def instance() -> str | None:
            try:
                pid = int(pid_file.read_text().strip())
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except (OSError, ValueError):
                return None
            return next((item.split(b"=", 1)[1].decode() for item in env if item.startswith(b"TRAINHUB_INSTANCE=")), None)

        try:
            return wait_for(instance, what=f"the instance marker of {self.name}'s hub", timeout=10, interval=0.1)
        except AssertionError:
            return None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 90, check_orphans: bool = True) -> int | None:
        """Signal `trainhub up`, wait for it, and check nothing of this instance is left."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                self.failed = True
                raise AssertionError(f"trainhub up did not stop within {timeout} s of {signal.Signals(sig).name}")
        self._refresh_output()
        code = self.proc.returncode
        if check_orphans and self.instance:
            try:
                left = wait_for(lambda: processes_with("TRAINHUB_INSTANCE", self.instance), lambda left: not left,
                                what=f"every process of {self.name} to exit", timeout=10, interval=0.1)
            except AssertionError:
                left = processes_with("TRAINHUB_INSTANCE", self.instance)
            if left:
                self.failed = True
                for pid in left:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                raise AssertionError(f"processes of {self.name} left after stop: {describe_pids(left)}")
        return code

    def restart(self) -> "Platform":
        self.stop()
        return self.start()

    def log(self) -> str:
        path = self.data_dir / "logs" / "jupyterhub.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def save_artifacts(self) -> Path:
        dest = ARTIFACTS / self.name
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True, exist_ok=True)
        if (self.data_dir / "logs").exists():
            shutil.copytree(self.data_dir / "logs", dest / "logs", dirs_exist_ok=True)
        for i, text in enumerate(self.outputs, 1):
            (dest / f"up-{i}.out").write_text(text)
        if self.config_file and self.config_file.exists():
            shutil.copy(self.config_file, dest / "config.py")
        for name in ("trainhub.json",):
            if (self.data_dir / name).exists():
                shutil.copy(self.data_dir / name, dest / name)
        return dest

    # -- CLI --------------------------------------------------------------------
    def cli(self, *args, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        args = list(args)
        # --data-dir belongs to the (sub-)sub-command: append it last
        r = subprocess.run([sys.executable, "-m", "trainhub.cli", *args, "--data-dir", str(self.data_dir)],
                           capture_output=True, text=True, env=self.env, timeout=timeout, cwd=str(REPO))
        if check and r.returncode != 0:
            raise AssertionError(f"trainhub {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r

    @property
    def admin_password(self) -> str:
        return (self.data_dir / "secrets" / "admin-password").read_text().strip()

    def token(self, user: str, admin: bool = False, groups=()) -> str:
        key = (user, admin, tuple(sorted(groups)))
        if key not in self._tokens:
            args = ["token", user]
            if admin:
                args.append("--admin")
            for g in groups:
                args += ["--group", g]
            self._tokens[key] = self.cli(*args).stdout.strip().splitlines()[-1]
        return self._tokens[key]

    @property
    def admin_token(self) -> str:
        return self.token(self.admin_user, admin=True)

    def ledger(self) -> dict:
        return json.loads(self.cli("status", "--json").stdout)

    def held_by(self, user: str) -> list[int]:
        return [d["device"] for d in self.ledger()["devices"] if d["user"] == user]

    # -- hub API ---------------------------------------------------------------
    def api(self, method: str, path: str, token: str | None = None, **kw) -> requests.Response:
        headers = dict(kw.pop("headers", {}) or {})
        headers["Authorization"] = f"token {token or self.admin_token}"
        kw.setdefault("timeout", 60)
        return requests.request(method, f"{self.url}/hub/api{path}", headers=headers, **kw)

    def server_model(self, user: str, token: str | None = None) -> dict | None:
        r = self.api("GET", f"/users/{user}", token)
        r.raise_for_status()
        return (r.json().get("servers") or {}).get("")

    def spawn(self, user: str, profile: str | None = "gpu-1", token: str | None = None, timeout: float = 120) -> dict:
        body = {} if profile is None else {"profile": profile}
        r = self.api("POST", f"/users/{user}/server", token or self.token(user), json=body)
        if r.status_code not in (201, 202):
            raise SpawnFailed(f"spawn of {user} ({profile}) refused: {r.status_code} {r.text[:500]}", r)
        # a server gone again (None) once the hub has shown it pending means its start failed
        seen = []

        def ready(model) -> bool:
            seen.append(model)
            if model is None and any(m is not None for m in seen):
                raise SpawnFailed(f"server of {user} vanished while starting; hub log tail:\n{self.log()[-3000:]}")
            return bool(model and model.get("ready"))

        try:
            return wait_for(lambda: self.server_model(user), ready, what=f"the server of {user} to be ready",
                            timeout=timeout, interval=0.25)
        except SpawnFailed:
            raise
        except AssertionError as e:
            raise SpawnFailed(str(e)) from None

    def stop_server(self, user: str, token: str | None = None, timeout: float = 60) -> None:
        r = self.api("DELETE", f"/users/{user}/server", token)
        if r.status_code == 400 and "not running" in r.text:
            return
        assert r.status_code in (202, 204), f"stop of {user}: {r.status_code} {r.text[:300]}"
        wait_for(lambda: self.server_model(user), lambda model: model is None, what=f"the server of {user} to stop",
                 timeout=timeout, interval=0.25)

    def stop_all_servers(self) -> None:
        r = self.api("GET", "/users")
        if r.status_code != 200:
            return
        for u in r.json():
            if u.get("servers", {}).get("") or u.get("server") or u.get("pending"):
                try:
                    self.stop_server(u["name"])
                except AssertionError:
                    pass

    def login(self, user: str, password: str) -> requests.Session:
        """A session logged in through the hub's login form (raises if the login fails)."""
        s = requests.Session()
        r = s.get(f"{self.url}/hub/login", timeout=30)
        r.raise_for_status()
        xsrf = s.cookies.get("_xsrf")
        r = s.post(f"{self.url}/hub/login", data={"username": user, "password": password, "_xsrf": xsrf},
                   allow_redirects=False, timeout=30)
        if r.status_code != 302 or "/hub/login" in r.headers.get("Location", ""):
            raise AssertionError(f"login of {user} failed: {r.status_code} {r.text[:500]}")
        s.headers["X-XSRFToken"] = s.cookies.get("_xsrf") or xsrf or ""
        return s

    # -- kernels ----------------------------------------------------------------
    def kernel_exec(self, user: str, code: str, token: str | None = None, timeout: float = 60,
                    keep_kernel: bool = False, kernel_id: str | None = None, path: str | None = None,
                    store_history: bool = False) -> str:
        """Run ``code`` in a fresh kernel of the user's server (or in kernel ``kernel_id``, kept); returns its stdout.
        ``path``: the notebook the kernel is for (its folder is the kernel's working directory), as JupyterLab asks.
        ``store_history``: as a notebook's cells run (%%train finds earlier cells' sources in the history)."""
        import websocket  # websocket-client, a jupyter-server dependency

        token = token or self.token(user)
        base = f"{self.url}/user/{user}/api/kernels"
        headers = {"Authorization": f"token {token}"}
        if kernel_id is None:
            r = requests.post(base, headers=headers, json={"name": "python3", **({"path": path} if path else {})},
                              timeout=60)
            assert r.status_code == 201, f"kernel start: {r.status_code} {r.text[:300]}"
            kid = r.json()["id"]
        else:
            kid, keep_kernel = kernel_id, True
        ws = None
        try:
            ws_url = base.replace("http://", "ws://", 1) + f"/{kid}/channels"
            deadline = time.monotonic() + timeout
            while True:
                try:
                    ws = websocket.create_connection(ws_url, header=[f"Authorization: token {token}"], timeout=timeout)
                    break
                except (websocket.WebSocketException, OSError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            msg_id = uuid.uuid4().hex
            ws.send(json.dumps({
                "header": {"msg_id": msg_id, "username": user, "session": uuid.uuid4().hex, "msg_type": "execute_request",
                           "version": "5.3", "date": ""},
                "parent_header": {}, "metadata": {}, "channel": "shell",
                "content": {"code": code, "silent": False, "store_history": store_history, "user_expressions": {},
                            "allow_stdin": False, "stop_on_error": True},
                "buffers": [],
            }))
            out, err = [], []
            while True:
                if time.monotonic() > deadline:
                    raise AssertionError(f"no reply from kernel within {timeout} s; output so far {out!r}")
                msg = json.loads(ws.recv())
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = msg.get("msg_type") or msg["header"]["msg_type"]
                if kind == "stream":
                    out.append(msg["content"]["text"])
                elif kind == "error":
                    err.append("\n".join(msg["content"].get("traceback", [])) or msg["content"].get("evalue", ""))
                elif kind == "status" and msg["content"]["execution_state"] == "idle" and msg.get("channel") == "iopub":
                    break
            if err:
                raise AssertionError(f"kernel raised:\n{''.join(err)}\nstdout: {''.join(out)}")
            return "".join(out)
        finally:
            if ws is not None:
                ws.close()
            if not keep_kernel:
                requests.delete(f"{base}/{kid}", headers=headers, timeout=30)


def _start_or_skip(p: Platform) -> Platform:
    try:
        return p.start()
    except RuntimeError:
        p.failed = True
        p.save_artifacts()
        raise


def pytest_addoption(parser):
    parser.addoption(
        "--kube", choices=("standin", "real"), default=None,
        help="where tests/kubernetes talk: the API stand-in (default) or the real v1.20 control plane "
             "built by tests/kubernetes/controlplane/build.sh (same as TRAINHUB_TEST_KUBE=real)")
    parser.addoption(
        "--kube-node", action="store_true", default=False,
        help="run tests/kubernetes/node: the Helm chart on a real one-node cluster (kubelet, containerd, runc; root; "
             "`make test-kube-node`, same as TRAINHUB_TEST_KUBE_NODE=1)")


def pytest_configure(config):
    if config.getoption("--kube"):
        os.environ["TRAINHUB_TEST_KUBE"] = config.getoption("--kube")


# tiers (markers registered in pyproject): set from what a test uses, not by hand
E2E_FIXTURES = {"platform", "platform_factory"}
KUBE_DIR = TESTS / "kubernetes"


def _uses_browser(item) -> bool:
    module = getattr(item, "module", None)
    return module is not None and any(getattr(v, "__module__", None) == "browserlab" for v in vars(module).values())


def pytest_collection_modifyitems(config, items):
    for item in items:
        if E2E_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.e2e)
        if _uses_browser(item) and not item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.browser)
        if Path(str(item.fspath)).is_relative_to(KUBE_DIR) and not item.get_closest_marker("kube"):
            item.add_marker(pytest.mark.kube)
        if not any(item.get_closest_marker(m) for m in ("e2e", "browser", "kube")):
            item.add_marker(pytest.mark.unit)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for name in ("platform", "platform_factory"):
            obj = item.funcargs.get(name) if hasattr(item, "funcargs") else None
            if isinstance(obj, Platform):
                obj.failed = True
            elif obj is not None and hasattr(obj, "created"):
                for p in obj.created:
                    p.failed = True


@pytest.fixture(scope="session")
def platform(tmp_path_factory):
    p = _start_or_skip(Platform("platform", tmp_path_factory.mktemp("platform") / "data"))
    try:
        yield p
    finally:
        try:
            if p.running:
                p.stop()
        except AssertionError:
            p.failed = True
            raise
        finally:
            if p.failed:
                p.save_artifacts()


class PlatformFactory:
    def __init__(self, tmp_path_factory):
        self.tmp = tmp_path_factory
        self.created: list[Platform] = []

    def __call__(self, name: str, *, start: bool = True, **kw) -> Platform:
        p = Platform(name, self.tmp.mktemp(name) / "data", **kw)
        self.created.append(p)
        return _start_or_skip(p) if start else p

    def close(self):
        errors = []
        for p in self.created:
            try:
                if p.running:
                    p.stop()
            except AssertionError as e:
                errors.append(str(e))
            if p.failed:
                p.save_artifacts()
        if errors:
            raise AssertionError("; ".join(errors))


@pytest.fixture(scope="session")
def platform_factory(tmp_path_factory):
    factory = PlatformFactory(tmp_path_factory)
    try:
        yield factory
    finally:
        factory.close()


class S3Server:
    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.key = "testing"
        self.secret = "testing"
        self.env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": self.key,
                    "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_DEFAULT_REGION": "us-east-1"}

    def filesystem(self):
        import s3fs

        # a fresh instance (and HTTP session) each time: one session stuck in s3fs's instance cache once stalled every
        # later bucket of the run
        return s3fs.S3FileSystem(endpoint_url=self.endpoint, key=self.key, secret=self.secret, use_listings_cache=False,
                                 skip_instance_cache=True)

    def make_bucket(self, name: str | None = None) -> str:
        name = name or f"b-{uuid.uuid4().hex[:12]}"
        self.filesystem().mkdir(name)
        return name


@pytest.fixture(scope="session")
def s3_server():
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which("moto_server")
    if not exe:
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    port = free_port()
    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    def answers():
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode}")
        try:
            return requests.get(endpoint + "/moto-api/", timeout=1).status_code
        except requests.RequestException as e:
            return repr(e)

    try:
        wait_for(answers, lambda status: isinstance(status, int), what=f"moto_server at {endpoint}", timeout=60)
    except (AssertionError, RuntimeError):
        proc.kill()
        raise
    try:
        yield S3Server(endpoint)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def _jobs_server():
    from jobs_contract_server import ServerThread

    server = ServerThread()
    yield server
    server.stop()


@pytest.fixture
def jobs_api(_jobs_server):
    _jobs_server.service.reset()
    yield _jobs_server
    _jobs_server.service.reset()


@pytest.fixture(scope="session")
def _ipython_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ipython")
    old = os.environ.get("IPYTHONDIR")
    os.environ["IPYTHONDIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("IPYTHONDIR", None)
    else:
        os.environ["IPYTHONDIR"] = old


@pytest.fixture
def shell(_ipython_dir):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    c = Config()
    c.HistoryManager.hist_file = ":memory:"
    sh = InteractiveShell.instance(config=c)
    sh.reset(new_session=True)
    sh.extension_manager.load_extension("trainhub.kernels")
    yield sh
    sh.reset(new_session=True)
