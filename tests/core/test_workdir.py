"""A job's working directory (trainhub.workdir): ignore rules, limits, packing, and the unpacking's refusals.

Pure or on temporary folders; no service. The unpacking is checked through both sinks the platform uses: a plain
``DirSink`` (a Kubernetes pod's folder) and a ``UserTree`` (the local launcher writes as the user, by descriptors).
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile

import pytest

from trainhub import workdir as wd
from trainhub.boundary.files import UserTree


# -- ignore rules ------------------------------------------------------------------------------------
@pytest.mark.parametrize("patterns, path, is_dir, ignored", [
    (["*.log"], "a.log", False, True),
    (["*.log"], "deep/down/a.log", False, True),
    (["*.log", "!keep.log"], "deep/keep.log", False, False),
    (["build/"], "build", True, True),
    (["build/"], "build", False, False),  # a file named build: only folders match "build/"
    (["build/"], "src/build", True, True),
    (["/build"], "src/build", True, False),  # anchored to the file's folder
    (["/build"], "build", True, True),
    (["docs/*.md"], "docs/a.md", False, True),
    (["docs/*.md"], "docs/sub/a.md", False, False),  # * never crosses a folder
    (["docs/**/*.md"], "docs/sub/deeper/a.md", False, True),
    (["docs/**/*.md"], "docs/a.md", False, True),
    (["**/cache"], "a/b/cache", True, True),
    (["logs/**"], "logs/x/y.txt", False, True),
    (["data?.csv"], "data1.csv", False, True),
    (["data[0-9].csv"], "dataX.csv", False, False),
    (["# a comment", "", "\\#hash"], "#hash", False, True),
    (["*.pt", "!best.pt", "best.pt"], "best.pt", False, True),  # the last pattern that matches decides
])
def test_ignore_rules_follow_gitignore(patterns, path, is_dir, ignored):
    assert wd.IgnoreRules(wd.parse_patterns(patterns)).ignored(path, is_dir) is ignored


def test_patterns_of_a_nested_ignore_file_apply_below_its_folder_only():
    rules = wd.IgnoreRules(wd.parse_patterns(["/out", "*.tmp"], base="sub"))
    assert rules.ignored("sub/out", True) and rules.ignored("sub/x/y.tmp", False)
    assert not rules.ignored("out", True) and not rules.ignored("y.tmp", False)


# -- scanning ------------------------------------------------------------------------------------------
def make_tree(root, files: dict):
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())


def paths(listing) -> set[str]:
    return {i.path for i in listing.items}


def test_scan_leaves_out_what_the_rules_say_and_never_follows_a_link(tmp_path):
    src = tmp_path / "proj"
    make_tree(src, {
        "train.py": "print(1)\n", "datautils.py": "X = 1\n", "pkg/__init__.py": "", "pkg/m.py": "",
        ".git/config": "[core]\n", ".venv/bin/python": "", "__pycache__/train.cpython-311.pyc": "", "pkg/m.pyc": "",
        ".env": "A=1\n",  # hidden files are sent, hidden folders are not
        ".gitignore": "runs/\n*.ckpt\n", "runs/1/events": "x", "model.ckpt": "x",
        "data/.gitignore": "*.csv\n!small.csv\n", "data/big.csv": "x", "data/small.csv": "a,b\n",
        ".trainhubignore": "notes/\n!model.ckpt\n", "notes/todo.txt": "",
        "secret/key": "k",
    })
    (src / "inside").symlink_to("pkg/m.py")
    (src / "storage").symlink_to(tmp_path)  # the home's link to the user's area: never followed
    (src / "escape").symlink_to("../outside")
    os.mkfifo(src / "pipe")
    listing = wd.scan(src, exclude=["secret/"])
    assert paths(listing) == {"train.py", "datautils.py", "pkg", "pkg/__init__.py", "pkg/m.py", ".env", ".gitignore",
                              ".trainhubignore", "model.ckpt", "data", "data/.gitignore", "data/small.csv", "inside"}
    assert {"storage", "escape", "pipe"} <= set(listing.skipped)
    assert "outside the folder" in listing.skipped["storage"]
    assert next(i for i in listing.items if i.path == "inside").target == "pkg/m.py"


def test_a_folder_over_the_byte_limit_is_refused_naming_what_weighs_most_and_how_to_leave_it_out(tmp_path):
    src = tmp_path / "proj"
    make_tree(src, {"train.py": "print(1)\n", "data/a.bin": b"x" * 6000, "data/b.bin": b"x" * 5000,
                    "weights.pt": b"x" * 3000})
    with pytest.raises(wd.WorkdirTooBig) as e:
        wd.scan(src, limits=wd.Limits(max_bytes=8000))
    message = str(e.value)
    assert e.value.biggest[0][:2] == ("data/", 11000) and "weights.pt" in [p for p, _, _ in e.value.biggest]
    assert "10.7 KB" in message and "data/" in message and "weights.pt" in message
    assert str(src / ".trainhubignore") in message and "--exclude data/" in message and "--no-workdir" in message
    # leaving it out makes it fit
    assert wd.scan(src, exclude=["data/"], limits=wd.Limits(max_bytes=8000)).bytes == 3009


def test_a_folder_over_the_entry_limit_is_refused(tmp_path):
    make_tree(tmp_path, {f"many/{i}.txt": "" for i in range(30)})
    with pytest.raises(wd.WorkdirTooBig) as e:
        wd.scan(tmp_path, limits=wd.Limits(max_files=10))
    assert "many/" in str(e.value) and "10 entries" in str(e.value)


def test_a_huge_folder_is_not_walked_to_the_end(tmp_path):
    make_tree(tmp_path, {f"d{i}/f.txt": "" for i in range(50)})
    with pytest.raises(wd.WorkdirTooBig) as e:
        wd.scan(tmp_path, limits=wd.Limits(max_files=2))
    assert "at least" in str(e.value)  # it stopped once it knew enough (SCAN_LIMIT_FACTOR times the limit)


def test_not_a_folder(tmp_path):
    with pytest.raises(wd.WorkdirError, match="cannot send"):
        wd.scan(tmp_path / "missing")


# -- packing and unpacking ----------------------------------------------------------------------------
def test_the_same_folder_packs_to_the_same_bytes_and_unpacks_to_the_same_tree(tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"train.py": "print(1)\n", "pkg/m.py": "X = 2\n", "run.sh": "#!/bin/sh\necho hi\n"})
    (src / "run.sh").chmod(0o755)
    (src / "alias.py").symlink_to("pkg/m.py")
    a, b = wd.snapshot(src), wd.snapshot(src)
    assert a.sha256 == b.sha256 and a.files == 3 and a.entries == 5 and a.bytes == 33
    (src / "pkg/m.py").write_text("X = 3\n")
    assert wd.snapshot(src).sha256 != a.sha256
    with wd.DirSink(tmp_path / "out") as sink:
        got = wd.unpack(a.archive, sink)
    out = tmp_path / "out"
    assert (got.files, got.bytes) == (3, 33)
    assert (out / "pkg/m.py").read_text() == "X = 2\n" and os.readlink(out / "alias.py") == "pkg/m.py"
    assert os.stat(out / "run.sh").st_mode & 0o100 and not os.stat(out / "train.py").st_mode & 0o100


def test_a_files_size_is_taken_when_it_is_packed(tmp_path):
    """The archive holds what each file held when it was opened for the pack, not what the scan saw before."""
    make_tree(tmp_path, {"shrinks.txt": "abc"})
    listing = wd.scan(tmp_path)
    (tmp_path / "shrinks.txt").write_text("")
    out = io.BytesIO()
    wd.pack(listing, out)
    out.seek(0)
    assert wd.check_archive(out).bytes == 0 and listing.items[0].size == 0


# -- refusals -------------------------------------------------------------------------------------------
def archive(*entries) -> io.BytesIO:
    """A .tar.gz built by hand: entries are (name, type, data-or-linkname)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = payload
                tar.addfile(info)
            elif kind == tarfile.REGTYPE:
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            else:
                tar.addfile(info)
    return io.BytesIO(gzip.compress(raw.getvalue()))


