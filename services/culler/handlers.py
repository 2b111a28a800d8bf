"""The culler's HTTP API, served under its JupyterHub service prefix.

GET  {prefix}metrics        Prometheus text (token or cookie unless authenticate_prometheus=False)
GET  {prefix}api/decisions  audit trail, newest first: ?user=&limit=&before=&acted=1 (everyone's with the
                            unfiltered decisions_scope or hub admin; one's own with decisions_scope!user=<self>)
POST {prefix}api/keep       {"server": ""}: "keep my GPU", restarts the caller's own idle clock (keep_scope!user=<self>)
POST {prefix}api/release    {"server": ""}: "give my GPU back" now: the kernels save their variables, the caller's own
                            server restarts on the CPU profile (keep_scope!user=<self>); 202, done in the background
POST {prefix}api/regain     {"server": "", "profile": "gpu-1"}: "get a GPU again": the request waits in the jobs
                            queue while the server runs on the CPU; once the GPUs are granted the kernels save their
                            variables and the server restarts on the profile (keep_scope!user=<self>); 202
GET  {prefix}api/regain     ?server=: that request's state (position, reason, estimate) and the GPU profiles one may ask for
DELETE {prefix}api/regain   ?server=: withdraw a request still waiting
GET  {prefix}api/warnings   the caller's standing warnings (for the JupyterLab notification)
GET  {prefix}api/gpus       ?server=<name>[&user=]: one server's devices (utilisation, memory, simulated) and
                            idle clock, for the JupyterLab status bar (decisions_scope!user=<owner>; another
                            user's server is a 404 to anyone without that scope for its owner)
"""

from __future__ import annotations

import asyncio
import os

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, check_scopes
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web

from trainhub.exceptions import Forbidden, InvalidRequest, NotFound
from trainhub.services.api import APIHandler, make_application


class CullerHandler(APIHandler):
    """Base: the culler instance (``self.service``) on the hub services' handler base.

    Authentication: a hub token in the Authorization header, or the service's OAuth cookie
    (a GET without either is redirected through the hub's OAuth flow, as for any hub service).
    """

    internal_error_message = "internal error in the trainhub-culler service; details are in its log"

    @property
    def culler(self):
        return self.service

    def has_scope(self, scope: str, owner: str | None = None) -> bool:
        """The caller holds ``scope`` (unfiltered when owner is None, else at least ``!user=owner``)."""
        if not scope:
            return True
        required = f"{scope}!user={owner}" if owner else scope
        return bool(check_scopes({required}, set(self.current_user.get("scopes") or ())))

    def sees_all_decisions(self) -> bool:
        return bool(self.current_user.get("admin")) or self.has_scope(self.culler.decisions_scope)

    def body_json(self) -> dict:
        body = self.json_body(required=False)
        if not isinstance(body, dict):
            raise InvalidRequest("request body must be a JSON object")
        return body


class MetricsHandler(CullerHandler):
    async def get(self):
        if self.culler.authenticate_prometheus and not self.current_user:
            raise web.HTTPError(403, "metrics need a JupyterHub token (or set GPUCuller.authenticate_prometheus=False)")
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.culler.prom.registry))


class DecisionsHandler(CullerHandler):
    @web.authenticated
    async def get(self):
        me = self.current_user["name"]
        user = self.get_argument("user", None)
        if not self.sees_all_decisions():
            if user not in (None, me):
                raise Forbidden("you may only read decisions about your own servers")
            if not self.has_scope(self.culler.decisions_scope, me):
                raise Forbidden(f"missing scope {self.culler.decisions_scope}")
            user = me
        if self.culler.audit is None:
            raise InvalidRequest("no audit trail: the culler runs without a database")
        try:
            limit = min(int(self.get_argument("limit", "100")), 1000)
            before = int(self.get_argument("before", "0")) or None
        except ValueError:
            raise InvalidRequest("limit and before must be integers") from None
        rows = await asyncio.to_thread(
            self.culler.audit.list, user=user, limit=limit, before_id=before,
            acted_only=self.get_argument("acted", "") in ("1", "true"),
        )
        latest = [r for r in self.culler.latest.values() if user is None or r["user"] == user]
        self.write_json({"items": rows, "latest": latest})


class KeepHandler(CullerHandler):
    @web.authenticated
    async def post(self):
        model = self.current_user
        if model.get("kind", "user") != "user":
            raise Forbidden("only users keep their own servers")
        body = self.body_json()
        user = body.get("user", model["name"])
        if user != model["name"]:
            raise Forbidden("you may only keep your own server")
        if not self.has_scope(self.culler.keep_scope, model["name"]):
            raise Forbidden(f"missing scope {self.culler.keep_scope}")
        server = body.get("server", "")
        if not isinstance(server, str):
            raise InvalidRequest('"server" must be a server name ("" for the default server)')
        row = self.culler.keep(model["name"], server)
        if self.culler.audit is not None:
            await asyncio.to_thread(self.culler.audit.append, [row])
        self.write_json({"user": model["name"], "server": server, "kept_at": row["at"].isoformat(),
                         "message": "Idle clock restarted: your GPUs are kept."})


