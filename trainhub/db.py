"""The platform database (SQLite in the data dir by default, any SQLAlchemy URL by config).

Several processes share it (the hub's spawner, the jobs service, the CLI), so SQLite
runs in WAL mode with a busy timeout, and writers that must not race take the write
lock up front (``BEGIN IMMEDIATE``) through :func:`write_session`.

A locked database (a long writer, a backup, someone's ``sqlite3`` shell) never turns into an
HTTP 500 or a lost write: taking the write lock is retried with :mod:`trainhub.backoff` for up to
``$TRAINHUB_DB_LOCK_TIMEOUT`` seconds (default 120), then :class:`DatabaseBusy` (503, "try
again") is raised; nothing was written.

Commits do not wait for the disk (``PRAGMA synchronous=NORMAL``, SQLite's advice for WAL): an
fsync per commit cost a submission 3-9 ms here, and a job start takes three commits. The database
stays consistent through any crash; a power loss or OS crash (not a process crash) may lose the
last transactions before it. ``$TRAINHUB_DB_SYNC=full`` makes every commit durable at once.

A short write made on an event loop (a job's start, a submission) must never wait for another writer:
inside :func:`no_waiting`, a write transaction takes SQLite's write lock at once or raises
:class:`WriteLockTaken` before anything is written, and the caller makes it on a worker thread instead
(:func:`write_now` does both).

The files are the platform's alone (0600: they hold
password hashes and jobs' environment values): see ``trainhub.settings.secure_file``.

A damaged SQLite file (not a database, truncated, corrupt pages) is :class:`DatabaseDamaged` wherever it is met (an
engine of :func:`get_engine`, :class:`SQLiteReader`, :func:`check_database`), never a raw driver traceback: its
message, built once here, names the file and how to restore it; the CLI prints it, ``trainhub up`` refuses to start
with it, and a service meeting it at start (:func:`init_db`) logs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import shlex
import sqlite3
import threading
import time
from collections import namedtuple
from pathlib import Path
from typing import Iterator

from sqlalchemy import bindparam, create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from trainhub.backoff import Backoff, WaitTimeout
from trainhub.exceptions import TrainhubError

log = logging.getLogger("trainhub.db")

ENV_LOCK_TIMEOUT = "TRAINHUB_DB_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT = 120.0
ENV_SYNC = "TRAINHUB_DB_SYNC"
SYNC_MODES = ("normal", "full")


def sync_mode() -> str:
    """SQLite's ``synchronous`` for the platform database (``$TRAINHUB_DB_SYNC``: normal, the default, or full)."""
    value = os.environ.get(ENV_SYNC, "normal").strip().lower() or "normal"
    if value not in SYNC_MODES:
        raise ValueError(f"${ENV_SYNC} must be one of {', '.join(SYNC_MODES)}, not {value!r}")
    return value


#: what a new, empty file in place of a damaged one loses, by file name (trainhub.settings.DataDir names them)
WHAT_IS_LOST = {
    "trainhub.sqlite": "the GPU ledger is rebuilt (devices are taken again as servers and jobs start), but the records "
                       "of jobs and sweeps (state, events, metrics), the model and dataset registry and the usage history "
                       "are lost and cannot be rebuilt; move the jobs/ folder beside it aside as well (the old jobs' logs "
                       "and outputs stay in it): a new database numbers jobs from 1 again",
    "jupyterhub.sqlite": "users, groups, the passwords of built-in logins and API tokens are lost; `trainhub up` creates "
                         "the admin again (its password stays in secrets/admin-password), add the others again with "
                         "`trainhub users add`",
}
SQLITE_CORRUPT, SQLITE_NOTADB, SQLITE_IOERR_READ = 11, 26, 266  # sqlite3.h


def is_damaged(error: BaseException) -> bool:
    """Is ``error`` (sqlite3's, or SQLAlchemy's around it) about the file itself: "file is not a database",
    "database disk image is malformed" (truncated, corrupt pages), a failed read? Not a locked database, a missing
    table or a constraint: those are ``OperationalError``/``IntegrityError``, subclasses of the same DatabaseError."""
    orig = getattr(error, "orig", error)
    if not isinstance(orig, sqlite3.DatabaseError):
        return False
    code = getattr(orig, "sqlite_errorcode", None)
    if code is None:
        return type(orig) is sqlite3.DatabaseError  # SQLITE_CORRUPT and SQLITE_NOTADB are raised as it exactly
    return code & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB) or code == SQLITE_IOERR_READ


