"""The jobs API (docs/jobs-api.md): submit, list, inspect, follow, wait for and cancel jobs."""

from __future__ import annotations

from typing import Callable, Iterator

from trainhub import workdir
from trainhub.states import job_is_terminal
from trainhub.workdir import Limits

from .base import ClientBase, TrainhubAPIError, check_ref, page_params


def _job(job_id) -> str:
    return check_ref(job_id, "job id")


class JobsAPI(ClientBase):
    def submit(self, spec: dict) -> dict:
        """POST /jobs: submit a job spec (exactly one of ``command``/``script``); returns the job."""
        return self._json("POST", "/jobs", json={k: v for k, v in spec.items() if v is not None})

    def send_workdir(self, folder, *, exclude=(), limits: Limits | None = None) -> dict:
        """Pack ``folder`` as a job's working directory (trainhub.workdir: its ignore rules and limits) and make sure
        the service has it (PUT /workdirs/{sha256}, skipped when it has it already). Returns what it holds, as the
        service says (``sha256``, ``files``, ``bytes``, ``entries``) with ``skipped`` (what was left out and why) and
        ``folder``; put ``sha256`` in a job spec's ``workdir``. :class:`~trainhub.workdir.WorkdirError` for a folder
        that cannot be sent (too big: its message names what weighs most)."""
        try:
            snap = workdir.snapshot(folder, exclude=exclude, limits=limits or workdir.Limits())
        except workdir.WorkdirTooBig:
            if limits is not None:
                raise
            served = self.workdir_limits()  # the service may take more than the defaults
            if served is None or (served.max_bytes <= workdir.DEFAULT_MAX_BYTES and served.max_files <= workdir.DEFAULT_MAX_FILES):
                raise
            snap = workdir.snapshot(folder, exclude=exclude, limits=served)
        with snap.archive:
            path = f"/workdirs/{snap.sha256}"
            try:
                info = self._json("GET", path)
            except TrainhubAPIError as e:
                if e.status != 404:
                    raise
                info = self._json("PUT", path, data=snap.archive, headers={"Content-Type": "application/octet-stream"},
                                  timeout=max(self.timeout, 300))
        return {**info, "skipped": snap.skipped, "folder": snap.root}

    def workdir_limits(self) -> Limits | None:
        """The service's limits on a working directory (GET /: ``limits``), None from a service that does not say."""
        limits = (self._json("GET", "/") or {}).get("limits") or {}
        if "workdir_bytes" not in limits:
            return None
        return workdir.Limits(int(limits["workdir_bytes"]), int(limits["workdir_files"]))

    def list(self, state=None, *, user: str | None = None, limit: int = 50, offset: int = 0, kind: str | None = None,
             before: str | None = None) -> dict:
        """GET /jobs: ``{"items": [...], "total", "limit", "offset", "next_before"}``, newest first.
        ``state`` is a state or a list of states; ``kind`` only jobs of that kind ("notebook"); ``before`` only jobs
        older than that id (a page's ``next_before``: the next page, by cursor)."""
        params = page_params(state, user=user, limit=limit, offset=offset)
        params.update({k: v for k, v in (("kind", kind), ("before", before)) if v})
        return self._json("GET", "/jobs", params=params)

    def get(self, job_id: str) -> dict:
        """GET /jobs/{id}."""
        return self._json("GET", f"/jobs/{_job(job_id)}")

    def cancel(self, job_id: str) -> dict:
        """DELETE /jobs/{id}: ask the service to stop the job; returns the job."""
        return self._json("DELETE", f"/jobs/{_job(job_id)}")

    def logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> str:
        """GET /jobs/{id}/logs: the log text, lines ``<ISO time> [<rank>] <text>``."""
        params = {k: v for k, v in (("worker", worker), ("tail", tail)) if v is not None}
        return self.request("GET", f"/jobs/{_job(job_id)}/logs", params=params).text

    def follow_logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> Iterator[str]:
        """Yield log lines as they are written, until the job ends (GET .../logs?follow=1)."""
        params = {"follow": 1}
        params.update({k: v for k, v in (("worker", worker), ("tail", tail)) if v is not None})
        # no read timeout: a quiet job may print nothing for a long time
        r = self.request("GET", f"/jobs/{_job(job_id)}/logs", params=params, stream=True,
                         timeout=(self.timeout, None))
        try:
            r.encoding = r.encoding or "utf-8"
            for line in r.iter_lines(decode_unicode=True):
                yield line
        finally:
            r.close()

    def metrics(self, job_id: str) -> dict:
        """GET /jobs/{id}/metrics: ``{"metrics": [...], "gpu": [...]}``."""
        return self._json("GET", f"/jobs/{_job(job_id)}/metrics")

    def events(self, job_id: str) -> list[dict]:
        """GET /jobs/{id}/events: what happened to the job, oldest first (``time``, ``kind``, ``message``)."""
        return self._json("GET", f"/jobs/{_job(job_id)}/events")["items"]

    def why(self, job_id: str) -> dict:
        """GET /jobs/{id}/why: why a queued job waits (code, message, blocking job)."""
        return self._json("GET", f"/jobs/{_job(job_id)}/why")

    def wait(self, job_id: str, poll: float = 1.0, callback: Callable[[dict], None] | None = None,
             timeout: float | None = None) -> dict:
        """Poll until the job reaches a terminal state and return it. ``callback(job)`` is called
        after every poll; ``timeout`` (seconds, None = no limit) raises TimeoutError."""
        return self._wait_until_terminal(lambda: self.get(job_id), job_is_terminal, f"job {job_id} to end",
                                         poll_interval=poll, callback=callback, timeout=timeout)
