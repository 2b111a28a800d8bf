"""Where kernel snapshots live and when they expire: the names the server and the kernel side share.

A release (the culler's, or the user's "give my GPU back") restarts a notebook server on another
profile; before that, each notebook's kernel pickles its variables into one snapshot, and the next
kernel started for the same notebook loads them back. The server extension that asks for snapshots
and the kernel side that writes and reads them are independent parts; both name the files here.

Layout, in the user's own home (the server's root directory; nobody else's server writes there)::

    <root>/.trainhub/snapshots/<key>.pkl    the pickled variables (cloudpickle)
    <root>/.trainhub/snapshots/<key>.json   the manifest: notebook, kept, not kept and why, when

``<key>`` is a hash of the notebook's path (relative to the server's root), so a notebook path never
becomes a file path here. Snapshots older than ``$TRAINHUB_SNAPSHOT_MAX_AGE`` seconds (default
7 days) are deleted whenever a kernel looks for its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

#: the folder of the snapshots, set by the server extension for the kernels it starts
DIR_VAR = "TRAINHUB_SNAPSHOT_DIR"
#: seconds a snapshot is kept (default DEFAULT_MAX_AGE)
MAX_AGE_VAR = "TRAINHUB_SNAPSHOT_MAX_AGE"
#: the server's root directory (notebook paths are relative to it), set by the server extension too
ROOT_VAR = "TRAINHUB_SNAPSHOT_ROOT"
#: the notebook a kernel belongs to (jupyter-server sets it for kernels started for a session: the
#: session's path, or the absolute path of the notebook when the session was created with a name)
SESSION_VAR = "JPY_SESSION_NAME"
DEFAULT_MAX_AGE = 7 * 86400.0
SUBDIR = os.path.join(".trainhub", "snapshots")


def default_dir(root_dir: str | os.PathLike) -> Path:
    return Path(root_dir) / SUBDIR


def notebook_path(session_name: str, root: str | os.PathLike | None = None) -> str:
    """The notebook's path relative to the server's root, however jupyter-server named the session."""
    if root and os.path.isabs(session_name):
        try:
            rel = os.path.relpath(os.path.normpath(session_name), os.path.normpath(root))
        except ValueError:
            return session_name
        if not rel.startswith(".."):
            return rel.replace(os.sep, "/")
    return session_name.strip("/")


def key_for(notebook: str) -> str:
    """A file-name-safe key for a notebook path (relative to the server's root: :func:`notebook_path`)."""
    return hashlib.sha256(notebook.strip("/").encode()).hexdigest()[:32]


def kernel_notebook(environ=os.environ) -> tuple[str, str] | None:
    """(snapshot folder, notebook path) of the kernel running with ``environ``; None outside a notebook."""
    folder, session = environ.get(DIR_VAR), environ.get(SESSION_VAR)
    if not folder or not session:
        return None
    return folder, notebook_path(session, environ.get(ROOT_VAR))


def data_path(folder: str | os.PathLike, notebook: str) -> Path:
    return Path(folder) / f"{key_for(notebook)}.pkl"


def manifest_path(folder: str | os.PathLike, notebook: str) -> Path:
    return Path(folder) / f"{key_for(notebook)}.json"


def max_age(environ=os.environ) -> float:
    try:
        return float(environ.get(MAX_AGE_VAR) or DEFAULT_MAX_AGE)
    except ValueError:
        return DEFAULT_MAX_AGE


def ensure_dir(folder: str | os.PathLike) -> Path:
    """The snapshot folder, created private to the user (0700) if missing."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder


def write_manifest(path: str | os.PathLike, manifest: dict) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(manifest, indent=1, default=str))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def read_manifest(path: str | os.PathLike) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def clean_expired(folder: str | os.PathLike, age: float | None = None, now: float | None = None) -> list[str]:
    """Delete snapshot files older than ``age`` seconds; returns the names deleted."""
    age = max_age() if age is None else age
    now = time.time() if now is None else now
    gone = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return gone
    for e in entries:
        try:
            if e.is_file(follow_symlinks=False) and now - e.stat(follow_symlinks=False).st_mtime > age:
                os.unlink(e.path)
                gone.append(e.name)
        except OSError:
            continue
    return gone
