"""Search spaces of sweeps: parsing, validation and conversion to Optuna distributions.

A parameter is written ``NAME=KIND:ARGS`` (``--param`` in ``%%sweep`` and the CLI)::

    lr=loguniform:1e-5:1e-1     a float, sampled on a log scale (LOW > 0)
    dropout=uniform:0:0.5       a float; uniform:0:1:0.1 steps by 0.1
    layers=int:2:8              an int in [2, 8]; int:16:256:16 steps by 16
    units=logint:16:1024        an int on a log scale (LOW >= 1)
    opt=choice:adam,sgd         one of the listed values (numbers and true/false are typed)

The same strings are accepted as the values of a ``search_space = {...}`` dict in a ``%%sweep``
cell and of the API's ``space`` object, which also takes a list (a choice) or the canonical
object ``{"type": "loguniform", "low": 1e-5, "high": 0.1}``. Every mistake raises
:class:`SpaceError` with one message naming the parameter and what would be accepted.

Pure functions; Optuna is imported only by :func:`to_distributions`.
"""

from __future__ import annotations

import ast
import math
import re

from trainhub.fmt import clip

KINDS = ("uniform", "loguniform", "int", "logint", "choice")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
EXAMPLES = {
    "uniform": "dropout=uniform:0:0.5",
    "loguniform": "lr=loguniform:1e-5:1e-1",
    "int": "layers=int:2:8",
    "logint": "units=logint:16:1024",
    "choice": "opt=choice:adam,sgd",
}
USAGE = {
    "uniform": "LOW:HIGH[:STEP]",
    "loguniform": "LOW:HIGH",
    "int": "LOW:HIGH[:STEP]",
    "logint": "LOW:HIGH",
    "choice": "A,B,...",
}
SPACE_VARIABLE = "search_space"
# What one sweep may ask of the service: each limit bounds the memory and the work its validation,
# its Optuna study and its grid cost, checked before anything is stored or materialised.
MAX_PARAMS = 64
MAX_NAME_LENGTH = 64
MAX_CHOICES = 1_000
MAX_CHOICE_LENGTH = 256
MAX_GRID_POINTS = 100_000
MAX_INT = 2 ** 53  # integers Optuna (which works in floats) still tells apart


class SpaceError(ValueError):
    """A search-space mistake; ``str(e)`` is the message meant for the user."""


def _number(text: str, what: str, prefix: str, integer: bool = False):
    try:
        value = int(text) if integer else float(text)
    except (TypeError, ValueError):
        kind = "a whole number" if integer else "a number"
        raise SpaceError(f"{prefix}: {what} {text!r} is not {kind}") from None
    if not integer and not math.isfinite(value):
        raise SpaceError(f"{prefix}: {what} must be finite, not {text!r}")
    return value


def _choice_value(text: str):
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if re.fullmatch(r"[+-]?\d+", t):
        return int(t)
    try:
        f = float(t)
    except ValueError:
        return t
    return f if math.isfinite(f) else t


def parse_param(text: str) -> tuple[str, dict]:
    """``"lr=loguniform:1e-5:1e-1"`` -> ``("lr", {"type": "loguniform", "low": 1e-05, "high": 0.1})``."""
    text = str(text).strip()
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise SpaceError(f"--param {text!r}: expected NAME=KIND:ARGS, e.g. lr=loguniform:1e-5:1e-1")
    return name, parse_dist(name, rest.strip(), prefix=f"--param {text}")


def parse_dist(name: str, spec, prefix: str | None = None) -> dict:
    """One parameter's distribution from a spec string, a list (choice) or a canonical dict."""
    prefix = prefix or f"parameter {name!r}"
    if not isinstance(name, str) or not _NAME.match(name):
        raise SpaceError(f"{prefix}: the name {str(name)[:MAX_NAME_LENGTH]!r} must be a Python identifier (letters, digits, _)")
    if len(name) > MAX_NAME_LENGTH:
        raise SpaceError(f"parameter {name[:MAX_NAME_LENGTH]}...: names are at most {MAX_NAME_LENGTH} characters")
    if isinstance(spec, (list, tuple)):
        return _check(name, {"type": "choice", "values": list(spec)}, prefix)
    if isinstance(spec, dict):
        return _check(name, dict(spec), prefix)
    if not isinstance(spec, str):
        raise SpaceError(f"{prefix}: expected a string like {EXAMPLES['loguniform'].split('=', 1)[1]!r}, "
                         f"a list of choices or an object, not {type(spec).__name__}")
    kind, _, args = spec.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        shown = kind or spec
        raise SpaceError(f"{prefix}: unknown distribution {shown!r}; use one of {', '.join(KINDS)} "
                         f"(e.g. {EXAMPLES['loguniform']})")
    if kind == "choice":
        values = [v for v in (a.strip() for a in args.split(",")) if v] if args.strip() else []
        return _check(name, {"type": "choice", "values": [_choice_value(v) for v in values]}, prefix)
    parts = [a.strip() for a in args.split(":")] if args else []
    allowed = (2, 3) if kind in ("uniform", "int") else (2,)
    if len(parts) not in allowed:
        raise SpaceError(f"{prefix}: {kind} takes {USAGE[kind]} (e.g. {EXAMPLES[kind]})")
    integer = kind in ("int", "logint")
    d = {"type": kind, "low": _number(parts[0], "LOW", prefix, integer),
         "high": _number(parts[1], "HIGH", prefix, integer)}
    if len(parts) == 3:
        d["step"] = _number(parts[2], "STEP", prefix, integer)
    return _check(name, d, prefix)


