"""A small synchronous client for the trainhub jobs API (docs/jobs-api.md).

Used by the CLI (`trainhub jobs ...`), the ``%%train`` magics and user code::

    from trainhub.client import TrainhubClient
    c = TrainhubClient()                       # $TRAINHUB_API_URL + $JUPYTERHUB_API_TOKEN
    job = c.submit({"command": "python train.py", "gpus": 1})
    job = c.wait(job["id"], callback=lambda j: print(j["state"]))

Blocking (requests): callers that must not block an event loop run it in a thread.
Connection failures are retried a few times with a short backoff; a POST is retried only
when the connection could not be opened, so a job is never submitted twice.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterator

import requests

from trainhub.states import job_is_terminal, sweep_is_terminal

ENV_URL = "TRAINHUB_API_URL"
ENV_TOKEN = "JUPYTERHUB_API_TOKEN"


class TrainhubAPIError(Exception):
    """The API answered with an error: ``status`` (HTTP code, 0 = unreachable) and the
    server's ``message`` (the text meant for the user, e.g. quota numbers)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{message} (HTTP {status})" if status else message)
        self.status = status
        self.message = message


class TrainhubConfigError(ValueError):
    """No API URL or token: not in a trainhub notebook/terminal and none given."""


class TrainhubClient:
    """Client for ``$TRAINHUB_API_URL`` authenticated with a JupyterHub API token.

    ``url``/``token`` default to ``$TRAINHUB_API_URL`` / ``$JUPYTERHUB_API_TOKEN`` (set in
    platform notebooks and terminals). ``timeout`` is per request in seconds; ``retries`` is how
    many times a connection failure is retried (0 = never), waiting ``backoff``, 2x, 4x... seconds.
    """

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30,
                 retries: int = 3, backoff: float = 0.5, session: requests.Session | None = None):
        url = url or os.environ.get(ENV_URL, "")
        token = token or os.environ.get(ENV_TOKEN, "")
        missing = [name for name, v in ((ENV_URL, url), (ENV_TOKEN, token)) if not v]
        if missing:
            raise TrainhubConfigError(
                "not in a trainhub notebook/terminal: pass --url/--token or set "
                + " and ".join(f"${m}" for m in missing)
                + f" (e.g. {ENV_URL}=http://127.0.0.1:8000/services/trainhub/api, "
                "a token from `trainhub token NAME`)"
            )
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = max(0, int(retries))
        self.backoff = backoff
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"token {token}"
        self.session.headers.setdefault("Accept", "application/json")

    def __repr__(self):
        return f"TrainhubClient({self.url!r})"

    # -- plumbing -----------------------------------------------------------------------------
    def request(self, method: str, path: str, *, params=None, json=None, stream: bool = False,
                timeout=None) -> requests.Response:
        """One API call; returns the response (2xx) or raises :class:`TrainhubAPIError`."""
        url = self.url + path
        idempotent = method.upper() in ("GET", "HEAD", "DELETE", "PUT")
        delay = self.backoff
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                r = self.session.request(method, url, params=params, json=json, stream=stream,
                                         timeout=timeout or self.timeout)
            except requests.ConnectionError as e:
                # a POST may be retried only if nothing reached the server
                if last or not (idempotent or _not_connected(e)):
                    raise TrainhubAPIError(0, f"cannot reach the trainhub API at {self.url}: {_short(e)}") from None
            except requests.Timeout:
                if last or not idempotent:
                    raise TrainhubAPIError(0, f"the trainhub API at {self.url} did not answer within "
                                              f"{timeout or self.timeout}s ({method} {path})") from None
            else:
                if r.status_code in (502, 503, 504) and idempotent and not last:
                    r.close()  # the proxy has no service behind it right now (restarting)
                elif r.status_code >= 400:
                    raise _api_error(r)
                else:
                    return r
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def _json(self, method, path, **kw):
        r = self.request(method, path, **kw)
        return r.json() if r.content else None

    # -- the API ------------------------------------------------------------------------------
    def submit(self, spec: dict) -> dict:
        """POST /jobs: submit a job spec (exactly one of ``command``/``script``); returns the job."""
        return self._json("POST", "/jobs", json={k: v for k, v in spec.items() if v is not None})

    def list(self, state=None, *, user: str | None = None, limit: int = 50, offset: int = 0) -> dict:
        """GET /jobs: ``{"items": [...], "total", "limit", "offset"}``, newest first.
        ``state`` is a state or a list of states."""
        params = {"limit": limit, "offset": offset}
        if state:
            params["state"] = state if isinstance(state, str) else ",".join(state)
        if user:
            params["user"] = user
        return self._json("GET", "/jobs", params=params)

    def get(self, job_id: str) -> dict:
        """GET /jobs/{id}."""
        return self._json("GET", f"/jobs/{_id(job_id)}")

    def cancel(self, job_id: str) -> dict:
        """DELETE /jobs/{id}: ask the service to stop the job; returns the job."""
        return self._json("DELETE", f"/jobs/{_id(job_id)}")

    def logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> str:
        """GET /jobs/{id}/logs: the log text, lines ``<ISO time> [<rank>] <text>``."""
        params = {k: v for k, v in (("worker", worker), ("tail", tail)) if v is not None}
        return self.request("GET", f"/jobs/{_id(job_id)}/logs", params=params).text

    def follow_logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> Iterator[str]:
        """Yield log lines as they are written, until the job ends (GET .../logs?follow=1)."""
        params = {"follow": 1}
        params.update({k: v for k, v in (("worker", worker), ("tail", tail)) if v is not None})
        # no read timeout: a quiet job may print nothing for a long time
        r = self.request("GET", f"/jobs/{_id(job_id)}/logs", params=params, stream=True,
                         timeout=(self.timeout, None))
        try:
            r.encoding = r.encoding or "utf-8"
            for line in r.iter_lines(decode_unicode=True):
                yield line
        finally:
            r.close()

    def metrics(self, job_id: str) -> dict:
        """GET /jobs/{id}/metrics: ``{"metrics": [...], "gpu": [...]}``."""
        return self._json("GET", f"/jobs/{_id(job_id)}/metrics")

    def wait(self, job_id: str, poll: float = 1.0, callback: Callable[[dict], None] | None = None,
             timeout: float | None = None) -> dict:
        """Poll until the job reaches a terminal state and return it. ``callback(job)`` is called
        after every poll; ``timeout`` (seconds, None = no limit) raises TimeoutError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if callback:
                callback(job)
            if job_is_terminal(job):
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} still {job.get('state')} after {timeout}s")
            time.sleep(poll)

    def whoami(self) -> str | None:
        """The token's user name: ``$JUPYTERHUB_USER``, else asked from the hub API next to the
        trainhub API (``.../services/trainhub/api`` -> ``.../hub/api/user``); None if unknown."""
        if os.environ.get("JUPYTERHUB_USER"):
            return os.environ["JUPYTERHUB_USER"]
        hub_api = os.environ.get("JUPYTERHUB_API_URL")
        if not hub_api and "/services/" in self.url:
            hub_api = self.url.split("/services/", 1)[0] + "/hub/api"
        if not hub_api:
            return None
        try:
            r = self.session.get(hub_api.rstrip("/") + "/user", timeout=self.timeout)
            return r.json().get("name") if r.ok else None
        except (requests.RequestException, ValueError):
            return None

    # -- usage accounting and the advisor (trainhub.services.usage) ------------------------------
    def usage(self, *, since: str | None = None, until: str | None = None, by: str = "user",
              user: str | None = None) -> dict:
        """GET /usage: GPU-seconds allocated / used ``by`` user, group, profile, day, kind or holder
        (``{"items": [...], "totals": {...}, ...}``); users get only their own figures."""
        params = {k: v for k, v in (("since", since), ("until", until), ("by", by), ("user", user)) if v}
        return self._json("GET", "/usage", params=params)

    def usage_csv(self, *, since: str | None = None, until: str | None = None, by: str = "user",
                  user: str | None = None) -> str:
        """GET /usage?format=csv: the report's items as CSV text."""
        params = {k: v for k, v in (("since", since), ("until", until), ("by", by), ("user", user)) if v}
        params["format"] = "csv"
        return self.request("GET", "/usage", params=params).text

    def usage_metrics(self) -> str:
        """GET /usage/metrics: Prometheus text of everyone's usage (admins)."""
        return self.request("GET", "/usage/metrics").text

    def diagnosis(self, job_id: str) -> dict:
        """GET /jobs/{id}/diagnosis: the advisor's diagnoses of a job, with their measurements."""
        return self._json("GET", f"/jobs/{_id(job_id)}/diagnosis")

    def why(self, job_id: str) -> dict:
        """GET /jobs/{id}/why: why a queued job waits (code, message, blocking job)."""
        return self._json("GET", f"/jobs/{_id(job_id)}/why")


