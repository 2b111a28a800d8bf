"""The live panel shown under a ``%%train`` cell (ipywidgets), and the static form that outlives it.

State, elapsed time, GPUs/devices, a log tail, small line charts of the reported metrics and a
Cancel button. A daemon thread polls the API and sets widget values (value updates from a thread
reach the browser; the kernel stays free); another follows the job's logs (``GET .../logs?follow=true``,
which streams each line as it is written), so a line shows under the cell as it is printed, not at the
next poll; where the follow cannot be had, the poll reads the log tail as before. The ``render_*``
functions are pure: job/metrics dicts in, HTML out, so tests feed them canned API answers.

Every display of a panel is one output holding, beside the widget, a static form of the job: ``text/plain`` and
``text/html`` (state, reason, elapsed time, devices, a metrics summary, the last log lines, links to the job in the
jobs table and to TensorBoard) and :data:`JOB_MIME` (the same as JSON, for the JupyterLab panel extension). A widget
lives only as long as its kernel; a notebook reopened later, after a kernel restart or run headless (nbclient,
papermill, ``jupyter execute``) keeps the static form. It is re-published in place (``update_display``, one display
id per panel) when the job changes state, every :attr:`StaticForm.static_every` seconds while it runs and, with the
final lines, when it ends, so a saved notebook shows the final state. In JupyterLab the panel extension renders the
output (``extensions/labextension/src/liveoutput.ts``): the live widget while its kernel holds it, else a live view
of the job that polls the jobs API (docs/notebooks.md, "The panel under the cell").
"""

from __future__ import annotations

import html
import math
import os
import re
import threading
import time
import uuid
from collections import deque
from datetime import datetime, timezone

from trainhub.backoff import Backoff
from trainhub.fmt import (diagnosis_summary, elapsed_seconds, fmt_devices, fmt_duration, fmt_number, measurement_line, parse_time,
                          resumed_from, state_text)
from trainhub.states import CANCELLED, FAILED, JOB_TERMINAL, LOST, QUEUED, RUNNING, SUCCEEDED

STATE_COLORS = {QUEUED: "#8a6d00", RUNNING: "#1f6feb", SUCCEEDED: "#1a7f37", FAILED: "#cf222e", CANCELLED: "#6e7781",
                LOST: "#cf222e"}
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT(\d\d:\d\d:\d\d))\S*\s+(\[\d+\])\s?(.*)$")


def render_header(job: dict, now: datetime | None = None, resumed: str = "") -> str:
    """The panel's first lines; ``resumed``: "resumed from step S" when this attempt started from a checkpoint."""
    state = job.get("state", "?")
    color = STATE_COLORS.get(state, "#6e7781")
    name = html.escape(job.get("name") or "")
    parts = [f"<b>{html.escape(job.get('id', '?'))}</b>" + (f" {name}" if name else ""),
             f"<span style='color:#fff;background:{color};border-radius:3px;padding:0 6px'>{html.escape(state)}</span>",
             _timing(job, now),
             html.escape(fmt_devices(job))]
    if job.get("profile"):
        parts.append("profile " + html.escape(job["profile"]))
    if (job.get("attempt") or 1) > 1:
        parts.append(f"attempt {job['attempt']}" + (f" ({html.escape(resumed)})" if resumed else ""))
    out = " &middot; ".join(parts)
    if job.get("reason") and (state != RUNNING):
        out += f"<br><span style='color:#57606a'>{html.escape(job['reason'])}</span>"
    if state in JOB_TERMINAL and job.get("outputs_url"):
        out += f"<br><span style='color:#57606a'>outputs: <code>{html.escape(job['outputs_url'])}</code></span>"
    return f"<div style='font-family:var(--jp-ui-font-family,sans-serif);line-height:1.6'>{out}</div>"


