"""The hub's configuration wires parts that never import one another: the local spawner installs the
kernel side's IPython startup file (%%train in every kernel) through a hook the composition root sets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from traitlets.config import Config

from trainhub.hub_config.embedded import configure, install_kernel_startup
from trainhub.kernels.startup import STARTUP_SOURCE, startup_path
from trainhub.settings import DataDir, Runtime
from trainhub.spawner.local import LocalGPUSpawner


@pytest.fixture
def hub_config(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINHUB_CONFIG", raising=False)
    DataDir(tmp_path).ensure()
    Runtime(data_dir=str(tmp_path)).save()
    c = Config()
    configure(c, str(tmp_path))
    return c


def spawner(config, name="alice") -> LocalGPUSpawner:
    return LocalGPUSpawner(config=config, user=SimpleNamespace(name=name, groups=[], admin=False, url=f"/user/{name}/"))


def test_the_embedded_hub_installs_the_kernel_startup_in_each_home(hub_config):
    assert hub_config.LocalGPUSpawner.prepare_home_hook is install_kernel_startup
    s = spawner(hub_config)
    s._prepare_home()
    assert startup_path(s.home_dir).read_text() == STARTUP_SOURCE


def test_without_the_hook_the_spawner_writes_no_startup_file(hub_config):
    del hub_config.LocalGPUSpawner["prepare_home_hook"]
    s = spawner(hub_config, "bob")
    s._prepare_home()
    assert not startup_path(s.home_dir).exists()


def test_an_admins_own_hook_is_kept(tmp_path, monkeypatch):
    admin_file = tmp_path / "admin_config.py"
    admin_file.write_text("c.LocalGPUSpawner.prepare_home_hook = lambda spawner, home: home.write_bytes('hooked', spawner.user.name.encode())\n")
    monkeypatch.setenv("TRAINHUB_CONFIG", str(admin_file))
    data = tmp_path / "data"
    DataDir(data).ensure()
    Runtime(data_dir=str(data)).save()
    c = Config()
    configure(c, str(data))
    s = spawner(c, "carol")
    s._prepare_home()
    assert (tmp_path / "data" / "homes" / "carol" / "hooked").read_text() == "carol"
    assert not startup_path(s.home_dir).exists()


def test_a_start_that_fails_on_the_platforms_side_says_why(hub_config):
    """No spawn ends in a bare "500 Internal Server Error": a failure while preparing the server (here the start-up
    hook meets a file the user's account cannot read) reaches the REST API caller and the spawn page with its cause,
    and whatever the start had taken (devices) is given back."""
    import asyncio

    from jupyterhub.spawner import SpawnException

    def hook(spawner, home):
        raise PermissionError(13, "Permission denied", "/root/checkout/kernels/__init__.py")

    hub_config.LocalGPUSpawner.prepare_home_hook = hook
    s = spawner(hub_config, "dora")
    s.user_options = {"profile": "cpu"}
    with pytest.raises(SpawnException) as e:
        asyncio.run(s.start())
    assert e.value.status_code == 500
    assert "could not start: [Errno 13] Permission denied: '/root/checkout/kernels/__init__.py'" in e.value.jupyterhub_message
    assert s.devices == [] and not [h for h in s.allocator.holdings() if h.user == "dora"]