class DatabaseDamaged(RuntimeError):
    """A database file of the platform is damaged or unreadable. The message says which file, what is wrong and how to
    restore it: stop the platform, move the file aside, restore a backup or let `trainhub up` make a new one (and what
    that loses). Not a :class:`TrainhubError`: an API request meeting it is a 500 for its caller (the admin's steps and
    paths are for the service's log, where it is logged with its traceback)."""

    def __init__(self, path, error: BaseException | str = ""):
        self.path = os.path.abspath(path) if path else ""
        detail = str(getattr(error, "orig", error) or "").strip()
        lost = WHAT_IS_LOST.get(os.path.basename(self.path), "everything it held is lost")
        if self.path:
            aside = shlex.quote(os.path.join(os.path.dirname(self.path), "damaged"))
            move = f"mkdir -p {aside} && mv {shlex.quote(self.path)}* {aside}/"
        else:
            move = "move the damaged file aside with its -wal and -shm files"
        super().__init__(
            f"the database {self.path or 'of the platform'} is damaged or unreadable{f' ({detail})' if detail else ''}.\n"
            "To restore it:\n"
            "  1. stop the platform if it runs (Ctrl-C on `trainhub up`);\n"
            f"  2. move the file aside with its -wal and -shm files: {move}\n"
            f"  3. copy a backup of it to {self.path or 'its place'}, or let `trainhub up` create a new, empty one.\n"
            f"     A new one: {lost}.")
        self.message = str(self)


def check_database(path) -> None:
    """Read the whole SQLite file ``path`` (``PRAGMA quick_check``: every page and record, not the indexes' contents;
    about 0.5 s per 150 MiB); :class:`DatabaseDamaged` if it is damaged or unreadable. A missing file is fine (it is
    created on the next start) and is not created here."""
    if not os.path.exists(path):
        return
    try:
        con = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=rw", uri=True, timeout=30)
        try:
            problems = [row[0] for row in con.execute("PRAGMA quick_check")]
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        if is_damaged(e):
            raise DatabaseDamaged(path, e) from None
        raise
    if problems != ["ok"]:
        raise DatabaseDamaged(path, "; ".join(map(str, problems[:3])))


def sqlite_file(url: str) -> str | None:
    """The file of a SQLite URL; None for another database or an in-memory one."""
    u = make_url(url)
    return u.database if u.get_backend_name() == "sqlite" and u.database not in (None, "", ":memory:") else None


def find_damaged(paths) -> DatabaseDamaged | None:
    """The first of ``paths`` (SQLite files) found damaged, as its error; None when all read whole."""
    for path in paths:
        try:
            check_database(path)
        except DatabaseDamaged as e:
            return e
        except sqlite3.Error:
            continue
    return None


class DatabaseBusy(TrainhubError):
    """The platform database stayed locked by another writer for the whole lock timeout."""

    status_code = 503
    reason = "busy"


def lock_timeout() -> float:
    """Seconds a writer waits for the database's write lock in all (``$TRAINHUB_DB_LOCK_TIMEOUT``, default 120)."""
    try:
        return max(float(os.environ.get(ENV_LOCK_TIMEOUT, DEFAULT_LOCK_TIMEOUT)), 0.0)
    except ValueError:
        return DEFAULT_LOCK_TIMEOUT


class WriteLockTaken(Exception):
    """A write in :func:`no_waiting` would have had to wait (another writer holds the lock, or this database's
    commits wait for the disk); nothing was written."""


_NO_WAIT = contextvars.ContextVar("trainhub_db_no_wait", default=False)


@contextlib.contextmanager
def no_waiting() -> Iterator[None]:
    """Write transactions opened in this block take the write lock at once or raise :class:`WriteLockTaken` (no
    retry, no SQLite busy handler): for a write of a few statements on an event loop. Only SQLite with commits that
    do not wait for the disk (``synchronous=NORMAL``) writes here at all; any other database raises at once."""
    token = _NO_WAIT.set(True)
    try:
        yield
    finally:
        _NO_WAIT.reset(token)


async def write_now(fn, inline: bool, executor=None):
    """``fn()``, a short write (a few statements in write transactions) that a caller on an event loop awaits: run
    on the loop where ``inline`` says the databases it writes are local SQLite and the write lock is free at once
    (:func:`no_waiting`), else in ``executor`` (None: the loop's default). On a worker thread each statement waits
    for the GIL while the loop serves other requests: a few ms instead of one on a request's way. ``fn`` must be safe
    to run again (a first try may have committed a first transaction before it found the lock taken)."""
    if inline:
        try:
            with no_waiting():
                return fn()
        except WriteLockTaken:
            pass
    return await asyncio.get_running_loop().run_in_executor(executor, fn)


def _busy_ms() -> int:
    """SQLite's own busy wait (ms); write transactions retry beyond it up to lock_timeout()."""
    return int(min(lock_timeout(), 5.0) * 1000)


