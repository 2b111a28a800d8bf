"""A real Kubernetes node on this machine: containerd + runc + a CNI bridge + kubelet v1.20.2, joined to the
real control plane (``controlplane/``), with simulated GPUs advertised by a device plugin.

What runs (every process started here, its PID recorded in ``<run dir>/state.json``):

* **containerd** 1.6 (Debian) with its CRI plugin, its state, socket and network namespaces under this
  run's folder; its root (content store, unpacked layers) kept in ``~/.cache/trainhub/node/containerd``
  between runs (content-addressed: an image imported again is only read, not unpacked again; one node at a
  time, another gets a fresh root): runc as the runtime (crun cannot run on these
  hybrid-cgroup machines), overlayfs, the sandbox image ``images.PAUSE_REF`` (imported here, never
  pulled) and ``restrict_oom_score_adj = true`` (the sandbox lacks CAP_SYS_RESOURCE: without it runc
  fails every container with "can't get final child's PID from pipe").
* **CNI**: the ``bridge`` plugin on a bridge of its own (``trainhub0``, gateway ``10.244.0.1/24``, created
  here before the kubelet so services on the host can listen on the gateway address), ``host-local``
  addresses kept under the run folder, no masquerading (nothing leaves the machine).
* **kubelet** v1.20.2 (``controlplane/build.sh``): ``--cgroup-driver=cgroupfs`` (PID 1 is not systemd),
  ``--fail-swap-on=false``, no static pod folder, no iptables chains, no image garbage collection (the
  images are imported, not pulled). Its node IP is the bridge's gateway (the kubelet refuses a loopback
  one): host-network pods get that address, and the kubelet's API listens there only (the apiserver
  reaches it for ``pods/log`` with its client certificate).
* **trainhub-fake-gpu** (``fakegpu/main.go``): a device plugin registering ``gpus`` simulated devices of
  ``gpu_resource`` with the kubelet, which then advertises them in the node's capacity and hands them
  to containers that ask (``NVIDIA_VISIBLE_DEVICES`` set to the chosen device ids).

The kubelet changes kernel settings when it starts (``vm.overcommit_memory``, ``kernel.panic``,
``kernel.panic_on_oops``, ...; the bridge plugin ``net.ipv4.ip_forward``): their values before the
start are recorded and put back once the node is up, and again at the end.

``stop()`` (also run when ``start()`` fails) tears down in order: the pods bound to the node (through the
API, so the kubelet stops them and the CNI plugin releases their addresses), the device plugin, the
kubelet, any container left (``ctr``), containerd and the shims it started (found by their containerd
address), every mount under the node's folders (the kubelet bind-mounts its root rshared; pod volumes,
network namespaces, container root file systems), the bridge, the ``kubepods`` cgroups in every
hierarchy, ``/var/log/pods``, ``/var/log/containers``, ``/var/lib/kubelet`` (1.20's device manager
keeps its socket there whatever the root folder) and ``/var/lib/cni`` (the CNI library's result cache) when the
node made them, and the kernel settings. ``cleanup_stale()`` does the same for a run whose process died (its ``state.json``).

Usage::

    node = Node(plane, workdir).start()         # NodeError with the logs' tails on failure
    node.import_images(images)                  # tests/kubernetes/node/images.py
    ...
    node.stop()
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "controlplane"))

from controlplane import _tail, cache_dir, free_port  # noqa: E402

from trainhub.backoff import WaitTimeout, poll  # noqa: E402

RUN_ROOT = Path("/run/trainhub-node")
NODE_NAME = "trainhub-node"
# containerd's root (content store, unpacked layers, metadata) is kept between runs: content-addressed, so an image
# imported again costs reading it, not unpacking it. One node at a time uses it (a lock); another gets a fresh root.
CONTAINERD_CACHE = Path(os.environ.get("TRAINHUB_NODE_CACHE") or Path.home() / ".cache" / "trainhub" / "node") / "containerd"
CNI_BIN = "/usr/lib/cni"
# what the kubelet (setupKernelTunables) and the CNI bridge plugin (isGateway) change
KERNEL_SETTINGS = ("vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
                   "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes", "net.ipv4.ip_forward")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# folders used whatever the configured paths: the kubelet's pod logs and device plugins' socket folder (1.20's
# device manager has /var/lib/kubelet/device-plugins/kubelet.sock built in), the CNI library's result cache
# (/var/lib/cni/results); removed at the end when the node made them
HOST_DIRS = (Path("/var/log/pods"), Path("/var/log/containers"), Path("/var/lib/kubelet"), Path("/var/lib/cni"))
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")


class NodeError(RuntimeError):
    """The node could not be started; the message carries the logs' tails."""


