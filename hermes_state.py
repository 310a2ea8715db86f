"""hermes_state: the SQLite session store of an AI agent — the ``SessionDB`` facade.

``SessionDB`` owns one connection, one re-entrant lock and the public API. Every concern lives
in a sibling module as plain functions that take the connection first (positional-only); the
class body is a table of methods built from them by ``hermes_state_methods`` (``_reads`` and
``_writes`` here), each showing its sibling's own parameters and result to type checkers, with
the write kind, spool, compaction-bound memory or fallback of each named in the table.

A file whose ``-wal`` is not empty while the database file is (truncated) is refused at open:
SQLite would delete that ``-wal`` on the first read.

The constants below are module attributes on purpose: the seed names them, and tests shorten
them at run time (they are read each time a write builds its policy).
"""

from __future__ import annotations

# asyncio and sys are attributes of this module on purpose: the application's tests patch
# ``hermes_state.asyncio.to_thread`` (the async wrapper looks it up at each call).
import asyncio  # noqa: F401
import contextlib
import functools
import logging
import sqlite3
import sys  # noqa: F401
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

import hermes_state_arguments as arguments
import hermes_state_connect as dbconn
import hermes_state_files as db_files
import hermes_state_home as home_paths
import hermes_state_schema_sql as schema_sql
import hermes_state_compat as compat
import hermes_state_compression as compression
import hermes_state_context_window as context_window
import hermes_state_deletion as deletion
import hermes_state_errors as errors
import hermes_state_fts as fts
import hermes_state_fulltext as fulltext
import hermes_state_gateway as gateway
import hermes_state_handoff as handoff
import hermes_state_impact as impact
import hermes_state_lineage as lineage
import hermes_state_listing as listing
import hermes_state_maintenance as maintenance
import hermes_state_messages as messages
import hermes_state_methods as methods
import hermes_state_openability as openability
import hermes_state_peers as peers
import hermes_state_profiles as profiles
import hermes_state_quarantine as quarantine
import hermes_state_recover as recover
import hermes_state_replication as replication
import hermes_state_rewind as rewind
import hermes_state_schema as schema
import hermes_state_search as search
import hermes_state_seen as seen
import hermes_state_session_model as session_model
import hermes_state_sessions as sessions
import hermes_state_telegram as telegram
import hermes_state_testguard as testguard
import hermes_state_transfer as transfer
import hermes_state_upkeep as upkeep
import hermes_state_workspace as workspace
import hermes_state_writes as writes
from hermes_state_home import get_hermes_home, hermes_home_override
from hermes_state_schema_sql import SCHEMA_VERSION
from hermes_state_errors import *  # noqa: F403 -- the facade re-exports the error hierarchy
from hermes_state_async import AsyncSessionDB
from hermes_state_methods import Fallback, lenient
from hermes_state_methods import read_method as _reads
from hermes_state_methods import write_method as _writes
from hermes_state_openability import format_session_db_unavailable, get_last_init_error
from hermes_state_profiles import ProfileStoreRegistry
from hermes_state_wal import apply_wal_with_fallback

# The module-level operations: arguments checked, operating-system failures typed.
backup_state_db = arguments.operation(maintenance.backup_state_db)
restore_state_db = arguments.operation(maintenance.restore_state_db)
repair_state_db = arguments.operation(maintenance.repair_state_db)
recover_state_db = arguments.operation(recover.recover_state_db)
resolve_store_home = arguments.operation(profiles.resolve_store_home)
display_hermes_home = arguments.operation(home_paths.display_hermes_home)
resolve_profile_home = arguments.operation(home_paths.resolve_profile_home)
profile_config_path = arguments.operation(home_paths.profile_config_path)
child_process_env = arguments.operation(home_paths.child_process_env)
workspace_key = arguments.operation(workspace.workspace_key)
repair_state_db_schema = arguments.operation(openability.repair_state_db_schema)

