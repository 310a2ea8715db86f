"""Exact BM25 ranking of word queries over the whole history, fast for common words.

**The order.** A word query is ranked the way ``messages_fts``'s own ``bm25()`` ranks it, ties
by message id. For phrases p₁…pₙ (the query's words and "quoted phrases", in query order) FTS5
scores a row

    score = Σᵢ idfᵢ · fᵢ·(k₁+1) / (fᵢ + k₁·(1 − b + b·D/avgdl)),   k₁ = 1.2, b = 0.75,

fᵢ the instances of pᵢ in the row's three columns (weight 1 each), D the row's length in
tokens (all columns), avgdl the mean length over the index, idfᵢ = ln((N − nᵢ + ½)/(nᵢ + ½))
(at least 10⁻⁶) for N rows of which nᵢ contain pᵢ. :func:`bm25_score` computes exactly that,
in the same floating-point order, from N and the token total of the index's own averages
record; :func:`formula_matches_fts5` checks it against this SQLite once per process, and a
SQLite that scores differently never takes the fast route.

**Why an index of its own.** FTS5 computes ``bm25()`` for every matching row before it sorts,
about 1 µs a row: 100 ms for a word in half of 200,000 messages. But a row's place depends on
its *impact* for each phrase, f/(f + K(D)) with K(D) = k₁·(1 − b + b·D/avgdl): the best rows
for a common word are its short messages and the long ones that repeat it. So the library
keeps, for each message, its high-impact postings: every term (ASCII letters and
digits, folded as FTS5 folds them) whose impact under the index's reference length A reaches
:data:`THRESHOLD` — all of a short message, the repeated words of a long one, about one
posting in seven. A posting is the token ``term_kkkk_f_D`` of ``search_impact_fts``, with
kkkk = ⌊(1 − impact)·10⁴⌋, beside the plain token ``term``: within a term the keyed tokens
sort best first, so the table's ``fts5vocab`` instance view reads a term's postings, with their
rows, in falling impact and can stop early; f and D give each row's exact share; and rows
indexed under every word of a query are one FTS5 AND of the plain tokens.

**The query** (:func:`top_k`): a conjunction of phrases whose tokens are all ASCII, with the
caller's filters. A single word is read best first, each row scored from its token, until the
k-th best row passing the filters beats every posting not read yet — whose impact is at most
the next token's, or past the last one below the threshold. Several phrases: FTS5 counts the
whole query first (a few thousand rows or fewer it ranks faster itself) and each phrase for its
idf; the rows indexed under every word are scored from their postings (for a query of single
words SQLite scores them and hands back the best few, scored again here exactly and checked
against the filters, when the rest provably cannot enter the top); every other row has a
phrase below the threshold, which bounds it, and the phrases' postings are read best first
(for a phrase, those of its longest word: a phrase occurs at most as often as each of its
words) until that bound falls below the k-th best. A row whose postings leave a frequency
unknown waits with its best case, and only if that best case can still enter the top is it
scored, from its text (tokenized as FTS5 tokenizes it; text that lacks a word even as a
substring is skipped) or, with others in one pass, by FTS5 itself, whichever the estimate
(:data:`TEXT_ROW_COST` …) finds cheaper. Scores use the current avgdl; A only orders the
tokens, and the bounds allow for the difference (impact at most x under A is at most x under
avgdl when A ≥ avgdl, else x/(x + r·(1 − x)), r = A/avgdl).
Whenever the proof would cost more than FTS5's own ranking — a rare word, a selective filter,
a bound that needs a common word's whole list — :func:`top_k` returns None and the caller
ranks with FTS5: the answer is the same.

**Counts and few rows.** The counts a query needs (each phrase's for its idf, the whole
query's to choose a route) are kept per file (:class:`_Counter`): a count of the rows at or
below the batch boundary stays exact while no such row changes, and the triggers count every
change of one (an insert into a gap, an update, a delete) in ``search_row_changes``; a query
asked again counts only the rows past the boundary it was counted to. A query of several words
or a phrase matching at most :data:`FEW_ROWS` rows is then scored here (:func:`_few_rows`):
its rows' ids come from FTS5's match alone, and each row's frequencies from its text — folded
as unicode61 folds it, the phrase found by a pattern over the text rather than token by token
— with its length from FTS5's own column sizes; ``bm25()`` would scan every phrase once more
for its idf.

**Coverage.** Messages are indexed in batches, from their stored text: at every
:data:`CHECK_EVERY`-th id an insert of the library looks whether :data:`FLUSH_ROWS` messages
wait past the batch boundary (``indexed``) and indexes them (:func:`after_insert`), so an
append writes nothing for the index in between (FTS5 writes a segment per commit, which would
cost more than one message's postings). Rows past the boundary are the next batch's, whoever
wrote them; triggers queue the rows at or below it that are inserted (an id in a gap), changed
or moved, and the ids of deleted ones (``search_impact_queue``, ``search_impact_gone``).
Searches score the matching rows past the boundary (up to :data:`MAX_UNFLUSHED_SCORED`) and up
to :data:`QUEUE_SCAN_LIMIT` queued rows from their text; with more, they rank with FTS5 until
the batches and :func:`drain_queue` — a chunk per batch check — have indexed them.

**Creation and fill.** The index is derived data, like the FTS indexes: a file that lacks any
part of it (a fresh one, one written before it existed, a recovered or repaired copy) gets it
whole and empty at open (:func:`create_index`, the version unchanged), with a fill due for
every message up to the highest id (``fill_high_water``). The fill runs like an FTS rebuild:
in the background of a writable open, under the cross-process admission lock, in chunks of
:data:`FILL_CHUNK_ROWS` existing rows above ``fill_progress`` (a keyset over the ids), each
chunk one write transaction (:func:`fill_when_admitted`, :func:`fill_chunk`). Rows above the
high water are kept by the batches; a row below it that a drain indexed first is left
as it is. Until the fill is done searches rank with FTS5 and sort by time without the blocks.

**Consistency and damage.** Every index has an epoch, in ``search_impact_state``, in each row
of ``search_impact`` and as the token ``_epoch_<n>`` inside ``search_impact_fts``; a search
checks that they agree, so a copy of the file that kept one table without the other (a salvage
that skips virtual tables) is never trusted; nor is a state row holding what the library
never writes, or a row indexed in the FTS5 table without its postings. Errors from the impact
index never reach a canonical write: the index is marked damaged and left alone, searches rank
with FTS5, and the next writable open replaces it with an empty one of a new epoch and fills
it (:func:`reset_index`). A search that finds it damaged or inconsistent says so
(:func:`damage_noticed`); a writable handle then marks it, through its own retried write. A
table or trigger of it dropped under an open handle is found by the handle's write that meets
it (:func:`missing_index_object`), or by a search's check of its objects and then the next
write (:func:`mark_index_damaged`): either drops the rest, whose triggers would fail every
write of messages, and the next writable open creates the index anew.
"""

from __future__ import annotations

import functools
import heapq
import json
import logging
import math
import os
import re
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes_state_common import IMPACT_DEFAULT_AVGDL, SEARCH_INDEX_SQL, SEARCH_TRIGGER_NAMES
from hermes_state_common import SEARCH_TRIGGERS_SQL, TIME_BLOCK_SHIFT, split_sql, transaction
from hermes_state_errors import is_corruption_error, is_sqlite_lock_error
from hermes_state_fts import RebuildStep, admission_lock

logger = logging.getLogger("hermes_state")

__all__ = [
    "K1",
    "B",
    "THRESHOLD",
    "QUEUE_SCAN_LIMIT",
    "MAX_WALK_POSTINGS",
    "Conjunction",
    "Bm25Stats",
    "column_tokens",
    "impact_postings",
    "INDEX_TABLES",
    "INDEX_VIRTUAL_TABLES",
    "INDEX_OBJECTS",
    "index_text",
    "after_insert",
    "drain_queue",
    "missing_objects",
    "missing_index_object",
    "drop_index",
    "create_index",
    "ensure_index",
    "reset_index",
    "fill_chunk",
    "needs_maintenance",
    "index_whole",
    "fill_when_admitted",
    "time_ranges",
    "index_problem",
    "index_health",
    "damage_noticed",
    "mark_index_damaged",
    "read_stats",
    "bm25_score",
    "match_count",
    "formula_matches_fts5",
    "conjunction",
    "top_k",
]

K1 = 1.2
B = 0.75
THRESHOLD = 0.7
KEY_SCALE = 10_000
MAX_TERM_CHARS = 64
QUEUE_SCAN_LIMIT = 64
MAX_WALK_POSTINGS = 40_000
MAX_RESOLVED_ROWS = 4_000
# Relative slack on every bound: the proof must survive a last-bit rounding difference.
_BOUND_SLACK = 1e-9

