"""Lineage: how sessions continue one another, and the sets callers build on it.

Lineage is the ``parent_session_id`` chain. A session's successor is its published
``successor_session_id`` while that is its child. Else, if it ended by compression, it is one
child over a continuation edge (:data:`CONTINUATION_EDGE_SQL`). A child that ended by
compression wins, then a live one, then the newest activity, then the greatest id. Else there
is none, and the session is a tip. Every forward walk uses this one rule, and walks stop on a
repeat, never on a count.

* :func:`compression_chain`: root to tip, the line history is read along.
* :func:`conversation_members`: what archive and prune act on. Any member gives the same set,
  so a listed row and its tip are kept or archived together.

Functions only read; an unknown id gives an empty answer. See docs/api.md."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hermes_state_common import row_to_dict
from hermes_state_errors import is_sqlite_lock_error

__all__ = [
    "DELEGATE_MARKER",
    "BRANCH_MARKER",
    "UNMARKED_CHILD_SQL",
    "CONTINUATION_EDGE_SQL",
    "Family",
    "session_ancestors",
    "session_descendants",
    "lineage_tree",
    "successor",
    "compression_tip",
    "get_compression_tip",
    "compression_ancestors",
    "compression_chain",
    "conversation_members",
    "forwarding_chain",
    "LISTABLE_SQL",
    "resolve_resume_session_id",
    "RESUME_CHILD_SQL",
]

DELEGATE_MARKER = "_delegate_from"
BRANCH_MARKER = "_branched_from"

# A session ``c`` (an alias of ``sessions``) that carries neither marker and is not a tool's
# own session. A marker counts when its key holds a value; ``model_config`` that is not JSON
# marks nothing.
UNMARKED_CHILD_SQL = f"""(
    c.source IS NOT 'tool'
    AND CASE WHEN json_valid(c.model_config)
             THEN json_extract(c.model_config, '$.{DELEGATE_MARKER}') IS NULL
                  AND json_extract(c.model_config, '$.{BRANCH_MARKER}') IS NULL
             ELSE 1 END
)"""
# The continuation edge from a parent ``p`` to its child ``c``.
CONTINUATION_EDGE_SQL = f"(p.end_reason = 'compression' AND {UNMARKED_CHILD_SQL})"


def _marked(alias: str, marker: str) -> str:
    """SQL: session ``alias`` carries ``marker`` (JSON ``model_config`` holding the key)."""
    return (f"(json_valid({alias}.model_config)"
            f" AND json_extract({alias}.model_config, '$.{marker}') IS NOT NULL)")


# A session ``s`` a picker lists on its own: no parent (or a parent that is gone), or a branch
# child (marked, or started once its parent had ended by ``/branch``), and never a delegate.
LISTABLE_SQL = f"""(
    NOT {_marked("s", DELEGATE_MARKER)}
    AND (s.parent_session_id IS NULL
         OR {_marked("s", BRANCH_MARKER)}
         OR NOT EXISTS (SELECT 1 FROM sessions lp WHERE lp.id = s.parent_session_id)
         OR EXISTS (SELECT 1 FROM sessions lp WHERE lp.id = s.parent_session_id
                    AND lp.end_reason = 'branched' AND s.started_at >= lp.ended_at))
)"""

# --- the parent chain ------------------------------------------------------------------------

# The seed's ancestors query: the session first, then each parent in turn.
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


def session_ancestors(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """The session and its ancestors, nearest first (empty when the session is unknown)."""
    cursor = conn.execute(ANCESTORS_SQL, (session_id,))
    return [row_to_dict(cursor, r) for r in cursor.fetchall()]


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


def session_descendants(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """The session and everything below it, breadth first (empty when it is unknown)."""
    cursor = conn.execute(DESCENDANTS_SQL, (session_id,))
    return [row_to_dict(cursor, r) for r in cursor.fetchall()]


def lineage_tree(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """Every session of the tree ``session_id`` belongs to: its topmost ancestor and
    everything below it, parents before children. Empty when the session is unknown."""
    ancestors = session_ancestors(conn, session_id)
    if not ancestors:
        return []
    return [r["id"] for r in session_descendants(conn, ancestors[-1]["id"])]


# --- the successor rule ----------------------------------------------------------------------

# A session and everything below it, with what the successor rule reads of each: whether it
# carries a marker, and its newest activity.
FAMILY_SQL = f"""
WITH RECURSIVE family(id) AS (
    SELECT ?
    UNION
    SELECT s.id FROM sessions s JOIN family f ON s.parent_session_id = f.id
)
SELECT c.id, c.parent_session_id, c.successor_session_id, c.end_reason, c.ended_at,
       c.started_at, {UNMARKED_CHILD_SQL} AS unmarked,
       COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = c.id),
                c.started_at) AS last_active
