"""Search-space parsing and sweep-spec validation: tables of good and bad input with the exact messages."""

from __future__ import annotations

import pytest

from trainhub.exceptions import InvalidRequest
from trainhub.searchspace import (SpaceError, describe, grid_points, grid_size, merge_spaces, parse_param,
                                            parse_space, reports_metric, space_from_source, to_distributions)
from trainhub.services.sweeps.spec import validate_sweep


@pytest.mark.parametrize("text, name, dist", [
    ("lr=loguniform:1e-5:1e-1", "lr", {"type": "loguniform", "low": 1e-5, "high": 0.1}),
    ("dropout=uniform:0:0.5", "dropout", {"type": "uniform", "low": 0.0, "high": 0.5}),
    ("dropout=uniform:0:1:0.25", "dropout", {"type": "uniform", "low": 0.0, "high": 1.0, "step": 0.25}),
    ("layers=int:2:8", "layers", {"type": "int", "low": 2, "high": 8}),
    ("layers=int:2:2", "layers", {"type": "int", "low": 2, "high": 2}),
    ("units=int:16:256:16", "units", {"type": "int", "low": 16, "high": 256, "step": 16}),
    ("units=logint:16:1024", "units", {"type": "logint", "low": 16, "high": 1024}),
    ("opt=choice:adam,sgd", "opt", {"type": "choice", "values": ["adam", "sgd"]}),
    ("bs=choice:32, 64,128", "bs", {"type": "choice", "values": [32, 64, 128]}),
    ("mix=choice:0.5,true,none,x", "mix", {"type": "choice", "values": [0.5, True, None, "x"]}),
    (" lr = LogUniform:1e-3:1 ", "lr", {"type": "loguniform", "low": 1e-3, "high": 1.0}),
])
def test_good_param_specs(text, name, dist):
    assert parse_param(text) == (name, dist)


@pytest.mark.parametrize("text, message", [
    ("lr", "--param 'lr': expected NAME=KIND:ARGS, e.g. lr=loguniform:1e-5:1e-1"),
    ("=uniform:0:1", "--param '=uniform:0:1': expected NAME=KIND:ARGS, e.g. lr=loguniform:1e-5:1e-1"),
    ("1lr=uniform:0:1", "--param 1lr=uniform:0:1: the name '1lr' must be a Python identifier (letters, digits, _)"),
    ("lr=normal:0:1", "--param lr=normal:0:1: unknown distribution 'normal'; use one of uniform, loguniform, int, logint, choice (e.g. lr=loguniform:1e-5:1e-1)"),
    ("lr=", "--param lr=: unknown distribution ''; use one of uniform, loguniform, int, logint, choice (e.g. lr=loguniform:1e-5:1e-1)"),
    ("lr=uniform:1", "--param lr=uniform:1: uniform takes LOW:HIGH[:STEP] (e.g. dropout=uniform:0:0.5)"),
    ("lr=loguniform:1e-5:1e-1:2", "--param lr=loguniform:1e-5:1e-1:2: loguniform takes LOW:HIGH (e.g. lr=loguniform:1e-5:1e-1)"),
    ("lr=uniform:a:1", "--param lr=uniform:a:1: LOW 'a' is not a number"),
    ("lr=uniform:0:inf", "--param lr=uniform:0:inf: HIGH must be finite, not 'inf'"),
    ("n=int:1.5:4", "--param n=int:1.5:4: LOW '1.5' is not a whole number"),
    ("lr=uniform:1:1", "--param lr=uniform:1:1: empty range: LOW (1) must be less than HIGH (1)"),
    ("lr=uniform:2:1", "--param lr=uniform:2:1: empty range: LOW (2) must be less than HIGH (1)"),
    ("n=int:5:2", "--param n=int:5:2: empty range: LOW (5) must be less than HIGH (2)"),
    ("lr=loguniform:0:1", "--param lr=loguniform:0:1: loguniform needs LOW > 0 (got 0); use uniform/int for ranges that reach 0"),
    ("n=logint:0:8", "--param n=logint:0:8: logint needs LOW > 0 (got 0); use uniform/int for ranges that reach 0"),
    ("lr=uniform:0:1:0", "--param lr=uniform:0:1:0: STEP must be positive (got 0)"),
    ("lr=uniform:0:1:2", "--param lr=uniform:0:1:2: STEP (2) is larger than the range 0..1"),
    ("opt=choice:", "--param opt=choice:: choice needs at least one value (e.g. opt=choice:adam,sgd)"),
    ("opt=choice:,,", "--param opt=choice:,,: choice needs at least one value (e.g. opt=choice:adam,sgd)"),
    ("opt=choice:a,b,a", "--param opt=choice:a,b,a: choice lists a value twice: ['a', 'b', 'a']"),
])
def test_bad_param_specs(text, message):
    with pytest.raises(SpaceError) as e:
        parse_param(text)
    assert str(e.value) == message


