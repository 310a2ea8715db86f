"""Listing and counting sessions: the rows pickers, the dashboard and ``/resume`` read.

:func:`list_sessions_rich` is one SQL statement whatever the filters, paging included. Rows
gain ``preview`` (the first user message, cut to 60 characters) and ``last_active``.
``include_children=False`` keeps what a picker lists on its own
(``hermes_state_lineage.LISTABLE_SQL``). ``order_by_last_active`` orders by the newest activity
along continuation edges; ``search_query`` and ``id_query`` apply in that order only. After
paging, each compressed row is shown as its tip, with its root's id as ``_lineage_root_id``.
:func:`session_count` uses the same filter meanings. Bad arguments
raise before anything is read. See docs/api.md."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable
from typing import Any

import hermes_state_arguments as arguments
from hermes_state_common import escape_like, row_to_dict
from hermes_state_errors import is_sqlite_lock_error
from hermes_state_lineage import CONTINUATION_EDGE_SQL, LISTABLE_SQL, get_compression_tip
from hermes_state_sessions import source_filters

__all__ = [
    "get_session_rich_row",
    "list_sessions_rich",
    "session_count",
    "search_sessions",
    "search_sessions_by_id",
    "list_cron_job_runs",
]

PREVIEW_CHARS = 60


def make_preview(text: str | None) -> str:
    """First user message, whitespace collapsed, at most 60 characters plus ``...``."""
    if not text:
        return ""
    collapsed = " ".join(text.split())
    if len(collapsed) <= PREVIEW_CHARS:
        return collapsed
    return collapsed[:PREVIEW_CHARS] + "..."


# preview (raw; make_preview shapes it) and last_active of session ``s``.
ENRICHED_SQL = """
    (SELECT m.content FROM messages m
     WHERE m.session_id = s.id AND m.role = 'user' AND m.content IS NOT NULL
     ORDER BY m.timestamp, m.id LIMIT 1) AS preview,
    COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = s.id),
             s.started_at) AS last_active
"""

# One page of session ids (``{page}``: a query yielding ``id`` and the ``rank`` it is ordered
# by), then the enriched columns of those rows only: a preview is read for at most ``limit``
# rows, whatever the offset.
ENRICHED_PAGE_SQL = f"""
SELECT s.*, {ENRICHED_SQL}
FROM ({{page}}) page JOIN sessions s ON s.id = page.id
ORDER BY page.rank DESC, s.started_at DESC, s.id DESC
"""

# Newest first by start: the listing's default order.
PAGE_BY_START_SQL = """
SELECT s.id, s.started_at AS rank FROM sessions s WHERE {where}
ORDER BY s.started_at DESC, s.id DESC
LIMIT ? OFFSET ?
"""

# Newest activity over each row's continuation chain first. ``chain`` pairs each filtered row
# with itself and every session reached from it through continuation edges (the chain row is
# the edge's parent ``p``), each with its own newest activity; a chain is a tree below a
# listed row, so only a damaged parent cycle meets the step bound;
# ``activity`` keeps the rows whose chain matches the search, if any.
MAX_CHAIN_STEPS = 10_000
PAGE_BY_ACTIVITY_SQL = f"""
WITH RECURSIVE
chain(root, id, title, end_reason, active, depth) AS (
    SELECT s.id, s.id, s.title, s.end_reason,
           COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = s.id),
                    s.started_at), 0
    FROM sessions s WHERE {{where}}
    UNION ALL
    SELECT p.root, c.id, c.title, c.end_reason,
           COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = c.id),
                    c.started_at), p.depth + 1
    FROM chain p JOIN sessions c ON c.parent_session_id = p.id
    WHERE {CONTINUATION_EDGE_SQL} AND p.depth < {MAX_CHAIN_STEPS}
),
activity(root, active) AS (
    SELECT c.root, MAX(c.active) FROM chain c GROUP BY c.root {{having}}
)
SELECT s.id, a.active AS rank FROM activity a JOIN sessions s ON s.id = a.root
ORDER BY a.active DESC, s.started_at DESC, s.id DESC
LIMIT ? OFFSET ?
"""

# Chain members ``c`` whose id (or, for a search, title) holds the needle; a search also
# matches titles with ``-``, ``_``, ``.`` and spaces removed against the needle without
# punctuation (``an94`` finds ``AN-94``).
ID_MATCH_SQL = "c.id LIKE ? ESCAPE '\\'"
TITLE_MATCH_SQL = "c.title LIKE ? ESCAPE '\\'"
COMPACT_TITLE_MATCH_SQL = (
    "replace(replace(replace(replace(lower(c.title), '-', ''), '_', ''), '.', ''), ' ', '')"
    " LIKE ? ESCAPE '\\'"
)
_NOT_A_WORD = re.compile(r"[\W_]+")

# What a compressed row takes from its compression tip; every other column stays the root's.
TIP_FIELDS = (
    "id", "ended_at", "end_reason", "message_count", "tool_call_count", "title", "last_active",
    "preview", "model", "system_prompt", "cwd", "git_branch", "git_repo_root",
)
ENRICHED_ONE_SQL = f"SELECT s.*, {ENRICHED_SQL} FROM sessions s WHERE s.id = ?"


def _optional_text(name: str, value: Any) -> str | None:
    return None if value is None else arguments.text(name, value)


def _cwd_condition(cwd_prefix: str) -> tuple[str, list[Any]]:
    """``cwd`` is the directory or lies below it (either separator); trailing separators of
    the prefix are dropped unless nothing else is left (``/`` lists everything under ``/``)."""
    prefix = cwd_prefix.rstrip("/\\") or cwd_prefix
    if prefix.endswith(("/", "\\")):
        return " AND substr(s.cwd, 1, length(?)) = ?", [prefix, prefix]
    return (
        " AND (s.cwd = ? OR substr(s.cwd, 1, length(?) + 1) IN (? || '/', ? || '\\'))",
        [prefix, prefix, prefix, prefix],
    )


def _where(
    *,
    source: str | None,
    exclude_sources: Iterable[str] | None,
    cwd_prefix: str | None,
    min_message_count: int,
    include_archived: bool,
    archived_only: bool,
    listable_only: bool,
) -> tuple[str, list[Any]]:
    """The WHERE clause over session ``s`` shared by the list and the count."""
    sql, params = source_filters(_optional_text("source", source), exclude_sources)
    sql = "1 = 1" + sql
    if listable_only:
        sql += f" AND {LISTABLE_SQL}"
    if _optional_text("cwd_prefix", cwd_prefix):
        cwd_sql, cwd_params = _cwd_condition(str(cwd_prefix))
        sql += cwd_sql
        params += cwd_params
    if arguments.integer("min_message_count", min_message_count) > 0:
        sql += " AND COALESCE(s.message_count, 0) >= ?"
        params.append(min_message_count)
    if archived_only:
        sql += " AND s.archived = 1"
    elif not include_archived:
        sql += " AND COALESCE(s.archived, 0) = 0"
    return sql, params


def _having(id_query: str | None, search_query: str | None) -> tuple[str, list[Any]]:
    """The chain-match condition of an activity-ordered list: each query given must match
    some session of the row's chain (empty when neither is given)."""
    groups: list[str] = []
    params: list[Any] = []
    needle = (_optional_text("id_query", id_query) or "").strip()
    if needle:
        groups.append(f"MAX({ID_MATCH_SQL})")
        params.append(f"%{escape_like(needle)}%")
    needle = (_optional_text("search_query", search_query) or "").strip()
    if needle:
        like = f"%{escape_like(needle)}%"
        terms, params = [ID_MATCH_SQL, TITLE_MATCH_SQL], [*params, like, like]
        compact = _NOT_A_WORD.sub("", needle.lower())
        if compact:
            terms.append(COMPACT_TITLE_MATCH_SQL)
            params.append(f"%{escape_like(compact)}%")
        groups.append(f"MAX({' OR '.join(terms)})")
    return (f"HAVING {' AND '.join(groups)}" if groups else ""), params


