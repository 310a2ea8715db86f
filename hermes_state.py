"""hermes_state: the SQLite session store of an AI agent — the ``SessionDB`` facade.

``SessionDB`` owns one connection, one re-entrant lock and the public API. Every concern lives
in a sibling module as plain functions that take the connection first; a method here
validates, picks the transaction kind and delegates.

Write discipline (one place, :meth:`SessionDB._write`):

* every write is one ``BEGIN IMMEDIATE`` transaction (``hermes_state_common.transaction``), so
  lock contention surfaces when the transaction starts, never half-way through it;
* SQLite's own busy timeout is short (1 s); on a lock error (recognised by result code) the
  whole transaction is retried after a random pause — 20–150 ms during the first 2 s, then
  250 ms–1 s — so that contending writers do not retry in lockstep, until the write's patience
  runs out: 20 s for ordinary writes, 60 s for transcript writes, 0.5 s for activity stamps.
  Then :class:`StateDbLockedError` (reason ``session_persistence_failed:locked``) names the
  processes holding the lock, in a WARNING and in ``<home>/logs/errors.log``. An activity
  stamp (an observation such as the working directory, see :func:`_activity`) is skipped at
  that point instead of raising: nothing depends on it, and the next observation stamps again;
* corruption proven to lie in the FTS indexes only detaches them (``fts_stale``) and the
  canonical write is retried once without them; any other corruption quarantines the file;
* after every 50 successful writes a PASSIVE checkpoint runs. With an SQLite inside the
  WAL-reset bug range, automatic checkpoints are off on every connection a handle opens, and
  every checkpoint a handle runs (after 50 writes, :meth:`SessionDB.checkpoint`, in
  ``close()``) runs from a helper connection while the handle holds the write lock, so no
  checkpoint overlaps a write of any hermes_state process;
* while checkpoints are left to Litestream (``hermes_state_replication``: the
  ``HERMES_STATE_CHECKPOINTS`` setting, or a replicator started with ``--leave-checkpoints``
  that is still running), a handle runs none of those checkpoints and every connection's
  automatic checkpoints are off; the setting is read at open and at every checkpoint decision.

Quarantine. Plain ``SQLITE_CORRUPT`` / ``SQLITE_NOTADB`` (not FTS-only), met by a write, a read
or the open itself, raises :class:`StateDbCorruptError` at once (no retry) and quarantines the
file: that handle, every other handle of the process on the file and every handle opened on it
later refuse writes without touching the file (transcript writes spool to
``<home>/sessions/<id>.jsonl`` instead); nothing rebuilds an FTS index of a file whose record
fails ``quick_check``; ``close()`` skips its checkpoint. The first quarantine of a file in a
process also writes a durable marker beside it (``hermes_state_quarantine``), so every later
writable open, in any process, starts out quarantined the same way until the marker is
cleared (after the file is mended or replaced). SQLite's own checkpoint, run by the last
connection to close, is kept from copying the ``-wal`` into the damaged file by
``SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE`` on every connection of the handle (Python ≥ 3.12) and, on
every Python, by a read-only connection the process keeps open on the file until it exits
(while it is open no other connection of the process closes last; a read-only connection
cannot checkpoint; at exit, handles still open close before it). Every connection checks cell
sizes (``cell_size_check``), so random bytes in a leaf are met as corruption before an append
writes around them. Not covered:

* other processes that already had the file open when it was quarantined: the marker is read
  when a store is opened, so one that has not met the damage itself goes on writing and
  checkpointing until it is restarted;
* connections this library did not open: an ``sqlite3`` connection the application left open
  on the file may be the last to close at exit, and it checkpoints;
* on Python 3.11, where that read-only connection is the only protection, a guard that could
  not be opened (no file descriptor left, the file unreadable): the handle's own connection
  may then close last and checkpoint, as SQLite does by default.

A file whose ``-wal`` is not empty while the database file is (truncated) is refused at open:
SQLite would delete that ``-wal`` on the first read.

The constants below are module attributes on purpose: tests shorten them.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import logging
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, Concatenate, ParamSpec, TypeVar

import hermes_state_common as common
import hermes_state_compression as compression
import hermes_state_compression_failures as compression_failures
import hermes_state_context_window as context_window
import hermes_state_fts as fts
import hermes_state_gateway as gateway
import hermes_state_handoff as handoff
import hermes_state_lockowners as lockowners
import hermes_state_messages as messages
import hermes_state_peers as peers
import hermes_state_portability as portability
import hermes_state_quarantine as quarantine
import hermes_state_rank as rank
import hermes_state_replication as replication
import hermes_state_rewind as rewind
import hermes_state_schema as schema
import hermes_state_search as search
import hermes_state_session_model as session_model
import hermes_state_sessions as sessions
import hermes_state_telegram as telegram
import hermes_state_testguard as testguard
import hermes_state_workspace as workspace
from hermes_state_common import (
    SCHEMA_VERSION,
    child_process_env,
    display_hermes_home,
    get_hermes_home,
    hermes_home_override,
    profile_config_path,
    resolve_profile_home,
)
import hermes_state_errors as errors
from hermes_state_errors import *  # noqa: F403 -- the facade re-exports the error hierarchy
from hermes_state_async import AsyncSessionDB
from hermes_state_portability import (
    backup_state_db,
    recover_state_db,
    repair_state_db,
    restore_state_db,
)
from hermes_state_profiles import ProfileStoreRegistry, resolve_store_home
from hermes_state_wal import apply_wal_with_fallback
from hermes_state_workspace import workspace_key

__all__ = [
    "SessionDB",
    "AsyncSessionDB",
    "apply_wal_with_fallback",
    "collect_profile_stats",
    "backup_state_db",
    "restore_state_db",
    "repair_state_db",
    "recover_state_db",
    "SCHEMA_VERSION",
    "get_hermes_home",
    "hermes_home_override",
    "display_hermes_home",
    "resolve_profile_home",
    "resolve_store_home",
    "profile_config_path",
    "child_process_env",
    "ProfileStoreRegistry",
    "profile_stores",
    "workspace_key",
    *errors.__all__,
]

logger = logging.getLogger("hermes_state")
T = TypeVar("T")
P = ParamSpec("P")

_WRITE_PATIENCE_S, _TRANSCRIPT_WRITE_PATIENCE_S, _ACTIVITY_WRITE_PATIENCE_S = 20.0, 60.0, 0.5
_WRITE_RETRY_MIN_S, _WRITE_RETRY_MAX_S = 0.020, 0.150
_WRITE_RETRY_SLOW_MIN_S, _WRITE_RETRY_SLOW_MAX_S = 0.250, 1.000
_CHECKPOINT_EVERY_N_WRITES = 50
_FAST_RETRY_WINDOW_S = 2.0
_SQLITE_BUSY_TIMEOUT_S = 1.0
_READ_BUSY_TIMEOUT_S = 5.0

_PATIENCE = {
    "write": "_WRITE_PATIENCE_S",
    "transcript": "_TRANSCRIPT_WRITE_PATIENCE_S",
    "activity": "_ACTIVITY_WRITE_PATIENCE_S",
}

# Serialises file creation with connection opening inside this process, so that the
# descriptor prepare_db_file() closes can never belong to a file another handle has locked.
_OPEN_LOCK = threading.Lock()


def _retry_delay(elapsed: float) -> float:
    if elapsed < _FAST_RETRY_WINDOW_S:
        return random.uniform(_WRITE_RETRY_MIN_S, _WRITE_RETRY_MAX_S)
    return random.uniform(_WRITE_RETRY_SLOW_MIN_S, _WRITE_RETRY_SLOW_MAX_S)


def _method_signature(fn: Callable[..., Any]) -> inspect.Signature:
    """``fn``'s signature with its leading connection parameter shown as ``self``."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sig.replace(parameters=[self_param, *params[1:]])


