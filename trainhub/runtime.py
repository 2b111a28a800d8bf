"""The in-job API: what a job's code calls (re-exported as ``trainhub.log_metrics`` etc.).

Inside a job the platform sets ``TRAINHUB_METRICS_FILE``, ``TRAINHUB_OUTPUTS_DIR`` and
``TRAINHUB_PARAMS`` (see docs/jobs-api.md, "Inside a job"). Outside a job every function
still works, so the same code runs in a notebook: metrics stay in memory, ``params()`` is
``{}`` and ``outputs_dir()`` is a temporary directory. Standard library only.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["log_metrics", "report", "params", "outputs_dir", "job_id", "in_job", "logged_metrics"]

_lock = threading.Lock()
_memory: list[dict] = []  # records logged outside a job, oldest first
_tmp_outputs: Path | None = None


def job_id() -> str | None:
    """The running job's id (``$TRAINHUB_JOB_ID``), or None outside a job."""
    return os.environ.get("TRAINHUB_JOB_ID") or None


def in_job() -> bool:
    """True when this process is a trainhub job's worker."""
    return job_id() is not None


def _number(v):
    """Metric values are numbers: accept numpy/torch scalars (anything with __float__)."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v if not (isinstance(v, float) and not math.isfinite(v)) else str(v)
    for attr in ("item", "__float__"):
        if hasattr(v, attr):
            try:
                return _number(v.item() if attr == "item" else float(v))
            except (TypeError, ValueError):
                pass
    raise TypeError(f"metric values must be numbers, got {type(v).__name__}: {v!r}")


def log_metrics(step: int | None = None, **values) -> dict:
    """Record metric ``values`` (``loss=0.4, acc=0.9``) for ``step``.

    In a job: appends ``{"time": epoch_s, "step": step, "values": {...}}`` as one JSON line to
    ``$TRAINHUB_METRICS_FILE`` (flushed per call), where the service reads it. Outside a job the
    record is kept in memory (see :func:`logged_metrics`). Returns the record either way.
    NaN/inf are written as the strings "nan"/"inf" so the file stays valid JSON.
    """
    if not values:
        raise TypeError("log_metrics() needs at least one metric, e.g. log_metrics(step=1, loss=0.5)")
    record = {"time": time.time(), "step": None if step is None else int(step),
              "values": {str(k): _number(v) for k, v in values.items()}}
    path = os.environ.get("TRAINHUB_METRICS_FILE")
    with _lock:
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
        else:
            _memory.append(record)
    return record


def report(step: int | None = None, **values) -> dict:
    """Same as :func:`log_metrics`; sweeps read their objective metric by name from it."""
    return log_metrics(step, **values)


def logged_metrics() -> list[dict]:
    """Records logged outside a job in this process (a copy, oldest first)."""
    with _lock:
        return list(_memory)


def params() -> dict:
    """The sweep trial's parameters (``$TRAINHUB_PARAMS``, JSON); ``{}`` outside a sweep."""
    raw = os.environ.get("TRAINHUB_PARAMS", "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"TRAINHUB_PARAMS is not valid JSON ({e}): {raw[:100]!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"TRAINHUB_PARAMS must be a JSON object, got {type(value).__name__}")
    return value


def outputs_dir() -> Path:
    """Where to write outputs: ``$TRAINHUB_OUTPUTS_DIR`` in a job (synced to storage while
    running and at exit), else a temporary directory kept for this process (created on first use)."""
    global _tmp_outputs
    path = os.environ.get("TRAINHUB_OUTPUTS_DIR")
    if path:
        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)
        return p
    with _lock:
        if _tmp_outputs is None:
            _tmp_outputs = Path(tempfile.mkdtemp(prefix="trainhub-outputs-"))
        return _tmp_outputs
