"""A user's folder, touched by the platform as that user, through directory descriptors, never by path.

The platform (root) reads, lists, copies and writes inside folders a user controls: the output sync of
a job, a model's registration, a checkpoint found for a retry, the kernel start-up file put into a home,
the retention of old outputs. A hostile user owns those folders and can change them at any moment: swap
a sub-folder for a symbolic link to the platform's secrets between a listing and a copy, watching the
platform's opens with inotify. Three rules make every access here safe by construction, not by a
check that could be raced:

1. **The user's identity.** Every system call runs with the user's file identity on the calling thread
   (:func:`~trainhub.boundary.accounts.fs_identity`: fsuid/fsgid of the account, supplementary groups
   cleared): the kernel refuses whatever the user could not open or change themselves.
2. **No name is resolved twice.** The root is opened once; every name below it is opened relative to
   its parent's descriptor with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
   RESOLVE_NO_XDEV)``, or, where the kernel lacks ``openat2``, one component at a time with
   ``O_NOFOLLOW``. A symbolic link anywhere on the way fails the open (``ELOOP``); it is never followed.
   A walk descends through the descriptors it opened, so a folder swapped after it was listed is either
   the folder that was opened or not walked at all.
3. **Only regular files and folders.** Files are opened ``O_NONBLOCK`` and checked with ``fstat``: a FIFO
   never blocks a platform thread, a device or socket is never read; sizes are bounded by the caller.

Everything here is blocking (call it on a worker thread); the identity is held only inside each call,
never across a ``yield``, so code between the pages of a walk runs as the platform again.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Iterator

from trainhub.boundary.accounts import Account, fs_identity

# openat2(2): one syscall number on every architecture Linux gives it
_SYS_OPENAT2 = 437
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV

_libc = ctypes.CDLL(None, use_errno=True)
_openat2_works: bool | None = None  # decided at the first call: ENOSYS (old kernel, seccomp) -> the component walk

MAX_NAME = 255


class TreeError(OSError):
    """A path inside a user's tree that cannot be used (a link, a special file, a name with ``..``)."""


@dataclass(frozen=True)
class Entry:
    """One file met by a walk: its path relative to the tree's root, its size and modification time."""

    path: str
    size: int
    mtime_ns: int


def parts_of(rel: str | os.PathLike) -> list[str]:
    """The components of a relative path; ``..``, absolute paths and NUL bytes are refused."""
    text = os.fspath(rel)
    if "\0" in text:
        raise TreeError(errno.EINVAL, "a path inside a user's folder cannot hold a NUL byte", text)
    if text.startswith("/"):
        raise TreeError(errno.EINVAL, "a path inside a user's folder must be relative", text)
    out = []
    for part in PurePosixPath(text).parts:
        if part in ("", "."):
            continue
        if part == ".." or len(part.encode()) > MAX_NAME:
            raise TreeError(errno.EINVAL, "a path inside a user's folder cannot leave it", text)
        out.append(part)
    return out


def _openat2(dirfd: int, name: str, flags: int, mode: int) -> int:
    how = struct.pack("QQQ", flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, _RESOLVE)
    fd = _libc.syscall(_SYS_OPENAT2, dirfd, name.encode(), how, len(how))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), name)
    return fd


def open_beneath(dirfd: int, rel: str | os.PathLike, flags: int, mode: int = 0o600) -> int:
    """``rel`` opened below ``dirfd`` without following any symbolic link or leaving the tree.

    ``openat2`` where the kernel has it; else one ``openat(..., O_NOFOLLOW)`` per component, each relative
    to the descriptor of the one before (the same guarantee, more system calls)."""
    global _openat2_works
    parts = parts_of(rel)
    if not parts:
        return os.open(".", flags | os.O_CLOEXEC, dir_fd=dirfd)
    if _openat2_works is not False:
        try:
            return _openat2(dirfd, "/".join(parts), flags | os.O_NOFOLLOW, mode)
        except OSError as e:
            if e.errno not in (errno.ENOSYS, errno.EPERM) or _openat2_works:
                raise
            _openat2_works = False  # no openat2 here (EPERM: a seccomp filter that refuses unknown calls)
        else:
            _openat2_works = True
    fd = dirfd
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            if fd != dirfd:
                os.close(fd)
            fd = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
    finally:
        if fd != dirfd:
            os.close(fd)


