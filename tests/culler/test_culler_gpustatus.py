"""Unit tests of ``GET api/gpus``: one server's devices and idle clock for the JupyterLab status bar.

The culler is the real service object over a real ledger (LocalGPUAllocator on SQLite), the scripted
metrics source and the real policy; the hub is test_culler_service_unit's ``InProcessHubClient`` and
the hub's token check test_culler_http_unit's ``TokenTable`` (unit-level stand-ins). The HTTP server is
the culler's real tornado application on loopback.
"""

from __future__ import annotations

import json
import socket
from datetime import datetime

import pytest
from test_culler_http_unit import ACCESS, KEEP, USAGE, USERS, TokenTable, own  # noqa: F401
from test_culler_service_unit import Clock, InProcessHubClient
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer

from trainhub.gpus import simulated_devices
from trainhub.ledger import LocalGPUAllocator
from trainhub.metrics import ScriptedMetricsSource
from trainhub.models import utcnow
from trainhub.services.culler.handlers import make_app
from trainhub.services.culler.models import AuditTrail
from trainhub.services.culler.service import GPUCuller

TOKENS = {
    **USERS,
    "bobsrv-token": {"kind": "user", "name": "bob", "admin": False,  # bob's server token (hub_config/scopes.py)
                     "scopes": own("bob")},
    "peek-token": {"kind": "user", "name": "mallory", "admin": False,  # usage read for herself only
                   "scopes": [ACCESS, f"{USAGE}!user=mallory"]},
}


class Tokens(TokenTable):
    def user_for_token(self, token, use_cache=True, session_id="", *, sync=True):
        USERS.update(TOKENS)
        return super().user_for_token(token, use_cache, session_id, sync=sync)


@pytest.fixture
async def rig(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'trainhub.sqlite'}"
    metrics_file = tmp_path / "gpu-metrics.json"
    alloc = LocalGPUAllocator(db_url=db_url, device_list=[d.to_dict() for d in simulated_devices(4)])
    clock = Clock()
    culler = GPUCuller(
        allocator=alloc, client=InProcessHubClient(alloc), audit=AuditTrail(db_url),
        metrics_source=ScriptedMetricsSource(path=str(metrics_file)),
    )
    culler.policy.utcnow = clock
    culler.policy.profile_timeouts = {"gpu-1": 3600, "gpu-2": 3600}
    culler.policy.release_timeout = 0  # the profile clock (1 h); the release clock: test_culler_policy.py
    culler.policy.start_grace_period = 0
    culler.setup()
    auth = Tokens(api_token="svc", api_url="http://127.0.0.1:9/hub/api", access_scopes={ACCESS})
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = HTTPServer(make_app(culler, hub_auth=auth))
    server.listen(port, "127.0.0.1")
    base = f"http://127.0.0.1:{port}/services/trainhub-culler/"

    async def call(path, token):
        resp = await AsyncHTTPClient().fetch(base + path, headers={"Authorization": f"token {token}"},
                                             raise_error=False, follow_redirects=False)
        assert resp.headers.get("Content-Type", "").startswith("application/json"), (resp.code, resp.body[:200])
        return resp.code, json.loads(resp.body)

    def metrics(**per_device):
        metrics_file.write_text(json.dumps({"devices": {k.removeprefix("gpu"): v for k, v in per_device.items()}}))

    culler.call, culler.metrics, culler.clock = call, metrics, clock
    yield culler
    server.stop()


