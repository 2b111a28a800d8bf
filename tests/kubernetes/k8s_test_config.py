"""Settings shared by the Kubernetes tests (a module of its own, not conftest, so test modules
can import it by a name no other test folder uses)."""

from __future__ import annotations

import base64
import os
from datetime import datetime, timedelta, timezone

REAL_KUBECONFIG = os.environ.get("TRAINHUB_TEST_KUBECONFIG", "")


def kube_mode() -> str:
    """Where the ``cluster`` and ``kube`` fixtures point: ``standin`` (default: ``KubeStandin`` on
    loopback), ``real`` (the v1.20.2 control plane of ``controlplane/``, with the kubelet
    stand-in; ``pytest --kube=real`` or ``TRAINHUB_TEST_KUBE=real``) or ``cluster`` (an existing
    cluster: ``TRAINHUB_TEST_KUBECONFIG``)."""
    if REAL_KUBECONFIG:
        return "cluster"
    mode = os.environ.get("TRAINHUB_TEST_KUBE", "standin") or "standin"
    if mode not in ("standin", "real"):
        raise ValueError(f"TRAINHUB_TEST_KUBE={mode!r}: expected 'standin' or 'real'")
    return mode


# the version of the real control plane the suite builds and runs (controlplane/build.sh)
CONTROL_PLANE_VERSION = (1, 20)
NAMESPACE = os.environ.get("TRAINHUB_TEST_NAMESPACE", "trainhub-test")
TEST_IMAGE = os.environ.get("TRAINHUB_TEST_IMAGE", "busybox:1.36")

GPU_TYPE_LABEL = "trainhub.io/gpu-type"
MIG = "nvidia.com/mig-1g.10gb"

GPU_TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]

# The nodes of the default cluster: two tainted A100 nodes (4 + 2 GPUs), one MIG node, one CPU
# node and GPU nodes that must not count (cordoned, not Ready, a taint no profile tolerates).
NODES = {
    "gpu-a": dict(allocatable={"nvidia.com/gpu": "4"}, taints=GPU_TAINT, labels={
        GPU_TYPE_LABEL: "a100", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.memory": "40960"}),
    "gpu-b": dict(allocatable={"nvidia.com/gpu": "2"}, labels={GPU_TYPE_LABEL: "a100"}, taints=GPU_TAINT),
    "mig-a": dict(allocatable={MIG: "2"}, labels={GPU_TYPE_LABEL: "a100-mig"}),
    "cpu-a": dict(allocatable={}),
    "gpu-cordoned": dict(allocatable={"nvidia.com/gpu": "8"}, labels={GPU_TYPE_LABEL: "a100"}, taints=GPU_TAINT,
                         unschedulable=True),
    "gpu-notready": dict(allocatable={"nvidia.com/gpu": "8"}, taints=GPU_TAINT, ready=False),
    "gpu-reserved": dict(allocatable={"nvidia.com/gpu": "8"},
                         taints=[{"key": "dedicated", "value": "other-team", "effect": "NoSchedule"}]),
}
SESSION_NODES = ("gpu-a", "gpu-b", "mig-a", "cpu-a", "gpu-cordoned")

PROFILES = [
    {"slug": "cpu", "display_name": "CPU", "gpus": 0, "image": TEST_IMAGE},
    {"slug": "gpu-1", "display_name": "1 GPU", "gpus": 1, "image": TEST_IMAGE, "cpu_limit": 4, "mem_limit": "16G",
     "node_selector": {GPU_TYPE_LABEL: "a100"},
     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    {"slug": "gpu-2", "display_name": "2 GPUs", "gpus": 2, "image": TEST_IMAGE,
     "node_selector": {GPU_TYPE_LABEL: "a100"},
     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    {"slug": "gpu-8", "display_name": "8 GPUs", "gpus": 8, "image": TEST_IMAGE,
     "node_selector": {GPU_TYPE_LABEL: "a100"},
     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    {"slug": "mig-small", "display_name": "MIG 1g.10gb", "gpus": 1, "gpu_resource": MIG, "image": TEST_IMAGE},
    # asks for more CPUs than any node has: refused at once, never Pending
    {"slug": "huge-cpu", "display_name": "Huge CPU", "gpus": 0, "image": TEST_IMAGE, "cpu_guarantee": 64},
    {"slug": "staff-gpu", "display_name": "Staff GPU", "gpus": 1, "image": TEST_IMAGE, "allowed_groups": ["staff"],
     "node_selector": {GPU_TYPE_LABEL: "a100"},
     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
]


def spawner_config(**overrides):
    """Config for GPUKubeSpawner in tests; overrides as Section__name=value."""
    from traitlets.config import Config

    c = Config()
    c.ProfileCatalog.profiles = PROFILES
    c.ProfileCatalog.default_profile = "cpu"
    c.KubeSpawner.namespace = NAMESPACE
    c.KubeSpawner.image = TEST_IMAGE
    # busybox stays up; the single-user arguments become positional parameters of sh
    c.KubeSpawner.cmd = ["sh", "-c", "sleep 3600", "sh"]
    c.KubeSpawner.start_timeout = 60
    c.KubeSpawner.http_timeout = 5
    c.KubeSpawner.events_enabled = False
    for key, value in overrides.items():
        section, name = key.split("__")
        setattr(getattr(c, section), name, value)
    return c


class MintingHook:
    """The admin's per-user credentials (StorageConfig.user_credentials_hook, as a Ceph RGW user per person or an STS
    call would give them): new ones at each call, valid ``valid`` seconds, keys ``ASIA<USER><n>``."""

    def __init__(self, valid: float = 4 * 3600):
        self.valid = valid
        self.calls: list[str] = []

    def __deepcopy__(self, memo):  # traitlets copies config values: the one hook is shared, with its calls
        return self

    def __call__(self, username: str) -> dict:
        self.calls.append(username)
        n = len(self.calls)
        return {"key": f"ASIA{username.upper().replace('-', '')}{n}", "secret": f"minted-{username}-{n}",
                "token": f"token-{username}-{n}", "expiration": datetime.now(timezone.utc) + timedelta(seconds=self.valid)}


def secret_text(secret: dict) -> dict:
    """A Secret's values as text (the apiserver stores stringData as base64 data; the stand-in may keep stringData)."""
    return secret.get("stringData") or {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
