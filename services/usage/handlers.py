"""HTTP API of usage accounting and the advisor (see openapi.json beside this file).

- ``GET {api}/usage``: GPU-seconds by user, group, profile, day, kind or holder. A user sees
  only their own figures (``custom:trainhub:usage:read!user=<self>``); holders of the unfiltered
  scope (admins) see everyone's and may filter with ``user=``.
- ``GET {api}/usage/metrics``: Prometheus text, everyone's totals: unfiltered scope only.
- ``GET {api}/jobs/{id}/diagnosis``: the advisor's view of a job: its owner or an admin (404
  to anyone else, as for the job itself).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from tornado import web

from trainhub.exceptions import InvalidRequest
from trainhub.services.api import APIHandler
from trainhub.services.jobs.handlers import JOB_ID, JobAccessMixin
from trainhub.states import RUNNING

from .accounting import BY, aggregate, day_of, parse_day, since_default, to_csv

USAGE_SCOPE = "custom:trainhub:usage:read"


def _sampler(service):
    sampler = getattr(service, "usage_sampler", None)
    if sampler is None:
        raise web.HTTPError(503, "usage accounting is starting; try again in a moment")
    return sampler


MAX_ROWS = 500_000  # stored daily rows one report may sum (a day holds one per user, kind, profile and holder)


class UsageHandler(APIHandler):
    async def get(self):
        caller = self.caller
        sampler = _sampler(self.service)
        by = self.get_argument("by", "user")
        if by not in BY:
            raise InvalidRequest(f"by must be one of {', '.join(BY)}, not {by!r}")
        fmt = self.get_argument("format", "json")
        if fmt not in ("json", "csv"):
            raise InvalidRequest(f"format must be json or csv, not {fmt!r}")
        today = datetime.fromtimestamp(sampler.clock(), timezone.utc).date()
        try:
            until = parse_day(self.get_argument("until", None), today)
            since = parse_day(self.get_argument("since", None), since_default(until))  # the 30 days up to until
        except ValueError as e:
            raise InvalidRequest(str(e)) from None
        # since after until is an empty range: an empty report (with both days echoed), not an error
        user = self.get_argument("user", None) or None
        everyone = caller.may_all(USAGE_SCOPE)
        if not everyone:
            if not caller.may(USAGE_SCOPE, caller.name):
                raise web.HTTPError(403, f"missing scope {USAGE_SCOPE} to see GPU usage")
            if user not in (None, caller.name):
                raise web.HTTPError(403, "you may only see your own GPU usage")
            user = caller.name
        # any range may be asked for (only stored days cost anything), but never more rows than the bound
        rows = await asyncio.to_thread(sampler.rows, since.isoformat(), until.isoformat(), user, MAX_ROWS + 1)
        if len(rows) > MAX_ROWS:
            raise InvalidRequest(f"since..until holds more than {MAX_ROWS:,} stored usage rows; ask for a shorter range")
        items = aggregate(rows, by)
        if fmt == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.finish(to_csv(items))
            return
        total = aggregate([r for r in rows], "kind")
        totals = {
            "gpu_seconds_allocated": round(sum(x["gpu_seconds_allocated"] for x in total), 3),
            "gpu_seconds_used": round(sum(x["gpu_seconds_used"] for x in total), 3),
            "gpu_seconds_measured": round(sum(x["gpu_seconds_measured"] for x in total), 3),
        }
        m = totals["gpu_seconds_measured"]
        totals["utilization"] = round(100 * totals["gpu_seconds_used"] / m, 1) if m else None
        self.write_json({"since": since.isoformat(), "until": until.isoformat(), "by": by, "user": user,
                         "scope": "all" if user is None else "user", "items": items, "totals": totals,
                         "sample_interval": sampler.sample_interval, "as_of": day_of(sampler.clock())})


class UsageMetricsHandler(APIHandler):
    async def get(self):
        caller = self.caller
        if not caller.may_all(USAGE_SCOPE):
            raise web.HTTPError(403, f"Prometheus metrics hold everyone's usage: they need the unfiltered {USAGE_SCOPE} "
                                "scope (admins)")
        sampler = _sampler(self.service)
        from .accounting import prometheus_text

        rows = await asyncio.to_thread(sampler.all_rows)
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(prometheus_text(rows, sampler.current_diagnoses()))


class DiagnosisHandler(JobAccessMixin, APIHandler):
    async def get(self, key):
        job = await self.load_job(key)
        sampler = _sampler(self.service)
        body = sampler.latest.get(job.id)
        if body is None:
            body = await asyncio.to_thread(sampler.stored_diagnosis, job.id)
        if body is None:
            body = {"id": job.key, "user": job.user, "samples": 0, "diagnoses": [], "workers": [],
                    "min_samples": sampler.thresholds.min_samples, "sample_interval": sampler.sample_interval,
                    "note": ("the advisor samples running jobs only" if job.state != RUNNING
                             else "collecting samples: none yet") if sampler.advisor else "the advisor is off"}
        else:
            body = dict(body)
            if job.state != RUNNING:
                body["note"] = f"as last seen while it ran ({body.get('updated')})" + (
                    f"; {body['note']}" if body.get("note") else "")
        body["state"] = job.state
        body["thresholds"] = sampler.thresholds.as_dict()
        self.write_json(body)


def handlers(prefix: str, service) -> list:
    api = prefix.rstrip("/") + "/api"
    kw = {"service": service}
    return [
        (api + r"/usage/?", UsageHandler, kw),
        (api + r"/usage/metrics", UsageMetricsHandler, kw),
        (api + rf"/jobs/{JOB_ID}/diagnosis", DiagnosisHandler, kw),
    ]
