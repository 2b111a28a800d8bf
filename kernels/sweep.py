"""The ``%%sweep`` cell magic: a hyperparameter sweep whose trials run the cell as jobs.

``%%sweep --trials N --parallel P --metric NAME --mode min|max [--param lr=loguniform:1e-5:1e-1 ...]``
sends the cell, with the notebook context ``%%train`` carries (:mod:`trainhub.kernels.context`),
as the trial code of a sweep of the jobs service. Each trial reads ``trainhub.params()`` and reports
``trainhub.report(step=..., NAME=...)``. The search space comes from ``--param`` flags and/or a
literal ``search_space = {...}`` dict in the cell. Bad input (unknown distribution, empty range, no
mode, a metric the cell never reports...) is a ``UsageError`` and nothing is submitted.

Under the cell a :class:`SweepPanel` shows progress, the best value, a table of trials and plots
(optimisation history, intermediate values per trial, parameter importance). ``--as VAR`` binds a
:class:`SweepHandle`. The ``render_*`` / ``svg_*`` functions are pure (dicts in, HTML out).
"""

from __future__ import annotations

import argparse
import html
import math
import os
import threading
import time

from IPython.core.error import UsageError
from IPython.core.magic import cell_magic, magics_class

from trainhub.fmt import clip, fmt_number, plural, sweep_progress, text_table
from trainhub.jobspec import add_spec_options, add_sweep_options, add_workdir_options, sweep_spec, workdir_summary
from trainhub.handle import seen_text
from trainhub.kernels.handle import LiveDisplay, settle
from trainhub.kernels.magics import TrainMagics, _UsageParser, cell_number, server_profile_default
from trainhub.kernels.widget import StaticForm, panel_backoff, svg_axes
from trainhub.searchspace import SPACE_VARIABLE
from trainhub.workdir import scan
from trainhub.states import (CANCELLED, COMPLETE, COMPLETED, FAILED, PENDING, PRUNED, RUNNING, SWEEP_TERMINAL, TRIAL_CANCELLED,
                             TRIAL_FAILED, TRIAL_RUNNING)

SWEEP_COLORS = {RUNNING: "#1f6feb", COMPLETED: "#1a7f37", FAILED: "#cf222e", CANCELLED: "#6e7781"}
TRIAL_COLORS = {PENDING: "#8a6d00", TRIAL_RUNNING: "#1f6feb", COMPLETE: "#1a7f37", PRUNED: "#bc4c00",
                TRIAL_FAILED: "#cf222e", TRIAL_CANCELLED: "#6e7781"}

CELL_HELP = f"""\
Run a hyperparameter sweep: each trial runs this cell as a batch job with its own parameters.

In the cell read the trial's parameters with trainhub.params() and report the metric with
trainhub.report(step=..., NAME=value) (intermediate values let the pruner stop bad trials early;
the last value reported is the trial's result). Declare the search space with --param flags or a
literal dict in the cell, e.g.  {SPACE_VARIABLE} = {{"lr": "loguniform:1e-5:1e-1", "opt": ["adam", "sgd"]}}.
Distributions: uniform:LOW:HIGH[:STEP], loguniform:LOW:HIGH, int:LOW:HIGH[:STEP], logint:LOW:HIGH,
choice:A,B,...  Notebook context (imports, functions, small values) is sent as with %%train, and
so is the notebook's folder: it is sent once and every trial runs in its own copy of it (its modules
import, relative paths work; .gitignore and .trainhubignore respected): --workdir DIR sends another,
--no-workdir none (the trials then run in your home directory).
"""


class _SweepParser(_UsageParser):
    def error(self, message):
        raise UsageError(f"{message}\n{self.format_usage().rstrip()}\nRun '%%sweep --help' for details; nothing was submitted.")


def sweep_parser() -> argparse.ArgumentParser:
    p = _SweepParser(prog="%%sweep", description=CELL_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                     allow_abbrev=False)
    add_sweep_options(p)
    add_spec_options(p)
    add_workdir_options(p, default="the notebook's folder; every trial runs in its own copy")
    p.add_argument("--wait", action="store_true", help="block until the sweep ends")
    p.add_argument("--as", dest="as_var", metavar="VAR", help="bind the SweepHandle to VAR (it is also the cell's result)")
    p.add_argument("--ignore-missing", action="store_true",
                   help="start even if some variables the cell uses cannot be sent (too big / not picklable)")
    p.add_argument("--dry-run", action="store_true", help="print the sweep spec and the trial script, submit nothing")
    return p


