"""Hostile-user tests of pattern 1 of issue 32: "a root process walks a user's files by path".

Every place where the platform (root) reads, lists, copies, writes or removes inside a folder a user
controls is attacked the way bob did it: a process of the user watches the folder with inotify and, at
the N-th open the platform causes there, swaps a folder (and a file) for a symbolic link to the
platform's secrets, to another user's folder or to a platform folder. Each path is run once per N (every
step of it, up to conftest.MAX_ROUNDS), with the user's identity and, where the platform has no accounts
(a sandbox-only install), with the platform's own identity: no secret, no other user's byte and no write
into a platform folder may ever result. A control shows the same attack does leak through a naive
by-path copy on this machine, so the attack is real.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from trainhub.boundary.files import UserTree

from swapkit import SECRET, SECRET_SIZE, Attacker, make_files

MODES = ["account", "no-accounts"]
LEGIT = {f"model/a{i:02d}.bin": bytes([65 + i]) * (100 + i) for i in range(12)}
LEGIT.update({"model/sub/w.bin": b"weights" * 50, "model/z.bin": b"last file"})


def _identity(mode, account):
    return account if mode == "account" else None


def _no_secret_under(folder: Path) -> None:
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            p = Path(dirpath, name)
            if p.is_symlink():
                continue
            data = p.read_bytes()
            assert SECRET not in data and len(data) != SECRET_SIZE, f"{p} holds the platform's secret"


def _reset(path: Path) -> None:
    if path.exists() or path.is_symlink():
        if path.is_symlink() or path.is_file():
            path.unlink()
        else:
            shutil.rmtree(path)


def _copy_by_path_as_before(src: str, dst: str) -> None:
    """The registry's copy before this fix (fsspec's walk, links dropped when listed, then copied by path as root)."""
    fs = LocalFileSystem()

    def pages():
        for root, dirs, files in fs.walk(src, detail=True):
            for name in [n for n, info in dirs.items() if info.get("islink")]:
                del dirs[name]
            yield [(info["name"][len(src):].lstrip("/")) for info in files.values() if not info.get("islink")]

    for _ in pages():  # first walk: count
        pass
    for page in pages():  # second walk: copy
        for rel in page:
            fs.makedirs(f"{dst}/{rel}".rsplit("/", 1)[0], exist_ok=True)
            fs.copy(f"{src}/{rel}", f"{dst}/{rel}")


def test_control_a_copy_by_path_as_root_leaks_under_this_attack(place, accounts, tmp_path):
    """The attack works here: the registry's old copy (listing, then copying by path as root) follows a folder
    swapped for a link during the copy into secrets/."""
    alice = accounts["alice"]
    many = {f"model/f{i:03d}.bin": b"x" * 10 for i in range(300)}
    leaked = False
    for at in (40, 80, 120, 160, 200):
        _reset(place.alice / "model")
        make_files(alice, place.alice, {**many, "model/zz/w.bin": b"w"})
        dst = tmp_path / "naive"
        _reset(dst)
        attacker = Attacker(alice, place.alice, {"model/zz": str(place.secrets)}, at=at)
        _copy_by_path_as_before(str(place.alice / "model"), str(dst))
        attacker.finish()
        if any(SECRET in p.read_bytes() for p in dst.rglob("*") if p.is_file()):
            leaked = True
            break
    assert leaked, "the swap never reached the old copy: this machine cannot show the attack"


@pytest.mark.parametrize("mode", MODES)
def test_model_registration_copies_nothing_from_outside_the_users_folder(place, accounts, attack, tmp_path, mode):
    """Registry: the copy of a registered folder (services/registry/files.py TreeSource + copy_tree)."""
    from trainhub.services.registry import files as fileops

    alice = accounts["alice"]
    dst = tmp_path / "models"
    fs = LocalFileSystem()

    def setup():
        _reset(place.alice / "model")
        _reset(dst)
        make_files(alice, place.alice, LEGIT)

    def operation():
        with UserTree(place.alice, _identity(mode, alice)) as tree:
            fileops.copy_tree(fileops.TreeSource(tree, "model"), fs, str(dst / "v1"), {})

    def check(error):
        assert error is None or isinstance(error, (fileops.SourceChanged, FileNotFoundError, PermissionError)), error
        if dst.exists():
            _no_secret_under(dst)
            for p in (dst / "v1" / "files").rglob("*"):
                if p.is_file():
                    rel = p.relative_to(dst / "v1" / "files").as_posix().replace(".moved", "")  # renamed aside
                    assert p.read_bytes() == LEGIT["model/" + rel]

    done = attack(alice, place.alice, {"model/sub": str(place.secrets), "model/z.bin": str(place.secrets / "admin-password")},
                  setup, operation, check)
    assert done


@pytest.mark.parametrize("mode", MODES)
def test_a_dataset_scan_never_counts_what_lies_outside(place, accounts, attack, mode):
    """Registry: the scan of a registered dataset walks only the user's folder."""
    from trainhub.services.registry import files as fileops

    alice = accounts["alice"]
    legit_size = sum(len(v) for v in LEGIT.values())
    results = []

    def setup():
        _reset(place.alice / "model")
        make_files(alice, place.alice, LEGIT)

    def operation():
        with UserTree(place.alice, _identity(mode, alice)) as tree:
            results.append(fileops.scan(fileops.TreeSource(tree, "model")))

    def check(error):
        assert error is None, error
        r = results[-1]
        assert r["size"] <= legit_size and r["file_count"] <= len(LEGIT), r

    attack(alice, place.alice, {"model/sub": str(place.secrets)}, setup, operation, check)


