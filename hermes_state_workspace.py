"""Workspace metadata: the directory and git checkout a session works in.

These are observations that decide nothing, so :func:`update_session_cwd` is an *activity*
write: skipped and logged when the lock is busy. A failed git probe never erases what is
recorded."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from hermes_state_arguments import shown
from hermes_state_common import Text, clean_text, stored_text
from hermes_state_errors import InvalidInputError

__all__ = [
    "update_session_cwd",
    "backfill_repo_roots",
    "distinct_session_cwds",
    "workspace_key",
]

UPDATE_CWD_SQL = """
UPDATE sessions SET cwd = ?,
    git_branch = COALESCE(?, git_branch),
    git_repo_root = COALESCE(?, git_repo_root)
WHERE id = ?
"""


def _observed(name: str, value: str | None) -> str | None:
    """A probed value, stripped; None (keep what is recorded) when blank or missing."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a string or None, got {value!r}")
    return clean_text(value.strip()) or None


def update_session_cwd(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    cwd: Text,
    git_branch: Text | None = None,
    git_repo_root: Text | None = None,
) -> None:
    """Record the session's working directory, and its git branch and repository root when
    the probe found them. Nothing happens for an empty id or directory, or an unknown id."""
    if not session_id or not cwd:
        return
    if not isinstance(cwd, str):
        raise InvalidInputError(f"cwd must be a string, got {cwd!r}")
    branch, root = _observed("git_branch", git_branch), _observed("git_repo_root", git_repo_root)
    key = stored_text(session_id)
    if key is not None:
        conn.execute(UPDATE_CWD_SQL, (clean_text(cwd), branch, root, key))


BACKFILL_ROOT_SQL = """
UPDATE sessions SET git_repo_root = ?
WHERE cwd = ? AND (git_repo_root IS NULL OR git_repo_root = '')
"""


def backfill_repo_roots(conn: sqlite3.Connection, /, cwd_to_root: Mapping[str, str]) -> None:
    """Give every session in one of the directories, and without a repository root, the root
    discovered for it. Pairs with an empty directory or root are skipped; with no pair left
    nothing is written."""
    if not isinstance(cwd_to_root, Mapping):
        raise InvalidInputError(f"cwd_to_root must be a mapping, got {type(cwd_to_root).__name__}")
    pairs = []
    for cwd, root in cwd_to_root.items():
        if not isinstance(cwd, str) or not isinstance(root, (str, type(None))):
            raise InvalidInputError(
                f"a directory and its root must be strings: {shown(cwd)}: {shown(root)}"
            )
        if cwd and root:
            pairs.append((clean_text(root), clean_text(cwd)))
    if pairs:
        conn.executemany(BACKFILL_ROOT_SQL, pairs)


# One row per distinct non-blank directory; last_active is the latest end, else start, of its
# sessions (children included).
DISTINCT_CWDS_SQL = """
SELECT cwd, COUNT(*) AS sessions, MAX(COALESCE(ended_at, started_at, 0)) AS last_active
FROM sessions
WHERE cwd IS NOT NULL AND TRIM(cwd) <> '' {archived}
GROUP BY cwd
"""
NOT_ARCHIVED_CLAUSE = "AND COALESCE(archived, 0) = 0"


def distinct_session_cwds(
    conn: sqlite3.Connection, /, include_archived: bool = False
) -> list[dict[str, Any]]:
    """``[{"cwd", "sessions", "last_active"}]`` over every session, in no defined order;
    archived sessions count only with ``include_archived``."""
    sql = DISTINCT_CWDS_SQL.format(archived="" if include_archived else NOT_ARCHIVED_CLAUSE)
    return [
        {"cwd": cwd, "sessions": int(count), "last_active": float(last_active or 0)}
        for cwd, count, last_active in conn.execute(sql)
    ]


def workspace_key(row: Mapping[str, Any]) -> str | None:
    """The workspace of a session row: its stripped ``git_repo_root`` when non-empty, else its
    stripped ``cwd`` when non-empty, else None. The branch plays no part."""
    for column in ("git_repo_root", "cwd"):
        value = row.get(column)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None
