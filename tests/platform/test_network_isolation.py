"""Pattern 2 of issue 32, "users reach each other's sockets on the shared loopback", through a real `trainhub up`.

Before: bob's kernel (and bob's job, which holds no token at all) subscribed to alice's IOPub port and received
every output message of hers; every one of her listening ports (server, kernels) accepted his connections; her
TensorBoard answered him through his own server's proxy. Now each user's processes run in a network namespace of
their own (trainhub.boundary.network): these tests try the same from bob's kernel, bob's job and bob's server's
proxy, and check what must still cross does (the hub and the jobs API from inside; one job's workers meeting on
their loopback; the egress proxy, to nothing of this machine).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import requests

from test_isolation import User

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                       reason="per-user network namespaces need `trainhub up` as root with iproute2 (CI has both)"),
]

LISTENING = """
import json
ports = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    with open(table) as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[3] == "0A":
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
"""

CONNECT_ALL = LISTENING + """
result = {{}}
import socket
for port in json.loads({ports!r}):
    if port in ports:
        result[port] = "own"  # a port of this user's own namespace: not the other user's
        continue
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        result[port] = "connected"
    except OSError as e:
        result[port] = "refused " + type(e).__name__
print("RESULT " + json.dumps(result))
"""


def _assert_none_reached(result: dict) -> None:
    """No port of hers connected, and at most one shows in the prober's own namespace (by chance the same number)."""
    assert not [p for p, r in result.items() if r == "connected"], result
    assert sum(r == "own" for r in result.values()) <= 1, f"her ports are in the other user's namespace: {result}"


def _result(out: str):
    for line in out.splitlines():  # a kernel's output, or a job's log ("[rank] RESULT ...")
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise AssertionError(f"no result in {out!r}")


@pytest.fixture(scope="module")
def two_servers(platform):
    """alice's and bob's servers, each with a kernel kept running; alice's listening ports and IOPub port."""
    for user in ("net-alice", "net-bob"):
        platform.spawn(user, "cpu")
    kernels = {}
    for user in ("net-alice", "net-bob"):
        r = requests.post(f"{platform.url}/user/{user}/api/kernels", json={"name": "python3"},
                          headers={"Authorization": f"token {platform.token(user)}"}, timeout=60)
        assert r.status_code == 201, r.text
        kernels[user] = r.json()["id"]
    info = platform.kernel_exec("net-alice", LISTENING + "from ipykernel import get_connection_info\n"
                                "c = get_connection_info(unpack=True)\n"
                                "print('RESULT ' + json.dumps({'ports': sorted(ports), 'iopub': c['iopub_port']}))",
                                kernel_id=kernels["net-alice"])
    alice = _result(info)
    runtime = json.loads((platform.data_dir / "trainhub.json").read_text())
    gate = {runtime["hub_port"], runtime["port"], *runtime["service_ports"].values(), 3128}
    alice["ports"] = [p for p in alice["ports"] if p not in gate]  # the gate's listeners are in every namespace alike
    assert alice["iopub"] in alice["ports"] and len(alice["ports"]) >= 6, alice  # her server's port + her kernel's 5
    yield kernels, alice
    for user in ("net-alice", "net-bob"):
        platform.stop_server(user)


def test_another_users_kernel_connects_to_none_of_her_listening_sockets(platform, two_servers):
    kernels, alice = two_servers
    out = platform.kernel_exec("net-bob", CONNECT_ALL.format(ports=json.dumps(alice["ports"])), kernel_id=kernels["net-bob"])
    _assert_none_reached(_result(out))


def test_another_users_kernel_reads_none_of_her_iopub(platform, two_servers):
    kernels, alice = two_servers
    subscribe = (
        "import threading, zmq\n"
        "_ctx = zmq.Context.instance()\n"
        "_sub = _ctx.socket(zmq.SUB)\n"
        "_sub.setsockopt(zmq.SUBSCRIBE, b'')\n"
        f"_sub.connect('tcp://127.0.0.1:{alice['iopub']}')\n"
        "_got = []\n"
        "def _listen():\n"
        "    while True:\n"
        "        try:\n"
        "            _got.append(_sub.recv_multipart())\n"
        "        except Exception:\n"
        "            return\n"
        "threading.Thread(target=_listen, daemon=True).start()\n"
        "print('subscribed')\n"
    )
    assert "subscribed" in platform.kernel_exec("net-bob", subscribe, kernel_id=kernels["net-bob"])
    said = platform.kernel_exec("net-alice", "for i in range(13): print('alice-secret-output', i)",
                                kernel_id=kernels["net-alice"])
    assert said.count("alice-secret-output") == 13  # her kernel did publish 13 outputs (and their code) on IOPub
    got = platform.kernel_exec("net-bob", "print('RESULT', len(_got))", kernel_id=kernels["net-bob"])
    assert got.strip() == "RESULT 0", got


def test_another_users_job_connects_to_none_of_her_listening_sockets(platform, two_servers):
    _kernels, alice = two_servers
    bob = User(platform, "net-bob")
    job = bob.wait(bob.submit(script=CONNECT_ALL.format(ports=json.dumps(alice["ports"])), name="bob-scans")["id"])
    assert job["state"] == "succeeded", (job, bob.logs(job["id"]))
    _assert_none_reached(_result(bob.logs(job["id"])))


