"""Pattern 3 of issue 32, "one S3 key for everyone", through a real `trainhub up` on IAM-enforcing moto.

The platform's key is an IAM user that may do anything with the bucket; users' servers and jobs must hold only
their own minted credentials (one role per user here: the mechanism moto enforces, docs/storage.md). A kernel
and a job of alice use plain ``fsspec`` with no options: her own area works; ``datasets/`` is read-only; bob's
area is out of reach; the platform's key is nowhere in her environment.
"""

from __future__ import annotations

import json
import os

import pytest
import requests

from test_user_credentials import BUCKET, IAMS3
from waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(os.geteuid() != 0, reason="per-user accounts need root (CI has it)")]

PROBE = """
import json, os
import fsspec
fs = fsspec.filesystem("s3")
home = os.environ["TRAINHUB_STORAGE_URL"].removeprefix("s3://")
out = {"aws": {k: v for k, v in os.environ.items() if k.startswith("AWS_")},
       "options": os.environ.get("TRAINHUB_STORAGE_OPTIONS")}
def attempt(name, fn):
    try:
        fn()
        out[name] = "allowed"
    except Exception as e:
        out[name] = "refused " + type(e).__name__
attempt("write own", lambda: fs.pipe(home + "/notes/from-" + os.environ.get("TRAINHUB_JOB_ID", "kernel"), b"mine"))
attempt("read datasets", lambda: fs.cat("%(bucket)s/team/datasets/mnist/train.bin"))
attempt("write datasets", lambda: fs.pipe("%(bucket)s/team/datasets/evil.bin", b"x"))
attempt("read bob", lambda: fs.cat("%(bucket)s/team/users/bob/private.txt"))
attempt("write bob", lambda: fs.pipe("%(bucket)s/team/users/bob/planted.txt", b"x"))
print("RESULT " + json.dumps(out))
""" % {"bucket": BUCKET}


@pytest.fixture(scope="module")
def iam_platform(platform_factory):
    s3 = IAMS3()
    config = ("c.CredentialMinter.per_user_roles = True\n"
              "c.CredentialMinter.duration = 900\n"
              "c.CredentialMinter.refresh_margin = 300\n"
              "c.CredentialMinter.region = 'us-east-1'\n")
    env = {"AWS_ACCESS_KEY_ID": s3.key, "AWS_SECRET_ACCESS_KEY": s3.secret, "AWS_ENDPOINT_URL": s3.endpoint,
           "AWS_DEFAULT_REGION": "us-east-1"}
    p = platform_factory("creds", storage=f"s3://{BUCKET}/team", env=env, config=config)
    p.s3 = s3
    yield p
    if p.running:
        p.stop()
    s3.close()


def _result(text: str) -> dict:
    for line in text.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise AssertionError(f"no result in {text[-2000:]!r}")


def _assert_own_credentials_only(r: dict, s3: IAMS3) -> None:
    assert r["write own"] == "allowed" and r["read datasets"] == "allowed", r
    for what in ("write datasets", "read bob", "write bob"):
        assert r[what].startswith("refused"), (what, r)
    assert s3.key not in json.dumps(r) and s3.secret not in json.dumps(r), r  # no platform key anywhere
    assert "AWS_CONFIG_FILE" in r["aws"] and "AWS_ACCESS_KEY_ID" not in r["aws"], r["aws"]


def test_a_kernel_holds_only_its_users_own_credentials(iam_platform):
    p = iam_platform
    p.spawn("alice", "cpu")
    try:
        _assert_own_credentials_only(_result(p.kernel_exec("alice", PROBE)), p.s3)
    finally:
        p.stop_server("alice")
    platform = p.s3.platform_s3()
    assert platform.get_object(Bucket=BUCKET, Key="team/users/bob/private.txt")["Body"].read() == b"bob's notes"
    assert platform.get_object(Bucket=BUCKET, Key="team/users/alice/notes/from-kernel")["Body"].read() == b"mine"


def test_a_job_holds_only_its_users_own_credentials(iam_platform):
    p = iam_platform
    h = {"Authorization": f"token {p.token('alice')}"}
    api = p.url + "/services/trainhub/api"
    r = requests.post(api + "/jobs", json={"script": PROBE, "name": "creds-probe"}, headers=h, timeout=60)
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    job = wait_for(lambda: requests.get(f"{api}/jobs/{jid}", headers=h, timeout=30).json(),
                   lambda j: j["state"] in ("succeeded", "failed", "cancelled"), what=f"job {jid}", timeout=180)
    logs = requests.get(f"{api}/jobs/{jid}/logs", headers=h, timeout=30).text
    assert job["state"] == "succeeded", (job, logs[-2000:])
    _assert_own_credentials_only(_result(logs), p.s3)