def sweep_body(args, cell: str, script_source: str) -> dict:
    """The POST /sweeps body from parsed flags; raises UsageError for mistakes (nothing submitted)."""
    try:
        return sweep_spec(args, script=script_source, space_source=cell, subject="the cell")
    except ValueError as e:
        raise UsageError(f"{e}; nothing was submitted.") from None


@magics_class
class SweepMagics(TrainMagics):
    """``%%sweep`` (configured like ``%%train``: ``TrainMagics.api_url``, ``max_value_bytes``...)."""

    @cell_magic
    def sweep(self, line: str, cell: str):
        """%%sweep --trials N --parallel P --metric NAME --mode min|max [--param NAME=KIND:ARGS ...]
        [--sampler tpe|random|grid|cmaes] [--pruner median|hyperband|none] [--gpus G --workers W ...]
        [--workdir DIR | --no-workdir] [--exclude PATTERN] [--name NAME] [--as VAR] [--wait]: run a hyperparameter
        sweep of this cell, each trial in a copy of the notebook's folder."""
        __tracebackhide__ = True
        prepared = self._prepare(sweep_parser(), line, cell, "%%sweep", "trial code")
        if prepared is None:  # --help was shown
            return None
        args, script = prepared
        body = sweep_body(args, cell, script.source.replace("%%train", "%%sweep"))
        body.setdefault("name", f"notebook-sweep-{cell_number(self.shell)}")
        folder = None if args.no_workdir else (args.workdir or os.getcwd())
        if args.dry_run:
            import json

            print(json.dumps({k: v for k, v in body.items() if k != "script"}, indent=2))
            print(body["script"])
            if folder is not None:
                listing = self._call("the working directory cannot be sent", scan, folder, exclude=args.exclude)
                print(f"%%sweep would send the working directory {listing.root} (each trial runs in a copy): "
                      f"{workdir_summary({'files': listing.files, 'bytes': listing.bytes, 'skipped': listing.skipped})}")
            return None
        sent = None
        if folder is not None:  # sent once: every trial's job runs in its own copy of it (trainhub.workdir)
            sent = self._call("the sweep was not started", self.client.send_workdir, folder, exclude=args.exclude)
            body["workdir"] = sent["sha256"]
        profile = server_profile_default(body)
        sweep = self._submit("the sweep was not started", self.client.create_sweep, body, profile)
        self._report_context(script, "%%sweep")
        if sent is not None:
            print(f"%%sweep sent the working directory {sent['folder']} (each trial runs in a copy): {workdir_summary(sent)}")
        handle = SweepHandle(self.client, sweep)
        self._present(handle, lambda: SweepPanel(self.client, sweep, poll=self.poll_interval),
                      f"started sweep {sweep['id']}: {plural(sweep['trials'], 'trial')}, {sweep['parallel']} at a time, "
                      f"{sweep['mode']}imising {sweep['metric']}", args.as_var)
        if args.wait:
            try:
                sweep = handle.wait(poll=self.poll_interval)
            except KeyboardInterrupt:
                print(f"stopped waiting; sweep {handle.id} keeps running (cancel it with the Cancel button or "
                      f"{args.as_var or 'the handle'}.cancel())")
                raise
            if handle.panel is None:
                print(summary_line(sweep))
        return handle


