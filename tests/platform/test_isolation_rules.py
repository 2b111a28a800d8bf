"""The rules of trainhub.boundary.isolation and trainhub.boundary.accounts without a platform: account names, which accounts are
never used, who may run on a platform that cannot isolate users, the banner, a real bubblewrap sandbox's view,
and the job environment's hand-over (envexec)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from trainhub.boundary import envexec
from trainhub.boundary.accounts import UNIX_NAME, AccountError, UserAccounts
from trainhub.exceptions import Forbidden
from trainhub.boundary.isolation import Isolation


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


SHELL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "FROM_THE_PLATFORM": "never the job's"}
TRICKY = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "A": "1", "B": "v=w\nsecond line", "EMPTY": "",
          "QUOTED": "$(echo run) `echo run` 'single' \"double\" \\ * ; exit 3", "SPACES": "  lead and trail  ",
          "LD_PRELOAD": "", "_UNDERSCORE": "x", "HOME": "/nowhere"}


def handed_over(env: dict, cmd: list[str], argv_for, quiet: bool = True) -> dict:
    """The environment ``cmd`` (which prints its own, NUL-separated) gets through the step ``argv_for(fd, cmd)``."""
    fd = envexec.environment_fd(env)
    try:
        r = subprocess.run(argv_for(fd, cmd), pass_fds=(fd,), env=SHELL_ENV, capture_output=True, timeout=60)
    finally:
        os.close(fd)
    assert r.returncode == 0 and not (quiet and r.stderr), r.stderr
    return dict(item.split(b"=", 1) for item in r.stdout.split(b"\0") if item)


def python_step(fd: int, cmd: list[str]) -> list[str]:
    return [sys.executable, "-I", "-S", envexec.__file__, str(fd), "--", *cmd]


def test_a_command_jobs_environment_reaches_it_through_bash_exactly_as_through_the_interpreter():
    cmd = ["/bin/bash", "-c", "env -0; true"]
    argv = envexec.command(99, cmd, TRICKY, SHELL_ENV)
    assert argv[:3] == ["/bin/bash", "-c", envexec.BASH_STEP], argv  # the light step was chosen
    by_bash = handed_over(TRICKY, cmd, lambda fd, c: envexec.command(fd, c, TRICKY, SHELL_ENV))
    assert by_bash == handed_over(TRICKY, cmd, python_step)
    assert {k: v for k, v in by_bash.items() if k.decode() in TRICKY} == {k.encode(): v.encode() for k, v in TRICKY.items()}
    assert b"FROM_THE_PLATFORM" not in by_bash


@pytest.mark.parametrize("extra", [{"A.B": "dotted"}, {"1X": "digit first"}, {"SHLVL": "7"}, {"IFS": ":"},
                                   {"BASH_ENV": "/tmp/x"}, {"SHELLOPTS": "xtrace"}, {"LC_ALL": "C"},
                                   {"LANG": "POSIX"}, {"ÜBER": "non-ascii name"}])
def test_what_bash_cannot_hand_over_exactly_goes_through_the_interpreter(extra):
    env = dict(TRICKY, **extra)
    if "LANG" in extra:
        env["LANG"] = extra["LANG"]
    cmd = ["/bin/bash", "-c", "env -0"]
    argv = envexec.command(99, cmd, env, SHELL_ENV)
    assert argv[:3] == python_step(99, cmd)[:3], argv
    got = handed_over(env, cmd, lambda fd, c: envexec.command(fd, c, env, SHELL_ENV), quiet=False)  # e.g. xtrace
    for key, value in extra.items():
        if key not in ("SHLVL", "IFS", "SHELLOPTS"):  # the job's own bash sets these, as it would anywhere
            assert got[key.encode()] == value.encode(), got
    # a script job's command is the interpreter itself: no shell of ours in between
    assert envexec.command(99, [sys.executable, "-u", "x.py"], TRICKY, SHELL_ENV)[:3] == python_step(99, [])[:3]


def as_root(monkeypatch) -> None:
    """The rules as `trainhub up` run as root sees them (the accounts' reachability check, which needs a real root, off)."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(Isolation, "_unreachable_without_sandbox", lambda self: [])


def test_as_root_without_bubblewrap_several_users_are_refused_until_the_admin_opts_in(monkeypatch, tmp_path):
    """"auto" as root without bwrap would serve everyone with accounts only, silently: refused, with the fix (install
    bubblewrap) and the opt-in (c.Isolation.sandbox = "none") named; the opt-in starts, and the banner says so."""
    as_root(monkeypatch)
    auto = Isolation(sandbox="auto", bwrap="")
    assert auto.mode == "accounts"
    [problem] = auto.problems()
    assert "apt-get install bubblewrap" in problem and 'c.Isolation.sandbox = "none"' in problem, problem
    not_executable = tmp_path / "bwrap"
    not_executable.write_text("")
    assert any(f"not installed at {not_executable}" in p for p in Isolation(sandbox="auto", bwrap=str(not_executable)).problems())
    opted_in = Isolation(sandbox="none", bwrap="")
    assert opted_in.mode == "accounts" and opted_in.problems() == []
    banner = "\n".join(opted_in.describe([]))
    assert 'Isolation: accounts only, as configured (c.Isolation.sandbox = "none")' in banner, banner
    # without accounts (one user as root) nothing is refused: only the admin may run servers and jobs then
    assert Isolation(sandbox="auto", bwrap="", user_accounts=False).problems() == []


def test_as_root_with_bubblewrap_auto_starts_with_accounts_and_sandbox(monkeypatch):
    as_root(monkeypatch)
    iso = Isolation(sandbox="auto", bwrap=sys.executable, setpriv=sys.executable)  # any executable stands in
    assert iso.mode == "accounts+sandbox" and iso.problems() == []
    assert "Isolation: accounts+sandbox: " in "\n".join(iso.describe([]))


@pytest.mark.parametrize("settings, mode", [
    ({"user_accounts": False, "sandbox": "bwrap"}, "sandbox"),
    ({"user_accounts": False, "sandbox": "none", "single_user": "admin"}, "none"),
])
def test_the_banner_names_the_mode_in_force_without_root(monkeypatch, settings, mode):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    iso = Isolation(bwrap=sys.executable, **settings)
    assert iso.mode == mode
    assert f"Isolation: {mode}" in "\n".join(iso.describe([]))


def test_code_the_accounts_cannot_read_is_said_at_start_not_at_the_first_spawn(tmp_path, monkeypatch):
    """A checkout made with umask 077 (or under a root-only folder, copied): every server of a user would die at its
    first import; `trainhub up` says so, naming the files and the fix, before anyone spawns."""
    code = tmp_path / "checkout" / "kernels"
    code.mkdir(parents=True)
    (code / "__init__.py").write_text("")
    os.chmod(code / "__init__.py", 0o600)
    iso = Isolation(user_accounts=True, sandbox="bwrap", code_paths=[str(tmp_path / "checkout")])
    monkeypatch.setattr(Isolation, "interpreter_paths", staticmethod(lambda: []))
    found = iso._unreadable_code()
    assert len(found) == 1 and "__init__.py (-rw-------)" in found[0] and "chmod -R o+rX" in found[0], found
    os.chmod(code / "__init__.py", 0o644)
    os.chmod(code, 0o700)
    assert "kernels (drwx------)" in iso._unreadable_code()[0]
    os.chmod(code, 0o755)
    assert iso._unreadable_code() == []
