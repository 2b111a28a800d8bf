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


def admin_configured(tmp_path, monkeypatch, admin_config: str) -> Config:
    """The embedded hub's configuration of a platform under ``tmp_path/data`` with the admin's own file
    ($TRAINHUB_CONFIG) holding ``admin_config``."""
    admin_file = tmp_path / "admin_config.py"
    admin_file.write_text(admin_config)
    monkeypatch.setenv("TRAINHUB_CONFIG", str(admin_file))
    data = tmp_path / "data"
    DataDir(data).ensure()
    Runtime(data_dir=str(data)).save()
    c = Config()
    configure(c, str(data))
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
    c = admin_configured(tmp_path, monkeypatch, "c.LocalGPUSpawner.prepare_home_hook = lambda spawner, home: "
                         "home.write_bytes('hooked', spawner.user.name.encode())\n")
    s = spawner(c, "carol")
    s._prepare_home()
    assert (tmp_path / "data" / "homes" / "carol" / "hooked").read_text() == "carol"
    assert not startup_path(s.home_dir).exists()


def test_the_platforms_server_extensions_are_warm_imports_unless_the_admin_chose(tmp_path, monkeypatch, hub_config):
    """The spawner names no extension module (its layer is their sibling's): the composition root adds them to the
    warm interpreters' imports, so a claimed server does not import them on a rush's critical path (issue 35)."""
    from trainhub.extensions import ENABLED_EXTENSIONS
    from trainhub.spawner.warm import DEFAULT_IMPORTS

    assert spawner(hub_config).warm_imports == [*DEFAULT_IMPORTS, *ENABLED_EXTENSIONS]
    c = admin_configured(tmp_path, monkeypatch, "c.LocalGPUSpawner.warm_imports = ['json']\n")
    assert spawner(c, "dave").warm_imports == ["json"]


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


# -- time in line is not start time -------------------------------------------------------------------------

class _LineThenStart(LocalGPUSpawner):
    """A spawner whose start waits in line for ``line`` seconds (as _wait_in_line marks it), then takes ``work``
    seconds more; ``queue_when_full`` and an api_url make it a spawn that may wait."""

    line = 0.0
    work = 0.0

    async def _start(self):
        import asyncio

        loop = asyncio.get_running_loop()
        self._in_line_since = loop.time()
        try:
            await asyncio.sleep(self.line)
        finally:
            self._in_line_seconds += loop.time() - self._in_line_since
            self._in_line_since = None
        await asyncio.sleep(self.work)
        return ("127.0.0.1", 1)


async def _as_the_hub_starts(spawner):
    """What JupyterHub's User.spawn does: call start(), read start_timeout, wait that long at most."""
    import asyncio

    from jupyterhub.utils import maybe_future

    f = maybe_future(spawner.start())
    await asyncio.wait_for(f, timeout=spawner.start_timeout)
    return f.result()


def _line_spawner(config, name, **kw):
    s = _LineThenStart(config=config, user=SimpleNamespace(name=name, groups=[], admin=False, url=f"/user/{name}/"),
                       api_url="http://127.0.0.1:1/api", queue_when_full=True, **kw)
    return s


def test_time_in_line_does_not_count_against_start_timeout(hub_config):
    """Under `trainhub up` a queued spawn failed after start_timeout (120 s, from the hub's configuration) with
    JupyterHub's empty "Spawn failed: ": the line's time counted. Now only the start itself does; the line has
    max_queue_wait."""
    import asyncio

    s = _line_spawner(hub_config, "liam", start_timeout=1, max_queue_wait=30)
    s.line, s.work = 2.5, 0.2  # longer in line than start_timeout: still started
    assert asyncio.run(_as_the_hub_starts(s)) == ("127.0.0.1", 1)
    assert s.start_timeout == 1  # the configured value is back once the start ends


def test_a_start_that_takes_too_long_outside_the_line_says_why(hub_config):
    """The spawner's own limit comes before JupyterHub's (which would fail with no reason), and names the time."""
    import asyncio

    from jupyterhub.spawner import SpawnException

    s = _line_spawner(hub_config, "mona", start_timeout=1, max_queue_wait=30)
    s.line, s.work = 0.1, 60  # the start hangs (after a short wait in line)
    with pytest.raises(SpawnException) as e:
        asyncio.run(_as_the_hub_starts(s))
    assert e.value.jupyterhub_message == ("The server of mona did not start within 1s (time waiting in line for GPUs "
                                          "not counted); see the hub's log.")
    assert s.start_timeout == 1


def test_the_hub_config_leaves_start_timeout_to_the_spawner(hub_config):
    s = spawner(hub_config, "nia")
    assert "start_timeout" not in hub_config.Spawner
    assert s.start_timeout == s.listen_timeout + 60
