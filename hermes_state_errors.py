"""The typed exception hierarchy of hermes_state, and SQLite error classification.

Every deliberate error derives from :class:`HermesStateError`. Messages state the condition;
advice belongs to the command line. SQLite errors are classified by extended result code,
never by message text, which changes between versions and locales. Translation happens here
only (:func:`translate`, :func:`translated_errors`); the original stays as ``__cause__``.
:func:`is_malformed_db_error` alone reads text: callers' own connections promise only that."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "HermesStateError",
    "StateDbError",
    "StateDbLockedError",
    "StateDbCorruptError",
    "StateDbFullError",
    "StateDbIOError",
    "StateDbReadOnlyError",
    "StateDbCannotOpenError",
    "StateDbConstraintError",
    "StateDbClosedError",
    "FtsCorruptError",
    "FullTextUnavailableError",
    "StateDbUnavailableError",
    "StateDbReplacedError",
    "StateDbInUseError",
    "InvalidInputError",
    "InvalidTypeError",
    "UnknownFilterError",
    "ImportRejectedError",
    "UnsafePathError",
    "LedgerBusyError",
    "LedgerConflictError",
    "StaleEpochError",
    "ReceiptRejectedError",
    "SessionNotFoundError",
    "TitleConflictError",
    "TopicAlreadyLinkedError",
    "OwnerLookupError",
    "CompressionConflictError",
    "RewriteRefusedError",
    "ProfileNotFoundError",
    "StoreNotHeldError",
    "ReplicationError",
    "is_sqlite_lock_error",
    "is_corruption_error",
    "is_fts_corruption_code",
    "is_disk_full_error",
    "is_io_error",
    "is_readonly_error",
    "is_hot_journal_error",
    "hot_journal_error",
    "translate",
    "translated_errors",
    "translate_os_error",
    "foreign_database_error",
    "HOT_JOURNAL_REASON",
    "is_malformed_db_error",
    "unnamed_cause",
    "missing_table",
    "FOREIGN_REASON",
    "TRUNCATED_REASON",
    "READ_ONLY_DIRECTORY_REASON",
    "translate_read",
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_CORRUPT",
    "SQLITE_NOTADB",
    "SQLITE_CORRUPT_VTAB",
    "SQLITE_FULL",
    "SQLITE_IOERR",
    "SQLITE_READONLY",
    "SQLITE_READONLY_ROLLBACK",
]

# Primary result codes; the extended code keeps the primary code in its low byte.
SQLITE_ERROR = 1
SQLITE_PERM = 3
SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_READONLY = 8
SQLITE_IOERR = 10
SQLITE_CORRUPT = 11
SQLITE_FULL = 13
SQLITE_CANTOPEN = 14
SQLITE_CONSTRAINT = 19
SQLITE_NOTADB = 26
SQLITE_CORRUPT_VTAB = SQLITE_CORRUPT | (1 << 8)
SQLITE_READONLY_ROLLBACK = SQLITE_READONLY | (3 << 8)
SQLITE_READONLY_DIRECTORY = SQLITE_READONLY | (6 << 8)

LOCKED_REASON = "session_persistence_failed:locked"
HOT_JOURNAL_REASON = "hot_journal"
FOREIGN_REASON = "foreign"
TRUNCATED_REASON = "truncated"
READ_ONLY_DIRECTORY_REASON = "read_only_directory"


class HermesStateError(Exception):
    """Root of every error raised by hermes_state.

    An error translated from SQLite's (:func:`translate`) carries its result code: the
    extended ``sqlite_errorcode`` and its ``sqlite_errorname``; None for the others."""

    sqlite_errorcode: int | None = None
    sqlite_errorname: str | None = None


class StateDbError(HermesStateError):
    """SQLite failed with a result code no narrower type describes (``SQLITE_ERROR`` for a
    missing table, say, or ``SQLITE_MISUSE``); ``sqlite_errorcode`` and ``sqlite_errorname``
    say which. Nothing of the failed transaction was written."""

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class StateDbLockedError(HermesStateError):
    """A write could not take the database lock before its patience ran out.

    ``holders`` names the processes seen holding SQLite locks on the database files at that
    moment (one line each, empty where ``/proc/locks`` is not available).
    """

    def __init__(
        self,
        message: str,
        *,
        path: Path | None = None,
        waited_s: float = 0.0,
        attempts: int = 0,
        holders: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.reason = LOCKED_REASON
        self.path = path
        self.waited_s = waited_s
        self.attempts = attempts
        self.holders = list(holders)


class StateDbCorruptError(HermesStateError):
    """The database file itself (not only a search index) is damaged.

    The handle that saw it is quarantined: it never writes to the file again. When a transcript
    could not be written, ``spooled_to`` is the JSONL file that holds it instead.
    """

    def __init__(
        self, message: str, *, path: Path | None = None, spooled_to: Path | None = None
    ) -> None:
        super().__init__(message)
        self.path = path
        self.spooled_to = spooled_to


class StateDbFullError(HermesStateError):
    """The disk (or the configured page limit) is full; the write was rolled back whole."""

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class StateDbIOError(HermesStateError):
    """The operating system failed a read or write of the database files (``SQLITE_IOERR``:
    a file-size limit, a failing disk, a vanished network share); the write was rolled back
    whole. SQLite reports a disk that is merely full as :class:`StateDbFullError`."""

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class StateDbReadOnlyError(HermesStateError):
    """The store may not be written (``SQLITE_READONLY``, or the operating system refused to
    create a file of it): its owner write-protected the database file or a sidecar
    (``chmod a-w``; the library never gives a write permission back), a read-only mount, a
    directory that cannot take the ``-wal`` or ``-shm``. Raised at a writable open or at the
    write; nothing was written; ``path`` is the protected file where it is known. A hot
    journal that a read-only open may not roll back is :class:`StateDbUnavailableError`
    ``hot_journal`` instead."""

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class StateDbCannotOpenError(HermesStateError):
    """The database file cannot be opened or created at all (``SQLITE_CANTOPEN``,
    ``SQLITE_PERM``, or the operating system's refusal): a missing directory for a read, no
    permission, no file descriptor left."""

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class StateDbConstraintError(HermesStateError):
    """A write broke a constraint of the schema (``SQLITE_CONSTRAINT``: a unique key, a
    foreign key, a NOT NULL column); its transaction was rolled back whole."""

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class StateDbClosedError(HermesStateError):
    """The handle was closed."""


class FtsCorruptError(HermesStateError):
    """A full-text index is damaged while the canonical tables are intact."""


class FullTextUnavailableError(HermesStateError):
    """The SQLite this process runs cannot maintain the full-text indexes (it was built without
    FTS5, or without its trigram tokenizer), or the handle was opened with full-text search
    switched off: index operations (rebuild, integrity check) cannot run. Searches still
    answer, from a scan of the canonical rows. ``level`` is the handle's full-text level."""

    def __init__(self, message: str, *, level: str) -> None:
        super().__init__(message)
        self.level = level


class StateDbUnavailableError(HermesStateError):
    """The store cannot serve this request: ``reason`` is "uninitialized" (no session store
    there yet), "incompatible" (another schema version), "foreign" (the file is another
    application's SQLite database, left untouched), "truncated" (the main file is empty beside
    a ``-wal`` that is not: it lost its content, it is not a new store), "busy" or
    "hot_journal" (an interrupted write left a rollback journal that only a writable open may
    roll back), "read_only_directory" (a read-only open of a WAL store with no ``-shm`` in a
    directory this user may not write: SQLite cannot create the ``-shm`` a reader needs).
    ``http_status`` is what a web front end should answer (503: try again later)."""

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        path: Path | None = None,
        http_status: int = 503,
        schema_version: int | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.path = path
        self.http_status = http_status
        self.schema_version = schema_version


class StateDbReplacedError(HermesStateError):
    """The database file was deleted or replaced underneath an open handle."""

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class StateDbInUseError(HermesStateError):
    """Maintenance that needs the database to itself (repair, restore) was refused because
    another connection has it open (SQLite's own lock says so; the caller's own handles
    count), or another maintenance run holds its admission lock. ``holders`` names the other
    processes where ``/proc/locks`` could tell."""

    def __init__(
        self, message: str, *, path: Path | None = None, holders: Sequence[str] = ()
    ) -> None:
        super().__init__(message)
        self.path = path
        self.holders = list(holders)


class InvalidInputError(HermesStateError, ValueError):
    """An argument was refused before anything was read or written: a value out of its range
    (an integer past SQLite's 64 bits, a number that is not finite, a title too long), a key
    holding a lone surrogate (no stored key can), a structure that is not JSON. ``argument``
    names the refused parameter (or field) where one is to blame."""

    def __init__(self, message: str, *, argument: str | None = None) -> None:
        super().__init__(message)
        self.argument = argument


class InvalidTypeError(InvalidInputError, TypeError):
    """An argument of the wrong type was refused before anything was read or written; also a
    ``TypeError``, as such refusals were before they were typed."""


class UnknownFilterError(InvalidTypeError):
    """A filter name the call does not know (a ``TypeError``, as an unknown keyword is);
    ``names`` lists them. Nothing was read or written."""

    def __init__(self, message: str, *, names: list[str]) -> None:
        super().__init__(message, argument=names[0] if len(names) == 1 else None)
        self.names = list(names)


class ImportRejectedError(InvalidInputError):
    """An import was refused whole and nothing of it was written: ``errors`` lists each
    problem (``{"index"|"line", "error", "code"[, "session_id"]}``: the record's position in
    the list, or the line of the stream; the readable message; its stable machine code).

    The codes: ``invalid-record`` (not an object), ``missing-id``, ``duplicate-id`` (twice in
    one import), ``session-exists`` (a different session holds the id), ``missing-field``,
    ``invalid-field`` (a session column of the wrong type), ``invalid-model-config``,
    ``invalid-messages`` (not a list), ``invalid-message`` (not an object), ``missing-role``,
    ``unsupported-text`` (content or text JSON or SQLite cannot carry),
    ``invalid-message-field``, ``out-of-range`` (an integer past 64 bits), ``invalid-usage``,
    ``truncated-record`` (fewer messages than its count), ``too-large`` (a session, a line
    or a JSON export past its limit), ``not-json`` (a line or an export that is not JSON),
    ``invalid-stream`` (a JSON Lines stream's frame) and ``more-problems`` (the entry that
    counts the problems not listed)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        # Each problem's code is stated where the problem is found, never read from its words.
        assert all(isinstance(e.get("code"), str) for e in errors), errors
        shown = "; ".join(_where(e) + e["error"] for e in errors[:3])
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        super().__init__(f"import refused, nothing written: {shown}{more}")
        self.errors = errors


def _where(error: dict[str, Any]) -> str:
    if "line" in error:
        return f"line {error['line']}: "
    return f"record {error['index']}: " if "index" in error else ""


class UnsafePathError(HermesStateError, ValueError):
    """A path or profile name was refused: a symlink where a database file belongs, a profile
    name with separators or ``..``, or a path that escapes its root."""

    def __init__(self, message: str, *, path: Path | str | None = None) -> None:
        super().__init__(message)
        self.path = path


class LedgerBusyError(HermesStateError):
    """A session cannot be deleted or pruned while its runtime ledgers hold live work."""

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


class LedgerConflictError(HermesStateError, ValueError):
    """A ledger operation does not fit the ledger's current state (wrong status, unknown id)."""


class StaleEpochError(LedgerConflictError):
    """The caller's runtime epoch is not the current one: another owner has taken over."""

    def __init__(self, message: str, *, epoch: int, current_epoch: int) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.current_epoch = current_epoch


class ReceiptRejectedError(LedgerConflictError):
    """A worker receipt was refused and nothing was written. ``reason`` is one of "gap",
    "out_of_order" (a duplicate or earlier sequence), "digest_mismatch", "not_live" (the
    execution is finished or unknown) or "unknown_execution"."""

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        execution_id: str | None = None,
        sequence: int | None = None,
        expected_sequence: int | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.execution_id = execution_id
        self.sequence = sequence
        self.expected_sequence = expected_sequence


class SessionNotFoundError(HermesStateError, KeyError):
    """No session has this id."""

    def __init__(self, session_id: str) -> None:
        super().__init__(session_id)
        self.session_id = session_id

    def __str__(self) -> str:
        return f"session not found: {self.session_id!r}"


class TitleConflictError(HermesStateError, ValueError):
    """Another session already carries this title."""


class TopicAlreadyLinkedError(HermesStateError, ValueError):
    """A session bound to one Telegram topic was bound to another; nothing was written. The
    message says the session "is already linked", which callers match."""

    def __init__(self, message: str, *, session_id: str, chat_id: str, thread_id: str) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.chat_id = chat_id
        self.thread_id = thread_id


class OwnerLookupError(HermesStateError):
    """The owner of an input could not be determined, so nothing was written on a guess."""


class CompressionConflictError(HermesStateError, ValueError):
    """A split compression would fork a conversation: the parent already forwards to a
    published successor, or the child's id is taken."""


class RewriteRefusedError(HermesStateError):
    """A rewrite of a session's transcript (``replace_messages``, ``archive_and_compact``) was
    refused and nothing was written: it would have undone or dropped what its caller never saw
    — rows of the session changed since the read the rewrite was built from (a rewind, a
    restore, another rewrite), or no bound of what the caller read is known and its messages
    account for none of the rows it would remove. Read the session again and rewrite from that
    read."""

    def __init__(self, message: str, *, session_id: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class ProfileNotFoundError(HermesStateError, LookupError):
    """An explicitly named profile (or home) has no directory: it was never created or it was
    removed. Raised before anything is opened or created for it."""

    def __init__(
        self, message: str, *, profile: str | None = None, path: Path | None = None
    ) -> None:
        super().__init__(message)
        self.profile = profile
        self.path = path


class StoreNotHeldError(HermesStateError, LookupError):
    """An owner released or transferred a profile store it does not hold."""


class ReplicationError(HermesStateError):
    """Replication to, or a restore from, a Litestream replica could not be done, or a
    checkpoint was asked for while checkpoints are left to Litestream. ``reason`` is one of
    "not_installed", "unsupported_version", "bad_url", "bad_interval", "bad_timestamp",
    "bad_setting", "already_running", "quarantined", "litestream_failed", "restore_failed",
    "output_exists", "checkpoints_left_to_litestream"; ``detail`` is what Litestream said."""

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        path: Path | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.path = path
        self.detail = detail


def _error_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code if isinstance(code, int) else None


def is_sqlite_lock_error(exc: BaseException) -> bool:
    """True for SQLITE_BUSY / SQLITE_LOCKED and their extended codes.

    This includes a busy error that FTS5 reports as "vtable constructor failed": the code is
    still SQLITE_BUSY, only the message differs.
    """
    code = _error_code(exc)
    return code is not None and (code & 0xFF) in (SQLITE_BUSY, SQLITE_LOCKED)


def is_corruption_error(exc: BaseException) -> bool:
    """True for SQLITE_CORRUPT (any extended code) and SQLITE_NOTADB."""
    code = _error_code(exc)
    return code is not None and (code & 0xFF) in (SQLITE_CORRUPT, SQLITE_NOTADB)


def is_fts_corruption_code(exc: BaseException) -> bool:
    """True when the result code itself says the damage is inside a virtual table."""
    return _error_code(exc) == SQLITE_CORRUPT_VTAB


def is_io_error(exc: BaseException) -> bool:
    """True for SQLITE_IOERR and its extended codes (the OS failed a read, write or lock)."""
    code = _error_code(exc)
    return code is not None and (code & 0xFF) == SQLITE_IOERR


def is_readonly_error(exc: BaseException) -> bool:
    """True for SQLITE_READONLY and its extended codes (a hot journal a read-only connection
    may not roll back is one of them: see :func:`is_hot_journal_error`)."""
    code = _error_code(exc)
    return code is not None and (code & 0xFF) == SQLITE_READONLY


def is_hot_journal_error(exc: BaseException) -> bool:
    """True for SQLITE_READONLY_ROLLBACK: a read-only connection found a hot rollback journal
    (a write was interrupted) and may not roll it back, so it cannot read the file."""
    return _error_code(exc) == SQLITE_READONLY_ROLLBACK


def hot_journal_error(path: Path) -> StateDbUnavailableError:
    """The error for a store that a read-only open cannot read because of a hot journal."""
    return StateDbUnavailableError(
        f"{path} has a hot rollback journal ({path.name}-journal) left by an interrupted "
        "write; a read-only open may not roll it back, so the store cannot be read",
        reason=HOT_JOURNAL_REASON,
        path=path,
    )


def is_disk_full_error(exc: BaseException) -> bool:
    """True for SQLITE_FULL (the disk or ``max_page_count`` is exhausted)."""
    code = _error_code(exc)
    return code is not None and (code & 0xFF) == SQLITE_FULL


# The causes SQLite gives no result code of its own, as its messages (or the sqlite3 module's)
# spell them: (cause, the message's pattern; its group, when it has one, names the object).
_UNNAMED_CAUSES = (
    ("missing_table", re.compile(r"no such table: (?:main\.)?(\w+)")),
    ("missing_column", re.compile(r"no such column: (\S+)|has no column named (\S+)")),
    ("fts5_format", re.compile(r"invalid fts5 file format")),
    ("undecodable_text", re.compile(r"Could not decode to UTF-8")),
)


def unnamed_cause(exc: BaseException) -> tuple[str, str | None] | None:
    """The cause of an error its result code does not name, and the object it names: a
    missing table or column (``"missing_table"``, ``"missing_column"``), FTS5 refusing its
    table's format (``"fts5_format"``), text stored in a table that is not UTF-8
    (``"undecodable_text"``); None for any other error.

    The one place the library reads an error's text, and only where no code tells these
    apart: SQLite reports the first three as the generic ``SQLITE_ERROR`` and names the
    object only in its message, and the last is raised by the ``sqlite3`` module while
    converting a value, with no result code at all. An error carrying any other code is
    never read."""
    if not isinstance(exc, sqlite3.Error):
        return None
    code = _error_code(exc)
    if code is not None and (code & 0xFF) != SQLITE_ERROR:
        return None
    text = str(exc)
    for cause, pattern in _UNNAMED_CAUSES:
        found = pattern.search(text)
        if found is not None:
            named = [group for group in found.groups() if group is not None]
            return cause, (named[0] if named else None)
    return None


def missing_table(exc: BaseException) -> str | None:
    """The table (without its schema's name) that a statement, or a trigger it fired, found
    missing; None when ``exc`` says no such thing (see :func:`unnamed_cause`)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return None
    cause = unnamed_cause(exc)
    return cause[1] if cause is not None and cause[0] == "missing_table" else None


# The two texts SQLite gives a damaged file's errors, as callers' own tooling keys on them.
_MALFORMED_TEXTS = ("malformed database schema", "database disk image is malformed")


def is_malformed_db_error(exc: BaseException) -> bool:
    """True for a ``sqlite3.DatabaseError`` whose text contains ``malformed database schema`` or
    ``database disk image is malformed`` (case-insensitive).

    For errors from the caller's own raw ``sqlite3`` connections (a doctor deciding whether a
    schema repair is worth trying); the library's own errors are already typed
    (:class:`StateDbCorruptError`). Unlike every other test here it matches text, because the
    text is its contract: callers hand it errors their own code may have re-raised from a
    message (no result code kept) and key their repair on exactly these two texts. A result
    code would also take in ``file is not a database`` (``SQLITE_NOTADB``), which no schema
    repair can help.
    """
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    text = str(exc).lower()
    return any(marker in text for marker in _MALFORMED_TEXTS)


def foreign_database_error(path: Path | None, tables: Sequence[str]) -> StateDbUnavailableError:
    """The error for an SQLite database of another application (it has tables, none of them a
    session store's): nothing may create the schema in it, replace it or salvage it."""
    shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
    where = path if path is not None else "the database"
    return StateDbUnavailableError(
        f"{where} is not a session store: it is another application's database ({shown})",
        reason=FOREIGN_REASON,
        path=path,
    )


def _why_not(path: Path | None, exc: sqlite3.Error) -> str:
    """Why SQLite could not open ``path``, where the file system says: a file this user may
    not read (another user's, or its read bit taken), else SQLite's own words."""
    try:
        if path is not None and path.exists() and not os.access(path, os.R_OK):
            st = path.stat()
            return (f"no permission to read it (it belongs to uid {st.st_uid}, mode "
                    f"{st.st_mode & 0o777:04o}; this process runs as uid {os.geteuid()})")
    except OSError:
        pass
    return str(exc)


def _typed(exc: sqlite3.Error, path: Path | None, where: str) -> HermesStateError:
    """The typed error for an SQLite error, by its result code."""
    code = _error_code(exc)
    primary = None if code is None else code & 0xFF
    if primary in (SQLITE_CORRUPT, SQLITE_NOTADB):
        return StateDbCorruptError(f"{where} is damaged: {exc}", path=path)
    if primary == SQLITE_FULL:
        return StateDbFullError(f"no space left for {where}: {exc}", path=path)
    if primary == SQLITE_IOERR:
        return StateDbIOError(f"I/O error on {where}: {exc}", path=path)
    if primary in (SQLITE_BUSY, SQLITE_LOCKED):
        return StateDbLockedError(f"{where} is locked: {exc}", path=path)
    if primary == SQLITE_READONLY:
        return StateDbReadOnlyError(f"{where} is write-protected: {exc}", path=path)
    if primary in (SQLITE_CANTOPEN, SQLITE_PERM):
        return StateDbCannotOpenError(f"{where} cannot be opened: {_why_not(path, exc)}",
                                      path=path)
    if primary == SQLITE_CONSTRAINT:
        return StateDbConstraintError(f"a write to {where} broke a constraint: {exc}", path=path)
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    return StateDbError(f"SQLite error on {where} ({name}): {exc}", path=path)


def translate(exc: sqlite3.Error, path: Path | None) -> HermesStateError:
    """The typed error for ``exc``, an SQLite error met on the database at ``path``: chosen by
    result code only, carrying ``sqlite_errorcode``, ``sqlite_errorname``, ``path`` and the
    original as ``__cause__`` (``raise translate(exc, path) from exc`` keeps it too)."""
    where = str(path) if path is not None else "the database"
    error: HermesStateError
    if is_hot_journal_error(exc):  # only read-only connections cannot roll it back
        error = hot_journal_error(path) if path is not None else StateDbUnavailableError(
            f"{where} has a hot rollback journal: {exc}", reason=HOT_JOURNAL_REASON)
    else:
        error = _typed(exc, path, where)
    error.sqlite_errorcode = _error_code(exc)
    error.sqlite_errorname = getattr(exc, "sqlite_errorname", None)
    error.__cause__ = exc
    return error


@contextlib.contextmanager
def translated_errors(path: Path | None) -> Iterator[None]:
    """Run the block with SQLite's errors translated (:func:`translate`) for ``path``; typed
    errors and everything else pass through unchanged."""
    try:
        yield
    except sqlite3.Error as exc:
        raise translate(exc, path) from exc


# What the operating system's refusals mean for a store, by errno (never by message text).
_OS_FULL = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})
_OS_DENIED = frozenset({errno.EACCES, errno.EPERM})
_OS_MISSING = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR})


