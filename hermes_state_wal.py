"""WAL on connections the caller opened itself, to its own databases, with a fallback.

:func:`apply_wal_with_fallback` is for code that keeps other SQLite databases beside the session
store (a kanban board, a project list, a response store) and wants them in WAL mode like
``state.db``, but on file systems that cannot do WAL (NFS, SMB, some FUSE mounts) still wants
them to work. ``SessionDB`` itself never falls back: it refuses a file that will not take WAL.

* A file that already reads ``wal`` is left as it is: no set-pragma is issued.
* Otherwise WAL is set. A file system whose locks cannot serve WAL's shared memory fails the
  switch with ``SQLITE_PROTOCOL`` ("locking protocol", as network mounts report it); a mount
  or authorizer that forbids the pragma with ``SQLITE_AUTH`` ("not authorized", which Python
  raises as a plain ``DatabaseError``, not an ``OperationalError``). Those two result codes,
  and only those (an error raised without a result code, by a connection wrapper, is read by
  SQLite's own text for them), switch the connection to DELETE mode, with one WARNING per ``db_label`` per
  process — unless the file turns out to be in WAL mode after all (another connection switched
  it meanwhile, or it cannot be read to tell): a WAL file is never downgraded, so the error is
  raised. Any other error propagates.
* A VFS without shared memory (``unix-none``, ``unix-dotfile``) keeps the file in rollback mode
  without an error; the mode it reports is returned as it is.
* On macOS, once WAL is active, ``checkpoint_fullfsync=1`` and ``synchronous=FULL`` are set
  (Apple's ``fsync`` does not reach the platter); a failure to set them is ignored.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import sys
import threading

__all__ = ["apply_wal_with_fallback"]

logger = logging.getLogger("hermes_state")

# Whether this system is macOS (where WAL connections get fuller fsyncs).
MACOS = sys.platform == "darwin"

# The result codes of a file system or mount that cannot, or may not, switch to WAL.
SQLITE_PROTOCOL = 15
SQLITE_AUTH = 23
_WAL_REFUSALS = (SQLITE_PROTOCOL, SQLITE_AUTH)

# The journal mode a connection is in (no argument: nothing is changed).
JOURNAL_MODE_SQL = "PRAGMA journal_mode"
# The switch, and the fallback where the file system refuses it; each returns the mode set.
SET_WAL_SQL = "PRAGMA journal_mode = WAL"
SET_DELETE_SQL = "PRAGMA journal_mode = DELETE"
# A read that makes the connection look at the file's header again (another connection may
# have switched the file to WAL since this one last read it).
HEADER_READ_SQL = "SELECT COUNT(*) FROM sqlite_master"
# macOS durability settings for a WAL connection.
MACOS_WAL_SQL = ("PRAGMA checkpoint_fullfsync = 1", "PRAGMA synchronous = FULL")

_warned_labels: set[str] = set()
_warned_lock = threading.Lock()


def _mode(conn: sqlite3.Connection, sql: str) -> str:
    row = conn.execute(sql).fetchone()
    return str(row[0]).lower() if row and row[0] is not None else ""


# SQLite's own text for those two result codes, for an error raised without its code (a
# connection wrapper's, a test double's): such an error carries nothing else to read.
_REFUSAL_TEXTS = ("locking protocol", "not authorized", "authorization denied")


def _refuses_wal(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return (code & 0xFF) in _WAL_REFUSALS
    return str(exc).strip().lower().startswith(_REFUSAL_TEXTS)


def _file_is_wal(conn: sqlite3.Connection) -> bool | None:
    """Whether the file itself is in WAL mode now (None: it could not be read)."""
    try:
        conn.execute(HEADER_READ_SQL).fetchone()
        return _mode(conn, JOURNAL_MODE_SQL) == "wal"
    except sqlite3.Error:
        return None


def _warn_once(db_label: str, exc: sqlite3.Error) -> None:
    with _warned_lock:
        if db_label in _warned_labels:
            return
        _warned_labels.add(db_label)
    logger.warning(
        "%s: WAL mode is not available here (%s); using journal_mode=DELETE, in which readers "
        "wait for writers (network and FUSE file systems often cannot share WAL's memory)",
        db_label, exc,
    )


def _macos_settings(conn: sqlite3.Connection, macos: bool | None) -> None:
    if MACOS if macos is None else macos:
        for sql in MACOS_WAL_SQL:
            with contextlib.suppress(sqlite3.Error):
                conn.execute(sql)


def apply_wal_with_fallback(
    conn: sqlite3.Connection, *, db_label: str = "state.db", macos: bool | None = None
) -> str:
    """Put the caller's own connection ``conn`` in WAL mode, falling back to DELETE where the
    file system refuses WAL (see the module docstring). Returns ``"wal"``, ``"delete"`` after
    the fallback, or the mode a VFS without shared memory kept (``"delete"`` for a file).

    ``db_label`` names the database in the one WARNING per label per process. ``macos``: give
    a WAL connection macOS's fuller fsyncs (None: on macOS only). Call it outside any
    transaction (SQLite does not change journal modes inside one)."""
    if _mode(conn, JOURNAL_MODE_SQL) == "wal":
        _macos_settings(conn, macos)
        return "wal"
    try:
        mode = _mode(conn, SET_WAL_SQL)
    except sqlite3.Error as exc:
        if not _refuses_wal(exc) or _file_is_wal(conn) is not False:
            raise
        _warn_once(db_label, exc)
        return _mode(conn, SET_DELETE_SQL)
    if mode == "wal":
        _macos_settings(conn, macos)
    return mode