__all__ = [
    "SessionDB",
    "AsyncSessionDB",
    "apply_wal_with_fallback",
    "collect_profile_stats",
    "backup_state_db",
    "restore_state_db",
    "repair_state_db",
    "recover_state_db",
    "repair_state_db_schema",
    "format_session_db_unavailable",
    "get_last_init_error",
    "DEFAULT_DB_PATH",
    "SCHEMA_VERSION",
    "SCHEMA_SQL",
    "MAX_FTS5_QUERY_CHARS",
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

# --- names the application imports from the previous store (see docs/compatibility.md) -----

#: The schema a new store is created with (tables, indexes, the FTS indexes and their
#: triggers), as one script of complete statements.
SCHEMA_SQL = schema_sql.SCHEMA_SQL
#: The longest search query read: longer input is cut to this many characters.
MAX_FTS5_QUERY_CHARS = search.MAX_INPUT_CHARS
_collect_delegate_child_ids = deletion.delegate_children
_delete_delegate_children = deletion.delete_delegate_children
_is_background_review_harness_message = messages.is_background_review_prompt
_strip_background_review_harness = messages.without_background_review

#: The package version (the one place it is written: the build reads it from here).
__version__ = "0.1.0"

logger = logging.getLogger("hermes_state")
#: The default store when this module was imported (``SessionDB()`` resolves it at each call).
DEFAULT_DB_PATH = home_paths.default_db_path()
# The previous store's doctor probes a file with this name.
_db_opens_cleanly = openability.db_opens_cleanly
T = TypeVar("T")

_WRITE_PATIENCE_S, _TRANSCRIPT_WRITE_PATIENCE_S, _ACTIVITY_WRITE_PATIENCE_S = 20.0, 60.0, 0.5
_WRITE_RETRY_MIN_S, _WRITE_RETRY_MAX_S = 0.020, 0.150
_WRITE_RETRY_SLOW_MIN_S, _WRITE_RETRY_SLOW_MAX_S = 0.250, 1.000
_CHECKPOINT_EVERY_N_WRITES = 50
_FAST_RETRY_WINDOW_S = 2.0
_SQLITE_BUSY_TIMEOUT_S = 1.0
_READ_BUSY_TIMEOUT_S = 5.0

def _retry_policy(kind: writes.WriteKind) -> writes.RetryPolicy:
    """The policy of a ``kind`` of write, from this module's constants as they are now."""
    patience = {"write": _WRITE_PATIENCE_S, "transcript": _TRANSCRIPT_WRITE_PATIENCE_S,
                "activity": _ACTIVITY_WRITE_PATIENCE_S}[kind]
    fast = (_WRITE_RETRY_MIN_S, _WRITE_RETRY_MAX_S)
    slow = (_WRITE_RETRY_SLOW_MIN_S, _WRITE_RETRY_SLOW_MAX_S)
    return writes.RetryPolicy(patience, _FAST_RETRY_WINDOW_S, fast, slow)


# --- what some methods answer instead of raising (see hermes_state_methods) -----------------

def _search_without_index(
    db: SessionDB, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[dict[str, Any]]:
    """A search that met a damaged index: detach it (when this handle may write) and answer
    from the canonical rows."""
    if not db.read_only and not db.quarantined:
        db._write(fts.detach_index)
    return db._read(lambda conn: search.search_messages(conn, *args, **kwargs, use_index=False))


_WITHOUT_DAMAGED_INDEX = Fallback(
    (errors.FtsCorruptError,), "met a damaged FTS index; detaching it", _search_without_index
)


# What transcript writes spool: most name their session and messages as append_message does.
_TRANSCRIPT = quarantine.Spool()
_COMPACTION = quarantine.Spool(messages="compacted_messages")
# SQLite refuses VACUUM inside a transaction.
VACUUM_SQL = "VACUUM"


class SessionDB:
    """A handle on one session store (default: ``get_hermes_home() / "state.db"``).

    Thread-safe; usable as a context manager; ``close()`` is idempotent. With
    ``read_only=True`` the file is opened ``mode=ro`` and nothing is ever created, migrated,
    checkpointed or repaired (see :class:`StateDbUnavailableError` for what it refuses); the
    one file it may write is the quarantine marker beside the store, when a read meets damage
    in the record (the error it raises says whether the marker could be written).

    ``profile_home`` is fixed at open: the directory of a ``state.db`` (a home's own store),
    else the home of the opening context (a scratch ``db_path``). Transcripts spooled on
    corruption and the lock log go there, so one profile's failures never land in another's
    home, whichever ``hermes_home_override`` the failing call runs under.

    ``seen_sessions``: for how many sessions the handle remembers what it read and wrote, the
    bound of rewrites whose caller passes none (default ``hermes_state_seen.SEEN_SESSIONS``).

    ``full_text``: the full-text level (``"full"``, ``"no-trigram"``, ``"none"``; see
    hermes_state_fulltext). None (the default) uses what this process's SQLite offers; a lower
    level keeps the handle from the indexes it leaves out (searches then scan the stored
    messages); a higher one raises :class:`FullTextUnavailableError`. The level in use is
    :attr:`full_text`.
    """

    def __init__(
        self,
        db_path: str | Path | None = None,
        *,
        read_only: bool = False,
        rebuild_fts: bool = True,
        seen_sessions: int | None = None,
        full_text: str | None = None,
    ) -> None:
        self.full_text = fulltext.resolve(full_text)
        path = home_paths.store_path(db_path)
        testguard.check_test_isolation(path)
        self.db_path = path
        self.path = path.absolute()
        # A home's own store is its state.db; a scratch file belongs to the context's home.
        in_home = self.path.name == home_paths.DB_FILENAME
        self.profile_home = self.path.parent if in_home else home_paths.get_hermes_home().absolute()
        self.read_only = read_only
        # Read-only handles never checkpoint, whoever does.
        self._checkpoints = writes.Checkpoints(
            self.path, lambda: self._connect("rw", 0.0),
            leave_to_litestream=(
                not read_only and replication.checkpoints_left_to_litestream(self.path)
            ),
            wal_reset_exposed=dbconn.wal_reset_exposed(),
            every=_CHECKPOINT_EVERY_N_WRITES,
        )
        self.write_retries = 0
        self._lock = threading.RLock()
        self._closed = False
        self._watch = quarantine.Watch(self.path, self.profile_home, read_only=read_only)
        self._upkeep = upkeep.Upkeep(self)
        self._seen = seen.SeenThrough(seen_sessions)
        try:
            self._connection = self._open_read_only() if read_only else self._open_writable()
        except BaseException as exc:
            openability.record_open_error(exc)
            raise
        if (not read_only and rebuild_fts and self._watch.reason is None
                and self.full_text == fulltext.FULL):
            self._upkeep.start()

    # --- opening ------------------------------------------------------------------------------

    def _connect(self, mode: str, timeout: float) -> sqlite3.Connection:
        """Every connection of the handle (its own, the checkpoint helper, the close guard,
        the snapshot reader), configured by ``dbconn.configure_connection``.

        Inside the WAL-reset bug range, and while checkpoints are left to Litestream, none of
        them ever checkpoints on its own: automatic checkpoints are off from the first
        statement (the setting touches no file)."""
        conn = dbconn.connect(self.path, mode, timeout=timeout)
        fulltext.register(conn, self.full_text)
        if self._checkpoints.automatic_off():
            conn.execute(writes.WAL_AUTOCHECKPOINT_OFF_SQL)
        return conn

    def _open_writable(self) -> sqlite3.Connection:
        with quarantine.OPEN_LOCK:
            db_files.refuse_symlinks(self.path)
            if db_files.wal_without_database(self.path):
                raise errors.StateDbCorruptError(
                    f"{self.path} is empty but its -wal is not: the file was truncated",
                    path=self.path,
                )
            earlier = quarantine.inherited(self.path)
            if earlier is None:
                db_files.prepare_db_file(self.path)
            self._watch.file_id = quarantine.file_identity(self.path)
            self._connection = self._connect("rw", _SQLITE_BUSY_TIMEOUT_S)
            quarantine.track(self)
            if earlier is None:
                # Before any write: a -wal damaged in the middle must never be checkpointed.
                earlier = quarantine.wal_damage(self.path, self._connection)
        if earlier is not None:
            # Born quarantined: it reads, spools what it cannot write, and never writes.
            logger.warning("%s was quarantined earlier; no writes: %s", self.path, earlier)
            self._quarantine(earlier)
            return self._connection
        try:
            self._outside_transaction(lambda conn: schema.configure_writable(conn, self.path))
            schema.ensure_schema(self._connection, self._write, full_text=self.full_text)
            db_files.tighten_modes(self.path)
        except BaseException:
            self._close_connections()
            raise
        return self._connection

    def _open_read_only(self) -> sqlite3.Connection:
        db_files.refuse_symlinks(self.path)
        if db_files.wal_without_database(self.path):  # the first read would delete the -wal
            raise errors.StateDbUnavailableError(
                f"{self.path} is truncated: the main file is empty but its -wal is not (it "
                "lost its content; it is not a new store)",
                reason=errors.TRUNCATED_REASON, path=self.path)
        if not self.path.is_file() or self.path.stat().st_size == 0:
            raise errors.StateDbUnavailableError(
                f"no initialised session store at {self.path}",
                reason="uninitialized",
                path=self.path,
            )
        self._watch.file_id = quarantine.file_identity(self.path)
        try:
            conn = self._connect("ro", _READ_BUSY_TIMEOUT_S)
        except sqlite3.Error as exc:
            raise self._read_error(exc) from exc
        try:
            schema.require_current(conn, self.path)
        except sqlite3.Error as exc:
            conn.close()
            error = self._read_error(exc)
            # SQLITE_NOTADB: not a database at all, as far as a reader can tell (no marker
            # beside a file that may not be a store); a writable open still quarantines it.
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
            if errors.is_corruption_error(exc) and code != errors.SQLITE_NOTADB:
                self._watch.record(exc, error, lambda: self._connect("ro", _READ_BUSY_TIMEOUT_S))
            raise error from exc
        except BaseException:
            conn.close()
            raise
        return conn

    # --- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the handle. A quarantined handle skips every checkpoint and leaves the -wal;
        so does one whose checkpoints are left to Litestream."""
        self._upkeep.stop()
        with self._lock:
            if self._closed:
                return
            self._adopt_quarantine()
            self._closed = True
            quarantine.untrack(self)
            if not self.read_only and self._watch.reason is None and (
                self._checkpoints.owned(self._connection)
            ):
                with contextlib.suppress(sqlite3.Error):
                    self._checkpoints.run(self._connection)
            self._close_connections()

    def _close_connections(self) -> None:
        self._checkpoints.close()
        self._connection.close()

    def __enter__(self) -> SessionDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # --- quarantine (see hermes_state_quarantine) ---------------------------------------------

    @property
    def quarantined(self) -> bool:
        """True once this handle, or another handle of this process on the same file, met
        corruption (or the file was quarantined before it was opened). Reading it changes
        nothing: the handle takes such a quarantine on before its next write and at close."""
        return self._watch.quarantined

    @property
    def _quarantined(self) -> BaseException | None:
        return self._watch.reason

    def _adopt_quarantine(self) -> None:
        earlier = self._watch.earlier()
        if earlier is not None:
            self._quarantine(earlier)

    def _met_damage(self, exc: sqlite3.Error, error: Exception) -> None:
        self._watch.met_damage(exc, error, fts_only=self._fts_only, enter=self._quarantine,
                               guard=lambda: self._connect("ro", _READ_BUSY_TIMEOUT_S))

    def _quarantine(self, exc: BaseException) -> None:
        with self._lock:
            self._watch.enter(exc, (self._connection, self._checkpoints.helper),
                              lambda: self._connect("ro", _SQLITE_BUSY_TIMEOUT_S))

    # --- the compatibility surface (see hermes_state_compat and docs/compatibility.md) -------

    @property
    def _conn(self) -> compat.RowConnection:
        """The handle's connection as the previous store handed it to application code: its
        statements return ``sqlite3.Row`` rows (the library's own code sees plain rows)."""
        view = self.__dict__.get("_row_view")
        if view is None:
            view = self.__dict__["_row_view"] = compat.RowConnection(self._connection, self._lock)
        return view

    def _execute_write(self, fn: Callable[[compat.WriteConnection], T]) -> T:
        """Run the application's ``fn(conn)`` as one write of the store: in one
        ``BEGIN IMMEDIATE`` transaction under the write patience and retry policy, refused on
        a quarantined or read-only handle, SQLite errors typed; returns what ``fn`` returns.
        ``conn`` is a :class:`~hermes_state_compat.WriteConnection` (``sqlite3.Row`` rows)."""
        return self._write(lambda conn: fn(compat.WriteConnection(conn, self._lock)))

    # --- the write path (see hermes_state_writes) ---------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise errors.StateDbClosedError(f"SessionDB for {self.path} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise errors.HermesStateError(f"SessionDB for {self.path} is read-only")
        self._adopt_quarantine()
        self._watch.refuse_writes()

    def _write(
        self,
        fn: Callable[[sqlite3.Connection], T],
        kind: writes.WriteKind = "write",
        *,
        may_drop_index: bool = True,
    ) -> T:
        """Run ``fn(conn)`` in one ``BEGIN IMMEDIATE`` transaction under the retry policy of
        ``kind`` (see hermes_state_writes.retrying); after the commit, the checkpoint policy."""

        def attempt(detach_index: bool) -> T:
            with self._lock:
                self._check_writable()
                with dbconn.transaction(self._connection):
                    if detach_index:
                        fts.detach_index(self._connection)
                    result = fn(self._connection)
                self._checkpoints.after_commit(self._connection)
            return result

        return writes.retrying(self, attempt, kind, drop_search_index=(
            self._drop_search_index if may_drop_index else None))

    def _drop_search_index(self) -> None:
        self._write(impact.drop_index, may_drop_index=False)

    def _outside_transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` for statements SQLite refuses inside a transaction (pragmas,
        ``VACUUM``, integrity checks, checkpoints): under the handle's lock, retried while the
        file is locked as a write is, with no ``BEGIN`` and no checkpoint after it."""

        def attempt(detach_index: bool) -> T:
            with self._lock:
                self._check_writable()
                if detach_index:
                    with dbconn.transaction(self._connection):
                        fts.detach_index(self._connection)
                return fn(self._connection)

        return writes.retrying(self, attempt, "write", drop_search_index=self._drop_search_index)

    def _policy(self, kind: writes.WriteKind) -> writes.RetryPolicy:
        return _retry_policy(kind)

    def _fts_only(self, exc: BaseException) -> bool:
        with self._lock:
            return fts.damage_is_fts_only(self._connection, exc)

    def _transcript_write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return self._write(fn, "transcript")

    # --- reads --------------------------------------------------------------------------------

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` under the handle's lock, in one read transaction (every statement
        of it sees the same snapshot); SQLite errors become typed errors.

        Corruption a read meets in the record itself (not only in an index) quarantines a
        writable handle as a write would: the file is proven damaged either way. A read-only
        handle records it (the marker beside the file) for the writers that come next."""
        with self._lock:
            self._check_open()
            try:
                with dbconn.read_transaction(self._connection):
                    return fn(self._connection)
            except sqlite3.Error as exc:
                error = self._read_error(exc)
                self._met_damage(exc, error)
                raise error from exc

    def _read_error(self, exc: sqlite3.Error) -> Exception:
        if self.read_only and errors.is_sqlite_lock_error(exc):
            return errors.StateDbUnavailableError(
                f"session store {self.path} stayed locked for {_READ_BUSY_TIMEOUT_S:g} s",
                reason="busy",
                path=self.path,
            )
        return errors.translate_read(exc, self.path) if self.read_only else self._translate(exc)

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
            error = self._read_error(exc)
            self._met_damage(exc, error)
            raise error from exc
        finally:
            conn.close()

    def _translate(self, exc: sqlite3.Error) -> errors.HermesStateError:
        return errors.translate(exc, self.path)

    # --- checkpoints --------------------------------------------------------------------------

    @property
    def wal_reset_exposed(self) -> bool:
        """Whether this process's SQLite lies in the WAL-reset bug range."""
        return self._checkpoints.wal_reset_exposed

    @property
    def last_checkpoint(self) -> tuple[int, int, int] | None:
        """SQLite's result row of the handle's last checkpoint (None: none yet)."""
        return self._checkpoints.last

    @last_checkpoint.setter
    def last_checkpoint(self, row: tuple[int, int, int] | None) -> None:
        self._checkpoints.last = row

    @property
    def _helper(self) -> sqlite3.Connection | None:
        return self._checkpoints.helper

    def checkpoint(self) -> tuple[int, int, int]:
        """Run a PASSIVE WAL checkpoint now (retried while another process holds the lock it
        needs). Returns SQLite's result row: (busy, frames in the WAL, frames checkpointed).
        :class:`ReplicationError` while checkpoints are left to Litestream."""
        with self._lock:
            if not self.read_only:
                self._checkpoints.refuse_if_left(self._connection)
        self._outside_transaction(self._checkpoints.run)
        assert self.last_checkpoint is not None
        return self.last_checkpoint

    # --- index upkeep (see hermes_state_upkeep) -----------------------------------------------

    @property
    def _rebuild_thread(self) -> threading.Thread | None:
        return self._upkeep.thread

    def rebuild_fts(self) -> None:
        """Rebuild the three FTS indexes now, in chunks, under the admission lock (after this
        handle's own background rebuild, if one is running, has finished); then finish the
        search index's fill, or replace it when damaged."""
        self._upkeep.rebuild_now()

    fts_status = _reads(fts.status)
    optimize_fts = _writes(fts.optimize_indexes)

    def check_fts_integrity(self) -> dict[str, str | None]:
        """FTS5 'integrity-check' of each index (None: clean). Changes nothing, but SQLite runs
        it as a write, so it needs a writable handle and takes the write lock briefly."""
        return self._outside_transaction(fts.integrity_report)

    quick_health = _reads(maintenance.quick_health)

    # --- sessions -----------------------------------------------------------------------------

    create_session = _writes(sessions.create_session)
    ensure_session = _writes(sessions.ensure_session)
    get_session = _reads(sessions.get_session)
    resolve_session_id = _reads(sessions.resolve_session_id)
    sessions_starting_with = _reads(sessions.sessions_starting_with)
    end_session = _writes(sessions.end_session)
    reopen_session = _writes(sessions.reopen_session)
    update_system_prompt = _writes(sessions.update_system_prompt)
    update_token_counts = _writes(sessions.update_token_counts)
    get_model_usage = _reads(sessions.get_model_usage)
    list_sessions_rich = _reads(listing.list_sessions_rich)
    # The previous store's name for one enriched row; the dashboard calls it.
    _get_session_rich_row = _reads(listing.get_session_rich_row)
    search_sessions = _reads(listing.search_sessions)
    session_count = _reads(listing.session_count)
    search_sessions_by_id = _reads(listing.search_sessions_by_id)
    list_cron_job_runs = _reads(listing.list_cron_job_runs)
    set_session_archived = _writes(sessions.set_session_archived)
    auto_archive_idle_sessions = _writes(sessions.auto_archive_idle_sessions)
    message_count = _reads(sessions.message_count)
    get_meta = _reads(dbconn.get_meta)
    set_meta = _writes(dbconn.set_meta)
    stats = _reads(sessions.stats)
    export_all = _reads(transfer.export_all)

    export_session = _reads(seen.EXPORT_SESSION)
    export_session_lineage = _reads(seen.EXPORT_SESSION_LINEAGE)

    @arguments.checked
    def iter_export_jsonl(
        self,
        session_ids: Iterable[str] | None = None,
        *,
        source: str | None = None,
        lineage: bool = False,
    ) -> Iterator[str]:
        """Export as JSON Lines from one consistent snapshot, in constant memory (see
        hermes_state_transfer.iter_export_jsonl); works on read-only handles."""
        with self._snapshot_reader() as conn:
            yield from transfer.iter_export_jsonl(
                conn, session_ids, source=source, lineage=lineage
            )

    @arguments.checked
    def import_sessions(
        self, sessions: list[Any], *, on_conflict: str = "skip", limited: bool = True,
        progress: transfer.Progress | None = None,
    ) -> dict[str, Any]:
        """Import exported sessions whole or not at all (hermes_state_transfer.import_sessions)."""
        return transfer.import_sessions(self._read, self._transcript_write, sessions,
                                        on_conflict=on_conflict, limited=limited, progress=progress)

    @arguments.checked
    def import_jsonl(
        self,
        fp: IO[Any],
        *,
        on_conflict: str = "fail",
        progress: transfer.Progress | None = None,
        max_record_bytes: int = transfer.MAX_RECORD_BYTES,
        chunk_messages: int | None = None,
    ) -> dict[str, Any]:
        """Import a whole JSON Lines export from ``fp`` (hermes_state_transfer.import_jsonl)."""
        return transfer.import_jsonl(self._read, self._transcript_write, fp,
                                     on_conflict=on_conflict, progress=progress,
                                     max_record_bytes=max_record_bytes,
                                     chunk_messages=chunk_messages)

    # --- session model, workspace, handoff ----------------------------------------------------

    update_session_meta = _writes(session_model.update_session_meta)
    update_session_model = _writes(session_model.update_session_model)
    update_session_billing_route = _writes(session_model.update_session_billing_route)
    update_session_cwd = _writes(
        workspace.update_session_cwd, "activity", fallback=methods.SKIPPED_WHEN_LOCKED
    )
    backfill_repo_roots = _writes(workspace.backfill_repo_roots)
    distinct_session_cwds = _reads(workspace.distinct_session_cwds)
    request_handoff = _writes(handoff.request_handoff)
    claim_handoff = _writes(handoff.claim_handoff)
    complete_handoff = _writes(handoff.complete_handoff)
    fail_handoff = _writes(handoff.fail_handoff)
    get_handoff_state = _reads(handoff.get_handoff_state, fallback=lenient(lambda: None))
    list_pending_handoffs = _reads(handoff.list_pending_handoffs, fallback=lenient(list))

    clear_messages = _writes(sessions.clear_messages, "transcript")

    # --- deleting, pruning, archiving (see hermes_state_deletion) ------------------------------

    delete_session = _writes(deletion.DELETE_SESSION)
    delete_sessions = _writes(deletion.DELETE_SESSIONS)
    delete_session_if_empty = _writes(deletion.DELETE_SESSION_IF_EMPTY)
    list_delete_candidates = _reads(deletion.list_delete_candidates)
    list_prune_candidates = _reads(deletion.list_prune_candidates)
    prune_sessions = _writes(deletion.PRUNE_SESSIONS)
    archive_sessions = _writes(deletion.archive_sessions)
    count_empty_sessions = _reads(deletion.count_empty_sessions)
    delete_empty_sessions = _writes(deletion.DELETE_EMPTY_SESSIONS)
    prune_empty_ghost_sessions = _writes(deletion.PRUNE_EMPTY_GHOST_SESSIONS)
    finalize_orphaned_compression_sessions = _writes(
        deletion.finalize_orphaned_compression_sessions
    )

    def vacuum(self) -> int:
        """Merge each FTS index's segments (``optimize``), checkpoint, then ``VACUUM``;
        returns how many indexes were merged. The checkpoint follows the handle's rules: none
        while checkpoints are left to Litestream, the handle's PASSIVE one (from its helper,
        under the write lock) inside the WAL-reset bug range, else TRUNCATE."""
        merged = self._write(fts.optimize_indexes)
        self._outside_transaction(self._checkpoints.truncate)
        self._outside_transaction(lambda conn: conn.execute(VACUUM_SQL).close())
        return merged

    @arguments.answered(deletion.refused_auto_prune)
    def maybe_auto_prune_and_vacuum(
        self,
        retention_days: float = 90,
        min_interval_hours: float = 24,
        vacuum: bool = True,
        sessions_dir: Path | None = None,
    ) -> dict[str, Any]:
        """Prune (and vacuum) at most once per ``min_interval_hours``; never raises: see
        hermes_state_deletion.auto_prune_and_vacuum."""
        return deletion.auto_prune_and_vacuum(
            self._write, self.prune_sessions, self.vacuum, retention_days=retention_days,
            min_interval_hours=min_interval_hours, vacuum=vacuum, sessions_dir=sessions_dir,
        )

    # --- messages: the handle remembers what it read and wrote (see hermes_state_seen) ---------

    append_message = _writes(seen.APPEND_MESSAGE, "transcript", spool=_TRANSCRIPT)
    get_messages = _reads(seen.GET_MESSAGES)
    get_messages_as_conversation = _reads(seen.GET_CONVERSATION)
    replace_messages = _writes(seen.REPLACE_MESSAGES, "transcript", spool=_TRANSCRIPT)

    has_archived_messages = _reads(messages.has_archived_messages)
    has_platform_message_id = _reads(messages.has_platform_message_id)

    # --- rewind and context windows -----------------------------------------------------------

    list_recent_user_messages = _reads(rewind.list_recent_user_messages)
    rewind_to_message = _writes(seen.REWIND_TO_MESSAGE, "transcript")
    restore_rewound = _writes(seen.RESTORE_REWOUND, "transcript")
    get_messages_around = _reads(context_window.get_messages_around)
    get_anchored_view = _reads(context_window.get_anchored_view)

    # --- titles -------------------------------------------------------------------------------

    sanitize_title = staticmethod(arguments.operation(sessions.sanitize_title))
    set_session_title = _writes(sessions.set_session_title)
    get_session_title = _reads(sessions.get_session_title)
    get_session_by_title = _reads(sessions.get_session_by_title)
    resolve_session_by_title = _reads(sessions.resolve_session_by_title)
    get_next_title_in_lineage = _reads(sessions.get_next_title_in_lineage)

    # --- lineage ------------------------------------------------------------------------------

    get_session_ancestors = _reads(lineage.session_ancestors)
    get_session_descendants = _reads(lineage.session_descendants)
    get_compression_tip = _reads(lineage.get_compression_tip)
    resolve_resume_session_id = _reads(lineage.resolve_resume_session_id)
    get_compression_lineage = _reads(lineage.compression_chain)

    # --- search -------------------------------------------------------------------------------

    _sanitize_fts5_query = staticmethod(search.sanitize_fts5_query)
    _contains_cjk = staticmethod(fts.contains_cjk)

    search_messages = _reads(search.search_messages, fallback=_WITHOUT_DAMAGED_INDEX)

    # --- compression --------------------------------------------------------------------------

    archive_and_compact = _writes(seen.ARCHIVE_AND_COMPACT, "transcript", spool=_COMPACTION)
    publish_compression_child = _writes(
        compression.publish_compression_child, "transcript",
        spool=quarantine.Spool(session="child_session_id"),
    )
    try_acquire_compression_lock = _writes(compression.try_acquire_compression_lock)
    refresh_compression_lock = _writes(compression.refresh_compression_lock)
    release_compression_lock = _writes(
        compression.release_compression_lock, fallback=lenient(lambda: None)
    )
    get_compression_lock_holder = _reads(compression.get_compression_lock_holder)
    get_compression_fallback_streak = _reads(
        compression.get_compression_fallback_streak, fallback=lenient(int)
    )
    set_compression_fallback_streak = _writes(compression.set_compression_fallback_streak)
    record_compression_failure_cooldown = _writes(
        compression.record_compression_failure_cooldown, fallback=lenient(lambda: None)
    )
    get_compression_failure_cooldown = _reads(
        compression.get_compression_failure_cooldown
    )
    clear_compression_failure_cooldown = _writes(
        compression.clear_compression_failure_cooldown, fallback=lenient(lambda: None)
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
    receipt_digest = staticmethod(arguments.operation(gateway.receipt_digest))
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

    ingress_owner_marker = staticmethod(arguments.operation(gateway.ingress_owner_marker))
    find_owned_input = _reads(gateway.find_owned_input)
    persist_exception_input = _writes(
        gateway.persist_exception_input, "transcript", spool=_TRANSCRIPT
    )


@arguments.operation
def collect_profile_stats(root: str | Path | None = None) -> dict[str, Any]:
    """:meth:`SessionDB.stats` of every profile under ``root`` (see
    hermes_state_profiles.collect_profile_stats); each store is opened read-only."""
    return profiles.collect_profile_stats(root, functools.partial(SessionDB, read_only=True))


#: This process's shared stores, one SessionDB per profile home, held by explicit owners
#: (see :class:`ProfileStoreRegistry`).
profile_stores: ProfileStoreRegistry[SessionDB] = ProfileStoreRegistry(SessionDB)
