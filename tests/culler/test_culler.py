"""The idle-GPU culler end to end, inside a real `trainhub up` (hub, proxy, culler service,
single-user servers, kernels), with simulated GPUs whose utilisation the test scripts through
``<data-dir>/gpu-metrics.json`` (``TRAINHUB_GPU_METRICS_FILE``, set by `trainhub up`).

Time is driven by short timeouts (a 12 s idle timeout for the gpu-1 profile, 0 = never for gpu-long, 6 s
warning, a pass every 2 s; the default timeout of an hour never fires), never by
long sleeps, and the three platforms below run side by side (started, spawned and stopped
concurrently; the whole file takes about two minutes). The main one holds five GPU servers at once,
each showing one rule:

=============  ===========  =========================================================
user           profile      what it shows
=============  ===========  =========================================================
cull-idle      gpu-1        idle (0 %, no cell running): warned, then released to cpu
cull-keep      gpu-1        "keep my GPU" restarts the clock; nobody else may press it
cull-busy      gpu-1        GPU at 80 %: never culled
cull-cell      gpu-1        GPU at 0 % but a cell is executing: never culled
cull-long      gpu-long     a profile whose timeout is 0: never culled
=============  ===========  =========================================================

Once released, cull-idle runs on the CPU profile and is never looked at again. Two small
platforms show ``action = "stop"`` (cull-stopped) and dry-run mode (cull-dry). A poller
thread records when each user first sees a warning at ``GET api/warnings``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
import requests
from waiting import wait_for

from trainhub.boundary.procs import processes_with

pytestmark = pytest.mark.e2e

TIMEOUT, WARNING, CHECK = 12, 6, 2
BUSY = 80

FLEET_CONFIG = f"""
# admin config of the culler end-to-end tests: seconds instead of hours
from trainhub.profiles import DEFAULT_PROFILES

