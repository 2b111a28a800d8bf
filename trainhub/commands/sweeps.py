"""`trainhub sweeps`: start, list, inspect and cancel hyperparameter sweeps.

Talks to the sweeps API of the jobs service (docs/sweeps.md) through
:class:`trainhub.client.TrainhubClient` (``$TRAINHUB_API_URL`` / ``$JUPYTERHUB_API_TOKEN`` or
``--url``/``--token``). Search-space mistakes are refused here, before anything is sent.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

from trainhub.cli import CommandError
from trainhub.commands.jobs import _api, _conn, cancel_each, check_workdir_args, client_from_args, send_workdir
from trainhub.fmt import clip, fmt_number, parse_time, plural, sweep_progress, text_table
from trainhub.jobspec import add_spec_options, add_sweep_options, add_workdir_options, parse_states, sweep_spec
from trainhub.states import COMPLETED, SWEEP_STATES


def add_parser(sub):
    p = sub.add_parser(
        "sweeps", help="hyperparameter sweeps: every trial a job, Optuna sampling and pruning",
        description="Run hyperparameter sweeps on the platform: each trial runs SCRIPT (or --command) as a job with "
        "its parameters in trainhub.params() ($TRAINHUB_PARAMS); trials report the metric with "
        "trainhub.report(step=..., NAME=value).",
        epilog="Examples:\n"
        "  trainhub sweeps create train.py --trials 20 --parallel 4 --metric val_loss --mode min \\\n"
        "      --param lr=loguniform:1e-5:1e-1 --param layers=int:2:8 --param opt=choice:adam,sgd --gpus 1\n"
        "  trainhub sweeps create src/train.py --workdir . --trials 8 --metric acc --mode max --param lr=uniform:0:1\n"
        "  trainhub sweeps list\n  trainhub sweeps show s-000003\n  trainhub sweeps cancel s-000003",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    sw = p.add_subparsers(dest="sweeps_command", metavar="SUBCOMMAND", parser_class=type(p))

    c = sw.add_parser("create", allow_abbrev=False, help="start a sweep",
                      description="Start a sweep of SCRIPT (a .py file) or --command. The search space comes from "
                      "--param flags and/or a literal `search_space = {...}` dict in SCRIPT. Distributions: "
                      "uniform:LOW:HIGH[:STEP], loguniform:LOW:HIGH, int:LOW:HIGH[:STEP], logint:LOW:HIGH, choice:A,B,...")
    c.add_argument("script", nargs="?", metavar="SCRIPT", help="a Python file: the trial code")
    c.add_argument("--command", "-c", dest="shell_command", metavar="CMD", help="a shell command to run as each trial instead")
    add_sweep_options(c)
    add_spec_options(c)
    add_workdir_options(c)
    c.add_argument("--wait", action="store_true", help="follow the sweep until it ends (exit 1 unless it completed)")
    c.add_argument("--json", action="store_true", help="print the sweep as JSON")
    _conn(c)
    c.set_defaults(func=cmd_create)

    ls = sw.add_parser("list", help="list sweeps, newest first")
    ls.add_argument("--state", action="append", default=[], metavar="STATE", help=f"only these states ({', '.join(SWEEP_STATES)})")
    ls.add_argument("--all", action="store_true", help="everyone's sweeps (admins)")
    ls.add_argument("--limit", type=int, default=50, metavar="N")
    ls.add_argument("--json", action="store_true")
    _conn(ls)
    ls.set_defaults(func=cmd_list)

    sh = sw.add_parser("show", help="show a sweep and its trials")
    sh.add_argument("id", metavar="ID", help="sweep id, e.g. s-000003")
    sh.add_argument("--json", action="store_true", help="the sweep and its trials as JSON")
    _conn(sh)
    sh.set_defaults(func=cmd_show)

    tr = sw.add_parser("trials", help="a sweep's trials (params, state, value, job)")
    tr.add_argument("id", metavar="ID")
    tr.add_argument("--json", action="store_true")
    _conn(tr)
    tr.set_defaults(func=cmd_trials)

    b = sw.add_parser("best", help="the best trial: value, params, job and outputs")
    b.add_argument("id", metavar="ID")
    b.add_argument("--json", action="store_true")
    _conn(b)
    b.set_defaults(func=cmd_best)

    cn = sw.add_parser("cancel", help="cancel sweeps (their running trials are stopped)")
    cn.add_argument("id", metavar="ID", nargs="+")
    _conn(cn)
    cn.set_defaults(func=cmd_cancel)


def body_from_args(args) -> dict:
    """The POST /sweeps body; mistakes (flags, search space, a metric never reported) raise CommandError (exit 2), nothing sent."""
    if bool(args.script) == bool(args.shell_command):
        raise CommandError("give either SCRIPT (a .py file) or --command 'CMD', not both or neither", 2)
    check_workdir_args(args)
    script = None
    if args.script:
        path = Path(args.script)
        if path.suffix != ".py":
            raise CommandError(f"{path} is not a .py file: for other programs use --command '...'", 2)
        try:
            script = path.read_text()
        except OSError as e:
            raise CommandError(f"cannot read {path}: {e.strerror}", 2) from None
    try:
        body = sweep_spec(args, command=args.shell_command, script=script, space_source=script, subject=str(args.script))
    except ValueError as e:
        raise CommandError(str(e), 2) from None
    if args.script and "name" not in body:
        body["name"] = re.sub(r"[^A-Za-z0-9._ -]", "-", Path(args.script).stem)[:100] or "sweep"
    if args.script and args.workdir:  # trials run SCRIPT from their copy of the folder, as `python SCRIPT` would here
        body.pop("script")
        body["command"] = shlex.join(["python", _inside(Path(args.script), Path(args.workdir))])
    return body


def _inside(script: Path, folder: Path) -> str:
    try:
        return script.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        raise CommandError(f"{script} is not inside --workdir {folder}: the trials run it from their copy of that "
                           "folder, so put it there (or leave --workdir out to send the script alone)", 2) from None


def cmd_create(args):
    body = body_from_args(args)
    client = client_from_args(args)
    if args.workdir:  # sent once: every trial runs in its own copy of it (trainhub.workdir)
        body["workdir"] = send_workdir(client, args, " (each trial runs in a copy)")
    sweep = _api(client.create_sweep, body)
    if args.json and not args.wait:
        print(json.dumps(sweep, indent=2))
        return 0
    print(f"started sweep {sweep['id']}: {plural(sweep['trials'], 'trial')}, {sweep['parallel']} at a time, "
          f"{sweep['mode']}imising {sweep['metric']}", file=sys.stderr if args.json else sys.stdout)
    if not args.wait:
        print(f"follow it with: trainhub sweeps show {sweep['id']}")
        return 0
    last = None

    def show(s):
        nonlocal last
        line = f"{s['id']} {s['state']}: {sweep_progress(s)}"
        if s.get("best"):
            line += f"; best {s['metric']} = {s['best']['value']:.6g}"
        if line != last:
            print(line, file=sys.stderr)
            last = line

    try:
        sweep = _api(client.wait_sweep, sweep["id"], poll=1.0, callback=show)
    except KeyboardInterrupt:
        print(f"stopped waiting; {sweep['id']} keeps running (cancel it with: trainhub sweeps cancel {sweep['id']})", file=sys.stderr)
        raise
    if args.json:
        print(json.dumps(sweep, indent=2))
    else:
        print(format_sweep(sweep))
    return 0 if sweep["state"] == COMPLETED else 1


def cmd_list(args):
    client = client_from_args(args)
    states = _api(parse_states, args.state, SWEEP_STATES)
    user = None if args.all else client.whoami()
    page = _api(client.list_sweeps, state=states or None, user=user, limit=args.limit)
    if args.json:
        print(json.dumps(page, indent=2))
        return 0
    items = page.get("items", [])
    if not items:
        print("no sweeps" + (f" in state {', '.join(states)}" if states else ""))
        return 0
    rows = []
    for s in items:
        created = parse_time(s.get("created"))
        p = s.get("progress") or {}
        best = s.get("best")
        rows.append([s["id"], clip(s.get("name"), 24), s.get("user", ""), s.get("state", ""),
                     f"{p.get('done', 0)}/{s.get('trials')}", str(p.get("running", 0) + p.get("pending", 0)),
                     str(p.get("pruned", 0)), f"{s.get('mode')} {s.get('metric')}",
                     f"{best['value']:.6g}" if best else "-", created.strftime("%Y-%m-%d %H:%M") if created else "-"])
    print(text_table(rows, ["ID", "NAME", "USER", "STATE", "DONE", "RUNNING", "PRUNED", "OBJECTIVE", "BEST", "CREATED"]))
    return 0


def format_sweep(sweep: dict) -> str:
    from trainhub.searchspace import describe

    lines = [f"{sweep['id']}  {sweep.get('name') or ''}".rstrip(),
             f"  state:     {sweep.get('state')}" + (f" ({sweep['reason']})" if sweep.get("reason") else ""),
             f"  objective: {sweep.get('mode')} {sweep.get('metric')} ({sweep.get('sampler')} sampler, {sweep.get('pruner')} pruner)",
             f"  space:     {describe(sweep.get('space') or {})}",
             f"  progress:  {sweep_progress(sweep)} ({sweep.get('parallel')} at a time)"]
    best = sweep.get("best")
    if best:
        lines.append(f"  best:      {sweep.get('metric')} = {best['value']:.6g}, trial {best['number']} ({best.get('job_id')}), "
                     f"params {json.dumps(best.get('params'))}")
        if best.get("outputs_url") or best.get("outputs_path"):
            lines.append(f"  outputs:   {best.get('outputs_url') or best.get('outputs_path')}")
    if sweep.get("importance"):
        lines.append("  importance: " + ", ".join(f"{k} {v:.2f}" for k, v in sweep["importance"].items()))
    return "\n".join(lines)


def format_trials(trials: list[dict]) -> str:
    if not trials:
        return "no trials yet"
    names = list(dict.fromkeys(k for t in trials for k in (t.get("params") or {})))
    rows = []
    for t in trials:
        params = t.get("params") or {}
        rows.append([str(t["number"]), t.get("state", ""), "-" if t.get("value") is None else f"{t['value']:.6g}",
                     *[fmt_number(params.get(k), 4, none="None") for k in names], t.get("job_id") or "-", clip(t.get("reason"), 60)])
    return text_table(rows, ["#", "STATE", "VALUE", *names, "JOB", "REASON"])


def cmd_show(args):
    client = client_from_args(args)
    sweep = _api(client.get_sweep, args.id)
    trials = _api(client.sweep_trials, args.id)
    if args.json:
        print(json.dumps({**sweep, "trial_items": trials}, indent=2))
        return 0
    print(format_sweep(sweep))
    print()
    print(format_trials(trials))
    return 0


def cmd_trials(args):
    client = client_from_args(args)
    trials = _api(client.sweep_trials, args.id)
    print(json.dumps(trials, indent=2) if args.json else format_trials(trials))
    return 0


def cmd_best(args):
    client = client_from_args(args)
    sweep = _api(client.get_sweep, args.id)
    best = sweep.get("best")
    if args.json:
        print(json.dumps(best, indent=2))
        return 0 if best else 1
    if not best:
        print(f"{sweep['id']} has no completed trial yet ({sweep_progress(sweep)})")
        return 1
    print(f"trial {best['number']}: {sweep['metric']} = {best['value']:.6g}\n  params:  {json.dumps(best['params'])}\n"
          f"  job:     {best.get('job_id')}\n  outputs: {best.get('outputs_url') or best.get('outputs_path') or '-'}")
    return 0


def cmd_cancel(args):
    return cancel_each(args.id, client_from_args(args).cancel_sweep, "trainhub sweeps cancel")