def _check(name: str, d: dict, prefix: str) -> dict:
    """Validate a canonical distribution dict and return a clean copy."""
    kind = d.get("type")
    if kind not in KINDS:
        raise SpaceError(f"{prefix}: unknown distribution {kind!r}; use one of {', '.join(KINDS)} "
                         f"(e.g. {EXAMPLES['loguniform']})")
    if kind == "choice":
        values = d.get("values")
        if not isinstance(values, list) or not values:
            raise SpaceError(f"{prefix}: choice needs at least one value (e.g. {EXAMPLES['choice']})")
        if len(values) > MAX_CHOICES:
            raise SpaceError(f"{prefix}: choice lists {len(values)} values; at most {MAX_CHOICES} are allowed "
                             "(use int:LOW:HIGH or uniform:LOW:HIGH:STEP for a long range)")
        for v in values:
            if not (v is None or isinstance(v, (str, int, float, bool))):
                raise SpaceError(f"{prefix}: choice values must be strings, numbers, booleans or null, not {clip(repr(v), 80)}")
            if isinstance(v, str) and len(v) > MAX_CHOICE_LENGTH:
                raise SpaceError(f"{prefix}: a choice value is {len(v)} characters long; at most {MAX_CHOICE_LENGTH} are allowed")
            if isinstance(v, float) and not math.isfinite(v):
                raise SpaceError(f"{prefix}: choice values must be finite numbers, not {v!r}")
        if len({repr(v) for v in values}) != len(values):
            raise SpaceError(f"{prefix}: choice lists a value twice: {values}")
        extra = set(d) - {"type", "values"}
        if extra:
            raise SpaceError(f"{prefix}: unknown key(s) {sorted(extra)} for choice (it takes 'values')")
        return {"type": "choice", "values": list(values)}
    extra = set(d) - {"type", "low", "high", "step"}
    if extra:
        raise SpaceError(f"{prefix}: unknown key(s) {sorted(extra)} for {kind} (it takes low, high, step)")
    integer = kind in ("int", "logint")
    out = {"type": kind}
    for key in ("low", "high", "step"):
        if key not in d or d[key] is None:
            if key == "step":
                continue
            raise SpaceError(f"{prefix}: {kind} needs {key} (e.g. {EXAMPLES[kind]})")
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            v = _number(str(v), key.upper(), prefix, integer)
        if integer and isinstance(v, float):
            if not v.is_integer():
                raise SpaceError(f"{prefix}: {key.upper()} {v!r} is not a whole number")
            v = int(v)
        if integer and abs(v) > MAX_INT:
            raise SpaceError(f"{prefix}: {key.upper()} must be between -2**53 and 2**53")
        if not integer:
            v = float(v)
            if not math.isfinite(v):
                raise SpaceError(f"{prefix}: {key.upper()} must be finite, not {v!r}")
        out[key] = v
    low, high = out["low"], out["high"]
    if low > high or (low == high and not integer):
        raise SpaceError(f"{prefix}: empty range: LOW ({_fmt(low)}) must be less than HIGH ({_fmt(high)})")
    if kind in ("loguniform", "logint") and low <= 0:
        raise SpaceError(f"{prefix}: {kind} needs LOW > 0 (got {_fmt(low)}); use uniform/int for ranges that reach 0")
    if "step" in out:
        if out["step"] <= 0:
            raise SpaceError(f"{prefix}: STEP must be positive (got {_fmt(out['step'])})")
        if out["step"] > high - low and high > low:
            raise SpaceError(f"{prefix}: STEP ({_fmt(out['step'])}) is larger than the range {_fmt(low)}..{_fmt(high)}")
    return out


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def parse_space(space) -> dict:
    """A whole search space: a dict name -> spec (string, list or object), or a list of
    ``NAME=KIND:ARGS`` strings (``--param`` values). Returns ``{name: canonical dict}``."""
    if space is None:
        space = {}
    out: dict[str, dict] = {}
    if isinstance(space, (list, tuple, dict)) and len(space) > MAX_PARAMS:
        raise SpaceError(f"the search space has {len(space)} parameters; at most {MAX_PARAMS} are allowed")
    if isinstance(space, (list, tuple)):
        for item in space:
            name, d = parse_param(item)
            if name in out:
                raise SpaceError(f"--param {item}: parameter {name!r} is given twice")
            out[name] = d
    elif isinstance(space, dict):
        for name, spec in space.items():
            out[name] = parse_dist(name, spec)
    else:
        raise SpaceError('the search space must be an object like {"lr": "loguniform:1e-5:1e-1"}')
    if len(out) > MAX_PARAMS:
        raise SpaceError(f"the search space has {len(out)} parameters; at most {MAX_PARAMS} are allowed")
    if not out:
        raise SpaceError("the search space is empty: give --param NAME=KIND:ARGS (e.g. --param lr=loguniform:1e-5:1e-1) "
                         f"or a {SPACE_VARIABLE} = {{...}} dict in the cell")
    return out


