"""Database access for the jobs service.

Every function here is synchronous and runs on a worker thread (``JobStore.read``/``write``): the
event loop never waits on the database. Writes go through one thread so that concurrent
submissions queue instead of fighting for the database lock.

One exception, :meth:`JobStore.lookup`: the API's own small reads (one job by id, a page of the
listing) run on the event loop when the database is SQLite in WAL mode, where a reader never waits
for a writer's lock. Such a read costs 20-100 us of CPU through :class:`trainhub.db.SQLiteReader`
(``fast_reads``: the same statements without SQLAlchemy's per-statement machinery), less than the two
thread switches a reader thread takes, and on a loaded machine each switch is a wait for a core
(``inline_reads``). The engine's per-pass reads (:meth:`JobStore.in_states`) go the same way.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

from sqlalchemy import String, bindparam, cast, func, insert, inspect, or_, select, update
from sqlalchemy.orm import Session

from trainhub.db import (SQLiteReader, get_engine, init_db, plain_in, plain_in_params, write_connection, write_now,
                         write_session)
from trainhub.exceptions import NotFound
from trainhub.fmt import as_utc, fmt_size
from trainhub.notebookjobs import notebook_info
from trainhub.states import CANCELLED, JOB_TERMINAL, QUEUED

from .models import GPUSampleRow, Job, JobEvent, JobKind, JobMetric, JobWorkdir, MetricOffset, job_key


METRICS_CHUNK = 1 << 20  # bytes of a metrics file read per pass
MAX_METRIC_VALUES = 64  # values kept per record
MAX_METRIC_NAME = 128
MAX_METRIC_RECORDS = 200_000  # records kept per job
MAX_METRICS_BYTES = 64 << 20  # bytes of one worker's metrics file read per attempt
MAX_METRIC_POINTS = 10_000  # records one GET /jobs/{id}/metrics answers with (evenly spread, the last always)


def _finite(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        v = float(v)
    except OverflowError:
        return None
    return v if math.isfinite(v) else None


def metric_record(line: bytes) -> dict | None:
    """One line of a metrics file as ``{"time", "step", "values"}``, or None when it is not a record."""
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("values", {}), dict):
        return None
    values = {}
    for k, v in rec.get("values", {}).items():
        v = _finite(v)
        if v is not None and len(k) <= MAX_METRIC_NAME and len(values) < MAX_METRIC_VALUES:
            values[k] = v
    step = _finite(rec.get("step"))
    step = int(step) if step is not None and abs(step) < 2 ** 63 else None
    when = _finite(rec.get("time"))
    if when is None or not 0 <= when < 253402300800:  # a time a date can show (before year 10000)
        when = datetime.now(timezone.utc).timestamp()
    return {"time": when, "step": step, "values": values}


def _spread(s: Session, model, job_id: int, limit: int, series: tuple) -> tuple[list, int]:
    """The rows of one job, ``limit`` at most spread evenly over its series (rows in id order), and the total."""
    total = s.scalar(select(func.count()).select_from(model).where(model.job_id == job_id)) or 0
    q = select(model).where(model.job_id == job_id)
    if total > limit:
        n_series = s.scalar(select(func.count()).select_from(select(*series).where(model.job_id == job_id).distinct().subquery()))
        per = max(limit // max(n_series, 1), 2)
        rn = func.row_number().over(partition_by=series, order_by=model.id)
        cnt = func.count().over(partition_by=series)
        sub = select(model.id.label("id"), rn.label("rn"), cnt.label("cnt")).where(model.job_id == job_id).subquery()
        stride = (sub.c.cnt + per - 2) / (per - 1)
        keep = select(sub.c.id).where(or_((sub.c.rn - 1) % stride == 0, sub.c.rn == sub.c.cnt))
        q = q.where(model.id.in_(keep))
    return list(s.scalars(q.order_by(model.id))), total


def iso(dt: datetime | None) -> str | None:
    if dt is None:
        return None
    return as_utc(dt).isoformat().replace("+00:00", "Z")


def job_to_dict(job: Job, base: str = "") -> dict:
    key = job.key
    return {
        "id": key, "name": job.name, "user": job.user, "state": job.state, "reason": job.reason,
        "gpus": job.gpus, "workers": job.workers, "devices": job.devices or [], "profile": job.profile,
        "command": job.command, "script": job.script, "env": job.env or {}, "time_limit": job.time_limit,
        "retries": job.retries, "attempt": job.attempt, "priority": job.priority, "preemptible": job.preemptible,
        "exit_codes": job.exit_codes or [], "created": iso(job.created), "started": iso(job.started),
        "finished": iso(job.finished), "outputs_url": job.outputs_url, "outputs_path": job.outputs_path,
        "sweep_id": job.sweep_id, "params": job.params or {},
        "links": {"self": f"{base}/jobs/{key}", "logs": f"{base}/jobs/{key}/logs", "metrics": f"{base}/jobs/{key}/metrics"},
    }


_JOBS = Job.__table__


class JobRecord:
    """A job as the API and the engine's passes read it: the row's columns as attributes (the names of
    :class:`Job`'s) and ``key``.

    Read with SQLAlchemy Core rather than the ORM: no session, identity map or instrumented attributes,
    which cost a GET of one job more CPU than the rest of the request together. A snapshot: setting an
    attribute changes this copy only (writes go through :meth:`JobStore.update`).
    """

    __slots__ = tuple(c.key for c in _JOBS.columns)

    def __init__(self, row):
        for name, value in zip(self.__slots__, row):
            setattr(self, name, value)

    @property
    def key(self) -> str:
        return job_key(self.id)


_RECORD = select(*_JOBS.columns).where(_JOBS.c.id == bindparam("job_id"))
_BY_SUBMIT_KEY = select(*_JOBS.columns).where(_JOBS.c.submit_key == bindparam("submit_key"))
_CREATE = insert(_JOBS).returning(*_JOBS.columns)
_EVENT = insert(JobEvent.__table__)
_WORKDIR = insert(JobWorkdir.__table__)
_in_states: dict[int, object] = {}


def _in_states_stmt(states: int):
    """The engine's read of every job in ``states`` states, oldest first (built once per count)."""
    if states not in _in_states:
        where = plain_in(_JOBS.c.state, states)
        _in_states[states] = select(*_JOBS.columns).where(where).order_by(_JOBS.c.id)
    return _in_states[states]
_KINDS = JobKind.__table__
_KIND_ROW = insert(_KINDS)
_listings: dict[tuple[bool, int, bool, bool, bool], tuple] = {}


def job_kind(env: dict | None) -> str | None:
    """The kind of a job by its spec's ``env`` (:data:`~.models.KINDS`): ``notebook`` when it is a notebook job
    (``$TRAINHUB_NOTEBOOK``, set by ``trainhub.notebookjobs.job_spec``), else None."""
    return "notebook" if notebook_info({"env": env or {}}) is not None else None


def _listing(user: bool, states: int, sweep: bool, kind: bool = False, before: bool = False) -> tuple:
    """The (count, page) statements of a listing with these filters (``states``: how many states), built
    once: the same statement object each time keeps SQLAlchemy's compiled-statement cache from recomputing
    its key, and :class:`~trainhub.db.SQLiteReader` compiles each once. Plain parameters (``state0``, ``state1``...)
    rather than an expanding one, so that a statement compiles to one SQL text.

    With ``kind`` the jobs come from ``job_kinds`` (its ``(kind, user, job_id)`` index, newest first), so a page costs
    the page whatever else the user ran; ``before`` (a job id) starts the page below it (a cursor: no offset to skip).
    The count is not limited by ``before``: it is how many match in all."""
    key = (user, states, sweep, kind, before)
    if key not in _listings:
        where, order = [], _JOBS.c.id
        source = _JOBS
        if kind:
            source = _KINDS.join(_JOBS, _JOBS.c.id == _KINDS.c.job_id)
            where.append(_KINDS.c.kind == bindparam("kind"))
            order = _KINDS.c.job_id
        if user:
            where.append((_KINDS.c.user if kind else _JOBS.c.user) == bindparam("user"))
        if states:
            where.append(plain_in(_JOBS.c.state, states))
        if sweep:
            where.append(_JOBS.c.sweep_id == bindparam("sweep_id"))
        count = select(func.count()).select_from(source).where(*where)
        if before:
            where.append(order < bindparam("before"))
        page = (select(*_JOBS.columns).select_from(source).where(*where).order_by(order.desc())
                .limit(bindparam("limit")).offset(bindparam("offset")))
        _listings[key] = (count, page)
    return _listings[key]


class JobStore:
    def __init__(self, db_url: str, inline_reads: bool = True):
        self.db_url = db_url
        from . import models  # noqa: F401  (registers the tables)

        had_kinds = inspect(get_engine(db_url)).has_table(_KINDS.name)
        init_db(db_url)
        self.engine = get_engine(db_url)
        if not had_kinds:  # a database from before job kinds: its notebook jobs get theirs, once
            self._fill_kinds()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="trainhub-db-write")
        self._readers = ThreadPoolExecutor(4, thread_name_prefix="trainhub-db-read")
        # SQLite (WAL, see trainhub.db): readers never wait for a lock; another database is a network round trip
        self.inline_reads = inline_reads and self.engine.dialect.name == "sqlite"
        # the API's reads and the engine's per-pass reads, without SQLAlchemy's per-statement cost
        self.fast_reads = SQLiteReader.for_engine(self.engine)

    async def write(self, fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(self._writer, lambda: fn(*args, **kwargs))

    async def write_now(self, fn, *args, **kwargs):
        """A short write a request waits for (a submission): on the event loop with SQLite when the write lock is free
        at once, else on the writer thread as :meth:`write` (trainhub.db.write_now). ``fn`` must be one transaction."""
        return await write_now(lambda: fn(*args, **kwargs), self.inline_reads, self._writer)

    async def read(self, fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(self._readers, lambda: fn(*args, **kwargs))

    async def lookup(self, fn, *args, **kwargs):
        """A small read for an API request (:meth:`record`, :meth:`list`): on the event loop with SQLite
        (``inline_reads``, see the module docstring), else on a reader thread as :meth:`read`."""
        if self.inline_reads:
            return fn(*args, **kwargs)
        return await self.read(fn, *args, **kwargs)

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    def _fill_kinds(self) -> None:
        """Kind rows for the jobs made before ``job_kinds`` existed (those whose env could be a notebook job's)."""
        with write_connection(self.db_url) as c:
            known = select(_KINDS.c.job_id)
            rows = c.execute(select(_JOBS.c.id, _JOBS.c.user, _JOBS.c.env).where(
                cast(_JOBS.c.env, String).like("%TRAINHUB_NOTEBOOK%"), _JOBS.c.id.not_in(known))).all()
            kinds = [{"job_id": r.id, "user": r.user, "kind": k} for r in rows if (k := job_kind(r.env))]
            if kinds:
                c.execute(_KIND_ROW, kinds)

    # -- jobs --------------------------------------------------------------
    def create(self, workdir: dict | None = None, **fields) -> JobRecord:
        """Queue a job (and its "submitted" event) in one write transaction; with a ``submit_key`` already used,
        the job made then (an idempotent retry). Core inserts: a burst of submissions waits on this one writer.
        ``workdir``: the working directory it was sent with (``sha256``, ``files``, ``bytes``), recorded with it."""
        with write_session(self.db_url) as s:
            c = s.connection()
            key = fields.get("submit_key")
            if key:
                row = c.execute(_BY_SUBMIT_KEY, {"submit_key": key}).first()
                if row is not None:
                    return JobRecord(row)  # an idempotent retry of the same submission
            row = c.execute(_CREATE, fields).first()
            c.execute(_EVENT, {"job_id": row.id, "kind": "submitted", "message": f"submitted by {row.user}"})
            kind = job_kind(fields.get("env"))
            if kind:
                c.execute(_KIND_ROW, {"job_id": row.id, "user": row.user, "kind": kind})
            if workdir:
                c.execute(_WORKDIR, {"job_id": row.id, **workdir})
                c.execute(_EVENT, {"job_id": row.id, "kind": "workdir", "message": (
                    f"working directory: {workdir['files']} files, {fmt_size(workdir['bytes'])} "
                    f"(archive {workdir['sha256'][:12]})")})
            s.commit()
            return JobRecord(row)

    def workdir_of(self, job_id: int) -> str | None:
        """The SHA-256 of the working directory job ``job_id`` was sent with (None: none)."""
        with self.engine.connect() as c:
            return c.execute(select(JobWorkdir.sha256).where(JobWorkdir.job_id == job_id)).scalar()

    def workdirs_in_use(self, user: str) -> set[str]:
        """The working directories of ``user``'s jobs that may still start (queued or running)."""
        with self.engine.connect() as c:
            rows = c.execute(select(JobWorkdir.sha256).join(Job, Job.id == JobWorkdir.job_id)
                             .where(Job.user == user, Job.state.not_in(JOB_TERMINAL)))
            return {r[0] for r in rows}

    def get(self, job_id: int) -> Job:
        with self.session() as s:
            job = s.get(Job, job_id)
            if job is None:
                raise NotFound(f"job {job_key(job_id)} not found")
            return job

    def record(self, job_id: int) -> JobRecord:
        """One job for the API (a read-only :class:`JobRecord`; the engine uses :meth:`get`)."""
        if self.fast_reads is not None:
            rows = self.fast_reads.rows(_RECORD, {"job_id": job_id})
            record = JobRecord(rows[0]) if rows else None
        else:
            with self.engine.connect() as c:
                row = c.execute(_RECORD, {"job_id": job_id}).first()
            record = None if row is None else JobRecord(row)
        if record is None:
            raise NotFound(f"job {job_key(job_id)} not found")
        return record

    def list(self, user: str | None, states: list[str] | None, limit: int, offset: int,
             sweep_id: int | None = None, kind: str | None = None, before: int | None = None) -> tuple[list[JobRecord], int]:
        """A page of jobs, newest first, as :class:`JobRecord` s, and how many match (one read transaction);
        ``kind``: only jobs of that kind; ``before``: only jobs older than that id (see :func:`_listing`)."""
        states = sorted(set(states or ()))
        count, page = _listing(user is not None, len(states), sweep_id is not None, kind is not None, before is not None)
        params = {"user": user, "sweep_id": sweep_id, "limit": limit, "offset": offset, "kind": kind, "before": before,
                  **plain_in_params(states)}
        if self.fast_reads is not None:
            with self.fast_reads.snapshot():
                total, rows = self.fast_reads.scalar(count, params), self.fast_reads.rows(page, params)
            return [JobRecord(r) for r in rows], total
        with self.engine.connect() as c:
            total = c.execute(count, params).scalar_one()
            rows = c.execute(page, params).all()
        return [JobRecord(r) for r in rows], total

    def in_states(self, *states: str) -> list[JobRecord]:
        """Every job in these states, oldest first (the engine's view of the queue and of what runs, each
        pass: with 10,000 queued, Core rows cost a third of what the ORM's instances did)."""
        states = sorted(set(states))
        stmt, params = _in_states_stmt(len(states)), plain_in_params(states)
        if self.fast_reads is not None:
            return [JobRecord(r) for r in self.fast_reads.rows(stmt, params)]
        with self.engine.connect() as c:
            return [JobRecord(r) for r in c.execute(stmt, params)]

    def update(self, job_id: int, event: tuple[str, str] | None = None, only_if_state: tuple | None = None, **fields) -> bool:
        """Set ``fields`` of one job (only while in ``only_if_state``, when given) and add ``event`` if it
        changed; True when it did. Core statements (``write_connection``): the engine makes several of
        these per job."""
        if not fields and not event:
            return True
        jobs = Job.__table__
        with write_connection(self.db_url) as c:
            changed = True
            if fields:
                q = update(jobs).where(jobs.c.id == job_id)
                if only_if_state:
                    q = q.where(jobs.c.state.in_(only_if_state))
                changed = bool(c.execute(q.values(**fields)).rowcount)
            if changed and event:
                c.execute(insert(JobEvent.__table__).values(job_id=job_id, kind=event[0], message=event[1]))
            return changed

    def request_cancel(self, job_id: int, by: str) -> Job:
        """Queued jobs are cancelled at once; running ones are flagged for the engine to stop."""
        with write_session(self.db_url) as s:
            job = s.get(Job, job_id)
            if job is None:
                raise NotFound(f"job {job_key(job_id)} not found")
            if job.state in JOB_TERMINAL:
                return job
            if job.state == QUEUED:
                job.state, job.reason = CANCELLED, f"cancelled by {by} while queued"
                job.finished = datetime.now(timezone.utc)
            else:
                job.cancel_requested = True
                job.reason = f"cancelling (requested by {by})"
            s.add(JobEvent(job_id=job_id, kind="cancel", message=f"cancel requested by {by}"))
            s.commit()
            return job

    def events(self, job_id: int) -> list[dict]:
        with self.session() as s:
            rows = s.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id))
            return [{"time": iso(e.time), "kind": e.kind, "message": e.message} for e in rows]

    # -- metrics -------------------------------------------------------------
    def ingest_metrics(self, job_id: int, attempt: int, worker: int, path: str) -> bool:
        """Read new complete lines of a worker's metrics file into the database, at most
        :data:`METRICS_CHUNK` bytes per call; True when more is left to read.

        The file is written by the job's own code, so nothing in it is trusted: a line that is not a
        JSON object of finite numbers is skipped, a record keeps at most :data:`MAX_METRIC_VALUES` values,
        a job keeps at most :data:`MAX_METRIC_RECORDS` records and a worker's file is read up to
        :data:`MAX_METRICS_BYTES`; past a bound the rest is passed over, with one event that says so
        (the file itself stays in the job's area)."""
        with write_session(self.db_url) as s:
            off = s.get(MetricOffset, (job_id, worker, attempt))
            if off is None:
                off = MetricOffset(job_id=job_id, worker=worker, attempt=attempt, offset=0)
                s.add(off)
            start = off.offset
            room = MAX_METRIC_RECORDS - s.scalar(select(func.count()).select_from(JobMetric).where(JobMetric.job_id == job_id))
            try:
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    if size > start and (start >= MAX_METRICS_BYTES or room <= 0):
                        off.offset = size
                        self._metrics_bound(s, job_id, path)
                        s.commit()
                        return False
                    f.seek(start)
                    data = f.read(METRICS_CHUNK)
            except FileNotFoundError:
                return False
            end = data.rfind(b"\n") + 1
            if end == 0 and len(data) == METRICS_CHUNK:
                end = len(data)  # one line longer than a chunk is no record: passed over
            if end == 0:
                return False
            records = [r for r in map(metric_record, data[:end].splitlines()) if r is not None]
            if len(records) > room:
                self._metrics_bound(s, job_id, path)
                records = records[:room]
            s.add_all(JobMetric(job_id=job_id, worker=worker, **r) for r in records)
            off.offset = start + end
            s.commit()
            return len(data) == METRICS_CHUNK

    @staticmethod
    def _metrics_bound(s: Session, job_id: int, path: str) -> None:
        """Say once per job that metrics past the bounds are not kept."""
        if not s.scalar(select(func.count()).select_from(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "metrics-limit")):
            s.add(JobEvent(job_id=job_id, kind="metrics-limit",
                           message=f"metrics past {MAX_METRIC_RECORDS} records (or {MAX_METRICS_BYTES >> 20} MiB per worker) "
                                   f"are not kept; report less often (the whole file stays in the job's area: "
                                   f"{os.path.basename(path)})"))

    def metrics(self, job_id: int, limit: int = MAX_METRIC_POINTS) -> dict:
        """A job's metric records and GPU samples, at most about ``limit`` of each: a long job's series are
        thinned evenly per worker (and device), keeping each series' first and last point."""
        with self.session() as s:
            rows, n_rows = _spread(s, JobMetric, job_id, limit, (JobMetric.worker,))
            gpu, n_gpu = _spread(s, GPUSampleRow, job_id, limit, (GPUSampleRow.worker, GPUSampleRow.device))

            def t(x):
                return datetime.fromtimestamp(x, timezone.utc).isoformat().replace("+00:00", "Z")

            metrics = [{"time": t(r.time), "step": r.step, "worker": r.worker, "values": r.values} for r in rows]
            samples = [{"time": t(g.time), "worker": g.worker, "device": g.device, "utilization": g.utilization,
                        "memory_used_mb": g.memory_used_mb, "simulated": g.simulated} for g in gpu]
            return {"metrics": metrics, "gpu": samples, "total": {"metrics": n_rows, "gpu": n_gpu}}

    def add_gpu_samples(self, rows: list[dict]) -> None:
        with write_session(self.db_url) as s:
            s.add_all(GPUSampleRow(**r) for r in rows)
            s.commit()
