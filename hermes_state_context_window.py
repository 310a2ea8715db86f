"""Context windows: the rows around one message, for a search hit shown in its conversation.

:func:`get_messages_around` returns up to ``window`` rows each side of an anchor.
:func:`get_anchored_view` adds *bookends*, the first and last substantial rows of the session,
so a hit shows how the session began and ended. Both read rewound and archived rows too, since
a search may hit them. An anchor outside the session gives an empty result."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

from hermes_state_errors import InvalidInputError
from hermes_state_messages import SELECT_MESSAGES_SQL, hydrated_message

__all__ = ["DEFAULT_KEEP_ROLES", "get_messages_around", "get_anchored_view"]

#: The roles :func:`get_anchored_view` keeps by default: the conversation, not its tool output.
DEFAULT_KEEP_ROLES: tuple[str, ...] = ("user", "assistant")

# The anchor, a full row, only as a message of that session.
ANCHOR_SQL = SELECT_MESSAGES_SQL + " WHERE id = ? AND session_id = ?"
# The rows just before and just after an id (the nearest first).
BEFORE_SQL = SELECT_MESSAGES_SQL + " WHERE session_id = ? AND id < ? ORDER BY id DESC LIMIT ?"
AFTER_SQL = SELECT_MESSAGES_SQL + " WHERE session_id = ? AND id > ? ORDER BY id LIMIT ?"
# Bookends: rows with content below (above) an id, of the roles in the JSON array :roles (any
# role when it is NULL); the first ones of the session (the last ones, newest first).
_BOOKEND_FILTER = """
WHERE session_id = :session_id AND content <> ''
  AND (:roles IS NULL OR role IN (SELECT value FROM json_each(:roles)))
"""
BOOKEND_START_SQL = SELECT_MESSAGES_SQL + _BOOKEND_FILTER + "AND id < :edge ORDER BY id LIMIT :n"
BOOKEND_END_SQL = (
    SELECT_MESSAGES_SQL + _BOOKEND_FILTER + "AND id > :edge ORDER BY id DESC LIMIT :n"
)


def _count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an int, got {type(value).__name__}")
    return max(value, 0)


def _anchor_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(
            f"around_message_id must be a message id (int), got {type(value).__name__}"
        )
    return value


def _roles(keep_roles: Iterable[str] | None) -> tuple[str, ...] | None:
    if keep_roles is None:
        return None
    if isinstance(keep_roles, str) or not isinstance(keep_roles, Iterable):
        raise InvalidInputError("keep_roles must be a tuple of role names or None")
    roles = tuple(keep_roles)
    if not all(isinstance(role, str) for role in roles):
        raise InvalidInputError("keep_roles must hold role names (strings)")
    return roles


def _slice(
    conn: sqlite3.Connection, session_id: str, anchor: int, window: int
) -> tuple[list[dict[str, Any]], int, int] | None:
    """(rows in id order, rows found before, rows found after); None: no such anchor."""
    anchor_row = conn.execute(ANCHOR_SQL, (anchor, session_id)).fetchone()
    if anchor_row is None:
        return None
    before = conn.execute(BEFORE_SQL, (session_id, anchor, window)).fetchall()
    after = conn.execute(AFTER_SQL, (session_id, anchor, window)).fetchall()
    rows = [hydrated_message(r) for r in (*reversed(before), anchor_row, *after)]
    return rows, len(before), len(after)


def get_messages_around(
    conn: sqlite3.Connection, /, session_id: str, around_message_id: int, window: int = 5
) -> dict[str, Any]:
    """``{"window": [rows], "messages_before": int, "messages_after": int}``: the anchor with up
    to ``window`` rows on each side (see the module docstring)."""
    found = _slice(conn, session_id, _anchor_id(around_message_id), _count(window, "window"))
    if found is None:
        return {"window": [], "messages_before": 0, "messages_after": 0}
    rows, before, after = found
    return {"window": rows, "messages_before": before, "messages_after": after}


def get_anchored_view(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    around_message_id: int,
    window: int = 5,
    bookend: int = 3,
    keep_roles: tuple[str, ...] | None = DEFAULT_KEEP_ROLES,
) -> dict[str, Any]:
    """:func:`get_messages_around` cut down to ``keep_roles`` (the anchor always stays; the two
    counts are those of the whole slice), with ``bookend_start`` — the session's first
    ``bookend`` rows below the slice whose role is kept and whose content is not empty — and
    ``bookend_end``, its last such rows above the slice, both in id order. A bookend is empty
    when the slice reaches that end of the session. ``keep_roles=None`` keeps every role (the
    bookends still skip empty content)."""
    anchor = _anchor_id(around_message_id)
    span, ends, roles = _count(window, "window"), _count(bookend, "bookend"), _roles(keep_roles)
    found = _slice(conn, session_id, anchor, span)
    if found is None:
        return {"window": [], "messages_before": 0, "messages_after": 0,
                "bookend_start": [], "bookend_end": []}
    rows, before, after = found
    kept = [r for r in rows if r["id"] == anchor or roles is None or r["role"] in roles]
    params = {"session_id": session_id, "n": ends,
              "roles": None if roles is None else json.dumps(list(roles))}
    start = conn.execute(BOOKEND_START_SQL, {**params, "edge": rows[0]["id"]}).fetchall()
    end = conn.execute(BOOKEND_END_SQL, {**params, "edge": rows[-1]["id"]}).fetchall()
    return {
        "window": kept,
        "messages_before": before,
        "messages_after": after,
        "bookend_start": [hydrated_message(r) for r in start],
        "bookend_end": [hydrated_message(r) for r in reversed(end)],
    }
