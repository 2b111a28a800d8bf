"""Users kept apart on one machine, tried as a user and an attacker would, through a real `trainhub up`.

The tests run as root (as CI does), so `trainhub up` runs each user's servers, kernels and jobs as
their own Unix account (``th-<user>``), in a bubblewrap sandbox where bwrap is installed. User A's
kernel and job try to read B's home and storage area and the platform's secrets and databases, and
a symbolic link in A's outputs points at B's file; a job tries to replace ``TRAINHUB_INSTANCE``; the
data dir's databases, logs and secrets must be 0600; a locked database delays a submission instead
of failing it; a platform stop requeues the job it ended with "platform stopped".
"""

from __future__ import annotations

import json
import os
import pwd
import sqlite3
import stat
import threading
from pathlib import Path

import pytest
import requests

from trainhub.states import JOB_TERMINAL as TERMINAL
from waiting import wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="per-user accounts need `trainhub up` to run as root (CI does)"),
]

SECRET = "bob-private-7d1c"

# what A's kernel or job tries: every path's content, or the error that kept it out
PROBE = """
import json, os, glob
paths = json.loads({paths!r})
found = {{}}
for p in paths:
    try:
        if os.path.isdir(p):
            found[p] = "listed: " + ",".join(os.listdir(p))
        else:
            with open(p, "rb") as f:
                found[p] = "read: " + f.read(200).decode(errors="replace")
    except OSError as e:
        found[p] = "denied: " + type(e).__name__
print("PROBE " + json.dumps({{"uid": os.getuid(), "gid": os.getgid(), "found": found}}))
"""


