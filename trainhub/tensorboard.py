"""TensorBoard for jobs: where a job writes its event files, and one TensorBoard showing several jobs.

A job writes TensorBoard event files under ``trainhub.tensorboard_dir()`` (``$TRAINHUB_OUTPUTS_DIR/
tensorboard``; e.g. ``SummaryWriter(trainhub.tensorboard_dir())``). The jobs service syncs them to
the job's area like every output (``<area>/outputs/tensorboard/``, every ``OutputSyncer.small_interval``
seconds while it runs). :func:`gather` copies the event files of the jobs asked for into one local
folder, one run per job (``<logdir>/<job id>[-<name>]/``), so one TensorBoard shows them side by
side; called again, it copies only what changed. :func:`command` is the TensorBoard process for it.

The user's server (``trainhub.extensions.tensorboard``: served through jupyter-server-proxy) and the
CLI (``trainhub jobs tensorboard``) both use these. Work is bounded: at most ``max_files`` files and
``max_bytes`` bytes per gather, whatever the jobs wrote.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trainhub.exceptions import InvalidRequest

EVENTS_REL = "outputs/tensorboard"  # in a job's area
LOGDIR_NAME = "tensorboard"  # in a job's outputs folder
_RUN_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def job_events_url(job: dict) -> str | None:
    """Where job ``job`` (the jobs API's JSON) keeps its event files; None for a job with no area yet."""
    area = job.get("outputs_url")
    return f"{area.rstrip('/')}/{EVENTS_REL}" if area else None


def run_name(job: dict) -> str:
    """The job's run in TensorBoard: its id, and its name when it has one (``j-000042-resnet``)."""
    name = _RUN_CHARS.sub("-", str(job.get("name") or "")).strip("-.")[:60]
    return f"{job['id']}-{name}" if name and name != job["id"] else str(job["id"])


@dataclass
class Gathered:
    files: int = 0  # files in the logdir for these jobs
    copied: int = 0  # of them copied this time
    bytes: int = 0
    empty: list[str] = field(default_factory=list)  # job ids with no event files (yet)


def gather(jobs: list[dict], logdir: str | os.PathLike, storage_options: dict | None = None, *,
           max_files: int = 10_000, max_bytes: int = 2 << 30) -> Gathered:
    """Copy the event files of ``jobs`` into ``logdir/<run>/`` (only new or grown files); see the module doc.

    Raises :class:`InvalidRequest` when the jobs hold more than ``max_files`` files or ``max_bytes``
    bytes of event files (nothing past the limit is copied).
    """
    import fsspec

    out = Gathered()
    root = Path(logdir)
    root.mkdir(parents=True, exist_ok=True)
    for job in jobs:
        url = job_events_url(job)
        run_dir = root / run_name(job)
        found = 0
        if url:
            fs, base = fsspec.core.url_to_fs(url, **(storage_options or {}))
            base = base.rstrip("/")
            try:
                listing = fs.find(base, detail=True, maxdepth=8) if fs.isdir(base) else {}
            except FileNotFoundError:
                listing = {}
            for path, info in sorted(listing.items()):
                if info.get("type") != "file" or info.get("islink"):
                    continue
                rel = path[len(base):].lstrip("/")
                if not rel or ".." in rel.split("/"):
                    continue
                size = int(info.get("size") or 0)
                out.files += 1
                out.bytes += size
                if out.files > max_files or out.bytes > max_bytes:
                    raise InvalidRequest(
                        f"the event files of these jobs pass the limit of {max_files} files / {max_bytes >> 20} MiB "
                        "for one TensorBoard: open fewer jobs at once")
                found += 1
                dest = run_dir / rel
                try:
                    if dest.stat().st_size == size:
                        continue  # event files only grow: same size, same content
                except FileNotFoundError:
                    pass
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(dest.name + ".part")
                fs.get_file(path, str(tmp))
                os.replace(tmp, dest)
                out.copied += 1
        if not found:
            out.empty.append(str(job["id"]))
    return out


def command(logdir: str | os.PathLike, port: int, path_prefix: str = "", host: str = "127.0.0.1",
            reload_interval: int = 15) -> list[str]:
    """The TensorBoard process for ``logdir`` on ``host:port``, its pages under ``path_prefix``."""
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", host, "--port", str(port),
           "--reload_interval", str(reload_interval)]
    if path_prefix.strip("/"):
        cmd += ["--path_prefix", "/" + path_prefix.strip("/")]
    return cmd


def proxy_prefix(server_base_url: str, port: int) -> str:
    """Where jupyter-server-proxy serves ``port`` under a server, path unchanged (``proxy/absolute``)."""
    return f"{server_base_url.rstrip('/')}/proxy/absolute/{port}"


def open_link(job_ids: list[str], server_prefix: str | None = None) -> str | None:
    """A link (root-relative) that opens TensorBoard for ``job_ids`` in the user's own server, for notebook
    output; None outside a server (``$JUPYTERHUB_SERVICE_PREFIX`` unset)."""
    from urllib.parse import quote

    prefix = server_prefix if server_prefix is not None else os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if not prefix or not job_ids:
        return None
    return f"{prefix.rstrip('/')}/trainhub/tensorboard/open?jobs={quote(','.join(job_ids), safe=',')}"


def installed() -> str | None:
    """None when TensorBoard can run here, else why not (one sentence a user can act on)."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        return "TensorBoard is not installed in this server's environment (pip install tensorboard)"
    return None