def _timing(job: dict, now: datetime | None) -> str:
    elapsed = elapsed_seconds(job, now)
    if elapsed is not None:
        return f"elapsed {fmt_duration(elapsed)}"
    created = parse_time(job.get("created"))
    if created is None or job.get("state") in JOB_TERMINAL:
        return "elapsed -"
    waited = ((now or datetime.now(timezone.utc)) - created).total_seconds()
    return f"waiting {fmt_duration(max(0.0, waited))}"


def short_log_line(line: str) -> str:
    """'2026-11-21T20:01:02.123Z [0] text' -> '20:01:02 [0] text'."""
    m = _LOG_LINE.match(line)
    return f"{m.group(2)} {m.group(3)} {m.group(4)}" if m else line


def render_logs(text: str, lines: int = 15) -> str:
    tail = [short_log_line(ln) for ln in (text or "").splitlines() if ln.strip()][-lines:]
    if not tail:
        return "<pre style='margin:0;color:#57606a;font-size:12px'>(no log output yet)</pre>"
    body = html.escape("\n".join(tail))
    return (f"<pre style='margin:0;max-height:18em;overflow:auto;font-size:12px;background:var(--jp-layout-color2,#f6f8fa);"
            f"padding:4px 6px'>{body}</pre>")


def metric_series(metrics: dict | None) -> dict[str, list[tuple[float, float]]]:
    """{metric name: [(x, value), ...]} from the API's metrics object (x = step, else record index;
    worker 0 only when several workers report, non-numbers skipped)."""
    series: dict[str, list[tuple[float, float]]] = {}
    records = (metrics or {}).get("metrics") or []
    workers = {r.get("worker", 0) for r in records}
    lead = 0 if 0 in workers else (min(workers) if workers else 0)
    for i, rec in enumerate(records):
        if len(workers) > 1 and rec.get("worker", 0) != lead:
            continue
        x = rec.get("step")
        x = i if x is None else x
        for k, v in (rec.get("values") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                series.setdefault(k, []).append((float(x), float(v)))
    return series


def svg_axes(xs, ys, width, height, pad=(44, 8, 18, 18)):
    """Scales and the frame (axes, y range labels) of a small SVG chart: ``(sx, sy, frame_svg, (x0, x1))``."""
    pad_l, pad_r, pad_t, pad_b = pad
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - (abs(y0) or 1) * 0.1, y1 + (abs(y1) or 1) * 0.1
    w, h = width - pad_l - pad_r, height - pad_t - pad_b

    def sx(x):
        return pad_l + (x - x0) / (x1 - x0) * w

    def sy(y):
        return pad_t + (1 - (y - y0) / (y1 - y0)) * h

    frame = (f"<line x1='{pad_l}' y1='{pad_t + h}' x2='{pad_l + w}' y2='{pad_t + h}' stroke='#d0d7de'/>"
             f"<line x1='{pad_l}' y1='{pad_t}' x2='{pad_l}' y2='{pad_t + h}' stroke='#d0d7de'/>"
             f"<text x='{pad_l - 4}' y='{pad_t + 4}' font-size='9' text-anchor='end' font-family='sans-serif'>{y1:.3g}</text>"
             f"<text x='{pad_l - 4}' y='{pad_t + h}' font-size='9' text-anchor='end' font-family='sans-serif'>{y0:.3g}</text>")
    return sx, sy, frame, (x0, x1)


def svg_line_chart(points: list[tuple[float, float]], title: str, width: int = 260, height: int = 120) -> str:
    """A small SVG line chart (no dependencies)."""
    pad_l = 44
    sx, sy, frame, (x0, x1) = svg_axes([p[0] for p in points], [p[1] for p in points], width, height)
    pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    last = points[-1][1]
    t = html.escape(title)
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' aria-label='{t}'>"
        f"<text x='{pad_l}' y='12' font-size='11' font-family='sans-serif'>{t}: {last:.4g}</text>"
        + frame +
        f"<text x='{pad_l}' y='{height - 4}' font-size='9' font-family='sans-serif'>{x0:g}</text>"
        f"<text x='{width - 8}' y='{height - 4}' font-size='9' text-anchor='end' font-family='sans-serif'>step {x1:g}</text>"
        f"<polyline fill='none' stroke='#1f6feb' stroke-width='1.5' points='{pts}'/>"
        "</svg>"
    )