FROM sessions c JOIN family f ON c.id = f.id
"""


@dataclass(frozen=True)
class _Node:
    id: str
    parent: str | None
    published: str | None
    end_reason: str | None
    ended_at: float | None
    started_at: float
    unmarked: bool  # neither marker, not a tool session (UNMARKED_CHILD_SQL)
    last_active: float

    def preference(self) -> tuple[int, float, float, str]:
        """How strongly this child is its parent's continuation (greatest wins)."""
        rank = 2 if self.end_reason == "compression" else 1 if self.ended_at is None else 0
        return (rank, self.last_active, self.started_at, self.id)


class Family:
    """A session and everything below it, read in one query, with the successor rule applied
    in memory: for walks that take many steps (a listing's tips, a long chain)."""

    def __init__(self, conn: sqlite3.Connection, root: str) -> None:
        self.root = root
        self.nodes: dict[str, _Node] = {}
        self.children: dict[str, list[str]] = {}
        for row in conn.execute(FAMILY_SQL, (root,)):
            node = _Node(row[0], row[1], row[2], row[3], row[4], float(row[5] or 0.0),
                         bool(row[6]), float(row[7] or 0.0))
            self.nodes[node.id] = node
        for node in self.nodes.values():
            if node.id != root and node.parent in self.nodes:
                self.children.setdefault(str(node.parent), []).append(node.id)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self.nodes

    def last_active(self) -> float:
        """The newest activity of any session of the family."""
        return max(n.last_active for n in self.nodes.values())

    def successor(self, session_id: str) -> str | None:
        """The successor of a session of the family (see the module docstring)."""
        node = self.nodes[session_id]
        kids = self.children.get(session_id, [])
        if node.published is not None and node.published in kids:
            return node.published
        if node.end_reason != "compression":
            return None
        edges = [self.nodes[k] for k in kids if self.nodes[k].unmarked]
        return max(edges, key=_Node.preference).id if edges else None

    def chain_from(self, start: str) -> list[str]:
        """``start`` and its successors in order; the last one is its compression tip."""
        path, seen = [start], {start}
        while (nxt := self.successor(path[-1])) is not None and nxt not in seen:
            path.append(nxt)
            seen.add(nxt)
        return path

    def compression_root(self, ancestors: Iterable[str]) -> str:
        """The first session of the chain through the first of ``ancestors`` (a session of
        the family, then its parents nearest first)."""
        walk = iter(ancestors)
        below = next(walk)
        for parent in walk:
            if parent not in self.nodes or self.successor(parent) != below:
                break
            below = parent
        return below


def successor(conn: sqlite3.Connection, session_id: str) -> str | None:
    """The successor of ``session_id``; None at a tip or for an unknown session."""
    family = Family(conn, session_id)
    return family.successor(session_id) if session_id in family else None


def compression_tip(conn: sqlite3.Connection, session_id: str) -> str | None:
    """Where the walk through successors from ``session_id`` ends; None for an unknown
    session."""
    family = Family(conn, session_id)
    return family.chain_from(session_id)[-1] if session_id in family else None


def get_compression_tip(conn: sqlite3.Connection, session_id: str) -> str:
    """The compression tip of ``session_id``: the id itself when nothing continues it, an
    unknown id included (callers switch to whatever this returns)."""
    return compression_tip(conn, session_id) or session_id


def _ancestry(conn: sqlite3.Connection, session_id: str) -> tuple[list[str], Family] | None:
    """The session and its parents (nearest first) and the family of the topmost one."""
    ancestors = [r["id"] for r in session_ancestors(conn, session_id)]
    if not ancestors:
        return None
    return ancestors, Family(conn, ancestors[-1])


