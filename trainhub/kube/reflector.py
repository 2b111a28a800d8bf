"""trainhub's one Kubernetes watch cache: kubespawner's ``ResourceReflector``, for every kind it watches.

The spawner's GPU ledger (nodes and pods) and the jobs launcher (its Jobs and their pods) read
these; nothing in trainhub lists objects per call or runs a watch loop of its own.

KubeSpawner's ``ResourceReflector`` keys objects by ``namespace/name``, which fails for
cluster-scoped objects such as nodes (they have no namespace). ``ClusterReflector`` keeps
the same life cycle (``start``/``stop``/``first_load_future``, one instance per process in
``KubeSpawner.reflectors``, stopped by ``KubeSpawner._stop_all_reflectors``) with its own
list/watch loop that tolerates both scopes, relists after a 410, and can run on an API client
of its own (``api=``: the jobs launcher's kubeconfig) instead of kubespawner's shared one.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

from kubernetes_asyncio import client, watch
from kubespawner.reflector import ResourceReflector
from traitlets.config import LoggingConfigurable

try:  # aiohttp raises this on a read timeout of the watch stream
    from aiohttp import ServerTimeoutError as _ReadTimeout
except ImportError:  # pragma: no cover
    _ReadTimeout = asyncio.TimeoutError


def object_key(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else meta["name"]


class ClusterReflector(ResourceReflector):
    """A reflector for cluster-scoped objects or for every namespace at once."""

    max_backoff = 30.0

    def __init__(self, *args, api=None, **kwargs):
        if api is None:
            super().__init__(*args, **kwargs)
            return
        # ResourceReflector.__init__ would take kubespawner's shared client, built from the global
        # configuration and cached for the event loop: a reflector with an API client of its own must
        # not leave one without a host behind for the spawner. The rest of that __init__, as it is.
        LoggingConfigurable.__init__(self, *args, **kwargs)
        self.api = api
        self.label_selector = ",".join(f"{k}={v}" for k, v in self.labels.items())
        self.field_selector = ",".join(f"{k}={v}" for k, v in self.fields.items())
        self.first_load_future = asyncio.Future()
        if not self.list_method_name and self.kind == "pods":
            self.list_method_name = "list_pod_for_all_namespaces" if self.omit_namespace else "list_namespaced_pod"
        if not self.list_method_name:
            raise RuntimeError(f"{type(self).__name__}: list_method_name must be set")
        self.watch_task = None

    def get(self, name: str, namespace: str | None = None) -> dict | None:
        """The cached object ``name`` (in ``namespace``, default this reflector's own; none for cluster-scoped kinds)."""
        if namespace is None and not self.omit_namespace:
            namespace = self.namespace
        return self.resources.get(f"{namespace}/{name}" if namespace else name)

    async def _list_and_update(self, resource_version=None):
        kwargs = dict(
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            _request_timeout=self.request_timeout,
            _preload_content=False,
        )
        if not self.omit_namespace:
            kwargs["namespace"] = self.namespace
        response = await getattr(self.api, self.list_method_name)(**kwargs)
        if not response.ok:
            raise client.ApiException(status=response.status, reason=response.reason)
        data = json.loads(await response.read())
        self.resources = {object_key(o): o for o in data.get("items") or []}
        if not self.first_load_future.done():
            self.first_load_future.set_result(None)
        return (data.get("metadata") or {}).get("resourceVersion")

    async def _watch_and_update(self):
        delay = 0.1
        resource_version = None
        where = "all namespaces" if self.omit_namespace else f"namespace {self.namespace}"
        self.log.info("watching %s in %s", self.kind, where)
        while not self._stopping:
            start = time.monotonic()
            w = watch.Watch()
            try:
                if resource_version is None:
                    resource_version = await self._list_and_update()
                kwargs = {
                    "label_selector": self.label_selector,
                    "field_selector": self.field_selector,
                    "resource_version": resource_version,
                    "timeout_seconds": self.timeout_seconds,
                    "_request_timeout": self.request_timeout,
                }
                if not self.omit_namespace:
                    kwargs["namespace"] = self.namespace
                method = getattr(self.api, self.list_method_name)
                async with w.stream(method, **kwargs) as stream:
                    async for event in stream:
                        delay = 0.1
                        obj = event["raw_object"]
                        if event["type"] == "ERROR":
                            # e.g. 410 Gone: the resource version is too old; list again
                            resource_version = None
                            break
                        key = object_key(obj)
                        if event["type"] == "DELETED":
                            self.resources.pop(key, None)
                        else:
                            self.resources[key] = obj
                        resource_version = obj["metadata"].get("resourceVersion", resource_version)
                        if self._stopping or time.monotonic() - start >= self.restart_seconds:
                            break
            except asyncio.CancelledError:
                if self._stopping:
                    break  # stop() cancelled us and waits for a clean finish
                raise
            except (_ReadTimeout, asyncio.TimeoutError):
                self.log.debug("read timeout watching %s, reconnecting", self.kind)
            except Exception:
                resource_version = None
                delay = min(delay * 2, self.max_backoff)
                self.log.exception("error watching %s, retrying in %.1fs", self.kind, delay)
                await asyncio.sleep(delay * (0.5 + random.random()))
            finally:
                w.stop()
                await w.close()
        self.log.info("%s watcher stopped", self.kind)


class NodeReflector(ClusterReflector):
    kind = "nodes"
    list_method_name = "list_node"

    @property
    def nodes(self) -> dict:
        return self.resources


class JobReflector(ClusterReflector):
    """``batch/v1`` Jobs of one namespace (the jobs launcher's Indexed Jobs)."""

    kind = "jobs"
    api_group_name = "BatchV1Api"
    list_method_name = "list_namespaced_job"


class PodReflector(ClusterReflector):
    """Pods of one namespace, or of every namespace with ``omit_namespace``."""

    kind = "pods"  # ResourceReflector derives list_pod_for_all_namespaces / list_namespaced_pod


class GPUPodReflector(PodReflector):
    """Every pod (all namespaces by default): GPU requests on nodes and per-user holdings."""

    @property
    def pods(self) -> dict:
        return self.resources