c.QuotaPolicy.user_gpu_limit = 2
c.Spawner.poll_interval = 2
c.ProfileCatalog.profiles = DEFAULT_PROFILES + [
    {{"slug": "gpu-long", "display_name": "1 GPU, no idle limit", "description": "Long interactive runs.", "gpus": 1}},
]
c.CullPolicy.default_timeout = 3600  # per-profile timeouts win: gpu-1 is culled after seconds, gpu-long never
c.CullPolicy.start_grace_period = 0  # seconds-scale clocks; the first-minutes grace: test_culler_habits.py
c.CullPolicy.warning_period = {WARNING}
c.CullPolicy.profile_timeouts = {{"gpu-1": {TIMEOUT}, "gpu-long": 0}}
c.GPUCuller.check_interval = {CHECK}
c.GPUCuller.sample_interval = 1
"""

SERVERS = {"cull-idle": "gpu-1", "cull-keep": "gpu-1", "cull-busy": "gpu-1", "cull-cell": "gpu-1",
           "cull-long": "gpu-long"}
#: the side platforms only run the culler (no jobs service: no running jobs are assumed)
SIDE_ENV = {"TRAINHUB_SERVICES": "trainhub-culler"}


def at(row_or_text) -> datetime:
    """When the culler made a decision or stamped a time (its own clock), as an aware datetime."""
    return datetime.fromisoformat(str(row_or_text["at"] if isinstance(row_or_text, dict) else row_or_text))


class Culler:
    """The culler's HTTP API through the proxy, and the scripted GPU utilisation file."""

    def __init__(self, platform):
        self.platform = platform
        self.url = platform.url + "/services/trainhub-culler"
        self.script = Path(platform.data_dir) / "gpu-metrics.json"
        self.util: dict[int, float] = {}
        self.default = 0.0

    def script_gpus(self, devices: dict[int, float] | None = None, default: float | None = None) -> None:
        """Rewrite the scripted utilisation (atomically: the culler re-reads it every second)."""
        self.util.update(devices or {})
        if default is not None:
            self.default = default
        tmp = self.script.with_name(f".{self.script.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps({"devices": {str(d): {"utilization": u} for d, u in self.util.items()},
                                   "default": {"utilization": self.default}}))
        os.replace(tmp, self.script)

    def _h(self, user=None, token=None):
        return {"Authorization": f"token {token or self.platform.token(user)}"}

    def warnings(self, user=None, token=None) -> list[dict]:
        r = requests.get(self.url + "/api/warnings", headers=self._h(user, token), timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["items"]

    def keep(self, caller=None, token=None, body=None) -> requests.Response:
        """POST api/keep as ``caller`` (or with ``token``); body default {"server": ""}."""
        return requests.post(self.url + "/api/keep", json={"server": ""} if body is None else body,
                             headers=self._h(caller, token), timeout=30)

    def decisions(self, user, acted=True, token=None) -> dict:
        params = {"user": user, "limit": 1000}
        if acted:
            params["acted"] = 1
        r = requests.get(self.url + "/api/decisions", params=params, headers=self._h(user, token), timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def latest(self, user) -> dict | None:
        rows = self.decisions(user, acted=False)["latest"]
        return rows[0] if rows else None

    def decision_after(self, user, moment: datetime, what: str, timeout: float) -> dict:
        """The culler's latest decision about ``user`` once it was made after ``moment`` (the culler's own clock):
        proof that a pass has looked at the server since then."""
        return wait_for(lambda: self.latest(user), lambda row: row is not None and at(row) > moment,
                        what=f"a decision about {user} after {what}", timeout=timeout)

    def metrics(self) -> str:
        r = requests.get(self.url + "/metrics", headers=self._h(token=self.platform.admin_token), timeout=30)
        assert r.status_code == 200, r.text
        return r.text

    def metric(self, name: str, **labels) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
        total = 0.0
        for line in self.metrics().splitlines():
            m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
            if not m or m.group(1) != name:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total += float(m.group(3))
        return total

    def service_token(self) -> str:
        """The culler's own hub token, read from its process (same uid as the tests)."""
        for pid in processes_with("TRAINHUB_INSTANCE", self.platform.instance):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"trainhub.services.culler" in cmd:
                for item in env:
                    if item.startswith(b"JUPYTERHUB_API_TOKEN="):
                        return item.split(b"=", 1)[1].decode()
        raise AssertionError("no culler process found")


def start_executing_cell(platform, user: str, code: str = "import time; time.sleep(600)"):
    """Start a kernel and send it a long cell over the websocket without waiting for the reply.

    Returns (websocket, kernel id) once the kernel reports ``busy`` for that cell.
    """
    import websocket  # websocket-client, a jupyter-server dependency

    token = platform.token(user)
    base = f"{platform.url}/user/{user}/api/kernels"
    r = requests.post(base, headers={"Authorization": f"token {token}"}, json={"name": "python3"}, timeout=60)
    assert r.status_code == 201, r.text
    kid = r.json()["id"]
    ws_url = base.replace("http://", "ws://", 1) + f"/{kid}/channels"
    ws = wait_for(lambda: _try_ws(websocket, ws_url, token), timeout=60, what=f"kernel websocket of {user}")
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({
        "header": {"msg_id": msg_id, "username": user, "session": uuid.uuid4().hex, "msg_type": "execute_request",
                   "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True},
        "buffers": [],
    }))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msg = json.loads(ws.recv())
        if (msg.get("parent_header", {}).get("msg_id") == msg_id and msg.get("channel") == "iopub"
                and msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] == "busy"):
            return ws, kid
    raise AssertionError(f"the kernel of {user} never reported busy")


def _try_ws(websocket, url, token):
    try:
        return websocket.create_connection(url, header=[f"Authorization: token {token}"], timeout=60)
    except (websocket.WebSocketException, OSError):
        return None


def server_env(platform, user: str) -> dict[str, str]:
    """The environment of a user's single-user server process (same uid as the tests)."""
    for pid in processes_with("JUPYTERHUB_USER", user):
        try:
            env = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text(errors="replace").split("\0") if "=" in item)
        except OSError:
            continue
        if env.get("TRAINHUB_INSTANCE") == platform.instance and "JUPYTERHUB_API_TOKEN" in env:
            return env
    raise AssertionError(f"no server process of {user} found")


