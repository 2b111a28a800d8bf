"""trainhub as jupyter-scheduler's back end: JupyterLab's "Create Notebook Job" runs the notebook as a trainhub job.

Enabled in every single-user server by ``jupyter-config/trainhub.json`` (``SchedulerApp.scheduler_class`` and
``environment_manager_class``). Runs inside the user's server, as the user, with the server's own
``$TRAINHUB_API_URL`` and ``$JUPYTERHUB_API_TOKEN`` (the kernel side's :class:`trainhub.client.TrainhubClient`):

- :class:`TrainhubEnvironments`: the form's environments and compute types are the profiles the user may use
  (``GET /profiles``).
- :class:`TrainhubNotebookScheduler`: a job is read here (the notebook, its ``parameters`` cell), turned into a
  trainhub job spec by :func:`trainhub.notebookjobs.job_spec` (papermill inside the job, outputs next to the input)
  and submitted (``POST /jobs``): it waits in trainhub's queue, counts against quotas and shows in ``trainhub jobs
  list`` like any job. Job definitions are the jobs service's notebook schedules (``/notebook-schedules``), so they
  run while this server is stopped.
- :class:`TrainhubSchedulerApp`: jupyter-scheduler's own server extension, the same routes and handlers, each keeping
  the status of a refusal of ours. jupyter-scheduler's handlers answer any :class:`SchedulerError` (and a body its
  models refuse) with ``HTTPError(500, str(e)) from e``; :class:`Refused` is a ``SchedulerError`` carrying a status
  (400 bad input, 403, 404 not there or not yours, 409, 429 queue cap...), which these handlers put back from the
  cause of that 500. The ``{"message"}`` the lab shows is ours either way: it says what to change.

A notebook in the user's storage area (under ``$TRAINHUB_STORAGE_PATH``, the notebook pod's storage mount, shown as
``~/storage``) is marked so in its spec: its job puts the outputs into the area, the only place a Kubernetes job pod
can reach (the Kubernetes launcher refuses one that only this server's home holds).

Workers, GPUs per worker and a time limit come from the job's ``runtime_environment_parameters``
(``{"workers": 2, "gpus": 1, "time_limit": "1h"}``).
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import datetime

from jupyter_core.paths import jupyter_data_dir
from jupyter_scheduler import handlers as sh
from jupyter_scheduler.environments import EnvironmentManager
from jupyter_scheduler.exceptions import SchedulerError
from jupyter_scheduler.extension import SchedulerApp
from jupyter_scheduler.models import (
    CountJobsQuery, CreateJob, CreateJobDefinition, CreateJobFromDefinition, DescribeJob, DescribeJobDefinition,
    JobFile, ListJobDefinitionsQuery, ListJobDefinitionsResponse, ListJobsQuery, ListJobsResponse,
    RuntimeEnvironment, Status, UpdateJob, UpdateJobDefinition,
)
from jupyter_scheduler.pydantic_v1 import ValidationError
from jupyter_scheduler.scheduler import BaseScheduler

from trainhub.client import TrainhubAPIError, TrainhubClient
from trainhub.exceptions import TrainhubError
from trainhub.notebookjobs import ENV, NotebookJobError, job_spec, load_notebook, notebook_info, output_path

FORMATS = {"ipynb": "Notebook", "html": "HTML"}
STATUS = {"queued": Status.QUEUED, "running": Status.IN_PROGRESS, "succeeded": Status.COMPLETED,
          "failed": Status.FAILED, "lost": Status.FAILED, "cancelled": Status.STOPPED}
#: jupyter-scheduler's status -> the trainhub states it stands for (the list's status filter)
STATES = {status: [s for s, st in STATUS.items() if st == status] for status in set(STATUS.values())}
PAGE_MAX = 500  # the jobs API's largest page
RUN_OPTIONS = ("workers", "gpus", "time_limit")


def _ms(iso: str | None) -> int | None:
    if not iso:
        return None
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def _client() -> TrainhubClient:
    return TrainhubClient(retries=1)


class Refused(SchedulerError):
    """A request the back end refuses: ``status`` is what jupyter-scheduler's REST API answers with
    (:class:`KeepsRefusalStatus`); the message says what to change."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message, self.status = message, status


def refused(e: TrainhubError) -> Refused:
    """A core refusal, with its ``status_code``, as jupyter-scheduler's error."""
    return Refused(e.message, e.status_code)


