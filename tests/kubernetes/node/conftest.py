"""Fixtures of the real-node tests (``make test-kube-node``): the chart installed on a real one-node cluster.

These tests run only when asked (``pytest --kube-node`` or ``TRAINHUB_TEST_KUBE_NODE=1``; ``make test-kube-node``,
which ``make test`` runs), as root; otherwise they are skipped with the reason. ``TRAINHUB_SKIP_KUBE_NODE=1`` skips
them on purpose where they were asked for. The binaries (``controlplane/build.sh``) and the images
(``images.py build``) are built by the make target before pytest starts; here they are only checked.

Fixtures:

* ``site`` (module): the real control plane (``controlplane/``, no kubelet stand-in), one real node (``node.py``:
  containerd, runc, CNI bridge, kubelet, 2 simulated ``nvidia.com/gpu``), the images imported (``images.py``), an S3
  server (moto) on the node's address, and the chart installed with its default values plus
  ``helm/trainhub/examples/bare-node.yaml`` plus ``Site.values`` (the API server's port, the S3 storage mounted
  by rclone sidecars), Ready.
  ``Site``: ``.plane``, ``.node``, ``.kubeconfig``, ``.namespace``, ``.url`` (the proxy, http://127.0.0.1:8000),
  ``.install`` (``chart.Install``: applied objects, skipped ones), ``.kubectl(*args)``, ``.get(path)`` (an API
  GET, JSON or None), ``.pods(selector)``, ``.pod_logs(name)``, ``.user(name)`` (a logged-in ``hubclient.HubUser``),
  ``.upgrade(extra_values)`` (render again with more values and apply, keeping the release's Secrets, then restart
  the hub), ``.wait_ready()``. On failure the hub's, the services' and the node's logs are copied to
  ``test-artifacts/kube-node/``.
* ``prometheus`` (module): a Prometheus API stand-in on loopback (a thread) answering DCGM utilisation series,
  ``.idle(namespace, pod, gpus)`` to report a pod's GPUs at 0 %; ``.url``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from waiting import wait_for

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "controlplane"))

import chart  # noqa: E402
import images  # noqa: E402
from hubclient import HubUser  # noqa: E402

from chart import NAMESPACE  # noqa: E402
from node import NODE_NAME  # noqa: E402

PROXY_URL = "http://127.0.0.1:8000"
HOST_PORTS = (8000, 8001, 8080, 8081, 8090)  # the chart's proxy, hub and services on the node's network
ARTIFACTS = HERE.parents[2] / "test-artifacts" / "kube-node"
S3_KEY, S3_SECRET, BUCKET = "trainhub-platform", "trainhub-platform-secret", "trainhub"


def _wanted(config) -> bool:
    return bool(config.getoption("--kube-node", default=False)) or os.environ.get("TRAINHUB_TEST_KUBE_NODE") == "1"


def pytest_collection_modifyitems(config, items):
    here = [i for i in items if Path(str(i.fspath)).is_relative_to(HERE)]
    if not here:
        return
    reason = None
    if not _wanted(config):
        reason = "the real node runs with `make test-kube-node` (pytest --kube-node)"
    elif os.environ.get("TRAINHUB_SKIP_KUBE_NODE", "").lower() in ("1", "true", "yes"):
        reason = "TRAINHUB_SKIP_KUBE_NODE is set"
    for item in here:
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def free_gateway_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_host_ports() -> None:
    """The chart's pods listen on fixed ports of the node's network (this machine's): say which are taken."""
    taken = []
    for port in HOST_PORTS:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                taken.append(port)
    if taken:
        pytest.fail(f"ports {taken} of this machine are in use: the chart's hub, proxy and services listen there on "
                    "the node's network (examples/bare-node.yaml); stop what holds them", pytrace=False)


class MotoS3:
    """moto's S3 server on the node's address (reached by the hub and services on the node's network and by pods on
    the bridge; nothing outside this machine)."""

    def __init__(self, host: str, log: Path):
        self.host, self.log = host, log
        self.port = free_gateway_port(host)
        self.endpoint = f"http://{host}:{self.port}"
        self.proc = None
        self.key, self.secret = S3_KEY, S3_SECRET  # the platform's (the chart's platformCredentialsSecret)

    def start(self) -> "MotoS3":
        moto = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
        self.proc = subprocess.Popen([moto, "-H", self.host, "-p", str(self.port)], stdout=open(self.log, "wb"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=S3_KEY,
                              aws_secret_access_key=S3_SECRET, region_name="us-east-1")

        def bucket():
            try:
                client.create_bucket(Bucket=BUCKET)
                return True
            except Exception:  # not listening yet
                assert self.proc.poll() is None, self.log.read_text()[-2000:]
                return False
        wait_for(bucket, what=f"moto on {self.endpoint}", timeout=60)
        self.client = client
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@dataclass
class Site:
    plane: object
    node: object
    s3: MotoS3
    workdir: Path
    namespace: str = NAMESPACE
    url: str = PROXY_URL
    values: dict = field(default_factory=dict)
    install: chart.Install | None = None

    @property
    def kubeconfig(self) -> str:
        return self.plane.kubeconfig()

    def kubectl(self, *args, check=True, stdin=None):
        return chart.kubectl(self.kubeconfig, "-n", self.namespace, *args, check=check, stdin=stdin)

    def get(self, path: str):
        status, body = self.plane.request("GET", path)
        return body if status == 200 else None

    def pods(self, selector: str = "") -> list[dict]:
        q = f"?labelSelector={selector}" if selector else ""
        return (self.get(f"/api/v1/namespaces/{self.namespace}/pods{q}") or {}).get("items") or []

    def pod(self, name: str) -> dict | None:
        return self.get(f"/api/v1/namespaces/{self.namespace}/pods/{name}")

    def pod_logs(self, name: str, container: str | None = None) -> str:
        q = f"?container={container}" if container else ""
        status, body = self.plane.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{name}/log{q}")
        return body if isinstance(body, str) else json.dumps(body)

    def deployment_pod(self, component: str, selector: str) -> dict | None:
        pods = [p for p in self.pods(selector) if not p["metadata"].get("deletionTimestamp")]
        return pods[0] if pods else None

    def user(self, name: str) -> HubUser:
        return HubUser(self.url, name)

    def values_file(self, extra: dict | None = None) -> Path:
        path = self.workdir / f"values-{len(list(self.workdir.glob('values-*.yaml')))}.yaml"
        merged = json.loads(json.dumps(self.values))
        _merge(merged, extra or {})
        path.write_text(yaml.safe_dump(merged))
        return path

    def render(self, extra: dict | None = None) -> list[dict]:
        sets = {"jupyterhub.hub.extraEnv.KUBERNETES_SERVICE_PORT": str(self.plane.port),
                "trainhub.extraEnv.KUBERNETES_SERVICE_PORT": str(self.plane.port)}
        return chart.render(self.namespace, [chart.NODE_VALUES, self.values_file(extra)], sets)

    def wait_ready(self, timeout: float = 300) -> None:
        """The hub, proxy and jobs Deployments rolled out (their current spec seen by the controller, one pod, of the
        current template, Ready: an old pod still terminating does not count) and the hub answering through the proxy."""
        def rolled_out(d):
            status = d.get("status") or {}
            return (status.get("observedGeneration", 0) >= d["metadata"]["generation"]
                    and status.get("replicas") == status.get("updatedReplicas") == status.get("readyReplicas") == 1)

        for name in ("hub", "proxy", "trainhub-jobs"):
            wait_for(lambda n=name: self.get(f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{n}"), rolled_out,
                     what=f"deployment {name} to be rolled out and ready", timeout=timeout, interval=1)
        wait_for(lambda: _get_status(f"{self.url}/hub/health"), lambda s: s == 200, what="the hub through the proxy",
                 timeout=timeout, interval=1)

    def upgrade(self, extra: dict) -> chart.Install:
        """Render with ``extra`` values and apply, keeping the release's Secrets (``helm template`` cannot look them up:
        new random tokens would not match the running pods'), then restart the hub (it reads trainhub.json at start)."""
        _merge(self.values, extra)  # later upgrades keep it
        objects = [o for o in self.render() if o["kind"] != "Secret"
                   or self.get(f"/api/v1/namespaces/{self.namespace}/secrets/{o['metadata']['name']}") is None]
        install = chart.install(self.plane, self.kubeconfig, self.namespace, objects)
        self.kubectl("rollout", "restart", "deployment/hub")  # a new generation: wait_ready waits for its pod
        self.wait_ready()
        return install

    def save_logs(self) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for pod in self.pods():
            name = pod["metadata"]["name"]
            for c in pod["spec"]["containers"]:
                (ARTIFACTS / f"{name}.{c['name']}.log").write_text(self.pod_logs(name, c["name"]))
        for log in list(self.node.workdir.glob("*.log")) + list(self.plane.workdir.glob("*.log")) + [self.s3.log]:
            with contextlib.suppress(OSError):
                shutil.copy(log, ARTIFACTS / f"{log.parent.name}-{log.name}")


def _merge(base: dict, extra: dict) -> None:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v


def _get_status(url: str) -> int | None:
    import requests

    try:
        return requests.get(url, timeout=5).status_code
    except requests.RequestException:
        return None


@pytest.fixture(scope="module")
def site(tmp_path_factory, request):
    from controlplane import ControlPlane, ControlPlaneError, ensure_built
    from node import Node

    check_host_ports()
    try:
        bin_dir = ensure_built()
    except ControlPlaneError as e:
        pytest.fail(f"the Kubernetes binaries could not be built: {e}", pytrace=False)
    built = images.build()
    workdir = tmp_path_factory.mktemp("kube-node")
    with contextlib.ExitStack() as stack:
        plane = ControlPlane(workdir / "plane", bin_dir=bin_dir, kubelet="none", node_names=(NODE_NAME,)).start()
        stack.callback(plane.stop)
        node = Node(plane, workdir / "node", name=NODE_NAME, gpus=2, bin_dir=bin_dir,
                    labels={"nvidia.com/gpu.product": "Simulated-GPU"})
        stack.callback(node.stop)
        node.start()
        node.import_images(built.values())
        s3 = MotoS3(node.gateway, workdir / "moto.log").start()
        stack.callback(s3.stop)
        site = Site(plane, node, s3, workdir)
        # S3 storage (moto), mounted in notebook pods by rclone sidecars (before 1.28: ordinary containers beside the
        # notebook); the sidecar image is the CI node's own build of rclone
        # users' pods get credentials of their own, minted by the hub and the jobs service through moto's IAM and STS
        # (a role per user), never the platform's key
        site.values = {"trainhub": {"storage": {"url": f"s3://{BUCKET}/platform", "endpointUrl": s3.endpoint,
                                                "mount": "fuse-sidecar", "sidecar": {"image": images.RCLONE_REF},
                                                "credentials": {"perUserRoles": True}}}}
        plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        wait_for(lambda: (site.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default") or {}).get("secrets"),
                 what="the namespace's default ServiceAccount token", timeout=60)
        # no volume provisioner on a bare node: the hub's database claim binds to a PersistentVolume of the admin's
        db = workdir / "hub-db"
        db.mkdir()
        os.chown(db, 1000, 1000)
        plane.request("POST", "/api/v1/persistentvolumes", {
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "trainhub-hub-db"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(db), "type": "Directory"}}})
        plane.request("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", {
            "metadata": {"name": "trainhub-storage-platform"},
            "stringData": {"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET}})
        site.install = chart.install(plane, site.kubeconfig, NAMESPACE, site.render())
        try:
            site.wait_ready()
            yield site
        finally:
            if request.session.testsfailed:
                with contextlib.suppress(Exception):
                    site.save_logs()


class _Prometheus(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        from urllib.parse import parse_qs, urlparse

        query = parse_qs(urlparse(self.path).query).get("query", [""])[0]
        self.server.queries.append(query)
        matchers = {k: re.compile(v) for k, v in re.findall(r'(\w+)=~"((?:[^"\\]|\\.)*)"', query)}
        now = time.time()
        result = []
        for (ns, pod), gpus in list(self.server.idle_pods.items()):
            for gpu in range(gpus):
                for name, value in (("DCGM_FI_DEV_GPU_UTIL", 0), ("DCGM_FI_DEV_FB_USED", 0), ("DCGM_FI_DEV_FB_FREE", 40960)):
                    metric = {"__name__": name, "namespace": ns, "pod": pod, "gpu": str(gpu), "UUID": f"SIM-{pod}-{gpu}"}
                    if all(m.fullmatch(metric.get(k, "")) for k, m in matchers.items()):
                        result.append({"metric": metric, "value": [now, str(value)]})
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def prometheus():
    """A Prometheus API stand-in on loopback: the culler on the node's network reaches it there."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    server.idle_pods, server.queries = {}, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    server.idle = lambda ns, pod, gpus: server.idle_pods.__setitem__((ns, pod), gpus)
    yield server
    server.shutdown()
