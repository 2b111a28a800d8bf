"""Load ``%%train`` automatically in platform notebooks.

The local spawner calls :func:`install_into` with the user's home (a ``trainhub.boundary.files.UserTree``,
written as the user through descriptors) before the single-user server starts (through
``LocalGPUSpawner.prepare_home_hook``, which the hub's configuration sets: the spawner never imports
the kernel side); :func:`install_ipython_startup` writes the same file into a folder by path. It writes ``~/.ipython/profile_default/startup/00-trainhub.py``, which
IPython runs in every new kernel: when the kernel belongs to a notebook whose variables were kept
across a release (``$TRAINHUB_SNAPSHOT_DIR`` and ``$JPY_SESSION_NAME``) it loads
``trainhub.kernels.snapshot``, which restores them; when ``$TRAINHUB_API_URL`` is set (the spawner sets it for
platform servers) it loads the ``trainhub.kernels`` extension, silently; anywhere else it does
nothing. A failure to load prints one line and never breaks the kernel.
"""

from __future__ import annotations

import os
from pathlib import Path

STARTUP_FILENAME = "00-trainhub.py"
MARKER = "# trainhub: loads the %%train magics in platform notebooks"

STARTUP_SOURCE = f'''{MARKER}
# (written by trainhub.kernels.startup.install_ipython_startup; rewritten on each server start)
def _trainhub_load_extension():
    import os
    import sys

    if os.environ.get("TRAINHUB_SNAPSHOT_DIR") and os.environ.get("JPY_SESSION_NAME"):
        try:  # a notebook's variables kept across a release come back (trainhub.kernels.snapshot)
            get_ipython().extension_manager.load_extension("trainhub.kernels.snapshot")
        except Exception as e:
            print(f"trainhub: variables kept for this notebook could not be restored ({{type(e).__name__}}: {{e}})", file=sys.stderr)
    if not os.environ.get("TRAINHUB_API_URL"):
        return
    try:
        get_ipython().extension_manager.load_extension("trainhub.kernels")
    except Exception as e:  # never break the kernel
        print(f"trainhub: %%train is not available in this kernel ({{type(e).__name__}}: {{e}})", file=sys.stderr)


_trainhub_load_extension()
del _trainhub_load_extension
'''


def startup_path(home_dir: str | os.PathLike, profile: str = "default") -> Path:
    ipython_dir = Path(home_dir) / ".ipython"
    return ipython_dir / f"profile_{profile}" / "startup" / STARTUP_FILENAME


def install_into(home, profile: str = "default") -> str:
    """Write the startup file into the home ``home`` (an object with ``makedirs``, ``read_bytes``, ``write_bytes``:
    a ``trainhub.boundary.files.UserTree``) unless it is there already; returns its path relative to the home.
    A link or special file in its place is not followed: the write fails and the server starts without it."""
    rel = startup_path("", profile).as_posix()
    try:
        if home.read_bytes(rel, len(STARTUP_SOURCE) * 2) == STARTUP_SOURCE.encode():
            return rel
    except OSError:
        pass
    home.makedirs(rel.rsplit("/", 1)[0], mode=0o755)
    home.write_bytes(rel, STARTUP_SOURCE.encode(), mode=0o644)
    return rel


def install_ipython_startup(home_dir: str | os.PathLike, *, profile: str = "default",
                            uid: int | None = None, gid: int | None = None) -> Path:
    """Write the startup file under ``home_dir`` (creating the folders) and return its path.

    Idempotent: rewrites the file only when its content differs. ``uid``/``gid``: owner to give
    the folders created and the file when the spawner runs as root (None = leave as is).
    For kernels that use another ``IPYTHONDIR`` or profile, pass ``profile`` or use
    :data:`STARTUP_SOURCE` directly (e.g. a Kubernetes ConfigMap mounted into the startup folder).
    """
    path = startup_path(home_dir, profile)
    created = []
    for folder in reversed(path.parents[:3]):  # .ipython, profile_x, startup
        if not folder.exists():
            folder.mkdir(mode=0o755)
            created.append(folder)
    if not path.exists() or path.read_text() != STARTUP_SOURCE:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(STARTUP_SOURCE)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    if uid is not None or gid is not None:
        for p in [*created, path]:
            os.chown(p, -1 if uid is None else uid, -1 if gid is None else gid)
    return path
