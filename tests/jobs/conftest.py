"""Fixtures for the client-side jobs tests (TrainhubClient, `trainhub jobs`).

- ``jobs_api`` (tests/conftest.py): the in-process jobs-service stand-in (tests/jobs_contract_server.py).
- ``api_env``: ``$TRAINHUB_API_URL``/``$JUPYTERHUB_API_TOKEN`` pointing at ``jobs_api``; returns it.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def api_env(jobs_api, monkeypatch):
    monkeypatch.setenv("TRAINHUB_API_URL", jobs_api.url)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", jobs_api.token)
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    return jobs_api
