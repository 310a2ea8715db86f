"""Sessions: creation, accounting, titles and archiving.

Creating a session never overwrites, so ``user_id`` is fixed at birth. The first end reason
wins. Token accounting moves session totals and the per-model row together. Archives are
deliberate (``archived``) or the idle clean-up's (``auto_archived``); resuming lifts only the
latter. Archive changes act on a whole conversation, so a listed row and its tip never
disagree."""

from __future__ import annotations

import json
import math
import re
import sqlite3
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from hermes_state_arguments import filter_texts
from hermes_state_common import (
    Key,
    Text,
    clean_optional,
    encode_json,
    escape_like,
    now,
    placeholders,
    quote_identifier,
    row_to_dict,
    stored_text,
)
from hermes_state_schema_sql import LIVE_ADMISSION_STATUSES, LIVE_EXECUTION_STATUSES, sql_values
from hermes_state_errors import (
    InvalidInputError,
    InvalidTypeError,
    SessionNotFoundError,
    TitleConflictError,
)
from hermes_state_lineage import compression_ancestors, conversation_members, session_ancestors
from hermes_state_schema import expected_columns

__all__ = [
    "create_session",
    "get_session",
    "resolve_session_id",
    "sessions_starting_with",
    "end_session",
    "reopen_session",
    "update_token_counts",
    "set_session_archived",
    "auto_archive_idle_sessions",
    "lift_auto_archive",
    "PINNING_STATUSES_SQL",
    "sanitize_title",
    "set_session_title",
    "set_auto_title_if_empty",
    "stats",
    "clear_messages",
    "ensure_session",
    "get_model_usage",
    "get_next_title_in_lineage",
    "get_session_by_title",
    "get_session_title",
    "message_count",
    "require_session",
    "resolve_session_by_title",
    "session_columns",
    "source_filters",
    "update_system_prompt",
]

_JSON_SESSION_COLUMNS = frozenset({"model_config", "origin_json"})


def session_columns() -> tuple[str, ...]:
    return tuple(c[0] for c in expected_columns()["sessions"])


def _session_value(name: str, value: Any) -> Any:
    """A session column's value as it is bound: JSON columns encoded, text cleaned, flags as
    integers; a value no column can hold is refused, naming the column."""
    if name in _JSON_SESSION_COLUMNS and value is not None and not isinstance(value, str):
        return clean_optional(encode_json(value, name, sort_keys=True))
    if isinstance(value, str):
        return clean_optional(value)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise InvalidInputError(f"{name} does not fit in 64 bits: {value}", argument=name)
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInputError(f"{name} must be a finite number, got {value!r}", argument=name)
    if value is not None and not isinstance(value, (int, float)):
        raise InvalidTypeError(
            f"{name} must be text or a number, got {type(value).__name__}", argument=name)
    return value


def _check_session_id(session_id: Any) -> str:
    if not isinstance(session_id, str) or not session_id.strip():
        raise InvalidInputError(f"session id must be a non-empty string, got {session_id!r}")
    if clean_optional(session_id) != session_id:  # SQLite cannot store a lone surrogate
        raise InvalidInputError(f"session id has a lone surrogate: {session_id!r}")
    return session_id


def require_session(conn: sqlite3.Connection, /, session_id: str) -> None:
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
        raise SessionNotFoundError(session_id)


def create_session(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    source: Text,
    model: Text | None = None,
    model_config: Mapping[str, Any] | str | None = None,
    system_prompt: Text | None = None,
    user_id: Text | None = None,
    parent_session_id: str | None = None,
    **columns: Any,
) -> str:
    """Create the session unless it exists. Returns the id.

    ``columns`` may set any other column of ``sessions`` (``cwd``, ``chat_id``, …). On an
    existing session the call fills the columns it gives that are still NULL and never
    changes a value already set: a gateway creates a bare row, and the agent's own call later
    brings the model, its configuration and the system prompt (:func:`_fill_missing`)."""
    columns.update(
        model=model,
        model_config=model_config,
        system_prompt=system_prompt,
        user_id=user_id,
        parent_session_id=parent_session_id,
    )
    _insert_session(conn, session_id, source, columns)
    return session_id


