"""The dataset and model registries (docs/storage.md)."""

from __future__ import annotations

import json
import os
from typing import Callable

from trainhub.backoff import WaitTimeout, poll as poll_until
from trainhub.states import PENDING

from .base import ClientBase, check_ref


class DatasetVersion(dict):
    """A dataset version as the API returns it, plus :meth:`filesystem` to read its files."""

    def filesystem(self):
        """``(fsspec filesystem, path)`` of the version's prefix, with this server's storage options."""
        import fsspec

        opts = json.loads(os.environ.get("TRAINHUB_STORAGE_OPTIONS") or "{}")
        return fsspec.core.url_to_fs(self["url"], **opts)


def _name(name) -> str:
    return check_ref(name, "registry name")


def _version(version) -> str:
    return "latest" if version in (None, "") else str(version)


class RegistryAPI(ClientBase):
    # -- datasets -----------------------------------------------------------------------------
    def list_datasets(self, q: str = "", *, owner: str | None = None, limit: int = 100, offset: int = 0) -> dict:
        """GET /datasets: ``{"items", "total"}``; ``q`` searches names and descriptions."""
        params = {k: v for k, v in (("q", q), ("owner", owner), ("limit", limit), ("offset", offset)) if v not in (None, "")}
        return self._json("GET", "/datasets", params=params)

    def get_dataset(self, name: str) -> dict:
        """GET /datasets/{name}: the dataset with every version under ``items``."""
        return self._json("GET", f"/datasets/{_name(name)}")

    def dataset(self, name: str, version="latest") -> DatasetVersion:
        """GET /datasets/{name}/versions/{version}: one version (``url``, ``size``, ``file_count``...)."""
        return DatasetVersion(self._json("GET", f"/datasets/{_name(name)}/versions/{_version(version)}"))

    def register_dataset(self, name: str, path: str, *, format: str = "", description: str = "",
                         metadata: dict | None = None, wait: bool | float = True, poll: float = 1.0,
                         callback: Callable[[dict], None] | None = None) -> DatasetVersion:
        """POST /datasets: register a new version of ``name`` pointing at storage ``path``
        (``datasets/...`` or ``users/<you>/...``). With ``wait`` (True or seconds) poll until
        the size/count scan ends, calling ``callback(version)`` with its progress; a scan still
        running when ``wait`` seconds have passed comes back ``pending``."""
        body = {"name": _name(name), "path": path, "format": format, "description": description,
                "metadata": metadata or {}, "wait": 5}
        v = self._json("POST", "/datasets", json=body)
        if v.get("status") != PENDING or wait is False or (wait is not True and float(wait) <= 0):
            return DatasetVersion(v)
        answers = iter([v])

        def fetch():  # the POST's answer first, then the version as the scan goes on
            latest = next(answers, None) or self._json("GET", f"/datasets/{_name(name)}/versions/{v['version']}")
            if callback and latest.get("status") == PENDING:
                callback(latest)
            return latest

        try:
            v = poll_until(fetch, lambda ver: ver.get("status") != PENDING, what=f"the scan of {name} v{v['version']}",
                           start=poll, factor=1.0, cap=None, timeout=None if wait is True else float(wait))
        except WaitTimeout as e:
            v = e.last
        return DatasetVersion(v)

    def deprecate_dataset(self, name: str, version, message: str = "", deprecated: bool = True) -> dict:
        """PATCH /datasets/{name}/versions/{v}: mark a version deprecated (owner or admin)."""
        return self._json("PATCH", f"/datasets/{_name(name)}/versions/{_version(version)}",
                          json={"deprecated": deprecated, "message": message})

    # -- models -------------------------------------------------------------------------------
    def list_models(self, q: str = "", *, stage: str | None = None, limit: int = 100, offset: int = 0) -> dict:
        """GET /models: ``{"items", "total"}``."""
        params = {k: v for k, v in (("q", q), ("stage", stage), ("limit", limit), ("offset", offset)) if v not in (None, "")}
        return self._json("GET", "/models", params=params)

    def get_model(self, name: str) -> dict:
        """GET /models/{name}: the model with every version under ``items``."""
        return self._json("GET", f"/models/{_name(name)}")

    def model_version(self, name: str, version="latest") -> dict:
        """GET /models/{name}/versions/{version}: ``version`` is a number, ``latest`` or a stage name."""
        return self._json("GET", f"/models/{_name(name)}/versions/{_version(version)}")

    def register_model(self, name: str, job: str | None = None, *, path: str | None = None, description: str = "",
                       metrics: dict | None = None, params: dict | None = None, datasets=(), stage: str | None = None) -> dict:
        """POST /models: register the outputs of finished ``job`` (or ``path`` inside them; without a job,
        a storage path in your area) as the next version of ``name``. Files are copied immutably;
        ``metrics``/``params`` add to the job's own; ``datasets`` are ``"name:version"`` lineage refs."""
        body = {"name": _name(name), "job": job, "path": path, "description": description, "metrics": metrics,
                "params": params, "datasets": list(datasets) or None, "stage": stage}
        return self._json("POST", "/models", json={k: v for k, v in body.items() if v not in (None, "")},
                          timeout=max(self.timeout, 600))

    def set_model_stage(self, name: str, version, stage: str, comment: str = "", exclusive: bool = False) -> dict:
        """PATCH /models/{name}/versions/{v}: move a version to none/staging/production/archived (audited)."""
        return self._json("PATCH", f"/models/{_name(name)}/versions/{_version(version)}",
                          json={"stage": stage, "comment": comment, "exclusive": exclusive})

    def export_model(self, name: str, version, dest) -> str:
        """GET .../export: save the version's bundle (tar.gz: MANIFEST.json, metadata.json, files/) to ``dest``
        (a file path, or a folder to put ``<name>-v<N>.tar.gz`` in). Returns the file's path."""
        r = self.request("GET", f"/models/{_name(name)}/versions/{_version(version)}/export", stream=True,
                         timeout=(self.timeout, None))
        dest = os.fspath(dest)
        if os.path.isdir(dest):
            cd = r.headers.get("Content-Disposition", "")
            fname = cd.split("filename=")[-1].strip('"') if "filename=" in cd else f"{name}-{version}.tar.gz"
            dest = os.path.join(dest, fname)
        with open(dest, "wb") as f:
            for chunk in r.iter_content(1 << 20):
                f.write(chunk)
        return dest
