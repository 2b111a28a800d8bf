"""GPU metrics: how busy each device is, from NVML or from a script (simulated devices).

One contract, :class:`GPUMetricsSource`, shared by the idle-GPU culler and the later
usage-accounting / advisor work. Swap implementations with a ``Type`` trait::

    metrics_class = Type(default_value=ScriptedMetricsSource, klass=GPUMetricsSource).tag(config=True)

Process-level helpers (CPU %, I/O wait of a pid) live in :mod:`trainhub.metrics.process`.
"""

from trainhub.metrics.base import GPUMetricsSource, GPUSample, MetricsUnavailable
from trainhub.metrics.nvml import NVMLMetricsSource
from trainhub.metrics.scripted import ScriptedMetricsSource, default_metrics_class

__all__ = [
    "GPUMetricsSource",
    "GPUSample",
    "MetricsUnavailable",
    "NVMLMetricsSource",
    "ScriptedMetricsSource",
    "default_metrics_class",
]
