"""Exact BM25 ranking of word queries, proven from the search impact index.

**The order** is FTS5's own ``bm25()`` over ``messages_fts``, ties by message id. The score is
:func:`hermes_state_bm25.bm25_score`, the one place it is defined; FTS5's ``bm25()`` is its
oracle. :func:`top_k` proves the best rows, or returns None and the caller ranks with FTS5.
Both ways give the same rows in the same order; only the cost differs.

**Why a proof.** FTS5 scores every matching row before it sorts. A common word matches much
of the history, but its best rows are few: short messages, and long ones that repeat it. The
impact index (:mod:`hermes_state_impact`) lists each word's postings best first, so the top
is proven after reading a small part of them.

**How** (:class:`_Proof`). Rows the index does not hold yet are scored from their text. For
several words, the rows indexed under every word are scored next; SQLite hands back the best
few when the rest provably cannot enter the top (not at first beside a word in at least half
the rows, which weighs next to nothing: :func:`_proven`). Then each word's postings are read
best first (:class:`Postings`) until the k-th best row that passes the filters beats the best
score an unread row can have (:meth:`_Proof.frontier`). A row whose postings leave a
frequency unknown waits with its best case. It is scored only if that best case can still
enter the top: from its text, or with the others in one FTS5 pass, whichever reads less.

**When FTS5 ranks instead.** Costs are counted in rows, never timed. FTS5 ranks at once a
quoted phrase of several words (the index keeps no positions); several words in a small
index (:attr:`Ranking.fts5_index_rows`), one of which matches few rows
(:attr:`Ranking.exact_rank_rows`), or few of whose rows are indexed under all of them
(:attr:`Ranking.everywhere_per_wanted`); a single word matching few rows (the search asks,
:attr:`Ranking.fts5_word_rows`) or found rare by its first postings, a repeated word, many
unindexed rows, and a damaged or partial index. A proof gives up when it would handle more than
:attr:`Ranking.proof_share` of the rows FTS5 would score.

**Bounds.** Scores use the current avgdl; the index's keys use the avgdl A it was built with.
An impact x under A is at most x under avgdl when A ≥ avgdl, else x/(x + r·(1 − x)) with
r = A/avgdl. Every bound carries a relative slack for last-bit rounding.

**Counts.** A word's count (its idf) for the rows at or below the batch boundary stays exact
while ``search_row_changes`` does not move: the triggers count every change to such a row. The
index keeps the counts of common words (``search_word_counts``), and each process caches the
counts it made, per file: only the rows past the count's boundary are counted. A count
stopped at a limit goes on from the last row it read.

Every knob is a field of :class:`Ranking`, passed by the caller; none changes the order.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import logging
import math
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from hermes_state_bm25 import (
    IDF_FLOOR,
    K1,
    TEXT_BYTES_SQL,
    TEXT_COLUMNS,
    Bm25Stats,
    bm25_score,
    bm25_sql,
    bm25_sql_params,
    column_tokens,
    count_matches,
    folded_text,
    formula_matches_fts5,
    fts5_text,
    learn_characters,
    phrase_match,
    read_stats,
    text_frequency,
    varints,
)
from hermes_state_errors import (
    InvalidInputError,
    InvalidTypeError,
    is_sqlite_lock_error,
)
from hermes_state_impact import (
    INDEX_FAULTS,
    KEY_SCALE,
    MAX_TERM_CHARS,
    THRESHOLD,
    IndexMismatch,
    IndexState,
    consistent,
    index_error,
    least_frequency,
    notice_damage,
    read_state,
)

logger = logging.getLogger("hermes_state")

__all__ = [
    "ASCII_ROW_SQL",
    "RANKING",
    "ROW_TEXT_SQL",
    "WORD_ABSENT_SQL",
    "Conjunction",
    "Postings",
    "Ranking",
    "bounded_rows",
    "conjunction",
    "match_count",
    "passing",
    "top_k",
]

# Relative slack on every bound: the proof must survive a last-bit rounding difference.
_BOUND_SLACK = 1e-9


# The most rows a statement of a search is asked for, or a fetch returns, at once: more than
# any store holds, so that a count knob of any size (see Ranking) is no limit, and within what
# SQLite's integers and a cursor's fetch take (a number they refuse would read as damage).
_MOST_ROWS = 2**31 - 1


def bounded_rows(rows: int) -> int:
    """A count of rows as a statement's LIMIT or a fetch's size (see :data:`_MOST_ROWS`)."""
    return min(rows, _MOST_ROWS)


# ---------------------------------------------------------------------------------------------
# Match counts
# ---------------------------------------------------------------------------------------------

# Match counts of messages_fts (the idf of a word, the size of a query), kept per file for
# the rows at or below the batch boundary while search_row_changes's count stays: the triggers
# count every change of such a row (insert into a gap, update, delete), so an unchanged count
# means those rows are the same, and only the rows past the cached boundary are counted again.
ROW_CHANGES_SQL = """
SELECT s.epoch, c.changes FROM search_impact_state AS s, search_row_changes AS c
"""
# The rows matching past the cached boundary (?2), and those past the batch boundary (?3), which
# the cache leaves out, in one statement (one snapshot); a plain count(*) of FTS5 rows walks
# the list at half the cost of reading each row out.
COUNT_PAST_SQL = """
SELECT (SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?1 AND rowid > ?2),
       (SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?1 AND rowid > ?3)
"""
# The same, read no further than ?4 rows, and the last row read (a later count of the same
# search, in the same read transaction, goes on from there).
COUNT_PAST_UP_TO_SQL = """
SELECT n, last, (SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?1 AND rowid > ?3)
FROM (SELECT count(*) AS n, max(rowid) AS last FROM (
          SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?1 AND rowid > ?2
          ORDER BY rowid LIMIT ?4))