def _enriched(cursor: sqlite3.Cursor) -> list[dict[str, Any]]:
    rows = [row_to_dict(cursor, r) for r in cursor.fetchall()]
    for row in rows:
        row["preview"] = make_preview(row["preview"])
    return rows


def _project_tip(conn: sqlite3.Connection, row: dict[str, Any]) -> None:
    """Show a compressed row as its compression tip (see the module docstring)."""
    if row.get("end_reason") != "compression":
        return
    try:
        tip_id = get_compression_tip(conn, row["id"])
        if tip_id == row["id"]:
            return
        found = _enriched(conn.execute(ENRICHED_ONE_SQL, (tip_id,)))
    except sqlite3.OperationalError as exc:
        if not is_sqlite_lock_error(exc):
            raise  # a tip that cannot be read is no reason to show the root instead
        return  # busy or locked: the row stays as it is
    if not found:
        return
    root_id = row["id"]
    row.update({key: found[0].get(key) for key in TIP_FIELDS})
    row["_lineage_root_id"] = root_id


def get_session_rich_row(
    conn: sqlite3.Connection, /, session_id: str, compact_rows: bool = False
) -> dict[str, Any] | None:
    """One session as :func:`list_sessions_rich` shows a row (every column, ``preview``,
    ``last_active``), never projected onto its tip; None for an unknown id.
    ``compact_rows`` leaves ``system_prompt`` out."""
    found = _enriched(conn.execute(ENRICHED_ONE_SQL, (session_id,)))
    if not found:
        return None
    if compact_rows:
        found[0].pop("system_prompt", None)
    return found[0]


