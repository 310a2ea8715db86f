"""Deleting sessions: one at a time, in batches, by prune filters, and the callers' clean-ups.

What a delete removes is decided once, by :func:`deletion_closure`: the sessions and their
delegate children; other children survive as roots. The command line previews that closure,
so what it shows is what goes. What a prune removes is selected once, by
:func:`select_prune_ids`: ended sessions, whole conversations only.

Live ledger work pins a session (:class:`LedgerBusyError`). Transcript files go only after the
commit (:class:`AfterCommit`), never outside ``sessions_dir``, never the quarantine's spool.
See docs/api.md."""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import math
import re
import sqlite3
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

import hermes_state_arguments as arguments
from hermes_state_common import escape_like, now, row_to_dict
from hermes_state_connect import get_meta, set_meta
from hermes_state_errors import (
    InvalidInputError,
    LedgerBusyError,
    StateDbConstraintError,
    UnknownFilterError,
)
from hermes_state_lineage import DELEGATE_MARKER, conversation_members
from hermes_state_sessions import PINNING_STATUSES_SQL, set_session_archived

__all__ = [
    "AfterCommit",
    "Deleted",
    "PRUNE_FILTERS",
    "AUTO_PRUNE_KEY",
    "remove_transcripts",
    "deletion_closure",
    "delegate_children",
    "delete_delegate_children",
    "list_delete_candidates",
    "delete_session",
    "DELETE_SESSION",
    "DELETE_SESSIONS",
    "DELETE_SESSION_IF_EMPTY",
    "select_prune_ids",
    "list_prune_candidates",
    "PRUNE_SESSIONS",
    "archive_sessions",
    "count_empty_sessions",
    "DELETE_EMPTY_SESSIONS",
    "PRUNE_EMPTY_GHOST_SESSIONS",
    "finalize_orphaned_compression_sessions",
    "claim_auto_prune",
    "restore_auto_prune",
    "maybe_auto_prune_and_vacuum",
    "refused_auto_prune",
]

logger = logging.getLogger("hermes_state")
P = ParamSpec("P")
T = TypeVar("T")


# --- transcript files, after the commit ------------------------------------------------------


@dataclass(frozen=True)
class Deleted(Generic[T]):
    """What a deleting function did in its transaction: its ``result`` and the sessions whose
    transcript files go once it committed."""

    result: T
    session_ids: tuple[str, ...]
    sessions_dir: Path | None


def _check_sessions_dir(sessions_dir: Any) -> Path | None:
    if sessions_dir is None:
        return None
    if not isinstance(sessions_dir, (str, Path)):
        raise InvalidInputError(
            f"sessions_dir must be a path or None, got {type(sessions_dir).__name__}"
        )
    return Path(sessions_dir)