"""
KEPT_COUNT_SQL = """
SELECT s.epoch, s.counted_changes, w.upto, w.matching
FROM search_impact_state AS s JOIN search_word_counts AS w ON w.term = ?
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

    def __init__(self, conn: sqlite3.Connection, index: IndexState) -> None:
        self.conn = conn
        self.boundary = index.indexed
        self.counted: dict[str, int] = {}
        # Counts stopped at a limit: the cached (boundary, rows) they started from, the last
        # row read and the rows counted past that boundary up to it (at or below the batch
        # boundary). A later whole count goes on from there on the same base, whatever the
        # process-wide cache holds by then.
        self.partial: dict[str, tuple[int, int, int, int]] = {}
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
        """How many rows match ``expression``."""
        if expression not in self.counted:
            self.counted[expression] = self._count(expression, None)
        return self.counted[expression]

    def at_most(self, expression: str, limit: int) -> bool:
        """Whether at most ``limit`` rows match, read no further than one match past it."""
        if expression not in self.counted:
            found = self._count(expression, limit)
            if found > limit:
                return False
            self.counted[expression] = found
        return self.counted[expression] <= limit

    def _cached(self, expression: str) -> tuple[int, int] | None:
        """(boundary, rows) of the count of ``expression`` that holds for the most rows: the
        process's cache of this file, or the count the index keeps of a common word."""
        found = [self._kept(expression)]
        if self.file:
            with _COUNTS_LOCK:
                entry = _COUNTS.get(self.file)
                if entry is not None and entry.key == self.key:
                    found.append(entry.counts.get(expression))
        held = [c for c in found if c is not None and c[0] <= self.boundary]
        return max(held) if held else None

    def _kept(self, expression: str) -> tuple[int, int] | None:
        """(upto, rows) of the index's kept count of a single word, if it holds (see
        ``search_word_counts``)."""
        term = expression[1:-1]
        if self.key is None or expression != phrase_match((term,)) or '"' in term:
            return None
        try:
            row = self.conn.execute(KEPT_COUNT_SQL, (term,)).fetchone()
        except sqlite3.OperationalError as exc:
            if is_sqlite_lock_error(exc):
                raise
            return None  # an index of an earlier release, without the table
        if row is None or (row[0], row[1]) != self.key:
            return None
        return int(row[2]), int(row[3])

    def _count(self, expression: str, limit: int | None) -> int:
        """The rows matching ``expression``; past a ``limit``, some number above it."""
        if limit is None and expression in self.partial:
            upto, rows, last, read = self.partial.pop(expression)
        else:
            upto, rows = self._cached(expression) or (0, 0)
            last, read = upto, 0
        most: int | None = None
        if limit is None:
            args = (expression, last, self.boundary)
            past, unflushed = (int(v) for v in self.conn.execute(COUNT_PAST_SQL, args).fetchone())
            past += read
        else:
            most = bounded_rows(max(limit - rows + 1, 0))
            up_to = (expression, upto, self.boundary, most)
            n, end, flushed = self.conn.execute(COUNT_PAST_UP_TO_SQL, up_to).fetchone()
            past, unflushed = int(n), int(flushed)
            if past >= most and end is not None and end <= self.boundary:
                self.partial[expression] = (upto, rows, int(end), past)
        below = past - unflushed
        # Each statement reads its own snapshot: the count is kept only if no row at or below
        # the boundary changed around it (the boundary only grows within an epoch).
        whole = most is None or past < most
        if whole and self.file and below and self._key() == self.key:
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



# ---------------------------------------------------------------------------------------------
# Top k
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conjunction:
    """A query the fast route can rank: words (folded ASCII tokens) that must all occur, in
    query order, repeats kept (FTS5 scores each occurrence)."""

    words: tuple[str, ...]

    @property
    def match(self) -> str:
        return " ".join(phrase_match((w,)) for w in self.words)


def conjunction(texts: Iterable[str]) -> Conjunction | None:
    """The conjunction of these term texts, or None when one of them is not a single token the
    impact index keeps: a phrase of several words (FTS5 finds its matches by their positions,
    which the index does not keep), a token of another script or too long, none at all."""
    words = []
    for text in texts:
        tokens = column_tokens(text)
        if len(tokens) != 1 or not tokens[0].isascii() or len(tokens[0]) > MAX_TERM_CHARS:
            return None
        words.append(tokens[0])
    return Conjunction(tuple(words)) if words else None


# A word's postings best first, with their rows: the fts5vocab 'instance' view of the impact
# table, over the word's tokens (term_kkkk_f_D sorts by falling impact).
VOCAB_SQL = "SELECT term, doc FROM search_impact_vocab WHERE term >= ? AND term < ?"
# The postings from a cursor's next one on: the rest of its token's rows (in row order, as the
# cursor reads them), then the tokens after it; counted no further than ?4 (a count past what
# the proof may read tells no more than that limit does).
LEFT_SQL = """
SELECT count(*) FROM (
    SELECT 1 FROM search_impact_vocab WHERE term = ?1 AND doc >= ?2
    UNION ALL SELECT 1 FROM search_impact_vocab WHERE term > ?1 AND term < ?3 LIMIT ?4)
"""
INDEXED_ROWS_SQL = "SELECT rowid FROM search_impact_fts WHERE search_impact_fts MATCH ? LIMIT ?"
INDEXED_COUNT_SQL = f"SELECT count(*) FROM ({INDEXED_ROWS_SQL})"
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
# both): a first cut, whose rows are scored again exactly and checked against the filters.
# Each word's posting is cut once, into a short string. SQLite keeps only the rows of the
# widest cut as it sorts. ``well_formed`` is 1 for a row whose postings are text and read as
# numbers from 1 up (each word's frequency, and the length in the first word's posting:
# damage that still reads as such numbers is not told here); the others sort first, and
# ``found`` counts the rows with postings of the index's epoch: with a row of either kind
# missing, the rows are settled one by one, which tells the damage.
POSTED_NUMBERS = 24
POSTED_TAIL_SQL = f"substr(postings, nullif(instr(' ' || postings, ?), 0) + ?, {POSTED_NUMBERS})"
EVERYWHERE_TOP_SQL = """
WITH t AS MATERIALIZED (
    SELECT id, {tails} FROM search_impact
    WHERE id IN (SELECT value FROM json_each(?)) AND epoch = ?),
r AS MATERIALIZED (
    SELECT id, {frequencies}, CAST(substr(t0, instr(t0, '_') + 1) AS INTEGER) AS d, {text} AS text
    FROM t)
SELECT id, {score} AS score, d, {fs}, (text AND d >= 1 AND {counted}) AS well_formed,
       (SELECT count(*) FROM t) AS found
FROM r ORDER BY well_formed, score DESC, id LIMIT ?
"""
# The text of the rows that pass the filters, and their length in tokens as FTS5 keeps it (the
# column sizes in %_docsize). Most rows waiting on a word's frequency lack it, and a row of
# ASCII text that lacks a word even as a substring of its lower-cased text has no token that
# is the word: such rows are left out by the read itself, before their text reaches Python.
# A column is ASCII when it is NULL or text of as many bytes as characters (unicode61 folds
# some other characters onto ASCII letters; a blob is read by FTS5 its own way).
ROW_TEXT_SQL = """
SELECT m.id, """ + TEXT_BYTES_SQL + """, d.sz FROM messages AS m
JOIN sessions AS s ON s.id = m.session_id LEFT JOIN messages_fts_docsize AS d ON d.id = m.id
WHERE m.id IN (SELECT value FROM json_each(?)) {filters} AND NOT ({ascii} AND ({lacking}))
"""
ASCII_ROW_SQL = " AND ".join(
    f"({c} IS NULL OR (typeof({c}) = 'text' AND length({c}) = length(CAST({c} AS BLOB))))"
    for c in TEXT_COLUMNS)
