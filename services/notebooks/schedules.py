"""Notebook schedules: the store functions (blocking: run on the jobs store's threads), the schedule clock and
the pass that submits due runs.

The pass (every ``NotebookSchedules.interval`` seconds, once as the service starts, and whenever an admin moves the
clock with ``POST /schedule-clock``) looks at each active schedule's due times in ``(checked, now]``:

- none: nothing happens;
- one or more: the latest is submitted as the owner (``JobsService.submit``: the same profile, quota and queue checks
  as any job); earlier ones are *missed* (the service was down, or the clock jumped) and the schedule's ``message``
  says how many and when, as does the service log;
- a run the jobs service refuses (its profile is gone, the owner's quota or queue cap) is missed too, with the
  refusal in ``message``; the next due time is tried again.

``checked`` then becomes ``now``, so a due time is considered once. Each schedule is handled in its own try/except:
one bad schedule never stops the pass.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from sqlalchemy import select
from traitlets import Float
from traitlets.config import LoggingConfigurable

from trainhub.db import Base, get_engine, write_session
from trainhub.exceptions import Forbidden, InvalidRequest, NotFound, TrainhubError
from trainhub.fmt import as_utc
from trainhub.httpapi import parse_id
from trainhub.loops import PeriodicLoop
from trainhub.notebookjobs import ENV, check_schedule, due_times, next_time
from trainhub.services.jobs.spec import validate_spec
from trainhub.services.jobs.store import iso

from .models import NotebookSchedule, ScheduleClock

PREFIX = "ns-"


def key(sid: int) -> str:
    return f"{PREFIX}{sid:06d}"


def schedule_dict(s: NotebookSchedule, now: datetime | None = None) -> dict:
    d = {
        "id": key(s.id), "user": s.user, "name": s.name, "schedule": s.schedule, "timezone": s.timezone,
        "active": s.active, "notebook": s.notebook or {}, "profile": (s.spec or {}).get("profile"),
        "workers": (s.spec or {}).get("workers", 1), "gpus": (s.spec or {}).get("gpus"),
        "time_limit": (s.spec or {}).get("time_limit"),
        "created": iso(s.created), "updated": iso(s.updated), "checked": iso(s.checked),
        "last_due": iso(s.last_due), "last_job": f"j-{s.last_job:06d}" if s.last_job else None,
        "runs": s.runs, "missed": s.missed, "message": s.message or None, "next": None,
    }
    if s.active and now is not None:
        d["next"] = iso(next_time(s.schedule, s.timezone, max(now, as_utc(s.checked))))
    return d


@dataclass
class Owner:
    """The caller a run is submitted as: the schedule's owner (``JobsService.check`` reads these)."""

    name: str
    groups: tuple = ()
    admin: bool = False
    scopes: set = field(default_factory=set)


class ScheduleStore:
    """Writes take the database's write lock from their first statement (``write_session``): a read that turns into a
    write could meet a snapshot another writer (the engine's pass) moved on meanwhile."""

    def __init__(self, db_url: str):
        self.db_url = db_url
        self.engine = get_engine(db_url)
        Base.metadata.create_all(self.engine, tables=[NotebookSchedule.__table__, ScheduleClock.__table__])

    def _session(self):
        from sqlalchemy.orm import Session

        return Session(self.engine, expire_on_commit=False)

    def create(self, **fields) -> NotebookSchedule:
        with write_session(self.db_url) as s:
            row = NotebookSchedule(**fields)
            s.add(row)
        return row

    def get(self, sid: int, user: str | None) -> NotebookSchedule:
        with self._session() as s:
            row = s.get(NotebookSchedule, sid)
        if row is None or (user is not None and row.user != user):  # another user's schedule is not revealed
            raise NotFound(f"no notebook schedule {key(sid)}")
        return row

    def list(self, user: str | None) -> list[NotebookSchedule]:
        with self._session() as s:
            q = select(NotebookSchedule).order_by(NotebookSchedule.id.desc())
            if user is not None:
                q = q.where(NotebookSchedule.user == user)
            return list(s.scalars(q))

    def active(self) -> list[NotebookSchedule]:
        with self._session() as s:
            return list(s.scalars(select(NotebookSchedule).where(NotebookSchedule.active.is_(True))))

    def update(self, sid: int, user: str | None, **fields) -> NotebookSchedule:
        with write_session(self.db_url) as s:
            row = s.get(NotebookSchedule, sid)
            if row is None or (user is not None and row.user != user):
                raise NotFound(f"no notebook schedule {key(sid)}")
            for k, v in fields.items():
                setattr(row, k, v)
        return row

    def clock_offset(self) -> timedelta:
        """How far an admin moved the schedule clock ahead of real time (0 until one did)."""
        with self._session() as s:
            row = s.get(ScheduleClock, 1)
        return timedelta(seconds=row.offset_seconds) if row is not None else timedelta(0)

    def move_clock_offset(self, offset: timedelta) -> timedelta:
        """Keep the larger of ``offset`` and the stored one (the clock never goes back); returns what is stored."""
        with write_session(self.db_url) as s:
            row = s.get(ScheduleClock, 1)
            if row is None:
                row = ScheduleClock(id=1, offset_seconds=0.0)
                s.add(row)
            if offset.total_seconds() > row.offset_seconds:
                row.offset_seconds, row.moved = offset.total_seconds(), datetime.now(timezone.utc)
            return timedelta(seconds=row.offset_seconds)

    def delete(self, sid: int, user: str | None) -> None:
        with write_session(self.db_url) as s:
            row = s.get(NotebookSchedule, sid)
            if row is None or (user is not None and row.user != user):
                raise NotFound(f"no notebook schedule {key(sid)}")
            s.delete(row)


