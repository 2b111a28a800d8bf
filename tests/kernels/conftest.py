"""Fixtures for the %%train magic tests.

- ``shell`` (from tests/conftest.py): a real in-process IPython shell with ``trainhub.kernels`` loaded.
- ``magics``: its ``TrainMagics`` instance.
- ``jobs_api``: the jobs-API contract stand-in from tests/client/jobs_contract_server.py (jobs run
  as local subprocesses), reset per test; ``magics.client`` points at it via ``api_magics``.
- ``api_magics``: ``magics`` whose client talks to ``jobs_api``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "jobs_contract_server", Path(__file__).parent.parent / "client" / "jobs_contract_server.py")
contract = sys.modules.get("jobs_contract_server")
if contract is None:
    contract = importlib.util.module_from_spec(_spec)
    sys.modules["jobs_contract_server"] = contract
    _spec.loader.exec_module(contract)


@pytest.fixture
def magics(shell):
    m = shell.magics_manager.registry["TrainMagics"]
    m.client = None
    m.max_value_bytes = 1_000_000
    m.poll_interval = 0.05
    yield m
    m.client = None


@pytest.fixture(scope="session")
def _jobs_server():
    server = contract.ServerThread()
    yield server
    server.stop()


@pytest.fixture
def jobs_api(_jobs_server):
    _jobs_server.service.reset()
    yield _jobs_server
    _jobs_server.service.reset()


@pytest.fixture
def api_magics(magics, jobs_api, monkeypatch):
    from trainhub.client import TrainhubClient

    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    magics.client = TrainhubClient(jobs_api.url, jobs_api.token, retries=1, backoff=0.01)
    return magics