def _is_spool(path: Path, session_id: str) -> bool:
    """Whether ``path`` is the quarantine's spool of ``session_id``: its records name the
    session (``hermes_state_quarantine.spool_transcript``). An empty file holds nothing
    spooled; one that cannot be read is treated as a spool: keeping a stray file costs only
    disk space."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            line = f.readline()
            if not line.strip():
                return False
            first = json.loads(line)
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    return isinstance(first, dict) and first.get("session_id") == session_id


def remove_transcripts(sessions_dir: Path | None, session_ids: Iterable[str]) -> None:
    """Remove each session's ``<id>.json``, ``<id>.jsonl`` and ``request_dump_<id>_*.json``
    from ``sessions_dir`` (None: nothing). Absent files and OS errors are ignored.

    A ``<id>.jsonl`` that is the quarantine's spool is kept: it holds messages a damaged store
    could not take, kept for the operator's recovery, which a delete in the repaired store
    must not take away."""
    if sessions_dir is None:
        return
    for session_id in session_ids:
        named = [sessions_dir / f"{session_id}.json", sessions_dir / f"{session_id}.jsonl"]
        if any(path.parent != sessions_dir for path in named) or "\0" in session_id:
            continue  # a separator in the id: it names no file of this directory
        if _is_spool(named[1], session_id):
            logger.warning("kept %s: it holds messages spooled while the store was quarantined",
                           named[1])
            named.pop()
        pattern = str(sessions_dir / f"request_dump_{glob.escape(session_id)}_*.json")
        for path in [*named, *map(Path, glob.glob(pattern))]:
            try:
                path.unlink()
            except OSError:
                pass


@dataclass(frozen=True)
class AfterCommit(Generic[P, T]):
    """A deleting function as a handle runs it: ``run(conn, ...)`` in the write transaction
    (retried with it), then :meth:`finish` once it committed. ``like`` is the public function
    (same parameters; called without a handle it does both at once)."""

    like: Callable[Concatenate[sqlite3.Connection, P], T]
    run: Callable[Concatenate[sqlite3.Connection, P], Deleted[T]]

    def __call__(self, conn: sqlite3.Connection, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.like(conn, *args, **kwargs)

    @staticmethod
    def finish(done: Deleted[T]) -> T:
        remove_transcripts(done.sessions_dir, done.session_ids)
        return done.result


# --- what a delete removes -------------------------------------------------------------------

# Work that is not finished (or whose fate is unknown) pins a session (see
# hermes_state_sessions.PINNING_STATUSES_SQL).
_PINNING = PINNING_STATUSES_SQL
# The sessions of a JSON list whose ledgers hold live work.
BUSY_SQL = f"""
SELECT session_id FROM session_admissions
WHERE session_id IN (SELECT value FROM json_each(:ids)) AND status IN {_PINNING}
UNION
SELECT session_id FROM worker_executions
WHERE session_id IN (SELECT value FROM json_each(:ids)) AND status IN {_PINNING}
"""
# Every delegate child: its id, its parent link and the session its marker names. One scan,
# then the closure is walked in memory: a recursive query would compare the marker of every
# session at each step.
DELEGATES_SQL = f"""
SELECT id, parent_session_id, json_extract(model_config, '$.{DELEGATE_MARKER}') FROM sessions
WHERE json_valid(model_config)
  AND json_extract(model_config, '$.{DELEGATE_MARKER}') IS NOT NULL
