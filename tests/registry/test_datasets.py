"""Dataset registry: register (size/count scan with progress), list/search/get, immutable
versions, deprecation by owners and admins, and who may point where."""

from __future__ import annotations


import pytest
from waiting import wait_for


def wait_ready(registry, name, version, as_="alice", timeout=60):
    return wait_for(lambda: registry.call("GET", f"/datasets/{name}/versions/{version}", as_).json(),
                    lambda v: v["status"] != "pending", what=f"dataset {name} v{version} scanned", timeout=timeout,
                    interval=0.1)


def test_register_computes_size_and_count(registry):
    for i in range(5):
        registry.storage_write(f"datasets/mnist/part-{i}.bin", b"x" * (100 + i))
    registry.storage_write("datasets/mnist/sub/labels.csv", b"a,b\n")
    r = registry.call("POST", "/datasets", "alice", {"name": "mnist", "path": "datasets/mnist", "format": "binary",
                                                     "description": "digits", "metadata": {"license": "CC"}})
    assert r.status_code in (201, 202), r.text
    v = wait_ready(registry, "mnist", r.json()["version"])
    assert v["status"] == "ready" and v["version"] == 1
    assert v["file_count"] == 6 and v["size"] == sum(100 + i for i in range(5)) + 4
    assert v["owner"] == "alice" and v["format"] == "binary" and v["metadata"] == {"license": "CC"}
    assert v["url"] == f"{registry.storage.root()}/datasets/mnist" and len(v["fingerprint"]) == 64
    assert v["created"].endswith("Z")


def test_versions_increment_and_are_immutable(registry):
    registry.storage_write("datasets/cifar/a.bin", b"1")
    v1 = registry.call("POST", "/datasets", "alice", {"name": "cifar", "path": "datasets/cifar"}).json()
    registry.storage_write("datasets/cifar/b.bin", b"22")
    v2 = registry.call("POST", "/datasets", "alice", {"name": "cifar", "path": "datasets/cifar"}).json()
    assert (v1["version"], v2["version"]) == (1, 2)
    v1 = wait_ready(registry, "cifar", 1)
    v2 = wait_ready(registry, "cifar", 2)
    assert (v1["file_count"], v2["file_count"]) == (1, 2)
    assert v1["fingerprint"] != v2["fingerprint"]
    for method, body in (("PATCH", {"url": "s3://elsewhere"}), ("PATCH", {"size": 1}), ("PUT", {"x": 1}), ("DELETE", None)):
        r = registry.call(method, "/datasets/cifar/versions/1", "alice", body)
        assert r.status_code == 409, (method, body, r.text)
        assert "immutable" in r.json()["message"]
    again = registry.call("GET", "/datasets/cifar/versions/1", "bob").json()
    assert again["file_count"] == 1 and again["url"] == v1["url"] and again["fingerprint"] == v1["fingerprint"]
    d = registry.call("GET", "/datasets/cifar", "reader").json()
    assert d["versions"] == [1, 2] and [i["version"] for i in d["items"]] == [1, 2]
    assert registry.call("GET", "/datasets/cifar/versions/latest", "reader").json()["version"] == 2


def test_list_and_search_visible_to_all(registry):
    registry.storage_write("datasets/imagenet/x", b"1")
    registry.storage_write("users/bob/speech/y", b"1")
    registry.call("POST", "/datasets", "alice", {"name": "imagenet", "path": "datasets/imagenet", "description": "photos"})
    registry.call("POST", "/datasets", "bob", {"name": "speech", "path": "users/bob/speech", "description": "audio clips"})
    names = [d["name"] for d in registry.call("GET", "/datasets", "reader").json()["items"]]
    assert names == ["imagenet", "speech"]
    assert [d["name"] for d in registry.call("GET", "/datasets", "alice", q="audio").json()["items"]] == ["speech"]
    assert [d["name"] for d in registry.call("GET", "/datasets", "alice", q="IMAGE").json()["items"]] == ["imagenet"]
    assert registry.call("GET", "/datasets", None).status_code == 401


def test_scan_reports_progress_for_large_prefixes(registry):
    n = 2500
    if registry.kind == "s3":
        registry.fs.pipe({registry.storage.strip(f"{registry.storage.root()}/datasets/many/f{i:05d}"): b"ab" for i in range(n)})
    else:
        import os

        base = registry.storage.strip(f"{registry.storage.root()}/datasets/many")
        os.makedirs(base, exist_ok=True)
        for i in range(n):
            with open(f"{base}/f{i:05d}", "wb") as f:
                f.write(b"ab")
    seen = []
    orig = registry.registry.progress.__class__.__setitem__

    class Recording(dict):
        def __setitem__(self, k, v):
            seen.append(dict(v))
            orig(self, k, v)

    registry.registry.progress = Recording()
    r = registry.call("POST", "/datasets", "alice", {"name": "many", "path": "datasets/many", "wait": 0})
    assert r.status_code == 202 and r.json()["status"] == "pending"
    v = wait_ready(registry, "many", 1)
    assert v["status"] == "ready" and v["file_count"] == n and v["size"] == 2 * n
    assert seen and seen[-1] == {"files": n, "bytes": 2 * n}


@pytest.mark.parametrize("caller,path,status", [
    ("alice", "users/bob/data", 403),
    ("alice", "../outside", 403),
    ("alice", "/etc", 403),
    ("alice", "models", 403),
    ("reader", "datasets/ok", 403),
    ("alice", "datasets/empty-prefix", 404),
    ("admin", "users/bob/data", 201),
])
def test_who_may_register_what(registry, caller, path, status):
    registry.storage_write("users/bob/data/file", b"1")
    registry.storage_write("datasets/ok/file", b"1")
    registry.storage_write("models/m/v1/files/x", b"1")
    r = registry.call("POST", "/datasets", caller, {"name": "d", "path": path})
    assert r.status_code == status, r.text
    assert set(r.json()) >= {"status", "message"} if status >= 400 else r.json()["name"] == "d"


def test_only_owner_or_admin_adds_versions_and_deprecates(registry):
    registry.storage_write("datasets/shared/a", b"1")
    registry.call("POST", "/datasets", "alice", {"name": "shared", "path": "datasets/shared"})
    r = registry.call("POST", "/datasets", "bob", {"name": "shared", "path": "datasets/shared"})
    assert r.status_code == 403 and "belongs to alice" in r.json()["message"]
    r = registry.call("PATCH", "/datasets/shared/versions/1", "bob", {"deprecated": True})
    assert r.status_code == 403
    r = registry.call("PATCH", "/datasets/shared/versions/1", "alice", {"deprecated": True, "message": "use v2"})
    assert r.status_code == 200 and r.json()["deprecated"] and r.json()["deprecation_message"] == "use v2"
    assert registry.call("GET", "/datasets", "bob", deprecated="0").json()["items"] == []
    r = registry.call("PATCH", "/datasets/shared/versions/1", "admin", {"deprecated": False})
    assert r.status_code == 200 and not r.json()["deprecated"]
    assert registry.call("POST", "/datasets", "admin", {"name": "shared", "path": "datasets/shared"}).status_code in (201, 202)


def test_bad_requests(registry):
    assert registry.call("POST", "/datasets", "alice", {"name": "bad name!", "path": "datasets/x"}).status_code == 400
    assert registry.call("GET", "/datasets/nope", "alice").status_code == 404
    assert registry.call("GET", "/datasets/nope/versions/1", "alice").json() == {"status": 404, "message": "no dataset named 'nope'"}
