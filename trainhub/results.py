"""Values sent back from a job: what ``%%train --return NAME`` and ``@trainhub.remote`` return.

In the job (rank 0, when the code has finished), :func:`send` writes each value to the job's storage
area (:mod:`trainhub.jobarea`), one file per value, then ``results/manifest.json`` last, so a reader
never sees half a result. Values holding torch tensors are written with ``torch.save`` and read back
with ``map_location="cpu"`` (a job on a GPU, a notebook without one); everything else is pickled.
A value that cannot be sent is named in the manifest with the reason, the others are still sent, and
the job fails with that message in its log: never silently.

On the other side, :func:`load` reads them for a finished job (``JobHandle.result()``,
``%train result JOB``, a ``@trainhub.remote`` call), straight from storage: nothing goes through
the jobs API or its database, so values of any size work.
"""

from __future__ import annotations

import json
import os
import sys
import time

from trainhub.jobarea import RESULTS, Area, current_area_url, read_value, write_value

MANIFEST = f"{RESULTS}/manifest.json"
VERSION = 1

__all__ = ["send", "send_names", "load", "ResultsError", "MANIFEST"]

_sent_outside: dict = {}  # what send() got outside a job (kept so notebook checks see it)


class ResultsError(RuntimeError):
    """The job's values cannot be had: it sent none, some could not be sent (``errors``: name -> why), or
    its storage area cannot be read. ``values`` holds those that could be read."""

    def __init__(self, message: str, errors: dict | None = None, values: dict | None = None):
        super().__init__(message)
        self.errors = dict(errors or {})
        self.values = dict(values or {})


# -- in the job -------------------------------------------------------------------------------------
def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0") or 0)
    except ValueError:
        return 0


def _type_name(value) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def send(values: dict, *, errors: dict | None = None) -> dict | None:
    """Send ``values`` ({name: value}) back from this job; called by the generated script, rank 0 only
    (other ranks return None at once). Returns the manifest.

    Each value goes to ``results/<name>.pkl`` (or ``.pt``) in the job's area, the manifest last.
    ``errors`` ({name: why}) names values known to be missing. If any value could not be sent, the
    job fails (SystemExit, exit code 1) with one line per value and the reason, after sending the rest.
    Outside a job the values are only kept in memory (:func:`sent_outside_a_job`).
    """
    if _rank() != 0:
        return None
    errors = dict(errors or {})
    manifest = {"version": VERSION, "job": os.environ.get("TRAINHUB_JOB_ID"), "rank": 0,
                "attempt": _int_env("TRAINHUB_JOB_ATTEMPT"), "time": time.time(), "values": {}, "errors": errors}
    url = current_area_url()
    if url is None:
        _sent_outside.clear()
        _sent_outside.update(values)
        return manifest
    area = Area(url)
    area.remove(MANIFEST)  # an older attempt's manifest must never describe this attempt's files
    for name, value in values.items():
        if not str(name).isidentifier() and name != "return":
            errors[name] = "not a Python name"
            continue
        try:
            fmt_main: list = []

            def writer(f, value=value):
                fmt_main[:] = write_value(f, value)

            size = area.write_with(f"{RESULTS}/{name}.bin", writer)
        except Exception as e:  # pickling raises many kinds
            errors[name] = f"cannot be pickled ({type(e).__name__}: {str(e)[:200]})"
            continue
        fmt, main_names = fmt_main
        manifest["values"][name] = {"file": f"{name}.bin", "format": fmt, "bytes": size, "type": _type_name(value),
                                    "main": main_names}
    area.write_bytes(MANIFEST, json.dumps(manifest, indent=1).encode())
    if errors:
        lines = [f"trainhub: could not send back {', '.join(sorted(errors))}:"]
        lines += [f"  - {n}: {why}" for n, why in sorted(errors.items())]
        if manifest["values"]:
            lines.append(f"  (sent: {', '.join(manifest['values'])})")
        raise SystemExit("\n".join(lines))
    return manifest