def list_sessions_rich(
    conn: sqlite3.Connection,
    /,
    source: str | None = None,
    exclude_sources: Iterable[str] | None = None,
    cwd_prefix: str | None = None,
    limit: int = 20,
    offset: int = 0,
    include_children: bool = False,
    min_message_count: int = 0,
    project_compression_tips: bool = True,
    order_by_last_active: bool = False,
    include_archived: bool = False,
    archived_only: bool = False,
    id_query: str | None = None,
    search_query: str | None = None,
    compact_rows: bool = False,
) -> list[dict[str, Any]]:
    """One page of enriched session rows (see the module docstring for every filter, the two
    orders and the tip projection). ``compact_rows`` leaves ``system_prompt`` out."""
    where, params = _where(
        source=source, exclude_sources=exclude_sources, cwd_prefix=cwd_prefix,
        min_message_count=min_message_count, include_archived=include_archived,
        archived_only=archived_only, listable_only=not include_children,
    )
    page = [arguments.integer("limit", limit), arguments.integer("offset", offset, minimum=0)]
    if order_by_last_active:
        having, having_params = _having(id_query, search_query)
        ids_sql = PAGE_BY_ACTIVITY_SQL.format(where=where, having=having)
        params += having_params
    else:
        ids_sql = PAGE_BY_START_SQL.format(where=where)
    sql = ENRICHED_PAGE_SQL.format(page=ids_sql)
    rows = _enriched(conn.execute(sql, (*params, *page)))
    if project_compression_tips and not include_children:
        for row in rows:
            _project_tip(conn, row)
    if compact_rows:
        for row in rows:
            row.pop("system_prompt", None)
    return rows


def session_count(
    conn: sqlite3.Connection,
    /,
    source: str | None = None,
    cwd_prefix: str | None = None,
    min_message_count: int = 0,
    include_archived: bool = False,
    archived_only: bool = False,
    exclude_children: bool = False,
    exclude_sources: Iterable[str] | None = None,
) -> int:
    """Session rows with :func:`list_sessions_rich`'s filter meanings; ``exclude_children``
    counts only the rows a picker lists on their own."""
    where, params = _where(
        source=source, exclude_sources=exclude_sources, cwd_prefix=cwd_prefix,
        min_message_count=min_message_count, include_archived=include_archived,
        archived_only=archived_only, listable_only=exclude_children,
    )
    return int(conn.execute(f"SELECT COUNT(*) FROM sessions s WHERE {where}", params)
               .fetchone()[0])


# Every session (of one source) with its last activity, archived ones included.
SEARCH_SESSIONS_SQL = """
SELECT s.*, COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = s.id),
                     s.started_at) AS last_active
FROM sessions s WHERE 1 = 1 {filters}
ORDER BY last_active DESC, s.started_at DESC, s.id DESC
LIMIT ? OFFSET ?
"""


def search_sessions(
    conn: sqlite3.Connection, /, source: str | None = None, limit: int = 20, offset: int = 0
) -> list[dict[str, Any]]:
    """Session rows plus ``last_active``, newest activity first (then ``started_at``, then
    id), archived ones included; ``limit=-1`` returns them all."""
    filters, params = source_filters(_optional_text("source", source), None)
    page = [arguments.integer("limit", limit), arguments.integer("offset", offset, minimum=0)]
    cursor = conn.execute(SEARCH_SESSIONS_SQL.format(filters=filters), (*params, *page))
    return [row_to_dict(cursor, r) for r in cursor.fetchall()]


def search_sessions_by_id(
    conn: sqlite3.Connection, /, query: str, limit: int = 20, include_archived: bool = True
) -> list[dict[str, Any]]:
    """Listed conversations whose chain holds an id containing ``query`` (case-insensitive):
    exact matches of the row's id or root id first, then prefixes, then the rest, each group
    in recency order; at most ``limit`` rows."""
    needle = (_optional_text("query", query) or "").strip().lower()
    if not needle or arguments.integer("limit", limit) <= 0:
        return []
    candidates = list_sessions_rich(
        conn, limit=min(4 * limit, arguments.INT64_MAX), offset=0,
        include_archived=include_archived, order_by_last_active=True, id_query=needle,
    )

    def rank(row: dict[str, Any]) -> int:
        ids = [str(row["id"]).lower(), str(row.get("_lineage_root_id") or row["id"]).lower()]
        if needle in ids:
            return 0
        return 1 if any(i.startswith(needle) for i in ids) else 2

    return sorted(candidates, key=rank)[:limit]  # a stable sort keeps recency within a rank


CRON_RUNS_SQL = f"""
SELECT s.*, {ENRICHED_SQL}
FROM sessions s WHERE s.source = 'cron' AND s.id >= ? AND s.id < ?
ORDER BY s.started_at DESC, s.id DESC
LIMIT ? OFFSET ?
"""


def list_cron_job_runs(
    conn: sqlite3.Connection, /, job_id: str, limit: int = 20, offset: int = 0
) -> list[dict[str, Any]]:
    """The runs of one cron job (sessions of source ``cron`` whose id starts with
    ``cron_<job_id>_``, an id range: ``job1`` never matches ``cron_job10_…``), newest first."""
    low = f"cron_{arguments.text('job_id', job_id)}_"
    high = low[:-1] + chr(ord("_") + 1)
    page = [arguments.integer("limit", limit), arguments.integer("offset", offset, minimum=0)]
    return _enriched(conn.execute(CRON_RUNS_SQL, (low, high, *page)))
