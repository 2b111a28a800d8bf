"""GPU metrics from NVML (nvidia-ml-py)."""

from __future__ import annotations

import asyncio
import threading
import time

from trainhub.metrics.base import GPUMetricsSource, GPUSample, MetricsUnavailable


class NVMLMetricsSource(GPUMetricsSource):
    """Utilisation and memory of real NVIDIA devices through NVML.

    NVML is initialised on first use, in a worker thread. Without an NVIDIA driver
    ``nvmlInit()`` raises ``NVMLError_LibraryNotFound``; :meth:`sample` then raises
    :class:`MetricsUnavailable` telling the admin to use ``ScriptedMetricsSource`` for
    simulated devices. A device whose query fails is left out of the result.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._lock = threading.Lock()
        self._initialised = False

    def _init(self):
        import pynvml

        if self._initialised:
            return pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as e:
            raise MetricsUnavailable(
                "NVML library not found: this machine has no NVIDIA driver, so GPU utilisation cannot be "
                "measured. For simulated devices use trainhub.metrics.ScriptedMetricsSource "
                f"({e})"
            ) from e
        except pynvml.NVMLError as e:
            raise MetricsUnavailable(f"NVML failed to initialise: {e}") from e
        self._initialised = True
        return pynvml

    def _sample_sync(self, devices: list[int]) -> dict[int, GPUSample]:
        with self._lock:
            pynvml = self._init()
            out: dict[int, GPUSample] = {}
            for idx in devices:
                try:
                    h = pynvml.nvmlDeviceGetHandleByIndex(idx)
                    util = pynvml.nvmlDeviceGetUtilizationRates(h)
                    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                except pynvml.NVMLError as e:
                    self.log.warning("NVML: cannot sample GPU %s: %s", idx, e)
                    continue
                out[idx] = GPUSample(
                    utilization=float(util.gpu),
                    memory_used_mb=mem.used / 2**20,
                    memory_total_mb=mem.total / 2**20,
                    simulated=False,
                    at=time.time(),
                )
            return out

    async def sample(self, devices: list[int]) -> dict[int, GPUSample]:
        return await asyncio.get_running_loop().run_in_executor(None, self._sample_sync, list(devices))

    def close(self) -> None:
        if self._initialised:
            import pynvml

            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:  # pragma: no cover
                pass
            self._initialised = False
