"""Gateway routing lookups: which session a messaging peer is talking to.

Platforms compare case-insensitively; ids compare as ``str(value)``. A key's current row is its
newest. :func:`record_gateway_session_peer` never writes ``user_id``: the principal is fixed
when the row is born."""

from __future__ import annotations

import sqlite3
from typing import Any

from hermes_state_common import Text, clean_text, row_to_dict, stored_text
from hermes_state_errors import InvalidInputError

__all__ = [
    "list_gateway_sessions",
    "find_session_by_origin",
    "find_latest_gateway_session_for_peer",
    "record_gateway_session_peer",
    "set_expiry_finalized",
]

# A row's last activity: its newest message, else its start.
_LAST_ACTIVE = """COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = k.id),
             k.started_at)"""

# The current row of every key (of one platform when the first two parameters name one),
# live ones only when the third is 1.
GATEWAY_SESSIONS_SQL = f"""
WITH keyed AS (
    SELECT s.*, ROW_NUMBER() OVER (
        PARTITION BY s.session_key ORDER BY s.started_at DESC, s.id DESC) AS _rank
    FROM sessions s
    WHERE s.session_key IS NOT NULL AND s.session_key <> ''
      AND (? IS NULL OR LOWER(s.source) = LOWER(?))
)
SELECT k.*, {_LAST_ACTIVE} AS last_active
FROM keyed k
WHERE k._rank = 1 AND (? = 0 OR k.ended_at IS NULL)
ORDER BY last_active DESC, k.started_at DESC, k.id DESC
"""


def _written(name: str, value: object) -> str | None:
    """A routing value about to be stored: ``str(value)``, None as NULL; a value no column can
    hold (a lone surrogate) is refused."""
    if value is None:
        return None
    text = stored_text(value)
    if text is None:
        raise InvalidInputError(f"{name} cannot be stored: {value!r}")
    return text


def list_gateway_sessions(
    conn: sqlite3.Connection, /, *, platform: str | None = None, active_only: bool = True
) -> list[dict[str, Any]]:
    """The current row of every session key, with ``last_active``, most recently active
    first; of one platform when ``platform`` is given."""
    wanted = None if platform is None else clean_text(str(platform))
    cursor = conn.execute(GATEWAY_SESSIONS_SQL, (wanted, wanted, 1 if active_only else 0))
    rows = [row_to_dict(cursor, r) for r in cursor.fetchall()]
    for row in rows:
        del row["_rank"]
    return rows


ORIGIN_CANDIDATES_SQL = """
SELECT id, user_id FROM sessions
WHERE ended_at IS NULL AND session_key IS NOT NULL AND session_key <> ''
  AND LOWER(source) = LOWER(?) AND chat_id = ?
  AND (? IS NULL OR COALESCE(thread_id, '') = ?)
ORDER BY started_at DESC, id DESC
"""


def find_session_by_origin(
    conn: sqlite3.Connection,
    /,
    *,
    platform: str,
    chat_id: str,
    thread_id: str | None = None,
    user_id: str | None = None,
) -> str | None:
    """The live gateway session of a chat (and thread, when given), or None when it cannot be
    told apart: with ``user_id``, the newest one of that sender, else the only candidate;
    without, the newest, unless the candidates belong to more than one sender."""
    if not platform or chat_id is None or chat_id == "":
        return None
    chat = stored_text(chat_id)
    thread = None if thread_id is None else stored_text(thread_id)
    if chat is None or (thread_id is not None and thread is None):
        return None
    rows = conn.execute(ORIGIN_CANDIDATES_SQL, (str(platform), chat, thread, thread)).fetchall()
    return _origin_choice(rows, user_id)


def _origin_choice(rows: list[tuple[Any, Any]], user_id: str | None) -> str | None:
    """The session among the candidate ``rows`` (id, sender; newest first) that the origin
    names, as :func:`find_session_by_origin` says."""
    if user_id is not None:
        sender = str(user_id)
        for session_id, row_user in rows:
            if row_user == sender:
                return str(session_id)
        return str(rows[0][0]) if len(rows) == 1 else None
    senders = {u for _, u in rows if u}
    return str(rows[0][0]) if rows and len(senders) <= 1 else None


