"""The connection: WAL, private files, symlink refusal, lock retries, checkpoints, closing, and
the classification of real SQLite errors."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import hermes_state_connect as dbconn
from hermes_state import (
    InvalidInputError,
    InvalidTypeError,
    SessionDB,
    StateDbClosedError,
    StateDbLockedError,
    Timing,
    UnsafePathError,
    is_corruption_error,
    is_sqlite_lock_error,
)
from state_helpers import Connections
from hermes_state_errors import SQLITE_BUSY, SQLITE_CORRUPT, SQLITE_LOCKED, SQLITE_NOTADB

SIDECARS = ("state.db", "state.db-wal", "state.db-shm")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    previous = os.umask(value)
    try:
        yield
    finally:
        os.umask(previous)


# --- settings --------------------------------------------------------------------------------


def test_journal_mode_is_wal_and_foreign_keys_are_on(db_path: Path, open_db) -> None:
    connections = Connections()
    db = open_db(db_path, on_connect=connections)
    other = sqlite3.connect(db.path)
    try:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        other.close()
    # foreign_keys is per connection: ask the handle's own.
    assert connections.own().execute("PRAGMA foreign_keys").fetchone()[0] == 1


def test_close_is_idempotent_and_later_calls_fail_typed(db_path: Path) -> None:
    db = SessionDB(db_path)
    db.create_session("s", "cli")
    db.close()
    db.close()
    assert db.closed
    with pytest.raises(StateDbClosedError):
        db.get_session("s")
    with pytest.raises(StateDbClosedError):
        db.append_message("s", "user", "late")


def test_context_manager_closes_and_keeps_the_data(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
    assert db.closed
    with SessionDB(db_path) as again:
        assert again.get_session("s")["source"] == "cli"


def test_context_manager_closes_on_error(db_path: Path) -> None:
    with pytest.raises(KeyError), SessionDB(db_path) as db:
        raise KeyError("boom")
    assert db.closed


# --- private files ---------------------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o000])
def test_files_are_0600_whatever_the_umask(hermes_home: Path, mask: int) -> None:
    path = hermes_home / "new" / "state.db"
    with umask(mask), SessionDB(path) as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "hello")
        for name in SIDECARS:
            assert mode(path.with_name(name)) == 0o600, name
    assert mode(path.parent) == 0o700


def test_existing_0644_files_are_tightened(db_path: Path) -> None:
    with umask(0o022):
        other = sqlite3.connect(db_path, isolation_level=None)
        other.execute("PRAGMA journal_mode = WAL")
        other.execute("CREATE TABLE unrelated (x)")
        other.execute("INSERT INTO unrelated VALUES (1)")
    try:
        assert {mode(db_path.with_name(n)) for n in SIDECARS} == {0o644}
        with SessionDB(db_path) as db:
            db.create_session("s", "cli")
            for name in SIDECARS:
                assert mode(db_path.with_name(name)) == 0o600, name
    finally:
        other.close()


def test_symlinked_database_is_refused(hermes_home: Path, tmp_path: Path) -> None:
    target = tmp_path / "real.db"
    SessionDB(target).close()
    before = target.read_bytes()
    link = hermes_home / "state.db"
    link.symlink_to(target)
    for read_only in (False, True):
        with pytest.raises(UnsafePathError):
            SessionDB(link, read_only=read_only)
    assert target.read_bytes() == before


def test_dangling_symlink_is_refused_and_nothing_is_created(
    hermes_home: Path, tmp_path: Path
) -> None:
    target = tmp_path / "not-there" / "victim.db"
    link = hermes_home / "state.db"
    link.symlink_to(target)
    with pytest.raises(UnsafePathError):
        SessionDB(link)
    assert not target.exists() and not target.parent.exists()
    assert link.is_symlink()


@pytest.mark.parametrize("sidecar", ["state.db-wal", "state.db-shm"])
def test_symlinked_sidecar_is_refused(db_path: Path, tmp_path: Path, sidecar: str) -> None:
    SessionDB(db_path).close()
    target = tmp_path / "victim"
    db_path.with_name(sidecar).unlink(missing_ok=True)
    db_path.with_name(sidecar).symlink_to(target)
    with pytest.raises(UnsafePathError):
        SessionDB(db_path)
    assert not target.exists()


def _empty_dir(tmp_path: Path) -> Path:
    """A working directory of its own, so that a test sees every file an open makes."""
    work = tmp_path / "work"
    work.mkdir()
    return work


@pytest.mark.parametrize("name", [":memory:", Path(":memory:")])
@pytest.mark.parametrize("read_only", [False, True])
def test_memory_is_refused_not_made_a_file_of_that_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str | Path, read_only: bool
) -> None:
    monkeypatch.chdir(_empty_dir(tmp_path))
    with pytest.raises(InvalidInputError, match="in-memory") as raised:
        SessionDB(name, read_only=read_only)
    assert raised.value.argument == "db_path"
    assert list(Path.cwd().iterdir()) == []


def test_a_file_named_memory_is_still_a_file_when_its_path_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(_empty_dir(tmp_path))
    with SessionDB("./:memory:") as db:
        db.create_session("s1", "cli")
    with SessionDB(Path.cwd() / ":memory:") as db:
        assert db.get_session("s1") is not None


@pytest.mark.parametrize("value", [5, b"state.db", True, 1.5, ["state.db"]])
def test_a_db_path_that_is_not_a_path_is_refused_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: object
) -> None:
    monkeypatch.chdir(_empty_dir(tmp_path))
    with pytest.raises(InvalidTypeError, match="db_path must be a str or a path"):
        SessionDB(value)  # type: ignore[arg-type]
    assert list(Path.cwd().iterdir()) == []


# --- lock contention -------------------------------------------------------------------------


def test_a_write_waits_out_another_process_holding_the_lock(
    db: SessionDB, hold_write_lock
) -> None:
    db.create_session("s", "cli")
    with hold_write_lock(db.path, seconds=2.0):
        start = time.monotonic()
        row_id = db.append_message("s", "user", "patient")
        waited = time.monotonic() - start
    assert waited > 1.0  # it really was blocked, and it did not give up
    assert [m["id"] for m in db.get_messages("s")] == [row_id]
    assert db.get_session("s")["message_count"] == 1


def test_reads_go_on_while_another_process_holds_the_write_lock(
    db: SessionDB, hold_write_lock
) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "readable")
    with hold_write_lock(db.path):
        start = time.monotonic()
        assert [m["content"] for m in db.get_messages("s")] == ["readable"]
        assert db.list_sessions_rich()[0]["id"] == "s"
        assert time.monotonic() - start < 0.9  # a blocked read would wait out the 1 s timeout


@pytest.mark.parametrize(
    ("patience_attr", "write"),
    [
        ("transcript_patience_s", lambda db: db.append_message("s", "user", "lost")),
        ("write_patience_s", lambda db: db.create_session("other", "cli")),
    ],
    ids=["transcript", "ordinary"],
)
def test_exhausted_patience_raises_locked_and_names_the_holder(
    db_path: Path,
    open_db,
    hold_write_lock,
    caplog: pytest.LogCaptureFixture,
    hermes_home: Path,
    patience_attr: str,
    write,
) -> None:
    patience = 0.3
    db = open_db(db_path, timing=Timing(**{patience_attr: patience}))
    db.create_session("s", "cli")
    caplog.set_level(logging.WARNING, logger="hermes_state")
    with hold_write_lock(db.path) as holder:
        start = time.monotonic()
        with pytest.raises(StateDbLockedError) as info:
            write(db)
        elapsed = time.monotonic() - start
    # One SQLite busy wait (1 s) may run past the patience, never more.
    assert patience <= elapsed < patience + db.timing.busy_timeout_s + 1.0
    error = info.value
    assert error.reason == "session_persistence_failed:locked"
    assert isinstance(error.__cause__, sqlite3.OperationalError)
    assert is_sqlite_lock_error(error.__cause__)
    if os.path.exists("/proc/locks"):
        named = f"PID {holder.pid}"
        assert any(named in h for h in error.holders)
        warnings = [r for r in caplog.records if r.name == "hermes_state"]
        assert any(r.levelno == logging.WARNING and named in r.getMessage() for r in warnings)
        log = (hermes_home / "logs" / "errors.log").read_text()
        assert "database is locked" in log and named in log
        assert mode(hermes_home / "logs" / "errors.log") == 0o600
    # Nothing was half-written, and the handle works once the lock is gone.
    assert db.get_messages("s") == [] and db.get_session("other") is None
    db.append_message("s", "user", "after")
    assert db.message_count("s") == 1


def test_opening_an_uninitialised_file_waits_for_the_lock(db_path: Path, hold_write_lock) -> None:
    with sqlite3.connect(db_path, isolation_level=None) as other:
        other.execute("PRAGMA journal_mode = WAL")
        other.execute("CREATE TABLE unrelated (x)")
    other.close()
    with hold_write_lock(db_path, seconds=1.5):
        with SessionDB(db_path) as db:
            db.create_session("s", "cli")
    with SessionDB(db_path) as db:
        assert db.get_session("s") is not None


def test_opening_gives_up_typed_when_patience_runs_out(db_path: Path, hold_write_lock) -> None:
    with sqlite3.connect(db_path, isolation_level=None) as other:
        other.execute("PRAGMA journal_mode = WAL")
    other.close()
    with hold_write_lock(db_path):
        with pytest.raises(StateDbLockedError):
            SessionDB(db_path, timing=Timing(write_patience_s=0.2))


def test_threads_on_two_handles_in_one_process_lose_no_write(db_path: Path) -> None:
    import threading

    handles = [SessionDB(db_path), SessionDB(db_path)]
    handles[0].create_session("s", "cli")
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(25):
                handles[n % 2].append_message("s", "user", f"{n}:{i}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        contents = sorted(m["content"] for m in handles[1].get_messages("s"))
        assert contents == sorted(f"{n}:{i}" for n in range(4) for i in range(25))
        assert handles[1].get_session("s")["message_count"] == 100
    finally:
        for h in handles:
            h.close()


# Appends argv[3] messages tagged argv[2] to session "shared" of argv[1], starting when the
# clock reaches argv[4].
APPEND_SCRIPT = """
import sys, time
from hermes_state import SessionDB
time.sleep(max(0.0, float(sys.argv[4]) - time.time()))
with SessionDB(sys.argv[1]) as db:
    for i in range(int(sys.argv[3])):
        db.append_message("shared", "user", f"{sys.argv[2]}:{i}")
        db.update_token_counts("shared", input_tokens=1, model="m")
