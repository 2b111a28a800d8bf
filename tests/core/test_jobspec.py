"""trainhub.jobspec: the job-spec flags of the CLI and the magics, and the one duration parser."""

from __future__ import annotations

import argparse

import pytest

from trainhub.exceptions import InvalidRequest
from trainhub.jobspec import add_spec_options, parse_duration, parse_states, spec_from_args, time_limit
from trainhub.states import JOB_STATES


@pytest.mark.parametrize("value, seconds", [
    (None, None), ("", None), (90, 90.0), (1.5, 1.5), ("90", 90.0), ("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0),
    ("1h30m", 5400.0), ("1d", 86400.0), (" 1h 30m 5s ", 5405.0), ("0.5h", 1800.0),
    (0, None), ("0s", None), ("  ", None), (1e9, 1e9), ("9999d", 9999 * 86400.0),  # 0 and blank: no limit
])
def test_parse_duration(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value, message", [
    ("soon", "time_limit 'soon' is not a duration: use seconds (3600) or text like '90s'"),
    ("30m2h", "is not a duration"),  # units in the order d, h, m, s
    (-1, "time_limit must be 0 (no limit) to 1000000000 seconds, not -1"), (1e9 + 1, "to 1000000000 seconds"),
    ("10000d", "is not a duration"), ("1.1234567s", "is not a duration"), ("٣s", "is not a duration"),
    (True, "time_limit must be seconds or a duration like '30m', not True"),
])
def test_parse_duration_refuses_with_the_field_name(value, message):
    with pytest.raises(InvalidRequest, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_duration(value)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_spec_options(p)
    return p


def test_flags_make_the_spec_and_the_time_limit_is_sent_as_written():
    args = parser().parse_args(["--gpus", "2", "--workers", "3", "--env", "A=1", "--env", "B=x=y", "--time-limit", "1h 30m",
                                "--retries", "1", "--name", "n"])
    assert spec_from_args(args, script="print(1)") == {
        "name": "n", "script": "print(1)", "gpus": 2, "workers": 3, "time_limit": "1h30m", "retries": 1,
        "env": {"A": "1", "B": "x=y"}}
    assert spec_from_args(parser().parse_args([]), command="true") == {"command": "true"}
    assert time_limit("90") == 90 and time_limit("2.5") == 2.5


@pytest.mark.parametrize("argv", [["--time-limit", "soon"], ["--time-limit", "10000d"], ["--gpus", "-1"], ["--workers", "0"],
                                  ["--env", "NOEQUALS"], ["--env", "1A=2"]])
def test_bad_flags_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parser().parse_args(argv)
    assert e.value.code == 2 and "error: argument" in capsys.readouterr().err


def test_parse_states():
    assert parse_states(["queued,running", " lost "], JOB_STATES) == ["queued", "running", "lost"]
    with pytest.raises(ValueError, match=r"unknown state done, gone \(one of queued, running, succeeded, failed, cancelled, lost\)"):
        parse_states(["done", "gone"], JOB_STATES)
