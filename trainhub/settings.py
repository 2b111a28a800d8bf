"""Where a running platform keeps its files, and the runtime facts `trainhub up` records.

`trainhub up` writes ``<data-dir>/trainhub.json`` (URLs, ports, GPU and storage choice)
so that other commands (`trainhub token`, `trainhub status`) and the hub config read
the same facts instead of re-deriving them.

The data dir is the platform's alone: `trainhub up` runs with umask 077, so every file it and
its services create (databases, logs, job folders) is 0600 and every folder 0700;
:meth:`DataDir.ensure` also closes what an older version left open (``secure_tree``). Users'
processes reach their own home through their sandbox; without one (per-user accounts, no
bubblewrap) the data dir and ``homes/`` are 0711: traversable to reach one's own home, not listable.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_DATA_DIR = "./.trainhub"
ENV_DATA_DIR = "TRAINHUB_DATA_DIR"


def default_data_dir() -> Path:
    return Path(os.environ.get(ENV_DATA_DIR, DEFAULT_DATA_DIR)).expanduser().resolve()


def write_secret(path: Path, value: str) -> None:
    """Write a secret readable by the owner only (0600), created that way from the start."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)


def read_or_create_secret(path: Path, nbytes: int = 32) -> tuple[str, bool]:
    """Return (secret, created)."""
    if path.exists():
        return path.read_text().strip(), False
    value = secrets.token_hex(nbytes)
    write_secret(path, value)
    return value, True


@dataclass
class DataDir:
    """Layout of the data directory; one place names every file in it."""

    root: Path

    def __post_init__(self):
        self.root = Path(self.root).expanduser().resolve()

    @property
    def runtime_file(self) -> Path:
        return self.root / "trainhub.json"

    @property
    def platform_db(self) -> Path:
        return self.root / "trainhub.sqlite"

    @property
    def platform_db_url(self) -> str:
        return f"sqlite:///{self.platform_db}"

    @property
    def hub_db_url(self) -> str:
        return f"sqlite:///{self.root / 'jupyterhub.sqlite'}"

    @property
    def cookie_secret(self) -> Path:
        return self.root / "secrets" / "jupyterhub_cookie_secret"

    @property
    def admin_password_file(self) -> Path:
        return self.root / "secrets" / "admin-password"

    @property
    def cli_token_file(self) -> Path:
        return self.root / "secrets" / "cli-service-token"

    def service_token_file(self, name: str) -> Path:
        return self.root / "secrets" / f"{name}-service-token"

    @property
    def proxy_token_file(self) -> Path:
        return self.root / "secrets" / "proxy-auth-token"

    @property
    def homes(self) -> Path:
        return self.root / "homes"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def default_storage(self) -> Path:
        return self.root / "storage"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @property
    def stop_record(self) -> Path:
        """Written by `trainhub up` when it stops the platform (see :class:`StopRecord`)."""
        return self.root / "platform-stop.json"

    def ensure(self, traversable: bool = False) -> None:
        """Create the layout, closed to everyone but the platform; ``traversable``: the root and ``homes/``
        0711 so that per-user accounts without a sandbox reach their own home (nothing is listable)."""
        for p in (self.root, self.root / "secrets", self.homes, self.logs):
            p.mkdir(parents=True, exist_ok=True)
        walk = 0o711 if traversable else 0o700
        os.chmod(self.root, walk)
        os.chmod(self.homes, walk)
        os.chmod(self.root / "secrets", 0o700)
        os.chmod(self.logs, 0o700)
        secure_tree(self.root, skip=(self.homes, self.default_storage, self.root / "node"))


def secure_file(path: Path) -> None:
    """0600 for a file holding secrets (databases with their -wal/-shm files, logs)."""
    try:
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    except FileNotFoundError:
        pass