"""


def test_processes_appending_to_one_session_lose_nothing(db: SessionDB, spawn_python) -> None:
    db.create_session("shared", "cli")
    start = f"{time.time() + 0.5:.3f}"
    procs = [spawn_python(APPEND_SCRIPT, str(db.path), tag, "60", start) for tag in "ab"]
    time.sleep(max(0.0, float(start) - time.time()))
    for i in range(60):
        db.append_message("shared", "user", f"main:{i}")
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    contents = [m["content"] for m in db.get_messages("shared")]
    assert sorted(contents) == sorted(f"{t}:{i}" for t in ("a", "b", "main") for i in range(60))
    for tag in ("a", "b", "main"):  # each writer's rows are in its own order
        mine = [c for c in contents if c.startswith(f"{tag}:")]
        assert mine == [f"{tag}:{i}" for i in range(60)]
    row = db.get_session("shared")
    assert (row["message_count"], row["input_tokens"]) == (180, 120)


# Appends to session "s" of argv[1] forever, printing each row id once append_message returned.
APPEND_FOREVER_SCRIPT = """
import sys
from hermes_state import SessionDB
db = SessionDB(sys.argv[1])
i = 0
while True:
    row_id = db.append_message("s", "assistant", f"row {i}", tool_calls=[{"id": str(i)}])
    print(row_id, flush=True)
    i += 1
