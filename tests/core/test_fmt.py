"""trainhub.fmt: the one place durations, sizes, times and tables are written for people."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from trainhub.fmt import (as_utc, clip, elapsed_seconds, fmt_duration, fmt_number, fmt_size, last_log_line, parse_time, text_table,
                          wait_reason_text)


@pytest.mark.parametrize("seconds, style, text", [
    # clock: elapsed times in tables and panels
    (None, "clock", "-"), (0, "clock", "00:00"), (65, "clock", "01:05"), (3723, "clock", "1:02:03"),
    (59.9, "clock", "00:59"), (-5, "clock", "00:00"),
    # units: time limits, delays, grace periods (the engine's and the scheduler's messages)
    (45, "units", "45s"), (185, "units", "3m05s"), (600, "units", "10m00s"), (3600, "units", "1h00m"),
    (7260, "units", "2h01m"), (None, "units", "unknown"),
    # coarse: the culler's idle times (was services.culler.policy.format_duration)
    (7260, "coarse", "2h01m"), (720, "coarse", "12m"), (42, "coarse", "42s"), (None, "coarse", "unknown"),
    (-5, "coarse", "0s"), (185, "coarse", "3m"),
])
def test_fmt_duration(seconds, style, text):
    assert fmt_duration(seconds, style) == text


def test_fmt_duration_refuses_an_unknown_style():
    with pytest.raises(ValueError, match="one of clock, units, coarse"):
        fmt_duration(5, "hms")


@pytest.mark.parametrize("n, text", [(0, "0 B"), (999, "999 B"), (1500, "1.5 KB"), (2_000_000, "2.0 MB"),
                                     (3.1e12, "3.1 TB"), (5e15, "5000.0 TB")])
def test_fmt_size(n, text):
    assert fmt_size(n) == text


@pytest.mark.parametrize("v, kw, text", [(None, {}, "-"), (None, {"none": ""}, ""), (0.123456789, {}, "0.123457"),
                                         (0.123456789, {"digits": 4}, "0.1235"), (3, {}, "3"), ("x", {}, "x")])
def test_fmt_number(v, kw, text):
    assert fmt_number(v, **kw) == text


def test_parse_time_and_elapsed():
    assert parse_time("2026-11-21T20:01:02Z") == datetime(2026, 11, 21, 20, 1, 2, tzinfo=timezone.utc)
    assert parse_time("2026-11-21T20:01:02") == datetime(2026, 11, 21, 20, 1, 2, tzinfo=timezone.utc)  # naive = UTC
    assert parse_time("") is None and parse_time(None) is None and parse_time("soon") is None
    plus_one = timezone(timedelta(hours=1))
    assert as_utc(datetime(2026, 11, 21, 20, 1, 2)) == datetime(2026, 11, 21, 20, 1, 2, tzinfo=timezone.utc)  # SQLite's naive
    assert as_utc(datetime(2026, 11, 21, 21, 1, 2, tzinfo=plus_one)).tzinfo is plus_one  # a zone given is kept
    job = {"started": "2026-11-21T20:00:00Z", "finished": "2026-11-21T20:01:05Z"}
    assert elapsed_seconds(job) == 65.0 and fmt_duration(elapsed_seconds(job)) == "01:05"
    assert elapsed_seconds({"started": None}) is None
    now = datetime(2026, 11, 21, 20, 0, 30, tzinfo=timezone.utc)
    assert elapsed_seconds({"started": "2026-11-21T20:00:00Z"}, now) == 30.0


@pytest.mark.parametrize("text, width, out", [
    ("short", 10, "short"), ("exactly-10", 10, "exactly-10"), (None, 5, ""),
    ("waiting for 2 GPUs (0 free of 8)", 20, "waiting for 2 GPUs…"), ("a (b c)", 5, "a (b…"),
])
def test_clip_marks_what_it_cuts(text, width, out):
    assert clip(text, width) == out and len(out) <= width


def test_text_table_aligns_and_strips():
    assert text_table([["j-1", "a"], ["j-000002", ""]], ["ID", "NAME"]) == "ID        NAME\nj-1       a\nj-000002"


def test_last_log_line():
    assert last_log_line("a\nb\n\n  \n") == "b" and last_log_line("") == ""


def test_wait_reason_text():
    job = {"id": "j-000007", "reason": "waiting"}
    why = {"message": "waiting for 8 GPUs: 2 of 8 free", "code": "no-gpus", "blocking_job": "j-000003",
           "reserved_start": 1_000_090.0}
    text = wait_reason_text(job, why, now=1_000_000.0)
    assert text.splitlines()[0] == "j-000007 is queued: waiting for 8 GPUs: 2 of 8 free"
    assert "  code:        no-gpus (first in line, waiting for enough GPUs to be free at once)" in text
    assert "  waiting for: j-000003 (trainhub jobs show j-000003)" in text
    assert "(in 01:30)" in text and "starts by:" in text
    estimate = wait_reason_text(job, dict(why, reserved_start=None, estimated_start=1_000_120.0), now=1_000_000.0)
    assert "  expected:" in estimate and "(in 02:00)" in estimate and "starts by" not in estimate
    assert "no scheduling pass" in wait_reason_text(job, {}, now=0) and "is queued: waiting" in wait_reason_text(job, {})


# -- counts: the one pluralisation ----------------------------------------------------------------
@pytest.mark.parametrize("n, word, text", [
    (1, "item", "1 item"), (0, "item", "0 items"), (2, "item", "2 items"), (1, "retry", "1 retry"),
    (0, "retry", "0 retries"), (3, "process", "3 processes"), (1.0, "core", "1 core"), (1.5, "core", "1.5 cores"),
    (2, "GPU", "2 GPUs"),
])
def test_plural(n, word, text):
    from trainhub.fmt import plural

    assert plural(n, word) == text


def test_counted_texts_never_say_1_items():
    from trainhub.fmt import fmt_devices, measurement_line, sweep_progress

    assert fmt_devices({"gpus": 1, "workers": 1}) == "1 GPU x 1 worker"
    assert fmt_devices({"gpus": 0, "workers": 2}) == "0 GPUs x 2 workers"
    assert measurement_line({"rank": 0, "cpu_percent": 50, "cpu_cores": 1, "samples": 1}).endswith("CPU 50% of 1 core, 1 sample")
    assert sweep_progress({"trials": 1, "progress": {"done": 0}}) == "0/1 trial done, 0 running"


# -- attempts: retries and restarts by the platform -------------------------------------------------
PLATFORM_STOP = {"kind": "queued", "message": "platform stopped at 2026-11-21 20:00:00Z while it ran; requeued"}
PREEMPTED = {"kind": "queued", "message": "preempted: a higher-priority job needed its GPUs; requeued"}
RETRIED = {"kind": "queued", "message": "worker 0 exited with code 1; retrying (attempt 2 of 2)"}


@pytest.mark.parametrize("job, events, text", [
    ({"attempt": 1, "retries": 0}, [], "1 of 1"),
    ({"attempt": 2, "retries": 1}, [RETRIED], "2 of 2"),
    # the report of issue 34: "attempt: 2 of 1" after a restart
    ({"attempt": 2, "retries": 0}, [PLATFORM_STOP],
     "2 of 2 (0 retries allowed; 1 restart after a platform stop, not counted against the retries)"),
    ({"attempt": 3, "retries": 1}, [PREEMPTED, RETRIED],
     "3 of 3 (1 retry allowed; 1 restart after a preemption, not counted against the retries)"),
    ({"attempt": 4, "retries": 1}, [PLATFORM_STOP, PREEMPTED, PLATFORM_STOP],
     "4 of 5 (1 retry allowed; 3 restarts (2 after a platform stop, 1 after a preemption), not counted against the retries)"),
    ({"attempt": 2, "retries": 2}, None, "2 (2 retries allowed)"),  # the events could not be read: no "of"
])
def test_attempt_text_counts_the_retries_and_shows_restarts_apart(job, events, text):
    from trainhub.fmt import attempt_text, format_job

    assert attempt_text(job, events) == text
    assert f"  attempt:  {text}" in format_job({"id": "j-000001", **job}, events).splitlines()
