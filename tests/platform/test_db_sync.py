"""The platform database's commit durability (trainhub.db: ``PRAGMA synchronous``, ``$TRAINHUB_DB_SYNC``)."""

from __future__ import annotations

import pytest

from trainhub import db


def pragma(url: str, name: str):
    with db.get_engine(url).connect() as c:
        return c.exec_driver_sql(f"PRAGMA {name}").scalar()


def test_wal_and_normal_sync_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv(db.ENV_SYNC, raising=False)
    url = f"sqlite:///{tmp_path}/default.db"
    assert pragma(url, "journal_mode") == "wal"
    assert pragma(url, "synchronous") == 1  # NORMAL: consistent after any crash, no fsync per commit


def test_full_sync_on_request(tmp_path, monkeypatch):
    monkeypatch.setenv(db.ENV_SYNC, "FULL")
    assert pragma(f"sqlite:///{tmp_path}/full.db", "synchronous") == 2


def test_bad_sync_value_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(db.ENV_SYNC, "sometimes")
    with pytest.raises(ValueError, match=r"TRAINHUB_DB_SYNC must be one of normal, full, not 'sometimes'"):
        db.get_engine(f"sqlite:///{tmp_path}/bad.db")
