"""The registry's OpenAPI fragment describes exactly the routes it serves."""

from __future__ import annotations

import re

from trainhub.services import registry as plugin
from trainhub.services.jobs.app import merged_openapi


class _Svc:
    registry = object()


def _template(route: str) -> str:
    path = route.split("/api", 1)[1]
    return re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", path)


def test_every_route_is_documented_and_vice_versa():
    routes = {_template(r[0]) for r in plugin.routes("/services/trainhub/", _Svc())}
    doc = merged_openapi([plugin])
    documented = {p for p in doc["paths"] if p.startswith(("/datasets", "/models"))}
    assert routes == documented
    for path, ops in doc["paths"].items():
        if path in documented:
            for op in ops.values():
                for ref in re.findall(r"#/components/schemas/(\w+)", str(op)):
                    assert ref in doc["components"]["schemas"], ref