def _job_layout(place, alice, storage_root: Path, key: str):
    job_dir = place.root / "jobs" / key
    (job_dir / "attempt-1").mkdir(parents=True, exist_ok=True)
    (job_dir / "attempt-1" / "worker-0.log").write_bytes(b"a log line\n")
    outputs = job_dir / "outputs"
    outputs.mkdir(exist_ok=True)
    os.chown(outputs, alice.uid, alice.gid)
    area = storage_root / "users" / "alice"
    area.mkdir(parents=True, exist_ok=True)
    os.chown(area, alice.uid, alice.gid)
    os.chmod(area, 0o700)
    return job_dir, outputs, area


@pytest.mark.parametrize("mode", MODES)
def test_output_sync_reads_only_the_jobs_own_outputs(place, accounts, attack, mode):
    """Jobs: the output sync (services/jobs/outputs.py) from a job's outputs/ to the user's area."""
    from trainhub.boundary.asuser import AsUser
    from trainhub.services.jobs.outputs import OutputSyncer
    from trainhub.storage import StorageConfig

    alice = accounts["alice"]
    storage_root = place.root / "storage"
    job_dir, outputs, area = _job_layout(place, alice, storage_root, "j-000001")
    storage = StorageConfig(url=str(storage_root))
    syncer = OutputSyncer(storage, as_user=lambda user: AsUser(user, _identity(mode, accounts[user])))
    files = {k.removeprefix("model/"): v for k, v in LEGIT.items()}

    def setup():
        for child in list(outputs.iterdir()):
            _reset(child)
        _reset(area / "jobs")
        make_files(alice, outputs, files)

    def operation():
        syncer.sync("alice", "j-000001", str(job_dir), final=True)

    def check(error):
        assert error is None, error
        _no_secret_under(area)
        assert not list(place.platform.glob("**/*.bin"))

    attack(alice, outputs, {"sub": str(place.secrets), "z.bin": str(place.secrets / "admin-password")},
           setup, operation, check)


@pytest.mark.parametrize("mode", MODES)
def test_output_sync_never_writes_through_a_link_in_the_users_area(place, accounts, attack, mode):
    """Jobs: the write side of the sync: a folder of the destination swapped for a link to a platform folder."""
    from trainhub.boundary.asuser import AsUser
    from trainhub.services.jobs.outputs import OutputSyncer
    from trainhub.storage import StorageConfig

    alice = accounts["alice"]
    storage_root = place.root / "storage"
    job_dir, outputs, area = _job_layout(place, alice, storage_root, "j-000002")
    make_files(alice, outputs, {k.removeprefix("model/"): v for k, v in LEGIT.items()})
    storage = StorageConfig(url=str(storage_root))
    syncer = OutputSyncer(storage, as_user=lambda user: AsUser(user, _identity(mode, accounts[user])))
    before = sorted(p.name for p in place.platform.iterdir())

    def setup():
        _reset(area / "jobs")
        make_files(alice, area, {"jobs/j-000002/sub/.keep": b""})

    def operation():
        syncer.sync("alice", "j-000002", str(job_dir), final=True)

    def check(error):
        assert error is None, error
        assert sorted(p.name for p in place.platform.iterdir()) == before
        assert (place.platform / "keep.txt").read_bytes() == b"platform file"

    attack(alice, area, {"jobs/j-000002/sub": str(place.platform), "jobs/j-000002": str(place.platform)},
           setup, operation, check)


class _Isolation:
    """What AttemptEnv and storage_tree ask of the platform's isolation: each user's account."""

    def __init__(self, accounts):
        self.accounts = accounts

    def account(self, name):
        return self.accounts.get(name)


