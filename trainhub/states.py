"""The states of jobs, sweeps and trials: the one list every part uses.

The jobs service stores them, the client and the CLI wait on them, the kernel side colours them
and the sweep controller maps job outcomes to trial outcomes. Import from here; no other module
spells a state list.

Jobs: ``queued -> running -> succeeded | failed | cancelled | lost`` (``lost``: the job's
processes or pods vanished without an exit status). Sweeps: ``running -> completed | failed |
cancelled``. Trials: ``pending`` (asked, job not yet recorded) ``-> running`` (its job is queued
or running) ``-> complete | pruned | failed | cancelled``. Registry versions (datasets, models):
``pending -> ready | failed``.
"""

from __future__ import annotations

# -- jobs ---------------------------------------------------------------------------------------
QUEUED = "queued"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
LOST = "lost"

JOB_STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED, LOST)
JOB_ACTIVE = frozenset({QUEUED, RUNNING})
JOB_TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED, LOST})
#: a queued job's reason until a scheduling pass has given it its own
SUBMITTED_REASON = "waiting for the scheduler's next pass"

# -- sweeps -------------------------------------------------------------------------------------
COMPLETED = "completed"

SWEEP_STATES = (RUNNING, COMPLETED, FAILED, CANCELLED)
SWEEP_TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED})

# -- trials of a sweep --------------------------------------------------------------------------
PENDING = "pending"
COMPLETE = "complete"
PRUNED = "pruned"
# the same words as a job's, named for the trial they describe
TRIAL_RUNNING, TRIAL_FAILED, TRIAL_CANCELLED = RUNNING, FAILED, CANCELLED

TRIAL_STATES = (PENDING, TRIAL_RUNNING, COMPLETE, PRUNED, TRIAL_FAILED, TRIAL_CANCELLED)
TRIAL_FINAL = frozenset({COMPLETE, PRUNED, TRIAL_FAILED, TRIAL_CANCELLED})


# -- versions in the dataset and model registries ------------------------------------------------
# pending (the size/count scan or the file copy runs) -> ready | failed
READY = "ready"

VERSION_STATUSES = (PENDING, READY, FAILED)


def job_is_terminal(job: dict) -> bool:
    """True when the job (an API dict) has ended: succeeded, failed, cancelled or lost."""
    return job.get("state") in JOB_TERMINAL


def sweep_is_terminal(sweep: dict) -> bool:
    """True when the sweep (an API dict) has ended: completed, failed or cancelled."""
    return sweep.get("state") in SWEEP_TERMINAL
