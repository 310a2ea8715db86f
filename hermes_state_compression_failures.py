"""What the context compressor remembers between turns about compressions that went wrong.

Two pieces of state on the session row:

* ``compression_fallback_streak`` — how many compressions in a row fell back to the cheap
  path; the compressor carries it from a session to its compression child, so it survives a
  split. Never negative; read as 0 when absent or not an integer.
* ``compression_failure_cooldown_until`` / ``compression_failure_error`` — after a failed
  compression, the wall-clock time before which the compressor should not try again, and why.
  A cooldown at or before now is over and reads as None.

The compressor probes for these methods and treats any failure as "feature off", so the
facade answers the streak read and the two cooldown writes leniently: a store error there is
logged and answered with 0 or None instead of raised. An empty session id is a no-op (or 0 /
None); an unknown id changes nothing.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any

from hermes_state_common import clean_optional, now, stored_text
from hermes_state_errors import InvalidInputError

__all__ = [
    "get_compression_fallback_streak",
    "set_compression_fallback_streak",
    "record_compression_failure_cooldown",
    "get_compression_failure_cooldown",
    "clear_compression_failure_cooldown",
]


def _key(session_id: str) -> str | None:
    return stored_text(session_id) if session_id else None


STREAK_SQL = "SELECT compression_fallback_streak FROM sessions WHERE id = ?"


def get_compression_fallback_streak(conn: sqlite3.Connection, /, session_id: str) -> int:
    """The stored streak, at least 0; 0 for an empty or unknown id or a non-integer value."""
    key = _key(session_id)
    row = None if key is None else conn.execute(STREAK_SQL, (key,)).fetchone()
    value = None if row is None else row[0]
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return max(0, value)


SET_STREAK_SQL = "UPDATE sessions SET compression_fallback_streak = ? WHERE id = ?"


def set_compression_fallback_streak(
    conn: sqlite3.Connection, /, session_id: str, streak: int
) -> None:
    """Store ``max(0, int(streak))``."""
    try:
        value = max(0, int(streak))
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInputError(f"streak must be an integer, got {streak!r}") from exc
    key = _key(session_id)
    if key is not None:
        conn.execute(SET_STREAK_SQL, (min(value, 2**63 - 1), key))


SET_COOLDOWN_SQL = """
UPDATE sessions SET compression_failure_cooldown_until = ?, compression_failure_error = ?
WHERE id = ?
"""


def record_compression_failure_cooldown(
    conn: sqlite3.Connection, /, session_id: str, cooldown_until: float, error: str | None = None
) -> None:
    """Remember that compression should not be tried again before ``cooldown_until`` (epoch
    seconds), and why."""
    try:
        until = float(cooldown_until)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"cooldown_until must be a time, got {cooldown_until!r}") from exc
    if not math.isfinite(until):
        raise InvalidInputError(f"cooldown_until must be finite, got {cooldown_until!r}")
    key = _key(session_id)
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
    key = _key(session_id)
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
    key = _key(session_id)
    if key is not None:
        conn.execute(CLEAR_COOLDOWN_SQL, (key,))
