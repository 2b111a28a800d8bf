"""Storage areas end to end: `trainhub up --storage s3://...` against a real moto S3 server,
and the local-folder default (the user's area linked into the home as `storage`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KERNEL_S3 = r"""
import json, os, fsspec
url = os.environ["TRAINHUB_STORAGE_URL"]
opts = json.loads(os.environ["TRAINHUB_STORAGE_OPTIONS"])
fs, path = fsspec.core.url_to_fs(url, **opts)
fs.pipe(path + "/notes/hello.txt", b"written by the kernel")
print(json.dumps({
    "url": url, "datasets": os.environ["TRAINHUB_DATASETS_URL"], "opts": opts,
    "aws": {k: v for k, v in os.environ.items() if k.startswith("AWS_")},
    "read": fs.cat(path + "/notes/hello.txt").decode(), "protocol": type(fs).__name__,
    "datasets_listable": fs.exists(fsspec.core.strip_protocol(os.environ["TRAINHUB_DATASETS_URL"]) + "/.keep"),
}))
"""

KERNEL_LOCAL = r"""
import json, os
with open("storage/from-kernel.txt", "w") as f:
    f.write("local area")
print(json.dumps({"url": os.environ["TRAINHUB_STORAGE_URL"], "cwd": os.getcwd(),
                  "link": os.path.realpath("storage"), "datasets": os.path.realpath("datasets")}))
"""


# an admin's own per-user credentials (moto without IAM enforcement takes any key): what reaches the kernel is the
# user's, never the platform's (tests/storage/test_user_credentials.py checks minted ones against enforced IAM)
S3_CONFIG = """
c.Spawner.poll_interval = 2
c.StorageConfig.user_credentials_hook = lambda username: {"key": "user-key-" + username, "secret": "user-secret"}
"""


@pytest.fixture(scope="module")
def s3_platform(platform_factory, s3_server):
    bucket = s3_server.make_bucket()
    p = platform_factory("s3", storage=f"s3://{bucket}/team", env=s3_server.env, config=S3_CONFIG)
    p.bucket = bucket
    yield p
    if p.running:
        p.stop()


def test_s3_storage_reaches_the_kernel(s3_platform, s3_server):
    p = s3_platform
    fs = s3_server.filesystem()
    # `trainhub up` created the shared datasets/ prefix
    assert fs.exists(f"{p.bucket}/team/datasets/.keep")
    p.spawn("sue", "cpu")
    try:
        out = json.loads(p.kernel_exec("sue", KERNEL_S3).strip().splitlines()[-1])
    finally:
        p.stop_server("sue")
    assert out["url"] == f"s3://{p.bucket}/team/users/sue"
    assert out["datasets"] == f"s3://{p.bucket}/team/datasets"
    # one S3 key for everyone is gone: the kernel holds the user's credentials, not the platform's key
    assert out["opts"] == {"endpoint_url": s3_server.endpoint}
    assert s3_server.key not in out["aws"].values() and s3_server.secret not in out["aws"].values()
    assert out["aws"].get("AWS_ACCESS_KEY_ID") == "user-key-sue" or "AWS_CONFIG_FILE" in out["aws"]
    assert out["protocol"] == "S3FileSystem" and out["read"] == "written by the kernel"
    assert out["datasets_listable"]
    # the object really is in the bucket, in sue's area
    assert fs.cat(f"{p.bucket}/team/users/sue/notes/hello.txt") == b"written by the kernel"
    # no local link for object storage
    assert not os.path.lexists(p.data_dir / "homes" / "sue" / "storage")


def test_unreachable_storage_is_refused_before_start(tmp_path, s3_server):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, **s3_server.env)
    r = subprocess.run([sys.executable, "-m", "trainhub.cli", "up", "--data-dir", str(tmp_path / "d"), "--gpus", "1",
                        "--port", str(port), "--storage", "s3://no-such-bucket-here/x"],
                       capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    assert r.returncode == 1
    assert "storage s3://no-such-bucket-here/x is not usable" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "trainhub.cli", "up", "--data-dir", str(tmp_path / "d"), "--gpus", "1",
                        "--port", str(port), "--storage", "gs://bucket/x"],
                       capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    assert r.returncode == 1 and "local folder or s3://" in r.stderr


def test_local_storage_is_linked_into_the_home(platform):
    platform.spawn("lou", "cpu")
    try:
        out = json.loads(platform.kernel_exec("lou", KERNEL_LOCAL).strip().splitlines()[-1])
    finally:
        platform.stop_server("lou")
    area = (platform.data_dir / "storage" / "users" / "lou").resolve()
    assert out["url"] == str(area)
    assert out["link"] == str(area)
    assert out["datasets"] == str((platform.data_dir / "storage" / "datasets").resolve())
    assert (area / "from-kernel.txt").read_text() == "local area"
    assert os.path.islink(platform.data_dir / "homes" / "lou" / "storage")
