"""GPU inventory: what devices this machine has (NVML), or simulated ones.

Simulated devices let the platform be tried and tested without a GPU; they are
labelled ``simulated`` wherever they are shown.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

log = logging.getLogger("trainhub.gpus")


@dataclass(frozen=True)
class GPUDevice:
    index: int
    name: str
    uuid: str
    memory_total_mb: int
    simulated: bool = False
    minor: int | None = None  # the driver's minor number: /dev/nvidia<minor> (None: unknown, taken as the index)

    @property
    def label(self) -> str:
        return f"GPU {self.index}: {self.name}" + (" (simulated)" if self.simulated else "")

    def to_dict(self) -> dict:
        return asdict(self)


def nvml_devices() -> list[GPUDevice] | None:
    """Devices reported by NVML, or None when no NVIDIA driver is present."""
    try:
        import pynvml
    except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        log.debug("NVML unavailable: %s", e)
        return None
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            try:
                minor = int(pynvml.nvmlDeviceGetMinorNumber(h))
            except pynvml.NVMLError:
                minor = None
            devices.append(
                GPUDevice(
                    index=i,
                    name=name.decode() if isinstance(name, bytes) else name,
                    uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
                    memory_total_mb=int(mem.total // (1024 * 1024)),
                    minor=minor,
                )
            )
        return devices
    finally:
        pynvml.nvmlShutdown()


def simulated_devices(n: int, name: str = "Simulated GPU", memory_mb: int = 16384) -> list[GPUDevice]:
    return [
        GPUDevice(index=i, name=name, uuid=f"GPU-simulated-{i:04d}", memory_total_mb=memory_mb, simulated=True)
        for i in range(n)
    ]


def parse_gpus_flag(value: str) -> str:
    """Validate `--gpus` (``auto`` or a non-negative integer); returns the normalised text."""
    v = str(value).strip().lower()
    if v == "auto":
        return v
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"--gpus must be 'auto' or a number of GPUs (0, 1, 2, ...), not {value!r}") from None
    if n < 0:
        raise ValueError(f"--gpus must be 0 or more, not {n}")
    return str(n)


def discover(spec: str) -> list[GPUDevice]:
    """Devices for a `--gpus` spec.

    ``auto``: NVML if present, else none. ``N``: the first N real devices when NVML has at
    least N, else N simulated devices (so a laptop can run the platform and its tests).
    """
    spec = parse_gpus_flag(spec)
    real = nvml_devices()
    if spec == "auto":
        return real or []
    n = int(spec)
    if real and len(real) >= n:
        return real[:n]
    if real:
        log.warning("Asked for %d GPUs but NVML reports %d; simulating %d devices instead", n, len(real), n)
    return simulated_devices(n)
