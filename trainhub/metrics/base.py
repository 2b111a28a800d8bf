"""The metrics contract: :class:`GPUSample` and :class:`GPUMetricsSource`."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from traitlets import Callable
from traitlets.config import LoggingConfigurable


class MetricsUnavailable(RuntimeError):
    """The source cannot measure at all (no NVIDIA driver, unreadable script file).

    ``str(e)`` is written for an administrator and says what to do.
    """


@dataclass(frozen=True)
class GPUSample:
    """One measurement of one device.

    utilization: percent of time a kernel ran on the device over the driver's last
    sample period, 0-100. memory_used_mb / memory_total_mb: device memory in MiB.
    simulated: the value was scripted, not measured. at: time.time() of the sample.
    """

    utilization: float
    memory_used_mb: float
    memory_total_mb: float
    simulated: bool
    at: float

    def to_dict(self) -> dict:
        return asdict(self)


class GPUMetricsSource(LoggingConfigurable):
    """Contract for a source of per-device GPU measurements.

    Implementations override :meth:`sample`; :meth:`close` is optional. ``sample`` must
    not block the event loop (run driver calls in a thread), must return one
    :class:`GPUSample` per device it could measure and simply leave out a device it could
    not (callers treat a missing device as "unknown", never as "idle"), and raises
    :class:`MetricsUnavailable` only when it can measure nothing at all.
    """

    gpu_targets = Callable(
        None,
        allow_none=True,
        help="""Where the ledger's devices live, given by the component that builds the source: the jobs
        service passes its launcher's ``gpu_targets``, the culler its ledger's. Sources that measure
        devices where they run (NVML, scripted) ignore it; per-pod sources (DCGM) resolve through it.""",
    )

    async def sample(self, devices: list[int]) -> dict[int, GPUSample]:
        """Measure ``devices`` (indices as in the GPU ledger) now."""
        raise NotImplementedError

    def close(self) -> None:
        """Release driver handles; the source is not used afterwards."""