class WarningWatch:
    """Polls ``GET api/warnings`` for some users (as they would) and keeps the first warning each saw."""

    def __init__(self):
        self.watched: list[tuple[Culler, str, str]] = []
        self.first: dict[str, tuple[float, dict]] = {}  # user -> (time.monotonic(), warning)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, culler: Culler, user: str) -> None:
        self.watched.append((culler, user, culler.platform.token(user)))

    def _run(self):
        while not self._stop.wait(0.5):
            for culler, user, token in list(self.watched):
                if user in self.first:
                    continue
                try:
                    items = culler.warnings(token=token)
                except Exception:  # the platform is stopping
                    continue
                if items:
                    self.first[user] = (time.monotonic(), items[0])

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=10)

    def seen(self, user: str, timeout: float) -> tuple[float, dict]:
        return wait_for(lambda: self.first.get(user), timeout=timeout, what=f"a warning for {user}")


class Fleet:
    """The three platforms and what the fixture learned while setting them up."""

    def __init__(self, main, stopper, dry):
        self.main, self.stopper, self.dry = main, stopper, dry
        self.culler = Culler(main)
        self.devices: dict[str, list[int]] = {}
        self.idle_since: dict[str, float] = {}  # user -> time.monotonic() when its GPU went idle
        self.watch = WarningWatch()
        self.cell = None
        self.idle_rows_after_release: int | None = None

    def go_idle(self, *users):
        self.culler.script_gpus({d: 0 for u in users for d in self.devices[u]})
        for u in users:
            self.idle_since[u] = time.monotonic()


def _spawn(platform, user, profile):
    platform.token(user)
    return platform.spawn(user, profile, timeout=180)


@pytest.fixture(scope="module")
def fleet(platform_factory):
    main = platform_factory("culler", gpus=5, config=FLEET_CONFIG, start=False)
    stopper = platform_factory("culler-stop", gpus=1, config=FLEET_CONFIG + '\nc.CullPolicy.action = "stop"\n',
                               env=SIDE_ENV, start=False)
    dry = platform_factory("culler-dry", gpus=1, config=FLEET_CONFIG + "\nc.CullPolicy.dry_run = True\n",
                           env=SIDE_ENV, start=False)
    f = Fleet(main, stopper, dry)
    t0 = time.monotonic()
    side = [Culler(stopper), Culler(dry)]
    for culler in (f.culler, *side):
        culler.script_gpus(default=BUSY)  # every GPU is busy until the fixture makes it idle
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda p: p.start(timeout=180), (main, stopper, dry)))
            print(f"\n[culler e2e] 3 platforms up in {time.monotonic() - t0:.0f} s", flush=True)
            spawns = [(main, u, prof) for u, prof in SERVERS.items()]
            spawns += [(stopper, "cull-stopped", "gpu-1"), (dry, "cull-dry", "gpu-1")]
            list(pool.map(lambda a: _spawn(*a), spawns))
        for row in main.ledger()["devices"]:
            if row["user"]:
                f.devices.setdefault(row["user"], []).append(row["device"])
        assert {u: len(d) for u, d in f.devices.items()} == {u: 1 for u in SERVERS}
        for user in ("cull-idle", "cull-keep", "cull-busy", "cull-cell", "cull-long"):
            f.watch.watch(f.culler, user)
        f.watch.watch(Culler(stopper), "cull-stopped")
        f.watch.watch(Culler(dry), "cull-dry")
        f.watch.start()
        print(f"[culler e2e] 7 servers ready at {time.monotonic() - t0:.0f} s", flush=True)
        f.cell = start_executing_cell(main, "cull-cell")
        f.go_idle("cull-idle", "cull-keep", "cull-cell", "cull-long")
        for culler in side:  # the whole of each side platform's single GPU
            culler.script_gpus(default=0)
        print(f"[culler e2e] cell running, GPUs idle at {time.monotonic() - t0:.0f} s", flush=True)
        yield f
    finally:
        f.watch.stop()
        if f.cell:
            f.cell[0].close()
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            for fut in [pool.submit(p.stop) for p in (main, stopper, dry) if p.running]:
                fut.result()


