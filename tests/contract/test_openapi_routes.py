"""The published OpenAPI document says what the jobs service serves, no more and no less.

The routes come from the tornado application the service really builds (``JobsService.make_app``,
plugins included), their methods from the handler classes; a new route or method without its
documentation fails here. Every operation documents the errors it can answer with the shared error
shape, and a path parameter's pattern accepts only what the route's regex matches.
"""

from __future__ import annotations

import json
import re

import pytest

from trainhub.gpus import simulated_devices
from trainhub.httpapi import route_methods
from trainhub.settings import Runtime

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


@pytest.fixture
def service(tmp_path, monkeypatch):
    from trainhub.services.jobs.app import JobsService

    for var in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "TRAINHUB_K8S_CONFIG", "TRAINHUB_CONFIG",
                "JUPYTERHUB_SERVICE_PREFIX"):
        monkeypatch.delenv(var, raising=False)
    Runtime(data_dir=str(tmp_path), devices=[d.to_dict() for d in simulated_devices(1)], simulated=True).save()
    app = JobsService()
    app.initialize(["--data-dir", str(tmp_path)])
    return app


def template(regex: str, api: str) -> str:
    """``/services/trainhub/api/jobs/(j-\\d+|\\d+)/logs$`` -> ``/jobs/{id}/logs`` (unnamed groups are ids)."""
    path = regex.removesuffix("$")[len(api):]
    path = re.sub(r"\(\?P<(\w+)>(?:[^()]|\([^()]*\))*\)", r"{\1}", path)
    path = re.sub(r"\((?:[^()]|\([^()]*\))*\)", "{id}", path)
    return path.replace("/?", "") or "/"


def served(service) -> dict[str, set[str]]:
    app = service.make_app()
    api = service.api_prefix.rstrip("/")
    routes: dict[str, set[str]] = {}
    for rule in app.wildcard_router.rules:
        regex = rule.matcher.regex.pattern
        if not regex.startswith(api):
            continue  # the OAuth callback: not part of the API
        routes.setdefault(template(regex, api), set()).update(m.lower() for m in route_methods(rule.target))
    return routes


def test_every_route_and_method_is_documented_and_nothing_else(service):
    doc = json.loads(service.openapi_text)
    documented = {path: {m for m in ops if m in HTTP_METHODS} for path, ops in doc["paths"].items()}
    assert served(service) == documented


def test_every_operation_documents_its_errors_in_the_shared_shape(service):
    doc = json.loads(service.openapi_text)
    assert doc["components"]["schemas"]["Error"]["required"] == ["status", "message"]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method not in HTTP_METHODS:
                continue
            where = f"{method.upper()} {path}"
            responses = op["responses"]
            errors = {code for code in responses if code[0] in "45"}
            if path != "/openapi.json":  # the document itself is public
                assert "401" in errors, where
            if "{" in path:
                assert "404" in errors, where
            if "requestBody" in op:
                assert {"400", "413"} <= errors, where
            for code in errors:
                assert responses[code] == {"$ref": "#/components/responses/Error"}, f"{where} {code}"
            params = op.get("parameters", []) + ops.get("parameters", [])
            if any(p["in"] == "query" for p in params):
                assert "400" in errors, f"{where}: a malformed query value is a 400"
    for ref in re.findall(r'"#/components/(\w+)/(\w+)"', service.openapi_text):
        assert ref[1] in doc["components"][ref[0]], ref


def test_path_parameters_accept_what_the_routes_match(service):
    """A value the document allows reaches the handler (no 404 from routing for a valid id) and the
    document's examples of ids are matched by the route."""
    doc = json.loads(service.openapi_text)
    app = service.make_app()
    api = service.api_prefix.rstrip("/")
    regexes = {template(r.matcher.regex.pattern, api): r.matcher.regex for r in app.wildcard_router.rules
               if r.matcher.regex.pattern.startswith(api)}
    samples = {"id": ["j-000042", "42", "s-000007", "7"], "name": ["resnet-50", "a", "x.y_z"],
               "version": ["3", "v3", "latest", "production"], "sha256": ["0" * 64, "9f" * 32]}
    for path, ops in doc["paths"].items():
        params = {p["name"]: p for op in ops.values() if isinstance(op, dict) for p in op.get("parameters", [])
                  if p["in"] == "path"}
        names = re.findall(r"{(\w+)}", path)
        assert set(names) == set(params), path
        for name, param in params.items():
            pattern = re.compile(param["schema"]["pattern"])
            for value in samples[name]:
                if not pattern.search(value):
                    continue
                concrete = path.replace("{" + name + "}", value)
                for other in names:
                    concrete = concrete.replace("{" + other + "}", samples[other][0 if other != "id" else 1])
                assert regexes[path].match(api + concrete), f"{concrete} is documented but not routed"


def test_the_service_hands_the_gil_over_quickly(service):
    """Its threads' short database work (a start's claim) does not wait Python's 5 ms per hand-over for the loop."""
    import sys

    before = sys.getswitchinterval()
    try:
        service.tune_interpreter()
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        service.switch_interval = 0  # 0 keeps the interpreter's own
        sys.setswitchinterval(before)
        service.tune_interpreter()
        assert sys.getswitchinterval() == before
    finally:
        sys.setswitchinterval(before)


def test_the_service_keeps_its_start_up_objects_out_of_full_collections(service):
    """Once up, the service freezes what its imports and set-up made: a full collection no longer walks them
    (about 0.1 s with no request served, each time one ran with 10,000 jobs queued)."""
    import gc

    before = gc.get_freeze_count()
    try:
        service.freeze_after_start = False
        service.settle_heap()
        assert gc.get_freeze_count() == before
        service.freeze_after_start = True
        service.settle_heap()
        frozen = gc.get_freeze_count()
        assert frozen > before + 10_000, frozen  # the imports alone
        gc.collect()
        assert gc.get_freeze_count() == frozen, "a full collection thawed the frozen objects"
    finally:
        gc.unfreeze()
