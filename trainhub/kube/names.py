"""Names on Kubernetes objects that the notebook spawner and the job launcher share (pure).

The GPU ledger on Kubernetes (``trainhub.spawner.k8s_allocator``) reads whose a pod is from these
annotations, whether the pod is a notebook (KubeSpawner's) or a job worker (the launcher's).
"""

from __future__ import annotations

import hashlib
import re

# Pod annotations naming the JupyterHub user a pod belongs to.
NOTEBOOK_USER_ANNOTATION = "hub.jupyter.org/username"  # set by KubeSpawner on notebook pods
JOB_USER_ANNOTATION = "trainhub.io/username"  # set by the trainhub job launcher on job pods
PROFILE_ANNOTATION = "trainhub.io/profile"
PROFILE_LABEL = "trainhub.io/profile"
COMPONENT_LABEL = "app.kubernetes.io/component"

# Environment keys that carry credentials; they go in a Secret, never in a plain env value.
# (TRAINHUB_STORAGE_OPTIONS is written without key/secret/token when a Secret is used.)
SECRET_ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def k8s_name(*parts: str, max_len: int = 63) -> str:
    """A DNS-1123 name from parts ("trainhub", "alice@x.org" -> "trainhub-alice-x-org")."""
    raw = "-".join(p for p in parts if p)
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)
    if name != raw or len(name) > max_len:
        # sanitizing lost information: a digest keeps distinct inputs distinct
        digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
        name = name[: max_len - 9].rstrip("-") + "-" + digest
    return name
