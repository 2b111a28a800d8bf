"""The one handler base of the hub services' JSON APIs: who is calling, what they may do, JSON errors.

Every hub service (the jobs service with its sweeps, registry and usage plugins; the idle-GPU
culler) builds its handlers on :class:`APIHandler`:

* requests authenticate with a JupyterHub API token (``Authorization: token ...``) or the
  service's OAuth cookie (``HubOAuthenticated``), identified without blocking the event loop;
  a caller the hub knows but who lacks the service's access scopes gets 403 naming them;
* trainhub's ``custom:`` scopes are checked through :class:`Caller` (``!user=`` filters; a hub
  admin holds them for everyone);
* errors are mapped to HTTP once (``trainhub.httpapi.JSONErrors``): every error body is
  ``{"status", "message"}``, a 405 carries ``Allow``, a path no route serves is a JSON 404
  (:class:`NoRouteHandler`, the application's ``default_handler_class``);
* the application's access log is ``trainhub.httpapi.log_request`` (:func:`make_application`).

The jupyter-server extension's handlers (``trainhub.extensions.storage``) are not hub services:
they run inside each user's server under jupyter-server's own authentication and authorization
(``auth_resource`` + ``@authorized``), so they keep jupyter-server's ``APIHandler`` and share only
the error mapping (``JSONErrors``) from the core.
"""

from __future__ import annotations

import functools
import inspect
import json
import os

from jupyterhub.services.auth import HubOAuthenticated, UserNotAllowed, check_scopes
from tornado import web
from tornado.log import app_log

from trainhub.exceptions import InvalidRequest, NotFound, TooLarge
from trainhub.fmt import clip
from trainhub.httpapi import MAX_REQUEST_BYTES, JSONErrors, dump_json, log_request, parse_json


# carried by an admin's unnarrowed tokens and browser logins (JupyterHub's admin role; hub_config/scopes.py
# asks for it in the services' OAuth), never by a token its owner narrowed to a filtered custom scope
ADMIN_SCOPE = "admin-ui"


