"""Fixtures for the sweeps unit tests.

- ``shell``: a real in-process IPython ``InteractiveShell`` (in-memory history) with the
  ``trainhub.kernels`` extension loaded, so ``%%sweep`` is registered as in a notebook.
- ``sweep_magics``: its ``SweepMagics`` instance, whose client is a :class:`FakeSweepsClient`.
- ``fake_client``: that client (tests/sweeps/sweeps_fakes.py): it records ``create_sweep`` bodies (``.created``) and answers
  with canned sweep / trial dicts.
"""

from __future__ import annotations

import pytest

from sweeps_fakes import FakeSweepsClient


@pytest.fixture
def fake_client():
    return FakeSweepsClient()


@pytest.fixture
def sweep_magics(shell, fake_client):
    from trainhub.kernels.sweep import SweepMagics

    m = shell.magics_manager.registry["SweepMagics"]
    assert isinstance(m, SweepMagics)
    m.client = fake_client
    return m