"""
TABLES_SQL = "SELECT name FROM sqlite_master WHERE type = 'table'"
# The ledgers whose live work pins a session (BUSY_SQL reads both).
LEDGER_TABLES = frozenset({"session_admissions", "worker_executions"})
# The table a statement of DELETE_ROWS_SQL changes.
_TABLE_RE = re.compile(r"\s*(?:UPDATE|DELETE FROM)\s+(\w+)")
EXISTING_SQL = "SELECT id FROM sessions WHERE id IN (SELECT value FROM json_each(?))"
# Deleting a JSON list of sessions: children outside it detached first, then every row that
# refers to them (ledger rows only once none is live: checked before), then the rows.
DELETE_ROWS_SQL = (
    """UPDATE sessions SET parent_session_id = NULL
       WHERE parent_session_id IN (SELECT value FROM json_each(:ids))
         AND id NOT IN (SELECT value FROM json_each(:ids))""",
    "DELETE FROM messages WHERE session_id IN (SELECT value FROM json_each(:ids))",
    "DELETE FROM session_model_usage WHERE session_id IN (SELECT value FROM json_each(:ids))",
    "DELETE FROM compression_locks WHERE session_id IN (SELECT value FROM json_each(:ids))",
    "DELETE FROM worker_receipts WHERE session_id IN (SELECT value FROM json_each(:ids))",
    "DELETE FROM worker_executions WHERE session_id IN (SELECT value FROM json_each(:ids))",
    "DELETE FROM session_admissions WHERE session_id IN (SELECT value FROM json_each(:ids))",
    "DELETE FROM sessions WHERE id IN (SELECT value FROM json_each(:ids))",
)


def _busy(conn: sqlite3.Connection, /, session_ids: Collection[str]) -> set[str]:
    """The sessions among ``session_ids`` whose ledgers hold live work."""
    return {r[0] for r in conn.execute(BUSY_SQL, {"ids": json.dumps(sorted(session_ids))})}


def deletion_closure(conn: sqlite3.Connection, /, session_ids: Collection[str]) -> list[str]:
    """The sessions deleting ``session_ids`` removes, sorted: those that exist and their
    delegate children, transitively. A delegate child is one whose ``_delegate_from`` names a
    doomed session, or whose parent is doomed and that carries the marker at all; every other
    child is detached and survives as a root. Reads only."""
    requested = json.dumps(sorted(session_ids))
    doomed = {r[0] for r in conn.execute(EXISTING_SQL, (requested,))}
    if not doomed:
        return []
    return sorted(doomed | _delegates_below(conn, doomed))


def _delegates_below(conn: sqlite3.Connection, /, seeds: Collection[str]) -> set[str]:
    """The delegate children of ``seeds``, transitively, none of ``seeds`` among them."""
    below: dict[str, set[str]] = {}
    for child, parent, named in conn.execute(DELEGATES_SQL):
        for anchor in {parent, named} - {None}:
            below.setdefault(str(anchor), set()).add(child)
    found, frontier = set(seeds), list(seeds)
    while frontier:
        for child in below.get(frontier.pop(), ()):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found - set(seeds)


def delegate_children(conn: sqlite3.Connection, /, parent_ids: Iterable[object]) -> list[str]:
    """The delegate children deleting ``parent_ids`` takes along (transitively, sorted), never
    one of ``parent_ids``; ids that are not non-empty strings are ignored. Reads only."""
    seeds = {sid for sid in parent_ids if isinstance(sid, str) and sid}
    return sorted(_delegates_below(conn, seeds))


def delete_delegate_children(
    conn: sqlite3.Connection, /, parent_ids: Iterable[object]
) -> list[str]:
    """Delete :func:`delegate_children` of ``parent_ids`` as :func:`delete_session` deletes a
    session (the caller's transaction; anything else pointing at them detached) and return
    their ids. :class:`LedgerBusyError`, nothing deleted, while any of them holds live work."""
    doomed = delegate_children(conn, parent_ids)
    if doomed:
        # The caller's connection may hold only part of the store's tables (an older store,
        # a copy of its sessions): a ledger that is absent holds no live work.
        tables = {r[0] for r in conn.execute(TABLES_SQL)}
        if LEDGER_TABLES <= tables:
            _refuse_busy(conn, doomed)
        ids = json.dumps(sorted(doomed))
        for sql in DELETE_ROWS_SQL:
            if _changed_table(sql) in tables:
                conn.execute(sql, {"ids": ids})
    return doomed


def _changed_table(sql: str) -> str:
    match = _TABLE_RE.match(sql)
    return match[1] if match else ""


def _delete_rows(conn: sqlite3.Connection, /, session_ids: Collection[str]) -> None:
    """Delete the sessions and everything referring to them; the caller checked live work."""
    ids = json.dumps(sorted(session_ids))
    for sql in DELETE_ROWS_SQL:
        conn.execute(sql, {"ids": ids})


def _refuse_busy(conn: sqlite3.Connection, /, session_ids: Collection[str]) -> None:
    busy = sorted(_busy(conn, session_ids))
    if busy:
        raise LedgerBusyError(
            f"session(s) {', '.join(busy)} hold live admissions or worker executions; "
            f"nothing deleted",
            session_id=busy[0],
        )


def _delete_cascading(
    conn: sqlite3.Connection, /, session_ids: Collection[str], sessions_dir: Any
) -> Deleted[list[str]]:
    """Delete ``session_ids`` with their delegate children; the result is the requested ids
    that existed."""
    directory = _check_sessions_dir(sessions_dir)
    doomed = deletion_closure(conn, session_ids)
    if not doomed:
        return Deleted([], (), directory)
    _refuse_busy(conn, doomed)
    existed = [r[0] for r in conn.execute(EXISTING_SQL, (json.dumps(sorted(session_ids)),))]
    _delete_rows(conn, doomed)
    return Deleted(existed, tuple(doomed), directory)


def _run_delete_session(
    conn: sqlite3.Connection, /, session_id: str, sessions_dir: Path | None = None
) -> Deleted[bool]:
    done = _delete_cascading(conn, [arguments.text("session_id", session_id)], sessions_dir)
    return Deleted(bool(done.result), done.session_ids, done.sessions_dir)


def delete_session(
    conn: sqlite3.Connection, /, session_id: str, sessions_dir: Path | None = None
) -> bool:
    """Delete a session, its messages, usage and terminal ledger rows, and its delegate
    children (transitively) the same way; detach its other children. True when it existed.

    Raises :class:`LedgerBusyError` (nothing deleted) while the ledgers of any session it
    would delete hold live work."""
    return AfterCommit.finish(_run_delete_session(conn, session_id, sessions_dir))


DELETE_SESSION = AfterCommit(delete_session, _run_delete_session)


def _run_delete_sessions(
    conn: sqlite3.Connection, /, session_ids: list[str], sessions_dir: Path | None = None
) -> Deleted[int]:
    if isinstance(session_ids, (str, bytes)) or not isinstance(session_ids, Iterable):
        raise InvalidInputError(
            f"session_ids must be a list of ids, got {type(session_ids).__name__}"
        )
    wanted = {sid for sid in session_ids if isinstance(sid, str) and sid}
    done = _delete_cascading(conn, wanted, sessions_dir)
    return Deleted(len(done.result), done.session_ids, done.sessions_dir)


def delete_sessions(
    conn: sqlite3.Connection, /, session_ids: list[str], sessions_dir: Path | None = None
) -> int:
    """:func:`delete_session` for a batch, in one transaction: non-string and empty ids are
    dropped, duplicates collapsed, unknown ids ignored. Returns how many of the ids existed
    (and were deleted); :class:`LedgerBusyError` deletes nothing."""
    return AfterCommit.finish(_run_delete_sessions(conn, session_ids, sessions_dir))


DELETE_SESSIONS = AfterCommit(delete_sessions, _run_delete_sessions)


# The columns a deletion's list shows of each session (the command line's previews).
CANDIDATE_COLUMNS = (
    "id", "source", "title", "model", "started_at", "ended_at", "message_count", "archived",
)
CANDIDATE_ROWS_SQL = f"""
SELECT {", ".join(CANDIDATE_COLUMNS)} FROM sessions
WHERE id IN (SELECT value FROM json_each(?))
ORDER BY started_at, id
"""


def _candidate_rows(conn: sqlite3.Connection, /, ids: Collection[str]) -> list[dict[str, Any]]:
    cursor = conn.execute(CANDIDATE_ROWS_SQL, (json.dumps(sorted(ids)),))
    return [row_to_dict(cursor, r) for r in cursor.fetchall()]


def list_delete_candidates(conn: sqlite3.Connection, /, session_id: str) -> list[dict[str, Any]]:
    """What ``delete_session(session_id)`` would delete now: the session first, then each
    delegate child it takes along, oldest first; the columns of
    :func:`list_prune_candidates`. Empty for an unknown session. Reads only."""
    rows = _candidate_rows(conn, deletion_closure(conn, [arguments.text("session_id", session_id)]))
    return sorted(rows, key=lambda row: row["id"] != session_id)


# Empty in the sense of a session abandoned before it began: no title, no messages, no child.
# Under the write lock the transaction holds, no message can be flushed between this check
# and the delete.
IF_EMPTY_SQL = """
SELECT 1 FROM sessions s
WHERE s.id = ? AND s.title IS NULL
  AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id)
  AND NOT EXISTS (SELECT 1 FROM sessions c WHERE c.parent_session_id = s.id)
