"""The job engine: queue → scheduler → ledger → launcher, and watching what runs.

One loop, woken on every submission or cancel, on a worker's exit (where the launcher can tell,
``Launcher.watch_exits``) and otherwise every ``tick`` seconds:
finish or retry jobs whose workers ended, stop cancelled / overdue / preempted jobs,
read new metrics, ask the scheduler policy which queued jobs start, take their devices
from the shared GPU ledger (atomically with the quota check) and launch them as a gang.
After a restart, running jobs are re-adopted from their launch state or marked lost.

Scheduling is event-driven: a tick only watches what runs. A scheduling pass runs when something
changed -- a submission, a cancel, a job ending or requeued, the GPU pool or its holdings, a
notebook server's request -- and otherwise every ``schedule_interval`` seconds (aging, reservations
and time estimates move with time). The queue is an in-memory copy kept in step with the database
by deltas (``.queued``), and waiting jobs' reasons are worked out when asked for
(:meth:`JobEngine.why`, the API's job views), never written per job per pass.

When the platform itself stops (`trainhub up` records it in ``<data-dir>/platform-stop.json``
before it ends anything), the engine stops deciding outcomes: the SIGTERMs of the stop are not
the jobs' own failures. On the next start, a job that was running when its platform run stopped
is requeued with "platform stopped" as the reason (``on_platform_stop = "requeue"``, the default)
or ends ``failed`` with it (``"fail"``); one that had finished by itself before the stop keeps its
own outcome. Jobs whose processes live on (the jobs service alone restarted) are re-adopted.

Every pass also gives back the devices of job holdings whose job is no longer running (a release
that failed on a locked database, a crash between allocation and launch): the ledger never keeps
devices of a job that has ended for longer than one pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections import defaultdict
from datetime import datetime, timezone

from traitlets import CaselessStrEnum, Float, Instance, Type, Unicode
from traitlets.config import LoggingConfigurable

from trainhub.db import write_now
from trainhub.exceptions import TrainhubError
from trainhub.fmt import REQUEUED, as_utc, fmt_duration, restart_causes
from trainhub.jobarea import JOB_URL_VAR
from trainhub.ledger import GPUAllocator, job_holder
from trainhub.loops import PeriodicLoop
from trainhub.boundary.procs import INSTANCE_VAR
from trainhub.quotas import QuotaPolicy
from trainhub.scheduler import Allocation, JobRequest, Scheduler, TrainhubScheduler
from trainhub.serverqueue import GRANTED, STALE_AFTER, WAITING, ServerQueue
from trainhub.settings import StopRecord, StopRecordFile
from trainhub.states import CANCELLED, FAILED, LOST, QUEUED, RUNNING, SUCCEEDED
from trainhub.storage import StorageConfig

from .attemptenv import AttemptEnv, resume_vars
from .launcher import JobView, Launcher
from .models import Job, job_key, parse_job_key
from .outputs import OutputSyncer
from .queued import QueuedJobs
from .store import JobStore

NODE = "local"


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def view(job: Job) -> JobView:
    return JobView(id=job.id, key=job.key, user=job.user, name=job.name, command=job.command, script=job.script,
                   workers=job.workers, gpus=job.gpus, env=dict(job.env or {}), attempt=job.attempt,
                   time_limit=job.time_limit, params=dict(job.params or {}), profile=job.profile)


def describe_exit(rank: int, code: int | None, lost: bool = False) -> str:
    if lost:
        return f"worker {rank} vanished without an exit status (killed or the machine restarted)"
    if code is not None and code < 0:
        import signal as _s

        try:
            name = _s.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker {rank} was killed by {name}"
    return f"worker {rank} exited with code {code}"


class JobEngine(LoggingConfigurable):
    tick = Float(1.0, help="Seconds between engine passes when nothing wakes it (submissions and cancels wake it at once).").tag(config=True)
    grace_period = Float(10.0, help="Seconds between SIGTERM and SIGKILL when a job is cancelled, preempted or over its time limit.").tag(config=True)
    gpu_sample_interval = Float(10.0, help="Seconds between GPU utilisation samples of running jobs.").tag(config=True)
    scheduler_class = Type(TrainhubScheduler, klass=Scheduler, help="Queue policy (see trainhub.scheduler).").tag(config=True)
    api_url = Unicode("", help="Public URL of this API, given to jobs as $TRAINHUB_API_URL.").tag(config=True)
    on_platform_stop = CaselessStrEnum(
        ["requeue", "fail"], "requeue",
        help="""What becomes of a job that was running when the platform (`trainhub up`) stopped: its workers get
        SIGTERM and, after grace, SIGKILL; on the next start it is "requeue"d (queued again, keeping its place and
        its retries, reason "platform stopped while it ran; requeued") or "fail"ed (reason "platform stopped while
        it ran"). A job that finished by itself before the stop keeps its own outcome. Jobs whose processes live on
        across a restart of the hub or of the jobs service alone are re-adopted whatever this says.""",
    ).tag(config=True)

    schedule_interval = Float(10.0, help="""Seconds between scheduling passes when nothing has changed, e.g. 10 (aging,
        reservations and the time estimates in waiting jobs' reasons move with time). Submissions, cancels, jobs that end
        or are requeued, and changes of the GPU pool, its holdings or the notebook servers waiting in line trigger a pass
        at once.""").tag(config=True)

    scheduler = Instance(Scheduler)

    def __init__(self, store: JobStore, allocator: GPUAllocator, launcher: Launcher, quota: QuotaPolicy,
                 storage: StorageConfig, syncer: OutputSyncer, catalog=None, metrics_source=None, groups_of=None, **kw):
        super().__init__(**kw)
        self.store, self.allocator, self.launcher, self.quota = store, allocator, launcher, quota
        self.storage, self.syncer, self.catalog, self.metrics_source = storage, syncer, catalog, metrics_source
        self.attempt_env = AttemptEnv(launcher, storage)  # what every worker of an attempt gets from the engine
        self.groups_of = groups_of or (lambda user: ())
        self.scheduler = self.scheduler_class(parent=self)
        if self.scheduler.max_cpu_jobs is None and "max_cpu_jobs" not in self.config.get(type(self.scheduler).__name__, {}):
            # one machine: CPU-only jobs share its cores; GPU jobs are bounded by the pool instead
            self.scheduler.max_cpu_jobs = max(4, 2 * (os.cpu_count() or 2))
        self._loop: PeriodicLoop | None = None
        self._stopping: dict[int, asyncio.Task] = {}  # job id -> terminate task
        self._plan = None  # the last pass's Plan: waiting jobs' reasons, worked out when asked for
        self._queued = QueuedJobs(store.db_url)
        self._dirty = True  # something changed since the last scheduling pass
        self._next_pass = 0.0  # time.monotonic() of the next timed pass
        self._signature = None  # (pool size, holdings, server requests) seen at the last pass
        self.schedule_passes = 0
        self._requeued = False  # a job went back to the queue: compare the queued ids at the next pass
        self._server_names: set[str] = set()  # server requests in the queue
        self._metrics_size: dict[tuple, int] = {}  # (job id, attempt, rank) -> metrics file size last ingested
        self._last_gpu_sample = 0.0
        self.servers = ServerQueue(store.db_url)  # notebook servers waiting for GPUs: in the same passes as jobs
        self.passes = 0
        self._end_listeners: list = []  # on_job_end callbacks
        self._stop_file: StopRecordFile | None = None  # see _stop_record

    def on_job_end(self, callback) -> None:
        """Call ``callback(job)`` (on the loop; it must not block) each time an attempt of a job ends and its
        outcome is recorded (terminal or requeued; ``job`` is the row as it was before): the sweep controller
        refills a trial's slot at once instead of on its next tick."""
        self._end_listeners.append(callback)

    # -- lifecycle -------------------------------------------------------------
    async def start(self) -> None:
        await self.recover()
        await self.launcher.start()
        self.launcher.watch_exits(self.wake)  # a worker's end wakes a pass at once (where the back end can tell)
        self._loop = PeriodicLoop("trainhub-job-engine", lambda: self.run_once(schedule=None), lambda: self.tick, self.log)
        self._loop.start()

    async def stop(self) -> None:
        if self._loop is not None:
            await self._loop.stop()
        # terminations under way end with the service: the next start re-adopts the job and, as its
        # cancel / time limit / preemption is persisted, stops it again
        stopping, self._stopping = list(self._stopping.values()), {}
        for task in stopping:
            task.cancel()
        await asyncio.gather(*stopping, return_exceptions=True)
        await self.launcher.close()  # watch caches, HTTP sessions (Kubernetes launcher)

    def wake(self) -> None:
        """Something changed (a submission, a cancel, a job ended): run a scheduling pass now."""
        self._dirty = True
        if self._loop is not None:
            self._loop.wake()

    def _stop_record(self) -> StopRecord | None:
        """The data dir's stop record (every pass asks: read again only when its file changed)."""
        if not self.launcher.data_dir:
            return None
        if self._stop_file is None or self._stop_file.data_dir != self.launcher.data_dir:
            self._stop_file = StopRecordFile(self.launcher.data_dir)
        return self._stop_file.read()

    def platform_stopping(self) -> bool:
        """The platform run this service belongs to has begun to stop."""
        me = os.environ.get(INSTANCE_VAR)
        if not me or not self.launcher.data_dir:
            return False
        record = self._stop_record()
        return record is not None and record.instance == me

    async def recover(self) -> None:
        """Re-adopt running jobs after a restart; those whose workers are gone are lost (or retried), those the
        platform's stop ended are requeued or failed (``on_platform_stop``)."""
        me = os.environ.get(INSTANCE_VAR, "")
        record = self._stop_record()
        for job in await self.store.read(self.store.in_states, RUNNING):
            ran_in = (job.launch_state or {}).get("instance")
            if me and ran_in and ran_in != me:
                if await self._after_platform_stop(job, record if record and record.instance == ran_in else None):
                    continue
            found = await self.launcher.adopt(view(job), job.launch_state or {})
            if found:
                self.log.info("job %s: re-adopted its running workers after a restart", job.key)
                await self.store.write(self.store.update, job.id, event=("adopted", "workers re-adopted after a service restart"))
            else:
                await self._end_attempt(job, LOST, "its workers were gone when the service restarted (platform stopped or machine rebooted)")

    async def _after_platform_stop(self, job: Job, record: StopRecord | None) -> bool:
        """A job running in an earlier platform run: True when dealt with here (requeued or failed by the stop);
        False for the ordinary path (its workers live on, or it ended by itself before the stop began)."""
        state = job.launch_state or {}
        if not state.get("workers"):
            # claimed, but the platform stopped before its launch was recorded: whatever of it had started, the
            # stop ended (it ends every process of its run), so it is the stop's to requeue (or fail), not lost
            if record is None:
                return False
            codes, while_ = [], "while it started"
        else:
            statuses = await self.launcher.poll(view(job), state)
            if not statuses or any(s.running for s in statuses):
                return False
            codes = [s.exit_code for s in sorted(statuses, key=lambda s: s.rank)]
            if all(c == 0 for c in codes) and not any(s.lost for s in statuses):
                return False  # it succeeded: the ordinary path records that
            if record is not None and _ended_before(state, record.began):
                return False  # it failed by itself before the platform stopped
            while_ = "while it ran"
        when = ""
        if record is not None:
            when = " at " + datetime.fromtimestamp(record.began, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
        how = "did not stop cleanly" if record is not None and record.reason != "stopped" else "stopped"
        if self.on_platform_stop == "fail":
            await self._end_attempt(job, FAILED, f"platform {how}{when} {while_}", codes)
        else:
            await self._end_attempt(job, QUEUED, f"platform {how}{when} {while_}{REQUEUED}", codes, requeue=True)
        return True

    # -- one pass ---------------------------------------------------------------
    async def run_once(self, schedule: bool | None = True) -> None:
        """One tick: watch what runs, then a scheduling pass (``schedule=None``: only when something
        changed or ``schedule_interval`` has passed; see the module docstring)."""
        self.passes += 1
        if self.platform_stopping():
            return  # the stop's SIGTERMs are not the jobs' outcomes: the next start sorts them out
        # what runs, what holds devices and which servers wait, in one read (see _read)
        running, holdings, server_rows = await self._read(self._read_state)
        holdings = await self._reconcile_ledger(running, holdings)
        for job in running:
            try:
                await self._watch(job)
            except Exception:
                self.log.exception("job %s: watching failed", job.key)
        servers = await self._server_requests(server_rows)
        signature = (len(self.allocator.devices()), frozenset((h.holder, h.device) for h in holdings),
                     frozenset((r.holder, r.gpus) for r in servers))
        timed = time.monotonic() >= self._next_pass
        if schedule is None:
            schedule = self._dirty or timed or signature != self._signature
        if schedule:
            self._dirty = False
            self._signature = signature
            self._next_pass = time.monotonic() + self.schedule_interval
            await self._schedule(servers, full_sync=timed)
        if self.metrics_source is not None and time.monotonic() - self._last_gpu_sample >= self.gpu_sample_interval:
            self._last_gpu_sample = time.monotonic()
            await self._sample_gpus([j for j in running if j.devices])

    async def _read(self, fn, inline: bool = True):
        """``fn()``, a read of the databases the pass needs: on the event loop where each is a local SQLite
        database in WAL mode (a reader never waits there, and a small read costs less than a trip to a
        worker thread, which is a wait for a core on a loaded machine: a submission waits for the pass),
        else on a worker thread."""
        if inline and self._local_sqlite:
            return fn()
        return await asyncio.to_thread(fn)

    @property
    def _local_sqlite(self) -> bool:
        """Both databases are local SQLite (WAL) and small work on them may run on the event loop."""
        return self.store.inline_reads and self.allocator.inline_reads

    async def _write_now(self, fn):
        """``fn()``, a job start's short write (its devices and claim, about 1 ms): on the event loop where both
        databases are local SQLite and the write lock is free at once, else on a worker thread (db.write_now): on a
        thread it took 3-8 ms on the way to the job's first line, while the loop served the start's log streams."""
        return await write_now(fn, self._local_sqlite)

    def _read_state(self) -> tuple[list, list, list]:
        """``(running jobs, ledger holdings, server requests)`` (blocking: see _read)."""
        return self.store.in_states(RUNNING), self.allocator.holdings(), self.servers.all()

    async def _reconcile_ledger(self, running: list[Job], holdings: list) -> list:
        """Release the devices of job holdings whose job is not running (no launch is under way during a pass);
        returns the holdings left."""
        ids = {j.id for j in running}
        stale = set()
        for h in holdings:
            number = h.holder.split(":", 1)[1] if h.kind == "job" and ":" in h.holder else ""
            if number.isdigit() and int(number) not in ids:
                stale.add(h.holder)
        for holder in sorted(stale):
            released = await asyncio.to_thread(self.allocator.release, holder)
            if released:
                self.log.warning("ledger: released devices %s of %s (its job is not running)", released, holder)
        return [h for h in holdings if h.holder not in stale]

    async def _watch(self, job: Job) -> None:
        v, state = view(job), job.launch_state or {}
        await self._ingest(job)
        if self.syncer.due(job.key):
            await asyncio.to_thread(self.syncer.sync, job.user, job.key, self.launcher.job_dir(v))
        if job.id in self._stopping:
            if not self._stopping[job.id].done():
                return
        statuses = await self.launcher.poll(v, state)
        ended = [s for s in statuses if not s.running]
        # decide whether this job must be stopped
        stop_reason = None
        if job.cancel_requested:
            stop_reason = "cancel"
        elif job.time_limit and job.started and (now_utc() - as_utc(job.started)).total_seconds() > job.time_limit:
            stop_reason = "time-limit"
        elif any((s.exit_code or 0) != 0 or s.lost for s in ended) and len(ended) < len(statuses):
            stop_reason = "gang-failure"
        elif state.get("preempting"):
            stop_reason = "preempt"
        elif state.get("stalled"):
            stop_reason = "stalled"
        elif len(ended) < len(statuses) and (stall := await self.launcher.stalled(v, state)):
            stop_reason = "stalled"
            state = {**state, "stalled": stall}
            await self.store.write(self.store.update, job.id, launch_state=state, event=("stalled", f"{stall}: requeueing"))
        if stop_reason and len(ended) < len(statuses):
            if job.id not in self._stopping:
                self.log.info("job %s: stopping workers (%s)", job.key, stop_reason)
                if stop_reason == "time-limit":
                    await self.store.write(self.store.update, job.id, launch_state={**state, "timed_out": True},
                                           event=("time-limit", f"time limit of {fmt_duration(job.time_limit, 'units')} reached: stopping"))
                elif stop_reason == "gang-failure":
                    first = next(s for s in ended if (s.exit_code or 0) != 0 or s.lost)
                    await self.store.write(self.store.update, job.id, launch_state={**state, "gang_failure": describe_exit(first.rank, first.exit_code, first.lost)},
                                           event=("gang-failure", f"{describe_exit(first.rank, first.exit_code, first.lost)}: stopping the other workers"))
                self._stopping[job.id] = asyncio.create_task(self.launcher.terminate(v, state, self.grace_period))
            return
        if len(ended) < len(statuses) or not statuses:
            return
        await self._forget_stopping(job)
        # every worker has ended: decide the outcome
        job = await self.store.read(self.store.get, job.id)
        state = job.launch_state or {}
        codes = [s.exit_code for s in sorted(statuses, key=lambda s: s.rank)]
        if job.cancel_requested:
            by = job.reason.removeprefix("cancelling (requested by ").rstrip(")") if job.reason.startswith("cancelling") else "the user"
            await self._end_attempt(job, CANCELLED, f"cancelled by {by} while running", codes)
        elif state.get("timed_out"):
            await self._end_attempt(job, FAILED, f"exceeded its time limit of {fmt_duration(job.time_limit, 'units')}", codes, retry=True)
        elif state.get("preempting"):
            await self._end_attempt(job, QUEUED, f"preempted: {state.get('preempt_reason', 'a higher-priority job needed its GPUs')}{REQUEUED}", codes, requeue=True)
        elif state.get("stalled"):
            await self._end_attempt(job, QUEUED, f"{state['stalled']}{REQUEUED}", codes, requeue=True)
        elif all(c == 0 for c in codes):
            n = len(codes)
            await self._end_attempt(job, SUCCEEDED, f"{'all ' + str(n) + ' workers' if n > 1 else 'the worker'} exited with code 0", codes)
        else:
            failed = [s for s in statuses if (s.exit_code or 0) != 0 or s.lost]
            first = min(failed, key=lambda s: s.rank)
            reason = state.get("gang_failure") or describe_exit(first.rank, first.exit_code, first.lost)
            state_ = LOST if all(s.lost for s in failed) else FAILED
            await self._end_attempt(job, state_, reason, codes, retry=True)

    async def _forget_stopping(self, job: Job) -> None:
        """Every worker has ended: collect the job's terminate task (cancelled if still waiting to SIGKILL)."""
        task = self._stopping.pop(job.id, None)
        if task is None:
            return
        if not task.done():
            task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise
        except Exception as e:
            self.log.warning("job %s: stopping its workers failed: %s", job.key, e)

    async def _end_attempt(self, job: Job, state: str, reason: str, codes=None, retry: bool = False, requeue: bool = False) -> None:
        """Release the job's devices and record the outcome (or requeue it for another attempt)."""
        v = view(job)
        await self._ingest(job, final=True)
        try:
            await asyncio.to_thread(self.syncer.sync, job.user, job.key, self.launcher.job_dir(v), True)
        except Exception:
            self.log.exception("job %s: final output sync failed", job.key)
        await asyncio.to_thread(self.allocator.release, job_holder(job.id))
        try:
            await self.launcher.cleanup(v, job.launch_state or {})
        except Exception:
            self.log.exception("job %s: launcher cleanup failed", job.key)
        # attempts the platform restarted (stopped, preempted, stalled: requeued) spend none of the job's retries
        restarts = len(restart_causes(await self.store.read(self.store.events, job.id))) if retry else 0
        if retry and job.attempt - restarts <= job.retries and not job.cancel_requested:
            requeue = True
            reason = f"{reason}; retrying (attempt {job.attempt + 1} of {job.retries + 1 + restarts})"
            state = QUEUED
        elif retry and job.retries:
            reason = f"{reason} (attempt {job.attempt} of {job.retries + 1 + restarts}; no retries left)"
        fields = dict(exit_codes=codes or [], cancel_requested=False if requeue else job.cancel_requested)
        if requeue:
            fields.update(state=QUEUED, reason=reason, devices=[], launch_state={})
            self._requeued = True
        else:
            fields.update(state=state, reason=reason, finished=now_utc())
        await self.store.write(self.store.update, job.id, event=(state, reason), **fields)
        for key in [k for k in self._metrics_size if k[0] == job.id]:
            del self._metrics_size[key]
        self.log.info("job %s (%s): %s — %s", job.key, job.user, state, reason)
        for callback in self._end_listeners:
            try:
                callback(job)
            except Exception:
                self.log.exception("job %s: an end listener failed", job.key)
        self.wake()

    async def _ingest(self, job: Job, final: bool = False) -> None:
        """New metric records of the job's workers into the database: a piece of each grown file per
        pass while it runs; everything left (within the store's bounds) when the attempt ends."""
        state = job.launch_state or {}
        adir = state.get("dir")
        if not adir:
            return
        for w in state.get("workers", []):
            path = os.path.join(adir, f"metrics-{w['rank']}.jsonl")
            # only when the file grew: a write transaction per worker per pass would queue API submissions
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                continue
            key = (job.id, job.attempt, w["rank"])
            if size == 0 or self._metrics_size.get(key) == size:
                continue
            while await self.store.write(self.store.ingest_metrics, job.id, job.attempt, w["rank"], path):
                if not final:
                    break
            else:
                self._metrics_size[key] = size  # caught up

    # -- scheduling ------------------------------------------------------------------
    async def _schedule(self, servers: list | None = None, full_sync: bool = False) -> None:
        """One scheduling pass over the in-memory queue (synced by deltas first); see the module docstring."""
        self.schedule_passes += 1
        if servers is None:
            servers = await self._server_requests()
        queued = self._queued
        full_sync, self._requeued = full_sync or self._requeued, False
        # the queue's changes and the pool's state in one read (a full sync of a long queue on a thread)
        delta, holdings, running = await self._read(
            lambda: (queued.fetch(full_sync), self.allocator.holdings(), self.store.in_states(RUNNING)),
            inline=queued.loaded and not full_sync)
        queued.apply(delta)
        queue = queued.queue
        # notebook servers waiting in line take part in the same pass, as requests named by their holder
        by_holder_req = {r.name: r for r in servers}
        for name in [n for n in self._server_names if n not in by_holder_req]:
            queue.remove(name)
        for r in servers:
            req = JobRequest(id=r.name, user=r.user, groups=r.groups, workers=1, gpus_per_worker=r.gpus, submitted_at=r.created)
            if queue.get(r.name) != req:
                queue.add(req)
        self._server_names = set(by_holder_req)
        if not len(queue):
            self._plan = None
            return
        capacity, allocations, running_jobs = self._cluster(holdings, running)
        quotas = self.quota.quotas()  # the admission rule's limits: queue and 403s agree
        plan = self.scheduler.schedule(time.time(), queue, allocations, capacity, quotas)
        self._plan = plan  # reasons of waiting jobs: worked out when asked for (why(), the API's job views)
        for start in plan.starts:
            job_id = parse_job_key(start.job_id)
            if start.job_id in by_holder_req:
                await self._grant_server(by_holder_req[start.job_id])
            elif job_id is not None and job_id in queued.keys:
                try:
                    job = await self._read(lambda: self.store.record(job_id))
                except TrainhubError:  # deleted meanwhile
                    queued.discard(job_id)
                    continue
                if job.state != QUEUED or job.cancel_requested or await self._launch(job):
                    queued.discard(job_id)  # it left the queue (started, failed to launch, cancelled meanwhile)
        for job_key_ in plan.preempt:
            await self._preempt(running_jobs.get(parse_job_key(job_key_)), plan)
        await self._tell_servers(plan, by_holder_req)

    def _cluster(self, holdings: list, running: list) -> tuple[dict, list[Allocation], dict]:
        """``(capacity, allocations, running jobs by id)``: the GPU pool and what holds it now."""
        running_jobs = {j.id: j for j in running}
        by_holder = defaultdict(list)
        for h in holdings:
            by_holder[h.holder].append(h)
        allocations = []
        for holder, hs in by_holder.items():
            kind = hs[0].kind
            job = running_jobs.get(int(holder.split(":", 1)[1])) if kind == "job" and holder.split(":", 1)[1].isdigit() else None
            if job is not None:
                placement = tuple((NODE, job.gpus) for _ in range(job.workers))
                allocations.append(Allocation(id=job.key, user=job.user, groups=tuple(job.groups or ()), placement=placement,
                                              kind="job", priority=job.priority, started_at=_ts(job.started),
                                              time_limit=job.time_limit, preemptible=job.preemptible, submitted_at=_ts(job.created)))
            else:
                allocations.append(Allocation(id=holder, user=hs[0].user, groups=tuple(self.groups_of(hs[0].user)),
                                              placement=((NODE, len(hs)),), kind="server" if kind == "server" else "job",
                                              started_at=_ts(hs[0].since)))
        for job in running_jobs.values():
            if not job.gpus:
                allocations.append(Allocation(id=job.key, user=job.user, groups=tuple(job.groups or ()),
                                              placement=tuple(("", 0) for _ in range(job.workers)), started_at=_ts(job.started)))
        return {NODE: len(self.allocator.devices())}, allocations, running_jobs

    # -- notebook servers waiting in line (trainhub.serverqueue) ----------------------------------------
    async def _server_requests(self, rows: list | None = None) -> list:
        """The waiting server requests (of ``rows`` when they were just read); stale ones (their spawner
        stopped looking) are dropped, and what a stale granted one holds goes back to the pool."""
        if rows is None:
            rows = await asyncio.to_thread(self.servers.all)
        now = time.time()
        for r in rows:
            if now - r.seen > STALE_AFTER:
                self.log.info("server request %s: its spawner stopped waiting; dropped", r.holder)
                await asyncio.to_thread(self.servers.withdraw, r.holder)
                if r.state == GRANTED and not any(h.pid for h in await asyncio.to_thread(self.allocator.holdings) if h.holder == r.holder):
                    await asyncio.to_thread(self.allocator.release, r.holder)
        return [r for r in rows if r.state == WAITING and now - r.seen <= STALE_AFTER]

    async def _grant_server(self, r) -> None:
        """The request's turn: take its devices for the server's holder, as the spawner would have."""
        try:
            devices = await asyncio.to_thread(
                self.allocator.allocate, r.holder, kind="server", user=r.user, count=r.gpus, profile=r.profile,
                gpu_model=r.gpu_model, quota=self.quota, user_groups=r.groups, group_members=None)
        except TrainhubError as e:  # taken in the meantime: it stays in line
            self.log.info("server request %s: not granted yet: %s", r.holder, e.message)
            return
        if not await asyncio.to_thread(self.servers.grant, r.holder, devices):  # withdrawn meanwhile
            await asyncio.to_thread(self.allocator.release, r.holder)
            return
        self.log.info("server request %s granted devices %s", r.holder, devices)

    async def _tell_servers(self, plan, requests: dict) -> None:
        """Each waiting server's position among everything waiting for GPUs, the scheduler's reason (with
        its estimate, where it has one) and the reserved start time."""
        if not requests:
            return
        # position among the GPU requests waiting (CPU-only jobs do not wait for GPUs); counting keys
        # does not work out the reasons of the jobs counted
        queue = self._queued.queue
        positions, waiting = {}, 0
        for key in plan.waiting:
            req = queue.get(key)
            if req is not None and req.gpus_per_worker <= 0:
                continue
            waiting += 1
            if key in requests:
                positions[key] = waiting
        rows = {}
        for name, r in requests.items():
            why = plan.waiting.get(name)
            if why is None:
                continue
            rows[r.holder] = (why.message, positions.get(name), waiting, why.reserved_start or why.estimated_start)
        await asyncio.to_thread(self.servers.update_waiting, rows)

    async def _preempt(self, job: Job | None, plan) -> None:
        if job is None or (job.launch_state or {}).get("preempting"):
            return
        reason = f"job {plan.head} (higher priority) needed its GPUs" if plan.head else "a higher-priority job needed its GPUs"
        await self.store.write(self.store.update, job.id, launch_state={**(job.launch_state or {}), "preempting": True, "preempt_reason": reason},
                               event=("preempt", f"preempting: {reason}; SIGTERM with {fmt_duration(self.grace_period, 'units')} grace"))

    def why(self, job_id: int):
        """The WaitReason of queued job ``job_id`` at the last pass (``None``: not seen by a pass yet), worked
        out now if the pass did not reach it."""
        plan = self._plan
        return None if plan is None else plan.waiting.get(job_key(job_id))

    async def _launch(self, job: Job) -> bool:
        """Start ``job``; False when it stays queued (its GPUs were taken in the meantime)."""
        count = job.gpus * job.workers
        gpu_model = None
        if job.profile and self.catalog is not None:
            try:
                gpu_model = self.catalog.get(job.profile).gpu_model
            except TrainhubError:
                gpu_model = None
        attempt = job.attempt + 1
        job.attempt = attempt
        v = view(job)
        workdir = await self.store.lookup(self.store.workdir_of, job.id)  # a small read: on the loop with SQLite
        if workdir:
            v = dataclasses.replace(v, workdir=workdir)
        jdir = self.launcher.job_dir(v)
        outputs_url = self.syncer.target_url(job.user, job.key)
        env = self.attempt_env.base(v, job.retries or 0, self.api_url)
        resume = await self._resume_point(v, env) if attempt > 1 else None
        resumed = f"; resumed from step {resume.step}" if resume else ""
        holder = job_holder(job.id)
        # the run it starts in, from the claim on: were the platform to stop before its launch is recorded, the next
        # start knows the stop ended it (recover)
        claim_state = {"dir": None, "workers": []}
        if os.environ.get(INSTANCE_VAR):
            claim_state["instance"] = os.environ[INSTANCE_VAR]

        def take() -> tuple[list, bool]:
            # the devices and the claim (see _write_now); the job is claimed before its workers start: if the
            # service dies mid-launch, recovery finds a RUNNING job and reconciles it
            devices = self.allocator.allocate(
                holder, kind="job", user=job.user, count=count, profile=job.profile, gpu_model=gpu_model, quota=self.quota,
                user_groups=tuple(job.groups or ()), group_members=None, per_worker=job.gpus or None)
            per_worker = [devices[i * job.gpus:(i + 1) * job.gpus] for i in range(job.workers)] if job.gpus else [[] for _ in range(job.workers)]
            claimed = self.store.update(
                job.id, only_if_state=(QUEUED,), state=RUNNING, attempt=attempt, devices=per_worker,
                started=now_utc(), reason=f"running on {_devices_text(per_worker)}{resumed}", outputs_url=outputs_url,
                outputs_path=os.path.join(jdir, "outputs"), launch_state=claim_state,
                event=("started", f"attempt {attempt}: {job.workers} worker(s) on {_devices_text(per_worker)}"))
            if not claimed:  # cancelled in the meantime
                self.allocator.release(holder)
            return per_worker, claimed

        try:
            per_worker, claimed = await self._write_now(take)
        except TrainhubError as e:  # a server took the GPUs in the meantime: stay queued
            if job.reason != e.message:
                await self.store.write(self.store.update, job.id, only_if_state=(QUEUED,), reason=e.message)
            return False
        if not claimed:
            return True
        if resume:
            env.update(resume_vars(resume))
            await self.store.write(self.store.update, job.id, event=(
                "resumed", f"resumed from step {resume.step}: attempt {attempt} is offered checkpoint {resume.name}"))
        try:
            state = await self.launcher.launch(v, per_worker, env)
        except Exception as e:
            self.log.exception("job %s: launch failed", job.key)
            job.launch_state = {}
            await self._end_attempt(job, FAILED, f"could not start its workers: {e}")
            return True
        await self.store.write(self.store.update, job.id, launch_state=state)
        for w in state.get("workers", []) if any(per_worker) else ():  # the pid is the record of held devices
            try:
                await asyncio.to_thread(self.allocator.set_pid, job_holder(job.id), w["pid"])
                break
            except Exception:
                pass
        return True

    async def _resume_point(self, job: JobView, env: dict):
        """The checkpoint the attempt about to start is offered (None: none, or its storage area could not be
        read, which an event says)."""
        try:
            return await self.attempt_env.resume_point(job, env)
        except Exception as e:
            self.log.warning("job %s: cannot look for checkpoints in %s: %s", job.key, env.get(JOB_URL_VAR), e)
            await self.store.write(self.store.update, job.id, event=(
                "resume", f"could not look for checkpoints in its storage area ({type(e).__name__}: {e}); starting afresh"))
            return None

    # -- GPU samples -----------------------------------------------------------------
    async def _sample_gpus(self, jobs: list[Job]) -> None:
        wanted = sorted({d for j in jobs for w in (j.devices or []) for d in w})
        if not wanted:
            return
        try:
            samples = await self.metrics_source.sample(wanted)
        except Exception as e:
            self.log.debug("GPU sampling unavailable: %s", e)
            return
        rows = []
        for j in jobs:
            for rank, devs in enumerate(j.devices or []):
                for d in devs:
                    s = samples.get(d)
                    if s is not None:
                        rows.append(dict(job_id=j.id, worker=rank, device=d, time=time.time(), utilization=float(s.utilization),
                                         memory_used_mb=float(s.memory_used_mb), simulated=bool(s.simulated)))
        if rows:
            await self.store.write(self.store.add_gpu_samples, rows)


def _ended_before(state: dict, when: float) -> bool:
    """Every worker's exit file was written before ``when`` (a second of slack for the clock's grain)."""
    try:
        return all(os.stat(w["exit_file"]).st_mtime < when - 1.0 for w in state.get("workers", []))
    except (OSError, KeyError, TypeError):
        return False


def _ts(dt: datetime | None) -> float:
    return as_utc(dt).timestamp() if dt else time.time()


def _devices_text(per_worker: list[list[int]]) -> str:
    flat = [d for w in per_worker for d in w]
    if not flat:
        return "CPU only"
    return "GPU" + ("s " if len(flat) > 1 else " ") + ",".join(str(d) for d in flat)
