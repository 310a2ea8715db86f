"""Rewind (``/undo``, ``/rewind``): taking the latest user turns back out of a live transcript,
and putting them back.

A rewind deletes nothing: it marks rows ``active = 0, compacted = 0``, which
:func:`restore_rewound` makes live again. Compaction archives are ``compacted = 1``. Older
stores archived with ``compacted = 0``, so a session's first rewind re-marks those first.
Neither step moves the session's counters, as callers expect."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from hermes_state_common import row_to_dict
from hermes_state_errors import InvalidInputError
from hermes_state_messages import SELECT_MESSAGES_SQL, decode_content
from hermes_state_sessions import require_session

__all__ = [
    "PREVIEW_CHARS",
    "MULTIMODAL_PREVIEW",
    "list_recent_user_messages",
    "message_preview",
    "rewind_to_message",
    "restore_rewound",
]

#: The longest preview; a longer text is cut to three characters less, plus ``...``.
PREVIEW_CHARS = 80
#: The preview of structured content that has no text part.
MULTIMODAL_PREVIEW = "[multimodal content]"


def _message_id(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be a message id (int), got {type(value).__name__}")
    return value


def _text_parts(content: Any) -> list[str] | None:
    """The text parts of structured content (None: it is not structured)."""
    if isinstance(content, Mapping):
        content = [content]
    if not isinstance(content, list):
        return None
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            parts.append(part["text"])
    return parts


def message_preview(content: Any) -> str:
    """One line of a message's content: text, or the text parts of structured content joined by
    spaces (:data:`MULTIMODAL_PREVIEW` when it has none), whitespace runs collapsed, cut to
    :data:`PREVIEW_CHARS`."""
    content = decode_content(content)
    parts = _text_parts(content)
    if parts is None:
        text = content if isinstance(content, str) else ""
    else:
        text = " ".join(parts) if parts else MULTIMODAL_PREVIEW
    text = " ".join(text.split())
    if len(text) > PREVIEW_CHARS:
        text = text[: PREVIEW_CHARS - 3] + "..."
    return text


# A session's user turns, newest first; with the second parameter true, rewound and archived
# ones too.
RECENT_USER_MESSAGES_SQL = """
SELECT id, timestamp, content FROM messages
WHERE session_id = ? AND role = 'user' AND (active = 1 OR ?)
ORDER BY id DESC LIMIT ?
"""


def list_recent_user_messages(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    limit: int = 20,
    include_inactive: bool = False,
) -> list[dict[str, Any]]:
    """The session's latest user turns, newest first (id descending), live ones only unless
    ``include_inactive``: ``[{"id", "timestamp", "preview"}]`` (see :func:`message_preview`).
    An unknown session, or a ``limit`` of 0 or less, gives ``[]``."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidInputError(f"limit must be an int, got {type(limit).__name__}")
    if limit <= 0:
        return []
    rows = conn.execute(RECENT_USER_MESSAGES_SQL, (session_id, int(bool(include_inactive)), limit))
    return [
        {"id": row_id, "timestamp": timestamp, "preview": message_preview(content)}
        for row_id, timestamp, content in rows
    ]


# The rewind target, a full row, only as a message of that session.
TARGET_MESSAGE_SQL = SELECT_MESSAGES_SQL + " WHERE id = ? AND session_id = ?"
# How many rewinds the session has had (NULL in an older row: none).
REWIND_COUNT_SQL = "SELECT COALESCE(rewind_count, 0) FROM sessions WHERE id = ?"
# The first rewind of a session: inactive rows written before compaction marked its archives
# are archives (no rewind preceded it), so they are marked as such.
MARK_LEGACY_ARCHIVE_SQL = """
UPDATE messages SET compacted = 1
WHERE session_id = ? AND active = 0 AND COALESCE(compacted, 0) = 0
"""
# The rewind itself: the live rows from the target on become rewound.
REWIND_ROWS_SQL = """
UPDATE messages SET active = 0, compacted = 0
WHERE session_id = ? AND id >= ? AND active = 1
"""
# Every rewind counts, whether or not it changed a row.
COUNT_REWIND_SQL = "UPDATE sessions SET rewind_count = COALESCE(rewind_count, 0) + 1 WHERE id = ?"
# The newest row still live after the rewind.
NEW_HEAD_SQL = "SELECT MAX(id) FROM messages WHERE session_id = ? AND active = 1"


def rewind_to_message(
    conn: sqlite3.Connection, /, session_id: str, target_message_id: int
) -> dict[str, Any]:
    """Take the live transcript back to just before a user turn (the caller's transaction).

    Every still-live row of the session with an id at or above ``target_message_id`` becomes
    rewound (``active = 0, compacted = 0``; see the module docstring) and ``rewind_count``
    grows by one, even when no row changed. Returns ``{"rewound_count", "target_message",
    "new_head_id"}``: how many rows were rewound, the target row as read before the change
    (``content`` decoded, ``tool_calls`` left as its stored JSON text) and the highest id still
    live (None when none is). :class:`InvalidInputError` (a ``ValueError``) when the id is not
    a message of that session (an unknown session included) or its role is not ``user``."""
    target_id = _message_id(target_message_id, "target_message_id")
    cursor = conn.execute(TARGET_MESSAGE_SQL, (target_id, session_id))
    row = cursor.fetchone()
    if row is None:
        raise InvalidInputError(f"message {target_id} is not a message of session {session_id!r}")
    target = row_to_dict(cursor, row)
    if target["role"] != "user":
        raise InvalidInputError(
            f"message {target_id} is a {target['role']!r} message; only a user turn is a "
            f"rewind target"
        )
    target["content"] = decode_content(target["content"])
    if conn.execute(REWIND_COUNT_SQL, (session_id,)).fetchone()[0] == 0:
        conn.execute(MARK_LEGACY_ARCHIVE_SQL, (session_id,))
    rewound = conn.execute(REWIND_ROWS_SQL, (session_id, target_id)).rowcount
    conn.execute(COUNT_REWIND_SQL, (session_id,))
    new_head = conn.execute(NEW_HEAD_SQL, (session_id,)).fetchone()[0]
    return {"rewound_count": rewound, "target_message": target, "new_head_id": new_head}


# Inactive rows from an id on become live again (a restored archive is live, not compacted).
RESTORE_ROWS_SQL = """
UPDATE messages SET active = 1, compacted = 0
WHERE session_id = ? AND id >= ? AND active = 0
"""


def restore_rewound(conn: sqlite3.Connection, /, session_id: str, since_message_id: int) -> int:
    """Make the session's inactive rows with an id at or above ``since_message_id`` live again
    — rewound rows, and compaction-archived ones too (the caller's transaction). Returns how
    many; an unknown session raises :class:`SessionNotFoundError`."""
    since = _message_id(since_message_id, "since_message_id")
    require_session(conn, session_id)
    return conn.execute(RESTORE_ROWS_SQL, (session_id, since)).rowcount
