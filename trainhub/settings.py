"""Where a running platform keeps its files, and the runtime facts `trainhub up` records.

`trainhub up` writes ``<data-dir>/trainhub.json`` (URLs, ports, GPU and storage choice)
so that other commands (`trainhub token`, `trainhub status`) and the hub config read
the same facts instead of re-deriving them.
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

    def ensure(self) -> None:
        for p in (self.root, self.root / "secrets", self.homes, self.logs):
            p.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "secrets", 0o700)


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

    @property
    def public_url(self) -> str:
        host = "127.0.0.1" if self.ip in ("", "0.0.0.0", "::") else self.ip
        return f"http://{host}:{self.port}{self.base_url}"

    @property
    def hub_api_url(self) -> str:
        return f"http://127.0.0.1:{self.hub_port}{self.base_url}hub/api"

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
        return cls(**json.loads(path.read_text()))
