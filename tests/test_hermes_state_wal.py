"""``apply_wal_with_fallback`` on connections the caller opened to its own databases.

The fallback is provoked with real SQLite refusals: an authorizer that forbids switching to
WAL (SQLite's ``SQLITE_AUTH``, "not authorized", as a mount that blocks the pragma reports it),
and VFSes without shared memory (``unix-none``, ``unix-dotfile``), which keep a file out of WAL
without an error. ``SQLITE_PROTOCOL`` ("locking protocol") needs a network file system to
happen and is not provoked here; it takes the same path by result code.
"""

from __future__ import annotations

import logging
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_state import apply_wal_with_fallback


@pytest.fixture
def path(tmp_path: Path) -> Path:
    conn = sqlite3.connect(tmp_path / "kanban.db", isolation_level=None)
    conn.execute("CREATE TABLE tasks (id INTEGER PRIMARY KEY, title TEXT)")
    conn.execute("INSERT INTO tasks (title) VALUES ('first')")
    conn.close()
    return tmp_path / "kanban.db"


@pytest.fixture
def conn(path: Path) -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(path, isolation_level=None)
    yield connection
    connection.close()


def label() -> str:
    return f"kanban.db ({uuid.uuid4().hex[:8]})"


def statements(conn: sqlite3.Connection) -> list[str]:
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    return seen


def forbid_wal(conn: sqlite3.Connection, before_denying: object = None) -> None:
    """Deny ``PRAGMA journal_mode = WAL`` on ``conn`` (reading the mode stays allowed)."""

    def authorizer(action: int, arg1: str | None, arg2: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_PRAGMA and arg1 == "journal_mode" and (arg2 or "").lower() \
                == "wal":
            if callable(before_denying):
                before_denying()
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    conn.set_authorizer(authorizer)


def journal_mode(path: Path) -> str:
    other = sqlite3.connect(path, isolation_level=None)
    try:
        return other.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        other.close()


def test_a_rollback_file_is_switched_to_wal(path: Path, conn: sqlite3.Connection) -> None:
    assert apply_wal_with_fallback(conn, db_label=label()) == "wal"
    assert journal_mode(path) == "wal"
    assert conn.execute("SELECT title FROM tasks").fetchall() == [("first",)]


def test_a_wal_file_is_left_alone(conn: sqlite3.Connection) -> None:
    apply_wal_with_fallback(conn)
    seen = statements(conn)
    assert apply_wal_with_fallback(conn) == "wal"
    assert seen == ["PRAGMA journal_mode"], "no set-pragma when it already reads wal"


def test_a_refused_switch_falls_back_to_delete_with_one_warning_per_label(
    path: Path, conn: sqlite3.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    name = label()
    forbid_wal(conn)
    with caplog.at_level(logging.WARNING, logger="hermes_state"):
        assert apply_wal_with_fallback(conn, db_label=name) == "delete"
        assert apply_wal_with_fallback(conn, db_label=name) == "delete"
        other = sqlite3.connect(path, isolation_level=None)
        forbid_wal(other)
        assert apply_wal_with_fallback(other, db_label="projects.db-" + name) == "delete"
        other.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage().split(":")[0] for r in warnings] == [name, "projects.db-" + name]
    assert "not authorized" in warnings[0].getMessage()
    assert journal_mode(path) == "delete"
    conn.execute("INSERT INTO tasks (title) VALUES ('still works')")
    assert conn.execute("SELECT COUNT(*) FROM tasks").fetchone()[0] == 2


def test_a_file_switched_to_wal_meanwhile_is_never_downgraded(
    path: Path, conn: sqlite3.Connection
) -> None:
    """Another connection switches the file to WAL between the read of the mode and the
    refused switch: the refusal is raised and the file stays WAL."""
    conn.execute("SELECT COUNT(*) FROM tasks").fetchone()

    def another_opener() -> None:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("PRAGMA journal_mode = WAL")
        other.close()

    forbid_wal(conn, before_denying=another_opener)
    with pytest.raises(sqlite3.DatabaseError, match="not authorized"):
        apply_wal_with_fallback(conn, db_label=label())
    assert journal_mode(path) == "wal"


def test_other_errors_propagate(path: Path) -> None:
    read_only = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None)
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            apply_wal_with_fallback(read_only, db_label=label())
    finally:
        read_only.close()
    assert journal_mode(path) == "delete"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    with pytest.raises(sqlite3.OperationalError):  # not inside a transaction
        apply_wal_with_fallback(conn, db_label=label())
    conn.close()


@pytest.mark.parametrize("vfs", ["unix-none", "unix-dotfile"])
def test_a_vfs_without_shared_memory_keeps_rollback_mode_without_an_error(
    path: Path, vfs: str, caplog: pytest.LogCaptureFixture
) -> None:
    conn = sqlite3.connect(f"{path.as_uri()}?vfs={vfs}", uri=True, isolation_level=None)
    try:
        with caplog.at_level(logging.WARNING, logger="hermes_state"):
            assert apply_wal_with_fallback(conn, db_label=label()) == "delete"
        assert caplog.records == []
        conn.execute("INSERT INTO tasks (title) VALUES ('works')")
    finally:
        conn.close()


@pytest.mark.parametrize("already_wal", [False, True])
def test_macos_settings_follow_wal(
    conn: sqlite3.Connection, already_wal: bool
) -> None:
    if already_wal:
        apply_wal_with_fallback(conn, macos=False)
    assert apply_wal_with_fallback(conn, macos=True) == "wal"
    assert conn.execute("PRAGMA checkpoint_fullfsync").fetchone()[0] == 1
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_no_macos_settings_elsewhere_or_without_wal(
    conn: sqlite3.Connection,
) -> None:
    seen = statements(conn)
    apply_wal_with_fallback(conn, macos=False)
    assert not any("fullfsync" in s or "synchronous" in s for s in seen)
    other_path = Path(conn.execute("PRAGMA database_list").fetchone()[2]).with_name("x.db")
    other = sqlite3.connect(f"{other_path.as_uri()}?vfs=unix-none", uri=True,
                            isolation_level=None)
    forbidden = statements(other)
    assert apply_wal_with_fallback(other, db_label=label(), macos=True) == "delete"
    assert not any("fullfsync" in s for s in forbidden), "only once WAL is active"
    other.close()


def test_a_mode_that_cannot_be_read_still_gets_the_switch(
    path: Path, conn: sqlite3.Connection
) -> None:
    denied: list[str] = []

    def authorizer(action: int, arg1: str | None, arg2: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_PRAGMA and arg1 == "journal_mode" and arg2 is None \
                and not denied:
            denied.append("read")
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    conn.set_authorizer(authorizer)
    assert apply_wal_with_fallback(conn, db_label=label()) == "wal"
    assert denied == ["read"]
    assert journal_mode(path) == "wal"
