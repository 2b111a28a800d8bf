"""Warm isolated job workers through the launcher (services/jobs/pooledstart.py over warmpool.py): a claimed pool
entry is the user's worker exactly as a cold start would make it, and nothing one user's worker does reaches another's
through the pool. The pool's own mechanics, without root, are tests/platform/test_warm_pool.py.

The tests use the real LocalLauncher with the real Isolation (as root: each user's own Unix account, in a bubblewrap
sandbox where bwrap is installed), a local storage root and device nodes of their own: user A's warm worker leaves module state,
environment, a /tmp file and a changed folder; user B's warm worker, from the same pool, sees none of it, and what
it sees (uid, groups, capabilities, environment, devices, folder, mounts) matches B's same probe started cold. The
last ones go through a real `trainhub up`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import stat
import threading
import time
from pathlib import Path

import pytest
from waiting import await_for, wait_for

from trainhub.boundary.accounts import UserAccounts
from trainhub.boundary.isolation import Isolation
from trainhub.services.jobs.launcher import JobView
from trainhub.services.jobs.local import LocalLauncher
from trainhub.storage import StorageConfig

from test_warm_pool import base_env, root_only

# what a worker sees, as one log line; with LEAVE set it also leaves traces for the next one
PROBE = r'''
import json, os, sys, json as _j
leave = os.environ.get("LEAVE")
nodes = json.loads(os.environ.get("NODES", "[]"))
report = {
    "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(), "cwd": os.getcwd(),
    "path0": sys.path[0], "argv": sys.argv, "name": __name__, "file": __file__, "env": dict(os.environ),
    "tmp": sorted(os.listdir("/tmp")), "leaked_attr": getattr(_j, "LEAKED_BY", None),
    "leaked_module": "leaked_mod" in sys.modules, "umask": os.umask(0o22),
    "other": {p: os.path.exists(p) for p in json.loads(os.environ.get("OTHER", "[]"))},
    "caps": {l.split(":")[0]: l.split()[1] for l in open("/proc/self/status") if l.startswith("Cap")},
    "nnp": [l.split()[1] for l in open("/proc/self/status") if l.startswith("NoNewPrivs")][0],
    "nodes": {n: os.path.exists(n) for n in nodes},
    "mounts": sorted((l.split()[4], l.split()[5]) for l in open("/proc/self/mountinfo")),
    "home_files": sorted(os.listdir(os.environ["HOME"])),
    "writable": {p: os.access(p, os.W_OK) for p in json.loads(os.environ.get("WRITABLE", "[]"))},
    "heavy": sorted(m for m in ("torch", "numpy", "jupyter_server", "tornado") if m in sys.modules),
    "nice": os.getpriority(os.PRIO_PROCESS, 0),
    "proc_env": dict(e.split("=", 1) for e in open("/proc/self/environ").read().split("\0") if e),
    "dumpable": __import__("ctypes").CDLL(None).prctl(3, 0, 0, 0, 0),
}
if leave:
    _j.LEAKED_BY = leave
    sys.modules["leaked_mod"] = sys
    os.environ["LEAKED_ENV"] = leave
    open("/tmp/leaked-" + leave, "w").write(leave)
    open(os.path.join(os.environ["HOME"], "left-" + leave), "w").write(leave)
    os.chdir("/")
print("PROBE " + json.dumps(report), flush=True)
'''


def job_view(key: str, user: str, script: str, env: dict | None = None, workers: int = 1, attempt: int = 1) -> JobView:
    return JobView(id=int(key.split("-")[1]), key=key, user=user, name=key, command=None, script=script, workers=workers,
                   gpus=0, env=env or {}, attempt=attempt, time_limit=None)


async def finish(launcher: LocalLauncher, job: JobView, state: dict, timeout: float = 60) -> list:
    return await await_for(lambda: launcher.poll(job, state), lambda statuses: all(not s.running for s in statuses),
                           what=f"every worker of {job.key} to end", timeout=timeout, interval=0.02)


def probe_of(state: dict) -> dict:
    text = Path(state["workers"][0]["log"]).read_text()
    lines = [l for l in text.splitlines() if "PROBE " in l]
    assert lines, text
    return json.loads(lines[-1].split("PROBE ", 1)[1])


def test_pool_settings_out_of_range_are_refused_clearly():
    from traitlets import TraitError

    with pytest.raises(TraitError, match="isolated_warm_pool_size must be zero or more, not -1"):
        LocalLauncher(isolated_warm_pool_size=-1)
    with pytest.raises(TraitError, match="isolated_warm_claim_timeout must be positive"):
        LocalLauncher(isolated_warm_claim_timeout=0)
    assert LocalLauncher(isolated_warm_pool_size=0, isolated_refill_delay=0).isolated_warm_pool_size == 0


# -- two users through the real launcher, as root ---------------------------------------------------
@pytest.fixture
def isolated(tmp_path):
    os.chmod(tmp_path, 0o711)
    from trainhub.app.up import code_paths

    iso = Isolation(code_paths=code_paths(), gpu_device_nodes=[str(tmp_path / "dev" / "fakegpu{minor}")], gpu_shared_nodes=[])
    iso.accounts = UserAccounts(parent=iso)
    dev = tmp_path / "dev"
    dev.mkdir()
    os.chmod(dev, 0o755)
    for minor in range(4):  # character devices (the null device's numbers): what a GPU's node looks like to a mount
        os.mknod(dev / f"fakegpu{minor}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    data = tmp_path / "data"
    data.mkdir()
    storage = StorageConfig(url=f"file://{data / 'storage'}")

    def launcher(**kw) -> LocalLauncher:
        return LocalLauncher(data_dir=str(data), isolation=iso, storage=storage, **kw)

    return iso, data, launcher


@root_only
async def test_two_users_warm_workers_share_nothing_and_match_a_cold_start(tmp_path, isolated):
    iso, data, make = isolated
    warm = make(isolated_warm_pool_size=2, isolated_refill_delay=30.0)  # both workers come from the one pool filled at first
    cold = make(isolated_warm_pool_size=0)
    nodes = [str(tmp_path / "dev" / f"fakegpu{m}") for m in range(4)]
    homes = {u: str(data / "homes" / u) for u in ("wja", "wjb")}
    try:
        # A's warm worker leaves traces everywhere it can
        a_env = {"LEAVE": "A-was-here", "NODES": json.dumps(nodes), "OTHER": json.dumps([homes["wjb"]])}
        job_a = job_view("j-000001", "wja", PROBE, a_env)
        state_a = await warm.launch(job_a, [[0]], base_env(HOME=homes["wja"]))
        assert [w["start"] for w in state_a["workers"]] == ["warm-isolated"]
        assert [s.exit_code for s in await finish(warm, job_a, state_a)] == [0]
        a = probe_of(state_a)

        # B: the same probe cold, then warm (same job, same paths)
        jdir = data / "jobs" / "j-000002"
        b_env = {"NODES": json.dumps(nodes), "WRITABLE": json.dumps([str(jdir / "outputs"), str(jdir / "work"), str(jdir / "script.py"), str(jdir)]),
                 "OTHER": json.dumps([homes["wja"], str(data / "jobs" / "j-000001"), str(data / "storage" / "users" / "wja"),
                                      os.path.join(homes["wja"], "left-A-was-here")])}
        job_b = job_view("j-000002", "wjb", PROBE, b_env)
        state_cold = await cold.launch(job_b, [[2, 3]], base_env(HOME=homes["wjb"]))
        assert [w["start"] for w in state_cold["workers"]] == ["cold"]
        assert [s.exit_code for s in await finish(cold, job_b, state_cold)] == [0]
        c = probe_of(state_cold)
        for w in state_cold["workers"]:
            os.unlink(w["log"])
            os.unlink(w["exit_file"])
        state_b = await warm.launch(job_b, [[2, 3]], base_env(HOME=homes["wjb"]))
        assert [w["start"] for w in state_b["workers"]] == ["warm-isolated"] and warm._pooled.pool.claims == 2
        assert [s.exit_code for s in await finish(warm, job_b, state_b)] == [0]
        b = probe_of(state_b)
    finally:
        await warm.close()
        await cold.close()

    # A ran as A, warm, with A's device only
    acct_a, acct_b = iso.account("wja"), iso.account("wjb")
    assert (a["uid"], a["gid"], a["groups"]) == (acct_a.uid, acct_a.gid, [])
    assert a["other"] == {homes["wjb"]: False} and a["nodes"][nodes[0]] and not a["nodes"][nodes[1]]
    # nothing of A's reached B's worker
    assert "LEAKED_ENV" not in b["env"] and b["leaked_attr"] is None and not b["leaked_module"]
    assert not any(n.startswith("leaked-") for n in b["tmp"]), b["tmp"]
    assert not any(b["other"].values()), b["other"]  # A's home, job folder, storage area and files do not exist
    # B's warm worker is B's worker as a cold start makes it
    assert (b["uid"], b["euid"], b["gid"], b["groups"]) == (acct_b.uid, acct_b.uid, acct_b.gid, [])
    assert b["caps"]["CapEff"] == b["caps"]["CapPrm"] == b["caps"]["CapAmb"] == "0000000000000000" and b["nnp"] == "1"
    for key in ("uid", "euid", "gid", "groups", "cwd", "path0", "argv", "name", "file", "tmp", "umask", "nnp", "nodes",
                "mounts", "home_files", "writable", "other", "heavy", "nice", "dumpable"):
        assert b[key] == c[key], (key, b[key], c[key])
    for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):  # the bounding set: warm empties it (stricter than setpriv)
        assert b["caps"][cap] == c["caps"][cap], cap
    differ = {"TRAINHUB_HOLDER", "MASTER_PORT", "PET_MASTER_PORT"}  # a launch's own marker and rendezvous port
    assert {k: v for k, v in b["env"].items() if k not in differ} == {k: v for k, v in c["env"].items() if k not in differ}
    assert b["proc_env"] == b["env"] and c["proc_env"] == c["env"]  # /proc/<pid>/environ: the job's, warm as cold
    assert a["proc_env"]["HOME"] == homes["wja"] and b["proc_env"]["HOME"] == homes["wjb"]
    assert b["nodes"] == {n: i in (2, 3) for i, n in enumerate(nodes)}
    assert a["heavy"] == b["heavy"] == []  # the pool's interpreters import nothing heavy
    assert b["writable"] == {str(jdir / "outputs"): True, str(jdir / "work"): True, str(jdir / "script.py"): False, str(jdir): False}


@root_only
async def test_cancel_time_limit_and_adoption_of_a_warm_isolated_worker(tmp_path, isolated):
    """terminate() signals the warm worker's group as a cold one's: SIGTERM reaches the script (not bwrap), the exit is
    recorded as -SIGTERM; a new launcher (a service restart) adopts and watches it; nothing of it is left."""
    from trainhub.boundary import procs

    _iso, data, make = isolated
    launcher = make(isolated_warm_pool_size=1)
    ended = asyncio.Event()
    launcher.watch_exits(ended.set)
    try:
        job = job_view("j-000003", "wjc", "import time\nprint('up', flush=True)\ntime.sleep(120)\n")
        state = await launcher.launch(job, [[]], base_env(HOME=str(data / "homes" / "wjc")))
        assert [w["start"] for w in state["workers"]] == ["warm-isolated"]
        log = Path(state["workers"][0]["log"])
        await await_for(lambda: log.read_text() if log.exists() else "", lambda t: "up" in t, what="'up' in the log",
                        timeout=60, interval=0.02)
        adopter = make()
        assert await adopter.adopt(job, state)
        assert [s.running for s in await adopter.poll(job, state)] == [True]
        t0 = time.monotonic()
        await launcher.terminate(job, state, grace=10)
        assert time.monotonic() - t0 < 9, "SIGTERM did not end the script: it waited for the SIGKILL"
        assert [s.exit_code for s in await launcher.poll(job, state)] == [-signal.SIGTERM]
        await asyncio.wait_for(ended.wait(), 10)
        await launcher.cleanup(job, state)
        holder = state["workers"][0]["holder"]
        assert wait_for(lambda: procs.processes_with("TRAINHUB_HOLDER", holder) == [], what="no process left", timeout=10)
    finally:
        await launcher.close()
    assert launcher._pooled.pool.waiting == []


@root_only
async def test_a_gang_takes_what_the_pool_has_and_starts_the_rest_cold(tmp_path, isolated):
    _iso, data, make = isolated
    launcher = make(isolated_warm_pool_size=2, isolated_refill_delay=30.0)
    try:
        job = job_view("j-000005", "wje", "import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)\n",
                       workers=3)
        state = await launcher.launch(job, [[], [], []], base_env(HOME=str(data / "homes" / "wje")))
        assert [w["start"] for w in state["workers"]] == ["warm-isolated", "warm-isolated", "cold"]
        assert len({w["pid"] for w in state["workers"]}) == 3 and all(os.getpgid(w["pid"]) == w["pid"] for w in state["workers"])
        assert [s.exit_code for s in await finish(launcher, job, state)] == [0, 0, 0]
        for w in state["workers"]:
            assert f"[{w['rank']}] rank {w['rank']} of 3" in Path(w["log"]).read_text()
        assert launcher._pooled.pool.claims == 2 and launcher._pooled.pool.waiting == []
    finally:
        await launcher.close()
    assert launcher._pooled.pool.fill() == 0  # closed: a refill scheduled before close() starts nothing


@root_only
async def test_the_pool_fills_when_the_service_starts_so_the_first_job_starts_warm(tmp_path, isolated):
    _iso, data, make = isolated
    launcher = make(isolated_warm_pool_size=2, isolated_refill_delay=30.0)
    try:
        assert launcher._pooled.pool is None
        await launcher.start()  # the engine's start, after recovery
        assert launcher._pooled.pool is not None and len(launcher._pooled.pool.waiting) == 2
        job = job_view("j-000006", "wjf", "print('first', flush=True)\n")
        state = await launcher.launch(job, [[]], base_env(HOME=str(data / "homes" / "wjf")))
        assert [w["start"] for w in state["workers"]] == ["warm-isolated"]
        assert [s.exit_code for s in await finish(launcher, job, state)] == [0]
    finally:
        await launcher.close()
    plain = LocalLauncher(data_dir=str(tmp_path / "plain"), isolation=None)
    await plain.start()  # nothing isolated: no pool
    assert plain._pooled.pool is None


@root_only
async def test_with_an_entry_ready_a_job_starts_on_the_event_loop_and_a_refused_claim_there_starts_it_cold(
        tmp_path, isolated, monkeypatch, caplog):
    """A one-worker script job of a known account with an entry ready starts on the event loop (the claim handed over,
    its answer awaited); the first job of a new account starts on a thread (its account is made then). A claim the warm
    interpreter refuses there discards the entry, which recorded nothing, and the worker starts cold on a thread."""
    _iso, data, make = isolated
    launcher = make(isolated_warm_pool_size=3, isolated_refill_delay=30.0)
    on_loop = []
    real_launch = launcher._launch

    def spy(*args, **kw):
        on_loop.append(threading.current_thread() is threading.main_thread())
        return real_launch(*args, **kw)

    monkeypatch.setattr(launcher, "_launch", spy)
    home = str(data / "homes" / "wjg")
    try:
        await launcher.start()
        pool = launcher._pooled.pool
        await await_for(lambda: sum(e.check_ready() for e in pool.waiting), lambda n: n == 3, what="3 entries ready",
                        timeout=60, interval=0.02)
        known = _iso.accounts.lookup("wjg") is not None  # (accounts outlive a test run on the same machine)
        first = job_view("j-000007", "wjg", "print('first job', flush=True)\n")
        state = await launcher.launch(first, [[]], base_env(HOME=home))
        assert on_loop == [known] and [w["start"] for w in state["workers"]] == ["warm-isolated"]
        assert [s.exit_code for s in await finish(launcher, first, state)] == [0]

        job = job_view("j-000008", "wjg", "import os\nprint('on the loop as', os.getuid(), flush=True)\n")
        state = await launcher.launch(job, [[]], base_env(HOME=home))
        assert on_loop == [known, True] and [w["start"] for w in state["workers"]] == ["warm-isolated"]
        assert [s.exit_code for s in await finish(launcher, job, state)] == [0]
        uid = _iso.account("wjg").uid
        assert f"[0] on the loop as {uid}" in Path(state["workers"][0]["log"]).read_text()

        real_hand_over = pool.hand_over  # the interpreter is sent a working folder it does not have: it refuses

        def missing_cwd(entry, spec, *args):
            return real_hand_over(entry, dict(spec, cwd=str(tmp_path / "no-such-folder")), *args)

        monkeypatch.setattr(pool, "hand_over", missing_cwd)
        refused = job_view("j-000009", "wjg", "print('cold after all', flush=True)\n")
        with caplog.at_level(logging.INFO):
            state = await launcher.launch(refused, [[]], base_env(HOME=home))
        assert on_loop == [known, True, True, False] and [w["start"] for w in state["workers"]] == ["cold"]
        assert "worker 0 starts cold: the warm worker failed its claim" in caplog.text
        assert "no-such-folder" in caplog.text
        assert [s.exit_code for s in await finish(launcher, refused, state)] == [0]
        lines = Path(state["workers"][0]["log"]).read_text().splitlines()
        assert len(lines) == 1 and lines[0].endswith("[0] cold after all"), lines  # nothing of the refused entry
        assert pool.claims == 2 and pool.waiting == []
    finally:
        await launcher.close()


@root_only
async def test_a_job_that_changes_python_start_up_starts_cold_with_a_log_line(tmp_path, isolated, caplog):
    _iso, data, make = isolated
    launcher = make(isolated_warm_pool_size=1)
    try:
        job = job_view("j-000004", "wjd", "import sys\nprint('hash', sys.flags.hash_randomization)\n", {"PYTHONHASHSEED": "0"})
        with caplog.at_level(logging.INFO):
            state = await launcher.launch(job, [[]], base_env(HOME=str(data / "homes" / "wjd")))
        assert [w["start"] for w in state["workers"]] == ["cold"]
        assert "starts cold: start-up variables differ" in caplog.text and "PYTHONHASHSEED" in caplog.text
        assert [s.exit_code for s in await finish(launcher, job, state)] == [0]
        assert "hash 0" in Path(state["workers"][0]["log"]).read_text()
        assert len(launcher._pooled.pool.waiting) == 1 and launcher._pooled.pool.claims == 0  # not handed out: still waiting
    finally:
        await launcher.close()


# -- through a real `trainhub up` ---------------------------------------------------------------------
@root_only
@pytest.mark.e2e
def test_through_the_platform_an_isolated_script_job_runs_warm_and_cancel_kills_it(platform):
    import pwd

    import requests

    from trainhub.states import JOB_TERMINAL

    user = "warmjobber"
    url = platform.url + "/services/trainhub/api"
    h = {"Authorization": f"token {platform.token(user)}"}

    def submit(**spec) -> str:
        r = requests.post(url + "/jobs", json=spec, headers=h, timeout=120)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def get(jid) -> dict:
        return requests.get(f"{url}/jobs/{jid}", headers=h, timeout=30).json()

    def wait(jid, states=JOB_TERMINAL, timeout=120) -> dict:
        return wait_for(lambda: get(jid), lambda job: job["state"] in states, what=f"job {jid} in {sorted(states)}",
                        timeout=timeout)

    def logs(jid) -> str:
        return requests.get(f"{url}/jobs/{jid}/logs", headers=h, timeout=30).text

    def launch_state(jid) -> dict:
        from sqlalchemy import create_engine, select

        from trainhub.services.jobs.models import Job, parse_job_key
        from trainhub.settings import DataDir

        engine = create_engine(DataDir(platform.data_dir).platform_db_url)
        with engine.connect() as c:
            state = c.execute(select(Job.launch_state).where(Job.id == parse_job_key(jid))).scalar_one()
        engine.dispose()
        return state or {}

    def start_path(jid) -> list[str]:
        return [w.get("start") for w in launch_state(jid).get("workers", [])]

    script = ("import os, pathlib\n"
              "pathlib.Path(os.environ['TRAINHUB_OUTPUTS_DIR'], 'result.txt').write_text('forty-two')\n"
              "print('uid', os.getuid(), 'cwd', os.getcwd(), flush=True)\n")
    first = submit(script=script, name="warm-first")  # the pool filled as the jobs service started
    assert wait(first)["state"] == "succeeded", logs(first)
    assert start_path(first) == ["warm-isolated"], start_path(first)
    jid = submit(script=script, name="warm-result")
    job = wait(jid)
    assert job["state"] == "succeeded", logs(jid)
    assert start_path(jid) == ["warm-isolated"], start_path(jid)
    acct = pwd.getpwnam(f"th-{user}")
    assert f"uid {acct.pw_uid} cwd {platform.data_dir / 'homes' / user}" in logs(jid)
    synced = platform.data_dir / "storage" / "users" / user / "jobs" / jid / "outputs" / "result.txt"
    wait_for(synced.exists, what="the synced output", timeout=60)
    assert synced.read_text() == "forty-two"

    long = submit(script="import time, os\nprint('pid', os.getpid(), 'running', flush=True)\ntime.sleep(300)\n", name="warm-cancel")
    wait_for(lambda: logs(long), lambda text: "running" in text, what="the long job to run", timeout=120)
    assert start_path(long) == ["warm-isolated"]
    t0 = time.monotonic()
    requests.delete(f"{url}/jobs/{long}", headers=h, timeout=30)
    assert wait(long, timeout=60)["state"] == "cancelled"
    assert time.monotonic() - t0 < 30
    from trainhub.boundary import procs

    state = launch_state(long)
    markers = [state["tag"], state["workers"][0]["holder"]]
    left = wait_for(lambda: [p for m in markers for p in procs.processes_with("TRAINHUB_HOLDER", m)], lambda pids: not pids,
                    what="no process of the cancelled job", timeout=30)
    assert left == []