# The method factories are typed with Concatenate so that type checkers see each generated
# method with its sibling function's own parameters and return type (the connection dropped).
Method = Callable[Concatenate["SessionDB", P], T]


def _reads(fn: Callable[Concatenate[sqlite3.Connection, P], T]) -> Method[P, T]:
    """A SessionDB method that runs the sibling function ``fn(conn, ...)`` as a read."""

    @functools.wraps(fn)
    def method(self: SessionDB, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._read(lambda conn: fn(conn, *args, **kwargs))

    method.__signature__ = _method_signature(fn)  # type: ignore[attr-defined]
    return method


def _writes(
    fn: Callable[Concatenate[sqlite3.Connection, P], T],
    kind: str = "write",
    *,
    spool: bool | tuple[str, str] = False,
    like: Callable[..., Any] | None = None,
) -> Method[P, T]:
    """A SessionDB method that runs ``fn(conn, ...)`` through the write wrapper.

    With ``spool`` (transcript writes) the message(s) of a write refused because the file is
    corrupt are appended to ``<home>/sessions/<session_id>.jsonl`` and the raised
    :class:`StateDbCorruptError` names that file in ``spooled_to``. ``spool=True`` reads the
    ``session_id`` and ``messages`` parameters; a pair names them instead. Without a messages
    argument the call's own arguments (``**`` keywords flattened) are the one record.
    ``like`` lends its parameters to a ``fn`` that takes ``*args, **kwargs`` and passes them on.
    """
    signature = inspect.signature(like or fn)
    params = ("session_id", "messages") if spool is True else spool or ("", "")
    session_param, messages_param = params

    @functools.wraps(like or fn)
    def method(self: SessionDB, /, *args: P.args, **kwargs: P.kwargs) -> T:
        # A retried transaction calls fn again: one-shot iterators must survive that.
        call_args = tuple(list(a) if isinstance(a, Iterator) else a for a in args)
        call_kwargs = {k: list(v) if isinstance(v, Iterator) else v for k, v in kwargs.items()}
        call: Callable[..., T] = fn
        try:
            return self._write(lambda conn: call(conn, *call_args, **call_kwargs), kind)
        except errors.StateDbCorruptError as exc:
            if spool:
                bound = signature.bind(None, *call_args, **call_kwargs).arguments
                session_id = str(bound[session_param])
                records = bound.get(messages_param) or [_call_record(signature, bound)]
                try:
                    exc.spooled_to = common.spool_transcript(
                        session_id,
                        [{"session_id": session_id, **r} for r in records],
                        home=self.profile_home,
                    )
                except (OSError, errors.UnsafePathError) as spool_error:  # the corrupt error stays
                    logger.error("could not spool the transcript of %s: %s", session_id,
                                 spool_error)
                    exc.add_note(f"the transcript could not be spooled: {spool_error}")
            raise

    method.__signature__ = _method_signature(like or fn)  # type: ignore[attr-defined]
    return method


# What a failing store does (a closed handle included) — not what a bad argument does: an
# InvalidInputError still reaches the caller.
_STORE_ERRORS: tuple[type[BaseException], ...] = (
    sqlite3.Error,
    errors.StateDbLockedError,
    errors.StateDbCorruptError,
    errors.StateDbFullError,
    errors.StateDbIOError,
    errors.StateDbClosedError,
    errors.StateDbUnavailableError,
)


def _or_fallback(method: Method[P, T], fallback: Callable[[], T]) -> Method[P, T]:
    """``method`` for callers that probe the store and switch a feature off on failure: a
    store error is logged and answered with ``fallback()`` instead of raised."""

    @functools.wraps(method)
    def lenient(self: SessionDB, /, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(self, *args, **kwargs)
        except _STORE_ERRORS as exc:
            logger.warning("%s on %s answered without the store: %s", method.__name__,
                           self.path, exc)
            return fallback()

    lenient.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
    return lenient


def _activity(fn: Callable[Concatenate[sqlite3.Connection, P], None]) -> Method[P, None]:
    """An observation-only stamp: ``fn`` written with the activity patience (0.5 s). When the
    patience runs out the stamp is skipped — the write wrapper has already logged the lock
    holders — rather than an error reaching the code that made the observation."""
    write = _writes(fn, "activity")

    @functools.wraps(write)
    def stamp(self: SessionDB, /, *args: P.args, **kwargs: P.kwargs) -> None:
        try:
            write(self, *args, **kwargs)
        except errors.StateDbLockedError:
            logger.warning("%s on %s skipped: the store stayed locked", fn.__name__, self.path)

    stamp.__signature__ = inspect.signature(write)  # type: ignore[attr-defined]
    return stamp


def _call_record(signature: inspect.Signature, bound: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for name, value in bound.items():
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            record.update(value)
        elif name != "conn":
            record[name] = value
    return record


# The files this process has quarantined, by (device, inode): the error that proved each one
# corrupt and its close guard, a read-only connection kept open until the process exits (see
# SessionDB._quarantine). A later writable handle on the same file starts out quarantined,
# without writing anything, for the rest of the process (the guard keeps the inode from being
# reused); across processes the marker of hermes_state_quarantine does the same.
# Guarded by _OPEN_LOCK.
_QUARANTINED_FILES: dict[tuple[int, int], tuple[BaseException, sqlite3.Connection | None]] = {}
# The open writable handles of this process (added under _OPEN_LOCK).
_LIVE_HANDLES: weakref.WeakSet[SessionDB] = weakref.WeakSet()


@atexit.register
def _close_quarantined_handles() -> None:
    """At exit, close every handle still open on a quarantined file (without a checkpoint)
    while the file's close guard is still open: left to the interpreter's teardown, a
    connection could be closed after the guard, be the last one, and checkpoint."""
    for handle in list(_LIVE_HANDLES):
        if handle.quarantined:
            handle.close()


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path`` itself, from ``lstat`` (no descriptor is opened)."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _earlier_quarantine(path: Path) -> BaseException | None:
    """The quarantine a new writable handle on ``path`` inherits: this process's (the error
    that proved the file corrupt), else an earlier process's marker. Under _OPEN_LOCK."""
    file_id = _file_identity(path)
    earlier = None if file_id is None else _QUARANTINED_FILES.get(file_id)
    if earlier is not None:
        return earlier[0]
    return quarantine.earlier_quarantine(path)


# Switches off automatic checkpoints for one connection (no file is read or written).
WAL_AUTOCHECKPOINT_OFF_SQL = "PRAGMA wal_autocheckpoint = 0"
# Gives one connection back SQLite's default automatic checkpoint (at 1000 WAL pages).
WAL_AUTOCHECKPOINT_DEFAULT_SQL = "PRAGMA wal_autocheckpoint = 1000"
# The checkpoint that never waits for readers or writers; its result row is inspected.
CHECKPOINT_SQL = "PRAGMA wal_checkpoint(PASSIVE)"
# SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, which the sqlite3 module exposes from Python 3.12 on.
_NO_CKPT_ON_CLOSE: int | None = getattr(sqlite3, "SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE", None)
# The first read of a close guard, which takes the database's shared lock.
GUARD_READ_SQL = "SELECT COUNT(*) FROM sqlite_master"


class SessionDB:
    """A handle on one session store (default: ``get_hermes_home() / "state.db"``).

    Thread-safe; usable as a context manager; ``close()`` is idempotent. With
    ``read_only=True`` the file is opened ``mode=ro`` and nothing is ever created, migrated,
    checkpointed or repaired (see :class:`StateDbUnavailableError` for what it refuses).

    ``profile_home`` is fixed at open: the directory of a ``state.db`` (a home's own store),
    else the home of the opening context (a scratch ``db_path``). Transcripts spooled on
    corruption and the lock log go there, so one profile's failures never land in another's
    home, whichever ``hermes_home_override`` the failing call runs under.
    """

    def __init__(
        self,
        db_path: str | Path | None = None,
        *,
        read_only: bool = False,
        rebuild_fts: bool = True,
    ) -> None:
        path = common.default_db_path() if db_path is None else Path(db_path).expanduser()
        testguard.check_test_isolation(path)
        self.path = path.absolute()
        # A home's own store is its state.db; a scratch file belongs to the context's home.
        in_home = self.path.name == common.DB_FILENAME
        self.profile_home = self.path.parent if in_home else common.get_hermes_home().absolute()
        self.read_only = read_only
        self.wal_reset_exposed = common.wal_reset_exposed()
        # Read-only handles never checkpoint, whoever does.
        self._leave_checkpoints = (
            not read_only and replication.checkpoints_left_to_litestream(self.path)
        )
        self.last_checkpoint: tuple[int, int, int] | None = None
        self.write_retries = 0
        self._lock = threading.RLock()
        self._writes = 0
        self._closed = False
        self._quarantined: BaseException | None = None
        self._file_id: tuple[int, int] | None = None
        self._helper: sqlite3.Connection | None = None
        self._rebuild_thread: threading.Thread | None = None
        self._stop_rebuild = threading.Event()
        self._seen = messages.SeenThrough()
        if read_only:
            self._conn = self._open_read_only()
        else:
            self._conn = self._open_writable()
            if rebuild_fts and self._quarantined is None:
                self._start_fts_maintenance()

    # --- opening ------------------------------------------------------------------------------

    def _connect(self, mode: str, timeout: float) -> sqlite3.Connection:
        """Every connection of the handle (its own, the checkpoint helper, the close guard,
        the snapshot reader), configured by ``common.configure_connection``.

        Inside the WAL-reset bug range, and while checkpoints are left to Litestream, none of
        them ever checkpoints on its own: automatic checkpoints are off from the first
        statement (the setting touches no file)."""
        uri = f"{self.path.as_uri()}?mode={mode}&nofollow=1"
        conn = common.configure_connection(sqlite3.connect(
            uri, uri=True, isolation_level=None, check_same_thread=False, timeout=timeout
        ))
        if self.wal_reset_exposed or self._leave_checkpoints:
            conn.execute(WAL_AUTOCHECKPOINT_OFF_SQL)
        return conn

    def _open_writable(self) -> sqlite3.Connection:
        with _OPEN_LOCK:
            common.refuse_symlinks(self.path)
            if common.wal_without_database(self.path):
                raise errors.StateDbCorruptError(
                    f"{self.path} is empty but its -wal is not: the file was truncated",
                    path=self.path,
                )
            earlier = _earlier_quarantine(self.path)
            if earlier is None:
                common.prepare_db_file(self.path)
            self._file_id = _file_identity(self.path)
            self._conn = self._connect("rw", _SQLITE_BUSY_TIMEOUT_S)
            _LIVE_HANDLES.add(self)
        if earlier is not None:
            # Born quarantined: it reads, spools what it cannot write, and never writes.
            logger.warning("%s was quarantined earlier; no writes: %s", self.path, earlier)
            self._quarantine(earlier)
            return self._conn
        try:
            self._write(self._configure_writable, transactional=False)
            schema.ensure_schema(self._conn, self._write)
            common.tighten_modes(self.path)
        except BaseException:
            self._close_connections()
            raise
        return self._conn

    def _configure_writable(self, conn: sqlite3.Connection) -> None:
        """Connection settings, outside any transaction (both pragmas are no-ops inside one)
        but through the retry wrapper: switching a new file to WAL needs its lock.

        A file from a newer library is refused first: switching its journal mode would
        already rewrite its header."""
        schema.refuse_newer(conn, self.path)
        conn.execute("PRAGMA foreign_keys = ON")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise errors.HermesStateError(f"{self.path} refused WAL mode (journal_mode={mode})")

    def _open_read_only(self) -> sqlite3.Connection:
        common.refuse_symlinks(self.path)
        if not self.path.is_file() or self.path.stat().st_size == 0:
            raise errors.StateDbUnavailableError(
                f"no initialised session store at {self.path}",
                reason="uninitialized",
                path=self.path,
            )
        conn = self._connect("ro", _READ_BUSY_TIMEOUT_S)
        try:
            version = schema.read_version(conn)
        except sqlite3.Error as exc:
            conn.close()
            if errors.is_sqlite_lock_error(exc):
                raise errors.StateDbUnavailableError(
                    f"session store {self.path} stayed locked for {_READ_BUSY_TIMEOUT_S:g} s",
                    reason="busy",
                    path=self.path,
                ) from exc
            raise self._translate(exc) from exc
        if version != SCHEMA_VERSION:
            conn.close()
            reason = "uninitialized" if version is None else "incompatible"
            raise errors.StateDbUnavailableError(
                f"session store {self.path} has schema version {version}, "
                f"this library reads {SCHEMA_VERSION}",
                reason=reason,
                path=self.path,
                schema_version=version,
            )
        return conn

    # --- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the handle. A quarantined handle skips every checkpoint and leaves the -wal;
        so does one whose checkpoints are left to Litestream."""
        self._stop_rebuild.set()
        if self._rebuild_thread is not None:
            self._rebuild_thread.join()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            _LIVE_HANDLES.discard(self)
            if not self.read_only and not self.quarantined and self._own_checkpoints():
                with contextlib.suppress(sqlite3.Error):
                    self._checkpoint()
            self._close_connections()

    def _close_connections(self) -> None:
        if self._helper is not None:
            self._helper.close()
        self._conn.close()

    def __enter__(self) -> SessionDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def quarantined(self) -> bool:
        return self._quarantined is not None or self._quarantined_elsewhere()

    def _quarantined_elsewhere(self) -> bool:
        """Adopt a quarantine another handle of this process declared on the same file."""
        earlier = None if self._file_id is None else _QUARANTINED_FILES.get(self._file_id)
        if earlier is not None and self._quarantined is None and not self._closed:
            self._quarantine(earlier[0])
        return earlier is not None

    # --- the write wrapper --------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise errors.StateDbClosedError(f"SessionDB for {self.path} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise errors.HermesStateError(f"SessionDB for {self.path} is read-only")
        if self.quarantined:
            raise errors.StateDbCorruptError(
                f"{self.path} is quarantined after corruption; no further writes on this handle",
                path=self.path,
            ) from self._quarantined

    def _write(
        self,
        fn: Callable[[sqlite3.Connection], T],
        kind: str = "write",
        *,
        transactional: bool = True,
    ) -> T:
        """Run ``fn(conn)`` in one retried ``BEGIN IMMEDIATE`` transaction (see module doc).

        ``kind`` picks the patience ("write", "transcript", "activity"); ``transactional=False``
        is only for statements SQLite refuses inside a transaction (connection pragmas)."""
        patience = globals()[_PATIENCE[kind]]
        start = time.monotonic()
        attempts = 0
        detach_fts = False
        while True:
            attempts += 1
            try:
                with self._lock:
                    self._check_writable()
                    scope = common.transaction if transactional else contextlib.nullcontext
                    with scope(self._conn):
                        if detach_fts:
                            fts.detach_index(self._conn)
                        result = fn(self._conn)
                    self._count_write()
                return result
            except sqlite3.Error as exc:
                if errors.is_sqlite_lock_error(exc):
                    elapsed = time.monotonic() - start
                    if elapsed >= patience:
                        raise self._locked_error(elapsed, attempts) from exc
                    delay = min(_retry_delay(elapsed), max(patience - elapsed, 0.001))
                    self.write_retries += 1
                    logger.debug("write to %s busy (attempt %d); retrying in %.3f s",
                                 self.path, attempts, delay)
                    time.sleep(delay)
                    continue
                if errors.is_corruption_error(exc) and not detach_fts and self._fts_only(exc):
                    logger.warning("FTS index damaged (%s); detaching it from %s", exc, self.path)
                    detach_fts = True
                    continue
                if errors.is_corruption_error(exc):
                    self._quarantine(exc)
                raise self._translate(exc) from exc
            except MemoryError as exc:
                if detach_fts or not self._fts_only(exc):
                    raise
                logger.warning("FTS index damaged (out of memory reading it); detaching it")
                detach_fts = True

    def _fts_only(self, exc: BaseException) -> bool:
        with self._lock:
            return fts.damage_is_fts_only(self._conn, exc)

    def _quarantine(self, exc: BaseException) -> None:
        """Never write to this file again from this process (see the module docstring).

        The handle refuses writes and close() skips its checkpoint. So that SQLite's own
        checkpoint, run when the last connection to a file closes, cannot copy the -wal into
        the damaged file either — whether this handle is closed, dropped or outlived by
        another handle of this process — every connection of the handle gets
        SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE (Python ≥ 3.12), and the process keeps a read-only
        connection on the file until it exits: while it is open no other connection of the
        process is the last one, and a read-only connection cannot checkpoint when it closes.
        The first quarantine of the file in the process declares it (the log lines and the
        durable marker that later processes start out quarantined from).
        """
        with self._lock:
            if self._quarantined is not None:
                return
            self._quarantined = exc
            for conn in filter(None, (self._conn, self._helper)):
                if _NO_CKPT_ON_CLOSE is not None and hasattr(conn, "setconfig"):
                    with contextlib.suppress(sqlite3.Error):
                        conn.setconfig(_NO_CKPT_ON_CLOSE, True)
            if self._file_id is not None:
                with _OPEN_LOCK:
                    if self._file_id not in _QUARANTINED_FILES:
                        _QUARANTINED_FILES[self._file_id] = (exc, self._open_close_guard())
                        quarantine.declare(self.path, exc, self.profile_home)

    def _open_close_guard(self) -> sqlite3.Connection | None:
        """A read-only connection that has read the file, so it holds SQLite's shared lock on
        it (in WAL mode a connection keeps that lock while it is open, even after a read
        that failed on a damaged page); None when not even that can be had."""
        try:
            guard = self._connect("ro", _SQLITE_BUSY_TIMEOUT_S)
        except sqlite3.Error:
            return None
        with contextlib.suppress(sqlite3.Error):
            guard.execute(GUARD_READ_SQL).fetchone()
        return guard

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` under the handle's lock; SQLite errors become typed errors.

        Corruption a read meets in the record itself (not only in an index) quarantines a
        writable handle as a write would: the file is proven damaged either way."""
        with self._lock:
            self._check_open()
            try:
                return fn(self._conn)
            except sqlite3.Error as exc:
                damaged = errors.is_corruption_error(exc) and not self.read_only
                if damaged and not self._fts_only(exc):
                    self._quarantine(exc)
                raise self._read_error(exc) from exc

    def _read_error(self, exc: sqlite3.Error) -> Exception:
        if self.read_only and errors.is_sqlite_lock_error(exc):
            return errors.StateDbUnavailableError(
                f"session store {self.path} is busy", reason="busy", path=self.path
            )
        return self._translate(exc)

    @contextlib.contextmanager
    def _snapshot_reader(self) -> Iterator[sqlite3.Connection]:
        """A second, read-only connection inside one read transaction: a consistent snapshot
        for long reads (a streaming export) that must not hold this handle's lock."""
        self._check_open()
        conn = self._connect("ro", _READ_BUSY_TIMEOUT_S)
        try:
            conn.execute("BEGIN")
            yield conn
        except sqlite3.Error as exc:
            raise self._read_error(exc) from exc
        finally:
            conn.close()

    def _transcript_write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return self._write(fn, "transcript")

    def _translate(self, exc: sqlite3.Error) -> Exception:
        if errors.is_hot_journal_error(exc):  # only read-only connections cannot roll it back
            return errors.hot_journal_error(self.path)
        if errors.is_corruption_error(exc):
            return errors.StateDbCorruptError(f"{self.path} is damaged: {exc}", path=self.path)
        if errors.is_disk_full_error(exc):
            return errors.StateDbFullError(f"no space left for {self.path}: {exc}", path=self.path)
        if errors.is_io_error(exc):
            return errors.StateDbIOError(f"I/O error on {self.path}: {exc}", path=self.path)
        if errors.is_sqlite_lock_error(exc):
            return errors.StateDbLockedError(f"{self.path} is locked: {exc}", path=self.path)
        return exc

    def _locked_error(self, waited: float, attempts: int) -> errors.StateDbLockedError:
        holders = lockowners.describe_lock_holders(self.path)
        line = "; ".join(holders) if holders else "no lock holder could be named"
        logger.warning("write to %s gave up after %.1f s: %s", self.path, waited, line)
        common.append_error_log(f"database is locked: {self.path}: {line}", self.profile_home)
        return errors.StateDbLockedError(
            f"{self.path} stayed locked for {waited:.1f} s ({attempts} attempts): {line}",
            path=self.path,
            waited_s=waited,
            attempts=attempts,
            holders=holders,
        )

    def _count_write(self) -> None:
        self._writes += 1
        if self._writes % _CHECKPOINT_EVERY_N_WRITES == 0 and self._own_checkpoints():
            try:
                self._checkpoint()
            except sqlite3.Error as exc:
                logger.debug("checkpoint of %s skipped: %s", self.path, exc)

    def _own_checkpoints(self) -> bool:
        """False while this file's checkpoints are left to Litestream. Called under the lock
        at every checkpoint decision; when the answer changes, the connections' automatic
        checkpoints follow it. A setting that turned invalid after the open keeps the last
        answer: this runs after a committed write, which must not look failed."""
        try:
            leave = replication.checkpoints_left_to_litestream(self.path)
        except errors.ReplicationError as exc:
            logger.warning("%s; keeping the previous checkpoint setting", exc)
            return not self._leave_checkpoints
        if leave != self._leave_checkpoints:
            self._leave_checkpoints = leave
            off = leave or self.wal_reset_exposed
            for conn in filter(None, (self._conn, self._helper)):
                conn.execute(WAL_AUTOCHECKPOINT_OFF_SQL if off else WAL_AUTOCHECKPOINT_DEFAULT_SQL)
        return not leave

    def checkpoint(self) -> tuple[int, int, int]:
        """Run a PASSIVE WAL checkpoint now, through the write wrapper (retried while another
        process holds the lock it needs). Returns SQLite's result row: (busy, frames in the
        WAL, frames checkpointed). :class:`ReplicationError` while checkpoints are left to
        Litestream."""
        with self._lock:
            if not self.read_only and not self._own_checkpoints():
                raise errors.ReplicationError(
                    f"the checkpoints of {self.path} are left to Litestream",
                    reason="checkpoints_left_to_litestream",
                    path=self.path,
                )
        self._write(lambda conn: self._checkpoint(), transactional=False)
        assert self.last_checkpoint is not None
        return self.last_checkpoint

    def _checkpoint(self) -> None:
        """One PASSIVE checkpoint, not retried; every checkpoint of the handle runs here.

        Inside the WAL-reset bug range it runs only while this handle holds the write lock,
        so that no writer of any process can reset the WAL under it; a connection cannot
        checkpoint inside its own transaction, so a helper connection does. (The checkpoint
        SQLite runs when the last connection to the file closes is safe as it is: SQLite
        runs it only after taking the database's EXCLUSIVE lock, which no other connection
        holds while one exists.)"""
        if not self.wal_reset_exposed:
            row = self._conn.execute(CHECKPOINT_SQL).fetchone()
        else:
            if self._helper is None:
                self._helper = self._connect("rw", 0.0)
            with common.transaction(self._conn):
                row = self._helper.execute(CHECKPOINT_SQL).fetchone()
        self.last_checkpoint = (row[0], row[1], row[2])
        busy, log_frames, checkpointed = self.last_checkpoint
        if busy or checkpointed < log_frames:
            logger.debug(
                "checkpoint of %s: %d of %d WAL frames copied (busy=%d)",
                self.path, checkpointed, log_frames, busy,
            )

    # --- FTS maintenance ----------------------------------------------------------------------

    def _start_fts_maintenance(self) -> None:
        """Finish or start an index rebuild in the background when that is safe (see
        hermes_state_fts): only under the cross-process admission lock, and a stale index
        only when no other process has the database open; then the search index's fill, or
        its replacement when damaged (see hermes_state_rank), under the same lock."""
        if self._read(fts.index_state).usable and not self._read(rank.needs_maintenance):
            return
        self._rebuild_thread = threading.Thread(
            target=self._rebuild_in_background, name="hermes-state-fts-rebuild", daemon=True
        )
        self._rebuild_thread.start()

    def _rebuild_in_background(self) -> None:
        try:
            if self._read(fts.index_state).usable or self._rebuild(require_exclusive=True):
                self._fill_search_index()
        except (errors.HermesStateError, sqlite3.Error) as exc:
            logger.warning("FTS rebuild of %s stopped: %s", self.path, exc)

    def _fill_search_index(self) -> bool:
        return rank.fill_when_admitted(self.path, self._read, self._write, self._stop_rebuild,
                                       before=self._refuse_rebuild_on_damage)

    def _rebuild(self, *, require_exclusive: bool) -> bool:
        return fts.rebuild_when_admitted(
            self.path,
            self._read,
            self._write,
            self._stop_rebuild,
            require_exclusive=require_exclusive,
            before=self._refuse_rebuild_on_damage,
        )

    def _refuse_rebuild_on_damage(self) -> None:
        """A rebuild reads every message and rewrites the indexes: on a file whose record is
        damaged it would write on and on into a corrupt file, so that file is quarantined
        instead (nothing is written) and the index stays detached."""
        damaged = self._read(fts.damaged_canonical_tables)
        if damaged:
            error = errors.StateDbCorruptError(
                f"{self.path} is damaged ({', '.join(damaged)} failed quick_check); "
                f"its full-text index is not rebuilt",
                path=self.path,
            )
            self._quarantine(error)
            raise error

    def rebuild_fts(self) -> None:
        """Rebuild the three FTS indexes now, in chunks, under the admission lock (after this
        handle's own background rebuild, if one is running, has finished); then finish the
        search index's fill, or replace it when damaged."""
        if self._rebuild_thread is not None:
            self._rebuild_thread.join()
        if not self._rebuild(require_exclusive=False):
            raise errors.HermesStateError(
                f"another process is rebuilding the FTS index of {self.path}"
            )
        if not self._fill_search_index():
            raise errors.HermesStateError(
                f"the search index of {self.path} is being filled by another process, "
                "or is too damaged to be replaced in place"
            )

    def fts_status(self) -> dict[str, Any]:
        """The FTS markers and trigger set, without checking the index contents."""
        state = self._read(fts.index_state)
        return {
            "stale": state.stale,
            "rebuild_high_water": state.high_water,
            "rebuild_progress": state.progress,
            "missing_triggers": self._read(fts.missing_triggers),
        }

    def check_fts_integrity(self) -> dict[str, str | None]:
        """FTS5 'integrity-check' of each index (None: clean). Changes nothing, but SQLite runs
        it as a write, so it needs a writable handle and takes the write lock briefly."""
        return self._write(fts.integrity_report, transactional=False)

    # --- sessions -----------------------------------------------------------------------------

    create_session = _writes(sessions.create_session)
    ensure_session = _writes(sessions.ensure_session)
    get_session = _reads(sessions.get_session)
    resolve_session_id = _reads(sessions.resolve_session_id)
    end_session = _writes(sessions.end_session)
    reopen_session = _writes(sessions.reopen_session)
    update_system_prompt = _writes(sessions.update_system_prompt)
    update_token_counts = _writes(sessions.update_token_counts)
    get_model_usage = _reads(sessions.get_model_usage)
    list_sessions_rich = _reads(sessions.list_sessions_rich)
    search_sessions = _reads(sessions.search_sessions)
    session_count = _reads(sessions.session_count)
    set_session_archived = _writes(sessions.set_session_archived)
    auto_archive_idle_sessions = _writes(sessions.auto_archive_idle_sessions)
    message_count = _reads(sessions.message_count)
    get_meta = _reads(common.get_meta)
    set_meta = _writes(common.set_meta)
    stats = _reads(sessions.stats)
    export_all = _reads(portability.export_all)

    def export_session(self, session_id: str) -> dict[str, Any] | None:
        """The session row plus ``messages`` (all generations, in order) and ``model_usage``."""
        exported = self._read(lambda c: portability.export_session(c, session_id))
        if exported is not None:
            self._seen.saw(session_id, messages.newest_id(exported["messages"]))
        return exported

    def export_session_lineage(self, session_id: str) -> list[dict[str, Any]]:
        """The whole lineage of ``session_id``, each session exported as by export_session."""
        exported = self._read(lambda c: portability.export_session_lineage(c, session_id))
        for session in exported:
            self._seen.saw(session["id"], messages.newest_id(session["messages"]))
        return exported

    def iter_export_jsonl(
        self,
        session_ids: Iterable[str] | None = None,
        *,
        source: str | None = None,
        lineage: bool = False,
    ) -> Iterator[str]:
        """Export as JSON Lines from one consistent snapshot, in constant memory (see
        hermes_state_portability.iter_export_jsonl); works on read-only handles."""
        with self._snapshot_reader() as conn:
            yield from portability.iter_export_jsonl(
                conn, session_ids, source=source, lineage=lineage
            )

    def import_sessions(self, sessions: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """Import exported sessions, each in its own transaction, parents first; returns the
        report (see hermes_state_portability.import_sessions)."""
        return portability.import_sessions(self._transcript_write, sessions)

    def import_jsonl(self, fp: IO[Any]) -> dict[str, Any]:
        """Import a JSON Lines export read from ``fp``; same rules and report."""
        return portability.import_jsonl(self._transcript_write, fp)

    # --- session model, workspace, handoff ----------------------------------------------------

    update_session_meta = _writes(session_model.update_session_meta)
    update_session_model = _writes(session_model.update_session_model)
    update_session_billing_route = _writes(session_model.update_session_billing_route)
    update_session_cwd = _activity(workspace.update_session_cwd)
    backfill_repo_roots = _writes(workspace.backfill_repo_roots)
    distinct_session_cwds = _reads(workspace.distinct_session_cwds)
    request_handoff = _writes(handoff.request_handoff)
    claim_handoff = _writes(handoff.claim_handoff)
    complete_handoff = _writes(handoff.complete_handoff)
    fail_handoff = _writes(handoff.fail_handoff)
    get_handoff_state = _or_fallback(_reads(handoff.get_handoff_state), lambda: None)
    list_pending_handoffs = _or_fallback(_reads(handoff.list_pending_handoffs), list)

    clear_messages = _writes(sessions.clear_messages, "transcript")
    delete_session = _writes(sessions.delete_session)
    prune_sessions = _writes(sessions.prune_sessions)

    def vacuum(self) -> None:
        self._write(lambda c: c.execute("VACUUM"), transactional=False)

    def maybe_auto_prune_and_vacuum(
        self, retention_days: float = 90, min_interval_hours: float = 24, vacuum: bool = True
    ) -> dict[str, Any] | None:
        """Prune (and vacuum) at most once per ``min_interval_hours``, remembered in
        ``state_meta``; None when it was not due."""
        if not self._write(lambda c: sessions.claim_auto_prune(c, min_interval_hours)):
            return None
        pruned = self.prune_sessions(retention_days)
        if vacuum and pruned:
            self.vacuum()
        return {"pruned": pruned, "vacuumed": bool(vacuum and pruned)}

    # --- messages -----------------------------------------------------------------------------

    # What the handle reads and writes of a session is remembered (messages.SeenThrough): a
    # rewrite given no seen_through_id never archives or deletes a row beyond it.
    _append_located = _writes(
        messages.append_located, "transcript", spool=True, like=messages.append_message
    )
    _replace_messages = _writes(messages.replace_messages, "transcript", spool=True)

    @functools.wraps(_append_located)
    def append_message(self, session_id: str, *args: Any, **kwargs: Any) -> int:
        row_id, previous_id = self._append_located(session_id, *args, **kwargs)
        self._seen.wrote(session_id, row_id, previous_id)
        return row_id

    def get_messages(
        self,
        session_id: str,
        include_inactive: bool = False,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        """Rows of a session in order (active generation only unless asked), every field
        decoded."""
        rows = self._read(lambda c: messages.get_messages(
            c, session_id, include_inactive, limit, offset))
        self._seen.saw(session_id, messages.newest_id(rows))
        return rows

    def get_messages_as_conversation(
        self,
        session_id: str,
        include_ancestors: bool = False,
        include_inactive: bool = False,
        *,
        include_row_ids: bool = False,
    ) -> list[dict[str, Any]]:
        """The OpenAI-format replay list of the session (see
        hermes_state_messages.read_conversation); ``_row_id`` on request."""
        turns, newest = self._read(lambda c: messages.read_conversation(
            c, session_id, include_ancestors, include_inactive, include_row_ids=include_row_ids))
        for read_id, newest_id in newest.items():
            self._seen.saw(read_id, newest_id)
        return turns

    def replace_messages(
        self,
        session_id: str,
        messages: Iterable[Mapping[str, Any]],
        active_only: bool = False,
        *,
        seen_through_id: int | None = None,
    ) -> None:
        """Replace the session's messages, only its live ones with ``active_only`` (see
        hermes_state_messages.replace_messages); with no ``seen_through_id``, the newest row
        this handle read or wrote is the bound."""
        bound = self._seen.bound(session_id, seen_through_id)
        ids = self._replace_messages(session_id, messages, active_only, seen_through_id=bound)
        self._seen.rewrote(session_id, ids)

    has_archived_messages = _reads(messages.has_archived_messages)
    has_platform_message_id = _reads(messages.has_platform_message_id)

    # --- rewind and context windows -----------------------------------------------------------

    list_recent_user_messages = _reads(rewind.list_recent_user_messages)
    rewind_to_message = _writes(rewind.rewind_to_message, "transcript")
    restore_rewound = _writes(rewind.restore_rewound, "transcript")
    get_messages_around = _reads(context_window.get_messages_around)
    get_anchored_view = _reads(context_window.get_anchored_view)

    # --- titles -------------------------------------------------------------------------------

    sanitize_title = staticmethod(sessions.sanitize_title)
    set_session_title = _writes(sessions.set_session_title)
    get_session_title = _reads(sessions.get_session_title)
    get_session_by_title = _reads(sessions.get_session_by_title)
    resolve_session_by_title = _reads(sessions.resolve_session_by_title)
    get_next_title_in_lineage = _reads(sessions.get_next_title_in_lineage)

    # --- lineage ------------------------------------------------------------------------------

    get_session_ancestors = _reads(compression.get_session_ancestors)
    get_session_descendants = _reads(compression.get_session_descendants)
    get_compression_tip = _reads(compression.get_compression_tip)
    get_compression_lineage = _reads(compression.get_compression_lineage)

    # --- search -------------------------------------------------------------------------------

    _sanitize_fts5_query = staticmethod(search.sanitize_fts5_query)

    def search_messages(
        self,
        query: str,
        source_filter: Iterable[str] | None = None,
        exclude_sources: Iterable[str] | None = None,
        role_filter: Iterable[str] | None = None,
        limit: int = 20,
        offset: int = 0,
        sort: str | None = None,
        include_inactive: bool = False,
    ) -> list[dict[str, Any]]:
        """Full-text search over every session (see hermes_state_search.search_messages):
        relevance by FTS5's bm25(), or ``sort="newest"``/``"oldest"``; pages are slices of
        one order.

        Never raises for any query text. An index found damaged is detached (``fts_stale``)
        and the search answers from canonical rows instead."""
        args = (query, source_filter, exclude_sources, role_filter, limit, offset, sort,
                include_inactive)
        try:
            hits = self._read(lambda c: search.search_messages(c, *args))
            search.note_index_damage(None if self.read_only or self.quarantined else self._write)
            return hits
        except errors.FtsCorruptError:
            logger.warning("FTS index of %s damaged during a search; detaching it", self.path)
            if not self.read_only and not self.quarantined:
                self._write(fts.detach_index)
            return self._read(lambda c: search.search_messages(c, *args, use_index=False))

    # --- compression --------------------------------------------------------------------------

    _archive_generation = _writes(
        compression.archive_generation, "transcript", spool=("session_id", "compacted_messages")
    )

    def archive_and_compact(
        self,
        session_id: str,
        compacted_messages: Iterable[Mapping[str, Any]],
        *,
        seen_through_id: int | None = None,
    ) -> int:
        """Compress the session in place (see hermes_state_compression.archive_and_compact);
        with no ``seen_through_id``, the newest row this handle read or wrote is the bound.
        Returns the number of rows of the new generation."""
        bound = self._seen.bound(session_id, seen_through_id)
        ids = self._archive_generation(session_id, compacted_messages, seen_through_id=bound)
        self._seen.rewrote(session_id, ids)
        return len(ids)

    publish_compression_child = _writes(
        compression.publish_compression_child, "transcript", spool=("child_session_id", "messages")
    )
    try_acquire_compression_lock = _writes(compression.try_acquire_compression_lock)
    refresh_compression_lock = _writes(compression.refresh_compression_lock)
    release_compression_lock = _writes(compression.release_compression_lock)
    get_compression_lock_holder = _reads(compression.get_compression_lock_holder)
    get_compression_fallback_streak = _or_fallback(
        _reads(compression_failures.get_compression_fallback_streak), int
    )
    set_compression_fallback_streak = _writes(compression_failures.set_compression_fallback_streak)
    record_compression_failure_cooldown = _or_fallback(
        _writes(compression_failures.record_compression_failure_cooldown), lambda: None
    )
    get_compression_failure_cooldown = _reads(
        compression_failures.get_compression_failure_cooldown
    )
    clear_compression_failure_cooldown = _or_fallback(
        _writes(compression_failures.clear_compression_failure_cooldown), lambda: None
    )

    # --- gateway: runtime epoch, admissions, workers ------------------------------------------

    begin_runtime_epoch = _writes(gateway.begin_runtime_epoch)
    get_runtime_epoch = _reads(gateway.get_runtime_epoch)
    admit_input = _writes(gateway.admit_input)
    claim_next_input = _writes(gateway.claim_next_input)
    settle_input = _writes(gateway.settle_input)
    resolve_unknown_input = _writes(gateway.resolve_unknown_input)
    get_admission = _reads(gateway.get_admission)
    list_admissions = _reads(gateway.list_admissions)
    receipt_digest = staticmethod(gateway.receipt_digest)
    register_worker_execution = _writes(gateway.register_worker_execution)
    record_worker_receipt = _writes(gateway.record_worker_receipt)
    finish_worker_execution = _writes(gateway.finish_worker_execution)
    resolve_unknown_execution = _writes(gateway.resolve_unknown_execution)
    list_worker_executions = _reads(gateway.list_worker_executions)
    list_worker_receipts = _reads(gateway.list_worker_receipts)

    # --- gateway: outbox, routing, delegations ------------------------------------------------

    record_delivery_obligation = _writes(gateway.record_delivery_obligation)
    record_delivery_failure = _writes(gateway.record_delivery_failure)
    settle_delivery_obligation = _writes(gateway.settle_delivery_obligation)
    get_delivery_obligation = _reads(gateway.get_delivery_obligation)
    list_owed_deliveries = _reads(gateway.list_owed_deliveries)
    save_gateway_routing_entry = _writes(gateway.save_gateway_routing_entry)
    load_gateway_routing_entries = _reads(gateway.load_gateway_routing_entries)
    replace_gateway_routing_entries = _writes(gateway.replace_gateway_routing_entries)
    delete_gateway_routing_entries = _writes(gateway.delete_gateway_routing_entries)
    record_async_delegation = _writes(gateway.record_async_delegation)
    update_async_delegation = _writes(gateway.update_async_delegation)
    get_async_delegation = _reads(gateway.get_async_delegation)
    list_async_delegations = _reads(gateway.list_async_delegations)

    # --- gateway: sessions by peer, Telegram DM topics -----------------------------------------

    list_gateway_sessions = _reads(peers.list_gateway_sessions)
    find_session_by_origin = _reads(peers.find_session_by_origin)
    find_latest_gateway_session_for_peer = _reads(peers.find_latest_gateway_session_for_peer)
    record_gateway_session_peer = _writes(peers.record_gateway_session_peer)
    set_expiry_finalized = _writes(peers.set_expiry_finalized)
    apply_telegram_topic_migration = _writes(telegram.apply_telegram_topic_migration)
    enable_telegram_topic_mode = _writes(telegram.enable_telegram_topic_mode)
    disable_telegram_topic_mode = _writes(telegram.disable_telegram_topic_mode)
    is_telegram_topic_mode_enabled = _reads(telegram.is_telegram_topic_mode_enabled)
    bind_telegram_topic = _writes(telegram.bind_telegram_topic)
    get_telegram_topic_binding = _reads(telegram.get_telegram_topic_binding)
    get_telegram_topic_binding_by_session = _reads(telegram.get_telegram_topic_binding_by_session)
    list_telegram_topic_bindings_for_chat = _reads(telegram.list_telegram_topic_bindings_for_chat)
    is_telegram_session_linked_to_topic = _reads(telegram.is_telegram_session_linked_to_topic)
    delete_telegram_topic_binding = _writes(telegram.delete_telegram_topic_binding)
    list_unlinked_telegram_sessions_for_user = _reads(
        telegram.list_unlinked_telegram_sessions_for_user
    )

    # --- gateway: exception-path ownership ----------------------------------------------------

    ingress_owner_marker = staticmethod(gateway.ingress_owner_marker)
    find_owned_input = _reads(gateway.find_owned_input)
    persist_exception_input = _writes(gateway.persist_exception_input, "transcript", spool=True)


def collect_profile_stats(root: str | Path | None = None) -> dict[str, Any]:
    """:meth:`SessionDB.stats` of every profile under ``root`` (see
    hermes_state_portability.collect_profile_stats); each store is opened read-only."""
    return portability.collect_profile_stats(root, functools.partial(SessionDB, read_only=True))


#: This process's shared stores, one SessionDB per profile home, held by explicit owners
#: (see :class:`ProfileStoreRegistry`).
profile_stores: ProfileStoreRegistry[SessionDB] = ProfileStoreRegistry(SessionDB)
