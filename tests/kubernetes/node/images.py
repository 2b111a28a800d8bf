"""The real node's container images, built without a registry or a container engine.

One list per image says what it holds (``helm/images/<image>/apt-packages.txt`` and
``requirements.txt``); the Dockerfiles next to them install exactly those lists for real registries,
and this module builds the same lists into OCI images for the CI node, so the two cannot drift. The
image's run settings (``ENV``, ``USER``, ``WORKDIR``, ``ENTRYPOINT``, ``CMD``, ``EXPOSE``) are read
from the Dockerfile too; what its ``FROM`` image would bring is Debian's Python here (``BASES``).

Four layers per image, each cached under ``~/.cache/trainhub/images`` by a hash of its recipe:

1. **base** (shared by every image): ``debootstrap --variant=minbase bookworm`` with Python 3 and
   its venv module, CA certificates, the user ``jovyan`` (uid 1000, gid 100). About 1 min cold.
2. **trainhub's dependencies** (shared by the images that hold trainhub): a virtual environment
   ``/opt/venv`` with trainhub's own dependencies (pyproject.toml's, no extras). About 75 s cold.
   Built in a chroot on an overlay over the base; the overlay's upper folder is the layer.
3. **the image's own** (per image): its Debian packages and its pip requirements with the
   dependencies of the trainhub extras it names, installed into the same ``/opt/venv`` (seconds to a
   few tens of seconds), or its npm packages.
4. **trainhub** (shared by the images that hold trainhub; rebuilt when the tree changed, seconds): the working
   tree's trainhub as a wheel, installed with ``--no-deps`` into ``/opt/venv``: changing trainhub's code never
   rebuilds layers 1 and 2.

``ctr images import`` reads the image as an OCI archive streamed from here (uncompressed layers);
pods run it with ``imagePullPolicy: Never`` or ``IfNotPresent`` under the chart's default names: no
image is ever pulled. Two images of others are built the same way for the CI node only, from lists next to this
module: the JupyterHub chart's proxy (configurable-http-proxy on Node.js, ``proxy-image/``) and the storage
sidecars' rclone (``rclone-image/``). The pause image of pod sandboxes is the upstream ``pause.c`` built by
``controlplane/build.sh``, in a one-layer image.

From a shell: ``python tests/kubernetes/node/images.py build`` builds (or checks) every cached layer
and prints the images' keys.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
IMAGES_DIR = ROOT / "helm" / "images"
CHART_VALUES = ROOT / "helm" / "trainhub" / "values.yaml"
BUILDER_RECIPE = "1"  # bump when how a layer is built changes: every cached layer is rebuilt

SUITE = "bookworm"
MIRROR = os.environ.get("TRAINHUB_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SECURITY_MIRROR = os.environ.get("TRAINHUB_DEBIAN_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
# what the Dockerfiles' FROM images bring and the debootstrap base has to: Python 3.11 with venv, CA certificates
BASE_PACKAGES = ["python3", "python3-venv", "ca-certificates"]
VENV = "/opt/venv"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PAUSE_REF = "trainhub.local/pause:3.4"
RCLONE_REF = "trainhub.local/rclone:1.60"

# The run settings each Dockerfile's FROM image would give it (the CI image has Debian's Python instead).
BASES = {
    "python": {"Env": ["LANG=C.UTF-8"]},
    "quay.io/jupyter/pytorch-notebook": {
        "Env": ["LANG=C.UTF-8", "HOME=/home/jovyan", "NB_USER=jovyan", "NB_UID=1000", "NB_GID=100", "SHELL=/bin/bash"],
        "Entrypoint": ["tini", "-g", "--"], "Cmd": ["jupyterhub-singleuser"], "WorkingDir": "/home/jovyan",
    },
}


class ImageError(RuntimeError):
    """An image could not be built or imported; the message carries the failing command's output."""