"""


def _run_delete_session_if_empty(
    conn: sqlite3.Connection, /, session_id: str, sessions_dir: Path | None = None
) -> Deleted[bool]:
    directory = _check_sessions_dir(sessions_dir)
    session_id = arguments.text("session_id", session_id)
    if conn.execute(IF_EMPTY_SQL, (session_id,)).fetchone() is None or _busy(conn, [session_id]):
        return Deleted(False, (), directory)
    _delete_rows(conn, [session_id])
    return Deleted(True, (session_id,), directory)


def delete_session_if_empty(
    conn: sqlite3.Connection, /, session_id: str, sessions_dir: Path | None = None
) -> bool:
    """Delete the session only while it has no title, no messages and no child session
    (live or ended alike), and no live ledger work; True when it was deleted."""
    return AfterCommit.finish(_run_delete_session_if_empty(conn, session_id, sessions_dir))


DELETE_SESSION_IF_EMPTY = AfterCommit(delete_session_if_empty, _run_delete_session_if_empty)


# --- the prune selection ---------------------------------------------------------------------


def _substring(name: str, value: Any) -> str:
    return f"%{escape_like(arguments.text(name, value))}%"


@dataclass(frozen=True)
class PruneFilter:
    """One filter of the vocabulary: its SQL condition over ``s`` (one ``?`` per parameter)
    and how a value becomes its parameters."""

    sql: str
    params: Callable[[str, Any], tuple[Any, ...]]


def _one(convert: Callable[[str, Any], Any]) -> Callable[[str, Any], tuple[Any, ...]]:
    return lambda name, value: (convert(name, value),)


def _cwd_prefix(name: str, value: Any) -> tuple[Any, ...]:
    """The prefix without trailing separators (unless nothing else would remain): the cwd
    equals it, or starts with it and a separator."""
    prefix = arguments.text(name, value)
    prefix = prefix.rstrip("/\\") or prefix
    return prefix, prefix + "/", prefix + "/", prefix + "\\", prefix + "\\"


def _archived(name: str, value: Any) -> tuple[Any, ...]:
    if not isinstance(value, bool):
        raise InvalidInputError(f"{name} must be True, False or None, got {value!r}")
    return (int(value),)


_TOKENS = "(COALESCE(s.input_tokens, 0) + COALESCE(s.output_tokens, 0))"
_COST = "COALESCE(s.actual_cost_usd, s.estimated_cost_usd, 0)"
_LIKE = "LIKE ? ESCAPE '\\'"

#: The filters ``list_prune_candidates``, ``prune_sessions`` and ``archive_sessions`` take, all
#: ANDed; a None value is no bound. Text comparisons are exact; ``provider`` and the ``*_like``
#: substrings ignore ASCII case (SQLite's ``lower`` and ``LIKE``).
PRUNE_FILTERS: Mapping[str, PruneFilter] = {
    "started_before": PruneFilter("s.started_at < ?", _one(arguments.number)),
    "started_after": PruneFilter("s.started_at >= ?", _one(arguments.number)),
    "source": PruneFilter("s.source = ?", _one(arguments.text)),
    "end_reason": PruneFilter("s.end_reason = ?", _one(arguments.text)),
    "user_id": PruneFilter("s.user_id = ?", _one(arguments.text)),
    "chat_id": PruneFilter("s.chat_id = ?", _one(arguments.text)),
    "chat_type": PruneFilter("s.chat_type = ?", _one(arguments.text)),
    "provider": PruneFilter("lower(s.billing_provider) = lower(?)", _one(arguments.text)),
    "title_like": PruneFilter(f"s.title {_LIKE}", _one(_substring)),
    "model_like": PruneFilter(f"s.model {_LIKE}", _one(_substring)),
    "branch_like": PruneFilter(f"s.git_branch {_LIKE}", _one(_substring)),
    "cwd_prefix": PruneFilter(
        "(s.cwd = ? OR substr(s.cwd, 1, length(?)) = ? OR substr(s.cwd, 1, length(?)) = ?)",
        _cwd_prefix,
    ),
    "min_messages": PruneFilter("COALESCE(s.message_count, 0) >= ?", _one(arguments.number)),
    "max_messages": PruneFilter("COALESCE(s.message_count, 0) <= ?", _one(arguments.number)),
    "min_tokens": PruneFilter(f"{_TOKENS} >= ?", _one(arguments.number)),
    "max_tokens": PruneFilter(f"{_TOKENS} <= ?", _one(arguments.number)),
    "min_cost": PruneFilter(f"{_COST} >= ?", _one(arguments.number)),
    "max_cost": PruneFilter(f"{_COST} <= ?", _one(arguments.number)),
    "min_tool_calls": PruneFilter("COALESCE(s.tool_call_count, 0) >= ?", _one(arguments.number)),
    "max_tool_calls": PruneFilter("COALESCE(s.tool_call_count, 0) <= ?", _one(arguments.number)),
    "archived": PruneFilter("COALESCE(s.archived, 0) = ?", _archived),
}

# Ended sessions, narrowed by the filters' conditions.
PRUNE_CANDIDATES_SQL = "SELECT s.id FROM sessions s WHERE s.ended_at IS NOT NULL{conditions}"


def _conditions(
    older_than_days: Any, source: Any, filters: Mapping[str, Any]
) -> tuple[str, list[Any]]:
    unknown = sorted(set(filters) - set(PRUNE_FILTERS))
    if unknown:
        raise UnknownFilterError(
            f"unknown prune filter(s): {', '.join(unknown)}", names=unknown
        )
    bounds = {**filters, "source": source}
    if bounds.get("started_before") is None and older_than_days is not None:
        days = arguments.number("older_than_days", older_than_days)
        if days < 0:
            raise InvalidInputError(f"older_than_days must not be negative, got {days!r}")
        bounds["started_before"] = now() - days * 86400.0
    sql, params = "", list[Any]()
    for name, value in bounds.items():
        if value is not None:
            sql += f" AND {PRUNE_FILTERS[name].sql}"
            params.extend(PRUNE_FILTERS[name].params(name, value))
    return sql, params


def select_prune_ids(
    conn: sqlite3.Connection,
    /,
    older_than_days: float | None,
    source: str | None = None,
    *,
    filters: Mapping[str, Any] | None = None,
    only_ids: Collection[str] | None = None,
) -> list[str]:
    """The sessions a prune deletes, sorted: the one place that selection is made, so the
    list a caller is shown and what a prune deletes cannot differ.

    Ended sessions that pass every filter (``older_than_days``: started more than that many
    days ago, unless ``started_before`` is given), and of ``only_ids`` when given; those whose
    ledgers hold live work are left out, and a session is kept while any member of its
    conversation is not selected. Reads only."""
    sql, params = _conditions(older_than_days, source, filters or {})
    candidates = {r[0] for r in conn.execute(PRUNE_CANDIDATES_SQL.format(conditions=sql), params)}
    if only_ids is not None:
        candidates &= set(only_ids)
    # Busy sessions are taken out first, so that a chain with a busy member is not a subset
    # of what may go and stays whole.
    deletable = candidates - _busy(conn, candidates)
    return sorted(sid for sid in deletable if conversation_members(conn, sid) <= deletable)


def list_prune_candidates(
    conn: sqlite3.Connection,
    /,
    older_than_days: float | None = None,
    source: str | None = None,
    **filters: Any,
) -> list[dict[str, Any]]:
    """What ``prune_sessions`` with the same arguments would delete now, oldest first
    (``started_at``): ``id, source, title, model, started_at, ended_at, message_count,
    archived``. Reads only."""
    return _candidate_rows(conn, select_prune_ids(conn, older_than_days, source, filters=filters))


def _run_prune_sessions(
    conn: sqlite3.Connection,
    /,
    older_than_days: float | None = 90,
    source: str | None = None,
    sessions_dir: Path | None = None,
    *,
    only_ids: Collection[str] | None = None,
    **filters: Any,
) -> Deleted[int]:
    directory = _check_sessions_dir(sessions_dir)
    ids = select_prune_ids(conn, older_than_days, source, filters=filters, only_ids=only_ids)
    _delete_rows(conn, ids)
    return Deleted(len(ids), tuple(ids), directory)


def prune_sessions(
    conn: sqlite3.Connection,
    /,
    older_than_days: float | None = 90,
    source: str | None = None,
    sessions_dir: Path | None = None,
    *,
    only_ids: Collection[str] | None = None,
    **filters: Any,
) -> int:
    """Delete what :func:`select_prune_ids` selects (children outside it are detached, never
    deleted); returns how many. ``only_ids`` bounds the deletion to sessions a caller was
    shown: one that changed since is kept, one that qualified only since is not deleted."""
    return AfterCommit.finish(_run_prune_sessions(
        conn, older_than_days, source, sessions_dir, only_ids=only_ids, **filters
    ))


PRUNE_SESSIONS = AfterCommit(prune_sessions, _run_prune_sessions)


def archive_sessions(
    conn: sqlite3.Connection,
    /,
    older_than_days: float | None = None,
    source: str | None = None,
    **filters: Any,
) -> int:
    """Archive (deliberately) each conversation the prune selection names — ``archived``
    defaulting to False, so a rerun is a no-op; deletes nothing. Returns how many sessions
    were selected."""
    filters.setdefault("archived", False)
    ids = select_prune_ids(conn, older_than_days, source, filters=filters)
    for session_id in ids:
        set_session_archived(conn, session_id, True)
    return len(ids)


# --- the callers' clean-ups ------------------------------------------------------------------

# Counter-empty: no messages counted, ended, not archived.
EMPTY_SESSIONS_SQL = """
SELECT id FROM sessions
WHERE COALESCE(message_count, 0) = 0 AND ended_at IS NOT NULL AND COALESCE(archived, 0) = 0
"""


def count_empty_sessions(conn: sqlite3.Connection, /) -> int:
    """How many ended, unarchived sessions count no messages."""
    return len(conn.execute(EMPTY_SESSIONS_SQL).fetchall())


def _run_delete_empty_sessions(
    conn: sqlite3.Connection, /, sessions_dir: Path | None = None
) -> Deleted[int]:
    directory = _check_sessions_dir(sessions_dir)
    empty = {r[0] for r in conn.execute(EMPTY_SESSIONS_SQL)}
    ids = sorted(empty - _busy(conn, empty))
    _delete_rows(conn, ids)
    return Deleted(len(ids), tuple(ids), directory)


def delete_empty_sessions(conn: sqlite3.Connection, /, sessions_dir: Path | None = None) -> int:
    """Delete the sessions :func:`count_empty_sessions` counts (but those with live ledger
    work): every child is detached, delegates too; stray messages go. Returns how many."""
    return AfterCommit.finish(_run_delete_empty_sessions(conn, sessions_dir))


DELETE_EMPTY_SESSIONS = AfterCommit(delete_empty_sessions, _run_delete_empty_sessions)

# A ghost: a terminal session that ended without a title or a message over a day ago.
GHOST_SESSIONS_SQL = """
SELECT s.id FROM sessions s
WHERE s.source = 'tui' AND s.title IS NULL AND s.ended_at IS NOT NULL AND s.started_at < ?
  AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id)
