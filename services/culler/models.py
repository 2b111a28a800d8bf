"""The culler's audit trail: one row per decision about a GPU server, acted on or not."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, DateTime, Integer, String, Text, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from trainhub.db import Base, get_engine, session_factory, write_session
from trainhub.fmt import as_utc
from trainhub.models import utcnow


class CullerEvent(Base):
    __tablename__ = "culler_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    server: Mapped[str] = mapped_column(String(255), default="")
    action: Mapped[str] = mapped_column(String(16))  # none | warn | stop | release | keep
    reason: Mapped[str] = mapped_column(Text)
    devices: Mapped[list] = mapped_column(JSON, default=list)
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    acted: Mapped[bool] = mapped_column(Boolean, default=False)  # the hub call succeeded
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    measurements: Mapped[dict] = mapped_column(JSON, default=dict)

    def to_dict(self) -> dict:
        return {
            "id": self.id, "at": as_utc(self.at).isoformat() if self.at else None, "user": self.user,
            "server": self.server, "action": self.action, "reason": self.reason, "devices": self.devices,
            "dry_run": self.dry_run, "acted": self.acted, "error": self.error, "measurements": self.measurements,
        }


class AuditTrail:
    """Blocking access to ``culler_events``; the service calls it through run_in_executor."""

    def __init__(self, db_url: str):
        self.db_url = db_url
        CullerEvent.__table__.create(get_engine(db_url), checkfirst=True)
        self._session = session_factory(db_url)

    def append(self, rows: list[dict]) -> None:
        if not rows:
            return
        with write_session(self.db_url) as s:
            s.add_all(CullerEvent(**r) for r in rows)

    def list(self, *, user: str | None = None, limit: int = 100, before_id: int | None = None, acted_only=False) -> list[dict]:
        q = select(CullerEvent).order_by(CullerEvent.id.desc()).limit(limit)
        if user:
            q = q.where(CullerEvent.user == user)
        if before_id:
            q = q.where(CullerEvent.id < before_id)
        if acted_only:
            q = q.where(CullerEvent.action != "none")
        with self._session() as s:
            return [e.to_dict() for e in s.scalars(q)]

    def since(self, after: datetime, limit: int = 200_000) -> list[dict]:
        """Rows newer than ``after``, oldest first (the culler learns its users' idle gaps from them at start)."""
        q = select(CullerEvent).where(CullerEvent.at >= after).order_by(CullerEvent.id).limit(limit)
        with self._session() as s:
            return [e.to_dict() for e in s.scalars(q)]

    def prune(self, older_than: datetime) -> int:
        with write_session(self.db_url) as s:
            return s.execute(delete(CullerEvent).where(CullerEvent.at < older_than)).rowcount or 0
