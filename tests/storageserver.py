"""The storage browser's test server, shared by tests/storage and tests/culler.

- :class:`Backend`: a storage root (a temp folder or an S3 prefix) with ``fs`` and ``path(rel)``/``write(rel)``.
- :func:`start_storage_server`: a real ``jupyter server`` subprocess for one user with the
  ``trainhub.extensions.storage`` extension and the spawner's storage environment; returns a
  :class:`StorageServer` whose ``.get/.put/.delete/.post(route, **params)`` send token-authenticated
  requests (never raise on status).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import requests
from waiting import wait_for

TOKEN = "storage-test-token"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Backend:
    def __init__(self, kind: str, root: str, fs, options: dict, env: dict):
        self.kind, self.root, self.fs, self.options, self.env = kind, root.rstrip("/"), fs, options, env

    def path(self, rel: str) -> str:
        return self.fs._strip_protocol(f"{self.root}/{rel}")

    def write(self, rel: str, data: bytes = b"x") -> None:
        p = self.path(rel)
        if self.kind == "local":
            os.makedirs(os.path.dirname(p), exist_ok=True)
        self.fs.pipe(p, data)


class StorageServer:
    def __init__(self, url: str, backend: Backend, proc):
        self.url, self.backend, self.proc = url, backend, proc

    def request(self, method: str, route: str, token: str | None = TOKEN, data=None, **params):
        headers = {"Authorization": f"token {token}"} if token else {}
        return requests.request(method, f"{self.url}/trainhub/{route}", params=params, data=data, headers=headers,
                                timeout=60)

    def get(self, route, **params):
        return self.request("GET", route, **params)

    def put(self, route, data: bytes, **params):
        return self.request("PUT", route, data=data, **params)

    def delete(self, route, **params):
        return self.request("DELETE", route, **params)

    def post(self, route, **params):
        return self.request("POST", route, data=b"", **params)

    def list_all(self, area="home", path="", limit=100) -> list[dict]:
        out, after = [], None
        while True:
            r = self.get("storage/list", area=area, path=path, limit=limit, **({"after": after} if after else {}))
            assert r.status_code == 200, r.text
            body = r.json()
            out += body["entries"]
            after = body["next_after"]
            if not after:
                return out


def start_storage_server(backend: Backend, workdir: Path, user: str = "alice", extra_env=None) -> StorageServer:
    port = free_port()
    env = dict(os.environ, **backend.env, **(extra_env or {}))
    env.update({
        "TRAINHUB_STORAGE_URL": f"{backend.root}/users/{user}",
        "TRAINHUB_DATASETS_URL": f"{backend.root}/datasets",
        "TRAINHUB_STORAGE_OPTIONS": json.dumps(backend.options),
        "JUPYTER_CONFIG_DIR": str(workdir / "config"),
        "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
    })
    env.pop("JUPYTERHUB_API_TOKEN", None)
    cmd = [sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1", "--no-browser",
           f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={workdir}",
           '--ServerApp.jpserver_extensions={"trainhub.extensions.storage": True}',
           "--StorageBrowser.max_upload_bytes=1000000"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(workdir / f"server-{uuid.uuid4().hex[:6]}.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    def answers():
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter server exited with {proc.returncode}: {Path(log.name).read_text()[-3000:]}")
        try:
            return requests.get(f"{url}/trainhub/storage/areas", headers={"Authorization": f"token {TOKEN}"},
                                timeout=2).status_code
        except requests.RequestException as e:
            return repr(e)

    try:
        wait_for(answers, lambda status: status == 200, what=f"the storage extension's jupyter server at {url}",
                 timeout=90, describe=lambda status: f"last answer {status}; log: {Path(log.name).read_text()[-3000:]}")
    except (AssertionError, RuntimeError):
        proc.kill()
        raise
    return StorageServer(url, backend, proc)
