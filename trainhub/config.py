"""One traitlets configuration shared by the hub and every platform service.

It layers, lowest first: what `trainhub up` recorded (device list, storage URL, database),
then the admin's own file (``<data-dir>/trainhub_config.py``, or the path in
``$TRAINHUB_CONFIG``). The hub config and each service load the same layers, so a
profile or quota means the same thing everywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from traitlets.config import Config, PyFileConfigLoader

from trainhub.settings import DataDir, Runtime

ENV_CONFIG = "TRAINHUB_CONFIG"


def admin_config_path(data_dir: DataDir) -> Path | None:
    explicit = os.environ.get(ENV_CONFIG)
    if explicit:
        path = Path(explicit).expanduser().resolve()
        if not path.exists():
            raise FileNotFoundError(f"{ENV_CONFIG}={explicit} does not exist")
        return path
    path = data_dir.root / "trainhub_config.py"
    return path if path.exists() else None


def runtime_config(runtime: Runtime, data_dir: DataDir) -> Config:
    c = Config()
    c.LocalGPUAllocator.db_url = data_dir.platform_db_url
    c.LocalGPUAllocator.device_list = list(runtime.devices)
    c.StorageConfig.url = runtime.storage or str(data_dir.default_storage)
    c.Isolation.code_paths = list(runtime.code_paths)
    c.Isolation.single_user = runtime.admin_user
    c.Isolation.device_minors = {d["index"]: d["minor"] for d in runtime.devices if d.get("minor") is not None}
    return c


def load_platform_config(data_dir: Path | str) -> Config:
    dd = DataDir(Path(data_dir))
    runtime = Runtime.load(dd.root)
    c = runtime_config(runtime, dd)
    path = admin_config_path(dd)
    if path is not None:
        loader = PyFileConfigLoader(path.name, str(path.parent))
        c.merge(loader.load_config())
    return c