def _call(fn, *args, **kwargs):
    """A client call; a refusal of the jobs API as :class:`Refused` with the API's status and words (unreachable: 503)."""
    try:
        return fn(*args, **kwargs)
    except TrainhubAPIError as e:
        raise Refused(e.message, e.status if 400 <= e.status < 600 else 503) from None


class TrainhubEnvironments(EnvironmentManager):
    """The user's profiles as jupyter-scheduler's environments; each offers every profile as a compute type."""

    def list_environments(self) -> list[RuntimeEnvironment]:
        listing = _call(_client().profiles)
        slugs = [p["slug"] for p in listing["items"]]
        # label = name: jupyter-scheduler 2.12's form takes the label as the picked value and looks environments up
        # by name (its conda environments have the two equal); the display name goes into the description (tooltip)
        return [RuntimeEnvironment(
            name=p["slug"], label=p["slug"],
            description=f"{p['display_name']}: {p.get('description') or str(p['gpus']) + ' GPU(s) per worker'}",
            file_extensions=["ipynb"], output_formats=list(FORMATS), metadata={"gpus": str(p["gpus"])},
            compute_types=slugs, default_compute_type=p["slug"], utc_only=False) for p in listing["items"]]

    def manage_environments_command(self) -> str:
        return ""

    def output_formats_mapping(self) -> dict[str, str]:
        return dict(FORMATS)


