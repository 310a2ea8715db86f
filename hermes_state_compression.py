"""Compression: generations, splits, compression locks, and the compressor's memory of failures.

* **In place** (:func:`archive_and_compact`): active rows become the archive
  (``active=0, compacted=1``) and the kept context is inserted again with its uids. A kept
  message thus exists twice, archived and live. Nothing may de-duplicate it: live reads see
  ``active=1`` only. Rows appended after the caller's read stay live.
* **Split** (:func:`publish_compression_child`): the child is written, the parent ends with
  ``end_reason='compression'`` and publishes the child as ``successor_session_id``.

Both continue the conversation, so both lift the idle clean-up's archive; a deliberate
archive stays.

**Locks** keep two processes from compressing one session. A lock is taken over only once
expired, or once its holder provably no longer exists (:func:`lock_holder_name` records pid,
host, PID namespace and start time). Doubt keeps the lock. Locks exclude compressors, not
appenders: ``seen_through_id`` protects appended turns.

**The compressor's memory** (fallback streak, failure cooldown) lives on the session row. The
compressor treats any failure there as "feature off", so these calls log errors and answer
0 or None."""

from __future__ import annotations

import math
import os
import re
import socket
import sqlite3
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from hermes_state_arguments import shown
from hermes_state_common import Bound, Text, clean_optional, now, stored_text
from hermes_state_errors import (
    CompressionConflictError,
    InvalidInputError,
    InvalidTypeError,
    SessionNotFoundError,
)
from hermes_state_messages import (
    RECOUNT_SQL,
    check_bound,
    insert_message,
    message_fields,
    message_list,
    put_back,
    take_unseen,
    tool_call_count_of,
)
from hermes_state_sessions import (
    create_session,
    get_session,
    lift_auto_archive,
    require_session,
)

__all__ = [
    "archive_and_compact",
    "archive_generation",
    "publish_compression_child",
    "lock_holder_name",
    "holder_is_gone",
    "try_acquire_compression_lock",
    "refresh_compression_lock",
    "release_compression_lock",
    "get_compression_lock_holder",
    "get_compression_fallback_streak",
    "set_compression_fallback_streak",
    "record_compression_failure_cooldown",
    "get_compression_failure_cooldown",
    "clear_compression_failure_cooldown",
]

# --- compression generations -----------------------------------------------------------------

ARCHIVE_GENERATION_SQL = """
UPDATE messages SET active = 0, compacted = 1 WHERE session_id = ? AND active = 1
"""

# Split compression: the parent ends by compression and forwards to its child.
PUBLISH_SUCCESSOR_SQL = """
UPDATE sessions SET ended_at = COALESCE(ended_at, ?), end_reason = 'compression',
                    successor_session_id = ?
WHERE id = ?
"""

# A deliberately archived parent hands its archive to the child it publishes.
INHERIT_DELIBERATE_ARCHIVE_SQL = """
UPDATE sessions SET archived = 1, auto_archived = 0
WHERE id = :child AND EXISTS (
    SELECT 1 FROM sessions WHERE id = :parent AND archived = 1 AND COALESCE(auto_archived, 0) = 0
)
"""


def _insert_generation(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    messages: Iterable[Mapping[str, Any]],
    count: bool,
) -> tuple[list[int], int]:
    """Insert message fields as active rows keeping the uids they carry; (ids, tool calls)."""
    ids, calls = [], 0
    for message in messages:
        fields = message_fields(message)
        fields["active"] = True
        ids.append(insert_message(conn, session_id, fields, count=count))
        calls += tool_call_count_of(str(fields.get("role")), fields.get("tool_calls"))
    return ids, calls


def archive_generation(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    compacted_messages: Iterable[Mapping[str, Any]],
    *,
    seen_through_id: Bound | None = None,
) -> list[int]:
    """:func:`archive_and_compact`, returning the ids of the new generation's rows."""
    bound = check_bound(seen_through_id)
    require_session(conn, session_id)
    generation = [message_fields(message)
                  for message in message_list(compacted_messages, "compacted_messages")]
    unseen = take_unseen(conn, session_id, bound, generation)
    conn.execute(ARCHIVE_GENERATION_SQL, (session_id,))
    ids, calls = _insert_generation(conn, session_id, generation, count=False)
    kept, kept_calls = put_back(conn, unseen)
    conn.execute(RECOUNT_SQL, (len(ids) + kept, calls + kept_calls, session_id))
    lift_auto_archive(conn, session_id)
    return ids


