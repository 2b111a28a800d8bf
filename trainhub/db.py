"""The platform database (SQLite in the data dir by default, any SQLAlchemy URL by config).

Several processes share it (the hub's spawner, the jobs service, the CLI), so SQLite
runs in WAL mode with a busy timeout, and writers that must not race take the write
lock up front (``BEGIN IMMEDIATE``) through :func:`write_session`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker


class Base(DeclarativeBase):
    pass


_engines: dict[tuple[int, str], Engine] = {}


def get_engine(url: str) -> Engine:
    """One engine per URL per process (engines pool connections; a forked child makes its own)."""
    key = (os.getpid(), url)
    engine = _engines.get(key)
    if engine is None:
        if url.startswith("sqlite"):
            engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

            @event.listens_for(engine, "connect")
            def _sqlite_pragmas(dbapi_conn, _record):
                # pysqlite's own transaction handling would defer BEGIN; we issue it ourselves.
                dbapi_conn.isolation_level = None
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA busy_timeout=30000")
                cur.execute("PRAGMA foreign_keys=ON")
                cur.close()

            @event.listens_for(engine, "begin")
            def _sqlite_begin(conn):
                mode = conn.info.pop("begin_mode", "DEFERRED")
                conn.exec_driver_sql(f"BEGIN {mode}")
        else:
            engine = create_engine(url, pool_pre_ping=True)
        _engines[key] = engine
    return engine


def init_db(url: str) -> Engine:
    """Create missing tables (all model modules must be imported first)."""
    from trainhub import models  # noqa: F401  (registers tables)

    engine = get_engine(url)
    # several processes (hub, services, CLI) may create tables at the same moment: take the
    # write lock first, so the check-then-create runs alone instead of failing with "locked"
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            conn.info["begin_mode"] = "IMMEDIATE"
        with conn.begin():
            Base.metadata.create_all(conn)
    return engine


def session_factory(url: str) -> sessionmaker:
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)


@contextlib.contextmanager
def write_session(url: str) -> Iterator[Session]:
    """A session whose transaction holds the database write lock from its first statement.

    Used where read-then-write must be atomic across processes (GPU allocation and the
    quota check that precedes it): SQLite gets ``BEGIN IMMEDIATE``, PostgreSQL a
    transaction-scoped advisory lock.
    """
    engine = get_engine(url)
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            conn.info["begin_mode"] = "IMMEDIATE"
        with conn.begin():
            if engine.dialect.name == "postgresql":
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7342001)")
            with Session(bind=conn, expire_on_commit=False) as session:
                yield session
                session.flush()