def send_names(namespace: dict, names: list[str]) -> dict | None:
    """``send`` the values of ``names`` in ``namespace`` (the script's globals); a name the code never
    bound is reported as such."""
    values, errors = {}, {}
    for n in names:
        if n in namespace:
            values[n] = namespace[n]
        else:
            errors[n] = "not defined when the code finished"
    return send(values, errors=errors)


def sent_outside_a_job() -> dict:
    """What :func:`send` got in this process outside a job (a copy)."""
    return dict(_sent_outside)


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return None


# -- in the notebook / the caller ------------------------------------------------------------------
def area_of(job: dict) -> str | None:
    """The storage area of a job as the API describes it (``outputs_url``; a local ``outputs_path``'s
    folder when the platform has no storage)."""
    if job.get("outputs_url"):
        return job["outputs_url"]
    if job.get("outputs_path"):
        return os.path.dirname(job["outputs_path"].rstrip("/"))
    return None


def read_manifest(job: dict, storage_options: dict | None = None) -> tuple[Area, dict | None]:
    url = area_of(job)
    jid = job.get("id", "the job")
    if not url:
        raise ResultsError(f"{jid} has no storage area (the service gave no outputs_url)")
    try:
        area = Area(url, storage_options)
        raw = area.read_bytes(MANIFEST)
    except FileNotFoundError:
        return Area(url, storage_options), None
    except Exception as e:
        raise ResultsError(f"cannot read the storage area of {jid} ({url}): {type(e).__name__}: {e}. Values are read "
                           "from storage directly: run this where $TRAINHUB_STORAGE_OPTIONS gives access to it (a "
                           "platform notebook or job)") from None
    try:
        return area, json.loads(raw)
    except ValueError as e:
        raise ResultsError(f"{url}/{MANIFEST} is not valid JSON ({e})") from None


def load(job: dict, *, storage_options: dict | None = None, namespace: dict | None = None) -> dict:
    """The values a finished job sent back, ``{name: value}`` (torch tensors on the CPU).

    Raises :class:`ResultsError` when it sent none, when the values are from an earlier attempt than
    the job's last, when some could not be sent (``errors``; ``values`` holds the others), or when a
    value refers to a class or function the job defined and ``namespace`` (default: ``__main__``'s)
    lacks, with what to do about it.
    """
    jid = job.get("id", "the job")
    area, manifest = read_manifest(job, storage_options)
    if manifest is None:
        raise ResultsError(f"{jid} sent no values back: submit with `%%train --return NAME` or call a "
                           "@trainhub.remote function (rank 0 sends them when the code has finished)")
    if job.get("attempt") and manifest.get("attempt") and manifest["attempt"] != job["attempt"]:
        raise ResultsError(f"the values in {area.url}/{RESULTS} are from attempt {manifest['attempt']} of {jid}; its last "
                           f"attempt ({job['attempt']}) sent none")
    ns = namespace if namespace is not None else vars(sys.modules.get("__main__") or object())
    values, errors = {}, dict(manifest.get("errors") or {})
    for name, meta in (manifest.get("values") or {}).items():
        missing = [m for m in meta.get("main") or [] if m not in ns]
        if missing:
            errors[name] = (f"a {meta.get('type')} whose class or function {', '.join(missing)} the job defined itself: "
                            f"define {', '.join(missing)} here first (in a cell), or send plain data (a dict, a "
                            "state_dict())")
            continue
        try:
            values[name] = _read_value(area, f"{RESULTS}/{meta['file']}", meta.get("format", "pickle"))
        except Exception as e:
            errors[name] = f"cannot be read back ({type(e).__name__}: {str(e)[:200]})"
    if errors:
        raise ResultsError(f"{jid}: " + "; ".join(f"{n}: {why}" for n, why in sorted(errors.items())), errors, values)
    return values


def _read_value(area: Area, rel: str, fmt: str):
    with area.open(rel) as f:
        return read_value(f, fmt)