# -- the handle -------------------------------------------------------------------------------------
class BestTrial(dict):
    """The best trial: a dict (number, value, params, job_id, outputs_url, outputs_path) with attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self):
        return (f"<BestTrial {self.get('number')}: value {self.get('value')!r}, params {self.get('params')}, "
                f"job {self.get('job_id')}, outputs {self.get('outputs_url') or self.get('outputs_path')}>")


class SweepHandle(LiveDisplay):
    """One sweep: ``status``, ``sweep`` (last seen), ``trials`` (table), ``best_trial``, ``importance``,
    ``register_best(name)`` (model registry), ``study()`` (its Optuna study, a copy), ``cancel()``, ``wait()``, ``show()``."""

    def __init__(self, client, sweep: dict, panel=None):
        self.client = client
        self.id = sweep["id"]
        self.sweep = sweep
        self.panel = panel

    @property
    def sweep(self) -> dict:
        """The sweep as last fetched (at ``seen_at``); ``status`` and ``refresh()`` ask the API."""
        return self._sweep

    @sweep.setter
    def sweep(self, value: dict) -> None:
        self._sweep, self.seen_at = value, time.time()

    def refresh(self) -> dict:
        self.sweep = self.client.get_sweep(self.id)
        return self.sweep

    @property
    def status(self) -> str:
        return self.refresh()["state"]

    @property
    def done(self) -> bool:
        return self.status in SWEEP_TERMINAL

    @property
    def trials(self):
        """The trials as a DataFrame (pandas) or a Table: number, state, value, one column per parameter, job, reason."""
        from trainhub.kernels.handle import Table

        rows = trial_rows(self.client.sweep_trials(self.id))
        try:
            import pandas as pd
        except ImportError:
            return Table(rows)
        return pd.DataFrame(rows)

    @property
    def best_trial(self) -> BestTrial | None:
        """The best completed trial so far (params, value, job_id, outputs_url / outputs_path), or None."""
        best = self.refresh().get("best")
        return BestTrial(best) if best else None

    @property
    def importance(self) -> dict | None:
        return self.refresh().get("importance")

    def register_best(self, name: str, *, path: str | None = None, description: str = "", stage: str | None = None) -> dict:
        """Register the best trial's job outputs as the next version of model ``name`` in the model
        registry (its params and final metrics come along); returns the model version."""
        best = self.best_trial
        if best is None:
            raise RuntimeError(f"sweep {self.id} has no completed trial yet ({sweep_progress(self.sweep)})")
        register = getattr(self.client, "register_model", None)
        if register is None:
            raise RuntimeError("this platform has no model registry; the best trial's outputs are at "
                               f"{best.get('outputs_url') or best.get('outputs_path')}")
        return register(name, job=best["job_id"], path=path, description=description or
                        f"best trial {best['number']} of sweep {self.id} ({self.sweep.get('metric')} = {best['value']:.6g})",
                        stage=stage)

    def study(self, storage: str | None = None):
        """This sweep's Optuna study, read from the copy of your own studies in your home
        (``optuna.load_study(study_name=self.id, storage=trainhub.optuna_storage())``): a copy, refreshed by the
        platform when a trial finishes and when the sweep ends; writing to it changes nothing on the platform."""
        import optuna

        from trainhub.runtime import optuna_storage

        url = storage or optuna_storage()
        missing = RuntimeError(f"sweep {self.id} is not in your Optuna copy ({url}) yet: it is written when its first "
                               "trial finishes")
        if storage is None and not os.path.exists(url.removeprefix("sqlite:///")):
            raise missing  # no copy yet (no sweep of yours has written it): not an SQLite error, and nothing created
        try:
            return optuna.load_study(study_name=self.id, storage=url)
        except KeyError:
            raise missing from None

    def cancel(self) -> dict:
        self.sweep = self.client.cancel_sweep(self.id)
        return self.sweep

    def wait(self, poll: float = 1.0, timeout: float | None = None) -> dict:
        """Block until the sweep is completed, failed or cancelled (and a live panel has published its final static
        form); returns the sweep."""
        self.sweep = self.client.wait_sweep(self.id, poll=poll, timeout=timeout)
        settle(self.panel)
        return self.sweep

    def show(self):
        from IPython.display import display

        if self.panel is None:
            self.panel = SweepPanel(self.client, self.sweep).start()
        display(self.panel)

    def __repr__(self):
        s = self.sweep
        best = s.get("best")
        return (f"<SweepHandle {self.id} {s.get('state')} (as of {seen_text(self.seen_at)}), {sweep_progress(s)}"
                + (f", best {s.get('metric')} {best['value']:.6g}" if best else "")
                + ": .status .trials .best_trial .cancel() .wait()>")


# -- pure rendering -----------------------------------------------------------------------------------
def summary_line(sweep: dict) -> str:
    best = sweep.get("best")
    text = f"sweep {sweep['id']} {sweep.get('state')}: {sweep_progress(sweep)}"
    if best:
        text += (f"; best {sweep.get('metric')} = {best['value']:.6g} (trial {best['number']}, {best.get('job_id')}, "
                 f"params {best.get('params')})")
    elif sweep.get("reason"):
        text += f" ({sweep['reason']})"
    return text


def trial_rows(trials: list[dict]) -> list[dict]:
    names = list(dict.fromkeys(k for t in trials for k in (t.get("params") or {})))
    rows = []
    for t in trials:
        row = {"number": t.get("number"), "state": t.get("state"), "value": t.get("value")}
        for k in names:
            row[k] = (t.get("params") or {}).get(k)
        row.update(steps=len(t.get("intermediate") or []), job_id=t.get("job_id"), reason=t.get("reason") or "")
        rows.append(row)
    return rows


def render_header(sweep: dict) -> str:
    state = sweep.get("state", "?")
    color = SWEEP_COLORS.get(state, "#6e7781")
    name = html.escape(sweep.get("name") or "")
    parts = [f"<b>{html.escape(sweep.get('id', '?'))}</b>" + (f" {name}" if name else ""),
             f"<span style='color:#fff;background:{color};border-radius:3px;padding:0 6px'>{html.escape(state)}</span>",
             html.escape(sweep_progress(sweep)),
             html.escape(f"{sweep.get('mode', '?')} {sweep.get('metric', '?')}, {sweep.get('sampler')}/{sweep.get('pruner')}, "
                         f"{sweep.get('parallel')} at a time")]
    out = " &middot; ".join(parts)
    best = sweep.get("best")
    if best:
        params = ", ".join(f"{k}={fmt_number(v, 4, none='')}" for k, v in (best.get("params") or {}).items())
        out += (f"<br>best <b>{html.escape(sweep.get('metric', ''))} = {best['value']:.6g}</b> "
                f"(trial {best['number']}, {html.escape(str(best.get('job_id')))}: {html.escape(params)})")
        if state in SWEEP_TERMINAL and (best.get("outputs_url") or best.get("outputs_path")):
            out += f"<br><span style='color:#57606a'>best outputs: <code>{html.escape(best.get('outputs_url') or best.get('outputs_path'))}</code></span>"
    if sweep.get("reason") and state != RUNNING or (sweep.get("reason") or "").startswith(("cancelling", "stopping")):
        out += f"<br><span style='color:#57606a'>{html.escape(sweep['reason'])}</span>"
    return f"<div style='font-family:var(--jp-ui-font-family,sans-serif);line-height:1.6'>{out}</div>"


def render_trials_table(trials: list[dict], max_rows: int = 50) -> str:
    if not trials:
        return "<div style='color:#57606a'>(no trials yet)</div>"
    rows = trial_rows(trials)[-max_rows:]
    cols = [c for c in rows[0] if c != "reason"] + ["reason"]
    head = "".join(f"<th style='text-align:left;padding:0 6px'>{html.escape(c)}</th>" for c in cols)
    body = []
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            text = html.escape(fmt_number(v, 4, none="") if c != "reason" else clip(v, 80))
            if c == "state":
                text = f"<span style='color:{TRIAL_COLORS.get(v, '#57606a')}'>{text}</span>"
            cells.append(f"<td style='padding:0 6px'>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f"<div style='max-height:16em;overflow:auto'><table style='font-size:12px;border-collapse:collapse'>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")


def svg_history(trials: list[dict], mode: str = "min", width: int = 300, height: int = 150) -> str:
    """Optimisation history: each completed trial's value (dots) and the best so far (line)."""
    pts = [(t["number"], t["value"]) for t in trials if t.get("state") == COMPLETE and isinstance(t.get("value"), (int, float))
           and math.isfinite(t["value"])]
    if not pts:
        return ""
    pts.sort()
    best, line = None, []
    for x, y in pts:
        best = y if best is None else (min(best, y) if mode == "min" else max(best, y))
        line.append((x, best))
    sx, sy, frame, (x0, x1) = svg_axes([p[0] for p in pts], [p[1] for p in pts], width, height)
    dots = "".join(f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='2.5' fill='#1f6feb'/>" for x, y in pts)
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line)
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' aria-label='optimisation history'>"
            f"<text x='44' y='12' font-size='11' font-family='sans-serif'>optimisation history (best {line[-1][1]:.4g})</text>"
            f"{frame}<polyline fill='none' stroke='#1a7f37' stroke-width='1.5' points='{path}'/>{dots}"
            f"<text x='44' y='{height - 4}' font-size='9' font-family='sans-serif'>trial {x0:g}</text>"
            f"<text x='{width - 8}' y='{height - 4}' font-size='9' text-anchor='end' font-family='sans-serif'>{x1:g}</text></svg>")