# One word (a parameter per column) is in no column of the row, even as a substring.
WORD_ABSENT_SQL = "NOT (" + " OR ".join(
    f"instr(lower(coalesce({c}, '')), ?) > 0" for c in TEXT_COLUMNS) + ")"
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

@dataclass(frozen=True)
class Ranking:
    """The knobs of the ranking through the impact index, each a count or a share of one: a
    caller or a test passes its own to :func:`top_k` or to ``search_messages``; none changes
    the order, only which way it is found.

    What a way costs is counted, not timed: the proof handles rows (a posting read, a row's
    postings settled, a row scored from its text or by FTS5), and FTS5's own ranking of a
    query of several words scores every row that matches it; an FTS5 pass over chosen rows
    walks every row of its words' lists, a row's text is read token by token."""

    # An index of at most this many rows: FTS5 ranks a query of several words at once, before
    # anything is counted (there the proof's fixed costs, each word's count and the cut of the
    # rows indexed under every word, come to what FTS5's ranking of all the matches costs).
    fts5_index_rows: int = 25_000
    # A query of several words one of which matches at most this many rows is ranked by FTS5
    # (no more rows match them all, and ranking that many costs about what a proof does).
    exact_rank_rows: int = 12_000
    # ...as is one with fewer than this many times the rows wanted indexed under every word:
    # its best rows are then mostly rows a word's postings leave open, scored one by one.
    everywhere_per_wanted: int = 4
    # A single word matching at most this many rows is ranked by FTS5 at once (with a source or
    # role filter, over the rows that pass it, a join per match): its whole ranking costs about
    # what a proof's fixed reads do (the index's state, its queues, the first postings).
    fts5_word_rows: int = 1024
    # A substring search asks the trigram index for the trigrams covering the text, and reads
    # the rows holding them when at most this many do (each is then checked for the text);
    # with more, for every trigram of the text (see hermes_state_search._substring_rows).
    trigram_cover_rows: int = 256
    # A search in time order reads a query's rows a range of ids at a time (the index's time
    # blocks), in the order of their time bounds, until no range left can hold a row for the
    # page; each range is a statement of its own. A query matching at most this many rows per
    # range reads them all in one statement instead: spread that thin, a page needs most
    # ranges.
    time_order_rows_per_range: int = 2
    # A single word is read this far before its count is asked for: a rare word is then ranked
    # by FTS5 at once, a common one seldom needs more.
    single_word_probe_postings: int = 1024
    # Queued rows (changed, or written below the boundary by another program) and matching
    # rows past the batch boundary scored from their text; with more, FTS5 ranks.
    queue_scan_limit: int = 64
    max_unflushed_scored: int = 256
    # The most postings a proof reads and rows it scores from their text before FTS5 ranks.
    max_walk_postings: int = 40_000
    max_resolved_rows: int = 4_000
    # A word's postings are read in batches, doubling from the first to the largest.
    first_batch_postings: int = 32
    max_batch_postings: int = 1024
    # The proof for a query of several words gives up (FTS5 ranks) when it would have to read
    # a word's postings down to this close to the threshold.
    abort_margin: float = 0.03
    # Pending rows FTS5 would score: the text of this many times the rows wanted, the
    # likeliest first, is read instead (see :meth:`_Walk.resolve_pending`)...
    head_rows: int = 2
    # ...the likeliest of them that pass the filters, among this many times as many.
    head_look: int = 4
    # The rows indexed under every word that SQLite hands over first, beyond the rows wanted,
    # and how many cuts it hands over, each four times the last, before they are all scored
    # here (SQLite's sort keeps only the rows of the widest cut).
    everywhere_first_cut: int = 48
    everywhere_cuts: int = 2
    # The proof of a query of several words handles at most this share of the rows FTS5
    # would score to rank it (a row is handled in Python, scored by FTS5 in C: over the
    # bench's two-word queries at 200,000 messages a proof spent 6 to 25 times what FTS5
    # does per row).
    proof_share: float = 0.1
    # How rows left waiting are scored: "estimate" (from their text when that reads fewer
    # tokens than an FTS5 pass walks rows of its words' lists, else by FTS5), "text", "fts5".
    score_waiting_by: str = "estimate"
    # False: FTS5 ranks every query (a reference to compare the proofs with).
    proofs: bool = True

    def __post_init__(self) -> None:
        for knob in fields(self):
            value = getattr(self, knob.name)
            _check_knob(knob.name, str(knob.type), value)
            if str(knob.type) == "float":  # a share given as an int, of any size
                object.__setattr__(self, knob.name, _as_float(value))


WAITING_ROWS_BY = ("estimate", "text", "fts5")
# Knobs a proof cannot read postings without: a batch of none would never move.
_AT_LEAST_ONE = ("first_batch_postings", "max_batch_postings")
# A declared type's accepted values (a bool is no count), and how a refusal names them.
_KNOB_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "bool": ((bool,), "a bool"), "int": ((int,), "an int"), "float": ((int, float), "a number")}


def _check_knob(name: str, kind: str, value: object) -> None:
    """Refuse a knob of :class:`Ranking` of the wrong type or out of its range: counts and
    shares are numbers from 0 (the postings' batches from 1), ``proofs`` a bool."""
    if kind == "str":
        if value not in WAITING_ROWS_BY:
            raise InvalidInputError(f"{name} must be one of {WAITING_ROWS_BY}, got {value!r}",
                                    argument=name)
        return
    types, what = _KNOB_TYPES[kind]
    if not isinstance(value, types) or isinstance(value, bool) != (kind == "bool"):
        raise InvalidTypeError(f"{name} must be {what}, got {type(value).__name__}",
                               argument=name)
    least = 1 if name in _AT_LEAST_ONE else 0
    if kind != "bool" and isinstance(value, int | float) and not value >= least:  # NaN too
        raise InvalidInputError(f"{name} must be at least {least}, got {value!r}",
                                argument=name)


