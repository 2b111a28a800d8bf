"""What every trainhub HTTP API shares, whatever serves it: JSON errors and the access log.

* :class:`JSONErrors`: a tornado ``RequestHandler`` mixin mapping errors to HTTP once: a
  :class:`~trainhub.exceptions.TrainhubError` answers its ``status_code`` with its message,
  ``web.HTTPError`` its status and message, anything else 500 with a fixed text (details go to
  the log only). Every error body is ``{"status": <code>, "message": <text>}``. The hub services'
  handler base (``trainhub.services.api.APIHandler``) and the jupyter-server extension's handlers
  both use it.
* :func:`log_request`: the access log in the manner of JupyterHub's ``log.py``, given to every hub
  service's ``web.Application`` as ``log_function``: 2xx/3xx at debug (notebook panels poll every
  second), any request slower than :data:`SLOW_REQUEST` seconds at info even when it succeeded,
  4xx at warning, 5xx at error (with the request headers); credentials never reach the log
  (query parameters such as ``token``, ``_xsrf``, ``code``, ``state``; the Authorization header
  and cookie values).
"""

from __future__ import annotations

import json
import logging
from http.cookies import CookieError, SimpleCookie
from urllib.parse import urlsplit, urlunsplit

from tornado import web
from tornado.log import access_log, app_log

from trainhub.exceptions import TrainhubError

#: Seconds after which a request is logged at info even when it succeeded.
SLOW_REQUEST = 1.0

#: A query parameter whose name *contains* one of these is logged as ``name=[secret]`` (JupyterHub's list).
SCRUB_PARAM_KEYS = ("token", "auth", "key", "code", "state", "_xsrf")


def scrub_uri(uri: str) -> str:
    """``uri`` with the values of credential-like query parameters replaced by ``[secret]``."""
    if "/api/authorizations/cookie/" in uri or "/api/authorizations/token/" in uri:
        uri = uri.rsplit("/", 1)[0] + "/[secret]"
    parts = urlsplit(uri)
    if not parts.query:
        return uri
    params = parts.query.split("&")
    changed = False
    for i, param in enumerate(params):
        key = param.split("=", 1)[0]
        if "=" in param and any(s in key.lower() for s in SCRUB_PARAM_KEYS):
            params[i] = f"{key}=[secret]"
            changed = True
    return urlunsplit(parts._replace(query="&".join(params))) if changed else uri


def scrub_headers(headers) -> dict:
    """Request headers for the log: the Authorization value and cookie values hidden."""
    out = dict(headers)
    if "Authorization" in out:
        scheme = out["Authorization"].split(" ", 1)[0] if " " in out["Authorization"] else ""
        out["Authorization"] = f"{scheme} [secret]".strip()
    if "Cookie" in out:
        try:
            names = list(SimpleCookie(out["Cookie"]).keys())
        except CookieError as e:
            out["Cookie"] = f"invalid cookie header: {e}"
        else:
            out["Cookie"] = "; ".join(f"{name}=[secret]" for name in names)
    return out


def _username(handler: web.RequestHandler) -> str:
    # only what the request already resolved: get_current_user may call the hub
    user = getattr(handler, "_current_user", None)
    if isinstance(user, dict):
        return str(user.get("name", ""))
    return "" if user is None else str(getattr(user, "name", user))


def log_request(handler: web.RequestHandler) -> None:
    """tornado ``log_function``: one access-log line per request (see the module docstring)."""
    status = handler.get_status()
    request = handler.request
    seconds = request.request_time()
    if status >= 500:
        level = logging.ERROR
    elif status >= 400:
        level = logging.WARNING
    elif seconds >= SLOW_REQUEST:
        level = logging.INFO
    else:
        level = logging.DEBUG
    if not access_log.isEnabledFor(level):
        return
    if status >= 500 and status not in (502, 503):
        access_log.log(level, json.dumps(scrub_headers(request.headers), indent=2))
    location = ""
    if status in (301, 302, 303, 307, 308):
        target = handler._headers.get("Location")
        if target:
            location = f" -> {scrub_uri(target)}"
    access_log.log(level, "%d %s %s%s (%s@%s) %.2fms", status, request.method, scrub_uri(request.uri), location,
                   _username(handler), request.remote_ip, 1000.0 * seconds)


def error_message(status_code: int, exc: BaseException | None, default: str, internal: str) -> str:
    """The user-facing text of an error answer (``internal`` for unexpected 5xx)."""
    if isinstance(exc, TrainhubError):
        return exc.message
    if isinstance(exc, web.HTTPError) and exc.get_message():
        return exc.get_message()
    if status_code >= 500:
        return internal
    return default