def ensure_session(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    source: Text = "unknown",
    model: Text | None = None,
) -> str:
    """The session id, creating a minimal session row when there is none."""
    return create_session(conn, session_id, source, model=model)


def _insert_session(
    conn: sqlite3.Connection, /, session_id: str, source: str, columns: Mapping[str, Any]
) -> bool:
    _check_session_id(session_id)
    if not isinstance(source, str) or not source:
        raise InvalidInputError(f"source must be a non-empty string, got {source!r}")
    allowed = set(session_columns()) - {"id", "source"}
    unknown = set(columns) - allowed
    if unknown:
        raise InvalidTypeError(f"unknown session columns: {', '.join(sorted(unknown))}")
    values = {k: _session_value(k, v) for k, v in columns.items() if v is not None}
    if "title" in values:
        values["title"] = sanitize_title(values["title"])
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone():
        _fill_missing(conn, session_id, values)
        return False
    values.setdefault("started_at", now())
    parent = values.get("parent_session_id")
    if parent is not None:
        require_session(conn, parent)
    if values.get("title") is not None:
        _check_title_free(conn, session_id, values["title"])
    names = ["id", "source", *values]
    sql = (
        f"INSERT INTO sessions ({', '.join(quote_identifier(n) for n in names)})"
        f" VALUES ({placeholders(len(names))}) ON CONFLICT(id) DO NOTHING"
    )
    return conn.execute(sql, (session_id, clean_optional(source), *values.values())).rowcount > 0


# Columns a repeated create_session never fills: the start stays the first call's, and a
# title is set (and checked for uniqueness) by set_session_title only.
_NEVER_FILLED = frozenset({"started_at", "title"})


def _fill_missing(
    conn: sqlite3.Connection, /, session_id: str, values: Mapping[str, Any]
) -> None:
    """Set each of ``values`` on the existing session where its column is still NULL. A parent
    is filled only when it exists and is not the session or one of its descendants."""
    fill = {k: v for k, v in values.items() if k not in _NEVER_FILLED}
    parent = fill.get("parent_session_id")
    if parent is not None:
        require_session(conn, parent)
        if any(row["id"] == session_id for row in session_ancestors(conn, parent)):
            del fill["parent_session_id"]  # it would close a cycle
    if not fill:
        return
    assignments = ", ".join(
        f"{quote_identifier(name)} = COALESCE({quote_identifier(name)}, ?)" for name in fill
    )
    conn.execute(f"UPDATE sessions SET {assignments} WHERE id = ?", (*fill.values(), session_id))


def get_session(conn: sqlite3.Connection, /, session_id: Key) -> dict[str, Any] | None:
    if isinstance(session_id, str) and clean_optional(session_id) != session_id:
        return None  # no stored id has a lone surrogate
    cursor = conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,))
    row = cursor.fetchone()
    return None if row is None else row_to_dict(cursor, row)


# Ids are case-sensitive, which LIKE is not (for ASCII): the prefix is compared exactly, and
# no character of it is a wildcard.
PREFIX_MATCH_SQL = "SELECT id FROM sessions WHERE substr(id, 1, length(:p)) = :p LIMIT 2"


def resolve_session_id(conn: sqlite3.Connection, /, session_id_or_prefix: Key) -> str | None:
    """The session id equal to, or uniquely starting with, the argument (compared exactly:
    case matters and ``%``/``_`` are literal); None when there is no match or more than one."""
    if not isinstance(session_id_or_prefix, str) or not session_id_or_prefix:
        return None
    prefix = stored_text(session_id_or_prefix)
    if prefix is None:
        return None  # no stored id has a lone surrogate, nor starts with one
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (prefix,)).fetchone():
        return prefix
    rows = conn.execute(PREFIX_MATCH_SQL, {"p": prefix}).fetchall()
    return rows[0][0] if len(rows) == 1 else None


PREFIX_MATCHES_SQL = """
SELECT id FROM sessions WHERE substr(id, 1, length(:p)) = :p ORDER BY started_at DESC, id LIMIT :n
"""