def _as_float(value: float) -> float:
    """A share as a float: an int past every float is no limit either (infinite), never a
    number the proof's arithmetic overflows on (which would read as a damaged index)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


RANKING = Ranking()


def passing(conn: sqlite3.Connection, ids: Sequence[int], filters: str,
            params: Sequence[object]) -> set[int]:
    """The rows among ``ids`` that pass the ``filters`` (as :func:`top_k` takes them)."""
    if not ids:
        return set()
    sql = CANDIDATES_SQL.format(filters=filters)
    return {r[0] for r in conn.execute(sql, (json.dumps(list(ids)), *params))}


def _posted(token: str) -> tuple[int, int]:
    """A posting token's frequency and row length (``term_kkkk_f_D``)."""
    _, _, f, length = token.rsplit("_", 3)
    return int(f), int(length)


class Postings:
    """A word's postings, best first: (token, row id) pairs."""

    def __init__(self, conn: sqlite3.Connection, term: str, ranking: Ranking) -> None:
        self.conn, self.term = conn, term
        self._rows = conn.execute(VOCAB_SQL, (term + "_", term + "`"))
        self._buffer: list[tuple[str, int]] = []
        self.batch = ranking.first_batch_postings
        self.max_batch = ranking.max_batch_postings
        self.next = self._read()

    def close(self) -> None:
        """End the statement: an unfinished one would keep its read transaction (and the
        file's locks) open on the store's connection."""
        self._rows.close()

    def _read(self) -> tuple[str, int] | None:
        if not self._buffer:  # as many as the batch being read: a proof often needs no more
            self._buffer = self._rows.fetchmany(bounded_rows(self.batch))[::-1]
            if not self._buffer:
                return None
        return self._buffer.pop()

    def bound(self) -> float:
        """Highest reference impact of any posting not read yet."""
        if self.next is None:
            return THRESHOLD
        return 1.0 - int(self.next[0].rsplit("_", 3)[1]) / KEY_SCALE

    def left(self, reach: float, most: int = -1) -> int:
        """How many postings not read yet have a reference impact of ``reach`` or more; past
        ``most`` (unless negative), some number above it."""
        if self.next is None:
            return 0
        end = f"{self.term}_{math.floor((1.0 - reach) * KEY_SCALE) + 1:04d}"
        token, row_id = self.next
        if token >= end:
            return 0
        limit = bounded_rows(most + 1) if most >= 0 else -1
        return int(self.conn.execute(LEFT_SQL, (token, row_id, end, limit)).fetchone()[0])

    def take(self) -> list[tuple[str, int]]:
        """The next postings, more each time (the first reads are the likeliest to suffice)."""
        postings: list[tuple[str, int]] = []
        while self.next is not None and len(postings) < self.batch:
            postings.append(self.next)
            self.next = self._read()
        self.batch = min(self.batch * 2, self.max_batch)
        return postings


