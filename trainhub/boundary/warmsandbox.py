"""The mechanics of a warm start in a sandbox, shared by warm servers (trainhub.spawner.warm) and warm isolated job
workers (services/jobs/warmpool.py): one place for what must be right for both.

A warm interpreter waits, as the platform (root) and in a sandbox of no user, for one claim. The platform's side
makes the mounts a cold sandbox would bind beyond the warm one's (:func:`sandbox_mounts`) as detached
``open_tree(OPEN_TREE_CLONE)`` descriptors (:func:`clone_mount`; read-only ones sealed with ``mount_setattr``
before they leave it) and sends them with a JSON spec over a Unix socket (:func:`send_claim`, ``SCM_RIGHTS``).
Inside, :func:`receive_claim` reads them, :func:`attach_mounts` attaches each at its own path (``move_mount``,
parents made 0755 as bwrap makes them), :func:`show_environ` makes ``/proc/<pid>/environ`` the claimer's environment
and :func:`become` drops to the account for good (capability bounding set
emptied, groups cleared, real/effective/saved ids, no_new_privs: what ``setpriv --reuid --regid --clear-groups
--no-new-privs`` gives a cold start, and no capability left at all).

Standard library only (it runs inside sandboxes before any user's code); no trainhub import.
"""

from __future__ import annotations

import array
import ctypes
import fnmatch
import json
import os
import socket
import stat

_libc = ctypes.CDLL(None, use_errno=True)
_libc.sbrk.restype, _libc.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t]
_libc.malloc.restype, _libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
# the unified syscall table: the same numbers on every Linux architecture
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_RECURSIVE, AT_EMPTY_PATH = 1, 0o2000000, 0x8000, 0x1000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
MOVE_MOUNT_F_EMPTY_PATH = 0x4
CLONE_NEWNET = 0x40000000
AT_FDCWD = -100
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_MM, PR_SET_MM_MAP = 35, 14
MAX_FDS = 64  # descriptors one claim may carry
MAX_CLAIM = 16 << 20  # bytes of one claim's JSON


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _check(ret: int, what: str) -> None:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


# -- the platform's side ---------------------------------------------------------------------------
def clone_mount(path: str, read_only: bool) -> int:
    """A detached bind mount of ``path`` (recursive) with the flags bwrap gives its binds (nosuid; nodev unless it
    is a device node, as ``--dev-bind``; read-only if asked): a descriptor another mount namespace can attach
    (``move_mount``)."""
    is_device = stat.S_ISCHR(os.stat(path).st_mode) or stat.S_ISBLK(os.stat(path).st_mode)
    fd = _libc.syscall(SYS_OPEN_TREE, AT_FDCWD, os.fsencode(path), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)
    _check(fd, f"open_tree {path}")
    flags = MOUNT_ATTR_NOSUID | (0 if is_device else MOUNT_ATTR_NODEV) | (MOUNT_ATTR_RDONLY if read_only else 0)
    attr = _MountAttr(flags, 0, 0, 0)
    if _libc.syscall(SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH | AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)) < 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, f"mount_setattr {path}: {os.strerror(err)}")
    return fd


def sandbox_mounts(rw, ro, device_nodes) -> list[tuple[str, bool, bool]]:
    """What a cold sandbox binds beyond a warm one's (``Isolation.sandbox_argv``'s ``rw``, ``ro`` and device nodes):
    ``(real path, read-only, is a folder)``, parents first, each path once (its first mount, as bwrap keeps it),
    missing ones skipped (``--dev-bind-try``; a cold sandbox would fail on a missing folder, a claim then too)."""
    found = [(os.path.realpath(p), False) for p in rw] + [(os.path.realpath(p), True) for p in ro]
    found += [(n, False) for n in device_nodes]
    mounts, seen = [], set()
    for path, read_only in sorted(found, key=lambda m: m[0].count("/")):
        if path not in seen and os.path.exists(path):
            seen.add(path)
            mounts.append((path, read_only, os.path.isdir(path)))
    return mounts


