"""`check_sqlite_store`: a store left by a run killed mid-write (a hot rollback journal) is accepted and rolled back,
as MLflow would roll it back; a read-only or broken store is refused with one line."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_lit.errors import ConfigError
from ragen_lit.run.store import check_sqlite_store

KILLED_MID_WRITE = """
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA cache_size = 1")  # dirty pages spill into the database file mid-transaction, as in a big write
db.execute("BEGIN")
db.executemany("INSERT INTO metrics VALUES (?)", [(i,) for i in range(2, 20000)])
db.execute("UPDATE metrics SET value = 99")
os._exit(9)  # killed: no commit, no rollback, the journal stays
"""


def test_a_store_killed_mid_write_is_rolled_back_not_refused(tmp_path: Path):
    store = tmp_path / "mlruns.db"
    with sqlite3.connect(store) as db:
        db.execute("CREATE TABLE metrics (value INTEGER)")
        db.execute("INSERT INTO metrics VALUES (1)")
    db.close()
    assert subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(store)]).returncode == 9
    journal = tmp_path / "mlruns.db-journal"
    assert journal.exists() and journal.stat().st_size > 0  # a hot journal, as a killed run leaves it
    check_sqlite_store(store, "logging.output_dir")
    with sqlite3.connect(store) as db:
        assert db.execute("SELECT value FROM metrics").fetchall() == [(1,)]  # the killed write was undone
    db.close()


def test_a_read_only_or_broken_store_is_refused(tmp_path: Path):
    store = tmp_path / "mlruns.db"
    store.write_bytes(b"not a database, but long enough to be read as a header" * 4)
    with pytest.raises(ConfigError, match="is not a readable sqlite database"):
        check_sqlite_store(store, "logging.output_dir")
    store.chmod(0o444)
    try:
        if not __import__("os").access(store, __import__("os").W_OK):  # root may write anyway
            with pytest.raises(ConfigError, match="is read-only"):
                check_sqlite_store(store, "logging.output_dir")
    finally:
        store.chmod(0o644)