@dataclass
class _Walk:
    """The state of one top-k search (see the module docstring)."""

    conn: sqlite3.Connection
    conj: Conjunction
    filters: str
    params: Sequence[object]
    wanted: int
    index: IndexState
    avgdl: float
    idfs: list[float]  # per word, in query order
    ranking: Ranking
    top: list[tuple[float, int]] = field(default_factory=list)  # min-heap of (score, -id)
    # Exactly scored rows whose filters are not checked yet: max-heap of (-score, id).
    unchecked: list[tuple[float, int]] = field(default_factory=list)
    pending: list[tuple[float, int]] = field(default_factory=list)  # max-heap (-bound, id)
    seen: set[int] = field(default_factory=set)
    resolved: int = 0
    # The rows of its words' lists an FTS5 pass over pending rows walks (counted when first
    # asked): None when scores leave out the idf, so FTS5's own cannot resolve them.
    list_rows: Callable[[], int] | None = None
    lengths: dict[int, int] = field(default_factory=dict)  # pending rows' lengths in tokens
    handled: int = 0  # the rows the proof has handled so far
    # Scores of rows left out of the top (or not let in), for :meth:`tie_at_the_edge`.
    passed_over: set[float] = field(default_factory=set)
    heads_read: int = 0  # the tokens of the likeliest pending rows' text read so far
    text_heads: int = 0  # the heads of pending rows read by text instead of all of them

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
            self.passed_over.add(heapq.heapreplace(self.top, item)[0])
        else:
            self.passed_over.add(score)

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
        """One word's score share per unit of idf: (k₁+1)·f/(f + K(length))."""
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
        return tuple(dict.fromkeys(self.conj.words))

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
        return passing(self.conn, list(ids), self.filters, self.params)

    def resolve_texts(self, ids: Sequence[int]) -> None:
        """Exact scores from the rows' text, for the rows among ``ids`` that pass the
        filters."""
        if not ids:
            return
        self.resolved += len(ids)
        sql = ROW_TEXT_SQL.format(filters=self.filters, ascii=ASCII_ROW_SQL,
                                  lacking=" OR ".join([WORD_ABSENT_SQL] * len(self.words)))
        words = [word for word in self.words for _ in TEXT_COLUMNS]
        rows = [(row_id, tuple(map(fts5_text, (content, tool_name, tool_calls))), sizes)
                for row_id, content, tool_name, tool_calls, sizes in self.conn.execute(
                    sql, (json.dumps(list(ids)), *self.params, *words))]
        learn_characters(text for _, texts, _ in rows for text in texts)
        for row_id, texts, sizes in rows:
            if sizes is not None:
                folded = [folded_text(t) for t in texts if t]
                frequencies = [text_frequency(folded, w) for w in self.conj.words]
                length = sum(varints(sizes))
            else:
                columns = [column_tokens(t) for t in texts]
                frequencies = [sum(c.count(w) for c in columns) for w in self.conj.words]
                length = sum(map(len, columns))
            if all(frequencies):
                self.offer(self.score(frequencies, length), row_id)

    def resolve_pending(self, floor: float | None) -> bool:
        """Score the pending rows whose best case reaches ``floor`` (all of them for None);
        False when there were none.

        Their text scores them, or FTS5 in one pass, whichever reads fewer (tokens of their
        text, rows of the words' lists). Either way the likeliest (highest best cases) come
        first, and the top they make leaves most of the others out: by text, the
        :attr:`Ranking.head_rows` × wanted likeliest, twice as many each time; before an FTS5
        pass, as many of the likeliest that pass the filters, while the tokens those reads
        take stay fewer than the pass walks."""
        due = [item for item in self.pending if floor is None or -item[0] >= floor]
        if not due:
            return False
        tokens = self._tokens(due)
        by = "text" if self.list_rows is None else self.ranking.score_waiting_by
        walked = self.list_rows() if self.list_rows and by == "estimate" else 0  # by FTS5
        by_text = by == "text" or (by == "estimate" and tokens <= walked)
        if by_text and self._read_a_text_head(len(due)):
            return True
        if by == "estimate" and not by_text and self._read_a_head(due, walked):
            return True
        self.pending = [] if floor is None else [i for i in self.pending if -i[0] < floor]
        heapq.heapify(self.pending)
        ids = sorted(row_id for _, row_id in due)
        self.handled += len(ids)
        if by_text:
            self.resolve_texts(ids)
        else:
            self._resolve_by_fts5(ids)
        return True

    def _read_a_text_head(self, due: int) -> bool:
        """Score the likeliest of the ``due`` rows from their text (the filters checked as it
        is read), before the others; False when the head would take them all."""
        head = (self.ranking.head_rows * self.wanted) << self.text_heads
        if not 0 < head < due:
            return False
        self.text_heads += 1
        self.handled += head
        self.resolve_texts(sorted(heapq.heappop(self.pending)[1] for _ in range(head)))
        return True

    def _read_a_head(self, due: Sequence[tuple[float, int]], walked: int) -> bool:
        """Score the likeliest of the ``due`` rows from their text instead of an FTS5 pass
        that walks ``walked`` rows, while the heads read stay fewer tokens than that; False
        when there is no head to read."""
        head = self.ranking.head_rows * self.wanted
        if not 0 < head < len(due):
            return False
        head_tokens = self._tokens(heapq.nsmallest(head, due))
        if self.heads_read + head_tokens >= walked:
            return False
        self.heads_read += head_tokens
        self.handled += head
        self.resolve_texts(self._likeliest(head))
        return True

    def _resolve_by_fts5(self, ids: Sequence[int]) -> None:
        """FTS5's own scores for ``ids``, in one pass; the filters are checked only for the
        rows that can still enter the top (see :meth:`propose`)."""
        if ids:
            args = (self.conj.match, min(ids), max(ids), json.dumps(sorted(ids)))
            for row_id, bm25 in self.conn.execute(RESOLVE_SQL, args):
                self.propose(-bm25, row_id)

    def _likeliest(self, n: int) -> list[int]:
        """Up to ``n`` of the pending rows with the highest best cases that pass the filters,
        taken off the heap, in id order: the likeliest :attr:`Ranking.head_look` × ``n`` are
        checked, and those failing the filters dropped (they cannot enter the top)."""
        look = min(self.ranking.head_look * n, len(self.pending))
        looked = [heapq.heappop(self.pending) for _ in range(look)]
        passing = self.passing(row_id for _, row_id in looked)
        taken: list[int] = []
        for item in looked:
            if item[1] not in passing:
                continue
            if len(taken) < n:
                taken.append(item[1])
            else:
                heapq.heappush(self.pending, item)
        return sorted(taken)

    def _tokens(self, due: Sequence[tuple[float, int]]) -> int:
        """The tokens of these pending rows' text (a row of unknown length counts avgdl)."""
        return sum(self.lengths.get(row_id, round(self.avgdl)) for _, row_id in due)

    def pending_rows(self) -> int:
        """The rows scoring every pending row by FTS5 would handle (none when it cannot)."""
        return 0 if self.list_rows is None else len(self.pending)

    def settle(self, ids: Sequence[int]) -> None:
        """Score new candidate rows (see :meth:`score_rows`): rows ``search_impact_fts``
        indexes, so each has its postings in ``search_impact``, or the two disagree."""
        self.handled += len(ids)
        sql, params = self.postings_sql
        rows = self.conn.execute(sql, (*params, json.dumps(list(ids)))).fetchall()
        if len(rows) < len(set(ids)):
            raise IndexMismatch(f"{len(set(ids)) - len(rows)} indexed rows without postings")
        self.score_rows(rows)

    def wait_below(self, word: str, postings: Sequence[tuple[str, int]]) -> None:
        """Rows of a query of two words that ``word``'s postings find after the rows indexed
        under both were scored: each is indexed under ``word`` alone, so the other word is
        below the threshold in it (absent from a row so short that it posts every word). Its
        posting tells its frequency of ``word`` and its length, and its postings in
        ``search_impact`` would tell nothing more: it waits with its best case, as in
        :meth:`score_rows`, without reading them."""
        kth = self.kth()
        for token, row_id in postings:
            f, length = _posted(token)
            least = least_frequency(length, self.index.avgdl)
            if least == 1:
                continue  # a row this short would have indexed the other word: it lacks it
            best = self.score([f if w == word else float(least - 1)
                               for w in self.conj.words], length)
            if kth is None or best >= kth:
                heapq.heappush(self.pending, (-best, row_id))
                self.lengths[row_id] = length

    def settle_everywhere(self, ids: Sequence[int]) -> None:
        """Score the rows indexed under every word of a query of single words (all their
        frequencies are in their postings): SQLite picks the best few, and only those are
        scored and checked against the filters here, when the rest provably cannot enter the
        top; else every row is scored here (see :meth:`settle`)."""
        words = self.words
        tails = ", ".join(f"{POSTED_TAIL_SQL} AS t{j}" for j in range(len(words)))
        frequencies = ", ".join(f"CAST(t{j} AS INTEGER) AS f{j}" for j in range(len(words)))
        text = " AND ".join(f"typeof(t{j}) = 'text'" for j in range(len(words)))
        column = {w: j for j, w in enumerate(words)}
        score = bm25_sql([f"f{column[w]}" for w in self.conj.words], "d")
        fs = ", ".join(f"f{j}" for j in range(len(words)))
        counted = " AND ".join(f"f{j} >= 1" for j in range(len(words)))
        sql = EVERYWHERE_TOP_SQL.format(tails=tails, frequencies=frequencies, text=text,
                                        score=score, fs=fs, counted=counted)
        params: list[object] = []
        for word in words:
            params += [" " + word + "_", len(word) + 6]
        params += [json.dumps(list(ids)), self.index.epoch]
        params += bm25_sql_params(self.idfs, self.avgdl)
        rows: list[Any] = []
        passing: set[int] = set()
        limit = self.ranking.everywhere_first_cut + self.wanted
        # (Past 16 widenings a cut holds more rows than any statement returns.)
        widest = limit * 4 ** min(max(0, self.ranking.everywhere_cuts - 1), 16)
        cursor = self.conn.execute(sql, (*params, bounded_rows(widest)))
        try:
            for _ in range(self.ranking.everywhere_cuts):
                cut = cursor.fetchmany(bounded_rows(limit - len(rows)))
                rows += cut
                if not rows or rows[0][-2] != 1 or rows[0][-1] != len(ids):
                    break  # a row without the postings it should have: score every one here
                passing |= self.passing(row[0] for row in cut)
                scored = sorted(
                    ((self.score([float(row[3 + column[w]]) for w in self.conj.words],
                                 int(row[2])), int(row[0])) for row in rows if row[0] in passing),
                    reverse=True)
                # Every row not read scores at most the last one read, as SQLite computes it:
                # it cannot enter the top if that is below the k-th best passing the filters
                # (with a margin for a last-bit difference between the two computations).
                if len(rows) < limit or (len(scored) >= self.wanted and float(rows[-1][1])
                                         * (1.0 + _BOUND_SLACK) < scored[self.wanted - 1][0]):
                    for row_score, row_id in scored:
                        self.offer(row_score, row_id)
                    return
                limit *= 4
        finally:
            cursor.close()
        self.settle(ids)

    def score_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """Score candidate rows: exactly from their postings when those tell every word's
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
                    postings[word] = _posted(token.split(" ", 1)[0])
            length = next(iter(postings.values()))[1] if postings else 0
            least = least_frequency(length, self.index.avgdl)
            settled = True
            upper: list[float] = []
            for word in self.conj.words:
                if word in postings:
                    upper.append(float(postings[word][0]))
                elif least == 1:
                    break  # a row this short would have indexed that word: it lacks it
                else:
                    upper.append(float(least - 1))
                    settled = False
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
                f, length = _posted(token)
                score = self.score([f] * len(self.conj.words), length)
                last = token
            if kth is None or score >= kth:
                self.propose(score, row_id)
            else:
                self.passed_over.add(score)

    def tie_at_the_edge(self, unseen: float) -> bool:
        """Whether the edge of a one-word query's full top may move once the scores are
        multiplied by the idf, as FTS5 does: scores a hair apart can become equal, and FTS5
        then orders the rows by id. So: a row not read may come that close to the last row in
        (its score at most ``unseen``), or a row left out scores that close and some two
        scores there differ (left out at a tie with the last row, it may still come in, when a
        row just above both joins the tie)."""
        kth = self.kth()
        if kth is None:
            return False
        low, high = kth - NEAR_TIE * abs(kth), kth + NEAR_TIE * abs(kth)
        left_out = self.passed_over | {-negated for negated, _ in self.unchecked}
        near = {s for s in left_out if low <= s <= kth}
        if unseen >= low:
            return True
        return bool(near) and len(near | {s for s, _ in self.top if s <= high}) > 1


# Matching rows past the batch boundary; queued rows (changed, or written below it by another
# program). Neither has current postings: both are scored from their text, and when there
# are more than a search scores itself, FTS5 ranks.
UNFLUSHED_MATCHES_SQL = """
SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? AND rowid > ? LIMIT ?
"""
QUEUED_SQL = "SELECT id FROM search_impact_queue LIMIT ?"


def _outside_the_index(
    conn: sqlite3.Connection, conj: Conjunction, index: IndexState, ranking: Ranking
) -> tuple[set[int], list[int]] | None:
    """(Rows whose postings must be ignored, those of them that match), or None."""
    limit = ranking.queue_scan_limit
    queued = [r[0] for r in conn.execute(QUEUED_SQL, (bounded_rows(limit + 1),))]
    if len(queued) > limit:
        return None
    args = (conj.match, index.indexed, bounded_rows(ranking.max_unflushed_scored + 1))
    unflushed = [r[0] for r in conn.execute(UNFLUSHED_MATCHES_SQL, args)]
    if len(unflushed) > ranking.max_unflushed_scored:
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
    ranking: Ranking = RANKING,
) -> list[int] | None:
    """The ids of the best ``wanted`` rows matching ``conj`` and the ``filters`` (an SQL
    condition on ``m`` = messages and ``s`` = sessions, starting with AND), best first, ties by
    id — or None when the impact index cannot prove them (the caller ranks with FTS5)."""
    if wanted <= 0:
        return []
    if not ranking.proofs or not formula_matches_fts5():
        return None
    try:
        return _top_k(conn, conj, filters, params, wanted, ranking)
    except INDEX_FAULTS as exc:
        if not index_error(exc):
            raise
        logger.warning("search impact index unreadable (%s); ranking with FTS5", exc)
        notice_damage(conn)
        return None


def match_count(conn: sqlite3.Connection, expression: str) -> int:
    """How many rows of ``messages_fts`` match ``expression``: through the cached counts when
    the impact index is whole (see :data:`ROW_CHANGES_SQL`), else counted outright."""
    index = read_state(conn)
    if index is not None and index.whole:
        try:
            return _Counter(conn, index)(expression)
        except INDEX_FAULTS as exc:
            if not index_error(exc):
                raise
            notice_damage(conn)
    return count_matches(conn, "messages_fts", expression)


def _list_rows(words: Sequence[str], count: Callable[[str], int]) -> int:
    """The rows of these words' lists, which FTS5 walks to match and count them."""
    return sum(count(phrase_match((word,))) for word in words)


