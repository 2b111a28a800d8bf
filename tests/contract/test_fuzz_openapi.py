"""Fuzzing the published OpenAPI document against a real jobs service (schemathesis).

A throwaway ``trainhub up`` (its jobs service with the sweeps, registry and usage plugins, behind the
real hub and proxy) answers every operation of the document it serves at ``/services/trainhub/api/
openapi.json``, with cases schemathesis generates from that document: examples, the coverage phase
(boundaries, missing and wrong values, methods the document does not list) and random cases. Every
answer must be no server error, a documented status with the documented content type, headers and
schema (errors included: ``{"status", "message"}``), and a 405 must carry ``Allow``.

Bounded to stay near a minute on 2 cores: few examples per operation, derandomized (the same cases on
every run). Run alone: ``.venv/bin/python -m pytest tests/contract/test_fuzz_openapi.py -q``.
"""

from __future__ import annotations

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    missing_required_header,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from trainhub.services.jobs.app import load_plugins, merged_openapi

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance, unsupported_method, missing_required_header]

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def fuzzed(platform_factory):
    """A private platform (the fuzzer deletes, cancels and submits at will) and a user's token."""
    p = platform_factory("contract-fuzz", gpus=2)
    return p, p.token("fuzzer")


# what the service serves (checked below to be what it answers at <prefix>api/openapi.json); one test per operation
schema = schemathesis.openapi.from_dict(merged_openapi(load_plugins()))


def test_the_served_document_is_the_one_fuzzed(fuzzed):
    p, _ = fuzzed
    r = requests.get(p.url + "/services/trainhub/api/openapi.json", timeout=30)
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    assert r.json() == schema.raw_schema


@schema.parametrize()
@settings(max_examples=8, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_every_answer_is_what_the_document_says(fuzzed, case):
    p, token = fuzzed
    case.call_and_validate(base_url=p.url + "/services/trainhub/api", headers={"Authorization": f"token {token}"},
                           checks=CHECKS, timeout=30)
