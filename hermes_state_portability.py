"""Portability: export and import of sessions, recovery, repair, backup and snapshots.

An export is plain JSON data: the session row with every column, every message row of every
generation (uids, JSON fields decoded, ``active``/``compacted`` flags) and the per-model usage
rows. Nothing in it is derived (no FTS text), so importing it back loses nothing.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from hermes_state_messages import get_messages
from hermes_state_sessions import get_model_usage, get_session, search_sessions

__all__ = ["export_session", "export_all"]


def export_session(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """The session row plus ``messages`` (all generations, in order) and ``model_usage``."""
    session = get_session(conn, session_id)
    if session is None:
        return None
    session["messages"] = get_messages(conn, session_id, include_inactive=True)
    session["model_usage"] = get_model_usage(conn, session_id)
    return session


def export_all(conn: sqlite3.Connection, source: str | None = None) -> list[dict[str, Any]]:
    """Every session (optionally of one source, archived ones included), oldest first,
    exported as above."""
    sessions = search_sessions(conn, source=source, limit=-1, include_archived=True)
    exported = (export_session(conn, s["id"]) for s in reversed(sessions))
    return [e for e in exported if e is not None]
