"""Start a real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler (v1.20.2, built by ``build.sh``) and the kubelet stand-in (``kubelet.py``).

What runs, and how:

* **etcd** (Debian's 3.4) with its data in a tmpfs folder when one is writable (``/dev/shm``).
* **kube-apiserver** on ``https://127.0.0.1:<free port>`` with a CA and serving certificate made
  here with ``openssl``; authentication by a static token file (``admin`` in ``system:masters``,
  the controller-manager and scheduler as ``system:kube-controller-manager`` /
  ``system:kube-scheduler``, the kubelet stand-in, and ``nobody`` with no groups for refusals);
  authorization ``Node,RBAC`` (no ``AlwaysAllow``); the default admission plugins of 1.20
  (ServiceAccount, DefaultTolerationSeconds, StorageObjectInUseProtection, ResourceQuota, ...);
  ServiceAccount tokens signed with a key pair made here (legacy token Secrets through the
  controller-manager, and the TokenRequest API: ``--service-account-issuer``).
* **kube-controller-manager** with every default controller (garbage collector, Job, ReplicaSet,
  node lifecycle, ServiceAccount tokens, PV binder, pvc-protection ...), each controller with its
  own ServiceAccount credentials, no leader election.
* **kube-scheduler**, no leader election.
* **the kubelet stand-in** (``kubelet.py``): no container runs. It heartbeats Nodes labelled
  ``kubelet.trainhub.io/managed=true`` (Ready condition, node Lease), runs the pods bound to
  them (Running/Ready, podIP, containerStatuses), finishes graceful deletions and makes
  containers exit on request (annotation ``kubelet.trainhub.io/exit-code``). With
  ``kubelet="none"`` it is not started: ``tests/kubernetes/node/`` brings a real kubelet instead,
  which joins as ``system:node:<name>`` (a token per name in ``node_names``, the Node authorizer)
  and serves pod logs to the apiserver, which authenticates to it with a client certificate.

Usage from Python::

    plane = ControlPlane(workdir).start()     # raises ControlPlaneError with log tails on failure
    plane.kubeconfig()                        # admin kubeconfig path; plane.kubeconfig(token=t) for others
    plane.stop()

From a shell (for a developer): ``python tests/kubernetes/controlplane/controlplane.py up``
prints the admin kubeconfig path and runs until Ctrl-C.

The binaries come from ``${TRAINHUB_KUBE_CACHE:-~/.cache/trainhub/kube-1.20.2}/bin`` (run
``build.sh`` first, or call ``ensure_built()``, which runs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from trainhub.backoff import WaitTimeout, poll

KUBE_VERSION = "1.20.2"
HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
KUBELET = HERE / "kubelet.py"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
CLIENT_IDENTITIES = 64


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started; the message carries the logs' tails."""


def cache_dir() -> Path:
    return Path(os.environ.get("TRAINHUB_KUBE_CACHE") or Path.home() / ".cache" / "trainhub" / f"kube-{KUBE_VERSION}")


