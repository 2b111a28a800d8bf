"""The storage browser extension against a local folder and a real S3 API (moto): listing,
paging, preview, upload, download, delete, the read-only datasets area, and every escape."""

from __future__ import annotations

import os

import pytest


def test_areas(storage_server):
    r = storage_server.get("storage/areas")
    assert r.status_code == 200
    areas = {a["name"]: a for a in r.json()["areas"]}
    assert areas["home"]["writable"] is True and areas["home"]["url"].endswith("/users/alice")
    assert areas["datasets"]["writable"] is False


def test_unauthenticated_is_refused(storage_server):
    r = storage_server.request("GET", "storage/list", token=None, area="home")
    assert r.status_code in (401, 403)
    r = storage_server.request("GET", "storage/list", token="wrong", area="home")
    assert r.status_code in (401, 403)


def test_list_pages_in_order_with_folders(storage_server):
    b = storage_server.backend
    for i in range(23):
        b.write(f"users/alice/paged/f{i:03d}.txt", b"%d" % i)
    b.write("users/alice/paged/sub/inner.txt", b"inner")
    entries = storage_server.list_all(path="paged", limit=7)
    names = [e["name"] for e in entries]
    assert names == sorted(names) and len(names) == 24 and len(set(names)) == 24
    sub = [e for e in entries if e["name"] == "sub"]
    assert sub and sub[0]["type"] == "directory" and sub[0]["path"] == "paged/sub"
    f0 = next(e for e in entries if e["name"] == "f000.txt")
    assert f0["type"] == "file" and f0["size"] == 1 and f0["path"] == "paged/f000.txt"
    assert f0["url"].endswith("/users/alice/paged/f000.txt") and f0["modified"]
    inner = storage_server.list_all(path="paged/sub")
    assert [e["path"] for e in inner] == ["paged/sub/inner.txt"]


def test_list_more_than_one_s3_page(storage_server):
    b = storage_server.backend
    if b.kind == "s3":
        b.fs.pipe({b.path(f"users/alice/big/k{i:05d}"): b"" for i in range(1205)})
    else:
        os.makedirs(b.path("users/alice/big"), exist_ok=True)
        for i in range(1205):
            open(b.path(f"users/alice/big/k{i:05d}"), "wb").close()
    r = storage_server.get("storage/list", area="home", path="big", limit=1100)
    body = r.json()
    assert len(body["entries"]) == 1100 and body["next_after"]
    rest = storage_server.get("storage/list", area="home", path="big", limit=1100, after=body["next_after"]).json()
    assert len(rest["entries"]) == 105 and rest["next_after"] is None
    assert rest["entries"][-1]["name"] == "k01204"


def test_missing_folder_is_404(storage_server):
    r = storage_server.get("storage/list", area="home", path="no/such/folder")
    assert r.status_code == 404
    assert r.json() == {"status": 404, "message": "no folder 'no/such/folder' in home/"}