def _top_k(
    conn: sqlite3.Connection,
    conj: Conjunction,
    filters: str,
    params: Sequence[object],
    wanted: int,
    ranking: Ranking,
) -> list[int] | None:
    distinct = list(dict.fromkeys(conj.words))
    single = len(distinct) == 1
    if single and len(conj.words) > 1:
        # One word again and again: FTS5 adds idf·x once per time, which differs in its last
        # bits from any multiple of x taken before the idf. FTS5 ranks.
        return None
    stats = read_stats(conn)
    if not single and stats.rows <= ranking.fts5_index_rows:
        return None  # a small index: FTS5 ranks several words faster than they are counted
    index = read_state(conn)
    if index is None or not index.whole:
        return None
    if not single and _few_indexed_under_all(conn, distinct, wanted, ranking):
        return None  # asked first: FTS5 then ranks, whatever the rest of the index holds
    if not consistent(conn, index):
        notice_damage(conn)  # a copy that kept one table without the other
        return None
    if stats.rows == 0 or stats.tokens == 0:
        return []
    count = _Counter(conn, index)
    # A word matching at most exact_rank_rows rows: no more match them all, and FTS5 ranks
    # that many faster than a proof (its count stops one past; a proof's goes on from there).
    if not single and any(count.at_most(phrase_match((w,)), ranking.exact_rank_rows)
                          for w in distinct):
        return None
    outside = _outside_the_index(conn, conj, index, ranking)
    if outside is None:
        return None
    return _proven(conn, conj, filters, params, wanted, index, stats, count, outside, ranking)


