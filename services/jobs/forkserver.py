"""Warm start for Python-script jobs: a long-lived interpreter that forks each worker.

A cold start of a `script` job costs two interpreter starts before the first output line
(the ``worker.py`` wrapper, then ``python -u script.py`` with its full ``site`` start).
The fork server pays for one interpreter start once: it has imported ``site`` (so the
venv's packages are importable) and the few standard-library modules the wrapper needs,
and then, per worker, forks::

    fork server (long-lived, its own session, tagged with the platform's instance marker)
     └─ wrapper   setsid() (own session and process group, pgid = its pid = the worker's "pid"),
        │         timestamps the pipe's lines into the log (worker.copy_output), waits, writes the exit file
        └─ worker environment, cwd, argv, signals and stdio of `python -u script.py`;
                  the script runs as ``__main__`` and the interpreter exits as it would after it

Protocol (one request per connection on a 0600 Unix socket, JSON lines)::

    -> {"op": "spawn", "script": P, "args": [], "env": {...}, "cwd": D, "log": L, "exit_file": E,
        "rank": N, "wrapper_err": W}
    <- {"pid": <wrapper pid>}  (sent by the wrapper after setsid() and forking the worker, which waits)
    -> "go"                    (the launcher has the pid; without it both exit and nothing ran)
    -> {"op": "wrap", "argv": [worker.py's arguments], "env": {...}, "wrapper_err": W, "fd": N}  + one descriptor
    <- {"pid": <wrapper pid>}  then "go", as for spawn: a cold worker's wrapper (below)
    -> {"op": "ping"} <- {"pid": <server pid>, "protocol": 1}
    -> {"op": "stop"} <- {"ok": true}, then the server exits
    <- {"error": "...", "cold": true}   the request is fine but must take the cold path (see below)
    <- {"error": "...", "restart": true}  site-packages changed since the server started: it exits,
                                        and the launcher starts a new one for the request

``wrap`` forks the wrapper of a worker that starts cold (an isolated one: its command is the sandbox, setpriv and
envexec chain): ``worker.main(argv)`` in a fork instead of a new ``python -S -P worker.py`` (an interpreter start per
cold job, about 11 ms of CPU on the reference machine). It gets ``env`` (the platform's, never the job's) and the
descriptor sent with the request (SCM_RIGHTS: the job's environment for envexec) under the number ``fd`` that
``argv`` names.

The server reaps its wrapper children on SIGCHLD; they never stay zombies. The wrappers do
not depend on the server: it can stop or die while they run.

What the script sees differs from ``python -u script.py`` only where a fork cannot redo the
interpreter's start-up: the hash seed is the server's (shared by all warm workers),
``/proc/<pid>/cmdline`` and ``/proc/<pid>/environ`` are the server's (``os.environ`` is the
job's, and so is the environment of anything the script executes). Jobs whose environment
would change the start-up itself (``PYTHONHASHSEED``, ``PYTHONOPTIMIZE``, ``PYTHONWARNINGS``...,
another locale, another ``HOME`` when user site-packages are on) are answered ``cold`` and
take the ordinary path. The server never imports heavy modules (no torch, numpy, CUDA:
forking after CUDA initialisation is unsafe); each worker is the fork of a fresh interpreter.

    python -u .../services/jobs/forkserver.py --socket <jobs_dir>/.forkserver.sock

The launcher-side client (:class:`ForkServer`) is at the end of this module.
"""

import json
import os
import signal
import socket
import struct
import sys

PROTOCOL = 1
SOCKET_NAME = ".forkserver.sock"
GO = b"go\n"

# start-up variables a fork can honour; any other PYTHON* variable in a job's environment means "cold"
_WARM_PYTHON_VARS = {"PYTHONUNBUFFERED", "PYTHONPATH", "PYTHONIOENCODING", "PYTHONBREAKPOINT", "PYTHONSTARTUP"}
_LOCALE_VARS = ("LANG", "LC_ALL", "LC_CTYPE")
_WAIT_GO = 60.0  # seconds a wrapper waits for the launcher's "go"
_READ_REQUEST = 10.0

if __package__:
    from . import worker
