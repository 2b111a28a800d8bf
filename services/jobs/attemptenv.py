"""What the engine gives every worker of an attempt: its environment, its storage area and the
checkpoint it resumes from.

The launchers add the per-worker part (ranks, devices, ``OMP_NUM_THREADS``; see
:mod:`trainhub.distenv`); the engine decides when an attempt starts and records what it started.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from trainhub.distenv import job_env
from trainhub.boundary import userenv
from trainhub.boundary.asuser import platform_tree, storage_tree
from trainhub.jobarea import (CHECKPOINTS, JOB_URL_VAR, RESUME_STEP_VAR, RESUME_URL_VAR, CheckpointInfo, area_url,
                              checkpoints_named, latest_checkpoint)
from trainhub.boundary.procs import INSTANCE_VAR
from trainhub.storage import StorageConfig

from .launcher import JobView, Launcher


class AttemptEnv:
    """Attempts' environments, from the launcher's folders and homes and the platform's storage (one per engine)."""

    def __init__(self, launcher: Launcher, storage: StorageConfig):
        self.launcher, self.storage = launcher, storage

    def base(self, job: JobView, retries: int, api_url: str = "") -> dict:
        """Every worker's variables for ``job``'s attempt ``job.attempt`` (``retries``: the job's retry budget)."""
        env = {
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", os.defpath),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "TRAINHUB_JOB_ID": job.key,
            "TRAINHUB_JOB_NAME": job.name,
            "TRAINHUB_USER": job.user,
            "TRAINHUB_PARAMS": json.dumps(job.params or {}),
            "TRAINHUB_JOB_ATTEMPT": str(job.attempt),
            INSTANCE_VAR: os.environ.get(INSTANCE_VAR, ""),
            **job_env(key=job.key, attempt=job.attempt, retries=retries),
        }
        if job.profile:
            env["TRAINHUB_PROFILE"] = job.profile
        home = self.launcher.home_dir(job.user)
        if home:
            env["HOME"] = home
            # the user's own packages (pip install [--user] in a terminal or a notebook): trainhub.boundary.userenv
            env.update(userenv.job_env(os.path.realpath(home), env))
        if api_url:
            env["TRAINHUB_API_URL"] = api_url
        if self.storage.url:
            env.update(self.storage.env_for(job.user))
        area = self.area_url(job)
        if area:
            env[JOB_URL_VAR] = area  # results and checkpoints (trainhub.jobarea)
        return env

    def area_url(self, job: JobView) -> str | None:
        """The job's storage area (trainhub.jobarea): its outputs_url on the platform's storage, else its folder."""
        return area_url(self.storage.user_url(job.user) if self.storage.url else None, job.key,
                        self.launcher.job_dir(job))

    async def resume_point(self, job: JobView, env: dict) -> CheckpointInfo | None:
        """The newest checkpoint the job saved in its storage area (``None``: none); raises when the area
        cannot be read (the engine says so in an event and starts afresh)."""
        url = env.get(JOB_URL_VAR)
        if not url:
            return None
        if self.storage.url and self.storage.is_local and url.startswith(self.storage.root().rstrip("/") + "/"):
            return await asyncio.to_thread(self._latest_local, url)
        if "://" not in url or url.startswith("file://"):  # the job's own folder (no storage): the user's part of it
            return await asyncio.to_thread(self._latest_in_job_dir, job, url)
        return await asyncio.to_thread(latest_checkpoint, url, self.storage.storage_options(job.user))

    def _latest_local(self, url: str) -> CheckpointInfo | None:
        """Listed as the area's owner through descriptors (trainhub.boundary): a link there is never followed."""
        try:
            tree, rel = storage_tree(self.storage, self.launcher.isolation, self.storage.strip(url))
        except FileNotFoundError:  # no area yet: nothing saved
            return None
        with tree:
            found = checkpoints_named(url, tree.names(f"{rel}/{CHECKPOINTS}" if rel else CHECKPOINTS))
        return found[-1] if found else None

    def _latest_in_job_dir(self, job: JobView, url: str) -> CheckpointInfo | None:
        """No storage: the area is the job's folder, the platform's (a job writes there only when nothing isolates
        it); listed through descriptors all the same."""
        with platform_tree(url.removeprefix("file://")) as tree:
            found = checkpoints_named(url, tree.names(CHECKPOINTS))
        return found[-1] if found else None


def resume_vars(checkpoint: CheckpointInfo) -> dict:
    """The variables that offer ``checkpoint`` to an attempt."""
    return {RESUME_URL_VAR: checkpoint.url, RESUME_STEP_VAR: str(checkpoint.step)}