def svg_intermediate(trials: list[dict], width: int = 300, height: int = 150, max_trials: int = 40) -> str:
    """Intermediate values per trial (one line each; pruned trials in orange)."""
    series = [(t, [(float(s), float(v)) for s, v in (t.get("intermediate") or []) if isinstance(v, (int, float)) and math.isfinite(v)])
              for t in trials[-max_trials:]]
    series = [(t, pts) for t, pts in series if pts]
    if not series:
        return ""
    xs = [p[0] for _, pts in series for p in pts]
    ys = [p[1] for _, pts in series for p in pts]
    sx, sy, frame, (x0, x1) = svg_axes(xs, ys, width, height)
    lines = []
    for t, pts in series:
        color = TRIAL_COLORS.get(t.get("state"), "#1f6feb")
        if len(pts) == 1:
            lines.append(f"<circle cx='{sx(pts[0][0]):.1f}' cy='{sy(pts[0][1]):.1f}' r='2' fill='{color}'/>")
        else:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
            lines.append(f"<polyline fill='none' stroke='{color}' stroke-opacity='0.8' stroke-width='1.2' points='{path}'>"
                         f"<title>trial {t.get('number')} ({html.escape(str(t.get('state')))})</title></polyline>")
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' aria-label='intermediate values'>"
            f"<text x='44' y='12' font-size='11' font-family='sans-serif'>intermediate values per trial</text>{frame}{''.join(lines)}"
            f"<text x='44' y='{height - 4}' font-size='9' font-family='sans-serif'>step {x0:g}</text>"
            f"<text x='{width - 8}' y='{height - 4}' font-size='9' text-anchor='end' font-family='sans-serif'>{x1:g}</text></svg>")