def _proven(
    conn: sqlite3.Connection, conj: Conjunction, filters: str, params: Sequence[object],
    wanted: int, index: IndexState, stats: Bm25Stats, count: _Counter,
    outside: tuple[set[int], list[int]], ranking: Ranking,
) -> list[int] | None:
    """The top the proof settles (None: FTS5 ranks).

    A word in at least half the rows has FTS5's floor for its idf: it weighs next to
    nothing, so it hardly bounds a row the other words' postings have not found yet, and
    most rows are indexed under it. A query holding one is proven first from the postings
    alone, each row they find scored whichever words index it; then, should that not settle
    the top within the budget, with the rows indexed under every word scored first, as any
    other query of several words is."""
    distinct = set(conj.words)
    light = len(distinct) > 1 and any(stats.idf(count(phrase_match((w,)))) <= IDF_FLOOR
                                      for w in distinct)
    for under_all_first in ((False, True) if light else (True,)):
        proof = _start(conn, conj, filters, params, wanted, index, stats, count, outside,
                       ranking, under_all_first)
        if proof is None:
            continue
        try:
            unseen = proof.run()
            if unseen is not None:
                return proof.ranked(unseen, stats)
        finally:
            proof.close()
    return None


def _few_indexed_under_all(
    conn: sqlite3.Connection, words: Sequence[str], wanted: int, ranking: Ranking,
) -> bool:
    """Whether fewer rows than :attr:`Ranking.everywhere_per_wanted` times the rows wanted are
    indexed under every one of several ``words``: FTS5 then ranks them faster than a proof (the
    best rows are mostly rows a word's postings leave open)."""
    least = ranking.everywhere_per_wanted * wanted
    found = conn.execute(INDEXED_COUNT_SQL, (_under_all(words), bounded_rows(least))).fetchone()[0]
    return bool(found < least)


def _indexed_under_all(
    conn: sqlite3.Connection, words: Sequence[str], most: float,
) -> list[int] | None:
    """The rows indexed under every one of several ``words``, or None when there are more
    than ``most`` (read no further than one past it)."""
    limit = bounded_rows(math.floor(most) + 1) if math.isfinite(most) else -1
    rows = [r[0] for r in conn.execute(INDEXED_ROWS_SQL, (_under_all(words), limit))]
    return None if len(rows) > most else rows


def _under_all(words: Sequence[str]) -> str:
    """The MATCH of ``search_impact_fts`` for the rows indexed under every one of ``words``."""
    return " AND ".join(f'"{w}"' for w in words)


def _start(
    conn: sqlite3.Connection, conj: Conjunction, filters: str, params: Sequence[object],
    wanted: int, index: IndexState, stats: Bm25Stats, count: _Counter,
    outside: tuple[set[int], list[int]], ranking: Ranking, under_all_first: bool,
) -> _Proof | None:
    """The proof of a query's top, its rows outside the index scored, and for a query of
    several words the rows indexed under every one, unless not ``under_all_first`` (None:
    FTS5 ranks)."""
    distinct = list(dict.fromkeys(conj.words))
    # A single word: idf scales every score alike, so it is left out until a near tie needs
    # it. Otherwise each word weighs its own idf.
    single = len(distinct) == 1
    idf_of = {w: 1.0 for w in distinct}
    list_rows: Callable[[], int] | None = None
    budget = math.inf  # the rows the proof may handle
    if not single:
        # The words' counts give their idf; FTS5 would score the rows matching them all, at
        # most those of the rarest.
        hits = {w: count(phrase_match((w,))) for w in distinct}
        idf_of = {w: stats.idf(n) for w, n in hits.items()}
        budget = ranking.proof_share * min(hits.values())
        list_rows = functools.partial(_list_rows, distinct, count)
    walk = _Walk(conn, conj, filters, params, wanted, index, stats.avgdl,
                 [idf_of[w] for w in conj.words], ranking, seen=set(outside[0]),
                 list_rows=list_rows)
    everywhere: list[int] = []
    if not single and under_all_first:
        # Each row indexed under every word is a row the proof handles: with more of them
        # than its budget, FTS5 ranks (known once the list has more rows than the budget and
        # the rows already seen, before any row is scored).
        listed = _indexed_under_all(conn, distinct, budget + len(walk.seen))
        if listed is None:
            return None
        everywhere = [r for r in listed if r not in walk.seen]
        walk.handled += len(everywhere)
        if walk.handled > budget:
            return None
        walk.seen.update(everywhere)
    walk.resolve_texts(sorted(outside[1]))
    if not single and under_all_first:
        # Score the rows indexed under every word; any other row has a word below the
        # threshold, which bounds it far lower than the postings' frontiers alone would.
        if everywhere:
            walk.settle_everywhere(everywhere)
        if len(walk.top) + len(walk.unchecked) + len(walk.pending) < wanted:
            return None  # the best rows are not all indexed under every word: FTS5 ranks
    weight = {w: sum(idf_of[q] for q in conj.words if q == w) for w in distinct}
    cursors = {w: Postings(conn, w, ranking) for w in distinct}
    return _Proof(walk, cursors, weight, budget, count, ranking, under_all_first)