def archive_and_compact(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    compacted_messages: Iterable[Mapping[str, Any]],
    *,
    seen_through_id: Bound | None = None,
) -> int:
    """Compress a session in place (the caller's transaction); returns the number of rows
    inserted as the new active generation, i.e. ``len(compacted_messages)``.

    Every active row the caller saw becomes ``active=0, compacted=1``: those up to
    ``seen_through_id`` (the newest row of the session the caller read; None covers every
    row present) and any above it whose ``message_uid`` is among ``compacted_messages``. Each
    of ``compacted_messages`` (append, export or replay format) is inserted as an
    ``active=1`` row keeping the ``message_uid``, ``tool_call_uids`` and timestamp it
    carries, so protected messages legitimately appear in both generations. The other rows
    above the bound were appended after the caller's read: they stay live, after the new
    generation, every column kept (see ``hermes_state_messages``). Earlier archives are left
    alone. The session's counters describe the live rows, as after
    :func:`~hermes_state_messages.replace_messages`.
    """
    return len(archive_generation(
        conn, session_id, compacted_messages, seen_through_id=seen_through_id
    ))


def publish_compression_child(
    conn: sqlite3.Connection,
    /,
    parent_session_id: str,
    child_session_id: str,
    source: str,
    messages: Iterable[Mapping[str, Any]],
    **session_columns: Any,
) -> str:
    """Split a session (the caller's transaction); returns the child's id.

    Creates the child with ``parent_session_id`` (``session_columns`` may set any other column
    of ``sessions``: ``model``, ``user_id``, ``session_key``…; nothing is copied from the
    parent implicitly but a deliberate archive), writes ``messages`` into it (uids kept), ends
    the parent with ``end_reason='compression'`` (a parent ended earlier for another reason
    is re-labelled: it now has a compression successor) and publishes the child as its
    ``successor_session_id``. An archive the idle clean-up set on the conversation is lifted.

    Raises :class:`CompressionConflictError` when the parent already has a published
    successor or the child id is taken: one conversation never forks into two live tips.
    """
    parent = get_session(conn, parent_session_id)
    if parent is None:
        raise SessionNotFoundError(parent_session_id)
    if parent["successor_session_id"] is not None:
        raise CompressionConflictError(
            f"session {parent_session_id} already forwards to {parent['successor_session_id']}"
        )
    if get_session(conn, child_session_id) is not None:
        raise CompressionConflictError(f"session {child_session_id} already exists")
    create_session(
        conn, child_session_id, source, parent_session_id=parent_session_id, **session_columns
    )
    _insert_generation(conn, child_session_id, message_list(messages), count=True)
    conn.execute(PUBLISH_SUCCESSOR_SQL, (now(), child_session_id, parent_session_id))
    lift_auto_archive(conn, child_session_id)
    conn.execute(
        INHERIT_DELIBERATE_ARCHIVE_SQL, {"child": child_session_id, "parent": parent_session_id}
    )
    return child_session_id


# --- compression locks -----------------------------------------------------------------------

_PID_RE = re.compile(r"(?<![\w-])pid=(\d+)(?!\w)")
_HOST_RE = re.compile(r"(?<![\w-])host=(\S+)")
_PIDNS_RE = re.compile(r"(?<![\w-])pidns=(\d+)(?!\w)")
_START_RE = re.compile(r"(?<![\w-])start=(\d+)(?!\w)")
_NS_INODE_RE = re.compile(r"\[(\d+)\]")


def _pid_namespace() -> str | None:
    """The inode of this process's PID namespace (``/proc/self/ns/pid``), None unknown."""
    try:
        match = _NS_INODE_RE.search(os.readlink("/proc/self/ns/pid"))
    except OSError:
        return None
    return None if match is None else match.group(1)


def _proc_is_ours() -> bool:
    """True when ``/proc`` shows this PID namespace (``/proc/self`` is our own pid): only then
    does ``/proc/<n>`` describe the process we call ``n``."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def _start_time(pid: int | str) -> str | None:
    """When process ``pid`` started (``/proc/<pid>/stat`` field 22, clock ticks since boot);
    None when there is no such process or no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat_line = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = stat_line[stat_line.rfind(")") + 2:].split()  # the name may hold spaces
    return fields[19] if len(fields) > 19 else None


