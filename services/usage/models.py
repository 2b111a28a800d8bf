"""Tables of usage accounting and the advisor (on the platform database)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, DateTime, Float, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from trainhub.db import Base
from trainhub.models import utcnow


class UsageDaily(Base):
    """GPU-seconds per (UTC day, user, holder kind, profile, holder), added to by every sampler pass."""

    __tablename__ = "usage_daily"
    __table_args__ = (UniqueConstraint("day", "user", "kind", "profile", "holder", name="uq_usage_daily_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    day: Mapped[str] = mapped_column(String(10), index=True)  # YYYY-MM-DD (UTC)
    user: Mapped[str] = mapped_column(String(255), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # server | job
    profile: Mapped[str] = mapped_column(String(255), default="")  # "" = none
    holder: Mapped[str] = mapped_column(String(255))
    groups: Mapped[list] = mapped_column(JSON, default=list)  # the user's groups when last written
    allocated_s: Mapped[float] = mapped_column(Float, default=0.0)
    used_s: Mapped[float] = mapped_column(Float, default=0.0)
    measured_s: Mapped[float] = mapped_column(Float, default=0.0)
    updated: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class UsageState(Base):
    """Small key/value state of the sampler: how far accounting has got (survives restarts)."""

    __tablename__ = "usage_state"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[float] = mapped_column(Float)


class JobDiagnosis(Base):
    """The advisor's latest diagnoses of a job (kept after it ends, so `trainhub jobs why` can tell)."""

    __tablename__ = "usage_job_diagnoses"

    job_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    updated: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    body: Mapped[dict] = mapped_column(JSON, default=dict)