def test_keep_my_gpu_restarts_the_clock_for_ones_own_server_only(fleet):
    p, culler = fleet.main, fleet.culler
    # nobody keeps another user's server
    for caller, body in (("cull-busy", {"user": "cull-keep", "server": ""}), ("cull-keep", {"user": "cull-busy"})):
        r = culler.keep(caller, body=body)
        assert r.status_code == 403, r.text
        assert r.json() == {"status": 403, "message": "you may only keep your own server"}
    assert culler.keep(token="not-a-token").status_code in (401, 403)

    # what a notebook server has to call the culler for the JupyterLab notification: its own token and URL
    env = server_env(p, "cull-keep")
    server_token = env["JUPYTERHUB_API_TOKEN"]
    assert env["TRAINHUB_CULLER_URL"] == culler.url

    _, w = fleet.watch.seen("cull-keep", TIMEOUT + 15)
    assert w["user"] == "cull-keep" and w["server"] == ""
    assert culler.warnings(token=server_token) == [w]
    r = culler.keep(token=server_token, body={"server": ""})
    assert r.status_code == 200, r.text
    assert r.json()["user"] == "cull-keep" and r.json()["server"] == "" and r.json()["kept_at"]
    assert culler.warnings(token=server_token) == []  # withdrawn at once

    def after_keep():
        latest = culler.latest("cull-keep")
        return latest if latest["measurements"].get("clock_reset_by") == "keep pressed" else None

    latest = wait_for(after_keep, timeout=3 * CHECK + 5, what="a decision counting from the keep")
    assert latest["action"] == "none" and latest["reason"].startswith("not culled: idle"), latest
    # past the timeout since its GPU went idle (a pass after the warning's act_at), the server still has its GPU:
    # the clock restarted at keep, and that pass counted from the keep
    later = culler.decision_after("cull-keep", at(w["act_at"]), "the warning's act_at", timeout=TIMEOUT + 30)
    assert later["action"] in ("none", "warn") and later["measurements"].get("clock_reset_by") == "keep pressed", later
    assert p.held_by("cull-keep") == fleet.devices["cull-keep"]
    assert p.server_model("cull-keep")["user_options"] == {"profile": "gpu-1"}
    actions = [r["action"] for r in culler.decisions("cull-keep")["items"][::-1]]
    assert actions[:2] == ["warn", "keep"] and "release" not in actions and "stop" not in actions, actions
    culler.script_gpus({d: BUSY for d in fleet.devices["cull-keep"]})  # back to work: out of the way


def test_idle_server_is_warned_then_released_to_cpu(fleet):
    p, culler = fleet.main, fleet.culler
    [device] = fleet.devices["cull-idle"]
    warned, w = fleet.watch.seen("cull-idle", TIMEOUT + 15)
    assert w["user"] == "cull-idle" and w["server"] == "" and w["devices"] == [device]
    assert w["action"] == "release" and w["keep_url"] == "/services/trainhub-culler/api/keep"
    assert "will release in" in w["message"] and "your variables will be kept (picklable values; tensors moved to CPU)" in w["message"]
    assert datetime.fromisoformat(w["act_at"]) > datetime.fromisoformat(w["warned_at"])

    def released():
        model = p.server_model("cull-idle")
        return model if model and model.get("ready") and model["user_options"].get("profile") == "cpu" else None

    wait_for(released, timeout=WARNING + 60, what="cull-idle restarted on the cpu profile")
    assert p.held_by("cull-idle") == []
    row = next(r for r in p.ledger()["devices"] if r["device"] == device)
    assert row["holder"] is None  # back in the pool
    assert culler.warnings("cull-idle") == []

    # the audit trail (as the user sees their own decisions) and the log
    rows = culler.decisions("cull-idle")["items"][::-1]
    assert [r["action"] for r in rows] == ["warn", "release"], rows
    warn, release = rows
    assert warn["reason"] == w["message"] and not warn["acted"]
    assert warn["measurements"]["idle_s"] >= TIMEOUT - WARNING  # not warned before it was due
    assert release["acted"] and release["error"] is None and "releasing" in release["reason"]
    assert release["devices"] == [device] and release["measurements"]["timeout_s"] == TIMEOUT
    assert release["measurements"]["idle_s"] >= TIMEOUT
    assert (datetime.fromisoformat(release["at"]) - datetime.fromisoformat(warn["at"])).total_seconds() >= WARNING
    log = p.log()
    assert '"event": "culler.decision", "user": "cull-idle", "server": "", "action": "warn"' in log
    assert '"event": "culler.decision", "user": "cull-idle", "server": "", "action": "release"' in log
    # other users never see it
    assert all(x["user"] == "cull-busy" for x in culler.warnings("cull-busy"))

    # the same notebook server, now without a GPU, still runs code
    out = p.kernel_exec("cull-idle", "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']), os.environ['TRAINHUB_PROFILE'])")
    assert out.split() == ["''", "cpu"]
    fleet.idle_rows_after_release = len(culler.decisions("cull-idle", acted=False)["items"])


