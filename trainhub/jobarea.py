"""A job's storage area: where its results and checkpoints live, for the job, the engine and the client.

Every job has one area, ``<user storage>/jobs/<job key>`` (the job's ``outputs_url`` in the API;
``$TRAINHUB_JOB_URL`` inside the job), on the platform's storage: a local folder or an object store
reached through fsspec (``s3://...``). The jobs service copies the job's local folder (logs,
``outputs/``) there; the job itself writes, straight to the area::

    results/manifest.json          what rank 0 sent back (``--return``, ``@trainhub.remote``), written last
    results/<name>.pkl | .pt       one file per value
    checkpoints/step-<S>.pkl|.pt|.bin   ``trainhub.save_checkpoint(state, step=S)``, the last N kept

Nothing of it is kept in the database. Writes are atomic: a reader sees a whole file or none (a
local folder: a temporary name in the same folder, then ``os.replace``; an object store: one PUT,
which is atomic). Credentials and endpoint come from ``$TRAINHUB_STORAGE_OPTIONS`` (JSON, set for
notebook servers and jobs) or are passed by the caller (the jobs service's own).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import sys
import tempfile
import types
import uuid
from dataclasses import dataclass

JOB_URL_VAR = "TRAINHUB_JOB_URL"  # the job's area, set for every worker
RESUME_URL_VAR = "TRAINHUB_RESUME_URL"  # the checkpoint offered to this attempt (a retried/preempted job)
RESUME_STEP_VAR = "TRAINHUB_RESUME_STEP"

RESULTS = "results"
CHECKPOINTS = "checkpoints"
_CKPT_NAME = re.compile(r"^step-(\d{1,18})\.(pkl|pt|bin)$")
CHECKPOINT_FORMATS = {"pkl": "pickle", "pt": "torch", "bin": "bytes"}


def area_url(user_storage_url: str | None, key: str, job_dir: str | None = None) -> str | None:
    """The area of job ``key``: ``<user storage URL>/jobs/<key>``; without storage, the job's local folder."""
    if user_storage_url:
        return f"{user_storage_url.rstrip('/')}/jobs/{key}"
    return job_dir or None


def current_area_url() -> str | None:
    """Inside a job: its area (``$TRAINHUB_JOB_URL``; older launchers: the storage URL plus the job key,
    else the job's local folder). None outside a job."""
    if os.environ.get(JOB_URL_VAR):
        return os.environ[JOB_URL_VAR]
    key = os.environ.get("TRAINHUB_JOB_ID")
    if not key:
        return None
    return area_url(os.environ.get("TRAINHUB_STORAGE_URL"), key, os.environ.get("TRAINHUB_JOB_DIR"))


def env_storage_options() -> dict:
    """fsspec options from ``$TRAINHUB_STORAGE_OPTIONS`` ({} when unset or not a JSON object)."""
    raw = os.environ.get("TRAINHUB_STORAGE_OPTIONS", "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint file in an area: ``step``, ``url`` and ``format`` ("pickle", "torch" or "bytes")."""

    step: int
    url: str
    format: str
    name: str


class Area:
    """One job's area on its filesystem. ``url`` as given (``s3://b/users/ann/jobs/j-000001`` or a path)."""

    def __init__(self, url: str, storage_options: dict | None = None):
        import fsspec

        if not url:
            raise ValueError("no storage area: this job has no $TRAINHUB_JOB_URL")
        self.url = url.rstrip("/")
        opts = env_storage_options() if storage_options is None else dict(storage_options)
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **opts)
        self.local = "file" in _protocols(self.fs)

    def path(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel.lstrip('/')}"

    def url_of(self, rel: str) -> str:
        return f"{self.url}/{rel.lstrip('/')}"

    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.path(rel))

    def names(self, rel: str) -> list[str]:
        """File names directly under ``rel`` ([] when it does not exist)."""
        try:
            entries = self.fs.ls(self.path(rel), detail=False, refresh=True)  # no stale listing cache
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)

    def put_file(self, local_path: str, rel: str) -> None:
        """Copy a local file to ``rel`` atomically (readers see the old file, or none, until it is whole)."""
        dest = self.path(rel)
        if self.local:
            folder = os.path.dirname(dest)
            os.makedirs(folder, exist_ok=True)
            if os.path.dirname(os.path.abspath(local_path)) == os.path.abspath(folder):
                _fsync(local_path)
                os.replace(local_path, dest)
                return
            import shutil

            tmp = os.path.join(folder, f".{os.path.basename(dest)}.{uuid.uuid4().hex[:8]}.tmp")
            try:
                shutil.copyfile(local_path, tmp)
                _fsync(tmp)
                os.replace(tmp, dest)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        else:
            self.fs.put_file(local_path, dest)  # one PUT (or one completed multipart upload): atomic

    def write_with(self, rel: str, writer) -> int:
        """Create ``rel`` atomically from ``writer(binary_file)``; returns its size. Large values never sit in
        memory twice: the writer streams into a temporary file (in the destination folder when local)."""
        dest = self.path(rel)
        folder = os.path.dirname(dest) if self.local else None
        if folder:
            os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dest)}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                writer(f)
                f.flush()
                size = f.tell()
            self.put_file(tmp, rel)
            return size
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def write_bytes(self, rel: str, data: bytes) -> int:
        return self.write_with(rel, lambda f: f.write(data))

    def open(self, rel: str, mode: str = "rb"):
        return self.fs.open(self.path(rel), mode)

    def read_bytes(self, rel: str) -> bytes:
        with self.open(rel) as f:
            return f.read()

    def remove(self, rel: str) -> None:
        try:
            self.fs.rm_file(self.path(rel))
        except FileNotFoundError:
            pass

    # -- checkpoints ---------------------------------------------------------------------------
    def checkpoints(self) -> list[CheckpointInfo]:
        """Complete checkpoints, oldest step first (temporary files of a save under way are not listed)."""
        return checkpoints_named(self.url, self.names(CHECKPOINTS))

    def latest_checkpoint(self) -> CheckpointInfo | None:
        found = self.checkpoints()
        return found[-1] if found else None


