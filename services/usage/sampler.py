"""The usage sampler: one loop in the jobs service that accounts GPU-seconds and feeds the advisor.

Every ``sample_interval`` seconds (with up to 10 % jitter):

1. the allocation history (``gpu_allocation_history``: every server and job allocation, open or
   closed since the previous pass) and one GPU sample of the devices involved (the service's
   metrics source: NVML, or the scripted file for simulated devices) are turned into GPU-seconds
   allocated / used / measured by :func:`.accounting.account` and added to ``usage_daily``;
2. each running job's workers are measured (GPU of their devices, CPU and I/O wait of their
   process trees, latest reported step) and :func:`.advisor.diagnose` is run on the latest window;
   the result is kept in memory and in ``usage_job_diagnoses``.

Each step, and each job, has its own try/except: one bad job never stops the pass. Blocking work
(database, /proc) runs on the jobs store's threads. ``clock`` is the time seam for tests.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from datetime import datetime, timezone

from sqlalchemy import func, or_, select
from traitlets import Bool, Float, Instance
from traitlets.config import LoggingConfigurable

from trainhub.fmt import as_utc
from trainhub.loops import PeriodicLoop
from trainhub.db import session_factory, write_session
from trainhub.models import GPUAllocationRecord

from .accounting import Interval, UsageRow, account
from .advisor import AdvisorThresholds, WorkerSample, diagnose
from .models import JobDiagnosis, UsageDaily, UsageState
from .procsample import TreeSampler

STATE_KEY = "accounted_until"


def _ts(dt: datetime | None) -> float | None:
    if dt is None:
        return None
    return as_utc(dt).timestamp()


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


class UsageSampler(LoggingConfigurable):
    """GPU usage accounting and the job advisor. Configure as ``c.UsageSampler.<name>``."""

    sample_interval = Float(
        10.0, help="Seconds between passes (10): one GPU sample, one accounting step and one advisor sample of "
        "every running job. Shorter = finer accounting and quicker diagnoses, at more CPU (see "
        "benchmarks/advisor_bench.py). Must be > 0.",
    ).tag(config=True)
    max_sample_gap = Float(
        60.0, help="Longest time (s) one GPU sample may stand for (60). Allocated time further from any sample "
        "(the service was down) counts as allocated but unmeasured, never as used.",
    ).tag(config=True)
    advisor = Bool(True, help="Diagnose running jobs (input-bound, stalled, memory-bound, straggler). False = accounting only.").tag(config=True)
    read_io = Bool(True, help="Read /proc/<pid>/io for the read throughput of job workers (one more file per process and pass).").tag(config=True)

    thresholds = Instance(AdvisorThresholds)

    def __init__(self, *, db_url: str, allocator=None, metrics_source=None, store=None, groups_of=None,
                 clock=time.time, **kw):
        super().__init__(**kw)
        from . import models  # noqa: F401  (registers the tables)
        from trainhub.db import init_db

        init_db(db_url)
        self.db_url = db_url
        self._session = session_factory(db_url)
        self.allocator, self.metrics_source, self.store = allocator, metrics_source, store
        self.groups_of = groups_of or (lambda user: ())
        self.clock = clock
        self.thresholds = AdvisorThresholds(parent=self)
        self.trees = TreeSampler(read_io=self.read_io)
        self.series: dict[int, dict[int, deque]] = {}  # job id -> rank -> WorkerSample window
        self.latest: dict[int, dict] = {}  # job id -> diagnosis body
        self.passes = 0
        self._loop: PeriodicLoop | None = None

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = PeriodicLoop("trainhub-usage-sampler", self.run_once, lambda: max(self.sample_interval, 0.05),
                                  self.log, jitter=0.1)
        self._loop.start()

    async def stop(self) -> None:
        if self._loop is not None:
            await self._loop.stop()

    async def _db(self, fn, *args, write: bool = False):
        if self.store is not None:
            return await (self.store.write if write else self.store.read)(fn, *args)
        return await asyncio.to_thread(fn, *args)

    async def run_once(self) -> None:
        """One pass: sample, account, diagnose."""
        self.passes += 1
        now = self.clock()
        records, since = await self._db(self._open_records, now)
        jobs = []
        if self.store is not None and self.advisor:
            from trainhub.states import RUNNING

            jobs = await self.store.read(self.store.in_states, RUNNING)
        devices = sorted({r.device for r in records} | {d for j in jobs for w in (j.devices or []) for d in w})
        gpu = await self._gpu(devices)
        try:
            samples = {d: [(now, s.utilization)] for d, s in gpu.items()}
            figures = account(records, samples, since=since, until=now, max_gap=self.max_sample_gap)
            groups = {u: tuple(self.groups_of(u)) for u in {k[1] for k in figures}}
            await self._db(self._add_figures, figures, groups, now, write=True)
        except Exception:
            self.log.exception("usage accounting step failed")
        if self.advisor:
            await self._advise(jobs, gpu, now)

    async def _gpu(self, devices: list[int]) -> dict:
        if not devices or self.metrics_source is None:
            return {}
        try:
            return await self.metrics_source.sample(devices)
        except Exception as e:  # MetricsUnavailable or a driver error: devices unknown, not idle
            self.log.debug("usage: GPU sampling unavailable: %s", e)
            return {}

    # -- accounting (database side, on a thread) ---------------------------------------
    def _open_records(self, now: float) -> tuple[list[Interval], float]:
        with self._session() as s:
            st = s.get(UsageState, STATE_KEY)
            since = st.value if st is not None else None
            q = select(GPUAllocationRecord)
            if since is not None:
                since_dt = datetime.fromtimestamp(since, timezone.utc)
                q = q.where(or_(GPUAllocationRecord.end.is_(None), GPUAllocationRecord.end > since_dt))
            else:
                q = q.where(GPUAllocationRecord.end.is_(None))
            rows = s.scalars(q).all()
        intervals = [Interval(r.device, r.holder, r.kind, r.user, r.profile, _ts(r.start), _ts(r.end)) for r in rows]
        if since is None:  # first pass ever: what is held now counts from its start (unmeasured before now)
            since = min([iv.start for iv in intervals] + [now])
        return intervals, min(since, now)

    def _add_figures(self, figures: dict, groups: dict, now: float) -> None:
        with write_session(self.db_url) as s:
            for (day, user, kind, profile, holder), f in figures.items():
                row = s.scalar(select(UsageDaily).where(
                    UsageDaily.day == day, UsageDaily.user == user, UsageDaily.kind == kind,
                    UsageDaily.profile == (profile or ""), UsageDaily.holder == holder))
                if row is None:
                    row = UsageDaily(day=day, user=user, kind=kind, profile=profile or "", holder=holder,
                                     allocated_s=0.0, used_s=0.0, measured_s=0.0)
                    s.add(row)
                row.allocated_s += f.allocated
                row.used_s += f.used
                row.measured_s += f.measured
                row.groups = list(groups.get(user, ()))
                row.updated = datetime.fromtimestamp(now, timezone.utc)
            st = s.get(UsageState, STATE_KEY)
            if st is None:
                s.add(UsageState(key=STATE_KEY, value=now))
            else:
                st.value = max(st.value, now)
            s.commit()

    def rows(self, since_day: str, until_day: str, user: str | None = None, limit: int | None = None) -> list[UsageRow]:
        """Stored rollup rows of [since_day, until_day], at most ``limit`` (blocking)."""
        with self._session() as s:
            q = select(UsageDaily).where(UsageDaily.day >= since_day, UsageDaily.day <= until_day)
            if user is not None:
                q = q.where(UsageDaily.user == user)
            if limit is not None:
                q = q.limit(limit)
            return [UsageRow(r.day, r.user, r.kind, r.profile or None, r.holder, tuple(r.groups or ()),
                             r.allocated_s, r.used_s, r.measured_s) for r in s.scalars(q)]

    def all_rows(self) -> list[UsageRow]:
        return self.rows("0000-00-00", "9999-99-99")

    # -- advisor ----------------------------------------------------------------------------
    async def _advise(self, jobs, gpu: dict, now: float) -> None:
        running = {j.id for j in jobs}
        for gone in set(self.series) - running:
            self.series.pop(gone, None)
            body = self.latest.pop(gone, None)
            if body is not None:
                body["final"] = True
        roots = {}
        for j in jobs:
            for w in (j.launch_state or {}).get("workers", []) or []:
                if w.get("pid"):
                    roots[(j.id, w["rank"])] = int(w["pid"])
        try:
            trees = await asyncio.to_thread(self.trees.sample, sorted(set(roots.values())))
        except Exception:
            self.log.exception("usage: process sampling failed")
            trees = {}
        steps = {}
        if jobs:
            try:
                steps = await self._db(self._latest_steps, [j.id for j in jobs])
            except Exception:
                self.log.debug("usage: cannot read job steps", exc_info=True)
        for j in jobs:
            try:
                await self._advise_job(j, gpu, trees, roots, steps.get(j.id, {}), now)
            except Exception:
                self.log.exception("usage: advising job %s failed", j.key)

    def _latest_steps(self, job_ids: list[int]) -> dict[int, dict[int, float]]:
        from trainhub.services.jobs.models import JobMetric

        out: dict[int, dict[int, float]] = {}
        with self._session() as s:
            q = (select(JobMetric.job_id, JobMetric.worker, func.max(JobMetric.step))
                 .where(JobMetric.job_id.in_(job_ids), JobMetric.step.is_not(None))
                 .group_by(JobMetric.job_id, JobMetric.worker))
            for job_id, worker, step in s.execute(q):
                out.setdefault(job_id, {})[worker] = float(step)
        return out

    async def _advise_job(self, job, gpu: dict, trees: dict, roots: dict, steps: dict, now: float) -> None:
        per_job = self.series.setdefault(job.id, {})
        window = max(int(self.thresholds.window), 1)
        ranks = range(max(job.workers or 1, len(job.devices or [])))
        added = False
        for rank in ranks:
            devs = (job.devices or [])[rank] if rank < len(job.devices or []) else []
            g = [gpu[d] for d in devs if d in gpu]
            tree = trees.get(roots.get((job.id, rank))) if (job.id, rank) in roots else None
            if (devs and len(g) < len(devs)) and tree is None:
                continue  # nothing measured for this worker in this pass
            if not devs and tree is None:
                continue
            sample = WorkerSample(
                at=now,
                gpu_util=(sum(x.utilization for x in g) / len(g)) if g and len(g) == len(devs) else None,
                gpu_mem_used_mb=sum(x.memory_used_mb for x in g) if g and len(g) == len(devs) else None,
                gpu_mem_total_mb=sum(x.memory_total_mb for x in g) if g and len(g) == len(devs) else None,
                cpu_percent=tree.cpu_percent if tree else None,
                cpu_cores=tree.cpu_cores if tree else None,
                max_process_cpu_percent=tree.max_process_cpu_percent if tree else None,
                iowait_fraction=tree.iowait_fraction if tree else None,
                read_mb_s=tree.read_mb_s if tree else None,
                step=steps.get(rank),
            )
            per_job.setdefault(rank, deque(maxlen=window)).append(sample)
            added = True
        if not added and job.id in self.latest:
            return
        diagnoses, summaries = diagnose({r: list(s) for r, s in per_job.items()}, self.thresholds)
        n = min((len(s) for s in per_job.values()), default=0)
        need = max(int(self.thresholds.min_samples), 1)
        body = {
            "id": job.key, "user": job.user, "state": job.state, "updated": iso(now),
            "samples": n, "min_samples": need, "sample_interval": self.sample_interval,
            "simulated": any(getattr(x, "simulated", False) for x in gpu.values()),
            "diagnoses": [d.to_dict() for d in diagnoses],
            "workers": [w.to_dict() for w in summaries],
            "note": (f"collecting samples: {n} of {need} needed before any diagnosis" if n < need
                     else ("no problem found" if not diagnoses else "")),
        }
        old = self.latest.get(job.id)
        self.latest[job.id] = body
        codes = [d["code"] for d in body["diagnoses"]]
        if old is None or [d["code"] for d in old["diagnoses"]] != codes:
            if codes:
                self.log.info("job %s: advisor: %s", job.key, "; ".join(d.message for d in diagnoses))
        await self._db(self._save_diagnosis, job.id, job.user, body, now, write=True)

    def _save_diagnosis(self, job_id: int, user: str, body: dict, now: float) -> None:
        with write_session(self.db_url) as s:
            row = s.get(JobDiagnosis, job_id)
            when = datetime.fromtimestamp(now, timezone.utc)
            if row is None:
                s.add(JobDiagnosis(job_id=job_id, user=user, updated=when, body=body))
            else:
                row.body, row.updated = body, when
            s.commit()

    def stored_diagnosis(self, job_id: int) -> dict | None:
        with self._session() as s:
            row = s.get(JobDiagnosis, job_id)
            return dict(row.body) if row is not None else None

    def current_diagnoses(self) -> dict:
        """{(job key, user): [codes]} of running jobs (for the Prometheus gauge)."""
        return {(b["id"], b["user"]): [d["code"] for d in b["diagnoses"]] for b in self.latest.values()}