def test_preview_text_binary_image(storage_server):
    b = storage_server.backend
    b.write("users/alice/pv/readme.md", "héllo\nworld".encode())
    b.write("users/alice/pv/blob.bin", bytes(range(256)) * 4)
    b.write("users/alice/pv/pic.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    b.write("users/alice/pv/large.txt", b"a" * 200_000)
    t = storage_server.get("storage/preview", area="home", path="pv/readme.md").json()
    assert t["kind"] == "text" and t["text"] == "héllo\nworld" and t["truncated"] is False
    assert storage_server.get("storage/preview", area="home", path="pv/blob.bin").json()["kind"] == "binary"
    assert storage_server.get("storage/preview", area="home", path="pv/pic.png").json()["kind"] == "image"
    big = storage_server.get("storage/preview", area="home", path="pv/large.txt").json()
    assert big["truncated"] is True and len(big["text"]) == 64 * 1024 and big["size"] == 200_000


def test_upload_download_delete(storage_server):
    data = os.urandom(300_000)
    r = storage_server.put("storage/files", data, area="home", path="up/dir/model.bin")
    assert r.status_code == 201, r.text
    assert r.json()["path"] == "up/dir/model.bin" and r.json()["size"] == len(data)
    r = storage_server.get("storage/files", area="home", path="up/dir/model.bin")
    assert r.status_code == 200 and r.content == data
    assert 'filename="model.bin"' in r.headers["Content-Disposition"]
    r = storage_server.delete("storage/files", area="home", path="up")
    assert r.status_code == 400 and "recursive=1" in r.json()["message"]
    assert storage_server.delete("storage/files", area="home", path="up/dir/model.bin").status_code == 204
    assert storage_server.get("storage/files", area="home", path="up/dir/model.bin").status_code == 404
    storage_server.put("storage/files", b"1", area="home", path="up2/a/b.txt")
    assert storage_server.delete("storage/files", area="home", path="up2", recursive=1).status_code == 204
    assert storage_server.get("storage/list", area="home", path="up2").status_code == 404
    # the area itself, however it is spelled, is never deleted
    storage_server.put("storage/files", b"k", area="home", path="keep/me.txt")
    for root in ("", "/", ".", "./", "./.", "keep/.."):
        r = storage_server.delete("storage/files", area="home", path=root, recursive=1)
        assert r.status_code == 403, (root, r.text)
    assert storage_server.get("storage/files", area="home", path="keep/me.txt").content == b"k"


def test_make_folder(storage_server):
    assert storage_server.post("storage/folders", area="home", path="newdir").status_code == 201
    names = [e["name"] for e in storage_server.list_all()]
    assert "newdir" in names


def test_a_file_in_the_way_or_a_name_too_long_is_a_clear_4xx(storage_server):
    assert storage_server.put("storage/files", b"f", area="home", path="way/file.txt").status_code == 201
    local = storage_server.backend.kind == "local"
    r = storage_server.post("storage/folders", area="home", path="way/file.txt")
    if local:  # object stores let a prefix and an object share a name
        assert r.status_code == 409 and "a file is in the way" in r.json()["message"], r.text
        r = storage_server.put("storage/files", b"x", area="home", path="way/file.txt/inner.txt")
        assert r.status_code == 409 and "a file is in the way" in r.json()["message"], r.text
    storage_server.post("storage/folders", area="home", path="way/dir")
    if local:
        r = storage_server.put("storage/files", b"x", area="home", path="way/dir")
        assert r.status_code == 409 and "is a folder" in r.json()["message"], r.text
    r = storage_server.put("storage/files", b"x", area="home", path="way/" + "n" * 256)
    assert r.status_code == 400 and "at most 255 bytes" in r.json()["message"], r.text
    r = storage_server.get("storage/list", area="home", path="/".join(["d" * 100] * 11))
    assert r.status_code == 400 and "at most 1024" in r.json()["message"], r.text
    assert storage_server.get("storage/files", area="home", path="way/file.txt").content == b"f"


def test_an_upload_past_the_limit_is_refused_and_writes_nothing(storage_server):
    r = storage_server.put("storage/files", b"z" * 1_000_001, area="home", path="big/upload.bin")
    assert r.status_code == 413 and "at most 1,000,000" in r.json()["message"], r.text
    assert storage_server.get("storage/files", area="home", path="big/upload.bin").status_code == 404


def test_datasets_area_is_read_only(storage_server):
    b = storage_server.backend
    b.write("datasets/mnist/train-0.tar", b"shard")
    entries = storage_server.list_all(area="datasets")
    assert [e["name"] for e in entries] == ["mnist"]
    r = storage_server.get("storage/files", area="datasets", path="mnist/train-0.tar")
    assert r.status_code == 200 and r.content == b"shard"
    r = storage_server.put("storage/files", b"evil", area="datasets", path="mnist/evil.txt")
    assert r.status_code == 403 and "read-only" in r.json()["message"]
    r = storage_server.delete("storage/files", area="datasets", path="mnist/train-0.tar")
    assert r.status_code == 403
    assert storage_server.post("storage/folders", area="datasets", path="x").status_code == 403
    assert b.fs.exists(b.path("datasets/mnist/train-0.tar"))


ESCAPES = [
    ("storage/list", {"area": "home", "path": "../bob"}, 403, "'..' is not allowed"),
    ("storage/list", {"area": "home", "path": "a/../../bob"}, 403, "'..' is not allowed"),
    ("storage/list", {"area": "datasets", "path": "../users/bob"}, 403, "'..' is not allowed"),
    ("storage/preview", {"area": "home", "path": "/etc/passwd"}, 403, "absolute paths"),
    ("storage/files", {"area": "home", "path": "/etc/passwd"}, 403, "absolute paths"),
    ("storage/files", {"area": "home", "path": "s3://other-bucket/users/bob/secret"}, 403, "absolute paths"),
    ("storage/files", {"area": "home", "path": "file:///etc/passwd"}, 403, "absolute paths"),
    ("storage/list", {"area": "users", "path": "bob"}, 400, "unknown storage area"),
    ("storage/list", {"area": "home", "path": "", "after": "../../bob/z"}, 403, "'..' is not allowed"),
    ("storage/list", {"area": "home", "path": "..\\bob"}, 403, "'..' is not allowed"),
]


@pytest.mark.parametrize("route,params,status,message", ESCAPES)
def test_escapes_refused_with_clear_json_error(storage_server, route, params, status, message):
    storage_server.backend.write("users/bob/secret.txt", b"bob's")
    r = storage_server.get(route, **params)
    assert r.status_code == status, r.text
    body = r.json()
    assert body["status"] == status and message in body["message"]


@pytest.mark.parametrize("method", ["PUT", "DELETE"])
def test_writes_outside_the_area_refused(storage_server, method):
    b = storage_server.backend
    b.write("users/bob/keep.txt", b"bob's")
    r = storage_server.request(method, "storage/files", data=b"x" if method == "PUT" else None, area="home",
                               path="../bob/keep.txt")
    assert r.status_code == 403
    assert b.fs.cat(b.path("users/bob/keep.txt")) == b"bob's"


def test_symlink_escape_refused(storage_server):
    b = storage_server.backend
    if b.kind != "local":
        pytest.skip("object stores have no symbolic links")
    b.write("users/bob/private/secret.txt", b"bob's")
    link = b.path("users/alice/to-bob")
    if not os.path.islink(link):
        os.symlink(b.path("users/bob/private"), link)
    for route in ("storage/list", "storage/preview", "storage/files"):
        path = "to-bob" if route == "storage/list" else "to-bob/secret.txt"
        r = storage_server.get(route, area="home", path=path)
        assert r.status_code == 403, (route, r.text)
        assert "leaves your storage area" in r.json()["message"]
    r = storage_server.put("storage/files", b"x", area="home", path="to-bob/planted.txt")
    assert r.status_code == 403
    assert not os.path.exists(b.path("users/bob/private/planted.txt"))


def test_api_proxy_without_api_configured(storage_server):
    r = storage_server.get("api/models")
    assert r.status_code == 503 and "TRAINHUB_API_URL" in r.json()["message"]


@pytest.mark.parametrize("method, route, status, allow", [
    ("POST", "storage/areas", 405, "GET, OPTIONS"),
    ("PATCH", "storage/files", 405, "GET, DELETE, PUT, OPTIONS"),
    ("GET", "storage/nothing-here", 404, None),
    ("DELETE", "culler/elsewhere", 404, None),
])
def test_errors_are_json_with_allow_on_405(storage_server, method, route, status, allow):
    """Every answer of the extension's routes is JSON ``{"status", "message"}``; a 405 names the route's methods."""
    r = storage_server.request(method, route, area="home", path="x")
    assert r.status_code == status and r.headers["Content-Type"].startswith("application/json")
    assert r.json()["status"] == status and r.json()["message"]
    assert r.headers.get("Allow") == allow
