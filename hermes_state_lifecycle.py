"""The life of a ``SessionDB`` handle's connection: opening it, reading through it, closing it.

A writable open, under the process's open lock, refuses a symlink and a truncated file (an empty
main file beside a ``-wal`` that is not: SQLite would delete that ``-wal`` on the first read),
takes on a quarantine this process or an earlier one recorded, and looks for damage in the
``-wal`` before anything could checkpoint it; a handle born quarantined reads and never
writes. Otherwise it configures the connection and creates or migrates the schema, each a
write under the retry policy (``hermes_state_writes``). A read-only open creates nothing and
refuses a file that is missing, empty or not at the current schema.

Every read is one read transaction under the handle's lock; an SQLite error becomes a typed
error, and corruption met in the record quarantines the file (``hermes_state_quarantine``).
Closing runs the handle's last checkpoint unless the file is quarantined or its checkpoints are
left to Litestream.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Callable, Iterator
from typing import Literal, Protocol, TypeVar

import hermes_state_connect as dbconn
import hermes_state_errors as errors
import hermes_state_files as db_files
import hermes_state_fulltext as fulltext
import hermes_state_quarantine as quarantine
import hermes_state_replication as replication
import hermes_state_schema as schema
import hermes_state_writes as writes

__all__ = [
    "Handle",
    "OnConnect",
    "Role",
    "checked_hook",
    "checkpoints",
    "watch",
    "connect",
    "open_writable",
    "open_read_only",
    "close",
    "read",
    "snapshot_reader",
]

logger = logging.getLogger("hermes_state")
T = TypeVar("T")


#: Which connection of a handle: its own, the checkpoint helper, the snapshot reader, the
#: close guard of a quarantined file.
Role = Literal["handle", "helper", "snapshot", "guard"]
#: The hook a handle calls with each connection it opens (see ``SessionDB``).
OnConnect = Callable[[Role, sqlite3.Connection], object]


class Handle(writes.Store, Protocol):
    """What opening, reading and closing need of a handle (``SessionDB``)."""

    _on_connect: OnConnect | None
    full_text: str

    @property
    def quarantined(self) -> bool: ...

    def close(self) -> None: ...


def checked_hook(
    on_connect: OnConnect | None, wal_reset_exposed: bool | None
) -> OnConnect | None:
    """``on_connect`` once both knobs of a handle being opened passed their type checks
    (:class:`InvalidTypeError` otherwise)."""
    if on_connect is not None and not callable(on_connect):
        raise errors.InvalidTypeError("on_connect must be callable", argument="on_connect")
    if wal_reset_exposed is not None and not isinstance(wal_reset_exposed, bool):
        raise errors.InvalidTypeError("wal_reset_exposed must be a bool or None",
                                      argument="wal_reset_exposed")
    return on_connect


def checkpoints(db: Handle, wal_reset_exposed: bool | None) -> writes.Checkpoints:
    """The checkpoint policy of a handle being opened: read-only handles never checkpoint,
    whoever does. ``wal_reset_exposed`` None: this SQLite's own exposure."""
    return writes.Checkpoints(
        db.path, lambda: connect(db, "rw", 0.0, "helper"),
        leave_to_litestream=(
            not db.read_only and replication.checkpoints_left_to_litestream(db.path)
        ),
        wal_reset_exposed=(
            dbconn.wal_reset_exposed() if wal_reset_exposed is None else wal_reset_exposed),
        every=db.timing.checkpoint_every,
    )


def watch(db: Handle) -> quarantine.Watch:
    """The quarantine of a handle being opened (its lock and checkpoints already made)."""
    timeout = db.timing.read_busy_timeout_s if db.read_only else db.timing.busy_timeout_s
    return quarantine.Watch(
        db.path, db.profile_home, read_only=db.read_only, lock=db._lock,
        connections=lambda: (db._connection, db._checkpoints.helper),
        guard=lambda: connect(db, "ro", timeout, "guard"),
        fts_only=lambda exc: writes.fts_only(db, exc),
    )


def connect(db: Handle, mode: str, timeout: float, role: Role = "handle") -> sqlite3.Connection:
    """Every connection of the handle (its own, the checkpoint helper, the close guard, the
    snapshot reader), configured by ``hermes_state_connect.configure_connection``.

    Inside the WAL-reset bug range, and while checkpoints are left to Litestream, none of them
    ever checkpoints on its own: automatic checkpoints are off from the first statement (the
    setting touches no file). The handle's ``on_connect`` hook sees each first."""
    hook = db._on_connect
    conn = dbconn.connect(db.path, mode, timeout=timeout,
                          on_open=None if hook is None else lambda conn: hook(role, conn))
    fulltext.register(conn, db.full_text)
    if db._checkpoints.automatic_off():
        conn.execute(writes.WAL_AUTOCHECKPOINT_OFF_SQL)
    return conn