def render_chart(metrics: dict | None, max_charts: int = 6) -> str:
    series = metric_series(metrics)
    if not series:
        return ""
    charts = [svg_line_chart(pts, name) for name, pts in list(series.items())[:max_charts]]
    return "<div style='display:flex;flex-wrap:wrap;gap:8px'>" + "".join(charts) + "</div>"


def render_tensorboard_link(job: dict, server_prefix: str | None = None) -> str:
    """"TensorBoard" opening the job's event files in the user's own server, once the job has started."""
    from trainhub.tensorboard import open_link

    link = open_link([job["id"]], server_prefix) if job.get("state") not in (None, QUEUED) else None
    if not link:
        return ""
    return (f"<a href='{html.escape(link, quote=True)}' target='_blank' rel='noopener' "
            "title='event files written under trainhub.tensorboard_dir()' "
            "style='margin-right:8px;line-height:28px'>TensorBoard</a>")


def render_diagnosis(body: dict | None) -> str:
    """The GPU efficiency advisor's line (API ``/jobs/{id}/diagnosis``): its findings and first remedies
    in a coloured box, or a quiet grey line while samples are collected / nothing is wrong."""
    if not body:
        return ""
    found = body.get("diagnoses") or []
    if not found:
        return (f"<div style='color:#57606a;font-size:12px'>GPU efficiency: {html.escape(diagnosis_summary(body))}"
                "</div>")
    items = []
    for d in found:
        color = "#cf222e" if d.get("severity") == "warning" else "#8a6d00"
        remedies = "".join(f"<li>{html.escape(r)}</li>" for r in (d.get("remedies") or [])[:3])
        items.append(f"<div style='border-left:3px solid {color};padding:2px 8px;margin:2px 0'>"
                     f"<b style='color:{color}'>{html.escape(d['code'])}</b> {html.escape(d.get('message', ''))}"
                     + (f"<ul style='margin:2px 0 2px 16px;padding:0'>{remedies}</ul>" if remedies else "") + "</div>")
    measured = "<br>".join(html.escape(measurement_line(w)) for w in body.get("workers") or [])
    if measured:
        items.append(f"<div style='color:#57606a;font-size:11px'>{measured}</div>")
    return "<div style='font-size:12px'>" + "".join(items) + "</div>"


# -- the static form: what a saved, reopened or headless-run notebook shows ---------------------------------
#: The MIME type of a job's static form as JSON (rendered live by the JupyterLab panel extension).
JOB_MIME = "application/vnd.trainhub.job+json"
#: Log lines kept in the static form.
STATIC_LOG_LINES = 10
#: The fields of the job object the static form keeps (what the header shows).
STATIC_FIELDS = ("id", "name", "user", "state", "reason", "gpus", "workers", "devices", "profile", "created", "started",
                 "finished", "attempt", "outputs_url", "sweep_id")


def job_links(job: dict, server_prefix: str | None = None) -> dict:
    """Where to see the job in the user's server (root-relative links; none outside a server): ``jobs_table``
    (JupyterLab opens its jobs table on the job: ``lab?trainhub-job=ID``) and, once it started, ``tensorboard``."""
    from urllib.parse import quote

    prefix = server_prefix if server_prefix is not None else os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if not prefix:
        return {}
    links = {"jobs_table": f"{prefix.rstrip('/')}/lab?trainhub-job={quote(str(job['id']))}"}
    if job.get("state") not in (None, QUEUED):
        from trainhub.tensorboard import open_link

        links["tensorboard"] = open_link([job["id"]], prefix)
    return links


def last_metrics(metrics: dict | None) -> dict[str, tuple[float, float]]:
    """{metric: (step, last value)} of the charted series (worker 0's when several report)."""
    return {name: pts[-1] for name, pts in metric_series(metrics).items() if pts}


