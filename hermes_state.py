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
  processes holding the lock, in a WARNING and in ``<home>/logs/errors.log``;
* corruption proven to lie in the FTS indexes only detaches them (``fts_stale``) and the
  canonical write is retried once without them; any other corruption quarantines the handle:
  no retry, no further writes, no checkpoint on close, and a transcript that could not be
  written is spooled to ``<home>/sessions/<id>.jsonl``;
* after every 50 successful writes a PASSIVE checkpoint runs. With an SQLite inside the
  WAL-reset bug range, automatic checkpoints are off and this checkpoint runs from a helper
  connection while the handle holds the write lock, so no checkpoint ever overlaps a write.

The constants below are module attributes on purpose: tests shorten them.
"""

from __future__ import annotations

import contextlib
import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import hermes_state_common as common
import hermes_state_compression as compression
import hermes_state_fts as fts
import hermes_state_lockowners as lockowners
import hermes_state_messages as messages
import hermes_state_portability as portability
import hermes_state_schema as schema
import hermes_state_sessions as sessions
from hermes_state_common import (
    SCHEMA_VERSION,
    child_process_env,
    display_hermes_home,
    get_hermes_home,
    hermes_home_override,
    resolve_profile_home,
)
from hermes_state_errors import (
    FtsCorruptError,
    HermesStateError,
    LedgerBusyError,
    SessionNotFoundError,
    StateDbClosedError,
    StateDbCorruptError,
    StateDbFullError,
    StateDbLockedError,
    StateDbUnavailableError,
    TitleConflictError,
    UnsafePathError,
    is_corruption_error,
    is_disk_full_error,
    is_sqlite_lock_error,
)

__all__ = [
    "SessionDB",
    "SCHEMA_VERSION",
    "get_hermes_home",
    "hermes_home_override",
    "display_hermes_home",
    "resolve_profile_home",
    "child_process_env",
    "HermesStateError",
    "StateDbLockedError",
    "StateDbCorruptError",
    "StateDbFullError",
    "StateDbClosedError",
    "FtsCorruptError",
    "StateDbUnavailableError",
    "LedgerBusyError",
    "SessionNotFoundError",
    "TitleConflictError",
    "UnsafePathError",
]

logger = logging.getLogger("hermes_state")
T = TypeVar("T")

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


class SessionDB:
    """A handle on one session store (default: ``get_hermes_home() / "state.db"``).

    Thread-safe; usable as a context manager; ``close()`` is idempotent. With
    ``read_only=True`` the file is opened ``mode=ro`` and nothing is ever created, migrated,
    checkpointed or repaired (see :class:`StateDbUnavailableError` for what it refuses).
    """

    def __init__(
        self,
        db_path: str | Path | None = None,
        *,
        read_only: bool = False,
        rebuild_fts: bool = True,
    ) -> None:
        path = common.default_db_path() if db_path is None else Path(db_path).expanduser()
        common.check_test_isolation(path)
        self.path = path.absolute()
        self.profile_home = self.path.parent
        self.read_only = read_only
        self.wal_reset_exposed = common.wal_reset_exposed()
        self.last_checkpoint: tuple[int, int, int] | None = None
        self._lock = threading.RLock()
        self._writes = 0
        self._closed = False
        self._quarantined: BaseException | None = None
        self._helper: sqlite3.Connection | None = None
        self._rebuild_thread: threading.Thread | None = None
        self._stop_rebuild = threading.Event()
        if read_only:
            self._conn = self._open_read_only()
        else:
            self._conn = self._open_writable()
            if rebuild_fts:
                self._start_fts_maintenance()

    # --- opening ------------------------------------------------------------------------------

    def _connect(self, mode: str, timeout: float) -> sqlite3.Connection:
        uri = f"{self.path.as_uri()}?mode={mode}&nofollow=1"
        conn = sqlite3.connect(
            uri, uri=True, isolation_level=None, check_same_thread=False, timeout=timeout
        )
        return conn

    def _open_writable(self) -> sqlite3.Connection:
        with _OPEN_LOCK:
            common.prepare_db_file(self.path)
            self._conn = self._connect("rw", _SQLITE_BUSY_TIMEOUT_S)
        try:
            self._write(self._configure_writable, transactional=False)
            schema.ensure_schema(self._conn, self._write)
            common.tighten_modes(self.path)
        except BaseException:
            self._conn.close()
            raise
        return self._conn

    def _configure_writable(self, conn: sqlite3.Connection) -> None:
        """Connection settings, outside any transaction (both pragmas are no-ops inside one)
        but through the retry wrapper: switching a new file to WAL needs its lock."""
        conn.execute("PRAGMA foreign_keys = ON")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise HermesStateError(f"{self.path} refused WAL mode (journal_mode={mode})")
        if self.wal_reset_exposed:
            conn.execute("PRAGMA wal_autocheckpoint = 0")

    def _open_read_only(self) -> sqlite3.Connection:
        common.refuse_symlinks(self.path)
        if not self.path.is_file() or self.path.stat().st_size == 0:
            raise StateDbUnavailableError(
                f"no initialised session store at {self.path}",
                reason="uninitialized",
                path=self.path,
            )
        conn = self._connect("ro", _READ_BUSY_TIMEOUT_S)
        try:
            version = schema.read_version(conn)
        except sqlite3.Error as exc:
            conn.close()
            if is_sqlite_lock_error(exc):
                raise StateDbUnavailableError(
                    f"session store {self.path} stayed locked for {_READ_BUSY_TIMEOUT_S:g} s",
                    reason="busy",
                    path=self.path,
                ) from exc
            raise self._translate(exc) from exc
        if version != SCHEMA_VERSION:
            conn.close()
            reason = "uninitialized" if version is None else "incompatible"
            raise StateDbUnavailableError(
                f"session store {self.path} has schema version {version}, "
                f"this library reads {SCHEMA_VERSION}",
                reason=reason,
                path=self.path,
                schema_version=version,
            )
        return conn

    # --- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the handle. A quarantined handle skips every checkpoint and leaves the -wal."""
        self._stop_rebuild.set()
        if self._rebuild_thread is not None:
            self._rebuild_thread.join()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            guard = None
            if self._quarantined is not None:
                guard = self._guard_against_close_checkpoint()
            elif not self.read_only:
                with contextlib.suppress(sqlite3.Error):
                    self._checkpoint()
            if self._helper is not None:
                self._helper.close()
            self._conn.close()
            if guard is not None:
                guard.close()

    def _guard_against_close_checkpoint(self) -> sqlite3.Connection | None:
        """Keep SQLite from checkpointing a corrupt file when this handle closes.

        Python ≥ 3.12 sets SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE. Python 3.11 cannot, so a read-only
        connection joins the WAL first: the writable connection is then not the last one and
        does not checkpoint, and the read-only one, closing last, cannot checkpoint. Returns
        that connection, to be closed after this handle's.
        """
        if hasattr(self._conn, "setconfig"):
            with contextlib.suppress(sqlite3.Error):
                self._conn.setconfig(sqlite3.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, True)
                return None
        try:
            guard = self._connect("ro", 0.0)
            with contextlib.suppress(sqlite3.Error):
                guard.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return guard
        except sqlite3.Error:
            return None

    def __enter__(self) -> SessionDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def quarantined(self) -> bool:
        return self._quarantined is not None

    # --- the write wrapper --------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StateDbClosedError(f"SessionDB for {self.path} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise HermesStateError(f"SessionDB for {self.path} is read-only")
        if self._quarantined is not None:
            raise StateDbCorruptError(
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
                if is_sqlite_lock_error(exc):
                    elapsed = time.monotonic() - start
                    if elapsed >= patience:
                        raise self._locked_error(elapsed, attempts) from exc
                    time.sleep(min(_retry_delay(elapsed), max(patience - elapsed, 0.001)))
                    continue
                if is_corruption_error(exc) and not detach_fts and self._fts_only(exc):
                    logger.warning("FTS index damaged (%s); detaching it from %s", exc, self.path)
                    detach_fts = True
                    continue
                if is_corruption_error(exc):
                    self._quarantined = exc
                    logger.error("quarantining %s after corruption: %s", self.path, exc)
                raise self._translate(exc) from exc

    def _fts_only(self, exc: sqlite3.Error) -> bool:
        with self._lock:
            return fts.damage_is_fts_only(self._conn, exc)

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` under the handle's lock; SQLite errors become typed errors."""
        with self._lock:
            self._check_open()
            try:
                return fn(self._conn)
            except sqlite3.Error as exc:
                if self.read_only and is_sqlite_lock_error(exc):
                    raise StateDbUnavailableError(
                        f"session store {self.path} is busy", reason="busy", path=self.path
                    ) from exc
                raise self._translate(exc) from exc

    def _translate(self, exc: sqlite3.Error) -> Exception:
        if is_corruption_error(exc):
            return StateDbCorruptError(f"{self.path} is damaged: {exc}", path=self.path)
        if is_disk_full_error(exc):
            return StateDbFullError(f"no space left for {self.path}: {exc}", path=self.path)
        if is_sqlite_lock_error(exc):
            return StateDbLockedError(f"{self.path} is locked: {exc}", path=self.path)
        return exc

    def _locked_error(self, waited: float, attempts: int) -> StateDbLockedError:
        holders = lockowners.describe_lock_holders(self.path)
        line = "; ".join(holders) if holders else "no lock holder could be named"
        logger.warning("write to %s gave up after %.1f s: %s", self.path, waited, line)
        common.append_error_log(f"database is locked: {self.path}: {line}")
        return StateDbLockedError(
            f"{self.path} stayed locked for {waited:.1f} s ({attempts} attempts): {line}",
            path=self.path,
            waited_s=waited,
            attempts=attempts,
            holders=holders,
        )

    def _count_write(self) -> None:
        self._writes += 1
        if self._writes % _CHECKPOINT_EVERY_N_WRITES == 0:
            try:
                self._checkpoint()
            except sqlite3.Error as exc:
                logger.debug("checkpoint of %s skipped: %s", self.path, exc)

    def _checkpoint(self) -> None:
        """PASSIVE checkpoint; inside the WAL-reset bug range, only while holding the write
        lock (a helper connection checkpoints, since a connection cannot inside its own
        transaction)."""
        if not self.wal_reset_exposed:
            row = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        else:
            if self._helper is None:
                self._helper = self._connect("rw", 0.0)
                self._helper.execute("PRAGMA wal_autocheckpoint = 0")
            with common.transaction(self._conn):
                row = self._helper.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
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
        only when no other process has the database open."""
        state = self._read(fts.index_state)
        if state.usable:
            return
        self._rebuild_thread = threading.Thread(
            target=self._rebuild_in_background, name="hermes-state-fts-rebuild", daemon=True
        )
        self._rebuild_thread.start()

    def _rebuild_in_background(self) -> None:
        try:
            self._rebuild(require_exclusive=True)
        except HermesStateError as exc:
            logger.warning("FTS rebuild of %s stopped: %s", self.path, exc)

    def _rebuild(self, *, require_exclusive: bool) -> bool:
        with fts.admission_lock(self.path) as admitted:
            if not admitted:
                return False
            state = self._read(fts.index_state)
            if state.stale is not None or not state.rebuilding:
                if require_exclusive and fts.other_processes_hold(self.path):
                    logger.warning(
                        "FTS index of %s stays detached: other processes have it open",
                        self.path,
                    )
                    return False
                self._write(fts.start_rebuild)
            while not self._stop_rebuild.is_set():
                if not self._write(fts.rebuild_chunk):
                    return True
            return False

    def rebuild_fts(self) -> None:
        """Rebuild the three FTS indexes now, in chunks, under the admission lock."""
        if not self._rebuild(require_exclusive=False):
            raise HermesStateError(f"another process is rebuilding the FTS index of {self.path}")

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
        return self._write(fts.integrity_report)

    # --- sessions -----------------------------------------------------------------------------

    def create_session(
        self,
        session_id: str,
        source: str,
        model: str | None = None,
        model_config: dict[str, Any] | str | None = None,
        system_prompt: str | None = None,
        user_id: str | None = None,
        parent_session_id: str | None = None,
        **columns: Any,
    ) -> str:
        """Create the session unless it exists; a second call changes nothing."""
        columns.update(
            model=model,
            model_config=model_config,
            system_prompt=system_prompt,
            user_id=user_id,
            parent_session_id=parent_session_id,
        )
        self._write(lambda c: sessions.create_session(c, session_id, source, columns))
        return session_id

    def ensure_session(self, session_id: str, source: str = "unknown", model: str | None = None) -> str:
        return self.create_session(session_id, source, model=model)

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        return self._read(lambda c: sessions.get_session(c, session_id))

    def resolve_session_id(self, session_id_or_prefix: str) -> str | None:
        return self._read(lambda c: sessions.resolve_session_id(c, session_id_or_prefix))

    def end_session(self, session_id: str, end_reason: str) -> bool:
        """End the session; the first end reason is kept (True when this call ended it)."""
        return self._write(lambda c: sessions.end_session(c, session_id, end_reason))

    def reopen_session(self, session_id: str) -> None:
        self._write(lambda c: sessions.reopen_session(c, session_id))

    def update_system_prompt(self, session_id: str, prompt: str | None) -> None:
        self._write(
            lambda c: sessions.update_session_columns(c, session_id, {"system_prompt": prompt})
        )

    def update_token_counts(
        self,
        session_id: str,
        input_tokens: int = 0,
        output_tokens: int = 0,
        model: str | None = None,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        reasoning_tokens: int = 0,
        estimated_cost_usd: float | None = None,
        actual_cost_usd: float | None = None,
        cost_status: str | None = None,
        cost_source: str | None = None,
        pricing_version: str | None = None,
        billing_provider: str | None = None,
        billing_base_url: str | None = None,
        billing_mode: str | None = None,
        api_call_count: int = 0,
        absolute: bool = False,
        task: str | None = None,
    ) -> None:
        """Add to (or, with ``absolute=True``, set) the session's totals and the matching
        ``session_model_usage`` row, in one transaction."""
        counts = dict(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_tokens=cache_read_tokens,
            cache_write_tokens=cache_write_tokens,
            reasoning_tokens=reasoning_tokens,
            api_call_count=api_call_count,
            estimated_cost_usd=estimated_cost_usd,
            actual_cost_usd=actual_cost_usd,
            cost_status=cost_status,
            cost_source=cost_source,
            pricing_version=pricing_version,
            billing_provider=billing_provider,
            billing_base_url=billing_base_url,
            billing_mode=billing_mode,
        )
        self._write(
            lambda c: sessions.update_token_counts(
                c, session_id, model=model, absolute=absolute, task=task, counts=counts
            )
        )

    def get_model_usage(self, session_id: str) -> list[dict[str, Any]]:
        return self._read(lambda c: sessions.model_usage(c, session_id))

    def list_sessions_rich(
        self,
        source: str | None = None,
        exclude_sources: Iterable[str] | None = None,
        limit: int = 20,
        offset: int = 0,
        include_archived: bool = False,
    ) -> list[dict[str, Any]]:
        """Conversations newest first, one row per lineage root, with ``preview``,
        ``last_active`` and the live tip (``tip_session_id``)."""
        return self._read(
            lambda c: sessions.list_sessions_rich(
                c,
                source=source,
                exclude_sources=exclude_sources,
                limit=limit,
                offset=offset,
                include_archived=include_archived,
            )
        )

    def search_sessions(
        self, source: str | None = None, limit: int = 20, offset: int = 0
    ) -> list[dict[str, Any]]:
        """Session rows newest first, optionally of one source."""
        return self._read(
            lambda c: sessions.list_sessions(c, source=source, limit=limit, offset=offset)
        )

    def session_count(self, source: str | None = None, include_archived: bool = True) -> int:
        return self._read(lambda c: sessions.session_count(c, source, include_archived))

    def message_count(self, session_id: str | None = None) -> int:
        """Active messages of one session, or of the whole store."""
        return self._read(lambda c: sessions.message_count(c, session_id))

    def get_meta(self, key: str) -> str | None:
        return self._read(lambda c: common.get_meta(c, key))

    def set_meta(self, key: str, value: object) -> None:
        self._write(lambda c: common.set_meta(c, key, value))

    def export_session(self, session_id: str) -> dict[str, Any] | None:
        return self._read(lambda c: portability.export_session(c, session_id))

    def export_all(self, source: str | None = None) -> list[dict[str, Any]]:
        return self._read(lambda c: portability.export_all(c, source))

    def clear_messages(self, session_id: str) -> int:
        """Delete every message of the session (all generations); the row stays, zeroed."""
        return self._write(lambda c: sessions.clear_messages(c, session_id), "transcript")

    def delete_session(self, session_id: str) -> bool:
        """Delete a session (children are orphaned, not deleted); False if there was none."""
        return self._write(lambda c: sessions.delete_session(c, session_id))

    def prune_sessions(self, older_than_days: float = 90, source: str | None = None) -> int:
        """Delete ended sessions idle for ``older_than_days``; returns how many."""
        return len(
            self._write(
                lambda c: sessions.prune_sessions(c, older_than_days=older_than_days, source=source)
            )
        )

    def vacuum(self) -> None:
        self._write(lambda c: c.execute("VACUUM"), transactional=False)

    def maybe_auto_prune_and_vacuum(
        self, retention_days: float = 90, min_interval_hours: float = 24, vacuum: bool = True
    ) -> dict[str, Any] | None:
        """Prune (and vacuum) at most once per ``min_interval_hours``, remembered in
        ``state_meta``; None when it was not due."""
        def claim(c: sqlite3.Connection) -> bool:
            last = common.get_meta(c, _AUTO_PRUNE_KEY)
            if last is not None and common.now() - float(last) < min_interval_hours * 3600:
                return False
            common.set_meta(c, _AUTO_PRUNE_KEY, common.now())
            return True

        if not self._write(claim):
            return None
        pruned = self.prune_sessions(retention_days)
        if vacuum and pruned:
            self.vacuum()
        return {"pruned": pruned, "vacuumed": bool(vacuum and pruned)}

    # --- messages -----------------------------------------------------------------------------

    def append_message(
        self,
        session_id: str,
        role: str,
        content: str | None = None,
        tool_name: str | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
        tool_call_id: str | None = None,
        token_count: int | None = None,
        finish_reason: str | None = None,
        reasoning: str | None = None,
        reasoning_content: str | None = None,
        reasoning_details: Any = None,
        codex_reasoning_items: Any = None,
        codex_message_items: Any = None,
        platform_message_id: str | None = None,
        observed: bool = False,
        effect_disposition: str | None = None,
        api_content: str | None = None,
        display_kind: str | None = None,
        display_metadata: Any = None,
        message_uid: str | None = None,
        timestamp: float | None = None,
        absorbed_message_uids: list[str] | None = None,
        tool_call_uids: dict[str, Any] | None = None,
        tool_call_uid: str | None = None,
    ) -> int:
        """Append one message and move the session's counters, in one transaction.

        Returns the row id. If the file turns out to be corrupt the message is spooled to
        ``<home>/sessions/<session_id>.jsonl`` and the error says where.
        """
        fields = {k: v for k, v in locals().items() if k not in ("self", "session_id")}
        return self._write_transcript(
            session_id, [fields], lambda c: messages.insert_message(c, session_id, fields)
        )

    def _write_transcript(
        self, session_id: str, records: list[dict[str, Any]], fn: Callable[[sqlite3.Connection], T]
    ) -> T:
        try:
            return self._write(fn, "transcript")
        except StateDbCorruptError as exc:
            stamped = [{"session_id": session_id, **r} for r in records]
            exc.spooled_to = common.spool_transcript(session_id, stamped)
            raise

    def get_messages(
        self,
        session_id: str,
        include_inactive: bool = False,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        return self._read(
            lambda c: messages.get_messages(
                c, session_id, include_inactive=include_inactive, limit=limit, offset=offset
            )
        )

    def get_messages_as_conversation(
        self, session_id: str, include_ancestors: bool = False, include_row_ids: bool = False
    ) -> list[dict[str, Any]]:
        """The OpenAI-format replay list (see hermes_state_messages.conversation).

        ``include_ancestors=True`` prepends the lineage, root first."""
        def read(c: sqlite3.Connection) -> list[dict[str, Any]]:
            ids = [session_id]
            if include_ancestors:
                ids = [r["id"] for r in reversed(compression.ancestors(c, session_id))]
            return messages.conversation(c, ids, include_row_ids=include_row_ids)

        return self._read(read)

    def replace_messages(self, session_id: str, new_messages: Iterable[dict[str, Any]]) -> list[int]:
        """Replace the active generation; every message keeps the uid it carries."""
        rows = [dict(m) for m in new_messages]
        return self._write_transcript(
            session_id, rows, lambda c: messages.replace_messages(c, session_id, rows)
        )

    # --- titles -------------------------------------------------------------------------------

    sanitize_title = staticmethod(sessions.sanitize_title)

    def set_session_title(self, session_id: str, title: str | None) -> bool:
        """Set the title (unique among sessions; TitleConflictError otherwise)."""
        return self._write(lambda c: sessions.set_session_title(c, session_id, title))

    def get_session_title(self, session_id: str) -> str | None:
        session = self.get_session(session_id)
        return None if session is None else session["title"]

    def get_session_by_title(self, title: str) -> dict[str, Any] | None:
        cleaned = sessions.sanitize_title(title)
        if cleaned is None:
            return None
        def read(c: sqlite3.Connection) -> dict[str, Any] | None:
            row = c.execute("SELECT id FROM sessions WHERE title = ?", (cleaned,)).fetchone()
            return None if row is None else sessions.get_session(c, row[0])
        return self._read(read)

    def resolve_session_by_title(self, title: str) -> str | None:
        """The most recent session of the title's lineage (``T``, ``T #2``, …)."""
        return self._read(lambda c: sessions.resolve_session_by_title(c, title))

    def get_next_title_in_lineage(self, title: str) -> str:
        return self._read(lambda c: sessions.next_title_in_lineage(c, title))

    # --- lineage ------------------------------------------------------------------------------

    def get_session_ancestors(self, session_id: str) -> list[dict[str, Any]]:
        """The session and its ancestors, nearest first."""
        return self._read(lambda c: compression.ancestors(c, session_id))

    def get_session_descendants(self, session_id: str) -> list[dict[str, Any]]:
        return self._read(lambda c: compression.descendants(c, session_id))

    def get_compression_tip(self, session_id: str) -> str | None:
        return self._read(lambda c: compression.compression_tip_of(c, session_id))

    def get_compression_lineage(self, session_id: str) -> list[str]:
        """The compression chain through the session, root first, tip last."""
        return self._read(lambda c: compression.compression_lineage(c, session_id))


_AUTO_PRUNE_KEY = "auto_prune_last_run_at"