class User:
    """A user of the jobs API (real HTTP)."""

    def __init__(self, platform, name):
        self.platform, self.name = platform, name
        self.url = platform.url + "/services/trainhub/api"
        self.h = {"Authorization": f"token {platform.token(name)}"}

    def submit(self, **spec) -> dict:
        r = requests.post(self.url + "/jobs", json=spec, headers=self.h, timeout=120)
        assert r.status_code == 201, r.text
        return r.json()

    def get(self, jid) -> dict:
        r = requests.get(f"{self.url}/jobs/{jid}", headers=self.h, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def wait(self, jid, states=TERMINAL, timeout=90) -> dict:
        return wait_for(lambda: self.get(jid), lambda job: job["state"] in states, what=f"job {jid} to be {sorted(states)}",
                        timeout=timeout)

    def logs(self, jid) -> str:
        return requests.get(f"{self.url}/jobs/{jid}/logs", headers=self.h, timeout=30).text

    def cancel(self, jid):
        requests.delete(f"{self.url}/jobs/{jid}", headers=self.h, timeout=30)


def uid_of(user: str) -> int:
    return pwd.getpwnam(f"th-{user}").pw_uid


def probe_result(text: str) -> dict:
    for line in text.splitlines():
        if "PROBE " in line:
            return json.loads(line.split("PROBE ", 1)[1])
    raise AssertionError(f"no probe output in:\n{text[-2000:]}")


def platform_files(data: Path) -> list[Path]:
    """The platform's secrets, databases and logs (what no user may read)."""
    files = [*data.glob("secrets/*"), *data.glob("*.sqlite"), *data.glob("logs/*"), data / "trainhub.json"]
    assert any(p.name.endswith(".sqlite") for p in files) and any(p.parent.name == "secrets" for p in files), files
    return files


@pytest.fixture(scope="module")
def bob_files(platform):
    """Bob's job writes a private file into his home and his storage area; returns their host paths."""
    bob = User(platform, "iso-bob")
    script = (
        "import os, pathlib\n"
        f"pathlib.Path(os.environ['HOME'], 'private.txt').write_text({SECRET!r})\n"
        f"pathlib.Path(os.environ['TRAINHUB_STORAGE_URL'].removeprefix('file://'), 'private.txt').write_text({SECRET!r})\n"
        "print('uid', os.getuid())\n"
    )
    job = bob.wait(bob.submit(script=script, name="bob-writes")["id"])
    assert job["state"] == "succeeded", (job, bob.logs(job["id"]))
    assert f"uid {uid_of('iso-bob')}" in bob.logs(job["id"])
    home = platform.data_dir / "homes" / "iso-bob"
    area = platform.data_dir / "storage" / "users" / "iso-bob"
    for folder in (home, area):
        st = folder.stat()
        assert st.st_uid == uid_of("iso-bob") and stat.S_IMODE(st.st_mode) == 0o700, (folder, oct(st.st_mode))
        assert (folder / "private.txt").read_text() == SECRET
    return [home / "private.txt", area / "private.txt", home, area]


def targets(platform, bob_files) -> list[str]:
    return [str(p) for p in bob_files + platform_files(platform.data_dir)] + [str(platform.data_dir)]


def assert_kept_out(result: dict, user: str, paths: list[str], data_dir: Path) -> None:
    assert result["uid"] == uid_of(user) and result["gid"] == pwd.getpwnam(f"th-{user}").pw_gid, result
    for p in paths:
        if p == str(data_dir):  # a sandbox shows the folders on the way to its own areas, nothing of the platform's
            seen = result["found"][p]
            assert seen.startswith("denied") or not {"secrets", "logs", "trainhub.sqlite", "jupyterhub.sqlite", "trainhub.json"} & set(
                seen.removeprefix("listed: ").split(",")), seen
            continue
        assert result["found"][p].startswith("denied"), (p, result["found"][p])
    assert SECRET not in json.dumps(result)


def test_a_job_runs_as_its_user_and_cannot_read_another_users_files_or_the_platforms(platform, bob_files):
    alice = User(platform, "iso-alice")
    paths = targets(platform, bob_files)
    job = alice.wait(alice.submit(script=PROBE.format(paths=json.dumps(paths)), name="alice-probes")["id"])
    assert job["state"] == "succeeded", (job, alice.logs(job["id"]))
    assert_kept_out(probe_result(alice.logs(job["id"])), "iso-alice", paths, platform.data_dir)


def test_a_kernel_runs_as_its_user_and_cannot_read_another_users_files_or_the_platforms(platform, bob_files):
    paths = targets(platform, bob_files)
    platform.spawn("iso-alice", "gpu-1")
    try:
        out = platform.kernel_exec("iso-alice", PROBE.format(paths=json.dumps(paths)) + "\nprint('home', os.path.expanduser('~'))\n")
    finally:
        platform.stop_server("iso-alice")
    assert_kept_out(probe_result(out), "iso-alice", paths, platform.data_dir)
    home = platform.data_dir / "homes" / "iso-alice"
    assert home.stat().st_uid == uid_of("iso-alice") and stat.S_IMODE(home.stat().st_mode) == 0o700


def test_a_symbolic_link_in_ones_outputs_does_not_export_another_users_file(platform, bob_files):
    alice = User(platform, "iso-alice")
    secrets = platform.data_dir / "secrets" / "admin-password"
    script = (
        "import os, pathlib\n"
        "out = pathlib.Path(os.environ['TRAINHUB_OUTPUTS_DIR'])\n"
        f"os.symlink({str(bob_files[0])!r}, out / 'link-to-bob.txt')\n"
        f"os.symlink({str(secrets)!r}, out / 'link-to-secret.txt')\n"
        f"os.symlink({str(bob_files[1])!r}, pathlib.Path(os.environ['TRAINHUB_JOB_DIR']) / 'work-link.txt')\n"
        "(out / 'own.txt').write_text('alice-own')\n"
    )
    job = alice.wait(alice.submit(script=script, name="alice-links")["id"])
    assert job["state"] == "succeeded", (job, alice.logs(job["id"]))
    synced = platform.data_dir / "storage" / "users" / "iso-alice" / "jobs" / job["id"]
    own = list(synced.rglob("own.txt"))
    assert own and own[0].read_text() == "alice-own", list(synced.rglob("*"))  # the sync ran
    admin_password = secrets.read_text()
    for f in synced.rglob("*"):
        if f.is_file() and not f.is_symlink():
            text = f.read_text(errors="replace")
            assert SECRET not in text and admin_password not in text, f
            assert f.stat().st_uid == uid_of("iso-alice"), f  # written as alice, into her area


def test_a_job_cannot_replace_the_platforms_variables(platform):
    alice = User(platform, "iso-alice")
    spec = {"command": "echo instance=$TRAINHUB_INSTANCE holder=$TRAINHUB_HOLDER", "name": "alice-env",
            "env": {"TRAINHUB_INSTANCE": "escaped", "TRAINHUB_HOLDER": "mine"}}
    r = requests.post(alice.url + "/jobs", json=spec, headers=alice.h, timeout=60)
    if r.status_code == 400:  # refused outright: also fine, and said clearly
        assert "TRAINHUB_" in r.json()["message"]
        return
    assert r.status_code == 201, r.text
    job = alice.wait(r.json()["id"])
    log = alice.logs(job["id"])
    assert f"instance={platform.instance}" in log and "escaped" not in log and "holder=mine" not in log, log


def test_databases_logs_and_secrets_are_the_platforms_alone(platform, bob_files):
    data = platform.data_dir
    assert stat.S_IMODE(data.stat().st_mode) & 0o077 in (0, 0o011)  # at most traversable, never listable
    for folder in (data / "secrets", data / "logs", data / "jobs"):
        assert stat.S_IMODE(folder.stat().st_mode) & 0o077 in (0, 0o011), folder
    for f in [*platform_files(data), *data.glob("*.sqlite-wal"), *data.glob("*.sqlite-shm")]:
        st = f.stat()
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600, (f, oct(st.st_mode))
    datasets = data / "storage" / "datasets"
    assert datasets.stat().st_uid == 0 and stat.S_IMODE(datasets.stat().st_mode) == 0o755


def test_a_locked_database_delays_a_submission_instead_of_failing_it(platform):
    alice = User(platform, "iso-alice")
    db = sqlite3.connect(platform.data_dir / "trainhub.sqlite", timeout=30, isolation_level=None)
    locked, release = threading.Event(), threading.Event()
    result = {}

    def submit():
        locked.wait()
        result["r"] = requests.post(alice.url + "/jobs", json={"command": "true", "name": "alice-locked"},
                                    headers=alice.h, timeout=120)

    t = threading.Thread(target=submit)
    t.start()
    try:
        db.execute("BEGIN IMMEDIATE")  # the write lock, as a long writer or someone's sqlite3 shell holds it
        locked.set()
        # the submission waits for the lock (no answer while we hold it); a condition with a deadline, never a sleep
        release.wait(7.0)  # past SQLite's own busy wait (5 s): the retry with backoff holds it
        assert "r" not in result, result["r"].text
    finally:
        db.execute("ROLLBACK")
        db.close()
        t.join(timeout=120)
    r = result["r"]
    assert r.status_code == 201, r.text
    assert alice.wait(r.json()["id"])["state"] == "succeeded"


def test_a_platform_stop_requeues_the_job_it_ended(platform_factory):
    p = platform_factory("iso-restart", gpus=1)
    carol = User(p, "iso-carol")
    jid = carol.submit(command="sleep 600", name="long")["id"]
    carol.wait(jid, states=("running",), timeout=60)
    p.stop()
    p.start()
    carol = User(p, "iso-carol")
    def seen():
        job = carol.get(jid)
        assert job["state"] not in TERMINAL, job
        events = requests.get(f"{carol.url}/jobs/{jid}/events", headers=carol.h, timeout=30).json()["items"]
        return job, [e for e in events if "platform stopped" in json.dumps(e)]

    job, said = wait_for(seen, lambda js: bool(js[1]) and js[0]["state"] in ("queued", "running"),
                         what=f"job {jid} requeued with 'platform stopped'", timeout=60)
    assert "SIGTERM" not in json.dumps(said), said
    carol.cancel(jid)
    assert carol.wait(jid)["state"] == "cancelled"


def test_the_ledger_gives_back_devices_of_gone_holders_within_a_poll(platform):
    """Holdings whose holder is gone without releasing them (a server that crashed while the database was locked,
    a job holding left by a service that died mid-launch) are freed by the platform on its own, not at restart."""
    import subprocess
    import sys

    from trainhub.ledger import LocalGPUAllocator
    from trainhub.settings import DataDir, Runtime

    runtime = Runtime.load(platform.data_dir)
    ledger = LocalGPUAllocator(db_url=DataDir(platform.data_dir).platform_db_url, device_list=runtime.devices)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    def gone_holder_is_freed(holder: str, kind: str, pid: int | None) -> None:
        # another test's server may still be stopping
        wait_for(ledger.free_devices, what="a free device", timeout=60, describe=lambda _: str(ledger.holdings()))
        # the holding exists (the reconciler may free it before a slower look, so none is taken here)
        assert len(ledger.allocate(holder, kind=kind, user="iso-ghost", count=1)) == 1
        if pid:
            ledger.set_pid(holder, pid)
        # the hub's poll is 2 s, the jobs engine's pass shorter: far within this
        wait_for(lambda: platform.held_by("iso-ghost"), lambda held: not held, what=f"{holder}'s device to come back",
                 timeout=60)

    gone_holder_is_freed("server:iso-ghost/", "server", dead.pid)  # its process is gone: the hub frees it
    gone_holder_is_freed("job:999999", "job", None)  # no such job is running: the jobs engine frees it
