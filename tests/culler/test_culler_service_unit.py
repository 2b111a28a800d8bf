"""Unit tests of the culler service's loop logic.

NOT an acceptance test: the hub is replaced by ``InProcessHubClient``, an in-process object
with HubClient's methods (no HTTP, no JupyterHub). The GPU ledger (LocalGPUAllocator on
SQLite), the scripted metrics source, the policy, the audit table and the Prometheus
registry are the real ones. End-to-end tests through a real `trainhub up` live elsewhere.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from prometheus_client import generate_latest

from trainhub.gpus import simulated_devices
from trainhub.ledger import LocalGPUAllocator, server_holder
from trainhub.metrics import ScriptedMetricsSource
from trainhub.models import utcnow
from trainhub.services.culler.models import AuditTrail
from trainhub.services.culler.service import GPUCuller, parse_holder


class InProcessHubClient:
    """Stand-in for HubClient (unit tests only): servers, kernels and jobs as plain data."""

    def __init__(self, allocator):
        self.allocator = allocator
        self.servers = {}  # (user, name) -> {"kernels": [...], "jobs": int|Exception, "profile": slug}
        self.calls = []
        self.fail_list = False

    def add(self, user, name="", *, gpus, profile, kernels=None, jobs=0, connected=True, status=None):
        """kernels default: one idle kernel with a JupyterLab tab connected (``connected``), else none."""
        devs = self.allocator.allocate(server_holder(user, name), kind="server", user=user, count=gpus, profile=profile)
        if kernels is None:
            kernels = [{"id": "k0", "execution_state": "idle", "connections": 1}] if connected else []
        status = status or {"last_activity": "2020-01-01T00:00:00Z", "connections": 0}
        self.servers[(user, name)] = {"kernels": kernels, "jobs": jobs, "profile": profile, "status": status}
        return devs

    async def list_active_users(self):
        if self.fail_list:
            raise ConnectionError("hub down")
        users = {}
        for (user, name) in self.servers:
            u = users.setdefault(user, {"name": user, "servers": {}})
            prefix = f"/user/{user}/" + (f"{name}/" if name else "")
            u["servers"][name] = {"name": name, "ready": True, "pending": None, "url": prefix}
        return list(users.values())

    async def kernels(self, server_url):
        user, _, rest = server_url.removeprefix("/user/").partition("/")
        entry = self.servers[(user, rest.rstrip("/"))]
        if isinstance(entry["kernels"], Exception):
            raise entry["kernels"]
        return entry["kernels"]

    async def status(self, server_url):
        user, _, rest = server_url.removeprefix("/user/").partition("/")
        status = self.servers[(user, rest.rstrip("/"))]["status"]
        if isinstance(status, Exception):
            raise status
        return status

    async def running_jobs(self, user):
        jobs = [s["jobs"] for (u, _), s in self.servers.items() if u == user]
        for j in jobs:
            if isinstance(j, Exception):
                raise j
        return max(jobs)

    async def stop_server(self, user, name):
        self.calls.append(("stop", user, name))
        self.allocator.release(server_holder(user, name))
        self.servers.pop((user, name))
        return True

    async def wait_stopped(self, user, name, timeout):
        self.calls.append(("wait", user, name))

    async def start_server(self, user, name, profile):
        self.calls.append(("start", user, name, profile))
        self.servers[(user, name)] = {"kernels": [], "jobs": 0, "profile": profile, "status": {}}


class Clock:
    def __init__(self):
        self.now = utcnow()

    def __call__(self):
        return self.now

    def advance(self, minutes):
        self.now += timedelta(minutes=minutes)


@pytest.fixture
def rig(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'trainhub.sqlite'}"
    metrics_file = tmp_path / "gpu-metrics.json"
    alloc = LocalGPUAllocator(db_url=db_url, device_list=[d.to_dict() for d in simulated_devices(6)])
    clock = Clock()
    culler = GPUCuller(
        allocator=alloc, client=InProcessHubClient(alloc), audit=AuditTrail(db_url),
        metrics_source=ScriptedMetricsSource(path=str(metrics_file)),
    )
    culler.policy.utcnow = clock
    culler.policy.release_timeout = 0  # these tests walk the profile timeouts; the release clock has its own below
    culler.policy.start_grace_period = 0  # the walks start at the server's start; the grace: test_culler_habits.py
    culler.setup()

    def utilisation(**per_device):
        metrics_file.write_text(json.dumps({"devices": {str(k.removeprefix("gpu")): {"utilization": v} for k, v in per_device.items()}}))

    culler.utilisation = utilisation
    culler.clock = clock
    return culler


async def run_for(culler, minutes, step=5):
    out = []
    for _ in range(int(minutes // step)):
        culler.clock.advance(step)
        out.append(await culler.run_once())
    return out


IDLE_KERNEL = [{"id": "k1", "execution_state": "idle", "last_activity": "2020-01-01T00:00:00Z", "connections": 1}]


async def test_one_pass_loop_releases_only_idle_gpu_servers(rig):
    hub = rig.client
    hub.add("alice", gpus=1, profile="gpu-1", kernels=IDLE_KERNEL)  # device 0: idle
    hub.add("bob", gpus=2, profile="gpu-2")  # devices 1,2: training
    hub.add("carol", gpus=1, profile="gpu-1", kernels=[{"id": "k", "execution_state": "busy"}])  # device 3
    hub.add("dave", "exp", gpus=1, profile="gpu-1", jobs=1)  # device 4: a job depends on it
    hub.add("erin", gpus=0, profile="cpu")
    rig.utilisation(gpu1=85, gpu2=70)

    passes = await run_for(rig, 115)
    # warning given at 1h50m, to alice only, and visible to her
    assert [d.action for info, d in passes[-1] if info.user == "alice"] == ["warn"]
    (w,) = rig.warnings_for("alice")
    assert "your variables will be kept" in w["message"] and w["action"] == "release"
    assert rig.warnings_for("bob") == []

    passes += await run_for(rig, 15)
    assert hub.calls == [("stop", "alice", ""), ("start", "alice", "", "cpu")]
    assert rig.warnings_for("alice") == []
    assert ("server:alice/", "cpu") in [(f"server:{u}/{n}", s["profile"]) for (u, n), s in hub.servers.items()]
    # nobody else was touched, and every one of them was reported with its reason
    reasons = {info.user: d.reason for info, d in passes[-1]}
    assert reasons == {
        "bob": "not culled: GPU busy 85% on GPU 1,2",
        "carol": "not culled: kernel executing",
        "dave": "not culled: running job(s) depend on it (1)",
    }
    assert {h.holder for h in rig.allocator.holdings()} == {"server:bob/", "server:carol/", "server:dave/exp"}

    rows = rig.audit.list(limit=1000)
    assert {r["action"] for r in rows} == {"none", "warn", "release"}
    (release,) = [r for r in rows if r["action"] == "release"]
    assert release["acted"] and release["devices"] == [0] and "releasing" in release["reason"]
    assert release["measurements"]["utilization"] == {"0": 0.0}

    await run_for(rig, 60)
    text = generate_latest(rig.prom.registry).decode()
    assert 'trainhub_culler_culls_total{action="release",reason="gpu_idle"} 1.0' in text
    assert 'trainhub_culler_gpus_released_total 1.0' in text
    assert 'trainhub_culler_warnings_total 1.0' in text
    assert 'trainhub_culler_skips_total{reason="GPU busy"}' in text
    assert 'trainhub_culler_skips_total{reason="kernel executing"}' in text
    hours = float(text.split("\ntrainhub_culler_gpu_hours_reclaimed_total ")[1].split()[0])
    assert hours == pytest.approx(1.0, abs=0.1)  # 1 device x ~65 min since the release


async def test_keep_restarts_the_clock(rig):
    rig.client.add("alice", gpus=1, profile="gpu-1")
    await run_for(rig, 115)
    assert rig.warnings_for("alice")
    row = rig.keep("alice", "")
    assert row["action"] == "keep" and rig.warnings_for("alice") == []
    passes = await run_for(rig, 30)
    assert rig.client.calls == []
    assert "idle 30m of 2h00m" in passes[-1][0][1].reason


async def test_gpu_use_after_warning_cancels_it(rig):
    rig.client.add("alice", gpus=1, profile="gpu-1")
    await run_for(rig, 115)
    rig.utilisation(gpu0=60)
    await run_for(rig, 5)
    assert rig.warnings_for("alice") == []
    rig.utilisation(gpu0=0)
    passes = await run_for(rig, 60)
    assert rig.client.calls == [] and "idle 55m" in passes[-1][0][1].reason


async def test_dry_run_never_acts(rig):
    rig.policy.dry_run = True
    rig.client.add("alice", gpus=1, profile="gpu-1")
    passes = await run_for(rig, 180)
    assert rig.client.calls == [] and rig.warnings_for("alice") == []
    actions = [d.action for p in passes for _, d in p]
    assert "warn" in actions and actions.count("release") > 1  # reported on every pass while idle ...
    text = generate_latest(rig.prom.registry).decode()
    assert 'trainhub_culler_culls_total{action="release",reason="dry_run"} 1.0' in text  # ... counted once
    assert "gpu_idle" not in text


async def test_unknowns_never_cull_and_one_bad_server_does_not_stop_the_pass(rig):
    hub = rig.client
    hub.add("alice", gpus=1, profile="gpu-1", kernels=ConnectionError("server gone"))
    hub.add("bob", gpus=1, profile="gpu-1", jobs=RuntimeError("404 jobs endpoint"))
    hub.add("carol", gpus=1, profile="gpu-1")
    passes = await run_for(rig, 130)
    reasons = {info.user: d.reason for info, d in passes[-1]}
    assert reasons["alice"] == "not culled: kernel state unknown (server did not answer)"
    assert reasons["bob"].startswith("not culled: running jobs unknown")
    assert hub.calls == [("stop", "carol", ""), ("start", "carol", "", "cpu")]


async def test_nobody_connected_releases_after_away_timeout(rig):
    """No kernel connection (browser closed): away_timeout (1 h) applies; a connected tab keeps the 2 h timeout."""
    hub = rig.client
    hub.add("alice", gpus=1, profile="gpu-1", connected=False)  # device 0
    hub.add("bob", gpus=1, profile="gpu-1")  # device 1: a JupyterLab tab connected (hidden or not)
    hub.add("carol", gpus=1, profile="gpu-1", connected=False, status=ConnectionError("status API down"))
    passes = await run_for(rig, 55)  # the first pass (5 min) has the first GPU sample
    (w,) = rig.warnings_for("alice")
    assert "nobody connected for 50m" in w["message"]
    assert rig.warnings_for("bob") == [] and rig.warnings_for("carol") == []
    passes += await run_for(rig, 10)
    assert hub.calls == [("stop", "alice", ""), ("start", "alice", "", "cpu")]
    (release,) = [r for r in rig.audit.list(limit=1000) if r["action"] == "release"]
    assert release["measurements"]["away"] is True and release["measurements"]["server"]["connections"] == 0
    reasons = {info.user: d.reason for info, d in passes[-1]}
    assert reasons["bob"] == "not culled: idle 1h00m of 2h00m under 10% on GPU 1"
    assert reasons["carol"] == "not culled: idle 1h00m of 2h00m under 10% on GPU 2"  # presence unknown: no away path
    assert 'trainhub_culler_errors_total{stage="status"} 13.0' in generate_latest(rig.prom.registry).decode()


async def test_a_tab_coming_back_withdraws_the_away_warning(rig):
    hub = rig.client
    hub.add("alice", gpus=1, profile="gpu-1", connected=False)
    await run_for(rig, 55)
    assert rig.warnings_for("alice")
    hub.servers[("alice", "")]["kernels"] = [{"id": "k0", "execution_state": "idle", "connections": 1}]
    passes = await run_for(rig, 5)
    assert rig.warnings_for("alice") == [] and "idle 55m of 2h00m" in passes[-1][0][1].reason
    hub.servers[("alice", "")]["kernels"] = []  # gone again: an hour from the last pass that saw the tab
    passes = await run_for(rig, 45)
    assert rig.warnings_for("alice") == [] and "idle 45m of 1h00m" in passes[-1][0][1].reason
    await run_for(rig, 20)
    assert hub.calls == [("stop", "alice", ""), ("start", "alice", "", "cpu")]


async def test_away_clock_starts_when_the_culler_first_sees_the_server(rig):
    """After a culler restart it cannot know how long nobody was there: it counts from its first pass."""
    hub = rig.client
    hub.add("alice", gpus=1, profile="gpu-1", connected=False)
    rig.clock.advance(50)  # GPUs taken 50 min before the culler's first pass
    passes = await run_for(rig, 10)
    assert "idle 5m of 1h00m under 10% on GPU 0, nobody connected for 5m" in passes[-1][0][1].reason


async def test_hub_down_skips_the_pass(rig):
    rig.client.add("alice", gpus=1, profile="gpu-1")
    rig.client.fail_list = True
    assert await run_for(rig, 130) == [[]] * 26
    assert rig.client.calls == []
    assert 'trainhub_culler_errors_total{stage="list_users"} 26.0' in generate_latest(rig.prom.registry).decode()


async def test_new_holder_starts_with_fresh_history(rig):
    rig.client.add("alice", gpus=1, profile="gpu-1")
    await run_for(rig, 100)
    await rig.client.stop_server("alice", "")
    rig.client.add("bob", gpus=1, profile="gpu-1")  # gets device 0, idle since its own start
    passes = await run_for(rig, 30)
    assert "idle 25m" in passes[-1][0][1].reason or "idle 30m" in passes[-1][0][1].reason


def test_parse_holder():
    assert parse_holder("server:alice/") == ("alice", "")
    assert parse_holder("server:alice/gpu") == ("alice", "gpu")
    assert parse_holder("job:42") is None


def test_config_file_and_env(tmp_path, monkeypatch):
    cfg = tmp_path / "culler_config.py"
    cfg.write_text(
        "c.CullPolicy.profile_timeouts = {'gpu-1': 1800}\n"
        "c.CullPolicy.action = 'stop'\n"
        "c.GPUCuller.check_interval = 60\n"
    )
    monkeypatch.delenv("TRAINHUB_DATA_DIR", raising=False)
    monkeypatch.delenv("TRAINHUB_CONFIG", raising=False)
    monkeypatch.setenv("TRAINHUB_DB_URL", f"sqlite:///{tmp_path / 'db.sqlite'}")
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/hub-base/services/trainhub-culler/")
    app = GPUCuller()
    app.initialize(["--config", str(cfg), "--CullPolicy.warning_period=300"])
    app.setup()
    assert app.policy.profile_timeouts == {"gpu-1": 1800} and app.policy.action == "stop"
    assert app.policy.warning_period == 300 and app.check_interval == 60
    assert app.policy.cpu_profile == "cpu" and app.service_prefix == "/hub-base/services/trainhub-culler/"
    assert type(app.metrics_source).__name__ == "ScriptedMetricsSource"  # no devices: simulated
    assert app.audit is not None


def test_started_like_trainhub_up(tmp_path, monkeypatch):
    """`trainhub up` runs `python -m trainhub.services.culler --port N` with TRAINHUB_DATA_DIR set."""
    from trainhub.settings import Runtime

    Runtime(data_dir=str(tmp_path), devices=[d.to_dict() for d in simulated_devices(2)]).save()
    (tmp_path / "trainhub_config.py").write_text(
        "c.ProfileCatalog.profiles = [{'slug': 'small', 'gpus': 0}, {'slug': 'gpu-1', 'gpus': 1, 'idle_timeout': 900}]\n"
    )
    monkeypatch.setenv("TRAINHUB_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("TRAINHUB_CONFIG", raising=False)
    app = GPUCuller()
    app.initialize(["--port", "18999"])
    app.setup()
    assert app.port == 18999
    assert [d.index for d in app.allocator.devices()] == [0, 1]
    assert app.policy.cpu_profile == "small"
    assert app.policy.timeout_for(app.catalog.get("gpu-1")) == 900


async def test_never_acts_twice_on_ledger_rows_the_spawner_did_not_free(rig):
    hub = rig.client
    hub.add("alice", gpus=1, profile="gpu-1")

    async def stop_without_freeing(user, name):  # a broken spawner: the server stops, the ledger keeps its rows
        hub.calls.append(("stop", user, name))
        return True

    hub.stop_server = stop_without_freeing
    passes = await run_for(rig, 180)
    assert hub.calls == [("stop", "alice", ""), ("start", "alice", "", "cpu")]
    assert "still in the ledger after the cull" in passes[-1][0][1].reason


async def test_release_clock_and_gpu_use_outside_the_kernels(rig):
    """Shipped release clock: an idle notebook server goes after 5 min; a server whose GPU was busy while its
    kernels were idle (a script from a terminal) only 30 min after that use, on the sample's time."""
    rig.policy.release_timeout = 300.0  # the shipped default
    rig.policy.learn_release_clock = False  # the fixed 5-min clock (the learned one: test_culler_habits.py)
    hub = rig.client
    hub.add("alice", gpus=1, profile="gpu-1", kernels=IDLE_KERNEL)  # device 0: idle notebook
    hub.add("bob", gpus=1, profile="gpu-1", kernels=IDLE_KERNEL)  # device 1: a terminal run, kernels idle
    rig.utilisation(gpu1=95)
    await run_for(rig, 15)
    assert hub.calls == [("stop", "alice", ""), ("start", "alice", "", "cpu")]
    used = rig.external_use_at["server:bob/"]
    assert used == rig.clock.now and rig.infos["server:bob/"].external_use_at == used
    rig.utilisation(gpu1=2)  # the run pauses or ends: idle from the next sample on, not released after 5 min
    await run_for(rig, 25)
    assert len(hub.calls) == 2 and rig.external_use_at["server:bob/"] == used and rig.warnings_for("bob") == []
    await run_for(rig, 5)  # 25 min idle: warned
    (w,) = rig.warnings_for("bob")
    assert "GPU last used outside the notebooks" in w["message"]
    await run_for(rig, 5)
    assert hub.calls[2:] == [("stop", "bob", ""), ("start", "bob", "", "cpu")]
    release = [r for r in rig.audit.list(limit=1000) if r["action"] == "release" and r["user"] == "bob"][0]
    assert release["measurements"]["timeout_s"] == 1800 and release["measurements"]["release_clock"] is True
    assert "server:bob/" not in rig.external_use_at or rig.external_use_at["server:bob/"] == used
