"""Model registry: versions from a job's outputs (immutable copies), metrics/params/lineage,
stages with an audit trail, ownership, export bundles, and job-output retention."""

from __future__ import annotations

import io
import json
import tarfile
from datetime import timedelta

import pytest


def register(registry, job, as_="alice", name="resnet", **extra):
    return registry.call("POST", "/models", as_, {"name": name, "job": job.key, **extra})


def test_register_from_job_copies_files_immutably(registry):
    job = registry.finished_job("alice", metrics=[{"loss": 1.0, "acc": 0.5}, {"loss": 0.2}], params={"lr": 0.01})
    r = register(registry, job, description="first")
    assert r.status_code == 201, r.text
    v = r.json()
    assert v["version"] == 1 and v["status"] == "ready" and v["stage"] == "none"
    assert v["metrics"] == {"loss": 0.2, "acc": 0.5} and v["params"] == {"lr": 0.01}
    assert v["lineage"] == {"job": job.key, "user": "alice"}
    assert v["url"] == f"{registry.storage.root()}/models/resnet/v1"
    assert [f["path"] for f in v["files"]] == ["model.pt", "sub/config.json"] and v["size"] == len(b"weights") + 2
    # the copy is independent of the job's outputs
    registry.storage_write(f"users/alice/jobs/{job.key}/model.pt", b"overwritten")
    fs, root = registry.fs, registry.storage.strip(v["url"])
    assert fs.cat(f"{root}/files/model.pt") == b"weights"
    manifest = json.loads(fs.cat(f"{root}/MANIFEST.json"))
    assert manifest["format"] == "trainhub-model-bundle/1" and manifest["version"] == 1
    r2 = register(registry, job)
    assert r2.json()["version"] == 2
    assert fs.cat(f"{registry.storage.strip(r2.json()['url'])}/files/model.pt") == b"overwritten"
    for method, body in (("PATCH", {"metrics": {"acc": 1}}), ("PUT", {}), ("DELETE", None)):
        assert registry.call(method, "/models/resnet/versions/1", "alice", body).status_code == 409


def test_sweep_trial_and_dataset_lineage(registry):
    registry.storage_write("datasets/mnist/a", b"1")
    registry.call("POST", "/datasets", "alice", {"name": "mnist", "path": "datasets/mnist"})
    job = registry.finished_job("alice", sweep_id=7, params={"lr": 0.3})
    v = register(registry, job, datasets=["mnist:1"], metrics={"val_acc": 0.9}).json()
    assert v["lineage"] == {"job": job.key, "user": "alice", "sweep": 7, "datasets": [{"name": "mnist", "version": 1}]}
    assert v["metrics"]["val_acc"] == 0.9
    r = register(registry, job, name="other", datasets=["nosuch:1"])
    assert r.status_code == 404


def test_subpath_of_outputs(registry):
    job = registry.finished_job("alice", files={"ckpt/best.pt": b"best", "ckpt/last.pt": b"last", "log.txt": b"l"})
    v = register(registry, job, path="ckpt").json()
    assert [f["path"] for f in v["files"]] == ["best.pt", "last.pt"]
    assert register(registry, job, path="../../bob").status_code == 403


def test_a_folder_of_too_many_files_is_refused_before_copying(registry, monkeypatch):
    from trainhub.services.registry import files as fileops

    monkeypatch.setattr(fileops, "MAX_MODEL_FILES", 5)
    job = registry.finished_job("alice", files={f"shard-{i}.bin": b"s" for i in range(6)})
    r = register(registry, job)
    assert r.status_code == 400 and "holds more than 5 files" in r.json()["message"], r.text
    assert register(registry, job, path="nothing-here").status_code == 404
    job = registry.finished_job("alice", files={f"shard-{i}.bin": b"s" for i in range(5)})
    assert register(registry, job, name="five").status_code == 201


@pytest.mark.parametrize("case,status", [("other-users-job", 404), ("running", 409), ("no-files", 404), ("reader", 403)])
def test_register_refusals(registry, case, status):
    if case == "other-users-job":
        job, caller = registry.finished_job("bob"), "alice"
    elif case == "running":
        job, caller = registry.finished_job("alice", state="running"), "alice"
    elif case == "no-files":
        job, caller = registry.finished_job("alice", files={}), "alice"
    else:
        job, caller = registry.finished_job("alice"), "reader"
    r = register(registry, job, as_=caller)
    assert r.status_code == status, r.text
    assert r.json()["message"]


def test_admin_registers_any_job_and_others_cannot_add_versions(registry):
    job = registry.finished_job("bob")
    assert register(registry, job, as_="admin", name="bobs").status_code == 201
    job2 = registry.finished_job("alice")
    r = register(registry, job2, as_="alice", name="bobs")
    assert r.status_code == 403 and "belongs to admin" in r.json()["message"]


