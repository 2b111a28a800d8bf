"""The hub services' shared HTTP layer: the access log (trainhub.httpapi.log_request), the JSON
error mapping (JSONErrors) and the handler base (trainhub.services.api.APIHandler).

Levels and scrubbing are tables over ``log_request`` with the request's timing set exactly (no
clock involved); the wiring is checked on real tornado servers on loopback: a hub service's
application logs a slow request at info with its token scrubbed, and every error is JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest
from tornado import httputil, web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer

from trainhub.exceptions import NotFound, QuotaExceeded
from trainhub.httpapi import log_request, scrub_headers, scrub_uri
from trainhub.services.api import APIHandler, make_application


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    @property
    def text(self) -> str:
        return "\n".join(r.getMessage() for r in self.records)


@pytest.fixture
def access_log(monkeypatch):
    """What tornado's access logger (the one log_request writes to) receives, at every level, even if
    an earlier test's logging setup (JupyterHub's MockHub re-parents the tornado loggers) changed it."""
    from tornado.log import access_log as logger

    records = _Records()
    monkeypatch.setattr(logger, "disabled", False)
    monkeypatch.setattr(logging.root.manager, "disable", logging.NOTSET)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(records)
    yield records
    logger.removeHandler(records)
    logger.setLevel(level)


@pytest.mark.parametrize(
    "uri, logged",
    [
        ("/api/jobs?limit=5", "/api/jobs?limit=5"),
        ("/api/jobs?token=abc123&limit=5", "/api/jobs?token=[secret]&limit=5"),
        ("/x?_xsrf=2|aa|bb&state=s1&code=c0de&next=/y", "/x?_xsrf=[secret]&state=[secret]&code=[secret]&next=/y"),
        ("/x?api_key=k&AuthToken=t&user=alice", "/x?api_key=[secret]&AuthToken=[secret]&user=alice"),
        ("/x?token", "/x?token"),  # no value, nothing to hide
        ("/hub/api/authorizations/token/s3cr3t", "/hub/api/authorizations/token/[secret]"),
    ],
)
def test_scrub_uri(uri, logged):
    assert scrub_uri(uri) == logged


def test_scrub_headers():
    out = scrub_headers({"Authorization": "token abc123", "Cookie": "a=1; jupyterhub-session-id=zz", "Accept": "*/*"})
    assert out == {"Authorization": "token [secret]", "Cookie": "a=[secret]; jupyterhub-session-id=[secret]", "Accept": "*/*"}
    assert scrub_headers({"Authorization": "abc123"})["Authorization"] == "[secret]"


class _Connection:
    """The transport a RequestHandler needs to exist (nothing is sent: log_request only reads)."""

    def set_close_callback(self, callback):
        pass


def _handler(uri: str, status: int, seconds: float, headers=None, user=None) -> web.RequestHandler:
    request = httputil.HTTPServerRequest(start_line=httputil.RequestStartLine("GET", uri, "HTTP/1.1"),
                                         headers=httputil.HTTPHeaders({"Host": "127.0.0.1", **(headers or {})}),
                                         connection=_Connection())
    request._start_time, request._finish_time = 1000.0, 1000.0 + seconds  # request_time() == seconds
    handler = web.RequestHandler(web.Application(), request)
    handler.set_status(status)
    if user is not None:
        handler.current_user = user
    return handler


@pytest.mark.parametrize(
    "status, seconds, level",
    [
        (200, 0.05, logging.DEBUG),  # panels poll every second: quiet
        (201, 0.999, logging.DEBUG),
        (200, 1.0, logging.INFO),  # slow: at info even though it succeeded
        (204, 7.5, logging.INFO),
        (302, 0.01, logging.DEBUG),
        (404, 0.01, logging.WARNING),
        (403, 3.0, logging.WARNING),
        (500, 0.01, logging.ERROR),
        (503, 2.0, logging.ERROR),
    ],
)
def test_levels(access_log, status, seconds, level):
    log_request(_handler("/services/trainhub/api/jobs?token=t0k3n", status, seconds, user={"name": "alice"}))
    [record] = [r for r in access_log.records if str(status) in r.getMessage()]
    assert record.levelno == level
    assert record.getMessage() == (f"{status} GET /services/trainhub/api/jobs?token=[secret] (alice@None) "
                                   f"{1000 * seconds:.2f}ms")


def test_server_errors_log_scrubbed_headers(access_log):
    log_request(_handler("/x?_xsrf=abc", 500, 0.01, headers={"Authorization": "token t0k3n", "Cookie": "s=c00k1e"}))
    text = "\n".join(r.getMessage() for r in access_log.records)
    assert '"Authorization": "token [secret]"' in text and '"Cookie": "s=[secret]"' in text
    assert "t0k3n" not in text and "c00k1e" not in text and "abc" not in text


def test_redirect_target_is_scrubbed(access_log):
    handler = _handler("/x", 302, 0.01)
    handler.set_header("Location", "/hub/api/oauth2/authorize?client_id=c&state=st4te")
    log_request(handler)
    [msg] = [r.getMessage() for r in access_log.records]
    assert msg.startswith("302 GET /x -> /hub/api/oauth2/authorize?client_id=c&state=[secret] ") and "st4te" not in msg


# -- a real service application on loopback ---------------------------------------------------------

class _Auth:
    """Stands in for the hub's token check (a unit test; e2e tests use the real hub)."""

    access_scopes = {"access:services!service=test"}

    async def get_user(self, handler, sync=False):
        header = handler.request.headers.get("Authorization", "")
        token = header.split(" ", 1)[1] if " " in header else handler.get_argument("token", "")
        return {"alice-token": {"kind": "user", "name": "alice", "scopes": ["access:services!service=test"]},
                "eve-token": {"kind": "user", "name": "eve", "scopes": []}}.get(token)

    def check_scopes(self, required, model):
        from jupyterhub.services.auth import check_scopes

        return check_scopes(required, set(model["scopes"]))


