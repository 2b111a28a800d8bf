"""Tables of the dataset and model registries (on the platform database, beside the jobs)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from trainhub.db import Base
from trainhub.models import utcnow
from trainhub.states import PENDING

STAGES = ("none", "staging", "production", "archived")


class Dataset(Base):
    __tablename__ = "registry_datasets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    owner: Mapped[str] = mapped_column(String(255), index=True)
    description: Mapped[str] = mapped_column(Text, default="")
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class DatasetVersion(Base):
    """Immutable once written, except for deprecation and the scan's own progress fields."""

    __tablename__ = "registry_dataset_versions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("registry_datasets.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    url: Mapped[str] = mapped_column(Text)  # full fsspec URL of the prefix
    format: Mapped[str] = mapped_column(String(64), default="")
    description: Mapped[str] = mapped_column(Text, default="")
    meta: Mapped[dict] = mapped_column(JSON, default=dict)
    created_by: Mapped[str] = mapped_column(String(255))
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    status: Mapped[str] = mapped_column(String(16), default=PENDING)
    error: Mapped[str] = mapped_column(Text, default="")
    size: Mapped[int] = mapped_column(BigInteger, default=0)
    file_count: Mapped[int] = mapped_column(Integer, default=0)
    fingerprint: Mapped[str] = mapped_column(String(64), default="")
    deprecated: Mapped[bool] = mapped_column(Boolean, default=False)
    deprecation_message: Mapped[str] = mapped_column(Text, default="")
    deprecated_by: Mapped[str | None] = mapped_column(String(255), nullable=True)

    __table_args__ = (UniqueConstraint("dataset_id", "version", name="uq_dataset_version"),)


class Model(Base):
    __tablename__ = "registry_models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    owner: Mapped[str] = mapped_column(String(255), index=True)
    description: Mapped[str] = mapped_column(Text, default="")
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ModelVersion(Base):
    """A registered model version: an immutable copy of files plus metadata. Only ``stage`` changes."""

    __tablename__ = "registry_model_versions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("registry_models.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    url: Mapped[str] = mapped_column(Text, default="")  # <root>/models/<name>/v<N>
    source_url: Mapped[str] = mapped_column(Text, default="")
    description: Mapped[str] = mapped_column(Text, default="")
    metrics: Mapped[dict] = mapped_column(JSON, default=dict)
    params: Mapped[dict] = mapped_column(JSON, default=dict)
    lineage: Mapped[dict] = mapped_column(JSON, default=dict)  # {"job", "sweep", "datasets": [{"name","version"}]}
    files: Mapped[list] = mapped_column(JSON, default=list)  # [{"path", "size"}]
    size: Mapped[int] = mapped_column(BigInteger, default=0)
    stage: Mapped[str] = mapped_column(String(16), default="none")
    status: Mapped[str] = mapped_column(String(16), default=PENDING)
    error: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(255))
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (UniqueConstraint("model_id", "version", name="uq_model_version"),)


class StageEvent(Base):
    """Audit trail of stage promotions: who moved which version where, and when."""

    __tablename__ = "registry_stage_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("registry_model_versions.id", ondelete="CASCADE"), index=True)
    time: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    user: Mapped[str] = mapped_column(String(255))
    from_stage: Mapped[str] = mapped_column(String(16))
    to_stage: Mapped[str] = mapped_column(String(16))
    comment: Mapped[str] = mapped_column(Text, default="")