class UserTree:
    """One folder of one user: opened once by the platform, then used only through descriptors, as the user.

    ``account`` None (no per-user accounts: the platform and its users share one account) keeps rules 2
    and 3: no link is followed and no special file read. Use it as a context manager (or ``close()``)."""

    def __init__(self, root: str | os.PathLike, account: Account | None, *, create: bool = False, mode: int = 0o700):
        self.root = os.fspath(root)
        self.account = account
        if create:
            os.makedirs(self.root, mode=0o755, exist_ok=True)  # its parents are the platform's
        # the root is the platform's choice (a home, an area, a job's folder): its last component must not be a link
        self._fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "UserTree":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def fd(self) -> int:
        if self._fd < 0:
            raise ValueError(f"the tree {self.root} is closed")
        return self._fd

    def identity(self):
        """The user's file identity on this thread (a context manager); every method below holds it."""
        return fs_identity(self.account)

    # -- single files ------------------------------------------------------------------------------
    def open(self, rel: str | os.PathLike, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
        """A descriptor of ``rel`` (the caller closes it). Reading opens only regular files."""
        with self.identity():
            fd = open_beneath(self.fd, rel, flags | os.O_NONBLOCK, mode)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) and not (flags & os.O_DIRECTORY):
                raise TreeError(errno.EINVAL, "not a regular file", os.fspath(rel))
            if not flags & os.O_DIRECTORY:
                os.set_blocking(fd, True)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def open_dir(self, rel: str | os.PathLike = "") -> int:
        with self.identity():
            return open_beneath(self.fd, rel, os.O_RDONLY | os.O_DIRECTORY)

    def read_bytes(self, rel: str | os.PathLike, limit: int) -> bytes:
        """The file's contents; TreeError when it holds more than ``limit`` bytes."""
        fd = self.open(rel)
        try:
            with open(fd, "rb", closefd=False) as f:
                data = f.read(limit + 1)
        finally:
            os.close(fd)
        if len(data) > limit:
            raise TreeError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(rel))
        return data

    def stat(self, rel: str | os.PathLike) -> os.stat_result:
        """``lstat`` of ``rel`` (a link is reported as a link, never followed)."""
        if not parts_of(rel):
            return os.fstat(self.fd)
        return self._at_parent(rel, lambda name, parent: os.stat(name, dir_fd=parent, follow_symlinks=False))

    def _at_parent(self, rel, fn):
        """``fn(last name, descriptor of its folder)`` as the user, the folder opened beneath the root without links."""
        parts = parts_of(rel)
        if not parts:
            raise TreeError(errno.EINVAL, "the tree's root itself", self.root)
        with self.identity():
            parent = open_beneath(self.fd, "/".join(parts[:-1]), os.O_PATH | os.O_DIRECTORY)
            try:
                return fn(parts[-1], parent)
            finally:
                os.close(parent)

    def exists(self, rel: str | os.PathLike) -> bool:
        try:
            self.stat(rel)
            return True
        except FileNotFoundError:
            return False
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                return False
            raise

    def makedirs(self, rel: str | os.PathLike, mode: int = 0o700) -> None:
        """Make ``rel`` and its missing parents (as the user: theirs); a link on the way fails."""
        parts = parts_of(rel)
        with self.identity():
            fd = self.fd
            try:
                for part in parts:
                    try:
                        os.mkdir(part, mode, dir_fd=fd)
                    except FileExistsError:
                        pass
                    nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    if fd != self.fd:
                        os.close(fd)
                    fd = nxt
            finally:
                if fd != self.fd:
                    os.close(fd)

    def write_bytes(self, rel: str | os.PathLike, data: bytes, mode: int = 0o600) -> None:
        """Write ``rel`` atomically (a temporary name beside it, then a rename in its folder)."""
        self.write_from(rel, lambda out: out.write(data), mode)

    def write_from(self, rel: str | os.PathLike, fill, mode: int = 0o600) -> None:
        """Write ``rel`` atomically from ``fill(file object)``; the parent folders are made as needed."""
        parts = parts_of(rel)
        if not parts:
            raise TreeError(errno.EISDIR, "cannot write the tree's root", self.root)
        if len(parts) > 1:
            self.makedirs("/".join(parts[:-1]))
        tmp = f".{parts[-1][:200]}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        with self.identity():
            parent = open_beneath(self.fd, "/".join(parts[:-1]), os.O_RDONLY | os.O_DIRECTORY)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent)
                try:
                    with open(fd, "wb", closefd=False) as out:
                        fill(out)
                finally:
                    os.close(fd)
                os.rename(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=parent)
                except OSError:
                    pass
                raise
            finally:
                os.close(parent)

    def copy_in(self, src_fd: int, rel: str | os.PathLike, mode: int = 0o600) -> int:
        """Copy the open file ``src_fd`` (from its current offset) to ``rel`` atomically; returns the bytes copied."""
        copied = [0]

        def fill(out):
            out.flush()
            copied[0] = _copy_fd(src_fd, out.fileno())

        self.write_from(rel, fill, mode)
        return copied[0]

    def symlink(self, target: str, rel: str | os.PathLike) -> None:
        """A symbolic link ``rel`` -> ``target`` (made as the user; the platform never follows it here)."""
        self._at_parent(rel, lambda name, parent: os.symlink(target, name, dir_fd=parent))

    def readlink(self, rel: str | os.PathLike) -> str:
        return self._at_parent(rel, lambda name, parent: os.readlink(name, dir_fd=parent))

    def unlink(self, rel: str | os.PathLike) -> None:
        self._at_parent(rel, lambda name, parent: os.unlink(name, dir_fd=parent))

    # -- whole trees -------------------------------------------------------------------------------
    def walk(self, rel: str | os.PathLike = "", page: int = 1000, skip: tuple[str, ...] = ()) -> Iterator[list[Entry]]:
        """Pages of the regular files under ``rel`` (paths relative to ``rel``), depth first.

        Each folder is opened relative to the descriptor of its parent, as the user; links, special files
        and folders that cannot be opened are skipped, never followed. ``skip``: names of folders directly
        under ``rel`` that are not entered (another identity's part of the tree)."""
        try:
            top = self.open_dir(rel)
        except FileNotFoundError:
            return
        stack: list[tuple[int, str]] = [(top, "")]
        out: list[Entry] = []
        try:
            while stack:
                dfd, prefix = stack.pop()
                try:
                    with self.identity():
                        subdirs, files = _list(dfd)
                        if not prefix and skip:
                            subdirs = [d for d in subdirs if d not in skip]
                        for name in reversed(subdirs):
                            try:
                                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                            except OSError:
                                continue  # gone, or a link now: not walked
                            stack.append((sub, f"{prefix}{name}/"))
                finally:
                    os.close(dfd)
                for name, st in files:
                    out.append(Entry(prefix + name, st.st_size, st.st_mtime_ns))
                    if len(out) >= page:
                        yield out
                        out = []
            if out:
                yield out
        finally:
            for dfd, _ in stack:
                os.close(dfd)

    def names(self, rel: str | os.PathLike = "") -> list[str]:
        """Names of the regular files directly in the folder ``rel`` ([] when it does not exist or is a link)."""
        try:
            dfd = self.open_dir(rel)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            if e.errno == errno.ELOOP:
                return []
            raise
        try:
            with self.identity():
                return [name for name, _ in _list(dfd)[1]]
        finally:
            os.close(dfd)

    def files(self, rel: str | os.PathLike = "") -> Iterator[Entry]:
        for p in self.walk(rel):
            yield from p

    def rmtree(self, rel: str | os.PathLike) -> int:
        """Remove ``rel`` and everything below it, through descriptors, as the user; returns the entries removed.
        A link is removed, never followed."""
        parts = parts_of(rel)
        if not parts:
            raise TreeError(errno.EINVAL, "cannot remove the tree's root", self.root)
        removed = 0
        with self.identity():
            parent = open_beneath(self.fd, "/".join(parts[:-1]), os.O_RDONLY | os.O_DIRECTORY)
            try:
                removed = _rmtree_at(parent, parts[-1])
            finally:
                os.close(parent)
        return removed

    def chown_all(self, uid: int, gid: int) -> None:
        """Hand the whole tree to ``uid:gid`` (as the platform: an admin's handover of a folder made before
        accounts), through descriptors; links are changed themselves, never followed."""
        if self.account is not None:
            raise TreeError(errno.EPERM, "a tree opened as a user cannot change owners", self.root)
        top = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.fd)
        os.fchown(top, uid, gid)
        stack = [top]
        try:
            while stack:
                dfd = stack.pop()
                try:
                    for entry in os.scandir(dfd):
                        try:
                            os.chown(entry.name, uid, gid, dir_fd=dfd, follow_symlinks=False)
                            if entry.is_dir(follow_symlinks=False):
                                stack.append(os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                                     dir_fd=dfd))
                        except (FileNotFoundError, NotADirectoryError):
                            continue
                        except OSError as e:
                            if e.errno != errno.ELOOP:
                                raise
                finally:
                    os.close(dfd)
        finally:
            for dfd in stack:
                os.close(dfd)


