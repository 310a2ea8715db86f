"""FTS5's own computations, reproduced in Python bit for bit: unicode61's tokens and ``bm25()``.

**Tokens.** ``messages_fts`` uses the unicode61 tokenizer. ASCII letters and digits are token
characters, folded to lower case; every other ASCII byte separates tokens. Other characters
are decided one code point at a time from SQLite's own Unicode tables, which need not be
Python's. So each new character is asked of FTS5 itself, once per process (:func:`_learn`),
unless both Unicode versions Python knows, 3.2 and its own, make it an other letter (CJK,
kana, Hangul), which unicode61 keeps as it is, or punctuation, a symbol or a space, at which it
separates tokens (a test asks the running SQLite about each).
Only the characters unicode61 changes are replaced in a text: a text's set of characters,
less those known to be kept as they are, is all there is to look at.
:func:`column_tokens` gives exactly FTS5's tokens of a column; :func:`fts5_text` reads a blob
another client stored as FTS5 reads it. :func:`text_frequency` counts a word in folded text
without splitting it into tokens.

**The score.** For phrases p₁…pₙ FTS5 scores a row

    score = Σᵢ idfᵢ · fᵢ·(k₁+1) / (fᵢ + k₁·(1 − b + b·D/avgdl)),   k₁ = 1.2, b = 0.75,

fᵢ the instances of pᵢ in the row's three columns (weight 1 each), D the row's length in
tokens, avgdl the mean length over the index, idfᵢ = ln((N − nᵢ + ½)/(nᵢ + ½)) (at least
10⁻⁶) for N rows of which nᵢ contain pᵢ. :func:`bm25_score` is the one definition: it
computes that in FTS5's floating-point order, from the index's own averages record
(:func:`read_stats`). :func:`bm25_sql` writes the same in SQL. :func:`formula_matches_fts5`
checks it against this SQLite once per process; a SQLite that scores differently never takes
the library's own ranking.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import sqlite3
import threading
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

logger = logging.getLogger("hermes_state")

__all__ = [
    "IDF_FLOOR",
    "K1",
    "SEPARATORS",
    "SEPARATOR_CLASS",
    "TEXT_BYTES_SQL",
    "TEXT_COLUMNS",
    "B",
    "Bm25Stats",
    "ColumnValue",
    "ascii_lower",
    "bm25_score",
    "bm25_sql",
    "bm25_sql_params",
    "column_tokens",
    "count_matches",
    "folded_origins",
    "folded_text",
    "formula_matches_fts5",
    "fts5_text",
    "learn_characters",
    "phrase_match",
    "read_stats",
    "row_counts",
    "text_frequency",
    "varints",
    "with_changes",
]

K1 = 1.2
B = 0.75
# FTS5's idf of a word in at least half the rows (its formula's value is not above 0 there).
IDF_FLOOR = 1e-6


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
_ASCII_BYTES = bytes(range(128))
# Every character looked up so far → what unicode61 makes of it: " " for a separator, else its
# folded form (possibly empty). unicode61 decides and folds one code point at a time, from
# tables of its own Unicode version (not Python's), so each new character is asked of FTS5
# itself, once per process, unless both Unicode versions Python knows make it an other letter
# or a separator (:func:`_learn`); ASCII is known from the start.
_CHARS: dict[int, str] = {c: chr(_ASCII_FOLD[c]) for c in range(128)}
_PROBE_LOCK = threading.Lock()
_probe: sqlite3.Connection | None = None
PROBE_SQL = "SELECT doc, term FROM temp.probe_vocab ORDER BY doc, offset"


def _probe_terms(docs: Sequence[str]) -> list[list[str]]:
    """The terms unicode61 makes of each of ``docs``, in order (the caller holds the lock)."""
    global _probe
    if _probe is None:
        probe = sqlite3.connect(":memory:", check_same_thread=False)
        # FTS5 cuts a token past 32 KB, maybe inside a character.
        probe.text_factory = lambda b: b.decode(errors="replace")
        try:
            probe.execute("CREATE VIRTUAL TABLE temp.probe USING fts5(x, content='')")
            probe.execute("CREATE VIRTUAL TABLE temp.probe_vocab"
                          " USING fts5vocab(temp, probe, 'instance')")
        except sqlite3.OperationalError:  # an SQLite without FTS5
            probe.close()
            raise
        _probe = probe
    _probe.execute("INSERT INTO temp.probe (probe) VALUES ('delete-all')")
    _probe.executemany("INSERT INTO temp.probe (rowid, x) VALUES (?, ?)", enumerate(docs))
    terms: list[list[str]] = [[] for _ in docs]
    for doc, term in _probe.execute(PROBE_SQL):
        terms[doc].append(term)
    return terms


# The characters unicode61 keeps as they are (a token character folding to itself), of those
# looked up so far: a text's characters less these are the ones to look at. Replaced, never
# changed in place, so a reader needs no lock.
_kept: frozenset[str] = frozenset()


def _without_fts5(ch: str) -> str:
    """What unicode61 makes of ``ch`` as far as Python's Unicode tables tell, for an SQLite
    without FTS5 to ask: letters, digits and private use are kept, folded to lower case
    without their diacritics (marks are dropped); anything else separates tokens."""
    category = unicodedata.category(ch)
    if category[0] == "M":
        return ""
    if category[0] not in "LN" and category != "Co":
        return " "
    base = unicodedata.normalize("NFKD", ch.lower())
    return "".join(c for c in base if not unicodedata.combining(c)) or ch.lower()


def _learn(chars: Iterable[str]) -> None:
    """What unicode61 makes of each of ``chars``: other letters of both Unicode versions
    Python knows are kept as they are (:func:`_surely_kept`), their punctuation, symbols and
    spaces separate tokens (:func:`_surely_separates`), the rest are asked of FTS5."""
    global _kept
    with _PROBE_LOCK:
        todo = [ch for ch in dict.fromkeys(chars) if ord(ch) not in _CHARS]
        if not todo:
            return
        likely: list[str] = []
        alone: list[str] = []
        for ch in todo:
            if _surely_kept(ch):
                _CHARS[ord(ch)] = ch
            elif _surely_separates(ch):
                _CHARS[ord(ch)] = " "
            else:
                (likely if _likely_kept(ch) else alone).append(ch)
        if likely or alone:
            _ask_fts5(likely, alone)
        _kept = _kept | {ch for ch in todo if _CHARS[ord(ch)] == ch}


def _ask_fts5(likely: list[str], alone: list[str]) -> None:
    """What unicode61 makes of each character, into :data:`_CHARS` (the caller holds the
    lock). Those ``likely`` kept as they are (:func:`_likely_kept`) are asked in runs, a token
    each, and known kept when a run comes back whole, which costs FTS5 far less than a token
    a character; those ``alone``, and those of a run that does not come back whole, are each
    tokenized alone between two ``a``s (by :func:`_without_fts5` on an SQLite without
    FTS5)."""
    runs = ["".join(likely[i:i + _RUN_CHARS]) for i in range(0, len(likely), _RUN_CHARS)]
    alone = list(alone)
    try:
        *made, terms = _probe_terms([*(f"a{run}a" for run in runs), _one_by_one(alone)])
        for run, made_of_run in zip(runs, made):
            if made_of_run == [f"a{run}a"]:
                _CHARS.update((ord(ch), ch) for ch in run)
            else:
                alone += run
                terms += _probe_terms([_one_by_one(run)])[0]
    except sqlite3.OperationalError:
        _CHARS.update((ord(ch), _without_fts5(ch)) for ch in (*likely, *alone))
        return
    each = iter(terms)
    for ch in alone:
        term = next(each)
        if term == "a":  # a separator: "a", "a"
            next(each)
            _CHARS[ord(ch)] = " "
        else:
            _CHARS[ord(ch)] = term[1:-1]


# Characters asked of FTS5 in one token at most (FTS5 cuts a token past 32 KB).
_RUN_CHARS = 2_000


def _surely_kept(ch: str) -> bool:
    """Whether ``ch`` is an other letter (Lo: CJK ideographs, kana, Hangul syllables...) in
    both Unicode versions Python knows, 3.2 and its own. unicode61 keeps every such character
    as it is: its tables, of Unicode 6.1 between the two, make it a token character, and it
    has no case to fold nor a diacritic unicode61 removes. A test asks the running SQLite
    about every one of them."""
    return unicodedata.category(ch) == "Lo" and unicodedata.ucd_3_2_0.category(ch) == "Lo"


def _surely_separates(ch: str) -> bool:
    """Whether both Unicode versions Python knows, 3.2 and its own, call ``ch`` punctuation, a
    symbol, a space, or a control or format character (``—``, ``…``, ``€``, a zero-width
    space). unicode61's tables, between the two, then separate tokens at it: it keeps letters,
    numbers, private use and unassigned code points in tokens and drops the diacritics it
    removes. Emoji newer than Unicode 3.2 are asked. A test asks the running SQLite about
    every one of them."""
    return all(category[0] in "PSZ" or category in ("Cc", "Cf")
               for category in (unicodedata.category(ch), unicodedata.ucd_3_2_0.category(ch)))


def _likely_kept(ch: str) -> bool:
    """Whether Python's tables make ``ch`` a token character unicode61 keeps as it is: a letter
    or digit without case to fold and, below the CJK blocks, without a diacritic to remove. A
    guess only, cheap to make, which FTS5 confirms (:func:`_ask_fts5`)."""
    return ch.isalnum() and ch.lower() == ch and (
        ch >= "\u2e80" or not unicodedata.decomposition(ch))


def _one_by_one(chars: Iterable[str]) -> str:
    """A text of ``chars``, each between two ``a``s."""
    return " ".join(f"a{ch}a" for ch in chars)


def learn_characters(texts: Iterable[str | None]) -> None:
    """Learn what unicode61 makes of every character of ``texts`` not known yet, at once: one
    question to FTS5 for a page of texts instead of one for each text that holds a new
    character."""
    _unkept(set().union(*map(_beyond_ascii, filter(None, texts))))


def _beyond_ascii(text: str) -> str:
    """``text`` without its ASCII characters, which are known from the start (dropped as
    bytes: a character at a time costs more on a long text)."""
    if text.isascii():
        return ""
    return text.encode(errors="surrogatepass").translate(None, _ASCII_BYTES).decode(
        errors="surrogatepass")


def _unkept(found: set[str]) -> set[str]:
    """``found`` less the characters known to be kept as they are, every one of the rest known
    once this returns (the new ones asked of FTS5 together)."""
    found = found - _kept
    unknown = [ch for ch in found if ord(ch) not in _CHARS]
    if unknown:
        _learn(unknown)
    return found


def _changes(raw: bytes) -> dict[str, str]:
    """Each non-ASCII character of the text encoded as ``raw`` that unicode61 does not keep as
    it is, with what it makes of it (see :data:`_CHARS`)."""
    found = _unkept(set(raw.translate(None, _ASCII_BYTES).decode()))
    return {ch: _CHARS[ord(ch)] for ch in found if _CHARS[ord(ch)] != ch}


def with_changes(text: str, changes: dict[str, str]) -> str:
    """``text`` with ``changes`` made, one code point at a time."""
    if any(ch in changes for made in changes.values() for ch in made):
        # A change makes a character that is changed too: a replacement would change it again.
        return text.translate({ord(ch): made for ch, made in changes.items()})
    for ch, made in changes.items():
        text = text.replace(ch, made)
    return text


# sqlite3Utf8Trans1: the bits a UTF-8 lead byte 0xC0–0xFF contributes to its code point.
_LEAD_BITS = bytes([*range(32), *range(16), *range(8), *range(4), *range(2), 0, 0])
# A code point no Python string can hold (beyond U+10FFFF, from an over-long run of
# continuation bytes) reads as this one: unicode61 puts everything from U+100000 up in one
# category, so the two make the same tokens.
_BEYOND_UNICODE = "\U00100000"


# A text column's value: the library's text, or a blob another client stored.
ColumnValue = str | bytes | None


# A message's text columns (of ``messages AS m``), in the order FTS5 indexes them, and the same
# as the bytes stored, for :func:`fts5_text`.
TEXT_COLUMNS = ("m.content", "m.tool_name", "m.tool_calls")
TEXT_BYTES_SQL = ", ".join(f"CAST({column} AS BLOB)" for column in TEXT_COLUMNS)


def fts5_text(value: ColumnValue) -> str | None:
    """A column value as FTS5 reads it. The library stores text; another client may store a
    blob, or text that is not UTF-8, whose bytes FTS5 decodes its own way (SQLite's
    READ_UTF8): any run of continuation bytes joins its lead byte, a lone continuation byte is
    the code point of its value, and an over-long form, a surrogate, U+FFFE and U+FFFF read as
    U+FFFD. The library's reads of the text it tokenizes therefore take the bytes
    (:data:`TEXT_BYTES_SQL`): Python cannot decode such text. (A number is stored as text in
    these columns.)"""
    if not isinstance(value, bytes):
        return value
    try:
        return value.decode("utf-8")  # where it is valid, FTS5 reads the same code points
    except UnicodeDecodeError:
        pass
    chars, i, end = [], 0, len(value)
    while i < end:
        c = value[i]
        i += 1
        if c >= 0xC0:
            c = _LEAD_BITS[c - 0xC0]
            while i < end and value[i] & 0xC0 == 0x80:
                c = ((c << 6) + (value[i] & 0x3F)) & 0xFFFFFFFF  # a C unsigned int
                i += 1
            if c < 0x80 or c & 0xFFFFF800 == 0xD800 or c & 0xFFFFFFFE == 0xFFFE:
                c = 0xFFFD
        chars.append(chr(c) if c <= 0x10FFFF else _BEYOND_UNICODE)
    return "".join(chars)


def column_tokens(text: str | None) -> list[str]:
    """The tokens of one column's text, folded: exactly the ones FTS5 makes of it."""
    if not text:
        return []
    if text.isascii():
        return text.encode().translate(_ASCII_FOLD).decode().split()
    raw = text.encode()
    # Every separator is a space then, and no character left is one that str.split splits at.
    return with_changes(raw.translate(_ASCII_FOLD_KEEP).decode(), _changes(raw)).split()


