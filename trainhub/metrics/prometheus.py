"""GPU metrics on Kubernetes: the NVIDIA DCGM exporter's series, read from Prometheus.

The DCGM exporter (part of the NVIDIA GPU Operator) publishes per-GPU series such as
``DCGM_FI_DEV_GPU_UTIL`` (percent) and ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` (MiB),
labelled with the ``namespace`` and ``pod`` the GPU is assigned to (its Kubernetes pod mapping,
on by default in the operator). :class:`PrometheusDCGMSource` asks Prometheus for them with one
instant query (``/api/v1/query``) per sample, so the culler and the jobs engine apply the same
policy as on the local back end, with the same :class:`~trainhub.metrics.base.GPUSample`.

Two ways in:

* ``await source.sample_pods([(namespace, pod), ...])`` → ``{(namespace, pod): [GPUSample, ...]}``
  (one sample per GPU of the pod, ordered by the exporter's ``gpu`` label);
* ``await source.sample(devices)`` (the :class:`GPUMetricsSource` contract, ledger device indices)
  once ``resolver`` maps devices to pods: ``resolver(devices) -> {device: target}`` where a
  target has ``namespace``, ``pod`` and ``slot`` (the slot-th GPU of that pod), sync or async.
  ``KubernetesLauncher.gpu_targets`` is such a resolver for job pods.

A device whose pod has no fresh series is left out (callers read that as "unknown", never as
"idle"); an unreachable Prometheus or an error answer raises :class:`MetricsUnavailable`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from urllib.parse import urlencode

from traitlets import Any, Dict, Float, Unicode, default

from trainhub.metrics.base import GPUMetricsSource, GPUSample, MetricsUnavailable

ENV_URL = "TRAINHUB_PROMETHEUS_URL"


@dataclass(frozen=True)
class GPUTarget:
    """Where a ledger device lives on Kubernetes: the ``slot``-th GPU of a pod (what a resolver returns)."""

    namespace: str
    pod: str
    slot: int = 0


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _regex_alternatives(values) -> str:
    # an RE2 alternation of literal names (DNS names: only "." is special); _quote escapes it for the string
    return "|".join(v.replace(".", "\\.") for v in sorted(set(values)))


class PrometheusDCGMSource(GPUMetricsSource):
    """Per-pod GPU utilisation and memory from the DCGM exporter through the Prometheus HTTP API."""

    url = Unicode(
        help=f"""Prometheus base URL, e.g. http://prometheus-operated.monitoring:9090 (the /api/v1/query
        endpoint is under it). Default: ${ENV_URL}.""",
    ).tag(config=True)

    @default("url")
    def _url_default(self):
        return os.environ.get(ENV_URL, "")

    util_metric = Unicode(
        "DCGM_FI_DEV_GPU_UTIL",
        help="""Utilisation series. For MIG slices (where GPU_UTIL is not reported) use
        DCGM_FI_PROF_GR_ENGINE_ACTIVE with util_scale = 100.""",
    ).tag(config=True)
    util_scale = Float(1.0, help="Factor turning util_metric into percent (100 for 0-1 ratios).").tag(config=True)
    used_metric = Unicode("DCGM_FI_DEV_FB_USED", help="Used frame-buffer memory series (MiB).").tag(config=True)
    free_metric = Unicode("DCGM_FI_DEV_FB_FREE", help="Free frame-buffer memory series (MiB); empty = total unknown (0).").tag(config=True)
    namespace_label = Unicode("namespace", help="Label holding the pod's namespace (\"exported_namespace\" when Prometheus relabels it).").tag(config=True)
    pod_label = Unicode("pod", help="Label holding the pod's name (\"exported_pod\" when Prometheus relabels it).").tag(config=True)
    gpu_label = Unicode("gpu", help="Label with the GPU's index on its node; orders a pod's GPUs into slots.").tag(config=True)
    selector = Unicode("", help="""Extra label matchers for every series, e.g. 'job="dcgm-exporter"'.""").tag(config=True)
    max_age = Float(
        120.0,
        help="""Seconds after which a series' last value no longer counts (Prometheus answers instant queries
        with values up to 5 minutes old; a stopped exporter must read as unknown, not as idle).""",
    ).tag(config=True)
    request_timeout = Float(10.0, help="Seconds one query may take.").tag(config=True)
    headers = Dict(help="Extra HTTP headers, e.g. {\"Authorization\": \"Bearer ...\"}.").tag(config=True)
    resolver = Any(
        None,
        help="""Callable (sync or async) `resolver(devices) -> {device: target}` mapping ledger device indices
        to pods (targets have namespace, pod and slot). Default: ``gpu_targets`` (what the jobs service or
        the culler gives the source). Without one, sample() measures nothing.""",
    ).tag(config=True)

    @default("resolver")
    def _resolver_default(self):
        return self.gpu_targets

    # -- Prometheus --------------------------------------------------------------------------

    async def query(self, promql: str) -> list[dict]:
        """Run an instant query; returns the ``result`` list of a vector answer."""
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError

        if not self.url:
            raise MetricsUnavailable(f"no Prometheus URL: set PrometheusDCGMSource.url or ${ENV_URL}")
        target = f"{self.url.rstrip('/')}/api/v1/query?{urlencode({'query': promql})}"
        try:
            resp = await AsyncHTTPClient().fetch(target, headers=dict(self.headers), request_timeout=self.request_timeout,
                                                 connect_timeout=self.request_timeout, raise_error=False)
        except (OSError, asyncio.TimeoutError, HTTPClientError) as e:
            raise MetricsUnavailable(f"Prometheus at {self.url} is unreachable: {e}") from e
        try:
            data = json.loads(resp.body or b"{}")
        except ValueError:
            data = {}
        if resp.code != 200 or data.get("status") != "success":
            why = data.get("error") or (resp.error and str(resp.error)) or f"HTTP {resp.code}"
            raise MetricsUnavailable(f"Prometheus query failed at {self.url}: {why}")
        result = (data.get("data") or {})
        if result.get("resultType") != "vector":
            raise MetricsUnavailable(f"Prometheus answered a {result.get('resultType')!r}, not an instant vector")
        return result.get("result") or []

    def _promql(self, pods: list[tuple[str, str]]) -> str:
        names = [m for m in (self.util_metric, self.used_metric, self.free_metric) if m]
        matchers = [f"__name__=~{_quote('|'.join(names))}",
                    f"{self.namespace_label}=~{_quote(_regex_alternatives(ns for ns, _ in pods))}",
                    f"{self.pod_label}=~{_quote(_regex_alternatives(p for _, p in pods))}"]
        if self.selector:
            matchers.append(self.selector)
        return "{" + ",".join(matchers) + "}"

    async def sample_pods(self, pods) -> dict[tuple[str, str], list[GPUSample]]:
        """``{(namespace, pod): [GPUSample per GPU, by gpu label]}`` for pods with fresh series."""
        pods = sorted({(str(ns), str(p)) for ns, p in pods})
        if not pods:
            return {}
        wanted = set(pods)
        now = time.time()
        gpus: dict[tuple[str, str], dict[str, dict]] = {}
        for series in await self.query(self._promql(pods)):
            labels = series.get("metric") or {}
            key = (labels.get(self.namespace_label, ""), labels.get(self.pod_label, ""))
            if key not in wanted:
                continue
            try:
                at, value = float(series["value"][0]), float(series["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if now - at > self.max_age or value != value:  # stale, or NaN
                continue
            gpu_id = labels.get(self.gpu_label) or labels.get("UUID") or "0"
            entry = gpus.setdefault(key, {}).setdefault(gpu_id, {"at": at})
            entry[labels.get("__name__")] = value
            entry["at"] = min(entry["at"], at)
        out = {}
        for key, per_gpu in gpus.items():
            samples = []
            for gpu_id in sorted(per_gpu, key=lambda g: (0, int(g)) if g.isdigit() else (1, g)):
                e = per_gpu[gpu_id]
                if self.util_metric not in e:
                    continue  # memory without utilisation cannot say idle or busy
                used = e.get(self.used_metric, 0.0)
                total = used + e[self.free_metric] if self.free_metric in e else 0.0
                samples.append(GPUSample(utilization=min(max(e[self.util_metric] * self.util_scale, 0.0), 100.0),
                                         memory_used_mb=used, memory_total_mb=total, simulated=False, at=e["at"]))
            if samples:
                out[key] = samples
        return out

    async def sample(self, devices: list[int]) -> dict[int, GPUSample]:
        if self.resolver is None:
            self.log.debug("PrometheusDCGMSource: no resolver configured; nothing to map devices %s to", devices)
            return {}
        targets = self.resolver(list(devices))
        if asyncio.iscoroutine(targets):
            targets = await targets
        if not targets:
            return {}
        by_pod = await self.sample_pods((t.namespace, t.pod) for t in targets.values())
        out = {}
        for device, t in targets.items():
            samples = by_pod.get((t.namespace, t.pod)) or []
            slot = getattr(t, "slot", 0)
            if slot < len(samples):
                out[device] = samples[slot]
        return out
