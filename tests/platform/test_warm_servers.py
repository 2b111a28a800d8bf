"""Warm single-user servers (trainhub.spawner.warm): a claimed warm interpreter is the user's server exactly as a
cold start would make it, and nothing one user's server does reaches the next user's through the warm path.

The first tests claim warm interpreters directly (a real pool, the real Isolation: as root, each user's own Unix
account in a bubblewrap sandbox where bwrap is installed) with a probe module in place of jupyterhub.singleuser,
and compare what the probe sees with the same probe started cold. The last one goes through a real `trainhub up`:
user A's server runs code from A's ~/.jupyter config that leaves module state, environment, files in /tmp and a
changed working folder; user B's server, started warm next, records what it sees.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainhub.boundary.accounts import UserAccounts, own_dir
from trainhub.boundary.isolation import Isolation
from trainhub.cpupriority import autogroups_enabled
from trainhub.spawner.warm import STARTUP_VARS, WarmPool, claim_spec, launch_env, startup_differences, warm_argv
from waiting import await_for

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="accounts need root (CI runs as root)")

# what a server process sees: printed as one JSON line; with LEAVE set, it also leaves traces for the next one
PROBE = r'''
import json, os, sys, json as _j
leave = os.environ.get("LEAVE")
report = {
    "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(), "cwd": os.getcwd(),
    "path0": sys.path[0], "argv": sys.argv[1:], "env": dict(os.environ), "tmp": sorted(os.listdir("/tmp")),
    "leaked_attr": getattr(_j, "LEAKED_BY", None), "leaked_module": "leaked_mod" in sys.modules,
    "umask": os.umask(0o22), "other_home": {p: os.path.exists(p) for p in json.loads(os.environ.get("OTHER", "[]"))},
    "caps": {l.split(":")[0]: l.split()[1] for l in open("/proc/self/status") if l.startswith("Cap")},
    "nnp": [l.split()[1] for l in open("/proc/self/status") if l.startswith("NoNewPrivs")][0],
    "home_files": sorted(os.listdir(os.environ["HOME"])),
    "proc_env": dict(e.split("=", 1) for e in open("/proc/self/environ").read().split("\0") if e),
    "dumpable": __import__("ctypes").CDLL(None).prctl(3, 0, 0, 0, 0),
}
if leave:
    _j.LEAKED_BY = leave
    sys.modules["leaked_mod"] = sys
    os.environ["LEAKED_ENV"] = leave
    open("/tmp/leaked-" + leave, "w").write(leave)
    os.chdir("/")
print("PROBE " + json.dumps(report), flush=True)
'''


def make_home(base: Path, user: str, account) -> Path:
    home = base / "homes" / user
    home.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(home.parent, 0o711)
    own_dir(str(home), account, 0o700)
    (home / "wprobe.py").write_text(PROBE)
    os.chmod(home / "wprobe.py", 0o644)
    return home


@pytest.fixture
def iso(tmp_path):
    os.chmod(tmp_path, 0o711)
    from trainhub.app.up import code_paths

    isolation = Isolation(code_paths=code_paths())
    if isolation.use_accounts:
        isolation.accounts = UserAccounts(parent=isolation)
    return isolation


def server_env(user: str, home: Path, token: str, devices: str, base: dict, **extra) -> dict:
    env = dict(base, HOME=str(home), USER=user, JUPYTERHUB_USER=user, JUPYTERHUB_API_TOKEN=token,
               CUDA_VISIBLE_DEVICES=devices, NVIDIA_VISIBLE_DEVICES=devices or "void", **extra)
    return env


def parse(out: str) -> dict:
    lines = [l for l in out.splitlines() if l.startswith("PROBE ")]
    assert lines, out
    return json.loads(lines[-1][6:])


async def claim_warm(pool: WarmPool, iso: Isolation, account, home: Path, env: dict):
    """Claim the pool's next interpreter for this user, as LocalGPUSpawner._claim does; returns it and its env."""
    wp = await pool.take()
    assert wp is not None, "the pool had no warm interpreter"
    env = dict(env, TRAINHUB_HOLDER=wp.token)
    cwd = os.path.realpath(home) if iso.use_sandbox else str(home)
    mounts = [(os.path.realpath(home), False, True)] if iso.use_sandbox else []
    old = os.umask(0o077)
    try:
        spec = claim_spec([sys.executable, "-m", "wprobe", "--port=1"], env, cwd, account, iso.use_sandbox)
    finally:
        os.umask(old)
    await pool.claim(wp, spec, mounts, 30)
    return wp, spec["env"]


