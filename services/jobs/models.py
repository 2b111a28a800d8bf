"""Tables of the jobs service (on the platform database shared with the GPU ledger)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, Text, Boolean, Index
from sqlalchemy.orm import Mapped, mapped_column

from trainhub.db import Base
from trainhub.models import utcnow
from trainhub.states import QUEUED
from trainhub.httpapi import parse_id


def job_key(n: int) -> str:
    return f"j-{n:06d}"


def parse_job_key(key: str) -> int | None:
    return parse_id(key, "j-")


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255))
    user: Mapped[str] = mapped_column(String(255), index=True)
    groups: Mapped[list] = mapped_column(JSON, default=list)
    state: Mapped[str] = mapped_column(String(16), index=True, default=QUEUED)
    reason: Mapped[str] = mapped_column(Text, default="")
    command: Mapped[str | None] = mapped_column(Text, nullable=True)
    script: Mapped[str | None] = mapped_column(Text, nullable=True)
    gpus: Mapped[int] = mapped_column(Integer, default=0)  # per worker
    workers: Mapped[int] = mapped_column(Integer, default=1)
    env: Mapped[dict] = mapped_column(JSON, default=dict)
    time_limit: Mapped[float | None] = mapped_column(Float, nullable=True)
    retries: Mapped[int] = mapped_column(Integer, default=0)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    profile: Mapped[str | None] = mapped_column(String(255), nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    preemptible: Mapped[bool] = mapped_column(Boolean, default=False)
    devices: Mapped[list] = mapped_column(JSON, default=list)  # per worker: [[0], [1]]
    exit_codes: Mapped[list] = mapped_column(JSON, default=list)
    launch_state: Mapped[dict] = mapped_column(JSON, default=dict)  # launcher's own (pids, dirs...)
    outputs_url: Mapped[str] = mapped_column(Text, default="")
    outputs_path: Mapped[str] = mapped_column(Text, default="")
    sweep_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    params: Mapped[dict] = mapped_column(JSON, default=dict)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    started: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    submit_key: Mapped[str | None] = mapped_column(String(255), nullable=True, unique=True)

    __table_args__ = (Index("ix_jobs_user_state", "user", "state"),)

    @property
    def key(self) -> str:
        return job_key(self.id)


#: the kinds of job ``GET /jobs?kind=`` selects (see :class:`JobKind`)
KINDS = ("notebook",)


class JobKind(Base):
    """What a job is, for the kinds a listing selects by (``GET /jobs?kind=notebook``: the Notebook Jobs list of
    JupyterLab asks for a page of these, never scanning a user's other jobs). Written with the job
    (``JobStore.create``); a job of no such kind has no row. Indexed by kind, owner and id (newest first per user),
    and by kind and id (an admin's listing of everyone's)."""

    __tablename__ = "job_kinds"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    user: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(32))

    __table_args__ = (Index("ix_job_kinds_kind_user_job", "kind", "user", "job_id"),
                      Index("ix_job_kinds_kind_job", "kind", "job_id"))


class JobWorkdir(Base):
    """The working directory a job was sent with (trainhub.workdir): its archive, by SHA-256, in the jobs service's
    store (services/jobs/workdirs.py); unpacked as the job's working directory before its workers start."""

    __tablename__ = "job_workdirs"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    files: Mapped[int] = mapped_column(Integer, default=0)
    bytes: Mapped[int] = mapped_column(Integer, default=0)


class JobEvent(Base):
    """What happened to a job and why: the audit trail behind `reason`."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    time: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")


class JobMetric(Base):
    __tablename__ = "job_metrics"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    worker: Mapped[int] = mapped_column(Integer, default=0)
    time: Mapped[float] = mapped_column(Float)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    values: Mapped[dict] = mapped_column(JSON)


class GPUSampleRow(Base):
    __tablename__ = "job_gpu_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    worker: Mapped[int] = mapped_column(Integer)
    device: Mapped[int] = mapped_column(Integer)
    time: Mapped[float] = mapped_column(Float)
    utilization: Mapped[float] = mapped_column(Float)
    memory_used_mb: Mapped[float] = mapped_column(Float)
    simulated: Mapped[bool] = mapped_column(Boolean, default=False)


class MetricOffset(Base):
    """How far each worker's metrics file has been read (so a restart neither loses nor repeats)."""

    __tablename__ = "job_metric_offsets"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    worker: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    offset: Mapped[int] = mapped_column(Integer, default=0)