F, D, L, H = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE


@pytest.mark.parametrize("entries, why", [
    ([("../evil.py", F, b"x")], "leaves the folder"),
    (([("ok/../../evil.py", F, b"x")]), "leaves the folder"),
    ([("/etc/evil", F, b"x")], "absolute path"),
    ([("lnk", L, "/etc")], "link that leaves the folder"),
    ([("sub/lnk", L, "../../etc")], "link that leaves the folder"),
    ([("lnk", L, "sub"), ("sub", D, None), ("lnk/x", F, b"x")], "below a link"),
    ([("a", F, b"x"), ("hard", H, "a")], "hard link"),
    ([("dev", tarfile.CHRTYPE, None)], "not a file, folder or link"),
    ([("fifo", tarfile.FIFOTYPE, None)], "not a file, folder or link"),
    ([("a", F, b"x"), ("a", F, b"y")], "twice"),
    ([("big", F, b"x" * 2000)], "more than 1000 bytes"),
    ([(f"f{i}", F, b"") for i in range(6)], "more than 5 entries"),
])
@pytest.mark.parametrize("sink_kind", ["dir", "user-tree"])
def test_unpacking_refuses_what_could_leave_the_folder_or_exhaust_the_machine(tmp_path, entries, why, sink_kind):
    dest = tmp_path / "dest"
    dest.mkdir()
    (tmp_path / "outside").mkdir()
    limits = wd.Limits(max_bytes=1000, max_files=5)
    with pytest.raises(wd.WorkdirError, match=why):
        wd.check_archive(archive(*entries), limits)
    sink = wd.DirSink(dest) if sink_kind == "dir" else UserTree(dest, None)
    try:
        with pytest.raises(wd.WorkdirError, match=why):
            wd.unpack(archive(*entries), sink, limits)
    finally:
        sink.close()
    assert not os.path.exists(tmp_path / "evil.py") and not list((tmp_path / "outside").iterdir())
    assert not os.path.exists("/etc/evil")