def run_cold(iso: Isolation, account, home: Path, env: dict) -> dict:
    argv = iso.command([sys.executable, "-m", "wprobe", "--port=1"], account=account, cwd=str(home), rw=[str(home)])
    old = os.umask(0o077)
    try:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120,
                             cwd=str(home) if not iso.use_sandbox else "/")
    finally:
        os.umask(old)
    assert out.returncode == 0, out.stderr
    return parse(out.stdout)


def test_startup_variables_that_differ_are_named():
    launched = {"PATH": "/bin", "LANG": "C.UTF-8", "PYTHONPATH": "/a"}
    assert startup_differences({"PATH": "/usr/bin", "LANG": "C.UTF-8", "PYTHONPATH": "/a"}, launched) == []
    assert startup_differences({"LANG": "C.UTF-8", "PYTHONPATH": "/b", "LD_PRELOAD": "x.so"}, launched) == ["LD_PRELOAD", "PYTHONPATH"]
    assert "PYTHON*" in STARTUP_VARS


def test_the_pool_filled_at_hub_start_is_the_one_every_spawner_claims_from():
    """hub_config.embedded.prefill_warm_servers: the interpreters started as the hub starts wait in the pool the
    spawners of that configuration take from (not a second pool beside it), so the first spawn is warm."""
    from traitlets.config import Config

    from trainhub.hub_config.embedded import prefill_warm_servers
    from trainhub.spawner import warm
    from trainhub.spawner.local import LocalGPUSpawner

    c = Config()
    c.JupyterHub.spawner_class = "trainhub.spawner.local.LocalGPUSpawner"
    c.LocalGPUSpawner.warm_pool_size = 1
    c.LocalGPUSpawner.warm_imports = ["json"]
    c.Isolation.sandbox = "none"
    c.Isolation.user_accounts = False
    c.Spawner.environment = {"TRAINHUB_CULLER_URL": "http://x", "LANG": "C.UTF-8"}

    async def scenario():
        before = set(warm._pools)
        prefill_warm_servers(c)
        await asyncio.sleep(0)  # the fill runs on the loop, after the configuration is loaded
        await asyncio.sleep(0)
        new = [warm._pools[k] for k in set(warm._pools) - before]
        assert len(new) == 1 and len(new[0].waiting) == 1
        spawner = LocalGPUSpawner(config=c)  # as the hub makes one for a user's spawn
        assert spawner._warm_pool() is new[0]
        taken = await new[0].take()
        assert taken is not None  # it becomes ready: a spawn would claim it
        taken.discard()
        for key in set(warm._pools) - before:
            for wp in warm._pools.pop(key).waiting:
                wp.discard()

        other = Config(c)
        other.JupyterHub.spawner_class = "jupyterhub.spawner.SimpleLocalProcessSpawner"
        prefill_warm_servers(other)  # another spawner: nothing started
        await asyncio.sleep(0)
        assert set(warm._pools) == before

    asyncio.run(scenario())


def test_a_failed_claim_discards_the_interpreter_and_says_why(tmp_path):
    """The spawner starts the server cold on WarmUnavailable; the failed interpreter never serves anyone."""
    from trainhub.spawner.warm import WarmUnavailable

    iso = Isolation(sandbox="none", user_accounts=False)

    async def scenario():
        pool = WarmPool(lambda fd: iso.command(warm_argv(sys.executable, fd, ["json"]), account=None, cwd="/"),
                        launch_env(["LANG"], {}, "/usr/bin:/bin"), 1, logging.getLogger("test-warm"))
        pool.fill()
        wp = await pool.take()
        spec = claim_spec([sys.executable, "-m", "json.tool"], {"HOME": "/"}, str(tmp_path / "missing"), None, False)
        with pytest.raises(WarmUnavailable, match="missing"):
            await pool.claim(wp, spec, [], 30)
        assert await asyncio.to_thread(wp.proc.wait, 30) != 0 and pool.claims == 0 and wp not in pool.waiting
        for other in pool.waiting:
            other.discard()

    asyncio.run(scenario())