def ensure_built(log=None) -> Path:
    """Run ``build.sh`` (a no-op check when the cache holds verified binaries); the bin folder."""
    out = log or sys.stderr
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out.write(proc.stdout)
    if proc.returncode != 0:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    return cache_dir() / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class ControlPlane:
    def __init__(self, workdir: str | os.PathLike, *, bin_dir: str | os.PathLike | None = None,
                 kubelet_heartbeat: float = 5.0, kubelet: str = "standin", node_names: tuple[str, ...] = ()):
        self.workdir = Path(workdir)
        self.bin_dir = Path(bin_dir) if bin_dir else cache_dir() / "bin"
        self.kubelet_heartbeat = kubelet_heartbeat
        if kubelet not in ("standin", "none"):
            raise ValueError(f"kubelet={kubelet!r}: 'standin' (kubelet.py) or 'none' (a real kubelet joins)")
        self.kubelet = kubelet
        self.node_names = tuple(node_names)
        self.procs: dict[str, subprocess.Popen] = {}
        self.tokens: dict[str, str] = {}
        self.url = ""
        self._etcd_dir: Path | None = None

    # -- paths -------------------------------------------------------------------------------

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    def log_file(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    # -- start / stop ------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> "ControlPlane":
        for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            if not (self.bin_dir / b).exists():
                raise ControlPlaneError(f"{self.bin_dir / b} is missing: run {BUILD_SCRIPT}")
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        if not Path(etcd).exists():
            raise ControlPlaneError("etcd is missing (Debian: apt-get install etcd-server)")
        if not shutil.which("openssl"):
            raise ControlPlaneError("openssl is missing (Debian: apt-get install openssl)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._pki()
            self._tokens()
            self._start_etcd(etcd)
            self._start_apiserver()
            self._wait_ready(timeout)
            self._start_controllers()
            if self.kubelet == "standin":
                self._start_kubelet()
            self._wait_for(lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default") is not None,
                           timeout, "the controller-manager to create the default ServiceAccount")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        # the kubelet and controllers first, etcd last
        for name in ("kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self._etcd_dir is not None:
            shutil.rmtree(self._etcd_dir, ignore_errors=True)
            self._etcd_dir = None

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def check_alive(self) -> None:
        """Raise ControlPlaneError naming any process of the plane that has exited."""
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        if dead:
            raise ControlPlaneError("control-plane process(es) exited: " + ", ".join(
                f"{n} (exit {rc}):\n{_tail(self.log_file(n))}" for n, rc in dead.items()))

    # -- pieces ------------------------------------------------------------------------------

    def _openssl(self, *args: str) -> None:
        proc = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=self.workdir / "pki")
        if proc.returncode:
            raise ControlPlaneError(f"openssl {' '.join(args)}: {proc.stderr}")

    @property
    def port(self) -> int:
        """The apiserver's port on 127.0.0.1."""
        return int(self.url.rsplit(":", 1)[1])

    def _pki(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)
        self._openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
                      "-days", "3650", "-subj", "/CN=trainhub-test-ca")
        # the apiserver's identity towards kubelets (pods/log, exec): a client certificate they check against the CA
        self._openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "kubelet-client.key", "-out", "kubelet-client.csr",
                      "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client")
        (pki / "client.ext").write_text("extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
        self._openssl("x509", "-req", "-in", "kubelet-client.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                      "-out", "kubelet-client.crt", "-days", "3650", "-extfile", "client.ext")
        self._openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
                      "-subj", "/CN=kube-apiserver")
        (pki / "san.ext").write_text(
            "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
            "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
            "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
        self._openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                      "-out", "apiserver.crt", "-days", "3650", "-extfile", "san.ext")
        self._openssl("genrsa", "-out", "sa.key", "2048")
        self._openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")

    def _tokens(self) -> None:
        users = {
            "admin": ("admin", "system:masters"),
            "kube-controller-manager": ("system:kube-controller-manager", ""),
            "kube-scheduler": ("system:kube-scheduler", ""),
            # the stand-in plays every node from one process, so it cannot be one system:node:<name>
            # (the Node authorizer would refuse it the other nodes' pods): it acts as an admin
            "kubelet": ("kubelet-standin", "system:masters"),
            "nobody": ("nobody", ""),
            # real kubelets (tests/kubernetes/node/): each node its own identity, authorized by the Node authorizer
            **{f"node:{n}": (f"system:node:{n}", "system:nodes") for n in self.node_names},
            # distinct admin identities for test clients, so the audit log tells them apart
            **{f"client-{i}": (f"test-client-{i}", "system:masters") for i in range(CLIENT_IDENTITIES)},
        }
        lines = []
        for key, (user, groups) in users.items():
            token = secrets.token_hex(16)
            self.tokens[key] = token
            lines.append(f'{token},{user},uid-{key},"{groups}"' if groups else f"{token},{user},uid-{key}")
        path = self.workdir / "tokens.csv"
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.log_file(name), "ab")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def _start_etcd(self, etcd: str) -> None:
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else self.workdir
        self._etcd_dir = Path(tempfile.mkdtemp(prefix="trainhub-etcd-", dir=base))
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            etcd, "--name", "trainhub-test", "--data-dir", str(self._etcd_dir),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"trainhub-test=http://127.0.0.1:{peer}",
            "--log-level", "warn", "--logger", "zap",
        ])

    def _start_apiserver(self) -> None:
        port = free_port()
        self.url = f"https://127.0.0.1:{port}"
        pki = self.workdir / "pki"
        self._apiserver_argv = [
            str(self.bin_dir / "kube-apiserver"),
            "--etcd-servers", self.etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(port), "--insecure-port", "0",
            "--tls-cert-file", str(pki / "apiserver.crt"), "--tls-private-key-file", str(pki / "apiserver.key"),
            "--client-ca-file", str(pki / "ca.crt"),
            "--token-auth-file", str(self.workdir / "tokens.csv"),
            "--authorization-mode", "Node,RBAC",
            "--kubelet-client-certificate", str(pki / "kubelet-client.crt"),
            "--kubelet-client-key", str(pki / "kubelet-client.key"),
            # a real kubelet is reached at its InternalIP (127.0.0.1): its node name is not in any DNS
            "--kubelet-preferred-address-types", "InternalIP",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--api-audiences", "https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range", SERVICE_CLUSTER_IP_RANGE,
            "--allow-privileged=true",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "--cert-dir", str(pki),
            # the test clients' requests (not the controllers' nor the kubelet's), for request counting
            "--audit-policy-file", str(self._audit_policy()), "--audit-log-path", str(self.audit_log),
            "--audit-log-format", "json", "--audit-log-maxsize", "0",
            "--v", "1",
        ]
        self._spawn("kube-apiserver", self._apiserver_argv)

    def restart_apiserver(self, timeout: float = 120) -> None:
        """Kill kube-apiserver and start it again on the same port and etcd: every watch ends and
        the new watch cache starts at the current revision (older resourceVersions: 410 Gone)."""
        proc = self.procs.pop("kube-apiserver")
        proc.kill()  # as a crash does (a graceful stop waits on the open watches for up to a minute)
        proc.wait(10)
        self._spawn("kube-apiserver", self._apiserver_argv)
        self._wait_ready(timeout)

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    def _audit_policy(self) -> Path:
        path = self.workdir / "audit-policy.json"
        path.write_text(json.dumps({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [
                {"level": "None", "users": ["system:kube-controller-manager", "system:kube-scheduler",
                                            "kubelet-standin", "system:apiserver"]},
                {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
                {"level": "None", "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*", "/version"]},
                {"level": "Metadata"},
            ]}))
        return path

    def _start_controllers(self) -> None:
        pki = self.workdir / "pki"
        cm = self.kubeconfig(token=self.tokens["kube-controller-manager"], name="kube-controller-manager")
        self._spawn("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"),
            "--kubeconfig", cm, "--authentication-kubeconfig", cm, "--authorization-kubeconfig", cm,
            "--leader-elect=false", "--port", "0", "--secure-port", "0",
            "--use-service-account-credentials=true",
            "--service-account-private-key-file", str(pki / "sa.key"),
            "--root-ca-file", str(pki / "ca.crt"),
            "--cluster-signing-cert-file", str(pki / "ca.crt"), "--cluster-signing-key-file", str(pki / "ca.key"),
            "--service-cluster-ip-range", SERVICE_CLUSTER_IP_RANGE,
            # the node lifecycle controller looks every 2 s (default 5 s); grace stays at the default 40 s
            "--node-monitor-period", "2s",
            "--v", "1",
        ])
        sched = self.kubeconfig(token=self.tokens["kube-scheduler"], name="kube-scheduler")
        self._spawn("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"),
            "--kubeconfig", sched, "--authentication-kubeconfig", sched, "--authorization-kubeconfig", sched,
            "--leader-elect=false", "--port", "0", "--secure-port", "0",
            "--v", "1",
        ])

    def _start_kubelet(self) -> None:
        self._spawn("kubelet", [
            sys.executable, str(KUBELET), "--kubeconfig", self.kubeconfig(token=self.tokens["kubelet"], name="kubelet"),
            "--heartbeat", str(self.kubelet_heartbeat),
        ])

    # -- HTTP helpers (standard library only: the starter runs before any test dependency) ------

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def request(self, method: str, path: str, body=None, *, token: str | None = None,
                content_type: str = "application/json", timeout: float = 10):
        """(status, parsed JSON body) of one API request as ``token`` (admin by default)."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token or self.tokens['admin']}", "Content-Type": content_type,
            "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=timeout) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def _get(self, path: str):
        status, body = self.request("GET", path)
        return body if status == 200 else None

    def _wait_for(self, predicate, timeout: float, what: str) -> None:
        def look():
            self.check_alive()
            with contextlib.suppress(OSError, ssl.SSLError):
                return predicate()
            return None

        try:
            poll(look, what=what, start=0.2, factor=1.0, timeout=timeout)
        except WaitTimeout:
            raise ControlPlaneError(f"timed out after {timeout:.0f}s waiting for {what}; logs:\n" + "\n".join(
                f"== {n}\n{_tail(self.log_file(n), 15)}" for n in self.procs)) from None

    def _wait_ready(self, timeout: float) -> None:
        def ready():
            status, body = self.request("GET", "/readyz", timeout=5)
            return status == 200
        self._wait_for(ready, timeout, "kube-apiserver /readyz")
        status, version = self.request("GET", "/version")
        if status != 200 or version.get("gitVersion") != f"v{KUBE_VERSION}":
            raise ControlPlaneError(f"/version says {version!r}, expected gitVersion v{KUBE_VERSION}: rebuild with {BUILD_SCRIPT}")

    # -- kubeconfigs -------------------------------------------------------------------------

    def kubeconfig(self, *, token: str | None = None, name: str = "admin", namespace: str = "default",
                   path: str | os.PathLike | None = None) -> str:
        """Write a kubeconfig for ``token`` (admin by default); its path."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": "trainhub-test", "cluster": {
                "server": self.url, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": name, "user": {"token": token or self.tokens["admin"]}}],
            "contexts": [{"name": name, "context": {"cluster": "trainhub-test", "user": name, "namespace": namespace}}],
        }
        out = Path(path) if path else self.workdir / f"kubeconfig-{name}"
        out.write_text(json.dumps(config, indent=1))
        out.chmod(0o600)
        return str(out)


def main(argv: list[str]) -> int:
    if argv[:1] != ["up"]:
        print(__doc__)
        return 2
    ensure_built()
    workdir = Path(tempfile.mkdtemp(prefix="trainhub-controlplane-"))
    plane = ControlPlane(workdir).start()
    print(f"control plane up: {plane.url}\nexport KUBECONFIG={plane.kubeconfig()}\nlogs: {workdir}", flush=True)
    try:
        while True:
            plane.check_alive()
            time.sleep(2)
    except KeyboardInterrupt:
        pass
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