class TrainhubNotebookScheduler(BaseScheduler):
    task_runner = None  # trainhub's jobs service queues, runs and schedules; nothing runs in this server

    # -- paths ---------------------------------------------------------------------------------------------
    def _home(self) -> str:
        return os.path.realpath(os.path.expanduser("~"))

    def _home_relative(self, input_uri: str) -> tuple[str, str | None]:
        """The input's path in the home, and in the user's storage area (None: not there). A notebook in the storage
        mount (``$TRAINHUB_STORAGE_PATH``, reached through a link such as ``~/storage``) keeps the path it is shown
        at; its job puts the outputs into the storage area, which a job pod on Kubernetes can reach and the home
        cannot."""
        shown = os.path.normpath(os.path.join(os.path.realpath(self.root_dir), input_uri))
        full = os.path.realpath(shown)
        mount = os.environ.get("TRAINHUB_STORAGE_PATH")
        if mount:
            in_area = os.path.relpath(full, os.path.realpath(mount))
            rel = os.path.relpath(shown, self._home())
            if not in_area.startswith("..") and not rel.startswith(".."):
                return rel, in_area
        rel = os.path.relpath(full, self._home())
        if rel.startswith(".."):
            raise Refused(f"{input_uri} is outside your home folder: only notebooks in your home can run as jobs", 403)
        return rel, None

    def _root_relative(self, home_rel: str) -> str:
        return os.path.relpath(os.path.join(self._home(), home_rel), os.path.realpath(self.root_dir))

    def _spec(self, input_uri: str, parameters, profile, options, name, formats) -> dict:
        rel, in_area = self._home_relative(input_uri)
        full = os.path.join(self._home(), rel)
        try:
            with open(full, "rb") as f:
                text = f.read()
        except FileNotFoundError:
            raise Refused(f"{input_uri} does not exist", 404) from None
        except IsADirectoryError:
            raise Refused(f"{input_uri} is a folder, not a notebook") from None
        except OSError as e:
            raise Refused(f"cannot read {input_uri}: {e.strerror}", 403 if isinstance(e, PermissionError) else 400) from None
        options = dict(options or {})
        unknown = set(options) - set(RUN_OPTIONS)
        if unknown:
            raise Refused(f"unknown option(s) {', '.join(sorted(unknown))}: give {', '.join(RUN_OPTIONS)}")
        try:
            nb = load_notebook(text, input_uri)
            if profile:
                profile = _resolve_profile(profile, _call(_client().profiles)["items"])
            return job_spec(nb, rel, parameters=parameters, profile=profile, name=name, output_formats=formats,
                            path_label=input_uri, workers=_int(options.get("workers"), "workers"),
                            gpus=_int(options.get("gpus"), "gpus"), time_limit=options.get("time_limit"),
                            storage_path=in_area)
        except TrainhubError as e:
            raise refused(e) from None

    # -- the list of deleted jobs (trainhub keeps every job's record; a deleted notebook job leaves this list) -
    def _deleted_file(self) -> str:
        return os.path.join(jupyter_data_dir(), "trainhub-notebook-jobs-deleted.json")

    def _deleted(self) -> set[str]:
        try:
            with open(self._deleted_file()) as f:
                return set(json.load(f))
        except (OSError, ValueError):
            return set()

    def _forget(self, job_id: str) -> None:
        ids = self._deleted() | {job_id}
        os.makedirs(os.path.dirname(self._deleted_file()), exist_ok=True)
        tmp = self._deleted_file() + ".tmp"
        with open(tmp, "w") as f:
            json.dump(sorted(ids), f)
        os.replace(tmp, self._deleted_file())

    # -- jobs ----------------------------------------------------------------------------------------------
    def _describe(self, job: dict, info: dict) -> DescribeJob:
        rel = info["input"]
        files = [JobFile(display_name="Input", file_format="input", file_path=self._root_relative(rel))]
        for fmt in info.get("output_formats") or ["ipynb"]:
            out = output_path(rel, job["id"], fmt)
            exists = os.path.exists(os.path.join(self._home(), out))
            files.append(JobFile(display_name=FORMATS.get(fmt, fmt), file_format=fmt,
                                 file_path=self._root_relative(out) if exists else None))
        status = STATUS.get(job["state"], Status.CREATED)
        return DescribeJob(
            name=job.get("name") or os.path.basename(rel), input_filename=os.path.basename(rel),
            runtime_environment_name=job.get("profile") or "default", runtime_environment_parameters={
                "workers": job.get("workers", 1), "gpus": job.get("gpus", 0),
                **({"time_limit": f"{job['time_limit']:g}"} if job.get("time_limit") else {})},  # seconds, as the form takes them
            output_formats=info.get("output_formats") or ["ipynb"], job_definition_id=info.get("schedule"),
            parameters={k: str(v) for k, v in (info.get("parameters") or {}).items()}, compute_type=job.get("profile"),
            job_id=job["id"], job_files=files, url=f"scheduler/jobs/{job['id']}", create_time=_ms(job.get("created")) or 0,
            update_time=_ms(job.get("finished") or job.get("started") or job.get("created")) or 0,
            start_time=_ms(job.get("started")), end_time=_ms(job.get("finished")), status=status,
            status_message=job.get("reason") or None, downloaded=True)

    def _notebook_page(self, status: Status | None, limit: int, before: str | None) -> dict:
        """One page of this user's notebook jobs, newest first (``GET /jobs?kind=notebook``: the jobs service's index of
        them, so a page costs a page however many other jobs the user has); ``next_before`` is the next page's token."""
        if status is not None and status not in STATES:  # CREATED: a trainhub job is queued as it is made
            return {"items": [], "total": 0, "next_before": None}
        return _call(_client().list, state=STATES[status] if status else None, user=os.environ.get("JUPYTERHUB_USER"),
                     limit=max(1, min(int(limit), PAGE_MAX)), kind="notebook", before=before or None)

    async def create_job(self, model: CreateJob) -> str:
        def make():
            spec = self._spec(model.input_uri, model.parameters, model.compute_type or _profile(model.runtime_environment_name),
                              model.runtime_environment_parameters, model.name, model.output_formats)
            return _call(_client().submit, spec)["id"]

        return await asyncio.to_thread(make)

    async def update_job(self, job_id: str, model: UpdateJob):
        if model.status == Status.STOPPED:
            return await self.stop_job(job_id)
        raise Refused("a trainhub job cannot be renamed or moved to another profile once submitted", 409)

    async def list_jobs(self, query: ListJobsQuery) -> ListJobsResponse:
        """A page (``max_items``, at most the jobs API's 500) from ``next_token`` on. The status filter is the API's;
        the definition, name and start-time filters and a sort other than newest first apply within the page."""
        def listing():
            page, deleted = self._notebook_page(query.status, query.max_items or PAGE_MAX, query.next_token), self._deleted()
            jobs = [self._describe(j, i) for j in page["items"] if j["id"] not in deleted and (i := notebook_info(j))]
            if query.job_definition_id:
                jobs = [j for j in jobs if j.job_definition_id == query.job_definition_id]
            if query.status:
                jobs = [j for j in jobs if j.status == query.status]
            if query.name:
                jobs = [j for j in jobs if j.name.startswith(query.name)]
            if query.start_time:
                jobs = [j for j in jobs if (j.start_time or 0) >= query.start_time]
            for sort in reversed(query.sort_by or []):
                jobs.sort(key=lambda j: (getattr(j, sort.name, None) is None, getattr(j, sort.name, None) or 0)
                          if sort.name != "name" else j.name, reverse=sort.direction.value == "desc")
            return ListJobsResponse(jobs=jobs, total_count=page["total"], next_token=page.get("next_before"))

        return await asyncio.to_thread(listing)

    async def count_jobs(self, query: CountJobsQuery) -> int:
        """How many notebook jobs are in ``query.status`` (the API's count; one job asked for)."""
        return (await asyncio.to_thread(lambda: self._notebook_page(query.status, 1, None)))["total"]

    async def get_job(self, job_id: str, job_files: bool | None = True) -> DescribeJob:
        def one():
            job = _call(_client().get, job_id)
            info = notebook_info(job)
            if info is None or job_id in self._deleted():
                raise Refused(f"no notebook job {job_id}", 404)
            return self._describe(job, info)

        return await asyncio.to_thread(one)

    async def stop_job(self, job_id: str):
        await asyncio.to_thread(lambda: _call(_client().cancel, job_id))

    async def delete_job(self, job_id: str):
        """Cancel it if it has not ended, and take it off the Notebook Jobs list (its outputs stay; trainhub's own
        jobs list keeps the record, as for every job)."""
        def delete():
            job = _call(_client().get, job_id)
            if job["state"] in ("queued", "running"):
                _call(_client().cancel, job_id)
            self._forget(job_id)

        await asyncio.to_thread(delete)

    # -- job definitions = the jobs service's notebook schedules ---------------------------------------------
    def _describe_definition(self, s: dict) -> DescribeJobDefinition:
        nb = s.get("notebook") or {}
        return DescribeJobDefinition(
            name=s["name"], input_filename=os.path.basename(nb.get("input") or ""),
            runtime_environment_name=s.get("profile") or "default", runtime_environment_parameters={
                "workers": s.get("workers") or 1, **({"gpus": s["gpus"]} if s.get("gpus") is not None else {}),
                **({"time_limit": s["time_limit"]} if s.get("time_limit") else {})},
            output_formats=nb.get("output_formats") or ["ipynb"],
            parameters={k: str(v) for k, v in (nb.get("parameters") or {}).items()}, compute_type=s.get("profile"),
            schedule=s["schedule"], timezone=s["timezone"], job_definition_id=s["id"],
            create_time=_ms(s["created"]) or 0, update_time=_ms(s["updated"]) or 0, active=s["active"])

    async def create_job_definition(self, model: CreateJobDefinition) -> str:
        def make():
            if not (model.schedule or "").strip():
                raise Refused("give a schedule (a cron expression such as '0 3 * * *'); to run once, create a job")
            spec = self._spec(model.input_uri, model.parameters, model.compute_type or _profile(model.runtime_environment_name),
                              model.runtime_environment_parameters, model.name, model.output_formats)
            info = json.loads(spec["env"][ENV])
            return _call(_client().create_schedule, {"name": model.name, "schedule": model.schedule,
                                                     "timezone": model.timezone or "UTC", "job": spec, "notebook": info})["id"]

        return await asyncio.to_thread(make)

    async def update_job_definition(self, job_definition_id: str, model: UpdateJobDefinition):
        def change():
            changes = {k: v for k, v in (("name", model.name), ("schedule", model.schedule), ("timezone", model.timezone),
                                         ("active", model.active)) if v is not None}
            if model.parameters is not None or model.compute_type or model.input_uri or model.runtime_environment_name:
                current = _call(_client().get_schedule, job_definition_id)
                nb = current.get("notebook") or {}
                uri = model.input_uri or self._root_relative(nb.get("input") or "")
                spec = self._spec(uri, model.parameters if model.parameters is not None else nb.get("parameters"),
                                  model.compute_type or _profile(model.runtime_environment_name) or current.get("profile"),
                                  model.runtime_environment_parameters, model.name or current["name"],
                                  model.output_formats or nb.get("output_formats"))
                changes["job"], changes["notebook"] = spec, json.loads(spec["env"][ENV])
            _call(_client().change_schedule, job_definition_id, changes)

        await asyncio.to_thread(change)

    async def delete_job_definition(self, job_definition_id: str):
        await asyncio.to_thread(lambda: _call(_client().delete_schedule, job_definition_id))

    async def get_job_definition(self, job_definition_id: str) -> DescribeJobDefinition:
        return self._describe_definition(await asyncio.to_thread(lambda: _call(_client().get_schedule, job_definition_id)))

    async def list_job_definitions(self, query: ListJobDefinitionsQuery) -> ListJobDefinitionsResponse:
        items = (await asyncio.to_thread(lambda: _call(_client().list_schedules)))["items"]
        defs = [self._describe_definition(s) for s in items if not query.name or s["name"].startswith(query.name)]
        return ListJobDefinitionsResponse(job_definitions=defs[: int(query.max_items or 1000)], total_count=len(defs))

    async def create_job_from_definition(self, job_definition_id: str, model: CreateJobFromDefinition):
        if model is not None and model.parameters:
            raise Refused("a run of a job definition takes the definition's parameters; change the definition "
                          "or create a job from the notebook to run it with others")
        return (await asyncio.to_thread(lambda: _call(_client().run_schedule, job_definition_id)))["id"]

    def get_staging_paths(self, model) -> dict[str, str]:
        return {}  # nothing is staged: the job carries its copy of the notebook and writes its outputs itself


