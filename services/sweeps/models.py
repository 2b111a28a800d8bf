"""Tables of sweeps (on the platform database, next to the jobs and Optuna's own tables).

A sweep row holds the spec and the outcome; a trial row links an Optuna trial (number and id
in the study ``trainhub-sweep-<id>``) to the job that runs it. Everything the controller needs
to carry on after a restart is here or in Optuna's storage.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from trainhub.db import Base
from trainhub.models import utcnow
from trainhub.states import PENDING, RUNNING
from trainhub.httpapi import parse_id


def sweep_key(n: int) -> str:
    return f"s-{n:06d}"


def parse_sweep_key(key: str) -> int | None:
    return parse_id(key, "s-")


def study_name(sweep_id: int) -> str:
    return f"trainhub-sweep-{sweep_id}"


class Sweep(Base):
    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255))
    user: Mapped[str] = mapped_column(String(255), index=True)
    groups: Mapped[list] = mapped_column(JSON, default=list)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)  # the creator's admin flag (profile checks)
    state: Mapped[str] = mapped_column(String(16), index=True, default=RUNNING)
    reason: Mapped[str] = mapped_column(Text, default="")
    n_trials: Mapped[int] = mapped_column(Integer)
    parallel: Mapped[int] = mapped_column(Integer)
    metric: Mapped[str] = mapped_column(String(128))
    mode: Mapped[str] = mapped_column(String(8))
    space: Mapped[dict] = mapped_column(JSON)
    settings: Mapped[dict] = mapped_column(JSON, default=dict)  # sampler, pruner, seed, startup_trials, prune_after
    job: Mapped[dict] = mapped_column(JSON)  # the trial job template (a job spec)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    importance: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # {param: share}, once enough trials completed
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    finished: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    @property
    def key(self) -> str:
        return sweep_key(self.id)


class SweepTrial(Base):
    __tablename__ = "sweep_trials"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)  # Optuna's trial number in the sweep's study
    optuna_id: Mapped[int] = mapped_column(Integer)  # Optuna's trial id (storage-wide)
    state: Mapped[str] = mapped_column(String(16), default=PENDING)
    reason: Mapped[str] = mapped_column(Text, default="")
    params: Mapped[dict] = mapped_column(JSON, default=dict)
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    job_state: Mapped[str | None] = mapped_column(String(16), nullable=True)  # last seen state of its job
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    intermediate: Mapped[list] = mapped_column(JSON, default=list)  # [[step, value], ...] reported to Optuna
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    __table_args__ = (UniqueConstraint("sweep_id", "number", name="uq_sweep_trial_number"),)