def test_proc_environ_of_a_claimed_server_is_its_users_not_the_launch_one(tmp_path, caplog):
    """/proc/<pid>/environ, read from outside as ``ps e``, procs.processes_with and the culler test's server_env read
    it, is the launch environment before the claim and the server's own after it, as a cold start's execve gives
    it (warmsandbox.show_environ), with no note in the hub's log."""
    iso = Isolation(sandbox="none", user_accounts=False)
    (tmp_path / "wsleep.py").write_text("import time\nopen('started', 'w').close()\ntime.sleep(120)\n")
    launched = launch_env(["LANG"], {}, "/usr/bin:/bin")

    def environ(pid: int) -> dict:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        assert raw.endswith(b"\0"), raw
        return dict(e.split("=", 1) for e in raw.decode().split("\0") if e)

    async def scenario():
        pool = WarmPool(lambda fd: iso.command(warm_argv(sys.executable, fd, ["json"]), account=None, cwd="/"),
                        launched, 1, logging.getLogger("test-warm"))
        pool.fill()
        wp = await pool.take()
        try:
            assert environ(wp.pid) == dict(launched, TRAINHUB_HOLDER=wp.token)  # no user yet
            env = dict(launched, HOME=str(tmp_path), JUPYTERHUB_USER="envuser", JUPYTERHUB_API_TOKEN="token-of-envuser",
                       TRAINHUB_HOLDER=wp.token, SPACED="a b=c")
            spec = claim_spec([sys.executable, "-m", "wsleep"], env, str(tmp_path), None, False)
            await pool.claim(wp, spec, [], 30)
            await await_for(lambda: (tmp_path / "started").exists(), what="the claimed server to start", interval=0.02)
            return env, environ(wp.pid)
        finally:
            wp.discard()

    with caplog.at_level(logging.INFO, logger="test-warm"):
        env, shown = asyncio.run(scenario())
    assert shown == env and shown["JUPYTERHUB_USER"] == "envuser"
    assert not [r for r in caplog.records if "environ" in r.getMessage()], caplog.text


@root_only
def test_a_warm_server_is_its_user_as_a_cold_one_and_inherits_nothing_from_the_previous_user(tmp_path, iso):
    """A's warm server leaves module state, environment, a /tmp file and a changed folder; B's warm server, from
    the same pool, sees none of it and matches B's cold start in identity, environment, folder and view of files."""
    accounts = {u: iso.account(u) for u in ("warma", "warmb")}
    homes = {u: make_home(tmp_path, u, accounts[u]) for u in accounts}
    base = launch_env(["LANG", "LC_ALL"], {}, os.path.dirname(sys.executable) + ":/usr/bin:/bin")

    async def scenario():
        log = logging.getLogger("test-warm")
        pool = WarmPool(lambda fd: iso.command(warm_argv(sys.executable, fd, ["json", "jupyter_server.serverapp"]),
                                               account=None, cwd="/"), base, 2, log)
        pool.fill()
        results = {}
        for user, other, leave in (("warma", "warmb", "A-was-here"), ("warmb", "warma", "")):
            env = server_env(user, homes[user], f"token-of-{user}", "1" if user == "warma" else "2,3", base,
                             OTHER=json.dumps([str(homes[other])]), **({"LEAVE": leave} if leave else {}))
            wp, env = await claim_warm(pool, iso, accounts[user], homes[user], env)
            assert await asyncio.to_thread(wp.proc.wait, 60) == 0
            results[user] = (wp, env)
        for wp in pool.waiting:
            wp.discard()
        return results

    # the probe prints to the inherited stdout: capture it through a file
    results = {}
    out_file = tmp_path / "probe.out"
    with open(out_file, "w") as f:
        saved = os.dup(1)
        os.dup2(f.fileno(), 1)
        try:
            results = asyncio.run(scenario())
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    reports = [json.loads(l[6:]) for l in out_file.read_text().splitlines() if l.startswith("PROBE ")]
    assert len(reports) == 2, out_file.read_text()
    by_user = {r["env"]["JUPYTERHUB_USER"]: r for r in reports}
    a, b = by_user["warma"], by_user["warmb"]
    wp_b, env_b = results["warmb"]
    assert b["env"] == env_b  # exactly B's environment: B's token and devices, nothing of A's
    assert b["proc_env"] == env_b  # and /proc/<pid>/environ shows it (ps e, the culler test), as a cold start's
    assert b["env"]["JUPYTERHUB_API_TOKEN"] == "token-of-warmb" and b["env"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "LEAKED_ENV" not in b["env"] and b["leaked_attr"] is None and not b["leaked_module"]
    assert not any(name.startswith("leaked-") for name in b["tmp"])
    assert b["cwd"] == b["path0"] and os.path.samefile(b["cwd"], homes["warmb"])
    assert b["argv"] == ["--port=1"] and b["umask"] == 0o077
    if iso.use_accounts:
        acct = accounts["warmb"]
        assert (b["uid"], b["euid"], b["gid"], b["groups"]) == (acct.uid, acct.uid, acct.gid, [])
        assert b["caps"]["CapEff"] == "0000000000000000" and b["nnp"] == "1"
    # the same probe started cold for B sees the same
    cold = run_cold(iso, accounts["warmb"], homes["warmb"], dict(env_b, TRAINHUB_HOLDER="cold"))
    for key in ("uid", "euid", "gid", "groups", "cwd", "path0", "argv", "tmp", "other_home", "umask", "home_files", "nnp",
                "dumpable"):
        assert b[key] == cold[key], key
    assert {k: v for k, v in b["env"].items() if k != "TRAINHUB_HOLDER"} == {k: v for k, v in cold["env"].items() if k != "TRAINHUB_HOLDER"}
    assert b["caps"]["CapEff"] == cold["caps"]["CapEff"]
    assert cold["proc_env"] == cold["env"]  # what the warm one's /proc shows is what a cold start's shows
    if iso.use_sandbox:
        assert b["other_home"] == {str(homes["warma"]): False}  # A's home does not exist in B's sandbox
    assert a["env"]["JUPYTERHUB_USER"] == "warma" and wp_b.token == env_b["TRAINHUB_HOLDER"]


# user A's server runs this from A's ~/.jupyter: traces in the server process, its environment, /tmp and its folder
LEAVE_CONFIG = r'''
import json, os, sys
json.LEFT_BY = os.environ.get("JUPYTERHUB_USER")
sys.modules["left_by_previous_user"] = sys
os.environ["LEFT_BY"] = os.environ.get("JUPYTERHUB_USER", "")
open("/tmp/left-by-" + os.environ.get("JUPYTERHUB_USER", ""), "w").write("x")
os.chdir("/")
'''

# user B's server records what it sees into B's home
RECORD_CONFIG = r'''
import json, os, sys
report = {
    "cmdline": open("/proc/self/cmdline", "rb").read().decode(errors="replace").split("\0"),
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "cwd": os.getcwd(),
    "env": dict(os.environ), "tmp": sorted(os.listdir("/tmp")), "left": getattr(json, "LEFT_BY", None),
    "left_module": "left_by_previous_user" in sys.modules, "other_home": os.path.exists(OTHER_HOME),
}
with open(os.path.join(os.environ["HOME"], "warm-report.json"), "w") as f:
    json.dump(report, f)
'''


def write_jupyter_config(home: Path, text: str) -> None:
    conf = home / ".jupyter"
    conf.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o755)  # own_dir makes it the account's and 0700 at spawn
    (conf / "jupyter_server_config.py").write_text(text)
    os.chmod(conf, 0o755)
    os.chmod(conf / "jupyter_server_config.py", 0o644)