def lock_holder_name(label: str = "") -> str:
    """A holder string for this process: ``host=<hostname> pid=<pid>``, where known
    ``pidns=<PID namespace inode> start=<start time>`` (what proves it gone later, see
    :func:`holder_is_gone`), and the label."""
    parts = [f"host={socket.gethostname()}", f"pid={os.getpid()}"]
    namespace = _pid_namespace()
    if namespace is not None:
        parts.append(f"pidns={namespace}")
        start = _start_time("self")
        if start is not None:
            parts.append(f"start={start}")
    name = " ".join(parts)
    return f"{name} {label}" if label else name


def holder_is_gone(holder: str) -> bool:
    """True only when ``holder`` names a process of this host that provably no longer exists.

    A holder string that records its PID namespace is judged only from the same namespace (a
    pid means another process, or none, in any other); there, a recorded start time that
    differs from the pid's now proves the pid was reused. Without those facts (an older
    holder string) the pid alone is judged, as before. Never signals anything on Windows,
    where ``os.kill`` terminates the process.
    """
    match = _PID_RE.search(holder)
    if match is None or sys.platform == "win32":
        return False
    host = _HOST_RE.search(holder)
    if host is not None and host.group(1) != socket.gethostname():
        return False
    pid = int(match.group(1))
    if pid <= 0:
        return False
    namespace, start = _PIDNS_RE.search(holder), _START_RE.search(holder)
    if namespace is not None:
        if namespace.group(1) != _pid_namespace():
            return False  # another PID namespace: nothing here says whether it lives
        if start is not None and _proc_is_ours():
            now_started = _start_time(pid)
            if now_started is not None:
                return now_started != start.group(1)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OverflowError, OSError):
        return False  # alive but not ours to signal, or not a pid at all
    return False


def _check_ttl(ttl_seconds: float) -> float:
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, (int, float)):
        raise InvalidTypeError(f"ttl_seconds must be a number, got {type(ttl_seconds).__name__}")
    if not math.isfinite(ttl_seconds) or ttl_seconds <= 0:
        raise InvalidInputError(f"ttl_seconds must be positive and finite, got {ttl_seconds!r}")
    return float(ttl_seconds)


def _check_holder(holder: str) -> str:
    if not isinstance(holder, str) or not holder:
        raise InvalidInputError(f"holder must be a non-empty string, got {holder!r}")
    return holder


def _reclaimable(holder: str, expires_at: float, at: float) -> bool:
    return expires_at <= at or holder_is_gone(holder)


SELECT_LOCK_SQL = "SELECT holder, expires_at FROM compression_locks WHERE session_id = ?"
TAKE_LOCK_SQL = """
INSERT INTO compression_locks (session_id, holder, acquired_at, expires_at) VALUES (?, ?, ?, ?)
ON CONFLICT(session_id) DO UPDATE SET
    holder = excluded.holder, acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
"""
REFRESH_LOCK_SQL = """
UPDATE compression_locks SET expires_at = ? WHERE session_id = ? AND holder = ?
"""


def try_acquire_compression_lock(
    conn: sqlite3.Connection, /, session_id: str, holder: str, ttl_seconds: float = 300.0
) -> bool:
    """Take the session's compression lock for ``ttl_seconds`` (the caller's transaction).

    True when ``holder`` now holds it: it was free, expired, held by a provably gone process,
    or already ``holder``'s (then its expiry is extended). False while someone else holds it,
    and for an empty session id (no session to compress).
    """
    _check_holder(holder)
    ttl = _check_ttl(ttl_seconds)
    if not session_id:
        return False
    at = now()
    row = conn.execute(SELECT_LOCK_SQL, (session_id,)).fetchone()
    if row is not None and row[0] == holder:
        conn.execute(REFRESH_LOCK_SQL, (at + ttl, session_id, holder))
        return True
    if row is not None and not _reclaimable(row[0], row[1], at):
        return False
    conn.execute(TAKE_LOCK_SQL, (session_id, holder, at, at + ttl))
    return True