def compression_ancestors(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """The session, then each parent in turn while the session below it is that parent's
    successor, nearest first (empty when the session is unknown)."""
    found = _ancestry(conn, session_id)
    if found is None:
        return []
    ancestors, family = found
    root = family.compression_root(ancestors)
    return ancestors[: ancestors.index(root) + 1]


def compression_chain(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """The compression chain through ``session_id``: its compression root first, then each
    successor, its compression tip last (empty when the session is unknown)."""
    found = _ancestry(conn, session_id)
    if found is None:
        return []
    ancestors, family = found
    return family.chain_from(family.compression_root(ancestors))


# --- the conversation's members --------------------------------------------------------------

# The session and each parent in turn while that parent ended by compression.
COMPRESSION_UP_SQL = """
WITH RECURSIVE up(id, parent) AS (
    SELECT id, parent_session_id FROM sessions WHERE id = ?
    UNION
    SELECT p.id, p.parent_session_id FROM sessions p JOIN up ON p.id = up.parent
    WHERE p.end_reason = 'compression'
)
SELECT id, parent FROM up
"""
# A compression root and everything below it through sessions that ended by compression.
COMPRESSION_DOWN_SQL = """
WITH RECURSIVE down(id, reason) AS (
    SELECT id, end_reason FROM sessions WHERE id = ?
    UNION
    SELECT c.id, c.end_reason FROM sessions c JOIN down ON c.parent_session_id = down.id
    WHERE down.reason = 'compression'
)
SELECT id FROM down
"""


def conversation_members(conn: sqlite3.Connection, session_id: str) -> set[str]:
    """Every session of the conversation ``session_id`` belongs to (see the module
    docstring); any member gives the same set; empty for an unknown session."""
    rows = conn.execute(COMPRESSION_UP_SQL, (session_id,)).fetchall()
    if not rows:
        return set()
    ids = {r[0] for r in rows}
    roots = [r[0] for r in rows if r[1] not in ids]
    root = roots[0] if roots else session_id  # a cycle of compressed sessions has no root
    return {r[0] for r in conn.execute(COMPRESSION_DOWN_SQL, (root,))}


# --- published forwarding --------------------------------------------------------------------

# The published successor of a session, when that session exists.
FORWARD_SQL = """
SELECT s.successor_session_id FROM sessions s JOIN sessions t ON t.id = s.successor_session_id
WHERE s.id = ?
"""


def forwarding_chain(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """The published successors of ``session_id``, followed in order wherever they lead
    (cycles stop); the last one is the published forwarding target."""
    chain: list[str] = []
    seen = {session_id}
    current = session_id
    while (row := conn.execute(FORWARD_SQL, (current,)).fetchone()) is not None:
        current = row[0]
        if current in seen:
            break
        seen.add(current)
        chain.append(current)
    return chain


# --- the resume target -----------------------------------------------------------------------

# The child a resume walks down to: the most recently started one that carries no marker and
# is not a tool's session, whatever its parent's end reason.
RESUME_CHILD_SQL = f"""
SELECT c.id FROM sessions c WHERE c.parent_session_id = ? AND {UNMARKED_CHILD_SQL}
ORDER BY c.started_at DESC, c.id DESC LIMIT 1
"""
HAS_MESSAGES_SQL = "SELECT 1 FROM messages WHERE session_id = ? LIMIT 1"
SESSION_EXISTS_SQL = "SELECT 1 FROM sessions WHERE id = ?"
RESUME_STEPS = 32


def resolve_resume_session_id(conn: sqlite3.Connection, /, session_id: str) -> str:
    """The session ``/resume`` opens for ``session_id``: from its compression tip, walk down
    (at most 32 steps) through each most recently started unmarked child, and return the
    deepest session on the way that has any message, else the tip. A falsy or unknown id
    comes back unchanged; a busy or locked store during the walk down returns the tip (a
    damaged file, or text that cannot be read, still raises: the caller must learn of it)."""
    if not session_id or conn.execute(SESSION_EXISTS_SQL, (session_id,)).fetchone() is None:
        return session_id
    try:
        tip = get_compression_tip(conn, session_id)
    except sqlite3.OperationalError as exc:
        if not is_sqlite_lock_error(exc):
            raise
        tip = session_id
    try:
        node, visited = tip, {tip}
        deepest = tip if conn.execute(HAS_MESSAGES_SQL, (tip,)).fetchone() else None
        for _ in range(RESUME_STEPS):
            row = conn.execute(RESUME_CHILD_SQL, (node,)).fetchone()
            if row is None or row[0] in visited:
                break
            node = row[0]
            visited.add(node)
            if conn.execute(HAS_MESSAGES_SQL, (node,)).fetchone():
                deepest = node
    except sqlite3.OperationalError as exc:
        if not is_sqlite_lock_error(exc):
            raise
        return tip
    return deepest or tip
