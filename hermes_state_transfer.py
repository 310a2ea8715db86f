"""Transfer: sessions out of one store and into another, as JSON or JSON Lines.

*Export* is plain JSON data: the session row with every column, every message row of every
generation (uids, JSON fields decoded, ``active``/``compacted`` flags) and the per-model usage
rows. Nothing derived travels (no FTS text, no ``search_cjk``), so an import loses nothing.
:func:`iter_export_jsonl` streams one JSON object per line from database cursors, so a session
of any size exports in constant memory. *Import* writes each session in its own transaction,
parents before children, messages through ``insert_message`` (uids kept): an existing identical
session is skipped, an existing different one is a conflict and nothing of it is written.
The JSONL importer spools the stream into a private SQLite file first, so memory stays bounded
whatever the stream's size.

The functions take the caller's connection (exports: run them inside one read transaction for
a consistent snapshot) or its write function (imports: ``write(fn)`` runs ``fn(conn)`` as one
retried write transaction); the facade passes its own, which translate SQLite's errors.
"""

from __future__ import annotations

import datetime
import functools
import json
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hermes_state_common import (
    SCHEMA_VERSION,
    clean_optional,
    connect,
    quote_identifier,
    transaction,
)
from hermes_state_errors import (
    InvalidInputError,
    InvalidTypeError,
    SessionNotFoundError,
    StateDbConstraintError,
    translated_errors,
)
from hermes_state_lineage import compression_chain, lineage_tree
from hermes_state_listing import search_sessions
from hermes_state_messages import (
    MESSAGE_FIELDS,
    SELECT_MESSAGES_SQL,
    get_messages,
    insert_message,
    message_fields,
    row_to_message,
)
from hermes_state_schema import WriteFn, expected_columns
from hermes_state_sessions import get_model_usage, get_session, session_columns

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_FORMAT_VERSION",
    "export_session",
    "export_all",
    "export_session_lineage",
    "iter_export_jsonl",
    "import_sessions",
    "import_jsonl",
]

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

_MESSAGE_DEFAULTS: dict[str, Any] = {
    **dict.fromkeys(MESSAGE_FIELDS),
    "observed": False,
    "active": True,
    "compacted": False,
}
_FLAGS = ("observed", "active", "compacted")
_USAGE_KEY = ("model", "billing_provider", "billing_base_url", "billing_mode", "task")


@dataclass
class _Incoming:
    """One session to import: its row, a re-iterable source of its messages (a retried
    transaction reads them again) and its usage rows."""

    session: dict[str, Any]
    messages: Callable[[], Iterable[Mapping[str, Any]]]
    usage: list[dict[str, Any]]

    @property
    def id(self) -> Any:
        return self.session.get("id")


def _from_dict(record: Mapping[str, Any]) -> _Incoming:
    if not isinstance(record, Mapping):
        raise InvalidTypeError(
            f"a session to import must be a mapping, got {type(record).__name__}")
    session = {k: v for k, v in record.items() if k not in ("messages", "model_usage")}
    messages = list(record.get("messages") or [])
    return _Incoming(session, lambda: messages, list(record.get("model_usage") or []))


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
    incoming = iter(rec.messages())
    for row in stored:
        other = next(incoming, None)
        if other is None or _comparable_message(row_to_message(row)) != _comparable_message(other):
            return False
    if next(incoming, None) is not None:
        return False
    return _comparable_usage(get_model_usage(conn, existing["id"])) == _comparable_usage(rec.usage)


def _usage_columns() -> list[str]:
    return [c[0] for c in expected_columns()["session_model_usage"]]