"""
CHILD_OF_SQL = """
SELECT parent_session_id, id FROM sessions
WHERE parent_session_id IN (SELECT value FROM json_each(?)) ORDER BY parent_session_id, id
LIMIT 1
"""


def _run_prune_empty_ghost_sessions(
    conn: sqlite3.Connection, /, sessions_dir: Path | None = None
) -> Deleted[int]:
    directory = _check_sessions_dir(sessions_dir)
    ghosts = {r[0] for r in conn.execute(GHOST_SESSIONS_SQL, (now() - 86400.0,))}
    ids = sorted(ghosts - _busy(conn, ghosts))
    child = conn.execute(CHILD_OF_SQL, (json.dumps(ids),)).fetchone()
    if child is not None:
        raise StateDbConstraintError(
            f"ghost session {child[0]} has a child session {child[1]}; no ghost deleted"
        )
    _delete_rows(conn, ids)
    return Deleted(len(ids), tuple(ids), directory)


def prune_empty_ghost_sessions(
    conn: sqlite3.Connection, /, sessions_dir: Path | None = None
) -> int:
    """Delete the ``tui`` sessions that ended untitled and without a message, started over 24 h
    ago; returns how many. A ghost with a child session deletes none of them
    (:class:`StateDbConstraintError`): children are not detached for a ghost."""
    return AfterCommit.finish(_run_prune_empty_ghost_sessions(conn, sessions_dir))


PRUNE_EMPTY_GHOST_SESSIONS = AfterCommit(
    prune_empty_ghost_sessions, _run_prune_empty_ghost_sessions
)

# Continuations that never made a call, left live for a week under a compressed parent.
FINALIZE_ORPHANED_SQL = """
UPDATE sessions SET ended_at = :now, end_reason = 'orphaned_compression'
WHERE COALESCE(api_call_count, 0) = 0 AND end_reason IS NULL AND ended_at IS NULL
  AND started_at < :cutoff
  AND EXISTS (SELECT 1 FROM sessions p WHERE p.id = sessions.parent_session_id
              AND p.ended_at IS NOT NULL AND p.end_reason = 'compression')
  AND EXISTS (SELECT 1 FROM messages m WHERE m.session_id = sessions.id)