_RECOVERABLE = """
    (s.ended_at IS NULL OR s.end_reason IN ('agent_close', 'ws_orphan_reap'))
    AND (s.message_count > 0 OR EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id))"""

PEER_BY_KEY_SQL = f"""
SELECT s.* FROM sessions s
WHERE s.session_key = ? AND s.source = ? AND {_RECOVERABLE}
ORDER BY s.started_at DESC, s.id DESC LIMIT 1
"""
PEER_BY_ORIGIN_SQL = f"""
SELECT s.* FROM sessions s
WHERE s.source = ? AND COALESCE(s.user_id, '') = ? AND COALESCE(s.chat_id, '') = ?
  AND COALESCE(s.chat_type, '') = ? AND COALESCE(s.thread_id, '') = ? AND {_RECOVERABLE}
ORDER BY s.started_at DESC, s.id DESC LIMIT 1
"""


def find_latest_gateway_session_for_peer(
    conn: sqlite3.Connection,
    /,
    *,
    source: str,
    user_id: str | None = None,
    session_key: str | None = None,
    chat_id: str | None = None,
    chat_type: str | None = None,
    thread_id: str | None = None,
) -> dict[str, Any] | None:
    """The newest recoverable session of the key (and platform); failing that, when chat and
    chat type are both given, the newest recoverable one of the same peer. None without a
    key."""
    if not session_key:
        return None
    searches: list[tuple[str, tuple[str | None, ...]]] = [
        (PEER_BY_KEY_SQL, (stored_text(session_key), stored_text(source)))
    ]
    if chat_id and chat_type:
        peer = tuple("" if v is None else stored_text(v)
                     for v in (user_id, chat_id, chat_type, thread_id))
        searches.append((PEER_BY_ORIGIN_SQL, (stored_text(source), *peer)))
    for sql, params in searches:
        if any(p is None for p in params):
            continue
        cursor = conn.execute(sql, params)
        row = cursor.fetchone()
        if row is not None:
            return row_to_dict(cursor, row)
    return None


RECORD_PEER_SQL = """
UPDATE sessions SET session_key = ?, source = ?, chat_id = ?, chat_type = ?, thread_id = ?,
    display_name = COALESCE(?, display_name), origin_json = COALESCE(?, origin_json)
WHERE id = ?
"""


def record_gateway_session_peer(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    *,
    source: str,
    user_id: str | None = None,
    session_key: str | None = None,
    chat_id: str | None = None,
    chat_type: str | None = None,
    thread_id: str | None = None,
    display_name: Text | None = None,
    origin_json: Text | None = None,
) -> None:
    """Point the session at this peer: key, platform, chat, chat type and thread are
    overwritten (None included), display name and origin only when given; ``user_id`` stays
    (see the module docstring). Nothing happens without an id or a key, or for an unknown id."""
    if not session_id or not session_key:
        return
    platform = _written("source", source)
    if not platform:
        raise InvalidInputError(f"source must be a platform name, got {source!r}")
    if origin_json is not None and not isinstance(origin_json, str):
        raise InvalidInputError(f"origin_json must be JSON text, got {type(origin_json).__name__}")
    values = [_written(name, value) for name, value in (
        ("session_key", session_key), ("chat_id", chat_id), ("chat_type", chat_type),
        ("thread_id", thread_id), ("display_name", display_name), ("origin_json", origin_json))]
    key = stored_text(session_id)
    if key is not None:
        conn.execute(RECORD_PEER_SQL, (values[0], platform, *values[1:], key))


SET_EXPIRY_FINALIZED_SQL = "UPDATE sessions SET expiry_finalized = ? WHERE id = ?"


def set_expiry_finalized(
    conn: sqlite3.Connection, /, session_id: str, finalized: bool = True
) -> None:
    """Record whether the gateway has finalized the session's expiry; nothing for an empty
    or unknown id."""
    key = stored_text(session_id) if session_id else None
    if key is not None:
        conn.execute(SET_EXPIRY_FINALIZED_SQL, (1 if finalized else 0, key))
