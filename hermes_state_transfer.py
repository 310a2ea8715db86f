"""Transfer: sessions out of one store and into another, as JSON or JSON Lines.

Export carries every row and nothing derived, so an import loses nothing; JSONL streams in
constant memory. Import is whole or nothing. A read-only check names every problem by index or
line before anything is written. The publish writes parents first, in chunks of about
:data:`PUBLISH_CHUNK_MESSAGES` messages, so other writers never wait long. A longer import
journals its progress in ``state_meta``. A failed import undoes itself; the next import undoes
a killed one. Replacements go last, so a failure never loses a replaced session. See
docs/operations.md."""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import logging
import math
import os
import re
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from contextlib import AbstractContextManager
from typing import IO, Any, Literal, NamedTuple, Protocol, TypeVar

from hermes_state_arguments import integer
from hermes_state_common import (
    OnStore,
    clean_optional,
    now,
    quote_identifier,
)
from hermes_state_connect import connect, set_meta, transaction
from hermes_state_files import remove_abandoned_temps, temp_prefix
from hermes_state_schema_sql import SCHEMA_VERSION
from hermes_state_compression import holder_is_gone, lock_holder_name
from hermes_state_deletion import delete_session, deletion_closure
from hermes_state_errors import (
    HermesStateError,
    ImportRejectedError,
    InvalidInputError,
    LedgerBusyError,
    SessionNotFoundError,
    translated_errors,
)
from hermes_state_lineage import DELEGATE_MARKER, compression_chain, lineage_tree
from hermes_state_listing import search_sessions
from hermes_state_messages import (
    MESSAGE_FIELDS,
    SELECT_MESSAGES_SQL,
    MessageRow,
    get_messages,
    insert_message,
    message_fields,
    row_to_message,
)
from hermes_state_schema import WriteFn, expected_columns
from hermes_state_sessions import get_model_usage, get_session, session_columns
from hermes_state_writes import Timing, WriteKind

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_FORMAT_VERSION",
    "export_session",
    "export_all",
    "export_session_lineage",
    "iter_export_jsonl",
    "export_jsonl_lines",
    "Store",
    "import_sessions",
    "import_jsonl",
    "read_json_export",
    "MAX_RECORD_BYTES",
    "MAX_JSON_EXPORT_BYTES",
    "LIST_MAX_SESSIONS",
    "LIST_MAX_SESSION_MESSAGES",
    "LIST_MAX_SESSION_BYTES",
    "LIST_MAX_MESSAGES",
    "LIST_MAX_BYTES",
    "LIST_DEFAULT_SOURCE",
    "remove_abandoned_imports",
    "ON_CONFLICT_CHOICES",
    "OnConflict",
    "PUBLISH_CHUNK_MESSAGES",
    "JOURNAL_PREFIX",
    "SPOOL_PREFIX",
    "OnCommit",
    "Progress",
]

logger = logging.getLogger("hermes_state")
T = TypeVar("T")

EXPORT_FORMAT = "hermes-state-export"
EXPORT_FORMAT_VERSION = 1


# =============================================================================================
# Export
# =============================================================================================


