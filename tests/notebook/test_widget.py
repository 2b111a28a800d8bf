"""The job panel (trainhub.kernels.widget) fed with canned API answers."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

pytest.importorskip("ipywidgets")

from trainhub.kernels.widget import JobPanel, metric_series, render_chart, render_logs, short_log_line  # noqa: E402
from waiting import wait_for  # noqa: E402

NOW = datetime(2026, 11, 21, 20, 10, 5, tzinfo=timezone.utc)
RUNNING = {"id": "j-000042", "name": "resnet", "user": "alice", "state": "running", "reason": "", "gpus": 2,
           "workers": 2, "devices": [[0, 1], [2, 3]], "profile": "gpu-2", "created": "2026-11-21T20:08:00Z",
           "started": "2026-11-21T20:09:00Z", "finished": None, "attempt": 1}
METRICS = {"metrics": [{"time": "2026-11-21T20:09:10Z", "step": s, "worker": w, "values": {"loss": 1 / (s + 1), "acc": s / 10}}
                       for s in range(5) for w in (0, 1)],
           "gpu": [{"time": "2026-11-21T20:09:10Z", "worker": 0, "device": 0, "utilization": 37.0, "memory_used_mb": 900}]}
LOGS = "".join(f"2026-11-21T20:09:{i:02d}.123Z [{i % 2}] epoch {i} <ok>\n" for i in range(30))


class FakeClient:
    def __init__(self, jobs):
        self.jobs = list(jobs)  # successive answers of get()
        self.cancelled = []

    def get(self, job_id):
        return self.jobs.pop(0) if len(self.jobs) > 1 else self.jobs[0]

    def logs(self, job_id, tail=None, worker=None):
        return LOGS

    def metrics(self, job_id):
        return METRICS

    def cancel(self, job_id):
        self.cancelled.append(job_id)
        return dict(RUNNING, state="cancelled", reason="cancelled by alice", finished="2026-11-21T20:10:00Z")


def test_update_renders_state_elapsed_devices_logs_and_chart():
    panel = JobPanel(FakeClient([RUNNING]), RUNNING)
    panel.update(RUNNING, METRICS, LOGS, now=NOW)
    h = panel.header.value
    assert "j-000042" in h and "resnet" in h and ">running<" in h and "elapsed 01:05" in h
    assert "2 GPUs x 2 workers (devices 0,1 | 2,3)" in h and "profile gpu-2" in h
    assert "epoch 29 &lt;ok&gt;" in panel.logs.value and "epoch 14" not in panel.logs.value  # last 15, escaped
    assert "20:09:29 [1] epoch 29" in panel.logs.value
    assert panel.chart.value.count("<svg") == 2 and "loss: 0.2" in panel.chart.value and "acc: 0.4" in panel.chart.value
    assert not panel.cancel_button.disabled


def test_terminal_state_hides_cancel_and_shows_reason():
    done = dict(RUNNING, state="failed", reason="worker 1 exited with code 1", finished="2026-11-21T20:09:30Z",
                outputs_url="s3://bucket/alice/jobs/j-000042")
    panel = JobPanel(FakeClient([done]), RUNNING)
    panel.update(done, now=NOW)
    assert ">failed<" in panel.header.value and "elapsed 00:30" in panel.header.value
    assert "worker 1 exited with code 1" in panel.header.value and "s3://bucket/alice" in panel.header.value
    assert panel.cancel_button.disabled and panel.cancel_button.layout.display == "none"


def test_queued_job_shows_why_it_waits():
    queued = dict(RUNNING, state="queued", started=None, reason="waiting for 4 GPUs (2 free)")
    panel = JobPanel(FakeClient([queued]), queued)
    panel.update(queued, now=NOW)
    assert "waiting 02:05" in panel.header.value and "waiting for 4 GPUs (2 free)" in panel.header.value
    assert panel.chart.value == "" and "no log output yet" in panel.logs.value


def test_metric_series_takes_worker_zero_and_skips_non_numbers():
    m = {"metrics": METRICS["metrics"] + [{"time": "x", "step": 9, "worker": 0, "values": {"loss": "nan", "note": True}}]}
    s = metric_series(m)
    assert s["loss"][:2] == [(0.0, 1.0), (1.0, 0.5)] and len(s["loss"]) == 5 and "note" not in s
    assert metric_series({"metrics": [{"step": None, "values": {"x": 1}}, {"step": None, "values": {"x": 2}}]}) == \
        {"x": [(0.0, 1.0), (1.0, 2.0)]}
    one = render_chart({"metrics": [{"step": 0, "values": {"loss": 3}}]})  # a single point still draws
    assert "<polyline" in one and "loss: 3" in one


def test_log_rendering():
    assert short_log_line("2026-11-21T20:01:02.123Z [3] hello") == "20:01:02 [3] hello"
    assert short_log_line("plain line") == "plain line"
    assert "no log output yet" in render_logs("")


def test_cancel_button_and_polling_thread():
    client = FakeClient([RUNNING, RUNNING, dict(RUNNING, state="succeeded", finished="2026-11-21T20:10:00Z")])
    panel = JobPanel(client, RUNNING, poll=0.01, metrics_every=0)
    panel.cancel_button.click()
    assert client.cancelled == ["j-000042"] and "cancel requested" in panel.message.value
    panel.start()
    assert panel.done.wait(10)
    assert ">succeeded<" in panel.header.value and "<polyline" in panel.chart.value


def test_polling_errors_are_shown_and_retried():
    class Flaky(FakeClient):
        calls = 0

        def get(self, job_id):
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise RuntimeError("proxy 503")
            return dict(RUNNING, state="succeeded")

    panel = JobPanel(Flaky([RUNNING]), RUNNING, poll=0.01)
    panel.start()
    assert panel.done.wait(10) and Flaky.calls == 2
    assert ">succeeded<" in panel.header.value and panel.message.value == ""


def test_tensorboard_link_through_the_users_server(monkeypatch):
    from trainhub.kernels.widget import render_tensorboard_link

    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")
    panel = JobPanel(FakeClient([RUNNING]), RUNNING)
    assert "href='/user/alice/trainhub/tensorboard/open?jobs=j-000042'" in panel.tensorboard.value
    assert render_tensorboard_link(dict(RUNNING, state="queued")) == ""  # nothing written yet
    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX")
    assert render_tensorboard_link(RUNNING) == ""  # outside a user's server there is no server to open it
    assert "href='/user/b&#x27;o/trainhub/tensorboard/open?jobs=j-000042'" in render_tensorboard_link(RUNNING, "/user/b'o/")


def test_log_lines_stream_into_the_pane_between_polls():
    import threading

    lines, more = ["2026-11-21T20:09:00.001Z [0] first line"], threading.Event()
    asked = []

    class Following(FakeClient):
        def logs(self, job_id, tail=None, worker=None):
            asked.append(tail)
            return ""

        def follow_logs(self, job_id, worker=None, tail=None):
            yield from lines
            more.wait(10)
            yield "2026-11-21T20:09:01.002Z [0] second line"
            over.wait(10)  # the stream stays up (its end would hand the lines to the poll)

    # one poll an hour: what shows in between came through the follow stream
    over = threading.Event()
    panel = JobPanel(Following([RUNNING]), RUNNING, poll=3600)
    panel.log_redraw = 0  # each line drawn as it comes (else the second, close behind, waits for the next)
    panel.start()
    try:
        wait_for(lambda: "first line" in panel.logs.value, what="the first line in the pane", interval=0.01)
        more.set()
        wait_for(lambda: "second line" in panel.logs.value, what="the second line in the pane", interval=0.01)
        assert asked == []  # the poll did not read the tail: the stream is up
    finally:
        over.set()
        panel.stop()


def test_a_failed_follow_falls_back_to_the_polled_tail():
    class NoFollow(FakeClient):
        def follow_logs(self, job_id, worker=None, tail=None):
            raise RuntimeError("404: an older service")
            yield  # a generator, as the client's

    client = NoFollow([RUNNING, RUNNING, dict(RUNNING, state="succeeded", finished="2026-11-21T20:10:00Z")])
    panel = JobPanel(client, RUNNING, poll=0.01)
    panel.start()
    assert panel.done.wait(10)
    assert "epoch 29" in panel.logs.value  # LOGS, read by the poll



def test_with_its_lines_streaming_the_state_is_read_after_a_poll_or_when_the_stream_ends():
    import threading

    ended, gets = threading.Event(), []

    class Streaming(FakeClient):
        def get(self, job_id):
            gets.append(job_id)
            return dict(RUNNING, state="succeeded", finished="2026-11-21T20:10:00Z")

        def follow_logs(self, job_id, worker=None, tail=None):
            yield "2026-11-21T20:09:00.001Z [0] first line"
            ended.wait(10)

    # submitted a moment ago: the POST's answer is on show, the poll is an hour
    panel = JobPanel(Streaming([RUNNING]), dict(RUNNING, state="queued", started=None), poll=3600)
    panel.start()
    try:
        wait_for(lambda: "first line" in panel.logs.value, what="the first line in the pane", interval=0.01)
        assert gets == []  # no read of the state while the job starts: it would only repeat the submission's answer
        ended.set()  # the job ended: its stream ends, and the final state shows at once, not after the poll
        assert panel.done.wait(10)
        assert gets and ">succeeded<" in panel.header.value
    finally:
        panel.stop()


def test_when_the_poll_sees_the_end_before_the_stream_brought_the_last_line_the_panel_waits_for_it():
    """``done`` means the panel is final: a job's last line still on its way in the follow stream when the poll
    saw the job end is in the pane by then (``%%train --wait`` returns on ``done``)."""
    import threading

    poll_drew_the_end = threading.Event()
    written = ["2026-11-21T20:09:00.001Z [0] first line"]  # the job's log as the service has it

    class LateLine(FakeClient):
        def get(self, job_id):
            return dict(RUNNING, state="succeeded", finished="2026-11-21T20:10:00Z")

        def diagnosis(self, job_id):  # the last read of the poll's refresh: the end is drawn
            poll_drew_the_end.set()
            return None

        def logs(self, job_id, tail=None, worker=None):
            return "\n".join(written)

        def follow_logs(self, job_id, worker=None, tail=None):
            yield written[0]
            assert poll_drew_the_end.wait(10)
            # the last line reaches the service (and the stream) after the poll drew the job's end
            written.append("2026-11-21T20:09:01.002Z [0] last line")
            yield written[-1]

    panel = JobPanel(LateLine([RUNNING]), RUNNING, poll=0.01)
    panel.start()
    try:
        assert panel.done.wait(10)
        assert "last line" in panel.logs.value
    finally:
        panel.stop()