def test_stage_promotion_is_audited(registry):
    job = registry.finished_job("alice")
    register(registry, job)
    register(registry, job)
    r = registry.call("PATCH", "/models/resnet/versions/1", "alice", {"stage": "staging", "comment": "try it"})
    assert r.status_code == 200 and r.json()["stage"] == "staging"
    r = registry.call("PATCH", "/models/resnet/versions/1", "alice", {"stage": "production"})
    hist = r.json()["stage_history"]
    assert [(e["user"], e["from"], e["to"]) for e in hist] == [("alice", "none", "staging"), ("alice", "staging", "production")]
    assert hist[0]["comment"] == "try it" and hist[0]["time"].endswith("Z")
    assert registry.call("PATCH", "/models/resnet/versions/1", "bob", {"stage": "archived"}).status_code == 403
    assert registry.call("PATCH", "/models/resnet/versions/1", "alice", {"stage": "gold"}).status_code == 400
    r = registry.call("PATCH", "/models/resnet/versions/2", "admin", {"stage": "production", "exclusive": True})
    assert r.json()["stage"] == "production"
    v1 = registry.call("GET", "/models/resnet/versions/1", "bob").json()
    assert v1["stage"] == "archived" and v1["stage_history"][-1]["user"] == "admin"
    assert registry.call("GET", "/models/resnet/versions/production", "reader").json()["version"] == 2
    m = registry.call("GET", "/models", "reader", stage="production").json()["items"]
    assert [x["name"] for x in m] == ["resnet"] and m[0]["stages"] == {"archived": [1], "production": [2]}


def test_export_bundle_is_self_describing(registry):
    job = registry.finished_job("alice", files={"model.pt": b"weights", "tok/vocab.txt": b"a\nb"}, metrics=[{"acc": 0.8}])
    register(registry, job)
    r = registry.call("GET", "/models/resnet/versions/1/export", "bob")
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/gzip"
    assert 'filename="resnet-v1.tar.gz"' in r.headers["Content-Disposition"]
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("MANIFEST.json"))
        meta = json.load(tar.extractfile("metadata.json"))
        weights = tar.extractfile("files/model.pt").read()
    assert set(names) == {"files/model.pt", "files/tok/vocab.txt", "metadata.json", "MANIFEST.json"}
    assert weights == b"weights"
    assert manifest["format"] == "trainhub-model-bundle/1" and manifest["name"] == "resnet" and manifest["version"] == 1
    assert manifest["metrics"] == {"acc": 0.8} and manifest["lineage"]["job"] == job.key
    import hashlib

    assert {f["path"]: f["sha256"] for f in manifest["files"]}["model.pt"] == hashlib.sha256(b"weights").hexdigest()
    assert meta["name"] == "resnet"


def test_job_output_retention_spares_registered_versions(registry):
    old = registry.finished_job("alice", files={"m.pt": b"old"})
    fresh = registry.finished_job("alice", files={"m.pt": b"new"})
    register(registry, old)
    reg = registry.registry
    reg.job_outputs_retention_days = 0
    assert reg.expire_job_outputs() == []
    reg.job_outputs_retention_days = 7
    now = reg.utcnow()
    reg.utcnow = lambda: now + timedelta(days=7, hours=1)
    registry.service.store.update(fresh.id, finished=now + timedelta(days=5))
    assert reg.expire_job_outputs() == [old.key]
    fs = registry.fs
    assert not fs.exists(registry.storage.strip(old.outputs_url + "/m.pt"))
    assert fs.exists(registry.storage.strip(fresh.outputs_url + "/m.pt"))
    v = registry.call("GET", "/models/resnet/versions/1", "alice").json()
    assert fs.cat(registry.storage.strip(v["url"] + "/files/m.pt")) == b"old"
    assert reg.expire_job_outputs() == []  # each job once


def test_a_model_larger_than_the_registry_takes_is_refused_before_copying(registry):
    """No single request makes the registry copy without bound: the listing's sizes are counted first."""
    from trainhub.services.registry import files as fileops

    job = registry.finished_job("alice", files={"big.bin": b"x" * 4096, "small.bin": b"y"})
    source = type("Src", (), {"pages": lambda self: iter([[("big.bin", 4096, ""), ("small.bin", 1, "")]]),
                              "__str__": lambda self: "outputs"})()
    with pytest.raises(fileops.TooLarge, match="holds more than"):
        fileops.copy_tree(source, registry.fs, "nowhere", {}, max_bytes=4000)
    assert register(registry, job).status_code == 201  # the default takes it


def test_a_file_that_keeps_growing_cannot_make_a_copy_endless():
    """A user's process appending to a file while it is registered: the copy stops at the registry's limit."""
    from trainhub.services.registry import files as fileops

    class Endless:
        name = "outputs/grows.bin"

        def read(self, n):
            return b"z" * n

    with pytest.raises(fileops.TooLarge, match="grew past"):
        fileops._copy_stream(Endless(), io.BytesIO(), 8 << 20)
