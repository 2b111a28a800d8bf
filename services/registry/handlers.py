"""REST handlers of the dataset and model registries (see openapi.json beside this file)."""

from __future__ import annotations

import asyncio
import os
import re

from jupyterhub.utils import url_path_join
from tornado import web

from trainhub.exceptions import Conflict, InvalidRequest
from trainhub.services.api import APIHandler
from trainhub.states import PENDING, READY

from .models import STAGES
from .registry import require_source
from .store import dataset_dict, dataset_version_dict, model_dict, model_version_dict

READ, WRITE = "custom:trainhub:registry:read", "custom:trainhub:registry:write"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
NAME_RE = r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,127})"
VERSION_RE = r"(?P<version>v?\d+|latest|staging|production|archived)"


def check_name(name) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise InvalidRequest(f"invalid name {name!r}: use letters, digits, '.', '_' and '-' (at most 128, starting with a letter or digit)")
    return name


def _int_arg(handler, name, default, lo=0, hi=1000) -> int:
    raw = handler.get_argument(name, None)
    if raw is None:
        return default
    if not (raw.isascii() and raw.lstrip("-").isdigit()) or not lo <= int(raw) <= hi:
        raise InvalidRequest(f"{name} must be a whole number from {lo} to {hi}, not {raw[:40]!r}")
    return int(raw)


def _flag(handler, name, default: bool) -> bool:
    raw = handler.get_argument(name, None)
    if raw is None:
        return default
    if raw not in ("0", "1", "false", "true"):
        raise InvalidRequest(f"{name} must be 0, 1, false or true, not {raw[:40]!r}")
    return raw in ("1", "true")


class RegistryHandler(APIHandler):
    @property
    def registry(self):
        return self.service.registry

    def reader(self):
        caller = self.caller
        if not (caller.may(READ) or caller.may(READ, caller.name)):
            raise web.HTTPError(403, "this token may not read the registries (needs custom:trainhub:registry:read)")
        return caller

    def writer(self):
        caller = self.caller
        if not (caller.may(WRITE, caller.name) or caller.may_all(WRITE)):
            raise web.HTTPError(403, "this token may not change the registries (needs custom:trainhub:registry:write)")
        return caller

    async def db_read(self, fn, *a, **kw):
        return await self.service.store.read(fn, *a, **kw)

    async def db_write(self, fn, *a, **kw):
        return await self.service.store.write(fn, *a, **kw)


# -- datasets -------------------------------------------------------------------------------------
class DatasetsHandler(RegistryHandler):
    async def get(self):
        self.reader()
        items, total = await self.db_read(
            self.registry.store.list_datasets, q=self.get_argument("q", ""), owner=self.get_argument("owner", None),
            include_deprecated=_flag(self, "deprecated", True),
            limit=_int_arg(self, "limit", 100, 1, 1000), offset=_int_arg(self, "offset", 0, 0, 10**9))
        self.write_json({"items": items, "total": total})

    async def post(self, name: str | None = None):
        caller = self.writer()
        body = self.json_body()
        name = check_name(name or body.get("name"))
        self.check_body(body, "DatasetRegistration")
        d = await self.registry.register_dataset(caller, name, body, wait=5.0 if body.get("wait") is None else float(body["wait"]))
        self.write_json(d, 201 if d["status"] != PENDING else 202)


class DatasetHandler(RegistryHandler):
    async def get(self, name):
        self.reader()
        ds, versions = await self.db_read(self.registry.store.get_dataset, name)
        d = dataset_dict(ds, versions)
        d["items"] = [dataset_version_dict(ds, v, self.registry.progress.get(("dataset", v.id))) for v in versions]
        self.write_json(d)


class DatasetVersionHandler(RegistryHandler):
    async def get(self, name, version):
        self.reader()
        ds, v = await self.db_read(self.registry.store.get_dataset_version, name, version)
        self.write_json(dataset_version_dict(ds, v, self.registry.progress.get(("dataset", v.id))))

    async def patch(self, name, version):
        caller = self.writer()
        body = self.json_body()
        other = set(body) - {"deprecated", "deprecation_message", "message"}
        if other:
            raise Conflict(f"dataset versions are immutable: only 'deprecated' may change (not {', '.join(sorted(other))}); "
                           "register a new version instead")
        if "deprecated" not in body:
            raise InvalidRequest("send {'deprecated': true|false, 'message': '...'}")
        self.check_body(body, "DatasetVersionChange")
        ds, v = await self.db_write(self.registry.store.deprecate_dataset_version, name, version, caller.name,
                                    caller.may_all(WRITE), bool(body["deprecated"]),
                                    str(body.get("message") or body.get("deprecation_message") or ""))
        self.write_json(dataset_version_dict(ds, v))

    async def put(self, name, version):
        self.writer()
        raise Conflict("dataset versions are immutable; register a new version (POST .../datasets)")

    async def delete(self, name, version):
        self.writer()
        raise Conflict("dataset versions are immutable and kept; deprecate it instead (PATCH {'deprecated': true})")