def open_writable(db: Handle) -> sqlite3.Connection:
    """Open the handle's writable connection (see the module docstring)."""
    with quarantine.OPEN_LOCK:
        db_files.refuse_symlinks(db.path)
        if db_files.wal_without_database(db.path):
            raise errors.StateDbCorruptError(
                f"{db.path} is empty but its -wal is not: the file was truncated",
                path=db.path,
            )
        earlier = quarantine.inherited(db.path)
        if earlier is None:
            db_files.prepare_db_file(db.path)
        db._watch.file_id = quarantine.file_identity(db.path)
        db._connection = connect(db, "rw", db.timing.busy_timeout_s)
        quarantine.track(db)
        if earlier is None:
            # Before any write: a -wal damaged in the middle must never be checkpointed.
            earlier = quarantine.wal_damage(db.path, db._connection)
    if earlier is not None:
        # Born quarantined: it reads, spools what it cannot write, and never writes.
        logger.warning("%s was quarantined earlier; no writes: %s", db.path, earlier)
        db._watch.enter(earlier)
        return db._connection
    try:
        writes.outside_transaction(db, lambda conn: schema.configure_writable(conn, db.path))
        schema.ensure_schema(db._connection, lambda fn: writes.write(db, fn),
                             full_text=db.full_text)
        db_files.tighten_modes(db.path)
    except BaseException:
        close_connections(db)
        raise
    return db._connection


def open_read_only(db: Handle) -> sqlite3.Connection:
    """Open the handle's read-only connection (see the module docstring)."""
    db_files.refuse_symlinks(db.path)
    if db_files.wal_without_database(db.path):  # the first read would delete the -wal
        raise errors.StateDbUnavailableError(
            f"{db.path} is truncated: the main file is empty but its -wal is not (it "
            "lost its content; it is not a new store)",
            reason=errors.TRUNCATED_REASON, path=db.path)
    if not db.path.is_file() or db.path.stat().st_size == 0:
        raise errors.StateDbUnavailableError(
            f"no initialised session store at {db.path}",
            reason="uninitialized",
            path=db.path,
        )
    db._watch.file_id = quarantine.file_identity(db.path)
    try:
        conn = connect(db, "ro", db.timing.read_busy_timeout_s)
    except sqlite3.Error as exc:
        raise read_error(db, exc) from exc
    try:
        schema.require_current(conn, db.path)
    except sqlite3.Error as exc:
        conn.close()
        error = read_error(db, exc)
        # SQLITE_NOTADB: not a database at all, as far as a reader can tell (no marker
        # beside a file that may not be a store); a writable open still quarantines it.
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if errors.is_corruption_error(exc) and code != errors.SQLITE_NOTADB:
            db._watch.record(exc, error)
        raise error from exc
    except BaseException:
        conn.close()
        raise
    return conn


def close(db: Handle) -> None:
    """Close the handle's connections, once. A quarantined handle skips every checkpoint and
    leaves the -wal; so does one whose checkpoints are left to Litestream."""
    with db._lock:
        if db._closed:
            return
        db._watch.adopt()
        db._closed = True
        quarantine.untrack(db)
        if not db.read_only and db._watch.reason is None and (
            db._checkpoints.owned(db._connection)
        ):
            with contextlib.suppress(sqlite3.Error):
                db._checkpoints.run(db._connection)
        close_connections(db)


def close_connections(db: Handle) -> None:
    db._checkpoints.close()
    db._turnstile.close()
    db._connection.close()


def read(db: Handle, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn(conn)`` under the handle's lock, in one read transaction (every statement of
    it sees the same snapshot); SQLite errors become typed errors.

    Corruption a read meets in the record itself (not only in an index) quarantines a
    writable handle as a write would: the file is proven damaged either way. A read-only
    handle records it (the marker beside the file) for the writers that come next."""
    with db._lock:
        writes.check_open(db)
        try:
            with dbconn.read_transaction(db._connection):
                return fn(db._connection)
        except sqlite3.Error as exc:
            error = read_error(db, exc)
            db._watch.met_damage(exc, error)
            raise error from exc


def read_error(db: Handle, exc: sqlite3.Error) -> Exception:
    """The typed error of an SQLite error a read met."""
    if db.read_only and errors.is_sqlite_lock_error(exc):
        return errors.StateDbUnavailableError(
            f"session store {db.path} stayed locked for {db.timing.read_busy_timeout_s:g} s",
            reason="busy",
            path=db.path,
        )
    return (errors.translate_read if db.read_only else errors.translate)(exc, db.path)


@contextlib.contextmanager
def snapshot_reader(db: Handle) -> Iterator[sqlite3.Connection]:
    """A second, read-only connection inside one read transaction: a consistent snapshot for
    long reads (a streaming export) that must not hold the handle's lock."""
    writes.check_open(db)
    conn = connect(db, "ro", db.timing.read_busy_timeout_s, "snapshot")
    try:
        conn.execute("BEGIN")
        yield conn
    except sqlite3.Error as exc:
        error = read_error(db, exc)
        db._watch.met_damage(exc, error)
        raise error from exc
    finally:
        conn.close()