def refresh_compression_lock(
    conn: sqlite3.Connection, /, session_id: str, holder: str, ttl_seconds: float = 300.0
) -> bool:
    """Extend ``holder``'s lock to ``ttl_seconds`` from now; False when ``holder`` does not
    hold it (any more). A lapsed lock nobody took over yet is still the holder's."""
    ttl = _check_ttl(ttl_seconds)
    cursor = conn.execute(REFRESH_LOCK_SQL, (now() + ttl, session_id, _check_holder(holder)))
    return cursor.rowcount > 0


def release_compression_lock(conn: sqlite3.Connection, /, session_id: str, holder: str) -> None:
    """Release ``holder``'s lock; anyone else's lock (or none) is left as it is."""
    conn.execute(
        "DELETE FROM compression_locks WHERE session_id = ? AND holder = ?", (session_id, holder)
    )


def get_compression_lock_holder(conn: sqlite3.Connection, /, session_id: str) -> str | None:
    """The holder of the session's lock while it binds; None when there is no lock or it could
    be reclaimed (expired, or its holder is provably gone)."""
    row = conn.execute(SELECT_LOCK_SQL, (session_id,)).fetchone()
    if row is None or _reclaimable(row[0], row[1], now()):
        return None
    return str(row[0])


# --- the compressor's memory: fallback streak and failure cooldown ---------------------------


def _failure_key(session_id: str) -> str | None:
    return stored_text(session_id) if session_id else None


STREAK_SQL = "SELECT compression_fallback_streak FROM sessions WHERE id = ?"


def get_compression_fallback_streak(conn: sqlite3.Connection, /, session_id: str) -> int:
    """The stored streak, at least 0; 0 for an empty or unknown id or a non-integer value."""
    key = _failure_key(session_id)
    row = None if key is None else conn.execute(STREAK_SQL, (key,)).fetchone()
    value = None if row is None else row[0]
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return max(0, value)


SET_STREAK_SQL = "UPDATE sessions SET compression_fallback_streak = ? WHERE id = ?"


def set_compression_fallback_streak(
    conn: sqlite3.Connection, /, session_id: str, streak: Any
) -> None:
    """Store ``max(0, int(streak))``."""
    try:
        value = max(0, int(streak))
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInputError(f"streak must be an integer, got {shown(streak)}") from exc
    key = _failure_key(session_id)
    if key is not None:
        conn.execute(SET_STREAK_SQL, (min(value, 2**63 - 1), key))


SET_COOLDOWN_SQL = """
UPDATE sessions SET compression_failure_cooldown_until = ?, compression_failure_error = ?
WHERE id = ?
"""


def record_compression_failure_cooldown(
    conn: sqlite3.Connection, /, session_id: str, cooldown_until: float, error: Text | None = None
) -> None:
    """Remember that compression should not be tried again before ``cooldown_until`` (epoch
    seconds), and why."""
    try:
        until = float(cooldown_until)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"cooldown_until must be a time, got {cooldown_until!r}") from exc
    if not math.isfinite(until):
        raise InvalidInputError(f"cooldown_until must be finite, got {cooldown_until!r}")
    key = _failure_key(session_id)
    if key is not None:
        reason = None if error is None else clean_optional(str(error))
        conn.execute(SET_COOLDOWN_SQL, (until, reason, key))


COOLDOWN_SQL = """
SELECT compression_failure_cooldown_until, compression_failure_error FROM sessions WHERE id = ?
"""


def get_compression_failure_cooldown(
    conn: sqlite3.Connection, /, session_id: str
) -> dict[str, Any] | None:
    """``{"cooldown_until", "remaining_seconds", "error"}`` while a cooldown lies in the
    future; None otherwise (and for an empty or unknown id)."""
    key = _failure_key(session_id)
    row = None if key is None else conn.execute(COOLDOWN_SQL, (key,)).fetchone()
    if row is None or not isinstance(row[0], (int, float)) or isinstance(row[0], bool):
        return None
    until, remaining = float(row[0]), float(row[0]) - now()
    if remaining <= 0:
        return None
    return {"cooldown_until": until, "remaining_seconds": remaining, "error": row[1]}


CLEAR_COOLDOWN_SQL = """
UPDATE sessions SET compression_failure_cooldown_until = NULL, compression_failure_error = NULL
WHERE id = ?
"""


def clear_compression_failure_cooldown(conn: sqlite3.Connection, /, session_id: str) -> None:
    """End the cooldown and forget its error."""
    key = _failure_key(session_id)
    if key is not None:
        conn.execute(CLEAR_COOLDOWN_SQL, (key,))