else:  # run by path (the fork server): the same file, under a name no script can shadow
    import importlib.util as _ilu

    _spec = _ilu.spec_from_file_location("_trainhub_jobs_worker", os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py"))
    worker = _ilu.module_from_spec(_spec)
    sys.modules[_spec.name] = worker
    _spec.loader.exec_module(worker)


# -- socket helpers (both sides) -----------------------------------------------------------------
def _address(path: str) -> tuple[str, int | None]:
    """A bind/connect address for ``path``; long paths go through an O_PATH descriptor of the folder
    (AF_UNIX paths are limited to 107 bytes). Returns (address, fd to close afterwards or None)."""
    if len(os.fsencode(path)) < 100:
        return path, None
    folder, name = os.path.split(path)
    fd = os.open(folder or ".", os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{name}", fd


def _connect(path: str, timeout: float) -> socket.socket:
    addr, fd = _address(path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.connect(addr)
    except BaseException:
        s.close()
        raise
    finally:
        if fd is not None:
            os.close(fd)
    return s


def _send(conn: socket.socket, obj) -> None:
    conn.sendall(json.dumps(obj).encode() + b"\n")


def _read_request(conn: socket.socket, limit: int = 16 << 20) -> tuple[bytes, list[int]]:
    """One message and the descriptors sent with it (SCM_RIGHTS, at most one)."""
    buf, fds = b"", []
    try:
        while b"\n" not in buf:
            chunk, got, _flags, _addr = socket.recv_fds(conn, 65536, 1)
            fds += got
            if not chunk:
                break
            buf += chunk
            if len(buf) > limit:
                raise ValueError("request too large")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    end = buf.find(b"\n")
    return (buf[:end + 1] if end >= 0 else buf), fds


def _read_line(conn: socket.socket, limit: int = 16 << 20) -> bytes:
    """One message (a line; what follows it, if anything, is dropped)."""
    buf = b""
    while b"\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > limit:
            raise ValueError("request too large")
    end = buf.find(b"\n")
    return buf[:end + 1] if end >= 0 else buf  # no newline: cut short (EOF)


# -- the server --------------------------------------------------------------------------------
def _log(msg: str) -> None:
    try:
        os.write(2, f"trainhub forkserver {os.getpid()}: {msg}\n".encode(errors="replace"))
    except OSError:
        pass


def _reap(*_) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _listen(path: str) -> socket.socket:
    """Bind a 0600 socket under a temporary name, then rename it onto ``path`` (replacing a stale one)."""
    tmp = f"{path}.{os.getpid()}"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    addr, fd = _address(tmp)
    old = os.umask(0o177)
    try:
        s.bind(addr)
    finally:
        os.umask(old)
        if fd is not None:
            os.close(fd)
    os.chmod(tmp, 0o600)
    s.listen(64)
    os.replace(tmp, path)
    return s


def cold_reason(env: dict, server_env=None) -> str | None:
    """Why a job with environment ``env`` cannot be forked from this interpreter (None: it can)."""
    server_env = os.environ if server_env is None else server_env
    for k in sorted(env):
        if k.startswith("PYTHON") and k not in _WARM_PYTHON_VARS and env[k] != server_env.get(k):
            return f"{k} is set"
    for k in _LOCALE_VARS:
        if env.get(k) != server_env.get(k):
            return f"{k} differs from the fork server's"
    import site

    if site.ENABLE_USER_SITE:
        for k in ("HOME", "PYTHONUSERBASE"):
            if env.get(k) != server_env.get(k):
                return f"{k} differs and user site-packages are enabled"
    return None


def _site_stamp() -> list:
    import site

    dirs = list(site.getsitepackages()) + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    stamp = []
    for d in dirs:
        try:
            stamp.append((d, os.stat(d).st_mtime_ns))
        except OSError:
            stamp.append((d, None))
    return stamp


_SITE_STAMP = [None]


def serve(listener: socket.socket, path: str) -> dict | None:
    """Accept requests until told to stop (returns None), or, in a forked worker, return its request."""
    me = os.getpid()
    inode = os.stat(path).st_ino
    _SITE_STAMP[0] = _site_stamp()
    worker._stamper()()  # what every wrapper and worker needs, imported once here
    import gc
    import types  # noqa: F401
    from importlib.machinery import SourceFileLoader  # noqa: F401

    gc.freeze()  # what is loaded now stays out of the children's collections (fewer copy-on-write faults)
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        try:
            conn, _ = listener.accept()
        except OSError as e:  # pragma: no cover - EMFILE and the like: do not spin
            _log(f"accept failed: {e}")
            import time

            time.sleep(0.1)
            continue
        try:
            job = _handle(conn, listener, me)
        except StopIteration as stop:
            try:  # unless a newer server has already taken the path over
                if os.stat(path).st_ino == inode:
                    os.unlink(path)
            except OSError:
                pass
            try:
                if not stop.args:
                    _send(conn, {"ok": True})
            except OSError:
                pass
            conn.close()
            listener.close()
            _log("stopped")
            return None
        except Exception as e:
            _log(f"request failed: {e!r}")
            job = None
            try:
                _send(conn, {"error": str(e)})
            except OSError:
                pass
        if os.getpid() != me:  # the worker: leave the server's loop behind
            return job
        conn.close()


def _handle(conn: socket.socket, listener: socket.socket, me: int):
    conn.settimeout(_READ_REQUEST)
    uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
    if uid != os.getuid():
        raise PermissionError(f"refused a connection from uid {uid}")
    line, fds = _read_request(conn)
    try:
        req = json.loads(line or b"{}")
        op = req.get("op")
        if op in ("spawn", "wrap") and _site_stamp() != _SITE_STAMP[0]:
            # packages installed since (trainhub's own code among them): .pth files are read at start-up only
            _send(conn, {"error": "site-packages changed since the fork server started", "restart": True})
            raise StopIteration("answered")
        if op == "wrap":
            if len(fds) != 1:
                raise ValueError("wrap needs the descriptor it names")
            pid = os.fork()
            if pid:
                return None
            try:  # the wrapper: never returns
                _wrap(conn, listener, req, fds[0])
            except BaseException as e:  # noqa: BLE001 - a forked child must never fall back into the server loop
                _log(f"wrapper failed: {e!r}")
            os._exit(70)
    finally:
        for fd in fds:
            os.close(fd)
    if op == "ping":
        _send(conn, {"pid": me, "protocol": PROTOCOL})
        return None
    if op == "stop":
        raise StopIteration
    if op != "spawn":
        raise ValueError(f"unknown op {op!r}")
    reason = cold_reason(req["env"])
    if reason:
        _send(conn, {"error": reason, "cold": True})
        return None
    pid = os.fork()
    if pid:
        return None
    # the wrapper (never returns, except as the worker)
    try:
        return _wrapper(conn, listener, req)
    except BaseException as e:  # noqa: BLE001 - a forked child must never fall back into the server loop
        _log(f"wrapper failed: {e!r}")
        os._exit(70)


def _wrapper(conn: socket.socket, listener: socket.socket, req: dict) -> dict:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    listener.close()
    os.setsid()
    # stay alive through the group's SIGTERM to record the worker's exit (the worker has its own handlers)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    if req.get("wrapper_err"):
        fd = os.open(req["wrapper_err"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    # the worker is forked before the reply (off the path to its first line) and waits for "go" on a pipe;
    # nobody knows the group before the reply, so no signal to it can come before the worker exists
    read_fd, write_fd = os.pipe()
    go_r, go_w = os.pipe()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    pid = os.fork()
    if pid == 0:
        conn.close()
        os.close(read_fd)
        os.close(go_w)
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        _worker_signals()
        go = os.read(go_r, 1)
        os.close(go_r)
        if go != b"g":  # no go: leave without a trace
            os._exit(0)
        return req
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    os.close(write_fd)
    os.close(go_r)
    if not _reply_and_wait_go(conn):  # the launcher gave up on this request: nothing ran
        os.close(go_w)
        os.close(read_fd)
        worker.wait_exit_code(pid)
        os._exit(0)
    os.write(go_w, b"g")
    os.close(go_w)
    worker.copy_output(read_fd, req["log"], int(req["rank"]))
    code = worker.wait_exit_code(pid)
    worker.write_exit_file(req["exit_file"], code)
    os._exit(0)


def _wrap(conn: socket.socket, listener: socket.socket, req: dict, fd: int) -> None:
    """A cold worker's wrapper, forked: what ``Popen([python, -S, -P, worker.py, *argv], env=env,
    start_new_session=True, stdin/stdout=DEVNULL, stderr=wrapper_err, pass_fds=(fd,))`` would run."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    listener.close()
    os.setsid()
    err = os.open(req["wrapper_err"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(err, 2)
    os.close(err)
    number = int(req["fd"])
    if number < 3:
        raise ValueError(f"descriptor number {number} is stdio's")
    if conn.fileno() == number:  # the connection sits where the descriptor must go: move it
        moved = conn.dup()
        conn.close()
        conn = moved
    if fd != number:
        os.dup2(fd, number)  # inheritable: the command chain reads it
        os.close(fd)
    else:
        os.set_inheritable(fd, True)
    os.environ.clear()
    os.environ.update(req["env"])
    argv = [str(a) for a in req["argv"]]
    if not _reply_and_wait_go(conn):  # the launcher gave up on this request: nothing ran
        os._exit(0)
    os._exit(worker.main(argv))


def _reply_and_wait_go(conn: socket.socket) -> bool:
    """A forked wrapper tells the launcher its pid, then waits for its "go" (closes ``conn``); False: none came."""
    _send(conn, {"pid": os.getpid()})
    conn.settimeout(_WAIT_GO)
    try:
        go = _read_line(conn, 16)
    except OSError:
        go = b""
    conn.close()
    return go == GO


def _worker_signals() -> None:
    """A fresh interpreter's dispositions (Python itself ignores SIGPIPE and SIGXFSZ), then unblock."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def prepare_worker(req: dict) -> str:
    """In the forked worker, after "go": become ``python -u script [args]`` (environment, cwd, argv,
    sys.path, stdio; signals are already a fresh interpreter's). Returns the script's path."""
    env = req["env"]
    os.environ.clear()
    os.environ.update(env)
    if req.get("cwd"):
        os.chdir(req["cwd"])
    script = os.path.join(os.getcwd(), req["script"]) if not os.path.isabs(req["script"]) else req["script"]
    sys.argv = [req["script"], *req.get("args", [])]
    # sys.path as `python script.py` builds it: the script's folder, then $PYTHONPATH, then the rest
    rest = sys.path[1:]
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(os.path.realpath(script)), *extra, *rest]
    if env.get("PYTHONIOENCODING"):
        import io

        enc, _, errors = env["PYTHONIOENCODING"].partition(":")
        enc = enc or sys.stdout.encoding
        for name, fd, default_errors in (("stdout", 1, "strict"), ("stderr", 2, "backslashreplace")):
            stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=enc,
                                      errors=errors or default_errors, write_through=True)
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
    return script


def run_script(script: str) -> None:
    """Run ``script`` as ``__main__``; exceptions propagate to the interpreter, which reports them and exits
    as after ``python script.py`` (SystemExit code, traceback and 1, KeyboardInterrupt as SIGINT; atexit,
    non-daemon threads and buffered files handled at shutdown)."""
    import types
    from importlib.machinery import SourceFileLoader

    sys.modules["_trainhub_forkserver"] = sys.modules.get("__main__")  # keep this module alive
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=script, __builtins__=__builtins__, __loader__=SourceFileLoader("__main__", script),
                         __spec__=None, __cached__=None)
    sys.modules["__main__"] = main
    with open(script, "rb") as f:
        source = f.read()
    code = compile(source, script, "exec", dont_inherit=True)

    def hook(etype, value, tb, _orig=sys.excepthook):  # drop this module's frames from tracebacks
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        _orig(etype, value.with_traceback(tb) if tb is not None else value, tb)

    sys.excepthook = hook
    exec(code, main.__dict__)


def main(argv=None) -> dict | None:
    """Serve on ``--socket PATH``; returns None when stopped, or the request in a forked worker."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "--socket":
        raise SystemExit("usage: forkserver.py --socket PATH")
    path = os.path.abspath(argv[1])
    listener = _listen(path)
    os.chdir("/")
    _log(f"listening on {path}")
    return serve(listener, path)


# -- the launcher's side -----------------------------------------------------------------------
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "KEY")


def server_environment(environ: dict) -> dict:
    """The fork server's environment: the service's, less secrets, interpreter start-up variables
    (PYTHON*) and the data dir (nothing needs it; it names the jobs service process alone)."""
    env = {}
    for k, v in environ.items():
        upper = k.upper()
        if any(w in upper for w in SECRET_WORDS) or upper.startswith(("AWS_", "PYTHON", "JUPYTERHUB_")):
            continue
        if upper in ("TRAINHUB_STORAGE_OPTIONS", "TRAINHUB_DATA_DIR", "TRAINHUB_HOLDER"):
            continue
        env[k] = v
    env.setdefault("LANG", "C.UTF-8")  # as the job engine's base environment
    return env


class ForkServerError(Exception):
    """The fork server could not start or answer (the launcher starts the worker cold)."""

    def __init__(self, message: str, cold: bool = False, restart: bool = False):
        super().__init__(message)
        self.cold = cold  # True: the server is fine, this job must take the cold path
        self.restart = restart  # True: the server is stale (it stopped); a new one can fork the job


class ForkServer:
    """Starts, talks to and stops one fork server (a child of the jobs service)."""

    def __init__(self, socket_path: str, log_path: str, env: dict, timeout: float = 10.0, python: str = sys.executable):
        import threading

        self.socket_path, self.log_path, self.env, self.timeout, self.python = socket_path, log_path, env, timeout, python
        self.proc = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def _request(self, obj: dict) -> dict:
        with _connect(self.socket_path, self.timeout) as s:
            _send(s, obj)
            line = _read_line(s)
        if not line:
            raise ConnectionError("no answer")
        return json.loads(line)

    def start(self) -> None:
        """(Re)start the server: ask a previous one on the socket (an earlier service) to stop, start a
        new one, wait until it answers. Raises ForkServerError."""
        import subprocess

        from trainhub.backoff import WaitTimeout, poll  # here: the server process (this file run as a script) never needs it

        with self._lock:
            if self.pid is not None:
                try:
                    if self._request({"op": "ping"}).get("pid") == self.proc.pid:
                        return
                except (OSError, ValueError):
                    pass
                self._stop_locked()
            try:  # a server left by an earlier run of the service (its wrappers are unaffected)
                self._request({"op": "stop"})
            except (OSError, ValueError):
                pass
            script = os.path.abspath(__file__)
            try:
                with open(self.log_path, "ab") as err:
                    self.proc = subprocess.Popen([self.python, "-u", script, "--socket", self.socket_path], env=self.env,
                                                 start_new_session=True, stdin=subprocess.DEVNULL,
                                                 stdout=subprocess.DEVNULL, stderr=err, cwd="/")
            except OSError as e:
                raise ForkServerError(f"cannot start the fork server: {e}") from e

            def answers() -> bool:
                try:
                    if self._request({"op": "ping"}).get("pid") == self.proc.pid:
                        return True
                except (OSError, ValueError):
                    pass
                if self.proc.poll() is not None:
                    raise ForkServerError(f"the fork server exited with {self.proc.returncode} (see {self.log_path})")
                return False

            try:
                poll(answers, what="the fork server to answer", start=0.005, factor=1.0, timeout=self.timeout)
            except WaitTimeout:
                self._stop_locked()
                raise ForkServerError(f"the fork server did not answer within {self.timeout:g} s") from None

    def spawn(self, request: dict) -> int:
        """Fork one worker; its wrapper's pid (= its process group). Starts the server if needed and
        restarts it once if it is gone. Raises ForkServerError (nothing was started then)."""
        return self._fork(dict(request, op="spawn"))

    def wrap(self, argv: list[str], env: dict, wrapper_err: str, fd: int) -> int:
        """Fork the wrapper of a cold worker: ``worker.main(argv)`` with environment ``env``, ``fd`` under its own
        number, stderr appended to ``wrapper_err``. Its pid (= its process group), as ``spawn``."""
        return self._fork({"op": "wrap", "argv": argv, "env": env, "wrapper_err": wrapper_err, "fd": fd}, fd)

    def _fork(self, request: dict, fd: int | None = None) -> int:
        if self.pid is None:
            self.start()
        try:
            return self._spawn(request, fd)
        except ForkServerError as e:
            if not e.restart:
                raise
            self._stop_if_ours()
            self.start()
            return self._spawn(request, fd)
        except (ConnectionError, FileNotFoundError, socket.timeout):
            self._stop_if_ours()  # dead, or alive but not reachable (its socket removed): replace it
            self.start()
            try:
                return self._spawn(request, fd)
            except (OSError, ValueError) as e:
                raise ForkServerError(f"fork server unavailable: {e}") from e
        except (OSError, ValueError) as e:
            raise ForkServerError(f"fork server request failed: {e}") from e

    def _spawn(self, request: dict, fd: int | None = None) -> int:
        with _connect(self.socket_path, self.timeout) as s:
            message = json.dumps(request).encode() + b"\n"
            if fd is None:
                s.sendall(message)
            else:  # the descriptor with the first bytes, the rest after
                sent = socket.send_fds(s, [message], [fd])
                s.sendall(message[sent:])
            line = _read_line(s)
            if not line:
                raise ConnectionError("the fork server closed the connection")
            reply = json.loads(line)
            if "pid" not in reply:
                raise ForkServerError(reply.get("error", "no pid in the answer"), cold=bool(reply.get("cold")),
                                      restart=bool(reply.get("restart")))
            s.sendall(GO)
            return int(reply["pid"])

    def _stop_if_ours(self) -> None:
        with self._lock:
            self._stop_locked(1.0)

    def stop(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._stop_locked(timeout)

    def _stop_locked(self, timeout: float = 5.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            self._request({"op": "stop"})
        except (OSError, ValueError):
            proc.terminate()
        try:
            proc.wait(timeout)
        except Exception:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    _job = main()
    if _job is not None:  # a forked worker: from here on, `python -u script.py`
        run_script(prepare_worker(_job))
