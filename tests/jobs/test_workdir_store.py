"""Where the jobs service keeps working directories (services/jobs/workdirs.py): written as they arrive, checked
before they are kept, one user's own, bounded, removed once no job still to run names them. No HTTP here: the
route is exercised end to end in tests/jobs/test_workdir_e2e.py."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile

import pytest

from trainhub import workdir as wd
from trainhub.exceptions import InvalidRequest, TooLarge
from trainhub.services.jobs.workdirs import WorkdirStore


def packed(tmp_path, files: dict) -> bytes:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    for name, text in files.items():
        (src / name).write_text(text)
    snap = wd.snapshot(src)
    return snap.archive.read()


def send(store, user, data: bytes, sha: str | None = None, piece: int = 100):
    up = store.receive(user, sha or hashlib.sha256(data).hexdigest())
    for i in range(0, len(data), piece):
        up.write(data[i:i + piece])
    return up.finish()


def leftovers(store) -> list[str]:
    return [n for _, _, names in os.walk(store.root) for n in names if n.endswith(".part")]


def test_an_archive_is_kept_under_its_hash_for_its_user_only(tmp_path):
    store = WorkdirStore(tmp_path / "store")
    data = packed(tmp_path, {"a.py": "x = 1\n", "b.txt": "hi\n"})
    sha = hashlib.sha256(data).hexdigest()
    info = send(store, "alice", data)
    assert (info.sha256, info.files, info.bytes, info.size) == (sha, 2, 9, len(data))
    assert store.info("alice", sha).to_dict() == info.to_dict()
    assert store.info("bob", sha) is None  # another user's job cannot name it
    assert oct(os.stat(store.root).st_mode & 0o777) == "0o700" and leftovers(store) == []


@pytest.mark.parametrize("make, error, words", [
    (lambda data: (data, "0" * 64), InvalidRequest, "SHA-256 is"),
    (lambda data: (b"not a tar.gz", None), InvalidRequest, "not a .tar.gz"),
    (lambda data: (_evil(), None), InvalidRequest, "leaves the folder"),
])
def test_what_does_not_hash_to_its_name_or_would_not_unpack_is_refused_and_not_kept(tmp_path, make, error, words):
    store = WorkdirStore(tmp_path / "store")
    data, sha = make(packed(tmp_path, {"a.py": ""}))
    with pytest.raises(error, match=words):
        send(store, "alice", data, sha)
    assert list((tmp_path / "store").rglob("*.tar.gz")) == [] and leftovers(store) == []


def _evil() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("../../escape.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    return gzip.compress(raw.getvalue())


def test_an_upload_past_the_limits_is_dropped_as_it_arrives(tmp_path):
    store = WorkdirStore(tmp_path / "store", wd.Limits(max_bytes=1000, max_files=2))
    up = store.receive("alice", "a" * 64)
    chunk = os.urandom(4096)
    for _ in range(store.limits.archive_bytes // len(chunk) + 2):
        up.write(chunk)
    assert up.too_big and up.fd < 0 and not up.tmp.exists()  # nothing more is written, nothing kept
    with pytest.raises(TooLarge, match="larger than"):
        up.finish()


def test_archives_no_job_still_to_run_names_are_removed_after_a_while(tmp_path):
    store = WorkdirStore(tmp_path / "store", keep=100)
    old_kept = send(store, "alice", packed(tmp_path, {"a.py": "1"}))
    old_gone = send(store, "alice", packed(tmp_path, {"a.py": "2"}))
    recent = send(store, "alice", packed(tmp_path, {"a.py": "3"}))
    now = os.stat(store.path("alice", recent.sha256)).st_mtime
    for info in (old_kept, old_gone):
        os.utime(store.path("alice", info.sha256), (now - 500, now - 500))
    removed = store.prune("alice", keep={old_kept.sha256}, now=now)
    assert removed == [f"{old_gone.sha256}.tar.gz"]
    assert store.exists("alice", old_kept.sha256) and store.exists("alice", recent.sha256)
    assert not store.exists("alice", old_gone.sha256) and store.info("alice", old_gone.sha256) is None


def test_a_name_that_is_not_a_hash_is_refused(tmp_path):
    store = WorkdirStore(tmp_path / "store")
    for bad in ("../../etc/passwd", "A" * 64, "abc"):
        with pytest.raises(InvalidRequest, match="SHA-256"):
            store.receive("alice", bad)
