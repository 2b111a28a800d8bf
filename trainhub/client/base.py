"""The client's plumbing: connection, retries, errors, the one wait-for-an-end loop, id checks.

Every API area (:mod:`.jobs`, :mod:`.sweeps`, :mod:`.registry`, :mod:`.usage`) is a mixin over
:class:`ClientBase`; :class:`trainhub.client.TrainhubClient` combines them.
"""

from __future__ import annotations

import os
from typing import Callable

import requests

from trainhub.backoff import Backoff, poll

ENV_URL = "TRAINHUB_API_URL"
ENV_TOKEN = "JUPYTERHUB_API_TOKEN"


class TrainhubAPIError(Exception):
    """The API answered with an error: ``status`` (HTTP code, 0 = unreachable) and the
    server's ``message`` (the text meant for the user, e.g. quota numbers)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{message} (HTTP {status})" if status else message)
        self.status = status
        self.message = message


class TrainhubConfigError(ValueError):
    """No API URL or token: not in a trainhub notebook/terminal and none given."""


def check_ref(value, kind: str) -> str:
    """One path segment of the API (a job id, sweep id or registry name): stripped, not empty, no ``/``;
    ValueError ``not a <kind>: ...`` otherwise."""
    text = str(value).strip()
    if not text or "/" in text:
        raise ValueError(f"not a {kind}: {value!r}")
    return text


class ClientBase:
    """Client for ``$TRAINHUB_API_URL`` authenticated with a JupyterHub API token.

    ``url``/``token`` default to ``$TRAINHUB_API_URL`` / ``$JUPYTERHUB_API_TOKEN`` (set in
    platform notebooks and terminals). ``timeout`` is per request in seconds; ``retries`` is how
    many times a connection failure is retried (0 = never), waiting ``backoff``, 2x, 4x... seconds
    (at most 5 s).
    """

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30,
                 retries: int = 3, backoff: float = 0.5, session: requests.Session | None = None):
        url = url or os.environ.get(ENV_URL, "")
        token = token or os.environ.get(ENV_TOKEN, "")
        missing = [name for name, v in ((ENV_URL, url), (ENV_TOKEN, token)) if not v]
        if missing:
            raise TrainhubConfigError(
                "not in a trainhub notebook/terminal: pass --url/--token or set "
                + " and ".join(f"${m}" for m in missing)
                + f" (e.g. {ENV_URL}=http://127.0.0.1:8000/services/trainhub/api, "
                "a token from `trainhub token NAME`)"
            )
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = max(0, int(retries))
        self.backoff = backoff
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"token {token}"
        self.session.headers.setdefault("Accept", "application/json")

    def __repr__(self):
        return f"{type(self).__name__}({self.url!r})"

    # -- plumbing -----------------------------------------------------------------------------
    def request(self, method: str, path: str, *, params=None, json=None, stream: bool = False,
                timeout=None, data=None, headers=None) -> requests.Response:
        """One API call; returns the response (2xx) or raises :class:`TrainhubAPIError`.

        Connection failures are retried ``retries`` times with backoff; a POST only when the
        connection could not be opened, so a job is never submitted twice. ``data``: a body other than JSON (a file
        object is sent from its current position, and from there again on a retry)."""
        start = data.tell() if hasattr(data, "seek") else None
        url = self.url + path
        idempotent = method.upper() in ("GET", "HEAD", "DELETE", "PUT")
        pause = Backoff(f"{method} {path}", start=self.backoff, factor=2.0, cap=5.0)
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            if start is not None:
                data.seek(start)
            try:
                r = self.session.request(method, url, params=params, json=json, stream=stream,
                                         timeout=timeout or self.timeout, data=data, headers=headers)
            except requests.ConnectionError as e:
                # a POST may be retried only if nothing reached the server
                if last or not (idempotent or _not_connected(e)):
                    raise TrainhubAPIError(0, f"cannot reach the trainhub API at {self.url}: {_short(e)}") from None
            except requests.Timeout:
                if last or not idempotent:
                    raise TrainhubAPIError(0, f"the trainhub API at {self.url} did not answer within "
                                              f"{timeout or self.timeout}s ({method} {path})") from None
            else:
                if r.status_code in (502, 503, 504) and idempotent and not last:
                    r.close()  # the proxy has no service behind it right now (restarting)
                elif r.status_code >= 400:
                    raise _api_error(r)
                else:
                    return r
            pause.sleep()
        raise AssertionError("unreachable")

    def _json(self, method, path, **kw):
        r = self.request(method, path, **kw)
        return r.json() if r.content else None

    def _wait_until_terminal(self, fetch: Callable[[], dict], is_terminal: Callable[[dict], bool], what: str, *,
                             poll_interval: float, callback: Callable[[dict], None] | None, timeout: float | None) -> dict:
        """The one wait-for-an-end loop: ``fetch()`` every ``poll_interval`` seconds until ``is_terminal``;
        ``callback(obj)`` after every fetch; :class:`~trainhub.backoff.WaitTimeout` after ``timeout`` s."""

        def fetch_and_report():
            obj = fetch()
            if callback:
                callback(obj)
            return obj

        return poll(fetch_and_report, is_terminal, what=what, describe=lambda obj: f"still {obj.get('state')}",
                    start=poll_interval, factor=1.0, cap=None, timeout=timeout)

    def whoami(self) -> str | None:
        """The token's user name: ``$JUPYTERHUB_USER``, else asked from the hub API next to the
        trainhub API (``.../services/trainhub/api`` -> ``.../hub/api/user``); None if unknown."""
        if os.environ.get("JUPYTERHUB_USER"):
            return os.environ["JUPYTERHUB_USER"]
        hub_api = os.environ.get("JUPYTERHUB_API_URL")
        if not hub_api and "/services/" in self.url:
            hub_api = self.url.split("/services/", 1)[0] + "/hub/api"
        if not hub_api:
            return None
        try:
            r = self.session.get(hub_api.rstrip("/") + "/user", timeout=self.timeout)
            return r.json().get("name") if r.ok else None
        except (requests.RequestException, ValueError):
            return None


def page_params(state=None, *, user: str | None = None, limit: int = 50, offset: int = 0) -> dict:
    """Query parameters of a listing: ``state`` is a state or a list of states."""
    params = {"limit": limit, "offset": offset}
    if state:
        params["state"] = state if isinstance(state, str) else ",".join(state)
    if user:
        params["user"] = user
    return params


def _api_error(r: requests.Response) -> TrainhubAPIError:
    message = ""
    try:
        body = r.json()
        if isinstance(body, dict):
            message = str(body.get("message") or "")
    except ValueError:
        pass
    if not message and r.status_code in (502, 503, 504):
        message = f"the trainhub jobs service behind {r.url.split('/jobs')[0]} is not answering ({r.reason}): is it running?"
    if not message:
        text = (r.text or "").strip()
        message = text[:300] if text and not text.lstrip().startswith("<") else (r.reason or "error")
    if r.status_code == 403 and "scope" in message.lower():
        message += " (the token lacks the trainhub jobs scopes)"
    elif r.status_code == 401:
        message += " (the token is missing, expired or not a JupyterHub API token)"
    return TrainhubAPIError(r.status_code, message)


def _not_connected(e: requests.ConnectionError) -> bool:
    """True when the connection was never opened (refused, DNS, connect timeout)."""
    from urllib3.exceptions import ConnectTimeoutError, MaxRetryError

    reason = e.args[0] if e.args else None
    if isinstance(reason, MaxRetryError):
        reason = reason.reason
    return isinstance(reason, ConnectTimeoutError)  # NewConnectionError is one


def _short(e: Exception) -> str:
    from urllib3.exceptions import MaxRetryError

    reason = e.args[0] if e.args else e
    if isinstance(reason, MaxRetryError) and reason.reason is not None:
        reason = reason.reason
    text = str(reason)
    return text.split(": ", 1)[-1] if "Failed to establish" in text else text
