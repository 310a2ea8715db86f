"""The search impact index: each message's high-impact postings, kept beside ``messages_fts``.

**Why.** FTS5 computes ``bm25()`` for every matching row before it sorts: 100 ms for a word
in half of 200,000 messages. But a row's place depends on its *impact* for each word,
f/(f + K(D)) with K(D) = k₁·(1 − b + b·D/avgdl). So each message keeps its high-impact
postings: every term whose impact under the index's reference length A reaches
:data:`THRESHOLD`. That is every word of a short message and the repeated words of a long
one, about one posting in seven. :mod:`hermes_state_rank` proves the best rows from them.

**Layout.** A posting is the token ``term_kkkk_f_D`` of ``search_impact_fts``, with
kkkk = ⌊(1 − impact)·10⁴⌋, beside the plain token ``term``. Within a term the keyed tokens
sort best first, so the ``fts5vocab`` instance view reads a term's postings in falling impact
and can stop early. f and D give each row's exact share. The rows indexed under every word of
a query are one FTS5 AND of the plain tokens. ``search_impact`` holds the same postings per
row.

**Coverage.** Messages are indexed in batches, from their stored text: every
:data:`CHECK_EVERY`-th id an insert looks whether :data:`FLUSH_ROWS` messages wait past the
batch boundary (``indexed``) and indexes them (:func:`after_insert`), and keeps the counts
of common words (:func:`_keep_word_counts`). An append in between
writes nothing for the index, because FTS5 writes a segment per commit. Triggers queue the
rows at or below the boundary that are inserted, changed or deleted; :func:`drain_queue`
indexes them a chunk per batch check. Searches score the rows not indexed yet from their text,
or rank with FTS5 when there are many.

**Creation and fill.** The index is derived data, like the FTS indexes. A file that lacks any
part of it, or declares its tables otherwise, gets it whole and empty at open
(:func:`create_index`), with a fill due up to the highest id. The fill runs like an FTS
rebuild: in the background of a writable open, under the admission lock, a chunk of
:data:`FILL_CHUNK_ROWS` rows per write transaction (:func:`fill_chunk`). Until it is done,
searches rank with FTS5.

**Consistency and damage.** Every index has an epoch, stored in ``search_impact_state``, in
each row of ``search_impact`` and as the token ``_epoch_<n>`` in ``search_impact_fts``. A
search checks that they agree, so a copy that kept one table without the other is never
trusted. Errors from the index never reach a canonical write: the index is marked damaged,
searches rank with FTS5, and the next writable open replaces it (:func:`reset_index`). A
search that finds damage says so for its file (:func:`notice_damage`); the process's next
write of a message there marks it (:func:`damage_noticed`). A table or trigger dropped under
an open handle is found by the write that meets it (:func:`missing_index_object`) or by a
search (:func:`mark_index_damaged`); either drops the rest, whose triggers would fail every
write of messages.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_state_arguments import INT64_MAX, INT64_MIN
from hermes_state_bm25 import (
    K1,
    TEXT_BYTES_SQL,
    B,
    ColumnValue,
    fts5_text,
    phrase_match,
    read_stats,
    row_counts,
)
from hermes_state_common import OnStore
from hermes_state_connect import split_sql, table_exists, transaction
from hermes_state_errors import (
    is_corruption_error,
    is_sqlite_lock_error,
    missing_table,
    unnamed_cause,
)
from hermes_state_fts import (
    CHUNK_END_SQL,
    RebuildStep,
    admission_lock,
    next_chunk_start,
    run_chunks,
)
from hermes_state_schema_sql import (
    IMPACT_DEFAULT_AVGDL,
    SEARCH_INDEX_SQL,
    SEARCH_TRIGGER_NAMES,
    SEARCH_TRIGGERS_SQL,
    TIME_BLOCK_SHIFT,
)

logger = logging.getLogger("hermes_state")

__all__ = [
    "ADD_ROW_SQL",
    "AFTER_INSERT_SQL",
    "CHECK_EVERY",
    "DECLARATIONS_SQL",
    "DRAIN_PER_WRITE",
    "FLUSH_ROWS",
    "FTS_ADD_SQL",
    "INDEX_FAULTS",
    "INDEX_OBJECTS",
    "INDEX_TABLES",
    "INDEX_VIRTUAL_TABLES",
    "KEY_SCALE",
    "MAX_FLUSH_ROWS",
    "MAX_TERM_CHARS",
    "SET_INDEXED_SQL",
    "THRESHOLD",
    "TIME_BLOCK_SQL",
    "UNFLUSHED_SQL",
    "IndexMismatch",
    "IndexState",
    "after_insert",
    "consistent",
    "create_index",
    "damage_noticed",
    "declared_otherwise",
    "drain_queue",
    "drop_index",
    "ensure_index",
    "fill_chunk",
    "fill_when_admitted",
    "impact_postings",
    "index_error",
    "index_health",
    "index_problem",
    "index_text",
    "index_whole",
    "least_frequency",
    "mark_index_damaged",
    "missing_index_object",
    "missing_objects",
    "needs_maintenance",
    "notice_damage",
    "read_state",
    "reset_index",
    "time_ranges",
]

THRESHOLD = 0.7
KEY_SCALE = 10_000
MAX_TERM_CHARS = 64

# ---------------------------------------------------------------------------------------------
# A row's postings
# ---------------------------------------------------------------------------------------------


def _reference_k(length: int, avgdl: float) -> float:
    return K1 * (1 - B + B * length / avgdl)


@functools.lru_cache(maxsize=8192)
def least_frequency(length: int, avgdl: float) -> int:
    """The smallest term frequency whose impact reaches THRESHOLD in a row of ``length``."""
    k = _reference_k(length, avgdl)
    return max(1, math.ceil(THRESHOLD * k / (1.0 - THRESHOLD) - 1e-9))


def impact_postings(
    content: ColumnValue, tool_name: ColumnValue, tool_calls: ColumnValue, avgdl: float
) -> tuple[str, int]:
    """A row's high-impact postings as index text (``term_kkkk_f_D`` tokens), and its length.

    ``avgdl`` is the index's reference length."""
    postings, _, length = _postings_of(content, tool_name, tool_calls, avgdl)
    return postings, length


