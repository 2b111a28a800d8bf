"""End-to-end tests of the embedded platform: a real `trainhub up` (JupyterHub, proxy,
single-user servers, kernels) with 4 simulated GPUs. See tests/conftest.py for fixtures."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys

import pytest
import requests

from trainhub.boundary.procs import processes_with as _tagged
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

    # no free GPU: 2 + 2 held, a third user asks for 1 and not to wait in line -> 409 with numbers
    platform.spawn("rhea", "gpu-2")
    assert platform.ledger()["free"] == 0
    r = platform.api("POST", "/users/sam/server", platform.token("sam"), json={"profile": "gpu-1", "wait": False})
    assert r.status_code == 409, r.text
    assert "0 of 4 free" in r.json()["message"], r.text
    assert_not_pending(platform, "sam")
    # ... and the refusal did not take anything
    assert sorted(d["user"] for d in platform.ledger()["devices"]) == ["quinn", "quinn", "rhea", "rhea"]

    # once something stops, the same request succeeds
    platform.stop_server("rhea")
    platform.spawn("sam", "gpu-1")
    assert len(platform.held_by("sam")) == 1


def progress_messages(platform, user: str, until: str, timeout: float = 60) -> list[str]:
    """The spawn's progress events (JupyterHub's EventSource stream) until one contains ``until``."""
    seen = []
    with requests.get(f"{platform.url}/hub/api/users/{user}/server/progress", stream=True, timeout=timeout,
                      headers={"Authorization": f"token {platform.token(user)}"}) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                seen.append(json.loads(line[5:])["message"])
                if until in seen[-1]:
                    return seen
    raise AssertionError(f"no progress event with {until!r}: {seen}")


def test_a_gpu_server_waits_in_line_with_its_place_and_starts_by_itself(platform):
    """Every GPU held: a GPU server's spawn waits in the jobs queue (202 pending, not 409), its progress
    says where it stands and what is free now, and it starts on its own when a GPU frees."""
    pool_is_free(platform)
    platform.spawn("una", "gpu-2")
    platform.spawn("vic", "gpu-2")
    assert platform.ledger()["free"] == 0
    r = platform.api("POST", "/users/wes/server", platform.token("wes"), json={"profile": "gpu-1"})
    assert r.status_code == 202, r.text
    first = progress_messages(platform, "wes", "in line")[-1]
    assert "in line for 1 GPU, number 1 of 1 waiting for GPUs. Waiting for 1 GPU: 0 of 4 free" in first, first
    assert "no start time can be promised" in first, first  # servers hold the GPUs without a time limit
    assert "Free now: CPU" in first, first  # the way out
    model = platform.api("GET", "/users/wes").json()
    assert model["pending"] == "spawn" and not platform.held_by("wes")
    # a second request queues behind it
    r = platform.api("POST", "/users/xan/server", platform.token("xan"), json={"profile": "gpu-1"})
    assert r.status_code == 202, r.text
    second = progress_messages(platform, "xan", "number 2 of 2")[-1]
    assert "number 2 of 2 waiting for GPUs" in second and "behind wes's notebook server" in second, second
    platform.stop_server("una")  # two GPUs free: both start by themselves, in order
    for user in ("wes", "xan"):
        wait_for(lambda: platform.server_model(user), lambda m: bool(m and m.get("ready")),
                 what=f"{user}'s queued server to start by itself", timeout=120)
        assert len(platform.held_by(user)) == 1
    for user in ("vic", "wes", "xan"):
        platform.stop_server(user)


def test_servers_and_jobs_share_one_line_with_an_estimate_from_time_limits(platform):
    """GPUs held by jobs with time limits: the waiting server gets the scheduler's reserved start, and
    a job submitted after it waits behind it (one queue, one policy)."""
    pool_is_free(platform)
    api = f"{platform.url}/services/trainhub/api"
    held = []
    for user in ("line-j1", "line-j2"):
        r = requests.post(api + "/jobs", json={"command": "sleep 600", "gpus": 2, "time_limit": "10m"},
                          headers={"Authorization": f"token {platform.token(user)}"}, timeout=30)
        assert r.status_code == 201, r.text
        held.append((user, r.json()["id"]))
    wait_for(lambda: platform.ledger()["free"], lambda free: free == 0, what="both jobs holding their GPUs", timeout=60)
    r = platform.api("POST", "/users/line-s/server", platform.token("line-s"), json={"profile": "gpu-1"})
    assert r.status_code == 202, r.text
    msg = progress_messages(platform, "line-s", "expected to start")[-1]
    # the jobs' time limits give the estimate; the reservation comes after the scheduler's reserve_after
    assert re.search(r"expected to start in about (9m\d\ds|10m00s) \(running work's time limits\)", msg), msg
    assert re.search(r"\(about \d\d:\d\d\)", msg), msg
    later = requests.post(api + "/jobs", json={"command": "true", "gpus": 1},
                          headers={"Authorization": f"token {platform.token('line-k')}"}, timeout=30).json()
    wait_for(lambda: requests.get(f"{api}/jobs/{later['id']}", timeout=30,
                                  headers={"Authorization": f"token {platform.token('line-k')}"}).json()["reason"],
             lambda reason: "behind line-s's notebook server" in reason, what="the later job to wait behind the server",
             timeout=30)
    for user, jid in held:
        requests.delete(f"{api}/jobs/{jid}", headers={"Authorization": f"token {platform.token(user)}"}, timeout=30)
    wait_for(lambda: platform.server_model("line-s"), lambda m: bool(m and m.get("ready")),
             what="the server to start once the jobs are cancelled", timeout=120)
    platform.stop_server("line-s")


def test_a_cancelled_wait_leaves_nothing_behind(platform):
    from trainhub.config import load_platform_config
    from trainhub.serverqueue import ServerQueue

    queue = ServerQueue(load_platform_config(platform.data_dir).LocalGPUAllocator.db_url)
    pool_is_free(platform)
    platform.spawn("yan", "gpu-2")
    platform.spawn("zed", "gpu-2")
    r = platform.api("POST", "/users/abe/server", platform.token("abe"), json={"profile": "gpu-1"})
    assert r.status_code == 202, r.text
    progress_messages(platform, "abe", "in line")
    assert [q.holder for q in queue.all()] == ["server:abe/"]
    platform.stop_server("abe")  # JupyterHub's Stop Server on the pending page: the spawn is cancelled
    assert queue.all() == [] and platform.server_model("abe") is None
    platform.stop_server("yan")
    # the two freed GPUs are there for the next request: the withdrawn one took nothing
    r = platform.api("POST", "/users/ada/server", platform.token("ada"), json={"profile": "gpu-2", "wait": False})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: platform.server_model("ada"), lambda m: bool(m and m.get("ready")), what="ada's server", timeout=120)
    assert not platform.held_by("abe") and len(platform.held_by("ada")) == 2
    for user in ("ada", "zed"):
        platform.stop_server(user)


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

    # 2. `trainhub up` itself is killed (SIGKILL) with a server running (a hub that dies alone is started again:
    #    tests/platform/test_supervised_hub.py): the ledger keeps a stale holding until the next start, which ends
    #    what the dead run left, releases the holding and leaves the user startable
    p.spawn("dana", "gpu-2")
    os.kill(p.proc.pid, signal.SIGKILL)
    p.proc.wait(timeout=60)
    assert len(p.held_by("dana")) == 2  # the holding of a run that did not stop
    p.start()
    assert "left by the previous run, which did not stop" in p.output, p.output
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
