"""Each user's own network namespace, and the gate: the only way into and out of it.

On one machine every process shares the loopback interface by default, so a user's kernel could
connect to another user's kernel ports (and read their IOPub: their outputs and code), their
TensorBoard or their server. As root, trainhub therefore runs all of one user's processes (servers,
kernels, terminals, job workers) in a network namespace of that user's own (``/run/netns/th-<account>``):
it holds a loopback interface and nothing else. Whatever must cross crosses through the **gate**, a
part of the platform that owns listening sockets on both sides:

- **out, to the platform**: in each namespace the gate listens on ``127.0.0.1:P`` for each platform port
  P (the hub, the public proxy, the jobs and culler services, an S3 endpoint on loopback) and forwards
  each connection to ``127.0.0.1:P`` of the machine: the URLs a server and a job get are unchanged, and
  every service they reach authenticates them as before;
- **out, to the internet**: an HTTP proxy in each namespace (``127.0.0.1:3128``, set as ``HTTPS_PROXY``
  for the user's processes) that connects only to addresses outside the machine and outside private
  networks (``UserNetwork.egress_deny``), so ``pip install`` works and the machine's other services and
  the local network stay out of reach;
- **in, from the proxy**: a server listens on loopback inside its namespace; the gate exposes it on a
  port of the machine's loopback (``expose``), which only the platform's processes can reach (every
  user's process is in its own namespace), and JupyterHub's proxy routes there.

The gate binds a namespace's listening sockets before any process of the user runs in it, so no user
process can take those ports first (and a namespace holds one user's processes only). The workers of one
job share their user's namespace, so they meet on its loopback (DDP's rendezvous), as a user's server and
its TensorBoard do. The gate runs in ``trainhub up`` (a thread of its own) and answers the hub and the
jobs service on a Unix socket only root can use (:class:`GateClient`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import ipaddress
import json
import logging
import os
import shutil
import socket
import struct
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from traitlets import Bool, CaselessStrEnum, Float, Integer, List, Unicode, default
from traitlets.config import LoggingConfigurable

NETNS_DIR = "/run/netns"
#: the gate's socket, set by `trainhub up` for the hub and the services it starts
GATE_SOCKET_VAR = "TRAINHUB_GATE_SOCKET"
NETNS_PREFIX = "th"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
log = logging.getLogger("trainhub.gate")

#: what the egress proxy never connects to unless UserNetwork.egress_allow says so
DEFAULT_DENY = ["0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
                "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/3", "::/128", "::1/128", "fc00::/7",
                "fe80::/10", "ff00::/8", "::ffff:0:0/96"]


class GateError(RuntimeError):
    """The gate could not do what was asked (a namespace, a port): the spawn or job start says why."""


class UserNetwork(LoggingConfigurable):
    enabled = CaselessStrEnum(
        ["auto", "on", "off"], "auto",
        help="""A network namespace per user (docs/isolation.md, "Network"): "auto" = on when `trainhub up` runs as root
        with per-user accounts and `ip` (iproute2) is installed; "on" = always (refuse to start without it); "off" =
        every process shares the machine's network (any user's process can connect to any other's listening ports).""",
    ).tag(config=True)

    egress = Bool(
        True,
        help="""An HTTP/HTTPS proxy in every user namespace (HTTPS_PROXY/HTTP_PROXY are set for their processes) that
        reaches addresses outside the machine and outside private networks: pip, conda, git over https and
        downloads work; the machine's own services and the local network do not (except the platform's ports, which
        the gate forwards). False: no way out but the platform's ports.""",
    ).tag(config=True)

    egress_port = Integer(3128, help="Port of the egress proxy on each namespace's loopback.").tag(config=True)

    egress_deny = List(
        Unicode(), list(DEFAULT_DENY),
        help="Networks (CIDR) the egress proxy never connects to: loopback, private, link-local, multicast, reserved.",
    ).tag(config=True)

    egress_allow = List(
        Unicode(),
        help="Networks (CIDR) the egress proxy reaches even though egress_deny lists them, e.g. ['10.1.2.3/32'] for a "
        "package mirror on the local network.",
    ).tag(config=True)

    forward_ports = List(
        Integer(),
        help="Ports of the machine's loopback every user namespace reaches at the same port (the gate forwards them). "
        "`trainhub up` adds the hub's, the public proxy's, the services' and a loopback S3 endpoint's.",
    ).tag(config=True)

    max_connections = Integer(
        1024, help="Connections the gate carries at once for one user (in and out together); more are refused.",
    ).tag(config=True)

    connect_timeout = Float(15.0, help="Seconds the gate waits to connect to either side.").tag(config=True)

    ip = Unicode(help="The ip command (iproute2). Default: ip on PATH.").tag(config=True)

    @default("ip")
    def _ip_default(self):
        return shutil.which("ip") or "/usr/sbin/ip"

    def wanted(self, accounts_on: bool) -> bool:
        """Whether namespaces are used, as ``enabled`` and the machine say."""
        if self.enabled == "off":
            return False
        if self.enabled == "on":
            return True
        return accounts_on and os.geteuid() == 0 and os.access(self.ip, os.X_OK)

    def problems(self, accounts_on: bool) -> list[str]:
        out = []
        if self.enabled == "on" and os.geteuid() != 0:
            out.append("c.UserNetwork.enabled = 'on' needs `trainhub up` to run as root (namespaces are made as root)")
        if self.enabled == "on" and not os.access(self.ip, os.X_OK):
            out.append("c.UserNetwork.enabled = 'on' but the ip command is missing: apt-get install iproute2")
        for cidr in [*self.egress_deny, *self.egress_allow]:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError as e:
                out.append(f"c.UserNetwork: {cidr!r} is not a network: {e}")
        return out


