"""Registry database access. Synchronous functions, run on the jobs store's threads.

Writes go through the jobs service's single writer thread (``JobStore.write``) and take
the write lock up front, so two registrations of the same name get distinct version numbers.
"""

from __future__ import annotations

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from trainhub.db import Base, get_engine, write_session
from trainhub.exceptions import Conflict, Forbidden, InvalidRequest, NotFound
from trainhub.services.jobs.store import iso
from trainhub.states import FAILED, PENDING, READY

from .models import STAGES, Dataset, DatasetVersion, Model, ModelVersion, StageEvent


def dataset_version_dict(ds: Dataset, v: DatasetVersion, progress: dict | None = None) -> dict:
    d = {
        "name": ds.name, "version": v.version, "url": v.url, "format": v.format,
        "description": v.description or ds.description, "metadata": v.meta or {}, "owner": ds.owner,
        "created_by": v.created_by, "created": iso(v.created), "status": v.status, "error": v.error or None,
        "size": v.size, "file_count": v.file_count, "fingerprint": v.fingerprint or None,
        "deprecated": v.deprecated, "deprecation_message": v.deprecation_message or None,
    }
    if progress is not None and v.status == PENDING:
        d["progress"] = progress
    return d


def dataset_dict(ds: Dataset, versions: list[DatasetVersion]) -> dict:
    latest = versions[-1] if versions else None
    return {
        "name": ds.name, "owner": ds.owner, "description": ds.description, "created": iso(ds.created),
        "versions": [v.version for v in versions],
        "latest": dataset_version_dict(ds, latest) if latest else None,
        "deprecated": bool(versions) and all(v.deprecated for v in versions),
    }


def model_version_dict(m: Model, v: ModelVersion, history: list[StageEvent] | None = None) -> dict:
    d = {
        "name": m.name, "version": v.version, "owner": m.owner, "url": v.url, "source_url": v.source_url,
        "description": v.description, "metrics": v.metrics or {}, "params": v.params or {},
        "lineage": v.lineage or {}, "files": v.files or [], "size": v.size, "stage": v.stage,
        "status": v.status, "error": v.error or None, "created_by": v.created_by, "created": iso(v.created),
    }
    if history is not None:
        d["stage_history"] = [{"time": iso(e.time), "user": e.user, "from": e.from_stage, "to": e.to_stage,
                               "comment": e.comment} for e in history]
    return d


def model_dict(m: Model, versions: list[ModelVersion]) -> dict:
    stages = {}
    for v in versions:
        if v.stage != "none":
            stages.setdefault(v.stage, []).append(v.version)
    return {
        "name": m.name, "owner": m.owner, "description": m.description, "created": iso(m.created),
        "versions": [v.version for v in versions], "stages": stages,
        "latest": model_version_dict(m, versions[-1]) if versions else None,
    }