@dataclass
class Recipe:
    """What one image holds and how it runs."""

    name: str
    ref: str  # the name it is imported as
    apt: list[str] = field(default_factory=list)
    pip: list[str] = field(default_factory=list)  # requirement lines, trainhub's own left out
    trainhub: str | None = None  # "[kubernetes]", "" (no extra), or None: no trainhub in it
    npm: list[str] = field(default_factory=list)
    npm_bin: dict = field(default_factory=dict)  # /usr/local/bin name -> path inside the npm prefix
    context: list[tuple[str, str]] = field(default_factory=list)  # the Dockerfile's COPY (source, dest)
    config: dict = field(default_factory=dict)  # OCI image config: Env, Entrypoint, Cmd, User, WorkingDir...

    def deps_key(self, lower_key: str) -> str:
        return _hash(["deps", BUILDER_RECIPE, lower_key, self.apt, self.pip, self.trainhub is not None and
                      extra_dependencies(self.trainhub), self.npm, self.npm_bin, self.config.get("User"),
                      self.config.get("WorkingDir")])


# -- the lists ----------------------------------------------------------------------------------------

def read_list(path: Path) -> list[str]:
    """Lines of a list file without comments and blanks."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if line:
            out.append(line)
    return out


_TRAINHUB_LINE = re.compile(r"^trainhub(\[[\w,\s-]*\])?\s*@\s*file:///src/?$")


def split_requirements(lines: list[str]) -> tuple[list[str], str | None]:
    """(third-party requirement lines, trainhub's extras or None) of a requirements list."""
    rest, extras = [], None
    for line in lines:
        m = _TRAINHUB_LINE.match(line)
        if m:
            extras = (m.group(1) or "").replace(" ", "")
        else:
            rest.append(line)
    return rest, extras


def trainhub_dependencies(extras: str = "") -> list[str]:
    """trainhub's dependencies with ``extras`` ("[kubernetes]"), as pyproject.toml lists them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project.get("dependencies") or []) + extra_dependencies(extras)


def extra_dependencies(extras: str) -> list[str]:
    """The dependencies the ``extras`` ("[kubernetes]") add to trainhub's own."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = []
    for extra in filter(None, extras.strip("[]").split(",")):
        deps += project.get("optional-dependencies", {}).get(extra.strip(), [])
    return deps


def dockerfile_settings(path: Path) -> tuple[dict, list[tuple[str, str]]]:
    """(OCI config, COPY sources and destinations) of a Dockerfile: FROM's base settings, then ENV, USER,
    WORKDIR, ENTRYPOINT, CMD, EXPOSE in order."""
    text = re.sub(r"\\\n", " ", path.read_text())
    config: dict = {"Env": []}
    copies = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, arg = line.partition(" ")
        op, arg = op.upper(), arg.strip()
        if op == "FROM":
            image = arg.split()[0].rsplit(":", 1)[0]
            base = BASES.get(image) or BASES.get(image.rsplit("/", 1)[-1]) or {}
            config.update(json.loads(json.dumps(base)))
            config.setdefault("Env", [])
        elif op == "ENV":
            for word in shlex.split(arg):
                k, _, v = word.partition("=")
                config["Env"] = [e for e in config["Env"] if not e.startswith(k + "=")] + [f"{k}={v}"]
        elif op == "USER":
            config["User"] = arg
        elif op == "WORKDIR":
            config["WorkingDir"] = arg
        elif op in ("ENTRYPOINT", "CMD"):
            config[op.capitalize() if op == "CMD" else "Entrypoint"] = json.loads(arg)
        elif op == "EXPOSE":
            config.setdefault("ExposedPorts", {}).update({f"{p}/tcp" if "/" not in p else p: {} for p in arg.split()})
        elif op == "COPY":
            words = [w for w in arg.split() if not w.startswith("--")]
            for src in words[:-1]:
                copies.append((src, words[-1]))
    config["Env"] = [f"PATH={VENV}/bin:{SYSTEM_PATH}"] + [e for e in config["Env"] if not e.startswith("PATH=")]
    return config, copies


def chart_refs() -> dict[str, str]:
    """The image names the chart's default values give the hub, notebook and trainhub images."""
    import yaml

    values = yaml.safe_load(CHART_VALUES.read_text())
    t, hub = values["trainhub"]["image"], values["jupyterhub"]["hub"]["image"]
    nb = values["jupyterhub"]["singleuser"]["image"]
    return {"trainhub": f"{t['repository']}:{t['tag']}", "hub": f"{hub['name']}:{hub['tag']}",
            "notebook": f"{nb['name']}:{nb['tag']}"}


def chart_recipe(name: str) -> Recipe:
    """An image of the chart, from helm/images/<name>/: its lists and its Dockerfile's run settings."""
    folder = IMAGES_DIR / name
    pip, extras = split_requirements(read_list(folder / "requirements.txt"))
    config, copies = dockerfile_settings(folder / "Dockerfile")
    return Recipe(name=name, ref=chart_refs()[name], apt=read_list(folder / "apt-packages.txt"), pip=pip,
                  trainhub=extras, context=copies, config=config)


def proxy_recipe() -> Recipe:
    """The JupyterHub chart's proxy (configurable-http-proxy on Node.js), for the CI node only: its lists are
    in tests/kubernetes/node/proxy-image/ and its name in the node's values file."""
    folder = HERE / "proxy-image"
    return Recipe(
        name="proxy", ref="trainhub.local/configurable-http-proxy:4.6.3", apt=read_list(folder / "apt-packages.txt"),
        npm=read_list(folder / "npm-packages.txt"),
        npm_bin={"configurable-http-proxy": "node_modules/configurable-http-proxy/bin/configurable-http-proxy"},
        config={"Env": [f"PATH={SYSTEM_PATH}", "LANG=C.UTF-8"], "User": "65534:65534", "WorkingDir": "/srv/configurable-http-proxy",
                "Entrypoint": [], "Cmd": ["configurable-http-proxy"], "ExposedPorts": {"8000/tcp": {}, "8001/tcp": {}}},
    )


def rclone_recipe() -> Recipe:
    """The storage sidecars' image (``storage.mount: fuse-sidecar``), for the CI node only: Debian's rclone and FUSE 3
    (tests/kubernetes/node/rclone-image/); the tests name it in their values."""
    return Recipe(name="rclone", ref=RCLONE_REF, apt=read_list(HERE / "rclone-image" / "apt-packages.txt"),
                  config={"Env": [f"PATH={SYSTEM_PATH}", "LANG=C.UTF-8"], "User": "0:0", "Entrypoint": ["rclone"]})


def recipes() -> dict[str, Recipe]:
    return {**{n: chart_recipe(n) for n in ("hub", "notebook", "trainhub")}, "proxy": proxy_recipe(),
            "rclone": rclone_recipe()}


# -- helpers -----------------------------------------------------------------------------------------------

def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:20]


