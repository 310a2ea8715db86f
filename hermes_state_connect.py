"""Connections and transactions: the one way a connection is opened, and one helper per kind of
transaction.

:func:`connect` opens connections in autocommit mode, so a transaction exists only where a
helper opens it: :func:`transaction` for a write (``BEGIN IMMEDIATE``, a savepoint when
nested) or :func:`read_transaction` for one snapshot. The ``state_meta`` helpers live here too."""

from __future__ import annotations

import contextlib
import functools
import itertools
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

from hermes_state_common import Text, clean_text, encode_json
from hermes_state_errors import InvalidTypeError

__all__ = [
    "CELL_SIZE_CHECK_SQL",
    "configure_connection",
    "connect",
    "get_meta",
    "read_transaction",
    "set_meta",
    "split_sql",
    "table_exists",
    "transaction",
    "wal_reset_exposed",
]


# Has SQLite check each cell's size against its page whenever it loads a b-tree page (a flag
# of the connection: nothing is read or written).
CELL_SIZE_CHECK_SQL = "PRAGMA cell_size_check = ON"


def configure_connection(conn: sqlite3.Connection, /) -> sqlite3.Connection:
    """Apply the settings every connection on a store gets, whoever opens it; returns ``conn``.

    ``cell_size_check``: by default SQLite trusts the cell sizes a b-tree page records, so a
    leaf whose cells hold random bytes (its header intact) still takes an append, and the next
    checkpoint writes that page back into the damaged file. With the check on, such a page
    fails with ``SQLITE_CORRUPT`` the first time it is loaded, so the damage is met before
    anything is written. Appends do not notice it; FTS5 reading a quoted phrase's position
    lists does (see docs/performance.md)."""
    conn.execute(CELL_SIZE_CHECK_SQL)
    return conn


# SQLite's busy timeout of a connection that does not say otherwise.
DEFAULT_BUSY_TIMEOUT_S = 5.0
_CONNECT_MODES = frozenset({"ro", "rw", "rwc"})


def connect(
    path: Path,
    mode: str,
    *,
    timeout: float = DEFAULT_BUSY_TIMEOUT_S,
    immutable: bool = False,
    on_open: Callable[[sqlite3.Connection], object] | None = None,
) -> sqlite3.Connection:
    """The one way the library opens a connection on a database file, whoever opens it (the
    facade, maintenance, recover, import's spool, replication, quarantine checks).

    A URI open with ``mode`` (``ro``, ``rw``, or ``rwc``, which may create the file) and
    ``nofollow=1`` (SQLite refuses a symlink), autocommit (``isolation_level=None``: the
    transaction helper says where transactions are), usable from any thread (the caller holds
    its own lock) and configured by :func:`configure_connection`. ``immutable`` is only for a
    private image nothing else can change (recover's copies): SQLite then takes no locks and
    ignores sidecars. ``on_open(conn)`` runs before the first statement on it."""
    if mode not in _CONNECT_MODES:
        raise ValueError(f"mode must be one of {sorted(_CONNECT_MODES)}, got {mode!r}")
    uri = f"{path.as_uri()}?mode={mode}&nofollow=1" + ("&immutable=1" if immutable else "")
    conn = sqlite3.connect(
        uri, uri=True, isolation_level=None, check_same_thread=False, timeout=timeout
    )
    if on_open is not None:
        on_open(conn)
    return configure_connection(conn)


# The WAL-reset bug (corruption when a WAL reset races a concurrent checkpoint) is fixed in
# 3.51.3 and in the 3.50.7 and 3.44.6 backports.
_WAL_RESET_FIXED = ((3, 44, 6), (3, 50, 7), (3, 51, 3))


def wal_reset_exposed(version: tuple[int, ...] = sqlite3.sqlite_version_info) -> bool:
    """True when this SQLite library is inside the WAL-reset bug range."""
    for fixed in _WAL_RESET_FIXED:
        if version[:2] == fixed[:2]:
            return version < fixed
    return version < (3, 51, 3) and version[:2] not in {f[:2] for f in _WAL_RESET_FIXED}


_savepoint_ids = itertools.count(1)


@contextlib.contextmanager
def transaction(
    conn: sqlite3.Connection, /, *, rollback_only: bool = False
) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction, or a SAVEPOINT when one is already open.

    Any exception rolls back (to the savepoint when nested) and propagates; a failed rollback
    never hides the original error. ``rollback_only``: the block is rolled back even when it
    succeeds — for a check SQLite runs as a write (FTS5's ``integrity-check``) that must leave
    nothing behind.
    """
    if conn.in_transaction:
        name = f"hermes_sp_{next(_savepoint_ids)}"
        conn.execute(f"SAVEPOINT {name}")
        try:
            yield conn
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute(f"ROLLBACK TO {name}")
                conn.execute(f"RELEASE {name}")
            raise
        if rollback_only:
            conn.execute(f"ROLLBACK TO {name}")
        conn.execute(f"RELEASE {name}")
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("ROLLBACK" if rollback_only else "COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


@contextlib.contextmanager
def read_transaction(conn: sqlite3.Connection, /) -> Iterator[sqlite3.Connection]:
    """One read transaction around a read of several statements, so that they all see the
    same snapshot: outside a transaction each statement sees the latest commit, which may land
    between two of them (a search would pick ids in one state and fetch the rows in another).
    Inside an open transaction, that one."""
    if conn.in_transaction:
        yield conn
        return
    conn.execute("BEGIN")
    try:
        yield conn
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@functools.cache
def split_sql(script: str) -> tuple[str, ...]:
    """Split a script of complete statements (triggers included) for conn.execute()."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            if current.strip():
                statements.append(current.strip())
            current = ""
    if current.strip():
        raise ValueError(f"incomplete SQL statement: {current.strip()[:60]!r}")
    return tuple(statements)


SET_META_SQL = """
INSERT INTO state_meta (key, value) VALUES (?, ?)
ON CONFLICT(key) DO UPDATE SET value = excluded.value
"""


def get_meta(conn: sqlite3.Connection, /, key: Text) -> str | None:
    """The value stored under ``key`` (lone surrogates removed, as :func:`set_meta` does)."""
    if not isinstance(key, str):
        raise InvalidTypeError(f"a meta key must be a string, got {type(key).__name__}")
    row = conn.execute("SELECT value FROM state_meta WHERE key = ?", (clean_text(key),)).fetchone()
    return None if row is None else row[0]


def set_meta(conn: sqlite3.Connection, /, key: Text, value: object) -> None:
    """Store ``value`` under ``key`` (strings as they are, anything else as JSON)."""
    if not isinstance(key, str):
        raise InvalidTypeError(f"a meta key must be a string, got {type(key).__name__}")
    text = value if isinstance(value, str) else encode_json(value) or "null"
    conn.execute(SET_META_SQL, (clean_text(key), clean_text(text)))


def table_exists(conn: sqlite3.Connection, /, name: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return row is not None
