"""A job's working directory: the folder its code is sent from, packed, checked and unpacked.

A notebook imports its own modules (``from datautils import ...``) and opens files relative to its
folder; a script does the same from where it is started. So a job carries that folder along, as Ray's
``working_dir``, SageMaker's ``source_dir`` and Determined's context do, and runs in a copy of it:

- :func:`scan` walks the folder without following links, skips what the ignore rules name
  (:data:`DEFAULT_IGNORE`, every ``.gitignore`` and ``.trainhubignore`` on the way, the caller's
  ``exclude`` patterns: the syntax of ``.gitignore``) and refuses a folder over the limits
  (:class:`Limits`) with :class:`WorkdirTooBig`, whose message names the biggest files and folders and
  how to leave them out;
- :func:`pack` writes what a scan found as a deterministic ``.tar.gz`` (sorted, owners and the gzip
  time left out) and returns its SHA-256, by which the jobs service stores it (``PUT /workdirs/{sha256}``);
- :func:`check_archive` and :func:`unpack` read an archive as a stream and refuse what could leave
  the folder or exhaust the machine: absolute paths, ``..``, links whose target leaves the folder,
  entries below a link, hard links, devices and FIFOs, duplicate names, more than the limits' bytes or
  entries. :func:`unpack` writes through a *sink* with three methods (``makedirs(rel, mode)``,
  ``write_from(rel, fill, mode)``, ``symlink(target, rel)``): the local launcher passes the user's
  :class:`trainhub.boundary.files.UserTree` (written as the user, through descriptors, never following a
  link), anything else :class:`DirSink`.

The kernel side (``%%train``), the CLI (``trainhub jobs submit --workdir``) and the services all use
this one module. It imports only the standard library: the Kubernetes launcher sends its source to
the job's pods, whose image need not have trainhub, and runs it there (``python3 -c SOURCE unpack
URL DEST MAX_BYTES MAX_FILES``, :func:`main`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import re
import stat
import sys
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field

IGNORE_FILE = ".trainhubignore"
GITIGNORE = ".gitignore"
# always left out unless a .trainhubignore says otherwise with "!": hidden folders (.git, .venv, .ipython,
# .ipynb_checkpoints, .cache...), Python's caches, node_modules
DEFAULT_IGNORE = (".*/", "__pycache__/", "*.py[cod]", "node_modules/")

DEFAULT_MAX_BYTES = 50 << 20  # the files' contents, unpacked
DEFAULT_MAX_FILES = 10_000  # files, folders and links
MAX_PATH = 4096  # bytes of one entry's path
MAX_NAME = 255  # bytes of one component
SCAN_LIMIT_FACTOR = 20  # a scan past the limits goes on (only listing) up to this many times them, for the message
ARCHIVE_OVERHEAD = 6 << 10  # tar headers (a long path's pax header too) and padding per entry, at most
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class WorkdirError(ValueError):
    """A working directory or archive that cannot be sent or unpacked; the message says why and what to do."""


class WorkdirTooBig(WorkdirError):
    """A folder over the limits; ``biggest`` lists (path, bytes, files) of what weighs most."""

    def __init__(self, message: str, biggest: list[tuple[str, int, int]]):
        super().__init__(message)
        self.biggest = biggest


@dataclass(frozen=True)
class Limits:
    max_bytes: int = DEFAULT_MAX_BYTES
    max_files: int = DEFAULT_MAX_FILES

    @property
    def archive_bytes(self) -> int:
        """The most bytes an archive within these limits can take (gzip never grows tar data by much)."""
        return self.max_bytes + self.max_files * ARCHIVE_OVERHEAD + (1 << 20)


def size_text(n: float) -> str:
    """1536 -> "1.5 KB" (as trainhub.fmt.fmt_size; repeated here so the module needs no trainhub)."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{int(n)} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


# -- ignore rules (the syntax of .gitignore) --------------------------------------------------------
@dataclass(frozen=True)
class Pattern:
    regex: re.Pattern
    negate: bool
    dir_only: bool
    base: str  # the folder (relative to the root, "" for the root) of the file the pattern came from
    text: str