def sessions_starting_with(
    conn: sqlite3.Connection, /, prefix: Key, limit: int = 10
) -> list[str]:
    """The ids starting with ``prefix`` (compared exactly), newest first, at most ``limit``:
    what an ambiguous :func:`resolve_session_id` could have meant."""
    key = stored_text(prefix) if isinstance(prefix, str) else None
    if not key:
        return []
    return [r[0] for r in conn.execute(PREFIX_MATCHES_SQL, {"p": key, "n": limit})]


# Only a live session changes: the first end (and its reason) is kept.
END_SESSION_SQL = (
    "UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL"
)


def end_session(conn: sqlite3.Connection, /, session_id: str, end_reason: Text | None) -> None:
    """End the session; the first end reason is kept. An unknown or already ended session is
    left as it is (callers end sessions another process may have deleted)."""
    conn.execute(END_SESSION_SQL, (now(), clean_optional(end_reason), session_id))


REOPEN_SQL = "UPDATE sessions SET ended_at = NULL, end_reason = NULL WHERE id = ?"


def reopen_session(conn: sqlite3.Connection, /, session_id: str) -> None:
    """Clear the end so a later end applies; resuming lifts the conversation's archive only
    when the idle clean-up set it, never a deliberate one."""
    if conn.execute(REOPEN_SQL, (session_id,)).rowcount == 0:
        raise SessionNotFoundError(session_id)
    lift_auto_archive(conn, session_id)


def update_system_prompt(conn: sqlite3.Connection, /, session_id: str, prompt: Text | None) -> None:
    update_session_columns(conn, session_id, {"system_prompt": prompt})


def update_session_columns(
    conn: sqlite3.Connection, /, session_id: str, values: Mapping[str, Any]
) -> None:
    sets = ", ".join(f"{quote_identifier(k)} = ?" for k in values)
    cursor = conn.execute(
        f"UPDATE sessions SET {sets} WHERE id = ?",
        (*(_session_value(k, v) for k, v in values.items()), session_id),
    )
    if cursor.rowcount == 0:
        raise SessionNotFoundError(session_id)


# --- accounting ------------------------------------------------------------------------------

TOKEN_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "api_call_count",
)
COST_FIELDS = ("estimated_cost_usd", "actual_cost_usd")
LABEL_FIELDS = ("cost_status", "cost_source", "pricing_version")
ROUTE_FIELDS = ("billing_provider", "billing_base_url", "billing_mode")

USAGE_UPSERT_SQL = """
INSERT INTO session_model_usage (
    session_id, model, billing_provider, billing_base_url, billing_mode, task,
    input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens,
    api_call_count, estimated_cost_usd, actual_cost_usd, first_used_at, last_used_at
) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (session_id, model, billing_provider, billing_base_url, billing_mode, task)
DO UPDATE SET {updates}, last_used_at = excluded.last_used_at
"""
_INCREMENT = "{f} = {f} + excluded.{f}"
_ADD_COST = "{f} = CASE WHEN excluded.{f} IS NULL THEN {f} ELSE COALESCE({f}, 0) + excluded.{f} END"
_SET_COST = "{f} = COALESCE(excluded.{f}, {f})"


