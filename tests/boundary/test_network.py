"""Pattern 2 of issue 32, "users reach each other's sockets on the shared loopback", at the level of the gate
(trainhub.boundary.network): real network namespaces, real processes in them, real connections.

- a process in alice's namespace listening on loopback is reached neither from bob's namespace nor, unless
  the gate exposes it, from anywhere; exposed, the platform (the machine's loopback) reaches it;
- from a namespace, the platform's forwarded ports answer at the same port, no other port of the machine does;
- the egress proxy connects to the internet's addresses only: never to the machine or a private network;
- only root may ask the gate anything.
(The same through a real `trainhub up`: tests/platform/test_isolation.py.)
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

from trainhub.boundary.network import Gate, GateClient, GateError, UserNetwork, netns_path, platform_prefix

PREFIX = platform_prefix(f"/tests/boundary/{os.getpid()}")  # this run's namespaces only (runs may overlap)


def ns(account: str) -> str:
    return PREFIX + account

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nsenter"),
                                reason="network namespaces need root, iproute2 and nsenter")

PROBE = r"""
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    with socket.create_connection((host, port), timeout=3) as s:
        s.sendall(b"ping\n")
        print("answer", s.recv(100).decode().strip())
except OSError as e:
    print("refused", type(e).__name__)
"""


def _echo_server(bind="127.0.0.1"):
    """A server on the machine's loopback that answers 'pong from the machine'."""
    srv = socket.socket()
    srv.bind((bind, 0))
    srv.listen(16)

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c:
                c.recv(100)
                c.sendall(b"pong from the machine\n")

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def _in_ns(name: str, code: str, *args, **kw) -> subprocess.Popen:
    return subprocess.Popen(["nsenter", f"--net={netns_path(name)}", "--", sys.executable, "-c", code, *map(str, args)],
                            stdout=subprocess.PIPE, text=True, **kw)


