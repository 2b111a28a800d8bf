"""Fixtures for the storage browser (the ``trainhub.extensions.storage`` server extension).

- ``storage_backend`` (session, parametrized ``local``/``s3``): a :class:`Backend` with a root
  URL (a temp folder, or a bucket on the session's real ``moto_server``), ``fs`` and
  ``path(rel)`` for seeding files.
- ``storage_server`` (session, per backend): a real ``jupyter server`` subprocess for user
  ``alice`` with the extension enabled and the spawner's storage environment; ``.get/.put/
  .delete/.post(route, **params)`` send token-authenticated requests (never raise on status).
"""

from __future__ import annotations

import subprocess

import pytest

from storageserver import Backend, start_storage_server


@pytest.fixture(scope="session", params=["local", "s3"])
def storage_backend(request, tmp_path_factory):
    if request.param == "local":
        import fsspec

        root = tmp_path_factory.mktemp("storage-root")
        for d in ("users/alice", "users/bob", "datasets"):
            (root / d).mkdir(parents=True)
        return Backend("local", str(root), fsspec.filesystem("file"), {}, {})
    s3 = request.getfixturevalue("s3_server")
    bucket = s3.make_bucket()
    fs = s3.filesystem()
    options = {"endpoint_url": s3.endpoint, "key": s3.key, "secret": s3.secret}
    b = Backend("s3", f"s3://{bucket}/platform", fs, options, s3.env)
    for d in ("users/alice", "users/bob", "datasets"):
        b.write(f"{d}/.keep", b"")
    return b


@pytest.fixture(scope="session")
def storage_server(storage_backend, tmp_path_factory):
    server = start_storage_server(storage_backend, tmp_path_factory.mktemp(f"jpserver-{storage_backend.kind}"))
    yield server
    server.proc.terminate()
    try:
        server.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.proc.kill()
