"""PrometheusDCGMSource against a tiny in-process Prometheus API stand-in.

The stand-in (a tornado app on loopback) serves canned ``/api/v1/query`` answers in Prometheus'
JSON format: every series it holds whose labels match the query's ``namespace``/``pod``
regex matchers and metric names (the only matchers the source sends), like Prometheus would.
It does not evaluate PromQL; the query text is checked separately.
"""

from __future__ import annotations

import json
import re
import socket
import time

import pytest
import pytest_asyncio
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from trainhub.metrics import MetricsUnavailable
from trainhub.metrics.prometheus import PrometheusDCGMSource
from trainhub.services.jobs.kubernetes import GPUTarget

_MATCHER = re.compile(r'(\w+)=~"((?:[^"\\]|\\.)*)"')


class FakePrometheus:
    def __init__(self):
        self.series: list[dict] = []
        self.queries: list[str] = []
        self.fail: tuple[int, dict] | None = None

    def add(self, name, ns, pod, gpu, value, age=0.0, **labels):
        self.series.append({"metric": {"__name__": name, "namespace": ns, "pod": pod, "gpu": str(gpu),
                                       "UUID": f"GPU-{pod}-{gpu}", "Hostname": "gpu-a", **labels},
                            "value": [time.time() - age, str(value)]})

    def answer(self, query: str) -> dict:
        self.queries.append(query)
        matchers = {k: re.compile(v.replace("\\\\", "\\")) for k, v in _MATCHER.findall(query)}
        result = [s for s in self.series if all(m.fullmatch(s["metric"].get(k, "")) for k, m in matchers.items())]
        return {"status": "success", "data": {"resultType": "vector", "result": result}}


class QueryHandler(web.RequestHandler):
    def get(self):
        prom = self.settings["prom"]
        if prom.fail:
            self.set_status(prom.fail[0])
            self.finish(prom.fail[1])
            return
        self.finish(prom.answer(self.get_argument("query")))


@pytest_asyncio.fixture
async def prom():
    fake = FakePrometheus()
    sock, port = bind_unused_port()  # non-blocking, loopback
    server = HTTPServer(web.Application([(r"/api/v1/query", QueryHandler)], prom=fake))
    server.add_sockets([sock])
    fake.url = f"http://127.0.0.1:{port}"
    yield fake
    server.stop()


def _gpu(ns, pod, gpu, util, used, free, prom, age=0.0):
    prom.add("DCGM_FI_DEV_GPU_UTIL", ns, pod, gpu, util, age)
    prom.add("DCGM_FI_DEV_FB_USED", ns, pod, gpu, used, age)
    prom.add("DCGM_FI_DEV_FB_FREE", ns, pod, gpu, free, age)


async def test_sample_pods_groups_gpus_by_pod(prom):
    _gpu("ml", "train-0", 3, 87, 30000, 10960, prom)
    _gpu("ml", "train-0", 1, 12, 1000, 39960, prom)
    _gpu("ml", "train-1", 0, 0, 0, 40960, prom)
    _gpu("other", "train-0", 5, 99, 1, 1, prom)  # same pod name, other namespace
    source = PrometheusDCGMSource(url=prom.url)
    out = await source.sample_pods([("ml", "train-0"), ("ml", "train-1"), ("ml", "absent")])
    assert sorted(out) == [("ml", "train-0"), ("ml", "train-1")]
    s0 = out[("ml", "train-0")]
    assert [(s.utilization, s.memory_used_mb, s.memory_total_mb) for s in s0] == [(12, 1000, 40960), (87, 30000, 40960)]
    assert not s0[0].simulated
    assert out[("ml", "train-1")][0].utilization == 0
    (query,) = prom.queries
    assert query == ('{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE",'
                     'namespace=~"ml",pod=~"absent|train-0|train-1"}')


async def test_sample_maps_ledger_devices_through_the_resolver(prom):
    _gpu("ml", "job-0", 0, 55, 100, 900, prom)
    _gpu("ml", "job-0", 1, 65, 100, 900, prom)
    _gpu("ml", "job-1", 0, 75, 100, 900, prom)

    async def resolver(devices):
        table = {4: GPUTarget("ml", "job-0", 0), 5: GPUTarget("ml", "job-0", 1), 6: GPUTarget("ml", "job-1", 0),
                 7: GPUTarget("ml", "job-1", 1), 8: GPUTarget("ml", "gone", 0)}
        return {d: table[d] for d in devices if d in table}

    source = PrometheusDCGMSource(url=prom.url, resolver=resolver)
    out = await source.sample([4, 5, 6, 7, 8, 9])
    # job-1 has one GPU series only and "gone" none: unknown, never idle
    assert {d: s.utilization for d, s in out.items()} == {4: 55, 5: 65, 6: 75}
    assert await PrometheusDCGMSource(url=prom.url).sample([4]) == {}  # no resolver: nothing known


async def test_stale_series_and_missing_utilisation_are_unknown(prom):
    _gpu("ml", "old", 0, 0, 0, 100, prom, age=600)  # exporter gone for 10 minutes
    prom.add("DCGM_FI_DEV_FB_USED", "ml", "memonly", 0, 5)
    prom.add("DCGM_FI_DEV_GPU_UTIL", "ml", "nomem", 0, 40)
    out = await PrometheusDCGMSource(url=prom.url).sample_pods([("ml", "old"), ("ml", "memonly"), ("ml", "nomem")])
    assert list(out) == [("ml", "nomem")]
    assert (out[("ml", "nomem")][0].memory_used_mb, out[("ml", "nomem")][0].memory_total_mb) == (0, 0)


async def test_mig_ratio_metric_relabelled_pods_and_selector(prom):
    prom.add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "", "", 0, 0.42, exported_namespace="ml", exported_pod="nb.alice", job="dcgm")
    source = PrometheusDCGMSource(url=prom.url, util_metric="DCGM_FI_PROF_GR_ENGINE_ACTIVE", util_scale=100, used_metric="",
                                  free_metric="", namespace_label="exported_namespace", pod_label="exported_pod", selector='job="dcgm"')
    out = await source.sample_pods([("ml", "nb.alice")])
    assert out[("ml", "nb.alice")][0].utilization == pytest.approx(42)
    assert prom.queries[-1] == ('{__name__=~"DCGM_FI_PROF_GR_ENGINE_ACTIVE",exported_namespace=~"ml",'
                                'exported_pod=~"nb\\\\.alice",job="dcgm"}')


@pytest.mark.parametrize("fail,fragment", [
    ((500, {"status": "error", "error": "query timed out"}), "query timed out"),
    ((400, {"status": "error", "errorType": "bad_data", "error": "parse error"}), "parse error"),
    ((200, {"status": "success", "data": {"resultType": "matrix", "result": []}}), "not an instant vector"),
])
async def test_prometheus_errors_raise_metrics_unavailable(prom, fail, fragment):
    prom.fail = fail
    with pytest.raises(MetricsUnavailable, match=fragment):
        await PrometheusDCGMSource(url=prom.url).sample_pods([("ml", "x")])


async def test_unreachable_or_unconfigured_prometheus():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MetricsUnavailable, match="unreachable"):
        await PrometheusDCGMSource(url=f"http://127.0.0.1:{port}", request_timeout=2).sample_pods([("ml", "x")])
    with pytest.raises(MetricsUnavailable, match="no Prometheus URL"):
        await PrometheusDCGMSource(url="").sample_pods([("ml", "x")])
    assert await PrometheusDCGMSource(url="").sample_pods([]) == {}