def translate_os_error(exc: OSError) -> HermesStateError:
    """The typed error for an operating-system failure met by a module-level operation, by
    ``errno``: a full disk or quota (:class:`StateDbFullError`), a read-only file system
    (:class:`StateDbReadOnlyError`), no permission or a missing file
    (:class:`StateDbCannotOpenError`), a file name too long (:class:`InvalidInputError`),
    anything else (:class:`StateDbIOError`). ``path`` is the file the system named; the
    original stays as ``__cause__``."""
    path = Path(exc.filename) if isinstance(exc.filename, str) else None
    where = str(path) if path is not None else "a file of the store"
    reason = exc.strerror or type(exc).__name__
    error: HermesStateError
    if exc.errno in _OS_FULL:
        error = StateDbFullError(f"no space left for {where}: {reason}", path=path)
    elif exc.errno == errno.EROFS:
        error = StateDbReadOnlyError(f"{where} is on a read-only file system", path=path)
    elif exc.errno in _OS_DENIED:
        error = StateDbCannotOpenError(f"no permission for {where}: {reason}", path=path)
    elif exc.errno in _OS_MISSING:
        error = StateDbCannotOpenError(f"{where} cannot be opened: {reason}", path=path)
    elif exc.errno == errno.ENAMETOOLONG:
        error = InvalidInputError(f"a file name is too long: {where[:120]}")
    else:
        error = StateDbIOError(f"I/O error on {where}: {reason}", path=path)
    error.__cause__ = exc
    return error


def translate_read(exc: sqlite3.Error, path: Path) -> HermesStateError:
    """The typed error of a read-only handle's SQLite error on ``path``: :func:`translate`,
    saying why where the cause is the directory around the store: a WAL store whose ``-shm``
    cannot be created (a directory this user may not write) is
    :class:`StateDbUnavailableError` ``read_only_directory``."""
    error: HermesStateError
    if _error_code(exc) == SQLITE_READONLY_DIRECTORY:
        error = StateDbUnavailableError(
            f"{path} cannot be read here: it is a WAL store without a -shm file, and SQLite "
            f"cannot create one in {path.parent} (this user may not write that directory)",
            reason=READ_ONLY_DIRECTORY_REASON, path=path)
    else:
        return translate(exc, path)
    error.sqlite_errorcode = _error_code(exc)
    error.sqlite_errorname = getattr(exc, "sqlite_errorname", None)
    error.__cause__ = exc
    return error