def platform_prefix(data_dir: str) -> str:
    """The names of one platform's namespaces (``th<digest of its data dir>-<account>``): two platforms on one
    machine (a test run starts several) never share, remove or replace each other's namespaces."""
    return f"{NETNS_PREFIX}{hashlib.sha256(os.path.realpath(data_dir).encode()).hexdigest()[:8]}-"


def netns_path(name: str) -> str:
    return os.path.join(NETNS_DIR, name)


def proxy_env(port: int) -> dict[str, str]:
    """The variables that send a user's HTTP(S) traffic through the egress proxy, loopback excepted."""
    url = f"http://127.0.0.1:{port}"
    no = "127.0.0.1,localhost,::1"
    return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url, "NO_PROXY": no, "no_proxy": no}


# -- sockets inside a namespace ----------------------------------------------------------------------
def _enter(path: str) -> None:
    """Move the calling thread into the network namespace at ``path`` (setns(2) affects one thread)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns {path}: {os.strerror(e)}")
    finally:
        os.close(fd)


class Namespace:
    """One user's namespace as the gate holds it: a thread inside it that makes sockets there, the listeners the
    gate bound in it, the ports it exposes and the connections it carries."""

    def __init__(self, name: str):
        self.name, self.path = name, netns_path(name)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"netns-{name}", initializer=_enter, initargs=(self.path,))
        self.servers: list[asyncio.base_events.Server] = []
        self.exposed: dict[int, tuple[int, asyncio.base_events.Server]] = {}  # inner port -> (host port, server)
        self.connections = 0

    def socket(self, bind: tuple[str, int] | None = None, listen: bool = False) -> socket.socket:
        """A TCP socket of this namespace (made by its thread), bound and listening as asked."""
        def make():
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                if bind:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(bind)
                if listen:
                    s.listen(128)
                s.setblocking(False)
                return s
            except BaseException:
                s.close()
                raise

        return self.pool.submit(make).result()

    def remount(self) -> None:
        """Mount this namespace at its path again (blocking): its name was removed from outside (``ip netns delete``:
        an admin's ``ip netns delete``) while the namespace lives on, its
        listeners and the user's processes in it. A fork of this namespace's thread is in it, so its ``mount``
        binds it, the same namespace, not a new one."""
        def remount():
            os.makedirs(NETNS_DIR, exist_ok=True)
            os.close(os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444))
            _run(["mount", "--bind", "/proc/self/ns/net", self.path])

        self.pool.submit(remount).result()

    def close(self) -> None:
        for srv in self.servers:
            srv.close()
        for _host_port, srv in self.exposed.values():
            srv.close()
        self.pool.shutdown(wait=False)


@dataclass
class _Rules:
    deny: list = field(default_factory=list)
    allow: list = field(default_factory=list)

    def permits(self, address: str) -> bool:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if any(ip in n for n in self.allow):
            return True
        if any(ip in n for n in self.deny) or (ip.version == 6 and ip.ipv4_mapped is not None):
            return False
        return not _is_this_machine(ip)


def _is_this_machine(ip) -> bool:
    """An address of one of this machine's own interfaces (its public address too: a service bound to 0.0.0.0 on the
    machine is the machine's, not the internet's). Binding to an address succeeds only where it is local."""
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((str(ip), 0))
        except OSError:
            return False
    return True


class Gate:
    """The gate's work, on one asyncio loop (``run`` in a thread of `trainhub up`)."""

    def __init__(self, config: UserNetwork, socket_path: str, prefix: str = NETNS_PREFIX + "-"):
        self.config = config
        self.socket_path = socket_path
        self.prefix = prefix  # this platform's namespaces: platform_prefix(data dir)
        self.namespaces: dict[str, Namespace] = {}
        self.rules = _Rules([ipaddress.ip_network(c, strict=False) for c in config.egress_deny],
                            [ipaddress.ip_network(c, strict=False) for c in config.egress_allow])
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()
        self._rpc: asyncio.base_events.Server | None = None
        self.started = threading.Event()
        self.error: BaseException | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start_thread(self) -> threading.Thread:
        """Run the gate on a thread of its own; returns once it answers (GateError if it could not start)."""
        t = threading.Thread(target=self._thread, name="trainhub-gate", daemon=True)
        t.start()
        self.started.wait(30)
        if self.error is not None:
            raise GateError(f"the network gate did not start: {self.error}")
        return t

    def _thread(self) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.loop.run_until_complete(self._start())
        except BaseException as e:
            self.error = e
            self.started.set()
            return
        self.started.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self._lock = asyncio.Lock()
        remove_leftovers(self.config.ip, self.prefix)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        old = os.umask(0o077)
        try:
            self._rpc = await asyncio.start_unix_server(self._serve_rpc, self.socket_path)
        finally:
            os.umask(old)
        os.chmod(self.socket_path, 0o600)

    def stop(self) -> None:
        """Close every listener and remove the namespaces (their processes have ended by then)."""
        if self.loop is None or not self.loop.is_running():
            return

        async def close():
            if self._rpc is not None:
                self._rpc.close()
            for ns in self.namespaces.values():
                ns.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        for name in list(self.namespaces):
            _run([self.config.ip, "netns", "delete", name], check=False)
        self.namespaces.clear()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    # -- the requests ------------------------------------------------------------------------------
    async def ensure_account(self, account: str) -> str:
        """The namespace of the account ``account`` (a Unix account name); returns its path."""
        if not account or not all(c.isalnum() or c in "_-" for c in account) or len(account) > 32:
            raise GateError(f"{account!r} is not an account name")
        return await self.ensure(self.prefix + account)

    async def ensure(self, name: str) -> str:
        """The namespace ``name`` (made with its listeners when new); returns its path."""
        if not name.startswith(self.prefix) or "/" in name or len(name) > 64:
            raise GateError(f"{name!r} is not a user namespace of this platform")
        async with self._lock:
            ns = self.namespaces.get(name)
            if ns is not None:
                if not os.path.exists(ns.path):  # removed from outside: the same namespace, under its name again
                    log.warning("network namespace %s was removed from outside; mounting it again", name)
                    await asyncio.to_thread(ns.remount)
                return ns.path
            await asyncio.to_thread(make_netns, self.config.ip, name)
            ns = Namespace(name)
            try:
                for port in dict.fromkeys(self.config.forward_ports):
                    sock = await asyncio.to_thread(ns.socket, ("127.0.0.1", port), True)
                    ns.servers.append(await asyncio.start_server(
                        lambda r, w, p=port, n=ns: self._forward_out(n, r, w, p), sock=sock))
                if self.config.egress:
                    sock = await asyncio.to_thread(ns.socket, ("127.0.0.1", self.config.egress_port), True)
                    ns.servers.append(await asyncio.start_server(lambda r, w, n=ns: self._egress(n, r, w), sock=sock))
            except BaseException:
                ns.close()
                await asyncio.to_thread(_run, [self.config.ip, "netns", "delete", name], False)
                raise
            self.namespaces[name] = ns
            log.info("network namespace %s ready (forwards %s%s)", name, sorted(set(self.config.forward_ports)),
                     f", egress proxy :{self.config.egress_port}" if self.config.egress else "")
            return ns.path

    async def expose(self, name: str, port: int) -> int:
        """A port of the machine's loopback leading to ``127.0.0.1:port`` inside ``name``; the same one when asked again."""
        await self.ensure(name)
        ns = self.namespaces[name]
        if not 0 < int(port) < 65536:
            raise GateError(f"port {port} is not a port")
        if port in ns.exposed:
            return ns.exposed[port][0]
        srv = await asyncio.start_server(lambda r, w: self._forward_in(ns, r, w, port), "127.0.0.1", 0)
        host_port = srv.sockets[0].getsockname()[1]
        ns.exposed[port] = (host_port, srv)
        return host_port

    async def unexpose(self, name: str, port: int) -> None:
        ns = self.namespaces.get(name)
        if ns is not None and port in ns.exposed:
            ns.exposed.pop(port)[1].close()

    # -- carrying connections ----------------------------------------------------------------------
    def _admit(self, ns: Namespace, writer) -> bool:
        if ns.connections >= self.config.max_connections:
            log.warning("%s: %d connections at once, refusing more (UserNetwork.max_connections)", ns.name, ns.connections)
            writer.close()
            return False
        ns.connections += 1
        return True

    async def _forward_out(self, ns: Namespace, reader, writer, port: int) -> None:
        """From inside a namespace to the same port of the machine's loopback."""
        if not self._admit(ns, writer):
            return
        try:
            r2, w2 = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), self.config.connect_timeout)
        except (OSError, asyncio.TimeoutError):
            ns.connections -= 1
            writer.close()
            return
        await self._pipe(ns, reader, writer, r2, w2)

    async def _forward_in(self, ns: Namespace, reader, writer, port: int) -> None:
        """From the machine's loopback (the proxy, the hub) to a server inside a namespace."""
        if not self._admit(ns, writer):
            return
        try:
            sock = await asyncio.get_running_loop().run_in_executor(ns.pool, _tcp_socket)
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port)), self.config.connect_timeout)
            r2, w2 = await asyncio.open_connection(sock=sock)
        except (OSError, asyncio.TimeoutError):
            ns.connections -= 1
            writer.close()
            return
        await self._pipe(ns, reader, writer, r2, w2)

    async def _pipe(self, ns: Namespace, r1, w1, r2, w2) -> None:
        try:
            await asyncio.gather(_copy(r1, w2), _copy(r2, w1))
        finally:
            ns.connections -= 1
            for w in (w1, w2):
                w.close()

    async def _egress(self, ns: Namespace, reader, writer) -> None:
        """The egress proxy: ``CONNECT host:port`` (HTTPS) or an absolute-URI request (plain HTTP), to addresses
        the rules permit only."""
        if not self._admit(ns, writer):
            return
        counted = True
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, OSError):
                return
            request = _parse_proxy_request(head)
            if request is None:
                writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            method, host, port, rest = request
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError:
                writer.write(_answer(502, f"trainhub egress: cannot resolve {host}"))
                return
            addresses = [i[4][0] for i in infos]
            refused = [a for a in addresses if not self.rules.permits(a)]
            if refused or not addresses:
                log.info("%s: egress to %s:%s refused (%s)", ns.name, host, port, ", ".join(refused))
                writer.write(_answer(403, f"trainhub egress: {host} ({', '.join(refused)}) is on this machine or a "
                                          "private network, which users' processes do not reach (c.UserNetwork.egress_allow)"))
                return
            try:
                r2, w2 = await asyncio.wait_for(asyncio.open_connection(addresses[0], port), self.config.connect_timeout)
            except (OSError, asyncio.TimeoutError) as e:
                writer.write(_answer(502, f"trainhub egress: cannot connect to {host}:{port}: {e}"))
                return
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                w2.write(rest)
            counted = False
            await self._pipe(ns, reader, writer, r2, w2)
        finally:
            if counted:
                ns.connections -= 1
                writer.close()

    # -- the RPC -----------------------------------------------------------------------------------
    async def _serve_rpc(self, reader, writer) -> None:
        sock = writer.get_extra_info("socket")
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        try:
            if uid != os.geteuid():
                writer.write(json.dumps({"error": "the gate answers the platform only"}).encode() + b"\n")
                return
            while True:
                line = await reader.readline()
                if not line:
                    return
                try:
                    req = json.loads(line)
                    op = req.get("op")
                    if op == "ensure":
                        out = {"netns": await self.ensure_account(str(req["account"])),
                               "env": proxy_env(self.config.egress_port) if self.config.egress else {}}
                    elif op == "expose":
                        out = {"host_port": await self.expose(str(req["name"]), int(req["port"]))}
                    elif op == "unexpose":
                        await self.unexpose(str(req["name"]), int(req["port"]))
                        out = {}
                    elif op == "status":
                        out = {"namespaces": {n: {"exposed": {str(k): v[0] for k, v in ns.exposed.items()},
                                                  "connections": ns.connections} for n, ns in self.namespaces.items()}}
                    else:
                        raise GateError(f"unknown request {op!r}")
                    writer.write(json.dumps({"ok": True, **out}).encode() + b"\n")
                except Exception as e:
                    writer.write(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode() + b"\n")
                await writer.drain()
        finally:
            writer.close()


