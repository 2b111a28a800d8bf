"""Dataset and model registries, served by the `trainhub` jobs service (a plugin of it).

Routes under ``<service prefix>api/``: ``datasets``, ``datasets/{name}``,
``datasets/{name}/versions/{v}``, ``models``, ``models/{name}``,
``models/{name}/versions/{v}`` (PATCH stage) and ``.../export`` (a tar.gz bundle).
See ``openapi.json`` beside this file and docs/storage.md.
"""

from __future__ import annotations

from pathlib import Path

from .handlers import handlers as _handlers
from .registry import Registry

OPENAPI = Path(__file__).with_name("openapi.json")


def _ensure(service) -> Registry:
    reg = getattr(service, "registry", None)
    if reg is None:
        reg = service.registry = Registry(service)
    return reg


def routes(prefix: str, service) -> list:
    _ensure(service)
    return _handlers(prefix, service)


async def start(service) -> None:
    await _ensure(service).start()


async def stop(service) -> None:
    reg = getattr(service, "registry", None)
    if reg is not None:
        await reg.stop()