def _id(job_id) -> str:
    job_id = str(job_id).strip()
    if not job_id or "/" in job_id:
        raise ValueError(f"not a job id: {job_id!r}")
    return job_id


def _api_error(r: requests.Response) -> TrainhubAPIError:
    message = ""
    try:
        body = r.json()
        if isinstance(body, dict):
            message = str(body.get("message") or "")
    except ValueError:
        pass
    if not message and r.status_code in (502, 503, 504):
        message = f"the trainhub jobs service behind {r.url.split('/jobs')[0]} is not answering ({r.reason}): is it running?"
    if not message:
        text = (r.text or "").strip()
        message = text[:300] if text and not text.lstrip().startswith("<") else (r.reason or "error")
    if r.status_code == 403 and "scope" in message.lower():
        message += " (the token lacks the trainhub jobs scopes)"
    elif r.status_code == 401:
        message += " (the token is missing, expired or not a JupyterHub API token)"
    return TrainhubAPIError(r.status_code, message)


def _not_connected(e: requests.ConnectionError) -> bool:
    """True when the connection was never opened (refused, DNS, connect timeout)."""
    from urllib3.exceptions import ConnectTimeoutError, MaxRetryError

    reason = e.args[0] if e.args else None
    if isinstance(reason, MaxRetryError):
        reason = reason.reason
    return isinstance(reason, ConnectTimeoutError)  # NewConnectionError is one