def row_counts(text: str) -> tuple[Counter[str], int]:
    """The terms of a row's text with their frequencies, and its length in tokens."""
    tokens = column_tokens(text)
    return Counter(tokens), len(tokens)


# ---------------------------------------------------------------------------------------------
# How often a phrase occurs in a row
# ---------------------------------------------------------------------------------------------


# A-Z folded, every other byte kept.
_ASCII_LOWER = bytes((c + 32) if 65 <= c <= 90 else c for c in range(256))
# What separates tokens in folded text: every ASCII character but a lower-case letter or digit
# (a class of a few ASCII ranges, quick to compile; its complement spans most of Unicode), and
# the same characters as a set.
SEPARATOR_CLASS = r"\x00-\x2f\x3a-\x60\x7b-\x7f"
SEPARATORS = frozenset(re.findall(f"[{SEPARATOR_CLASS}]", bytes(range(128)).decode()))


def folded_text(text: str) -> str:
    """The text with every character that unicode61 folds or separates replaced by what it
    makes of it, ASCII separators kept: every non-ASCII character left is then a token
    character folding to itself, and the tokens are the runs of ``[a-z0-9]`` and non-ASCII."""
    return ascii_lower(text if text.isascii() else with_changes(text, _changes(text.encode())))


def ascii_lower(text: str) -> str:
    """The text with its ASCII letters in lower case, every other character kept (as LIKE
    folds case)."""
    return text.encode().translate(_ASCII_LOWER).decode() if not text.isascii() else text.lower()