def export_session(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """The session row plus ``messages`` (all generations, in order) and ``model_usage``."""
    session = get_session(conn, session_id)
    if session is None:
        return None
    session["messages"] = get_messages(conn, session_id, include_inactive=True)
    session["model_usage"] = get_model_usage(conn, session_id)
    return session


def export_all(conn: sqlite3.Connection, source: str | None = None) -> list[dict[str, Any]]:
    """Every session (optionally of one source, archived ones included) in
    ``search_sessions`` order (newest activity first), each exported as above plus its
    ``last_active``. Nothing is left out, however many sessions the store holds."""
    out = []
    for row in search_sessions(conn, source=source, limit=-1):
        exported = export_session(conn, row["id"])
        if exported is not None:
            exported["last_active"] = row["last_active"]
            out.append(exported)
    return out


def export_session_lineage(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """The conversation ``session_id`` belongs to, as one export: its compression chain
    (``hermes_state_lineage.compression_chain``: back through the compression ancestors, then
    forward by the successor rule to the tip). The tip's export (session columns and
    ``messages``) with ``segments`` (each session's export, root first),
    ``lineage_session_ids``, ``message_count`` (the messages the segments carry) and
    ``messages`` (every segment's, in order). None for an unknown session."""
    segments = [e for e in (export_session(conn, i) for i in compression_chain(conn, session_id))
                if e is not None]
    if not segments:
        return None
    exported = dict(segments[-1])
    exported["segments"] = segments
    exported["lineage_session_ids"] = [s["id"] for s in segments]
    exported["messages"] = [m for s in segments for m in s["messages"]]
    exported["message_count"] = len(exported["messages"])
    return exported


# Oldest first, so parents usually precede their children (import does not rely on it).
EXPORT_IDS_SQL = "SELECT id FROM sessions ORDER BY started_at, id"
EXPORT_IDS_BY_SOURCE_SQL = "SELECT id FROM sessions WHERE source = ? ORDER BY started_at, id"


def _export_ids(
    conn: sqlite3.Connection,
    session_ids: Iterable[str] | None,
    source: str | None,
    lineage: bool,
) -> list[str]:
    if session_ids is None:
        if source is None:
            return [r[0] for r in conn.execute(EXPORT_IDS_SQL)]
        return [r[0] for r in conn.execute(EXPORT_IDS_BY_SOURCE_SQL, (source,))]
    ids: dict[str, None] = {}
    for session_id in session_ids:
        found = lineage_tree(conn, session_id) if lineage else (
            [session_id] if get_session(conn, session_id) is not None else []
        )
        if not found:
            raise SessionNotFoundError(session_id)
        ids.update(dict.fromkeys(found))
    return list(ids)


SESSION_MESSAGES_SQL = SELECT_MESSAGES_SQL + " WHERE session_id = ? ORDER BY id"


def _line(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def iter_export_jsonl(
    store: Store,
    session_ids: Iterable[str] | None = None,
    *,
    source: str | None = None,
    lineage: bool = False,
) -> Iterator[str]:
    """:func:`export_jsonl_lines` from one consistent snapshot of the handle's file, read on a
    connection of its own (the handle's lock stays free); works on read-only handles."""
    with store._snapshot_reader() as conn:
        yield from export_jsonl_lines(conn, session_ids, source=source, lineage=lineage)


def export_jsonl_lines(
    conn: sqlite3.Connection,
    session_ids: Iterable[str] | None = None,
    *,
    source: str | None = None,
    lineage: bool = False,
) -> Iterator[str]:
    """Export as JSON Lines, one line at a time, in constant memory.

    Lines: a header ``{"kind": "header", ...}``; per session a ``session`` line (the row),
    its ``message`` lines (every generation, in id order) and ``usage`` lines; a final
    ``end`` line with the totals. ``session_ids`` (default: every session, or those of
    ``source``) are expanded to their whole lineage with ``lineage=True``. Run it inside one
    read transaction for a consistent snapshot; an unknown id raises before any line."""
    ids = _export_ids(conn, session_ids, source, lineage)
    yield _line(
        {
            "kind": "header",
            "format": EXPORT_FORMAT,
            "format_version": EXPORT_FORMAT_VERSION,
            "schema_version": SCHEMA_VERSION,
            "exported_at": datetime.datetime.now(datetime.UTC).isoformat(),
        }
    )
    sessions = messages = 0
    for session_id in ids:
        session = get_session(conn, session_id)
        if session is None:  # deleted since the ids were read (no snapshot held)
            continue
        sessions += 1
        yield _line({"kind": "session", "session": session})
        cursor = conn.execute(SESSION_MESSAGES_SQL, (session_id,))
        for row in cursor:
            messages += 1
            message = row_to_message(row)
            yield _line({"kind": "message", "session_id": session_id, "message": message})
        for usage in get_model_usage(conn, session_id):
            yield _line({"kind": "usage", "session_id": session_id, "usage": usage})
    yield _line({"kind": "end", "sessions": sessions, "messages": messages})


# =============================================================================================
# Import
# =============================================================================================

OnConflict = Literal["skip", "replace", "fail"]
ON_CONFLICT_CHOICES: tuple[OnConflict, ...] = ("skip", "replace", "fail")
Progress = Callable[[str, int, int | None], None]


class Store(Protocol):
    """What an import or a streaming export needs of a handle (``SessionDB``): its reads,
    its writes, a snapshot reader and its :class:`~hermes_state_writes.Timing`."""

    timing: Timing

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    def _write(self, fn: Callable[[sqlite3.Connection], T], kind: WriteKind = ...) -> T: ...

    def _snapshot_reader(self) -> AbstractContextManager[sqlite3.Connection]: ...


def _store_io(store: Store) -> tuple[OnStore, WriteFn]:
    """An import's reads, and its writes: transcript writes (the longer patience)."""
    return store._read, functools.partial(store._write, kind="transcript")

#: Called after each publish transaction of an import commits: (messages written, in all).
OnCommit = Callable[[int, int], object]

# One publish transaction writes about this many messages (a few tenths of a second), so a
# long import never holds the write lock near another writer's patience (20 s / 60 s).
PUBLISH_CHUNK_MESSAGES = 1000
# state_meta key of an import published in several transactions: its holder and the sessions
# written so far, so that the next import removes what a killed one left.
JOURNAL_PREFIX = "import_in_progress:"
PROGRESS_EVERY = 5000  # messages between two progress reports
#: The longest line (one record: a session, a message, a usage row) a JSON Lines import reads,
#: in bytes (characters for a text stream); a longer one refuses the import.
MAX_RECORD_BYTES = 64 * 2**20
#: The largest whole JSON export :func:`read_json_export` reads (larger: export as JSON Lines).
MAX_JSON_EXPORT_BYTES = 256 * 2**20
_JSON_PIECE = 2**20  # how much of a JSON export one read takes

# import_sessions(list): the limits its callers (a dashboard upload) expect.
LIST_MAX_SESSIONS = 500
LIST_MAX_SESSION_MESSAGES = 10_000
LIST_MAX_SESSION_BYTES = 5 * 2**20
LIST_MAX_MESSAGES = 50_000
LIST_MAX_BYTES = 25 * 2**20

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_ERRORS_KEPT = 200  # a hopeless stream is not reported line by line to the end

_MESSAGE_DEFAULTS: dict[str, Any] = {
    **dict.fromkeys(MESSAGE_FIELDS),
    "observed": False,
    "active": True,
    "compacted": False,
}
_FLAGS = ("observed", "active", "compacted")
_COUNTERS = ("message_count", "tool_call_count")
_USAGE_KEY = ("model", "billing_provider", "billing_base_url", "billing_mode", "task")

Where = dict[str, int]  # {"index": position in a list} or {"line": line of a stream}


class _Problem(NamedTuple):
    """One problem a check found: its stable machine code (see :class:`ImportRejectedError`)
    and the readable message."""

    code: str
    message: str


@dataclass
class _Incoming:
    """One session to import: where it came from, its row, a re-iterable source of its
    messages (each with where it came from) and its usage rows."""

    where: Where
    session: dict[str, Any]
    messages: Callable[[], Iterable[tuple[Where, Any]]]
    usage: list[tuple[Where, Any]]

    @property
    def id(self) -> Any:
        return self.session.get("id")


@dataclass
class _Planned:
    """A checked session and what its import does: ``import`` (new) or ``replace``."""

    rec: _Incoming
    action: str
    row: dict[str, Any]
    messages: int
    ignored_fields: list[str]
    ignored_message_fields: list[str]


@dataclass
class _Outcome:
    imported: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    detached: list[dict[str, Any]] = field(default_factory=list)
    title_conflicts: list[dict[str, Any]] = field(default_factory=list)
    ignored_fields: dict[str, list[str]] = field(default_factory=dict)
    ignored_message_fields: dict[str, list[str]] = field(default_factory=dict)
    messages: int = 0
    abandoned_removed: list[str] = field(default_factory=list)
    abandoned_kept: list[dict[str, str]] = field(default_factory=list)


class _Errors:
    """Every problem found, each with where it is; :meth:`raise_any` refuses the import."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.more = 0

    def add(self, where: Where, error: str, session_id: Any = None, *, code: str) -> None:
        if len(self.items) >= _ERRORS_KEPT:
            self.more += 1
            return
        entry: dict[str, Any] = {**where, "error": error, "code": code}
        if isinstance(session_id, str):
            entry["session_id"] = session_id
        self.items.append(entry)

    def raise_any(self) -> None:
        if self.more:
            self.items.append({"error": f"{self.more} more problem(s) not listed",
                               "code": "more-problems"})
        if self.items:
            raise ImportRejectedError(self.items)


# --- checks ---------------------------------------------------------------------------------


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# A column whose every problem has a code of its own (instead of invalid-field, out-of-range
# or unsupported-text).
_COLUMN_CODES = {"model_config": "invalid-model-config"}


def _value_problem(name: str, declared: str, notnull: int, value: Any) -> _Problem | None:
    """Why ``value`` cannot be stored in column ``name`` of SQL type ``declared``, or None."""
    if value is None:
        return _Problem(_code(name, "invalid-field"), f"{name} may not be null") if (
            notnull) else None
    problem = _TYPE_PROBLEMS.get(declared)
    return problem(name, value) if problem is not None else None


def _code(name: str, general: str) -> str:
    """The problem code of column ``name``: its own, if it has one, else ``general``."""
    return _COLUMN_CODES.get(name, general)


def _text_problem(name: str, value: Any) -> _Problem | None:
    if not isinstance(value, str):
        return _Problem(_code(name, "invalid-field"),
                        f"{name} must be text, got {type(value).__name__}")
    if not _encodable(value):
        return _Problem(_code(name, "unsupported-text"),
                        f"{name} is not valid Unicode text (it holds a lone surrogate)")
    return None


def _integer_problem(name: str, value: Any) -> _Problem | None:
    if not isinstance(value, int):
        return _Problem(_code(name, "invalid-field"),
                        f"{name} must be an integer, got {type(value).__name__}")
    return _range_problem(name, value)


def _real_problem(name: str, value: Any) -> _Problem | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _Problem(_code(name, "invalid-field"),
                        f"{name} must be a number, got {type(value).__name__}")
    if isinstance(value, int):
        return _range_problem(name, value)
    if not math.isfinite(value):
        return _Problem(_code(name, "invalid-field"), f"{name} must be finite, got {value!r}")
    return None


def _range_problem(name: str, value: int) -> _Problem | None:
    if not _INT64_MIN <= value <= _INT64_MAX:
        return _Problem(_code(name, "out-of-range"),
                        f"{name} {value} is outside SQLite's 64-bit integer range")
    return None


# What a value of each declared SQL type must be (other types take anything).
_TYPE_PROBLEMS: dict[str, Callable[[str, Any], _Problem | None]] = {
    "TEXT": _text_problem, "INTEGER": _integer_problem, "REAL": _real_problem,
}


@functools.cache
def _table_columns(table: str) -> dict[str, tuple[str, int]]:
    return {name: (declared, notnull) for name, declared, notnull, _ in expected_columns()[table]}


def _row_problem(table: str, row: Mapping[str, Any]) -> _Problem | None:
    columns = _table_columns(table)
    for name, value in row.items():
        if name in columns:
            problem = _value_problem(name, *columns[name], value)
            if problem:
                return problem
    return None


def _stored_value_problem(values: Iterable[Any]) -> _Problem | None:
    """Why a built message row cannot be written (an integer past 64 bits, a surrogate)."""
    for value in values:
        if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
            return _Problem("out-of-range",
                            f"the integer {value} is outside SQLite's 64-bit integer range")
        if isinstance(value, str) and not _encodable(value):
            return _Problem("unsupported-text",
                            "a text field is not valid Unicode text (it holds a lone surrogate)")
    return None


# The message fields whose every refusal has a code of its own: a message without its role,
# content that JSON or SQLite cannot carry.
_MESSAGE_FIELD_CODES = {"role": "missing-role", "content": "unsupported-text"}


def _message_problem(exc: BaseException) -> _Problem:
    """The problem of a message :meth:`MessageRow.from_fields` refused with ``exc``, coded by
    the field the refusal names (its ``argument``) and the refusal's type."""
    argument = getattr(exc, "argument", None)
    if argument in _MESSAGE_FIELD_CODES:
        code = _MESSAGE_FIELD_CODES[argument]
    elif argument == "token_count" and not isinstance(exc, TypeError):
        code = "out-of-range"  # the one integer field: a wrong type is an invalid field
    else:
        code = "invalid-message-field"
    return _Problem(code, str(exc) or type(exc).__name__)


_CHECK_ERRORS = (ValueError, TypeError, OverflowError, RecursionError, HermesStateError)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _check(conn: sqlite3.Connection, rec: _Incoming, errors: _Errors) -> _Planned | None:
    """Check one record completely (row, every message, usage, counters); the planned row
    with its counters, or None when it has problems (each added to ``errors``)."""
    sid = rec.id
    if not isinstance(sid, str) or not sid.strip() or not _encodable(sid):
        errors.add(rec.where, f"session id must be a non-empty string, got {sid!r}",
                   code="missing-id")
        return None
    found = len(errors.items) + errors.more
    columns = session_columns()
    row = _checked_session_row(rec, sid, columns, errors)
    rows, live, tool_calls, dropped = _check_messages(conn, rec, sid, errors)
    _check_usage(rec, sid, errors)
    stated = row.get("message_count")
    if isinstance(stated, int) and stated > rows:
        errors.add(rec.where, f"message_count is {stated} but the record holds {rows} "
                              "message(s): a truncated record?", sid, code="truncated-record")
    if len(errors.items) + errors.more > found:
        return None
    row.setdefault("message_count", live)
    row.setdefault("tool_call_count", tool_calls)
    for counter in _COUNTERS:
        if row[counter] is None:
            row[counter] = live if counter == "message_count" else tool_calls
    return _Planned(rec, "import", row, rows, sorted(set(rec.session) - set(columns)),
                    sorted(dropped))


def _checked_session_row(
    rec: _Incoming, sid: str, columns: tuple[str, ...], errors: _Errors
) -> dict[str, Any]:
    """The record's session row (the store's ``columns`` only), its problems added to
    ``errors``."""
    row = {k: rec.session[k] for k in columns if k in rec.session}
    if row.get("started_at") is None:
        row["started_at"] = now()  # a record written by hand: the session starts now
    missing = [k for k in ("source",) if row.get(k) is None]
    for name in missing:
        errors.add(rec.where, f"the session has no {name}", sid, code="missing-field")
    if isinstance(row.get("model_config"), str) and not _is_json(row["model_config"]):
        errors.add(rec.where, "model_config must be valid JSON", sid,
                   code="invalid-model-config")
    problem = _row_problem("sessions", {k: v for k, v in row.items() if k not in missing})
    if problem:
        errors.add(rec.where, problem.message, sid, code=problem.code)
    return row


def _check_messages(
    conn: sqlite3.Connection, rec: _Incoming, sid: str, errors: _Errors
) -> tuple[int, int, int, set[str]]:
    """Check every message of the record: (rows, live rows, tool calls, dropped field names);
    each problem is added to ``errors``."""
    rows = live = tool_calls = 0
    dropped: set[str] = set()
    for where, message in rec.messages():
        if not isinstance(message, Mapping):
            errors.add(where, f"message {rows} must be an object, got {type(message).__name__}",
                       sid, code="invalid-message")
            rows += 1
            continue
        fields = message_fields(message)
        dropped.update(k for k in fields if k not in _MESSAGE_DEFAULTS)
        kept = {k: v for k, v in fields.items() if k in _MESSAGE_DEFAULTS}
        try:
            built = MessageRow.from_fields(conn, sid, kept)
            problem = _stored_value_problem(built.values())
        except _CHECK_ERRORS as exc:
            problem = _message_problem(exc)
        if problem:
            errors.add(where, f"message {rows}: {problem.message}", sid, code=problem.code)
        elif built.active:
            live += 1
            tool_calls += built.tool_call_count
        rows += 1
    return rows, live, tool_calls, dropped


def _check_usage(rec: _Incoming, sid: str, errors: _Errors) -> None:
    """Check every usage row of the record (an object, storable, each model once)."""
    keys: set[tuple[Any, ...]] = set()
    for where, usage in rec.usage:
        if not isinstance(usage, Mapping):
            problem: _Problem | None = _Problem(
                "invalid-usage", f"a usage row must be an object, got {type(usage).__name__}")
        else:
            problem = _row_problem("session_model_usage", usage)
            key = tuple(usage.get(k) for k in _USAGE_KEY)
            if problem is None and key in keys:
                problem = _Problem("invalid-usage",
                                   f"usage row for {usage.get('model')!r} appears twice")
            keys.add(key)
        if problem:
            errors.add(where, problem.message, sid, code=problem.code)


def _comparable_message(message: Mapping[str, Any]) -> dict[str, Any]:
    fields = {**_MESSAGE_DEFAULTS, **{k: v for k, v in message_fields(message).items()
                                      if k in _MESSAGE_DEFAULTS}}
    for flag in _FLAGS:
        fields[flag] = bool(fields[flag])
    return fields


def _comparable_usage(rows: Iterable[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(
        tuple(sorted((k, v) for k, v in row.items() if k != "session_id")) for row in rows
    )


def _same_session(conn: sqlite3.Connection, existing: Mapping[str, Any], rec: _Incoming) -> bool:
    """True when the stored session equals the incoming one in every column the incoming
    record carries, message for message (streamed) and in its usage rows."""
    columns = set(session_columns())
    if any(existing.get(k) != v for k, v in rec.session.items() if k in columns):
        return False
    stored = conn.execute(SESSION_MESSAGES_SQL, (existing["id"],))
    incoming = (m for _, m in rec.messages())
    for row in stored:
        other = next(incoming, None)
        if other is None or _comparable_message(row_to_message(row)) != _comparable_message(other):
            return False
    if next(incoming, None) is not None:
        return False
    usage = [u for _, u in rec.usage]
    return _comparable_usage(get_model_usage(conn, existing["id"])) == _comparable_usage(usage)


# --- plan -------------------------------------------------------------------------------------

PARENT_OF_SQL = "SELECT parent_session_id FROM sessions WHERE id = ?"


def _parents_first(plan: list[_Planned]) -> list[_Planned]:
    """The plan reordered so that a session follows its parent when both are imported;
    otherwise input order (links are acyclic by now)."""
    by_id = {p.rec.id: p for p in plan}
    placed: set[str] = set()
    out: list[_Planned] = []
    for item in plan:
        chain = []
        node: _Planned | None = item
        while node is not None and node.rec.id not in placed:
            placed.add(node.rec.id)
            chain.append(node)
            parent = node.row.get("parent_session_id")
            node = by_id.get(parent) if parent is not None else None
        out.extend(reversed(chain))
    return out


def _link_parents(conn: sqlite3.Connection, plan: list[_Planned], outcome: _Outcome) -> None:
    """Keep a parent link only when the parent is stored or imported and no cycle results;
    otherwise the session is imported as a root and counted as detached."""
    links = {p.rec.id: p.row.get("parent_session_id") for p in plan}

    def parent_of(session_id: str) -> Any:
        if session_id in links:
            return links[session_id]
        row = conn.execute(PARENT_OF_SQL, (session_id,)).fetchone()
        return None if row is None else row[0]

    for item in plan:
        sid, parent = item.rec.id, links[item.rec.id]
        if parent is None:
            continue
        reason = None
        if parent not in links and get_session(conn, parent) is None:
            reason = "missing"
        else:
            seen = {sid}
            node = parent
            while node is not None and node not in seen:
                seen.add(node)
                node = parent_of(node)
            if node == sid:
                reason = "cycle"
        if reason:
            links[sid] = item.row["parent_session_id"] = None
            outcome.detached.append({"session_id": sid, "parent_session_id": parent,
                                     "reason": reason})


def _plan(
    conn: sqlite3.Connection,
    records: Iterable[_Incoming],
    on_conflict: OnConflict,
    errors: _Errors,
    outcome: _Outcome,
    progress: Progress | None,
) -> list[_Planned]:
    """Check every record against the store (reads only) and decide what each does."""
    plan: list[_Planned] = []
    seen: set[str] = set()
    checked = 0
    for rec in records:
        planned = _check(conn, rec, errors)
        before, checked = checked, checked + (planned.messages if planned else 0)
        if progress is not None and checked // PROGRESS_EVERY > before // PROGRESS_EVERY:
            progress("checking messages", checked, None)
        if planned is None:
            continue
        sid = rec.id
        if sid in seen:
            errors.add(rec.where, "a session with this id comes earlier in the same import", sid,
                       code="duplicate-id")
            continue
        seen.add(sid)
        existing = get_session(conn, sid)
        if existing is None:
            plan.append(planned)
        elif _same_session(conn, existing, rec) or on_conflict == "skip":
            outcome.skipped.append(sid)
        elif on_conflict == "replace":
            planned.action = "replace"
            plan.append(planned)
        else:
            errors.add(rec.where, "a different session with this id exists (import with "
                                  "on_conflict 'replace' or 'skip')", sid, code="session-exists")
    if progress is not None:
        progress("checked messages", checked, None)
    _link_parents(conn, plan, outcome)
    return _parents_first(plan)


# --- publish ------------------------------------------------------------------------------------

TITLE_HOLDER_SQL = "SELECT id FROM sessions WHERE title = ? AND id <> ?"
DELETE_SESSION_MESSAGES_SQL = "DELETE FROM messages WHERE session_id = ?"
DELETE_SESSION_USAGE_SQL = "DELETE FROM session_model_usage WHERE session_id = ?"
JOURNALS_SQL = "SELECT key, value FROM state_meta WHERE key LIKE ? ESCAPE '\\'"
DELETE_META_SQL = "DELETE FROM state_meta WHERE key = ?"
META_SQL = "SELECT value FROM state_meta WHERE key = ?"


def _write_session(conn: sqlite3.Connection, item: _Planned, outcome: _Outcome) -> None:
    """Write one planned session (the caller's transaction)."""
    rec, sid = item.rec, item.rec.id
    if item.action == "import" and get_session(conn, sid) is not None:
        raise ImportRejectedError(
            [{**rec.where, "session_id": sid, "code": "session-exists",
              "error": "a session with this id was created while the import ran"}]
        )
    row = _publishable_row(conn, sid, item.row, outcome)
    _write_session_row(conn, sid, row, replace=item.action == "replace")
    for _, message in rec.messages():
        fields = message_fields(message)
        kept = {k: v for k, v in fields.items() if k in _MESSAGE_DEFAULTS}
        insert_message(conn, sid, kept, count=False)
    _insert_usage(conn, sid, [usage for _, usage in rec.usage])
    (outcome.replaced if item.action == "replace" else outcome.imported).append(sid)
    outcome.messages += item.messages
    if item.ignored_fields:
        outcome.ignored_fields[sid] = item.ignored_fields
    if item.ignored_message_fields:
        outcome.ignored_message_fields[sid] = item.ignored_message_fields


def _insert_usage(conn: sqlite3.Connection, sid: str, rows: list[Mapping[str, Any]]) -> None:
    """Insert the session's usage rows (the store's columns of each)."""
    usage_columns = _table_columns("session_model_usage")
    for usage in rows:
        cells = {k: usage[k] for k in usage_columns if k in usage}
        cells["session_id"] = sid
        conn.execute(
            f"INSERT INTO session_model_usage ({', '.join(quote_identifier(n) for n in cells)})"
            f" VALUES ({', '.join('?' * len(cells))})",
            list(cells.values()),
        )


def _publishable_row(
    conn: sqlite3.Connection, sid: str, planned: Mapping[str, Any], outcome: _Outcome
) -> dict[str, Any]:
    """The planned row as it can be written now: without a title another session took, and
    a root when its parent was deleted meanwhile (each change noted in ``outcome``)."""
    row = dict(planned)
    title = row.get("title")
    if title is not None:
        holder = conn.execute(TITLE_HOLDER_SQL, (title, sid)).fetchone()
        if holder is not None:
            row["title"] = None
            outcome.title_conflicts.append({"session_id": sid, "title": title,
                                            "held_by": holder[0]})
    parent = row.get("parent_session_id")
    if parent is not None and get_session(conn, parent) is None:  # deleted meanwhile
        row["parent_session_id"] = None
        outcome.detached.append({"session_id": sid, "parent_session_id": parent,
                                 "reason": "missing"})
    return row


def _write_session_row(
    conn: sqlite3.Connection, sid: str, row: Mapping[str, Any], *, replace: bool
) -> None:
    """Insert the session row, or (``replace``) empty the stored session and update its row."""
    names = list(row)
    values = [clean_optional(v) if isinstance(v, str) else v for v in row.values()]
    if replace:
        conn.execute(DELETE_SESSION_MESSAGES_SQL, (sid,))
        conn.execute(DELETE_SESSION_USAGE_SQL, (sid,))
        conn.execute(
            f"UPDATE sessions SET {', '.join(f'{quote_identifier(n)} = ?' for n in names)}"
            " WHERE id = ?",
            [*values, sid],
        )
    else:
        conn.execute(
            f"INSERT INTO sessions ({', '.join(quote_identifier(n) for n in names)})"
            f" VALUES ({', '.join('?' * len(names))})",
            values,
        )


@dataclass
class _Journal:
    """What an import published in several transactions has written so far: its holder, the
    sessions in the order written, and the fingerprint of each as the import left it (absent
    from journals of older versions)."""

    holder: str
    sessions: list[str]
    written: dict[str, str] = field(default_factory=dict)

    def value(self) -> dict[str, Any]:
        return {"holder": self.holder, "sessions": self.sessions, "written": self.written}


def _journal(value: Any) -> _Journal | None:
    """A journal stored in ``state_meta``, or None when it is not one of ours."""
    try:
        stored = json.loads(value)
        written = stored.get("written", {})
        return _Journal(str(stored["holder"]), [str(sid) for sid in stored["sessions"]],
                        {str(k): str(v) for k, v in written.items()})
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


SESSION_ROW_SQL = "SELECT * FROM sessions WHERE id = ?"
MESSAGES_PRINT_SQL = """
SELECT COUNT(*), MAX(id), SUM(active), SUM(compacted), MAX(timestamp) FROM messages
WHERE session_id = ?
"""
USAGE_ROWS_SQL = "SELECT * FROM session_model_usage WHERE session_id = ? ORDER BY rowid"
# The sessions under a set of sessions by their parent link.
CHILDREN_SQL = """
SELECT id, parent_session_id FROM sessions
WHERE parent_session_id IN (SELECT value FROM json_each(?))
"""


def _fingerprint(conn: sqlite3.Connection, session_id: str) -> str:
    """A digest of a session as it stands: its row, its messages (how many, the newest id,
    how many live and archived) and its usage rows. Any write to it since changes it."""
    state = [conn.execute(query, (session_id,)).fetchall()
             for query in (SESSION_ROW_SQL, MESSAGES_PRINT_SQL, USAGE_ROWS_SQL)]
    text = json.dumps(state, default=repr, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _undo_journal(
    conn: sqlite3.Connection, key: str, journal: _Journal
) -> tuple[list[str], list[dict[str, str]]]:
    """Delete what an import wrote, as its journal names it, and the journal itself (the
    caller's transaction): (ids deleted, ``{"session_id", "reason"}`` of each session kept).

    Only what the import itself wrote goes. A session someone else has written to since (its
    fingerprint moved), one with a session created under it since (a child or a delegate
    that is not the import's, which the delete would take along or detach), and one a worker
    has taken into use are kept, and so is every session of the import above a kept one."""
    kept: dict[str, str] = {}
    doomed = _unchanged_since(conn, journal, kept)
    _spare_parents(conn, doomed, kept)
    removed: list[str] = []
    for sid in reversed(journal.sessions):
        if sid not in doomed:
            continue
        try:
            if delete_session(conn, sid):
                removed.append(sid)
        except LedgerBusyError:
            kept[sid] = "a worker has taken it into use"
    conn.execute(DELETE_META_SQL, (key,))
    return removed, [{"session_id": sid, "reason": why} for sid, why in kept.items()]


def _unchanged_since(conn: sqlite3.Connection, journal: _Journal, kept: dict[str, str]
                     ) -> set[str]:
    """The sessions of the journal that still exist as the import wrote them; those written
    to since go to ``kept``, with the reason."""
    unchanged: set[str] = set()
    for sid in journal.sessions:
        printed = journal.written.get(sid)
        if conn.execute(SESSION_ROW_SQL, (sid,)).fetchone() is None:
            continue
        if printed is not None and _fingerprint(conn, sid) != printed:
            kept[sid] = "written to by another writer since the import wrote it"
        else:
            unchanged.add(sid)
    return unchanged


def _spare_parents(conn: sqlite3.Connection, doomed: set[str], kept: dict[str, str]) -> None:
    """Move from ``doomed`` to ``kept`` every session a session outside it hangs under
    (a child, or a delegate by its marker), until none does: sparing one may leave another
    session under it outside."""
    while doomed:
        ids = json.dumps(sorted(doomed))
        outsiders = {child: parent for child, parent in conn.execute(CHILDREN_SQL, (ids,))
                     if child not in doomed}
        closure = set(deletion_closure(conn, doomed)) - doomed
        for child in closure:
            outsiders.setdefault(child, _anchor(conn, child, doomed))
        anchors = {parent: child for child, parent in outsiders.items() if parent in doomed}
        if not anchors:
            return
        for parent, child in anchors.items():
            doomed.discard(parent)
            kept[parent] = f"session {child} was created under it since the import wrote it"


def _anchor(conn: sqlite3.Connection, child: str, doomed: set[str]) -> str | None:
    """The session among ``doomed`` a delegate child hangs under (parent link or marker)."""
    row = conn.execute(DELEGATE_ANCHORS_SQL, (child,)).fetchone()
    if row is None:
        return None
    for anchor in row:
        if anchor in doomed:
            return str(anchor)
    return None


DELEGATE_ANCHORS_SQL = f"""
SELECT parent_session_id,
       CASE WHEN json_valid(model_config)
            THEN json_extract(model_config, '$.{DELEGATE_MARKER}') END
FROM sessions WHERE id = ?
"""


def _remove_abandoned(conn: sqlite3.Connection) -> tuple[list[str], list[dict[str, str]]]:
    removed: list[str] = []
    kept: list[dict[str, str]] = []
    for key, value in conn.execute(JOURNALS_SQL, (JOURNAL_PREFIX + "%",)).fetchall():
        journal = _journal(value)
        if journal is not None and holder_is_gone(journal.holder):
            gone, stay = _undo_journal(conn, key, journal)
            removed.extend(gone)
            kept.extend(stay)
    return removed, kept


def remove_abandoned_imports(conn: sqlite3.Connection, /) -> list[str]:
    """Delete what imports whose process provably died mid-way wrote (their journal's holder
    is gone); returns the ids removed. Sessions others have written to since are kept (see
    :func:`_undo_journal`). The caller's write transaction."""
    return _remove_abandoned(conn)[0]


def _chunks(plan: list[_Planned], chunk_messages: int) -> list[list[_Planned]]:
    """Whole sessions per chunk, about ``chunk_messages`` messages each; the
    replacements all go in the last chunk, so that a failed import never loses a session
    it was to replace."""
    chunks: list[list[_Planned]] = [[]]
    size = 0
    for item in plan:
        if item.action != "import":
            continue
        if chunks[-1] and size + item.messages > chunk_messages:
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += item.messages
    chunks[-1].extend(item for item in plan if item.action != "import")
    return chunks


def _publish(
    write: WriteFn,
    plan: list[_Planned],
    outcome: _Outcome,
    progress: Progress | None,
    chunk_messages: int | None,
    pause_s: float,
    on_commit: OnCommit | None,
) -> None:
    """Write the plan: one transaction when it fits in a chunk; otherwise one per chunk with
    a journal naming what is written so far, so that a failure (an exception, Ctrl-C, one
    raised by ``on_commit``) deletes it again and a killed process's sessions are deleted by
    the next import. Between two chunks the lock stays free ``pause_s`` seconds."""
    chunks = _chunks(plan, PUBLISH_CHUNK_MESSAGES if chunk_messages is None else chunk_messages)
    journal = _PublishJournal() if len(chunks) > 1 else None  # one transaction needs none
    total = sum(item.messages for item in plan)
    done = 0
    try:
        for number, items in enumerate(chunks):
            if number:
                time.sleep(pause_s)
            last = number == len(chunks) - 1
            part = write(functools.partial(_write_chunk, items=items, journal=journal, last=last))
            before, done = done, done + sum(item.messages for item in items)
            if on_commit is not None:
                on_commit(done, total)
            _merge(outcome, part)
            if progress is not None and journal is not None and (
                done // PROGRESS_EVERY > before // PROGRESS_EVERY or last
            ):
                progress("importing messages", done, total)
    except BaseException as exc:
        if journal is not None:
            _note_kept(exc, write(journal.undo))
        raise


def _write_chunk(
    conn: sqlite3.Connection, items: list[_Planned], journal: _PublishJournal | None, last: bool
) -> _Outcome:
    """Write one chunk's sessions, and keep the journal: the chunk's sessions added to it,
    or, with the ``last`` chunk, the journal removed (the import is whole)."""
    part = _Outcome()
    for item in items:
        _write_session(conn, item, part)
    if journal is not None and last:
        journal.remove(conn)
    elif journal is not None:
        journal.add(conn, items)
    return part


class _PublishJournal:
    """The journal of an import published in several transactions: a meta row naming the
    sessions the committed chunks wrote, with their fingerprints, held by this process."""

    def __init__(self) -> None:
        self.key = JOURNAL_PREFIX + uuid.uuid4().hex
        self.holder = lock_holder_name("import")

    def stored(self, conn: sqlite3.Connection) -> _Journal:
        """What the committed chunks wrote: the journal, never this process's own tally, which
        an interrupt landing just after a commit would leave one chunk short."""
        row = conn.execute(META_SQL, (self.key,)).fetchone()
        journal = None if row is None else _journal(row[0])
        return _Journal(self.holder, []) if journal is None else journal

    def add(self, conn: sqlite3.Connection, items: list[_Planned]) -> None:
        journal = self.stored(conn)
        for item in items:
            journal.sessions.append(item.rec.id)
            journal.written[item.rec.id] = _fingerprint(conn, item.rec.id)
        set_meta(conn, self.key, journal.value())

    def remove(self, conn: sqlite3.Connection) -> None:
        conn.execute(DELETE_META_SQL, (self.key,))

    def undo(self, conn: sqlite3.Connection) -> list[dict[str, str]]:
        """Delete what the committed chunks wrote; the sessions kept, as others wrote to
        them since (see :func:`_undo_journal`)."""
        return _undo_journal(conn, self.key, self.stored(conn))[1]


def _note_kept(exc: BaseException, kept: list[dict[str, str]]) -> None:
    """Name, on the error that ended an import, the sessions its undo kept."""
    if kept:
        note = "; ".join(f"{k['session_id']}: {k['reason']}" for k in kept)
        exc.add_note(f"the interrupted import kept {len(kept)} session(s) it had "
                     f"written, as others wrote to them since: {note}")
        logger.warning("interrupted import kept sessions others wrote to: %s", note)


def _merge(outcome: _Outcome, part: _Outcome) -> None:
    for name in ("imported", "replaced", "detached", "title_conflicts"):
        getattr(outcome, name).extend(getattr(part, name))
    outcome.ignored_fields.update(part.ignored_fields)
    outcome.ignored_message_fields.update(part.ignored_message_fields)
    outcome.messages += part.messages


def _import(
    read: OnStore,
    write: WriteFn,
    records: Callable[[], Iterable[_Incoming]],
    on_conflict: str,
    errors: _Errors,
    progress: Progress | None,
    *,
    pause_s: float,
    chunk_messages: int | None = None,
    on_commit: OnCommit | None = None,
) -> _Outcome:
    """Check everything first (reads only: no lock held), then publish; any problem found
    refuses the whole import before anything is written."""
    if on_conflict not in ON_CONFLICT_CHOICES:
        raise InvalidInputError(
            f"on_conflict must be one of {', '.join(ON_CONFLICT_CHOICES)}, got {on_conflict!r}"
        )
    outcome = _Outcome()
    # Before the check, so that what a killed import left is not taken for stored sessions.
    if read(lambda conn: conn.execute(JOURNALS_SQL, (JOURNAL_PREFIX + "%",)).fetchone()):
        outcome.abandoned_removed, outcome.abandoned_kept = write(_remove_abandoned)
    plan: list[_Planned] = read(
        lambda conn: _plan(conn, records(), on_conflict, errors, outcome, progress)
    )
    errors.raise_any()
    _publish(write, plan, outcome, progress, chunk_messages, pause_s, on_commit)
    return outcome


# --- import_sessions(list) --------------------------------------------------------------------


def _list_records(sessions: list[Any], errors: _Errors, limited: bool) -> list[_Incoming]:
    """The records of a list import; shape problems and (``limited``) oversize sessions
    are added to ``errors``."""
    records: list[_Incoming] = []
    total_messages = total_bytes = 0
    for index, record in enumerate(sessions):
        where = {"index": index}
        shape = _list_record_shape(record, where, errors)
        if shape is None:
            continue
        messages, usage = shape
        if limited:
            size = _list_record_size(record, where, errors)
            if size is None:
                continue
            total_messages += len(messages)
            total_bytes += size
            if _too_large(record, len(messages), size, where, errors):
                continue
        records.append(_list_incoming(where, index, record, messages, usage))
    if limited and (total_messages > LIST_MAX_MESSAGES or total_bytes > LIST_MAX_BYTES):
        raise InvalidInputError(
            f"the import holds {total_messages} messages and {total_bytes} bytes: at most "
            f"{LIST_MAX_MESSAGES} messages and {LIST_MAX_BYTES} bytes at once"
        )
    return records


def _list_incoming(
    where: Where, index: int, record: Mapping[str, Any], messages: list[Any], usage: list[Any]
) -> _Incoming:
    """The session of list record ``index``: its columns (no source: the default one) and
    its messages and usage rows, each located by the index."""
    session = {k: v for k, v in record.items()
               if k not in ("messages", "model_usage", *_LIST_RUNTIME_COLUMNS)}
    if session.get("source") is None:
        session["source"] = LIST_DEFAULT_SOURCE
    rows = [({"index": index}, m) for m in messages]
    return _Incoming(where, session, functools.partial(iter, rows),
                     [({"index": index}, u) for u in usage])


def _list_record_shape(
    record: Any, where: Where, errors: _Errors
) -> tuple[list[Any], list[Any]] | None:
    """The messages and usage rows of one list record, or None when its shape is wrong (the
    problem added to ``errors``)."""
    if not isinstance(record, Mapping):
        errors.add(where, f"a session must be an object, got {type(record).__name__}",
                   code="invalid-record")
        return None
    sid = record.get("id")
    messages, usage = record.get("messages"), record.get("model_usage")
    if messages is not None and not isinstance(messages, list):
        errors.add(where, f"messages must be a list, got {type(messages).__name__}", sid,
                   code="invalid-messages")
        return None
    if usage is not None and not isinstance(usage, list):
        errors.add(where, f"model_usage must be a list, got {type(usage).__name__}", sid,
                   code="invalid-usage")
        return None
    return messages or [], usage or []


def _list_record_size(record: Mapping[str, Any], where: Where, errors: _Errors) -> int | None:
    """The record's size in bytes of JSON, or None when it is not JSON data (the problem
    added to ``errors``)."""
    try:
        return len(json.dumps(record, ensure_ascii=False, default=str).encode())
    except (ValueError, TypeError, RecursionError) as exc:
        # a lone surrogate is text UTF-8 cannot carry; anything else is not JSON data
        code = "unsupported-text" if isinstance(exc, UnicodeError) else "not-json"
        errors.add(where, f"the session is not JSON data: {exc}", record.get("id"), code=code)
        return None


def _too_large(
    record: Mapping[str, Any], messages: int, size: int, where: Where, errors: _Errors
) -> bool:
    """Whether one session is over a per-session limit of a list import (added to
    ``errors``)."""
    if messages > LIST_MAX_SESSION_MESSAGES:
        errors.add(where, f"{messages} messages: at most "
                          f"{LIST_MAX_SESSION_MESSAGES} per session", record.get("id"),
                   code="too-large")
        return True
    if size > LIST_MAX_SESSION_BYTES:
        errors.add(where, f"{size} bytes: at most {LIST_MAX_SESSION_BYTES} per session",
                   record.get("id"), code="too-large")
        return True
    return False


# A list import (the web endpoint's) restores history, not the ownership of a live channel or
# of a rewind: these columns start empty, as a new session's do.
_LIST_RUNTIME_COLUMNS = ("handoff_state", "handoff_target", "handoff_at", "handoff_platform",
                         "handoff_error", "rewind_count")
# The source of a listed session that names none (a record written by hand).
LIST_DEFAULT_SOURCE = "import"


def _list_error(entry: dict[str, Any]) -> dict[str, Any]:
    """One problem as a list import reports it: ``{"index", "error"[, "session_id"]}``, in the
    previous store's words for the problems it also refused (the web endpoint passes these
    through as they are; the codes stay on :class:`ImportRejectedError` for streams)."""
    code, text = entry.get("code"), str(entry["error"])
    if code == "missing-id":
        text = "session id is required"
    elif code == "missing-role" and (m := re.match(r"message (\d+):", text)):
        text = f"messages[{m[1]}].role must be a non-empty string"
    elif code == "invalid-field" and (m := re.match(r"(\w+) must be text, got", text)):
        text = f"{m[1]} must be a string"
    elif code == "too-large":
        text = ("messages exceeds the per-session import limit" if " messages: " in text
                else "session exceeds the import size limit")
    out = {k: v for k, v in entry.items() if k != "code"}
    out["error"] = text
    return out


def _list_errors(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first problem of each refused record (the previous store stopped at one)."""
    seen: set[Any] = set()
    out = []
    for entry in entries:
        index = entry.get("index")
        if index is not None and index in seen:
            continue
        seen.add(index)
        out.append(_list_error(entry))
    return out


def import_sessions(
    store: Store,
    sessions: list[Any],
    *,
    on_conflict: str = "skip",
    limited: bool = True,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Import exported sessions (``export_session`` / ``export_all`` dicts), whole or not at
    all: every record is checked before anything is written.

    A non-list, or (``limited``) more than 500 sessions, 50,000 messages or 25 MiB raises
    :class:`InvalidInputError`; a session over 10,000 messages or 5 MiB is a problem of its
    record. Result: ``{"ok": True, "imported", "skipped", "detached", "imported_ids",
    "skipped_ids", "errors": []}`` (counts and id lists; replaced sessions count as
    imported), or when any record has a problem ``{"ok": False, "imported": 0, "skipped": 0,
    "detached": 0, "errors": [{"index", "error"[, "session_id"]}]}`` (the first problem of each
    refused record, in the previous store's words where it refused the same) and nothing is
    written. A record without ``source`` is imported with ``"import"``; the handoff and
    rewind state of a record is not imported (history is, not a live channel).
    ``on_conflict``: an existing session with the same id is skipped (``"skip"``), replaced
    when it differs (``"replace"``), or, when it differs, fails the import (``"fail"``); an
    identical one is always skipped. A parent link is kept when the parent is stored or
    imported and no cycle results; otherwise the session is imported as a root (detached).
    """
    if not isinstance(sessions, list):
        raise InvalidInputError(f"sessions must be a list, got {type(sessions).__name__}")
    if limited and len(sessions) > LIST_MAX_SESSIONS:
        raise InvalidInputError(
            f"{len(sessions)} sessions: at most {LIST_MAX_SESSIONS} in one import"
        )
    errors = _Errors()
    records = _list_records(sessions, errors, limited)
    try:
        errors.raise_any()
        outcome = _import(*_store_io(store), lambda: records, on_conflict, errors, progress,
                          pause_s=store.timing.import_pause_s)
    except ImportRejectedError as exc:
        return {"ok": False, "imported": 0, "skipped": 0, "detached": 0,
                "errors": _list_errors(exc.errors)}
    imported = outcome.imported + outcome.replaced
    return {
        "ok": True,
        "imported": len(imported),
        "skipped": len(outcome.skipped),
        "detached": len(outcome.detached),
        "imported_ids": imported,
        "skipped_ids": outcome.skipped,
        "errors": [],
    }


# --- import_jsonl -------------------------------------------------------------------------------

# The JSONL importer's spool: memory stays bounded, sessions can be reordered parents-first,
# and the check and a retried transaction can read a session again.
SPOOL_SCHEMA_SQL = """
CREATE TABLE lines (n INTEGER PRIMARY KEY, block INTEGER, kind TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX lines_by_block ON lines (block, kind, n);
"""
SPOOL_INSERT_SQL = "INSERT INTO lines (n, block, kind, body) VALUES (?, ?, ?, ?)"
SPOOL_BLOCK_SQL = "SELECT n, body FROM lines WHERE block = ? AND kind = ? ORDER BY n"
SPOOL_PREFIX = "hermes-import-"


def _header_problem(obj: Mapping[str, Any]) -> _Problem | None:
    if obj.get("kind") != "header" or obj.get("format") != EXPORT_FORMAT:
        return _Problem("invalid-stream",
                        f"not a {EXPORT_FORMAT} stream (its first line must be the header)")
    version = obj.get("format_version")
    if version != EXPORT_FORMAT_VERSION:
        return _Problem("invalid-stream", f"format_version {version!r} is not one this "
                                          f"version reads ({EXPORT_FORMAT_VERSION})")
    schema = obj.get("schema_version")
    if not isinstance(schema, int) or isinstance(schema, bool) or schema > SCHEMA_VERSION:
        return _Problem("invalid-stream",
                        f"schema_version {schema!r}: written by a newer store than this one "
                        f"(schema {SCHEMA_VERSION}); upgrade hermes-state to import it")
    return None


def stream_name(fp: object) -> str:
    """How an error names the stream an import reads: its file's name, else its type."""
    name = getattr(fp, "name", None)
    if isinstance(name, (str, bytes)):
        return os.fsdecode(name)
    if isinstance(name, int):
        return f"file descriptor {name}"
    return f"the {type(fp).__name__} stream"


def _too_long(fp: object, n: int, limit: int, what: str) -> ImportRejectedError:
    return ImportRejectedError([{"line": n, "code": "too-large", "error": (
        f"{stream_name(fp)}: {what} is longer than {limit} bytes, the most one record may take "
        f"(an endless line, or a file of zeros?); read no further, nothing was imported")}])


def _bounded_lines(fp: IO[Any], limit: int) -> Iterator[tuple[int, Any]]:
    """(line number, line) of a stream, each read in one piece of at most ``limit`` bytes
    (characters for a text stream) and its newline: a longer line raises
    :class:`ImportRejectedError` naming the stream and the line, without reading it whole."""
    readline = getattr(fp, "readline", None)
    if not callable(readline):  # an iterable of lines, each already in memory
        for n, raw in enumerate(fp, start=1):
            if isinstance(raw, (str, bytes, bytearray)) and len(raw) > limit + 1:  # + newline
                raise _too_long(fp, n, limit, f"line {n}")
            yield n, raw
        return
    n = 0
    while True:
        raw = readline(limit + 1)
        if not raw:
            return
        n += 1
        if len(raw) > limit and raw[-1:] not in (b"\n", "\n"):
            raise _too_long(fp, n, limit, f"line {n}")
        yield n, raw


def read_json_export(fp: IO[Any], limit: int = MAX_JSON_EXPORT_BYTES) -> Any:
    """A whole JSON export (what ``export_session`` / ``export_all`` give, as JSON text) read
    from ``fp`` in at most ``limit`` bytes (characters for a text stream). A stream that does
    not begin with ``[`` or ``{`` (after white space), is larger, or is not JSON raises
    :class:`ImportRejectedError` naming it, having read no more than ``limit`` and a byte."""
    limit = min(integer("limit", limit, minimum=1), sys.maxsize - 1)
    data = _json_text(fp, limit)
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise _not_json(fp, exc.lineno, exc.colno, exc.msg) from None
    except UnicodeDecodeError as exc:
        raise ImportRejectedError([{"line": 1, "code": "not-json", "error": (
            f"{stream_name(fp)}: not JSON (not UTF-8 text: {exc.reason} at byte {exc.start}); "
            "nothing was imported")}]) from None
    except (ValueError, RecursionError) as exc:
        raise ImportRejectedError([{"line": 1, "code": "not-json", "error": (
            f"{stream_name(fp)}: not JSON ({exc or 'nested too deeply'}); nothing was imported"
        )}]) from None


def _json_text(fp: IO[Any], limit: int) -> str | bytes:
    """The whole text of ``fp``, refused once it is longer than ``limit`` or does not begin
    as JSON (``[`` or ``{`` after white space)."""
    pieces: list[Any] = []
    size, begun = 0, False
    while size <= limit:
        piece = fp.read(min(_JSON_PIECE, limit + 1 - size))
        if not isinstance(piece, (str, bytes, bytearray)):
            raise InvalidInputError(f"{stream_name(fp)} gave {type(piece).__name__}, not text")
        if not piece:
            break
        if not begun and piece.strip():
            _check_json_start(fp, pieces, piece)
            begun = True
        pieces.append(piece)
        size += len(piece)
    if size > limit:
        raise _too_long(fp, 1, limit, "the JSON export (a single record)")
    return pieces[0][:0].join(pieces) if pieces else ""


def _check_json_start(fp: object, pieces: list[Any], piece: Any) -> None:
    """Refuse a stream whose first text after white space (in ``piece``, after the blank
    ``pieces``) is not ``[`` or ``{``, naming where it is."""
    lead = piece[: len(piece) - len(piece.lstrip())]
    if piece[len(lead):len(lead) + 1] not in ("[", "{", b"[", b"{"):
        before = "".join(p if isinstance(p, str) else bytes(p).decode("utf-8", "replace")
                         for p in [*pieces, lead])
        line, column = before.count("\n") + 1, len(before) - before.rfind("\n")
        raise _not_json(fp, line, column, "Expecting value")


def _not_json(fp: object, line: int, column: int, why: str) -> ImportRejectedError:
    """The refusal of a JSON export whose text stops being JSON at ``line``, ``column``."""
    return ImportRejectedError([{"line": line, "code": "not-json", "error": (
        f"{stream_name(fp)}: not JSON at line {line}, column {column} ({why}); nothing was "
        "imported (an export is JSON Lines or JSON: `sessions export` writes one)")}])


@dataclass
class _Frame:
    """What a JSONL stream has shown so far: its header's line, its end line, its session
    lines (line, row), the latest session line of each id and how many message lines."""
    header: int | None = None
    end: tuple[int, dict[str, Any]] | None = None
    sessions: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    blocks: dict[Any, int] = field(default_factory=dict)
    messages: int = 0


def _spool_jsonl(
    fp: IO[Any],
    spool: sqlite3.Connection,
    errors: _Errors,
    progress: Progress | None,
    limit: int = MAX_RECORD_BYTES,
) -> list[tuple[int, dict[str, Any]]]:
    """Load JSONL lines into ``spool`` and check the stream's frame: the header first, an
    ``end`` line last whose counts match. Returns (line, session row) per session line; a
    message or usage line belongs to the latest session line of its session id. A line over
    ``limit`` refuses the import at once (see :func:`_bounded_lines`)."""
    spool.executescript(SPOOL_SCHEMA_SQL)
    frame = _Frame()
    batch: list[tuple[Any, ...]] = []
    n = 0
    with transaction(spool):
        for n, raw in _bounded_lines(fp, limit):
            text = _line_text(n, raw, errors)
            if text is None or not text.strip():
                continue
            if progress is not None and n % 50_000 == 0:
                progress("reading lines", n, None)
            try:
                obj = json.loads(text)
            except (ValueError, RecursionError) as exc:
                errors.add({"line": n}, f"not a JSON line: {exc}", code="not-json")
                continue
            spooled = _frame_line(frame, n, obj, errors)
            if spooled is not None:
                batch.append(spooled)
                if len(batch) >= 1000:
                    spool.executemany(SPOOL_INSERT_SQL, batch)
                    batch.clear()
        spool.executemany(SPOOL_INSERT_SQL, batch)
    _check_frame(frame, n, errors)
    return frame.sessions


def _line_text(n: int, raw: Any, errors: _Errors) -> str | None:
    """Line ``n`` as text, or None when it is not UTF-8 text (added to ``errors``)."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, (bytes, bytearray)):
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            errors.add({"line": n}, f"not UTF-8 text: {exc.reason}", code="not-json")
            return None
    errors.add({"line": n}, f"not text but {type(raw).__name__}", code="not-json")
    return None


def _frame_line(
    frame: _Frame, n: int, obj: Any, errors: _Errors
) -> tuple[int, int, str, str] | None:
    """Take JSON line ``n`` into ``frame``; the spool row of a message or usage line, None for
    any other line or a line with a problem (added to ``errors``). A wrong header refuses the
    import at once: nothing after it can be trusted."""
    if frame.header is None:
        frame.header = n
        problem = _header_problem(obj if isinstance(obj, dict) else {})
        if problem:
            errors.add({"line": n}, problem.message, code=problem.code)
            errors.raise_any()
        return None
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if frame.end is not None:
        errors.add({"line": n}, "a line after the end line", code="invalid-stream")
    elif kind == "end":
        frame.end = (n, obj)
    elif kind == "session":
        session = obj.get("session")
        if isinstance(session, dict):
            frame.blocks[session.get("id")] = n
            frame.sessions.append((n, session))
        else:
            errors.add({"line": n}, "a session line needs a 'session' object",
                       code="invalid-stream")
    elif kind in ("message", "usage"):
        return _spool_row(frame, n, kind, obj, errors)
    else:
        errors.add({"line": n}, f"unknown kind {kind!r}", code="invalid-stream")
    return None


def _spool_row(
    frame: _Frame, n: int, kind: str, obj: dict[str, Any], errors: _Errors
) -> tuple[int, int, str, str] | None:
    """The spool row of message or usage line ``n``: (line, its session line, kind, body)."""
    frame.messages += kind == "message"
    block = frame.blocks.get(obj.get("session_id"))
    if block is None:
        errors.add({"line": n}, f"{kind} of a session that has no session line before it",
                   code="invalid-stream")
        return None
    try:
        body = json.dumps(obj.get(kind), ensure_ascii=False)
    except ValueError as exc:  # a lone surrogate escaped in the line
        errors.add({"line": n}, str(exc), code="unsupported-text")
        return None
    return n, block, kind, body


def _check_frame(frame: _Frame, last: int, errors: _Errors) -> None:
    """Check the stream's frame once read to its ``last`` line: a header, and an end line
    whose counts match the lines the stream holds."""
    if frame.header is None:
        errors.add({"line": 1}, f"empty: not a {EXPORT_FORMAT} stream", code="invalid-stream")
    elif frame.end is None:
        errors.add({"line": last + 1}, "the stream ends without its end line: it was cut "
                                       "short (a truncated copy?)", code="invalid-stream")
    else:
        line, obj = frame.end
        sessions, messages = len(frame.sessions), frame.messages
        if obj.get("sessions") != sessions or obj.get("messages") != messages:
            errors.add({"line": line}, f"the end line counts {obj.get('sessions')!r} sessions "
                                       f"and {obj.get('messages')!r} messages but the stream "
                                       f"holds {sessions} and {messages}: lines are "
                                       "missing or were altered", code="invalid-stream")


def _report(outcome: _Outcome) -> dict[str, Any]:
    report: dict[str, Any] = {
        "ok": True,
        "imported": outcome.imported,
        "replaced": outcome.replaced,
        "skipped": outcome.skipped,
        "title_conflicts": outcome.title_conflicts,
        "parent_missing": outcome.detached,
        "messages_imported": outcome.messages,
        "errors": [],
    }
    if outcome.abandoned_removed:
        report["abandoned_import_removed"] = outcome.abandoned_removed
    if outcome.abandoned_kept:
        report["abandoned_import_kept"] = outcome.abandoned_kept
    for key in ("ignored_fields", "ignored_message_fields"):
        if getattr(outcome, key):
            report[key] = getattr(outcome, key)
    return report


def _record_limit(max_record_bytes: object, chunk_messages: object) -> int:
    """The longest line a stream import takes, once both of its sizes passed their checks."""
    limit = integer("max_record_bytes", max_record_bytes, minimum=1)
    if chunk_messages is not None:
        integer("chunk_messages", chunk_messages, minimum=1)
    if limit >= sys.maxsize:
        raise InvalidInputError(f"max_record_bytes must be below {sys.maxsize}, got {limit}")
    return limit


def _spooled_records(
    spool: sqlite3.Connection, sessions: list[tuple[int, dict[str, Any]]]
) -> Callable[[], Iterator[_Incoming]]:
    """The records of a spooled stream: each session line's row with its usage rows, and its
    messages read from the spool line by line when the import gets to them."""

    def spooled(block: int, kind: str) -> Iterator[tuple[Where, Any]]:
        rows = spool.execute(SPOOL_BLOCK_SQL, (block, kind))
        return (({"line": n}, json.loads(b)) for n, b in rows)

    def records() -> Iterator[_Incoming]:
        for block, session in sessions:
            yield _Incoming({"line": block}, session,
                            functools.partial(spooled, block, "message"),
                            list(spooled(block, "usage")))

    return records


def import_jsonl(
    store: Store,
    fp: IO[Any],
    *,
    on_conflict: str = "fail",
    progress: Progress | None = None,
    max_record_bytes: int = MAX_RECORD_BYTES,
    chunk_messages: int | None = None,
    on_commit: OnCommit | None = None,
) -> dict[str, Any]:
    """Import a stream written by :func:`export_jsonl_lines` (text or binary file object,
    read line by line into a private spool file: memory stays bounded), whole or not at all.
    A line over ``max_record_bytes`` (default :data:`MAX_RECORD_BYTES`) refuses the import,
    naming the stream and the line. ``chunk_messages``: about how many messages one publish
    transaction writes (None: :data:`PUBLISH_CHUNK_MESSAGES`); between two of them the lock
    stays free for the handle's ``timing.import_pause_s``. ``on_commit(done, total)`` is called
    after each publish transaction commits, with the messages written so far and in all; what
    it raises ends the import as any failure does (what earlier transactions wrote is deleted
    again; after the last commit the import is complete).

    The stream must be whole: its header first (a known ``format_version``, a
    ``schema_version`` no newer than this store's), an ``end`` line last whose counts match.
    Any problem — of the frame or of any record — raises :class:`ImportRejectedError` listing
    each by line, and nothing is written. ``on_conflict`` as for :func:`import_sessions`
    (default ``"fail"``: an identical session is skipped, a different one refuses the
    import). Report: ``ok``, ``imported``, ``replaced``, ``skipped`` (id lists),
    ``title_conflicts`` (imported without the title another session holds),
    ``parent_missing`` (imported as a root: the parent is neither stored nor imported, or
    the link would close a cycle), ``messages_imported`` and ``errors`` (empty)."""
    limit = _record_limit(max_record_bytes, chunk_messages)
    remove_abandoned_temps(None, SPOOL_PREFIX)  # spools of imports killed mid-way
    with tempfile.TemporaryDirectory(prefix=temp_prefix(SPOOL_PREFIX)) as tmp:
        spool_path = Path(tmp) / "spool.db"
        with translated_errors(spool_path):  # the spool's own errors (the store's are typed)
            spool = connect(spool_path, "rwc")
            try:
                spool.execute("PRAGMA journal_mode = OFF")
                spool.execute("PRAGMA synchronous = OFF")
                errors = _Errors()
                sessions = _spool_jsonl(fp, spool, errors, progress, limit)
                errors.raise_any()
                outcome = _import(*_store_io(store), _spooled_records(spool, sessions),
                                  on_conflict, errors, progress,
                                  pause_s=store.timing.import_pause_s,
                                  chunk_messages=chunk_messages,
                                  on_commit=on_commit)
                return _report(outcome)
            finally:
                spool.close()
