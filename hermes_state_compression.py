"""Lineage and compression: the parent chain, compression generations and compression locks.

Lineage is the ``parent_session_id`` chain. A compression that splits a conversation ends the
parent with ``end_reason='compression'`` and publishes the child as its successor
(``successor_session_id``); the *tip* of a conversation is where that chain of successors ends.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from hermes_state_sessions import chain_from, family_of, row_to_dict

__all__ = [
    "get_session_ancestors",
    "get_session_descendants",
    "get_compression_tip",
    "get_compression_lineage",
]

# The seed's lineage queries: the session first, then each parent in turn.
ANCESTORS_SQL = """
WITH RECURSIVE lineage(id, parent_session_id, depth) AS (
    SELECT id, parent_session_id, 0 FROM sessions WHERE id = ?
    UNION
    SELECT s.id, s.parent_session_id, l.depth + 1
    FROM sessions s JOIN lineage l ON s.id = l.parent_session_id
    WHERE l.depth < 10000
)
SELECT s.id, s.title, s.started_at, s.parent_session_id, s.source, s.end_reason
FROM lineage l JOIN sessions s ON s.id = l.id
ORDER BY l.depth
"""

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
    return _rows(conn, ANCESTORS_SQL, session_id)


def get_session_descendants(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """The session and everything below it, breadth first."""
    return _rows(conn, DESCENDANTS_SQL, session_id)


def get_compression_tip(conn: sqlite3.Connection, session_id: str) -> str | None:
    """Where the compression chain starting at ``session_id`` currently ends."""
    family, children = family_of(conn, session_id)
    if session_id not in family:
        return None
    return chain_from(family, children, session_id)[-1]


# One step of the rule of hermes_state_sessions.next_in_chain, for walking up a chain.
SUCCESSOR_LINK_SQL = "SELECT successor_session_id, end_reason FROM sessions WHERE id = ?"
NEWEST_CHILD_SQL = """
SELECT id FROM sessions WHERE parent_session_id = ? ORDER BY started_at DESC, id DESC LIMIT 1
"""


def _is_successor(conn: sqlite3.Connection, parent: str, child: str) -> bool:
    """True when ``child`` (a child of ``parent``) is ``parent``'s compression successor: the
    published one, else — with no published successor among its descendants — the newest
    child of a parent that ended by compression."""
    successor, end_reason = conn.execute(SUCCESSOR_LINK_SQL, (parent,)).fetchone()
    if successor is not None:
        if successor == child:
            return True
        if any(r["id"] == parent for r in get_session_ancestors(conn, successor)[1:]):
            return False
    if end_reason != "compression":
        return False
    newest = conn.execute(NEWEST_CHILD_SQL, (parent,)).fetchone()
    return newest is not None and newest[0] == child


def compression_root(conn: sqlite3.Connection, session_id: str) -> str | None:
    """The first session of the compression chain through ``session_id``: walk up while the
    session is its parent's compression successor. A delegate child, or an older branch the
    parent has moved past, is not its parent's successor and starts a chain of its own."""
    rows = get_session_ancestors(conn, session_id)
    if not rows:
        return None
    root = rows[0]["id"]
    for parent in rows[1:]:
        if not _is_successor(conn, parent["id"], root):
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