class RegistryStore:
    def __init__(self, db_url: str):
        self.db_url = db_url
        self.engine = get_engine(db_url)
        Base.metadata.create_all(self.engine, tables=[t.__table__ for t in (Dataset, DatasetVersion, Model, ModelVersion, StageEvent)])

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    # -- datasets ------------------------------------------------------------------------------
    def list_datasets(self, q: str = "", owner: str | None = None, include_deprecated: bool = True,
                      limit: int = 100, offset: int = 0) -> tuple[list[dict], int]:
        with self.session() as s:
            query = select(Dataset)
            if q:
                like = f"%{q}%"
                query = query.where(or_(Dataset.name.ilike(like), Dataset.description.ilike(like)))
            if owner:
                query = query.where(Dataset.owner == owner)
            total = s.scalar(select(func.count()).select_from(query.subquery()))
            rows = s.scalars(query.order_by(Dataset.name).limit(limit).offset(offset)).all()
            out = []
            for ds in rows:
                vs = self._ds_versions(s, ds.id)
                d = dataset_dict(ds, vs)
                if not include_deprecated and d["deprecated"]:
                    continue
                out.append(d)
            return out, total

    def _ds_versions(self, s, dataset_id) -> list[DatasetVersion]:
        return list(s.scalars(select(DatasetVersion).where(DatasetVersion.dataset_id == dataset_id).order_by(DatasetVersion.version)))

    def _dataset(self, s, name: str) -> Dataset:
        ds = s.scalar(select(Dataset).where(Dataset.name == name))
        if ds is None:
            raise NotFound(f"no dataset named {name!r}")
        return ds

    def get_dataset(self, name: str) -> tuple[Dataset, list[DatasetVersion]]:
        with self.session() as s:
            ds = self._dataset(s, name)
            return ds, self._ds_versions(s, ds.id)

    def get_dataset_version(self, name: str, version: int | str) -> tuple[Dataset, DatasetVersion]:
        with self.session() as s:
            ds = self._dataset(s, name)
            vs = self._ds_versions(s, ds.id)
            return ds, _pick(vs, version, f"dataset {name}")

    def create_dataset_version(self, name: str, caller: str, may_all: bool, **fields) -> tuple[Dataset, DatasetVersion]:
        """A new version (status pending); the dataset is created on first registration."""
        with write_session(self.db_url) as s:
            ds = s.scalar(select(Dataset).where(Dataset.name == name))
            if ds is None:
                ds = Dataset(name=name, owner=caller, description=fields.get("description", ""))
                s.add(ds)
                s.flush()
            elif ds.owner != caller and not may_all:
                raise Forbidden(f"dataset {name!r} belongs to {ds.owner}; only its owner or an admin may add versions")
            n = (s.scalar(select(func.max(DatasetVersion.version)).where(DatasetVersion.dataset_id == ds.id)) or 0) + 1
            v = DatasetVersion(dataset_id=ds.id, version=n, created_by=caller, status=PENDING, **fields)
            s.add(v)
            s.commit()
            return ds, v

    def finish_dataset_scan(self, version_id: int, *, size=0, file_count=0, fingerprint="", error: str = "") -> None:
        with write_session(self.db_url) as s:
            v = s.get(DatasetVersion, version_id)
            if error:
                v.status, v.error = FAILED, error
            else:
                v.status, v.size, v.file_count, v.fingerprint = READY, size, file_count, fingerprint
            s.commit()

    def deprecate_dataset_version(self, name: str, version, caller: str, may_all: bool, deprecated: bool, message: str):
        with write_session(self.db_url) as s:
            ds = self._dataset(s, name)
            if ds.owner != caller and not may_all:
                raise Forbidden(f"only the owner of dataset {name!r} ({ds.owner}) or an admin may deprecate it")
            v = _pick(self._ds_versions(s, ds.id), version, f"dataset {name}")
            v.deprecated = bool(deprecated)
            v.deprecation_message = message if deprecated else ""
            v.deprecated_by = caller if deprecated else None
            s.commit()
            return ds, v

    def pending_dataset_versions(self) -> list[tuple[Dataset, DatasetVersion]]:
        with self.session() as s:
            rows = s.execute(select(Dataset, DatasetVersion).join(DatasetVersion, DatasetVersion.dataset_id == Dataset.id)
                             .where(DatasetVersion.status == PENDING)).all()
            return [(a, b) for a, b in rows]

    # -- models --------------------------------------------------------------------------------
    def list_models(self, q: str = "", stage: str | None = None, limit: int = 100, offset: int = 0):
        with self.session() as s:
            query = select(Model)
            if q:
                like = f"%{q}%"
                query = query.where(or_(Model.name.ilike(like), Model.description.ilike(like)))
            total = s.scalar(select(func.count()).select_from(query.subquery()))
            rows = s.scalars(query.order_by(Model.name).limit(limit).offset(offset)).all()
            out = []
            for m in rows:
                d = model_dict(m, self._m_versions(s, m.id))
                if stage and stage not in d["stages"]:
                    continue
                out.append(d)
            return out, total

    def _m_versions(self, s, model_id) -> list[ModelVersion]:
        return list(s.scalars(select(ModelVersion).where(ModelVersion.model_id == model_id).order_by(ModelVersion.version)))

    def _model(self, s, name: str) -> Model:
        m = s.scalar(select(Model).where(Model.name == name))
        if m is None:
            raise NotFound(f"no model named {name!r}")
        return m

    def get_model(self, name: str):
        with self.session() as s:
            m = self._model(s, name)
            return m, self._m_versions(s, m.id)

    def get_model_version(self, name: str, version):
        """``version``: a number, ``latest``, or a stage name (the newest version in that stage)."""
        with self.session() as s:
            m = self._model(s, name)
            v = _pick_model(self._m_versions(s, m.id), version, name)
            history = list(s.scalars(select(StageEvent).where(StageEvent.version_id == v.id).order_by(StageEvent.id)))
            return m, v, history

    def create_model_version(self, name: str, caller: str, may_all: bool, url_for, **fields):
        with write_session(self.db_url) as s:
            m = s.scalar(select(Model).where(Model.name == name))
            if m is None:
                m = Model(name=name, owner=caller, description=fields.get("description", ""))
                s.add(m)
                s.flush()
            elif m.owner != caller and not may_all:
                raise Forbidden(f"model {name!r} belongs to {m.owner}; only its owner or an admin may add versions")
            n = (s.scalar(select(func.max(ModelVersion.version)).where(ModelVersion.model_id == m.id)) or 0) + 1
            v = ModelVersion(model_id=m.id, version=n, created_by=caller, status=PENDING, url=url_for(n), **fields)
            s.add(v)
            s.commit()
            return m, v

    def finish_model_copy(self, version_id: int, *, files=(), size=0, error: str = "") -> None:
        with write_session(self.db_url) as s:
            v = s.get(ModelVersion, version_id)
            if error:
                v.status, v.error = FAILED, error
            else:
                v.status, v.files, v.size = READY, list(files), size
            s.commit()

    def set_stage(self, name: str, version, stage: str, caller: str, may_all: bool, comment: str = "",
                  exclusive: bool = False):
        if stage not in STAGES:
            raise InvalidRequest(f"unknown stage {stage!r}; choose one of {', '.join(STAGES)}")
        with write_session(self.db_url) as s:
            m = self._model(s, name)
            if m.owner != caller and not may_all:
                raise Forbidden(f"only the owner of model {name!r} ({m.owner}) or an admin may change its stages")
            vs = self._m_versions(s, m.id)
            v = _pick_model(vs, version, name)
            if v.status != READY:
                raise Conflict(f"model {name} version {v.version} is {v.status}; only ready versions change stage")
            changed = []
            if exclusive and stage in ("staging", "production"):
                # the previous holders of this stage are archived, each change audited
                for other in vs:
                    if other.id != v.id and other.stage == stage:
                        changed.append((other, other.stage, "archived"))
            if v.stage != stage:
                changed.append((v, v.stage, stage))
            for ver, old, new in changed:
                ver.stage = new
                s.add(StageEvent(version_id=ver.id, user=caller, from_stage=old, to_stage=new,
                                 comment=comment if ver is v else f"replaced by version {v.version} in {stage}"))
            s.commit()
            return m, v

    def registered_prefixes(self) -> list[str]:
        """Source URLs of every registered model version (kept out of job-output expiry)."""
        with self.session() as s:
            return [u for u in s.scalars(select(ModelVersion.source_url)) if u]


def _pick(versions, version, what: str):
    if not versions:
        raise NotFound(f"{what} has no versions")
    if version in (None, "", "latest"):
        return versions[-1]
    try:
        n = int(str(version).lstrip("v"))
    except ValueError:
        raise InvalidRequest(f"version must be a number or 'latest', got {version!r}") from None
    for v in versions:
        if v.version == n:
            return v
    raise NotFound(f"{what} has no version {n}")


def _pick_model(versions, version, name: str):
    """``version``: a number, ``latest``, or a stage name (the newest version in that stage)."""
    if isinstance(version, str) and version in STAGES[1:]:
        staged = [v for v in versions if v.stage == version]
        if not staged:
            raise NotFound(f"model {name} has no version in stage {version!r}")
        return staged[-1]
    return _pick(versions, version, f"model {name}")


