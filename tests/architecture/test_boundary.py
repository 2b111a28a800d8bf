"""One place for the boundary (issue 32, part 7): nothing outside ``trainhub.boundary`` acts as a user by itself.

A root-run copy that forgot the user's identity is how a model registration once copied the platform's
secrets. So, read from the source (every module, every function, as grimp reads imports):

- identity and namespace primitives (``setfsuid``, ``setresuid``, ``setgroups``, ``setns``, ``unshare``...)
  and the commands that switch to a user (``setpriv``, ``bwrap``, ``nsenter``) appear only in
  ``trainhub/boundary/``;
- the parts that run as root (the services, the spawner, the hub's configuration, ``trainhub up``) never walk,
  copy or remove a folder by path themselves (``os.walk``, ``shutil.copytree``/``rmtree``/``copy*``,
  ``os.scandir``, ``Path.rglob``/``glob``/``iterdir``...): they use ``trainhub.boundary.files.UserTree``
  (through ``AsUser``) or, for S3, a listing by key. The few exceptions below are the platform's own folders,
  each with its reason; a new one must be added here, which a review sees.

The test plants a violation in a copy of a module to prove it is not blind.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BOUNDARY = REPO / "trainhub" / "boundary"
ROOT_SIDE = [REPO / "services", REPO / "spawner", REPO / "hub_config", REPO / "trainhub" / "app",
             REPO / "trainhub" / "settings.py", REPO / "trainhub" / "ledger.py", REPO / "trainhub" / "storage.py"]
EVERYWHERE = [REPO / "services", REPO / "spawner", REPO / "hub_config", REPO / "trainhub", REPO / "extensions",
              REPO / "kernels"]

IDENTITY_CALLS = {"setfsuid", "setfsgid", "setresuid", "setresgid", "setreuid", "setregid", "setuid", "setgid",
                  "seteuid", "setegid", "setgroups", "setns", "unshare", "initgroups"}
SWITCH_COMMANDS = {"setpriv", "bwrap", "nsenter", "unshare", "runuser", "su", "sudo", "chroot"}
WALKS = {("os", "walk"), ("os", "scandir"), ("os", "listdir"), ("shutil", "copytree"), ("shutil", "rmtree"),
         ("shutil", "copy"), ("shutil", "copy2"), ("shutil", "copyfile"), ("shutil", "move")}
PATH_WALKS = {"rglob", "glob", "iterdir"}
FS_WALKS = {"walk", "find", "rm", "copy", "get", "put"}  # an fsspec filesystem's (``fs.walk(path)``)

#: (file relative to the repo, the call) -> why it is not a user's tree
ALLOWED = {
    ("services/jobs/worker.py", "os.listdir"): "/proc/self/fd: the wrapper's own descriptors",
    ("services/usage/procsample.py", "os.listdir"): "/proc: the kernel's process table",
    ("services/jobs/handlers.py", "glob"): "a job's attempt-N/worker-R.log files: the platform's folder (0700), "
                                           "which the job cannot write",
    ("services/jobs/kubernetes.py", "glob"): "the Kubernetes launcher's own log folders (the platform's)",
    ("services/jobs/forkserver.py", "os.listdir"): "/proc/self/fd of a forked worker before it execs",
    ("services/jobs/warmpool.py", "os.listdir"): "/proc/self/fd of a pool entry",
    ("trainhub/settings.py", "os.scandir"): "secure_tree: the data dir, through descriptors, never entering a folder "
                                            "the platform does not own",
    ("services/jobs/logwatch.py", "iterdir"): "a job's attempt folders: the platform's (the job cannot write there)",
    ("services/registry/files.py", "fs.copy"): "FsSource: S3 keys copied server-side (no links in object storage)",
    ("services/registry/registry.py", "fs.rm"): "retention on S3: a key prefix (local storage goes through UserTree)",
    ("services/jobs/workdirs.py", "os.scandir"): "the store of working directories sent with jobs: the platform's "
                                                 "folder (0700; uploads arrive over HTTP, no user writes there)",
}


def _py_files(roots):
    for root in roots:
        if root.is_file():
            yield root
        else:
            yield from (p for p in root.rglob("*.py") if "node_modules" not in p.parts)


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def identity_violations(path: Path, source: str | None = None) -> list[str]:
    tree = ast.parse(source if source is not None else path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Name):
            name = node.id
        if name in IDENTITY_CALLS:
            out.append(f"{_rel(path)}:{node.lineno}: {name}")
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            first = node.elts[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value in SWITCH_COMMANDS:
                out.append(f"{_rel(path)}:{node.lineno}: a {first.value!r} command line")
    return out


def walk_violations(path: Path, source: str | None = None) -> list[str]:
    tree = ast.parse(source if source is not None else path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        func = node.func
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        if (owner, func.attr) in WALKS:
            key = f"{owner}.{func.attr}"
        elif func.attr in PATH_WALKS and owner not in {"os", "shutil", "ast"}:
            key = func.attr
        elif func.attr in FS_WALKS and (owner == "fs" or (isinstance(func.value, ast.Attribute) and func.value.attr == "fs")):
            key = f"fs.{func.attr}"
        else:
            continue
        if (_rel(path), key) in ALLOWED:
            continue
        out.append(f"{_rel(path)}:{node.lineno}: {key}(...)")
    return out


def test_only_the_boundary_switches_identity_or_namespace():
    found = [v for p in _py_files(EVERYWHERE) if BOUNDARY not in p.parents for v in identity_violations(p)]
    assert not found, "act as a user through trainhub.boundary (AsUser, Isolation.command), not directly:\n" + "\n".join(found)


def test_root_side_parts_never_walk_a_folder_by_path():
    found = [v for p in _py_files(ROOT_SIDE) for v in walk_violations(p)]
    assert not found, ("a root-run part walks, copies or removes a folder by path: use trainhub.boundary.files.UserTree "
                       "(AsUser.tree / storage_tree), or add the platform's own folder to ALLOWED with its reason:\n"
                       + "\n".join(found))


@pytest.mark.parametrize("planted,check", [
    ("import ctypes\nctypes.CDLL(None).setfsuid(1000)\n", identity_violations),
    ("import subprocess\nsubprocess.run(['setpriv', '--reuid=1', 'id'])\n", identity_violations),
    ("import os\ndef f(p):\n    for d, _, n in os.walk(p):\n        pass\n", walk_violations),
    ("import shutil\ndef f(a, b):\n    shutil.copytree(a, b)\n", walk_violations),
    ("def f(p):\n    return list(p.rglob('*'))\n", walk_violations),
])
def test_the_checks_see_a_planted_violation(planted, check):
    module = REPO / "services" / "registry" / "registry.py"
    assert check(module, module.read_text() + "\n" + planted), planted