def _postings_of(
    content: ColumnValue, tool_name: ColumnValue, tool_calls: ColumnValue, avgdl: float,
    sampled: Counter[str] | None = None,
) -> tuple[str, str, int]:
    """:func:`impact_postings`, with what :func:`index_text` makes of them ("" for none);
    each of the row's terms counts once in ``sampled``."""
    text = "\n".join(filter(None, map(fts5_text, (content, tool_name, tool_calls))))
    if not text:
        return "", "", 0
    counts, length = row_counts(text)
    if sampled is not None:
        sampled.update(counts.keys())
    least = least_frequency(length, avgdl)
    # A short row posts every word, a long row only its repeated words.
    posted = counts.items() if least == 1 else [(t, f) for t, f in counts.items() if f >= least]
    k = _reference_k(length, avgdl)
    keys: dict[int, str] = {}  # a posting's key depends on its frequency alone: most are 1
    terms: list[str] = []
    postings: list[str] = []
    for term, f in posted:
        if len(term) > MAX_TERM_CHARS or not term.isascii():
            continue  # words of other scripts, and over-long ones, are not posted
        key = keys.get(f)
        if key is None:
            key = keys[f] = f"_{int((1.0 - f / (f + k)) * KEY_SCALE):04d}_{f}_{length}"
        terms.append(term)
        postings.append(term + key)
    if not terms:
        return "", "", length
    text = " ".join(postings)
    return text, text + " " + " ".join(terms), length


# ---------------------------------------------------------------------------------------------
# Keeping the index
# ---------------------------------------------------------------------------------------------

# The plain tables, the virtual tables and the triggers: a file lacking any of them has its
# whole index created anew (see :func:`create_index`).
INDEX_TABLES = ("search_impact_state", "search_impact", "search_impact_queue",
                "search_impact_gone", "search_time_blocks", "search_row_changes",
                "search_word_counts")
INDEX_VIRTUAL_TABLES = ("search_impact_fts", "search_impact_vocab")
INDEX_OBJECTS = (*INDEX_TABLES, *INDEX_VIRTUAL_TABLES, *SEARCH_TRIGGER_NAMES)
_FTS_SHADOWS = ("search_impact_fts_data", "search_impact_fts_idx", "search_impact_fts_docsize",
                "search_impact_fts_config")


@dataclass(frozen=True)
class IndexState:
    """The row of ``search_impact_state``."""

    epoch: int
    avgdl: float  # the reference length A
    indexed: int  # rows of search_impact up to this id are in search_impact_fts
    fill_high_water: int | None  # a fill is due for the messages up to this id...
    fill_progress: int | None  # ...and has reached this one
    damaged: bool

    @property
    def whole(self) -> bool:
        return not self.damaged and self.fill_high_water is None


STATE_SQL = """
SELECT epoch, avgdl, indexed, fill_high_water, fill_progress, damaged FROM search_impact_state
"""


# The state of an index whose state row holds what the library never writes: damaged.
_MALFORMED = IndexState(0, IMPACT_DEFAULT_AVGDL, 0, None, None, True)


def _index_of(row: Sequence[Any]) -> IndexState:
    """The state from the first six columns of a row read by :data:`STATE_SQL`'s select; a
    damaged one for values the library never writes (a reference length that is not a
    positive number, ids that are not whole numbers)."""
    epoch, avgdl, indexed, high_water, progress, damaged = row[:6]
    numbers = (epoch, indexed, *(v for v in (high_water, progress) if v is not None))
    if (not all(type(v) is int for v in numbers) or type(avgdl) not in (int, float)
            or not math.isfinite(avgdl) or avgdl <= 0 or indexed < 0):
        return _MALFORMED
    return IndexState(epoch, float(avgdl), indexed, high_water, progress, bool(damaged))


def read_state(conn: sqlite3.Connection) -> IndexState | None:
    """The index's state; None on a file without it."""
    try:
        row = conn.execute(STATE_SQL).fetchone()
    except sqlite3.OperationalError as exc:
        if is_sqlite_lock_error(exc):
            raise
        return None
    return None if row is None else _index_of(row)


