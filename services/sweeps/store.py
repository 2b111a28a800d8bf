"""Database access for sweeps. Synchronous functions, run on the jobs store's threads
(``service.store.read`` / ``service.store.write``): the event loop never waits on SQLite."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, load_only

from trainhub.db import SQLiteReader, get_engine, init_db, plain_in, plain_in_params, write_session
from trainhub.exceptions import NotFound
from trainhub.services.jobs.models import Job, JobMetric
from trainhub.services.jobs.store import iso
from trainhub.states import COMPLETE, RUNNING, TRIAL_FINAL, TRIAL_STATES

from .models import Sweep, SweepTrial, sweep_key


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


_any: dict[int, object] = {}


def _any_in_states(states: int):
    """One sweep id in ``states`` states, if any (built once per count, see trainhub.db.SQLiteReader)."""
    if states not in _any:
        table = Sweep.__table__
        _any[states] = select(table.c.id).where(plain_in(table.c.state, states)).limit(1)
    return _any[states]


class SweepStore:
    def __init__(self, db_url: str):
        self.db_url = db_url
        init_db(db_url)  # creates the sweeps tables (models imported above)
        self.engine = get_engine(db_url)
        self.fast_reads = SQLiteReader.for_engine(self.engine)

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    # -- sweeps ------------------------------------------------------------------------------------
    def create(self, **fields) -> Sweep:
        with write_session(self.db_url) as s:
            sweep = Sweep(**fields)
            s.add(sweep)
            s.commit()
            return sweep

    def delete(self, sweep_id: int) -> None:
        with write_session(self.db_url) as s:
            s.execute(SweepTrial.__table__.delete().where(SweepTrial.sweep_id == sweep_id))
            s.execute(Sweep.__table__.delete().where(Sweep.id == sweep_id))
            s.commit()

    def get(self, sweep_id: int) -> Sweep:
        with self.session() as s:
            sweep = s.get(Sweep, sweep_id)
            if sweep is None:
                raise NotFound(f"sweep {sweep_key(sweep_id)} not found")
            return sweep

    def list(self, user: str | None, states: list[str] | None, limit: int, offset: int):
        with self.session() as s:
            q = select(Sweep)
            if user is not None:
                q = q.where(Sweep.user == user)
            if states:
                q = q.where(Sweep.state.in_(states))
            total = s.scalar(select(func.count()).select_from(q.subquery()))
            items = list(s.scalars(q.order_by(Sweep.id.desc()).limit(limit).offset(offset)))
            return items, total

    def in_states(self, *states: str) -> list[Sweep]:
        # the controller asks for the running sweeps on every pass (twice a second, and at each trial's end): where
        # there are none, which is most of the time, one row's read through SQLiteReader answers instead of a session
        states = sorted(set(states))
        if self.fast_reads is not None and not self.fast_reads.rows(_any_in_states(len(states)), plain_in_params(states)):
            return []
        with self.session() as s:
            return list(s.scalars(select(Sweep).where(Sweep.state.in_(states)).order_by(Sweep.id)))

    def workdirs_in_use(self, user: str) -> set[str]:
        """The working directories (SHA-256s) ``user``'s running sweeps start their trials in (the job template's)."""
        with self.session() as s:
            templates = s.scalars(select(Sweep.job).where(Sweep.user == user, Sweep.state == RUNNING))
            return {t["workdir"] for t in templates if isinstance(t, dict) and t.get("workdir")}

    def update(self, sweep_id: int, only_if_state: tuple | None = None, **fields) -> bool:
        with write_session(self.db_url) as s:
            q = update(Sweep).where(Sweep.id == sweep_id)
            if only_if_state:
                q = q.where(Sweep.state.in_(only_if_state))
            r = s.execute(q.values(**fields))
            s.commit()
            return bool(r.rowcount)

    # -- trials ------------------------------------------------------------------------------------
    def trials(self, sweep_id: int) -> list[SweepTrial]:
        with self.session() as s:
            return list(s.scalars(select(SweepTrial).where(SweepTrial.sweep_id == sweep_id).order_by(SweepTrial.number)))

    def trials_of(self, sweep_ids: list[int]) -> dict[int, list[SweepTrial]]:
        out: dict[int, list[SweepTrial]] = {i: [] for i in sweep_ids}
        if not sweep_ids:
            return out
        with self.session() as s:
            for t in s.scalars(select(SweepTrial).where(SweepTrial.sweep_id.in_(sweep_ids)).order_by(SweepTrial.number)):
                out[t.sweep_id].append(t)
        return out

    def add_trial(self, **fields) -> SweepTrial:
        with write_session(self.db_url) as s:
            t = SweepTrial(**fields)
            s.add(t)
            s.commit()
            return t

    def record_trials(self, updates: list[tuple[int, dict]], add: dict | None = None) -> SweepTrial | None:
        """Trial rows updated (``[(trial id, fields)]``) and a new one added (``add``: its fields), in one
        transaction: the outcome of the trial that ended and the row of the one that takes its slot."""
        with write_session(self.db_url) as s:
            for trial_id, fields in updates:
                s.execute(update(SweepTrial).where(SweepTrial.id == trial_id).values(**fields))
            t = None
            if add is not None:
                t = SweepTrial(**add)
                s.add(t)
            s.commit()
            return t

    def update_trial(self, trial_id: int, **fields) -> None:
        with write_session(self.db_url) as s:
            s.execute(update(SweepTrial).where(SweepTrial.id == trial_id).values(**fields))
            s.commit()

    def jobs(self, job_ids: list[int]) -> dict[int, Job]:
        """The jobs of trials, by id (one query; only the columns sweeps use: not the scripts)."""
        if not job_ids:
            return {}
        cols = (Job.id, Job.state, Job.reason, Job.cancel_requested, Job.started, Job.finished, Job.outputs_url,
                Job.outputs_path)
        with self.session() as s:
            return {j.id: j for j in s.scalars(select(Job).options(load_only(*cols)).where(Job.id.in_(job_ids)))}

    def metric_records(self, job_id: int) -> list[dict]:
        """A job's reported metric records, oldest first (``{"step", "worker", "values"}``)."""
        with self.session() as s:
            rows = s.execute(select(JobMetric.step, JobMetric.worker, JobMetric.values)
                             .where(JobMetric.job_id == job_id).order_by(JobMetric.id))
            return [{"step": step, "worker": worker, "values": values} for step, worker, values in rows]