def _short(e: Exception) -> str:
    from urllib3.exceptions import MaxRetryError

    reason = e.args[0] if e.args else e
    if isinstance(reason, MaxRetryError) and reason.reason is not None:
        reason = reason.reason
    text = str(reason)
    return text.split(": ", 1)[-1] if "Failed to establish" in text else text


# -- sweeps (docs/sweeps.md) ------------------------------------------------------------------------
def _sweep_id(sweep_id) -> str:
    sweep_id = str(sweep_id).strip()
    if not sweep_id or "/" in sweep_id:
        raise ValueError(f"not a sweep id: {sweep_id!r}")
    return sweep_id


def _create_sweep(self, spec: dict) -> dict:
    """POST /sweeps: a job spec (``script`` or ``command``, ``gpus``...) plus ``trials``, ``parallel``,
    ``metric``, ``mode``, ``space`` ({name: "loguniform:1e-5:1e-1", ...}), ``sampler``, ``pruner``.
    Returns the sweep; bad input raises :class:`TrainhubAPIError` (400) and nothing is submitted."""
    return self._json("POST", "/sweeps", json={k: v for k, v in spec.items() if v is not None})


def _list_sweeps(self, state=None, *, user: str | None = None, limit: int = 50, offset: int = 0) -> dict:
    """GET /sweeps: ``{"items": [...], "total", "limit", "offset"}``, newest first."""
    params = {"limit": limit, "offset": offset}
    if state:
        params["state"] = state if isinstance(state, str) else ",".join(state)
    if user:
        params["user"] = user
    return self._json("GET", "/sweeps", params=params)


