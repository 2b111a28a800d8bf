"""REST handlers of the sweeps API (see openapi.json beside this file).

Same rules as jobs: ``custom:trainhub:jobs:read`` / ``:write`` with the owner as the ``!user=``
filter; another user's sweep answers 404; errors are JSON ``{"status", "message"}``.
"""

from __future__ import annotations

from tornado import web

from trainhub.exceptions import NotFound
from trainhub.services.api import APIHandler
from trainhub.services.jobs.handlers import READ, WRITE
from trainhub.states import SWEEP_STATES, SWEEP_TERMINAL

from .models import parse_sweep_key
from .spec import validate_sweep
from .store import sweep_to_dict, trial_to_dict

SWEEP_ID = r"(?P<id>s-\d+|\d+)"


class SweepAccessMixin:
    @property
    def controller(self):
        return self.service.sweeps

    async def load_sweep(self, key: str, write: bool = False):
        sweep_id = parse_sweep_key(key)
        if sweep_id is None:
            raise NotFound(f"no sweep {key!r}")
        store = self.controller.store
        try:
            sweep = await self.service.store.read(store.get, sweep_id)
        except NotFound:
            raise NotFound(f"sweep {key} not found") from None
        caller = self.caller
        if not caller.may(READ, sweep.user):
            raise NotFound(f"sweep {key} not found")  # not revealed
        if write and not caller.may(WRITE, sweep.user):
            raise web.HTTPError(403, f"you may read sweep {key} but not change it")
        return sweep

    async def sweep_json(self, sweep) -> dict:
        store = self.controller.store
        trials = await self.service.store.read(store.trials, sweep.id)
        best_ids = [t.job_id for t in trials if t.job_id]
        jobs = await self.service.store.read(store.jobs, best_ids)
        return sweep_to_dict(sweep, trials, jobs, self.service.api_prefix.rstrip("/"), importance=sweep.importance)


class SweepsHandler(SweepAccessMixin, APIHandler):
    async def get(self):
        states = self.states_arg(SWEEP_STATES, "sweep states")
        limit, offset = self.page()
        who = self.listing_owner(READ, "sweeps")
        store = self.controller.store
        items, total = await self.service.store.read(store.list, who, states or None, limit, offset)
        trials = await self.service.store.read(store.trials_of, [s.id for s in items])
        jobs = await self.service.store.read(store.jobs, [t.job_id for ts in trials.values() for t in ts if t.job_id])
        base = self.service.api_prefix.rstrip("/")
        self.write_json({"items": [sweep_to_dict(s, trials[s.id], jobs, base, importance=s.importance) for s in items],
                         "total": total, "limit": limit, "offset": offset})

    async def post(self):
        caller = self.caller
        if not caller.may(WRITE, caller.name):
            raise web.HTTPError(403, f"missing scope {WRITE} to start sweeps")
        body = self.json_body()
        spec = validate_sweep(body)
        if spec.job.profile:  # an unknown one in the catalog's words, before the document's enum
            self.service.catalog.get(spec.job.profile)
        self.check_body(body, "SweepSpec")
        self.service.check(caller, spec.job, kind="trial")
        if spec.job.workdir:  # every trial runs in a copy of it: the caller's own upload, as a job's (404 if not)
            await self.service.own_workdir(caller, spec.job.workdir)
        await self.service.check_queued(caller.name)  # its trials are queued jobs of the caller: at the cap, none could be
        sweep = await self.controller.create(caller, spec)
        self.write_json(await self.sweep_json(sweep), status=201)


class SweepHandler(SweepAccessMixin, APIHandler):
    async def get(self, id):
        sweep = await self.load_sweep(id)
        self.write_json(await self.sweep_json(sweep))

    async def delete(self, id):
        sweep = await self.load_sweep(id, write=True)
        if sweep.state not in SWEEP_TERMINAL:
            sweep = await self.controller.cancel(sweep, self.caller.name)
        self.write_json(await self.sweep_json(sweep), status=202)


class SweepTrialsHandler(SweepAccessMixin, APIHandler):
    async def get(self, id):
        sweep = await self.load_sweep(id)
        store = self.controller.store
        trials = await self.service.store.read(store.trials, sweep.id)
        jobs = await self.service.store.read(store.jobs, [t.job_id for t in trials if t.job_id])
        base = self.service.api_prefix.rstrip("/")
        self.write_json({"sweep": sweep.key, "metric": sweep.metric, "mode": sweep.mode,
                         "items": [trial_to_dict(t, jobs.get(t.job_id), base) for t in trials]})


def default_handlers(prefix: str, service) -> list:
    api = prefix.rstrip("/") + "/api"
    kw = {"service": service}
    return [
        (api + r"/sweeps/?", SweepsHandler, kw),
        (api + rf"/sweeps/{SWEEP_ID}/?", SweepHandler, kw),
        (api + rf"/sweeps/{SWEEP_ID}/trials/?", SweepTrialsHandler, kw),
    ]