class Caller:
    """The authenticated caller (the hub's identity model) and the scopes it holds."""

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
        the ``!user`` form of the custom scopes, so the hub's admin flag lifts the filter, but only
        for a token that carries the admin's role (``admin-ui``: full tokens and browser logins): a
        token its owner narrowed (``custom:trainhub:jobs:read!user=admin`` alone) is held to it.
        """
        if check_scopes({scope}, self.scopes):
            return True
        return (self.admin and self.kind == "user" and ADMIN_SCOPE in self.scopes
                and bool(check_scopes({f"{scope}!user={self.name}"}, self.scopes)))


def _refusal_first(method):
    @functools.wraps(method)
    async def answer(self, *args, **kwargs):
        if self._refusal is not None:
            raise self._refusal
        result = method(self, *args, **kwargs)
        return (await result) if inspect.isawaitable(result) else result

    answer.refusal_first = True
    return answer


@web.stream_request_body
class APIHandler(JSONErrors, HubOAuthenticated, web.RequestHandler):
    """Base for the JSON API handlers of every hub service (see the module docstring).

    Routes pass ``{"service": <the service object>}``; a ``hub_auth`` in the application's
    settings replaces the one HubOAuthenticated builds from the environment. Bodies are streamed in,
    so one past :data:`~trainhub.httpapi.MAX_REQUEST_BYTES` is never held: it is dropped as it
    arrives and refused (413, JSON).
    """

    internal_error_message = "internal error in the trainhub service; details are in its log"

    def initialize(self, service=None):
        self.service = service
        length = self.request.headers.get("Content-Length", "0")
        # past the bound the body is read in pieces and dropped (json_body answers 413 once it has all
        # arrived: answering earlier closes the connection under a proxy still sending, a 503 to the caller)
        self._body = None if length.isdigit() and int(length) > MAX_REQUEST_BYTES else bytearray()
        hub_auth = self.settings.get("hub_auth")
        if hub_auth is not None:
            self.hub_auth = hub_auth

    @property
    def log(self):
        return getattr(self.service, "log", None) or app_log

    _refusal: BaseException | None = None

    async def prepare(self):
        try:
            self.check_method()  # a method the route lacks is a 405 with Allow, whoever asks
            await self._identify()
        except Exception as e:
            # answered once the body has arrived (each handler method raises it first, see __init_subclass__):
            # a streaming handler that answers in prepare() has tornado close the connection after the answer,
            # under a proxy that keeps it alive and sends the next request on it (a 503 for that caller)
            self._refusal = e

    def __init_subclass__(cls, **kwargs):
        """Every method a handler defines answers the refusal prepare() deferred before doing anything."""
        super().__init_subclass__(**kwargs)
        for name in (m.lower() for m in cls.SUPPORTED_METHODS):
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "refusal_first", False):
                setattr(cls, name, _refusal_first(method))

    async def _identify(self):
        # identify the caller without blocking the event loop (get_current_user would)
        model = await self.hub_auth.get_user(self, sync=False)
        if model:
            try:
                model = self.check_hub_user(model)
            except UserNotAllowed:
                self._hub_auth_user_cache = None
                raise web.HTTPError(403, f"{model.get('name')} lacks the scopes {sorted(self.hub_scopes or ())}") from None
        self._hub_auth_user_cache = model
        self.current_user = model

    def data_received(self, chunk: bytes) -> None:
        if self._body is None:  # past the bound: the rest is read and dropped, json_body answers 413
            return
        self._body += chunk
        if len(self._body) > MAX_REQUEST_BYTES:
            self._body = None

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

    def json_body(self, required: bool = True) -> dict:
        """The parsed JSON body, an object (400 when it is not a JSON object; when empty: 400 if ``required``,
        else ``{}``): every body of these APIs is one, so no handler meets a list or a number."""
        if self._body is None:
            length = self.request.headers.get("Content-Length", "")
            size = f"is {int(length):,} bytes" if length.isdigit() else "passes the bound"
            raise TooLarge(f"the request body {size}; at most {MAX_REQUEST_BYTES:,} bytes are accepted")
        if not self._body:
            if not required:
                return {}
            raise web.HTTPError(400, "a JSON request body is required")
        body = parse_json(bytes(self._body))
        if not isinstance(body, dict):
            raise InvalidRequest("the request body must be a JSON object ({...})")
        return body

    def check_body(self, body: dict, schema: str) -> None:
        """Refuse what the published document's ``schema`` does not allow (``trainhub.services.contract``)."""
        contract = getattr(self.service, "contract", None)
        if contract is not None:
            contract.check(body, schema)

    def states_arg(self, allowed, what: str = "states") -> list[str]:
        """``?state=a&state=b`` (or ``state=a,b``), each one of ``allowed``; an empty value is a 400 too."""
        states = [s for v in self.get_arguments("state") for s in v.split(",")]
        bad = [s for s in states if s not in allowed]
        if bad:
            raise InvalidRequest(f"unknown state(s) {[clip(b, 40) for b in bad[:5]]}; {what} are {list(allowed)}")
        return states

    def page(self, default_limit: int = 50) -> tuple[int, int]:
        """``(limit, offset)`` from the query, checked (limit 1-500, offset >= 0)."""
        try:
            limit = int(self.get_argument("limit", str(default_limit)))
            offset = int(self.get_argument("offset", "0"))
        except ValueError:
            raise web.HTTPError(400, "limit and offset must be whole numbers") from None
        if not 1 <= limit <= 500 or not 0 <= offset < 2**63:
            raise web.HTTPError(400, "limit must be 1-500 and offset 0 or more (below 2**63)")
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
        self.finish(dump_json(obj))


class NoRouteHandler(JSONErrors, web.RequestHandler):
    """Any path no route serves: a JSON 404 like every other error; the service's own root says it runs
    (JupyterHub asks it while starting, so that its check is not a warning in every log)."""

    def prepare(self):
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
        if prefix and self.request.path == prefix and self.request.method in ("GET", "HEAD"):
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"service": os.environ.get("JUPYTERHUB_SERVICE_NAME", ""), "running": True}))
            return
        raise NotFound(f"nothing is served at {self.request.path}")


def make_application(handlers: list, **settings) -> web.Application:
    """A hub service's tornado application: its routes, the shared access log, JSON 404s."""
    settings.setdefault("log_function", log_request)
    settings.setdefault("default_handler_class", NoRouteHandler)
    return web.Application(handlers, **settings)