def cache_dir() -> Path:
    return Path(os.environ.get("TRAINHUB_IMAGE_CACHE") or Path.home() / ".cache" / "trainhub" / "images")


def _log(msg: str) -> None:
    print(f"[images {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _run(argv: list[str], **kw) -> str:
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if proc.returncode:
        raise ImageError(f"{' '.join(map(str, argv))[:300]} failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}")
    return proc.stdout


def _chroot(root: Path, script: str, env: dict | None = None) -> str:
    """Run ``script`` with sh in a chroot at ``root`` with a clean environment (nice: builds share 2 cores)."""
    base = {"PATH": SYSTEM_PATH, "HOME": "/root", "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
    return _run(["nice", "-n", "10", "env", "-i", *[f"{k}={v}" for k, v in {**base, **(env or {})}.items()],
                 "chroot", str(root), "/bin/sh", "-ec", script])


@contextlib.contextmanager
def _mounted(root: Path):
    """/proc and /dev of the host inside ``root`` for package scripts; a policy-rc.d that starts no service;
    the host's DNS and CA bundle (pip's HTTPS may go through a proxy whose CA only the host trusts)."""
    mounts = []
    try:
        for src, dst, args in (("proc", root / "proc", ["-t", "proc"]), ("/dev", root / "dev", ["--bind"])):
            dst.mkdir(exist_ok=True)
            _run(["mount", *args, src, str(dst)])
            mounts.append(dst)
        policy = root / "usr/sbin/policy-rc.d"
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf")
        ca = _host_ca()
        if ca:
            shutil.copyfile(ca, root / "tmp/host-ca.crt")
        yield
    finally:
        for m in reversed(mounts):
            if subprocess.run(["umount", str(m)], capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(m)], capture_output=True)
        for leftover in (root / "usr/sbin/policy-rc.d", root / "tmp/host-ca.crt"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        with contextlib.suppress(OSError):
            (root / "etc/resolv.conf").write_text("")  # the runtime mounts its own


def _host_ca() -> str | None:
    for path in (os.environ.get("PIP_CERT"), "/etc/ssl/certs/ca-certificates.crt"):
        if path and Path(path).is_file():
            return path
    return None


def _pip_env() -> dict:
    env = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_DEFAULT_TIMEOUT": "180", "PIP_NO_CACHE_DIR": "1"}
    if _host_ca():
        env["PIP_CERT"] = "/tmp/host-ca.crt"
    return env


@contextlib.contextmanager
def _overlay(lowers: list[Path], upper: Path):
    """An overlay with ``lowers`` (top first) under ``upper``; yields the merged folder."""
    upper.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ovl-work-", dir=upper.parent))
    merged = Path(tempfile.mkdtemp(prefix="ovl-merged-", dir=upper.parent))
    upper.mkdir(parents=True, exist_ok=True)
    _run(["mount", "-t", "overlay", "overlay", "-o",
          f"lowerdir={':'.join(map(str, lowers))},upperdir={upper},workdir={work}", str(merged)])
    try:
        yield merged
    finally:
        if subprocess.run(["umount", str(merged)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(merged)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(OSError):
            merged.rmdir()


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _clean(root: Path) -> None:
    """What a layer must not carry: apt's lists and caches, logs, temporary files, pip caches."""
    for pattern in ("var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb", "tmp/*",
                    "root/.cache", "var/log/apt/*", "var/log/dpkg.log", "var/cache/debconf/*-old"):
        for p in root.glob(pattern):
            if p.name in ("lock", "partial") and p.parent.name in ("lists", "archives"):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()


def write_layer(folder: Path, out: Path) -> str:
    """Pack ``folder`` (an overlay upper folder or a whole root) as an uncompressed OCI layer tar at ``out``;
    overlay whiteouts (0/0 character devices, opaque folders) become ``.wh.`` entries. Its sha256."""
    tmp = out.with_suffix(".tmp")
    digest = hashlib.sha256()

    class Hashing(io.RawIOBase):
        def __init__(self, f):
            self.f = f

        def writable(self):
            return True

        def write(self, b):
            digest.update(b)
            return self.f.write(b)

    with open(tmp, "wb") as raw, tarfile.open(fileobj=Hashing(raw), mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, folder)
            entries = [] if rel_dir == "." else [rel_dir]
            if rel_dir != "." and _opaque(dirpath):
                entries.append(("opaque", rel_dir))
            for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                entries.append(name if rel_dir == "." else os.path.join(rel_dir, name))
            for entry in entries:
                if isinstance(entry, tuple):
                    info = tarfile.TarInfo(os.path.join(entry[1], ".wh..wh..opq"))
                    tar.addfile(info)
                    continue
                path = os.path.join(folder, entry)
                st = os.lstat(path)
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    info = tarfile.TarInfo(os.path.join(os.path.dirname(entry), ".wh." + os.path.basename(entry)))
                    tar.addfile(info)
                    continue
                info = tar.gettarinfo(path, arcname=entry)
                info.uname = info.gname = ""
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    tmp.rename(out)
    return "sha256:" + digest.hexdigest()


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, "trusted.overlay.opaque") == b"y"
    except OSError:
        return False


# -- the layers ----------------------------------------------------------------------------------------------

@dataclass
class Layer:
    tar: Path
    digest: str
    folder: Path  # unpacked (a root or an overlay upper), a lower folder of the layers above


def _cached_layer(d: Path) -> Layer | None:
    info = d / "layer.json"
    if not info.exists():
        return None
    meta = json.loads(info.read_text())
    tar = d / "layer.tar"
    if not tar.exists() or tar.stat().st_size != meta["size"]:
        return None
    return Layer(tar, meta["digest"], d / "tree")


def _store_layer(d: Path, tree: Path, started: float) -> Layer:
    digest = write_layer(tree, d / "layer.tar")
    (d / "layer.json").write_text(json.dumps({"digest": digest, "size": (d / "layer.tar").stat().st_size,
                                              "seconds": round(time.time() - started, 1)}))
    # the same layer of an older recipe is not needed again (a recipe that comes back is rebuilt)
    prefix = d.name.rsplit("-", 1)[0]
    for old in cache_dir().glob(f"{prefix}-*"):
        if old != d and old.is_dir() and old.name.rsplit("-", 1)[0] == prefix:
            shutil.rmtree(old, ignore_errors=True)
    return Layer(d / "layer.tar", digest, tree)


def base_key() -> str:
    return _hash(["base", BUILDER_RECIPE, SUITE, MIRROR, SECURITY_MIRROR, BASE_PACKAGES])


def ensure_base() -> tuple[str, Layer]:
    """Layer 1, shared by every image: a minbase Debian with Python, venv, CA certificates and jovyan."""
    key = base_key()
    d = cache_dir() / f"base-{key}"
    with _locked(cache_dir() / f".base-{key}.lock"):
        layer = _cached_layer(d)
        if layer:
            return key, layer
        _log(f"base {key}: debootstrap {SUITE} (minbase, {', '.join(BASE_PACKAGES)})")
        started = time.time()
        shutil.rmtree(d, ignore_errors=True)
        tree = d / "tree"
        d.mkdir(parents=True)
        _run(["nice", "-n", "10", "debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE,
              str(tree), MIRROR])
        (tree / "etc/apt/sources.list").write_text(
            f"deb {MIRROR} {SUITE} main\ndeb {MIRROR} {SUITE}-updates main\ndeb {SECURITY_MIRROR} {SUITE}-security main\n")
        with _mounted(tree):
            _chroot(tree, "useradd --uid 1000 --gid 100 --create-home --home-dir /home/jovyan --shell /bin/bash jovyan")
        _clean(tree)
        layer = _store_layer(d, tree, started)
        _log(f"base {key}: {layer.tar.stat().st_size >> 20} MiB in {time.time() - started:.0f}s")
        return key, layer


def ensure_trainhub_deps(base: tuple[str, Layer]) -> tuple[str, Layer]:
    """Layer 2, shared by the images that hold trainhub: /opt/venv with trainhub's own dependencies (no extras)."""
    deps = trainhub_dependencies()
    key = _hash(["trainhub-deps", BUILDER_RECIPE, base[0], deps])
    d = cache_dir() / f"shared-deps-{key}"
    with _locked(cache_dir() / f".shared-deps-{key}.lock"):
        layer = _cached_layer(d)
        if layer:
            return key, layer
        _log(f"shared deps {key}: trainhub's {len(deps)} requirements from pyproject.toml")
        started = time.time()
        shutil.rmtree(d, ignore_errors=True)
        tree = d / "tree"
        with _overlay([base[1].folder], tree) as root, _mounted(root):
            (root / "tmp/requirements.txt").write_text("\n".join(deps) + "\n")
            _chroot(root, f"python3 -m venv {VENV} && {VENV}/bin/pip install -q -r /tmp/requirements.txt", env=_pip_env())
            _clean(root)
        layer = _store_layer(d, tree, started)
        _log(f"shared deps {key}: {layer.tar.stat().st_size >> 20} MiB in {time.time() - started:.0f}s")
        return key, layer


def ensure_deps(recipe: Recipe, base: tuple[str, Layer], shared: tuple[str, Layer] | None = None) -> tuple[str, Layer]:
    """Layer 3 of one image: its Debian packages and, in /opt/venv over ``shared`` (trainhub's dependencies), its
    requirements with the dependencies of the trainhub extras it names; or its npm packages."""
    key = recipe.deps_key(shared[0] if shared else base[0])
    d = cache_dir() / f"{recipe.name}-deps-{key}"
    with _locked(cache_dir() / f".{recipe.name}-deps-{key}.lock"):
        layer = _cached_layer(d)
        if layer:
            return key, layer
        extras = f" + trainhub{recipe.trainhub}'s extra dependencies" if recipe.trainhub else ""
        _log(f"{recipe.name} deps {key}: apt {recipe.apt}, pip {len(recipe.pip)}{extras}, npm {recipe.npm}")
        started = time.time()
        shutil.rmtree(d, ignore_errors=True)
        tree = d / "tree"
        lowers = [shared[1].folder, base[1].folder] if shared else [base[1].folder]
        with _overlay(lowers, tree) as root, _mounted(root):
            if recipe.apt:
                _chroot(root, "apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get install -y -qq "
                              "--no-install-recommends " + " ".join(map(shlex.quote, recipe.apt)))
            reqs = list(recipe.pip) + (extra_dependencies(recipe.trainhub) if recipe.trainhub else [])
            if reqs:
                (root / "tmp/requirements.txt").write_text("\n".join(reqs) + "\n")
                venv = "" if shared else f"python3 -m venv {VENV} && "
                _chroot(root, f"{venv}{VENV}/bin/pip install -q -r /tmp/requirements.txt", env=_pip_env())
            if recipe.npm:
                prefix = root / "opt/npm"
                _run(["npm", "install", "--no-audit", "--no-fund", "--omit=dev", "--prefix", str(prefix), *recipe.npm])
                links = " && ".join(f"ln -sf /opt/npm/{target} /usr/local/bin/{name}"
                                    for name, target in recipe.npm_bin.items())
                _chroot(root, f"chown -R root:root /opt/npm && {links}")
            user, workdir = recipe.config.get("User"), recipe.config.get("WorkingDir")
            if workdir:
                _chroot(root, f"mkdir -p {shlex.quote(workdir)}" + (f" && chown {user} {shlex.quote(workdir)}" if user else ""))
            _clean(root)
        layer = _store_layer(d, tree, started)
        _log(f"{recipe.name} deps {key}: {layer.tar.stat().st_size >> 20} MiB in {time.time() - started:.0f}s")
        return key, layer


def context_files(recipe: Recipe) -> list[tuple[Path, str]]:
    """The working tree's files the Dockerfile copies to /src (trainhub's source), as (path, name in /src)."""
    out = []
    for src, dest in recipe.context:
        if not dest.startswith("/src"):
            continue
        path = ROOT / src
        base = dest[len("/src"):].strip("/")
        if path.is_dir():
            for p in sorted(path.rglob("*")):
                if p.is_file() and "__pycache__" not in p.parts and "node_modules" not in p.parts and p.suffix != ".pyc":
                    out.append((p, os.path.join(base, p.relative_to(path).as_posix()) if base else p.relative_to(ROOT).as_posix()))
        elif path.is_file():
            name = os.path.join(base, path.name) if dest.endswith("/") else (base or path.name)
            out.append((path, name))
    return out


def ensure_code(recipe: Recipe, lowers: list[Layer], base: tuple[str, Layer]) -> Layer | None:
    """Layer 3: the working tree's trainhub, built as a wheel here and installed --no-deps into /opt/venv.

    Keyed by the files the Dockerfile copies for the wheel (not by the image: ``--no-deps`` writes the same files
    into any image's /opt/venv), so the images share one layer and an unchanged tree reuses it."""
    if recipe.trainhub is None:
        return None
    files = [(path, name) for path, name in context_files(recipe) if name != "requirements.txt"]
    h = hashlib.sha256(("code" + BUILDER_RECIPE + base[0]).encode())
    for path, name in files:
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    key = h.hexdigest()[:20]
    d = cache_dir() / f"code-{key}"
    with _locked(cache_dir() / ".code.lock"):
        layer = _cached_layer(d)
        if layer:
            return layer
        started = time.time()
        with tempfile.TemporaryDirectory(prefix="trainhub-src-") as tmp:
            src, wheels = Path(tmp) / "src", Path(tmp) / "wheels"
            for path, name in files:
                (src / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, src / name)
            _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                  str(src)], cwd=tmp)
            wheel = next(wheels.glob("trainhub-*.whl"))
            tree = d / "tree"
            with _overlay([layer.folder for layer in lowers], tree) as root, _mounted(root):
                shutil.copy(wheel, root / "tmp" / wheel.name)
                _chroot(root, f"{VENV}/bin/pip install -q --no-deps --no-index /tmp/{wheel.name}", env=_pip_env())
                _clean(root)
        layer = _store_layer(d, tree, started)
        _log(f"trainhub layer {key}: {layer.tar.stat().st_size >> 10} KiB in {time.time() - started:.1f}s")
        return layer


@dataclass
class Image:
    ref: str
    layers: list[Layer]
    config: dict

    def oci_config(self) -> bytes:
        cfg = {k: v for k, v in self.config.items() if v not in (None, [], {}) or k in ("Entrypoint",)}
        return json.dumps({
            "architecture": "amd64", "os": "linux", "config": cfg,
            "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in self.layers]},
        }, sort_keys=True).encode()


def build(names=None) -> dict[str, Image]:
    """Every image named (default: all), cached layers reused; {name: Image}."""
    all_recipes = recipes()
    base = ensure_base()
    out = {}
    shared = None
    for name in names or all_recipes:
        recipe = all_recipes[name]
        if recipe.trainhub is not None and shared is None:
            shared = ensure_trainhub_deps(base)
        lower = shared if recipe.trainhub is not None else None
        deps = ensure_deps(recipe, base, lower)
        layers = [base[1]] + ([lower[1]] if lower else []) + [deps[1]]
        code = ensure_code(recipe, layers[::-1], base)
        out[name] = Image(recipe.ref, layers + ([code] if code else []), recipe.config)
    return out


def pause_image(pause_binary: Path) -> Image:
    """The pod sandbox image: the static pause binary alone."""
    d = cache_dir() / ("pause-" + hashlib.sha256(pause_binary.read_bytes()).hexdigest()[:20])
    with _locked(cache_dir() / ".pause.lock"):
        layer = _cached_layer(d)
        if not layer:
            tree = d / "tree"
            tree.mkdir(parents=True, exist_ok=True)
            shutil.copy2(pause_binary, tree / "pause")
            layer = _store_layer(d, tree, time.time())
    return Image(PAUSE_REF, [layer], {"Entrypoint": ["/pause"], "User": "65535:65535"})


# -- into containerd ---------------------------------------------------------------------------------------------

def _blob(tar: tarfile.TarFile, data: bytes | None = None, path: Path | None = None, digest: str | None = None) -> dict:
    if data is not None:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        size = len(data)
    else:
        size = path.stat().st_size
    info = tarfile.TarInfo("blobs/sha256/" + digest.split(":", 1)[1])
    info.size = size
    info.mode = 0o644
    if data is not None:
        tar.addfile(info, io.BytesIO(data))
    else:
        with open(path, "rb") as f:
            tar.addfile(info, f)
    return {"digest": digest, "size": size}


def write_oci_archive(images: list[Image], out, have: set[str] = frozenset()) -> None:
    """An OCI image layout holding ``images`` as a tar stream on the file object ``out``; layer blobs whose digest is in
    ``have`` (already in the importing content store) are named in the manifests but not streamed again."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        seen: dict[str, dict] = {}
        manifests = []
        for image in images:
            layers = []
            for layer in image.layers:
                if layer.digest not in seen:
                    if layer.digest in have:
                        seen[layer.digest] = {"digest": layer.digest, "size": layer.tar.stat().st_size}
                    else:
                        seen[layer.digest] = _blob(tar, path=layer.tar, digest=layer.digest)
                layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", **seen[layer.digest]})
            config = _blob(tar, data=image.oci_config())
            manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                   "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
                                   "layers": layers}).encode()
            desc = _blob(tar, data=manifest)
            manifests.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", **desc,
                              "platform": {"architecture": "amd64", "os": "linux"},
                              "annotations": {"io.containerd.image.name": image.ref,
                                              "org.opencontainers.image.ref.name": image.ref.rsplit(":", 1)[1]}})
        for name, data in (("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
                           ("index.json", json.dumps({"schemaVersion": 2, "manifests": manifests}).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def import_images(images: list[Image], address: str, namespace: str = "k8s.io") -> None:
    """``ctr images import`` of ``images`` into the containerd at ``address`` (streamed, nothing on disk). Layers the
    content store holds already (a kept containerd root) are not streamed again: only new layers cost time."""
    listed = subprocess.run(["ctr", "--address", address, "-n", namespace, "content", "ls", "-q"],
                            capture_output=True, text=True)
    have = set(listed.stdout.split()) if listed.returncode == 0 else set()
    proc = subprocess.Popen(["ctr", "--address", address, "-n", namespace, "images", "import", "-"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        write_oci_archive(images, proc.stdin, have)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    output = proc.stdout.read().decode(errors="replace")
    if proc.wait():
        raise ImageError(f"ctr images import failed (exit {proc.returncode}):\n{output[-4000:]}")


def main(argv: list[str]) -> int:
    if argv[:1] != ["build"]:
        print(__doc__)
        return 2
    started = time.time()
    for name, image in build(argv[1:] or None).items():
        print(f"{name}: {image.ref} " + " ".join(f"{layer.digest[7:19]}({layer.tar.stat().st_size >> 20}M)"
                                                  for layer in image.layers))
    print(f"built in {time.time() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
