"""trainhub.db.no_waiting: a write made on an event loop takes SQLite's write lock at once or says so, and leaves the
pooled connection waiting again as everyone else expects."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from sqlalchemy import text

from trainhub.db import WriteLockTaken, get_engine, no_waiting, write_connection, write_now


@pytest.fixture
def url(tmp_path):
    url = f"sqlite:///{tmp_path}/platform.db"
    with write_connection(url) as c:
        c.execute(text("CREATE TABLE t (v INTEGER)"))
    return url


def rows(url) -> list[int]:
    with get_engine(url).connect() as c:
        return [r[0] for r in c.execute(text("SELECT v FROM t ORDER BY v"))]


def hold_write_lock(path, seconds: float) -> threading.Thread:
    """Another process's writer (its own connection) holding the write lock for ``seconds``."""
    taken = threading.Event()

    def hold():
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        taken.set()
        time.sleep(seconds)
        other.execute("COMMIT")
        other.close()

    t = threading.Thread(target=hold)
    t.start()
    assert taken.wait(5)
    return t


def test_a_free_lock_is_taken_and_the_write_lands(url):
    with no_waiting(), write_connection(url) as c:
        c.execute(text("INSERT INTO t VALUES (1)"))
    assert rows(url) == [1]


def test_a_taken_lock_is_said_at_once_nothing_is_written_and_later_writes_wait_again(url, tmp_path):
    holder = hold_write_lock(tmp_path / "platform.db", 1.0)
    started = time.monotonic()
    with pytest.raises(WriteLockTaken):
        with no_waiting(), write_connection(url) as c:
            c.execute(text("INSERT INTO t VALUES (2)"))
    assert time.monotonic() - started < 0.5  # neither SQLite's busy wait nor the retries
    with get_engine(url).connect() as c:  # the connection it used, back in the pool: SQLite's busy wait is back on it
        assert c.exec_driver_sql("PRAGMA busy_timeout").scalar() > 0
    # outside the block a write waits for the lock and lands
    with write_connection(url) as c:
        c.execute(text("INSERT INTO t VALUES (3)"))
    holder.join()
    assert rows(url) == [3]


def test_commits_that_wait_for_the_disk_are_never_made_without_waiting(url, monkeypatch):
    monkeypatch.setenv("TRAINHUB_DB_SYNC", "full")
    with pytest.raises(WriteLockTaken, match="synchronous=full"):
        with no_waiting(), write_connection(url) as c:
            c.execute(text("INSERT INTO t VALUES (4)"))
    assert rows(url) == []


# -- write_now: a short write a coroutine awaits -------------------------------------------------------

def insert(url, value):
    def fn():
        with write_connection(url) as c:
            c.execute(text("INSERT INTO t VALUES (:v)"), {"v": value})
        return threading.get_ident()
    return fn


async def test_write_now_writes_on_the_loop_when_the_lock_is_free(url):
    assert await write_now(insert(url, 5), inline=True) == threading.get_ident()  # this (the loop's) thread
    assert await write_now(insert(url, 6), inline=False) != threading.get_ident()  # not inline: a worker thread
    assert rows(url) == [5, 6]


async def test_write_now_waits_for_a_taken_lock_on_a_thread_while_the_loop_goes_on(url, tmp_path):
    import asyncio

    holder = hold_write_lock(tmp_path / "platform.db", 0.5)
    write = asyncio.ensure_future(write_now(insert(url, 7), inline=True))
    late, step = 0.0, 0.01
    for _ in range(20):  # the loop's own timers while the write waits for the lock
        before = time.monotonic()
        await asyncio.sleep(step)
        late = max(late, time.monotonic() - before - step)
    assert await write != threading.get_ident()
    await asyncio.to_thread(holder.join)
    assert rows(url) == [7]
    assert late < 0.2, f"the event loop stalled {late:.3f} s while the write waited for the lock"