def _tcp_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    return s


async def _copy(reader, writer) -> None:
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError):
            if writer.can_write_eof():
                writer.write_eof()


def _answer(code: int, text: str) -> bytes:
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[code]
    body = (text + "\n").encode()
    return (f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


def _parse_proxy_request(head: bytes):
    """(method, host, port, request to forward) of a proxy request head; None when it is not one."""
    try:
        first, _, headers = head.decode("latin-1").partition("\r\n")
        method, target, version = first.split(" ")
    except ValueError:
        return None
    if not version.startswith("HTTP/1."):
        return None
    if method == "CONNECT":
        host, sep, port = target.rpartition(":")
        if not sep or not port.isdigit():
            return None
        return method, host.strip("[]"), int(port), b""
    if not target.startswith("http://"):
        return None
    rest = target[len("http://"):]
    authority, slash, path = rest.partition("/")
    host, sep, port = authority.rpartition(":")
    if not sep or not port.isdigit():
        host, port = authority, "80"
    kept = [h for h in headers.split("\r\n") if h and not h.lower().startswith(("proxy-connection:", "connection:", "proxy-authorization:"))]
    forwarded = f"{method} /{path if slash else ''} {version}\r\n" + "\r\n".join(kept + ["Connection: close"]) + "\r\n\r\n"
    return method, host.strip("[]"), int(port), forwarded.encode("latin-1")


# -- namespaces ----------------------------------------------------------------------------------------
def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise GateError(f"{' '.join(cmd)}: {r.stderr.strip() or r.returncode}")
    return r


def make_netns(ip: str, name: str) -> None:
    """``ip netns add NAME`` with its loopback up (a leftover of the same name is replaced)."""
    if os.path.exists(netns_path(name)):
        _run([ip, "netns", "delete", name], check=False)
    _run([ip, "netns", "add", name])
    _run([ip, "-n", name, "link", "set", "lo", "up"])


def remove_leftovers(ip: str, prefix: str) -> list[str]:
    """Namespaces of an earlier run of this platform (they are made anew when a user's process starts)."""
    try:
        names = [n for n in os.listdir(NETNS_DIR) if n.startswith(prefix)]
    except FileNotFoundError:
        return []
    for n in names:
        _run([ip, "netns", "delete", n], check=False)
    return names


# -- the platform's side -------------------------------------------------------------------------------
class GateClient:
    """How the hub and the jobs service ask the gate (blocking; call it on a worker thread)."""

    def __init__(self, socket_path: str, timeout: float = 30.0):
        self.socket_path, self.timeout = socket_path, timeout

    def _call(self, **req) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(self.timeout)
            try:
                s.connect(self.socket_path)
            except OSError as e:
                raise GateError(f"the network gate does not answer at {self.socket_path} ({e.strerror or e}): is "
                                "`trainhub up` running?") from None
            s.sendall(json.dumps(req).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
        reply = json.loads(data or b"{}")
        if not reply.get("ok"):
            raise GateError(reply.get("error") or "the network gate closed the connection")
        return reply

    def ensure(self, account: str) -> str:
        return self.ensure_env(account)[0]

    def ensure_env(self, account: str) -> tuple[str, dict]:
        """(the account's namespace path, the variables a process in it needs: the egress proxy's)."""
        reply = self._call(op="ensure", account=account)
        return reply["netns"], dict(reply.get("env") or {})

    def expose(self, name: str, port: int) -> int:
        return int(self._call(op="expose", name=name, port=port)["host_port"])

    def unexpose(self, name: str, port: int) -> None:
        self._call(op="unexpose", name=name, port=port)

    def status(self) -> dict:
        return self._call(op="status")["namespaces"]


class UserNetworks:
    """The platform's side of the gate in the hub or the jobs service: where each user's processes must run."""

    def __init__(self, socket_path: str):
        self.client = GateClient(socket_path)

    @classmethod
    def from_environment(cls, socket_path: str | None = None) -> "UserNetworks | None":
        """The gate `trainhub up` runs (``$TRAINHUB_GATE_SOCKET``), or None: no namespaces (the machine's network)."""
        path = socket_path if socket_path is not None else os.environ.get(GATE_SOCKET_VAR, "")
        return cls(path) if path else None

    def place(self, account_name: str) -> tuple[str, dict]:
        """(namespace path, environment) of an account's processes; blocking. GateError when the gate cannot."""
        return self.client.ensure_env(account_name)