def secure_tree(root: Path, skip=()) -> None:
    """Close the platform's files under ``root`` to group and others: databases (and their -wal/-shm),
    logs, the runtime file, secrets (folders in ``skip`` are left alone).

    Walked through descriptors, never following a link, and only through folders the platform owns: a
    user's folder (homes, storage areas, a job's ``outputs/`` and ``work/``) is never entered, whatever its
    name or place, and each file is changed through the descriptor it was checked with."""
    skip = {os.path.realpath(p) for p in skip}
    me = os.geteuid()
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    stack = [(top, os.path.realpath(root), False)]
    while stack:
        dfd, path, secret = stack.pop()
        try:
            with os.scandir(dfd) as it:
                entries = list(it)
            for e in entries:
                full = os.path.join(path, e.name)
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_uid != me:
                    continue  # a user's: never entered, never changed
                if stat.S_ISDIR(st.st_mode):
                    if full in skip or e.name in ("outputs", "work"):  # jobs' outputs are users' files
                        continue
                    try:
                        sub = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                    except OSError:
                        continue
                    stack.append((sub, full, secret or "secret" in e.name))
                elif stat.S_ISREG(st.st_mode) and (secret or e.name.endswith(
                        (".sqlite", ".sqlite-wal", ".sqlite-shm", ".db", ".log", ".json", ".pid"))):
                    try:
                        fd = os.open(e.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
                    except OSError:
                        continue
                    try:
                        os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
                    finally:
                        os.close(fd)
        finally:
            os.close(dfd)


@dataclass
class StopRecord:
    """What `trainhub up` writes when it stops the platform (or finds that the last run never stopped):
    which run it was and when its stop began. The jobs service reads it on its next start to tell jobs
    the platform stopped (requeued or failed, ``JobEngine.on_platform_stop``) from jobs that failed."""

    instance: str
    began: float  # time.time() when the stop began
    reason: str = "stopped"  # "stopped" (SIGINT/SIGTERM) or "did not stop cleanly" (found at the next start)

    def save(self, dd: "DataDir") -> None:
        tmp = dd.stop_record.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(dd.stop_record)

    @classmethod
    def load(cls, dd: "DataDir") -> "StopRecord | None":
        try:
            return cls(**json.loads(dd.stop_record.read_text()))
        except (OSError, ValueError, TypeError):
            return None


class StopRecordFile:
    """The stop record of one data dir for a reader that asks often (the jobs engine, on every pass): the file is
    read again only when it changed (:meth:`StopRecord.save` writes it whole and renames it into place, so a new
    record is a new inode)."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self._dd = DataDir(data_dir)
        self._seen: tuple | None = None
        self._record: StopRecord | None = None

    def read(self) -> StopRecord | None:
        try:
            st = os.stat(self._dd.stop_record)
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            seen = None
        if seen != self._seen:
            self._seen, self._record = seen, StopRecord.load(self._dd) if seen else None
        return self._record


@dataclass
class Runtime:
    """Facts about the running platform, written by `trainhub up`."""

    data_dir: str
    ip: str = "127.0.0.1"
    port: int = 8000
    hub_port: int = 8081
    proxy_api_port: int = 8001
    service_ports: dict = field(default_factory=dict)
    gpus: str = "auto"
    storage: str = ""
    admin_user: str = "admin"
    pid: int | None = None
    base_url: str = "/"
    devices: list = field(default_factory=list)
    simulated: bool = False
    started_at: str = ""
    instance: str = ""  # the TRAINHUB_INSTANCE marker of this run
    code_paths: list = field(default_factory=list)  # folders of trainhub's code (read-only in sandboxes)

    @property
    def public_url(self) -> str:
        host = "127.0.0.1" if self.ip in ("", "0.0.0.0", "::") else self.ip
        return f"http://{host}:{self.port}{self.base_url}"

    @property
    def hub_api_url(self) -> str:
        return f"http://127.0.0.1:{self.hub_port}{self.base_url}hub/api"

    def service_url(self, name: str) -> str:
        """Hub service ``name`` at its own loopback port, under the prefix the hub gives it: how processes on this
        machine reach it without the proxy's hop (its own token check is the same either way)."""
        return f"http://127.0.0.1:{self.service_ports[name]}{self.base_url}services/{name}/"

    def save(self) -> None:
        path = DataDir(Path(self.data_dir)).runtime_file
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, data_dir: Path | str) -> "Runtime":
        path = DataDir(Path(data_dir)).runtime_file
        if not path.exists():
            raise FileNotFoundError(
                f"{path} does not exist: start the platform first with `trainhub up --data-dir {data_dir}`"
            )
        data = json.loads(path.read_text())
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})
