"""Fixtures for the client-side jobs tests (TrainhubClient, `trainhub jobs`).

- ``jobs_api`` (tests/conftest.py): the in-process jobs-service stand-in (tests/jobs_contract_server.py).
- ``api_env``: ``$TRAINHUB_API_URL``/``$JUPYTERHUB_API_TOKEN`` pointing at ``jobs_api``; returns it.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def api_env(jobs_api, monkeypatch):
    monkeypatch.setenv("TRAINHUB_API_URL", jobs_api.url)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", jobs_api.token)
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    return jobs_api


@pytest.fixture
def serve_jobs_api(monkeypatch):
    """``start(service)`` serves a real jobs service object's API on a tornado server of the test's event loop, the
    hub's authentication replaced by ``Authorization: token <user name>`` (scopes on the user's own jobs and sweeps;
    ``root`` is an admin); returns ``call(user, method, path, body=None) -> (status, JSON body)``."""
    import json

    from tornado.httpclient import AsyncHTTPClient

    from trainhub.services import api as service_api

    async def identify(self):
        name = self.request.headers.get("Authorization", "").removeprefix("token ")
        model = {"name": name, "kind": "user", "admin": name == "root", "groups": [],
                 "scopes": [f"custom:trainhub:jobs:write!user={name}", f"custom:trainhub:jobs:read!user={name}",
                            f"custom:trainhub:sweeps:write!user={name}", f"custom:trainhub:sweeps:read!user={name}"]}
        self._hub_auth_user_cache = model
        self.current_user = model

    monkeypatch.setattr(service_api.APIHandler, "_identify", identify)
    servers = []

    def start(service):
        server = service.make_app().listen(0, "127.0.0.1")
        servers.append(server)
        port = next(iter(server._sockets.values())).getsockname()[1]
        base = f"http://127.0.0.1:{port}{service.api_prefix}"

        async def call(user, method, path, body=None):
            r = await AsyncHTTPClient().fetch(base + path, method=method, raise_error=False,
                                              body=None if body is None else json.dumps(body),
                                              headers={"Authorization": f"token {user}", "Content-Type": "application/json"})
            return r.code, json.loads(r.body)

        return call

    yield start
    for server in servers:
        server.stop()