def is_locked(error: BaseException) -> bool:
    """SQLite's "database is locked" / "database table is locked" (SQLITE_BUSY, SQLITE_LOCKED)."""
    text = str(getattr(error, "orig", error)).lower()
    return isinstance(error, OperationalError) and ("locked" in text or "busy" in text)


class Base(DeclarativeBase):
    pass


_engines: dict[tuple[int, str], Engine] = {}


def get_engine(url: str) -> Engine:
    """One engine per URL per process (engines pool connections; a forked child makes its own)."""
    key = (os.getpid(), url)
    engine = _engines.get(key)
    if engine is None:
        if url.startswith("sqlite"):
            busy_ms = _busy_ms()
            sync = sync_mode().upper()
            engine = create_engine(url, connect_args={"timeout": busy_ms / 1000, "check_same_thread": False})

            @event.listens_for(engine, "connect")
            def _sqlite_pragmas(dbapi_conn, _record):
                # pysqlite's own transaction handling would defer BEGIN; we issue it ourselves.
                dbapi_conn.isolation_level = None
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute(f"PRAGMA busy_timeout={busy_ms}")
                cur.execute(f"PRAGMA synchronous={sync}")
                cur.execute("PRAGMA foreign_keys=ON")
                cur.close()

            @event.listens_for(engine, "begin")
            def _sqlite_begin(conn):
                mode = conn.info.pop("begin_mode", "DEFERRED")
                conn.exec_driver_sql(f"BEGIN {mode}")

            path = engine.url.database

            @event.listens_for(engine, "handle_error")
            def _sqlite_damaged(context):
                # every statement and connection of the engine, its set-up's PRAGMAs included
                if path not in (None, "", ":memory:") and is_damaged(context.original_exception):
                    raise DatabaseDamaged(path, context.original_exception) from context.sqlalchemy_exception
        else:
            engine = create_engine(url, pool_pre_ping=True)
        _engines[key] = engine
    return engine


def init_db(url: str) -> Engine:
    """Create missing tables (all model modules must be imported first)."""
    from trainhub import models  # noqa: F401  (registers tables)

    engine = get_engine(url)
    try:
        # several processes (hub, services, CLI) may create tables at the same moment: take the
        # write lock first, so the check-then-create runs alone instead of failing with "locked"
        conn, trans = _begin_write(engine, url)
        try:
            Base.metadata.create_all(conn)
            trans.commit()
        finally:
            conn.close()
    except DatabaseDamaged as e:
        # a service starting on it says so in its log (the CLI prints the error itself: trainhub.cli filters this)
        log.error("%s", e, extra={"database_damaged": True})
        raise
    return engine


def session_factory(url: str) -> sessionmaker:
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)


def _begin_write(engine: Engine, url: str) -> tuple[Connection, object]:
    """A connection in a transaction that holds the write lock; a locked database is retried with backoff
    (in :func:`no_waiting`: WriteLockTaken at once)."""
    no_wait = _NO_WAIT.get()
    if no_wait and (engine.dialect.name != "sqlite" or sync_mode() != "normal"):
        raise WriteLockTaken(f"writes to {engine.dialect.name} with synchronous={sync_mode()} may wait")
    pause = Backoff(f"the write lock of {url}", start=0.05, factor=2.0, cap=2.0, jitter=0.2, timeout=lock_timeout())
    while True:
        conn = engine.connect()
        try:
            if engine.dialect.name == "sqlite":
                conn.info["begin_mode"] = "IMMEDIATE"
                if no_wait:
                    _set_busy(conn, 0)
            trans = conn.begin()
            if engine.dialect.name == "postgresql":
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7342001)")
            return conn, trans
        except OperationalError as e:
            _close(conn)
            if not is_locked(e):
                raise
            if no_wait:
                raise WriteLockTaken(f"the write lock of {url} is taken") from e
            try:
                delay = pause.next_delay()
            except WaitTimeout:
                raise DatabaseBusy(f"The platform database stayed locked for {pause.timeout:g} s; nothing was changed. "
                                   "Try again in a moment.") from e
            log.warning("database %s is locked; retrying in %.2f s", url, delay)
            time.sleep(delay)
        except BaseException:
            _close(conn)
            raise


def _set_busy(conn: Connection, ms: int) -> None:
    conn.connection.dbapi_connection.execute(f"PRAGMA busy_timeout={int(ms)}")


def _close(conn: Connection) -> None:
    """Back to the pool, with SQLite's busy wait as every other user of the pool expects it (in :func:`no_waiting`
    the transaction's connection had none)."""
    try:
        if _NO_WAIT.get() and conn.dialect.name == "sqlite":
            _set_busy(conn, _busy_ms())
    finally:
        conn.close()


