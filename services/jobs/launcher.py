"""The launcher contract: how a back end runs a job's gang of workers.

The engine decides *when* and on *which devices* a job runs; a launcher only starts,
watches, stops and re-finds workers. The local launcher runs processes; the Kubernetes
launcher runs an Indexed Job. Both keep what they need to find the workers again in
``launch_state`` (persisted in the job row), so a service restart can re-adopt them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from traitlets import Instance, Unicode, default
from traitlets.config import LoggingConfigurable

from trainhub.boundary.asuser import AsUser
from trainhub.boundary.isolation import Isolation

from .workdirs import FOLDER as WORKDIRS_FOLDER, WorkdirStore


@dataclass(frozen=True)
class JobView:
    """What a launcher may know about a job (a detached copy of the row)."""

    id: int
    key: str
    user: str
    name: str
    command: str | None
    script: str | None
    workers: int
    gpus: int
    env: dict
    attempt: int
    time_limit: float | None
    params: dict = field(default_factory=dict)
    profile: str | None = None
    workdir: str | None = None  # the SHA-256 of the working directory it was sent with (Launcher.workdir_archive)


@dataclass(frozen=True)
class WorkerStatus:
    rank: int
    running: bool
    exit_code: int | None = None  # set once the worker has ended (negative: killed by signal)
    lost: bool = False  # the worker vanished without an exit status


class Launcher(LoggingConfigurable):
    """Contract. The coroutines must not block the event loop.

    ``launch``, ``poll``, ``terminate`` and ``adopt`` must be overridden; ``job_dir``, ``home_dir``,
    ``cleanup``, ``close`` and ``gpu_targets`` have working defaults. The jobs service constructs
    its launcher with ``data_dir=`` (the platform data dir); ``jobs_dir`` defaults from it.
    """

    data_dir = Unicode(
        help="The platform data dir, given by the jobs service when it builds its launcher. Default: $TRAINHUB_DATA_DIR.",
    )
    jobs_dir = Unicode(
        help="""Local folder holding one sub-folder per job (logs, metrics, outputs). Default: <data_dir>/jobs
        (/var/lib/trainhub/jobs without a data dir).""",
    ).tag(config=True)
    isolation = Instance(
        Isolation, allow_none=True,
        help="""How workers of different users are kept apart on this machine (accounts, sandbox; see
        trainhub.boundary.isolation), given by the jobs service from the platform's configuration. None: workers run as the
        service's account, unsandboxed. The Kubernetes launcher ignores it (pods are isolated by the cluster).""",
    )

    workdir_store = Instance(
        WorkdirStore, help="""Where the working directories sent with jobs are kept (services/jobs/workdirs.py), given by
        the jobs service with its limits. Default: <jobs_dir>/.workdirs with trainhub.workdir's default limits.""",
    )

    @default("workdir_store")
    def _workdir_store_default(self):
        return WorkdirStore(Path(self.jobs_dir) / WORKDIRS_FOLDER)

    def workdir_archive(self, job: JobView) -> Path | None:
        """The archive of the working directory ``job`` was sent with (None: none). A launcher unpacks it as the
        job's working directory before its workers start (trainhub.workdir.unpack): the local one into the job's
        folder as its user, the Kubernetes one in each pod from the job's storage area."""
        return self.workdir_store.path(job.user, job.workdir) if job.workdir else None

    @default("data_dir")
    def _data_dir_default(self):
        return os.environ.get("TRAINHUB_DATA_DIR", "")

    @default("jobs_dir")
    def _jobs_dir_default(self):
        return os.path.join(self.data_dir or "/var/lib/trainhub", "jobs")

    def check(self, spec) -> None:
        """Refuse at submission (raise :class:`~trainhub.exceptions.InvalidRequest`, a 400 naming what to do instead) a
        job spec (``services.jobs.spec.JobSpec``) this back end could not run as asked. Default: none."""

    async def launch(self, job: JobView, devices: list[list[int]], env: dict) -> dict:
        """Start all workers at once (gang); return the launch state to persist.

        ``devices[rank]`` are the device indices of worker ``rank``; ``env`` is the base
        environment (storage, job identity). Raise to fail the launch; nothing may be left running.
        """
        raise NotImplementedError

    async def poll(self, job: JobView, state: dict) -> list[WorkerStatus]:
        raise NotImplementedError

    async def terminate(self, job: JobView, state: dict, grace: float) -> None:
        """SIGTERM (or equivalent) to every worker, then SIGKILL after ``grace`` seconds."""
        raise NotImplementedError

    async def adopt(self, job: JobView, state: dict) -> bool:
        """After a restart: True if the job's workers (running or finished with a status) were found."""
        raise NotImplementedError

    def job_dir(self, job: JobView) -> str:
        """Local folder holding the job's logs, metrics files and outputs: ``<jobs_dir>/<job key>``."""
        return str(Path(self.jobs_dir) / job.key)

    def home_dir(self, user: str) -> str:
        """The ``$HOME`` of ``user``'s workers on this back end; "" (default) leaves it to the back end."""
        return ""

    def as_user(self, user: str) -> AsUser:
        """How the platform acts as ``user`` for their files (the output syncer, checkpoints): with their account
        when the isolation has accounts (blocking: the account may be created). Default: the service's identity."""
        return AsUser.of(self.isolation, user) if self.isolation is not None else AsUser(user, None)

    async def stalled(self, job: JobView, state: dict) -> str | None:
        """Why this running attempt cannot make progress and should go back to the queue (stopped, requeued,
        not counted as a failure), e.g. a gang only partly placed by a cluster scheduler; None: it can.
        Called after each ``poll``. Default: never (local workers start together or fail)."""
        return None

    async def cleanup(self, job: JobView, state: dict) -> None:
        """Drop back-end objects once the job is terminal (files are kept). Default: nothing to drop."""

    async def start(self) -> None:
        """Get ready for the first launch, once the engine has re-adopted what runs (warm pools). Default: nothing."""

    def watch_exits(self, callback) -> None:
        """From now on call ``callback()`` on the event loop as soon as a worker of a running job may have ended, so
        the engine learns of an end without waiting for its next periodic pass. Spurious calls are allowed (the engine
        polls and finds nothing new); a missed one costs only latency. Default: no events (the periodic pass)."""

    async def close(self) -> None:
        """Release watch caches and sessions when the service stops (running jobs keep running). Default: nothing."""

    def gpu_targets(self, devices: list[int]) -> dict:
        """Ledger devices of running jobs -> where a per-pod metrics source finds them
        (``trainhub.metrics.prometheus.GPUTarget``). Default: {} (the devices are this machine's)."""
        return {}
