"""Fixtures for the client-side tests (TrainhubClient, `trainhub jobs`).

- ``jobs_api``: an in-process stand-in for the jobs service speaking docs/jobs-api.md
  (``jobs_contract_server.ServerThread``, one per session, reset per test): ``.url``, ``.token``,
  ``.service`` (``posts``, ``jobs``, ``fail_gets``). Jobs run as real local subprocesses.
- ``api_env``: ``$TRAINHUB_API_URL``/``$JUPYTERHUB_API_TOKEN`` pointing at ``jobs_api``; returns it.
"""

from __future__ import annotations

import pytest

from jobs_contract_server import ServerThread


@pytest.fixture(scope="session")
def _jobs_server():
    server = ServerThread()
    yield server
    server.stop()


@pytest.fixture
def jobs_api(_jobs_server):
    _jobs_server.service.reset()
    yield _jobs_server
    _jobs_server.service.reset()


@pytest.fixture
def api_env(jobs_api, monkeypatch):
    monkeypatch.setenv("TRAINHUB_API_URL", jobs_api.url)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", jobs_api.token)
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    return jobs_api