def _import_one(conn: sqlite3.Connection, rec: _Incoming) -> dict[str, Any]:
    """Import one session in the caller's transaction; returns what happened to it."""
    session_id = rec.id
    if not isinstance(session_id, str) or not session_id.strip():
        raise InvalidInputError(f"session id must be a non-empty string, got {session_id!r}")
    existing = get_session(conn, session_id)
    if existing is not None:
        if _same_session(conn, existing, rec):
            return {"status": "skipped"}
        return {"status": "conflict", "reason": "a different session with this id exists"}
    outcome: dict[str, Any] = {"status": "imported"}
    columns = session_columns()
    row = {k: rec.session[k] for k in columns if k in rec.session}
    unknown = sorted(set(rec.session) - set(columns))
    if unknown:
        outcome["ignored_fields"] = unknown
    title = row.get("title")
    if title is not None:
        holder = conn.execute("SELECT id FROM sessions WHERE title = ?", (title,)).fetchone()
        if holder is not None:
            row["title"] = None
            outcome["title_conflict"] = {"title": title, "held_by": holder[0]}
    parent = row.get("parent_session_id")
    if parent is not None and get_session(conn, parent) is None:
        row["parent_session_id"] = None
        outcome["parent_missing"] = parent
    names = list(row)
    conn.execute(
        f"INSERT INTO sessions ({', '.join(quote_identifier(n) for n in names)})"
        f" VALUES ({', '.join('?' * len(names))})",
        [clean_optional(v) if isinstance(v, str) else v for v in row.values()],
    )
    count = 0
    dropped: set[str] = set()
    for message in rec.messages():
        fields = message_fields(message)
        dropped.update(k for k in fields if k not in _MESSAGE_DEFAULTS)
        insert_message(
            conn,
            session_id,
            {k: v for k, v in fields.items() if k in _MESSAGE_DEFAULTS},
            count=False,
        )
        count += 1
    if dropped:
        outcome["ignored_message_fields"] = sorted(dropped)
    usage_columns = _usage_columns()
    for usage in rec.usage:
        values = {k: usage[k] for k in usage_columns if k in usage}
        values["session_id"] = session_id
        conn.execute(
            f"INSERT INTO session_model_usage ({', '.join(quote_identifier(n) for n in values)})"
            f" VALUES ({', '.join('?' * len(values))})",
            list(values.values()),
        )
    outcome["messages"] = count
    return outcome


def _parents_first(records: list[_Incoming]) -> list[_Incoming]:
    """The records reordered so that a session follows its parent when both are imported;
    otherwise input order. Cycles and duplicate ids cannot loop."""
    first: dict[Any, _Incoming] = {}
    for rec in records:
        first.setdefault(rec.id, rec)
    placed: set[int] = set()
    out: list[_Incoming] = []
    for rec in records:
        chain = []
        node: _Incoming | None = rec
        while node is not None and id(node) not in placed:
            placed.add(id(node))
            chain.append(node)
            parent = node.session.get("parent_session_id")
            node = first.get(parent) if parent is not None else None
        out.extend(reversed(chain))
    return out


def _import_records(write: WriteFn, records: list[_Incoming]) -> dict[str, Any]:
    report: dict[str, Any] = {
        "imported": [],
        "skipped": [],
        "conflicts": [],
        "title_conflicts": [],
        "parent_missing": [],
        "invalid": [],
        "messages_imported": 0,
    }
    for rec in _parents_first(records):
        try:
            outcome = write(functools.partial(_import_one, rec=rec))
        except (ValueError, TypeError, StateDbConstraintError) as exc:
            report["invalid"].append({"session_id": rec.id, "error": str(exc)})
            continue
        status = outcome["status"]
        if status == "skipped":
            report["skipped"].append(rec.id)
        elif status == "conflict":
            report["conflicts"].append({"session_id": rec.id, "reason": outcome["reason"]})
        else:
            report["imported"].append(rec.id)
            report["messages_imported"] += outcome["messages"]
            if "title_conflict" in outcome:
                conflict = outcome["title_conflict"]
                report["title_conflicts"].append({"session_id": rec.id, **conflict})
            if "parent_missing" in outcome:
                report["parent_missing"].append(
                    {"session_id": rec.id, "parent_session_id": outcome["parent_missing"]}
                )
            for key in ("ignored_fields", "ignored_message_fields"):
                if key in outcome:
                    report.setdefault(key, {})[rec.id] = outcome[key]
    return report


