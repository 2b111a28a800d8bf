"""Validating a sweep spec (POST /sweeps): every mistake is refused before anything is submitted.

A sweep spec is a job spec (``command`` or ``script``, ``gpus``, ``workers``, ``env``,
``time_limit``, ``profile``...: see docs/jobs-api.md), used as the template of every trial,
plus the sweep's own fields (:data:`SWEEP_FIELDS`).
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field

from trainhub.exceptions import InvalidRequest
from trainhub.fmt import clip
from trainhub.jobspec import MODES, PRUNERS, SAMPLERS
from trainhub.searchspace import SpaceError, grid_count, parse_space, reports_metric
from trainhub.services.jobs.spec import JobSpec, validate_spec, whole_number

SWEEP_FIELDS = {"name", "trials", "parallel", "metric", "mode", "sampler", "pruner", "space", "seed",
                "check_metric", "prune_after", "startup_trials"}
METRIC_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,127}$")
MAX_TRIALS = 10_000


@dataclass
class SweepSpec:
    name: str
    trials: int
    parallel: int
    metric: str
    mode: str
    sampler: str
    pruner: str
    space: dict
    job: JobSpec
    seed: int | None = None
    startup_trials: int | None = None  # trials finished before pruning/TPE start (None = derived)
    prune_after: int = 0  # steps a trial reports before it may be pruned
    options: dict = field(default_factory=dict)

    def settings(self) -> dict:
        """The sweep-level settings stored with the sweep (what the controller needs besides the job)."""
        return {"sampler": self.sampler, "pruner": self.pruner, "seed": self.seed,
                "startup_trials": self.startup_trials, "prune_after": self.prune_after}


def validate_sweep(body) -> SweepSpec:
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object describing the sweep (see GET /openapi.json)")
    job_body = {k: v for k, v in body.items() if k not in SWEEP_FIELDS}
    for k in ("sweep_id", "params", "submit_key"):
        if k in job_body:
            raise InvalidRequest(f"{k} is set by the sweep for each trial and cannot be given")
    metric = body.get("metric")
    if not metric or not isinstance(metric, str):
        raise InvalidRequest("metric is required: the name the trials report, e.g. --metric val_loss with "
                             "trainhub.report(step=..., val_loss=...) in the trial")
    if not METRIC_RE.match(metric):
        raise InvalidRequest(f"metric {metric!r} is not a metric name (letters, digits, _ . / -)")
    mode = body.get("mode")
    if mode is None or mode == "":
        raise InvalidRequest(f"mode is required: 'min' or 'max' (does a smaller or a larger {metric} win?)")
    if mode not in MODES:
        raise InvalidRequest(f"mode must be 'min' or 'max', not {mode!r}")
    sampler = body.get("sampler") or "tpe"
    if not isinstance(sampler, str):
        raise InvalidRequest(f"sampler must be one of {', '.join(SAMPLERS)}")
    if sampler not in SAMPLERS:
        raise InvalidRequest(f"unknown sampler {sampler!r}; use one of {', '.join(SAMPLERS)}")
    if sampler == "cmaes" and importlib.util.find_spec("cmaes") is None:
        raise InvalidRequest("the cmaes sampler needs the 'cmaes' package, which this platform does not have; "
                             "use --sampler tpe (or ask an admin to install cmaes)")
    pruner = body.get("pruner") or "median"
    if not isinstance(pruner, str):
        raise InvalidRequest(f"pruner must be one of {', '.join(PRUNERS)}")
    if pruner not in PRUNERS:
        raise InvalidRequest(f"unknown pruner {pruner!r}; use one of {', '.join(PRUNERS)}")
    trials = body.get("trials")
    if trials is None:
        raise InvalidRequest("trials is required: how many trials to run (e.g. --trials 20)")
    trials = whole_number(body, "trials", None, 1, MAX_TRIALS)
    parallel = whole_number(body, "parallel", 1, 1, 256)
    try:
        space = parse_space(body.get("space"))
    except SpaceError as e:
        raise InvalidRequest(str(e)) from None
    if sampler == "grid":
        try:
            points = grid_count(space)
        except SpaceError as e:
            raise InvalidRequest(str(e)) from None
        if points is None:
            cont = [n for n, d in space.items() if d["type"] in ("loguniform", "logint")
                    or (d["type"] == "uniform" and "step" not in d)]
            raise InvalidRequest(f"the grid sampler needs discrete parameters: {', '.join(cont)} "
                                 "is continuous; use choice:..., int:LOW:HIGH or uniform:LOW:HIGH:STEP")
        if trials > points:
            raise InvalidRequest(f"the grid has {points} points but trials is {trials}; "
                                 f"use --trials {points} or fewer")
    seed = body.get("seed")
    seed = None if seed is None else whole_number(body, "seed", None, 0, 2**32 - 1)  # numpy's seed range
    startup = body.get("startup_trials")
    startup = None if startup is None else whole_number(body, "startup_trials", None, 0, MAX_TRIALS)
    prune_after = whole_number(body, "prune_after", 0, 0, 1_000_000)
    check = body.get("check_metric", True)
    if not isinstance(check, bool):
        raise InvalidRequest("check_metric must be true or false")
    name = body.get("name") or "sweep"
    if not isinstance(name, str) or len(name) > 110:
        raise InvalidRequest(f"name must be a string of at most 110 characters (each trial is NAME-tN), not {clip(repr(name), 60)}")
    job = validate_spec({**job_body, "name": f"{name}-t0"})
    job.name = job.name[:-3]
    if check and job.script is not None and reports_metric(job.script, metric) is False:
        raise InvalidRequest(f"metric {metric!r} is never reported by the trial code: call "
                             f"trainhub.report(step=..., {metric}=...) in it (or pass check_metric: false / "
                             "--no-metric-check if a helper reports it)")
    return SweepSpec(name=job.name, trials=trials, parallel=min(parallel, trials), metric=metric, mode=mode,
                     sampler=sampler, pruner=pruner, space=space, job=job, seed=seed, startup_trials=startup,
                     prune_after=prune_after)
