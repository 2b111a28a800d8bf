"""Who is calling, and what they may do: JupyterHub identity plus trainhub's custom scopes.

Requests authenticate with a JupyterHub API token or the browser's OAuth cookie
(HubOAuth). A user holds ``custom:trainhub:jobs:read!user=<self>``; admins hold the
unfiltered scope. Another user's job answers 404, so its existence is not revealed.
"""

from __future__ import annotations

import json
import time

from jupyterhub.services.auth import HubOAuthenticated, UserNotAllowed, check_scopes
from tornado import web

from trainhub.exceptions import TrainhubError


class Caller:
    def __init__(self, model: dict):
        self.model = model
        self.name = model["name"]
        self.kind = model.get("kind", "user")
        self.admin = bool(model.get("admin"))
        self.groups = tuple(model.get("groups") or ())
        self.scopes = set(model.get("scopes") or ())

    def may(self, scope: str, owner: str | None = None) -> bool:
        if owner and owner != self.name and self.may_all(scope):
            return True
        required = f"{scope}!user={owner}" if owner else scope
        return bool(check_scopes({required}, self.scopes))

    def may_all(self, scope: str) -> bool:
        """Holds ``scope`` for everyone: unfiltered, or a hub admin whose token carries it for themselves.

        Admins made after start-up (``trainhub token NAME --admin``, the admin page) hold only
        the ``!user`` form of the custom scopes, so the hub's admin flag lifts the filter.
        """
        if check_scopes({scope}, self.scopes):
            return True
        return self.admin and self.kind == "user" and bool(check_scopes({f"{scope}!user={self.name}"}, self.scopes))


class APIHandler(HubOAuthenticated, web.RequestHandler):
    """Base for JSON API handlers: async authentication, JSON errors, scope helpers."""

    def initialize(self, service=None):
        self.service = service

    @property
    def log(self):
        return self.service.log

    async def prepare(self):
        model = None
        try:
            model = await self.hub_auth.get_user(self, sync=False)
            if model:
                model = self.check_hub_user(model)
        except UserNotAllowed:
            model = None
        self._hub_auth_user_cache = model
        self._t0 = time.monotonic()

    def get_current_user(self):
        return getattr(self, "_hub_auth_user_cache", None)

    @property
    def caller(self) -> Caller:
        model = self.current_user
        if not model:
            raise web.HTTPError(401, "authentication required: send 'Authorization: token <JupyterHub API token>'")
        return Caller(model)

    def check_xsrf_cookie(self):
        # token-authenticated API calls carry no cookie; HubOAuth checks cookie-based ones
        if self.request.headers.get("Authorization"):
            return
        return super().check_xsrf_cookie()

    def json_body(self) -> dict:
        if not self.request.body:
            raise web.HTTPError(400, "a JSON request body is required")
        try:
            return json.loads(self.request.body)
        except ValueError as e:
            raise web.HTTPError(400, f"the request body is not valid JSON: {e}")

    def page(self, default_limit: int = 50) -> tuple[int, int]:
        """``(limit, offset)`` from the query, checked (limit 1-500, offset >= 0)."""
        try:
            limit = int(self.get_argument("limit", str(default_limit)))
            offset = int(self.get_argument("offset", "0"))
        except ValueError:
            raise web.HTTPError(400, "limit and offset must be whole numbers") from None
        if not 1 <= limit <= 500 or offset < 0:
            raise web.HTTPError(400, "limit must be 1-500 and offset 0 or more")
        return limit, offset

    def listing_owner(self, scope: str, what: str) -> str | None:
        """Whose items a listing shows: ``?user=`` for those holding ``scope`` for everyone, else the caller's own."""
        caller = self.caller
        user = self.get_argument("user", None)
        if caller.may_all(scope):
            return user
        if user not in (None, caller.name):
            raise web.HTTPError(403, f"you may only list your own {what}")
        if not caller.may(scope, caller.name):
            raise web.HTTPError(403, f"missing scope {scope}")
        return caller.name

    def write_json(self, obj, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = self._reason
        if isinstance(exc, TrainhubError):
            message = exc.message
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        elif status_code >= 500:
            message = "internal error in the trainhub service; details are in its log"
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": message}))

    def _handle_request_exception(self, e):
        if isinstance(e, TrainhubError):
            self.log.info("%s %s -> %s: %s", self.request.method, self.request.path, e.status_code, e.message)
            self.send_error(e.status_code, exc_info=(type(e), e, e.__traceback__))
            return
        return super()._handle_request_exception(e)
