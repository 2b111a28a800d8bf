"""Unit tests of the culler's HTTP API (real tornado server on loopback).

The hub's token check is replaced by ``TokenTable`` (a HubOAuth whose user_for_token reads
a dict instead of calling a hub): a unit-level stand-in, not an acceptance test.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from jupyterhub.services.auth import HubOAuth
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer

from trainhub.services.culler.handlers import make_app
from trainhub.services.culler.models import AuditTrail
from trainhub.services.culler.service import GPUCuller

ACCESS = "access:services!service=trainhub-culler"
KEEP, USAGE = "custom:trainhub:culler:keep", "custom:trainhub:usage:read"


def own(name):
    return [ACCESS, f"{KEEP}!user={name}", f"{USAGE}!user={name}"]


USERS = {  # token -> the identity model the hub would return (scopes as hub_config/scopes.py grants them)
    "alice-token": {"kind": "user", "name": "alice", "admin": False, "scopes": own("alice")},
    "bob-token": {"kind": "user", "name": "bob", "admin": False, "scopes": own("bob")},
    "admin-token": {"kind": "user", "name": "root", "admin": False, "scopes": [ACCESS, KEEP, USAGE]},
    "nokeep-token": {"kind": "user", "name": "carl", "admin": False, "scopes": [ACCESS]},
    "noscope-token": {"kind": "user", "name": "eve", "admin": False, "scopes": []},
}


class TokenTable(HubOAuth):
    def user_for_token(self, token, use_cache=True, session_id="", *, sync=True):
        model = json.loads(json.dumps(USERS.get(token))) if token in USERS else None
        if sync:
            return model
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(model)
        return fut


@pytest.fixture
async def api(tmp_path):
    culler = GPUCuller(audit=AuditTrail(f"sqlite:///{tmp_path / 'db.sqlite'}"))
    culler.warnings["server:alice/"] = {"user": "alice", "server": "", "message": "idle 1h50m ...", "action": "release"}
    culler.warned_at["server:alice/"] = culler.policy.utcnow()
    auth = TokenTable(api_token="svc", api_url="http://127.0.0.1:9/hub/api", access_scopes={ACCESS})
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = HTTPServer(make_app(culler, hub_auth=auth))
    server.listen(port, "127.0.0.1")
    base = f"http://127.0.0.1:{port}/services/trainhub-culler/"

    async def call(path, token=None, method="GET", body=None):
        headers = {"Authorization": f"token {token}"} if token else {}
        resp = await AsyncHTTPClient().fetch(
            base + path, method=method, headers=headers, raise_error=False, follow_redirects=False,
            body=None if body is None else json.dumps(body),
        )
        ctype = resp.headers.get("Content-Type", "")
        # invariant: every API answer other than metrics and redirects is JSON
        if path.startswith("api/") and resp.code < 300 or resp.code >= 400:
            assert ctype.startswith("application/json"), (resp.code, ctype, resp.body[:200])
        return resp

    yield culler, call
    server.stop()


async def test_warnings_are_per_user(api):
    culler, call = api
    r = await call("api/warnings", "alice-token")
    assert r.code == 200 and json.loads(r.body)["items"][0]["message"].startswith("idle")
    assert json.loads((await call("api/warnings", "bob-token")).body) == {"items": []}


async def test_keep_own_server_only(api):
    culler, call = api
    r = await call("api/keep", "bob-token", "POST", {"user": "alice"})
    assert r.code == 403 and "only keep your own" in json.loads(r.body)["message"]
    r = await call("api/keep", "alice-token", "POST", {"server": ""})
    assert r.code == 200 and json.loads(r.body)["user"] == "alice"
    assert "server:alice/" in culler.kept_at and culler.warnings_for("alice") == []
    assert [e["action"] for e in culler.audit.list()] == ["keep"]
    r = await call("api/keep", "nokeep-token", "POST", {})
    assert r.code == 403 and KEEP in json.loads(r.body)["message"]
    r = await call("api/keep", "alice-token", "POST", {"server": 3})
    assert r.code == 400 and json.loads(r.body) == {"status": 400, "message": '"server" must be a server name ("" for the default server)'}


async def test_decisions_everyone_for_admins_own_for_users(api):
    culler, call = api
    culler.audit.append([
        {"user": "alice", "server": "", "action": "warn", "reason": "idle", "devices": [0]},
        {"user": "bob", "server": "", "action": "none", "reason": "not culled: GPU busy 90%", "devices": [1]},
    ])
    r = await call("api/decisions?limit=5", "admin-token")
    assert r.code == 200 and [e["user"] for e in json.loads(r.body)["items"]] == ["bob", "alice"]
    r = await call("api/decisions", "alice-token")
    assert r.code == 200 and [e["user"] for e in json.loads(r.body)["items"]] == ["alice"]
    assert (await call("api/decisions?user=bob", "alice-token")).code == 403
    assert (await call("api/decisions", "nokeep-token")).code == 403
    assert (await call("api/decisions?limit=x", "admin-token")).code == 400


async def test_auth_required(api):
    culler, call = api
    assert (await call("api/keep", None, "POST", {})).code == 403
    assert (await call("api/warnings", "noscope-token")).code == 403
    assert (await call("metrics")).code == 403


async def test_metrics_prometheus_text(api):
    culler, call = api
    culler.prom.culls.labels("gpu_idle", "release").inc()
    culler.prom.skips.labels("GPU busy").inc(3)
    r = await call("metrics", "alice-token")
    text = r.body.decode()
    assert r.code == 200 and r.headers["Content-Type"].startswith("text/plain")
    assert "# TYPE trainhub_culler_gpu_hours_reclaimed_total counter" in text
    assert 'trainhub_culler_culls_total{action="release",reason="gpu_idle"} 1.0' in text
    assert 'trainhub_culler_skips_total{reason="GPU busy"} 3.0' in text
    culler.authenticate_prometheus = False
    assert (await call("metrics")).code == 200
