"""Scripted GPU metrics: utilisation read from a JSON file, for simulated devices, tests and demos."""

from __future__ import annotations

import asyncio
import json
import os
import time

from traitlets import Float, Unicode, default

from trainhub.metrics.base import GPUMetricsSource, GPUSample, MetricsUnavailable

ENV_SCRIPT = "TRAINHUB_GPU_METRICS_FILE"
#: File name `trainhub up` gives the culler in the data dir (``<data-dir>/gpu-metrics.json``).
DEFAULT_SCRIPT_NAME = "gpu-metrics.json"


class ScriptedMetricsSource(GPUMetricsSource):
    """Per-device utilisation from a JSON file, re-read on every sample.

    File format (every field optional)::

        {"devices": {"0": {"utilization": 85, "memory_used_mb": 1000}},
         "default": {"utilization": 0, "memory_used_mb": 0}}

    A device missing from ``devices`` gets ``default``; with no default it reads 0 %.
    A missing file means every device is idle (0 %): simulated devices run nothing.
    An unreadable or malformed file raises :class:`MetricsUnavailable` (callers then
    treat every device as unknown, so nothing is culled on a typo).
    """

    path = Unicode(
        help=f"""JSON file with the scripted utilisation, e.g. /srv/trainhub/gpu-metrics.json.

        Re-read on every sample, so a test or demo edits it to change what the culler sees.
        Default: ${ENV_SCRIPT} (`trainhub up` sets it to <data-dir>/{DEFAULT_SCRIPT_NAME}), else empty
        (every device reads 0 %).
        """,
    ).tag(config=True)

    memory_total_mb = Float(
        16384, help="Memory reported for a simulated device when the file gives none (MiB)."
    ).tag(config=True)

    @default("path")
    def _default_path(self):
        return os.environ.get(ENV_SCRIPT, "")

    def _read(self) -> dict:
        if not self.path or not os.path.exists(self.path):
            return {}
        try:
            with open(self.path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise MetricsUnavailable(f"cannot read scripted GPU metrics from {self.path}: {e}") from e
        if not isinstance(data, dict):
            raise MetricsUnavailable(f"{self.path}: expected a JSON object with 'devices' and/or 'default'")
        return data

    def _sample_sync(self, devices: list[int]) -> dict[int, GPUSample]:
        data = self._read()
        per_device = data.get("devices") or {}
        fallback = data.get("default") or {}
        now = time.time()
        out = {}
        for idx in devices:
            entry = per_device.get(str(idx), fallback)
            try:
                util = float(entry.get("utilization", 0))
                used = float(entry.get("memory_used_mb", 0))
                total = float(entry.get("memory_total_mb", self.memory_total_mb))
            except (AttributeError, TypeError, ValueError) as e:
                raise MetricsUnavailable(f"{self.path}: bad entry for device {idx}: {entry!r} ({e})") from e
            out[idx] = GPUSample(
                utilization=min(max(util, 0.0), 100.0),
                memory_used_mb=used,
                memory_total_mb=total,
                simulated=True,
                at=now,
            )
        return out

    async def sample(self, devices: list[int]) -> dict[int, GPUSample]:
        return await asyncio.to_thread(self._sample_sync, list(devices))


def default_metrics_class(devices) -> type[GPUMetricsSource]:
    """The source that fits a device list: scripted when every device is simulated (or none), else NVML."""
    from trainhub.metrics.nvml import NVMLMetricsSource

    devices = list(devices)
    if devices and not all(getattr(d, "simulated", False) for d in devices):
        return NVMLMetricsSource
    return ScriptedMetricsSource