@pytest.mark.parametrize("space, message", [
    ({}, "the search space is empty: give --param NAME=KIND:ARGS (e.g. --param lr=loguniform:1e-5:1e-1) or a search_space = {...} dict in the cell"),
    ({"lr": 0.1}, "parameter 'lr': expected a string like 'loguniform:1e-5:1e-1', a list of choices or an object, not float"),
    ({"lr": {"type": "uniform", "low": 0}}, "parameter 'lr': uniform needs high (e.g. dropout=uniform:0:0.5)"),
    ({"lr": {"type": "beta"}}, "parameter 'lr': unknown distribution 'beta'; use one of uniform, loguniform, int, logint, choice (e.g. lr=loguniform:1e-5:1e-1)"),
    ({"lr": {"type": "uniform", "low": 0, "high": 1, "mu": 2}}, "parameter 'lr': unknown key(s) ['mu'] for uniform (it takes low, high, step)"),
    ({"opt": []}, "parameter 'opt': choice needs at least one value (e.g. opt=choice:adam,sgd)"),
    ({"opt": [[1, 2]]}, "parameter 'opt': choice values must be strings, numbers, booleans or null, not [1, 2]"),
    (["lr=uniform:0:1", "lr=uniform:0:2"], "--param lr=uniform:0:2: parameter 'lr' is given twice"),
    ("lr=uniform:0:1", 'the search space must be an object like {"lr": "loguniform:1e-5:1e-1"}'),
])
def test_bad_spaces(space, message):
    with pytest.raises(SpaceError) as e:
        parse_space(space)
    assert str(e.value) == message


def test_spaces_from_dicts_lists_and_flags_agree():
    from_flags = parse_space(["lr=loguniform:1e-5:0.1", "opt=choice:adam,sgd", "n=int:2:8"])
    from_dict = parse_space({"lr": "loguniform:1e-5:0.1", "opt": ["adam", "sgd"],
                             "n": {"type": "int", "low": 2.0, "high": 8}})
    assert from_flags == from_dict
    assert describe(from_flags) == "lr=loguniform:1e-05:0.1 opt=choice:adam,sgd n=int:2:8"
    assert parse_space([describe(from_flags).split()[0]])["lr"] == from_flags["lr"]
    d = to_distributions(from_flags)
    assert d["lr"].log and d["lr"].low == 1e-5 and d["n"].high == 8 and list(d["opt"].choices) == ["adam", "sgd"]


def test_space_in_the_cell_is_read_without_running_it():
    src = "import trainhub\nsearch_space = {'lr': 'loguniform:1e-4:1', 'opt': ['a', 'b']}\nprint(1/0)\n"
    assert space_from_source(src) == {"lr": "loguniform:1e-4:1", "opt": ["a", "b"]}
    assert space_from_source("x = 1\n") is None
    with pytest.raises(SpaceError, match="must be a literal dict"):
        space_from_source("search_space = make_space()\n")
    with pytest.raises(SpaceError) as e:
        merge_spaces(parse_space(["lr=uniform:0:1"]), parse_space({"lr": "uniform:0:2"}))
    assert str(e.value) == "parameter(s) lr declared both with --param and in the cell's search_space dict: keep one"


@pytest.mark.parametrize("source, expected", [
    ("import trainhub\ntrainhub.report(step=1, val_loss=0.3)\n", True),
    ("from trainhub import log_metrics\nlog_metrics(val_loss=1)\n", True),
    ("import trainhub\ntrainhub.report(step=1, loss=0.3)\n", False),
    ("print('no reports at all')\n", False),
    ("import trainhub\nm = {'val_loss': 1}\ntrainhub.report(**m)\n", None),
    ("def broken(:\n", None),
])
def test_metric_check(source, expected):
    assert reports_metric(source, "val_loss") is expected


def test_grid_points():
    space = parse_space(["n=int:1:3", "opt=choice:a,b", "d=uniform:0:1:0.5"])
    grid = grid_points(space)
    assert grid == {"n": [1, 2, 3], "opt": ["a", "b"], "d": [0.0, 0.5, 1.0]}
    assert grid_size(grid) == 18
    assert grid_points(parse_space(["lr=loguniform:1e-3:1"])) is None


