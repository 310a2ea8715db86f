"""``is_malformed_db_error`` on errors met by the caller's own connections to damaged files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hermes_state import (
    SessionDB,
    StateDbCorruptError,
    StateDbLockedError,
    is_malformed_db_error,
)


def error_of(path: Path, sql: str) -> sqlite3.Error:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(sql).fetchall()
    except sqlite3.Error as exc:
        return exc
    finally:
        conn.close()
    raise AssertionError(f"{sql!r} succeeded on {path}")


def test_a_damaged_table_is_malformed(
    db: SessionDB, db_path: Path, damage_messages_table: object
) -> None:
    db.create_session("s", "cli")
    for n in range(50):
        db.append_message("s", "user", f"message {n} " + "x" * 200)
    db.close()
    damage_messages_table(db_path)  # type: ignore[operator]
    exc = error_of(db_path, "SELECT * FROM messages")
    assert "database disk image is malformed" in str(exc)
    assert is_malformed_db_error(exc) is True


def test_a_damaged_schema_is_malformed(tmp_path: Path) -> None:
    path = tmp_path / "schema.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE t (x)")
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET sql = 'CREATE TABLE t (x' WHERE name = 't'")
    conn.close()
    exc = error_of(path, "SELECT * FROM t")
    assert "malformed database schema" in str(exc)
    assert is_malformed_db_error(exc) is True


def test_other_errors_are_not_malformed(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database file at all" * 200)
    not_a_db = error_of(garbage, "SELECT * FROM sqlite_master")
    assert "file is not a database" in str(not_a_db)
    assert is_malformed_db_error(not_a_db) is False, "no schema repair helps this one"
    missing = error_of(tmp_path / "fine.db", "SELECT * FROM no_such_table")
    assert is_malformed_db_error(missing) is False
    assert is_malformed_db_error(ValueError("database disk image is malformed")) is False
    assert is_malformed_db_error(StateDbCorruptError("database disk image is malformed")) is False
    assert is_malformed_db_error(StateDbLockedError("locked")) is False


@pytest.mark.parametrize("text", ["Database Disk Image Is Malformed",
                                  "MALFORMED DATABASE SCHEMA (t) - near x"])
def test_text_is_matched_without_regard_to_case(text: str) -> None:
    """An error re-raised from its message keeps no result code: the text is the test."""
    assert is_malformed_db_error(sqlite3.DatabaseError(text)) is True
    assert is_malformed_db_error(sqlite3.OperationalError(text)) is True
