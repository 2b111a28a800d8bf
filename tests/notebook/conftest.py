"""Fixtures for the %%train magic tests.

- ``shell`` (from tests/conftest.py): a real in-process IPython shell with ``trainhub.kernels`` loaded.
- ``magics``: its ``TrainMagics`` instance, in a fresh notebook folder (the working directory %%train sends).
- ``jobs_api`` (from tests/conftest.py): the jobs-API contract stand-in, tests/jobs_contract_server.py
  (jobs run as local subprocesses), reset per test; ``magics.client`` points at it via ``api_magics``.
- ``api_magics``: ``magics`` whose client talks to ``jobs_api``.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def magics(shell, tmp_path, monkeypatch):
    # the kernel's working directory is the notebook's folder, which %%train sends along: a fresh one per test
    notebook_folder = tmp_path / "notebook"
    notebook_folder.mkdir()
    monkeypatch.chdir(notebook_folder)
    m = shell.magics_manager.registry["TrainMagics"]
    m.client = None
    m.max_value_bytes = 1_000_000
    m.poll_interval = 0.05
    yield m
    m.client = None


@pytest.fixture
def api_magics(magics, jobs_api, monkeypatch):
    from trainhub.client import TrainhubClient

    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    magics.client = TrainhubClient(jobs_api.url, jobs_api.token, retries=1, backoff=0.01)
    return magics
