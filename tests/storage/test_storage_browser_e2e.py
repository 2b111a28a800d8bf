"""The storage browser server extension inside real spawned servers of a real `trainhub up`:
the user's area (local folder and S3), the read-only datasets area, escapes, other users,
and the panel's proxy to the trainhub API."""

from __future__ import annotations

import json

import pytest
import requests

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", autouse=True)
def panel_installed():
    # what `trainhub up` / CI do (see docs/storage.md): servers of this environment load the extension
    from trainhub.extensions import install_labextension

    install_labextension()


class Browser:
    def __init__(self, platform, user, token=None):
        self.base = f"{platform.url}/user/{user}/trainhub"
        self.h = {"Authorization": f"token {token or platform.token(user)}"}

    def req(self, method, route, data=None, **params):
        return requests.request(method, f"{self.base}/{route}", params=params, data=data, headers=self.h, timeout=60)


@pytest.fixture(scope="module")
def alice(platform):
    platform.spawn("sb-alice", "cpu")
    platform.token("sb-bob")
    yield Browser(platform, "sb-alice")
    platform.stop_server("sb-alice")


def test_browse_upload_download_delete(platform, alice):
    r = alice.req("GET", "storage/areas")
    assert r.status_code == 200, r.text
    areas = {a["name"]: a for a in r.json()["areas"]}
    assert areas["home"]["url"].endswith("/users/sb-alice") and not areas["datasets"]["writable"]
    assert alice.req("PUT", "storage/files", data=b"hello", area="home", path="notes/a.txt").status_code == 201
    on_disk = platform.data_dir / "storage" / "users" / "sb-alice" / "notes" / "a.txt"
    assert on_disk.read_bytes() == b"hello"
    listing = alice.req("GET", "storage/list", area="home", path="notes").json()
    assert [(e["name"], e["size"]) for e in listing["entries"]] == [("a.txt", 5)]
    assert listing["entries"][0]["url"] == str(on_disk)
    assert alice.req("GET", "storage/preview", area="home", path="notes/a.txt").json()["text"] == "hello"
    assert alice.req("GET", "storage/files", area="home", path="notes/a.txt").content == b"hello"
    assert alice.req("DELETE", "storage/files", area="home", path="notes/a.txt").status_code == 204
    assert not on_disk.exists()


def test_escapes_and_datasets_read_only(platform, alice):
    bob_file = platform.data_dir / "storage" / "users" / "sb-bob" / "secret.txt"
    bob_file.parent.mkdir(parents=True, exist_ok=True)
    bob_file.write_text("bob's")
    (platform.data_dir / "storage" / "datasets" / "shared.txt").write_text("for all")
    for params, status in (({"path": "../sb-bob/secret.txt"}, 403), ({"path": str(bob_file)}, 403),
                           ({"area": "datasets", "path": "../users/sb-bob/secret.txt"}, 403)):
        r = alice.req("GET", "storage/files", **{"area": "home", **params})
        assert r.status_code == status, r.text
        assert r.json()["status"] == status and r.json()["message"]
    assert alice.req("GET", "storage/files", area="datasets", path="shared.txt").content == b"for all"
    r = alice.req("PUT", "storage/files", data=b"x", area="datasets", path="mine.txt")
    assert r.status_code == 403 and "read-only" in r.json()["message"]
    assert bob_file.read_text() == "bob's"


def test_other_users_cannot_use_the_server(platform, alice):
    bob = Browser(platform, "sb-alice", token=platform.token("sb-bob"))
    r = bob.req("GET", "storage/list", area="home")
    assert r.status_code in (401, 403, 404)
    r = requests.get(alice.base + "/storage/list", params={"area": "home"}, timeout=30, allow_redirects=False)
    assert r.status_code in (302, 401, 403)


def test_panel_proxy_reaches_the_registry_and_jobs(platform, alice):
    r = alice.req("GET", "api/models")
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"items", "total"}
    r = alice.req("GET", "api/jobs")
    assert r.status_code == 200 and "items" in r.json()
    r = alice.req("GET", "api/../../hub/api/users")
    assert r.status_code in (403, 404)
    r = alice.req("POST", "api/models", data=json.dumps({"name": "x"}))
    assert r.status_code == 400 and "give 'job'" in r.json()["message"]


# the server holds the user's own credentials (an admin's hook here: moto without IAM takes any key), never the
# platform's key (docs/storage.md, "Per-user credentials"; tests/storage/test_user_credentials.py)
S3_CONFIG = """
c.Spawner.poll_interval = 2
c.StorageConfig.user_credentials_hook = lambda username: {"key": "user-key-" + username, "secret": "user-secret"}
"""


def test_s3_storage_browser(platform_factory, s3_server):
    bucket = s3_server.make_bucket()
    p = platform_factory("sb-s3", storage=f"s3://{bucket}/team", env=s3_server.env, config=S3_CONFIG)
    try:
        p.spawn("s3-sue", "cpu")
        b = Browser(p, "s3-sue")
        fs = s3_server.filesystem()
        fs.pipe({f"{bucket}/team/users/s3-sue/data/f{i:04d}.bin": b"z" for i in range(1500)})
        fs.pipe(f"{bucket}/team/users/other/secret", b"no")
        first = b.req("GET", "storage/list", area="home", path="data", limit=1000).json()
        assert len(first["entries"]) == 1000 and first["next_after"]
        rest = b.req("GET", "storage/list", area="home", path="data", limit=1000, after=first["next_after"]).json()
        assert len(rest["entries"]) == 500 and rest["next_after"] is None
        assert first["entries"][0]["url"] == f"s3://{bucket}/team/users/s3-sue/data/f0000.bin"
        assert b.req("PUT", "storage/files", data=b"up", area="home", path="u.txt").status_code == 201
        assert fs.cat(f"{bucket}/team/users/s3-sue/u.txt") == b"up"
        r = b.req("GET", "storage/files", area="home", path=f"s3://{bucket}/team/users/other/secret")
        assert r.status_code == 403
        r = b.req("GET", "storage/files", area="home", path="../other/secret")
        assert r.status_code == 403
        assert b.req("PUT", "storage/files", data=b"x", area="datasets", path="x").status_code == 403
    finally:
        p.stop_all_servers()
        p.stop()