class ReleaseHandler(CullerHandler):
    """"Give my GPU back": one's own server, released now (see GPUCuller.give_back)."""

    @web.authenticated
    async def post(self):
        model = self.current_user
        if model.get("kind", "user") != "user":
            raise Forbidden("only users give their own GPUs back")
        body = self.body_json()
        if body.get("user", model["name"]) != model["name"]:
            raise Forbidden("you may only give back your own server's GPUs")
        if not self.has_scope(self.culler.keep_scope, model["name"]):
            raise Forbidden(f"missing scope {self.culler.keep_scope}")
        server = body.get("server", "")
        if not isinstance(server, str):
            raise InvalidRequest('"server" must be a server name ("" for the default server)')
        answer = await self.culler.give_back(model["name"], server)
        self.write_json(answer, status=202)


class RegainHandler(CullerHandler):
    """"Get a GPU again": one's own CPU server, moved to a GPU profile once the queue grants the GPUs
    (see GPUCuller.regain). POST asks (202), GET follows the request and lists the GPU profiles one may
    ask for, DELETE withdraws a request still in line."""

    def _own(self, body: dict | None = None) -> tuple[str, str]:
        model = self.current_user
        if model.get("kind", "user") != "user":
            raise Forbidden("only users move their own servers to GPUs")
        body = body or {}
        owner = body.get("user", self.get_argument("user", model["name"]))
        if owner != model["name"]:
            raise Forbidden("you may only move your own server to GPUs")
        if not self.has_scope(self.culler.keep_scope, model["name"]):
            raise Forbidden(f"missing scope {self.culler.keep_scope}")
        server = body.get("server", self.get_argument("server", ""))
        if not isinstance(server, str):
            raise InvalidRequest('"server" must be a server name ("" for the default server)')
        return model["name"], server

    @web.authenticated
    async def post(self):
        body = self.body_json()
        user, server = self._own(body)
        profile = body.get("profile")
        if profile is not None and (not isinstance(profile, str) or not profile):
            raise InvalidRequest('"profile" must be a GPU profile\'s slug (or left out for the smallest one open to you)')
        answer = await self.culler.regain(user, server, profile, admin=bool(self.current_user.get("admin")))
        self.write_json(answer, status=202)

    @web.authenticated
    async def get(self):
        user, server = self._own()
        try:
            model = await self.culler.client.user_model(user)
            _, _, profiles = await self.culler._user_profiles(
                {**model, "admin": model.get("admin") or self.current_user.get("admin")})
        except Exception as e:  # the request's state is still worth answering
            self.log.warning("cannot list the GPU profiles of %s: %s", user, e)
            profiles = []
        self.write_json({"request": self.culler.regain_status(user, server),
                         "profiles": [{"slug": p.slug, "display_name": p.display_name, "gpus": p.gpus} for p in profiles]})

    @web.authenticated
    async def delete(self):
        user, server = self._own()
        self.write_json(self.culler.cancel_regain(user, server))


class WarningsHandler(CullerHandler):
    @web.authenticated
    async def get(self):
        self.write_json({"items": self.culler.warnings_for(self.current_user["name"])})


class GPUStatusHandler(CullerHandler):
    """One server's devices and idle clock: what the culler decides on, as the user's status bar shows it."""

    @web.authenticated
    async def get(self):
        caller = self.caller
        owner = self.get_argument("user", None) or caller.name
        server = self.get_argument("server", "")
        scope = self.culler.decisions_scope
        if owner != caller.name and not caller.may(scope, owner):
            # whether another user has such a server is not the caller's business: not a 403
            raise NotFound("no such server")
        if scope and not caller.may(scope, owner):
            raise Forbidden(f"missing scope {scope}")
        status = await self.culler.gpu_status(owner, server)
        clock = status["clock"]
        # keep restarts the caller's own clock only (KeepHandler): offered when that would change something
        keep_scope = self.culler.keep_scope
        status["can_keep"] = bool(
            clock and clock["running"] and not clock["dry_run"] and owner == caller.name and caller.kind == "user"
            and (not keep_scope or caller.may(keep_scope, owner))
        )
        self.write_json(status)


class OAuthCallbackHandler(HubOAuthCallbackHandler):
    def initialize(self, culler=None):
        self.hub_auth = self.settings["hub_auth"]


def default_handlers(prefix: str) -> list[tuple]:
    return [
        (prefix + "metrics", MetricsHandler),
        (prefix + "api/decisions", DecisionsHandler),
        (prefix + "api/keep", KeepHandler),
        (prefix + "api/release", ReleaseHandler),
        (prefix + "api/regain", RegainHandler),
        (prefix + "api/warnings", WarningsHandler),
        (prefix + "api/gpus", GPUStatusHandler),
    ]


def make_app(culler, hub_auth=None) -> web.Application:
    prefix = culler.service_prefix if culler.service_prefix.endswith("/") else culler.service_prefix + "/"
    if hub_auth is None:
        hub_auth = HubOAuth(api_token=culler.api_token, api_url=culler.hub_api_url, cache_max_age=60)
    routes = [(path, handler, {"service": culler}) for path, handler in default_handlers(prefix)]
    routes.append((prefix + "oauth_callback", OAuthCallbackHandler))
    return make_application(routes, hub_auth=hub_auth, cookie_secret=os.urandom(32))
