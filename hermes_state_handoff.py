"""Cross-platform handoff: moving a live session from the CLI or TUI to a messaging platform.

The state lives on the session row::

    NULL ──request──▶ pending ──claim──▶ running ──complete──▶ completed
      ▲                                     └──────fail───────▶ failed
      └──── a new request is allowed from NULL, completed or failed

A claim is atomic, so two watchers never run one handoff. An unknown id changes nothing."""

from __future__ import annotations

import sqlite3
from typing import Any

from hermes_state_common import Text, clean_text, row_to_dict, stored_text
from hermes_state_errors import InvalidInputError

__all__ = [
    "HANDOFF_ERROR_CHARS",
    "request_handoff",
    "claim_handoff",
    "complete_handoff",
    "fail_handoff",
    "get_handoff_state",
    "list_pending_handoffs",
]

HANDOFF_ERROR_CHARS = 500

REQUEST_HANDOFF_SQL = """
UPDATE sessions SET handoff_state = 'pending', handoff_platform = ?, handoff_error = NULL
WHERE id = ? AND (handoff_state IS NULL OR handoff_state IN ('completed', 'failed'))
"""


def request_handoff(conn: sqlite3.Connection, /, session_id: str, platform: str) -> bool:
    """Ask for the session to move to ``platform``; False for an unknown session or while a
    handoff is pending or running."""
    if not isinstance(platform, str) or not platform.strip():
        raise InvalidInputError(f"platform must be a platform name, got {platform!r}")
    key = stored_text(session_id)
    if key is None:
        return False
    return conn.execute(REQUEST_HANDOFF_SQL, (clean_text(platform), key)).rowcount > 0


CLAIM_HANDOFF_SQL = """
UPDATE sessions SET handoff_state = 'running' WHERE id = ? AND handoff_state = 'pending'
"""


def claim_handoff(conn: sqlite3.Connection, /, session_id: str) -> bool:
    """Move a pending handoff to running; False when it was not pending."""
    key = stored_text(session_id)
    return key is not None and conn.execute(CLAIM_HANDOFF_SQL, (key,)).rowcount > 0


COMPLETE_HANDOFF_SQL = """
UPDATE sessions SET handoff_state = 'completed', handoff_error = NULL WHERE id = ?
"""


def complete_handoff(conn: sqlite3.Connection, /, session_id: str) -> None:
    """Mark the handoff completed (and its error cleared), whatever its state was."""
    key = stored_text(session_id)
    if key is not None:
        conn.execute(COMPLETE_HANDOFF_SQL, (key,))


FAIL_HANDOFF_SQL = "UPDATE sessions SET handoff_state = 'failed', handoff_error = ? WHERE id = ?"


def fail_handoff(conn: sqlite3.Connection, /, session_id: str, error: Text) -> None:
    """Mark the handoff failed with the first 500 characters of ``error``, whatever its state
    was."""
    key = stored_text(session_id)
    if key is not None:
        text = None if error is None else clean_text(str(error))[:HANDOFF_ERROR_CHARS]
        conn.execute(FAIL_HANDOFF_SQL, (text, key))


HANDOFF_STATE_SQL = """
SELECT handoff_state AS state, handoff_platform AS platform, handoff_error AS error
FROM sessions WHERE id = ?
"""


def get_handoff_state(conn: sqlite3.Connection, /, session_id: str) -> dict[str, Any] | None:
    """``{"state", "platform", "error"}`` of the session (all None when it never had a
    handoff); None for an unknown session."""
    key = stored_text(session_id)
    if key is None:
        return None
    cursor = conn.execute(HANDOFF_STATE_SQL, (key,))
    row = cursor.fetchone()
    return None if row is None else row_to_dict(cursor, row)


PENDING_HANDOFFS_SQL = """
SELECT * FROM sessions WHERE handoff_state = 'pending' ORDER BY started_at, id
"""


def list_pending_handoffs(conn: sqlite3.Connection, /) -> list[dict[str, Any]]:
    """Full session rows waiting for the gateway, oldest first."""
    cursor = conn.execute(PENDING_HANDOFFS_SQL)
    return [row_to_dict(cursor, r) for r in cursor.fetchall()]