@pytest.mark.parametrize("mode", MODES)
def test_a_retry_is_offered_only_the_users_own_checkpoints(place, accounts, attack, mode):
    """Jobs: the checkpoint a retried attempt resumes from (services/jobs/attemptenv.py), listed in the user's area."""
    from types import SimpleNamespace

    from trainhub.services.jobs.attemptenv import AttemptEnv
    from trainhub.storage import StorageConfig

    alice = accounts["alice"]
    storage_root = place.root / "storage"
    area = storage_root / "users" / "alice"
    area.mkdir(parents=True, exist_ok=True)
    os.chown(area, alice.uid, alice.gid)
    (place.secrets / "step-999.pkl").write_bytes(SECRET)
    storage = StorageConfig(url=str(storage_root))
    launcher = SimpleNamespace(isolation=_Isolation(accounts) if mode == "account" else None)
    env = AttemptEnv(launcher, storage)
    url = f"{storage_root}/users/alice/jobs/j-000003"
    offered = []

    def setup():
        _reset(area / "jobs")
        make_files(alice, area, {"jobs/j-000003/checkpoints/step-1.pkl": b"one", "jobs/j-000003/checkpoints/step-2.pkl": b"two"})

    def operation():
        offered.append(env._latest_local(url))

    def check(error):
        assert error is None, error
        got = offered[-1]
        assert got is None or got.step in (1, 2), got

    attack(alice, area, {"jobs/j-000003/checkpoints": str(place.secrets)}, setup, operation, check)


@pytest.mark.parametrize("mode", MODES)
def test_the_kernel_startup_file_is_written_only_into_the_home(place, accounts, attack, mode):
    """Spawner: the IPython start-up file the hub writes into a home before each server start."""
    from trainhub.kernels.startup import install_into

    alice = accounts["alice"]
    before = sorted(p.name for p in place.platform.iterdir())

    def setup():
        _reset(place.alice / ".ipython")
        make_files(alice, place.alice, {".ipython/profile_default/startup/README": b"x"})

    def operation():
        with UserTree(place.alice, _identity(mode, alice)) as home:
            install_into(home)

    def check(error):
        assert error is None or isinstance(error, OSError), error
        assert sorted(p.name for p in place.platform.iterdir()) == before

    attack(alice, place.alice, {".ipython/profile_default/startup": str(place.platform),
                                ".ipython/profile_default": str(place.platform)}, setup, operation, check)


@pytest.mark.parametrize("mode", MODES)
def test_retention_removes_only_the_users_files(place, accounts, attack, mode):
    """Registry: the retention of old job outputs removes a folder of the user's area (UserTree.rmtree)."""
    alice = accounts["alice"]

    def setup():
        _reset(place.alice / "jobs")
        make_files(alice, place.alice, {"jobs/j-000004/a.bin": b"a", "jobs/j-000004/sub/b.bin": b"b",
                                        "jobs/j-000004/sub/deeper/c.bin": b"c"})

    def operation():
        with UserTree(place.alice, _identity(mode, alice)) as tree:
            tree.rmtree("jobs/j-000004")

    def check(error):
        assert error is None or isinstance(error, OSError), error
        assert (place.platform / "keep.txt").read_bytes() == b"platform file"
        assert (place.secrets / "admin-password").read_bytes() == SECRET

    attack(alice, place.alice, {"jobs/j-000004/sub": str(place.platform), "jobs/j-000004/sub/deeper": str(place.secrets)},
           setup, operation, check)


def test_handing_a_folder_over_to_an_account_never_follows_a_link(place, accounts, attack):
    """Accounts: a folder made before accounts is handed to the account (own_dir -> UserTree.chown_all); once a
    sub-folder is theirs the user can swap what is in it, and the walk must not follow."""
    from trainhub.boundary.accounts import own_dir

    alice = accounts["alice"]
    old = place.alice / "old"

    def setup():
        _reset(old)
        for rel in ("a/b/c", "a/d", "e"):
            (old / rel).mkdir(parents=True, exist_ok=True)
        for folder in [old, *old.rglob("*")]:
            os.chmod(folder, 0o755)
            (folder / "f.txt").write_bytes(b"f")
            os.chmod(folder / "f.txt", 0o644)

    def operation():
        own_dir(old, alice, 0o700)

    def check(error):
        assert error is None or isinstance(error, OSError), error
        for p in [place.platform, place.platform / "keep.txt", place.secrets, place.secrets / "admin-password"]:
            st = os.lstat(p)
            assert (st.st_uid, st.st_gid) == (0, 0), p

    attack(alice, old, {"a/b": str(place.platform), "a/d": str(place.secrets)}, setup, operation, check)


def test_securing_the_data_dir_never_enters_a_users_folder(place, accounts):
    """settings.secure_tree closes the platform's files; a folder of a user is never entered, whatever its name."""
    from trainhub.settings import secure_tree

    alice = accounts["alice"]
    jobs = place.root / "jobs" / "j-000005"
    jobs.mkdir(parents=True)
    make_files(alice, jobs, {"anything/db.sqlite": b"user data", "secret-looking/x.json": b"{}"})
    os.chown(jobs / "anything", alice.uid, alice.gid)
    for p in (jobs / "anything" / "db.sqlite", jobs / "secret-looking" / "x.json"):
        os.chmod(p, 0o644)
    (place.root / "platform.sqlite").write_bytes(b"")
    os.chmod(place.root / "platform.sqlite", 0o644)
    secure_tree(place.root)
    assert stat.S_IMODE(os.stat(jobs / "anything" / "db.sqlite").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(jobs / "secret-looking" / "x.json").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(place.root / "platform.sqlite").st_mode) == 0o600