def _get_sweep(self, sweep_id: str) -> dict:
    """GET /sweeps/{id}: state, progress, best trial, parameter importance."""
    return self._json("GET", f"/sweeps/{_sweep_id(sweep_id)}")


def _sweep_trials(self, sweep_id: str) -> list[dict]:
    """GET /sweeps/{id}/trials: the trials (number, state, params, value, intermediate, job_id...)."""
    return self._json("GET", f"/sweeps/{_sweep_id(sweep_id)}/trials")["items"]


def _cancel_sweep(self, sweep_id: str) -> dict:
    """DELETE /sweeps/{id}: no new trials; running trials' jobs are cancelled. Returns the sweep."""
    return self._json("DELETE", f"/sweeps/{_sweep_id(sweep_id)}")


def _wait_sweep(self, sweep_id: str, poll: float = 1.0, callback: Callable[[dict], None] | None = None,
                timeout: float | None = None) -> dict:
    """Poll until the sweep is completed, failed or cancelled and return it (``callback(sweep)`` after
    every poll; ``timeout`` seconds raises TimeoutError)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        sweep = self.get_sweep(sweep_id)
        if callback:
            callback(sweep)
        if sweep_is_terminal(sweep):
            return sweep
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"sweep {sweep_id} still {sweep.get('state')} after {timeout}s")
        time.sleep(poll)


TrainhubClient.create_sweep = _create_sweep
TrainhubClient.list_sweeps = _list_sweeps
TrainhubClient.get_sweep = _get_sweep
TrainhubClient.sweep_trials = _sweep_trials
TrainhubClient.cancel_sweep = _cancel_sweep
TrainhubClient.wait_sweep = _wait_sweep


# -- dataset and model registries (docs/storage.md) -------------------------------------------------
class DatasetVersion(dict):
    """A dataset version as the API returns it, plus :meth:`filesystem` to read its files."""

    def filesystem(self):
        """``(fsspec filesystem, path)`` of the version's prefix, with this server's storage options."""
        import json as _json

        import fsspec

        opts = _json.loads(os.environ.get("TRAINHUB_STORAGE_OPTIONS") or "{}")
        return fsspec.core.url_to_fs(self["url"], **opts)


def _name(name) -> str:
    name = str(name).strip()
    if not name or "/" in name:
        raise ValueError(f"not a registry name: {name!r}")
    return name


def _version(version) -> str:
    return "latest" if version in (None, "") else str(version)


def _list_datasets(self, q: str = "", *, owner: str | None = None, limit: int = 100, offset: int = 0) -> dict:
    """GET /datasets: ``{"items", "total"}``; ``q`` searches names and descriptions."""
    params = {k: v for k, v in (("q", q), ("owner", owner), ("limit", limit), ("offset", offset)) if v not in (None, "")}
    return self._json("GET", "/datasets", params=params)


def _get_dataset(self, name: str) -> dict:
    """GET /datasets/{name}: the dataset with every version under ``items``."""
    return self._json("GET", f"/datasets/{_name(name)}")


def _dataset(self, name: str, version="latest") -> DatasetVersion:
    """GET /datasets/{name}/versions/{version}: one version (``url``, ``size``, ``file_count``...)."""
    return DatasetVersion(self._json("GET", f"/datasets/{_name(name)}/versions/{_version(version)}"))


def _register_dataset(self, name: str, path: str, *, format: str = "", description: str = "",
                      metadata: dict | None = None, wait: bool | float = True, poll: float = 1.0,
                      callback: Callable[[dict], None] | None = None) -> DatasetVersion:
    """POST /datasets: register a new version of ``name`` pointing at storage ``path``
    (``datasets/...`` or ``users/<you>/...``). With ``wait`` (True or seconds) poll until
    the size/count scan ends, calling ``callback(version)`` with its progress."""
    body = {"name": _name(name), "path": path, "format": format, "description": description,
            "metadata": metadata or {}, "wait": 5}
    v = self._json("POST", "/datasets", json=body)
    deadline = None if wait is True else (time.monotonic() + float(wait) if wait else time.monotonic())
    while v.get("status") == "pending" and (deadline is None or time.monotonic() < deadline):
        if callback:
            callback(v)
        time.sleep(poll)
        v = self._json("GET", f"/datasets/{_name(name)}/versions/{v['version']}")
    return DatasetVersion(v)


def _deprecate_dataset(self, name: str, version, message: str = "", deprecated: bool = True) -> dict:
    """PATCH /datasets/{name}/versions/{v}: mark a version deprecated (owner or admin)."""
    return self._json("PATCH", f"/datasets/{_name(name)}/versions/{_version(version)}",
                      json={"deprecated": deprecated, "message": message})


def _list_models(self, q: str = "", *, stage: str | None = None, limit: int = 100, offset: int = 0) -> dict:
    """GET /models: ``{"items", "total"}``."""
    params = {k: v for k, v in (("q", q), ("stage", stage), ("limit", limit), ("offset", offset)) if v not in (None, "")}
    return self._json("GET", "/models", params=params)


def _get_model(self, name: str) -> dict:
    """GET /models/{name}: the model with every version under ``items``."""
    return self._json("GET", f"/models/{_name(name)}")


def _model_version(self, name: str, version="latest") -> dict:
    """GET /models/{name}/versions/{version}: ``version`` is a number, ``latest`` or a stage name."""
    return self._json("GET", f"/models/{_name(name)}/versions/{_version(version)}")


def _register_model(self, name: str, job: str | None = None, *, path: str | None = None, description: str = "",
                    metrics: dict | None = None, params: dict | None = None, datasets=(), stage: str | None = None) -> dict:
    """POST /models: register the outputs of finished ``job`` (or ``path`` inside them; without a job,
    a storage path in your area) as the next version of ``name``. Files are copied immutably;
    ``metrics``/``params`` add to the job's own; ``datasets`` are ``"name:version"`` lineage refs."""
    body = {"name": _name(name), "job": job, "path": path, "description": description, "metrics": metrics,
            "params": params, "datasets": list(datasets) or None, "stage": stage}
    return self._json("POST", "/models", json={k: v for k, v in body.items() if v not in (None, "")},
                      timeout=max(self.timeout, 600))