def trial_to_dict(t: SweepTrial, job: Job | None = None, base: str = "") -> dict:
    from trainhub.services.jobs.models import job_key

    d = {"number": t.number, "state": t.state, "reason": t.reason, "params": t.params or {}, "value": t.value,
         "intermediate": t.intermediate or [], "job_id": job_key(t.job_id) if t.job_id else None,
         "job_state": (job.state if job is not None else t.job_state), "created": iso(t.created), "finished": iso(t.finished),
         "started": iso(job.started) if job is not None else None,
         "outputs_url": job.outputs_url if job is not None else "", "outputs_path": job.outputs_path if job is not None else ""}
    if t.job_id:
        d["links"] = {"job": f"{base}/jobs/{job_key(t.job_id)}"}
    return d


def progress(trials: list[SweepTrial]) -> dict:
    counts = {s: 0 for s in TRIAL_STATES}
    for t in trials:
        counts[t.state] = counts.get(t.state, 0) + 1
    counts["done"] = sum(counts[s] for s in TRIAL_FINAL)
    return counts


def best_trial(trials: list[SweepTrial], mode: str) -> SweepTrial | None:
    done = [t for t in trials if t.state == COMPLETE and t.value is not None]
    if not done:
        return None
    pick = min if mode == "min" else max
    return pick(done, key=lambda t: (t.value, -t.number) if mode == "max" else (t.value, t.number))


def sweep_to_dict(sweep: Sweep, trials: list[SweepTrial], jobs: dict[int, Job] | None = None, base: str = "",
                  importance: dict | None = None) -> dict:
    from trainhub.services.jobs.models import job_key

    jobs = jobs or {}
    key = sweep.key
    best = best_trial(trials, sweep.mode)
    best_d = None
    if best is not None:
        job = jobs.get(best.job_id)
        best_d = {"number": best.number, "value": best.value, "params": best.params,
                  "job_id": job_key(best.job_id) if best.job_id else None,
                  "outputs_url": job.outputs_url if job is not None else "",
                  "outputs_path": job.outputs_path if job is not None else ""}
    settings = sweep.settings or {}
    return {
        "id": key, "name": sweep.name, "user": sweep.user, "state": sweep.state, "reason": sweep.reason,
        "metric": sweep.metric, "mode": sweep.mode, "trials": sweep.n_trials, "parallel": sweep.parallel,
        "sampler": settings.get("sampler"), "pruner": settings.get("pruner"), "seed": settings.get("seed"),
        "space": sweep.space, "job": sweep.job, "created": iso(sweep.created), "finished": iso(sweep.finished),
        "progress": progress(trials), "best": best_d, "importance": importance,
        "links": {"self": f"{base}/sweeps/{key}", "trials": f"{base}/sweeps/{key}/trials",
                  "jobs": f"{base}/jobs?sweep={sweep.id}"},
    }

