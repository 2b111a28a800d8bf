"""The culler's HTTP calls: JupyterHub REST API, single-user servers' kernels API, jobs service.

One small class so the service's loop can be unit-tested with an in-process stand-in
(tests/culler uses one; end-to-end tests go through a real `trainhub up`).
"""

from __future__ import annotations

import json
from urllib.parse import quote, urlencode, urlsplit

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets.config import LoggingConfigurable
from traitlets import Float, Unicode

from trainhub.backoff import apoll


class HubClient(LoggingConfigurable):
    """Talks to the hub as the culler service (token in the Authorization header)."""

    hub_api_url = Unicode(help="JupyterHub API URL, e.g. http://127.0.0.1:8081/hub/api").tag(config=True)
    api_token = Unicode(help="The service's API token.").tag(config=True)
    public_url = Unicode(help="Proxy URL servers are reached through, e.g. http://127.0.0.1:8000").tag(config=True)
    jobs_api_url = Unicode(help="trainhub API URL for the jobs query; empty = no jobs service.").tag(config=True)
    request_timeout = Float(20.0, help="Seconds per HTTP request.").tag(config=True)

    def _headers(self, extra=None):
        h = {"Authorization": f"token {self.api_token}", "Accept": "application/json"}
        h.update(extra or {})
        return h

    async def _fetch(self, url, method="GET", body=None, headers=None, raise_error=True):
        req = HTTPRequest(
            url, method=method, headers=self._headers(headers),
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True, request_timeout=self.request_timeout,
            connect_timeout=self.request_timeout,
        )
        return await AsyncHTTPClient().fetch(req, raise_error=raise_error)

    @staticmethod
    def _server_path(user: str, server_name: str) -> str:
        return f"/users/{quote(user, safe='')}/servers/{quote(server_name, safe='')}" if server_name \
            else f"/users/{quote(user, safe='')}/server"

    async def list_active_users(self) -> list[dict]:
        """Users with at least one active (running or pending) server, following pagination."""
        url = f"{self.hub_api_url}/users?{urlencode({'state': 'active'})}"
        users = []
        while url:
            resp = await self._fetch(url, headers={"Accept": "application/jupyterhub-pagination+json"})
            model = json.loads(resp.body)
            if isinstance(model, list):
                users.extend(model)
                break
            users.extend(model["items"])
            nxt = (model.get("_pagination") or {}).get("next")
            url = nxt["url"] if nxt else None
        return users

    async def _server_api(self, server_url: str, path: str):
        origin = urlsplit(self.public_url)
        if not origin.netloc:
            raise RuntimeError("public_url is not set: cannot reach single-user servers (set TRAINHUB_PUBLIC_URL)")
        # no_track_activity: our polling must not count as user activity in jupyter-server
        url = f"{origin.scheme}://{origin.netloc}{server_url.rstrip('/')}/api/{path}?no_track_activity=1"
        return json.loads((await self._fetch(url)).body)

    async def kernels(self, server_url: str) -> list[dict]:
        """Kernel models of a running server (``server_url`` is the hub's path, e.g. /user/alice/)."""
        return await self._server_api(server_url, "kernels")

    async def status(self, server_url: str) -> dict:
        """jupyter-server's /api/status: ``last_activity`` (API requests, kernels, terminals), ``connections``."""
        return await self._server_api(server_url, "status")

    async def snapshot(self, server_url: str, timeout: float) -> dict:
        """``POST <server>trainhub/snapshot``: every notebook kernel of the server saves its variables.

        Waits at most ``timeout`` seconds for the kernels (plus the request's own allowance); raises on
        any failure, the caller decides what that means (a release goes on without the snapshot)."""
        origin = urlsplit(self.public_url)
        if not origin.netloc:
            raise RuntimeError("public_url is not set: cannot reach single-user servers (set TRAINHUB_PUBLIC_URL)")
        url = f"{origin.scheme}://{origin.netloc}{server_url.rstrip('/')}/trainhub/snapshot"
        req = HTTPRequest(url, method="POST", headers=self._headers({"Content-Type": "application/json"}),
                          body=json.dumps({"timeout": timeout}), request_timeout=timeout + self.request_timeout,
                          connect_timeout=self.request_timeout, follow_redirects=False)
        return json.loads((await AsyncHTTPClient().fetch(req)).body)

    async def announce_move(self, server_url: str, move: dict, timeout: float = 5.0) -> None:
        """``POST <server>trainhub/move``: the server's open JupyterLab pages are told that it is about to move (they
        show the move's progress instead of JupyterLab's "Server unavailable" dialog). Raises on any failure."""
        origin = urlsplit(self.public_url)
        if not origin.netloc:
            raise RuntimeError("public_url is not set: cannot reach single-user servers (set TRAINHUB_PUBLIC_URL)")
        url = f"{origin.scheme}://{origin.netloc}{server_url.rstrip('/')}/trainhub/move"
        req = HTTPRequest(url, method="POST", headers=self._headers({"Content-Type": "application/json"}),
                          body=json.dumps(move), request_timeout=timeout, connect_timeout=timeout, follow_redirects=False)
        await AsyncHTTPClient().fetch(req)

    async def running_jobs(self, user: str) -> int | None:
        """Running jobs of ``user``; None when no jobs service is configured. Raises on any error."""
        if not self.jobs_api_url:
            return None
        url = f"{self.jobs_api_url.rstrip('/')}/jobs?{urlencode({'state': 'running', 'user': user})}"
        body = json.loads((await self._fetch(url)).body)
        if isinstance(body, dict) and isinstance(body.get("total"), int):
            return body["total"]
        items = body.get("items") if isinstance(body, dict) else body
        if not isinstance(items, list):
            raise ValueError(f"unexpected jobs response: {str(body)[:200]}")
        return len(items)

    async def stop_server(self, user: str, server_name: str) -> bool:
        """DELETE the server; True when stopped, False when the hub says the stop is still pending (202)."""
        resp = await self._fetch(self.hub_api_url + self._server_path(user, server_name), method="DELETE")
        return resp.code != 202

    async def user_model(self, user: str) -> dict:
        """The hub's model of ``user``: name, groups (read:users:groups) and servers (read:servers)."""
        resp = await self._fetch(f"{self.hub_api_url}/users/{quote(user, safe='')}")
        return json.loads(resp.body)

    async def server_model(self, user: str, server_name: str) -> dict | None:
        return ((await self.user_model(user)).get("servers") or {}).get(server_name)

    async def wait_stopped(self, user: str, server_name: str, timeout: float) -> None:
        await apoll(lambda: self.server_model(user, server_name),
                    lambda model: not model or (not model.get("ready") and not model.get("pending")),
                    what=f"server {user}/{server_name} to stop", describe=lambda model: f"still {model.get('pending') or 'running'}",
                    start=1.0, factor=1.0, timeout=timeout)

    async def wait_started(self, user: str, server_name: str, timeout: float) -> None:
        """Until the server is ready; raises when it is gone again (its start failed) or on the timeout."""
        def ready(model) -> bool:
            if not model:
                raise RuntimeError(f"the server {user}/{server_name} did not start (its start failed; see the hub log)")
            return bool(model.get("ready"))

        await apoll(lambda: self.server_model(user, server_name), ready, what=f"server {user}/{server_name} to start",
                    describe=lambda model: f"still {(model or {}).get('pending') or 'not ready'}",
                    start=1.0, factor=1.0, timeout=timeout)

    async def start_server(self, user: str, server_name: str, profile: str) -> None:
        try:
            await self._fetch(self.hub_api_url + self._server_path(user, server_name), method="POST", body={"profile": profile})
        except HTTPClientError as e:
            body = e.response.body.decode("utf8", "replace")[:500] if e.response is not None else ""
            raise RuntimeError(f"hub refused to start {user}/{server_name} on profile {profile!r}: {e.code} {body}") from e
