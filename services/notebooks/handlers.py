"""REST handlers of notebook schedules and the caller's profiles (see openapi.json beside this file).

- ``GET  /profiles``                          the profiles the caller may use (JupyterLab's environments / compute types),
                                              with a job's bounds on each (``max_gpus`` per worker, ``max_workers``)
- ``GET|POST /notebook-schedules``            the caller's schedules (admins: ``?user=``); make one (201)
- ``GET|PATCH|DELETE /notebook-schedules/{id}`` one schedule; change it (name, schedule, timezone, active, job); remove it
- ``POST /notebook-schedules/{id}/runs``      submit one run now (201 job)
- ``GET|POST /schedule-clock``                the schedule clock; admins move it forward (``{"now": ISO}``) and a pass runs
"""

from __future__ import annotations

from datetime import datetime, timezone

from tornado import web

from trainhub.exceptions import InvalidRequest
from trainhub.fmt import as_utc
from trainhub.services.api import APIHandler
from trainhub.services.jobs.spec import MAX_WORKERS
from trainhub.services.jobs.store import iso, job_to_dict

from .schedules import parse_key, schedule_dict

READ, WRITE = "custom:trainhub:jobs:read", "custom:trainhub:jobs:write"
SID = r"(?P<id>ns-\d+|\d+)"


class ScheduleHandler(APIHandler):
    @property
    def schedules(self):
        return self.service.notebook_schedules

    def reader(self) -> str | None:
        """The owner to look under (None: every owner, for admins)."""
        return self.listing_owner(READ, "notebook schedules")

    def owner_for_write(self) -> str | None:
        caller = self.caller
        if caller.may_all(WRITE):
            return None
        if not caller.may(WRITE, caller.name):
            raise web.HTTPError(403, f"missing scope {WRITE} to change notebook schedules")
        return caller.name

    def owner_for_read(self) -> str | None:
        caller = self.caller
        if caller.may_all(READ):
            return None
        if not caller.may(READ, caller.name):
            raise web.HTTPError(403, f"missing scope {READ} to read notebook schedules")
        return caller.name


class ProfilesHandler(APIHandler):
    async def get(self):
        caller = self.caller
        if not caller.may(READ, caller.name):
            raise web.HTTPError(403, f"missing scope {READ}")
        catalog = self.service.catalog
        # what a job on each may ask for (the Create Notebook Job form's bounds): GPUs per worker up to its pool's
        # size (a job's GPUs in all are checked against it at submission, with the quotas), workers up to the spec's
        items = [{"slug": p.slug, "display_name": p.display_name, "description": getattr(p, "description", "") or "",
                  "gpus": p.gpus, "max_gpus": len(self.service.pool(p)), "max_workers": MAX_WORKERS}
                 for p in catalog.for_user(caller.groups, caller.admin)]
        default = catalog.default()
        self.write_json({"items": items, "default": default.slug if default else None})


class SchedulesHandler(ScheduleHandler):
    async def get(self):
        who = self.reader()
        rows = await self.service.store.read(self.schedules.store.list, who)
        now = self.schedules.now()
        self.write_json({"items": [schedule_dict(r, now) for r in rows], "total": len(rows)})

    async def post(self):
        caller = self.caller
        if not caller.may(WRITE, caller.name):
            raise web.HTTPError(403, f"missing scope {WRITE} to make notebook schedules")
        body = self.json_body()
        self.check_body(body, "NotebookScheduleSpec")
        self.write_json(await self.schedules.create(caller, body), status=201)


class OneScheduleHandler(ScheduleHandler):
    async def get(self, id):
        row = await self.service.store.read(self.schedules.store.get, parse_key(id), self.owner_for_read())
        self.write_json(schedule_dict(row, self.schedules.now()))

    async def patch(self, id):
        owner = self.owner_for_write()
        body = self.json_body()
        self.check_body(body, "NotebookScheduleChange")
        self.write_json(await self.schedules.change(self.caller, parse_key(id), owner, body))

    async def delete(self, id):
        owner = self.owner_for_write()
        await self.service.store.write(self.schedules.store.delete, parse_key(id), owner)
        self.set_status(204)
        self.finish()


class RunsHandler(ScheduleHandler):
    async def post(self, id):
        owner = self.owner_for_write()
        job = await self.schedules.run_now(self.caller, parse_key(id), owner)
        self.write_json(job_to_dict(job, self.service.api_prefix.rstrip("/")), status=201)


class ClockHandler(ScheduleHandler):
    async def get(self):
        self.owner_for_read()
        self.write_json({"now": iso(self.schedules.now()), "real": iso(datetime.now(timezone.utc))})

    async def post(self):
        """Admins: move the schedule clock forward to ``now`` (never back) and run a pass at once."""
        caller = self.caller
        if not (caller.admin and caller.may_all(WRITE)):
            raise web.HTTPError(403, "only admins may move the schedule clock")
        body = self.json_body()
        self.check_body(body, "ScheduleClock")
        try:
            to = datetime.fromisoformat(str(body["now"]).replace("Z", "+00:00"))
        except (KeyError, ValueError):
            raise InvalidRequest('send {"now": "2027-01-01T00:00:00Z"} (ISO 8601)') from None
        now = await self.schedules.move_clock(as_utc(to))
        fired = await self.schedules.run_pass()
        self.write_json({"now": iso(now), "fired": fired})


def handlers(prefix: str, service) -> list:
    api = prefix.rstrip("/") + "/api"
    kw = {"service": service}
    return [
        (api + r"/profiles", ProfilesHandler, kw),
        (api + r"/notebook-schedules/?", SchedulesHandler, kw),
        (api + rf"/notebook-schedules/{SID}/?", OneScheduleHandler, kw),
        (api + rf"/notebook-schedules/{SID}/runs", RunsHandler, kw),
        (api + r"/schedule-clock", ClockHandler, kw),
    ]