def test_busy_gpu_executing_cell_and_untimed_profile_are_never_culled(fleet):
    p, culler = fleet.main, fleet.culler
    # cull-idle went idle with cull-cell and cull-long and has been released (a full timeout plus the warning
    # period): a pass after that release has looked at each of them, and would have culled them by then
    release = wait_for(lambda: [r for r in culler.decisions("cull-idle")["items"] if r["action"] == "release"],
                       what="cull-idle's release", timeout=TIMEOUT + WARNING + 60)[0]
    for user in ("cull-busy", "cull-cell", "cull-long"):
        culler.decision_after(user, at(release), "cull-idle's release", timeout=3 * CHECK + 30)
    expected = {
        "cull-busy": f"not culled: GPU busy {BUSY}%",
        "cull-cell": "not culled: kernel executing",
        "cull-long": "not culled: profile gpu-long has no idle timeout",
    }
    for user, reason in expected.items():
        assert p.held_by(user) == fleet.devices[user], user
        assert p.server_model(user)["user_options"]["profile"] == SERVERS[user]
        answer = culler.decisions(user)
        assert answer["items"] == [], (user, answer["items"])  # never warned, stopped or released
        assert answer["latest"][0]["reason"] == reason, answer["latest"]
        assert user not in fleet.watch.first and culler.warnings(user) == []
    # the cell really is executing, on an idle GPU
    kernels = requests.get(f"{p.url}/user/cull-cell/api/kernels",
                           headers={"Authorization": f"token {p.token('cull-cell')}"}, timeout=30).json()
    assert [k["execution_state"] for k in kernels] == ["busy"]
    assert culler.latest("cull-cell")["measurements"]["utilization"] == {str(fleet.devices["cull-cell"][0]): 0.0}
    # the released server now runs on the CPU profile: no more decisions about it
    if fleet.idle_rows_after_release is not None:
        assert len(culler.decisions("cull-idle", acted=False)["items"]) == fleet.idle_rows_after_release


def test_prometheus_counters(fleet):
    culler = fleet.culler
    assert requests.get(culler.url + "/metrics", timeout=30).status_code == 403
    assert culler.metric("trainhub_culler_culls_total", reason="gpu_idle", action="release") == 1
    assert culler.metric("trainhub_culler_culls_total", reason="dry_run") == 0
    assert culler.metric("trainhub_culler_gpus_released_total") == 1
    assert culler.metric("trainhub_culler_warnings_total") >= 2
    # one GPU, counted from the release until now (it is not held again)
    reclaimed = culler.metric("trainhub_culler_gpu_hours_reclaimed_total")
    [release] = [r for r in culler.decisions("cull-idle")["items"] if r["action"] == "release"]
    last_pass = culler.metric("trainhub_culler_last_pass_timestamp_seconds")  # counted up to the last pass
    assert 0 < reclaimed * 3600 <= last_pass - at(release).timestamp() + 1
    for label in ("GPU busy", "kernel executing", "profile", "idle"):
        assert culler.metric("trainhub_culler_skips_total", reason=label) > 0, label
    assert culler.metric("trainhub_culler_errors_total") == 0
    # the culler keeps passing: the end of its last pass moves on
    wait_for(lambda: culler.metric("trainhub_culler_last_pass_timestamp_seconds"), lambda t: t > last_pass,
             what="another culler pass", timeout=3 * CHECK + 30)