def svg_importance(importance: dict | None, width: int = 300) -> str:
    """Parameter importance as horizontal bars (largest first)."""
    if not importance:
        return ""
    items = sorted(importance.items(), key=lambda kv: -kv[1])[:12]
    bar_h, pad_l, top = 16, 90, 18
    height = top + bar_h * len(items) + 4
    top_value = max(v for _, v in items) or 1.0
    bars = []
    for i, (name, v) in enumerate(items):
        y = top + i * bar_h
        w = max(1.0, (width - pad_l - 40) * v / top_value)
        bars.append(f"<text x='{pad_l - 4}' y='{y + 11}' font-size='10' text-anchor='end' font-family='sans-serif'>{html.escape(clip(name, 14))}</text>"
                    f"<rect x='{pad_l}' y='{y + 2}' width='{w:.1f}' height='{bar_h - 5}' fill='#8250df'/>"
                    f"<text x='{pad_l + w + 3:.1f}' y='{y + 11}' font-size='9' font-family='sans-serif'>{v:.2f}</text>")
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' aria-label='parameter importance'>"
            f"<text x='4' y='12' font-size='11' font-family='sans-serif'>parameter importance</text>{''.join(bars)}</svg>")


def render_plots(sweep: dict, trials: list[dict]) -> str:
    charts = [svg_history(trials, sweep.get("mode", "min")), svg_intermediate(trials), svg_importance(sweep.get("importance"))]
    charts = [c for c in charts if c]
    if not charts:
        return ""
    return "<div style='display:flex;flex-wrap:wrap;gap:10px'>" + "".join(charts) + "</div>"


# -- the static form (see trainhub.kernels.widget: what outlives the widget) ---------------------------
#: The MIME type of a sweep's static form as JSON (rendered live by the JupyterLab panel extension).
SWEEP_MIME = "application/vnd.trainhub.sweep+json"
STATIC_TRIALS = 10  # trials in the static form (the newest)
STATIC_SWEEP_FIELDS = ("id", "name", "user", "state", "reason", "trials", "parallel", "metric", "mode", "sampler", "pruner",
                       "progress", "best", "created", "finished")