def _glob_regex(glob: str) -> str:
    """A gitignore glob (``*``, ``?``, ``[...]``, ``**``) as a regex over a relative path with ``/``."""
    out, i, n = [], 0, len(glob)
    while i < n:
        c = glob[i]
        if c == "*":
            if glob.startswith("**", i):
                before = i == 0 or glob[i - 1] == "/"
                after = i + 2 == n or glob[i + 2] == "/"
                if before and after:
                    if i + 2 == n:
                        out.append(".*")  # "a/**": everything inside
                        i += 2
                    else:
                        out.append("(?:.*/)?")  # "**/b", "a/**/b": zero or more folders
                        i += 3
                    continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = glob.find("]", i + 2 if glob.startswith("[!", i) or glob.startswith("[^", i) else i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = glob[i + 1:j]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j + 1
                continue
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(glob[i + 1]))
            i += 2
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse_patterns(lines, base: str = "", source: str = "") -> list[Pattern]:
    """The patterns of a ``.gitignore``-style text (a list of lines) found in folder ``base``."""
    out = []
    for raw in lines:
        line = raw.rstrip("\n").rstrip("\r")
        if not line.strip() or line.startswith("#"):
            continue
        if not line.endswith("\\ "):
            line = line.rstrip(" ")
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        elif line.startswith("\\!") or line.startswith("\\#"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line  # a slash at the start or in the middle: relative to the file's folder
        line = line.lstrip("/")
        body = _glob_regex(line)
        regex = re.compile(("" if anchored else "(?:.*/)?") + body + "$")
        out.append(Pattern(regex, negate, dir_only, base, (source + ": " if source else "") + raw.strip()))
    return out


class IgnoreRules:
    """Which paths of a folder are left out: patterns in order, the last that matches decides (as git does)."""

    def __init__(self, patterns: list[Pattern] | None = None):
        self.patterns = list(patterns or [])

    def plus(self, more: list[Pattern]) -> "IgnoreRules":
        return IgnoreRules(self.patterns + list(more)) if more else self

    def ignored(self, rel: str, is_dir: bool) -> bool:
        verdict = False
        for p in self.patterns:
            if p.dir_only and not is_dir:
                continue
            if p.base:
                if not rel.startswith(p.base + "/"):
                    continue
                sub = rel[len(p.base) + 1:]
            else:
                sub = rel
            if p.regex.match(sub):
                verdict = not p.negate
        return verdict


def default_rules(exclude=()) -> tuple[IgnoreRules, list[Pattern]]:
    """(the defaults, the caller's ``exclude`` patterns): the latter are applied after every ignore file."""
    return IgnoreRules(parse_patterns(DEFAULT_IGNORE, source="default")), parse_patterns(list(exclude), source="--exclude")


# -- scanning -----------------------------------------------------------------------------------------
@dataclass
class Item:
    path: str  # relative, with "/"
    kind: str  # "file", "dir", "link"
    size: int = 0
    mode: int = 0o644
    target: str = ""  # a link's target


@dataclass
class Listing:
    """What :func:`scan` found: the entries to send (sorted), their bytes, and what it left out and why."""

    root: str
    items: list[Item] = field(default_factory=list)
    bytes: int = 0
    skipped: dict[str, str] = field(default_factory=dict)  # path -> why (links leaving the folder, special files)

    @property
    def files(self) -> int:
        return sum(1 for i in self.items if i.kind == "file")


def _read_ignore_file(dfd: int, name: str) -> list[str]:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        with open(fd, "rb", closefd=False) as f:
            return f.read(1 << 20).decode("utf-8", "replace").splitlines()
    finally:
        os.close(fd)


def link_inside(rel: str, target: str) -> bool:
    """Does the link ``rel`` -> ``target`` stay inside the folder (relative target, never above the root)?"""
    if not target or target.startswith("/") or "\0" in target:
        return False
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    return joined != ".." and not joined.startswith("../") and not posixpath.isabs(joined)


def scan(root: str | os.PathLike, *, exclude=(), limits: Limits = Limits()) -> Listing:
    """The entries of ``root`` to send, walked without following links.

    Links that stay inside the folder are kept as links; links leaving it, FIFOs, sockets and devices are
    left out (``skipped`` says so). Raises :class:`WorkdirTooBig` past ``limits`` (after going on listing, up
    to :data:`SCAN_LIMIT_FACTOR` times them, to name what weighs most) and :class:`WorkdirError` when
    ``root`` is not a folder."""
    root = os.path.abspath(os.fspath(root))
    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise WorkdirError(f"cannot send {root} as the job's working directory: {e.strerror}") from None
    defaults, extra = default_rules(exclude)
    listing = Listing(root)
    count = 0
    enough = False  # past the limits many times over: the message knows enough
    stack: list[tuple[int, str, IgnoreRules]] = [(top, "", defaults)]
    try:
        while stack and not enough:
            dfd, prefix, rules = stack.pop()
            try:
                base = prefix.rstrip("/")
                found = parse_patterns(_read_ignore_file(dfd, GITIGNORE), base, posixpath.join(base, GITIGNORE))
                found += parse_patterns(_read_ignore_file(dfd, IGNORE_FILE), base, posixpath.join(base, IGNORE_FILE))
                rules = rules.plus(found)
                here = rules.plus(extra)
                with os.scandir(dfd) as it:
                    entries = sorted(it, key=lambda e: e.name)
                subdirs = []
                for entry in entries:
                    item = _item(dfd, prefix, entry, here, listing)
                    if item is None:
                        continue
                    listing.items.append(item)
                    listing.bytes += item.size
                    count += 1
                    if item.kind == "dir":
                        subdirs.append(entry.name)
                    if count > limits.max_files * SCAN_LIMIT_FACTOR or listing.bytes > limits.max_bytes * SCAN_LIMIT_FACTOR:
                        enough = True
                        break
                for name in reversed(subdirs):
                    try:
                        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                    except OSError as e:
                        listing.skipped[prefix + name + "/"] = f"cannot be read ({e.strerror})"
                        continue
                    stack.append((sub, f"{prefix}{name}/", rules))
            finally:
                os.close(dfd)
    finally:
        for dfd, _, _ in stack:
            os.close(dfd)
    over = count > limits.max_files or listing.bytes > limits.max_bytes
    if over:
        raise too_big(listing, count, limits, partial=enough)
    listing.items.sort(key=lambda i: i.path)
    return listing


def _item(dfd: int, prefix: str, entry: os.DirEntry, rules: IgnoreRules, listing: Listing) -> Item | None:
    """The entry to send for ``entry`` of the folder ``dfd``, or None (ignored, gone, or left out: ``skipped``)."""
    rel = prefix + entry.name
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return None  # gone meanwhile
    is_dir = stat.S_ISDIR(st.st_mode)
    if rules.ignored(rel, is_dir):
        return None
    if len(rel.encode()) > MAX_PATH or len(entry.name.encode()) > MAX_NAME:
        listing.skipped[rel] = "its path is too long"
        return None
    if is_dir:
        return Item(rel, "dir", mode=0o755)
    if stat.S_ISREG(st.st_mode):
        return Item(rel, "file", st.st_size, 0o755 if st.st_mode & 0o111 else 0o644)
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(entry.name, dir_fd=dfd)
        except OSError:
            return None
        if link_inside(rel, target):
            return Item(rel, "link", target=target)
        listing.skipped[rel] = f"a link to {target}, outside the folder (links are never followed)"
        return None
    listing.skipped[rel] = "not a regular file, folder or link"
    return None


def biggest(items: list[Item], n: int = 6) -> list[tuple[str, int, int]]:
    """What weighs most, as (path, bytes, files), heaviest first, at most ``n``: the top-level entries (folders with
    their totals) holding at least 1% of the bytes, and the biggest files inside folders of several files."""
    tops: dict[str, list[int]] = {}
    for i in items:
        if i.kind == "file":
            head, sep, _ = i.path.partition("/")
            t = tops.setdefault(head + sep, [0, 0])
            t[0] += i.size
            t[1] += 1
    total = sum(b for b, _ in tops.values())
    ranked = sorted(((p, b, f) for p, (b, f) in tops.items()), key=lambda x: (-x[1], x[0]))
    ranked = [r for r in ranked if r[1] * 100 >= total][:n] or ranked[:1]
    floor = ranked[-1][1] if ranked else 0
    for i in sorted((i for i in items if i.kind == "file" and "/" in i.path), key=lambda i: (-i.size, i.path))[:3]:
        top = i.path.split("/", 1)[0] + "/"
        if tops.get(top, [0, 0])[1] > 1 and i.size >= floor:
            ranked.append((i.path, i.size, 1))
    return sorted(ranked, key=lambda x: (-x[1], x[0]))[:n]


def too_big(listing: Listing, count: int, limits: Limits, partial: bool = False) -> WorkdirTooBig:
    top = biggest(listing.items)
    more = "at least " if partial else ""
    lines = [f"the working directory {listing.root} is too big to send with the job: {more}{size_text(listing.bytes)} "
             f"in {more}{count:,} files and folders (the limit is {size_text(limits.max_bytes)} and "
             f"{limits.max_files:,} entries). What weighs most:"]
    width = max((len(p) for p, _, _ in top), default=0)
    for path, size, files in top:
        lines.append(f"    {path.ljust(width)}  {size_text(size):>10}" + (f"  ({files:,} files)" if files > 1 else ""))
    example = [p for p, _, _ in top if p.count("/") <= 1 and (p.endswith("/") or "/" not in p)][:2] or ["data/"]
    lines += [f"Leave out what the job does not need: add a line per pattern (the syntax of .gitignore) to "
              f"{os.path.join(listing.root, IGNORE_FILE)}, e.g.",
              *(f"    {p}" for p in example),
              f"or pass --exclude {example[0]} (repeatable); --no-workdir sends nothing (the job then runs in your home "
              "folder). Data belongs in storage ($TRAINHUB_STORAGE_URL) or datasets/, read from there by the job."]
    return WorkdirTooBig("\n".join(lines), top)


# -- packing ------------------------------------------------------------------------------------------
class _Hashing(io.RawIOBase):
    """A write-only file that hashes and counts what goes through it into ``out``."""

    def __init__(self, out):
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.sha.update(b)
        self.size += len(b)
        self.out.write(b)
        return len(b)


@dataclass
class Snapshot:
    """A packed folder: the archive (a file object at offset 0), its SHA-256 and size, what it holds."""

    archive: object
    sha256: str
    size: int
    files: int
    bytes: int
    entries: int
    skipped: dict[str, str] = field(default_factory=dict)
    root: str = ""

    def summary(self) -> str:
        return f"{self.files:,} file{'s' if self.files != 1 else ''}, {size_text(self.bytes)}"

    def close(self) -> None:
        self.archive.close()


def _tarinfo(item: Item) -> tarfile.TarInfo:
    info = tarfile.TarInfo(item.path)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0  # the same folder packs to the same bytes: its hash names it
    if item.kind == "dir":
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    elif item.kind == "link":
        info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, item.target
    else:
        info.type, info.mode, info.size = tarfile.REGTYPE, item.mode, item.size
    return info


def pack(listing: Listing, out, limits: Limits = Limits()) -> tuple[str, int]:
    """Write ``listing`` as a ``.tar.gz`` into the binary file ``out``; returns (SHA-256 hex, bytes written).

    Each file is opened once without following a link; its size is taken when it is opened, and a file that
    changes while it is read fails the pack (the archive would not be what was scanned)."""
    hashing = _Hashing(out)
    root = os.open(listing.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    total = 0
    try:
        with gzip.GzipFile(filename="", fileobj=hashing, mode="wb", mtime=0, compresslevel=6) as gz, \
                tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for item in listing.items:
                if item.kind != "file":
                    tar.addfile(_tarinfo(item))
                    continue
                try:
                    fd = _open_below(root, item.path)
                except OSError as e:
                    raise WorkdirError(f"cannot read {os.path.join(listing.root, item.path)}: {e.strerror}") from None
                with open(fd, "rb") as f:
                    st = os.fstat(f.fileno())
                    if not stat.S_ISREG(st.st_mode):
                        raise WorkdirError(f"{os.path.join(listing.root, item.path)} changed while it was packed")
                    item.size = st.st_size
                    total += item.size
                    if total > limits.max_bytes:
                        raise too_big(listing, len(listing.items), limits)
                    tar.addfile(_tarinfo(item), _Exact(f, item.size, os.path.join(listing.root, item.path)))
    finally:
        os.close(root)
    return hashing.sha.hexdigest(), hashing.size


class _Exact:
    """Exactly ``size`` bytes of ``f`` (tarfile reads that many): a file that shrank meanwhile is an error."""

    def __init__(self, f, size: int, path: str):
        self.f, self.left, self.path = f, size, path

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.f.read(n)
        if len(data) < n:
            raise WorkdirError(f"{self.path} changed while it was packed (it became shorter)")
        self.left -= len(data)
        return data


def _open_below(root_fd: int, rel: str) -> int:
    fd = root_fd
    parts = rel.split("/")
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            if fd != root_fd:
                os.close(fd)
            fd = nxt
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        if fd != root_fd:
            os.close(fd)


def snapshot(root: str | os.PathLike, *, exclude=(), limits: Limits = Limits()) -> Snapshot:
    """Scan and pack ``root`` (in memory up to 8 MB, then a temporary file); the caller closes it."""
    listing = scan(root, exclude=exclude, limits=limits)
    out = tempfile.SpooledTemporaryFile(max_size=8 << 20)
    try:
        sha, size = pack(listing, out, limits)
    except BaseException:
        out.close()
        raise
    out.seek(0)
    return Snapshot(out, sha, size, listing.files, listing.bytes, len(listing.items), listing.skipped, listing.root)


# -- checking and unpacking -----------------------------------------------------------------------------
@dataclass
class Unpacked:
    files: int = 0
    bytes: int = 0
    entries: int = 0


def member_path(name: str) -> str:
    """An archive entry's path, checked: relative, no ``..``, no NUL, within the length limits."""
    if "\0" in name:
        raise WorkdirError(f"refused: the archive holds a path with a NUL byte ({name!r})")
    if name.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", name):
        raise WorkdirError(f"refused: the archive holds an absolute path ({name})")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise WorkdirError(f"refused: the archive holds a path that leaves the folder ({name})")
    if not parts:
        return ""
    rel = "/".join(parts)
    if len(rel.encode()) > MAX_PATH or any(len(p.encode()) > MAX_NAME for p in parts):
        raise WorkdirError(f"refused: the archive holds a path that is too long ({rel[:100]}...)")
    return rel


def members(fileobj, limits: Limits = Limits()):
    """The archive's entries as (path, kind, tarinfo, tarfile), each checked before it is yielded (see the module
    docstring); the archive is read as a stream, once, and never more than ``limits`` allow."""
    seen: set[str] = set()
    links: list[str] = []
    total, count = 0, 0
    # the tar stream itself is bounded too: headers (a pax header may be as long as it likes) never make the
    # reading of a small archive unbounded
    stream = _Bounded(gzip.GzipFile(fileobj=fileobj, mode="rb"), limits.archive_bytes)
    try:
        tar = tarfile.open(fileobj=stream, mode="r|")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise WorkdirError(f"refused: not a .tar.gz archive ({e})") from None
    with tar:
        while True:
            try:
                info = tar.next()
            except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
                raise WorkdirError(f"refused: a damaged archive ({e})") from None
            if info is None:
                return
            rel = member_path(info.name)
            if not rel:
                if info.isdir():
                    continue
                raise WorkdirError("refused: the archive holds an entry without a name")
            if rel in seen:
                raise WorkdirError(f"refused: the archive holds {rel} twice")
            seen.add(rel)
            if any(rel == ln or rel.startswith(ln + "/") for ln in links):
                raise WorkdirError(f"refused: the archive holds {rel}, below a link")
            count += 1
            if count > limits.max_files:
                raise WorkdirError(f"refused: the archive holds more than {limits.max_files:,} entries")
            if info.isreg():
                total += info.size
                if total > limits.max_bytes:
                    raise WorkdirError(f"refused: the archive's files are more than {size_text(limits.max_bytes)} unpacked")
                kind = "file"
            elif info.isdir():
                kind = "dir"
            elif info.issym():
                if not link_inside(rel, info.linkname):
                    raise WorkdirError(f"refused: the archive holds a link that leaves the folder ({rel} -> {info.linkname})")
                links.append(rel)
                kind = "link"
            elif info.islnk():
                raise WorkdirError(f"refused: the archive holds a hard link ({rel}); send the file itself")
            else:
                raise WorkdirError(f"refused: the archive holds {rel}, which is not a file, folder or link")
            yield rel, kind, info, tar


class _Bounded:
    """A file read as a stream that refuses to give more than ``limit`` bytes."""

    def __init__(self, f, limit: int):
        self.f, self.left, self.limit = f, limit, limit

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n if n is not None and n >= 0 else self.left + 1)
        self.left -= len(data)
        if self.left < 0:
            raise WorkdirError(f"refused: the archive unpacks to more than {size_text(self.limit)}")
        return data


def check_archive(fileobj, limits: Limits = Limits()) -> Unpacked:
    """Read the whole archive as :func:`unpack` would, writing nothing; raises :class:`WorkdirError`."""
    out = Unpacked()
    for rel, kind, info, tar in members(fileobj, limits):
        out.entries += 1
        if kind == "file":
            f = tar.extractfile(info)
            while f.read(1 << 20):
                pass
            out.files += 1
            out.bytes += info.size
    return out


def unpack(fileobj, sink, limits: Limits = Limits()) -> Unpacked:
    """Write the archive's entries through ``sink`` (see the module docstring); returns what was written.

    Each entry is checked before anything of it is written; a refusal stops the unpacking with
    :class:`WorkdirError` (what was written before stays: the caller removes the folder)."""
    out = Unpacked()
    for rel, kind, info, tar in members(fileobj, limits):
        out.entries += 1
        if kind == "dir":
            sink.makedirs(rel, 0o755)
        elif kind == "link":
            parent = posixpath.dirname(rel)
            if parent:
                sink.makedirs(parent, 0o755)
            sink.symlink(info.linkname, rel)
        else:
            src = tar.extractfile(info)
            mode = 0o755 if info.mode & 0o111 else 0o644
            sink.write_from(rel, lambda dst, src=src: _copy(src, dst), mode)
            out.files += 1
            out.bytes += info.size
    return out


def _copy(src, dst) -> None:
    while True:
        chunk = src.read(1 << 20)
        if not chunk:
            return
        dst.write(chunk)


class Below:
    """A sink's sub-folder ``prefix`` as a sink of its own (the unpacking writes below it)."""

    def __init__(self, sink, prefix: str):
        self.sink, self.prefix = sink, member_path(prefix)

    def makedirs(self, rel: str, mode: int = 0o755) -> None:
        self.sink.makedirs(f"{self.prefix}/{rel}", mode)

    def write_from(self, rel: str, fill, mode: int = 0o644) -> None:
        self.sink.write_from(f"{self.prefix}/{rel}", fill, mode)

    def symlink(self, target: str, rel: str) -> None:
        self.sink.symlink(target, f"{self.prefix}/{rel}")


class DirSink:
    """A folder written with plain system calls, one component at a time without following a link (the folder of a
    Kubernetes pod, tests). A local user's folder is written through their UserTree instead."""

    def __init__(self, root: str | os.PathLike):
        self.root = os.fspath(root)
        os.makedirs(self.root, exist_ok=True)
        self.fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "DirSink":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _folder(self, parts: list[str], mode: int = 0o755) -> int:
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
            return fd if fd != self.fd else os.dup(self.fd)
        except BaseException:
            if fd != self.fd:
                os.close(fd)
            raise

    def makedirs(self, rel: str, mode: int = 0o755) -> None:
        os.close(self._folder(member_path(rel).split("/"), mode))

    def write_from(self, rel: str, fill, mode: int = 0o644) -> None:
        parts = member_path(rel).split("/")
        parent = self._folder(parts[:-1])
        try:
            fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                         dir_fd=parent)
            with open(fd, "wb") as f:
                fill(f)
        finally:
            os.close(parent)

    def symlink(self, target: str, rel: str) -> None:
        parts = member_path(rel).split("/")
        parent = self._folder(parts[:-1])
        try:
            os.symlink(target, parts[-1], dir_fd=parent)
        finally:
            os.close(parent)


