"""Each user's own Python environment: ``python``, ``pip`` and the packages they install, in their terminals,
notebook kernels and jobs alike, kept in their home across server restarts.

The platform's interpreter lives in a virtualenv nobody but the platform may write (read-only in every sandbox).
A user's environment is a small virtualenv *layered* on it, in their home::

    ~/.trainhub/venv/pyvenv.cfg                      home = <the platform's base interpreter>,
                                                     include-system-site-packages = true (so ``pip install --user`` works)
    ~/.trainhub/venv/bin/python, python3, python3.X  -> the platform's base interpreter
    ~/.trainhub/venv/bin/pip, pip3                   ``python -m pip`` of this environment
    ~/.trainhub/venv/lib/python3.X/site-packages/    ``pip install X`` goes here
        00-trainhub-platform.pth                     the platform's packages (trainhub, Jupyter, torch...) after these
    ~/.trainhub/venv/share/jupyter/kernels/python3/  the notebook kernel runs this environment's python
    ~/.local/lib/python3.X/site-packages/            ``pip install --user X`` goes here (the user site)

Its ``python`` sees, in this order: the user site, the environment's own packages, the platform's packages, then the
base interpreter's. So what a user installs wins over the platform's copy of the same package, for them only.

Where each part of the platform uses it:

- servers (``trainhub.spawner.local``): :func:`install` at every start (as the user, through descriptors); the
  server's environment (:func:`server_env`) puts ``bin/`` and ``~/.local/bin`` first on ``PATH`` and the kernel spec
  on ``JUPYTER_PATH``, so a terminal's ``python``/``pip``, ``%pip`` in a notebook and the notebook's kernel all use
  it, and ``trainhub`` is the platform's command;
- jobs (``trainhub.services.jobs.attemptenv``): :func:`job_env`: the same ``PATH``, and ``PYTHONPATH`` naming the two
  package folders, so a ``%%train`` script (run by the platform's interpreter) imports what the user installed, as a
  ``python train.py`` command job does through ``PATH``.

What a job's platform interpreter does not do with ``PYTHONPATH``: run the ``.pth`` files of the user's folders (an
editable ``pip install -e`` is not seen by ``script`` jobs; ``command`` jobs that call ``python`` see it).
"""

from __future__ import annotations

import json
import os
import site
import stat
import sys

#: the environment's folder, relative to the home
VENV = ".trainhub/venv"
#: set in a server's environment: the user's environment is there (the server extension then gives terminals a shell
#: that keeps the server's PATH)
VAR = "TRAINHUB_USER_ENV"
PTH_NAME = "00-trainhub-platform.pth"
KERNEL_NAME = "python3"

_PY = f"python{sys.version_info.major}.{sys.version_info.minor}"
_PIP = '#!/bin/sh\n# written by trainhub (trainhub.boundary.userenv): pip of this environment\nexec "$(dirname "$0")/python" -m pip "$@"\n'


def venv_dir(home: str) -> str:
    return os.path.join(home, VENV)


def site_packages(home: str) -> str:
    """Where ``pip install`` puts the user's packages."""
    return os.path.join(venv_dir(home), "lib", _PY, "site-packages")


def user_site(home: str) -> str:
    """Where ``pip install --user`` puts them (the user site of ``$HOME``)."""
    return os.path.join(home, ".local", "lib", _PY, "site-packages")


def bin_dirs(home: str) -> list[str]:
    """The user's commands: the environment's (python, pip, what pip installs) and ``pip install --user``'s."""
    return [os.path.join(venv_dir(home), "bin"), os.path.join(home, ".local", "bin")]


