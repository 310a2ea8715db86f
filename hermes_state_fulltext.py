"""What full-text search this process's SQLite offers, and what a handle uses of it.

Some SQLite builds lack FTS5 (``CREATE VIRTUAL TABLE ... USING fts5`` fails with ``no such
module: fts5``), and builds older than 3.34 lack its ``trigram`` tokenizer. A handle works on
all of them, at one of three *levels*:

* ``"full"``: the three FTS5 indexes and the search index, kept by their triggers;
* ``"no-trigram"``: FTS5 without the trigram tokenizer. A new store gets no
  ``messages_fts_trigram``; an indexed store's sync triggers are swapped for ones that feed
  the two other indexes only, with ``fts_trigram_stale`` set (again by any write that meets
  the full triggers). Word searches, Latin and CJK, keep ``messages_fts`` and
  ``messages_fts_cjk``; the substring routes the trigram index serves (text inside longer
  words) scan the canonical rows instead, with the same conditions, in every process while
  the marker is set;
* ``"none"``: no full-text index at all. A new store gets every canonical table but none of the
  FTS tables or their triggers; an existing store's index is *detached* (its sync triggers
  dropped, ``fts_stale`` set to reason :data:`UNAVAILABLE_REASON`) at open, and again by any
  write that finds triggers another process put back meanwhile, so no write is ever refused.
  Searches answer from a scan of the canonical rows (``hermes_state_scan``). The next writable
  open by a process whose SQLite has FTS5 creates what is missing and rebuilds the index (only
  when no other process has the file open: see ``hermes_state_fts``).

:func:`detected` asks this process's SQLite once (an FTS5 table and a trigram table created in
an in-memory database); :func:`resolve` turns a handle's ``full_text`` parameter into its level:
None follows the detection, a level may lower it (a test, or a deployment that wants the store
kept without index), and asking for more than the build has raises
:class:`~hermes_state_errors.FullTextUnavailableError`.
"""

from __future__ import annotations

import functools
import sqlite3

from hermes_state_errors import FullTextUnavailableError, InvalidInputError

__all__ = [
    "FULL",
    "LEVELS",
    "NONE",
    "NO_TRIGRAM",
    "TRIGRAM_UNAVAILABLE_REASON",
    "UNAVAILABLE_REASON",
    "detected",
    "is_unavailable_error",
    "level_of",
    "register",
    "resolve",
    "unavailable",
]

FULL = "full"
NO_TRIGRAM = "no-trigram"
NONE = "none"
# From the most to the least.
LEVELS = (FULL, NO_TRIGRAM, NONE)
# The ``fts_stale`` reason a handle without FTS5 records when it detaches the index, and the
# ``fts_trigram_stale`` one of a handle without the trigram tokenizer.
UNAVAILABLE_REASON = "fts5-unavailable"
TRIGRAM_UNAVAILABLE_REASON = "trigram-unavailable"

_FTS5_PROBE_SQL = "CREATE VIRTUAL TABLE temp.probe_fts5 USING fts5(x)"
_TRIGRAM_PROBE_SQL = "CREATE VIRTUAL TABLE temp.probe_trigram USING fts5(x, tokenize='trigram')"


@functools.cache
def detected() -> str:
    """The level this process's SQLite supports (asked once per process)."""
    conn = sqlite3.connect(":memory:")
    try:
        try:
            conn.execute(_FTS5_PROBE_SQL)
        except sqlite3.Error:
            return NONE
        try:
            conn.execute(_TRIGRAM_PROBE_SQL)
        except sqlite3.Error:
            return NO_TRIGRAM
        return FULL
    finally:
        conn.close()


def resolve(requested: object) -> str:
    """A handle's level for its ``full_text`` parameter (see the module's text)."""
    available = detected()
    if requested is None:
        return available
    if not isinstance(requested, str) or requested not in LEVELS:
        raise InvalidInputError(
            f"full_text must be None or one of {', '.join(map(repr, LEVELS))}, "
            f"got {requested!r}", argument="full_text")
    if LEVELS.index(requested) < LEVELS.index(available):
        raise FullTextUnavailableError(
            f"full_text={requested!r} asked for, but this SQLite ({sqlite3.sqlite_version}) "
            f"offers {available!r} only", level=available)
    return requested


# What a build without FTS5 (or without the trigram tokenizer) says when a statement needs it:
# creating an index, or writing a row whose triggers feed one. SQLite's result code for both is
# SQLITE_ERROR, shared with every syntax error, so here the text is the only difference.
_UNAVAILABLE_MESSAGES = ("no such module: fts5", "no such tokenizer: trigram")


def is_unavailable_error(exc: BaseException) -> bool:
    """Whether ``exc`` says this SQLite lacks FTS5 (or the trigram tokenizer)."""
    return isinstance(exc, sqlite3.OperationalError) and any(
        text in str(exc) for text in _UNAVAILABLE_MESSAGES)


def unavailable(level: str, what: str) -> FullTextUnavailableError:
    """The error of an index operation ``what`` on a handle at ``level``."""
    reason = ("this SQLite has no FTS5" if detected() == NONE
              else "this SQLite has no trigram tokenizer" if detected() == NO_TRIGRAM
              else "the handle was opened with full-text search off")
    return FullTextUnavailableError(
        f"{what}: full-text search is unavailable ({reason}; full_text={level!r}); searches "
        "answer from a scan of the stored messages", level=level)



# The SQL function through which a connection tells its handle's level to the library's code
# that gets the connection only (searches, index upkeep).
LEVEL_FUNCTION = "hermes_state_full_text"
_LEVEL_SQL = f"SELECT {LEVEL_FUNCTION}()"


def register(conn: sqlite3.Connection, /, level: str) -> None:
    """Record ``level`` on ``conn`` (see :func:`level_of`)."""
    conn.create_function(LEVEL_FUNCTION, 0, lambda: level, deterministic=True)


def level_of(conn: sqlite3.Connection, /) -> str:
    """The level recorded on ``conn``; what this SQLite offers for any other connection."""
    try:
        level = conn.execute(_LEVEL_SQL).fetchone()[0]
    except sqlite3.OperationalError:
        return detected()
    return str(level)
