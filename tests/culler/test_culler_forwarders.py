"""The storage extension's forwarders for the JupyterLab idle-GPU notification
(``trainhub/culler/warnings`` and ``trainhub/culler/keep``), the status bar's GPU line
(``trainhub/gpu/status``) and "get a GPU again" (``trainhub/culler/regain``), against a stand-in culler that
records what it receives. The real culler is exercised by tests/culler/test_culler_notification.py."""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import fsspec
import pytest

from storageserver import TOKEN, Backend, start_storage_server  # the storage tests' jupyter-server launcher

SERVER_TOKEN = "server-own-hub-token"


class FakeCuller:
    def __init__(self):
        self.calls: list[dict] = []
        self.warnings = [{"user": "alice", "server": "gpu", "devices": [0], "message": "idle", "action": "release",
                          "warned_at": "2026-11-21T20:00:00+00:00", "act_at": "2026-11-21T20:10:00+00:00",
                          "keep_url": "/services/trainhub-culler/api/keep"}]
        self.keep_status = 200
        self.gpus = {"user": "alice", "server": "gpu", "devices": [{"index": 0, "simulated": True, "utilization": 37.0}],
                     "clock": None, "can_keep": False}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _reply(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _record(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                outer.calls.append({"method": self.command, "path": self.path,
                                    "auth": self.headers.get("Authorization"), "body": body})

            def do_GET(self):
                self._record()
                if self.path == "/services/trainhub-culler/api/warnings":
                    self._reply(200, {"items": outer.warnings})
                elif self.path.startswith("/services/trainhub-culler/api/gpus?"):
                    self._reply(200, outer.gpus)
                elif self.path.startswith("/services/trainhub-culler/api/regain?"):
                    self._reply(200, {"request": None, "profiles": [{"slug": "gpu-1", "display_name": "1 GPU", "gpus": 1}]})
                else:
                    self._reply(404, {"status": 404, "message": "nope"})

            def do_DELETE(self):
                self._record()
                self._reply(200, {"message": "Request withdrawn: the server stays on the CPU."})

            def do_POST(self):
                self._record()
                if self.path.endswith("/api/regain"):
                    self._reply(202, {"state": "waiting", "profile": "gpu-2"})
                elif outer.keep_status != 200:
                    self._reply(outer.keep_status, {"status": outer.keep_status, "message": "you may only keep your own server"})
                else:
                    self._reply(200, {"user": "alice", "server": "gpu", "kept_at": "2026-11-21T20:01:00+00:00",
                                      "message": "Idle clock restarted: your GPUs are kept."})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/services/trainhub-culler"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()


def _server(tmp_path, extra_env, config):
    root = tmp_path / "root"
    (root / "users" / "alice").mkdir(parents=True)
    (root / "datasets").mkdir()
    backend = Backend("local", str(root), fsspec.filesystem("file"), {}, {})
    work = tmp_path / "work"
    (work / "config").mkdir(parents=True)
    # the fixture's launcher drops $JUPYTERHUB_API_TOKEN, so the server's token comes in through config
    (work / "config" / "jupyter_server_config.json").write_text(json.dumps({"StorageBrowser": config}))
    return start_storage_server(backend, work, extra_env=extra_env)


def _stop(server):
    server.proc.terminate()
    try:
        server.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.proc.kill()


@pytest.fixture(scope="module")
def culler():
    c = FakeCuller()
    yield c
    c.close()


@pytest.fixture(scope="module")
def server(culler, tmp_path_factory):
    s = _server(tmp_path_factory.mktemp("culler-fwd"), {"TRAINHUB_CULLER_URL": culler.url, "JUPYTERHUB_SERVER_NAME": "gpu"},
                {"api_token": SERVER_TOKEN})
    yield s
    _stop(s)


def test_warnings_forwarded_with_the_servers_token(server, culler):
    culler.calls.clear()
    r = server.get("culler/warnings")
    assert r.status_code == 200, r.text
    assert r.json() == {"items": culler.warnings}
    assert culler.calls == [{"method": "GET", "path": "/services/trainhub-culler/api/warnings",
                             "auth": f"token {SERVER_TOKEN}", "body": b""}]


def test_keep_posts_this_servers_name(server, culler):
    culler.calls.clear()
    r = server.request("POST", "culler/keep", data=b"{}")
    assert r.status_code == 200, r.text
    assert r.json()["message"] == "Idle clock restarted: your GPUs are kept."
    [call] = culler.calls
    assert call["method"] == "POST" and call["path"] == "/services/trainhub-culler/api/keep"
    assert call["auth"] == f"token {SERVER_TOKEN}"
    assert json.loads(call["body"]) == {"server": "gpu"}


def test_gpu_status_asks_for_this_server_only(server, culler):
    culler.calls.clear()
    r = server.get("gpu/status", server="other", user="bob")
    assert r.status_code == 200, r.text
    assert r.json() == culler.gpus
    assert culler.calls == [{"method": "GET", "path": "/services/trainhub-culler/api/gpus?server=gpu",
                             "auth": f"token {SERVER_TOKEN}", "body": b""}]


def test_get_a_gpu_again_is_for_this_server_only(server, culler):
    culler.calls.clear()
    r = server.request("POST", "culler/regain", data=json.dumps({"profile": "gpu-2", "server": "other", "user": "bob"}).encode())
    assert r.status_code == 202 and r.json()["state"] == "waiting", r.text
    r = server.get("culler/regain", server="other")
    assert r.status_code == 200 and r.json()["profiles"][0]["slug"] == "gpu-1", r.text
    r = server.request("DELETE", "culler/regain")
    assert r.status_code == 200 and "stays on the CPU" in r.json()["message"], r.text
    post, get, delete = culler.calls
    assert (post["method"], post["path"], json.loads(post["body"])) == (
        "POST", "/services/trainhub-culler/api/regain", {"server": "gpu", "profile": "gpu-2"})
    assert (get["method"], get["path"]) == ("GET", "/services/trainhub-culler/api/regain?server=gpu")
    assert (delete["method"], delete["path"]) == ("DELETE", "/services/trainhub-culler/api/regain?server=gpu")
    assert {c["auth"] for c in culler.calls} == {f"token {SERVER_TOKEN}"}
    culler.calls.clear()
    r = server.request("POST", "culler/regain", data=b'{"profile": 3}')
    assert r.status_code == 400 and "GPU profile slug" in r.json()["message"], r.text
    assert culler.calls == []


def test_culler_errors_come_back_as_json(server, culler):
    culler.keep_status = 403
    try:
        r = server.request("POST", "culler/keep", data=b"")
    finally:
        culler.keep_status = 200
    assert r.status_code == 403
    assert r.json() == {"status": 403, "message": "you may only keep your own server"}


def test_unauthenticated_is_refused(server, culler):
    culler.calls.clear()
    assert server.request("GET", "culler/warnings", token=None).status_code in (401, 403)
    assert server.request("POST", "culler/keep", token=None, data=b"").status_code in (401, 403)
    assert server.request("GET", "gpu/status", token=None).status_code in (401, 403)
    assert culler.calls == []


def test_no_culler_configured(tmp_path):
    s = _server(tmp_path, {}, {"api_token": SERVER_TOKEN})
    try:
        r = s.get("culler/warnings")
        assert r.status_code == 200 and r.json() == {"items": []}
        r = s.get("gpu/status")
        assert r.status_code == 200 and r.json() == {"devices": [], "clock": None, "can_keep": False, "culler": False}
        r = s.request("POST", "culler/keep", data=b"")
        assert r.status_code == 503 and "TRAINHUB_CULLER_URL" in r.json()["message"]
        r = s.get("culler/regain")
        assert r.status_code == 200 and r.json() == {"request": None, "profiles": [], "culler": False}
        r = s.request("POST", "culler/regain", data=b"")
        assert r.status_code == 503 and "TRAINHUB_CULLER_URL" in r.json()["message"]
    finally:
        _stop(s)


def test_unreachable_culler_is_a_json_502(tmp_path):
    s = _server(tmp_path, {"TRAINHUB_CULLER_URL": "http://127.0.0.1:9/services/trainhub-culler"}, {"api_token": SERVER_TOKEN})
    try:
        r = s.get("culler/warnings")
        assert r.status_code == 502 and "cannot reach the culler" in r.json()["message"]
    finally:
        _stop(s)


def test_a_move_announced_reaches_every_open_page_at_once(server):
    """The culler's POST trainhub/move (before it saves the kernels and restarts the server): every page subscribed to
    jupyter-server's event bus (JupyterLab's serviceManager.events) gets the event; GET keeps it for a page that comes
    later; a bad body is a JSON 400 and no event."""
    import websocket

    assert server.get("move").json() == {"move": None}
    ws = websocket.create_connection(server.url.replace("http://", "ws://", 1) + "/api/events/subscribe",
                                     header=[f"Authorization: token {TOKEN}"], timeout=30)
    try:
        bad = server.request("POST", "move", data=json.dumps({"action": "explode", "profile": "cpu"}).encode())
        assert bad.status_code == 400 and "release" in bad.json()["message"], bad.text
        body = {"action": "release", "profile": "cpu", "message": "trainhub is moving this server onto the CPU",
                "variables": True}
        r = server.request("POST", "move", data=json.dumps(body).encode())
        assert r.status_code == 200, r.text
        event = json.loads(ws.recv())
        while event.get("schema_id") != "https://schema.trainhub.dev/events/server-move":
            event = json.loads(ws.recv())  # (other events of the server, if any)
        assert {k: event[k] for k in body} == body and event["at"] > 0, event
    finally:
        ws.close()
    assert server.get("move").json()["move"]["profile"] == "cpu"
    assert server.request("POST", "move", token=None, data=json.dumps(body).encode()).status_code in (401, 403)