def read_sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    except OSError:
        return None


def write_sysctl(name: str, value: str) -> None:
    with contextlib.suppress(OSError):
        Path("/proc/sys", *name.split(".")).write_text(value + "\n")


def _mounts_under(*folders: Path) -> list[str]:
    """Mount points under ``folders``, deepest first (from /proc/self/mountinfo)."""
    roots = [str(f.resolve()) for f in folders if f]
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if any(point == r or point.startswith(r + "/") for r in roots):
                points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def _umount_all(*folders: Path) -> list[str]:
    """Unmount everything under ``folders`` (lazily if busy); what was unmounted."""
    done = []
    for _ in range(3):  # a mount may hide another at the same point
        points = _mounts_under(*folders)
        if not points:
            break
        for p in points:
            if subprocess.run(["umount", p], capture_output=True).returncode:
                subprocess.run(["umount", "-l", p], capture_output=True)
            done.append(p)
    return done


def _cgroup_trees(name: str = "kubepods") -> list[Path]:
    """``<hierarchy>/kubepods`` (and ``kubepods.slice``) folders in every cgroup hierarchy."""
    out = []
    if CGROUP_ROOT.is_dir():
        for hierarchy in CGROUP_ROOT.iterdir():
            for n in (name, name + ".slice"):
                if (hierarchy / n).is_dir():
                    out.append(hierarchy / n)
        if (CGROUP_ROOT / "cgroup.controllers").exists() and (CGROUP_ROOT / name).is_dir():
            out.append(CGROUP_ROOT / name)
    return out


def _rmdir_cgroups(tree: Path) -> None:
    """rmdir a cgroup folder and its children, deepest first (cgroup folders are removed with rmdir only)."""
    for dirpath, _, _ in sorted(os.walk(tree), key=lambda t: -t[0].count("/")):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