def _set_model_stage(self, name: str, version, stage: str, comment: str = "", exclusive: bool = False) -> dict:
    """PATCH /models/{name}/versions/{v}: move a version to none/staging/production/archived (audited)."""
    return self._json("PATCH", f"/models/{_name(name)}/versions/{_version(version)}",
                      json={"stage": stage, "comment": comment, "exclusive": exclusive})


def _export_model(self, name: str, version, dest) -> str:
    """GET .../export: save the version's bundle (tar.gz: MANIFEST.json, metadata.json, files/) to ``dest``
    (a file path, or a folder to put ``<name>-v<N>.tar.gz`` in). Returns the file's path."""
    r = self.request("GET", f"/models/{_name(name)}/versions/{_version(version)}/export", stream=True,
                     timeout=(self.timeout, None))
    dest = os.fspath(dest)
    if os.path.isdir(dest):
        cd = r.headers.get("Content-Disposition", "")
        fname = cd.split("filename=")[-1].strip('"') if "filename=" in cd else f"{name}-{version}.tar.gz"
        dest = os.path.join(dest, fname)
    with open(dest, "wb") as f:
        for chunk in r.iter_content(1 << 20):
            f.write(chunk)
    return dest


TrainhubClient.list_datasets = _list_datasets
TrainhubClient.get_dataset = _get_dataset
TrainhubClient.dataset = _dataset
TrainhubClient.register_dataset = _register_dataset
TrainhubClient.deprecate_dataset = _deprecate_dataset
TrainhubClient.list_models = _list_models
TrainhubClient.get_model = _get_model
TrainhubClient.model_version = _model_version
TrainhubClient.register_model = _register_model
TrainhubClient.set_model_stage = _set_model_stage
TrainhubClient.export_model = _export_model