class SlowHandler(APIHandler):
    async def get(self):
        await asyncio.sleep(1.1)  # the slow request under test, not a wait for a condition
        self.write_json({"user": self.caller.name})


class FailingHandler(APIHandler):
    async def get(self, what):
        if what == "quota":
            raise QuotaExceeded("GPU quota exceeded: alice holds 2 of 2 GPUs and asked for 1 more.")
        if what == "missing":
            raise NotFound("job j-000009 not found")
        if what == "http":
            raise web.HTTPError(409, "100% busy")
        raise RuntimeError("secret internals")


class EchoHandler(APIHandler):
    async def post(self):
        self.write_json({"user": self.caller.name, "body": self.json_body()})


@pytest.fixture
async def service():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    app = make_application([(r"/slow", SlowHandler), (r"/fail/(\w+)", FailingHandler), (r"/echo", EchoHandler)],
                           hub_auth=_Auth())
    server = HTTPServer(app)
    server.listen(port, "127.0.0.1")

    async def call(path, token=None):
        headers = {"Authorization": f"token {token}"} if token else {}
        return await AsyncHTTPClient().fetch(f"http://127.0.0.1:{port}{path}", headers=headers, raise_error=False,
                                             follow_redirects=False)
    call.port = port
    yield call
    server.stop()


async def test_slow_request_logged_at_info_with_token_scrubbed(service, access_log):
    r = await service("/slow?token=alice-token&n=1")
    assert r.code == 200 and json.loads(r.body) == {"user": "alice"}
    [record] = access_log.records
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith("200 GET /slow?token=[secret]&n=1 (alice@127.0.0.1) ")
    assert "alice-token" not in access_log.text


@pytest.mark.parametrize(
    "path, token, status, message",
    [
        ("/fail/quota", "alice-token", 403, "GPU quota exceeded: alice holds 2 of 2 GPUs and asked for 1 more."),
        ("/fail/missing", "alice-token", 404, "job j-000009 not found"),
        ("/fail/http", "alice-token", 409, "100% busy"),
        ("/fail/boom", "alice-token", 500, "internal error in the trainhub service; details are in its log"),
        ("/fail/quota", "eve-token", 403, "eve lacks the scopes ['access:services!service=test']"),
        ("/nowhere", None, 404, "nothing is served at /nowhere"),
    ],
)
async def test_every_error_is_json_status_and_message(service, access_log, path, token, status, message):
    r = await service(path, token)
    assert r.code == status and r.headers["Content-Type"] == "application/json"
    assert json.loads(r.body) == {"status": status, "message": message}
    [record] = [x for x in access_log.records if x.getMessage().startswith(str(status))]
    assert record.levelno == (logging.ERROR if status >= 500 else logging.WARNING)
    assert "secret internals" not in r.body.decode()


