"""A JupyterHub user as the node tests play one, through the chart's proxy only: log in with the login form, make a
token with the session (the hub's API, its XSRF check included), start and stop a server through the REST API,
read the spawn page, and run code in a kernel of the server over its websocket."""

from __future__ import annotations

import json
import time
import uuid

import requests
from waiting import wait_for


class HubUser:
    def __init__(self, base_url: str, name: str, password: str = "any password"):
        self.base = base_url.rstrip("/")
        self.name = name
        self.session = requests.Session()
        login = self.session.get(f"{self.base}/hub/login", timeout=30)
        login.raise_for_status()
        resp = self.session.post(f"{self.base}/hub/login", allow_redirects=False, timeout=30,
                                 data={"username": name, "password": password, "_xsrf": self.session.cookies.get("_xsrf")})
        assert resp.status_code == 302, f"login of {name}: {resp.status_code} {resp.text[:300]}"
        # a token of their own, made with the logged-in session (cookie + XSRF header), for the REST API
        resp = self.session.post(f"{self.base}/hub/api/users/{name}/tokens", timeout=30,
                                 json={"note": "node tests", "expires_in": 7200},
                                 headers={"X-XSRFToken": self.session.cookies.get("_xsrf")})
        assert resp.status_code == 201, f"token of {name}: {resp.status_code} {resp.text[:300]}"
        self.token = resp.json()["token"]
        self.headers = {"Authorization": f"token {self.token}"}

    def api(self, method: str, path: str, **kw) -> requests.Response:
        return requests.request(method, f"{self.base}/hub/api{path}", headers=self.headers, timeout=60, **kw)

    def spawn_page(self) -> str:
        """The spawn form as the logged-in browser gets it."""
        resp = self.session.get(f"{self.base}/hub/spawn", timeout=60)
        resp.raise_for_status()
        return resp.content.decode("utf-8")  # the hub's <meta charset>; its header names none

    def start(self, profile: str) -> requests.Response:
        return self.api("POST", f"/users/{self.name}/server", json={"profile": profile})

    def progress(self, timeout: float = 240) -> list[dict]:
        """The spawn's progress events until the last (ready or failed)."""
        events = []
        with requests.get(f"{self.base}/hub/api/users/{self.name}/server/progress", headers=self.headers,
                          stream=True, timeout=timeout) as resp:
            for line in resp.iter_lines():
                if line.startswith(b"data:"):
                    events.append(json.loads(line[5:]))
                    if events[-1].get("ready") or events[-1].get("failed"):
                        break
        return events

    def spawn(self, profile: str, timeout: float = 240) -> list[dict]:
        """Start the default server with ``profile`` and wait until it is ready; the progress events."""
        resp = self.start(profile)
        assert resp.status_code in (201, 202), f"spawn {profile}: {resp.status_code} {resp.text[:500]}"
        events = self.progress(timeout)
        assert events and events[-1].get("ready"), f"spawn {profile} did not get ready: {events[-3:]}"
        return events

    def server(self) -> dict | None:
        user = self.api("GET", f"/users/{self.name}").json()
        return (user.get("servers") or {}).get("")

    def stop(self, timeout: float = 120) -> None:
        resp = self.api("DELETE", f"/users/{self.name}/server")
        assert resp.status_code in (202, 204), f"stop: {resp.status_code} {resp.text[:300]}"
        wait_for(self.server, lambda s: s is None, what=f"{self.name}'s server to stop", timeout=timeout)

    def notebook(self, path: str) -> requests.Response:
        """A request to the user's server through the proxy."""
        return requests.get(f"{self.base}/user/{self.name}/{path.lstrip('/')}", headers=self.headers, timeout=60)

    def run(self, code: str, timeout: float = 300) -> str:
        """Run ``code`` in a new kernel of the server (deleted afterwards); its stdout. AssertionError on an error."""
        import websocket  # websocket-client, a jupyter-server dependency

        kernels = f"{self.base}/user/{self.name}/api/kernels"
        resp = requests.post(kernels, headers=self.headers, json={"name": "python3"}, timeout=60)
        assert resp.status_code == 201, f"kernel start: {resp.status_code} {resp.text[:300]}"
        kid = resp.json()["id"]
        ws = websocket.create_connection(kernels.replace("http://", "ws://", 1) + f"/{kid}/channels",
                                         header=[f"Authorization: token {self.token}"], timeout=timeout)
        try:
            msg_id = uuid.uuid4().hex
            ws.send(json.dumps({
                "header": {"msg_id": msg_id, "username": self.name, "session": uuid.uuid4().hex,
                           "msg_type": "execute_request", "version": "5.3", "date": ""},
                "parent_header": {}, "metadata": {}, "channel": "shell",
                "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                            "allow_stdin": False, "stop_on_error": True},
                "buffers": []}))
            out, err = [], []
            deadline = time.monotonic() + timeout
            while True:
                assert time.monotonic() < deadline, f"no reply from the kernel in {timeout} s; output so far {out!r}"
                msg = json.loads(ws.recv())
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = msg["header"]["msg_type"]
                if kind == "stream":
                    out.append(msg["content"]["text"])
                elif kind == "error":
                    err.append("\n".join(msg["content"].get("traceback") or []) or msg["content"].get("evalue", ""))
                elif kind == "status" and msg["content"]["execution_state"] == "idle":
                    break
            assert not err, "the kernel raised:\n" + "".join(err) + "\nstdout: " + "".join(out)
            return "".join(out)
        finally:
            ws.close()
            requests.delete(f"{kernels}/{kid}", headers=self.headers, timeout=30)