HTTP_SERVER = """
import http.server, threading, socketserver, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"alice-tensorboard-scalars"
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
_srv = socketserver.TCPServer(("127.0.0.1", 0), H)
threading.Thread(target=_srv.serve_forever, daemon=True).start()
print("RESULT " + json.dumps(_srv.server_address[1]))
"""


def test_a_helper_of_hers_answers_through_her_server_only(platform, two_servers):
    """alice's TensorBoard-like helper (unauthenticated, on her loopback): her own server's proxy reaches it, bob's
    server's proxy does not, not even through her proxy's path."""
    kernels, _alice = two_servers
    port = _result(platform.kernel_exec("net-alice", HTTP_SERVER, kernel_id=kernels["net-alice"]))
    hers = requests.get(f"{platform.url}/user/net-alice/proxy/{port}/", timeout=30,
                        headers={"Authorization": f"token {platform.token('net-alice')}"})
    assert hers.status_code == 200 and hers.text == "alice-tensorboard-scalars", (hers.status_code, hers.text[:200])
    bob_h = {"Authorization": f"token {platform.token('net-bob')}"}
    for path in (f"/user/net-bob/proxy/{port}/", f"/user/net-bob/proxy/{port}/user/net-alice/proxy/absolute/{port}/",
                 f"/user/net-alice/proxy/{port}/"):
        r = requests.get(platform.url + path, headers=bob_h, timeout=30, allow_redirects=False)
        assert "alice-tensorboard-scalars" not in r.text and r.status_code != 200, (path, r.status_code, r.text[:200])


EGRESS = """
import os, socket, json
proxy = os.environ["HTTPS_PROXY"]
host, port = proxy.rsplit("/", 1)[-1].split(":")
out = {{"proxy": proxy}}
for target in json.loads({targets!r}):
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"CONNECT {{target}} HTTP/1.1\\r\\nHost: {{target}}\\r\\n\\r\\n".encode())
        out[target] = s.recv(200).decode().split("\\r\\n")[0]
print("RESULT " + json.dumps(out))
"""


def test_the_way_out_reaches_nothing_of_this_machine(platform, two_servers):
    """The egress proxy of a namespace refuses this machine's own ports (the proxy's API among them)."""
    kernels, _alice = two_servers
    runtime = json.loads((platform.data_dir / "trainhub.json").read_text())
    targets = [f"127.0.0.1:{runtime['proxy_api_port']}", f"localhost:{runtime['hub_port']}", "10.0.0.1:443"]
    result = _result(platform.kernel_exec("net-bob", EGRESS.format(targets=json.dumps(targets)), kernel_id=kernels["net-bob"]))
    for t in targets:
        assert result[t].startswith("HTTP/1.1 403"), result
    # and the proxy's API port is not among the ports the gate forwards into a namespace
    direct = _result(platform.kernel_exec("net-bob", CONNECT_ALL.format(ports=json.dumps([runtime["proxy_api_port"]])),
                                          kernel_id=kernels["net-bob"]))
    assert direct[str(runtime["proxy_api_port"])].startswith("refused"), direct


RENDEZVOUS = """
import os, socket, time
rank, addr, port = int(os.environ["RANK"]), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, port)); s.listen(1)
    c, _ = s.accept(); print("rank 0 met", c.recv(100).decode())
else:
    for _ in range(200):
        try:
            c = socket.create_connection((addr, port), timeout=2); break
        except OSError:
            time.sleep(0.1)
    c.sendall(b"rank 1"); print("rank 1 sent")
"""


def test_the_workers_of_one_job_still_meet_on_their_loopback(platform):
    """What must cross still does: the two workers of one job rendezvous at MASTER_ADDR:MASTER_PORT (as DDP does)."""
    alice = User(platform, "net-alice")
    job = alice.wait(alice.submit(script=RENDEZVOUS, workers=2, name="rendezvous")["id"], timeout=120)
    logs = alice.logs(job["id"])
    assert job["state"] == "succeeded" and "rank 0 met rank 1" in logs, (job, logs[-2000:])


NETNS_PROBE = """
import json, os, socket
out = {"netns": os.readlink("/proc/self/ns/net")}
try:
    socket.create_connection(("127.0.0.1", %d), timeout=3).close()
    out["proxy_api"] = "connected"
except OSError as e:
    out["proxy_api"] = "refused " + type(e).__name__
print("RESULT " + json.dumps(out))
"""


def test_a_users_job_runs_in_the_namespace_of_the_users_kernels(platform, two_servers):
    """A job is no way around it: bob's job shares his kernels' namespace (not the machine's: the proxy's API port,
    which the gate does not forward, is out of its reach, as it is out of his kernel's)."""
    kernels, _alice = two_servers
    runtime = json.loads((platform.data_dir / "trainhub.json").read_text())
    probe = NETNS_PROBE % runtime["proxy_api_port"]
    kernel = _result(platform.kernel_exec("net-bob", probe, kernel_id=kernels["net-bob"]))
    bob = User(platform, "net-bob")
    job = bob.wait(bob.submit(script=probe, name="bob-netns")["id"])
    assert job["state"] == "succeeded", (job, bob.logs(job["id"]))
    in_job = _result(bob.logs(job["id"]))
    assert in_job["netns"] == kernel["netns"] != os.readlink("/proc/self/ns/net"), (in_job, kernel)
    assert in_job["proxy_api"].startswith("refused") and kernel["proxy_api"].startswith("refused"), (in_job, kernel)
