"""End-to-end tests of the embedded platform: a real `trainhub up` (JupyterHub, proxy,
single-user servers, kernels) with 4 simulated GPUs. See tests/conftest.py for fixtures."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys

import pytest
import requests

from trainhub.procs import processes_with as _tagged
from waiting import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_with(var, value):
    """Live (non-zombie) processes carrying var=value in their environment."""
    live = []
    for pid in _tagged(var, value):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    live.append(pid)
        except OSError:
            pass
    return live

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def _clean_servers(request):
    """Every test leaves the shared platform with no server running."""
    yield
    if "platform" in request.fixturenames:
        p = request.getfixturevalue("platform")
        if p.running:
            p.stop_all_servers()


def pool_is_free(platform, timeout: float = 60) -> None:
    """Precondition of tests that count devices: nothing (from earlier tests) holds a GPU."""
    try:
        wait_for(lambda: platform.ledger()["free"] == 4, timeout=timeout, interval=1, what="all 4 GPUs free")
    except AssertionError:
        held = [(d["device"], d["holder"]) for d in platform.ledger()["devices"] if d["holder"]]
        raise AssertionError(f"an earlier test left GPUs held on the shared platform: {held}") from None


def assert_not_pending(platform, user):
    r = platform.api("GET", f"/users/{user}")
    assert r.status_code == 200
    model = r.json()
    assert not model.get("pending"), model
    assert not model.get("servers"), model


# -- login and users --------------------------------------------------------------

def test_a_start_logs_no_errors_before_the_banner(platform):
    """`trainhub up` waits for the hub on its own port and for the proxy's route before asking through the
    proxy, and the services' roots answer JupyterHub's check: no red proxy 404s, no 404 warnings."""
    log = (platform.data_dir / "logs" / "jupyterhub.log").read_text(errors="replace")
    start = log[:log.index("JupyterHub is now running")]
    assert "404 GET /hub/api/" not in start
    assert "404 GET /services/" not in start


def test_admin_logs_in_through_the_form(platform):
    s = platform.login(platform.admin_user, platform.admin_password)
    r = s.get(f"{platform.url}/hub/home", timeout=30)
    assert r.status_code == 200 and "Logout" in r.text
    with pytest.raises(AssertionError, match="login of admin failed"):
        platform.login(platform.admin_user, "wrong-password")


def test_users_add_then_login(platform):
    r = platform.cli("users", "add", "bob")
    m = re.search(r"user bob can log in with password: (\S+)", r.stdout)
    assert m, r.stdout
    s = platform.login("bob", m.group(1))
    assert s.get(f"{platform.url}/hub/home", timeout=30).status_code == 200
    listing = platform.cli("users", "list").stdout
    assert re.search(r"^bob\s", listing, re.M), listing


# -- spawning on the GPU ledger -----------------------------------------------------

def test_spawn_runs_kernel_on_ledger_device_and_users_get_disjoint_devices(platform):
    pool_is_free(platform)
    platform.spawn("alice", "gpu-1")
    held = platform.held_by("alice")
    assert len(held) == 1
    out = platform.kernel_exec(
        "alice", 'import os; print(os.environ["CUDA_VISIBLE_DEVICES"], os.environ["TRAINHUB_PROFILE"])'
    )
    assert out.split() == [str(held[0]), "gpu-1"]

    platform.spawn("bert", "gpu-2")
    bert = platform.held_by("bert")
    assert len(bert) == 2 and not set(bert) & set(held)
    out = platform.kernel_exec("bert", 'import os; print(os.environ["CUDA_VISIBLE_DEVICES"])')
    assert sorted(int(x) for x in out.strip().split(",")) == sorted(bert)

    ledger = platform.ledger()
    assert ledger["total"] == 4 and ledger["free"] == 1
    assert all(d["simulated"] for d in ledger["devices"])

    # stopping returns the devices
    platform.stop_server("alice")
    platform.stop_server("bert")
    assert platform.ledger()["free"] == 4


def test_cpu_profile_holds_no_gpu(platform):
    platform.spawn("carla", "cpu")
    assert platform.held_by("carla") == []
    out = platform.kernel_exec("carla", 'import os; print(repr(os.environ["CUDA_VISIBLE_DEVICES"]))')
    assert out.strip() == "''"
    platform.stop_server("carla")


def test_refusals_are_clear_4xx_never_500_or_stuck(platform):
    pool_is_free(platform)
    # unknown profile: 400 naming the choices
    r = platform.api("POST", "/users/quinn/server", platform.token("quinn"), json={"profile": "gpu-99"})
    assert r.status_code == 400, r.text
    assert "gpu-99" in r.json()["message"] and "gpu-1" in r.json()["message"]
    assert_not_pending(platform, "quinn")

    # a profile limited to another group: 403
    r = platform.api("POST", "/users/quinn/server", platform.token("quinn"), json={"profile": "gpu-4"})
    assert r.status_code == 403, r.text
    assert "research" in r.json()["message"]
    assert_not_pending(platform, "quinn")

    # over quota: the user holds 2 of 2 and asks for 1 more on a named server -> 403 with numbers
    platform.spawn("quinn", "gpu-2")
    r = platform.api("POST", "/users/quinn/servers/extra", platform.token("quinn"), json={"profile": "gpu-1"})
    assert r.status_code == 403, r.text
    msg = r.json()["message"]
    assert "quota" in msg and "2 of 2" in msg, msg
    model = platform.api("GET", "/users/quinn").json()
    assert "extra" not in (model.get("servers") or {}), model
    assert len(platform.held_by("quinn")) == 2

    # no free GPU: 2 + 2 held, a third user asks for 1 -> 409 with numbers
    platform.spawn("rhea", "gpu-2")
    assert platform.ledger()["free"] == 0
    r = platform.api("POST", "/users/sam/server", platform.token("sam"), json={"profile": "gpu-1"})
    assert r.status_code == 409, r.text
    assert "0 of 4 free" in r.json()["message"], r.text
    assert_not_pending(platform, "sam")
    # ... and the refusal did not take anything
    assert sorted(d["user"] for d in platform.ledger()["devices"]) == ["quinn", "quinn", "rhea", "rhea"]

    # once something stops, the same request succeeds
    platform.stop_server("rhea")
    platform.spawn("sam", "gpu-1")
    assert len(platform.held_by("sam")) == 1


def test_killed_server_returns_its_devices(platform):
    platform.spawn("kim", "gpu-1")
    ledger = platform.ledger()
    [row] = [d for d in ledger["devices"] if d["user"] == "kim"]
    from trainhub.config import load_platform_config
    from trainhub.ledger import LocalGPUAllocator

    [holding] = [h for h in LocalGPUAllocator(config=load_platform_config(platform.data_dir)).holdings() if h.user == "kim"]
    assert holding.pid, "the ledger records the server's pid"
    os.kill(holding.pid, signal.SIGKILL)
    # poll_interval is 2 s in the test config: the spawner's poll notices the dead server and releases its device
    wait_for(lambda: not platform.held_by("kim"), timeout=60, what="device released after SIGKILL")
    wait_for(lambda: platform.server_model("kim") is None, timeout=60, what="hub notices the dead server")
    # the device is usable again
    platform.spawn("kim", "gpu-1")
    assert platform.held_by("kim") == [row["device"]] or len(platform.held_by("kim")) == 1


# -- spawn page -------------------------------------------------------------------

def test_spawn_page_lists_allowed_profiles_with_availability_and_quota(platform):
    pool_is_free(platform)
    platform.cli("users", "add", "carol", "--password", "carol-secret-1")
    platform.cli("users", "add", "rita", "--password", "rita-secret-1", "--group", "research")
    platform.spawn("alice", "gpu-1")  # one device taken: 3 of 4 free

    html = platform.login("carol", "carol-secret-1").get(f"{platform.url}/hub/spawn", timeout=30).text
    for slug in ("cpu", "gpu-1", "gpu-2"):
        assert f'value="{slug}"' in html, slug
    assert 'value="gpu-4"' not in html
    assert "3 of 4 GPUs free (simulated)" in html
    assert "Your GPU quota: 2 of 2 remaining" in html

    html = platform.login("rita", "rita-secret-1").get(f"{platform.url}/hub/spawn", timeout=30).text
    assert 'value="gpu-4"' in html
    assert "over your quota (2 GPUs left)" in html  # gpu-4 needs 4, rita may hold 2
    # the form spawns too
    s = platform.login("carol", "carol-secret-1")
    r = s.post(f"{platform.url}/hub/spawn", data={"profile": "gpu-1", "_xsrf": s.cookies.get("_xsrf")}, timeout=60)
    assert r.status_code == 200
    wait_for(lambda: (platform.server_model("carol") or {}).get("ready"), timeout=120, what="carol's server ready")
    assert len(platform.held_by("carol")) == 1


# -- the CLI around `up` ----------------------------------------------------------

def run_cli(*args, timeout=60, **kw):
    return subprocess.run([sys.executable, "-m", "trainhub.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(REPO), **kw)


def test_up_on_all_interfaces_without_tls_warns(tmp_path):
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        r = run_cli("up", "--ip", "0.0.0.0", "--port", str(port), "--gpus", "1", "--data-dir", str(tmp_path / "d"))
        assert "WARNING" in r.stderr and "plain HTTP" in r.stderr, r.stderr
        assert r.returncode == 1 and "in use" in r.stderr  # stopped before starting anything
        r = run_cli("up", "--ip", "0.0.0.0", "--insecure", "--port", str(port), "--gpus", "1", "--data-dir", str(tmp_path / "d"))
        assert "WARNING" not in r.stderr
        r = run_cli("up", "--port", str(free_port()), "--ssl-cert", "x.pem", "--data-dir", str(tmp_path / "d"))
        assert r.returncode == 2 and "go together" in r.stderr
    finally:
        busy.close()


def test_help_of_each_command_and_bad_flags():
    from trainhub.cli import build_parser

    parser = build_parser()
    commands = list(parser._subparsers._group_actions[0].choices)
    assert {"up", "token", "status", "users"} <= set(commands)
    for cmd in ("up", "token", "status", "users"):
        r = run_cli(cmd, "--help")
        assert r.returncode == 0 and "usage: trainhub " + cmd in r.stdout, (cmd, r.stderr)
    r = run_cli("up", "--gpus", "many")
    assert r.returncode == 2 and "--gpus" in r.stderr and "--help" in r.stderr
    r = run_cli("status", "--no-such-flag")
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr
    r = run_cli("status", "--data-dir", "/nonexistent/trainhub")
    assert r.returncode == 1 and "trainhub up" in r.stderr and "Traceback" not in r.stderr


# -- a private platform: first start, restarts, crash, Ctrl-C ---------------------------

@pytest.mark.timeout(600)  # three starts and four spawns; slow on a loaded 2-core machine
def test_password_once_restart_keeps_ledger_consistent_and_ctrl_c_leaves_nothing(platform_factory):
    p = platform_factory("restarts")
    first = p.output
    password = p.admin_password
    assert f"password: {password}" in first
    mode = stat.S_IMODE(os.stat(p.data_dir / "secrets" / "admin-password").st_mode)
    assert mode == 0o600

    # 1. a clean restart with a server running: the server is stopped, its devices are free
    p.spawn("dana", "gpu-1")
    assert len(p.held_by("dana")) == 1
    p.restart()
    assert password not in p.output and "the password is in" in p.output
    assert p.login(p.admin_user, password)
    assert p.ledger()["free"] == 4
    assert p.server_model("dana") is None

    # 2. the hub crashes (SIGKILL) with a server running: the ledger keeps a stale holding
    #    until the next start, which releases it and leaves the user startable
    p.spawn("dana", "gpu-2")
    hub_pid = int((p.data_dir / "jupyterhub.pid").read_text())
    os.kill(hub_pid, signal.SIGKILL)
    p.proc.wait(timeout=60)  # `trainhub up` notices and cleans up the processes
    assert processes_with("TRAINHUB_INSTANCE", p.instance) == []
    assert len(p.held_by("dana")) == 2  # the stale holding (server process gone)
    p.start()
    assert p.ledger()["free"] == 4, p.ledger()
    assert p.server_model("dana") is None
    p.spawn("dana", "gpu-2")
    assert len(p.held_by("dana")) == 2

    # 3. Ctrl-C with a server and a kernel running leaves no process behind
    out = p.kernel_exec("dana", "print('kernel up')", keep_kernel=True)
    assert out.strip() == "kernel up"
    pids = processes_with("TRAINHUB_INSTANCE", p.instance)
    assert len(pids) >= 4  # hub, proxy, server, kernel (and services)
    code = p.stop(signal.SIGINT)  # asserts no process with the marker is left
    assert code == 0
    assert "SIGINT received" in p.output
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    assert p.ledger()["free"] == 4