"""


def test_kill_9_loses_no_committed_row(db: SessionDB, spawn_python) -> None:
    import signal

    db.create_session("s", "cli")
    proc = spawn_python(APPEND_FOREVER_SCRIPT, str(db.path))
    assert proc.stdout is not None
    committed = [int(proc.stdout.readline()) for _ in range(150)]
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    stored = {m["id"] for m in db.get_messages("s")}
    assert set(committed) <= stored
    row = db.get_session("s")
    # Counters move in the row's own transaction: never one without the other.
    assert row["message_count"] == row["tool_call_count"] == len(stored)
    check = sqlite3.connect(db.path)
    try:
        assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        check.close()
    db.append_message("s", "user", "the store carries on")


# --- checkpoints -----------------------------------------------------------------------------


def test_passive_checkpoint_runs_after_50_writes(db: SessionDB) -> None:
    assert db.last_checkpoint is None
    db.create_session("s", "cli")
    for i in range(db.timing.checkpoint_every):
        db.append_message("s", "user", f"message {i}")
    assert db.last_checkpoint is not None
    busy, log_frames, checkpointed = db.last_checkpoint
    assert busy == 0 and 0 <= checkpointed <= log_frames


@pytest.mark.parametrize(
    ("version", "exposed"),
    [
        ((3, 40, 1), True), ((3, 44, 5), True), ((3, 44, 6), False), ((3, 45, 0), True),
        ((3, 50, 6), True), ((3, 50, 7), False), ((3, 51, 2), True), ((3, 51, 3), False),
        ((3, 52, 0), False), ((4, 0, 0), False),
    ],
)
def test_wal_reset_bug_range(version: tuple[int, int, int], exposed: bool) -> None:
    from hermes_state_connect import wal_reset_exposed

    assert wal_reset_exposed(version) is exposed


def test_the_handle_reports_this_sqlites_exposure(db: SessionDB) -> None:
    from hermes_state_connect import wal_reset_exposed

    assert db.wal_reset_exposed is wal_reset_exposed(sqlite3.sqlite_version_info)


# --- classifying real errors -----------------------------------------------------------------


def test_busy_error_from_a_locked_database_is_a_lock_error(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    first = sqlite3.connect(path, isolation_level=None)
    second = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        first.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as info:
            second.execute("BEGIN IMMEDIATE")
    finally:
        first.close()
        second.close()
    assert info.value.sqlite_errorcode & 0xFF == SQLITE_BUSY
    assert is_sqlite_lock_error(info.value)
    assert not is_corruption_error(info.value)


def test_busy_fts5_constructor_error_is_a_lock_error(tmp_path: Path) -> None:
    """In rollback-journal mode a connection that opens an FTS5 table while another holds the
    exclusive lock gets SQLITE_BUSY worded "vtable constructor failed: messages_fts"."""
    path = tmp_path / "journal.db"
    owner = sqlite3.connect(path, isolation_level=None)
    reader = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        owner.execute("PRAGMA journal_mode = DELETE")
        owner.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, content TEXT)")
        owner.execute(
            "CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages',"
            " content_rowid='id')"
        )
        reader.execute("SELECT COUNT(*) FROM sqlite_master").fetchall()  # schema loaded
        owner.execute("BEGIN EXCLUSIVE")
        with pytest.raises(sqlite3.OperationalError) as info:
            reader.execute("SELECT * FROM messages_fts WHERE messages_fts MATCH 'x'").fetchall()
    finally:
        owner.close()
        reader.close()
    assert "vtable constructor failed" in str(info.value)
    assert is_sqlite_lock_error(info.value)
    assert not is_corruption_error(info.value)


def test_locked_table_error_is_a_lock_error(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
    try:
        conn.execute("CREATE TABLE t (x)")
        conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(10)])
        reading = conn.execute("SELECT x FROM t")
        reading.fetchone()
        with pytest.raises(sqlite3.OperationalError) as info:
            conn.execute("DROP TABLE t")  # a statement is still reading it
    finally:
        conn.close()
    assert info.value.sqlite_errorcode & 0xFF == SQLITE_LOCKED
    assert is_sqlite_lock_error(info.value)


def _damaged_file(tmp_path: Path) -> Path:
    path = tmp_path / "damaged.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x TEXT)")
    conn.executemany("INSERT INTO t VALUES (?)", [("x" * 500,) for _ in range(200)])
    conn.commit()
    conn.close()
    page_size = 4096
    with open(path, "r+b") as f:
        f.seek(page_size * 3)
        f.write(b"\xa5" * page_size)
    return path


def test_corrupt_error_from_a_damaged_page_is_corruption(tmp_path: Path) -> None:
    conn = sqlite3.connect(_damaged_file(tmp_path))
    try:
        with pytest.raises(sqlite3.DatabaseError) as info:
            conn.execute("SELECT SUM(LENGTH(x)) FROM t").fetchall()
    finally:
        conn.close()
    assert info.value.sqlite_errorcode & 0xFF == SQLITE_CORRUPT
    assert is_corruption_error(info.value)
    assert not is_sqlite_lock_error(info.value)


def test_not_a_database_error_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not an SQLite file at all " * 200)
    conn = sqlite3.connect(path)
    try:
        with pytest.raises(sqlite3.DatabaseError) as info:
            conn.execute("SELECT * FROM sqlite_master").fetchall()
    finally:
        conn.close()
    assert info.value.sqlite_errorcode == SQLITE_NOTADB
    assert is_corruption_error(info.value)


def test_other_errors_are_neither(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "plain.db")
    errors: list[BaseException] = [ValueError("database is locked"), RuntimeError("corrupt")]
    try:
        conn.execute("CREATE TABLE t (x UNIQUE)")
        conn.execute("INSERT INTO t VALUES (1)")
        for sql in ("INSERT INTO t VALUES (1)", "SELEC nonsense", "SELECT * FROM missing"):
            with pytest.raises(sqlite3.Error) as info:
                conn.execute(sql)
            errors.append(info.value)
    finally:
        conn.close()
    for error in errors:
        assert not is_sqlite_lock_error(error), error
        assert not is_corruption_error(error), error


# --- the knobs a handle takes -----------------------------------------------------------------


def test_on_connect_sees_each_connection_before_the_library_runs_a_statement(
    db_path: Path, open_db
) -> None:
    connections = Connections()
    db = open_db(db_path, on_connect=connections)
    db.create_session("s", "cli")
    assert "".join(db.iter_export_jsonl())  # a streaming export reads from a snapshot
    assert [role for role, _ in connections.opened][:1] == ["handle"]
    assert "snapshot" in connections.statements
    for role in ("handle", "snapshot"):
        assert connections.of(role)[0] == dbconn.CELL_SIZE_CHECK_SQL, role


def test_a_handle_refuses_knobs_of_the_wrong_type_before_touching_the_file(
    db_path: Path,
) -> None:
    with pytest.raises(InvalidTypeError) as hook:
        SessionDB(db_path, on_connect="trace")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError) as exposure:
        SessionDB(db_path, wal_reset_exposed="yes")  # type: ignore[arg-type]
    assert (hook.value.argument, exposure.value.argument) == ("on_connect", "wal_reset_exposed")
    assert not db_path.exists()


def test_waiting_for_the_index_upkeep_returns_at_once_when_none_runs(db_path: Path) -> None:
    with SessionDB(db_path, rebuild_fts=False) as db:
        assert not db.started_index_upkeep
        assert db.wait_for_index(0) is True and db.wait_for_index() is True
        with pytest.raises(InvalidTypeError):
            db.wait_for_index("soon")  # type: ignore[arg-type]


def test_the_wal_reset_mitigation_can_be_forced_either_way(db_path: Path, open_db) -> None:
    for forced in (True, False):
        connections = Connections()
        db = open_db(db_path, on_connect=connections, wal_reset_exposed=forced)
        assert db.wal_reset_exposed is forced
        setting = connections.own().execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        assert setting == (0 if forced else 1000)
