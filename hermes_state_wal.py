"""WAL on connections the caller opened itself, to its own databases, with a fallback.

:func:`apply_wal_with_fallback` sets WAL, but falls back to DELETE mode on file systems that
cannot share memory (``SQLITE_PROTOCOL``, ``SQLITE_AUTH`` only), with one WARNING. A file
already in WAL is never downgraded; a mode that cannot be read gets the switch tried.
``SessionDB`` itself never falls back."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import sys
import threading

__all__ = ["apply_wal_with_fallback", "warned_labels"]

logger = logging.getLogger("hermes_state")

# The result codes of a file system or mount that cannot, or may not, switch to WAL.
SQLITE_PROTOCOL = 15
SQLITE_AUTH = 23
_WAL_REFUSALS = (SQLITE_PROTOCOL, SQLITE_AUTH)

# The journal mode a connection is in (no argument: nothing is changed).
JOURNAL_MODE_SQL = "PRAGMA journal_mode"
# The switch, and the fallback where the file system refuses it; each returns the mode set.
SET_WAL_SQL = "PRAGMA journal_mode=WAL"
SET_DELETE_SQL = "PRAGMA journal_mode=DELETE"
# A read that makes the connection look at the file's header again (another connection may
# have switched the file to WAL since this one last read it).
HEADER_READ_SQL = "SELECT COUNT(*) FROM sqlite_master"
# macOS durability settings for a WAL connection.
MACOS_WAL_SQL = ("PRAGMA checkpoint_fullfsync=1", "PRAGMA synchronous=FULL")

# The labels warned about in this process (clearing one re-arms its warning).
warned_labels: set[str] = set()
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
        if db_label in warned_labels:
            return
        warned_labels.add(db_label)
    logger.warning(
        "%s: WAL mode is not available here (%s); using journal_mode=DELETE, in which readers "
        "wait for writers (network and FUSE file systems often cannot share WAL's memory)",
        db_label, exc,
    )


def _macos_settings(conn: sqlite3.Connection, macos: bool | None) -> None:
    # The platform is read at each call, so the settings can be exercised on other systems.
    if sys.platform == "darwin" if macos is None else macos:
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
    try:
        current = _mode(conn, JOURNAL_MODE_SQL)
    except sqlite3.Error:
        current = ""  # an unreadable mode: the switch below tells
    if current == "wal":
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
