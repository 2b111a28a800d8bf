"""The rules of trainhub.isolation and trainhub.accounts without a platform: account names, which accounts are
never used, who may run on a platform that cannot isolate users, the banner, a real bubblewrap sandbox's view,
and the job environment's hand-over (envexec)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from trainhub import envexec
from trainhub.accounts import UNIX_NAME, AccountError, UserAccounts
from trainhub.exceptions import Forbidden
from trainhub.isolation import Isolation


def test_account_names_are_portable_and_distinct():
    accounts = UserAccounts()
    assert accounts.unix_name("alice") == "th-alice"
    odd = ["Alice@example.org", "alice.example", "x" * 60, "ALICE"]
    names = [accounts.unix_name(n) for n in odd]
    for n in names:
        assert UNIX_NAME.match(n) and len(n) <= 32, n
    assert len(set(names + ["th-alice"])) == len(odd) + 1


def test_a_system_account_is_never_a_users_account():
    accounts = UserAccounts(name_template="{username}")
    with pytest.raises(AccountError, match="outside trainhub's range"):
        accounts.lookup("root")


def test_a_platform_that_cannot_isolate_serves_only_its_admin_unless_told_loudly():
    iso = Isolation(user_accounts=False, sandbox="none", single_user="admin")
    assert iso.mode == "none" and not iso.isolated
    iso.check_user("admin")
    with pytest.raises(Forbidden, match="cannot isolate users"):
        iso.check_user("bob")
    assert "only 'admin' may" in "\n".join(iso.describe([]))
    shared = Isolation(user_accounts=False, sandbox="none", single_user="admin", allow_shared_account=True)
    shared.check_user("bob")
    assert "NO ISOLATION BETWEEN USERS" in "\n".join(shared.describe([]))


def test_a_sandbox_sees_its_own_area_and_not_the_rest(tmp_path):
    if not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed")
    iso = Isolation(user_accounts=False, sandbox="bwrap")
    mine, theirs, datasets = tmp_path / "mine", tmp_path / "theirs", tmp_path / "datasets"
    for d in (mine, theirs, datasets):
        d.mkdir()
    (theirs / "secret.txt").write_text("theirs")
    (datasets / "data.txt").write_text("shared")
    code = (
        "import os, pathlib\n"
        f"pathlib.Path({str(mine)!r}, 'out.txt').write_text('written')\n"
        f"print('theirs', os.path.exists({str(theirs / 'secret.txt')!r}))\n"
        f"print('data', pathlib.Path({str(datasets / 'data.txt')!r}).read_text())\n"
        f"try:\n    pathlib.Path({str(datasets / 'new.txt')!r}).write_text('x')\n    print('datasets writable')\n"
        "except OSError:\n    print('datasets read-only')\n"
    )
    argv = iso.command([sys.executable, "-c", code], account=None, cwd=str(mine), rw=[str(mine)], ro=[str(datasets)])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "theirs False" in r.stdout and "data shared" in r.stdout and "datasets read-only" in r.stdout, r.stdout
    assert (mine / "out.txt").read_text() == "written" and not (datasets / "new.txt").exists()


def test_the_job_environment_travels_in_a_descriptor():
    env = {"A": "1", "LD_PRELOAD": "/x.so", "B": "v=w\nsecond line"}
    fd = os.memfd_create("t", 0)
    os.write(fd, envexec.encode_environment(env))
    got = envexec.read_environment(fd)
    assert got == {k.encode(): v.encode() for k, v in env.items()}