def import_sessions(write: WriteFn, sessions: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Import exported sessions (``export_session`` / ``export_all`` dicts), any order.

    ``write(fn)`` runs ``fn(conn)`` in one retried write transaction; each session gets its
    own. Report: ``imported``, ``skipped`` (an identical session exists), ``conflicts`` (a
    different one exists; nothing of it written), ``title_conflicts`` (imported without the
    title another session holds), ``parent_missing`` (imported as a root: its parent is
    neither stored nor imported), ``invalid`` (rejected records) and ``messages_imported``.
    """
    return _import_records(write, [_from_dict(s) for s in sessions])


# The JSONL importer's spool: memory stays bounded, sessions can be reordered parents-first,
# and a retried transaction can re-read a session.
SPOOL_SCHEMA_SQL = """
CREATE TABLE lines (n INTEGER PRIMARY KEY, block INTEGER, kind TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX lines_by_block ON lines (block, kind, n);
"""
SPOOL_INSERT_SQL = "INSERT INTO lines (n, block, kind, body) VALUES (?, ?, ?, ?)"
SPOOL_BLOCK_SQL = "SELECT body FROM lines WHERE block = ? AND kind = ? ORDER BY n"


def _line_text(n: int, raw: object) -> str:
    """Line ``n`` of a stream as text: a string, or bytes in UTF-8."""
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, (bytes, bytearray)):
        raise InvalidTypeError(f"line {n} is not text but {type(raw).__name__}")
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"line {n} is not UTF-8: {exc}") from None


def _spool_jsonl(fp: IO[Any], spool: sqlite3.Connection) -> list[tuple[int, dict[str, Any]]]:
    """Load JSONL lines into ``spool``; returns (block, session row) for each session line.
    A message or usage line belongs to the latest session line of its session id."""
    spool.executescript(SPOOL_SCHEMA_SQL)
    sessions: list[tuple[int, dict[str, Any]]] = []
    blocks: dict[Any, int] = {}
    batch: list[tuple[Any, ...]] = []
    with transaction(spool):
        for n, raw in enumerate(fp, start=1):
            text = _line_text(n, raw)
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
                kind = obj["kind"]
            except (ValueError, TypeError, KeyError) as exc:
                raise InvalidInputError(f"line {n} is not an export line: {exc}") from None
            if kind == "header":
                if obj.get("format") != EXPORT_FORMAT:
                    raise InvalidInputError(f"line {n}: not a {EXPORT_FORMAT} stream")
                continue
            if kind == "end":
                continue
            if kind == "session":
                session = obj.get("session")
                if not isinstance(session, dict):
                    raise InvalidInputError(f"line {n}: a session line needs a 'session' object")
                blocks[session.get("id")] = n
                sessions.append((n, session))
                continue
            if kind not in ("message", "usage"):
                raise InvalidInputError(f"line {n}: unknown kind {kind!r}")
            block = blocks.get(obj.get("session_id"))
            if block is None or not isinstance(obj.get(kind), dict):
                raise InvalidInputError(
                    f"line {n}: {kind} of a session that has no session line before it"
                )
            batch.append((n, block, kind, json.dumps(obj[kind], ensure_ascii=False)))
            if len(batch) >= 1000:
                spool.executemany(SPOOL_INSERT_SQL, batch)
                batch.clear()
        spool.executemany(SPOOL_INSERT_SQL, batch)
    return sessions


def import_jsonl(write: WriteFn, fp: IO[Any]) -> dict[str, Any]:
    """Import a stream written by :func:`iter_export_jsonl` (text or binary file object,
    read line by line; memory stays bounded by one session row at a time plus the ids).
    Same rules and report as :func:`import_sessions`."""
    with tempfile.TemporaryDirectory(prefix="hermes-import-") as tmp:
        spool_path = Path(tmp) / "spool.db"
        with translated_errors(spool_path):  # the spool's own errors (the store's are typed)
            spool = connect(spool_path, "rwc")
            try:
                spool.execute("PRAGMA journal_mode = OFF")
                spool.execute("PRAGMA synchronous = OFF")
                sessions = _spool_jsonl(fp, spool)

                def spooled(block: int, kind: str) -> Iterator[dict[str, Any]]:
                    rows = spool.execute(SPOOL_BLOCK_SQL, (block, kind))
                    return (json.loads(b) for (b,) in rows)

                records = [
                    _Incoming(
                        session,
                        functools.partial(spooled, block, "message"),
                        list(spooled(block, "usage")),
                    )
                    for block, session in sessions
                ]
                return _import_records(write, records)
            finally:
                spool.close()