async def passes(culler, total, step=5):
    """Move the clock ``total`` minutes, a pass every ``step`` (samples closer than max_sample_gap)."""
    for _ in range(total // step):
        culler.clock.advance(step)
        await culler.run_once()


def minutes(a: str, b: datetime) -> float:
    return (datetime.fromisoformat(a) - b).total_seconds() / 60


async def test_own_server_devices_from_the_culler_samples(rig):
    alice = rig.client.add("alice", gpus=2, profile="gpu-2")
    rig.metrics(**{f"gpu{alice[0]}": {"utilization": 37, "memory_used_mb": 2150.4}})
    await rig.run_once()
    code, body = await rig.call("api/gpus?server=", "alice-token")
    assert code == 200 and body["user"] == "alice" and body["server"] == ""
    assert [d["index"] for d in body["devices"]] == alice
    first, second = body["devices"]
    assert first["simulated"] is True and first["name"] == "Simulated GPU"
    assert (first["utilization"], first["memory_used_mb"], first["memory_total_mb"]) == (37.0, 2150.4, 16384.0)
    assert (second["utilization"], second["memory_used_mb"]) == (0.0, 0.0)
    # the same numbers the policy decides on: the history the pass recorded
    assert rig.history.latest(alice[0])[1] == 37.0
    # one GPU at 37 %: the culler's clock does not run
    assert body["clock"]["running"] is False and body["clock"]["reason"] == "not culled: GPU busy 37% on GPU 0"
    assert body["can_keep"] is False and body["checked_at"]


async def test_stale_samples_are_refreshed_by_one_sampling_pass(rig):
    (dev,) = rig.client.add("alice", gpus=1, profile="gpu-1")
    rig.metrics(**{f"gpu{dev}": {"utilization": 5}})
    await rig.run_once()
    rig.metrics(**{f"gpu{dev}": {"utilization": 90}})
    # within status_max_age: the latest sample as the sampling loop left it
    assert (await rig.call("api/gpus", "alice-token"))[1]["devices"][0]["utilization"] == 5.0
    rig.clock.advance(1)
    code, body = await rig.call("api/gpus", "alice-token")
    assert body["devices"][0]["utilization"] == 90.0 and rig.history.latest(dev)[1] == 90.0
    rig.status_max_age = 0  # 0 = never sample for a request
    rig.metrics(**{f"gpu{dev}": {"utilization": 1}})
    rig.clock.advance(1)
    assert (await rig.call("api/gpus", "alice-token"))[1]["devices"][0]["utilization"] == 90.0


async def test_clock_runs_while_idle_and_keep_resets_it(rig):
    rig.client.add("alice", gpus=1, profile="gpu-1")
    # the holding's start is the real time of the add (a busy machine: later than the fake clock's start, and the
    # idle clock would count from it); the fake clock goes on from there
    rig.clock.now = max(rig.clock.now, utcnow())
    await rig.run_once()
    start = rig.clock.now
    await passes(rig, 20)
    code, body = await rig.call("api/gpus", "alice-token")
    clock = body["clock"]
    assert clock["running"] is True and clock["action"] == "release" and clock["dry_run"] is False
    assert clock["timeout_s"] == 3600 and clock["idle_s"] == 20 * 60
    assert minutes(clock["act_at"], start) == pytest.approx(60, abs=0.01)
    assert body["can_keep"] is True and body["warning"] is None and body["at"] == rig.clock.now.isoformat()
    await passes(rig, 35)  # 55 min idle: the warning stands
    body = (await rig.call("api/gpus", "alice-token"))[1]
    assert body["warning"]["act_at"] == body["clock"]["act_at"] and body["clock"]["warned_at"]
    rig.keep("alice", "")  # what POST api/keep does
    body = (await rig.call("api/gpus", "alice-token"))[1]
    assert body["clock"]["idle_s"] == 0 and minutes(body["clock"]["act_at"], rig.clock.now) == pytest.approx(60, abs=0.01)
    assert body["warning"] is None and body["clock"]["warned_at"] is None


async def test_no_keep_without_the_scope_or_in_dry_run(rig):
    rig.client.add("carl", gpus=1, profile="gpu-1")
    await rig.run_once()
    USERS["carl-usage"] = {"kind": "user", "name": "carl", "admin": False, "scopes": [ACCESS, f"{USAGE}!user=carl"]}
    try:
        body = (await rig.call("api/gpus", "carl-usage"))[1]
    finally:
        del USERS["carl-usage"]
    assert body["clock"]["running"] is True and body["can_keep"] is False
    rig.client.add("alice", gpus=1, profile="gpu-1")
    rig.policy.dry_run = True
    await rig.run_once()
    body = (await rig.call("api/gpus", "alice-token"))[1]
    assert body["clock"]["dry_run"] is True and body["can_keep"] is False


async def test_another_users_server_is_not_found(rig):
    rig.client.add("bob", gpus=1, profile="gpu-1")
    await rig.run_once()
    for token in ("alice-token", "peek-token", "nokeep-token"):
        code, body = await rig.call("api/gpus?user=bob&server=", token)
        assert (code, body) == (404, {"status": 404, "message": "no such server"}), token
    # the same answer for a user or server that does not exist
    assert (await rig.call("api/gpus?user=nobody", "alice-token"))[0] == 404
    # the owner, and an admin holding the scope for everyone, see it
    for token in ("bob-token", "bobsrv-token", "admin-token"):
        code, body = await rig.call("api/gpus?user=bob&server=", token)
        assert code == 200 and len(body["devices"]) == 1, token
    # an admin sees the clock but cannot press keep for bob
    assert (await rig.call("api/gpus?user=bob", "admin-token"))[1]["can_keep"] is False


async def test_missing_scope_is_403(rig):
    code, body = await rig.call("api/gpus", "nokeep-token")  # carl: service access, no usage:read
    assert code == 403 and USAGE in body["message"]
    assert (await rig.call("api/gpus", "noscope-token"))[0] == 403


async def test_own_server_without_gpus(rig):
    rig.client.add("alice", gpus=0, profile="cpu")
    await rig.run_once()
    code, body = await rig.call("api/gpus?server=", "alice-token")
    assert code == 200 and body["devices"] == [] and body["clock"] is None and body["can_keep"] is False


async def test_device_the_source_cannot_measure(rig, tmp_path):
    rig.client.add("alice", gpus=1, profile="gpu-1")
    (tmp_path / "gpu-metrics.json").write_text("{not json")
    await rig.run_once()
    body = (await rig.call("api/gpus", "alice-token"))[1]
    (dev,) = body["devices"]
    assert dev["utilization"] is None and dev["memory_total_mb"] == 16384 and dev["simulated"] is True
    assert body["clock"]["running"] is False and "no recent GPU metrics" in body["clock"]["reason"]
