"""Fixtures for trainhub.data tests.

- ``moto_server`` (session): a real ``moto_server`` subprocess on a free loopback port;
  yields its endpoint URL; stopped at teardown.
- ``s3_options`` (session): storage options (endpoint, dummy keys) for that server.
- ``s3_bucket``: a fresh bucket name per test (created), e.g. ``"t-3f2a..."``.
- ``s3fs_fs``: an ``s3fs.S3FileSystem`` for the server (listing cache off).
- ``make_samples``: factory writing ``n`` samples (``key.jpg`` + ``key.json``) under a folder
  or URL; returns ``{key: {ext: bytes}}``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

ACCESS = {"key": "testing", "secret": "testing"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_server():
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    if not os.path.exists(exe):
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    port = _free_port()
    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"moto_server did not start on {url}")
            time.sleep(0.1)
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def s3_options(moto_server):
    return {"endpoint_url": moto_server, **ACCESS}


@pytest.fixture
def s3fs_fs(s3_options):
    import s3fs

    return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True, **s3_options)


@pytest.fixture
def s3_bucket(s3fs_fs):
    name = "t-" + uuid.uuid4().hex[:12]
    s3fs_fs.mkdir(name)
    return name


@pytest.fixture
def make_samples():
    import fsspec

    def make(url: str, n: int, storage_options: dict | None = None, size: int = 1000, prefix: str = "s"):
        fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        if "://" not in url:
            os.makedirs(root, exist_ok=True)
        expected = {}
        blobs = {}
        for i in range(n):
            key = f"{prefix}{i:05d}"
            jpg = (f"{key}:".encode() * (size // 7 + 1))[:size]
            meta = json.dumps({"i": i}).encode()
            expected[key] = {"jpg": jpg, "json": meta}
            blobs[f"{root}/{key}.jpg"] = jpg
            blobs[f"{root}/{key}.json"] = meta
        fs.pipe(blobs)
        return expected

    return make
