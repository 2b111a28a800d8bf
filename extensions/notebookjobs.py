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
  run while this server is stopped. jupyter-scheduler's handlers answer a :class:`SchedulerError` with a 500 whose
  message is ours; the message says what to change.

Workers, GPUs per worker and a time limit come from the job's ``runtime_environment_parameters``
(``{"workers": 2, "gpus": 1, "time_limit": "1h"}``).
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import datetime

from jupyter_core.paths import jupyter_data_dir
from jupyter_scheduler.environments import EnvironmentManager
from jupyter_scheduler.exceptions import SchedulerError
from jupyter_scheduler.models import (
    CountJobsQuery, CreateJob, CreateJobDefinition, CreateJobFromDefinition, DescribeJob, DescribeJobDefinition,
    JobFile, ListJobDefinitionsQuery, ListJobDefinitionsResponse, ListJobsQuery, ListJobsResponse,
    RuntimeEnvironment, Status, UpdateJob, UpdateJobDefinition,
)
from jupyter_scheduler.scheduler import BaseScheduler

from trainhub.client import TrainhubAPIError, TrainhubClient
from trainhub.exceptions import TrainhubError
from trainhub.notebookjobs import ENV, NotebookJobError, job_spec, load_notebook, notebook_info, output_path

FORMATS = {"ipynb": "Notebook", "html": "HTML"}
STATUS = {"queued": Status.QUEUED, "running": Status.IN_PROGRESS, "succeeded": Status.COMPLETED,
          "failed": Status.FAILED, "lost": Status.FAILED, "cancelled": Status.STOPPED}
RUN_OPTIONS = ("workers", "gpus", "time_limit")


def _ms(iso: str | None) -> int | None:
    if not iso:
        return None
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def _client() -> TrainhubClient:
    return TrainhubClient(retries=1)


def _call(fn, *args, **kwargs):
    """A client call, its refusal in the API's own words as a SchedulerError (what jupyter-scheduler shows)."""
    try:
        return fn(*args, **kwargs)
    except TrainhubAPIError as e:
        raise SchedulerError(e.message if hasattr(e, "message") else str(e)) from None


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

    def _home_relative(self, input_uri: str) -> str:
        full = os.path.realpath(os.path.join(self.root_dir, input_uri))
        rel = os.path.relpath(full, self._home())
        if rel.startswith(".."):
            raise SchedulerError(f"{input_uri} is outside your home folder: only notebooks in your home can run as jobs")
        return rel

    def _root_relative(self, home_rel: str) -> str:
        return os.path.relpath(os.path.join(self._home(), home_rel), os.path.realpath(self.root_dir))

    def _spec(self, input_uri: str, parameters, profile, options, name, formats) -> dict:
        rel = self._home_relative(input_uri)
        full = os.path.join(self._home(), rel)
        try:
            with open(full, "rb") as f:
                text = f.read()
        except FileNotFoundError:
            raise SchedulerError(f"{input_uri} does not exist") from None
        except OSError as e:
            raise SchedulerError(f"cannot read {input_uri}: {e.strerror}") from None
        options = dict(options or {})
        unknown = set(options) - set(RUN_OPTIONS)
        if unknown:
            raise SchedulerError(f"unknown option(s) {', '.join(sorted(unknown))}: give {', '.join(RUN_OPTIONS)}")
        try:
            nb = load_notebook(text, input_uri)
            if profile:
                profile = _resolve_profile(profile, _call(_client().profiles)["items"])
            return job_spec(nb, rel, parameters=parameters, profile=profile, name=name, output_formats=formats,
                            path_label=input_uri, workers=_int(options.get("workers"), "workers"),
                            gpus=_int(options.get("gpus"), "gpus"), time_limit=options.get("time_limit"))
        except TrainhubError as e:
            raise SchedulerError(e.message) from None

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
                "workers": job.get("workers", 1), "gpus": job.get("gpus", 0)},
            output_formats=info.get("output_formats") or ["ipynb"], job_definition_id=info.get("schedule"),
            parameters={k: str(v) for k, v in (info.get("parameters") or {}).items()}, compute_type=job.get("profile"),
            job_id=job["id"], job_files=files, url=f"scheduler/jobs/{job['id']}", create_time=_ms(job.get("created")) or 0,
            update_time=_ms(job.get("finished") or job.get("started") or job.get("created")) or 0,
            start_time=_ms(job.get("started")), end_time=_ms(job.get("finished")), status=status,
            status_message=job.get("reason") or None, downloaded=True)

    def _notebook_jobs(self) -> list[tuple[dict, dict]]:
        client, deleted, out, offset = _client(), self._deleted(), [], 0
        while True:
            page = _call(client.list, limit=500, offset=offset)
            for job in page["items"]:
                info = notebook_info(job)
                if info is not None and job["id"] not in deleted:
                    out.append((job, info))
            offset += len(page["items"])
            if not page["items"] or offset >= page["total"] or offset >= 5000:
                return out

    async def create_job(self, model: CreateJob) -> str:
        def make():
            spec = self._spec(model.input_uri, model.parameters, model.compute_type or _profile(model.runtime_environment_name),
                              model.runtime_environment_parameters, model.name, model.output_formats)
            return _call(_client().submit, spec)["id"]

        return await asyncio.to_thread(make)

    async def update_job(self, job_id: str, model: UpdateJob):
        if model.status == Status.STOPPED:
            return await self.stop_job(job_id)
        raise SchedulerError("a trainhub job cannot be renamed or moved to another profile once submitted")

    async def list_jobs(self, query: ListJobsQuery) -> ListJobsResponse:
        def listing():
            jobs = [self._describe(j, i) for j, i in self._notebook_jobs()]
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
            limit = int(query.max_items or 1000)
            return ListJobsResponse(jobs=jobs[:limit], total_count=len(jobs))

        return await asyncio.to_thread(listing)

    async def count_jobs(self, query: CountJobsQuery) -> int:
        jobs = await asyncio.to_thread(self._notebook_jobs)
        return sum(1 for j, _ in jobs if STATUS.get(j["state"]) == query.status)

    async def get_job(self, job_id: str, job_files: bool | None = True) -> DescribeJob:
        def one():
            job = _call(_client().get, job_id)
            info = notebook_info(job)
            if info is None or job_id in self._deleted():
                raise SchedulerError(f"no notebook job {job_id}")
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
                "workers": s.get("workers") or 1, **({"time_limit": s["time_limit"]} if s.get("time_limit") else {})},
            output_formats=nb.get("output_formats") or ["ipynb"],
            parameters={k: str(v) for k, v in (nb.get("parameters") or {}).items()}, compute_type=s.get("profile"),
            schedule=s["schedule"], timezone=s["timezone"], job_definition_id=s["id"],
            create_time=_ms(s["created"]) or 0, update_time=_ms(s["updated"]) or 0, active=s["active"])

    async def create_job_definition(self, model: CreateJobDefinition) -> str:
        def make():
            if not (model.schedule or "").strip():
                raise SchedulerError("give a schedule (a cron expression such as '0 3 * * *'); to run once, create a job")
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
            raise SchedulerError("a run of a job definition takes the definition's parameters; change the definition "
                                 "or create a job from the notebook to run it with others")
        return (await asyncio.to_thread(lambda: _call(_client().run_schedule, job_definition_id)))["id"]

    def get_staging_paths(self, model) -> dict[str, str]:
        return {}  # nothing is staged: the job carries its copy of the notebook and writes its outputs itself


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


__all__ = ["TrainhubEnvironments", "TrainhubNotebookScheduler"]