SET_INDEXED_SQL = "UPDATE search_impact_state SET indexed = ?"
SET_DAMAGED_SQL = "UPDATE search_impact_state SET damaged = 1"


def _mark_damaged(conn: sqlite3.Connection, exc: BaseException) -> None:
    logger.warning("search impact index damaged (%s); ranking falls back to FTS5", exc)
    conn.execute(SET_DAMAGED_SQL)


# The files whose impact index a search found damaged, by their main database file: a read
# cannot write the marker itself, so the process's next write of a message to that file does.
_damage_noticed: set[str] = set()
_DAMAGE_LOCK = threading.Lock()
FILE_SQL = "PRAGMA database_list"


def _file_of(conn: sqlite3.Connection) -> str:
    name = conn.execute(FILE_SQL).fetchone()[2]
    return os.path.realpath(name) if name else f":memory:{id(conn)}"


def notice_damage(conn: sqlite3.Connection) -> None:
    """Say that a read on ``conn`` found its file's impact index damaged."""
    file = _file_of(conn)
    with _DAMAGE_LOCK:
        _damage_noticed.add(file)


def damage_noticed(conn: sqlite3.Connection) -> bool:
    """Whether a search found the impact index of ``conn``'s file damaged since the last
    call for that file."""
    if not _damage_noticed:
        return False
    file = _file_of(conn)
    with _DAMAGE_LOCK:
        noticed = file in _damage_noticed
        _damage_noticed.discard(file)
    return noticed


def mark_index_damaged(conn: sqlite3.Connection) -> None:
    """Mark the impact index damaged (the caller's write transaction): the library stops
    keeping it, and the next writable open replaces it (see :func:`fill_when_admitted`). An
    index missing some of its objects is dropped instead: what is left of it serves no search,
    and its triggers would fail every write of messages."""
    try:
        if missing_objects(conn):
            drop_index(conn)
        else:
            conn.execute(SET_DAMAGED_SQL)
    except sqlite3.OperationalError as exc:
        if is_sqlite_lock_error(exc):
            raise  # else a file without the index: the next open creates it whole


class IndexMismatch(Exception):
    """The index's tables disagree: a row one of them indexes is missing from another."""


# What a damaged index can raise: SQLite's errors, Python's on values in its tables that the
# library did not write, and a mismatch between its tables (:func:`index_error` tells which
# mean the index is at fault).
_PYTHON_FAULTS = (MemoryError, ValueError, TypeError, ArithmeticError, IndexMismatch)
INDEX_FAULTS = (sqlite3.Error, *_PYTHON_FAULTS)


def missing_index_object(exc: BaseException) -> bool:
    """Whether ``exc`` says one of the index's own tables is missing (its triggers then fail
    every write of the rows they watch, until the index is dropped)."""
    return missing_table(exc) in (*INDEX_OBJECTS, *_FTS_SHADOWS)


def index_error(exc: BaseException) -> bool:
    """Errors that mean the impact index itself is unusable: corruption (garbage in an FTS5
    structure can also read as out of memory), one of its tables missing, FTS5 refusing its
    table's format, or values in its tables (or in messages, for its postings) the library did
    not write."""
    if isinstance(exc, _PYTHON_FAULTS):
        return True
    if not isinstance(exc, sqlite3.Error) or is_sqlite_lock_error(exc):
        return False
    if is_corruption_error(exc) or missing_index_object(exc):
        return True
    # FTS5 refusing its table's format; text another client stored in the index's own tables
    # that is not UTF-8 (its reads of messages take their bytes, which any value gives).
    cause = unnamed_cause(exc)
    return cause is not None and cause[0] in ("fts5_format", "undecodable_text")


# The key of a posting (``_kkkk_f_D``), ending where the token does.
_POSTING_KEY = re.compile(r"_\d+_\d+_\d+(?= |$)")


def index_text(postings: str) -> str:
    """What ``search_impact_fts`` indexes for a row: its postings, then each posting's term
    alone (so "indexed under every word of the query" is a plain FTS5 AND)."""
    return postings + " " + _POSTING_KEY.sub("", postings)


FTS_ADD_SQL = "INSERT INTO search_impact_fts (rowid, postings) VALUES (?, ?)"
FTS_REMOVE_SQL = """
INSERT INTO search_impact_fts (search_impact_fts, rowid, postings) VALUES ('delete', ?, ?)
"""
ADD_ROW_SQL = "INSERT OR REPLACE INTO search_impact (id, epoch, postings) VALUES (?, ?, ?)"
TIME_BLOCK_SQL = """
INSERT INTO search_time_blocks (block, first_at, last_at) VALUES (?, ?, ?)
ON CONFLICT (block) DO UPDATE SET first_at = min(first_at, excluded.first_at),
                                  last_at = max(last_at, excluded.last_at)
"""
# Messages are indexed in batches (FTS5 writes a segment per commit, which would cost more
# than a message's postings; tokenizing them is the same work at any time): searches read the
# rows past the batch boundary from their text meanwhile. An insert looks whether a batch is
# due at every CHECK_EVERY-th id (an id is handed out once, so some insert of the library
# sees each multiple); a batch is FLUSH_ROWS rows, and one write takes at most MAX_FLUSH_ROWS
# (a store where another program wrote many rows catches up over several writes).
CHECK_EVERY = 16
FLUSH_ROWS = 128
MAX_FLUSH_ROWS = 1024
AFTER_INSERT_SQL = """
SELECT epoch, avgdl, indexed, fill_high_water, fill_progress, damaged,
       EXISTS (SELECT 1 FROM search_impact_queue) OR EXISTS (SELECT 1 FROM search_impact_gone)
FROM search_impact_state
"""


