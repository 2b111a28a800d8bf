"""The sweep controller: Optuna asks, jobs run, metrics come back, Optuna prunes and learns.

One loop in the jobs service, woken when a sweep is created or cancelled, when the engine records
the end of one of its trials' jobs (``JobEngine.on_job_end``: a freed slot is refilled at once,
not on the next tick) and otherwise every ``tick`` seconds (which bounds how late new metrics reach
Optuna's pruner). Per running sweep (each in its own try/except, so one broken sweep never stops
the others):

1. every trial whose job ended: its outcome (the last reported value of the metric when the job
   succeeded; failed, with the reason, when the job failed or never reported it) is recorded on
   the trial;
2. the freed slots are refilled: new trials (asked ahead, or asked now) are submitted as jobs
   (through ``service.submit``, so the scheduler holds them to the user's quota) until ``parallel``
   are unfinished or all ``trials`` were started; the sweep completes when every trial is done;
3. then, in the same pass if it submitted nothing, else in the next (a tick later at most), what no
   job start waits for: Optuna is told the outcomes of 1; the unfinished trials' new values of the
   metric (from the job metrics table the engine fills) are reported as intermediate values, and a
   trial the pruner stops has its job cancelled and is recorded as pruned; the importance is fitted
   again; and the next trials are asked ahead where the sampler's suggestion cannot change
   (:func:`~.sampling.ahead_allowed`), so that a slot that frees is refilled without any Optuna call.

All state lives in SQL (``sweeps``, ``sweep_trials``, the jobs) and in Optuna's RDB storage in the
platform database, so a restarted service carries on: Optuna is told what the trial rows record,
trials whose jobs ran meanwhile are reconciled, a trial recorded but not yet submitted is submitted
again under the same ``submit_key`` (never twice), trials asked (ahead) but never recorded become
trials asked ahead again, as many as are left to start (the others are failed). Optuna calls block on SQLite: they run on one dedicated thread, never on the loop.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from traitlets import Bool, Float, Integer
from traitlets.config import LoggingConfigurable

from trainhub.exceptions import TooManyQueued, TrainhubError
from trainhub.loops import PeriodicLoop
from trainhub.searchspace import SpaceError, grid_count, parse_space, to_distributions
from trainhub.services.jobs.models import job_key
from trainhub.states import (CANCELLED, COMPLETE, COMPLETED, FAILED, JOB_TERMINAL, PENDING, PRUNED, RUNNING,
                             TRIAL_CANCELLED, TRIAL_FAILED, TRIAL_FINAL, TRIAL_RUNNING)

from .models import Sweep, SweepTrial, study_name
from .sampling import ahead_allowed, make_pruner, make_sampler, no_fsync_of_its_own
from .store import SweepStore, best_trial, now_utc
from .usercopy import COPIES_FOLDER, StudyCopies
from .trials import failing_fast, metric_points, trial_outcome, trials_to_start


class BrokenSweep(Exception):
    """A stored sweep whose definition cannot be rebuilt (a row written before today's limits, or
    edited by hand): it is failed with this reason instead of being retried on every pass."""


def check_stored(sweep: Sweep) -> None:
    """Re-validate a stored sweep's space before its study is built: the limits that bound the work of
    a new request bound the work of rebuilding an old one, so no stored row can exhaust the service."""
    try:
        space = parse_space(sweep.space)
        if (sweep.settings or {}).get("sampler") == "grid" and grid_count(space) is None:
            raise SpaceError("the grid sampler needs discrete parameters")
    except SpaceError as e:
        raise BrokenSweep(f"its stored search space cannot be used: {e}") from None


class SweepCaller:
    """Who submits a sweep's trials: its creator (name, groups, admin flag as at creation)."""

    def __init__(self, sweep: Sweep):
        self.name = sweep.user
        self.groups = tuple(sweep.groups or ())
        self.admin = bool(sweep.admin)
        self.kind = "user"
        self.scopes: set = set()