# ---------------------------------------------------------------------------------------------
# Tokens, as FTS5's unicode61 tokenizer makes them
# ---------------------------------------------------------------------------------------------

# ASCII letters and digits are token characters (folded to lower case); every other ASCII
# byte separates tokens. Exactly unicode61's rule for ASCII text.
_ASCII_FOLD = bytes(
    (c + 32) if 65 <= c <= 90 else c if (48 <= c <= 57 or 97 <= c <= 122) else 32
    for c in range(256)
)
# The same, keeping the bytes of non-ASCII characters for a closer look.
_ASCII_FOLD_KEEP = bytes(c if c >= 128 else _ASCII_FOLD[c] for c in range(256))
# Every character seen so far → what unicode61 makes of it: " " for a separator, else its
# folded form (possibly empty). unicode61 decides and folds one code point at a time, from
# tables of its own Unicode version (not Python's), so each new character is asked of FTS5
# itself, once per process (:func:`_learn`); ASCII is known from the start.
_CHARS: dict[int, str] = {c: chr(_ASCII_FOLD[c]) for c in range(128)}
_PROBE_LOCK = threading.Lock()
_probe: sqlite3.Connection | None = None
PROBE_SQL = "SELECT term FROM temp.probe_vocab ORDER BY offset"


def _learn(chars: Iterable[str]) -> None:
    """What unicode61 makes of each of ``chars``: each is tokenized between two ``a``s."""
    global _probe
    with _PROBE_LOCK:
        todo = [ch for ch in chars if ord(ch) not in _CHARS]
        if not todo:
            return
        if _probe is None:
            _probe = sqlite3.connect(":memory:", check_same_thread=False)
            _probe.execute("CREATE VIRTUAL TABLE temp.probe USING fts5(x)")
            _probe.execute("CREATE VIRTUAL TABLE temp.probe_vocab"
                           " USING fts5vocab(temp, probe, 'instance')")
        _probe.execute("DELETE FROM temp.probe")
        _probe.execute("INSERT INTO temp.probe (x) VALUES (?)",
                       (" ".join(f"a{ch}a" for ch in todo),))
        terms = iter([r[0] for r in _probe.execute(PROBE_SQL)])
        for ch in todo:
            term = next(terms)
            if term == "a":  # a separator: "a", "a"
                next(terms)
                _CHARS[ord(ch)] = " "
            else:
                _CHARS[ord(ch)] = term[1:-1]


def _pieces(text: str) -> list[str]:
    """The text split at ASCII separators, ASCII letters folded (other characters kept as they
    are)."""
    return text.encode().translate(_ASCII_FOLD_KEEP).decode().split()


def _tokens_of(text: str) -> list[str]:
    """The tokens of text holding non-ASCII characters."""
    unknown = [ch for ch in set(text) if ord(ch) not in _CHARS]
    if unknown:
        _learn(unknown)
    return [t for t in text.translate(_CHARS).split(" ") if t]


def column_tokens(text: str | None) -> list[str]:
    """The tokens of one column's text, folded: exactly the ones FTS5 makes of it."""
    if not text:
        return []
    if text.isascii():
        return text.encode().translate(_ASCII_FOLD).decode().split()
    return _tokens_of(text)


def _row_counts(text: str) -> tuple[Counter[str], int]:
    """ASCII terms of a row's text with their frequencies, and its length in tokens."""
    pieces = _pieces(text)
    if text.isascii():
        return Counter(pieces), len(pieces)
    plain = [piece for piece in pieces if piece.isascii()]
    # The other pieces at once: they are separated anyway, and their order does not matter.
    others = _tokens_of(" ".join(piece for piece in pieces if not piece.isascii()))
    words = plain + [token for token in others if token.isascii()]
    return Counter(words), len(plain) + len(others)


def _reference_k(length: int, avgdl: float) -> float:
    return K1 * (1 - B + B * length / avgdl)


@functools.lru_cache(maxsize=8192)
def _least_frequency(length: int, avgdl: float) -> int:
    """The smallest term frequency whose impact reaches THRESHOLD in a row of ``length``."""
    k = _reference_k(length, avgdl)
    return max(1, math.ceil(THRESHOLD * k / (1.0 - THRESHOLD) - 1e-9))


def impact_postings(
    content: str | None, tool_name: str | None, tool_calls: str | None, avgdl: float
) -> tuple[str, int]:
    """A row's high-impact postings as index text (``term_kkkk_f_D`` tokens), and its length.

    ``avgdl`` is the index's reference length."""
    postings, _, length = _postings_of(content, tool_name, tool_calls, avgdl)
    return postings, length


def _postings_of(
    content: str | None, tool_name: str | None, tool_calls: str | None, avgdl: float
) -> tuple[str, str, int]:
    """:func:`impact_postings`, with what :func:`index_text` makes of them ("" for none)."""
    text = "\n".join(part for part in (content, tool_name, tool_calls) if part)
    if not text:
        return "", "", 0
    counts, length = _row_counts(text)
    least = _least_frequency(length, avgdl)
    k = _reference_k(length, avgdl)
    if least == 1:  # a short row posts every word
        terms, frequencies = list(counts.keys()), list(counts.values())
    else:  # a long row only its repeated words, most frequent first
        items = sorted(((t, f) for t, f in counts.items() if f >= least),
                       key=_second, reverse=True)
        terms, frequencies = [t for t, _ in items], [f for _, f in items]
    if terms and max(map(len, terms)) > MAX_TERM_CHARS:
        kept = [(t, f) for t, f in zip(terms, frequencies) if len(t) <= MAX_TERM_CHARS]
        terms, frequencies = [t for t, _ in kept], [f for _, f in kept]
    if not terms:
        return "", "", length
    # A posting's key depends on its frequency alone (the length is the row's): most are 1.
    keys = {f: "_%04d_%d_%d" % (int((1.0 - f / (f + k)) * KEY_SCALE), f, length)
            for f in set(frequencies)}
    postings = " ".join(map(str.__add__, terms, map(keys.__getitem__, frequencies)))
    return postings, postings + " " + " ".join(terms), length


def _second(item: tuple[str, int]) -> int:
    return item[1]


# ---------------------------------------------------------------------------------------------
# Keeping the index
# ---------------------------------------------------------------------------------------------

# The plain tables, the virtual tables and the triggers: a file lacking any of them has its
# whole index created anew (see :func:`create_index`).
INDEX_TABLES = ("search_impact_state", "search_impact", "search_impact_queue",
                "search_impact_gone", "search_time_blocks", "search_row_changes")
INDEX_VIRTUAL_TABLES = ("search_impact_fts", "search_impact_vocab")
INDEX_OBJECTS = (*INDEX_TABLES, *INDEX_VIRTUAL_TABLES, *SEARCH_TRIGGER_NAMES)
_FTS_SHADOWS = ("search_impact_fts_data", "search_impact_fts_idx", "search_impact_fts_config")


@dataclass(frozen=True)
class _Index:
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
_MALFORMED = _Index(0, IMPACT_DEFAULT_AVGDL, 0, None, None, True)


def _index_of(row: Sequence[Any]) -> _Index:
    """The state from the first six columns of a row read by :data:`STATE_SQL`'s select; a
    damaged one for values the library never writes (a reference length that is not a
    positive number, ids that are not whole numbers)."""
    epoch, avgdl, indexed, high_water, progress, damaged = row[:6]
    numbers = (epoch, indexed, *(v for v in (high_water, progress) if v is not None))
    if (not all(type(v) is int for v in numbers) or type(avgdl) not in (int, float)
            or not math.isfinite(avgdl) or avgdl <= 0 or indexed < 0):
        return _MALFORMED
    return _Index(epoch, float(avgdl), indexed, high_water, progress, bool(damaged))


def _index_state(conn: sqlite3.Connection) -> _Index | None:
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


# Set when a read finds the impact index damaged; reads cannot write the marker themselves.
_damage_noticed: ContextVar[bool] = ContextVar("hermes_impact_damage_noticed", default=False)


def damage_noticed() -> bool:
    """Whether a search of this context found the impact index damaged since the last call."""
    noticed = _damage_noticed.get()
    _damage_noticed.set(False)
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
# library did not write, and a mismatch between its tables (:func:`_index_error` tells which
# mean the index is at fault).
_PYTHON_FAULTS = (MemoryError, ValueError, TypeError, ArithmeticError, IndexMismatch)
INDEX_FAULTS = (sqlite3.Error, *_PYTHON_FAULTS)
# FTS5 refusing its table's format; text another client stored that is not UTF-8, which
# the index's reads of messages cannot hand over (its postings cannot be computed).
_INDEX_ERROR_SIGNS = ("invalid fts5 file format", "Could not decode to UTF-8")
# An object SQLite names missing: a statement's own table, or one a trigger writes.
_MISSING_TABLE = re.compile(r"no such table: (?:main\.)?(\w+)")


