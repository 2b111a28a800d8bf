"""The banner of `trainhub up` prints commands that work as typed (issue 34: `trainhub users add NAME` needed
`.venv/bin/trainhub`, which `make up` runs but which is not on PATH): trainhub.app.up.cli_command."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from trainhub.app.up import cli_command

SCRIPT = os.path.join(os.path.dirname(sys.executable), "trainhub")


def test_not_on_path_the_scripts_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = cli_command(tmp_path / ".trainhub", "users add NAME", env={"PATH": "/usr/bin:/bin"}, script=SCRIPT)
    assert cmd == f"{shlex.quote(SCRIPT)} users add NAME" and os.path.isabs(shlex.split(cmd)[0])


def test_on_path_the_bare_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {"PATH": os.path.dirname(SCRIPT)}
    assert cli_command(tmp_path / ".trainhub", "status", env=env, script=SCRIPT) == "trainhub status"
    # another trainhub first on PATH is not this platform's: the absolute path
    other = tmp_path / "bin"
    other.mkdir()
    (other / "trainhub").write_text("#!/bin/sh\n")
    (other / "trainhub").chmod(0o755)
    assert cli_command(tmp_path / ".trainhub", "status", env={"PATH": f"{other}:{env['PATH']}"}, script=SCRIPT) == \
        f"{shlex.quote(SCRIPT)} status"


def test_another_data_dir_is_named_after_the_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "platform data"
    cmd = cli_command(elsewhere, "token NAME", env={"PATH": "/usr/bin"}, script=SCRIPT)
    assert shlex.split(cmd) == [SCRIPT, "token", "NAME", "--data-dir", str(elsewhere.resolve())]
    env = {"PATH": "/usr/bin", "TRAINHUB_DATA_DIR": str(elsewhere)}
    assert "--data-dir" not in cli_command(elsewhere, "token NAME", env=env, script=SCRIPT)


def test_the_printed_command_runs_as_typed(tmp_path):
    """What the banner prints for `trainhub up --data-dir DIR` started from the checkout, typed from another folder."""
    data = tmp_path / "data"
    cmd = cli_command(data, "status", env={"PATH": "/usr/bin:/bin"}, script=SCRIPT)
    r = subprocess.run(shlex.split(cmd) + ["--json"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    # found the command, parsed it and looked in this platform's data dir (no platform runs there in this test)
    assert f"{data}/trainhub.json does not exist" in r.stderr, r.stderr
    assert "invalid choice" not in r.stderr and "unrecognized" not in r.stderr