def sweep_links(sweep: dict, server_prefix: str | None = None) -> dict:
    """``jobs_table``: the sweep's trials in the user's jobs table (``lab?trainhub-sweep=ID``); ``optuna_dashboard``:
    its study in optuna-dashboard through the user's own server (trainhub.extensions.optunadash); none outside a server."""
    from urllib.parse import quote

    prefix = server_prefix if server_prefix is not None else os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if not prefix:
        return {}
    sid = quote(str(sweep["id"]))
    return {"jobs_table": f"{prefix.rstrip('/')}/lab?trainhub-sweep={sid}",
            "optuna_dashboard": f"{prefix.rstrip('/')}/trainhub/optuna/open?sweep={sid}"}


def sweep_static_text(sweep: dict, trials: list[dict], links: dict | None = None) -> str:
    """The sweep as plain text: its summary line, the newest trials as a table, where to see more."""
    lines = [summary_line(sweep)]
    if sweep.get("reason") and sweep.get("best"):
        lines.append(f"  {sweep['reason']}")
    rows = trial_rows(trials)[-STATIC_TRIALS:]
    if rows:
        cols = [c for c in rows[0] if c != "reason"]
        table = text_table([[fmt_number(r.get(c), 4, none="") for c in cols] for r in rows], cols)
        lines += ["  " + ln for ln in table.splitlines()]
        if len(trials) > len(rows):
            lines.append(f"  (the newest {len(rows)} of {plural(len(trials), 'trial')})")
    else:
        lines.append("  (no trials yet)")
    if (links or {}).get("jobs_table"):
        lines.append(f"  trials in the jobs table: {links['jobs_table']}")
    if (links or {}).get("optuna_dashboard"):
        lines.append(f"  in Optuna's dashboard: {links['optuna_dashboard']}")
    lines.append(f"  details: trainhub sweeps show {sweep.get('id')}")
    return "\n".join(lines)


def sweep_static_html(sweep: dict, trials: list[dict], links: dict | None = None) -> str:
    parts = [render_header(sweep), render_trials_table(trials, max_rows=STATIC_TRIALS)]
    anchors = []
    if (links or {}).get("jobs_table"):
        anchors.append(f"<a href='{html.escape(links['jobs_table'], quote=True)}' target='_blank' rel='noopener'>"
                       "its trials in the jobs table</a>")
    if (links or {}).get("optuna_dashboard"):
        anchors.append(f"<a href='{html.escape(links['optuna_dashboard'], quote=True)}' target='_blank' rel='noopener' "
                       "title='a read-only copy of your own studies (trainhub.optuna_storage())'>Open in Optuna dashboard</a>")
    anchors.append(f"details: <code>trainhub sweeps show {html.escape(str(sweep.get('id')))}</code>")
    parts.append("<div style='font-size:12px;color:#57606a;margin-top:2px'>" + " &middot; ".join(anchors) + "</div>")
    return (f"<div class='trainhub-sweep-static' data-trainhub-sweep='{html.escape(str(sweep.get('id')), quote=True)}'>"
            + "".join(parts) + "</div>")


def sweep_static_bundle(sweep: dict, trials: list[dict], links: dict | None = None) -> dict:
    links = sweep_links(sweep) if links is None else links
    data = {"version": 1, "kind": "sweep", "id": sweep.get("id"),
            "sweep": {k: sweep.get(k) for k in STATIC_SWEEP_FIELDS if k in sweep},
            "trials": trial_rows(trials)[-STATIC_TRIALS:], "links": links}
    return {"text/plain": sweep_static_text(sweep, trials, links), "text/html": sweep_static_html(sweep, trials, links),
            SWEEP_MIME: data}


def render_dashboard_link(sweep: dict, server_prefix: str | None = None) -> str:
    """"Open in Optuna dashboard" (the user's own copy of their studies, through their server); "" outside a server."""
    link = sweep_links(sweep, server_prefix).get("optuna_dashboard")
    if not link:
        return ""
    return (f"<a href='{html.escape(link, quote=True)}' target='_blank' rel='noopener' style='margin-right:8px' "
            "title='a read-only copy of your own studies: trainhub.optuna_storage()'>Open in Optuna dashboard</a>")