def _pids_with_arg(fragment: str) -> list[int]:
    """Processes whose command line holds ``fragment`` (one of this node's own unique paths)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            args = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(fragment.encode() in a for a in args):
            out.append(int(d.name))
    return out


def _kill(pid: int, sig=signal.SIGTERM) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _stop_pid(pid: int, timeout: float = 15) -> None:
    _kill(pid, signal.SIGTERM)

    def gone() -> bool:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return not _alive(pid)

    with contextlib.suppress(WaitTimeout):
        poll(gone, what=f"process {pid} to exit", start=0.1, factor=1.0, timeout=timeout)
    if _alive(pid):
        _kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


class Node:
    """See the module docstring."""

    def __init__(self, plane, workdir: str | os.PathLike, *, name: str = NODE_NAME, gpus: int = 2,
                 gpu_resource: str = "nvidia.com/gpu", labels: dict | None = None, bridge: str = "trainhub0",
                 subnet: str = "10.244.0.0/24", gateway: str = "10.244.0.1", bin_dir: Path | None = None):
        self.plane = plane
        self.workdir = Path(workdir)
        self.name = name
        self.gpus = gpus
        self.gpu_resource = gpu_resource
        self.labels = dict(labels or {})
        self.bridge = bridge
        self.subnet = subnet
        self.gateway = gateway
        self.bin_dir = Path(bin_dir) if bin_dir else cache_dir() / "bin"
        self.run_dir = RUN_ROOT / f"{os.getpid()}-{int(time.time())}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.state: dict = {}
        self._root_lock = None

    # -- paths ---------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """containerd's socket."""
        return str(self.run_dir / "containerd.sock")

    @property
    def kubelet_root(self) -> Path:
        return self.workdir / "kubelet"

    def log_file(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    # -- start ---------------------------------------------------------------------------------

    def start(self, timeout: float = 180) -> "Node":
        self._preflight()
        cleanup_stale()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.state = {"workdir": str(self.workdir), "run_dir": str(self.run_dir), "pids": {}, "bridge": self.bridge,
                      "kernel": {k: read_sysctl(k) for k in KERNEL_SETTINGS},
                      "made_dirs": [str(d) for d in HOST_DIRS if not d.exists()]}
        self._save()
        try:
            self._start_containerd(timeout)
            removed = remove_containers(self.address)  # a crashed run's, in the kept root
            if removed:
                self.state["stale_containers_removed"] = removed
            from images import import_images, pause_image

            import_images([pause_image(self.bin_dir / "pause")], self.address)
            self._make_bridge()
            self._start_kubelet()
            self._wait(self._ready, timeout, f"node {self.name} to be Ready")
            self.restore_kernel_settings()  # the kubelet set them while starting
            self._start_device_plugin()
            if self.gpus:
                self._wait(lambda: self.allocatable().get(self.gpu_resource) == str(self.gpus), timeout,
                           f"{self.gpus} x {self.gpu_resource} in node {self.name}'s allocatable (the device plugin)")
        except BaseException:
            self.stop()
            raise
        return self

    def _preflight(self) -> None:
        if os.geteuid() != 0:
            raise NodeError("a real node needs root (containerd, mounts, cgroups, the bridge)")
        for b in ("kubelet", "trainhub-fake-gpu", "pause"):
            if not (self.bin_dir / b).exists():
                raise NodeError(f"{self.bin_dir / b} is missing: run tests/kubernetes/controlplane/build.sh node")
        for tool in ("containerd", "runc", "ctr", "ip"):
            if not shutil.which(tool):
                raise NodeError(f"{tool} is missing: apt-get install containerd runc iproute2 (build.sh --packages-only)")
        if not Path(CNI_BIN, "bridge").exists():
            raise NodeError(f"{CNI_BIN}/bridge is missing: apt-get install containernetworking-plugins")

    def _save(self) -> None:
        (self.run_dir / "state.json").write_text(json.dumps(self.state, indent=1))

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        # start_new_session: Popen's pid is the daemon itself (no forking wrapper), recorded at once
        log = open(self.log_file(name), "ab")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log.close()
        self.procs[name] = proc
        self.state["pids"][name] = proc.pid
        self._save()
        return proc

    def check_alive(self) -> None:
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        if dead:
            raise NodeError("node process(es) exited: " + ", ".join(
                f"{n} (exit {rc}):\n{_tail(self.log_file(n))}" for n, rc in dead.items()))

    def _wait(self, predicate, timeout: float, what: str):
        def look():
            self.check_alive()
            self.plane.check_alive()
            with contextlib.suppress(OSError):
                return predicate()
            return None

        try:
            return poll(look, what=what, start=0.2, factor=1.0, timeout=timeout)
        except WaitTimeout:
            raise NodeError(f"timed out after {timeout:.0f}s waiting for {what}; logs:\n" + "\n".join(
                f"== {n}\n{_tail(self.log_file(n), 20)}" for n in self.procs)) from None

    def _containerd_root(self) -> Path:
        """The kept root when no other node holds it, else a fresh one in the work folder (removed at the end)."""
        CONTAINERD_CACHE.mkdir(parents=True, exist_ok=True)
        lock = open(CONTAINERD_CACHE.parent / "containerd.lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            self.state["temporary_root"] = str(self.workdir / "containerd")
            return self.workdir / "containerd"
        self._root_lock = lock
        return CONTAINERD_CACHE

    def _start_containerd(self, timeout: float) -> None:
        root, state = self._containerd_root(), self.run_dir / "containerd"
        conf_dir = self.workdir / "cni" / "net.d"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / "10-trainhub.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "trainhub", "plugins": [{
                "type": "bridge", "bridge": self.bridge, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": self.subnet, "gateway": self.gateway}]],
                         "dataDir": str(self.run_dir / "cni-ipam")},
            }]}, indent=1))
        from images import PAUSE_REF

        config = self.workdir / "containerd.toml"
        config.write_text(f"""version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{self.address}"
[ttrpc]
  address = "{self.address}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_REF}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{shutil.which('runc')}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{conf_dir}"
""")
        self.state["made_run_containerd"] = not Path("/run/containerd").exists()
        self._save()
        self._spawn("containerd", ["containerd", "--config", str(config)])
        self._wait(lambda: subprocess.run(["ctr", "--address", self.address, "version"], capture_output=True).returncode == 0,
                   timeout, "containerd to answer")

    def _make_bridge(self) -> None:
        """The bridge with its gateway address, before any pod: host services can listen on it from the start."""
        prefix = self.subnet.split("/")[1]
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)  # a stale one
        for cmd in (["ip", "link", "add", self.bridge, "type", "bridge"],
                    ["ip", "addr", "add", f"{self.gateway}/{prefix}", "dev", self.bridge],
                    ["ip", "link", "set", self.bridge, "up"]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                raise NodeError(f"{' '.join(cmd)}: {r.stderr}")

    def _start_kubelet(self) -> None:
        root = self.kubelet_root
        (root / "pki").mkdir(parents=True, exist_ok=True)
        (root / "volume-plugins").mkdir(exist_ok=True)
        kubeconfig = self.plane.kubeconfig(token=self.plane.tokens[f"node:{self.name}"], name=f"node-{self.name}")
        self.kubelet_port = free_port()
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        self._spawn("kubelet", [
            str(self.bin_dir / "kubelet"),
            "--kubeconfig", kubeconfig,
            # the node's address is the bridge's gateway (the kubelet refuses a loopback node IP): host-network pods
            # and the kubelet's API are on it, reachable from this machine and from the pods, nowhere else
            "--hostname-override", self.name, "--node-ip", self.gateway,
            "--address", self.gateway, "--port", str(self.kubelet_port), "--read-only-port", "0", "--healthz-port", "0",
            "--container-runtime", "remote", "--container-runtime-endpoint", f"unix://{self.address}",
            "--runtime-request-timeout", "5m",
            "--root-dir", str(root), "--cert-dir", str(root / "pki"),
            "--volume-plugin-dir", str(root / "volume-plugins"),
            "--client-ca-file", str(self.plane.ca_file), "--anonymous-auth=false",
            "--authorization-mode", "AlwaysAllow",  # only the apiserver's client certificate gets in
            "--cgroup-driver", "cgroupfs", "--fail-swap-on=false",
            "--make-iptables-util-chains=false",
            # images are imported, never pulled: never collect them; no evictions for a busy shared disk
            "--image-gc-high-threshold", "100", "--image-gc-low-threshold", "99",
            "--eviction-hard", "memory.available<1Mi",
            "--resolv-conf", "/etc/resolv.conf",
            "--node-status-update-frequency", "4s", "--sync-frequency", "5s",
            "--max-pods", "40",
            *(["--node-labels", labels] if labels else []),
            "--v", "1",
        ])

    def node(self) -> dict | None:
        status, body = self.plane.request("GET", f"/api/v1/nodes/{self.name}")
        return body if status == 200 else None

    def allocatable(self) -> dict:
        return ((self.node() or {}).get("status") or {}).get("allocatable") or {}

    def _ready(self) -> bool:
        n = self.node()
        conds = {c["type"]: c["status"] for c in ((n or {}).get("status") or {}).get("conditions") or []}
        taints = {t["key"] for t in ((n or {}).get("spec") or {}).get("taints") or []}
        return conds.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints

    def _start_device_plugin(self) -> None:
        plugins = DEVICE_PLUGINS
        self._wait(lambda: (plugins / "kubelet.sock").exists(), 60, "the kubelet's device plugin socket")
        if self.gpus:
            self._spawn("fake-gpu", [str(self.bin_dir / "trainhub-fake-gpu"), "--dir", str(plugins),
                                     "--resource", self.gpu_resource, "--count", str(self.gpus)])

    def restore_kernel_settings(self) -> dict:
        """Put back the kernel settings recorded before the start; {name: (was, now)} of those that had changed."""
        changed = {}
        for name, value in (self.state.get("kernel") or {}).items():
            now = read_sysctl(name)
            if value is not None and now != value:
                write_sysctl(name, value)
                changed[name] = (now, value)
        return changed

    # -- images --------------------------------------------------------------------------------

    def import_images(self, images) -> None:
        from images import import_images

        import_images(list(images), self.address)

    def images(self) -> list[str]:
        out = subprocess.run(["ctr", "--address", self.address, "-n", "k8s.io", "images", "ls", "-q"],
                             capture_output=True, text=True).stdout
        return out.split()

    # -- stop ----------------------------------------------------------------------------------

    def _delete_pods(self, timeout: float = 90) -> None:
        """Delete every pod bound to this node through the API and wait until the kubelet has ended them."""
        selector = urllib.parse.quote(f"spec.nodeName={self.name}")

        def pods():
            status, body = self.plane.request("GET", f"/api/v1/pods?fieldSelector={selector}")
            return (body or {}).get("items") or [] if status == 200 else []

        for p in pods():
            meta = p["metadata"]
            self.plane.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                               {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 1})
        kubelet = self.procs.get("kubelet")
        with contextlib.suppress(WaitTimeout):  # the kubelet removes them; a dead kubelet never will
            poll(lambda: not pods() or kubelet is None or kubelet.poll() is not None,
                 what=f"the pods of node {self.name} to go", start=0.5, factor=1.0, timeout=timeout)

    def stop(self) -> None:
        """Tear everything down (see the module docstring); safe to call twice and after a failed start."""
        kubelet = self.procs.get("kubelet")
        if kubelet is not None and kubelet.poll() is None and self.plane.url:
            with contextlib.suppress(Exception):
                # cordoned first: the controllers' replacements stay unbound instead of landing here again
                self.plane.request("PATCH", f"/api/v1/nodes/{self.name}", {"spec": {"unschedulable": True}},
                                   content_type="application/merge-patch+json")
                self._delete_pods()
        for name in ("fake-gpu", "kubelet"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                _stop_pid(proc.pid)
        teardown(self.state)
        self.procs.clear()
        if self._root_lock is not None:
            self._root_lock.close()
            self._root_lock = None
        with contextlib.suppress(Exception):
            self.plane.request("DELETE", f"/api/v1/nodes/{self.name}")


def teardown(state: dict) -> list[str]:
    """What remains of a node run (its ``state.json``): containers, containerd and its shims, mounts, the bridge,
    cgroups, the kubelet's log folders, kernel settings. Returns what it found and removed."""
    done = []
    run_dir = Path(state["run_dir"]) if state.get("run_dir") else None
    workdir = Path(state["workdir"]) if state.get("workdir") else None
    pids = state.get("pids") or {}
    for name in ("fake-gpu", "kubelet"):
        if pids.get(name) and _alive(pids[name]):
            _stop_pid(pids[name])
            done.append(f"stopped {name}")
    address = str(run_dir / "containerd.sock") if run_dir else None
    containerd = pids.get("containerd")
    if address and containerd and _alive(containerd):
        removed = remove_containers(address)
        if removed:
            done.append(f"killed {removed} leftover container(s)")
        _stop_pid(containerd, timeout=30)
        done.append("stopped containerd")
    if address:
        # the shims outlive containerd; each names its containerd's address on its command line
        for pid in _pids_with_arg(address):
            _stop_pid(pid, timeout=5)
            done.append(f"stopped shim {pid}")
    mounts = _umount_all(*[d for d in (workdir, run_dir) if d])
    if mounts:
        done.append(f"unmounted {len(mounts)}")
    bridge = state.get("bridge")
    if bridge and subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode == 0:
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        done.append(f"deleted bridge {bridge}")
    for tree in _cgroup_trees():
        _rmdir_cgroups(tree)
        done.append(f"removed {tree}")
    for d in state.get("made_dirs") or []:
        if Path(d).exists():
            shutil.rmtree(d, ignore_errors=True)
            done.append(f"removed {d}")
    for name, value in (state.get("kernel") or {}).items():
        if value is not None and read_sysctl(name) != value:
            write_sysctl(name, value)
            done.append(f"{name}={value}")
    if state.get("made_run_containerd") and Path("/run/containerd").exists():
        shutil.rmtree("/run/containerd", ignore_errors=True)
        done.append("removed /run/containerd")
    if run_dir and run_dir.exists():
        shutil.rmtree(run_dir, ignore_errors=True)
    if state.get("temporary_root"):
        shutil.rmtree(state["temporary_root"], ignore_errors=True)  # a root of its own: the images' unpacked layers
    return done


def remove_containers(address: str) -> int:
    """Kill and delete every container of containerd's k8s.io namespace (what the kubelet left); how many."""
    ctr = ["ctr", "--address", address, "-n", "k8s.io"]
    tasks = subprocess.run([*ctr, "tasks", "ls", "-q"], capture_output=True, text=True, timeout=60).stdout.split()
    for t in tasks:
        subprocess.run([*ctr, "tasks", "kill", "-s", "SIGKILL", t], capture_output=True, timeout=60)
    for t in tasks:
        subprocess.run([*ctr, "tasks", "delete", "-f", t], capture_output=True, timeout=60)
    containers = subprocess.run([*ctr, "containers", "ls", "-q"], capture_output=True, text=True, timeout=60).stdout.split()
    for c in containers:
        subprocess.run([*ctr, "containers", "delete", c], capture_output=True, timeout=60)
    return len(containers)


def cleanup_stale() -> list[str]:
    """Tear down what a node run left behind when its process died (its state.json is still in RUN_ROOT)."""
    done = []
    if not RUN_ROOT.is_dir():
        return done
    for state_file in RUN_ROOT.glob("*/state.json"):
        owner = int(state_file.parent.name.split("-")[0])
        if owner != os.getpid() and _alive(owner):
            continue  # another live session's node
        with contextlib.suppress(ValueError, OSError):
            done += teardown(json.loads(state_file.read_text()))
        shutil.rmtree(state_file.parent, ignore_errors=True)
    return done


if __name__ == "__main__":
    if sys.argv[1:] == ["cleanup"]:
        print("\n".join(cleanup_stale()) or "nothing left behind")
        sys.exit(0)
    print(__doc__)
    sys.exit(2)
