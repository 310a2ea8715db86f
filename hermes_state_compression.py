"""Lineage and compression: the parent chain, compression generations and compression locks.

Lineage is the ``parent_session_id`` chain. A compression that splits a conversation ends the
parent with ``end_reason='compression'`` and publishes the child as its successor
(``successor_session_id``); the *tip* of a conversation is where that chain of successors ends.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from hermes_state_sessions import chain_from, family_of, row_to_dict, session_ancestors

__all__ = [
    "get_session_ancestors",
    "get_session_descendants",
    "get_compression_tip",
    "get_compression_lineage",
]

# The seed's descendants query: the session first, then everything below it.
DESCENDANTS_SQL = """
WITH RECURSIVE descendants(id, depth) AS (
    SELECT id, 0 FROM sessions WHERE id = ?
    UNION
    SELECT s.id, d.depth + 1 FROM sessions s JOIN descendants d ON s.parent_session_id = d.id
    WHERE d.depth < 10000
)
SELECT s.id, s.title, s.started_at, s.parent_session_id, s.source, s.end_reason
FROM descendants d JOIN sessions s ON s.id = d.id
ORDER BY d.depth, s.started_at, s.id
"""


def _rows(conn: sqlite3.Connection, sql: str, session_id: str) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, (session_id,))
    return [row_to_dict(cursor, r) for r in cursor.fetchall()]


def get_session_ancestors(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """The session and its ancestors, nearest first (empty when the session is unknown)."""
    return session_ancestors(conn, session_id)


def get_session_descendants(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """The session and everything below it, breadth first."""
    return _rows(conn, DESCENDANTS_SQL, session_id)


def get_compression_tip(conn: sqlite3.Connection, session_id: str) -> str | None:
    """Where the compression chain starting at ``session_id`` currently ends."""
    family, children = family_of(conn, session_id)
    if session_id not in family:
        return None
    return chain_from(family, children, session_id)[-1]


def compression_root(conn: sqlite3.Connection, session_id: str) -> str | None:
    """The first session of the compression chain through ``session_id``: walk up while the
    parent ended by compression."""
    rows = get_session_ancestors(conn, session_id)
    if not rows:
        return None
    root = rows[0]["id"]
    for parent in rows[1:]:
        if parent["end_reason"] != "compression":
            break
        root = parent["id"]
    return root


def get_compression_lineage(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """The compression chain through ``session_id``, root first, live tip last."""
    root = compression_root(conn, session_id)
    if root is None:
        return []
    family, children = family_of(conn, root)
    return chain_from(family, children, root)