def base_interpreter() -> str:
    """The interpreter the platform's virtualenv is made from (the user's environment is made from it too)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def platform_site_packages() -> list[str]:
    """The platform's package folders, which the user's environment reads after its own."""
    return [p for p in site.getsitepackages() if os.path.isdir(p)]


def _path(first: list[str], rest: str | None) -> str:
    parts = [*first, os.path.dirname(sys.executable)]
    for p in (rest or os.defpath).split(os.pathsep):
        if p and p not in parts:
            parts.append(p)
    return os.pathsep.join(parts)


def server_env(home: str, env: dict) -> dict:
    """The variables a server (and so its terminals and kernels) gets for the user's environment, given ``env``."""
    jupyter_path = os.path.join(venv_dir(home), "share", "jupyter")
    if env.get("JUPYTER_PATH"):
        jupyter_path += os.pathsep + env["JUPYTER_PATH"]
    return {"PATH": _path(bin_dirs(home), env.get("PATH")), "JUPYTER_PATH": jupyter_path, VAR: venv_dir(home)}


def job_env(home: str, env: dict) -> dict:
    """The variables every worker of a job gets for the user's environment, given ``env``."""
    pythonpath = [user_site(home), site_packages(home)]
    if env.get("PYTHONPATH"):
        pythonpath.append(env["PYTHONPATH"])
    return {"PATH": _path(bin_dirs(home), env.get("PATH")), "PYTHONPATH": os.pathsep.join(pythonpath),
            VAR: venv_dir(home)}


def files() -> dict[str, tuple[bytes, int]]:
    """The environment's files the platform writes: {path relative to the home: (content, mode)}."""
    base = base_interpreter()
    cfg = (f"home = {os.path.dirname(base)}\ninclude-system-site-packages = true\n"
           f"version = {'.'.join(map(str, sys.version_info[:3]))}\nexecutable = {base}\n"
           "# written by trainhub (trainhub.boundary.userenv): your own environment, layered on the platform's\n")
    pth = "".join(f"import site; site.addsitedir({p!r})\n" for p in platform_site_packages())
    kernel = {"argv": [f"{{home}}/{VENV}/bin/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
              "display_name": "Python 3 (ipykernel)", "language": "python",
              "metadata": {"debugger": True, "trainhub": "your environment: ~/.trainhub/venv (pip install, pip install --user)"}}
    rel_sp = f"{VENV}/lib/{_PY}/site-packages"
    return {
        f"{VENV}/pyvenv.cfg": (cfg.encode(), 0o644),
        f"{VENV}/bin/pip": (_PIP.encode(), 0o755),
        f"{VENV}/bin/pip3": (_PIP.encode(), 0o755),
        f"{rel_sp}/{PTH_NAME}": (pth.encode(), 0o644),
        f"{VENV}/share/jupyter/kernels/{KERNEL_NAME}/kernel.json": (json.dumps(kernel, indent=1).encode(), 0o644),
    }


def install(home, home_path: str) -> None:
    """Make the user's environment in ``home`` (a ``trainhub.boundary.files.UserTree`` of the home at ``home_path``,
    written as the user, through descriptors) or bring the platform's part of it up to date; the user's packages stay.

    Files of the user's own in the places of ``bin/python*`` (not links) are left alone, as are the rest of the folder's
    contents. Blocking."""
    for folder in (f"{VENV}/bin", f"{VENV}/lib/{_PY}/site-packages", f"{VENV}/share/jupyter/kernels/{KERNEL_NAME}"):
        home.makedirs(folder, mode=0o755)
    for rel, (content, mode) in files().items():
        if rel.endswith("kernel.json"):
            content = content.replace(b"{home}", home_path.encode())
        try:
            if home.read_bytes(rel, len(content) + 1) == content and stat.S_IMODE(home.stat(rel).st_mode) == mode:
                continue
        except OSError:
            pass
        home.write_bytes(rel, content, mode=mode)
    base = base_interpreter()
    for name in ("python", "python3", _PY):
        _link(home, base, f"{VENV}/bin/{name}")


def _link(home, target: str, rel: str) -> None:
    try:
        st = home.stat(rel)
    except FileNotFoundError:
        home.symlink(target, rel)
        return
    if stat.S_ISLNK(st.st_mode) and home.readlink(rel) != target:
        home.unlink(rel)
        home.symlink(target, rel)