@contextlib.contextmanager
def write_session(url: str) -> Iterator[Session]:
    """A session whose transaction holds the database write lock from its first statement.

    Used where read-then-write must be atomic across processes (GPU allocation and the
    quota check that precedes it): SQLite gets ``BEGIN IMMEDIATE``, PostgreSQL a
    transaction-scoped advisory lock. Taking the lock is retried while the database is locked
    (up to :func:`lock_timeout`, then :class:`DatabaseBusy`); the body runs once, holding it.
    """
    with write_connection(url) as conn:
        with Session(bind=conn, expire_on_commit=False) as session:
            yield session
            session.flush()


@contextlib.contextmanager
def write_connection(url: str) -> Iterator[Connection]:
    """:func:`write_session`'s transaction as a plain Core connection, for writers of Core statements.

    The ORM session around a single ``UPDATE`` or ``INSERT`` (its bulk-update evaluation, flush and
    identity bookkeeping) costs several times the statement, and a job's life makes a dozen such
    writes (see benchmarks/README.md, jobs load)."""
    conn, trans = _begin_write(get_engine(url), url)
    try:
        yield conn
        trans.commit()
    except BaseException:
        if trans.is_active:
            trans.rollback()
        raise
    finally:
        _close(conn)


def plain_in(column, count: int, name: str = "state"):
    """``column IN (:state0, :state1, ...)`` with ``count`` plain parameters rather than one expanding parameter, so
    that the statement compiles to one SQL text, which :class:`SQLiteReader` prepares once. Fill them with
    :func:`plain_in_params`."""
    return column.in_([bindparam(f"{name}{i}") for i in range(count)])


def plain_in_params(values, name: str = "state") -> dict:
    """The parameters of :func:`plain_in` for ``values``, in order."""
    return {f"{name}{i}": value for i, value in enumerate(values)}


class SQLiteReader:
    """Small, hot reads of a local SQLite database straight through the ``sqlite3`` module.

    SQLAlchemy's per-statement machinery (connection checkout, the BEGIN its SQLite set-up emits, the
    compiled-cache lookup, the result object, the ROLLBACK) costs a read of one row five times the read
    itself, and the jobs API and every scheduling pass make such reads. These are SQLAlchemy's own
    statements, compiled once for the SQLite dialect (so built once: plain bound parameters, no expanding
    ones), and every value goes through its column type's own result processor, so a row reads exactly as
    through SQLAlchemy: a named tuple with the selected columns' keys. One connection per thread, made
    ``query_only``; in WAL mode a reader never waits for a writer. Use :meth:`for_engine`: None for any
    other database.
    """

    def __init__(self, engine: Engine):
        self.path = engine.url.database
        self._dialect = engine.dialect
        self._prepared: dict[int, tuple] = {}
        self._local = threading.local()

    @classmethod
    def for_engine(cls, engine: Engine) -> "SQLiteReader | None":
        ok = engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:")
        return cls(engine) if ok else None

    def _connection(self) -> sqlite3.Connection:
        con = getattr(self._local, "connection", None)
        if con is None:
            con = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            try:
                con.execute("PRAGMA query_only=ON")
            except sqlite3.DatabaseError as e:
                con.close()
                self._damaged(e)
                raise
            self._local.connection = con
        return con

    def _damaged(self, error: sqlite3.DatabaseError) -> None:
        if is_damaged(error):
            raise DatabaseDamaged(self.path, error) from error

    def _prepare(self, stmt) -> tuple:
        done = self._prepared.get(id(stmt))
        if done is None:
            compiled = stmt.compile(dialect=self._dialect)
            columns = list(stmt.selected_columns)
            processors = [c.type.dialect_impl(self._dialect).result_processor(self._dialect, None) for c in columns]
            row = namedtuple("Row", [c.key for c in columns], rename=True)
            values = compiled.params  # the statement's own values (``state == "queued"``), None for the caller's
            done = self._prepared[id(stmt)] = (stmt, str(compiled), tuple(compiled.positiontup or ()), values, processors, row)
        return done

    def rows(self, stmt, params: dict | None = None) -> list:
        """The rows of ``stmt`` (a statement built once and kept: it is prepared by identity)."""
        _, sql, names, values, processors, row = self._prepare(stmt)
        values = {**values, **params} if params else values
        try:
            raw = self._connection().execute(sql, [values[n] for n in names]).fetchall()
        except sqlite3.DatabaseError as e:
            self._damaged(e)
            raise
        if not any(processors):
            return [row._make(r) for r in raw]
        return [row._make([p(v) if p is not None else v for p, v in zip(processors, r)]) for r in raw]

    def scalar(self, stmt, params: dict | None = None):
        rows = self.rows(stmt, params)
        return rows[0][0] if rows else None

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads inside see one state of the database (one read transaction)."""
        con = self._connection()
        con.execute("BEGIN")
        try:
            yield
        finally:
            con.execute("COMMIT")