def metrics_summary(metrics: dict | None, limit: int = 8) -> str:
    """``loss 0.123 (step 99), acc 0.91 (step 99)``: each metric's last value; "" when none was reported."""
    last = list(last_metrics(metrics).items())
    text = ", ".join(f"{name} {fmt_number(v, 4)} (step {x:g})" for name, (x, v) in last[:limit])
    return text + (f", and {len(last) - limit} more" if len(last) > limit else "")


def log_tail(text: str, lines: int = STATIC_LOG_LINES) -> list[str]:
    """The last ``lines`` non-blank log lines, shortened as the panel shows them."""
    return [short_log_line(ln) for ln in (text or "").splitlines() if ln.strip()][-lines:]


def static_text(job: dict, logs: str = "", metrics: dict | None = None, links: dict | None = None,
                now: datetime | None = None) -> str:
    """The job as plain text: what a notebook shows where neither the widget nor HTML can (``text/plain``)."""
    name = f" {job['name']}" if job.get("name") else ""
    lines = [f"{job.get('id', '?')}{name}: {state_text(job)}",
             f"  {_timing(job, now)} · {fmt_devices(job)}" + (f" · profile {job['profile']}" if job.get("profile") else "")]
    if job.get("outputs_url") and job.get("state") in JOB_TERMINAL:
        lines.append(f"  outputs: {job['outputs_url']}")
    summary = metrics_summary(metrics)
    if summary:
        lines.append(f"  metrics: {summary}")
    tail = log_tail(logs)
    lines.append("  last log lines:" if tail else "  (no log output yet)")
    lines += [f"    {ln}" for ln in tail]
    links = links or {}
    if links.get("jobs_table"):
        lines.append(f"  jobs table: {links['jobs_table']}")
    if links.get("tensorboard"):
        lines.append(f"  TensorBoard: {links['tensorboard']}")
    lines.append(f"  live panel: %train status {job.get('id')}   details: trainhub jobs show {job.get('id')}")
    return "\n".join(lines)


def static_html(job: dict, logs: str = "", metrics: dict | None = None, links: dict | None = None,
                now: datetime | None = None) -> str:
    """The job as HTML with inline styles (``text/html``: nbconvert, GitHub, an untrusted or extension-less frontend)."""
    parts = [render_header(job, now)]
    summary = metrics_summary(metrics)
    if summary:
        parts.append(f"<div style='font-size:12px'>metrics: {html.escape(summary)}</div>")
    parts.append(render_logs(logs, STATIC_LOG_LINES))
    links = links or {}
    anchors = [f"<a href='{html.escape(links[k], quote=True)}' target='_blank' rel='noopener'>{label}</a>"
               for k, label in (("jobs_table", "open in the jobs table"), ("tensorboard", "TensorBoard")) if links.get(k)]
    anchors.append(f"live panel: <code>%train status {html.escape(str(job.get('id')))}</code>")
    parts.append("<div style='font-size:12px;color:#57606a;margin-top:2px'>" + " &middot; ".join(anchors) + "</div>")
    return (f"<div class='trainhub-job-static' data-trainhub-job='{html.escape(str(job.get('id')), quote=True)}'>"
            + "".join(parts) + "</div>")


def static_bundle(job: dict, logs: str = "", metrics: dict | None = None, links: dict | None = None,
                  now: datetime | None = None) -> dict:
    """The static form as a MIME bundle: ``text/plain``, ``text/html`` and :data:`JOB_MIME` (the job's fields, last
    log lines, last metric values and links as JSON)."""
    links = job_links(job) if links is None else links
    data = {"version": 1, "kind": "job", "id": job.get("id"), "job": {k: job.get(k) for k in STATIC_FIELDS if k in job},
            "logs": log_tail(logs), "metrics": {k: list(v) for k, v in last_metrics(metrics).items()}, "links": links}
    return {"text/plain": static_text(job, logs, metrics, links, now), "text/html": static_html(job, logs, metrics, links, now),
            JOB_MIME: data}