def folded_origins(text: str) -> list[int]:
    """For each character of :func:`folded_text` of ``text`` (called first: it learns the
    characters), the index in ``text`` of the character it comes from, then ``len(text)``:
    unicode61 drops some characters (combining diacritics), so the two need not line up."""
    origins: list[int] = []
    for i, ch in enumerate(text):
        origins.extend([i] * (1 if ch.isascii() else len(_CHARS.get(ord(ch), ch))))
    origins.append(len(text))
    return origins


def text_frequency(texts: Sequence[str], word: str) -> int:
    """How often an ASCII ``word`` is a token of the columns, read from their folded text (see
    :func:`folded_text`) without splitting it into tokens: each instance of the word that ends
    at a token's end and starts at a token's start (found as plain text: nothing compiled)."""
    found = 0
    for text in texts:
        start = text.find(word)
        while start >= 0:
            end = start + len(word)
            found += ((start == 0 or not _is_token_char(text[start - 1]))
                      and (end == len(text) or text[end] in SEPARATORS))
            start = text.find(word, start + 1)
    return found


def _is_token_char(ch: str) -> bool:
    return ord(ch) >= 128 or ch.isalnum()


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
        return IDF_FLOOR if value <= 0.0 else value


def varints(blob: bytes) -> list[int]:
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
    values = varints(row[0]) if row and row[0] else []
    if not values:
        return Bm25Stats(0, 0)
    return Bm25Stats(values[0], sum(values[1:]))


