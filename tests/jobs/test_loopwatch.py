"""The jobs service's loop watch (trainhub.loopwatch, issue 35): what held up the event loop, and where.

A callback that holds the loop is counted as the loop's lateness and logged with where the loop thread was; the cycle
collector's pauses and the requests' own time are counted; ``GET {api}/service/stalls`` serves the counts to admins
only. The service runs in process over a temporary data dir (as in test_queue_cap.py), its API on a real tornado
server; the hub's authentication is replaced by ``Authorization: token <user name>`` ("root" is the admin).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time

import pytest
from tornado.httpclient import AsyncHTTPClient
from traitlets.config import Config

from trainhub.gpus import simulated_devices
from trainhub.loopwatch import LoopWatch
from trainhub.services import api as service_api
from trainhub.settings import Runtime


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # a blocking call on the loop: what the watch is there to find


async def until(condition, what: str, tries: int = 100):
    for _ in range(tries):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


async def test_a_held_loop_is_counted_and_logged_with_where_it_was(caplog):
    watch = LoopWatch(logging.getLogger("test-loopwatch"), interval=0.02, stall=0.1)
    watch.start()
    try:
        await asyncio.sleep(0.05)
        with caplog.at_level(logging.WARNING, logger="test-loopwatch"):
            hold_the_loop(0.3)
            await until(lambda: watch.stalls, "the stall to be recorded")
        stall = watch.stalls[-1]
        assert stall["ms"] >= 200
        assert "hold_the_loop" in stall["where"], stall
        assert "event loop held up" in caplog.text and "hold_the_loop" in caplog.text
        snap = watch.snapshot()
        assert snap["loop_lag"]["over_ms"]["200"] >= 1
        assert snap["loop_lag"]["max_ms"] >= 200
        json.dumps(snap)  # served as JSON as it is

        before = watch.snapshot()["gc"]["2"]["count"]
        gc.collect()
        assert watch.snapshot()["gc"]["2"]["count"] == before + 1

        watch.request(0.06)
        watch.request(0.001)
        req = watch.snapshot()["requests"]
        assert req["count"] == 2 and req["over_ms"]["50"] == 1 and req["over_ms"]["200"] == 0
    finally:
        watch.stop()
    assert watch._on_gc not in gc.callbacks


@pytest.fixture
def service(tmp_path, monkeypatch):
    from trainhub.services.jobs.app import JobsService

    for var in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "TRAINHUB_K8S_CONFIG", "TRAINHUB_CONFIG",
                "JUPYTERHUB_SERVICE_PREFIX"):
        monkeypatch.delenv(var, raising=False)
    Runtime(data_dir=str(tmp_path), devices=[d.to_dict() for d in simulated_devices(2)], simulated=True).save()

    async def identify(self):
        name = self.request.headers.get("Authorization", "").removeprefix("token ")
        model = {"name": name, "kind": "user", "admin": name == "root", "groups": [],
                 "scopes": [f"custom:trainhub:jobs:read!user={name}", f"custom:trainhub:jobs:write!user={name}"]}
        self._hub_auth_user_cache = model
        self.current_user = model

    monkeypatch.setattr(service_api.APIHandler, "_identify", identify)
    c = Config()
    c.Isolation.allow_shared_account = True
    app = JobsService(config=c)
    app.initialize(["--data-dir", str(tmp_path)])
    return app


async def test_stall_counts_are_served_to_admins_only(service):
    server = service.make_app().listen(0, "127.0.0.1")
    try:
        port = next(iter(server._sockets.values())).getsockname()[1]
        url = f"http://127.0.0.1:{port}{service.api_prefix}service/stalls"

        async def get(user):
            r = await AsyncHTTPClient().fetch(url, headers={"Authorization": f"token {user}"}, raise_error=False)
            return r.code, json.loads(r.body)

        code, body = await get("root")
        assert code == 404 and "stall_log_threshold" in body["message"]  # no watch started (the service's start does)

        service.loopwatch = LoopWatch(service.log)
        service.loopwatch.start()
        try:
            code, body = await get("alice")
            assert code == 403 and "admins" in body["message"]
            code, body = await get("root")
            assert code == 200, body
            assert set(body) >= {"loop_lag", "gc", "requests", "stalls", "process_cpu_s"}
            # the requests served so far were counted by the access log's hook (the 403 at least)
            assert body["requests"]["count"] >= 1
        finally:
            service.loopwatch.stop()
    finally:
        server.stop()
