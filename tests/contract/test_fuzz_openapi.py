"""Fuzzing the published OpenAPI document against a real jobs service (schemathesis).

A throwaway ``trainhub up`` (its jobs service with the sweeps, registry and usage plugins, behind the
real hub and proxy) answers every operation of the document it serves at ``/services/trainhub/api/
openapi.json``, with cases schemathesis generates from that document: examples, the coverage phase
(boundaries, missing and wrong values, methods the document does not list) and random cases. Every
answer must be no server error, a documented status with the documented content type, headers and
schema (errors included: ``{"status", "message"}``), and a 405 must carry ``Allow``.

A second test runs schemathesis's command line with every check (positive data accepted, negative data
refused, stateful sequences) against the document the service serves, as an outside fuzzer would.

Bounded to stay near a few minutes on 2 cores: few examples per operation, derandomized (the same cases on
every run). Run alone: ``.venv/bin/python -m pytest tests/contract/test_fuzz_openapi.py -q``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    """The file's document, with the platform's profiles as the enum of every spec's ``profile``."""
    p, _ = fuzzed
    r = requests.get(p.url + "/services/trainhub/api/openapi.json", timeout=30)
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    served = r.json()
    profiles = served["components"]["schemas"]["JobSpec"]["properties"]["profile"]["enum"]
    assert "gpu-1" in profiles and None in profiles
    assert served == merged_openapi(load_plugins(), [x for x in profiles if x is not None])
    assert merged_openapi(load_plugins()) == schema.raw_schema


def test_every_check_passes_on_the_served_document(fuzzed, tmp_path):
    """Schemathesis's own command line, every check (see schemathesis.toml for the exceptions and why),
    all phases (examples, coverage, fuzzing, stateful) against the served document: what an outside
    fuzzer would run. Positive data must be accepted and negative data refused, so the document is exact."""
    p, token = fuzzed
    api = p.url + "/services/trainhub/api"
    cmd = [str(Path(sys.executable).with_name("st")), "--config-file", str(Path(__file__).with_name("schemathesis.toml")),
           "--no-color", "run", api + "/openapi.json", "--url", api, "-H", f"Authorization: token {token}",
           # --checks all names every check on the command line, which wins over the file's
           # use_after_free.enabled = false: excluded here too, for the reason schemathesis.toml gives
           "--checks", "all", "--exclude-checks", "use_after_free", "--max-examples", "8", "--seed", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:]


@schema.parametrize()
@settings(max_examples=8, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_every_answer_is_what_the_document_says(fuzzed, case):
    p, token = fuzzed
    case.call_and_validate(base_url=p.url + "/services/trainhub/api", headers={"Authorization": f"token {token}"},
                           checks=CHECKS, timeout=30)