def current_umask() -> int:
    """This process's umask, read without changing it (``os.umask`` sets one to read it: another thread creating a
    file meanwhile would get that one)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o077)
    os.umask(umask)
    return umask


def send_claim(sock: socket.socket, spec: dict, mounts: list[tuple[str, bool, bool]], netns: str | None = None) -> None:
    """Send ``spec`` with ``mounts`` (from :func:`sandbox_mounts`) as descriptors, in one message (blocking socket),
    and ``netns`` (the user's network namespace, trainhub.boundary.network) as the last descriptor. The descriptors
    are this process's only for the call."""
    if len(mounts) + 1 > MAX_FDS:
        raise ValueError(f"{len(mounts)} mounts: at most {MAX_FDS - 1} fit one claim")
    fds: list[int] = []
    try:
        for path, read_only, _is_dir in mounts:
            fds.append(clone_mount(path, read_only))
        if netns:
            fds.append(os.open(netns, os.O_RDONLY | os.O_CLOEXEC))
        spec = dict(spec, mounts=[{"dest": path, "dir": is_dir} for path, _ro, is_dir in mounts], netns=bool(netns))
        data = json.dumps(spec).encode() + b"\n"
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        sent = sock.sendmsg([data], anc)
        if sent < len(data):
            sock.sendall(data[sent:])
    finally:
        for fd in fds:
            os.close(fd)


# -- the inside ----------------------------------------------------------------------------------
def receive_claim(sock: socket.socket) -> tuple[dict, list[int]]:
    """One claim: its JSON spec and the descriptors that came with it. EOFError when the platform closed the socket
    first (it let this interpreter go)."""
    data, fds = b"", []
    while True:
        msg, anc, _flags, _addr = sock.recvmsg(1 << 16, socket.CMSG_SPACE(MAX_FDS * 4))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(payload[: len(payload) - len(payload) % 4])
                fds.extend(got)
        if not msg:
            if not data:
                raise EOFError
            break
        data += msg
        if data.endswith(b"\n"):
            break
        if len(data) > MAX_CLAIM:
            raise ValueError("claim too large")
    return json.loads(data), fds


def serve_claim(sock: socket.socket, apply):
    """The inside of a warm process, once: say ``ready``, take one claim, ``apply(spec, fds)`` it and answer ``ok``
    (with the pid and uid it now runs as), returning what ``apply`` returned. End of file before a claim (let go)
    exits 0, as does a claimer gone before ``ready`` (a hub that stopped while this process still imported); a failed
    claim answers the error and exits 1, before anything of the claimer's ran."""
    try:
        sock.sendall(b"ready\n")
        spec, fds = receive_claim(sock)
    except (EOFError, ConnectionError):
        os._exit(0)
    try:
        result = apply(spec, fds)
    except BaseException as e:  # the claimer starts it cold
        try:
            sock.sendall(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode() + b"\n")
        finally:
            os._exit(1)
    reply = {"ok": True, "pid": os.getpid(), "uid": os.getuid()}
    notes = [n for n in (environ_note, *claim_notes) if n]
    if notes:
        reply["notes"] = notes
    sock.sendall(json.dumps(reply).encode() + b"\n")
    sock.close()
    return result


def claim_answer(answer: bytes) -> tuple[str | None, list[str]]:
    """The claimer's reading of :func:`serve_claim`'s answer line: ``(None, notes)`` when the process took the claim
    on (notes: what it could not do and runs without, to be logged), ``(error, [])`` when not (``""`` when it ended
    without a word). ValueError for an answer that is not JSON."""
    reply = json.loads(answer or b"{}")
    if not reply.get("ok"):
        return reply.get("error") or "", []
    return None, [str(n) for n in reply.get("notes", [])]


def attach(fd: int, dest: str, is_dir: bool) -> None:
    """Attach the detached mount ``fd`` at ``dest``, making the mount point (and its parents, 0755, the
    platform's) inside the sandbox as bwrap would have; closes ``fd``."""
    parent = os.path.dirname(dest)
    missing = []
    while parent and not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for folder in reversed(missing):
        os.mkdir(folder)
        os.chmod(folder, 0o755)  # whatever the umask: the account must pass through
    if is_dir:
        if not os.path.isdir(dest):
            os.mkdir(dest)
            os.chmod(dest, 0o755)
    elif not os.path.exists(dest):
        os.close(os.open(dest, os.O_CREAT | os.O_WRONLY, 0o600))
    _check(_libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, os.fsencode(dest), MOVE_MOUNT_F_EMPTY_PATH), f"move_mount {dest}")
    os.close(fd)


def enter_netns(spec: dict, fds: list[int]) -> None:
    """Enter the network namespace a claim carries (its last descriptor; removed from ``fds``), for good and before any
    other thread exists: a thread already running would stay in the old namespace, so that claim is refused."""
    if not spec.get("netns"):
        return
    fd = fds.pop()
    try:
        import threading

        if threading.active_count() != 1:
            raise OSError(f"{threading.active_count()} threads run: a network namespace is entered by a single thread")
        _check(_libc.setns(fd, CLONE_NEWNET), "setns")
    finally:
        os.close(fd)


def attach_mounts(described: list[dict], fds: list[int]) -> None:
    """Attach the claim's descriptors at the paths its spec names (``[{"dest", "dir"}]``, in that order)."""
    if len(described) != len(fds):
        for fd in fds:
            os.close(fd)
        raise ValueError(f"{len(described)} mounts described, {len(fds)} descriptors received")
    for m, fd in zip(described, fds):
        attach(fd, m["dest"], m["dir"])


environ_note = ""  # why /proc/self/environ could not be made the claimer's ("" when it was, or never asked)
claim_notes: list[str] = []  # anything else the claim could not do and the server runs without (for the hub's log)