@root_only
def test_through_the_hub_the_next_users_warm_server_sees_nothing_of_the_previous_one(platform):
    import pwd

    a, b = "warmleaver", "warmrecorder"
    homes = {u: platform.data_dir / "homes" / u for u in (a, b)}
    write_jupyter_config(homes[a], LEAVE_CONFIG)
    write_jupyter_config(homes[b], f"OTHER_HOME = {str(homes[a])!r}\n" + RECORD_CONFIG)
    try:
        platform.spawn(a, "gpu-1")
        platform.stop_server(a)
        platform.spawn(b, "gpu-1")
        held = platform.held_by(b)
        report = json.loads((homes[b] / "warm-report.json").read_text())
        me = platform.api("GET", "/user", token=report["env"]["JUPYTERHUB_API_TOKEN"])  # while B's server runs
        # found as a cold server is, by its user in /proc/<pid>/environ (ps e, the culler test's server_env)
        from trainhub.boundary.procs import processes_with

        shown = {}
        for pid in processes_with("JUPYTERHUB_USER", b):
            try:
                if b"trainhub.spawner.warmstart" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    raw = Path(f"/proc/{pid}/environ").read_text()
                    shown = dict(e.split("=", 1) for e in raw.split("\0") if e)
            except OSError:
                pass
    finally:
        platform.stop_server(a)
        platform.stop_server(b)
    assert "trainhub.spawner.warmstart" in report["cmdline"], f"B's server did not start warm: {report['cmdline']}"
    assert report["left"] is None and not report["left_module"] and "LEFT_BY" not in report["env"]
    assert not any(name.startswith("left-by-") for name in report["tmp"]), report["tmp"]
    assert os.path.samefile(report["cwd"], homes[b])
    env = report["env"]
    assert env["JUPYTERHUB_USER"] == b and os.path.samefile(env["HOME"], homes[b])
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, held)) and len(held) == 1
    assert me.status_code == 200 and me.json()["name"] == b, me.text  # the token is B's
    assert shown.get("JUPYTERHUB_API_TOKEN") == env["JUPYTERHUB_API_TOKEN"], "B's server not found by its /proc environ"
    assert shown.get("TRAINHUB_INSTANCE") == platform.instance and shown.get("TRAINHUB_HOLDER")
    acct = pwd.getpwnam(f"th-{b}")
    assert (report["uid"], report["gid"], report["groups"]) == (acct.pw_uid, acct.pw_gid, [])
    if shutil.which("bwrap"):
        assert not report["other_home"]  # A's home does not exist in B's sandbox