class StaticForm:
    """What a live panel (job or sweep) shares: one display id for all its displays, its widget's view and the static
    form in one bundle, re-published in place (``update_display``) from any thread. Subclasses give :meth:`static`
    and :meth:`_static_key` (what, when it changes, is published at once)."""

    #: seconds between two re-publications of the static form while the job or sweep runs (a change of
    #: ``_static_key`` and the end are published at once)
    static_every = 30.0
    widget = None

    def _init_static(self, what: str) -> None:
        self.display_id = f"trainhub-{what}-{uuid.uuid4().hex}"
        self._displayed = False
        self._published: tuple | None = None
        self._published_at = 0.0

    def static(self) -> dict:
        raise NotImplementedError

    def _static_key(self) -> tuple:
        return ()

    def bundle(self) -> dict:
        """The widget's view (while its kernel lives) and the static form, in one MIME bundle (the widget's own
        ``text/plain``, ``VBox(children=...)``, gives way to the static form's)."""
        data = dict(self.static())
        view = self.widget._repr_mimebundle_() if self.widget is not None else None
        if view:
            data.update({k: v for k, v in view.items() if k != "text/plain"})
        return data

    def _repr_mimebundle_(self, include=None, exclude=None, **kw):
        return self.bundle()

    def _ipython_display_(self):
        from IPython.display import display

        display(self.bundle(), raw=True, display_id=self.display_id)
        self._displayed = True
        self._published, self._published_at = self._static_key(), time.monotonic()

    def publish(self, force: bool = False) -> None:
        """Re-publish every display of this panel (widget and static form) in place when what the static form says
        changed (``_static_key``), after ``static_every`` seconds, or ``force``; never raises (a kernel shutting down).
        From a thread the update goes out under the cell running now: a frontend matches it by display id (JupyterLab,
        nbclient, which keeps only the running cell's messages)."""
        if not self._displayed:
            return
        key = self._static_key()
        if not force and key == self._published and time.monotonic() - self._published_at < self.static_every:
            return
        try:
            from IPython.display import update_display

            update_display(self.bundle(), raw=True, display_id=self.display_id)
            self._published, self._published_at = key, time.monotonic()
        except Exception:
            pass


def panel_backoff(what: str, poll: float) -> Backoff:
    """The pauses of a live panel's polling thread: ``poll`` seconds while the API answers; after each
    failure twice the last (at most 32 x ``poll`` and 30 s) until it answers again (``reset()``)."""
    return Backoff(what, start=poll, factor=2.0, cap=min(poll * 32, 30.0))