def bm25_score(
    idfs: Sequence[float], frequencies: Sequence[float], length: int, avgdl: float
) -> float:
    """The score of one row (higher is better: FTS5's ``bm25()`` returns its negative).

    The one definition of the score: :func:`bm25_sql` writes the same in SQL, and the impact
    index's bounds (:mod:`hermes_state_impact`) are the share of one phrase, ``f/(f + K)``.
    Column weights or a tie-break would be added here, in :func:`bm25_sql` and in the oracle
    test that holds this to this SQLite's ``bm25()``."""
    score = 0.0
    for idf, f in zip(idfs, frequencies, strict=True):
        score += idf * ((f * (K1 + 1.0)) / (f + K1 * (1 - B + B * length / avgdl)))
    return score


def bm25_sql(frequencies: Sequence[str], length: str) -> str:
    """:func:`bm25_score` as an SQL expression over these columns (one frequency a phrase);
    its parameters, phrase by phrase, are :func:`bm25_sql_params`."""
    return " + ".join(f"? * (({f} * ?) / ({f} + ? * (1 - ? + ? * {length} / ?)))"
                      for f in frequencies)


def bm25_sql_params(idfs: Sequence[float], avgdl: float) -> list[float]:
    """The parameters of :func:`bm25_sql`."""
    return [x for idf in idfs for x in (idf, K1 + 1.0, K1, B, B, avgdl)]


