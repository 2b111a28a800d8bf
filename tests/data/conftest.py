"""Fixtures for trainhub.data tests.

- ``moto_server`` (session): the endpoint URL of the session's real ``moto_server`` (``s3_server`` of
  tests/conftest.py).
- ``s3_options`` (session): storage options (endpoint, dummy keys) for that server.
- ``s3_bucket``: a fresh bucket name per test (created), e.g. ``"t-3f2a..."``.
- ``s3fs_fs``: an ``s3fs.S3FileSystem`` for the server (listing cache off).
- ``make_samples``: factory writing ``n`` samples (``key.jpg`` + ``key.json``) under a folder
  or URL; returns ``{key: {ext: bytes}}``.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

ACCESS = {"key": "testing", "secret": "testing"}


@pytest.fixture(scope="session")
def moto_server(s3_server):
    """The session's one moto S3 server (tests/conftest.py's ``s3_server``): its endpoint URL."""
    return s3_server.endpoint


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
