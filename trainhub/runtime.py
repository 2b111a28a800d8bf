"""The in-job API: what a job's code calls (re-exported as ``trainhub.log_metrics`` etc.).

Inside a job the platform sets ``TRAINHUB_METRICS_FILE``, ``TRAINHUB_OUTPUTS_DIR``,
``TRAINHUB_PARAMS``, ``TRAINHUB_JOB_URL`` (its storage area) and, when a retried or preempted
job starts again after saving checkpoints, ``TRAINHUB_RESUME_URL``/``TRAINHUB_RESUME_STEP`` (see
docs/jobs-api.md, "Inside a job"). Outside a job every function still works, so the same code
runs in a notebook: metrics stay in memory, ``params()`` is ``{}``, ``outputs_dir()`` and the
checkpoints are in temporary directories and ``resume()`` is None.

Checkpoints (:func:`save_checkpoint`, :func:`load_checkpoint`, :func:`resume`) live in the job's
storage area (:mod:`trainhub.jobarea`), so they outlive the attempt that wrote them, on this
machine and on Kubernetes alike. Standard library only at import time (fsspec, and torch for
torch checkpoints, are imported when used).
"""

from __future__ import annotations

import json
import math
import operator
import os
import tempfile
import threading
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["log_metrics", "report", "params", "outputs_dir", "tensorboard_dir", "job_id", "in_job", "logged_metrics", "attempt",
           "save_checkpoint", "load_checkpoint", "checkpoints", "resume", "Checkpoint", "torch_state", "restore_torch",
           "rng_state", "set_rng_state", "optuna_storage", "OPTUNA_COPY"]

# Each user's copy of their own sweeps' Optuna studies, relative to their home (written by the jobs service as the
# user, refreshed when a trial finishes and when a sweep ends; docs/sweeps.md, "In Optuna's own tools")
OPTUNA_COPY = ".trainhub/optuna/studies.db"

_lock = threading.Lock()
_memory: list[dict] = []  # records logged outside a job, oldest first
_tmp_outputs: Path | None = None
_tmp_area: str | None = None  # checkpoints outside a job
_resumed_said = False


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


def tensorboard_dir() -> Path:
    """Where a job writes TensorBoard event files (``outputs_dir()/tensorboard``, created): the side panel,
    the ``%%train`` widget and ``trainhub jobs tensorboard`` show them, one run per job
    (``SummaryWriter(trainhub.tensorboard_dir())``)."""
    from trainhub.tensorboard import LOGDIR_NAME

    path = outputs_dir() / LOGDIR_NAME
    path.mkdir(parents=True, exist_ok=True)
    return path


def attempt() -> int:
    """This job's attempt (1 on the first run, 2 after one retry or preemption...); 1 outside a job."""
    try:
        return int(os.environ.get("TRAINHUB_JOB_ATTEMPT", "1") or 1)
    except ValueError:
        return 1


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0") or 0)
    except ValueError:
        return 0


# -- checkpoints ----------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """A loaded checkpoint: its ``step``, the ``state`` saved and where it is (``url``)."""

    step: int
    state: object
    url: str


def _area():
    """The storage area checkpoints go to: the job's, or a temporary folder kept for this process."""
    global _tmp_area
    from trainhub.jobarea import Area, current_area_url

    url = current_area_url()
    if url is None:
        with _lock:
            if _tmp_area is None:
                _tmp_area = tempfile.mkdtemp(prefix="trainhub-checkpoints-")
            url = _tmp_area
        return Area(url, {})
    return Area(url)


