"""The jobs service wires its parts through typed contracts, not ``hasattr`` and patching.

- ``Launcher`` (services/jobs/launcher.py): ``data_dir`` given at construction, ``jobs_dir`` and the
  local launcher's ``home_dir_template`` default from it (configuration wins); ``job_dir``,
  ``home_dir``, ``close`` and ``gpu_targets`` have documented defaults.
- ``GPUAllocator`` (trainhub/ledger.py): ``start``, ``close`` and ``gpu_targets`` with defaults.
- ``GPUMetricsSource.gpu_targets``: given by the component that builds the source; a DCGM source
  resolves through it unless a ``resolver`` is configured.
- ``Scheduler.group_priority``: the priority a job submitted without one gets from its groups.
- No background task is started without a reference (an AST check over the whole tree), and the
  group refresh loop stops with the service.
"""

from __future__ import annotations

import ast
import json
import socket
from pathlib import Path

import pytest
from waiting import await_for
from tornado import web
from tornado.httpserver import HTTPServer
from traitlets.config import Config

from trainhub.gpus import simulated_devices
from trainhub.ledger import GPUAllocator
from trainhub.metrics.prometheus import PrometheusDCGMSource
from trainhub.metrics.scripted import ScriptedMetricsSource
from trainhub.services.jobs.app import GroupDirectory, JobsService
from trainhub.services.jobs.launcher import JobView, Launcher
from trainhub.scheduler import FifoGangScheduler, TrainhubScheduler
from trainhub.settings import Runtime

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def service(tmp_path, monkeypatch):
    for var in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "TRAINHUB_K8S_CONFIG", "TRAINHUB_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    Runtime(data_dir=str(tmp_path), devices=[d.to_dict() for d in simulated_devices(2)], simulated=True).save()

    def make(config: Config | None = None) -> JobsService:
        app = JobsService(config=config or Config())
        app.initialize(["--data-dir", str(tmp_path)])
        return app
    return make


def test_launcher_defaults_come_from_the_services_data_dir(service, tmp_path):
    app = service()
    assert app.launcher.data_dir == str(tmp_path)
    assert app.launcher.jobs_dir == str(tmp_path / "jobs")
    assert app.launcher.home_dir("bob") == str(tmp_path / "homes" / "bob")
    view = JobView(id=7, key="j-000007", user="bob", name="n", command="true", script=None, workers=1, gpus=0,
                   env={}, attempt=1, time_limit=None)
    assert app.launcher.job_dir(view) == str(tmp_path / "jobs" / "j-000007")
    # the metrics source was built knowing where the launcher's devices are
    assert isinstance(app.engine.metrics_source, ScriptedMetricsSource)
    assert app.engine.metrics_source.gpu_targets == app.launcher.gpu_targets


def test_configuration_wins_over_the_defaults(service):
    c = Config()
    c.LocalLauncher.jobs_dir = "/srv/jobs"
    c.LocalLauncher.home_dir_template = "/home/{username}"
    app = service(c)
    assert app.launcher.jobs_dir == "/srv/jobs" and app.launcher.home_dir("bob") == "/home/bob"
    c = Config()
    c.LocalLauncher.home_dir_template = ""
    assert service(c).launcher.home_dir("bob") == ""  # "" = the job's own folder, HOME untouched


def test_dcgm_source_resolves_through_the_builders_targets(service):
    c = Config()
    c.JobsService.metrics_source_class = PrometheusDCGMSource
    app = service(c)
    assert app.engine.metrics_source.resolver == app.launcher.gpu_targets

    def mine(devices):
        return {}

    assert PrometheusDCGMSource(gpu_targets=app.launcher.gpu_targets, resolver=mine).resolver is mine
    assert PrometheusDCGMSource().resolver is None


async def test_base_contracts_have_working_defaults(tmp_path):
    launcher = Launcher(data_dir=str(tmp_path))
    assert launcher.jobs_dir == str(tmp_path / "jobs") and launcher.home_dir("x") == "" and launcher.gpu_targets([0]) == {}
    await launcher.close()
    assert Launcher(data_dir="").jobs_dir == "/var/lib/trainhub/jobs"
    allocator = GPUAllocator()
    allocator.start()
    allocator.close()
    assert allocator.gpu_targets([0, 1]) == {}


def test_group_priority_is_the_schedulers():
    assert FifoGangScheduler().group_priority(["prod"]) == 0
    sched = TrainhubScheduler(group_priorities={"prod": 10, "students": -5})
    assert sched.group_priority(["prod", "students"]) == 10
    assert sched.group_priority(["students"]) == -5 and sched.group_priority(["other"]) == 0


async def test_group_directory_refreshes_and_stops(monkeypatch):
    calls = []

    class Groups(web.RequestHandler):
        def get(self):
            calls.append(self.request.headers.get("Authorization"))
            self.finish(json.dumps([{"name": "lab", "users": ["ann", "bo"]}, {"name": "ops", "users": ["bo"]}]))

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = HTTPServer(web.Application([(r"/hub/api/groups", Groups)]))
    server.listen(port, "127.0.0.1")
    monkeypatch.setenv("JUPYTERHUB_API_URL", f"http://127.0.0.1:{port}/hub/api")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "svc-token")
    import logging

    groups = GroupDirectory(logging.getLogger("test"), interval=60)
    try:
        groups.start()
        task = groups._loop._task
        await await_for(lambda: groups("bo"), what="the group directory to know bo", timeout=10)
        assert groups("bo") == ("lab", "ops") and groups("ann") == ("lab",) and calls == ["token svc-token"]
        await groups.stop()
        assert task.done() and groups._loop is None
    finally:
        server.stop()


def _sources():
    for part in ("trainhub", "services", "spawner", "extensions", "kernels", "hub_config"):
        yield from (p for p in (REPO / part).rglob("*.py") if "node_modules" not in p.parts)


def test_no_background_task_is_started_without_a_reference():
    """``asyncio.create_task(...)`` / ``ensure_future(...)`` as a bare statement drops the task:
    it can be garbage-collected mid-run and is never cancelled nor awaited on stop."""
    dropped = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                func = node.value.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in ("create_task", "ensure_future", "spawn_callback"):
                    dropped.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not dropped, f"tasks started without keeping a reference: {dropped}"
