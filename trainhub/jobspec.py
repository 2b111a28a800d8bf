"""The job spec from flags, shared by `trainhub jobs submit`, `trainhub sweeps create`, ``%%train`` and ``%%sweep``.

:func:`add_spec_options` adds the same flags to each of their parsers (``--gpus``, ``--workers``,
``--name``, ``--profile``, ``--env``, ``--time-limit``, ``--retries``) and :func:`spec_from_args`
turns them into the API's job spec; :func:`add_sweep_options` and :func:`sweep_spec` do the same for
the sweep flags of `trainhub sweeps create` and ``%%sweep``. :func:`parse_duration` is the one
reading of "90s/30m/2h/1h30m": the flags check a time limit with it before anything is sent, and the
jobs service validates specs with it. :func:`parse_states` reads ``--state`` values. Mistakes raise
``ValueError`` (or argparse's errors) with one message; each caller reports it its own way (exit 2,
``UsageError``).
"""

from __future__ import annotations

import argparse
import re

from trainhub.exceptions import InvalidRequest
from trainhub.fmt import fmt_size
from trainhub.searchspace import SpaceError, merge_spaces, parse_space, reports_metric, space_from_source

SAMPLERS = ("tpe", "random", "grid", "cmaes")
PRUNERS = ("median", "hyperband", "none")
MODES = ("min", "max")

# the API document's time_limit pattern (services/jobs/openapi.json): bounded digits keep any text far from overflow
_DURATION = re.compile(r"^ *(?:([0-9]{1,4}(?:\.[0-9]{1,6})?) *d)? *(?:([0-9]{1,6}(?:\.[0-9]{1,6})?) *h)? *"
                       r"(?:([0-9]{1,7}(?:\.[0-9]{1,6})?) *m)? *(?:([0-9]{1,9}(?:\.[0-9]{1,6})?) *s?)? *$")
MAX_DURATION_SECONDS = 1e9  # as a number (about 31 years)
_NUMBER = re.compile(r"\d+(\.\d+)?")
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_duration(value, field_name: str = "time_limit") -> float | None:
    """Seconds from a number or text like "90s", "30m", "2h", "1h30m" (units in the order d, h, m, s);
    None, "" and 0 (no limit) are None. :class:`~trainhub.exceptions.InvalidRequest` (a 400 in the API) names
    ``field_name`` and what would be accepted."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InvalidRequest(f"{field_name} must be seconds or a duration like '30m', not {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
        if not 0 <= seconds <= MAX_DURATION_SECONDS:
            raise InvalidRequest(f"{field_name} must be 0 (no limit) to {MAX_DURATION_SECONDS:.0f} seconds, not {value!r}")
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise InvalidRequest(f"{field_name} {value!r} is not a duration: use seconds (3600) or text like '90s', '30m', '2h', '1h30m'")
        d, h, mi, s = (float(x) if x else 0.0 for x in m.groups())
        seconds = d * 86400 + h * 3600 + mi * 60 + s
    if seconds == 0:
        return None
    return seconds


# -- argument types ---------------------------------------------------------------------------
def nonneg_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def pos_int(text):
    v = nonneg_int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def env_pair(text):
    """``NAME=VALUE`` -> ``(NAME, VALUE)``."""
    key, sep, value = text.partition("=")
    if not sep or not ENV_KEY.match(key):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return key, value


def time_limit(text):
    """``--time-limit``: seconds (sent as a number) or a duration text (checked here, sent as written)."""
    text = text.strip()
    try:
        parse_duration(text)
    except InvalidRequest:
        raise argparse.ArgumentTypeError(f"expected seconds or a duration like 90s, 30m, 2h, 1h30m; got {text!r}") from None
    if _NUMBER.fullmatch(text):
        return float(text) if "." in text else int(text)
    return text.replace(" ", "")  # the service reads it with the same parser


# -- the flags --------------------------------------------------------------------------------
def add_spec_options(p: argparse.ArgumentParser) -> None:
    """The job-spec flags shared by `trainhub jobs submit`, `trainhub sweeps create`, %%train and %%sweep."""
    p.add_argument("--gpus", type=nonneg_int, metavar="N", help="GPUs per worker (default: the profile's, else the service's)")
    p.add_argument("--workers", type=pos_int, metavar="W", help="number of workers (default 1); each gets RANK/WORLD_SIZE")
    p.add_argument("--name", metavar="NAME", help="a name to recognise the job by")
    p.add_argument("--profile", metavar="SLUG", help="a server profile slug (its GPU count is the default for --gpus)")
    p.add_argument("--env", action="append", default=[], metavar="K=V", type=env_pair,
                   help="environment variable for the job (repeatable)")
    p.add_argument("--time-limit", metavar="T", type=time_limit,
                   help="stop the job after T: seconds or 90s, 30m, 2h (default or 0: no limit)")
    p.add_argument("--retries", type=nonneg_int, metavar="R", help="re-run a failed job up to R times (default 0)")


def add_workdir_options(p: argparse.ArgumentParser, *, default: str = "") -> None:
    """The working-directory flags shared by `trainhub jobs submit`, %%train and %%sweep (trainhub.workdir). ``default``:
    the folder sent when --workdir is not given (%%train, %%sweep: the notebook's), "" none."""
    g = p.add_argument_group("working directory")
    where = f" (default: {default})" if default else ""
    g.add_argument("--workdir", metavar="DIR", help="send the folder DIR along: the job runs in a copy of it, so its "
                   "modules import and relative paths work as here" + where + "; .gitignore and .trainhubignore are "
                   "respected, hidden folders and __pycache__ left out, at most 50 MB and 10,000 entries")
    g.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="leave out what PATTERN matches (the syntax of .gitignore: data/, *.pt); repeatable")
    if default:
        g.add_argument("--no-workdir", action="store_true",
                       help="send no folder: the job runs in your home directory")