# -- models ---------------------------------------------------------------------------------------
class ModelsHandler(RegistryHandler):
    async def get(self):
        self.reader()
        stage = self.get_argument("stage", None)
        if stage is not None and stage not in STAGES:
            raise InvalidRequest(f"stage must be one of {', '.join(STAGES)}, not {stage[:40]!r}")
        items, total = await self.db_read(
            self.registry.store.list_models, q=self.get_argument("q", ""), stage=stage,
            limit=_int_arg(self, "limit", 100, 1, 1000), offset=_int_arg(self, "offset", 0, 0, 10**9))
        self.write_json({"items": items, "total": total})

    async def post(self, name: str | None = None):
        caller = self.writer()
        body = self.json_body()
        name = check_name(name or body.get("name"))
        require_source(body)
        self.check_body(body, "ModelRegistration")
        d = await self.registry.register_model(caller, name, body)
        self.write_json(d, 201)


class ModelHandler(RegistryHandler):
    async def get(self, name):
        self.reader()
        m, versions = await self.db_read(self.registry.store.get_model, name)
        d = model_dict(m, versions)
        d["items"] = [model_version_dict(m, v) for v in versions]
        self.write_json(d)


class ModelVersionHandler(RegistryHandler):
    async def get(self, name, version):
        self.reader()
        m, v, history = await self.db_read(self.registry.store.get_model_version, name, version)
        self.write_json(model_version_dict(m, v, history))

    async def patch(self, name, version):
        caller = self.writer()
        body = self.json_body()
        other = set(body) - {"stage", "comment", "exclusive"}
        if other:
            raise Conflict(f"model versions are immutable: only 'stage' may change (not {', '.join(sorted(other))})")
        if "stage" not in body:
            raise InvalidRequest("send {'stage': 'none'|'staging'|'production'|'archived'}")
        self.check_body(body, "ModelVersionChange")
        m, v = await self.db_write(self.registry.store.set_stage, name, version, str(body["stage"]), caller.name,
                                   caller.may_all(WRITE), str(body.get("comment") or ""), bool(body.get("exclusive", False)))
        self.log.info("model %s v%d moved to %s by %s", name, v.version, v.stage, caller.name)
        m, v, history = await self.db_read(self.registry.store.get_model_version, name, v.version)
        self.write_json(model_version_dict(m, v, history))

    async def put(self, name, version):
        self.writer()
        raise Conflict("model versions are immutable; register a new version")

    async def delete(self, name, version):
        self.writer()
        raise Conflict("registered model versions are kept forever; archive it instead (PATCH {'stage': 'archived'})")


class ModelExportHandler(RegistryHandler):
    async def get(self, name, version):
        self.reader()
        m, v, history = await self.db_read(self.registry.store.get_model_version, name, version)
        d = model_version_dict(m, v, history)
        if v.status != READY:
            raise Conflict(f"model {name} version {v.version} is {v.status}; it cannot be exported yet")
        path = await self.registry.build_bundle(d)
        try:
            self.set_header("Content-Type", "application/gzip")
            self.set_header("Content-Disposition", f'attachment; filename="{name}-v{v.version}.tar.gz"')
            self.set_header("Content-Length", str(os.path.getsize(path)))
            with open(path, "rb") as f:
                while True:
                    chunk = await asyncio.get_running_loop().run_in_executor(None, f.read, 1 << 20)
                    if not chunk:
                        break
                    self.write(chunk)
                    await self.flush()
            self.finish()
        finally:
            os.unlink(path)


def handlers(prefix: str, service) -> list:
    api = url_path_join(prefix, "api")
    kw = {"service": service}
    return [
        (f"{api}/datasets", DatasetsHandler, kw),
        (f"{api}/datasets/{NAME_RE}", DatasetHandler, kw),
        (f"{api}/datasets/{NAME_RE}/versions/{VERSION_RE}", DatasetVersionHandler, kw),
        (f"{api}/models", ModelsHandler, kw),
        (f"{api}/models/{NAME_RE}", ModelHandler, kw),
        (f"{api}/models/{NAME_RE}/versions/{VERSION_RE}", ModelVersionHandler, kw),
        (f"{api}/models/{NAME_RE}/versions/{VERSION_RE}/export", ModelExportHandler, kw),
    ]
