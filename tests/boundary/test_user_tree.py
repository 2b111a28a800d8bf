"""trainhub.boundary.files.UserTree: a user's folder used only through descriptors, as the user.

The rules without an attacker (the races are tests/boundary/test_hostile_swaps.py): no link is ever
followed, ``..`` and absolute paths are refused, a FIFO never blocks and a special file is never read,
what is written is the user's and lands atomically, and the component-by-component walk used where the
kernel lacks openat2 behaves the same."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from trainhub.boundary import files
from trainhub.boundary.files import TreeError, UserTree


@pytest.fixture(params=["openat2", "component-walk"])
def resolver(request, monkeypatch):
    if request.param == "component-walk":
        monkeypatch.setattr(files, "_openat2_works", False)
    return request.param


@pytest.fixture
def tree(tmp_path, resolver):
    root = tmp_path / "home"
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"a")
    (root / "sub" / "b.txt").write_bytes(b"bb")
    (root / "sub" / "deep" / "c.txt").write_bytes(b"ccc")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"secret")
    os.symlink(outside, root / "link-dir")
    os.symlink(outside / "secret.txt", root / "link-file")
    os.symlink(outside, root / "sub" / "deep" / "nested-link")
    with UserTree(root, None) as t:
        yield t


def test_a_walk_lists_regular_files_and_never_follows_a_link(tree):
    paths = [e.path for page in tree.walk() for e in page]
    assert paths == ["a.txt", "sub/b.txt", "sub/deep/c.txt"]
    assert [e.path for e in tree.files("sub")] == ["b.txt", "deep/c.txt"]
    assert [e.path for page in tree.walk(skip=("sub",)) for e in page] == ["a.txt"]
    assert tree.names("sub") == ["b.txt"] and tree.names("link-dir") == []


@pytest.mark.parametrize("rel", ["link-file", "link-dir/secret.txt", "sub/deep/nested-link/secret.txt"])
def test_no_open_goes_through_a_link(tree, tmp_path, rel):
    with pytest.raises(OSError):
        tree.open(rel)
    if "/" in rel:
        with pytest.raises(OSError):
            tree.write_bytes(rel, b"x")
    else:  # a write at a link's own name replaces the link (a rename in its folder), never writes through it
        tree.write_bytes(rel, b"x")
        assert not stat.S_ISLNK(tree.stat(rel).st_mode)
    assert (tmp_path / "outside" / "secret.txt").read_bytes() == b"secret"
    assert sorted(os.listdir(tmp_path / "outside")) == ["secret.txt"]


@pytest.mark.parametrize("rel", ["../outside/secret.txt", "/etc/passwd", "sub/../../x", "a\0b"])
def test_paths_that_leave_the_tree_are_refused(tree, rel):
    with pytest.raises(TreeError):
        tree.open(rel)


def test_a_fifo_never_blocks_and_special_files_are_not_read(tree):
    os.mkfifo(os.path.join(tree.root, "pipe"))
    done = threading.Event()

    def read():
        with pytest.raises(TreeError, match="not a regular file"):
            tree.open("pipe")
        done.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout=10)
    assert done.is_set(), "opening a FIFO blocked the thread"
    assert "pipe" not in [e.path for e in tree.files()]


def test_writes_are_atomic_and_make_their_folders(tree):
    tree.write_bytes("new/dir/file.bin", b"1234")
    assert tree.read_bytes("new/dir/file.bin", 10) == b"1234"
    with pytest.raises(TreeError, match="larger than 3 bytes"):
        tree.read_bytes("new/dir/file.bin", 3)
    src = os.open(os.path.join(tree.root, "sub", "b.txt"), os.O_RDONLY)
    try:
        assert tree.copy_in(src, "copied/b.txt") == 2
    finally:
        os.close(src)
    assert tree.read_bytes("copied/b.txt", 10) == b"bb"
    assert not [n for n in os.listdir(os.path.join(tree.root, "new", "dir")) if n.endswith(".tmp")]


def test_rmtree_removes_links_without_following_them(tree, tmp_path):
    removed = tree.rmtree("sub")
    assert removed == 5 and not os.path.exists(os.path.join(tree.root, "sub"))
    assert (tmp_path / "outside" / "secret.txt").read_bytes() == b"secret"
    tree.rmtree("link-dir")
    assert (tmp_path / "outside").is_dir()


def test_the_root_itself_must_not_be_a_link(tmp_path):
    os.symlink(tmp_path, tmp_path / "looped")
    with pytest.raises(OSError):
        UserTree(tmp_path / "looped", None)


def test_as_an_account_what_is_written_is_theirs_and_what_they_cannot_read_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("accounts need root")
    from trainhub.boundary.accounts import UserAccounts

    alice = UserAccounts().ensure("alice")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chown(home, alice.uid, alice.gid)
    (home / "roots.txt").write_bytes(b"root's")
    os.chmod(home / "roots.txt", 0o640)  # group root: refused too (no supplementary groups under the identity)
    with UserTree(home, alice) as t:
        t.write_bytes("mine/file.txt", b"hers")
        st = os.stat(home / "mine" / "file.txt")
        assert (st.st_uid, st.st_gid) == (alice.uid, alice.gid)
        assert os.stat(home / "mine").st_uid == alice.uid
        with pytest.raises(PermissionError):
            t.read_bytes("roots.txt", 100)
    assert os.getgroups() == [0] or 0 in os.getgroups() or os.getgroups() == []  # the thread's groups came back
    assert os.geteuid() == 0 and open(home / "roots.txt", "rb").read() == b"root's"