# -- in a Kubernetes pod ------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    """``unpack URL DEST MAX_BYTES MAX_FILES``: fetch the archive at URL (fsspec, with
    ``$TRAINHUB_STORAGE_OPTIONS``; a plain path too) and unpack it into the new folder DEST."""
    if len(argv) != 5 or argv[0] != "unpack":
        print("usage: unpack URL DEST MAX_BYTES MAX_FILES", file=sys.stderr)
        return 2
    _, url, dest, max_bytes, max_files = argv
    limits = Limits(int(max_bytes), int(max_files))
    try:
        if "://" in url and not url.startswith("file://"):
            import json

            import fsspec

            opts = json.loads(os.environ.get("TRAINHUB_STORAGE_OPTIONS") or "{}")
            src = fsspec.open(url, "rb", **opts).open()
        else:
            src = open(url[len("file://"):] if url.startswith("file://") else url, "rb")
        with src, DirSink(dest) as sink:
            got = unpack(src, sink, limits)
    except (WorkdirError, OSError, ImportError) as e:
        print(f"trainhub: the job's working directory could not be unpacked from {url}: {e}", file=sys.stderr)
        return 1
    print(f"trainhub: working directory {dest}: {got.files} files, {size_text(got.bytes)}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # python3 -c "<this file>" unpack ...  (the Kubernetes worker script)
    sys.exit(main(sys.argv[1:]))
