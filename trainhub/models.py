"""Tables of the core: the GPU ledger.

Services add their own tables on the same :class:`trainhub.db.Base`.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import DateTime, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from trainhub.db import Base


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class GPUAllocation(Base):
    """One row per held device; the primary key makes double allocation impossible."""

    __tablename__ = "gpu_allocations"

    device: Mapped[int] = mapped_column(Integer, primary_key=True)
    holder: Mapped[str] = mapped_column(String(255), index=True)  # "server:alice/" or "job:42"
    kind: Mapped[str] = mapped_column(String(16))  # "server" | "job"
    user: Mapped[str] = mapped_column(String(255), index=True)
    profile: Mapped[str | None] = mapped_column(String(255), nullable=True)
    since: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pid_started: Mapped[float | None] = mapped_column(nullable=True)


class GPUAllocationRecord(Base):
    """History of every allocation (kept after release): the basis of usage accounting."""

    __tablename__ = "gpu_allocation_history"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    device: Mapped[int] = mapped_column(Integer)
    holder: Mapped[str] = mapped_column(String(255), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    user: Mapped[str] = mapped_column(String(255), index=True)
    profile: Mapped[str | None] = mapped_column(String(255), nullable=True)
    start: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    end: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True, index=True)
