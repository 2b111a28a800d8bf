"""Registries through a real `trainhub up`: a model registered from a real job's outputs with
the job handle inside a user's kernel, promoted, exported; datasets shared by all users."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
import requests
from waiting import wait_for

from trainhub.states import PENDING

pytestmark = pytest.mark.e2e

REGISTER_FROM_KERNEL = r"""
import json
from trainhub.client import TrainhubClient
from trainhub.kernels.handle import JobHandle
c = TrainhubClient()
script = '''
import trainhub
trainhub.log_metrics(step=0, loss=0.9)
trainhub.log_metrics(step=1, loss=0.25, acc=0.93)
(trainhub.outputs_dir() / "model.bin").write_bytes(b"trained-weights")
(trainhub.outputs_dir() / "config.json").write_text('{"layers": 3}')
'''
job = JobHandle(c, c.submit({"name": "reg-train", "script": script, "gpus": 0}))
job.wait(timeout=120)
v = job.register_model("e2e-classifier", description="from the handle", datasets=["e2e-digits:1"])
# the side panel's "insert loading code" snippet for a dataset version
ds = c.dataset("e2e-digits", 1)
fs, root = ds.filesystem()
v["_dataset_files"] = len(fs.find(root))
print(json.dumps(v))
"""


@pytest.fixture(scope="module")
def api(platform):
    url = platform.url + "/services/trainhub/api"

    def call(method, path, user, body=None, **params):
        return requests.request(method, url + path, json=body, params=params, timeout=120,
                                headers={"Authorization": f"token {platform.token(user)}"})

    return call


def test_model_from_a_real_job(platform, api):
    digits = platform.data_dir / "storage" / "datasets" / "e2e-digits"
    digits.mkdir(parents=True, exist_ok=True)
    for i in range(3):
        (digits / f"part-{i}.bin").write_bytes(b"d" * 10)
    r = api("POST", "/datasets", "reg-alice", {"name": "e2e-digits", "path": "datasets/e2e-digits", "format": "binary"})
    assert r.status_code == 201, r.text
    assert (r.json()["file_count"], r.json()["size"]) == (3, 30)

    platform.spawn("reg-alice", "cpu")
    try:
        out = platform.kernel_exec("reg-alice", REGISTER_FROM_KERNEL, timeout=180)
    finally:
        platform.stop_server("reg-alice")
    v = json.loads(out.strip().splitlines()[-1])
    assert v.pop("_dataset_files") == 3
    assert v["name"] == "e2e-classifier" and v["version"] == 1 and v["status"] == "ready"
    assert v["metrics"] == {"loss": 0.25, "acc": 0.93}
    assert v["lineage"]["job"].startswith("j-") and v["lineage"]["datasets"] == [{"name": "e2e-digits", "version": 1}]
    assert sorted(f["path"] for f in v["files"]) == ["config.json", "model.bin"]
    copied = platform.data_dir / "storage" / "models" / "e2e-classifier" / "v1" / "files" / "model.bin"
    assert copied.read_bytes() == b"trained-weights"

    # everyone sees it; only the owner (or an admin) promotes it; promotions are audited
    assert api("GET", "/models/e2e-classifier", "reg-bob").json()["versions"] == [1]
    assert api("PATCH", "/models/e2e-classifier/versions/1", "reg-bob", {"stage": "production"}).status_code == 403
    r = api("PATCH", "/models/e2e-classifier/versions/1", "reg-alice", {"stage": "staging"})
    assert r.status_code == 200 and r.json()["stage_history"][-1]["user"] == "reg-alice"
    r = api("PATCH", "/models/e2e-classifier/versions/1", platform.admin_user, {"stage": "production"})
    assert r.status_code == 200, r.text
    hist = r.json()["stage_history"]
    assert [(e["user"], e["to"]) for e in hist] == [("reg-alice", "staging"), (platform.admin_user, "production")]

    r = api("GET", "/models/e2e-classifier/versions/production/export", "reg-bob")
    assert r.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))
        assert tar.extractfile("files/model.bin").read() == b"trained-weights"
    assert manifest["stage"] == "production" and manifest["format"] == "trainhub-model-bundle/1"


def test_other_users_job_cannot_be_registered(platform, api):
    job = api("POST", "/jobs", "reg-carol", {"name": "c", "command": "true", "gpus": 0}).json()
    r = api("POST", "/models", "reg-dave", {"name": "stolen", "job": job["id"]})
    assert r.status_code == 404
    assert api("GET", "/models/stolen", "reg-dave").status_code == 404


def test_a_link_in_ones_area_registers_nothing_of_another_users(platform, api):
    """Paths are resolved (links included) against the caller's own area, and scans follow no links."""
    import os

    users = platform.data_dir / "storage" / "users"
    secret = users / "reg-bob" / "secret"
    secret.mkdir(parents=True, exist_ok=True)
    (secret / "weights.bin").write_bytes(b"bob's")
    mine = users / "reg-eve" / "mine"
    mine.mkdir(parents=True, exist_ok=True)
    (mine / "own.txt").write_text("eve's")
    for link, target in ((users / "reg-eve" / "bobs", secret), (mine / "bobs.bin", secret / "weights.bin"),
                         (mine / "bobsdir", secret)):
        if not os.path.lexists(link):
            os.symlink(target, link)
    for path in ("users/reg-eve/bobs", "users/reg-eve/bobs/weights.bin", "users/reg-bob/secret",
                 "users/reg-eve/../reg-bob/secret"):
        r = api("POST", "/datasets", "reg-eve", {"name": "eve-stolen", "path": path})
        assert r.status_code == 403, (path, r.text)
        r = api("POST", "/models", "reg-eve", {"name": "eve-stolen-model", "path": path})
        assert r.status_code == 403, (path, r.text)
    r = api("POST", "/datasets", "reg-eve", {"name": "eve-own", "path": "users/reg-eve/mine"})
    assert r.status_code in (200, 201), r.text
    version = wait_for(lambda: api("GET", "/datasets/eve-own/versions/1", "reg-eve").json(),
                       lambda v: v.get("status") != PENDING, what="the scan of eve's folder")
    assert version["file_count"] == 1, version  # own.txt; the links to bob's file and folder are not followed