def _usage_sql(absolute: bool) -> str:
    token = "{f} = excluded.{f}" if absolute else _INCREMENT
    cost = _SET_COST if absolute else _ADD_COST
    updates = [token.format(f=f) for f in TOKEN_FIELDS] + [cost.format(f=f) for f in COST_FIELDS]
    return USAGE_UPSERT_SQL.format(updates=", ".join(updates))


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def _check_cost(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTypeError(f"{name} must be a number or None, got {type(value).__name__}")
    return float(value)


# The session's model and billing route, and whether any usage was accounted to it yet.
SESSION_ROUTE_SQL = """
SELECT model, billing_provider, billing_base_url, billing_mode,
       input_tokens + output_tokens + cache_read_tokens + cache_write_tokens
       + reasoning_tokens + api_call_count > 0
FROM sessions WHERE id = ?
"""


def update_token_counts(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    input_tokens: int = 0,
    output_tokens: int = 0,
    model: Text | None = None,
    cache_read_tokens: int = 0,
    cache_write_tokens: int = 0,
    reasoning_tokens: int = 0,
    estimated_cost_usd: float | None = None,
    actual_cost_usd: float | None = None,
    cost_status: Text | None = None,
    cost_source: Text | None = None,
    pricing_version: Text | None = None,
    billing_provider: Text | None = None,
    billing_base_url: Text | None = None,
    billing_mode: Text | None = None,
    api_call_count: int = 0,
    absolute: bool = False,
    task: Text | None = None,
) -> None:
    """Add to (or, with ``absolute=True``, set) the session totals and the matching
    ``session_model_usage`` row (session × model × billing route × task), in the caller's
    transaction. ``model`` fills the session's model only while it is NULL.

    The session's billing route is the one requested (``create_session``,
    ``update_session_billing_route``) until usage is first accounted: the route of the first
    update that counts tokens or calls replaces it, its three fields at once. After that a
    fallback route (a later update's) is kept on its usage row only, and an update that
    counts nothing never changes the session's route. A usage row without a route of its own
    takes the session's, and without a model the session's model."""
    counts = (input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
              reasoning_tokens, api_call_count)
    tokens = {f: _check_count(f, n) for f, n in zip(TOKEN_FIELDS, counts, strict=True)}
    costs = {f: _check_cost(f, c) for f, c in zip(
        COST_FIELDS, (estimated_cost_usd, actual_cost_usd), strict=True)}
    labels = _given(LABEL_FIELDS, (cost_status, cost_source, pricing_version))
    route = _given(ROUTE_FIELDS, (billing_provider, billing_base_url, billing_mode))
    row = conn.execute(SESSION_ROUTE_SQL, (session_id,)).fetchone()
    if row is None:
        raise SessionNotFoundError(session_id)
    session_model, *session_route, accounted = row
    if route and any(tokens.values()) and not accounted:
        route = {f: route.get(f) for f in ROUTE_FIELDS}  # the first accounted: all three
        labels.update(route)
    _add_to_session(conn, session_id, tokens, costs, labels, model, absolute=absolute)
    usage_route = {**dict(zip(ROUTE_FIELDS, session_route, strict=True)), **route}
    usage_key = (session_model if model is None else model, *usage_route.values(), task)
    _add_to_usage(conn, session_id, usage_key, tokens, costs, absolute=absolute)


def _given(fields: tuple[str, ...], values: tuple[Any, ...]) -> dict[str, Any]:
    """The fields given a value (not None)."""
    return {f: v for f, v in zip(fields, values, strict=True) if v is not None}


def _add_to_session(
    conn: sqlite3.Connection,
    session_id: str,
    tokens: dict[str, int],
    costs: dict[str, float | None],
    labels: dict[str, Any],
    model: str | None,
    *,
    absolute: bool,
) -> None:
    """Add the figures to the session's totals (``absolute``: set them; a cost not given stays
    as it is), set the given labels, and the model while the session has none."""
    sets = [f"{f} = ?" if absolute else f"{f} = {f} + ?" for f in TOKEN_FIELDS]
    params: list[Any] = list(tokens.values())
    for f, value in costs.items():
        if value is not None:
            sets.append(f"{f} = ?" if absolute else f"{f} = COALESCE({f}, 0) + ?")
            params.append(value)
    for f, label in labels.items():
        sets.append(f"{f} = ?")
        params.append(clean_optional(label))
    if model is not None:
        sets.append("model = COALESCE(model, ?)")
        params.append(clean_optional(model))
    conn.execute(f"UPDATE sessions SET {', '.join(sets)} WHERE id = ?", (*params, session_id))


def _add_to_usage(
    conn: sqlite3.Connection,
    session_id: str,
    key: tuple[Any, ...],
    tokens: dict[str, int],
    costs: dict[str, float | None],
    *,
    absolute: bool,
) -> None:
    """Add the figures to (``absolute``: set them on) the usage row of ``key``: (model, the
    three route fields, task), each None stored as ''."""
    stamp = now()
    conn.execute(
        _usage_sql(absolute),
        (session_id, *(clean_optional(v) or "" for v in key), *tokens.values(),
         *costs.values(), stamp, stamp),
    )


def get_model_usage(conn: sqlite3.Connection, /, session_id: str) -> list[dict[str, Any]]:
    cursor = conn.execute(
        "SELECT * FROM session_model_usage WHERE session_id = ?"
        " ORDER BY first_used_at, model, task",
        (session_id,),
    )
    return [row_to_dict(cursor, r) for r in cursor.fetchall()]


# --- filters shared with listing and pruning ------------------------------------------------


def source_filters(
    source: str | None, exclude_sources: Iterable[str] | None, *, alias: str = "s"
) -> tuple[str, list[Any]]:
    """SQL conditions for a source and an excluded-sources list of any length.

    The list travels as one JSON parameter (``json_each``), so its length never meets
    SQLite's bound-parameter limit and nothing is formatted into SQL text.
    """
    sql, params = "", []
    if source is not None:
        sql += f" AND {alias}.source = ?"
        params.append(source)
    excluded = filter_texts("exclude_sources", exclude_sources) or []
    if excluded:
        sql += f" AND {alias}.source NOT IN (SELECT value FROM json_each(?))"
        params.append(json.dumps(excluded))
    return sql, params


def message_count(conn: sqlite3.Connection, /, session_id: str | None = None) -> int:
    """Active messages of one session, or of the whole store."""
    if session_id is None:
        return int(conn.execute("SELECT COUNT(*) FROM messages WHERE active = 1").fetchone()[0])
    return int(
        conn.execute(
            "SELECT COUNT(*) FROM messages WHERE session_id = ? AND active = 1", (session_id,)
        ).fetchone()[0]
    )


# --- statistics ------------------------------------------------------------------------------

# The seed's example queries: totals by model, the sessions with the highest token usage.
STATS_BY_MODEL_SQL = """
SELECT model,
       COUNT(*) AS session_count,
       COALESCE(SUM(input_tokens), 0) AS total_input,
       COALESCE(SUM(output_tokens), 0) AS total_output,
       SUM(estimated_cost_usd) AS total_cost
FROM sessions
WHERE model IS NOT NULL
GROUP BY model
ORDER BY total_cost DESC, model
"""
STATS_TOP_SESSIONS_SQL = """
SELECT id, title, model, input_tokens + output_tokens AS total_tokens, estimated_cost_usd
FROM sessions
ORDER BY total_tokens DESC, id
LIMIT ?
"""
STATS_BY_SOURCE_SQL = """
SELECT s.source, COUNT(*) AS sessions,
       COALESCE(SUM(s.message_count), 0) AS messages,
       COALESCE(SUM(s.input_tokens), 0) AS input_tokens,
       COALESCE(SUM(s.output_tokens), 0) AS output_tokens,
       SUM(s.estimated_cost_usd) AS estimated_cost_usd
FROM sessions s
GROUP BY s.source
ORDER BY sessions DESC, s.source
"""
STATS_TOTALS_SQL = """
SELECT COUNT(*),
       COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0),
       COALESCE(SUM(cache_read_tokens), 0), COALESCE(SUM(cache_write_tokens), 0),
       COALESCE(SUM(reasoning_tokens), 0), SUM(estimated_cost_usd), SUM(actual_cost_usd)
FROM sessions
"""


def stats(conn: sqlite3.Connection, /, top: int = 10) -> dict[str, Any]:
    """Store-wide statistics: totals, sessions and messages by source, tokens and cost by
    model, and the ``top`` sessions by tokens. A plain read (works on read-only handles)."""
    (
        sessions, input_tokens, output_tokens, cache_read, cache_write, reasoning,
        estimated, actual,
    ) = conn.execute(STATS_TOTALS_SQL).fetchone()
    messages, active = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(active), 0) FROM messages"
    ).fetchone()

    def rows(sql: str, *params: Any) -> list[dict[str, Any]]:
        cursor = conn.execute(sql, params)
        return [row_to_dict(cursor, r) for r in cursor.fetchall()]

    return {
        "sessions": sessions,
        "messages": active,
        "messages_including_archived": messages,
        "tokens": {
            "input": input_tokens,
            "output": output_tokens,
            "cache_read": cache_read,
            "cache_write": cache_write,
            "reasoning": reasoning,
        },
        "estimated_cost_usd": estimated,
        "actual_cost_usd": actual,
        "by_source": rows(STATS_BY_SOURCE_SQL),
        "by_model": rows(STATS_BY_MODEL_SQL),
        "top_sessions": rows(STATS_TOP_SESSIONS_SQL, top),
    }