# -- jupyter-scheduler's server extension, keeping the status of a refusal -------------------------------------
class KeepsRefusalStatus:
    """jupyter-scheduler's handlers raise ``HTTPError(500, str(e)) from e`` for every error of the back end: the
    status of a :class:`Refused` cause is put back (a body its models refuse is a 400); the message stays ours."""

    def send_error(self, status_code: int = 500, **kwargs):
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        cause = getattr(exc, "__cause__", None)
        if status_code == 500 and isinstance(cause, Refused):
            status_code = cause.status
        elif status_code == 500 and isinstance(cause, ValidationError):
            status_code = 400  # CreateJob(**payload) and the like refused the request's own fields
        super().send_error(status_code, **kwargs)


class JobHandler(KeepsRefusalStatus, sh.JobHandler):
    pass


class JobsCountHandler(KeepsRefusalStatus, sh.JobsCountHandler):
    pass


class FilesDownloadHandler(KeepsRefusalStatus, sh.FilesDownloadHandler):
    pass


class BatchJobHandler(KeepsRefusalStatus, sh.BatchJobHandler):
    pass


class JobDefinitionHandler(KeepsRefusalStatus, sh.JobDefinitionHandler):
    pass


class JobFromDefinitionHandler(KeepsRefusalStatus, sh.JobFromDefinitionHandler):
    pass