@dataclass
class _Proof:
    """The postings of a query's words read best first until the top is proven."""

    walk: _Walk
    cursors: dict[str, Postings]
    weight: dict[str, float]  # each distinct word's idf, times its repeats
    budget: float  # the rows the proof may handle (a share of those FTS5 would score)
    count: _Counter
    ranking: Ranking
    # Whether the rows indexed under every word were scored first: then a row the postings
    # find has some word below the threshold.
    under_all_first: bool
    read: int = 0  # postings read
    settled: int = 0  # rows those postings found, scored or left waiting
    foresee_at: int = 1

    @property
    def single(self) -> bool:
        return len(self.cursors) == 1

    def close(self) -> None:
        for cursor in self.cursors.values():
            cursor.close()

    def frontier(self) -> tuple[float, dict[str, float], list[str]]:
        """(The best score of a row not found yet, each word's best share of it, the words
        whose postings can still find one). When the rows indexed under every word were not
        scored first, such a row may be one of them."""
        shares = {w: self.weight[w] * self.walk.most(c.bound()) for w, c in self.cursors.items()}
        total = sum(shares.values())
        if self.single or not self.under_all_first:
            return total, shares, list(shares)
        # The unseen row's word below the threshold, whichever it is, weighs least.
        floor = self.walk.most(THRESHOLD)
        below = max(shares, key=lambda w: total - shares[w] + self.weight[w] * floor)
        unseen = total - shares[below] + self.weight[below] * floor
        return unseen, shares, [w for w in shares if w != below]

    def run(self) -> float | None:
        """Read until the k-th best row beats every row not found: the best score such a row
        can have, or None when FTS5 is the faster way (or the proof cannot be made)."""
        walk = self.walk
        while True:
            unseen, shares, readable = self.frontier()
            kth = walk.kth()
            live = [w for w in readable if self.cursors[w].next is not None]
            only_pending = (kth is not None and kth > unseen) or not live
            # FTS5 ranks once the rows the proof has handled and its waiting rows reach its
            # budget; when only those rows are left, once they alone would.
            if walk.pending_rows() + (0 if only_pending else walk.handled) > self.budget:
                return None
            if only_pending:
                if walk.resolve_pending(kth):
                    continue  # the top moved: check the proof again
                return unseen if kth is not None and kth > unseen else None
            if (walk.resolved > self.ranking.max_resolved_rows
                    or self.read > self.ranking.max_walk_postings):
                return None
            word = max(live, key=lambda w: shares[w])
            if kth is not None and not self.worth_reading(word, kth, unseen, shares[word]):
                return None
            if not self.read_batch(word, kth):
                return None

    def worth_reading(self, word: str, kth: float, unseen: float, share: float) -> bool:
        """Whether reading this word's postings as deep as the proof needs stays within its
        budget: nearly to the end means reading a common word's whole list, where FTS5 is the
        faster way."""
        if self.single:
            return True
        reach = self.walk.reference_for((kth - unseen + share) / self.weight[word])
        if reach is None or reach < THRESHOLD + self.ranking.abort_margin:
            return False
        if self.read < self.foresee_at:
            return True
        # After a first batch, and whenever the postings read have doubled: the rows reading
        # down to that depth would handle, each posting and, at the share of postings settled
        # so far, the row it finds.
        self.foresee_at = 2 * self.read
        per_posting = 1.0 + self.settled / self.read
        room = self.budget - self.walk.pending_rows()
        if room < 0:
            return False
        # Counted no further than the budget allows: a larger count decides the same.
        most = math.floor(room / per_posting) if math.isfinite(room) else -1
        return self.cursors[word].left(reach, most) * per_posting <= room

    def read_batch(self, word: str, kth: float | None) -> bool:
        """Read the word's next postings and score (or set waiting) the rows they find; False
        when the word proves rare enough for FTS5 to rank at once."""
        walk, ranking = self.walk, self.ranking
        postings = self.cursors[word].take()
        probe = ranking.single_word_probe_postings
        if (self.single and self.read < probe <= self.read + len(postings)
                and self.count.at_most(walk.conj.match, ranking.exact_rank_rows)):
            return False
        self.read += len(postings)
        walk.handled += len(postings)
        fresh = [(token, row_id) for token, row_id in postings if row_id not in walk.seen]
        walk.seen.update(row_id for _, row_id in fresh)
        if self.single:
            walk.offer_single(fresh, kth)
            return True
        if kth is not None:
            fresh = self._able_to_enter(word, fresh, kth)
        if fresh:
            self.settled += len(fresh)
            # Two words, the rows indexed under both scored first: a row the postings of one
            # of them find later is not indexed under the other.
            if len(self.cursors) == 2 and self.under_all_first:
                walk.wait_below(word, fresh)
            else:
                walk.settle([row_id for _, row_id in fresh])
        return True

    def _able_to_enter(self, word: str, postings: list[tuple[str, int]],
                       kth: float) -> list[tuple[str, int]]:
        """The postings of ``word`` whose rows can still beat ``kth`` (see
        :func:`_token_best`; the other words' best shares do not change within a batch)."""
        others = [(self.weight[w], self.weight[w] * self.walk.most(c.bound()))
                  for w, c in self.cursors.items() if w != word]
        best: dict[str, float] = {}
        for token, _ in postings:
            if token not in best:
                best[token] = _token_best(self.walk, self.weight[word], token, others,
                                          below=self.under_all_first)
        return [(t, r) for t, r in postings if best[t] >= kth]

    def ranked(self, unseen: float, stats: Bm25Stats) -> list[int] | None:
        """The proven top's ids, best first (None: FTS5 ranks, the idf could tie its edge)."""
        walk = self.walk
        if self.single and walk.tie_at_the_edge(unseen):
            return None  # FTS5 ranks: which of the two makes the page depends on the idf
        ranked = sorted((-score, -negated) for score, negated in walk.top)
        if self.single and _near_tie([s for s, _ in ranked]):
            # Scores that differ in their last bits could become equal once multiplied by the
            # idf, as FTS5 does; recompute them that way.
            idf = stats.idf(self.count(phrase_match((next(iter(self.cursors)),))))
            ranked = sorted((s * idf, i) for s, i in ranked)
        return [row_id for _, row_id in ranked]


def _token_best(
    walk: _Walk, weight: float, token: str, others: Sequence[tuple[float, float]],
    below: bool,
) -> float:
    """The best score a row first found under ``token`` (of a word of this ``weight``) can
    have: the others, (weight, best share) each, have not been read down to it; and with
    ``below``, it was not indexed under every word (those were scored first), so another
    word is below the threshold — for a row this short, absent."""
    f, n = _posted(token)
    best = weight * walk.share(f, n) + sum(high for _, high in others)
    if not below:
        return best
    least = least_frequency(n, walk.index.avgdl)
    low_share = walk.share(least - 1, n) if least > 1 else -math.inf
    return best - min(high - w * low_share for w, high in others)


# Scores this close (relatively) may be equal once multiplied by the idf.
NEAR_TIE = 1e-12


def _near_tie(scores: Sequence[float]) -> bool:
    return any(a != b and abs(a - b) <= NEAR_TIE * abs(a) for a, b in itertools.pairwise(scores))