def route_methods(cls: type[web.RequestHandler]) -> list[str]:
    """The methods a handler class answers: those it implements (tornado's own stubs answer 405)."""
    stub = web.RequestHandler._unimplemented_method
    return [m for m in cls.SUPPORTED_METHODS if getattr(cls, m.lower(), stub) is not stub]


def allowed_methods(handler: web.RequestHandler) -> list[str]:
    """What a 405 from ``handler`` names in ``Allow``."""
    return route_methods(type(handler))


class JSONErrors:
    """Mixin for tornado handlers: errors mapped to HTTP once, every error body JSON ``{"status", "message"}``;
    a 405 names the route's methods in ``Allow`` (RFC 9110 §15.5.6), whoever raised it (tornado included)."""

    #: the message of an unexpected 5xx (what failed and where to look; never the exception text)
    internal_error_message = "internal error; details are in the server's log"

    def check_method(self) -> None:
        """405 for a method the route does not have, before anything else (authentication included)."""
        if self.request.method not in allowed_methods(self):
            raise web.HTTPError(405)

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = error_message(status_code, exc, self._reason, self.internal_error_message)
        if status_code == 405:
            allow = allowed_methods(self)
            self.set_header("Allow", ", ".join(allow))
            if message == self._reason:
                message = f"{self.request.method} is not allowed here; this route answers {', '.join(allow) or 'nothing'}"
        body = getattr(self.request, "_body_future", None)
        if body is not None and not body.done():
            # answered before a streamed body was read (tornado's own 405 for a method it does not know): tornado
            # closes the connection after this answer, so say so, or a proxy reuses it for the next request
            self.set_header("Connection", "close")
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": message}))

    def _handle_request_exception(self, e):
        if isinstance(e, TrainhubError):
            # an expected refusal: one info line, no traceback (log_request adds the access line)
            log = getattr(self, "log", None) or app_log
            log.info("%s %s -> %s: %s", self.request.method, self.request.path, e.status_code, e.message)
            self.send_error(e.status_code, exc_info=(type(e), e, e.__traceback__))
            return
        return super()._handle_request_exception(e)


#: how deeply a request's JSON may nest (a job spec nests 3 levels; a sweep's space 4)
MAX_REQUEST_BYTES = 8 << 20  # a JSON request body (a job's script may be 5 MB); larger ones get 413
MAX_SERVER_BODY_BYTES = 64 << 20  # what a service reads at all: a refused body up to this is read (in pieces)
# and dropped, so the caller gets its 413 through the proxy; past it the connection is closed
MAX_JSON_DEPTH = 32


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is too large for a number")
    return value


def _depth(value, limit: int) -> int:
    """How deeply ``value`` nests (iteratively: a deep value must not exhaust the stack here either)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_json(raw: bytes | str, max_depth: int = MAX_JSON_DEPTH):
    """A request body as JSON, or :class:`~trainhub.exceptions.InvalidRequest` (400) saying what is wrong:
    not JSON, NaN/Infinity or a number too large for a finite float, or nested deeper than ``max_depth``.
    Nothing that could not be written back as valid JSON is ever accepted."""
    from trainhub.exceptions import InvalidRequest, TooLarge

    if len(raw) > MAX_REQUEST_BYTES:
        raise TooLarge(f"the request body is {len(raw):,} bytes; at most {MAX_REQUEST_BYTES:,} are accepted")
    try:
        value = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise InvalidRequest(f"the request body nests deeper than {max_depth} levels") from None
    except ValueError as e:
        raise InvalidRequest(f"the request body is not valid JSON: {e}") from None
    if _depth(value, max_depth) > max_depth:
        raise InvalidRequest(f"the request body nests deeper than {max_depth} levels")
    return value


#: the largest id a path or query may name (SQLite's INTEGER is 64-bit signed)
MAX_ID = 2**63 - 1


def parse_id(text: str, prefix: str = "") -> int | None:
    """A row id from a path or query (``"j-000007"``, ``"7"``), or None when it names no row: ASCII digits only
    (``\\d`` also matches other scripts' digits) and at most :data:`MAX_ID`, so a lookup never overflows."""
    text = str(text)
    if prefix and text.startswith(prefix):
        text = text[len(prefix):]
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    value = int(text)
    return value if value <= MAX_ID else None


def dump_json(obj) -> str:
    """A response body: strict JSON (a non-finite number is a bug to see, never an invalid document)."""
    return json.dumps(obj, default=str, allow_nan=False)
