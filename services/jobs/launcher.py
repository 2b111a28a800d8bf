"""The launcher contract: how a back end runs a job's gang of workers.

The engine decides *when* and on *which devices* a job runs; a launcher only starts,
watches, stops and re-finds workers. The local launcher runs processes; the Kubernetes
launcher runs an Indexed Job. Both keep what they need to find the workers again in
``launch_state`` (persisted in the job row), so a service restart can re-adopt them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from traitlets.config import LoggingConfigurable


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


@dataclass(frozen=True)
class WorkerStatus:
    rank: int
    running: bool
    exit_code: int | None = None  # set once the worker has ended (negative: killed by signal)
    lost: bool = False  # the worker vanished without an exit status


class Launcher(LoggingConfigurable):
    """Contract. All methods are coroutines and must not block the event loop."""

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
        """Local folder holding the job's logs, metrics files and outputs."""
        raise NotImplementedError

    async def cleanup(self, job: JobView, state: dict) -> None:
        """Drop back-end objects once the job is terminal (files are kept)."""