def missing_index_object(exc: BaseException) -> bool:
    """Whether ``exc`` says one of the index's own tables is missing (its triggers then fail
    every write of the rows they watch, until the index is dropped)."""
    found = _MISSING_TABLE.search(str(exc)) if isinstance(exc, sqlite3.OperationalError) else None
    return found is not None and found.group(1) in (*INDEX_OBJECTS, *_FTS_SHADOWS)


def _index_error(exc: BaseException) -> bool:
    """Errors that mean the impact index itself is unusable: corruption (garbage in an FTS5
    structure can also read as out of memory), one of its tables missing, FTS5 refusing its
    table's format, or values in its tables (or in messages, for its postings) the library did
    not write."""
    if isinstance(exc, _PYTHON_FAULTS):
        return True
    if not isinstance(exc, sqlite3.Error) or is_sqlite_lock_error(exc):
        return False
    return (is_corruption_error(exc) or missing_index_object(exc)
            or any(sign in str(exc) for sign in _INDEX_ERROR_SIGNS))


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
    batch boundary from their text. A search of this context that found the index damaged
    marks it so here, in the write (the next writable open replaces it)."""
    if damage_noticed():
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
UNFLUSHED_SQL = """
SELECT id, content, tool_name, tool_calls, timestamp FROM messages WHERE id > ? ORDER BY id
LIMIT ?
"""


def _flush(conn: sqlite3.Connection, index: _Index) -> None:
    """Index the messages past the batch boundary, up to :data:`MAX_FLUSH_ROWS` of them."""
    rows = _index_read(conn, UNFLUSHED_SQL, (index.indexed, MAX_FLUSH_ROWS))
    if rows and _write_postings(conn, index, rows):
        conn.execute(SET_INDEXED_SQL, (rows[-1][0],))


def _index_read(conn: sqlite3.Connection, sql: str, args: Sequence[object]) -> list[Any] | None:
    """The rows of one of the index's own reads (the caller's write transaction); None, the
    index marked damaged, when the index or the rows it reads fail it."""
    try:
        return conn.execute(sql, args).fetchall()
    except INDEX_FAULTS as exc:
        if not _index_error(exc):
            raise
        _mark_damaged(conn, exc)
        return None


def _write_postings(
    conn: sqlite3.Connection, index: _Index,
    rows: Sequence[tuple[int, str | None, str | None, str | None, float | None]],
) -> bool:
    """Postings of these messages into ``search_impact`` and ``search_impact_fts``, their times
    into the blocks, all or nothing; False (the index marked damaged) when the index fails —
    or when a row holds what the library never writes (text that is not text, a time that is
    not a number: another client's), whose postings it cannot compute exactly."""
    postings: list[tuple[int, int, str]] = []
    fts_rows: list[tuple[int, str]] = []
    blocks: dict[int, tuple[float, float]] = {}
    try:
        for row_id, content, tool_name, tool_calls, stamp in rows:
            text, indexed, _ = _postings_of(content, tool_name, tool_calls, index.avgdl)
            postings.append((row_id, index.epoch, text))
            if text:
                fts_rows.append((row_id, indexed))
            if stamp is not None:
                first, last = blocks.get(row_id >> TIME_BLOCK_SHIFT, (stamp, stamp))
                blocks[row_id >> TIME_BLOCK_SHIFT] = (min(first, stamp), max(last, stamp))
        with transaction(conn):  # a savepoint in the caller's transaction
            conn.executemany(ADD_ROW_SQL, postings)
            conn.executemany(FTS_ADD_SQL, fts_rows)
            conn.executemany(TIME_BLOCK_SQL, [(b, lo, hi) for b, (lo, hi) in blocks.items()])
    except INDEX_FAULTS as exc:
        if not _index_error(exc):
            raise
        _mark_damaged(conn, exc)
        return False
    return True


# Queued rows (all at or below the batch boundary: the triggers leave newer ones to the next
# batch), with the postings they have and their text now.
QUEUE_BATCH_SQL = """
SELECT q.id, i.epoch, i.postings, m.id IS NOT NULL, m.content, m.tool_name, m.tool_calls,
       m.timestamp
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
    index = _index_state(conn)
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
        if not _index_error(exc):
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
    through the table works (DROP TABLE included), but the shadow tables are plain ones."""
    for name, rows in _fresh_index_rows().items():
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
        if not _index_error(exc):
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


def ensure_index(conn: sqlite3.Connection) -> None:
    """:func:`create_index` when any part of the index is missing (the caller's transaction)."""
    if missing_objects(conn):
        create_index(conn)


EPOCH_TOKEN = "_epoch_{epoch}"
# A new epoch; the fill covers every message there is (none: nothing to fill).
START_SQL = """
INSERT OR REPLACE INTO search_impact_state
    (id, epoch, avgdl, indexed, fill_high_water, fill_progress, damaged)
SELECT 1, ?, ?, coalesce(max(id), 0), max(id), CASE WHEN max(id) IS NULL THEN NULL ELSE 0 END, 0
FROM messages
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
                 "search_time_blocks"):
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
        if not _index_error(exc):
            raise
        logger.warning("search impact index cannot be reset (%s); ranking uses FTS5", exc)
        return False
    logger.info("search impact index reset; a fill of every message is due")
    return True


# ---------------------------------------------------------------------------------------------
# Filling the index for the messages already there
# ---------------------------------------------------------------------------------------------

FILL_CHUNK_ROWS = 2000
# The end of the next chunk: the id of the n-th message above the progress marker, or of the
# last one below the high water when fewer are left (a keyset over the ids).
FILL_CHUNK_END_SQL = """
SELECT max(id), count(*) FROM (
    SELECT id FROM messages WHERE id > ? AND id <= ? ORDER BY id LIMIT ?
)
"""
# The chunk's messages, and whether a drain already gave one its postings in this epoch.
FILL_ROWS_SQL = """
SELECT m.id, m.content, m.tool_name, m.tool_calls, m.timestamp, i.id IS NOT NULL
FROM messages m LEFT JOIN search_impact i ON i.id = m.id AND i.epoch = ?
WHERE m.id > ? AND m.id <= ?
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
    index = _index_state(conn)
    if index is None or index.damaged or index.fill_high_water is None:
        return None
    lo, want = index.fill_progress or 0, chunk_rows or FILL_CHUNK_ROWS
    last, count = conn.execute(FILL_CHUNK_END_SQL, (lo, index.fill_high_water, want)).fetchone()
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
    index = _index_state(conn)
    return index is None or not index.whole


def _needs_reset(conn: sqlite3.Connection) -> bool:
    index = _index_state(conn)
    if index is None or index.damaged:
        return True
    try:
        return not _consistent(conn, index)
    except INDEX_FAULTS as exc:
        if not _index_error(exc):
            raise
        return True


def index_whole(conn: sqlite3.Connection) -> bool:
    index = _index_state(conn)
    return index is not None and index.whole


TIME_BLOCKS_SQL = "SELECT block, first_at, last_at FROM search_time_blocks WHERE block <= ?"


def time_ranges(conn: sqlite3.Connection) -> list[tuple[int, int, float, float]]:
    """Ranges of message ids with bounds of their messages' times, (first id, last id, first
    time, last time), covering every id: the blocks up to the batch boundary, then the ids past
    it, whose times are not bounded yet. One range of everything while a fill is due, and
    for an index that is damaged."""
    everything = [(0, 2**62, -math.inf, math.inf)]
    index = _index_state(conn)
    if index is None or not index.whole:
        return everything
    try:
        blocks = conn.execute(TIME_BLOCKS_SQL, (index.indexed >> TIME_BLOCK_SHIFT,)).fetchall()
        ranges = [(block << TIME_BLOCK_SHIFT, min(((block + 1) << TIME_BLOCK_SHIFT) - 1,
                                                   index.indexed), float(first_at), float(last_at))
                  for block, first_at, last_at in blocks]
    except INDEX_FAULTS as exc:
        if not _index_error(exc):
            raise
        _damage_noticed.set(True)
        return everything
    ranges.append((index.indexed + 1, 2**62, -math.inf, math.inf))
    return ranges


def fill_when_admitted(
    db_path: Path,
    read: Callable[[Callable[[sqlite3.Connection], Any]], Any],
    write: Callable[[Callable[[sqlite3.Connection], Any]], Any],
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
        while not stop.is_set():
            step = write(fill_chunk)
            if step is None or step.finished:
                break
        return bool(read(index_whole))


EPOCH_SQL = "SELECT 1 FROM search_impact_fts WHERE search_impact_fts MATCH ? AND rowid = 0"
NEWEST_EPOCH_SQL = "SELECT epoch FROM search_impact ORDER BY id DESC LIMIT 1"


def _consistent(conn: sqlite3.Connection, index: _Index) -> bool:
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
    index = _index_state(conn)
    if index is None or missing_objects(conn):
        return None
    if index.damaged:
        return "marked damaged"
    try:
        conn.execute(INTEGRITY_CHECK_SQL)
        if not _consistent(conn, index):
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
    index = _index_state(conn)
    if index is None:
        return {"usable": False, "damaged": False, "filling": False, "queued": None,
                "gone": None}
    try:
        usable = index.whole and _consistent(conn, index)
    except INDEX_FAULTS as exc:
        if not _index_error(exc):
            raise
        usable = False
    queued, gone = conn.execute(INDEX_HEALTH_SQL).fetchone()
    return {"usable": usable, "damaged": index.damaged,
            "filling": index.fill_high_water is not None, "queued": queued, "gone": gone,
            "epoch": index.epoch, "avgdl": index.avgdl, "indexed": index.indexed}


# ---------------------------------------------------------------------------------------------
# BM25 as FTS5 computes it
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bm25Stats:
    rows: int  # N: rows in the index
    tokens: int  # tokens in all columns of all rows

    @property
    def avgdl(self) -> float:
        return self.tokens / self.rows

    def idf(self, hits: int) -> float:
        value = math.log((self.rows - hits + 0.5) / (hits + 0.5))
        return 1e-6 if value <= 0.0 else value


def _varints(blob: bytes) -> list[int]:
    """SQLite varints (FTS5 writes its records with them)."""
    values, value, length = [], 0, 0
    for byte in blob:
        length += 1
        if length == 9:
            values.append((value << 8) | byte)
            value = length = 0
            continue
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            values.append(value)
            value = length = 0
    return values


def read_stats(conn: sqlite3.Connection, table: str = "messages_fts") -> Bm25Stats:
    """N and the token total from the index's averages record (``%_data`` row 1), which is
    what FTS5's xRowCount and xColumnTotalSize read."""
    row = conn.execute(f"SELECT block FROM {table}_data WHERE id = 1").fetchone()
    values = _varints(row[0]) if row and row[0] else []
    if not values:
        return Bm25Stats(0, 0)
    return Bm25Stats(values[0], sum(values[1:]))


def bm25_score(
    idfs: Sequence[float], frequencies: Sequence[float], length: int, avgdl: float
) -> float:
    """The score of one row (higher is better: FTS5's ``bm25()`` returns its negative)."""
    score = 0.0
    for idf, f in zip(idfs, frequencies, strict=True):
        score += idf * ((f * (K1 + 1.0)) / (f + K1 * (1 - B + B * length / avgdl)))
    return score


def _phrase_match(phrase: tuple[str, ...]) -> str:
    return '"' + " ".join(phrase) + '"'


def _count(conn: sqlite3.Connection, table: str, expression: str) -> int:
    sql = f"SELECT count(*) FROM {table} WHERE {table} MATCH ?"
    return int(conn.execute(sql, (expression,)).fetchone()[0])


# Match counts of messages_fts (the idf of a phrase, the size of a query), kept per file for
# the rows at or below the batch boundary while search_row_changes's count stays: the triggers
# count every change of such a row (insert into a gap, update, delete), so an unchanged count
# means those rows are the same, and only the rows past the cached boundary are counted again.
ROW_CHANGES_SQL = """
SELECT s.epoch, c.changes FROM search_impact_state AS s, search_row_changes AS c
"""
COUNT_PAST_SQL = """
SELECT count(*), coalesce(sum(rowid <= ?), 0) FROM messages_fts
WHERE messages_fts MATCH ? AND rowid > ?
"""
FILE_SQL = "PRAGMA database_list"
MAX_CACHED_COUNTS = 4096
MAX_CACHED_FILES = 64


@dataclass
class _Counts:
    """The cached counts of one file, valid for one epoch and change count."""

    key: tuple[int, int] | None  # (epoch, changes)
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # (boundary, rows)


_COUNTS: dict[str, _Counts] = {}
_COUNTS_LOCK = threading.Lock()


class _Counter:
    """Match counts for one search: cached for the rows at or below the boundary, counted
    past the cached boundary (see :data:`ROW_CHANGES_SQL`), each once per search."""

    def __init__(self, conn: sqlite3.Connection, index: _Index) -> None:
        self.conn = conn
        self.boundary = index.indexed
        self.counted: dict[str, int] = {}
        self.key = self._key()
        # No cache for a file without a name (in memory) or without the change count (an
        # index of an older release that only a read-only handle sees: the next writable open
        # creates the index anew).
        name = conn.execute(FILE_SQL).fetchone()[2] if self.key is not None else None
        self.file = str(name or "")

    def _key(self) -> tuple[int, int] | None:
        try:
            row = self.conn.execute(ROW_CHANGES_SQL).fetchone()
        except sqlite3.OperationalError as exc:
            if is_sqlite_lock_error(exc):
                raise
            return None
        return None if row is None else (int(row[0]), int(row[1]))

    def __call__(self, expression: str) -> int:
        if expression not in self.counted:
            self.counted[expression] = self._count(expression)
        return self.counted[expression]

    def _count(self, expression: str) -> int:
        cached = None
        if self.file:
            with _COUNTS_LOCK:
                entry = _COUNTS.get(self.file)
                if entry is not None and entry.key == self.key:
                    cached = entry.counts.get(expression)
        upto, rows = cached if cached and cached[0] <= self.boundary else (0, 0)
        args = (self.boundary, expression, upto)
        past, below = (int(v) for v in self.conn.execute(COUNT_PAST_SQL, args).fetchone())
        # Each statement reads its own snapshot: the count is kept only if no row at or below
        # the boundary changed around it (the boundary only grows within an epoch).
        if self.file and below and self._key() == self.key:
            with _COUNTS_LOCK:
                entry = _COUNTS.get(self.file)
                if entry is None or entry.key != self.key:
                    if len(_COUNTS) >= MAX_CACHED_FILES:
                        _COUNTS.clear()
                    entry = _COUNTS[self.file] = _Counts(self.key)
                if len(entry.counts) >= MAX_CACHED_COUNTS:
                    entry.counts.clear()
                entry.counts[expression] = (self.boundary, rows + below)
        return rows + past


def _phrase_frequency(columns: Sequence[Sequence[str]], phrase: tuple[str, ...]) -> int:
    """Instances of ``phrase`` in a row: start positions inside one column, overlaps too."""
    if len(phrase) == 1:
        return sum(tokens.count(phrase[0]) for tokens in columns)
    # Tokens hold no space: with each token between spaces of its own, an instance is the
    # phrase written the same way. A phrase that can overlap itself ("a a") is counted with a
    # lookahead, which finds overlapping instances too.
    needle = " " + "  ".join(phrase) + " "
    texts = [" " + "  ".join(tokens) + " " for tokens in columns if tokens]
    if not _self_overlapping(phrase):
        return sum(text.count(needle) for text in texts)
    pattern = re.compile("(?=" + re.escape(needle) + ")")
    return sum(len(pattern.findall(text)) for text in texts)


# A-Z folded, every other byte kept.
_ASCII_LOWER = bytes((c + 32) if 65 <= c <= 90 else c for c in range(256))
_TOKEN_CHARS = "a-z0-9\x80-\U0010ffff"
_ASCII_RUNS = re.compile("[\x00-\x7f]+")


def _folded_text(text: str) -> str:
    """The text with every character that unicode61 folds or separates replaced by what it
    makes of it, ASCII separators kept: every non-ASCII character left is then a token
    character folding to itself, and the tokens are the runs of ``[a-z0-9]`` and non-ASCII."""
    if not text.isascii():
        chars = set(_ASCII_RUNS.sub("", text))
        unknown = [ch for ch in chars if ord(ch) not in _CHARS]
        if unknown:
            _learn(unknown)
        special = {ch: _CHARS[ord(ch)] for ch in chars if _CHARS[ord(ch)] != ch}
        if special:
            pattern = re.compile("[" + "".join(map(re.escape, special)) + "]")
            text = pattern.sub(lambda m: special[m.group()], text)
    return text.encode().translate(_ASCII_LOWER).decode()


def _text_frequency(texts: Sequence[str], phrase: tuple[str, ...]) -> int:
    """:func:`_phrase_frequency` of an ASCII phrase, read from the columns' folded text (see
    :func:`_folded_text`) without splitting it into tokens."""
    pattern = _text_phrase_pattern(phrase)
    found = 0
    for text in texts:
        for m in pattern.finditer(text):
            start = m.start()
            found += start == 0 or not _is_token_char(text[start - 1])
    return found


def _lacks_a_word(texts: Sequence[str | None], words: Sequence[str]) -> bool:
    """Whether ASCII texts lack one of the (ASCII, folded) words even as a substring, so that
    no token of theirs is that word (most rows waiting on a word's frequency lack it)."""
    present = [t for t in texts if t]
    if not all(t.isascii() for t in present):
        return False  # unicode61 folds some other characters onto ASCII letters
    lowered = "\n".join(present).lower()
    return any(word not in lowered for word in words)


def _is_token_char(ch: str) -> bool:
    return ord(ch) >= 128 or ch.isalnum()


@functools.lru_cache(maxsize=256)
def _text_phrase_pattern(phrase: tuple[str, ...]) -> re.Pattern[str]:
    """Instances of ``phrase`` in folded text, ending at a token's end; the caller checks that
    each starts at a token's start. A phrase that can overlap itself is found by a lookahead
    (overlapping instances); for any other, a match that starts inside a token cannot hide an
    instance, which would have to start at one of its later tokens."""
    body = f"[^{_TOKEN_CHARS}]+".join(phrase) + f"(?![{_TOKEN_CHARS}])"
    return re.compile("(?=" + body + ")" if _self_overlapping(phrase) else body)


@functools.lru_cache(maxsize=256)
def _self_overlapping(phrase: tuple[str, ...]) -> bool:
    return any(phrase[k:] == phrase[:len(phrase) - k] for k in range(1, len(phrase)))


_SELF_CHECK_ROWS = (
    ("alpha beta gamma", None, None),
    ("alpha alpha alpha delta", "alpha", '{"q": "beta alpha"}'),
    ("beta " * 40 + "alpha", None, None),
    ("gamma delta", "beta", None),
    ("Alpha-Beta, gamma! alpha beta", None, '[{"alpha": 1}]'),
    ("epsilon", None, None),
)
_SELF_CHECK_QUERIES = (
    ("alpha",), ("alpha", "beta"), ("beta", "gamma", "alpha"), ("alpha beta",), ("gamma",),
)


@functools.cache
def formula_matches_fts5() -> bool:
    """True when :func:`bm25_score` equals this SQLite's ``bm25()`` bit for bit (checked on a
    small table in memory, once per process)."""
    mem = sqlite3.connect(":memory:")
    try:
        mem.execute("CREATE VIRTUAL TABLE t USING fts5(content, tool_name, tool_calls)")
        mem.executemany("INSERT INTO t VALUES (?, ?, ?)", _SELF_CHECK_ROWS)
        mem.commit()  # FTS5 writes its averages record when the transaction commits
        stats = read_stats(mem, "t")
        for query in _SELF_CHECK_QUERIES:
            phrases = [tuple(column_tokens(p)) for p in query]
            expression = " ".join(_phrase_match(p) for p in phrases)
            idfs = [stats.idf(_count(mem, "t", _phrase_match(p))) for p in phrases]
            sql = "SELECT rowid, bm25(t) FROM t WHERE t MATCH ?"
            for rowid, expected in mem.execute(sql, (expression,)).fetchall():
                columns = [column_tokens(c) for c in _SELF_CHECK_ROWS[rowid - 1]]
                frequencies = [_phrase_frequency(columns, p) for p in phrases]
                length = sum(map(len, columns))
                if -bm25_score(idfs, frequencies, length, stats.avgdl) != expected:
                    logger.warning("this SQLite's bm25() differs from the library's formula; "
                                   "word search ranks with FTS5 only")
                    return False
        return True
    finally:
        mem.close()


# ---------------------------------------------------------------------------------------------
# Top k
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conjunction:
    """A query the fast route can rank: phrases (tuples of folded ASCII tokens) that must all
    occur, in query order, repeats kept (FTS5 scores each occurrence)."""

    phrases: tuple[tuple[str, ...], ...]

    @property
    def match(self) -> str:
        return " ".join(_phrase_match(p) for p in self.phrases)


def conjunction(texts: Iterable[str]) -> Conjunction | None:
    """The conjunction of these term texts (words, phrase contents), or None when one of them
    has a token the impact index does not keep (non-ASCII, too long) or none at all."""
    phrases = []
    for text in texts:
        tokens = tuple(column_tokens(text))
        if not tokens or not all(t.isascii() and len(t) <= MAX_TERM_CHARS for t in tokens):
            return None
        phrases.append(tokens)
    return Conjunction(tuple(phrases)) if phrases else None


# A word's postings best first, with their rows: the fts5vocab 'instance' view of the impact
# table, over the word's tokens (term_kkkk_f_D sorts by falling impact).
VOCAB_SQL = "SELECT term, doc FROM search_impact_vocab WHERE term >= ? AND term < ?"
INDEXED_ROWS_SQL = "SELECT rowid FROM search_impact_fts WHERE search_impact_fts MATCH ?"
CANDIDATES_SQL = """
SELECT m.id FROM messages m JOIN sessions s ON s.id = m.session_id
WHERE m.id IN (SELECT value FROM json_each(?)) {filters}
"""
# Each query word's posting among a row's postings, cut out in SQL (the text of a short row
# holds every word of it; only the query's words are needed): a term holds no "_", so the
# first token starting with "term_" is the term's own, and a row posts a term at most once.
POSTED_TOKEN_SQL = "substr(postings, nullif(instr(' ' || postings, ?), 0), ?)"
POSTINGS_SQL = """
SELECT id, epoch, {tokens} FROM search_impact WHERE id IN (SELECT value FROM json_each(?))
"""
# Enough characters for any posting of a term: its key, frequency and length are a few digits.
POSTED_TOKEN_TAIL = 48
# The best rows indexed under every word of a query of single words, scored by SQLite from
# their postings (a posting's key has four digits, so a word's frequency starts len(word) + 6
# characters into its posting, and its length follows; :data:`POSTED_NUMBERS` characters hold
# both): a first cut, whose rows are scored again exactly and checked against the filters;
# ``well_formed`` counts the rows it read. Each word's posting is cut once, into a short string.
POSTED_NUMBERS = 24
POSTED_TAIL_SQL = f"substr(postings, nullif(instr(' ' || postings, ?), 0) + ?, {POSTED_NUMBERS})"
EVERYWHERE_TOP_SQL = """
WITH t AS MATERIALIZED (
    SELECT id, {tails} FROM search_impact
    WHERE id IN (SELECT value FROM json_each(?)) AND epoch = ?),
r AS (SELECT id, {frequencies}, CAST(substr(t0, instr(t0, '_') + 1) AS INTEGER) AS d FROM t
      WHERE {present})
SELECT id, {score} AS score, d, {fs}, (SELECT count(*) FROM r) AS well_formed FROM r
ORDER BY score DESC, id LIMIT ?
"""
SHARE_SQL = "? * ((f{j} * ?) / (f{j} + ? * (1 - ? + ? * d / ?)))"
# The text of the rows that pass the filters, and their length in tokens as FTS5 keeps it (the
# column sizes in %_docsize).
ROW_TEXT_SQL = """
SELECT m.id, m.content, m.tool_name, m.tool_calls, d.sz FROM messages AS m
JOIN sessions AS s ON s.id = m.session_id LEFT JOIN messages_fts_docsize AS d ON d.id = m.id
WHERE m.id IN (SELECT value FROM json_each(?)) {filters}
"""
# FTS5's own scores for chosen rows: the rowid test is kept out of FTS5's reach (+rowid), so
# FTS5 walks the query once and scores only the rows that pass it.
RESOLVE_SQL = """
SELECT rowid, bm25(messages_fts) FROM messages_fts
WHERE messages_fts MATCH ? AND rowid BETWEEN ? AND ? AND +rowid IN (SELECT value FROM json_each(?))
"""
MATCHING_SQL = """
SELECT rowid FROM messages_fts
WHERE messages_fts MATCH ? AND rowid IN (SELECT value FROM json_each(?))
"""

FIRST_BATCH_POSTINGS = 32
MAX_BATCH_POSTINGS = 1024
# Rows matching a query of several words or a phrase up to which FTS5 ranks them itself: its
# count is cheap, and ranking that many costs about what a proof does.
EXACT_RANK_ROWS = 12_000
# The proof for a query of several words gives up (FTS5 ranks) when it would have to read a
# word's postings down to this close to the threshold.
ABORT_MARGIN = 0.03
# A phrase whose words are all indexed together in fewer rows than this many times the rows
# wanted is ranked by FTS5: its best rows are mostly rows the index holds under some words only.
PHRASE_PROBE = 4
# What scoring rows costs, in µs (measured at 200,000 messages): from their text, per row and
# per token; by FTS5 in one pass, per row of each word's list (it reads them all, for the idf
# too; a phrase's words about half as much: its rarest word lets FTS5 skip through the others'
# lists) and per row scored.
TEXT_ROW_COST = 8.0
TEXT_TOKEN_COST = 0.06
FTS_LIST_ROW_COST = 0.08
FTS_PHRASE_FACTOR = 0.5
FTS_SCORED_ROW_COST = 3.0
# The rows indexed under every word that SQLite hands over first, beyond the rows wanted, and
# how many times that cut is widened (four times each) before they are all scored here.
EVERYWHERE_FIRST_CUT = 48
EVERYWHERE_CUTS = 3
# A single word is read this far before its count is asked for: a rare word is then ranked by
# FTS5 at once, a common one seldom needs more.
SINGLE_WORD_PROBE_POSTINGS = 1024


class _Cursor:
    """A word's postings, best first: (token, row id) pairs."""

    def __init__(self, conn: sqlite3.Connection, term: str) -> None:
        self._rows = conn.execute(VOCAB_SQL, (term + "_", term + "`"))
        self._buffer: list[tuple[str, int]] = []
        self.batch = FIRST_BATCH_POSTINGS
        self.next = self._read()

    def close(self) -> None:
        """End the statement: an unfinished one would keep its read transaction (and the
        file's locks) open on the store's connection."""
        self._rows.close()

    def _read(self) -> tuple[str, int] | None:
        if not self._buffer:
            self._buffer = self._rows.fetchmany(512)[::-1]
            if not self._buffer:
                return None
        return self._buffer.pop()

    def bound(self) -> float:
        """Highest reference impact of any posting not read yet."""
        if self.next is None:
            return THRESHOLD
        return 1.0 - int(self.next[0].rsplit("_", 3)[1]) / KEY_SCALE

    def take(self) -> list[tuple[str, int]]:
        """The next postings, more each time (the first reads are the likeliest to suffice)."""
        postings: list[tuple[str, int]] = []
        while self.next is not None and len(postings) < self.batch:
            postings.append(self.next)
            self.next = self._read()
        self.batch = min(self.batch * 2, MAX_BATCH_POSTINGS)
        return postings


@dataclass
class _Walk:
    """The state of one top-k search (see the module docstring)."""

    conn: sqlite3.Connection
    conj: Conjunction
    filters: str
    params: Sequence[object]
    wanted: int
    index: _Index
    avgdl: float
    idfs: list[float]  # per phrase, in query order
    top: list[tuple[float, int]] = field(default_factory=list)  # min-heap of (score, -id)
    # Exactly scored rows whose filters are not checked yet: max-heap of (-score, id).
    unchecked: list[tuple[float, int]] = field(default_factory=list)
    pending: list[tuple[float, int]] = field(default_factory=list)  # max-heap (-bound, id)
    seen: set[int] = field(default_factory=set)
    resolved: int = 0
    # What FTS5 costs to score pending rows (µs, before the rows it scores): None when scores
    # leave out the idf, so FTS5's own cannot resolve them.
    fts_cost: float | None = None
    lengths: dict[int, int] = field(default_factory=dict)  # pending rows' lengths in tokens

    def kth(self) -> float | None:
        """The score a row must beat to enter the top (None while it has room)."""
        self._promote()
        return self.top[0][0] if len(self.top) >= self.wanted else None

    def offer(self, score: float, row_id: int) -> None:
        """A row known to pass the filters."""
        item = (score, -row_id)
        if len(self.top) < self.wanted:
            heapq.heappush(self.top, item)
        elif item > self.top[0]:
            heapq.heapreplace(self.top, item)

    def propose(self, score: float, row_id: int) -> None:
        """A row whose filters are checked only if it can still enter the top."""
        heapq.heappush(self.unchecked, (-score, row_id))

    def _promote(self) -> None:
        while self.unchecked:
            best = (-self.unchecked[0][0], -self.unchecked[0][1])
            if len(self.top) >= self.wanted and best <= self.top[0]:
                return
            size = min(len(self.unchecked), max(16, self.wanted - len(self.top)))
            chunk = [heapq.heappop(self.unchecked) for _ in range(size)]
            passing = self.passing(row_id for _, row_id in chunk)
            for negated, row_id in chunk:
                if row_id in passing:
                    self.offer(-negated, row_id)

    def score(self, frequencies: Sequence[float], length: int) -> float:
        return bm25_score(self.idfs, frequencies, length, self.avgdl)

    def share(self, f: float, length: int) -> float:
        """One phrase's score share per unit of idf: (k₁+1)·f/(f + K(length))."""
        return bm25_score((1.0,), (f,), length, self.avgdl)

    def most(self, reference: float) -> float:
        """Highest current score share, (k₁+1)·impact, of a posting whose reference impact is
        at most ``reference`` (see the module docstring for the bound)."""
        r = self.index.avgdl / self.avgdl
        bound = reference if r >= 1.0 else reference / (reference + r * (1.0 - reference))
        return (K1 + 1.0) * min(1.0, bound * (1.0 + _BOUND_SLACK))

    def reference_for(self, share: float) -> float | None:
        """The reference impact below which a posting's share (per unit of weight) falls
        under ``share``: the inverse of :meth:`most` (None: not even at the threshold)."""
        u = share / ((K1 + 1.0) * (1.0 + _BOUND_SLACK))
        r = self.index.avgdl / self.avgdl
        x = u if r >= 1.0 else r * u / (1.0 - u + r * u) if u < 1.0 else 1.0
        return None if x <= THRESHOLD else x

    @functools.cached_property
    def words(self) -> tuple[str, ...]:
        """The query's distinct words, in query order."""
        return tuple(dict.fromkeys(t for p in self.conj.phrases for t in p))

    @functools.cached_property
    def postings_sql(self) -> tuple[str, list[object]]:
        """:data:`POSTINGS_SQL` for the query's words, and its parameters before the ids."""
        tokens = ", ".join([POSTED_TOKEN_SQL] * len(self.words))
        params: list[object] = []
        for word in self.words:
            params += [" " + word + "_", len(word) + POSTED_TOKEN_TAIL]
        return POSTINGS_SQL.format(tokens=tokens), params

    def passing(self, ids: Iterable[int]) -> set[int]:
        """The rows among ``ids`` that pass the caller's filters."""
        sql = CANDIDATES_SQL.format(filters=self.filters)
        ids = list(ids)
        if not ids:
            return set()
        return {r[0] for r in self.conn.execute(sql, (json.dumps(ids), *self.params))}

    def resolve_texts(self, ids: Sequence[int]) -> None:
        """Exact scores from the rows' text, for the rows among ``ids`` that pass the
        filters."""
        if not ids:
            return
        self.resolved += len(ids)
        sql = ROW_TEXT_SQL.format(filters=self.filters)
        rows = self.conn.execute(sql, (json.dumps(list(ids)), *self.params)).fetchall()
        for row_id, content, tool_name, tool_calls, sizes in rows:
            texts = (content, tool_name, tool_calls)
            if _lacks_a_word(texts, self.words):
                continue
            if sizes is not None:
                folded = [_folded_text(t) for t in texts if t]
                frequencies = [_text_frequency(folded, p) for p in self.conj.phrases]
                length = sum(_varints(sizes))
            else:
                columns = [column_tokens(t) for t in texts]
                frequencies = [_phrase_frequency(columns, p) for p in self.conj.phrases]
                length = sum(map(len, columns))
            if all(frequencies):
                self.offer(self.score(frequencies, length), row_id)

    def resolve_pending(self, floor: float | None) -> bool:
        """Score the pending rows whose best case reaches ``floor`` (all of them for None);
        False when there were none."""
        candidates = []
        while self.pending and (floor is None or -self.pending[0][0] >= floor):
            candidates.append(heapq.heappop(self.pending)[1])
        if not candidates:
            return False
        tokens = sum(self.lengths.get(i, round(self.avgdl)) for i in candidates)
        text_cost = TEXT_ROW_COST * len(candidates) + TEXT_TOKEN_COST * tokens
        fts_cost = None if self.fts_cost is None else (
            self.fts_cost + FTS_SCORED_ROW_COST * len(candidates))
        if fts_cost is None or text_cost <= fts_cost:
            self.resolve_texts(sorted(candidates))
        elif ids := sorted(self.passing(candidates)):
            args = (self.conj.match, min(ids), max(ids), json.dumps(ids))
            for row_id, bm25 in self.conn.execute(RESOLVE_SQL, args):
                self.offer(-bm25, row_id)
        return True

    def settle(self, ids: Sequence[int]) -> None:
        """Score new candidate rows (see :meth:`score_rows`): rows ``search_impact_fts``
        indexes, so each has its postings in ``search_impact``, or the two disagree."""
        sql, params = self.postings_sql
        rows = self.conn.execute(sql, (*params, json.dumps(list(ids)))).fetchall()
        if len(rows) < len(set(ids)):
            raise IndexMismatch(f"{len(set(ids)) - len(rows)} indexed rows without postings")
        self.score_rows(rows)

    def settle_everywhere(self, ids: Sequence[int]) -> None:
        """Score the rows indexed under every word of a query of single words (all their
        frequencies are in their postings): SQLite picks the best few, and only those are
        scored and checked against the filters here, when the rest provably cannot enter the
        top; else every row is scored here (see :meth:`settle`)."""
        words = self.words
        tails = ", ".join(f"{POSTED_TAIL_SQL} AS t{j}" for j in range(len(words)))
        present = " AND ".join(f"t{j} IS NOT NULL" for j in range(len(words)))
        frequencies = ", ".join(f"CAST(t{j} AS INTEGER) AS f{j}" for j in range(len(words)))
        column = {w: j for j, w in enumerate(words)}
        score = " + ".join(SHARE_SQL.format(j=column[p[0]]) for p in self.conj.phrases)
        fs = ", ".join(f"f{j}" for j in range(len(words)))
        sql = EVERYWHERE_TOP_SQL.format(tails=tails, present=present, frequencies=frequencies,
                                        score=score, fs=fs)
        params: list[object] = []
        for word in words:
            params += [" " + word + "_", len(word) + 6]
        params += [json.dumps(list(ids)), self.index.epoch]
        for idf in self.idfs:
            params += [idf, K1 + 1.0, K1, B, B, self.avgdl]
        limit = EVERYWHERE_FIRST_CUT + self.wanted
        for _ in range(EVERYWHERE_CUTS):
            rows = self.conn.execute(sql, (*params, limit)).fetchall()
            if not rows or rows[0][-1] != len(ids):
                break  # a row without the postings it should have: score every one here
            passing = self.passing(row[0] for row in rows)
            scored = sorted(
                ((self.score([float(row[3 + column[p[0]]]) for p in self.conj.phrases],
                             int(row[2])), int(row[0])) for row in rows if row[0] in passing),
                reverse=True)
            # Every row not returned scores at most the last one returned, as SQLite computes
            # it: it cannot enter the top if that is below the k-th best passing the filters
            # (with a margin for a last-bit difference between the two computations).
            if len(rows) < limit or (len(scored) >= self.wanted and float(rows[-1][1])
                                     * (1.0 + _BOUND_SLACK) < scored[self.wanted - 1][0]):
                for row_score, row_id in scored:
                    self.offer(row_score, row_id)
                return
            limit *= 4
        self.settle(ids)

    def score_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """Score candidate rows: exactly from their postings when those tell every phrase's
        frequency, else they wait, with their best case, for their text. Rows the postings
        prove not to match, rows whose best case cannot enter the top, and rows failing the
        filters are dropped."""
        exact: dict[int, float] = {}
        waiting: dict[int, tuple[float, int]] = {}  # best case, length
        kth = self.kth()
        for row_id, epoch, *tokens in rows:
            if epoch != self.index.epoch:
                waiting[row_id] = (math.inf, 0)  # length unknown
                continue
            postings: dict[str, tuple[int, int]] = {}
            for word, token in zip(self.words, tokens, strict=True):
                if token:
                    _, _, f, n = token.split(" ", 1)[0].rsplit("_", 3)
                    postings[word] = (int(f), int(n))
            length = next(iter(postings.values()))[1] if postings else 0
            least = _least_frequency(length, self.index.avgdl)
            settled = True
            upper: list[float] = []
            for phrase in self.conj.phrases:
                known = [postings[t][0] if t in postings else None for t in phrase]
                if least == 1 and None in known:
                    break  # a row this short would have indexed that word: it lacks it
                upper.append(float(min(least - 1 if f is None else f for f in known)))
                settled = settled and len(phrase) == 1 and known[0] is not None
            else:
                best = self.score(upper, length)
                if kth is not None and best < kth:
                    continue
                if settled:
                    exact[row_id] = best
                else:
                    waiting[row_id] = (best, length)
        for row_id, score in exact.items():
            self.propose(score, row_id)
        for row_id, (best, length) in waiting.items():
            heapq.heappush(self.pending, (-best, row_id))
            if length:
                self.lengths[row_id] = length

    def offer_single(self, postings: Sequence[tuple[str, int]], kth: float | None) -> None:
        """Rows of a one-word query: each posting's token gives the row's exact score."""
        last, score = "", 0.0
        for token, row_id in postings:
            if token != last:
                _, _, f, length = token.rsplit("_", 3)
                score = self.score([float(f)] * len(self.conj.phrases), int(length))
                last = token
            if kth is None or score >= kth:
                self.propose(score, row_id)

    def visit(self, expression: str) -> None:
        """Settle the rows of the impact index matching ``expression`` not seen yet."""
        rows = [r[0] for r in self.conn.execute(INDEXED_ROWS_SQL, (expression,))]
        new = [r for r in rows if r not in self.seen]
        self.seen.update(new)
        if new:
            self.settle(new)


# Matching rows past the batch boundary; queued rows (changed, or written below it by another
# program). Neither has current postings: both are scored from their text, and when there
# are more than a search scores itself, FTS5 ranks.
UNFLUSHED_MATCHES_SQL = """
SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? AND rowid > ? LIMIT ?
"""
QUEUED_SQL = "SELECT id FROM search_impact_queue LIMIT ?"
MAX_UNFLUSHED_SCORED = 256


def _outside_the_index(
    conn: sqlite3.Connection, conj: Conjunction, index: _Index
) -> tuple[set[int], list[int]] | None:
    """(Rows whose postings must be ignored, those of them that match), or None."""
    queued = [r[0] for r in conn.execute(QUEUED_SQL, (QUEUE_SCAN_LIMIT + 1,))]
    if len(queued) > QUEUE_SCAN_LIMIT:
        return None
    args = (conj.match, index.indexed, MAX_UNFLUSHED_SCORED + 1)
    unflushed = [r[0] for r in conn.execute(UNFLUSHED_MATCHES_SQL, args)]
    if len(unflushed) > MAX_UNFLUSHED_SCORED:
        return None
    if queued:
        unflushed += [r[0] for r in conn.execute(MATCHING_SQL, (conj.match, json.dumps(queued)))]
    return set(queued) | set(unflushed), unflushed


def top_k(
    conn: sqlite3.Connection,
    conj: Conjunction,
    filters: str,
    params: Sequence[object],
    wanted: int,
) -> list[int] | None:
    """The ids of the best ``wanted`` rows matching ``conj`` and the ``filters`` (an SQL
    condition on ``m`` = messages and ``s`` = sessions, starting with AND), best first, ties by
    id — or None when the impact index cannot prove them (the caller ranks with FTS5)."""
    if wanted <= 0:
        return []
    if not formula_matches_fts5():
        return None
    try:
        return _top_k(conn, conj, filters, params, wanted)
    except INDEX_FAULTS as exc:
        if not _index_error(exc):
            raise
        logger.warning("search impact index unreadable (%s); ranking with FTS5", exc)
        _damage_noticed.set(True)
        return None


def match_count(conn: sqlite3.Connection, expression: str) -> int:
    """How many rows of ``messages_fts`` match ``expression``: through the cached counts when
    the impact index is whole (see :data:`ROW_CHANGES_SQL`), else counted outright."""
    index = _index_state(conn)
    if index is not None and index.whole:
        try:
            return _Counter(conn, index)(expression)
        except INDEX_FAULTS as exc:
            if not _index_error(exc):
                raise
            _damage_noticed.set(True)
    return _count(conn, "messages_fts", expression)


# A query of several words or a phrase matching up to this many rows may be scored here from
# its rows' text: FTS5's bm25() would scan each phrase once more for its idf, which the cached
# counts give; it is, when that scan costs more than reading the rows' text by estimate.
FEW_ROWS = 400
MATCHING_ROWS_SQL = "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?"
# A row matching several words or a phrase is longer than most: about twice the mean length
# (the benchmark's corpus at 20,000 and 200,000 messages).
MATCH_LENGTH = 2.0
# FTS5's walk for the idf costs about this share of its walk to match (measured at 200,000).
FTS_IDF_SHARE = 0.3


def _few_rows(
    conn: sqlite3.Connection,
    conj: Conjunction,
    filters: str,
    params: Sequence[object],
    wanted: int,
    index: _Index,
    stats: Bm25Stats,
    count: Callable[[str], int],
) -> list[int] | None:
    """The best ``wanted`` rows of a query matching at most :data:`FEW_ROWS` rows, scored
    exactly from their text (None for more, or when FTS5 would rank them faster). It reads
    ``messages_fts`` only, so rows past the batch boundary and queued ones need nothing of
    their own."""
    rows = count(conj.match)
    if rows > FEW_ROWS:
        return None
    phrases = list(dict.fromkeys(conj.phrases))
    # Both ways walk the phrases' lists to find the rows; FTS5 then walks them again, more
    # cheaply, for each phrase's idf, and scores the rows; here their text is read.
    text_cost = rows * (TEXT_ROW_COST + TEXT_TOKEN_COST * MATCH_LENGTH * stats.avgdl)
    fts_cost = FTS_IDF_SHARE * _fts_pass_cost(phrases, count) + FTS_SCORED_ROW_COST * rows
    if fts_cost < text_cost:
        return None
    idfs = {p: stats.idf(count(_phrase_match(p))) for p in phrases}
    walk = _Walk(conn, conj, filters, params, wanted, index, stats.avgdl,
                 [idfs[p] for p in conj.phrases])
    ids = [r[0] for r in conn.execute(MATCHING_ROWS_SQL, (conj.match,))]
    walk.resolve_texts(sorted(ids))
    return [row_id for _, row_id in sorted((-score, -negated) for score, negated in walk.top)]


def _fts_pass_cost(phrases: Sequence[tuple[str, ...]], count: Callable[[str], int]) -> float:
    """What FTS5 costs (µs) to walk these phrases once and count each for its idf, before the
    rows it scores: the rows of every word's list."""
    return FTS_LIST_ROW_COST * sum(
        count(_phrase_match((word,))) * (1 if len(phrase) == 1 else FTS_PHRASE_FACTOR)
        for phrase in phrases for word in phrase)


def _top_k(
    conn: sqlite3.Connection,
    conj: Conjunction,
    filters: str,
    params: Sequence[object],
    wanted: int,
) -> list[int] | None:
    index = _index_state(conn)
    if index is None or not index.whole:
        return None
    if not _consistent(conn, index):
        _damage_noticed.set(True)  # a copy that kept one table without the other
        return None
    stats = read_stats(conn)
    if stats.rows == 0 or stats.tokens == 0:
        return []
    count = _Counter(conn, index)
    distinct = list(dict.fromkeys(conj.phrases))
    if len(distinct) > 1 or len(distinct[0]) > 1:
        few = _few_rows(conn, conj, filters, params, wanted, index, stats, count)
        if few is not None:
            return few
    # A single word: idf scales every score alike, so it is left out until a near tie needs
    # it. Otherwise each phrase weighs its own idf.
    single = len(distinct) == 1 and len(distinct[0]) == 1
    # The count of a query of several words decides first (:func:`_few_rows` counted it):
    # FTS5 ranks a few thousand rows faster than any proof.
    if not single and count(conj.match) <= EXACT_RANK_ROWS:
        return None
    outside = _outside_the_index(conn, conj, index)
    if outside is None:
        return None
    idf_of = {p: 1.0 for p in distinct}
    fts_cost: float | None = None
    everywhere: list[int] = []
    if not single:
        # Rows indexed under every word of the query (cheap to list, they need no idf yet):
        # too few, and the best rows cannot be proven from the index.
        words = dict.fromkeys(t for p in distinct for t in p)
        expression = " AND ".join(f'"{t}"' for t in words)
        everywhere = [r[0] for r in conn.execute(INDEXED_ROWS_SQL, (expression,))]
        if len(everywhere) < wanted * (PHRASE_PROBE if len(distinct) == 1 else 1):
            return None
        # The phrases' counts give their idf.
        idf_of = {p: stats.idf(count(_phrase_match(p))) for p in distinct}
        fts_cost = _fts_pass_cost(distinct, count)
    walk = _Walk(conn, conj, filters, params, wanted, index, stats.avgdl,
                 [idf_of[p] for p in conj.phrases], seen=outside[0], fts_cost=fts_cost)
    walk.resolve_texts(sorted(outside[1]))
    weight = {p: sum(idf_of[q] for q in conj.phrases if q == p) for p in distinct}
    if not single:
        # Score the rows indexed under every word; any other row has a phrase below the
        # threshold, which bounds it far lower than the postings' frontiers alone would.
        new = [r for r in everywhere if r not in walk.seen]
        walk.seen.update(new)
        if new and all(len(p) == 1 for p in distinct):
            walk.settle_everywhere(new)
        elif new:
            walk.settle(new)
        if len(walk.top) + len(walk.unchecked) + len(walk.pending) < wanted:
            return None  # the best rows are not all indexed under every word: FTS5 ranks
    # Each phrase is read through its longest word: likely its rarest, with fewest postings.
    cursors = {p: _Cursor(conn, max(p, key=len)) for p in distinct}
    try:
        floor = walk.most(THRESHOLD)
        read = 0
        while True:
            shares = {p: weight[p] * walk.most(c.bound()) for p, c in cursors.items()}
            if single:
                unseen, readable = shares[distinct[0]], distinct
            else:
                # The unseen row's phrase below the threshold, whichever it is, weighs least.
                total = sum(shares.values())
                below = max(distinct, key=lambda p: total - shares[p] + weight[p] * floor)
                unseen = total - shares[below] + weight[below] * floor
                readable = [p for p in distinct if p != below]
            kth = walk.kth()
            live = [p for p in readable if cursors[p].next is not None]
            if (kth is not None and kth > unseen) or not live:
                if walk.resolve_pending(kth):
                    continue  # the top moved: check the proof again
                if kth is not None and kth > unseen:
                    break
                return None  # the proof cannot be made: FTS5 ranks
            if walk.resolved > MAX_RESOLVED_ROWS or read > MAX_WALK_POSTINGS:
                return None
            phrase = max(live, key=lambda p: shares[p])
            if not single and kth is not None:
                # How far this phrase's postings must be read for the proof: nearly to the end
                # means reading a common word's whole list, where FTS5 is the faster way.
                reach = walk.reference_for((kth - unseen + shares[phrase]) / weight[phrase])
                if reach is None or reach < THRESHOLD + ABORT_MARGIN:
                    return None
            postings = cursors[phrase].take()
            if single and read < SINGLE_WORD_PROBE_POSTINGS <= read + len(postings):
                if count(conj.match) <= EXACT_RANK_ROWS:
                    return None
            read += len(postings)
            fresh = [(token, row_id) for token, row_id in postings if row_id not in walk.seen]
            walk.seen.update(row_id for _, row_id in fresh)
            if single:
                walk.offer_single(fresh, kth)
            else:
                if kth is not None and len(phrase) == 1:
                    # The other phrases' best shares do not change within a batch.
                    others = [(weight[q], weight[q] * walk.most(c.bound()))
                              for q, c in cursors.items() if q != phrase]
                    best: dict[str, float] = {}
                    for token, _ in fresh:
                        if token not in best:
                            best[token] = _token_best(walk, weight[phrase], token, others)
                    fresh = [(t, r) for t, r in fresh if best[t] >= kth]
                if fresh:
                    walk.settle([row_id for _, row_id in fresh])
        ranked = sorted((-score, -negated) for score, negated in walk.top)
        if single and _near_tie([s for s, _ in ranked]):
            # Scores that differ in their last bits could become equal once multiplied by the
            # idf, as FTS5 does; recompute them that way.
            idf = stats.idf(count(_phrase_match(distinct[0])))
            ranked = sorted((s * idf, i) for s, i in ranked)
        return [row_id for _, row_id in ranked]
    finally:
        for cursor in cursors.values():
            cursor.close()


def _token_best(
    walk: _Walk, weight: float, token: str, others: Sequence[tuple[float, float]]
) -> float:
    """The best score a row first found under ``token`` (of a one-word phrase of this
    ``weight``) can have: it was not indexed under every word, so another phrase is below the
    threshold — for a row this short, absent — and the others, (weight, best share) each, have
    not been read down to it."""
    _, _, f, length = token.rsplit("_", 3)
    n = int(length)
    least = _least_frequency(n, walk.index.avgdl)
    low_share = walk.share(least - 1, n) if least > 1 else -math.inf
    best = weight * walk.share(float(f), n)
    return (best + sum(high for _, high in others)
            - min(high - w * low_share for w, high in others))


def _near_tie(scores: Sequence[float]) -> bool:
    return any(a != b and abs(a - b) <= 1e-12 * abs(a) for a, b in zip(scores, scores[1:]))
