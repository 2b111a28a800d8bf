"""Database access for the jobs service.

Every function here is synchronous and runs on a worker thread (``JobStore.run``); the
event loop never waits on SQLite. Writes go through one thread so that concurrent
submissions queue instead of fighting for the database lock.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from trainhub.db import get_engine, init_db, write_session
from trainhub.exceptions import NotFound
from trainhub.states import CANCELLED, JOB_TERMINAL, QUEUED

from .models import GPUSampleRow, Job, JobEvent, JobMetric, MetricOffset, job_key


def iso(dt: datetime | None) -> str | None:
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.isoformat().replace("+00:00", "Z")


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


class JobStore:
    def __init__(self, db_url: str):
        self.db_url = db_url
        from . import models  # noqa: F401  (registers the tables)

        init_db(db_url)
        self.engine = get_engine(db_url)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="trainhub-db-write")
        self._readers = ThreadPoolExecutor(4, thread_name_prefix="trainhub-db-read")

    async def write(self, fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(self._writer, lambda: fn(*args, **kwargs))

    async def read(self, fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(self._readers, lambda: fn(*args, **kwargs))

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    # -- jobs --------------------------------------------------------------
    def create(self, **fields) -> Job:
        with write_session(self.db_url) as s:
            key = fields.get("submit_key")
            if key:
                existing = s.scalar(select(Job).where(Job.submit_key == key))
                if existing is not None:
                    return existing  # an idempotent retry of the same submission
            job = Job(**fields)
            s.add(job)
            s.flush()
            s.add(JobEvent(job_id=job.id, kind="submitted", message=f"submitted by {job.user}"))
            s.commit()
            return job

    def get(self, job_id: int) -> Job:
        with self.session() as s:
            job = s.get(Job, job_id)
            if job is None:
                raise NotFound(f"job {job_key(job_id)} not found")
            return job

    def list(self, user: str | None, states: list[str] | None, limit: int, offset: int, sweep_id: int | None = None):
        with self.session() as s:
            q = select(Job)
            if user is not None:
                q = q.where(Job.user == user)
            if states:
                q = q.where(Job.state.in_(states))
            if sweep_id is not None:
                q = q.where(Job.sweep_id == sweep_id)
            total = s.scalar(select(func.count()).select_from(q.subquery()))
            items = s.scalars(q.order_by(Job.id.desc()).limit(limit).offset(offset)).all()
            return list(items), total

    def in_states(self, *states: str) -> list[Job]:
        with self.session() as s:
            return list(s.scalars(select(Job).where(Job.state.in_(states)).order_by(Job.id)))

    def update(self, job_id: int, event: tuple[str, str] | None = None, only_if_state: tuple | None = None, **fields) -> bool:
        with write_session(self.db_url) as s:
            if not fields:  # just an event
                if event:
                    s.add(JobEvent(job_id=job_id, kind=event[0], message=event[1]))
                    s.commit()
                return True
            q = update(Job).where(Job.id == job_id)
            if only_if_state:
                q = q.where(Job.state.in_(only_if_state))
            r = s.execute(q.values(**fields))
            if r.rowcount and event:
                s.add(JobEvent(job_id=job_id, kind=event[0], message=event[1]))
            s.commit()
            return bool(r.rowcount)

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
    def ingest_metrics(self, job_id: int, attempt: int, worker: int, path: str) -> int:
        """Read new complete lines of a worker's metrics file into the database."""
        with write_session(self.db_url) as s:
            off = s.get(MetricOffset, (job_id, worker, attempt))
            start = off.offset if off else 0
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    data = f.read()
            except FileNotFoundError:
                return 0
            end = data.rfind(b"\n") + 1
            if end == 0:
                return 0
            n = 0
            for line in data[:end].splitlines():
                try:
                    rec = json.loads(line)
                    values = {k: float(v) for k, v in rec.get("values", {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                except (ValueError, TypeError, AttributeError):
                    continue
                step = rec.get("step")
                s.add(JobMetric(job_id=job_id, worker=worker, time=float(rec.get("time", 0)),
                                step=int(step) if isinstance(step, (int, float)) else None, values=values))
                n += 1
            if off is None:
                s.add(MetricOffset(job_id=job_id, worker=worker, attempt=attempt, offset=start + end))
            else:
                off.offset = start + end
            s.commit()
            return n

    def metrics(self, job_id: int) -> dict:
        with self.session() as s:
            rows = s.scalars(select(JobMetric).where(JobMetric.job_id == job_id).order_by(JobMetric.id))
            gpu = s.scalars(select(GPUSampleRow).where(GPUSampleRow.job_id == job_id).order_by(GPUSampleRow.id))

            def t(x):
                return datetime.fromtimestamp(x, timezone.utc).isoformat().replace("+00:00", "Z")

            return {
                "metrics": [{"time": t(r.time), "step": r.step, "worker": r.worker, "values": r.values} for r in rows],
                "gpu": [{"time": t(g.time), "worker": g.worker, "device": g.device, "utilization": g.utilization,
                         "memory_used_mb": g.memory_used_mb, "simulated": g.simulated} for g in gpu],
            }

    def add_gpu_samples(self, rows: list[dict]) -> None:
        with write_session(self.db_url) as s:
            s.add_all(GPUSampleRow(**r) for r in rows)
            s.commit()