def save_checkpoint(state, step: int, *, keep: int | None = 3) -> str | None:
    """Save ``state`` as the checkpoint of ``step`` (a whole number >= 0) into the job's storage area.

    Atomic: a checkpoint is visible whole or not at all, so a job killed while saving resumes from
    the previous one. The last ``keep`` checkpoints are kept (None or 0: all). ``state`` may be
    ``bytes`` (stored as is), anything holding torch tensors (``torch.save``; see :func:`torch_state`)
    or any picklable value. Only rank 0 saves (the others return None at once: in data-parallel
    training every rank holds the same state). Returns the checkpoint's URL.
    """
    try:
        if isinstance(step, bool):
            raise TypeError
        step = operator.index(step)  # ints, numpy and torch integer scalars
    except TypeError:
        raise TypeError(f"step must be a whole number, not {type(step).__name__}: {step!r}") from None
    if step < 0:
        raise ValueError(f"step must be >= 0, not {step}")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
        raise ValueError(f"keep must be a whole number >= 0 or None, not {keep!r}")
    if _rank() != 0:
        return None
    from trainhub.jobarea import CHECKPOINTS, checkpoint_name, write_value

    area = _area()
    folder = area.path(CHECKPOINTS) if area.local else None
    if folder:
        os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".step-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            fmt, _main = write_value(f, state)
        name = checkpoint_name(step, fmt)
        for old in area.checkpoints():  # the same step saved again in another format: one file per step
            if old.step == step and old.name != name:
                area.remove(f"{CHECKPOINTS}/{old.name}")
        area.put_file(tmp, f"{CHECKPOINTS}/{name}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    if keep:
        for old in area.checkpoints()[:-keep]:
            area.remove(f"{CHECKPOINTS}/{old.name}")
    return area.url_of(f"{CHECKPOINTS}/{name}")


def checkpoints() -> list:
    """The job's checkpoints, oldest first (``trainhub.jobarea.CheckpointInfo``: step, url, format)."""
    return _area().checkpoints()


def _load(area, info, map_location) -> Checkpoint:
    from trainhub.jobarea import CHECKPOINTS, read_value

    with area.open(f"{CHECKPOINTS}/{info.name}") as f:
        return Checkpoint(info.step, read_value(f, info.format, map_location), info.url)


def load_checkpoint(step: int | None = None, *, map_location="cpu") -> Checkpoint | None:
    """Load the latest checkpoint (or the one of ``step``) from the job's storage area; None when there is
    none. Torch tensors are loaded onto ``map_location`` (default the CPU; ``load_state_dict`` then
    copies them to the model's device)."""
    area = _area()
    found = area.checkpoints()
    if step is not None:
        found = [c for c in found if c.step == int(step)]
    if not found:
        return None
    return _load(area, found[-1], map_location)


def resume(*, map_location="cpu") -> Checkpoint | None:
    """The checkpoint this attempt was started with, loaded; None on a fresh start.

    When a job that saved checkpoints is retried, preempted and requeued, or started again after its
    workers were lost, the platform offers it the latest one (``$TRAINHUB_RESUME_URL``, step in
    ``$TRAINHUB_RESUME_STEP``; the job's events say "resumed from step S")::

        ckpt = trainhub.resume()
        start = 0 if ckpt is None else ckpt.step + 1
    """
    global _resumed_said
    from trainhub.jobarea import RESUME_STEP_VAR, RESUME_URL_VAR

    url = os.environ.get(RESUME_URL_VAR)
    if not url:
        return None
    area = _area()
    info = next((c for c in area.checkpoints() if c.url == url), None)
    if info is None:  # not under this area's URL as written (another spelling): the newest of the step
        step = int(os.environ.get(RESUME_STEP_VAR, "-1") or -1)
        info = next((c for c in reversed(area.checkpoints()) if c.step == step), None)
    if info is None:
        raise FileNotFoundError(f"the checkpoint offered to this attempt ({url}) is gone from the job's storage area")
    ckpt = _load(area, info, map_location)
    if not _resumed_said and _rank() == 0:
        _resumed_said = True
        print(f"trainhub: resumed from step {ckpt.step} ({info.name})", file=sys.stderr, flush=True)
    return ckpt


# -- torch helpers ----------------------------------------------------------------------------------
def _unwrap(model):
    """The module inside DistributedDataParallel / DataParallel / torch.compile wrappers."""
    for attr in ("module", "_orig_mod"):
        inner = getattr(model, attr, None)
        if inner is not None and hasattr(inner, "state_dict"):
            return _unwrap(inner)
    return model


def rng_state() -> dict:
    """The random generators' states: Python's, torch's (CPU and CUDA, when loaded) and numpy's (when loaded)."""
    import random

    out = {"python": random.getstate()}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        out["numpy"] = np.random.get_state()
    return out


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned (generators absent here are skipped)."""
    import random

    if "python" in state:
        random.setstate(state["python"])
    torch = sys.modules.get("torch")
    if torch is not None:
        if "torch" in state:
            torch.set_rng_state(state["torch"].cpu())
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]][:torch.cuda.device_count()])
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in state:
        np.random.set_state(state["numpy"])


def torch_state(model=None, optimizer=None, scheduler=None, *, rng: bool = True, **extra) -> dict:
    """A checkpoint state for torch training: the state dicts of ``model`` (unwrapped from DDP),
    ``optimizer`` and ``scheduler``, the random generators' states and any ``extra`` values::

        trainhub.save_checkpoint(trainhub.runtime.torch_state(model, opt, sched, epoch=epoch), step)
    """
    state = dict(extra)
    if model is not None:
        state["model"] = _unwrap(model).state_dict()
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    if rng:
        state["rng"] = rng_state()
    return state


def restore_torch(state: dict, model=None, optimizer=None, scheduler=None, *, rng: bool = True) -> dict:
    """Load what :func:`torch_state` saved into ``model``, ``optimizer`` and ``scheduler`` (and the random
    generators); returns the extra values (``{"epoch": ...}``)."""
    if model is not None and "model" in state:
        _unwrap(model).load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and "scheduler" in state:
        scheduler.load_state_dict(state["scheduler"])
    if rng and "rng" in state:
        set_rng_state(state["rng"])
    return {k: v for k, v in state.items() if k not in ("model", "optimizer", "scheduler", "rng")}


def optuna_storage(home: str | os.PathLike | None = None) -> str:
    """The Optuna storage URL of the caller's own sweeps: ``optuna.load_study(study_name="s-000003",
    storage=trainhub.optuna_storage())`` in a notebook, ``optuna-dashboard "$(python -c ...)"`` in a terminal.

    An SQLite file in the home (``~/.trainhub/optuna/studies.db``; ``home`` default ``$HOME``) holding a **copy**
    of each of the user's studies, named by sweep id (``s-000003``), written by the platform as the user when a
    trial finishes and when a sweep ends. Only the user's own sweeps are in it. Writing to it changes nothing on
    the platform (the next refresh replaces the file)."""
    base = Path(home) if home is not None else Path(os.environ.get("HOME") or os.path.expanduser("~"))
    return "sqlite:///" + str(base / OPTUNA_COPY)