class JobPanel(StaticForm):
    """Live view of one job, with its static form (see the module docstring). ``update(job, metrics, logs)`` sets the widgets from API dicts;
    ``start()`` runs a daemon thread that polls every ``poll`` seconds (metrics every
    ``metrics_every`` s) until the job ends or ``stop()``, and one that streams its log lines as they come;
    ``done`` is set when it has ended."""

    #: seconds between two redraws of the log pane while lines stream in (the first line shows at once)
    log_redraw = 0.1

    def __init__(self, client, job: dict, *, poll: float = 1.0, metrics_every: float = 3.0, log_lines: int = 15):
        import ipywidgets as w

        self.client = client
        self.job = job
        self.metrics: dict | None = None
        self.log_text = ""
        self.poll = poll
        self.metrics_every = metrics_every
        self.log_lines = log_lines
        self.resumed = ""  # "resumed from step S" when the attempt shown started from a checkpoint
        self._events_read = False
        self._streamed: deque | None = None  # the followed lines, while the follow stream is up
        self._drawn_at = 0.0
        self._log_lock = threading.Lock()
        self.done = threading.Event()
        self._stop = threading.Event()
        self._nudge = threading.Event()  # the polling thread reads now (set by stop() and by the stream's end)
        self._thread: threading.Thread | None = None
        self._follower: threading.Thread | None = None  # the log follow's thread
        # the plain parts share one layout and one text style: each widget model is a message to the frontend as the
        # job starts (the panel is built while the job's first line is on its way, on the same cores)
        plain = w.Layout()
        self.header = w.HTML(layout=plain)
        text = self.header.style
        self.chart = w.HTML(layout=plain, style=text)
        self.logs = w.HTML(layout=plain, style=text)
        self.message = w.HTML(layout=plain, style=text)
        self.diagnosis = w.HTML(layout=plain, style=text)
        self.cancel_button = w.Button(description="Cancel", button_style="danger", icon="stop",
                                      tooltip="cancel this job", layout=w.Layout(width="auto"))
        self.cancel_button.on_click(lambda _b: self.cancel())
        self.tensorboard = w.HTML(layout=plain, style=text)  # a link through the user's server (extensions.tensorboard)
        self.widget = w.VBox([w.HBox([self.header, w.HBox([self.tensorboard, self.cancel_button], layout=plain)],
                                     layout=w.Layout(justify_content="space-between", align_items="flex-start")),
                              self.diagnosis, self.chart, self.logs, self.message], layout=plain)
        self._init_static("job")
        self.update(job, logs="")

    # -- display ----------------------------------------------------------------------------------
    def static(self) -> dict:
        return static_bundle(self.job, self.log_text, self.metrics)

    def _static_key(self) -> tuple:
        return (self.job.get("state"), self.job.get("reason"), self.job.get("attempt"))

    def update(self, job: dict | None = None, metrics: dict | None = None, logs: str | None = None,
               now: datetime | None = None, force: bool = False) -> None:
        """Set what the panel shows. The static form goes out first (at once on a state change or with ``force``,
        else every static_every seconds), then the widgets: iopub keeps the order, so a frontend showing the widget's
        new state already holds a static form that says as much, and a notebook saved then keeps it (saved just
        after the widget said "succeeded", it kept "queued" on a loaded machine)."""
        if job is not None:
            self.job = job
        if metrics is not None:
            self.metrics = metrics
        if logs is not None:
            self.log_text = logs
        self.publish(force)
        if job is not None:
            self.header.value = render_header(job, now, self.resumed)
            terminal = job.get("state") in JOB_TERMINAL
            self.cancel_button.disabled = terminal
            self.cancel_button.layout.display = "none" if terminal else None
            self.tensorboard.value = render_tensorboard_link(job)
        if metrics is not None:
            self.chart.value = render_chart(metrics)
        if logs is not None:
            self.logs.value = render_logs(logs, self.log_lines)

    def cancel(self) -> None:
        try:
            self.update(self.client.cancel(self.job["id"]))
            self.message.value = "<span style='color:#57606a'>cancel requested</span>"
        except Exception as e:
            self.message.value = f"<span style='color:#cf222e'>cancel failed: {html.escape(str(e))}</span>"

    # -- polling ----------------------------------------------------------------------------------
    def refresh(self, with_metrics: bool = True) -> dict:
        """One poll: job, log tail and (optionally) metrics; returns the job."""
        job_id = self.job["id"]
        job = self.client.get(job_id)
        self._see_resume(job)
        logs = self._draw_streamed() if self._streamed is not None else self.client.logs(job_id, tail=self.log_lines * 4)
        metrics = self.client.metrics(job_id) if with_metrics or job.get("state") in JOB_TERMINAL else None
        self.update(job, metrics, logs)
        if (with_metrics or job.get("state") in JOB_TERMINAL) and job.get("state") != QUEUED:
            self.refresh_diagnosis(job_id)
        return job

    def _see_resume(self, job: dict) -> None:
        """While running, the reason says whether this attempt resumed; once ended, the job's events do
        (read once)."""
        if (job.get("attempt") or 1) <= 1:
            return
        if job.get("state") == RUNNING:
            self.resumed = resumed_from([], job.get("reason"))
        elif job.get("state") in JOB_TERMINAL and not self._events_read:
            try:
                self.resumed = resumed_from(self.client.events(job["id"]))
                self._events_read = True
            except Exception:
                pass

    def refresh_diagnosis(self, job_id: str) -> None:
        """The advisor's line; a service without the usage plugin (404/error) leaves it empty."""
        try:
            self.diagnosis.value = render_diagnosis(self.client.diagnosis(job_id))
        except Exception:
            self.diagnosis.value = ""

    def start(self) -> "JobPanel":
        if self._thread is None:
            if hasattr(self.client, "follow_logs"):
                self._streamed = deque(maxlen=self.log_lines * 4)
                self._follower = threading.Thread(target=self._follow, name=f"trainhub-panel-logs-{self.job['id']}",
                                                  daemon=True)
                self._follower.start()
            self._thread = threading.Thread(target=self._run, name=f"trainhub-panel-{self.job['id']}", daemon=True)
            self._thread.start()
        return self

    def _follow(self) -> None:
        """Stream the job's log lines into the pane until the job ends; on any failure (an older service, the
        connection lost) the polling thread reads the tail again."""
        try:
            for line in self.client.follow_logs(self.job["id"], tail=self.log_lines * 4):
                if self._stop.is_set():
                    return
                with self._log_lock:
                    self._streamed.append(line)
                if time.monotonic() - self._drawn_at >= self.log_redraw:
                    self._draw_streamed()
            self._draw_streamed()
        except Exception:
            pass
        finally:
            if not self.done.is_set():
                self._streamed = None  # the poll reads the tail from now on
            self._nudge.set()  # the job ended (its final state at once) or the poll takes over the lines

    def _draw_streamed(self) -> str | None:
        """Show the streamed lines (the poll also calls this, so a line that came within ``log_redraw`` of the last
        redraw shows at the next poll at the latest)."""
        streamed = self._streamed
        if streamed is None:
            return None
        with self._log_lock:
            text = "\n".join(streamed)
        self._drawn_at = time.monotonic()
        self.update(logs=text)
        return text

    def _last_lines(self, wait: float = 5.0) -> None:
        """The job ended, but its follow may still be bringing the last lines it wrote: wait for the stream's end (at
        most ``wait`` s), then draw the tail once, so the pane is final when ``done`` is set (a redraw from either
        thread can land after a newer one, and a follow cut short never drew the end)."""
        if self._follower is None:
            return  # no follow: the refresh read the tail
        self._follower.join(wait)
        self.update(logs=self.client.logs(self.job["id"], tail=self.log_lines * 4), force=True)

    def stop(self) -> None:
        self._stop.set()
        self._nudge.set()

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` or until nudged; True when stopped."""
        self._nudge.wait(seconds)
        self._nudge.clear()
        return self._stop.is_set()

    def _run(self) -> None:
        # the metrics (and the advisor's line) from the first `metrics_every` on, or when the job ends
        last_metrics = time.monotonic() if self._streamed is not None else 0.0
        errors = 0
        # every `poll` seconds; after failures twice as long each time (at most 30 s), back to `poll` once it works
        pause = panel_backoff(f"job {self.job['id']} to end", self.poll)
        try:
            # the state the submission answered is on show and the stream brings the lines: a read right away would
            # repeat that answer while the job starts (the same cores, the same service). The first read comes after
            # `poll`, or as soon as the stream ends (the job ended, or the poll must take over the lines)
            if self._streamed is not None and self._pause(self.poll):
                return
            while not self._stop.is_set():
                try:
                    due = time.monotonic() - last_metrics >= self.metrics_every
                    job = self.refresh(with_metrics=due)
                    if due:
                        last_metrics = time.monotonic()
                    if errors:
                        self.message.value = ""
                    errors = 0
                    pause.reset()
                    if job.get("state") in JOB_TERMINAL:
                        self._last_lines()
                        break
                except Exception as e:
                    errors += 1
                    self.message.value = (f"<span style='color:#8a6d00'>cannot refresh ({html.escape(str(e))}); "
                                          f"retrying</span>")
                if self._pause(pause.next_delay()):
                    break
        finally:
            self.publish(force=True)  # the final state, metrics and lines, before anyone waiting on `done` goes on
            self.done.set()
