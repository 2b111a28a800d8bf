"""Worker logs of Kubernetes job pods, read from the pods API into the local job folder.

Each running pod's log is read every ``log_interval`` (``timestamps=true``, ``sinceSeconds`` with ``log_overlap`` of
margin; the lines already taken are skipped by timestamp) and once more when the pod ends, and appended to
``<job_dir>/attempt-N/worker-R.log`` in the local launcher's format; the metrics lines the in-pod wrapper forwards go to
``metrics-R.jsonl``. After a restart the reading resumes after the last line a log already holds. A mixin of
:class:`~trainhub.services.jobs.kubernetes.KubernetesLauncher` (its pods API, namespace and retried requests).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from traitlets import Float
from traitlets.config import LoggingConfigurable

from . import k8s_job_manifests as jm

if TYPE_CHECKING:
    from .launcher import JobView


@dataclass
class _Cursor:
    after: tuple | None = None  # ts_key of the last line taken
    skip: int = 0  # lines taken at exactly that key
    fetched: float = 0.0  # time.time() of the last read


class PodLogs(LoggingConfigurable):
    """Reads the logs of an attempt's pods; ``run`` is the launcher's record of the attempt (its ``cursors``,
    ``resume``, ``done`` and ``next_read``)."""

    log_interval = Float(2.0, help="Seconds between reads of a running pod's log (a pod's final log is read as soon as it ends).").tag(config=True)
    log_overlap = Float(5.0, help="Seconds of overlap between log reads (clock skew margin; repeated lines are dropped by timestamp).").tag(config=True)

    async def _collect_logs(self, job: JobView, state: dict, pods: list[dict], run, force: bool = False) -> None:
        adir = state.get("dir")
        if not adir:
            return
        now = time.monotonic()
        for pod in pods:
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            uid, rank = meta.get("uid"), jm.pod_index(pod)
            if rank is None or uid in run.done:
                continue
            ended = status.get("phase") in ("Succeeded", "Failed")
            started = any(cs.get("name") == jm.CONTAINER and ((cs.get("state") or {}).get("running") or (cs.get("state") or {}).get("terminated"))
                          for cs in status.get("containerStatuses") or [])
            if not started:
                continue
            if not (ended or force) and now < run.next_read.get(uid, 0):
                continue
            run.next_read[uid] = now + self.log_interval
            try:
                await self._read_log(meta["name"], rank, Path(adir), run, uid)
            except Exception as e:  # a log read must never stop the status poll
                self.log.warning("kubernetes: reading the log of pod %s failed: %s", meta["name"], e)
                continue
            if ended:
                run.done.add(uid)

    async def _read_log(self, pod: str, rank: int, adir: Path, run, uid: str) -> None:
        from kubernetes_asyncio.client.rest import ApiException

        cursor = run.cursors.get(uid)
        if cursor is None:
            cursor = run.cursors[uid] = _Cursor(after=run.resume.get(rank), skip=0)
        kwargs = {"container": jm.CONTAINER, "timestamps": True, "_preload_content": False}
        if cursor.fetched:
            kwargs["since_seconds"] = max(1, int(math.ceil(time.time() - cursor.fetched + self.log_overlap)))
        fetched = time.time()
        try:
            resp = await self._request(f"read log of pod {pod}", self._core.read_namespaced_pod_log, pod, self.namespace, **kwargs)
        except ApiException as e:
            if e.status in (400, 404):  # container not started yet, or the pod is gone
                return
            raise
        body = await resp.read()
        if resp.status >= 400:  # _preload_content=False: errors come back as responses
            if resp.status in (400, 404):
                return
            raise ApiException(status=resp.status, reason=resp.reason)
        text = body.decode("utf-8", errors="replace")
        lines, metrics, cursor.after, cursor.skip = jm.split_pod_log(text, rank, cursor.after, cursor.skip)
        cursor.fetched = fetched
        if lines or metrics:
            await asyncio.to_thread(_append, adir, rank, lines, metrics)


def _append(adir: Path, rank: int, lines: list[str], metrics: list[str]) -> None:
    if lines:
        with open(adir / f"worker-{rank}.log", "a", encoding="utf-8") as f:
            f.writelines(lines)
    if metrics:
        with open(adir / f"metrics-{rank}.jsonl", "a", encoding="utf-8") as f:
            f.writelines(metrics)


def log_resume_points(adir: Path, workers: int) -> dict[int, tuple]:
    """After a restart: per rank, the end of the millisecond of the last line already in its log."""
    out = {}
    for rank in range(workers):
        path = adir / f"worker-{rank}.log"
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - 4096))
                tail = f.read().decode("utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in reversed(tail):
            ts = line.split(" ", 1)[0]
            key = jm.ts_key(ts)
            if key[0]:
                out[rank] = (key[0], key[1] + 999_999)  # the whole millisecond was read
                break
    return out