BASE = {"script": "import trainhub\ntrainhub.report(step=0, val_loss=1)\n", "trials": 4, "metric": "val_loss",
        "mode": "min", "space": {"lr": "loguniform:1e-5:1e-1"}}


@pytest.mark.parametrize("change, message", [
    ({"mode": None}, "mode is required: 'min' or 'max' (does a smaller or a larger val_loss win?)"),
    ({"mode": "up"}, "mode must be 'min' or 'max', not 'up'"),
    ({"metric": None}, "metric is required: the name the trials report, e.g. --metric val_loss with trainhub.report(step=..., val_loss=...) in the trial"),
    ({"metric": "val loss"}, "metric 'val loss' is not a metric name (letters, digits, _ . / -)"),
    ({"trials": None}, "trials is required: how many trials to run (e.g. --trials 20)"),
    ({"trials": 0}, "trials must be between 1 and 10000, not 0"),
    ({"parallel": "two"}, "parallel must be a whole number, not 'two'"),
    ({"sampler": "bayes"}, "unknown sampler 'bayes'; use one of tpe, random, grid, cmaes"),
    ({"pruner": "asha"}, "unknown pruner 'asha'; use one of median, hyperband, none"),
    ({"sampler": "grid"}, "the grid sampler needs discrete parameters: lr is continuous; use choice:..., int:LOW:HIGH or uniform:LOW:HIGH:STEP"),
    ({"sampler": "grid", "space": {"n": "int:1:3"}}, "the grid has 3 points but trials is 4; use --trials 3 or fewer"),
    ({"space": {"lr": "uniform:3:1"}}, "parameter 'lr': empty range: LOW (3) must be less than HIGH (1)"),
    ({"script": "print(1)\n"}, "metric 'val_loss' is never reported by the trial code: call trainhub.report(step=..., val_loss=...) in it (or pass check_metric: false / --no-metric-check if a helper reports it)"),
    ({"params": {"a": 1}}, "params is set by the sweep for each trial and cannot be given"),
    ({"command": "echo"}, "give exactly one of 'command' (a shell command) or 'script' (Python source)"),
    ({"seed": 1.5}, "seed must be a whole number, not 1.5"),
    # the size of a request never decides the size of the work: each limit is checked before anything is built
    ({"sampler": "grid", "space": {"n": "int:0:1000000000000"}},
     "the grid has 1,000,000,000,001 points; at most 100,000 are allowed (fewer values per parameter, larger steps, or --sampler tpe/random)"),
    ({"sampler": "grid", "space": {"a": "int:1:100", "b": "int:1:100", "c": "int:1:100"}},
     "the grid has 1,000,000 points; at most 100,000 are allowed (fewer values per parameter, larger steps, or --sampler tpe/random)"),
    ({"sampler": "grid", "space": {"d": "uniform:0:1:1e-300"}},
     "the grid has 4,611,686,018,427,387,904 points; at most 100,000 are allowed (fewer values per parameter, larger steps, or --sampler tpe/random)"),
    ({"space": {f"p{i}": "uniform:0:1" for i in range(65)}}, "the search space has 65 parameters; at most 64 are allowed"),
    ({"space": {"opt": list(range(1001))}},
     "parameter 'opt': choice lists 1001 values; at most 1000 are allowed (use int:LOW:HIGH or uniform:LOW:HIGH:STEP for a long range)"),
    ({"space": {"opt": ["x" * 257]}}, "parameter 'opt': a choice value is 257 characters long; at most 256 are allowed"),
    ({"space": {"n": {"type": "int", "low": 0, "high": 2 ** 64}}}, "parameter 'n': HIGH must be between -2**53 and 2**53"),
    ({"space": {"p" * 65: "uniform:0:1"}}, f"parameter {'p' * 64}...: names are at most 64 characters"),
])
def test_bad_sweep_specs(change, message):
    body = {**BASE, **change}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(InvalidRequest) as e:
        validate_sweep(body)
    assert e.value.message == message


def test_good_sweep_spec_defaults():
    spec = validate_sweep({**BASE, "name": "my sweep", "gpus": 1, "parallel": 9})
    assert (spec.name, spec.trials, spec.parallel, spec.sampler, spec.pruner) == ("my sweep", 4, 4, "tpe", "median")
    assert spec.job.gpus == 1 and spec.job.script == BASE["script"] and spec.job.name == "my sweep"
    assert validate_sweep({**BASE, "script": "print(1)", "check_metric": False}).job.script == "print(1)"
    assert validate_sweep({**BASE, "script": None, "command": "python train.py"}).job.command == "python train.py"