def after_insert(conn: sqlite3.Connection, row_id: int) -> None:
    """Keep the index after the library inserted message ``row_id`` (the caller's
    transaction): at every :data:`CHECK_EVERY`-th id, index a due batch and work a little on
    the queues. Nothing else is written for a message; searches read the rows past the
    batch boundary from their text. A search that found this file's index damaged has it
    marked here, in the write (the next writable open replaces it)."""
    if damage_noticed(conn):
        mark_index_damaged(conn)
    if row_id % CHECK_EVERY:
        return
    try:
        row = conn.execute(AFTER_INSERT_SQL).fetchone()
    except sqlite3.OperationalError as exc:
        if is_sqlite_lock_error(exc):
            raise
        return  # a file without the index: the next open creates it
    index = None if row is None else _index_of(row)
    if index is None or index.damaged:
        return  # no index, or a damaged one
    waiting = bool(row[6])
    if row_id - index.indexed >= FLUSH_ROWS:
        _flush(conn, index)
    if waiting:
        drain_queue(conn, DRAIN_PER_WRITE)


# The messages past the batch boundary, oldest first.
UNFLUSHED_SQL = f"""
SELECT m.id, {TEXT_BYTES_SQL}, m.timestamp FROM messages m WHERE m.id > ? ORDER BY m.id LIMIT ?
"""