def _list(dfd: int) -> tuple[list[str], list[tuple[str, os.stat_result]]]:
    """(sub-folders, regular files with their lstat) of the open folder ``dfd``."""
    subdirs, files = [], []
    with os.scandir(dfd) as it:
        for entry in it:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(entry.name)
            elif stat.S_ISREG(st.st_mode):
                files.append((entry.name, st))
    subdirs.sort()
    files.sort()
    return subdirs, files


def _rmtree_at(parent: int, name: str) -> int:
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent)
        return 1
    try:
        dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a link or a file meanwhile: remove that
            os.unlink(name, dir_fd=parent)
            return 1
        raise
    removed = 0
    try:
        for entry in list(os.scandir(dfd)):
            removed += _rmtree_at(dfd, entry.name)
    finally:
        os.close(dfd)
    os.rmdir(name, dir_fd=parent)
    return removed + 1


def _copy_fd(src: int, dst: int) -> int:
    total = 0
    while True:
        try:
            n = os.copy_file_range(src, dst, 1 << 24)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            break
        if n == 0:
            return total
        total += n
    while True:  # a plain copy where copy_file_range cannot go (another file system on old kernels, /proc...)
        chunk = os.read(src, 1 << 20)
        if not chunk:
            return total
        os.write(dst, chunk)
        total += len(chunk)
