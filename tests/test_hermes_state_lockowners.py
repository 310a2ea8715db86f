"""Naming the processes that hold SQLite's locks, from real processes and hand-written tables."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hermes_state_lockowners import (
    PROC_LOCKS_ENV,
    LockHolder,
    ProcLock,
    describe_lock_holders,
    lock_holders,
    lock_table_path,
    parse_proc_locks,
)

needs_proc_locks = pytest.mark.skipif(
    not os.path.exists("/proc/locks"), reason="needs Linux /proc/locks"
)

PENDING = 0x40000000
SHARED_FIRST = PENDING + 2
SHARED_LAST = SHARED_FIRST + 509

# Opens argv[1] in the journal mode argv[2], takes the write lock, says so, and keeps it until
# its stdin is closed.
HOLDER_SCRIPT = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
if sys.argv[2] == "wal":
    conn.execute("PRAGMA journal_mode=WAL")
else:
    conn.execute("PRAGMA journal_mode=DELETE")
conn.execute("CREATE TABLE IF NOT EXISTS t(x)")
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO t VALUES (1)")
print("ready", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
"""


@contextlib.contextmanager
def holding_write_lock(db_path: Path, journal_mode: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER_SCRIPT, str(db_path), journal_mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def file_id(path: Path) -> str:
    st_ = os.stat(path)
    return f"{os.major(st_.st_dev):02x}:{os.minor(st_.st_dev):02x}:{st_.st_ino}"


# --- live processes -----------------------------------------------------------------------


@needs_proc_locks
def test_wal_writer_is_named_with_its_command_line(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    with holding_write_lock(db, "wal") as proc:
        holders = lock_holders(db)
        lines = describe_lock_holders(db)

    mine = [h for h in holders if h.pid == proc.pid]
    assert mine, holders
    first = holders[0]
    assert (first.pid, first.file, first.kind, first.mode) == (
        proc.pid, "state.db-shm", "WAL write", "WRITE"
    )
    assert (first.start, first.end) == (120, 120)
    assert first.command.startswith(f"{os.path.basename(sys.executable)} -c ")
    assert "\n" not in first.command
    expected = f"PID {proc.pid} ({first.command}) holds WAL write lock on state.db-shm"
    assert first.describe() == expected
    assert lines[0] == expected
    # The writer is also a reader: it holds a read mark, the DMS and SHARED on the main file.
    kinds = {(h.file, h.kind) for h in mine}
    assert ("state.db", "SHARED") in kinds
    assert ("state.db-shm", "shared dead-man switch (DMS)") in kinds


@needs_proc_locks
def test_rollback_journal_writer_holds_reserved_on_main_file(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    with holding_write_lock(db, "delete") as proc:
        holders = lock_holders(db)

    assert [(h.pid, h.file, h.kind, h.mode) for h in holders] == [
        (proc.pid, "state.db", "RESERVED", "WRITE"),
        (proc.pid, "state.db", "SHARED", "READ"),
    ]
    assert holders[0].describe().endswith("holds RESERVED lock on state.db")


@contextlib.contextmanager
def writing_here(db: Path) -> Iterator[sqlite3.Connection]:
    """A WAL connection of this process on ``db`` inside a write transaction (the WAL write
    lock held); the transaction commits on leaving the block, which proves looking at the
    lock table dropped none of this process's locks."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS t(x)")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (1)")
        yield conn
        conn.execute("COMMIT")
    finally:
        conn.close()


@needs_proc_locks
def test_own_process_is_excluded_by_default(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    with writing_here(db):
        assert lock_holders(db) == []
        holders = lock_holders(db, exclude_pids=())
        assert (holders[0].pid, holders[0].kind) == (os.getpid(), "WAL write")


@needs_proc_locks
def test_no_locks_means_no_holders(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    sqlite3.connect(db).close()
    assert lock_holders(db, exclude_pids=()) == []


# --- degrading silently -------------------------------------------------------------------


def test_missing_lock_table_gives_nothing(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    db.write_bytes(b"")
    missing = str(tmp_path / "no-such-locks")
    assert lock_holders(db, proc_locks_path=missing) == []
    assert describe_lock_holders(db, proc_locks_path=missing) == []


@needs_proc_locks
def test_the_environment_names_another_lock_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "state.db"
    with writing_here(db):
        assert lock_holders(db, exclude_pids=()) != []
        monkeypatch.setenv(PROC_LOCKS_ENV, str(tmp_path / "no-such-locks"))
        assert lock_table_path() == str(tmp_path / "no-such-locks")
        assert lock_holders(db, exclude_pids=()) == []
        monkeypatch.delenv(PROC_LOCKS_ENV)
        assert lock_table_path() == "/proc/locks"


def test_missing_database_gives_nothing(tmp_path: Path) -> None:
    assert describe_lock_holders(tmp_path / "absent.db") == []


def test_unreadable_lock_table_gives_nothing(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    db.write_bytes(b"")
    assert describe_lock_holders(db, proc_locks_path=str(tmp_path)) == []  # a directory


# --- classification, from a hand-written lock table ---------------------------------------


def test_ranges_are_classified_and_sorted_most_important_first(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").write_bytes(b"")
    other = tmp_path / "other.db"
    other.write_bytes(b"")
    main, wal, shm = file_id(db), file_id(Path(f"{db}-wal")), file_id(Path(f"{db}-shm"))
    me = os.getpid()
    gone = 999_999_999  # above any pid_max: the process has exited
    table = "\n".join([
        f"1: POSIX  ADVISORY  READ  {gone} {shm} 128 128",
        f"2: POSIX  ADVISORY  READ  {gone} {shm} 124 127",
        f"3: POSIX  ADVISORY  READ  {gone} {main} {SHARED_FIRST} {SHARED_LAST}",
        f"4: POSIX  ADVISORY  WRITE {me} {shm} 121 127",
        f"5: POSIX  ADVISORY  WRITE {me} {main} {PENDING + 1} {PENDING + 1}",
        f"6: POSIX  ADVISORY  WRITE {me} {shm} 120 120",
        f"6: -> POSIX  ADVISORY  WRITE {gone} {shm} 120 120",
        f"7: FLOCK  ADVISORY  WRITE {gone} {main} 0 EOF",
        f"8: POSIX  ADVISORY  WRITE {gone} {file_id(other)} 120 120",
        f"9: POSIX  ADVISORY  WRITE {gone} {wal} 0 EOF",
        f"10: OFDLCK ADVISORY  WRITE -1 {main} {SHARED_FIRST} {SHARED_LAST}",
        f"11: POSIX  ADVISORY  WRITE {gone} {main} 0 EOF",
        f"12: POSIX  ADVISORY  READ  {gone} {main} {PENDING} {PENDING}",
    ])
    locks = tmp_path / "locks"
    locks.write_text(table + "\n")

    holders = lock_holders(db, exclude_pids=(), proc_locks_path=str(locks))

    assert [(h.pid, h.file, h.kind) for h in holders] == [
        (gone, "state.db", "PENDING, RESERVED, EXCLUSIVE (byte-range 0-EOF)"),
        (-1, "state.db", "EXCLUSIVE"),
        (me, "state.db-shm", "WAL write"),
        (me, "state.db", "RESERVED"),
        (me, "state.db-shm", "exclusive checkpoint, recover, read-marks 0-4"),
        (gone, "state.db", "shared PENDING"),
        (gone, "state.db", "SHARED"),
        (gone, "state.db-shm", "shared read-marks 1-4"),
        (gone, "state.db-shm", "shared dead-man switch (DMS)"),
        (gone, "state.db-wal", "exclusive byte-range 0-EOF"),
    ]
    by_kind = {h.kind: h for h in holders}
    assert by_kind["WAL write"].command == by_kind["RESERVED"].command != "unknown"
    assert by_kind["SHARED"].command == "unknown"
    assert by_kind["SHARED"].end == SHARED_LAST
    assert by_kind["exclusive byte-range 0-EOF"].end is None
    assert by_kind["EXCLUSIVE"].describe() == (
        "A process not visible from here holds EXCLUSIVE lock on state.db"
    )
    assert lock_holders(db, exclude_pids=(gone, -1), proc_locks_path=str(locks)) == [
        h for h in holders if h.pid == me
    ]
    assert lock_holders(db, proc_locks_path=str(locks)) == [h for h in holders if h.pid != me]


def test_describe_format() -> None:
    holder = LockHolder(
        pid=594094,
        command="hermes --worktree --yolo",
        file="state.db-shm",
        kind="WAL write",
        start=120,
        end=120,
        mode="WRITE",
    )
    assert holder.describe() == (
        "PID 594094 (hermes --worktree --yolo) holds WAL write lock on state.db-shm"
    )


# --- parsing /proc/locks ------------------------------------------------------------------


def test_parse_proc_locks_reads_holders_waiters_and_odd_lines() -> None:
    text = (
        "1: POSIX  ADVISORY  WRITE 594094 08:02:1234567 120 120\n"
        "1: -> POSIX  ADVISORY  WRITE 4242 08:02:1234567 120 120\n"
        "1:  -> POSIX  ADVISORY  WRITE 4343 08:02:1234567 120 121\n"
        "2: FLOCK  ADVISORY  READ 17 fd:1a:99 0 EOF\n"
        "3: OFDLCK ADVISORY  WRITE -1 103:05:7 1073741826 1073742335\n"
        "4: POSIX  ADVISORY  READ 5 <none>:0 0 EOF\n"
        "garbage\n"
        "\n"
        "5: POSIX  ADVISORY  WRITE 12 08:02:notanumber 0 1\n"
        "6: POSIX  ADVISORY  WRITE 12 08:02:33 0\n"
        "7: LEASE  ACTIVE    READ 88 00:2c:4455 0 EOF\n"
    )
    assert parse_proc_locks(text) == [
        ProcLock(1, "POSIX", "ADVISORY", "WRITE", 594094, 8, 2, 1234567, 120, 120),
        ProcLock(1, "POSIX", "ADVISORY", "WRITE", 4242, 8, 2, 1234567, 120, 120, blocked=True),
        ProcLock(1, "POSIX", "ADVISORY", "WRITE", 4343, 8, 2, 1234567, 120, 121, blocked=True),
        ProcLock(2, "FLOCK", "ADVISORY", "READ", 17, 0xFD, 0x1A, 99, 0, None),
        ProcLock(3, "OFDLCK", "ADVISORY", "WRITE", -1, 0x103, 5, 7, SHARED_FIRST, SHARED_LAST),
        ProcLock(7, "LEASE", "ACTIVE", "READ", 88, 0, 0x2C, 4455, 0, None),
    ]


def test_parse_empty_table() -> None:
    assert parse_proc_locks("") == []


@given(st.text())
def test_parse_never_raises(text: str) -> None:
    for lock in parse_proc_locks(text):
        assert lock.end is None or lock.end >= 0