def _flush(conn: sqlite3.Connection, index: IndexState) -> None:
    """Index the messages past the batch boundary, up to :data:`MAX_FLUSH_ROWS` of them, and
    keep the counts of common words (:func:`_keep_word_counts`)."""
    rows = _index_read(conn, UNFLUSHED_SQL, (index.indexed, MAX_FLUSH_ROWS))
    sampled: Counter[str] = Counter()
    if rows and _write_postings(conn, index, rows, sampled):
        conn.execute(SET_INDEXED_SQL, (rows[-1][0],))
        _keep_word_counts(conn, sampled, -(-len(rows) // SAMPLE_EVERY), rows[-1][0])


# Words common in a batch get their counts kept (see search_word_counts): those in at least
# COMMON_IN_BATCH of the rows sampled, every SAMPLE_EVERY-th row of the batch.
SAMPLE_EVERY = 8
COMMON_IN_BATCH = 1 / 4
# Each batch carries this many kept counts on to its boundary: those whose rows past their
# end (which a search counts) are likely the most, at the word's share of the rows counted.
CARRIED_PER_BATCH = 2
# New counts a batch takes, in rows of the lists they walk (at least one word a batch): the
# words wait, commonest first, for later batches.
NEW_COUNT_ROWS = 65_536
# The change count, the count the kept counts hold for, and whether FTS5's index is whole (not
# stale, not rebuilding).
KEEP_STATE_SQL = """
SELECT (SELECT changes FROM search_row_changes), counted_changes,
       NOT EXISTS (SELECT 1 FROM state_meta
                   WHERE key IN ('fts_stale', 'fts_rebuild_high_water'))
FROM search_impact_state
"""
CLEAR_COUNTS_SQL = "DELETE FROM search_word_counts"
COUNTED_SQL = "UPDATE search_impact_state SET counted_changes = ?"
LONGEST_TAILS_SQL = """
SELECT term, upto, matching FROM search_word_counts WHERE upto < ?1
ORDER BY (?1 - upto) * 1.0 * matching / upto DESC LIMIT ?2
"""
NOT_KEPT_SQL = """
SELECT value FROM json_each(?) WHERE value NOT IN (SELECT term FROM search_word_counts)
ORDER BY key
"""
MATCHING_BETWEEN_SQL = """
SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ? AND rowid > ? AND rowid <= ?
"""
KEEP_COUNT_SQL = """
INSERT OR REPLACE INTO search_word_counts (term, upto, matching) VALUES (?, ?, ?)
"""


def _matching(conn: sqlite3.Connection, term: str, after: int, upto: int) -> int:
    """The rows of ``messages_fts`` past ``after`` up to ``upto`` that hold ``term``."""
    return int(conn.execute(MATCHING_BETWEEN_SQL,
                            (phrase_match((term,)), after, upto)).fetchone()[0])


def _keep_word_counts(
    conn: sqlite3.Connection, sampled: Counter[str], sampled_rows: int, boundary: int,
) -> None:
    """Keep the counts of common words after a batch up to ``boundary`` was indexed (the
    caller's transaction): carry :data:`CARRIED_PER_BATCH` on to the boundary, and
    count the commonest words of the batch's sample not kept yet, :data:`NEW_COUNT_ROWS` a
    batch, all by FTS5. A change below the boundary starts the counts over; none is kept while
    FTS5's index is stale or rebuilding. A failure leaves them as they were (a search counts
    what they do not hold); values the library never writes mark the index damaged."""
    least = max(2, math.ceil(sampled_rows * COMMON_IN_BATCH))
    common = sorted((t for t, n in sampled.items()
                     if n >= least and t.isascii() and len(t) <= MAX_TERM_CHARS),
                    key=sampled.__getitem__, reverse=True)
    try:
        with transaction(conn):  # a savepoint in the caller's transaction
            changes, counted, whole = conn.execute(KEEP_STATE_SQL).fetchone()
            if counted != changes or not whole:
                conn.execute(CLEAR_COUNTS_SQL)
                conn.execute(COUNTED_SQL, (changes if whole else None,))
                if not whole:
                    return
            kept = [(term, boundary, matching + _matching(conn, term, upto, boundary))
                    for term, upto, matching in conn.execute(
                        LONGEST_TAILS_SQL, (boundary, CARRIED_PER_BATCH)).fetchall()]
            walked = 0
            for (term,) in conn.execute(NOT_KEPT_SQL, (json.dumps(common),)).fetchall():
                if walked >= NEW_COUNT_ROWS:
                    break
                matching = _matching(conn, term, 0, boundary)
                walked += matching
                kept.append((term, boundary, matching))
            conn.executemany(KEEP_COUNT_SQL, kept)
    except INDEX_FAULTS as exc:
        if index_error(exc):
            _mark_damaged(conn, exc)
        elif isinstance(exc, sqlite3.Error) and not is_sqlite_lock_error(exc):
            logger.debug("word counts not kept for this batch (%s)", exc)
        else:
            raise


def _index_read(conn: sqlite3.Connection, sql: str, args: Sequence[object]) -> list[Any] | None:
    """The rows of one of the index's own reads (the caller's write transaction); None, the
    index marked damaged, when the index or the rows it reads fail it."""
    try:
        return conn.execute(sql, args).fetchall()
    except INDEX_FAULTS as exc:
        if not index_error(exc):
            raise
        _mark_damaged(conn, exc)
        return None


def _write_postings(
    conn: sqlite3.Connection, index: IndexState,
    rows: Sequence[tuple[int, ColumnValue, ColumnValue, ColumnValue, float | None]],
    sampled: Counter[str] | None = None,
) -> bool:
    """Postings of these messages into ``search_impact`` and ``search_impact_fts``, their times
    into the blocks (a time that is not a number bounds none), all or nothing; False (the
    index marked damaged) when the index fails. A blob another client stored is read as FTS5
    reads it (:func:`hermes_state_bm25.fts5_text`)."""
    postings: list[tuple[int, int, str]] = []
    fts_rows: list[tuple[int, str]] = []
    blocks: dict[int, tuple[float, float]] = {}
    try:
        for n, (row_id, content, tool_name, tool_calls, stamp) in enumerate(rows):
            seen = sampled if sampled is not None and n % SAMPLE_EVERY == 0 else None
            text, indexed, _ = _postings_of(content, tool_name, tool_calls, index.avgdl, seen)
            postings.append((row_id, index.epoch, text))
            if text:
                fts_rows.append((row_id, indexed))
            if isinstance(stamp, int | float):
                first, last = blocks.get(row_id >> TIME_BLOCK_SHIFT, (stamp, stamp))
                blocks[row_id >> TIME_BLOCK_SHIFT] = (min(first, stamp), max(last, stamp))
        with transaction(conn):  # a savepoint in the caller's transaction
            conn.executemany(ADD_ROW_SQL, postings)
            conn.executemany(FTS_ADD_SQL, fts_rows)
            conn.executemany(TIME_BLOCK_SQL, [(b, lo, hi) for b, (lo, hi) in blocks.items()])
    except INDEX_FAULTS as exc:
        if not index_error(exc):
            raise
        _mark_damaged(conn, exc)
        return False
    return True


# Queued rows (all at or below the batch boundary: the triggers leave newer ones to the next
# batch), with the postings they have and their text now.
QUEUE_BATCH_SQL = f"""
SELECT q.id, i.epoch, i.postings, m.id IS NOT NULL, {TEXT_BYTES_SQL}, m.timestamp
FROM (SELECT id FROM search_impact_queue ORDER BY id DESC LIMIT ?) AS q
LEFT JOIN search_impact i ON i.id = q.id
LEFT JOIN messages m ON m.id = q.id
"""
GONE_BATCH_SQL = """
SELECT g.id, i.epoch, i.postings
FROM (SELECT id FROM search_impact_gone LIMIT ?) AS g
LEFT JOIN search_impact i ON i.id = g.id
"""
DRAIN_PER_WRITE = 16
UNGONE_SQL = "DELETE FROM search_impact_gone WHERE id = ?"
UNQUEUE_SQL = "DELETE FROM search_impact_queue WHERE id = ?"
REMOVE_ROW_SQL = "DELETE FROM search_impact WHERE id = ?"


def drain_queue(conn: sqlite3.Connection, limit: int) -> int:
    """Index up to ``limit`` queued rows, newest first, and purge as many deleted ones (the
    caller's transaction); returns how many rows were handled (0 for a damaged index)."""
    index = read_state(conn)
    if index is None or index.damaged:
        return 0
    gone = conn.execute(GONE_BATCH_SQL, (limit,)).fetchall()
    queued = _index_read(conn, QUEUE_BATCH_SQL, (limit,))
    if queued is None:
        return 0
    if not gone and not queued:
        return 0
    # Each id's postings are removed once, deleted or queued alike: an id deleted and written
    # again (an id in a gap) is in both lists, and the queued row's removal covers the deleted
    # one's, so the id leaves both (purged later, it would take the new row's postings).
    stale = {row_id: (epoch, postings)
             for row_id, epoch, postings in [*gone, *(q[:3] for q in queued)]}
    try:
        with transaction(conn):  # a savepoint in the caller's transaction
            for row_id, (epoch, postings) in stale.items():
                # Only rows of this epoch are in the FTS5 table (an older epoch's are not).
                if postings and epoch == index.epoch:
                    conn.execute(FTS_REMOVE_SQL, (row_id, index_text(postings)))
                conn.execute(REMOVE_ROW_SQL, (row_id,))
            conn.executemany(UNGONE_SQL, [(row_id,) for row_id in stale])
            conn.executemany(UNQUEUE_SQL, [(q[0],) for q in queued])
    except INDEX_FAULTS as exc:
        if not index_error(exc):
            raise
        _mark_damaged(conn, exc)
        return 0
    live = [(q[0], *q[4:]) for q in queued if q[3]]
    if live and not _write_postings(conn, index, live):
        return 0
    return len(gone) + len(queued)


@functools.cache
def _fresh_index_rows() -> dict[str, tuple[tuple[object, ...], ...]]:
    """What the shadow tables of a new, empty ``search_impact_fts`` hold on this SQLite."""
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(SEARCH_INDEX_SQL)
        return {name: tuple(mem.execute(f"SELECT * FROM {name}").fetchall())
                for name in _FTS_SHADOWS}
    finally:
        mem.close()


def _rewrite_shadow_tables(conn: sqlite3.Connection) -> None:
    """Put ``search_impact_fts``'s shadow tables back to those of a new, empty table, without
    FTS5 reading the old ones: once its structure record is damaged, nothing that goes
    through the table works (DROP TABLE included), but the shadow tables are plain ones. A
    table an earlier version declared may lack one of them (%_docsize)."""
    for name, rows in _fresh_index_rows().items():
        if not table_exists(conn, name):
            continue
        conn.execute(f"DELETE FROM {name}")
        for row in rows:
            conn.execute(f"INSERT INTO {name} VALUES ({', '.join('?' * len(row))})", row)


MISSING_OBJECTS_SQL = """
SELECT value FROM json_each(?) WHERE value NOT IN (SELECT name FROM sqlite_master)
"""


def missing_objects(conn: sqlite3.Connection) -> list[str]:
    """The index's tables and triggers this file lacks (reads only)."""
    return [r[0] for r in conn.execute(MISSING_OBJECTS_SQL, (json.dumps(INDEX_OBJECTS),))]


def drop_index(conn: sqlite3.Connection) -> None:
    """Drop every object of the index (the caller's transaction), however damaged."""
    for name in SEARCH_TRIGGER_NAMES:
        conn.execute(f"DROP TRIGGER IF EXISTS {name}")
    conn.execute("DROP TABLE IF EXISTS search_impact_vocab")
    try:
        conn.execute("DROP TABLE IF EXISTS search_impact_fts")
    except (sqlite3.Error, MemoryError) as exc:
        if not index_error(exc):
            raise
        _rewrite_shadow_tables(conn)
        conn.execute("DROP TABLE search_impact_fts")
    for name in INDEX_TABLES:
        conn.execute(f"DROP TABLE IF EXISTS {name}")


def create_index(conn: sqlite3.Connection) -> None:
    """Create the index anew, empty, with a fill of every message there is due (the caller's
    transaction): what a file without it gets (a fresh one, one written before the index
    existed or by a salvage that kept only part of it, a recovered or repaired copy)."""
    drop_index(conn)
    for statement in split_sql(SEARCH_INDEX_SQL + SEARCH_TRIGGERS_SQL):
        conn.execute(statement)
    _start(conn, _reference_length(conn))


# The schema text (sqlite_master.sql) of the named tables.
DECLARATIONS_SQL = """
SELECT name, sql FROM sqlite_master
WHERE type = 'table' AND name IN (SELECT value FROM json_each(?))
"""


@functools.cache
def _declared_virtual_tables() -> dict[str, str]:
    """The schema text of each virtual table of the index as a new one has it."""
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(SEARCH_INDEX_SQL)
        return dict(mem.execute(DECLARATIONS_SQL, (json.dumps(INDEX_VIRTUAL_TABLES),)))
    finally:
        mem.close()


def declared_otherwise(conn: sqlite3.Connection) -> bool:
    """Whether a virtual table of the index is declared otherwise than ``SEARCH_INDEX_SQL``
    declares it now (an earlier version made it; one made without the %_docsize table cannot
    even be counted by another SQLite client). Reads only."""
    live = dict(conn.execute(DECLARATIONS_SQL, (json.dumps(INDEX_VIRTUAL_TABLES),)))
    return any(name in live and live[name] != sql
               for name, sql in _declared_virtual_tables().items())


def ensure_index(conn: sqlite3.Connection) -> None:
    """:func:`create_index` when any part of the index is missing, or declared otherwise than
    now (the caller's transaction)."""
    if missing_objects(conn) or declared_otherwise(conn):
        create_index(conn)


EPOCH_TOKEN = "_epoch_{epoch}"
# A new epoch; the fill covers every message there is (none: nothing to fill).
START_SQL = """
INSERT OR REPLACE INTO search_impact_state
    (id, epoch, avgdl, indexed, fill_high_water, fill_progress, damaged)
SELECT 1, ?, ?, coalesce(max(id), 0), max(id), NULL, 0 FROM messages
"""


def _reference_length(conn: sqlite3.Connection) -> float:
    """The reference length A of a new epoch: the mean length ``messages_fts`` knows now (it
    only orders the postings; any value is exact, one near the mean proves sooner)."""
    try:
        stats = read_stats(conn)
    except (sqlite3.Error, MemoryError):
        return IMPACT_DEFAULT_AVGDL
    return stats.avgdl if stats.rows and stats.tokens else IMPACT_DEFAULT_AVGDL


def _start(conn: sqlite3.Connection, avgdl: float) -> int:
    """A new, empty epoch with its fill due (the caller's transaction); returns the epoch."""
    epoch = int.from_bytes(os.urandom(4), "big") % 2_000_000_000 + 1
    for name in ("search_impact", "search_impact_queue", "search_impact_gone",
                 "search_time_blocks", "search_word_counts"):
        conn.execute(f"DELETE FROM {name}")
    conn.execute(START_SQL, (epoch, avgdl))
    conn.execute(FTS_ADD_SQL, (0, EPOCH_TOKEN.format(epoch=epoch)))
    return epoch


def reset_index(conn: sqlite3.Connection) -> bool:
    """Start the index over, empty, with its fill due (the caller's transaction): for an
    index found damaged or inconsistent. Its shadow tables are rewritten directly, so an index
    too damaged for FTS5 to open is replaced too. False when its tables cannot be written (it
    stays marked damaged; searches rank with FTS5)."""
    avgdl = _reference_length(conn)
    try:
        with transaction(conn):  # a savepoint in the caller's transaction
            _rewrite_shadow_tables(conn)
            # FTS5 can open the table again; this makes it drop what it still holds in memory.
            conn.execute(
                "INSERT INTO search_impact_fts (search_impact_fts) VALUES ('delete-all')"
            )
            _start(conn, avgdl)
    except INDEX_FAULTS as exc:
        if not index_error(exc):
            raise
        logger.warning("search impact index cannot be reset (%s); ranking uses FTS5", exc)
        return False
    logger.info("search impact index reset; a fill of every message is due")
    return True


# ---------------------------------------------------------------------------------------------
# Filling the index for the messages already there
# ---------------------------------------------------------------------------------------------

FILL_CHUNK_ROWS = 2000
# The chunk's messages, and whether a drain already gave one its postings in this epoch.
FILL_ROWS_SQL = f"""
SELECT m.id, {TEXT_BYTES_SQL}, m.timestamp, i.id IS NOT NULL
FROM messages m LEFT JOIN search_impact i ON i.id = m.id AND i.epoch = ?
WHERE m.id >= ? AND m.id <= ?
"""
FILL_PROGRESS_SQL = "UPDATE search_impact_state SET fill_progress = ?"
FILL_DONE_SQL = "UPDATE search_impact_state SET fill_high_water = NULL, fill_progress = NULL"


def fill_chunk(
    conn: sqlite3.Connection, chunk_rows: int | None = None
) -> RebuildStep | None:
    """Fill the index for the next ``chunk_rows`` (default :data:`FILL_CHUNK_ROWS`) messages
    of a due fill (the caller's transaction): their postings, straight into
    ``search_impact_fts``, and their time blocks. None when no fill is due or the index is
    damaged. Rows past the high water are kept by the batches; a row a drain indexed
    meanwhile is left as it is (its time is in the blocks already)."""
    index = read_state(conn)
    if index is None or index.damaged or index.fill_high_water is None:
        return None
    lo, want = next_chunk_start(index.fill_progress), chunk_rows or FILL_CHUNK_ROWS
    last, count = conn.execute(CHUNK_END_SQL, (lo, index.fill_high_water, want)).fetchone()
    finished = count < want or last == index.fill_high_water
    hi = index.fill_high_water if finished else last
    chunk = _index_read(conn, FILL_ROWS_SQL, (index.epoch, lo, hi))
    if chunk is None:
        return None
    rows = [row[:5] for row in chunk if not row[5]]
    if not _write_postings(conn, index, rows):
        return None
    conn.execute(FILL_DONE_SQL if finished else FILL_PROGRESS_SQL, () if finished else (hi,))
    return RebuildStep(count, finished)


def needs_maintenance(conn: sqlite3.Connection) -> bool:
    """Whether the index waits for a writable open's maintenance: missing, damaged, or with
    a fill due (one cheap read; an inconsistency searches find is marked damaged)."""
    index = read_state(conn)
    return index is None or not index.whole


def _needs_reset(conn: sqlite3.Connection) -> bool:
    index = read_state(conn)
    if index is None or index.damaged:
        return True
    try:
        return not consistent(conn, index)
    except INDEX_FAULTS as exc:
        if not index_error(exc):
            raise
        return True


def index_whole(conn: sqlite3.Connection) -> bool:
    index = read_state(conn)
    return index is not None and index.whole


TIME_BLOCKS_SQL = "SELECT block, first_at, last_at FROM search_time_blocks WHERE block <= ?"


def _bound(value: object, unbounded: float) -> float:
    """A block's time bound; none for one that is not a number (the triggers of a file written
    before they skipped such times could store text another client wrote as a time)."""
    return float(value) if isinstance(value, int | float) else unbounded


def time_ranges(conn: sqlite3.Connection) -> list[tuple[int, int, float, float]]:
    """Ranges of message ids with bounds of their messages' times, (first id, last id, first
    time, last time), covering every id of a timed message: the blocks up to the batch
    boundary (a block whose messages have no time, a number, has none), then the ids past it,
    whose times are not bounded yet. One range of every id while a fill is due, and for an
    index that is damaged."""
    everything = [(INT64_MIN, INT64_MAX, -math.inf, math.inf)]
    index = read_state(conn)
    if index is None or not index.whole:
        return everything
    try:
        blocks = conn.execute(TIME_BLOCKS_SQL, (index.indexed >> TIME_BLOCK_SHIFT,)).fetchall()
        ranges = [(block << TIME_BLOCK_SHIFT, min(((block + 1) << TIME_BLOCK_SHIFT) - 1,
                                                   index.indexed),
                   _bound(first_at, -math.inf), _bound(last_at, math.inf))
                  for block, first_at, last_at in blocks]
    except INDEX_FAULTS as exc:
        if not index_error(exc):
            raise
        notice_damage(conn)
        return everything
    ranges.append((index.indexed + 1, INT64_MAX, -math.inf, math.inf))
    return ranges


def fill_when_admitted(
    db_path: Path,
    read: OnStore,
    write: OnStore,
    stop: threading.Event,
    *,
    before: Callable[[], None],
) -> bool:
    """Replace a damaged or inconsistent index and run its fill in chunks, if this process gets
    the admission lock of the FTS rebuilds; True when the index is whole. ``read``/``write``
    run a function on the store (the latter in a retried write transaction), ``before`` vets
    the file first (it raises to refuse), ``stop`` ends the loop between two chunks."""
    with admission_lock(db_path) as admitted:
        if not admitted:
            return False
        before()
        if read(_needs_reset) and not write(reset_index):
            return False
        run_chunks(write, fill_chunk, stop)
        return bool(read(index_whole))


EPOCH_SQL = "SELECT 1 FROM search_impact_fts WHERE search_impact_fts MATCH ? AND rowid = 0"
NEWEST_EPOCH_SQL = "SELECT epoch FROM search_impact ORDER BY id DESC LIMIT 1"


def consistent(conn: sqlite3.Connection, index: IndexState) -> bool:
    """Every object of the index is there (without a trigger, the changes it would queue or
    count go unseen), and the FTS5 table, the postings and the state belong to the same
    epoch."""
    if missing_objects(conn):
        return False
    token = '"' + EPOCH_TOKEN.format(epoch=index.epoch) + '"'
    if conn.execute(EPOCH_SQL, (token,)).fetchone() is None:
        return False
    newest = conn.execute(NEWEST_EPOCH_SQL).fetchone()
    return newest is None or newest[0] == index.epoch


INTEGRITY_CHECK_SQL = "INSERT INTO search_impact_fts (search_impact_fts) VALUES ('integrity-check')"


def index_problem(conn: sqlite3.Connection) -> str | None:
    """The damage the index shows, None when none (a missing index or a due fill is not
    damage: the next writable open sees to those). FTS5's 'integrity-check' runs as a write:
    on a private copy, in a transaction the caller rolls back."""
    index = read_state(conn)
    if index is None or missing_objects(conn):
        return None
    if index.damaged:
        return "marked damaged"
    try:
        conn.execute(INTEGRITY_CHECK_SQL)
        if not consistent(conn, index):
            return "its tables belong to different epochs"
    except INDEX_FAULTS as exc:
        if isinstance(exc, sqlite3.Error) and is_sqlite_lock_error(exc):
            raise
        return f"{type(exc).__name__}: {exc}"
    return None


INDEX_HEALTH_SQL = """
SELECT (SELECT count(*) FROM search_impact_queue), (SELECT count(*) FROM search_impact_gone)
"""


def index_health(conn: sqlite3.Connection) -> dict[str, object]:
    """The impact index's state: usable, damaged, filling, rows queued, deleted rows to purge."""
    index = read_state(conn)
    if index is None:
        return {"usable": False, "damaged": False, "filling": False, "queued": None,
                "gone": None}
    try:
        usable = index.whole and consistent(conn, index)
    except INDEX_FAULTS as exc:
        if not index_error(exc):
            raise
        usable = False
    queued, gone = conn.execute(INDEX_HEALTH_SQL).fetchone()
    return {"usable": usable, "damaged": index.damaged,
            "filling": index.fill_high_water is not None, "queued": queued, "gone": gone,
            "epoch": index.epoch, "avgdl": index.avgdl, "indexed": index.indexed}