def test_culler_role_is_least_privilege(fleet):
    p, culler = fleet.main, fleet.culler
    service = p.api("GET", "/services/trainhub-culler").json()
    assert service["roles"] == ["trainhub-culler"], service
    token = culler.service_token()
    me = p.api("GET", "/user", token).json()
    assert me["kind"] == "service" and me["name"] == "trainhub-culler"
    # what the token really holds: the role's scopes and the user names they imply, nothing else
    assert set(me["scopes"]) == {
        "list:users", "read:servers", "read:users:groups", "delete:servers", "start:servers", "access:servers",
        "access:services!service=trainhub", "custom:trainhub:jobs:read", "read:users:name",
    }, me["scopes"]
    assert p.api("POST", "/users/cull-intruder", token).status_code == 403
    assert p.api("GET", "/users/cull-idle/tokens", token).status_code in (403, 404)
    assert p.api("POST", "/users/cull-idle/tokens", token, json={}).status_code in (403, 404)
    assert p.api("DELETE", "/users/cull-busy", token).status_code == 403
    assert p.api("GET", "/users/cull-busy", token).json().get("last_activity") is None  # no activity read


def test_action_stop_stops_the_server(fleet):
    p = fleet.stopper
    culler = Culler(p)
    _, w = fleet.watch.seen("cull-stopped", TIMEOUT + 15)
    assert w["action"] == "stop" and "will stop in" in w["message"]
    wait_for(lambda: p.server_model("cull-stopped") is None, timeout=WARNING + 30, what="the server stopped")
    assert p.held_by("cull-stopped") == [] and p.ledger()["free"] == 1
    rows = culler.decisions("cull-stopped")["items"][::-1]
    assert [(r["action"], r["acted"]) for r in rows] == [("warn", False), ("stop", True)], rows
    assert (at(rows[1]) - at(rows[0])).total_seconds() >= WARNING  # the user had the warning period
    assert culler.warnings("cull-stopped") == []
    assert culler.metric("trainhub_culler_culls_total", reason="gpu_idle", action="stop") == 1
    assert culler.metric("trainhub_culler_gpus_released_total") == 1


def test_dry_run_reports_but_never_acts(fleet):
    p = fleet.dry
    culler = Culler(p)

    def would_release():
        return [r for r in culler.decisions("cull-dry")["items"] if r["action"] == "release"]

    [row] = wait_for(would_release, timeout=TIMEOUT + WARNING + 20, what="a dry-run release decision")[-1:]
    assert row["dry_run"] and not row["acted"] and row["reason"].startswith("dry run: idle")
    # two more passes reported the same release: a real release would have freed the GPU by then
    wait_for(would_release, lambda rows: len(rows) >= 3, what="two more dry-run release decisions",
             timeout=4 * CHECK + 30)
    assert p.held_by("cull-dry") == [0]
    assert p.server_model("cull-dry")["user_options"] == {"profile": "gpu-1"}
    assert "cull-dry" not in fleet.watch.first and culler.warnings("cull-dry") == []  # nobody is warned
    rows = culler.decisions("cull-dry")["items"]
    assert {r["action"] for r in rows} == {"warn", "release"} and not any(r["acted"] for r in rows)
    assert all(r["dry_run"] and r["reason"].startswith("dry run: ") for r in rows)
    assert len([r for r in rows if r["action"] == "release"]) > 1  # reported on every pass ...
    assert culler.metric("trainhub_culler_culls_total", reason="dry_run", action="release") == 1  # ... counted once
    assert culler.metric("trainhub_culler_culls_total", reason="gpu_idle") == 0
    assert culler.metric("trainhub_culler_gpus_released_total") == 0
    assert '"event": "culler.decision", "user": "cull-dry", "server": "", "action": "release"' in p.log()
