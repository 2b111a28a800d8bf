"""What notebook pods and job pods both need, written once."""

from __future__ import annotations

SHM_VOLUME = "dshm"


def shm_parts(size: str | None) -> tuple[list[dict], list[dict]]:
    """A memory-backed ``/dev/shm`` of ``size`` (a quantity, "1Gi"): ``(volumes, volume_mounts)``.

    Container runtimes give 64 MiB, which PyTorch's DataLoader workers and NCCL outgrow at once
    ("bus error" in a notebook or a job). Empty or None: the runtime's own, nothing added.
    """
    if not size:
        return [], []
    return ([{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": size}}],
            [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}])
