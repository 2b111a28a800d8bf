"""A real node leaves this machine as it found it: every process it started (found by PID and by its own paths),
every mount under its folders, its bridge, the kubelet's cgroups, the folders the kubelet makes outside its root,
and the kernel settings the kubelet and the bridge plugin change.

A node of its own (not the chart's; one node at a time runs on a machine): a pod with the volumes that mount
(a memory-backed emptyDir, a Secret, the ServiceAccount token), a simulated GPU and the pod network.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from node import NODE_NAME
from waiting import wait_for

pytestmark = pytest.mark.timeout(600)


def _processes_with(fragment: str) -> list[str]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if fragment.encode() in (d / "cmdline").read_bytes():
                    out.append(d.name)
            except OSError:
                pass
    return out


def _mounts_under(*folders: Path) -> list[str]:
    roots = [str(f) for f in folders]
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if any(line.split()[4].startswith(r) for r in roots)]


def test_a_node_is_torn_down_completely(tmp_path):
    import images
    from controlplane import ControlPlane, ensure_built
    from node import HOST_DIRS, KERNEL_SETTINGS, Node, _cgroup_trees, read_sysctl

    bin_dir = ensure_built()
    kernel_before = {k: read_sysctl(k) for k in KERNEL_SETTINGS}
    host_dirs_before = {str(d) for d in HOST_DIRS if d.exists()}
    assert not _cgroup_trees(), "kubepods cgroups exist before the node starts: another kubelet runs here"
    plane = ControlPlane(tmp_path / "plane", bin_dir=bin_dir, kubelet="none", node_names=(NODE_NAME,)).start()
    node = Node(plane, tmp_path / "node", name=NODE_NAME, gpus=1, bin_dir=bin_dir)
    try:
        node.start()
        image = images.build(["trainhub"])["trainhub"]
        node.import_images([image])
        plane.request("POST", "/api/v1/namespaces/default/secrets",
                      {"metadata": {"name": "s"}, "stringData": {"k": "v"}})
        wait_for(lambda: plane.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[1].get("secrets"),
                 what="the default ServiceAccount token", timeout=60)
        status, _ = plane.request("POST", "/api/v1/namespaces/default/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper"},
            "spec": {"terminationGracePeriodSeconds": 2, "containers": [{
                "name": "c", "image": image.ref, "imagePullPolicy": "Never", "command": ["sleep", "3600"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}, {"name": "s", "mountPath": "/s"}]}],
                "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}, {"name": "s", "secret": {"secretName": "s"}}]}})
        assert status == 201
        pod = wait_for(lambda: plane.request("GET", "/api/v1/namespaces/default/pods/sleeper")[1],
                       lambda p: (p.get("status") or {}).get("phase") == "Running", what="the pod to run", timeout=120)
        assert pod["status"]["podIP"].startswith("10.244.0.")
        # what the run made: the bridge, mounts under its folders, the kubepods cgroups, a container's processes
        assert subprocess.run(["ip", "link", "show", node.bridge], capture_output=True).returncode == 0
        assert _mounts_under(node.workdir, node.run_dir) and _cgroup_trees()
        assert _processes_with(str(node.run_dir))  # containerd, its shims
        run_dir, workdir, pids = node.run_dir, node.workdir, dict(node.state["pids"])
    finally:
        node.stop()
        plane.stop()
    for name, pid in pids.items():
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3], name
    assert not _processes_with(str(run_dir)), "a process of the node (containerd, a shim, a container) is left"
    assert not _processes_with(str(workdir))
    assert not _mounts_under(workdir, run_dir)
    assert subprocess.run(["ip", "link", "show", "trainhub0"], capture_output=True).returncode != 0
    assert not _cgroup_trees()
    assert {str(d) for d in HOST_DIRS if d.exists()} == host_dirs_before
    assert {k: read_sysctl(k) for k in KERNEL_SETTINGS} == kernel_before
    assert not run_dir.exists()