# --- titles ----------------------------------------------------------------------------------

TITLE_MAX_CHARS = 100
# Zero-width characters, bidi embeddings/overrides/isolates and marks, and the BOM.
_INVISIBLE = frozenset(
    "\u200b\u200c\u200d\u2060\ufeff\u200e\u200f\u061c"
    "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
_TITLE_SUFFIX_RE = re.compile(r"^(.*?) #(\d+)$")


def sanitize_title(title: Text | None) -> str | None:
    """Strip, collapse whitespace, drop control/DEL/zero-width/bidi/BOM characters.

    Empty → None; longer than 100 characters → :class:`InvalidInputError` (a ValueError)
    whose text says ``too long``, the length and the maximum.
    """
    if title is None:
        return None
    if not isinstance(title, str):
        raise InvalidTypeError(f"title must be a string, got {type(title).__name__}")
    kept = []
    for ch in clean_optional(title) or "":
        if ch.isspace():
            kept.append(" ")
        elif ch in _INVISIBLE or unicodedata.category(ch) == "Cc":
            continue
        else:
            kept.append(ch)
    cleaned = " ".join("".join(kept).split())
    if not cleaned:
        return None
    if len(cleaned) > TITLE_MAX_CHARS:
        raise InvalidInputError(
            f"title too long: {len(cleaned)} characters (maximum {TITLE_MAX_CHARS})"
        )
    return cleaned


CLEAR_TITLE_SQL = "UPDATE sessions SET title = NULL WHERE id = ?"


def _title_holder(conn: sqlite3.Connection, /, session_id: str, title: str) -> str | None:
    """The other session that holds ``title``, if any."""
    owner = conn.execute("SELECT id FROM sessions WHERE title = ?", (title,)).fetchone()
    return None if owner is None or owner[0] == session_id else str(owner[0])


def _title_taken(title: str, holder: str) -> TitleConflictError:
    return TitleConflictError(f"title {title!r} is already in use by session {holder}")


def _check_title_free(conn: sqlite3.Connection, /, session_id: str, title: str) -> None:
    holder = _title_holder(conn, session_id, title)
    if holder is not None:
        raise _title_taken(title, holder)


def set_session_title(conn: sqlite3.Connection, /, session_id: str, title: Text | None) -> bool:
    """Set (or, with an empty title, clear) the title; False when there is no such session.
    Titles are unique: another session's title raises :class:`TitleConflictError`, except
    that a title held by one of the session's compression ancestors moves to the session (a
    continuation carries its conversation's name)."""
    cleaned = sanitize_title(title)
    if cleaned is not None:
        holder = _title_holder(conn, session_id, cleaned)
        if holder is not None:
            if holder not in compression_ancestors(conn, session_id)[1:]:
                raise _title_taken(cleaned, holder)
            conn.execute(CLEAR_TITLE_SQL, (holder,))
    cursor = conn.execute("UPDATE sessions SET title = ? WHERE id = ?", (cleaned, session_id))
    return cursor.rowcount > 0


def set_auto_title_if_empty(conn: sqlite3.Connection, /, session_id: str, title: Text) -> bool:
    """Set a generated title only while the session has none, in the same transaction as the
    check (a rename made meanwhile is never overwritten); False when the session has a title
    or does not exist. Otherwise as :func:`set_session_title`."""
    row = conn.execute("SELECT title FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None or row[0] is not None:
        return False
    return set_session_title(conn, session_id, title)


def _lineage_titles(conn: sqlite3.Connection, /, base: str) -> list[tuple[str, str, float]]:
    """(id, title, started_at) of sessions titled ``base`` or ``base #N``."""
    rows = conn.execute(
        "SELECT id, title, started_at FROM sessions"
        " WHERE title = ? OR title LIKE ? ESCAPE '\\'",
        (base, escape_like(base) + " #%"),
    ).fetchall()
    out = []
    for session_id, title, started_at in rows:
        match = _TITLE_SUFFIX_RE.match(title)
        if title == base or (match and match.group(1) == base):
            out.append((session_id, title, started_at))
    return out


def get_session_title(conn: sqlite3.Connection, /, session_id: str) -> str | None:
    row = conn.execute("SELECT title FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return None if row is None else row[0]


def get_session_by_title(conn: sqlite3.Connection, /, title: Text) -> dict[str, Any] | None:
    cleaned = sanitize_title(title)
    if cleaned is None:
        return None
    row = conn.execute("SELECT id FROM sessions WHERE title = ?", (cleaned,)).fetchone()
    return None if row is None else get_session(conn, row[0])


def resolve_session_by_title(conn: sqlite3.Connection, /, title: Text) -> str | None:
    """The most recent session of the title's lineage (``T``, ``T #2``, ``T #3``…)."""
    cleaned = sanitize_title(title)
    if cleaned is None:
        return None
    candidates = _lineage_titles(conn, cleaned)
    if not candidates:
        return None
    return max(candidates, key=lambda c: (c[2], c[0]))[0]


def get_next_title_in_lineage(conn: sqlite3.Connection, /, title: Text) -> str:
    """``T`` → ``T #2`` (or the next free number); an existing ``#N`` suffix is stripped."""
    cleaned = sanitize_title(title) or ""
    match = _TITLE_SUFFIX_RE.match(cleaned)
    base = match.group(1) if match else cleaned
    existing = _lineage_titles(conn, base)
    if not existing:
        return base
    highest = 1
    for _, t, _ in existing:
        m = _TITLE_SUFFIX_RE.match(t)
        if m and m.group(1) == base:
            highest = max(highest, int(m.group(2)))
    return f"{base} #{highest + 1}"


# --- clearing --------------------------------------------------------------------------------


def clear_messages(conn: sqlite3.Connection, /, session_id: str) -> None:
    """Delete every message of the session (all generations); the row stays, both counters
    zeroed. An unknown session raises :class:`SessionNotFoundError`."""
    require_session(conn, session_id)
    conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
    conn.execute(
        "UPDATE sessions SET message_count = 0, tool_call_count = 0 WHERE id = ?", (session_id,)
    )


# --- archiving -------------------------------------------------------------------------------

SET_ARCHIVED_SQL = """
UPDATE sessions SET archived = ?, auto_archived = 0
WHERE id IN (SELECT value FROM json_each(?))
"""


def set_session_archived(conn: sqlite3.Connection, /, session_id: str, archived: bool) -> bool:
    """Archive (deliberately) or unarchive the session's conversation: the session, its
    ancestors through compression-ended parents and its descendants below compression-ended
    sessions (``hermes_state_lineage.conversation_members``). True when a row was written;
    False for an unknown session.

    Archiving sets ``archived=1`` and clears ``auto_archived``, so resuming or compressing
    never lifts it; unarchiving clears both.
    """
    if not isinstance(archived, bool):
        raise InvalidTypeError(f"archived must be a bool, got {type(archived).__name__}")
    members = conversation_members(conn, session_id)
    return conn.execute(SET_ARCHIVED_SQL, (int(archived), json.dumps(sorted(members)))).rowcount > 0


IS_AUTO_ARCHIVED_SQL = "SELECT 1 FROM sessions WHERE id = ? AND auto_archived = 1"
LIFT_AUTO_ARCHIVE_SQL = """
UPDATE sessions SET archived = 0, auto_archived = 0
WHERE auto_archived = 1 AND id IN (SELECT value FROM json_each(?))
"""


def lift_auto_archive(conn: sqlite3.Connection, /, session_id: str, *, check: bool = False) -> int:
    """Lift the idle clean-up's archive from the session's conversation (a deliberate archive
    stays); returns how many sessions changed. ``check`` first looks at the session's own flag
    and does nothing when it is clear (the cheap path for every appended user turn)."""
    if check and conn.execute(IS_AUTO_ARCHIVED_SQL, (session_id,)).fetchone() is None:
        return 0
    members = conversation_members(conn, session_id)
    return conn.execute(LIFT_AUTO_ARCHIVE_SQL, (json.dumps(sorted(members)),)).rowcount


# Sessions whose last activity (latest message, else start) is before the cutoff.
IDLE_SESSIONS_SQL = """
SELECT s.id, COALESCE(s.archived, 0), COALESCE(s.pinned, 0) FROM sessions s
WHERE COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = s.id),
               s.started_at) < ?
  {filters}
"""
AUTO_ARCHIVE_SQL = """
UPDATE sessions SET archived = 1, auto_archived = 1
WHERE COALESCE(archived, 0) = 0 AND id IN (SELECT value FROM json_each(?))
"""


# Work that is not finished (or whose fate is unknown) pins a session. Both ledgers are held
# to the live states of either, so a status one of them borrows from the other still pins.
PINNING_STATUSES_SQL = sql_values(
    tuple(dict.fromkeys(LIVE_ADMISSION_STATUSES + LIVE_EXECUTION_STATUSES))
)
_PINNING = PINNING_STATUSES_SQL
LIVE_LEDGER_SQL = f"""
SELECT
    (SELECT COUNT(*) FROM session_admissions WHERE session_id = :id AND status IN {_PINNING}),
    (SELECT COUNT(*) FROM worker_executions WHERE session_id = :id AND status IN {_PINNING})
"""


def _has_live_work(conn: sqlite3.Connection, /, session_id: str) -> bool:
    admissions, executions = conn.execute(LIVE_LEDGER_SQL, {"id": session_id}).fetchone()
    return bool(admissions or executions)


def auto_archive_idle_sessions(
    conn: sqlite3.Connection, /, idle_days: float, *, source: str | None = None
) -> int:
    """The idle clean-up: archive (``archived=1``, ``auto_archived=1``) conversations idle for
    more than ``idle_days``; returns how many sessions it archived.

    A conversation (its members, see ``hermes_state_lineage``) is archived only as a whole,
    when every session of it — all of ``source``, when given — is idle (latest message, else
    ``started_at``, before the cutoff), none is pinned and none has live work in its ledgers
    (queued, started or unknown admissions; registered, running or unknown executions).
    Sessions already archived keep the archive they have, so a deliberate one stays
    deliberate.
    """
    if isinstance(idle_days, bool) or not isinstance(idle_days, (int, float)):
        raise InvalidTypeError(f"idle_days must be a number, got {type(idle_days).__name__}")
    if not math.isfinite(idle_days) or idle_days < 0:
        raise InvalidInputError(f"idle_days must be finite and not negative, got {idle_days!r}")
    cutoff = now() - idle_days * 86400.0
    filters, params = source_filters(source, None)
    idle = {
        r[0]: (bool(r[1]), bool(r[2]))
        for r in conn.execute(IDLE_SESSIONS_SQL.format(filters=filters), (cutoff, *params))
    }
    seen: set[str] = set()
    archived = 0
    for session_id in sorted(idle):
        if session_id in seen:
            continue
        members = conversation_members(conn, session_id)
        seen |= members
        if _archivable(conn, members, idle):
            archived += conn.execute(AUTO_ARCHIVE_SQL, (json.dumps(sorted(members)),)).rowcount
    return archived


def _archivable(
    conn: sqlite3.Connection, members: set[str], idle: Mapping[str, tuple[bool, bool]]
) -> bool:
    """A conversation the idle clean-up archives: every member idle (``idle``: archived,
    pinned, of each idle session), not all archived already, none pinned, no live work."""
    if not members <= idle.keys():
        return False  # part of the conversation is still active
    if all(idle[m][0] for m in members) or any(idle[m][1] for m in members):
        return False  # already archived, or pinned
    return not any(_has_live_work(conn, m) for m in members)
