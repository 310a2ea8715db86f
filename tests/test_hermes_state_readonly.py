"""Read-only opens: an unusable store is a typed 503, never created, changed or waited on
forever."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from hermes_state import (
    SessionDB,
    StateDbUnavailableError,
)
from state_helpers import file_hashes, populate, process_holding, sha256


def unavailable(path: Path) -> StateDbUnavailableError:
    with pytest.raises(StateDbUnavailableError) as info:
        SessionDB(path, read_only=True)
    assert info.value.http_status == 503
    return info.value


def test_a_missing_store_is_unavailable_and_nothing_is_created(tmp_path: Path) -> None:
    before = file_hashes(tmp_path)
    error = unavailable(tmp_path / "nowhere" / "state.db")
    assert error.reason == "uninitialized"
    assert not (tmp_path / "nowhere").exists()
    assert file_hashes(tmp_path) == before


def test_a_zero_byte_file_is_unavailable_and_left_alone(tmp_path: Path) -> None:
    empty = tmp_path / "profile" / "state.db"
    empty.parent.mkdir()
    empty.touch()
    assert unavailable(empty).reason == "uninitialized"
    assert sorted(p.name for p in empty.parent.iterdir()) == ["state.db"]
    assert empty.stat().st_size == 0


def test_a_database_without_tables_is_uninitialized(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    sqlite3.connect(path).execute("PRAGMA user_version = 7").connection.close()
    assert unavailable(path).reason == "uninitialized"


def test_an_old_schema_is_incompatible_and_not_touched(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, started_at REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
            role TEXT NOT NULL, content TEXT, timestamp REAL NOT NULL);
        INSERT INTO sessions VALUES ('s', 'cli', 1);
        """
    )
    conn.close()
    before = file_hashes(tmp_path)
    error = unavailable(path)
    assert error.reason == "incompatible" and error.schema_version == 1
    assert file_hashes(tmp_path) == before


def test_a_newer_schema_is_incompatible(db_path: Path) -> None:
    SessionDB(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    before = sha256(db_path)
    error = unavailable(db_path)
    assert error.reason == "incompatible" and error.schema_version == 99
    assert sha256(db_path) == before


def test_a_lock_held_past_the_read_budget_is_busy_after_about_five_seconds(
    db_path: Path,
) -> None:
    with SessionDB(db_path) as db:
        populate(db, sessions=1, messages=1)
    body = """
    conn.execute("PRAGMA locking_mode = EXCLUSIVE")
    conn.execute("BEGIN EXCLUSIVE")
    conn.execute("INSERT INTO state_meta (key, value) VALUES ('held', '1')")
    """
    with process_holding(db_path, body):
        start = time.monotonic()
        error = unavailable(db_path)
        waited = time.monotonic() - start
    assert error.reason == "busy"
    assert 4.0 <= waited < 8.0