def merge_spaces(from_flags: dict, from_cell: dict) -> dict:
    """``--param`` flags and the cell's dict together; a name in both is a mistake."""
    both = sorted(set(from_flags) & set(from_cell))
    if both:
        raise SpaceError(f"parameter(s) {', '.join(both)} declared both with --param and in the cell's "
                         f"{SPACE_VARIABLE} dict: keep one")
    return {**from_cell, **from_flags}


def space_from_source(source: str, variable: str = SPACE_VARIABLE) -> dict | None:
    """The literal dict assigned to ``variable`` at the top level of ``source`` (not run), or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    found = None
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == variable for t in stmt.targets):
            found = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == variable:
            found = stmt.value
    if found is None:
        return None
    try:
        value = ast.literal_eval(found)
    except (ValueError, SyntaxError, TypeError):
        raise SpaceError(f"{variable} in the cell must be a literal dict such as "
                         '{"lr": "loguniform:1e-5:1e-1", "opt": ["adam", "sgd"]} (it is read without running the cell)') from None
    if not isinstance(value, dict):
        raise SpaceError(f"{variable} in the cell must be a dict, not {type(value).__name__}")
    return value


def reports_metric(source: str, metric: str) -> bool | None:
    """Does ``source`` report ``metric``? True when a ``report(...)``/``log_metrics(...)`` call passes
    it by keyword, None when that cannot be told (``**values``, unparsable), False otherwise."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    unknown = False
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
        if name not in ("report", "log_metrics"):
            continue
        for kw in node.keywords:
            if kw.arg == metric:
                return True
            if kw.arg is None:
                unknown = True
    return None if unknown else False


def _grid_count(d: dict) -> int | None:
    """How many grid values one parameter has (None: continuous), counted, never listed."""
    if d["type"] == "choice":
        return len(d["values"])
    if d["type"] == "int":
        return (d["high"] - d["low"]) // d.get("step", 1) + 1
    if d["type"] == "uniform" and "step" in d:
        n = (d["high"] - d["low"]) / d["step"] + 1e-9
        return int(math.floor(n)) + 1 if n < 2 ** 62 else 2 ** 62
    return None


def grid_count(space: dict) -> int | None:
    """The number of points of a discrete space's grid (None when a parameter is continuous).

    Refuses (:class:`SpaceError`) a grid over :data:`MAX_GRID_POINTS`: Optuna's grid sampler holds
    every point in memory, so the size of the grid is the size of the work."""
    n = 1
    for d in space.values():
        c = _grid_count(d)
        if c is None:
            return None
        n *= c
    if n > MAX_GRID_POINTS:
        raise SpaceError(f"the grid has {n:,} points; at most {MAX_GRID_POINTS:,} are allowed "
                         "(fewer values per parameter, larger steps, or --sampler tpe/random)")
    return n


def grid_points(space: dict) -> dict[str, list] | None:
    """The grid of a discrete space ({name: values}); None when a parameter is continuous.
    Sized by :func:`grid_count` before any value is listed."""
    if grid_count(space) is None:
        return None
    grid = {}
    for name, d in space.items():
        if d["type"] == "choice":
            grid[name] = list(d["values"])
        elif (n := _grid_count(d)) is not None:
            step = d.get("step", 1)
            vals = [d["low"] + i * step for i in range(n)]
            grid[name] = [int(v) for v in vals] if d["type"] == "int" else [round(v, 12) for v in vals]
        else:
            return None
    return grid


def grid_size(grid: dict[str, list]) -> int:
    n = 1
    for values in grid.values():
        n *= len(values)
    return n


def to_distributions(space: dict) -> dict:
    """Canonical space -> ``{name: optuna.distributions.BaseDistribution}``."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out = {}
    for name, d in space.items():
        kind = d["type"]
        if kind == "choice":
            out[name] = CategoricalDistribution(d["values"])
        elif kind in ("uniform", "loguniform"):
            out[name] = FloatDistribution(d["low"], d["high"], log=kind == "loguniform", step=d.get("step"))
        else:
            out[name] = IntDistribution(d["low"], d["high"], log=kind == "logint", step=d.get("step", 1))
    return out


def describe(space: dict) -> str:
    """``lr=loguniform:1e-05:0.1 opt=choice:adam,sgd`` (the flags' form, for display)."""
    parts = []
    for name, d in space.items():
        if d["type"] == "choice":
            parts.append(f"{name}=choice:" + ",".join("null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
                                                     for v in d["values"]))
        else:
            args = [_fmt(d["low"]), _fmt(d["high"])] + ([_fmt(d["step"])] if "step" in d else [])
            parts.append(f"{name}={d['type']}:" + ":".join(args))
    return " ".join(parts)
