"""Whether a store opens, and why not: the previous ``SessionDB``'s module-level helpers.

The agent's doctor calls these names, so they keep their results and wording. Unlike the
previous store, a schema repair runs only while no other process has the file open, and rows
are never modified. A file with proven row damage is never opened writable: the last
writable connection to close would checkpoint the damage in."""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import TypedDict

import hermes_state_fts as fts
import hermes_state_fulltext as fulltext
import hermes_state_maintenance as maintenance
import hermes_state_quarantine as quarantine
from hermes_state_connect import connect, transaction
from hermes_state_files import sidecar_paths
from hermes_state_errors import HermesStateError, is_hot_journal_error, unnamed_cause

__all__ = [
    "RepairResult",
    "db_opens_cleanly",
    "format_session_db_unavailable",
    "get_last_init_error",
    "record_open_error",
    "set_last_init_error",
    "repair_state_db_schema",
]

_last_open_error: str | None = None
_last_open_error_lock = threading.Lock()

# Causes that usually mean a network or FUSE file system without the locking WAL needs.
_LOCKING_HINTS = ("locking protocol", "not authorized")
_NETWORK_FS_HINT = (
    " (the file may be on an NFS/SMB or FUSE file system, where SQLite's WAL mode does not"
    " work: see https://www.sqlite.org/wal.html)"
)


def record_open_error(exc: BaseException) -> None:
    """Remember ``exc`` as the last error a store open raised in this process."""
    global _last_open_error
    with _last_open_error_lock:
        _last_open_error = f"{type(exc).__name__}: {exc}"


def set_last_init_error(message: str | None) -> None:
    """Set (or, with None, clear) the remembered last open error; a successful open never
    clears it, so a caller that handled the failure clears it here."""
    global _last_open_error
    with _last_open_error_lock:
        _last_open_error = message


def get_last_init_error() -> str | None:
    """The last error a ``SessionDB()`` open raised in this process, None when none did."""
    with _last_open_error_lock:
        return _last_open_error


def format_session_db_unavailable(prefix: str = "Session database not available") -> str:
    """``prefix`` with the last open error and, for a locking failure, where to look."""
    cause = get_last_init_error()
    if cause is None:
        return f"{prefix}."
    lowered = cause.lower()
    hint = _NETWORK_FS_HINT if any(h in lowered for h in _LOCKING_HINTS) else ""
    return f"{prefix}: {cause}{hint}."


JOURNAL_MODE_SQL = "PRAGMA journal_mode"
INTEGRITY_CHECK_SQL = "PRAGMA integrity_check"
COUNT_SESSIONS_SQL = "SELECT COUNT(*) FROM sessions"
PROBE_SESSION_SQL = "INSERT INTO sessions (id, source, started_at) VALUES (?, ?, ?)"
PROBE_MESSAGE_SQL = (
    "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)"
)
# A table or column the probe names but an older layout lacks is not damage (SQLite gives
# both the generic SQLITE_ERROR code: see hermes_state_errors.unnamed_cause).
_MISSING_SCHEMA = ("missing_table", "missing_column")


def db_opens_cleanly(db_path: str | Path) -> str | None:
    """None when the store at ``db_path`` opens and takes a write, else the reason.

    The file is checked read-only first (a ``-wal`` damaged in the middle, then
    ``integrity_check``): the writable connection of the probe checkpoints the ``-wal`` into
    the file when it closes last, which must never happen to a damaged file. Only a file
    with a hot journal, which a read-only connection may not read, is checked writable."""
    path = Path(db_path)
    damage = quarantine.wal_damage(path) if path.is_file() else None
    if damage is not None:
        return str(damage)
    problem = _read_only_problem(path)
    if problem is not None:
        return problem
    try:
        conn = connect(path, "rw")
    except sqlite3.Error as exc:
        return str(exc)
    try:
        conn.execute(JOURNAL_MODE_SQL).fetchall()
        problems = [row[0] for row in conn.execute(INTEGRITY_CHECK_SQL)]
        if problems != ["ok"]:
            return "; ".join(problems[:3])
        conn.execute(COUNT_SESSIONS_SQL).fetchall()
        return _probe_write(conn)
    except sqlite3.Error as exc:
        return str(exc)
    finally:
        conn.close()


def _read_only_problem(path: Path) -> str | None:
    """``integrity_check``'s findings through a read-only connection (which never
    checkpoints), None when it passes or only a writable open could read the file."""
    try:
        conn = connect(path, "ro")
    except sqlite3.Error as exc:
        return str(exc)
    try:
        problems = [row[0] for row in conn.execute(INTEGRITY_CHECK_SQL)]
    except sqlite3.Error as exc:
        return None if is_hot_journal_error(exc) else str(exc)
    finally:
        conn.close()
    return None if problems == ["ok"] else "; ".join(problems[:3])


def _probe_write(conn: sqlite3.Connection) -> str | None:
    now = time.time()
    try:
        with transaction(conn, rollback_only=True):
            probe = f"__opens_cleanly_probe_{now}"
            conn.execute(PROBE_SESSION_SQL, (probe, "probe", now))
            conn.execute(PROBE_MESSAGE_SQL, (probe, "user", "probe", now))
    except sqlite3.OperationalError as exc:
        cause = unnamed_cause(exc)
        if cause is not None and cause[0] in _MISSING_SCHEMA:
            return None
        if fulltext.is_unavailable_error(exc):
            return None  # this SQLite lacks FTS5: a SessionDB detaches the index and writes
        return str(exc)
    return None