def environ_block(env: dict) -> bytes:
    """``env`` as ``execve`` lays out a new process's environment: ``KEY=VALUE`` entries, each ended by a NUL.
    ValueError where ``execve`` could not pass it (a NUL anywhere, ``=`` or nothing in a name), as Popen says."""
    out = []
    for k, v in env.items():
        key, value = os.fsencode(k), os.fsencode(v)
        if not key or b"=" in key or b"\0" in key or b"\0" in value:
            raise ValueError(f"environment variable {k!r} cannot be passed to a process")
        out.append(key + b"=" + value + b"\0")
    return b"".join(out)


class _MmMap(ctypes.Structure):
    """``struct prctl_mm_map`` (linux/prctl.h)."""
    _fields_ = [(name, ctypes.c_uint64) for name in ("start_code", "end_code", "start_data", "end_data", "start_brk",
                                                     "brk", "start_stack", "arg_start", "arg_end", "env_start",
                                                     "env_end")] + \
               [("auxv", ctypes.c_void_p), ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]


def _mm_map(env_start: int, env_end: int) -> _MmMap:
    """This process's memory map descriptor as it is now (/proc/self/stat, ``brk`` from libc), with the environment
    at ``[env_start, env_end)``; auxv and /proc/self/exe left as they are."""
    with open("/proc/self/stat", "rb") as f:
        stat_line = f.read()
    fields = stat_line[stat_line.rindex(b")") + 2:].split()  # field 3 (state) onwards: the name may hold anything

    def field(n: int) -> int:  # proc(5)'s 1-based numbering
        return int(fields[n - 3])

    brk = _libc.sbrk(0)
    return _MmMap(start_code=field(26), end_code=field(27), start_data=field(45), end_data=field(46),
                  start_brk=field(47), brk=brk, start_stack=field(28), arg_start=field(48), arg_end=field(49),
                  env_start=env_start, env_end=env_end, auxv=None, auxv_size=0, exe_fd=0xFFFFFFFF)


def show_environ(env: dict) -> str:
    """Make what ``/proc/<pid>/environ`` of this process reads (``ps e``, the platform's and tests' scans) ``env``,
    as ``execve`` of a cold start would have it, not the environment this process was started with.

    ``prctl(PR_SET_MM, PR_SET_MM_MAP)`` moves the environment's bounds in one call (``PR_SET_MM_ENV_START`` and
    ``_END`` one at a time need ``CAP_SYS_RESOURCE``, which containers often drop; the map needs no capability for
    these fields) to a block that is never freed (malloc'd outside Python: not even the interpreter's shutdown frees
    it while the process still runs). The map rewrites every field: ``brk`` is read just before, and the process is
    single-threaded at claim (were another thread to move ``brk`` in between, only a later ``brk`` would fail, and
    malloc map memory instead). Where the call fails (a kernel without
    ``CONFIG_CHECKPOINT_RESTORE``, seccomp) the process carries on (``os.environ``, and so what it executes, is
    right either way): returns, and keeps in ``environ_note`` for the claim's answer, why; "" when it worked.
    ValueError for an environment no process could be given (:func:`environ_block`)."""
    global environ_note
    data = environ_block(env)
    start = _libc.malloc(len(data) + 1)  # one more NUL after the block: env_end lies inside the allocation
    if not start:
        environ_note = f"/proc/{os.getpid()}/environ keeps the warm start's environment (no memory for it)"
        return environ_note
    ctypes.memmove(start, data + b"\0", len(data) + 1)
    mm_map = _mm_map(start, start + len(data))
    if _libc.prctl(PR_SET_MM, PR_SET_MM_MAP, ctypes.byref(mm_map), ctypes.c_ulong(ctypes.sizeof(mm_map)),
                   ctypes.c_ulong(0)) < 0:
        err = ctypes.get_errno()
        environ_note = (f"/proc/{os.getpid()}/environ keeps the warm start's environment "
                        f"(prctl(PR_SET_MM_MAP): {os.strerror(err)})")
        return environ_note
    environ_note = ""
    return ""


def become(uid: int, gid: int) -> None:
    """The user's account for good: no capability can come back (bounding set emptied, then the ids change
    from root, which clears the others; no_new_privs keeps setuid binaries from giving any).

    The id change also makes the process non-dumpable; it is made dumpable again, as the ``execve`` of a cold start
    leaves a process whose ids all are the user's: the user's own processes may then read its /proc files
    (``/proc/<pid>/environ``, which a non-dumpable process cannot open even as itself) and debug it, as they may a
    cold one. Nothing of anyone else is in it: before its claim it ran only the platform's code."""
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0 or ctypes.get_errno() != 22:  # EINVAL: past the last
        cap += 1
        if cap > 128:
            break
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid or os.getgroups():
        raise OSError("the account switch did not hold")


def startup_differences(env: dict, launched: dict, patterns) -> list[str]:
    """Start-up variables (names matching ``patterns``) whose value in ``env`` differs from the one a warm
    interpreter started with (``launched``): what a running interpreter cannot take on later."""
    keys = {k for k in {*env, *launched} if any(fnmatch.fnmatchcase(k, p) for p in patterns)}
    return sorted(k for k in keys if env.get(k) != launched.get(k))