async def test_the_service_root_says_it_runs(service, monkeypatch):
    """JupyterHub asks a service's root while starting: a 200, not a 404 warning in every start's log."""
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/services/test/")
    monkeypatch.setenv("JUPYTERHUB_SERVICE_NAME", "test")
    r = await service("/services/test/")
    assert r.code == 200 and json.loads(r.body) == {"service": "test", "running": True}
    assert (await service("/services/test/elsewhere")).code == 404


@pytest.mark.parametrize("body, message", [
    (b'{"gpus": 1e999}', "too large for a number"),
    (b'{"gpus": NaN}', "not a number JSON allows"),
    (b'{"x": -Infinity}', "not a number JSON allows"),
    (b"[" * 40 + b"]" * 40, "nests deeper than 32 levels"),
    (b"[" * 100000 + b"]" * 100000, "nests deeper than 32 levels"),
    (b"{not json", "not valid JSON"),
])
def test_request_json_is_strict_and_bounded(body, message):
    from trainhub.exceptions import InvalidRequest
    from trainhub.httpapi import parse_json

    with pytest.raises(InvalidRequest, match=message):
        parse_json(body)


def test_request_json_within_bounds_and_responses_never_carry_nan():
    from trainhub.httpapi import dump_json, parse_json

    assert parse_json(b'{"a": [[[1.5e300]]], "b": null}') == {"a": [[[1.5e300]]], "b": None}
    with pytest.raises(ValueError):
        dump_json({"x": float("inf")})


def _exchange(port: int, requests_: list[tuple[str, str, bytes | None, str | None]]) -> list[tuple[int, dict, dict]]:
    """Requests sent one after another on one keep-alive connection (what a proxy does); each answer's
    status, headers and JSON body. A connection the server closed without saying so (``Connection: close``)
    fails the next request."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    out = []
    try:
        for method, path, body, token in requests_:
            headers = {"Content-Type": "application/json", **({"Authorization": f"token {token}"} if token else {})}
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            out.append((r.status, dict(r.getheaders()), json.loads(r.read())))
    finally:
        conn.close()
    return out


async def test_a_missing_method_is_a_json_405_with_allow_and_the_connection_lives_on(service):
    """RFC 9110: a 405 names the route's methods in Allow: for a method tornado knows (PATCH), one it does not
    (TRACE), with a body or without; a refusal waits for the body, so a proxy's connection is not closed under it."""
    body = b'{"x": 1}' * 1000
    answers = await asyncio.to_thread(_exchange, service.port, [
        ("PATCH", "/echo", body, "alice-token"),
        ("TRACE", "/echo", None, None),
        ("GET", "/echo", None, "eve-token"),
        ("POST", "/echo", body[:8], "eve-token"),  # 403 (no access scope), answered after the body
        ("POST", "/echo", b"[1, 2]", "alice-token"),
        ("DELETE", "/slow", body, None),
        ("POST", "/echo", b'{"x": 1}', "alice-token"),
    ])
    statuses = [a[0] for a in answers]
    assert statuses == [405, 405, 405, 403, 400, 405, 200]
    for status, headers, doc in answers[:-1]:
        assert headers["Content-Type"] == "application/json" and doc["status"] == status
    assert [a[1].get("Allow") for a in answers] == ["POST", "POST", "POST", None, None, "GET", None]
    # a method tornado does not know is refused before the body is read: the answer says the connection ends
    assert [a[1].get("Connection") for a in answers] == [None, "close", None, None, None, None, None]
    assert answers[0][2]["message"] == "PATCH is not allowed here; this route answers POST"
    assert answers[4][2]["message"] == "the request body must be a JSON object ({...})"
    assert answers[-1][2] == {"user": "alice", "body": {"x": 1}}


@pytest.mark.parametrize("text, prefix, value", [
    ("j-000007", "j-", 7), ("7", "j-", 7), (str(2**63 - 1), "", 2**63 - 1),
    (str(2**63), "", None), ("9" * 40, "s-", None), ("s-", "s-", None), ("\u0663", "", None), ("\u00b2", "", None),
    ("-1", "", None), ("1e3", "", None),
])
def test_parse_id_never_names_a_row_sqlite_cannot_hold(text, prefix, value):
    from trainhub.httpapi import parse_id

    assert parse_id(text, prefix) == value
