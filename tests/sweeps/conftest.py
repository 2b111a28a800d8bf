"""Fixtures for the sweeps unit tests.

- ``shell``: a real in-process IPython ``InteractiveShell`` (in-memory history) with the
  ``trainhub.kernels`` extension loaded, so ``%%sweep`` is registered as in a notebook.
- ``sweep_magics``: its ``SweepMagics`` instance, whose client is a :class:`FakeSweepsClient`; the working
  directory is a fresh notebook folder (``tmp_path / "notebook"``, which ``%%sweep`` sends along).
- ``fake_client``: that client (tests/sweeps/sweeps_fakes.py): it records ``create_sweep`` bodies (``.created``) and answers
  with canned sweep / trial dicts; ``send_workdir`` packs the folder for real and records it (``.workdirs``).
"""

from __future__ import annotations

import pytest

from sweeps_fakes import FakeSweepsClient


@pytest.fixture
def fake_client():
    return FakeSweepsClient()


@pytest.fixture
def sweep_magics(shell, fake_client, tmp_path, monkeypatch):
    from trainhub.kernels.sweep import SweepMagics

    notebook_folder = tmp_path / "notebook"  # the kernel's working directory: the notebook's folder
    notebook_folder.mkdir()
    monkeypatch.chdir(notebook_folder)
    m = shell.magics_manager.registry["SweepMagics"]
    assert isinstance(m, SweepMagics)
    m.client = fake_client
    return m