class _TensorFound(Exception):
    pass


class _Pickler(pickle.Pickler):
    """Pickles, noting the classes and functions of ``__main__`` (the job's script) the value refers to.
    When torch is loaded, a torch tensor stops it (``stop_at_tensor``: the value is then written with
    ``torch.save``) or is skipped (a cheap pass that only collects the ``__main__`` names)."""

    def __init__(self, file, stop_at_tensor: bool = True):
        super().__init__(file, protocol=4)
        self.main_names: set[str] = set()
        self.stop_at_tensor = stop_at_tensor
        torch = sys.modules.get("torch")
        self._tensor_types = tuple(t for t in (getattr(torch, "Tensor", None), getattr(torch, "UntypedStorage", None),
                                               getattr(torch, "TypedStorage", None)) if t is not None) if torch else ()

    def reducer_override(self, obj):
        if self._tensor_types and isinstance(obj, self._tensor_types):
            if self.stop_at_tensor:
                raise _TensorFound()
            return (int, ())  # a placeholder: this pass only looks for __main__ names
        t = obj if isinstance(obj, (type, types.FunctionType)) else type(obj)
        if getattr(t, "__module__", None) == "__main__":
            self.main_names.add(getattr(t, "__qualname__", t.__name__).split(".")[0])
        return NotImplemented


def write_value(f, value) -> tuple[str, list[str]]:
    """Write ``value`` to the binary file ``f``: ``("pickle" | "torch" | "bytes", __main__ names it refers to)``.

    ``bytes`` are written as they are; a value holding torch tensors with ``torch.save`` (read back on
    the CPU by :func:`read_value`); anything else with pickle. Pickling errors propagate."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        f.write(value)
        return "bytes", []
    p = _Pickler(f)
    try:
        p.dump(value)
        return "pickle", sorted(p.main_names)
    except _TensorFound:
        pass
    import torch

    f.seek(0)
    f.truncate()
    probe = _Pickler(io.BytesIO(), stop_at_tensor=False)
    probe.dump(value)
    torch.save(value, f)
    return "torch", sorted(probe.main_names)


def read_value(f, fmt: str, map_location="cpu"):
    """Read back what :func:`write_value` wrote in format ``fmt`` (torch tensors onto ``map_location``)."""
    if fmt == "bytes":
        return f.read()
    if fmt == "torch":
        try:
            import torch
        except ImportError:
            raise RuntimeError("it holds torch tensors: install torch here to read it") from None
        return torch.load(f, map_location=map_location, weights_only=False)
    if fmt != "pickle":
        raise ValueError(f"unknown format {fmt!r}")
    return pickle.load(f)


def checkpoint_name(step: int, fmt: str) -> str:
    ext = {v: k for k, v in CHECKPOINT_FORMATS.items()}[fmt]
    return f"step-{int(step):012d}.{ext}"


def _fsync(path: str) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _protocols(fs) -> tuple:
    p = fs.protocol
    return p if isinstance(p, tuple) else (p,)


def checkpoints_named(url: str, names) -> list[CheckpointInfo]:
    """The complete checkpoints among the file ``names`` of the folder ``checkpoints/`` of the area at ``url``,
    oldest step first (temporary files of a save under way are not among them)."""
    out = []
    for name in names:
        m = _CKPT_NAME.match(name)
        if m:
            out.append(CheckpointInfo(int(m.group(1)), f"{url.rstrip('/')}/{CHECKPOINTS}/{name}",
                                      CHECKPOINT_FORMATS[m.group(2)], name))
    return sorted(out, key=lambda c: (c.step, c.name))


def latest_checkpoint(url: str | None, storage_options: dict | None = None) -> CheckpointInfo | None:
    """The newest complete checkpoint in the area at ``url`` (None when there is none or no area)."""
    if not url:
        return None
    return Area(url, storage_options).latest_checkpoint()