class RepairResult(TypedDict):
    repaired: bool
    strategy: str | None
    backup_path: str | None
    error: str | None


def _result(
    repaired: bool, strategy: str | None, backup: Path | None, error: str | None
) -> RepairResult:
    return {"repaired": repaired, "strategy": strategy,
            "backup_path": None if backup is None else str(backup), "error": error}


def _raw_backup(path: Path) -> Path | None:
    """A byte copy of the damaged file (and its sidecars) beside it; None when copying failed.
    A file that cannot be read through SQLite cannot be copied through its backup API."""
    backup = path.with_name(f"{path.name}.malformed-backup-{time.strftime('%Y%m%d_%H%M%S')}")
    try:
        shutil.copy2(path, backup)
        for sidecar in sidecar_paths(path):
            if sidecar.exists():
                shutil.copy2(sidecar, backup.with_name(backup.name + sidecar.name[len(path.name):]))
    except OSError:
        return None
    return backup


REBUILD_SQL = "INSERT INTO {table} ({table}) VALUES ('rebuild')"
WRITABLE_SCHEMA_ON_SQL = "PRAGMA writable_schema = ON"
WRITABLE_SCHEMA_OFF_SQL = "PRAGMA writable_schema = OFF"
SCHEMA_VERSION_SQL = "PRAGMA schema_version"
# Every entry but the first of each (type, name): SQLite reads only one of them.
DELETE_DUPLICATE_SCHEMA_SQL = """
    DELETE FROM sqlite_master WHERE rowid NOT IN (
        SELECT MIN(rowid) FROM sqlite_master GROUP BY type, name
    )
"""
DELETE_FTS_SCHEMA_SQL = "DELETE FROM sqlite_master WHERE name LIKE 'messages\\_fts%' ESCAPE '\\'"
VACUUM_SQL = "VACUUM"


def _rebuild_fts(conn: sqlite3.Connection) -> None:
    with transaction(conn):
        for table in fts.FTS_TABLES:
            conn.execute(REBUILD_SQL.format(table=table))


def _edit_schema(conn: sqlite3.Connection, sql: str) -> None:
    """Run ``sql`` on ``sqlite_master`` and bump the schema cookie in the same transaction,
    so that every other connection reloads the schema instead of writing by the old one."""
    conn.execute(WRITABLE_SCHEMA_ON_SQL)
    try:
        with transaction(conn):
            version = conn.execute(SCHEMA_VERSION_SQL).fetchone()[0]
            conn.execute(sql)
            conn.execute(f"PRAGMA schema_version = {int(version) + 1}")
    finally:
        conn.execute(WRITABLE_SCHEMA_OFF_SQL)


def _dedup_schema(conn: sqlite3.Connection) -> None:
    _edit_schema(conn, DELETE_DUPLICATE_SCHEMA_SQL)


def _drop_fts_rebuild(conn: sqlite3.Connection) -> None:
    """Delete the FTS objects from the schema (a damaged shadow b-tree cannot be dropped),
    VACUUM the orphaned pages away, then create and fill the indexes again."""
    _edit_schema(conn, DELETE_FTS_SCHEMA_SQL)
    conn.execute(VACUUM_SQL)
    maintenance.rebuild_indexes(conn, maintenance.no_progress)


_STRATEGIES = (
    ("rebuild_fts", _rebuild_fts),
    ("dedup_schema", _dedup_schema),
    ("drop_fts_rebuild", _drop_fts_rebuild),
)


def repair_state_db_schema(db_path: str | Path, *, backup: bool = True) -> RepairResult:
    """Repair a store whose schema or search index keeps it from opening (see the module
    docstring); never raises for a store that cannot be repaired: ``error`` says why."""
    path = Path(db_path)
    if not path.is_file():
        return _result(False, None, None, f"no database file at {path}")
    reason = db_opens_cleanly(path)
    if reason is None:
        return _result(True, "already_healthy", None, None)
    if fts.other_processes_hold(path):
        return _result(False, None, None, f"{path} is in use by another process: {reason}")
    copy = _raw_backup(path) if backup else None
    damaged = _damaged_record(path)
    if damaged is not None:  # no strategy mends rows, and each would checkpoint into the file
        return _result(False, None, copy, f"{reason} ({damaged}: recover the store)")
    for strategy, run in _STRATEGIES:
        try:
            conn = connect(path, "rw")
        except sqlite3.Error as exc:
            reason = str(exc)
            break
        try:
            run(conn)
        except sqlite3.Error as exc:
            reason = str(exc)
            continue
        finally:
            conn.close()
        reason = db_opens_cleanly(path)
        if reason is None:
            return _result(True, strategy, copy, _cleared_quarantine(path))
    return _result(False, None, copy, reason)


def _damaged_record(path: Path) -> str | None:
    """What proves the rows of the file themselves damaged, read-only: a ``-wal`` damaged in
    the middle, or canonical tables failing ``quick_check``; None when nothing does (a file
    whose schema cannot even be read is left to the strategies)."""
    damage = quarantine.wal_damage(path)
    if damage is not None:
        return str(damage)
    try:
        conn = connect(path, "ro")
    except sqlite3.Error:
        return None
    try:
        tables = fts.damaged_canonical_tables(conn)
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return f"damaged tables: {', '.join(tables)}" if tables else None


def _cleared_quarantine(path: Path) -> str | None:
    try:
        quarantine.clear_quarantine(path)
    except HermesStateError as exc:
        return f"repaired, but the quarantine stays: {exc}"
    return None