class SweepController(LoggingConfigurable):
    tick = Float(0.5, help="Seconds between controller passes when nothing wakes it (creates, cancels and the end of a "
                 "trial's job wake it at once); also how late new metrics are reported to Optuna (and pruned), at most (the "
                 "pass that refills a freed slot leaves them, and Optuna's tells, importance fit and asks, to the next pass, "
                 "unless the last such work is older than this).").tag(config=True)
    fail_fast = Integer(3, help="Stop a sweep when its first N finished trials all failed (broken trial code). 0 = never.").tag(config=True)
    importance_min_trials = Integer(5, help="Completed trials needed before parameter importance is computed "
                                    "(optuna.importance, PED-ANOVA). 0 = never compute it.").tag(config=True)
    user_copies = Bool(True, help="Keep each user's own copy of their studies in their home (~/.trainhub/optuna/studies.db, "
                       "written as the user when a trial finishes and when a sweep ends), so that optuna.load_study and "
                       "optuna-dashboard open their sweeps (docs/sweeps.md). Needs homes on this machine (the local back "
                       "end); False: no copies.").tag(config=True)

    def __init__(self, service, **kw):
        super().__init__(**kw)
        self.service = service
        self.store = SweepStore(service.db_url)
        self._optuna = ThreadPoolExecutor(1, thread_name_prefix="trainhub-optuna")
        self._storage = None
        self._studies: dict[int, object] = {}
        self._creating: set[int] = set()  # sweeps whose study is being made: the loop leaves them alone
        self._ahead: dict[int, list[tuple[int, int, dict]]] = {}  # sweep id -> [(number, optuna id, params)] asked before a slot freed
        self._ahead_wanted: dict[int, int] = {}  # sweep id -> how many trials later_work keeps asked ahead
        self._importance_due: set[int] = set()  # sweeps whose importance the next quiet pass fits again
        self._rows: dict[int, list[tuple[int, dict]]] = {}  # sweep id -> trial row updates written with the next write
        self._tells: dict[int, list[tuple]] = {}  # sweep id -> outcomes recorded in trial rows, not yet told to Optuna
        self._running: dict[int, list] = {}  # sweep id -> its (trial, job) still running at its last step
        self._later_done = 0.0  # time.monotonic() of the last later_work
        self._loop: PeriodicLoop | None = None
        self.passes = 0
        self.copies = self._make_copies()

    def _make_copies(self) -> StudyCopies | None:
        """The users' own copies of their studies (usercopy.py), where this service has a data dir and homes."""
        dd, launcher = getattr(self.service, "dd", None), getattr(self.service, "launcher", None)
        if not self.user_copies or dd is None or launcher is None:
            return None
        return StudyCopies(dd.root / COPIES_FOLDER, self.storage, lambda user: self.store.list(user, None, 100000, 0)[0],
                           launcher.home_dir, launcher.as_user, self.log)

    def _copy_changed(self, sweep: Sweep) -> None:
        if self.copies is not None:
            self.copies.changed(sweep)

    # -- plumbing ---------------------------------------------------------------------------------
    async def optuna(self, fn, *a, **kw):
        """Run a blocking Optuna call on the controller's own thread."""
        return await asyncio.get_running_loop().run_in_executor(self._optuna, lambda: fn(*a, **kw))

    async def read(self, fn, *a, **kw):
        return await self.service.store.read(fn, *a, **kw)

    async def lookup(self, fn, *a, **kw):
        """A small read (the running sweeps, a sweep's trials and their jobs' states): on the event loop with
        SQLite in WAL mode (``JobStore.lookup``), which saves two thread switches per read on the way from a
        trial's end to the next one's start."""
        return await self.service.store.lookup(fn, *a, **kw)

    async def write(self, fn, *a, **kw):
        return await self.service.store.write(fn, *a, **kw)

    def storage(self):
        """Optuna's RDB storage on the platform database (sync; optuna thread)."""
        if self._storage is None:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            sqlite = self.service.db_url.startswith("sqlite")
            kwargs = {"connect_args": {"timeout": 30}} if sqlite else {"pool_pre_ping": True}
            storage = optuna.storages.RDBStorage(self.service.db_url, engine_kwargs=kwargs)
            if sqlite:
                no_fsync_of_its_own(storage.engine)
            self._storage = storage
        return self._storage

    def _create_study(self, sweep: Sweep):
        import optuna

        check_stored(sweep)
        study = optuna.create_study(storage=self.storage(), study_name=study_name(sweep.id), load_if_exists=True,
                                    direction="minimize" if sweep.mode == "min" else "maximize",
                                    sampler=make_sampler(sweep.settings or {}, sweep.space, sweep.n_trials),
                                    pruner=make_pruner(sweep.settings or {}, sweep.n_trials))
        study.set_user_attr("trainhub_sweep", sweep.key)
        self._studies[sweep.id] = study
        return study

    def _study(self, sweep: Sweep):
        study = self._studies.get(sweep.id)
        if study is None:
            import optuna

            check_stored(sweep)
            study = optuna.load_study(study_name=study_name(sweep.id), storage=self.storage(),
                                      sampler=make_sampler(sweep.settings or {}, sweep.space, sweep.n_trials),
                                      pruner=make_pruner(sweep.settings or {}, sweep.n_trials))
            self._studies[sweep.id] = study
        return study

    async def create(self, caller, spec) -> Sweep:
        """Record a validated sweep and its Optuna study; the loop starts its trials."""
        sweep = await self.write(self.store.create, name=spec.name, user=caller.name, groups=list(caller.groups),
                                 admin=bool(caller.admin), state=RUNNING, reason="starting its first trials",
                                 n_trials=spec.trials, parallel=spec.parallel, metric=spec.metric, mode=spec.mode,
                                 space=spec.space, settings=spec.settings(), job=job_template(spec.job))
        self._creating.add(sweep.id)
        try:
            await self.optuna(self._create_study, sweep)
        except BaseException:
            await self.write(self.store.delete, sweep.id)
            raise
        finally:
            self._creating.discard(sweep.id)
        self._copy_changed(sweep)  # the study is in the user's copy from the start
        self.log.info("sweep %s created by %s: %d trials, %d at a time, %s %s over %s", sweep.key, caller.name,
                      spec.trials, spec.parallel, spec.mode, spec.metric, ", ".join(spec.space))
        self.wake()
        return sweep

    async def cancel(self, sweep: Sweep, by: str) -> Sweep:
        """Stop a sweep: no new trials; its unfinished jobs are cancelled now (the loop ends the sweep
        once they have stopped)."""
        await self.write(self.store.update, sweep.id, only_if_state=(RUNNING,), cancel_requested=True,
                         reason=f"cancelling (requested by {by})")
        trials = await self.read(self.store.trials, sweep.id)
        jobs = await self.read(self.store.jobs, [t.job_id for t in trials if t.job_id])
        for job in jobs.values():
            if job.state not in JOB_TERMINAL:
                await self.write(self.service.store.request_cancel, job.id, by)
        self.service.engine.wake()
        self.wake()
        return await self.read(self.store.get, sweep.id)

    # -- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        try:
            await self.optuna(self.storage)
            await self.reconcile_orphans()
        except Exception:  # the jobs API must come up anyway; the loop retries Optuna on every pass
            self.log.exception("sweeps: Optuna storage on %s not ready; retrying in the loop", self.service.db_url)
        self._loop = PeriodicLoop("trainhub-sweep-controller", self.run_once, lambda: self.tick, self.log)
        self._loop.start()
        self.service.engine.on_job_end(self._job_ended)

    def _job_ended(self, job) -> None:
        """A job's attempt ended (engine callback): a trial's job wakes the loop, which records it and refills its slot."""
        if job.sweep_id is not None:
            self.wake()

    async def stop(self) -> None:
        if self._loop is not None:
            await self._loop.stop()
        self._optuna.shutdown(wait=False, cancel_futures=True)  # never block the loop on a busy database
        if self.copies is not None:
            self.copies.stop()

    def wake(self) -> None:
        if self._loop is not None:
            self._loop.wake()

    async def run_once(self) -> None:
        """One pass: every running sweep records its ended trials and refills the freed slots; then the work no
        job start waits for (see :meth:`later_work`), left to the next pass when this one submitted a trial (so
        that it does not compete with the engine starting it), but never for longer than ``tick``."""
        self.passes += 1
        sweeps = [s for s in await self.lookup(self.store.in_states, RUNNING) if s.id not in self._creating]
        submitted = 0
        for sweep in sweeps:
            try:
                submitted += await self.step(sweep)
            except asyncio.CancelledError:
                raise
            except BrokenSweep as e:
                await self._fail_broken(sweep, str(e))
            except Exception:
                self.log.exception("sweep %s: controller step failed; retrying next tick", sweep.key)
        if submitted and time.monotonic() - self._later_done < self.tick:
            return
        self._later_done = time.monotonic()
        for sweep in sweeps:
            try:
                await self.later_work(sweep)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.log.exception("sweep %s: controller step failed; retrying next tick", sweep.key)

    async def later_work(self, sweep: Sweep) -> None:
        try:
            await self._later_work(sweep)
        finally:
            await self._flush_rows(sweep)

    async def _later_work(self, sweep: Sweep) -> None:
        """What no trial's start waits for: Optuna told the outcomes recorded since (:meth:`_close`), the unfinished
        trials' new values reported (and pruned), the importance fitted again, the next trial asked ahead."""
        running = self._running.pop(sweep.id, None)
        if running is None:
            return  # the sweep ended, or its step failed
        await self._flush_tells(sweep)
        for t, job in running:
            try:
                await self._follow(sweep, t, job)
            except TrainhubError as e:
                self.log.info("sweep %s trial %d: %s", sweep.key, t.number, e.message)
        if sweep.id in self._importance_due:
            self._importance_due.discard(sweep.id)
            await self._update_importance(sweep, await self.lookup(self.store.trials, sweep.id))  # after the flush above
        more = self._ahead_wanted.pop(sweep.id, 0) - len(self._ahead.get(sweep.id, ()))
        if more > 0:
            asked = await self.optuna(self._ask_many, sweep, more)
            self._ahead.setdefault(sweep.id, []).extend(asked)
            self.log.info("sweep %s: asked ahead: %s", sweep.key, ", ".join(f"trial {n} {p}" for n, _, p in asked))

    # -- one sweep ----------------------------------------------------------------------------------
    async def step(self, sweep: Sweep) -> int:
        """Record the trials whose jobs ended and refill the freed slots; returns how many trials it submitted.
        The trials whose jobs still run are followed by :meth:`later_work` (as they are, when it runs)."""
        self._running.pop(sweep.id, None)  # what an earlier pass left for later work is this pass's now
        self._ahead_wanted.pop(sweep.id, None)  # (a sweep cancelled since asks nothing ahead)
        try:
            return await self._step(sweep)
        finally:
            await self._flush_rows(sweep)

    async def _step(self, sweep: Sweep) -> int:
        if sweep.id not in self._studies:
            await self.optuna(self._study, sweep)  # rebuilt on the first pass, so a broken row fails at once
        trials = await self.lookup(self.store.trials, sweep.id)
        jobs = await self.lookup(self.store.jobs, [t.job_id for t in trials if t.job_id])
        completed_before = sum(t.state == COMPLETE for t in trials)
        submitted, running = 0, []
        for t in trials:  # _follow keeps `t` (and, through its answer, `jobs`) up to date: no second read
            job = jobs.get(t.job_id) if t.job_id else None
            if t.state == TRIAL_RUNNING and job is not None and job.state not in JOB_TERMINAL and not sweep.cancel_requested:
                running.append((t, job))
                continue
            was_pending = t.state == PENDING
            try:
                job = await self._follow(sweep, t, job)
            except TrainhubError as e:
                self.log.info("sweep %s trial %d: %s", sweep.key, t.number, e.message)
                continue
            if job is not None:
                jobs[job.id] = job
            submitted += int(was_pending and t.state == TRIAL_RUNNING)
        unfinished = [t for t in trials if t.state not in TRIAL_FINAL
                      or (t.job_id and jobs.get(t.job_id) is not None and jobs[t.job_id].state not in JOB_TERMINAL)]
        if sum(t.state == COMPLETE for t in trials) != completed_before:
            self._importance_due.add(sweep.id)
        if sweep.cancel_requested:
            if not unfinished:
                await self._importance_now(sweep, trials)
            await self._wind_down(sweep, trials, jobs, unfinished)
            return submitted
        stop = failing_fast(trials, min(self.fail_fast, sweep.n_trials))
        if stop:
            await self.write(self.store.update, sweep.id, cancel_requested=True, reason=f"stopping: {stop}")
            sweep.cancel_requested, sweep.reason = True, f"stopping: {stop}"
            await self._wind_down(sweep, trials, jobs, unfinished, final_state=FAILED, final_reason=stop)
            return submitted
        if len(trials) >= sweep.n_trials and not unfinished:
            await self._importance_now(sweep, trials)  # there when the sweep ends
            await self._finish(sweep, trials)
            return submitted
        for _ in range(trials_to_start(sweep.n_trials, sweep.parallel, len(trials), len(unfinished))):
            t = await self._start_trial(sweep)
            if t is None:
                break
            trials.append(t)
            submitted += 1
        self._ahead_wanted[sweep.id] = ahead_allowed(sweep.settings or {}, sweep.n_trials, sweep.parallel, trials)
        self._running[sweep.id] = running
        return submitted

    async def _follow(self, sweep: Sweep, t: SweepTrial, job):
        """Bring one trial up to date with its job (``t`` is updated in place); returns its job as last seen."""
        if t.state == PENDING:
            if sweep.cancel_requested:
                await self._close(sweep, t, TRIAL_CANCELLED, None, "the sweep was cancelled before it started")
                return job
            return await self._submit(sweep, t)
        if t.state in TRIAL_FINAL:
            if job is not None and job.state != t.job_state:
                self._row(sweep, t, job_state=job.state)
            return job
        if job is None:
            await self._close(sweep, t, TRIAL_FAILED, None, f"its job {job_key(t.job_id) if t.job_id else '?'} is gone")
            return job
        points = metric_points(await self.read(self.store.metric_records, job.id), sweep.metric)
        known = {int(s) for s, _ in (t.intermediate or [])}
        new = [(s, v) for s, v in points if s not in known]
        # dedupe steps reported twice: the first value of a step is the one Optuna keeps
        seen, fresh = set(), []
        for s, v in new:
            if s not in seen:
                seen.add(s)
                fresh.append((s, v))
        if job.state in JOB_TERMINAL:  # the last values and the outcome: one Optuna call, one write
            state, value, reason = trial_outcome(job.state, job.reason, job.key, points, sweep.metric,
                                                 sweep.cancel_requested)
            await self._close(sweep, t, state, value, reason, job_state=job.state, fresh=fresh)
            return job
        prune = False
        if fresh:
            may_prune = job.state == RUNNING and not sweep.cancel_requested and not job.cancel_requested
            prune = await self.optuna(self._report, sweep, t.optuna_id, fresh, may_prune)
            t.intermediate = [*(t.intermediate or []), *[[s, v] for s, v in fresh]]
            self._row(sweep, t, intermediate=t.intermediate, job_state=job.state)
        if prune:
            stopped = await self.write(self.service.store.request_cancel, job.id, f"sweep {sweep.key} (pruned)")
            self.service.engine.wake()
            if stopped.state not in JOB_TERMINAL or stopped.state == CANCELLED:
                step, value = fresh[-1]
                await self._close(sweep, t, PRUNED, value,
                                  f"pruned at step {step}: {sweep.metric} = {value:.6g} was worse than the median of "
                                  f"earlier trials at that step; its job {job.key} was stopped", job_state=stopped.state)
                self.log.info("sweep %s: trial %d pruned at step %s (%s=%.6g); cancelling %s", sweep.key, t.number,
                              step, sweep.metric, value, job.key)
                return stopped
            job = stopped
        if job.state in JOB_TERMINAL:
            state, value, reason = trial_outcome(job.state, job.reason, job.key, points, sweep.metric,
                                                 sweep.cancel_requested)
            await self._close(sweep, t, state, value, reason, job_state=job.state)
        elif job.state != t.job_state:
            self._row(sweep, t, job_state=job.state)
        return job

    def _report(self, sweep: Sweep, optuna_id: int, points: list, may_prune: bool) -> bool:
        """Report intermediate values to Optuna; True when the trial should be pruned (optuna thread)."""
        import optuna

        study = self._study(sweep)
        trial = optuna.trial.Trial(study, optuna_id)
        if trial._cached_frozen_trial.state.is_finished():
            return False
        for step, value in points:
            trial.report(value, step)
        return may_prune and trial.should_prune()

    def _tell(self, sweep: Sweep, number: int, state: str, value: float | None, fresh: tuple = (),
              optuna_id: int | None = None) -> None:
        """Tell Optuna a trial's outcome, after its last intermediate values ``fresh`` (optuna thread)."""
        from optuna.trial import TrialState

        if fresh:
            self._report(sweep, optuna_id, list(fresh), False)
        study = self._study(sweep)
        if state == COMPLETE:
            study.tell(number, value, skip_if_finished=True)
        elif state == PRUNED:
            study.tell(number, state=TrialState.PRUNED, skip_if_finished=True)
        else:
            study.tell(number, state=TrialState.FAIL, skip_if_finished=True)

    async def _close(self, sweep: Sweep, t: SweepTrial, state: str, value, reason: str, job_state: str | None = None,
                     fresh: list = ()) -> None:
        """Record a trial's outcome (and its last intermediate values ``fresh``) in its row, written in the same
        transaction as the row of the trial that takes its slot (or at the end of the pass); Optuna is told it by
        :meth:`_flush_tells` before anything depends on it (an ask, the importance, a pruning decision, the sweep's
        end), so a trial asked ahead starts without waiting for the tell. Nothing is lost in a crash before
        either: the job's state and metrics stay in the jobs tables, and the next pass records the trial from
        them again; a row that records an outcome Optuna was not told is told on restart (:meth:`reconcile_orphans`)."""
        fields = dict(state=state, value=value, reason=reason, finished=now_utc())
        if fresh:
            t.intermediate = [*(t.intermediate or []), *[[s, v] for s, v in fresh]]
            fields["intermediate"] = t.intermediate
        if job_state is not None:
            fields["job_state"] = job_state
            t.job_state = job_state
        self._row(sweep, t, **fields)
        t.state, t.value, t.reason = state, value, reason
        self._tells.setdefault(sweep.id, []).append((t.number, t.optuna_id, state, value, tuple(fresh)))
        self.log.info("sweep %s: trial %d %s: %s", sweep.key, t.number, state, reason)

    def _row(self, sweep: Sweep, t: SweepTrial, **fields) -> None:
        """Update trial ``t`` (in memory now; its row with the next trial's row, or at the end of the pass, in one
        transaction with the other rows of the pass)."""
        for k, v in fields.items():
            setattr(t, k, v)
        self._rows.setdefault(sweep.id, []).append((t.id, fields))

    async def _flush_rows(self, sweep: Sweep) -> None:
        """Write the trial outcomes recorded in this pass that no new trial's row took along."""
        rows = self._rows.pop(sweep.id, None)
        if rows:
            await self.write(self.store.record_trials, rows)

    async def _flush_tells(self, sweep: Sweep) -> None:
        """Tell Optuna the outcomes recorded since the last flush (one call on the Optuna thread)."""
        tells = self._tells.pop(sweep.id, None)
        if not tells:
            return
        try:
            await self.optuna(self._tell_all, sweep, tells)
        except BaseException:
            self._tells.setdefault(sweep.id, [])[:0] = tells  # told again later (a tell is idempotent)
            raise
        self._copy_changed(sweep)  # a trial finished: the user's own copy follows

    def _tell_all(self, sweep: Sweep, tells: list) -> None:
        for number, optuna_id, state, value, fresh in tells:
            self._tell(sweep, number, state, value, fresh, optuna_id)

    def _ask_many(self, sweep: Sweep, n: int) -> list[tuple[int, int, dict]]:
        return [self._ask(sweep) for _ in range(n)]

    def _ask(self, sweep: Sweep) -> tuple[int, int, dict]:
        study = self._study(sweep)
        trial = study.ask(to_distributions(sweep.space))
        return trial.number, trial._trial_id, dict(trial.params)

    async def _start_trial(self, sweep: Sweep) -> SweepTrial | None:
        """Record and submit the next trial (the one asked ahead, if any); None when it could not be submitted."""
        ahead = self._ahead[sweep.id].pop(0) if self._ahead.get(sweep.id) else None
        if ahead is None:
            await self._flush_tells(sweep)  # the sampler learns from every outcome recorded so far
        number, optuna_id, params = ahead if ahead is not None else await self.optuna(self._ask, sweep)
        t = await self.write(self.store.record_trials, self._rows.pop(sweep.id, []),
                             dict(sweep_id=sweep.id, number=number, optuna_id=optuna_id, params=params, state=PENDING,
                                  reason="submitting its job"))
        return t if await self._submit(sweep, t) is not None else None

    async def _submit(self, sweep: Sweep, t: SweepTrial):
        """Submit a trial's job (idempotent: the same submit_key returns the job already made); returns the job,
        None when it could not be submitted (the trial is failed and the sweep stops)."""
        from trainhub.services.jobs.spec import JobSpec

        template = dict(sweep.job or {})
        env = dict(template.pop("env", None) or {})
        env.update(TRAINHUB_SWEEP_ID=sweep.key, TRAINHUB_TRIAL_NUMBER=str(t.number))
        spec = JobSpec(**{**template, "name": f"{sweep.name}-t{t.number}"[:128], "env": env, "sweep_id": sweep.id,
                          "params": dict(t.params or {}), "submit_key": f"sweep-{sweep.id}-trial-{t.number}"})
        try:
            job = await self.service.submit(SweepCaller(sweep), spec)
        except TooManyQueued as e:  # the creator's queue is full: the trial waits for room, the sweep goes on
            reason = f"waiting to submit its job: {e.message}"
            if t.reason != reason:
                await self.write(self.store.update_trial, t.id, reason=reason)
                t.reason = reason
                self.log.info("sweep %s: trial %d waits: %s", sweep.key, t.number, e.message)
            return None
        except TrainhubError as e:
            await self._close(sweep, t, TRIAL_FAILED, None, f"its job could not be submitted: {e.message}")
            await self.write(self.store.update, sweep.id, cancel_requested=True,
                             reason=f"stopping: trial {t.number} could not be submitted: {e.message}")
            sweep.cancel_requested = True
            return None
        await self.write(self.store.update_trial, t.id, job_id=job.id, job_state=job.state, state=TRIAL_RUNNING,
                         reason=f"job {job.key} {job.state}")
        t.job_id, t.job_state, t.state = job.id, job.state, TRIAL_RUNNING
        self.log.info("sweep %s: trial %d submitted as %s with %s", sweep.key, t.number, job.key, t.params)
        return job

    async def _wind_down(self, sweep: Sweep, trials, jobs, unfinished, final_state: str = CANCELLED,
                         final_reason: str | None = None) -> None:
        """A cancelled (or failing) sweep: stop its unfinished jobs, end when all have stopped."""
        for t in unfinished:
            job = jobs.get(t.job_id) if t.job_id else None
            if job is not None and job.state not in JOB_TERMINAL and not job.cancel_requested:
                await self.write(self.service.store.request_cancel, job.id, f"sweep {sweep.key}")
                self.service.engine.wake()
        if unfinished:
            return
        if final_reason is None:
            final_reason = sweep.reason.removeprefix("cancelling ").strip("()") if sweep.reason.startswith("cancelling") else "cancelled"
            final_reason = final_reason.replace("requested by", "cancelled by")
        if sweep.reason.startswith("stopping: "):
            final_state, final_reason = FAILED, sweep.reason.removeprefix("stopping: ")
        await self._drop_ahead(sweep)
        await self.write(self.store.update, sweep.id, only_if_state=(RUNNING,), state=final_state,
                         reason=final_reason, finished=now_utc())
        self._studies.pop(sweep.id, None)
        self._copy_changed(sweep)
        self.log.info("sweep %s %s: %s", sweep.key, final_state, final_reason)

    async def _fail_broken(self, sweep: Sweep, reason: str) -> None:
        """End a sweep that cannot be rebuilt, without Optuna: its unfinished jobs are cancelled and
        its unfinished trials closed with the reason, so nothing of it keeps running or retrying."""
        self.log.warning("sweep %s: failed: %s", sweep.key, reason)
        trials = await self.read(self.store.trials, sweep.id)
        jobs = await self.read(self.store.jobs, [t.job_id for t in trials if t.job_id])
        for t in trials:
            job = jobs.get(t.job_id) if t.job_id else None
            if job is not None and job.state not in JOB_TERMINAL and not job.cancel_requested:
                await self.write(self.service.store.request_cancel, job.id, f"sweep {sweep.key}")
            if t.state not in TRIAL_FINAL:
                await self.write(self.store.update_trial, t.id, state=TRIAL_CANCELLED, finished=now_utc(),
                                 reason=f"the sweep failed: {reason}")
        self.service.engine.wake()
        await self.write(self.store.update, sweep.id, only_if_state=(RUNNING,), state=FAILED, reason=reason,
                         cancel_requested=True, finished=now_utc())
        self._ahead.pop(sweep.id, None)  # never asked: a sweep that cannot be rebuilt has no study here
        self._ahead_wanted.pop(sweep.id, None)
        self._tells.pop(sweep.id, None)
        self._running.pop(sweep.id, None)
        self._studies.pop(sweep.id, None)

    async def _finish(self, sweep: Sweep, trials) -> None:
        best = best_trial(trials, sweep.mode)
        counts = {s: sum(t.state == s for t in trials) for s in (COMPLETE, PRUNED, TRIAL_FAILED, TRIAL_CANCELLED)}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        if best is None:
            state, reason = FAILED, f"no trial completed ({summary})"
        else:
            state = COMPLETED
            reason = f"best {sweep.metric} = {best.value:.6g} (trial {best.number}, {job_key(best.job_id)}); {summary}"
        await self._drop_ahead(sweep)
        await self.write(self.store.update, sweep.id, only_if_state=(RUNNING,), state=state, reason=reason, finished=now_utc())
        self._studies.pop(sweep.id, None)
        self._copy_changed(sweep)
        self.log.info("sweep %s %s: %s", sweep.key, state, reason)

    async def _drop_ahead(self, sweep: Sweep) -> None:
        """The sweep ends: Optuna is told every outcome, and a trial asked ahead that no slot will take is failed
        there (no trial row has it)."""
        await self._flush_rows(sweep)
        await self._flush_tells(sweep)
        self._ahead_wanted.pop(sweep.id, None)
        self._importance_due.discard(sweep.id)
        self._running.pop(sweep.id, None)
        for number, _id, _params in self._ahead.pop(sweep.id, []):
            await self.optuna(self._tell, sweep, number, TRIAL_FAILED, None)

    async def _importance_now(self, sweep: Sweep, trials) -> None:
        """The importance, if completed trials came since the last fit (the sweep is about to end)."""
        if sweep.id in self._importance_due:
            self._importance_due.discard(sweep.id)
            await self._flush_tells(sweep)
            await self._update_importance(sweep, trials)

    async def _update_importance(self, sweep: Sweep, trials) -> None:
        n = sum(t.state == COMPLETE for t in trials)
        if not self.importance_min_trials or n < self.importance_min_trials:
            return
        try:
            importance = await self.optuna(self._importance, sweep)
        except Exception as e:  # too few distinct values, a single-valued parameter...
            self.log.info("sweep %s: no parameter importance yet: %s", sweep.key, e)
            return
        await self.write(self.store.update, sweep.id, importance=importance)

    def _importance(self, sweep: Sweep) -> dict:
        import optuna

        evaluator = optuna.importance.PedAnovaImportanceEvaluator()
        values = optuna.importance.get_param_importances(self._study(sweep), evaluator=evaluator)
        return {k: round(float(v), 6) for k, v in values.items()}

    async def reconcile_orphans(self) -> None:
        """After a restart: Optuna is told the outcomes trial rows record that it lacks, and of the Optuna trials left
        RUNNING without a trial row (the service died between an ask, ahead or not, and the record), the first
        ones become the sweep's trials asked ahead again, as many as it still has trials to start (at most
        ``parallel``: so a restart changes no suggestion, a grid keeps its points); the others are failed."""
        for sweep in await self.read(self.store.in_states, RUNNING):
            try:
                rows = {t.number: t for t in await self.read(self.store.trials, sweep.id)}
                adopt = 0 if sweep.cancel_requested else max(0, min(sweep.parallel, sweep.n_trials - len(rows)))
                n, ahead = await self.optuna(self._fail_orphans, sweep, rows, adopt)
                if ahead:
                    self._ahead[sweep.id] = ahead
                    self.log.info("sweep %s: trial(s) %s, asked before the restart, are its next", sweep.key,
                                  ", ".join(str(a[0]) for a in ahead))
                if n:
                    self.log.info("sweep %s: %d Optuna trial(s) asked before a crash and never submitted marked failed", sweep.key, n)
            except BrokenSweep:
                continue  # the loop's first pass fails it with the reason
            except Exception:
                self.log.exception("sweep %s: reconciling after restart failed", sweep.key)

    def _fail_orphans(self, sweep: Sweep, rows: dict, adopt: int) -> tuple[int, list]:
        """Optuna brought up to date with the trial rows after a restart: the outcomes rows record and Optuna was
        not told yet are told (with the intermediate values it lacks); of the trials without a row, the first
        ``adopt`` are adopted as trials asked ahead and the others failed. Returns (orphans failed, the adopted
        [(number, optuna id, params)]) (optuna thread)."""
        from optuna.trial import TrialState

        study = self._study(sweep)
        n, ahead = 0, []
        unfinished = study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
        for ft in unfinished:
            row = rows.get(ft.number)
            if row is not None and row.state in TRIAL_FINAL:
                fresh = [(int(s), v) for s, v in (row.intermediate or []) if int(s) not in ft.intermediate_values]
                self._tell(sweep, ft.number, row.state, row.value, tuple(fresh), ft._trial_id)
        orphans = [ft for ft in unfinished if ft.number not in rows]
        for ft in sorted(orphans, key=lambda ft: ft.number):
            if len(ahead) < adopt and ft.state == TrialState.RUNNING and set(ft.params) == set(sweep.space):
                ahead.append((ft.number, ft._trial_id, dict(ft.params)))
                continue
            study.tell(ft.number, state=TrialState.FAIL, skip_if_finished=True)
            n += 1
        return n, ahead


def job_template(spec) -> dict:
    """The trial job template stored with a sweep (a JobSpec as a dict, without per-trial fields)."""
    d = asdict(spec)
    for k in ("sweep_id", "params", "submit_key"):
        d.pop(k, None)
    return d