SCAN_DEFAULTS = r"""
import os, sys, json
from trainhub.extensions import ENABLED_EXTENSIONS
from trainhub.spawner.warm import DEFAULT_IMPORTS
for name in (*DEFAULT_IMPORTS, *ENABLED_EXTENSIONS):  # as the platform's configuration has them
    __import__(name)
import jupyterlab.labapp  # the lab application, which the warm server imports when it starts
from traitlets import HasTraits
from trainhub.spawner.warmstart import _recompute_import_time_defaults
os.environ["HOME"] = sys.argv[2]
_recompute_import_time_defaults()
stale, todo = [], [HasTraits]
while todo:
    c = todo.pop()
    todo.extend(c.__subclasses__())
    for name, value in getattr(c, "_static_immutable_initial_values", {}).items():
        if isinstance(value, str) and sys.argv[1] in value:
            stale.append(f"{c.__module__}.{c.__name__}.{name} = {value}")
print(json.dumps(sorted(set(stale))))
"""


def test_no_default_keeps_the_home_the_warm_interpreter_imported_under(tmp_path):
    """A warm interpreter imports the server's modules before it knows its user: no trait default of any
    class they define may still point under the $HOME it had then once the claim set the user's."""
    before, after = tmp_path / "before-claim-home", tmp_path / "users-home"
    env = {**os.environ, "HOME": str(before)}
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTERLAB_WORKSPACES_DIR", "JUPYTERLAB_SETTINGS_DIR"):
        env.pop(var, None)
    r = subprocess.run([sys.executable, "-c", SCAN_DEFAULTS, str(before), str(after)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


@pytest.mark.skipif(not autogroups_enabled(), reason="this kernel shares the CPU by process, not by session")
def test_a_refill_imports_behind_a_starting_server_and_a_claimed_server_runs_at_normal_priority(tmp_path):
    """Issue 35 (rush hour): while a server starts, the pool's interpreters that still import run at
    BACKGROUND_NICE, and at 0 again once none starts; one a spawn takes while it imports is put back to 0 at once; a
    claimed interpreter's session is at 0 whatever the hub had given it, so no user's server is left behind others."""
    from trainhub.cpupriority import BACKGROUND_NICE, session_nice
    from trainhub.spawner.warm import renice_sessions

    go = tmp_path / "go"
    (tmp_path / "slowimport.py").write_text(  # an import that lasts until the test says so
        f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n")
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(60)\n")
    iso = Isolation(sandbox="none", user_accounts=False)

    async def scenario():
        pool = WarmPool(lambda fd: iso.command(warm_argv(sys.executable, fd, ["slowimport"]), account=None, cwd="/"),
                        launch_env(["LANG"], {"PYTHONPATH": str(tmp_path)}, "/usr/bin:/bin"), 2,
                        logging.getLogger("test-warm"))
        pool.fill()
        first, second = pool.waiting
        try:
            assert [session_nice(wp.pid) for wp in (first, second)] == [0, 0]
            async with pool.server_starting():
                await await_for(lambda: [session_nice(wp.pid) for wp in (first, second)],
                                lambda n: n == [BACKGROUND_NICE] * 2, what="the importing interpreters behind the start")
                async with pool.server_starting():  # a second start at once: still behind
                    pass
                assert session_nice(second.pid) == BACKGROUND_NICE
                go.write_text("")
                taken = await pool.take()  # the oldest: the spawn no longer waits behind anyone
                assert taken is first and session_nice(first.pid) == 0
            assert session_nice(second.pid) == 0  # no server starting: the refill takes any idle core again

            renice_sessions([second.pid], BACKGROUND_NICE)  # as if the hub had left it behind
            second.nice = BACKGROUND_NICE
            taken = await pool.take()
            assert taken is second and session_nice(second.pid) == 0
            # and even an interpreter the hub could not put back starts its server at 0 (warmstart.apply_claim)
            renice_sessions([second.pid], BACKGROUND_NICE)
            spec = claim_spec([sys.executable, "-m", "sleeper"], {"HOME": str(tmp_path), "PYTHONPATH": str(tmp_path)},
                              str(tmp_path), None, False)
            await pool.claim(second, spec, [], 30)
            assert session_nice(second.pid) == 0
        finally:
            for wp in (first, second, *pool.waiting):
                wp.discard()

    asyncio.run(scenario())