def workdir_summary(sent: dict) -> str:
    """One line on a working directory sent (``JobsAPI.send_workdir``'s answer): what it holds, what was left out."""
    text = f"{sent.get('files', 0):,} file{'s' if sent.get('files') != 1 else ''}, {fmt_size(sent.get('bytes', 0))}"
    skipped = sent.get("skipped") or {}
    if skipped:
        names = ", ".join(sorted(skipped)[:5]) + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else "")
        text += f" (left out: {names}: links leaving it or special files)"
    return text


def spec_from_args(args, *, command: str | None = None, script: str | None = None) -> dict:
    """The API's job spec from :func:`add_spec_options` flags (unset flags left out: the service's defaults apply)."""
    spec = {"name": args.name, "command": command, "script": script, "gpus": args.gpus, "workers": args.workers,
            "profile": args.profile, "time_limit": args.time_limit, "retries": args.retries}
    if args.env:
        spec["env"] = dict(args.env)
    return {k: v for k, v in spec.items() if v is not None}


def add_sweep_options(p: argparse.ArgumentParser) -> None:
    """The sweep flags shared by `trainhub sweeps create` and %%sweep (with :func:`add_spec_options` for each trial's job)."""
    g = p.add_argument_group("sweep")
    g.add_argument("--trials", type=pos_int, metavar="N", help="trials to run in all (required)")
    g.add_argument("--parallel", type=pos_int, default=1, metavar="P", help="trials running at once (default 1; "
                   "your GPU quota may hold fewer)")
    g.add_argument("--metric", metavar="NAME", help="the metric each trial reports with trainhub.report(NAME=...) (required)")
    g.add_argument("--mode", metavar="min|max", help="minimise or maximise the metric (required)")
    g.add_argument("--param", action="append", default=[], metavar="NAME=KIND:ARGS",
                   help="a parameter, e.g. lr=loguniform:1e-5:1e-1, layers=int:2:8, opt=choice:adam,sgd (repeatable)")
    g.add_argument("--sampler", choices=SAMPLERS, default="tpe", help="Optuna sampler (default tpe)")
    g.add_argument("--pruner", choices=PRUNERS, default="median",
                   help="Optuna pruner stopping bad trials early from their intermediate values (default median)")
    g.add_argument("--seed", type=int, metavar="S", help="sampler seed (reproducible suggestions)")
    g.add_argument("--startup-trials", type=nonneg_int, metavar="K",
                   help="finished trials before TPE models and the median pruner compares (default trials/4, 1..5)")
    g.add_argument("--prune-after", type=nonneg_int, default=0, metavar="STEPS",
                   help="steps a trial reports before it may be pruned (default 0)")
    g.add_argument("--no-metric-check", action="store_true",
                   help="start even if the trial code has no report(..., NAME=...) call (a helper module reports it)")


def sweep_spec(args, *, command: str | None = None, script: str | None = None, space_source: str | None = None,
               subject: str = "the cell") -> dict:
    """The POST /sweeps body from :func:`add_sweep_options` and :func:`add_spec_options` flags.

    The search space comes from ``--param`` flags and the literal ``search_space = {...}`` dict in
    ``space_source`` (the cell, the script); ``script`` (the trial code) must report the metric unless
    ``--no-metric-check``. ``subject`` names the trial code in messages ("the cell", "train.py").
    ValueError (with what would be accepted) for every mistake; nothing is sent then.
    """
    if args.trials is None:
        raise ValueError("--trials N is required: how many trials to run")
    if not args.metric:
        raise ValueError(f"--metric NAME is required: the value {subject} reports with trainhub.report(step=..., NAME=...)")
    if not args.mode:
        raise ValueError(f"--mode is required: min or max (does a smaller or a larger {args.metric} win?)")
    if args.mode not in MODES:
        raise ValueError(f"--mode must be min or max, not {args.mode!r}")
    try:
        flags = parse_space(args.param) if args.param else {}
        declared = space_from_source(space_source) if space_source else None
        space = merge_spaces(flags, parse_space(declared) if declared else {})
        if not space:
            parse_space({})  # raises the "empty search space" message
    except SpaceError as e:
        raise ValueError(str(e)) from None
    if script is not None and not args.no_metric_check and reports_metric(script, args.metric) is False:
        raise ValueError(f"{subject} never reports {args.metric!r}: call trainhub.report(step=..., {args.metric}=...) "
                         "in it (or pass --no-metric-check if a helper module reports it)")
    body = spec_from_args(args, command=command, script=script)
    body.update(trials=args.trials, parallel=args.parallel, metric=args.metric, mode=args.mode, space=space,
                sampler=args.sampler, pruner=args.pruner, prune_after=args.prune_after)
    for key in ("seed", "startup_trials"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.no_metric_check:
        body["check_metric"] = False
    return body


def parse_states(values, allowed) -> list[str]:
    """``--state`` values (repeatable, comma-separated), each one of ``allowed``; ValueError names the others."""
    states = [s.strip() for arg in values for s in arg.split(",") if s.strip()]
    bad = [s for s in states if s not in allowed]
    if bad:
        raise ValueError(f"unknown state {', '.join(bad)} (one of {', '.join(allowed)})")
    return states
