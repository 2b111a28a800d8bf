"""Fixtures for the dataset and model registries, served in-process by the real handlers.

- ``registry`` (per test, parametrized ``local``/``s3``): a :class:`RegistryHarness` running the
  registry plugin's routes on a real tornado server (own thread and loop) over a fresh platform
  database, with storage in a temp folder or a bucket on the session's ``moto_server``.
  Callers are fixed users (``alice``, ``bob``: registry write for themselves, read for all;
  ``admin``: unfiltered; ``reader``: read only); a request names one as ``as_=``. Helpers:
  ``call(method, path, as_, json)``, ``finished_job(user, files, metrics)`` (a job row whose
  outputs are already in storage), ``storage_write(rel, data)``.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
import requests
from tornado import web
from traitlets.config import LoggingConfigurable

from trainhub.services import api as service_api
from trainhub.services.jobs.store import JobStore
from trainhub.storage import StorageConfig

USERS = {
    "alice": {"scopes": ["custom:trainhub:registry:write!user=alice", "custom:trainhub:registry:read"]},
    "bob": {"scopes": ["custom:trainhub:registry:write!user=bob", "custom:trainhub:registry:read"]},
    "admin": {"scopes": ["custom:trainhub:registry:write", "custom:trainhub:registry:read"], "admin": True},
    "reader": {"scopes": ["custom:trainhub:registry:read"]},
}


class ServiceStandIn(LoggingConfigurable):
    """The parts of the jobs service (JobsService) the registry plugin uses."""

    version = "test"

    def __init__(self, db_url: str, storage: StorageConfig):
        super().__init__()
        self.log = logging.getLogger("test-registry")
        self.db_url = db_url
        self.store = JobStore(db_url)
        self.storage = storage
        self.service_prefix = "/services/trainhub/"
        self.api_prefix = "/services/trainhub/api/"


class RegistryHarness:
    def __init__(self, kind: str, storage: StorageConfig, db_url: str):
        from trainhub.services import registry as plugin

        self.kind = kind
        self.storage = storage
        self.fs = storage.filesystem()
        self.service = ServiceStandIn(db_url, storage)
        self.plugin = plugin
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        self.error = None

        def run():
            asyncio.set_event_loop(self.loop)
            try:
                routes = plugin.routes(self.service.service_prefix, self.service)
                self.loop.run_until_complete(plugin.start(self.service))
                app = web.Application(routes)
                self.http = app.listen(0, "127.0.0.1")
                self.port = next(iter(self.http._sockets.values())).getsockname()[1]
            except Exception as e:
                self.error = e
                raise
            finally:
                ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(30)
        if self.error:
            raise self.error
        self.url = f"http://127.0.0.1:{self.port}/services/trainhub/api"

    @property
    def registry(self):
        return self.service.registry

    def close(self):
        async def stop():
            self.http.stop()
            await self.plugin.stop(self.service)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def call(self, method: str, path: str, as_: str | None = "alice", json_body=None, **params) -> requests.Response:
        headers = {"Authorization": f"token {as_}"} if as_ else {}
        return requests.request(method, self.url + path, json=json_body, params=params, headers=headers, timeout=60)

    def storage_write(self, rel: str, data: bytes) -> str:
        path = self.storage.strip(f"{self.storage.root()}/{rel}")
        if self.storage.is_local:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe(path, data)
        return path

    def finished_job(self, user: str = "alice", files: dict | None = None, metrics=(), state: str = "succeeded",
                     sweep_id=None, params=None):
        from datetime import datetime, timezone

        store = self.service.store
        job = store.create(name="train", user=user, groups=[], command="python train.py", gpus=0, workers=1,
                           env={}, params=params or {"lr": 0.1}, sweep_id=sweep_id)
        outputs = f"{self.storage.user_url(user)}/jobs/{job.key}"
        for rel, data in (files if files is not None else {"model.pt": b"weights", "sub/config.json": b"{}"}).items():
            self.storage_write(f"users/{user}/jobs/{job.key}/{rel}", data)
        store.update(job.id, state=state, outputs_url=outputs, finished=datetime.now(timezone.utc))
        for i, values in enumerate(metrics):
            with store.session() as s:
                from trainhub.services.jobs.models import JobMetric

                s.add(JobMetric(job_id=job.id, worker=0, time=float(i), step=i, values=values))
                s.commit()
        return store.get(job.id)


@pytest.fixture(autouse=True)
def _fake_hub_auth(monkeypatch):
    """Who a request comes from: ``Authorization: token <user>`` names one of USERS."""

    async def prepare(self):
        header = self.request.headers.get("Authorization", "")
        name = header.split(" ", 1)[1] if " " in header else ""
        model = None
        if name in USERS:
            model = {"name": name, "kind": "user", "admin": USERS[name].get("admin", False), "groups": [],
                     "scopes": USERS[name]["scopes"]}
        self._hub_auth_user_cache = model

    monkeypatch.setattr(service_api.APIHandler, "prepare", prepare)


@pytest.fixture(params=["local", "s3"])
def registry(request, tmp_path):
    if request.param == "local":
        storage = StorageConfig(url=str(tmp_path / "storage"))
    else:
        s3 = request.getfixturevalue("s3_server")
        bucket = s3.make_bucket()
        storage = StorageConfig(url=f"s3://{bucket}/root", endpoint_url=s3.endpoint, key=s3.key, secret=s3.secret,
                                extra_options={"use_listings_cache": False})
    storage.ensure_layout(["alice", "bob"])
    h = RegistryHarness(request.param, storage, f"sqlite:///{tmp_path / 'platform.sqlite'}")
    yield h
    h.close()