"""


def finalize_orphaned_compression_sessions(conn: sqlite3.Connection, /) -> int:
    """End (``orphaned_compression``) the live sessions started over 7 days ago that made no
    API call, have messages and whose parent ended by compression; returns how many.
    Messages are untouched."""
    stamp = now()
    return conn.execute(
        FINALIZE_ORPHANED_SQL, {"now": stamp, "cutoff": stamp - 7 * 86400.0}
    ).rowcount


# --- the automatic prune ---------------------------------------------------------------------

AUTO_PRUNE_KEY = "last_auto_prune"
# Where earlier versions of this library kept it.
_EARLIER_AUTO_PRUNE_KEY = "auto_prune_last_run_at"


def _last_run(conn: sqlite3.Connection, /) -> float | None:
    text = get_meta(conn, AUTO_PRUNE_KEY) or get_meta(conn, _EARLIER_AUTO_PRUNE_KEY)
    try:
        last = float(text) if text is not None else None
    except ValueError:
        return None  # unparseable counts as never
    return last if last is not None and math.isfinite(last) else None


def claim_auto_prune(
    conn: sqlite3.Connection, /, min_interval_hours: float
) -> tuple[bool, str | None]:
    """(due, the stamp it replaced). When due, the run is stamped now, in the same
    transaction as the check: two processes starting together do not both prune."""
    hours = arguments.number("min_interval_hours", min_interval_hours)
    last = _last_run(conn)
    if last is not None and now() - last < hours * 3600:
        return False, None
    previous = get_meta(conn, AUTO_PRUNE_KEY)
    set_meta(conn, AUTO_PRUNE_KEY, repr(now()))
    return True, previous


DELETE_META_SQL = "DELETE FROM state_meta WHERE key = ?"


def restore_auto_prune(conn: sqlite3.Connection, /, previous: str | None) -> None:
    """Put back the stamp a failed run replaced, so the next start tries again."""
    if previous is None:
        conn.execute(DELETE_META_SQL, (AUTO_PRUNE_KEY,))
    else:
        set_meta(conn, AUTO_PRUNE_KEY, previous)


class AutoPruned(Protocol):
    """What the automatic prune needs of a handle (``SessionDB``)."""

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    def prune_sessions(self, older_than_days: float, *, sessions_dir: Path | None = ...) -> int: ...

    def vacuum(self) -> int: ...


def maybe_auto_prune_and_vacuum(
    db: AutoPruned,
    retention_days: float = 90,
    min_interval_hours: float = 24,
    vacuum: bool = True,
    sessions_dir: Path | None = None,
) -> dict[str, Any]:
    """The automatic prune a caller runs at start-up, through the handle ``db``: at most once
    per ``min_interval_hours`` (``state_meta['last_auto_prune']``, epoch seconds),
    ``db.prune_sessions(retention_days, sessions_dir=...)``, and a VACUUM only when something
    was pruned.

    Always ``{"skipped", "pruned", "vacuumed"}``, plus ``"error"`` (its text) when a step
    failed — it never raises, a closed handle included. A failed VACUUM is logged and only
    leaves ``vacuumed`` False; a failed prune puts the previous stamp back, so the next start
    tries again."""
    report: dict[str, Any] = {"skipped": False, "pruned": 0, "vacuumed": False}
    write = db._write
    try:
        due, previous = write(lambda conn: claim_auto_prune(conn, min_interval_hours))
        if not due:
            return {**report, "skipped": True}
        try:
            report["pruned"] = db.prune_sessions(retention_days, sessions_dir=sessions_dir)
        except Exception:
            with contextlib.suppress(Exception):
                write(lambda conn: restore_auto_prune(conn, previous))
            raise
        if vacuum and report["pruned"]:
            try:
                db.vacuum()
                report["vacuumed"] = True
            except Exception as exc:  # the prune stands; the file is only not compacted
                logger.warning("VACUUM after the automatic prune failed: %s", exc)
    except Exception as exc:  # never raises: the callers run this at start-up
        logger.warning("automatic prune failed: %s", exc)
        report["error"] = str(exc) or type(exc).__name__
    return report


def refused_auto_prune(refusal: Exception) -> dict[str, Any]:
    """The report of an automatic prune whose arguments were refused: nothing was done, and,
    as :func:`maybe_auto_prune_and_vacuum` never raises, the refusal is its ``error``."""
    logger.warning("automatic prune refused: %s", refusal)
    return {"skipped": False, "pruned": 0, "vacuumed": False, "error": str(refusal)}