class RuntimeEnvironmentsHandler(KeepsRefusalStatus, sh.RuntimeEnvironmentsHandler):
    pass


class ConfigHandler(KeepsRefusalStatus, sh.ConfigHandler):
    pass


_OURS = {c.__name__: c for c in (JobHandler, JobsCountHandler, FilesDownloadHandler, BatchJobHandler, JobDefinitionHandler,
                                 JobFromDefinitionHandler, RuntimeEnvironmentsHandler, ConfigHandler)}


class TrainhubSchedulerApp(SchedulerApp):
    """jupyter-scheduler's server extension with handlers that keep a refusal's status: the same name (so the same
    ``jupyter_jupyter_scheduler_config.json`` and ``SchedulerApp`` settings) and routes. Enabled in place of
    ``jupyter_scheduler`` by ``jupyter-config/trainhub.json``; a route of a later jupyter-scheduler not known here
    keeps its own handler."""

    handlers = [(route, _OURS.get(cls.__name__, cls)) for route, cls in SchedulerApp.handlers]


def _jupyter_server_extension_points():
    return [{"module": __name__, "app": TrainhubSchedulerApp}]


def _profile(environment: str | None) -> str | None:
    return environment if environment and environment != "default" else None


def _resolve_profile(name: str, profiles: list[dict]) -> str:
    """A profile of the caller's by slug, or by its display name (jupyter-scheduler's form may send the environment's
    label); else NotebookJobError naming the ones there are."""
    for p in profiles:
        if name == p["slug"]:
            return p["slug"]
    for p in profiles:
        if name.strip().lower() == str(p.get("display_name") or "").strip().lower():
            return p["slug"]
    raise NotebookJobError(f"unknown profile {name!r}: yours are {', '.join(p['slug'] for p in profiles)}")


def _int(value, what: str) -> int | None:
    if value in (None, ""):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise NotebookJobError(f"{what} must be a whole number, not {value!r}") from None


__all__ = ["Refused", "TrainhubEnvironments", "TrainhubNotebookScheduler", "TrainhubSchedulerApp"]
