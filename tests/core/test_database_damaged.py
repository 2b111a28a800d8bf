"""A damaged database file gives a clear error, never a driver's traceback (trainhub.db.DatabaseDamaged).

`trainhub status`, `trainhub up` and the services meet the platform's SQLite files (``trainhub.sqlite``: ledger, jobs,
sweeps, registry, usage; ``jupyterhub.sqlite``: the hub's users and tokens). A file that is not a database, truncated,
or with corrupt pages is answered with one message naming the file, the way to restore it (stop the platform, move
the file aside, restore a backup or let `trainhub up` create a new one) and what a new one loses; the CLI exits 1.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import column, select, table, text

from trainhub.cli import damaged_database
from trainhub.db import WHAT_IS_LOST, DatabaseDamaged, SQLiteReader, check_database, get_engine, init_db, is_damaged
from trainhub.gpus import simulated_devices
from trainhub.settings import DataDir, Runtime

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "trainhub.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(REPO))


def garble(path: Path) -> None:
    path.write_bytes(b"this is not an SQLite database, whatever its name says\n" * 100)


def truncate(path: Path) -> None:
    os.truncate(path, 3000)  # inside its first page


def corrupt_pages(path: Path) -> None:
    """Every page but the first (the header and the schema) overwritten."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(bytes((i * 7 + 3) % 256 for i in range(size - 4096)))


@pytest.fixture(scope="module")
def good_ledger(tmp_path_factory) -> Path:
    """A data dir's trainhub.sqlite as `trainhub status` leaves it (the ledger's tables, a few pages)."""
    root = tmp_path_factory.mktemp("good")
    Runtime(data_dir=str(root), devices=[d.to_dict() for d in simulated_devices(2)], simulated=True).save()
    r = run_cli("status", "--data-dir", str(root))
    assert r.returncode == 0 and "2 of 2 free" in r.stdout, r.stderr
    db = DataDir(root).platform_db
    assert db.stat().st_size > 4096 and not Path(f"{db}-wal").exists()
    return db


@pytest.fixture
def data_dir(tmp_path, good_ledger) -> Path:
    Runtime(data_dir=str(tmp_path), devices=[d.to_dict() for d in simulated_devices(2)], simulated=True).save()
    shutil.copy(good_ledger, DataDir(tmp_path).platform_db)
    return tmp_path


def assert_clear(r: subprocess.CompletedProcess, command: str, path: Path) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "sqlalchemy" not in r.stderr.lower(), r.stderr
    assert r.stderr.startswith(f"trainhub {command}: error: the database {path} is damaged or unreadable"), r.stderr
    assert "stop the platform" in r.stderr and f"mv {path}* " in r.stderr and "copy a backup" in r.stderr, r.stderr
    assert WHAT_IS_LOST[path.name] in r.stderr.replace("\n     ", " "), r.stderr
    assert r.stderr.count("is damaged") == 1, r.stderr  # said once (init_db's log line is for the services)


@pytest.mark.parametrize("damage", [garble, truncate, corrupt_pages])
def test_status_on_a_damaged_database_says_which_file_and_how_to_restore_it(data_dir, damage):
    db = DataDir(data_dir).platform_db
    damage(db)
    assert_clear(run_cli("status", "--data-dir", str(data_dir)), "status", db)


@pytest.mark.parametrize("name", ["trainhub.sqlite", "jupyterhub.sqlite"])
def test_up_refuses_a_damaged_database_before_starting_anything(data_dir, name):
    db = data_dir / name
    if db != DataDir(data_dir).platform_db:
        shutil.copy(DataDir(data_dir).platform_db, db)
    corrupt_pages(db)  # only a read of every page finds it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run_cli("up", "--data-dir", str(data_dir), "--gpus", "1", "--port", str(port))
    assert_clear(r, "up", db)
    assert not (data_dir / "logs" / "jupyterhub.log").exists()  # the hub was never started


def test_a_service_starting_on_a_damaged_database_logs_the_message(tmp_path, caplog):
    db = tmp_path / "trainhub.sqlite"
    garble(db)
    with caplog.at_level(logging.ERROR, logger="trainhub.db"), pytest.raises(DatabaseDamaged) as e:
        init_db(f"sqlite:///{db}")  # what the jobs service's store and the hub's ledger do as they start
    assert e.value.path == str(db)
    assert [r.getMessage() for r in caplog.records] == [str(e.value)]


def test_reads_and_writes_meet_damaged_pages_as_the_same_error(tmp_path):
    db = tmp_path / "trainhub.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (v TEXT)")
    con.executemany("INSERT INTO t VALUES (?)", [("x" * 500,)] * 200)
    con.commit()
    con.close()
    engine = get_engine(f"sqlite:///{db}")
    corrupt_pages(db)
    with pytest.raises(DatabaseDamaged, match="database disk image is malformed"):
        with engine.connect() as c:
            c.execute(text("SELECT count(*) FROM t")).all()
    with pytest.raises(DatabaseDamaged, match=str(db)):
        SQLiteReader.for_engine(engine).rows(select(column("v")).select_from(table("t")))


def test_a_driver_error_that_names_no_file_is_matched_to_the_data_dirs_databases(tmp_path):
    """The hub's database opened outside trainhub.db (``trainhub users add`` sets a password in it directly)."""
    from trainhub.hubapi import set_native_password

    hub_db = Path(DataDir(tmp_path).hub_db_url.removeprefix("sqlite:///"))
    garble(hub_db)
    with pytest.raises(Exception) as raw:
        set_native_password(tmp_path, "alice", "a long password")
    assert not isinstance(raw.value, DatabaseDamaged) and is_damaged(raw.value)
    found = damaged_database(raw.value, str(tmp_path))
    assert isinstance(found, DatabaseDamaged) and found.path == str(hub_db)
    assert "`trainhub users add`" in str(found)


def test_only_the_file_itself_is_damage():
    """A locked database, a missing table or a constraint is a DatabaseError too, but not a damaged file."""
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE t (v INTEGER UNIQUE)")
    con.execute("INSERT INTO t VALUES (1)")
    for sql in ("SELECT * FROM missing", "INSERT INTO t VALUES (1)"):
        with pytest.raises(sqlite3.DatabaseError) as e:
            con.execute(sql)
        assert not is_damaged(e.value), sql
    assert is_damaged(sqlite3.DatabaseError("file is not a database"))


def test_a_whole_file_passes_the_check_and_a_missing_one_is_left_alone(tmp_path, good_ledger):
    check_database(good_ledger)
    check_database(tmp_path / "not-there.sqlite")
    assert not (tmp_path / "not-there.sqlite").exists()


def test_what_is_lost_is_said_for_each_of_the_data_dirs_databases(tmp_path):
    dd = DataDir(tmp_path)
    assert set(WHAT_IS_LOST) == {dd.platform_db.name, Path(dd.hub_db_url.removeprefix("sqlite:///")).name}