def parse_key(text: str) -> int:
    sid = parse_id(text, PREFIX)
    if sid is None:
        raise NotFound(f"no notebook schedule {text[:40]}")
    return sid


class NotebookSchedules(LoggingConfigurable):
    interval = Float(30.0, help="""Seconds between two looks at the schedules (cron's resolution is a minute). A due
        run starts at most this late. 0 = only when an admin moves the clock (POST /schedule-clock).""").tag(config=True)

    def __init__(self, service, **kw):
        super().__init__(**kw)
        self.service = service
        self.store = ScheduleStore(service.db_url)
        # the schedule clock: real time plus what an admin moved it forward by (kept in the database across restarts)
        self.offset = self.store.clock_offset()
        self._loop: PeriodicLoop | None = None
        self._lock = asyncio.Lock()

    def now(self) -> datetime:
        return datetime.now(timezone.utc) + self.offset

    async def move_clock(self, to: datetime) -> datetime:
        """Move the schedule clock forward to ``to`` (never back: a due time is considered once), stored before it
        counts, so a restart of the service keeps it."""
        ahead = to - datetime.now(timezone.utc)
        if ahead > self.offset:
            self.offset = await self.service.store.write(self.store.move_clock_offset, ahead)
        return self.now()

    async def start(self) -> None:
        await self.run_pass()  # runs due while the service was down: fired (the latest) or reported (the others)
        if self.interval > 0:
            self._loop = PeriodicLoop("trainhub-notebook-schedules", self.run_pass, self.interval, self.log, jitter=0.1)
            self._loop.start()

    async def stop(self) -> None:
        if self._loop is not None:
            await self._loop.stop()
            self._loop = None

    # -- making and changing ---------------------------------------------------------------------------------
    def check_spec(self, owner, body_spec: dict):
        """The job spec a schedule submits, checked as a submission would be now (400/403/409), without queueing."""
        spec = validate_spec(body_spec)
        if spec.profile:
            self.service.catalog.get(spec.profile)
        self.service.check(owner, spec)
        return spec

    async def create(self, caller, body: dict) -> dict:
        expr = check_schedule(body.get("schedule"), body.get("timezone"))
        spec = body.get("job")
        if not isinstance(spec, dict):
            raise InvalidRequest("job must be the spec each run submits (as for POST /jobs)")
        self.check_spec(caller, spec)
        name = str(body.get("name") or spec.get("name") or "notebook schedule")[:255]
        now = self.now()
        row = await self.service.store.write(
            self.store.create, user=caller.name, groups=list(caller.groups), admin=bool(caller.admin), name=name,
            schedule=expr, timezone=body.get("timezone") or "UTC", active=bool(body.get("active", True)), spec=spec,
            notebook=body.get("notebook") or {}, created=now, updated=now, checked=now)
        self.log.info("notebook schedule %s made by %s: %r (%s)", key(row.id), caller.name, expr, name)
        return schedule_dict(row, now)

    async def change(self, caller, sid: int, owner: str | None, body: dict) -> dict:
        fields: dict = {}
        if "schedule" in body or "timezone" in body:
            row = await self.service.store.read(self.store.get, sid, owner)
            fields["schedule"] = check_schedule(body.get("schedule", row.schedule), body.get("timezone", row.timezone))
            fields["timezone"] = body.get("timezone", row.timezone) or "UTC"
        if "job" in body:
            row = await self.service.store.read(self.store.get, sid, owner)
            self.check_spec(Owner(row.user, tuple(row.groups or ()), row.admin), body["job"])
            fields["spec"] = body["job"]
        if "notebook" in body:
            fields["notebook"] = body["notebook"] or {}
        if "name" in body and body["name"]:
            fields["name"] = str(body["name"])[:255]
        if "active" in body:
            fields["active"] = bool(body["active"])
            if fields["active"]:  # switched on again: runs due while it was off are not owed
                fields["checked"] = self.now()
        fields["updated"] = self.now()
        row = await self.service.store.write(self.store.update, sid, owner, **fields)
        return schedule_dict(row, self.now())

    # -- firing ------------------------------------------------------------------------------------------------
    async def submit_run(self, row: NotebookSchedule, due: datetime | None):
        """Submit one run of ``row`` as its owner; the job's ``$TRAINHUB_NOTEBOOK`` names the schedule."""
        import json

        spec = dict(row.spec)
        env = dict(spec.get("env") or {})
        try:
            info = json.loads(env.get(ENV) or "{}")
        except ValueError:
            info = {}
        info.update({"schedule": key(row.id), "due": iso(due) if due else None})
        env[ENV] = json.dumps(info, separators=(",", ":"))
        spec["env"] = env
        spec.setdefault("name", row.name)
        groups = self.service.groups(row.user) or tuple(row.groups or ())
        owner = Owner(row.user, tuple(groups), row.admin)
        return await self.service.submit(owner, validate_spec(spec))

    async def run_now(self, caller, sid: int, owner: str | None):
        row = await self.service.store.read(self.store.get, sid, owner)
        job = await self.submit_run(row, None)
        await self.service.store.write(self.store.update, sid, None, runs=row.runs + 1, last_job=job.id, message="")
        return job

    async def run_pass(self) -> list[dict]:
        """Fire what is due at the schedule clock's now; returns what happened, one entry per schedule that was due."""
        async with self._lock:
            now = self.now()
            report = []
            for row in await self.service.store.read(self.store.active):
                try:
                    entry = await self._fire_due(row, now)
                except Exception as e:  # one bad schedule never stops the pass
                    self.log.exception("notebook schedule %s: the pass failed on it: %s", key(row.id), e)
                    continue
                if entry:
                    report.append(entry)
            return report

    async def _fire_due(self, row: NotebookSchedule, now: datetime) -> dict | None:
        checked = as_utc(row.checked)
        if now <= checked:
            return None
        due = due_times(row.schedule, row.timezone, checked, now)
        if not due:  # nothing to write: the next pass looks from the same point
            return None
        latest, earlier = due[-1], due[:-1]
        words = []
        if earlier:
            many = "at least " if len(due) >= 1000 else ""
            words.append(f"missed {many}{len(earlier)} run(s) due {_times(earlier)} (the service was not running then, or its "
                         f"clock moved past them); only the latest, due {iso(latest)}, is run")
            self.log.warning("notebook schedule %s of %s: %s", key(row.id), row.user, words[-1])
        # the due times are claimed before the run is submitted: a failure in between never fires one twice
        missed = row.missed + len(earlier)
        await self.service.store.write(self.store.update, row.id, None, checked=now, last_due=latest, missed=missed,
                                       message="; ".join(words))
        entry = {"schedule": key(row.id), "user": row.user, "due": iso(latest), "missed": [iso(t) for t in earlier]}
        try:
            job = await self.submit_run(row, latest)
        except TrainhubError as e:
            msg = getattr(e, "message", None) or str(e)
            words.append(f"the run due {iso(latest)} could not start: {msg}")
            self.log.warning("notebook schedule %s of %s: %s", key(row.id), row.user, words[-1])
            fields = {"missed": missed + 1}
            entry["error"] = msg
        else:
            fields = {"runs": row.runs + 1, "last_job": job.id}
            entry["job"] = job.key
            self.log.info("notebook schedule %s of %s: run due %s submitted as %s", key(row.id), row.user, iso(latest), job.key)
        fields["message"] = "; ".join(words)
        await self.service.store.write(self.store.update, row.id, None, **fields)
        return entry


def _times(ts: list[datetime]) -> str:
    if len(ts) <= 3:
        return ", ".join(iso(t) for t in ts)
    return f"{iso(ts[0])} … {iso(ts[-1])}"


__all__ = ["NotebookSchedules", "ScheduleStore", "Owner", "Forbidden", "key", "parse_key", "schedule_dict"]
