"""Notebook schedules: job definitions with cron schedules, owned by the jobs service (a jobs-service plugin).

A schedule keeps the spec of a notebook job (made by ``trainhub.notebookjobs.job_spec`` in the user's server, when
JupyterLab's "Create Notebook Job" asks for a schedule) and submits it as its owner whenever its cron expression comes
due, through the same ``JobsService.submit`` as any job (profiles, quotas, queueing, isolation): the user's server may
be stopped. Due runs missed while the service was down are reported on the schedule, and a run that cannot start says
why there.

- :mod:`.models` — the ``notebook_schedules`` table (the platform database, beside the jobs)
- :mod:`.schedules` — the store functions, the clock and the pass that fires due runs
- :mod:`.handlers` — ``/profiles``, ``/notebook-schedules[/{id}[/runs]]``, ``/schedule-clock``

Loaded by ``trainhub.services.jobs.app`` (``PLUGINS``). See docs/notebook-jobs.md.
"""

from __future__ import annotations

from pathlib import Path

OPENAPI = Path(__file__).with_name("openapi.json")


def routes(prefix: str, service) -> list:
    from .handlers import handlers as _handlers

    return _handlers(prefix, service)


async def start(service) -> None:
    from .schedules import NotebookSchedules

    service.notebook_schedules = NotebookSchedules(service=service, parent=service)
    await service.notebook_schedules.start()


async def stop(service) -> None:
    schedules = getattr(service, "notebook_schedules", None)
    if schedules is not None:
        await schedules.stop()