def test_what_is_not_a_tar_gz_is_refused():
    with pytest.raises(wd.WorkdirError, match="not a .tar.gz|damaged"):
        wd.check_archive(io.BytesIO(b"PK\x03\x04 a zip, not a tar.gz"))


def test_a_small_archive_that_unpacks_to_much_more_than_the_limits_allow_is_refused_while_it_is_read():
    """A gzip bomb hidden in a header (a pax header may be of any length): the decompressed stream is bounded by
    the limits, so reading it stops early instead of holding gigabytes."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a")
        info.pax_headers = {"comment": "x" * (4 << 20)}
        tar.addfile(info, io.BytesIO(b""))
    bomb = gzip.compress(raw.getvalue())
    assert len(bomb) < 64 << 10
    with pytest.raises(wd.WorkdirError, match="unpacks to more than"):
        wd.check_archive(io.BytesIO(bomb), wd.Limits(max_bytes=1000, max_files=5))


def test_the_module_runs_alone_as_the_kubernetes_pods_run_it(tmp_path):
    """The pods get the module's source (their image need not have trainhub): it must need nothing but the standard
    library, and unpack a plain path too."""
    import subprocess
    import sys

    src = tmp_path / "src"
    make_tree(src, {"datautils.py": "X = 1\n"})
    snap = wd.snapshot(src)
    (tmp_path / "a.tar.gz").write_bytes(snap.archive.read())
    code = open(wd.__file__).read()
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, "unpack", f"file://{tmp_path}/a.tar.gz",
                          str(tmp_path / "pod"), "1000", "10"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "pod/datautils.py").read_text() == "X = 1\n" and "1 files" in out.stderr
    bad = subprocess.run([sys.executable, "-I", "-S", "-c", code, "unpack", f"file://{tmp_path}/a.tar.gz",
                          str(tmp_path / "pod2"), "2", "10"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "could not be unpacked" in bad.stderr
