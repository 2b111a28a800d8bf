"""CLI parsing: every command's --help, flag validation, clear errors (exit 2)."""

from __future__ import annotations

import argparse

import pytest

from trainhub.cli import build_parser, main
from trainhub.commands.up import gpus, port
from trainhub.app.up import is_loopback


def subcommands(parser) -> dict:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def all_commands():
    parser = build_parser()
    out = []
    for name, sub in subcommands(parser).items():
        out.append([name])
        for inner in subcommands(sub):
            out.append([name, inner])
    return out


def test_core_commands_are_registered():
    names = {c[0] for c in all_commands()}
    assert {"up", "token", "status", "users"} <= names
    assert ["users", "add"] in all_commands() and ["users", "list"] in all_commands()


@pytest.mark.parametrize("command", all_commands(), ids=" ".join)
def test_help_of_every_command(command, capsys):
    with pytest.raises(SystemExit) as e:
        main(command + ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: trainhub " + " ".join(command))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["up", "--gpus", "many"], "--gpus must be 'auto' or a number"),
        (["up", "--gpus", "-1"], "--gpus"),
        (["up", "--port", "70000"], "port must be 1-65535"),
        (["up", "--port", "http"], "is not a port number"),
        (["status", "--bogus"], "unrecognized arguments: --bogus"),
        (["nosuchcommand"], "invalid choice"),
        (["token"], "the following arguments are required: NAME"),
    ],
)
def test_bad_flags_exit_2_with_a_hint(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "--help" in err


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "trainhub up" in capsys.readouterr().out


def test_status_without_a_platform_is_one_clear_line(tmp_path, capsys):
    assert main(["status", "--data-dir", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert "trainhub up" in err and "Traceback" not in err


def test_token_rejects_bad_names(tmp_path, capsys):
    assert main(["token", "no/slash", "--data-dir", str(tmp_path)]) == 2
    assert "not a valid user name" in capsys.readouterr().err


@pytest.mark.parametrize("value, expect", [("auto", "auto"), ("AUTO", "auto"), ("0", "0"), (" 4 ", "4")])
def test_gpus_flag(value, expect):
    assert gpus(value) == expect


def test_port_flag():
    assert port("8000") == 8000
    with pytest.raises(argparse.ArgumentTypeError):
        port("0")


@pytest.mark.parametrize("ip, loop", [("127.0.0.1", True), ("localhost", True), ("::1", True), ("0.0.0.0", False),
                                      ("10.1.2.3", False), ("myhost", False)])
def test_is_loopback(ip, loop):
    assert is_loopback(ip) is loop


def test_ssl_flags_go_together(capsys):
    assert main(["up", "--ssl-cert", "c.pem", "--data-dir", "/nonexistent"]) == 2
    assert "go together" in capsys.readouterr().err


def test_a_closed_pipe_is_not_a_traceback():
    """`trainhub ... | head`: the reader goes away; the CLI stops quietly (no BrokenPipeError traceback)."""
    import os
    import subprocess
    import sys

    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written
    try:
        # a command printing more than a pipe holds (as `trainhub jobs list --limit 500` does)
        code = ("import sys, trainhub.cli as cli\n"
                "cli._main = lambda argv=None: [print('j-000001 running', flush=True) for _ in range(100000)] and 0\n"
                "sys.exit(cli.main([]))\n")
        proc = subprocess.run([sys.executable, "-c", code], stdout=w, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(w)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 141


def test_status_inside_a_users_server_points_to_what_works_there(tmp_path, monkeypatch, capsys):
    from trainhub.cli import main

    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/ann/")
    assert main(["status", "--data-dir", str(tmp_path / "nowhere")]) != 0
    err = capsys.readouterr().err
    assert "on the host" in err and "trainhub jobs list" in err and "trainhub up" not in err