# -- the live panel --------------------------------------------------------------------------------
class SweepPanel(StaticForm):
    """Live view of one sweep: ``update(sweep, trials)`` sets the widgets from API dicts; ``start()``
    polls every ``poll`` seconds on a daemon thread until the sweep ends or ``stop()``."""

    def __init__(self, client, sweep: dict, *, poll: float = 1.0):
        import ipywidgets as w

        self.client = client
        self.sweep = sweep
        self.trials: list[dict] = []
        self.poll = poll
        self.done = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.header = w.HTML()
        self.bar = w.IntProgress(value=0, min=0, max=max(1, int(sweep.get("trials") or 1)), bar_style="info",
                                 layout=w.Layout(width="300px"))
        self.table = w.HTML()
        self.plots = w.HTML()
        self.message = w.HTML()
        self.cancel_button = w.Button(description="Cancel sweep", button_style="danger", icon="stop",
                                      tooltip="cancel this sweep and its running trials", layout=w.Layout(width="auto"))
        self.cancel_button.on_click(lambda _b: self.cancel())
        self.dashboard = w.HTML(value=render_dashboard_link(sweep))  # through the user's server (extensions.optunadash)
        self.widget = w.VBox([w.HBox([self.header, w.HBox([self.dashboard, self.cancel_button])],
                                     layout=w.Layout(justify_content="space-between", align_items="flex-start")),
                              self.bar, self.plots, self.table, self.message])
        self._init_static("sweep")
        self.update(sweep, [])

    def static(self) -> dict:
        return sweep_static_bundle(self.sweep, self.trials)

    def _static_key(self) -> tuple:
        best = self.sweep.get("best") or {}
        return (self.sweep.get("state"), (self.sweep.get("progress") or {}).get("done"), best.get("value"))

    def update(self, sweep: dict | None = None, trials: list[dict] | None = None) -> None:
        if sweep is not None:
            self.sweep = sweep
            self.header.value = render_header(sweep)
            self.bar.value = int((sweep.get("progress") or {}).get("done", 0))
            terminal = sweep.get("state") in SWEEP_TERMINAL
            self.bar.bar_style = {COMPLETED: "success", FAILED: "danger", CANCELLED: "warning"}.get(sweep.get("state"), "info")
            self.cancel_button.disabled = terminal
            self.cancel_button.layout.display = "none" if terminal else None
        if trials is not None:
            self.trials = trials
            self.table.value = render_trials_table(trials)
            self.plots.value = render_plots(self.sweep, trials)
        self.publish()  # the static form: at once when the state, progress or best changes, else every static_every s

    def cancel(self) -> None:
        try:
            self.update(self.client.cancel_sweep(self.sweep["id"]))
            self.message.value = "<span style='color:#57606a'>cancel requested: running trials are being stopped</span>"
        except Exception as e:
            self.message.value = f"<span style='color:#cf222e'>cancel failed: {html.escape(str(e))}</span>"

    def refresh(self) -> dict:
        sweep = self.client.get_sweep(self.sweep["id"])
        trials = self.client.sweep_trials(self.sweep["id"])
        self.update(sweep, trials)
        return sweep

    def start(self) -> "SweepPanel":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"trainhub-sweep-panel-{self.sweep['id']}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        errors = 0
        pause = panel_backoff(f"sweep {self.sweep['id']} to end", self.poll)  # as JobPanel's
        try:
            while not self._stop.is_set():
                try:
                    sweep = self.refresh()
                    if errors:
                        self.message.value = ""
                    errors = 0
                    pause.reset()
                    if sweep.get("state") in SWEEP_TERMINAL:
                        break
                except Exception as e:
                    errors += 1
                    self.message.value = f"<span style='color:#8a6d00'>cannot refresh ({html.escape(str(e))}); retrying</span>"
                if pause.sleep(until=self._stop):
                    break
        finally:
            self.publish(force=True)  # the final state and trials
            self.done.set()


__all__ = ["SweepMagics", "SweepHandle", "SweepPanel", "BestTrial", "sweep_parser", "sweep_body", "SWEEP_MIME"]