def phrase_match(phrase: tuple[str, ...]) -> str:
    return '"' + " ".join(phrase) + '"'


def count_matches(conn: sqlite3.Connection, table: str, expression: str) -> int:
    sql = f"SELECT count(*) FROM {table} WHERE {table} MATCH ?"
    return int(conn.execute(sql, (expression,)).fetchone()[0])


_SELF_CHECK_ROWS = (
    ("alpha beta gamma", None, None),
    ("alpha alpha alpha delta", "alpha", '{"q": "beta alpha"}'),
    ("beta " * 40 + "alpha", None, None),
    ("gamma delta", "beta", None),
    ("Alpha-Beta, gamma! alpha beta", None, '[{"alpha": 1}]'),
    ("epsilon", None, None),
)
_SELF_CHECK_QUERIES = (("alpha",), ("alpha", "beta"), ("beta", "gamma", "alpha"), ("gamma",))


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
        for words in _SELF_CHECK_QUERIES:
            expression = " ".join(phrase_match((w,)) for w in words)
            idfs = [stats.idf(count_matches(mem, "t", phrase_match((w,)))) for w in words]
            sql = "SELECT rowid, bm25(t) FROM t WHERE t MATCH ?"
            for rowid, expected in mem.execute(sql, (expression,)).fetchall():
                columns = [column_tokens(c) for c in _SELF_CHECK_ROWS[rowid - 1]]
                frequencies = [sum(c.count(w) for c in columns) for w in words]
                length = sum(map(len, columns))
                if -bm25_score(idfs, frequencies, length, stats.avgdl) != expected:
                    logger.warning("this SQLite's bm25() differs from the library's formula; "
                                   "word search ranks with FTS5 only")
                    return False
        return True
    finally:
        mem.close()