def _probe(name: str | None, host: str, port: int) -> str:
    cmd = [sys.executable, "-c", PROBE, host, str(port)]
    if name:
        cmd = ["nsenter", f"--net={netns_path(name)}", "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()


LISTENER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.recv(100); c.sendall(b"pong from " + sys.argv[2].encode() + b"\n"); c.close()
"""


@pytest.fixture
def gate():
    platform_srv, platform_port = _echo_server()
    other_srv, other_port = _echo_server()  # a service of the machine the gate does not forward
    config = UserNetwork(forward_ports=[platform_port], egress_port=3129)
    folder = tempfile.mkdtemp(prefix="th-gate-")
    os.chmod(folder, 0o755)  # others may pass: the socket's own mode and the gate's check keep them out
    g = Gate(config, os.path.join(folder, "gate.sock"), PREFIX)
    g.start_thread()
    yield g, GateClient(g.socket_path), platform_port, other_port
    g.stop()
    shutil.rmtree(folder, ignore_errors=True)
    platform_srv.close()
    other_srv.close()


def test_one_users_listening_sockets_are_out_of_another_users_reach(gate):
    g, client, platform_port, other_port = gate
    client.ensure("alice")
    client.ensure("bob")
    port = 45123
    alice = _in_ns(ns("alice"), LISTENER, port, "alice")
    try:
        assert alice.stdout.readline().strip() == "listening"
        assert _probe(ns("alice"), "127.0.0.1", port) == "answer pong from alice"  # her own processes reach it
        assert _probe(ns("bob"), "127.0.0.1", port).startswith("refused")  # bob's do not
        assert _probe(None, "127.0.0.1", port).startswith("refused")  # nor the machine's, until exposed
        host_port = client.expose(ns("alice"), port)
        assert client.expose(ns("alice"), port) == host_port  # asked again: the same
        assert _probe(None, "127.0.0.1", host_port) == "answer pong from alice"
        assert _probe(ns("bob"), "127.0.0.1", host_port).startswith("refused")  # the exposed port is the machine's
        client.unexpose(ns("alice"), port)
        assert _probe(None, "127.0.0.1", host_port).startswith("refused")
    finally:
        alice.kill()
        alice.wait()


def test_a_namespace_reaches_the_platforms_ports_and_nothing_else_of_the_machine(gate):
    g, client, platform_port, other_port = gate
    client.ensure("carol")
    assert _probe(ns("carol"), "127.0.0.1", platform_port) == "answer pong from the machine"
    assert _probe(ns("carol"), "127.0.0.1", other_port).startswith("refused")
    # the gate's listeners were there before any user process: a user cannot take the platform's port first
    taker = subprocess.run(["nsenter", f"--net={netns_path(ns('carol'))}", "--", sys.executable, "-c",
                            f"import socket; s=socket.socket(); s.bind(('127.0.0.1', {platform_port}))"],
                           capture_output=True, text=True)
    assert "Address already in use" in taker.stderr


def test_a_namespace_removed_from_outside_is_the_same_one_under_its_name_when_next_asked(gate):
    """An admin's `ip netns delete` of a user's namespace name while the user's processes run in it: the gate mounts
    the one it holds again, so new processes of the user join the running ones and the gate's listeners, never a
    dead path (nsenter: cannot open) or a namespace without the platform's ports."""
    g, client, platform_port, other_port = gate
    client.ensure("dave2")
    port = 45124
    dave = _in_ns(ns("dave2"), LISTENER, port, "dave")  # a process of the user's, running in it
    try:
        assert dave.stdout.readline().strip() == "listening"
        subprocess.run(["ip", "netns", "delete", ns("dave2")], check=True)
        assert not os.path.exists(netns_path(ns("dave2")))
        client.ensure("dave2")
        assert _probe(ns("dave2"), "127.0.0.1", port) == "answer pong from dave"  # the same namespace
        assert _probe(ns("dave2"), "127.0.0.1", platform_port) == "answer pong from the machine"  # with the listeners
    finally:
        dave.kill()
        dave.wait()


EGRESS = r"""
import socket, sys
port, target = int(sys.argv[1]), sys.argv[2]
with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    print(s.recv(300).decode().split("\r\n")[0])
"""


@pytest.mark.parametrize("target", ["127.0.0.1:{platform}", "127.0.0.1:{other}", "localhost:{other}", "10.0.0.1:80",
                                    "169.254.169.254:80", "[::1]:{other}", "192.168.1.1:443"])
def test_the_egress_proxy_never_connects_to_the_machine_or_a_private_network(gate, target):
    g, client, platform_port, other_port = gate
    client.ensure("dave")
    target = target.format(platform=platform_port, other=other_port)
    out = subprocess.run(["nsenter", f"--net={netns_path(ns('dave'))}", "--", sys.executable, "-c", EGRESS, "3129", target],
                         capture_output=True, text=True, timeout=30).stdout.strip()
    assert out.startswith("HTTP/1.1 403"), out


def test_only_root_may_ask_the_gate(gate):
    g, client, *_ = gate
    from trainhub.boundary.accounts import UserAccounts

    bob = UserAccounts().ensure("bob")
    code = ("import socket, sys\ns = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
            "try:\n    s.sendall(b'{\"op\": \"ensure\", \"account\": \"x\"}\\n')\nexcept OSError:\n    pass\n"
            "print(s.recv(200))")
    as_bob = ["setpriv", f"--reuid={bob.uid}", f"--regid={bob.gid}", "--clear-groups", "--", "/usr/bin/python3", "-c",
              code, g.socket_path]
    out = subprocess.run(as_bob, capture_output=True, text=True, timeout=30)
    assert "Permission denied" in out.stderr, (out.stdout, out.stderr)  # the socket is the platform's (0600)
    os.chmod(g.socket_path, 0o666)  # even where the file lets them in, the gate checks who asks
    out = subprocess.run(as_bob, capture_output=True, text=True, timeout=30)
    assert "the platform only" in out.stdout, (out.stdout, out.stderr)
    assert not os.path.exists(netns_path(ns("x")))
    with pytest.raises(GateError, match="not an account name"):
        client.ensure("../../etc")


def test_the_egress_proxy_never_reaches_this_machine_by_a_public_address_either(gate):
    """A service of this machine bound to all addresses is the machine's, whatever address names it: an address of the
    machine's own interfaces is refused even when it is not a private one (here one from TEST-NET-3 added to lo)."""
    g, client, _platform_port, _other_port = gate
    address = "203.0.113.77"
    subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    try:
        srv, port = _echo_server(bind=address)
        client.ensure("erin")
        out = subprocess.run(["nsenter", f"--net={netns_path(ns('erin'))}", "--", sys.executable, "-c", EGRESS, "3129",
                              f"{address}:{port}"], capture_output=True, text=True, timeout=30).stdout.strip()
        assert out.startswith("HTTP/1.1 403"), out
        srv.close()
    finally:
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False)


def test_a_gate_removes_only_its_own_platforms_namespaces():
    """Several platforms on one machine (the tests' private ones, a lab's): a gate that starts removes the namespaces
    its own platform's previous run left, never another platform's (it once removed every th- namespace of the
    machine, and the other platform's next server or job failed: "nsenter: cannot open /run/netns/...")."""
    from trainhub.boundary.network import make_netns

    config = UserNetwork(forward_ports=[], egress=False)
    other = platform_prefix(f"/elsewhere/{os.getpid()}") + "alice"
    make_netns(config.ip, other)  # a user's namespace of another platform on this machine
    make_netns(config.ip, ns("left-here"))  # this platform's previous run never stopped
    folder = tempfile.mkdtemp(prefix="th-gate-")
    g = Gate(config, os.path.join(folder, "gate.sock"), PREFIX)
    try:
        g.start_thread()
        assert os.path.exists(netns_path(other)) and not os.path.exists(netns_path(ns("left-here")))
    finally:
        g.stop()
        subprocess.run([config.ip, "netns", "delete", other], check=False)
        shutil.rmtree(folder, ignore_errors=True)
