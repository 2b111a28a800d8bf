"""The table of notebook schedules (on the platform database, beside the jobs)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, DateTime, Float, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from trainhub.db import Base
from trainhub.models import utcnow


class NotebookSchedule(Base):
    __tablename__ = "notebook_schedules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    groups: Mapped[list] = mapped_column(JSON, default=list)  # the owner's groups when it was made (until the hub says)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    name: Mapped[str] = mapped_column(String(255))
    schedule: Mapped[str] = mapped_column(String(255))  # five-field cron expression
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    spec: Mapped[dict] = mapped_column(JSON)  # the POST /jobs spec each run submits
    notebook: Mapped[dict] = mapped_column(JSON, default=dict)  # input, parameters, output_formats (for the lists)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # the schedule clock up to which due runs were looked at: a run due after it and at or before "now" fires
    checked: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_due: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)  # the latest due run, fired or not
    last_job: Mapped[int | None] = mapped_column(Integer, nullable=True)
    runs: Mapped[int] = mapped_column(Integer, default=0)  # runs submitted
    missed: Mapped[int] = mapped_column(Integer, default=0)  # due runs not submitted (missed while down, or refused)
    message: Mapped[str] = mapped_column(Text, default="")  # the latest problem, in words; "" when the last run started


class ScheduleClock(Base):
    """The schedule clock's offset from real time (one row, ``id`` 1): an admin's ``POST /schedule-clock`` moved it
    forward; kept here so a restart of the jobs service keeps it (a due time already passed is never owed again)."""

    __tablename__ = "notebook_schedule_clock"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    offset_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    moved: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
