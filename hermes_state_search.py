"""Message search: from user text to queries on the three FTS5 indexes, and snippets.

**The query language.** User text never reaches FTS5 as typed. :func:`sanitize_fts5_query`
reduces it to a small language that is always valid FTS5 and keeps the meaning of plain
queries:

* A *term* is a balanced ``"quoted phrase"`` or a run of non-space characters. Punctuation and
  FTS5 syntax at the edges of a word are dropped. A word with punctuation inside is a phrase
  of its parts (``chat-send`` → ``"chat-send"``, ``gateway/run.py``, ``it's``), which also
  takes away any ``column:`` filter. A trailing ``*`` makes a prefix query (``deploy*``,
  ``"gateway/run" *``); a leading one is dropped. Unbalanced quotes, control characters and
  lone surrogates are removed; a term without a letter or digit is dropped. ``^``, ``NEAR()``
  and parentheses are not offered.
* ``AND``, ``OR`` and ``NOT`` (upper case only) are operators between two terms; a dangling
  one is dropped, and of several in a row the last wins. Lower-case ``and``/``or``/``not``
  are words. Precedence is FTS5's: adjacent terms bind tightest, then ``NOT``, ``AND``,
  ``OR`` (``a NOT b c`` is a ∧ ¬(b ∧ c)).
* Only the first :data:`MAX_INPUT_CHARS` characters are read; at most :data:`MAX_QUERY_TERMS`
  terms and :data:`MAX_QUERY_CHARS` characters are kept, whole terms dropped from the end. A
  single term over the cap is cut and searched as a prefix, so its text still matches.

**Routes** (:func:`plan_search`). The query is an OR of *alternatives*; each goes to one index:

* ``messages_fts`` (``fts_match``): alternatives whose positive terms hold no CJK text.
* ``messages_fts_cjk`` (``cjk_match``): alternatives with CJK text in a positive term, spelled
  as ``search_cjk`` indexes it: one character ``X`` is the prefix ``"X" *``, two are the token
  ``"AB"``, longer runs the phrase of their bigrams ``"AB BC CD"``; a run followed by more
  text in the same term carries its trailing character (``東京b`` → ``"東京 京 b"``). A CJK
  term that appears only after ``NOT`` in a Latin alternative stays on ``messages_fts``.
* The Latin alternatives also go to ``messages_fts_cjk`` (``latin_cjk_match``): unicode61
  reads a CJK run and the Latin letters touching it as one token, so ``Python入門`` holds the
  word ``python`` for ``search_cjk`` only.
* A negated term leaves a row out when either index finds it there: each route asks the
  other index, row by row, for the rows it may not read whole (``fts_where``,
  ``latin_cjk_where``, ``cjk_where``).
* LIKE (``like_groups``): the same boolean query with substring semantics (``cat`` finds
  ``concatenate``; ASCII case folding), ``%``, ``_`` and ``\\`` literal, a word keeping those
  at its edges (``50%`` finds ``50% off``). It serves the canonical fallback while the
  indexes are stale, and substring search through ``messages_fts_trigram``. That index is
  asked for trigrams of every plain piece of at least 3 characters (``index_patterns``,
  :func:`_substring_rows`), never with ``LIKE`` (SQLite 3.40 counts a pattern's bytes there
  and can crash on shorter ones); the escaped patterns then filter exactly.

A query with no usable term has no plan and finds nothing. A plan that is one Latin
alternative of required terms, none a prefix, carries its ``conjunction``: what
:mod:`hermes_state_rank` ranks through the impact index.

**One order** (:func:`search_messages`), of which ``offset``/``limit`` is a slice:

* Relevance: the rows ``messages_fts`` finds, in its own ``bm25()`` order under the same
  filters, ties by id (through the impact index or by FTS5: the order is the same); then rows
  only ``messages_fts_cjk`` finds for the Latin words; then the CJK alternatives' rows by
  ``bm25()``, newest first for a CJK run under three characters (matched by substring); then
  rows holding the CJK text inside a longer word, newest first. A later route is asked only
  when the earlier ones run out before ``offset + limit``.
* ``sort="newest"``/``"oldest"``: the same rows merged by message time, ties by relevance then
  id, rows without a numeric time last. Blocks of 4,096 ids are read in the order of their
  time bounds (``search_time_blocks``) until no later block can hold a row as new (old); a
  query matching only a few rows a block
  (:attr:`~hermes_state_rank.Ranking.time_order_rows_per_range`) has them read at once.
* Substring hits: only when no route finds a row, the rows holding the text inside a word,
  newest first, marked ``"match": "substring"``.

A handle without FTS5, or on a file whose index such a handle detached, answers from
:mod:`hermes_state_scan`: the same plan evaluated on a scan of the canonical rows.

**Snippets** (:func:`make_snippet`) are cut from the column that holds the match (content,
else tool calls, else tool name), centred on it. Word hits mark whole words (a prefix marks
the word it begins); CJK and substring hits mark the text wherever it occurs. Words are found
as plain text and their boundaries read from the characters around a match, so the snippets
of a new query compile nothing (a phrase in text read unfolded, a small pattern). Text read
folded (a word hit's, beyond ASCII) is folded from its head as far as the snippet needs, and a
page's new characters are learnt from those heads (:meth:`Marker.window_spans`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
import sqlite3
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import hermes_state_fulltext as fulltext
import hermes_state_impact as impact
import hermes_state_rank as rank
import hermes_state_scan as scan
from hermes_state_arguments import INT64_MAX, INT64_MIN, filter_texts, integer
from hermes_state_bm25 import (
    SEPARATOR_CLASS,
    SEPARATORS,
    TEXT_BYTES_SQL,
    ascii_lower,
    column_tokens,
    folded_origins,
    folded_text,
    learn_characters,
)
from hermes_state_common import clean_text, escape_like
from hermes_state_errors import (
    FtsCorruptError,
    InvalidTypeError,
    is_corruption_error,
    is_sqlite_lock_error,
)
from hermes_state_fts import (
    CJK_CHAR_CLASS,
    cjk_bigrams,
    damage_is_fts_only,
    has_cjk,
    index_state,
    iter_cjk_runs,
)

__all__ = [
    "BLOCK_HITS_SQL",
    "ELLIPSIS",
    "MATCH_END",
    "MATCH_START",
    "MAX_INPUT_CHARS",
    "MAX_QUERY_CHARS",
    "MAX_QUERY_TERMS",
    "MAX_ROWS",
    "SNIPPET_HEAD_CHARS",
    "SNIPPET_WIDTH",
    "SORTS",
    "LikeGroup",
    "Marker",
    "SearchPlan",
    "make_snippet",
    "plan_search",
    "sanitize_fts5_query",
    "search_filters",
    "search_messages",
    "snippet_pattern",
    "sort_order",
]

MAX_QUERY_TERMS = 32
MAX_INPUT_CHARS = 2048
MAX_QUERY_CHARS = MAX_INPUT_CHARS
SNIPPET_WIDTH = 120
# A snippet of text read folded is looked for in a head of this many characters first (four
# times longer each time that cannot tell the window): folding costs per character.
SNIPPET_HEAD_CHARS = 256
# A page's new characters are learnt from the heads of its texts this long, the snippet's
# first two heads, when its snippets are looked for from the heads (a character met further
# on is learnt when a text is folded that far).
LEARNT_HEAD_CHARS = 4 * SNIPPET_HEAD_CHARS
# More rows than any SQLite file holds (its largest is 2⁴⁸ bytes).
MAX_ROWS = 2**48
MATCH_START = ">>>"
MATCH_END = "<<<"
ELLIPSIS = "..."

_OPERATORS = frozenset({"AND", "OR", "NOT"})
# Words that are syntax as FTS5 barewords (NEAR only before "(", never emitted; quoted anyway).
_KEYWORDS = _OPERATORS | {"NEAR"}

# ---------------------------------------------------------------------------------------------
# User text → terms and operators
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Term:
    text: str  # the text searched: a word, or a phrase's content
    quoted: bool  # rendered as an FTS5 string rather than a bareword
    prefix: bool = False  # cut by the length cap: matched as a prefix
    like: str | None = None  # the text for the LIKE routes, when it differs from ``text``
    phrase: bool = False  # the user's own "quoted phrase"

    @property
    def like_text(self) -> str:
        return self.text if self.like is None else self.like


_Item = _Term | str  # a str item is one of _OPERATORS
_RenderTerm = Callable[[_Term], str]

_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")
# A balanced phrase, a lone (unbalanced) quote, or a run of other non-space characters.
_CHUNK_RE = re.compile(r'"([^"]*)"|"|[^\s"]+')


def _is_word_char(ch: str) -> bool:
    """Letters, digits, marks and private use: what unicode61 keeps inside a token."""
    cat = unicodedata.category(ch)
    return cat[0] in "LNM" or cat == "Co"


def _is_usable_char(ch: str) -> bool:
    cat = unicodedata.category(ch)
    return cat[0] in "LN" or cat == "Co"


def _usable(text: str) -> bool:
    return any(_is_usable_char(ch) for ch in text)


def _strip_edges(word: str, keep: str = "") -> str:
    start, end = 0, len(word)
    while start < end and not (_is_word_char(word[start]) or word[start] in keep):
        start += 1
    while end > start and not (_is_word_char(word[end - 1]) or word[end - 1] in keep):
        end -= 1
    return word[start:end]


# Kept at the edges of a word on the LIKE routes: dropping them would make them wildcards in
# effect ("50%" would find "500"), and in a LIKE path they are literal.
_LIKE_LITERALS = "%_"


def _word_term(chunk: str) -> _Term | None:
    # A trailing run of "*" (after any other punctuation is cut off) asks for a prefix.
    prefix = _strip_edges(chunk, keep="*").endswith("*")
    word = _strip_edges(chunk)
    if not _usable(word):
        return None
    bare = word not in _KEYWORDS and all(_is_word_char(ch) for ch in word)
    like = _strip_edges(chunk, keep=_LIKE_LITERALS)
    return _Term(word, quoted=not bare, prefix=prefix, like=None if like == word else like)


def _phrase_term(content: str) -> _Term | None:
    content = content.strip()
    return _Term(content, quoted=True, phrase=True) if _usable(content) else None


def _as_text(query: object) -> str:
    if query is None:
        return ""
    if isinstance(query, (bytes, bytearray)):
        return bytes(query).decode("utf-8", "replace")
    try:
        return str(query)
    except Exception as exc:  # an object with no text (a cycle, a structure too deep)
        raise InvalidTypeError(
            f"query must be text, got a {type(query).__name__} with none", argument="query"
        ) from exc


def _render_term(term: _Term) -> str:
    if not term.quoted:
        return term.text + ("*" if term.prefix else "")
    # A colon separates tokens inside a phrase as a space does; written as a space, no
    # reader of the rendered query takes it for FTS5's column filter.
    text = term.text.replace('"', '""').replace(":", " ")
    return '"' + text + '"' + (" *" if term.prefix else "")


def _cut_term(term: _Term, limit: int) -> _Term | None:
    """``term`` cut to render in ``limit`` characters, as a prefix query (None: nothing left)."""
    room = limit - (4 if term.quoted else 1)  # the quotes and " *", or the bare "*"
    text = _strip_edges(term.text[: max(room, 0)])
    return _Term(text, term.quoted, prefix=True) if _usable(text) else None


def _parse(query: object) -> list[_Item]:
    """Terms with operators only between two of them, within the caps (see module docstring)."""
    text = _CONTROL_RE.sub(" ", clean_text(_as_text(query)[:MAX_INPUT_CHARS]))
    items: list[_Item] = []
    pending_op: str | None = None
    terms = length = 0
    for match in _CHUNK_RE.finditer(text):
        chunk = match.group(0)
        if chunk in _OPERATORS:
            if items:
                pending_op = chunk  # the last of several operators in a row wins
            continue
        if match.group(1) is not None:
            term = _phrase_term(match.group(1))
        elif chunk == '"':
            continue
        else:
            term = _word_term(chunk)
        if term is None:
            continue
        if terms == MAX_QUERY_TERMS:
            break
        joiner = f" {pending_op} " if pending_op else " "
        extra = len(_render_term(term)) + (len(joiner) if items else 0)
        if length + extra > MAX_QUERY_CHARS:
            if items:
                break
            term = _cut_term(term, MAX_QUERY_CHARS)
            if term is None:
                break
            extra = len(_render_term(term))
        if items and pending_op:
            items.append(pending_op)
        items.append(term)
        pending_op = None
        terms += 1
        length += extra
    return items


def _render(items: Iterable[_Item], render_term: _RenderTerm = _render_term) -> str:
    return " ".join(item if isinstance(item, str) else render_term(item) for item in items)


def sanitize_fts5_query(query: object) -> str:
    """``query`` as a valid FTS5 query for ``messages_fts``, or ``""`` if nothing usable remains.

    Any object is accepted: None is empty, bytes are decoded as UTF-8, anything else goes
    through ``str()``. The rules are in the module docstring.
    """
    return _render(_parse(query))


# ---------------------------------------------------------------------------------------------
# The plan: one expression per index, LIKE groups, needles
# ---------------------------------------------------------------------------------------------


def _cjk_tokens(run: str, followed: bool) -> tuple[str, bool]:
    """How ``run`` is spelled in a query on ``messages_fts_cjk``, and whether it needs ``*``."""
    if followed:  # the run ends here in any matching row: spell it as the index does
        return (run if len(run) == 1 else " ".join(cjk_bigrams(run)) + " " + run[-1]), False
    if len(run) == 1:
        return run, True
    return " ".join(cjk_bigrams(run)), False


def _render_cjk_term(term: _Term) -> str:
    if not has_cjk(term.text):
        return _render_term(term)
    pieces: list[tuple[str, bool]] = []
    pos = 0
    for run in iter_cjk_runs(term.text):
        if run.start() > pos:
            pieces.append((term.text[pos : run.start()], False))
        pieces.append((run.group(0), True))
        pos = run.end()
    if pos < len(term.text):
        pieces.append((term.text[pos:], False))
    parts: list[str] = []
    star = term.prefix
    for i, (piece, is_run) in enumerate(pieces):
        if not is_run:
            parts.append(piece)
            continue
        followed = any(later_run or _usable(later) for later, later_run in pieces[i + 1 :])
        tokens, run_star = _cjk_tokens(piece, followed)
        parts.append(tokens)
        star = star or run_star
    return '"' + " ".join(parts).replace('"', '""') + '"' + (" *" if star else "")


def _positive_and_negated(alternative: list[_Item]) -> tuple[list[_Term], list[list[_Term]]]:
    """An OR-free alternative as its required terms and its negated conjunctions."""
    positive: list[_Term] = []
    negated: list[list[_Term]] = []
    for conjunct in scan.split_on(alternative, "AND"):
        head, *tails = scan.split_on(conjunct, "NOT")  # implicit AND binds tighter than NOT
        positive.extend(t for t in head if isinstance(t, _Term))
        negated.extend([t for t in tail if isinstance(t, _Term)] for tail in tails)
    return positive, negated


def _like_pattern(text: str) -> str:
    return "%" + escape_like(text) + "%"


_LIKE_WILDCARD_RE = re.compile("[%_]")


@dataclass(frozen=True)
class LikeGroup:
    """One alternative of the query for the LIKE routes (see the module docstring).

    A row matches when every ``include`` pattern matches and, for each tuple in ``exclude``,
    not all of its patterns match. Patterns are for ``LIKE ? ESCAPE '\\'``. ``index_patterns``
    are plain ``LIKE ?`` patterns (no ESCAPE) implied by ``include``, for the trigram index.
    ``substring`` is False for a group made only of the user's own "quoted phrases": they ask
    for that phrase, so substring hits do not pad out a short page of phrase hits. ``words``
    is the alternative's terms without CJK text as a MATCH on ``messages_fts_cjk`` (None when
    it has none): where the group finds CJK text inside a longer word, those terms are still
    words (``東京 python`` does not find ``東京 abcpython``).
    """

    include: tuple[str, ...]
    exclude: tuple[tuple[str, ...], ...]
    index_patterns: tuple[str, ...]
    substring: bool = True
    words: str | None = None

    def where(
        self, column: str, *, trigram: bool = False, row_text: str | None = None
    ) -> tuple[str, tuple[str, ...]]:
        """An SQL condition on ``column`` (a trusted SQL expression, never user text); the
        negated conjunctions are tested on ``row_text`` when given (a negated word leaves the
        row out wherever the row holds it).

        With ``trigram``, the index patterns come first so FTS5 can use them (the caller runs
        this only on groups that have some).
        """
        escaped = f"{column} LIKE ? ESCAPE '\\'"
        excluded = f"{row_text or column} LIKE ? ESCAPE '\\'"
        clauses: list[str] = []
        params: list[str] = []
        if trigram:
            clauses += [f"{column} LIKE ?"] * len(self.index_patterns)
            params += self.index_patterns
        clauses += [escaped] * len(self.include)
        params += self.include
        for conjunction in self.exclude:
            clauses.append("NOT (" + " AND ".join([excluded] * len(conjunction)) + ")")
            params += conjunction
        return "(" + " AND ".join(clauses) + ")", tuple(params)


def _like_group(positive: list[_Term], negated: list[list[_Term]]) -> LikeGroup:
    include = tuple(dict.fromkeys(_like_pattern(t.like_text) for t in positive))
    exclude = tuple(tuple(_like_pattern(t.like_text) for t in conj) for conj in negated)
    pieces = (p for t in positive for p in _LIKE_WILDCARD_RE.split(t.like_text) if len(p) >= 3)
    index_patterns = tuple(dict.fromkeys("%" + p + "%" for p in pieces))
    return LikeGroup(include, exclude, index_patterns, not all(t.phrase for t in positive))


@dataclass(frozen=True)
class SearchPlan:
    """How to run one query on each index (see the module docstring for the routing rules)."""

    query: str  # the sanitized query, valid on messages_fts
    fts_match: str | None  # MATCH on messages_fts, or None when no alternative goes there
    cjk_match: str | None  # MATCH on messages_fts_cjk, or None when no alternative goes there
    like_groups: tuple[LikeGroup, ...]  # the whole query for LIKE, OR of the groups
    needles: tuple[str, ...]  # the positive terms' texts, for make_snippet
    latin_cjk_match: str | None = None  # fts_match's alternatives, spelled for messages_fts_cjk
    prefixes: tuple[str, ...] = ()  # the needles that are prefix terms (word*)
    # The whole query as phrases that must all occur, when it is one: what the impact index
    # ranks (see hermes_state_rank); None for OR, NOT, prefixes, CJK, non-ASCII words.
    conjunction: rank.Conjunction | None = None
    cjk_short: bool = False  # a CJK run of fewer than 3 characters: newest first, like LIKE
    cjk_groups: tuple[LikeGroup, ...] = ()  # the CJK alternatives, for their substring rows
    # What keeps each route exact for negated terms (see _negations_where).
    fts_where: tuple[str, tuple[str, ...]] = ("", ())
    latin_cjk_where: tuple[str, tuple[str, ...]] = ("", ())
    cjk_where: tuple[str, tuple[str, ...]] = ("", ())

    def like_where(self, column: str) -> tuple[str, tuple[str, ...]]:
        """The whole query as one exact LIKE condition on ``column`` (a trusted SQL expression)."""
        parts = [group.where(column) for group in self.like_groups]
        return "(" + " OR ".join(sql for sql, _ in parts) + ")", tuple(
            p for _, params in parts for p in params
        )


# Whether this row matches an expression on messages_fts, on messages_fts_cjk; whether its tool
# name holds a term. messages_fts is asked only when the name could hold it: an ASCII name
# holds a token only as a substring (the term's longest ASCII word stands for it), and holds a
# word that is the whole name without asking.
FTS_ROW_MATCHES_SQL = """
EXISTS (SELECT 1 FROM messages_fts WHERE messages_fts MATCH ? AND rowid = m.id)"""
CJK_ROW_MATCHES_SQL = """
EXISTS (SELECT 1 FROM messages_fts_cjk WHERE messages_fts_cjk MATCH ? AND rowid = m.id)"""
TOOL_NAME_HOLDS_SQL = """
(m.tool_name IS NOT NULL AND ({whole}(m.tool_name GLOB ?{substring})
 AND EXISTS (SELECT 1 FROM messages_fts WHERE messages_fts MATCH ? AND rowid = m.id)))"""
_NON_ASCII_GLOB = "*[^\x01-\x7f]*"
_ASCII_WORD = re.compile("[A-Za-z0-9]+")


def _tool_name_holds(term: _Term) -> tuple[str, list[str]]:
    """:data:`TOOL_NAME_HOLDS_SQL` for ``term``, and its parameters."""
    words = _ASCII_WORD.findall(term.text)
    whole = not term.prefix and words == [term.text]
    sql = TOOL_NAME_HOLDS_SQL.format(
        whole="m.tool_name LIKE ? ESCAPE '\\' OR " if whole else "",
        substring=" OR m.tool_name LIKE ? ESCAPE '\\'" if words else "")
    return sql, [*([escape_like(term.text)] if whole else []), _NON_ASCII_GLOB,
                 *([_like_pattern(max(words, key=len))] if words else []),
                 "tool_name : (" + _render_term(term) + ")"]


def _cjk_view_holds(term: _Term) -> tuple[str, list[str]]:
    return CJK_ROW_MATCHES_SQL, [_render_cjk_term(term)]


@dataclass(frozen=True)
class _View:
    """What the index of a route reads of a row, for the negations it cannot see whole."""

    whole: str  # a condition under which the index reads the whole row
    render: _RenderTerm  # a term spelled for the index
    matches: str  # the row matches an expression on the index
    elsewhere: Callable[[_Term], tuple[str, list[str]]]  # the row holds a term where it does not


# messages_fts reads a word glued to CJK text as part of one token with it; messages_fts_cjk
# does not read the tool name of a row spelled by an earlier version (or another client).
_FTS_VIEW = _View("m.search_cjk IS NULL", _render_term, FTS_ROW_MATCHES_SQL, _cjk_view_holds)
_CJK_VIEW = _View("m.tool_name IS NULL", _render_cjk_term, CJK_ROW_MATCHES_SQL, _tool_name_holds)


def _negations_where(
    alternatives: Sequence[list[_Item]], view: _View
) -> tuple[str, tuple[str, ...]]:
    """A condition on ``m`` (and its parameters) that keeps a route exact for negated terms: a
    row holds a term when either index finds it there (a word glued to CJK text, or in the tool
    name, included). The route's match already leaves out a row whose negated conjunction its
    own index finds whole; so a row is also left out when a term of one is held where that
    index does not look and each of the others is held either way. With several alternatives,
    a row passes through one it matches. The lookups run for the row itself, only for a row
    that index does not read whole. Empty when no alternative negates anything."""
    negations = [_positive_and_negated(alternative)[1] for alternative in alternatives]
    if not any(negations):
        return "", ()
    parts: list[str] = []
    params: list[str] = []
    for alternative, negated in zip(alternatives, negations, strict=True):
        clauses = []
        if len(alternatives) > 1:  # which alternative the row matches
            clauses.append(view.matches)
            params.append(_render(alternative, view.render))
        for conjunction in negated:
            elsewhere = [view.elsewhere(term) for term in conjunction]
            there = " OR ".join(sql for sql, _ in elsewhere)
            for _, term_params in elsewhere:
                params += term_params
            if len(conjunction) == 1 and len(alternatives) == 1:
                clauses.append(f"NOT ({there})")
                continue
            held = []
            for term, (sql, term_params) in zip(conjunction, elsewhere, strict=True):
                held.append(f"({sql} OR {view.matches})")
                params += [*term_params, view.render(term)]
            clauses.append(f"(NOT ({there}) OR NOT ({' AND '.join(held)}))")
        parts.append("(" + (" AND ".join(clauses) or "1") + ")")
    return f" AND ({view.whole} OR " + " OR ".join(parts) + ")", tuple(params)


def plan_search(query: object) -> SearchPlan | None:
    """The routes for ``query``, or None when it has no usable term (the search finds nothing)."""
    items = _parse(query)
    if not items:
        return None
    latin: list[list[_Item]] = []
    cjk: list[list[_Item]] = []
    groups: list[LikeGroup] = []
    needles: dict[str, None] = {}
    prefixes: dict[str, None] = {}
    conj = None
    cjk_short = False
    cjk_groups: list[LikeGroup] = []
    alternatives = scan.split_on(items, "OR")
    for alternative in alternatives:
        positive, negated = _positive_and_negated(alternative)
        groups.append(_like_group(positive, negated))
        needles.update((t.text, None) for t in positive)
        prefixes.update((t.text, None) for t in positive if t.prefix)
        if any(has_cjk(t.text) for t in positive):
            cjk.append(alternative)
            cjk_group, short = _cjk_route(groups[-1], positive)
            cjk_groups.append(cjk_group)
            cjk_short = cjk_short or short
        else:
            latin.append(alternative)
            if len(alternatives) == 1 and not negated and not any(t.prefix for t in positive):
                conj = rank.conjunction(t.text for t in positive)
    return SearchPlan(
        query=_render(items),
        fts_match=_any_of(latin),
        cjk_match=_any_of(cjk, _render_cjk_term),
        like_groups=tuple(groups),
        needles=tuple(needles),
        latin_cjk_match=_any_of(latin, _render_cjk_term),
        prefixes=tuple(prefixes),
        conjunction=conj,
        cjk_short=cjk_short,
        cjk_groups=tuple(cjk_groups),
        fts_where=_negations_where(latin, _FTS_VIEW),
        latin_cjk_where=_negations_where(latin, _CJK_VIEW),
        cjk_where=_literal_where(cjk, cjk_groups, _negations_where(cjk, _CJK_VIEW)),
    )


def _cjk_route(group: LikeGroup, positive: list[_Term]) -> tuple[LikeGroup, bool]:
    """An alternative's group for the CJK route, its terms without CJK text as words, and
    whether one of its CJK runs is shorter than a trigram."""
    words = [t for t in positive if not has_cjk(t.text)]
    short = any(len(run.group(0)) < 3 for t in positive for run in iter_cjk_runs(t.text))
    return replace(group, words=_render(words, _render_cjk_term) if words else None), short


def _any_of(
    alternatives: list[list[_Item]], render_term: _RenderTerm = _render_term
) -> str | None:
    """A MATCH that any of ``alternatives`` satisfies; None when there are none."""
    return " OR ".join(_render(alt, render_term) for alt in alternatives) or None


def _literal_where(
    alternatives: list[list[_Item]], groups: list[LikeGroup],
    where: tuple[str, tuple[str, ...]],
) -> tuple[str, tuple[str, ...]]:
    """``where`` of the CJK route, which also holds the row to the exact text of a single
    alternative whose terms keep a symbol between their parts (``100%完成``): the index reads
    no symbol, so without it ``100完成`` would match as well."""
    if len(alternatives) != 1:
        return where
    positive = _positive_and_negated(alternatives[0])[0]
    if all(ch.isalnum() or ch.isspace() for term in positive for ch in term.text):
        return where
    exact = " AND ".join([f"{_LIKE_TEXT} LIKE ? ESCAPE '\\'"] * len(groups[0].include))
    return f"{where[0]} AND ({exact})", (*where[1], *groups[0].include)


# ---------------------------------------------------------------------------------------------
# Snippets
# ---------------------------------------------------------------------------------------------

_UNFOLDED_SEPARATORS = r"[\W_]+"
# Between words in folded text, where every character unicode61 separates is an ASCII one
# other than a letter or digit.
_FOLDED_SEPARATORS = f"[{SEPARATOR_CLASS}]+"
_ASCII_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


def _needle_words(needle: str, folded: bool = False) -> list[str]:
    """The words of a needle: in folded text, unicode61's own tokens (``thanks🙂`` is one)."""
    if folded:
        return column_tokens(needle)
    words: list[str] = []
    current = ""
    for ch in needle:
        if _is_word_char(ch):
            current += ch
        elif current:
            words.append(current)
            current = ""
    if current:
        words.append(current)
    return words


def _needle_forms(
    needle: str, folded: bool = False
) -> tuple[str, tuple[str, ...] | None] | None:
    """A needle as a regex: its words in order, any punctuation or space between them; with
    the words, when they can be found as plain text: a single word (or no word: the needle
    itself), or words in folded text, where a token never begins with a separator, so the
    separators before it are a plain run (see :func:`_words_after`)."""
    words = _needle_words(needle, folded)
    if len(words) > 1:
        rx = (_FOLDED_SEPARATORS if folded else _UNFOLDED_SEPARATORS).join(map(re.escape, words))
        return rx, tuple(words) if folded else None
    plain = words[0] if words else needle if needle.strip() else None
    return None if plain is None else (re.escape(plain), (plain,))


def _words_after(text: str, pos: int, words: Sequence[str]) -> int | None:
    """Where ``words`` end in folded ``text`` when each follows a run of separators, the first
    at ``pos``; None when they do not."""
    for word in words:
        start = pos
        while pos < len(text) and text[pos] in SEPARATORS:
            pos += 1
        if pos == start or not text.startswith(word, pos):
            return None
        pos += len(word)
    return pos


def _token_char(ch: str) -> bool:
    """What keeps a word going, for word boundaries in snippets of word hits, read in folded
    text (see :meth:`Marker.spans`, where every character unicode61 separates is an ASCII
    one): a letter or digit, or any other character left, but not CJK text, which the CJK
    index reads apart from the letters touching it (``python`` is a word of ``Python入門``)."""
    return ch in _ASCII_TOKEN_CHARS or (not ch.isascii() and not has_cjk(ch))


# :func:`_token_char` as a pattern, for :attr:`Marker.pattern` only: its classes span most of
# Unicode, and compiling them costs milliseconds.
_TOKEN_CHAR = rf"(?:(?![{CJK_CHAR_CLASS}])[a-z0-9\x80-\U0010ffff])"


@dataclass(frozen=True)
class _Needle:
    """One needle of a marker: its words in order with any separators between them, and
    whether it matches whole tokens only, or as a prefix the whole token it begins. A needle
    of one word, or of several in folded text, is found as plain text (nothing compiled);
    else by a small pattern."""

    text: str
    found_as: re.Pattern[str] | tuple[str, ...]
    words: bool
    prefix: bool
    reference: str  # the same as one regular expression, word boundaries included

    def _find(self, text: str, pos: int) -> tuple[int, int] | None:
        if not isinstance(self.found_as, tuple):
            match = self.found_as.search(text, pos)
            return None if match is None else match.span()
        head, rest = self.found_as[0], self.found_as[1:]
        while (start := text.find(head, pos)) >= 0:
            end = _words_after(text, start + len(head), rest)
            if end is not None:
                return start, end
            pos = start + 1
        return None

    def first(self, text: str, pos: int) -> tuple[int, int] | None:
        """(start, end) of the needle's first match at ``pos`` or after."""
        while (span := self._find(text, pos)) is not None:
            start, end = span
            pos = start + 1
            if not self.words:
                return start, end
            if start and _token_char(text[start - 1]):
                continue
            if self.prefix:
                while end < len(text) and _token_char(text[end]):
                    end += 1
            elif end < len(text) and _token_char(text[end]):
                continue
            return start, end
        return None


@dataclass(frozen=True)
class Marker:
    """What a snippet marks: needles in the order they are tried at a position (the first
    that matches there is marked, and the scan goes on where it ends).

    Each needle is found as plain text (a phrase in text read unfolded, by a small pattern of
    its own); whole words are told by the characters around a match (:func:`_token_char`),
    not by a character class compiled into a pattern, so a new query compiles nothing
    costly. :attr:`pattern` is the same marker as one regular expression."""

    needles: tuple[_Needle, ...]
    # Whether the needles are folded as unicode61 folds them (``cafe`` for ``Café``), so that
    # text is read folded too; else both have their ASCII letters folded, as LIKE folds case
    # (see :meth:`spans`).
    folded: bool = False
    # Whether some needle holds an ASCII letter (else there is no case to fold).
    cased: bool = True

    @functools.cached_property
    def pattern(self) -> re.Pattern[str]:
        """The marker as one regular expression: its matches are those of :meth:`finditer`."""
        return re.compile("|".join(f"(?:{needle.reference})" for needle in self.needles))

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        """(start, end) of each match in ``text``, read as the marker's needles are: folded as
        the index reads it (``café`` and ``CAFE`` are the word cafe, ``sınır`` is not
        ``sinir``), or with ASCII letters folded only (the Kelvin sign is not ``k``)."""
        if not self.folded or text.isascii():
            yield from self.finditer(ascii_lower(text) if self.cased else text)
            return
        folded = folded_text(text)
        if len(folded) == len(text):
            yield from self.finditer(folded)
            return
        origins = folded_origins(text)
        yield from ((origins[start], origins[end]) for start, end in self.finditer(folded))

    @functools.cached_property
    def longest(self) -> int | None:
        """The most characters a match spans, when every needle matches text as long as its
        own (one word or run, not a prefix); else None."""
        lengths = [len(n.found_as[0]) for n in self.needles
                   if isinstance(n.found_as, tuple) and len(n.found_as) == 1 and not n.prefix]
        return max(lengths) if len(lengths) == len(self.needles) else None

    def window_spans(self, text: str, width: int, head: int = SNIPPET_HEAD_CHARS
                     ) -> Iterator[tuple[int, int]]:
        """The matches a snippet ``width`` characters wide needs, its first and those after
        it, as :meth:`spans` finds them. A text read folded is folded a head at a time
        (``head`` characters, then four times as many) until the head holds the window: its
        first match starts a window's width and the longest match's length before the head's
        end, so every match that can show in the window, and every match before it, ends
        inside the head as it does in the whole text. Where folding changes the text's
        length, or a match's length has no bound (a prefix, several words), the whole text is
        read."""
        longest = self.longest
        if not self.folded or longest is None or text.isascii():
            return self.spans(text)
        head = max(head, 1)
        folded = ""  # the head's, grown a piece at a time: unicode61 folds each character alone
        while True:
            end = min(head, len(text))
            more = folded_text(text[len(folded):end])
            if len(more) != end - len(folded):
                return self.spans(text)
            folded += more
            found = self.finditer(folded)
            first = next(found, None)
            if end == len(text) or (first is not None and first[0] + width + longest < end):
                return iter(()) if first is None else itertools.chain((first,), found)
            head *= 4

    def finditer(self, text: str) -> Iterator[tuple[int, int]]:
        """(start, end) of each match in ``text`` (read as :meth:`spans` reads it), left to
        right without overlaps, as ``pattern.finditer`` finds them."""
        found: list[tuple[int, int] | None] = [(-1, -1)] * len(self.needles)
        pos = 0
        while True:
            best: tuple[int, int] | None = None
            for i, needle in enumerate(self.needles):
                span = found[i]
                if span is not None and span[0] < pos:
                    span = found[i] = needle.first(text, pos)
                if span is not None and (best is None or span[0] < best[0]):
                    best = span
            if best is None:
                return
            yield best
            pos = max(best[1], best[0] + 1)


def _needles(
    needles: Iterable[str], *, words: bool = False, prefixes: Iterable[str] = (),
    folded: bool = False,
) -> list[_Needle]:
    """The needles of a marker, longer ones first (at any position the longest one is
    marked). With ``words`` a needle matches whole tokens only (as a word query matches), a
    prefix needle any token it begins, marked whole."""
    prefix_set = set(prefixes)
    found: dict[str, _Needle] = {}
    for needle in needles:
        found_as = _needle_forms(needle, folded)
        if found_as is None:
            continue
        rx, plain = found_as
        prefix = words and needle in prefix_set
        reference = rx
        if words:
            tail = _TOKEN_CHAR + "*" if prefix else ""
            reference = f"(?<!{_TOKEN_CHAR}){rx}{tail}(?!{_TOKEN_CHAR})"
        found.setdefault(reference, _Needle(needle, re.compile(rx) if plain is None else plain,
                                            words, prefix, reference))
    return [found[rx] for rx in sorted(found, key=lambda rx: (-len(rx), rx))]


def _marker(
    parts: Sequence[list[_Needle]], *, folded: bool = False
) -> Marker | None:
    """The marker of these parts' needles, tried part by part."""
    needles = tuple(needle for part in parts for needle in part)
    if not needles:
        return None
    # No re.IGNORECASE: Python's case folding makes more letters alike than unicode61's or
    # LIKE's (``ı`` and ``i``, the Kelvin sign and ``k``); the text is read folded instead.
    cased = any(ch.isascii() and ch.isalpha() for n in needles for ch in n.text)
    return Marker(needles, folded, cased)


def make_snippet(
    text: str,
    needles: Sequence[str] | Marker | None,
    *,
    width: int = SNIPPET_WIDTH,
    head: int = SNIPPET_HEAD_CHARS,
) -> str:
    """``width`` characters of ``text`` centred on the first match of any needle.

    Needles match case-insensitively, and any run of spaces or punctuation inside a needle
    matches any such run in the text (as a phrase query would); a :class:`Marker` (see
    :func:`snippet_pattern`) may be given instead. Every match inside the window is wrapped in
    ``>>>`` and ``<<<``; ``...`` marks where the text was cut. Markers and ellipses are not
    counted in ``width``. Without a match the snippet is the start of the text. A long text
    read folded is searched from its first ``head`` characters first (see
    :meth:`Marker.window_spans`); the snippet is the same for any ``head`` (of text a message
    can hold: a lone surrogate is read as U+FFFD there, and folding refuses it).
    """
    if needles is None or isinstance(needles, Marker):
        marker = needles
    else:
        listed = [ascii_lower(n) for n in needles]
        marker = _marker([_needles(listed)])
    width = max(width, 1)
    spans = marker.window_spans(text, width, head) if marker is not None else iter(())
    return _window(text, next(spans, None), spans, width)


def _window(text: str, first: tuple[int, int] | None, rest: Iterator[tuple[int, int]],
            width: int) -> str:
    """The snippet centred on the ``first`` match, marking it and the ``rest`` inside the
    window (matches as (start, end))."""
    start = 0
    if first is not None:
        length = first[1] - first[0]
        start = first[0] - max(width - length, 0) // 2
        start = max(0, min(start, len(text) - width, first[0]))
    end = min(len(text), start + width)
    out = [ELLIPSIS] if start > 0 else []
    pos = start
    if first is not None:
        for match_start, match_end in itertools.chain((first,), rest):
            if match_start >= end:
                break
            lo, hi = max(match_start, start), min(match_end, end)
            out += [text[pos:lo], MATCH_START, text[lo:hi], MATCH_END]
            pos = hi
    out.append(text[pos:end])
    if end < len(text):
        out.append(ELLIPSIS)
    return "".join(out)


def snippet_pattern(plan: SearchPlan, *, words: bool) -> Marker | None:
    """What a hit's snippet marks: whole words for word hits (CJK runs stay substrings, as the
    CJK index finds them), the needles' text anywhere for substring hits."""
    needles, prefixes = plan.needles, plan.prefixes
    # A word hit may hold a word in another spelling (``Café`` for cafe): such needles are read
    # as the index reads them, in folded text. CJK text alone folds to itself, and folding it
    # costs more than the rest of a snippet, so a query of CJK text alone is read as it is.
    folded = words and any(not has_cjk(n) or folded_text(n) != n for n in needles)
    fold = folded_text if folded else ascii_lower
    needles, prefixes = tuple(map(fold, needles)), tuple(map(fold, prefixes))
    latin = [n for n in needles if not has_cjk(n)]
    cjk = [n for n in needles if has_cjk(n)]
    return _marker([_needles(latin, words=words, prefixes=prefixes, folded=folded),
                    _needles(cjk, folded=folded)], folded=folded)


# ---------------------------------------------------------------------------------------------
# Running a search
# ---------------------------------------------------------------------------------------------

CONTEXT_CHARS = 200
SORTS = ("newest", "oldest")
WORD = "word"
SUBSTRING = "substring"


def sort_order(sort: object) -> str | None:
    """``"newest"``, ``"oldest"`` or None (relevance): the text compared stripped and in lower
    case, anything else meaning relevance."""
    if isinstance(sort, str) and sort.strip().lower() in SORTS:
        return sort.strip().lower()
    return None


# The whole record without duplicates: live rows, and rows of an archived generation whose
# message has no live copy in its session (summarized away), the newest such copy only (a
# message kept through one compaction and summarized away by a later one is archived twice).
# A rewound row (inactive, not compacted, in a session that has been rewound) is left out.
# Stores written before archives were marked compacted have never been rewound, so their
# inactive rows are archives too.
WHOLE_RECORD_SQL = """ AND (m.active = 1 OR (
    (m.compacted = 1 OR COALESCE(s.rewind_count, 0) = 0)
    AND NOT EXISTS (SELECT 1 FROM messages a WHERE a.session_id = m.session_id
                    AND a.message_uid = m.message_uid
                    AND (a.active = 1 OR (a.id > m.id AND (
                         a.compacted = 1 OR COALESCE(s.rewind_count, 0) = 0))))))"""


def search_filters(
    source_filter: str | Iterable[str] | None,
    exclude_sources: str | Iterable[str] | None,
    role_filter: str | Iterable[str] | None,
    include_inactive: bool,
) -> tuple[str, list[str]]:
    """SQL conditions on ``m`` (messages) and ``s`` (sessions). Each list travels as one JSON
    parameter, so any length works and nothing is formatted into SQL text. ``source_filter``
    and ``exclude_sources`` apply when not None (an empty list selects nothing / excludes
    nothing), ``role_filter`` when not empty."""
    sql, params = "", []
    if not include_inactive:
        sql += WHOLE_RECORD_SQL
    roles = filter_texts("role_filter", role_filter)
    for values, condition in (
        (filter_texts("source_filter", source_filter), "s.source IN"),
        (filter_texts("exclude_sources", exclude_sources), "s.source NOT IN"),
        (roles or None, "m.role IN"),
    ):
        if values is None or (condition.endswith("NOT IN") and not values):
            continue
        sql += f" AND {condition} (SELECT value FROM json_each(?))"
        params.append(json.dumps(values))
    return sql, params


# Relevance on one index: FTS5's own bm25(), ties by id. FTS5 ranks on its own first (a prefix
# of the order, no join per match); the filters then keep what they keep of that prefix
# (:func:`_passing`). A shorter prefix than asked for holds every match.
RANKED_SQL = """
SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY bm25({table}), rowid LIMIT ?
"""
# The same order over the rows that pass the filters, each match joined to its session (FTS5
# scores only the rows that pass).
FILTERED_RANKED_SQL = """
SELECT f.rowid FROM {table} f JOIN messages m ON m.id = f.rowid
JOIN sessions s ON s.id = m.session_id
WHERE {table} MATCH ? {filters} ORDER BY bm25({table}), f.rowid LIMIT ?
"""
# How many prefixes' worth of FTS5's order is sorted at once under the caller's filter (sorting
# eight times as many of its best rows costs FTS5 1-5% more than one prefix at 200,000
# messages).
FILTERED_PREFIXES = 8
COUNT_SQL = "SELECT count(*) FROM {table} WHERE {table} MATCH ?"
AT_MOST_SQL = "SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {table} MATCH ? LIMIT ?)"
# Whether any session passes the source filters: when none does no row can, and the search ends
# before it reads an index (else a source no session has costs every route, substrings too).
SOURCES_EXIST_SQL = "SELECT EXISTS (SELECT 1 FROM sessions s WHERE 1 {filters})"
# Time order: the rows of one range of ids, read range by range (see impact.time_ranges).
BLOCK_HITS_SQL = """
SELECT f.rowid, m.timestamp FROM {table} f JOIN messages m ON m.id = f.rowid
JOIN sessions s ON s.id = m.session_id
WHERE {table} MATCH ? AND f.rowid BETWEEN ? AND ? {filters}
"""
# FTS5's scores for chosen rows (ties on time), the rowid test kept out of FTS5's reach.
SCORES_SQL = """
SELECT rowid, bm25({table}) FROM {table}
WHERE {table} MATCH ? AND rowid BETWEEN ? AND ? AND +rowid IN (SELECT value FROM json_each(?))
"""


def _at_most(conn: sqlite3.Connection, table: str, match: str, limit: int) -> bool:
    """Whether at most ``limit`` rows match, read no further than one past it."""
    read = rank.bounded_rows(limit + 1)
    return bool(conn.execute(AT_MOST_SQL.format(table=table), (match, read)).fetchone()[0]
                <= limit)


def _match_count(conn: sqlite3.Connection, table: str, match: str) -> int:
    if table == "messages_fts":
        return rank.match_count(conn, match)  # cached counts
    return int(conn.execute(COUNT_SQL.format(table=table), (match,)).fetchone()[0])


def _passing(
    conn: sqlite3.Connection, ids: list[int], filters: str, params: list[str], wanted: int,
) -> list[int]:
    """The first ``wanted`` of ``ids`` that pass the filters, in their order: the first
    ``wanted`` are checked, and the rest only when some of those fail (each check reads the
    rows and their sessions)."""
    passing: set[int] = set()
    for checked in (ids[:wanted], ids[wanted:]):
        if len(passing) < wanted:
            passing |= rank.passing(conn, checked, filters, params)
    return [row_id for row_id in ids if row_id in passing][:wanted]


def _ranked(
    conn: sqlite3.Connection, table: str, match: str, conj: rank.Conjunction | None,
    filters: str, params: list[str], wanted: int, ranking: rank.Ranking = rank.RANKING,
) -> list[int]:
    """The first ``wanted`` rows of ``table`` for ``match`` in relevance order."""
    few = (conj is not None and len(set(conj.words)) == 1
           and _at_most(conn, table, match, ranking.fts5_word_rows))
    if few and params:  # a source or role filter: FTS5 ranks the rows that pass, in one pass
        sql = FILTERED_RANKED_SQL.format(table=table, filters=filters)
        return [row[0] for row in conn.execute(sql, (match, *params, wanted))]
    if conj is not None and not few:
        ids = rank.top_k(conn, conj, filters, params, wanted, ranking)
        if ids is not None:
            return ids
    sql = RANKED_SQL.format(table=table)
    prefix = 2 * wanted + 16
    # With the caller's source or role filter, FTS5 sorts a longer prefix at once, read only as
    # far as the filter needs: a longer one asked for later would score every row again.
    sorted_rows = rank.bounded_rows(FILTERED_PREFIXES * prefix if params else prefix)
    with contextlib.closing(conn.execute(sql, (match, sorted_rows))) as cursor:
        ranked = [row[0] for row in cursor.fetchmany(rank.bounded_rows(prefix))]
        ids = _passing(conn, ranked, filters, params, wanted)
        if len(ids) >= wanted or len(ranked) < prefix:
            return ids
        count = _match_count(conn, table, match)
        if count <= prefix:
            return ids
        # Too few of FTS5's best rows passed the filters. A prefix four times as long as the
        # share that passed says is enough (the best rows pass less often than the rest, as
        # often as not), while that is under half the matches; else, or should it still fall
        # short, the rows that pass the filters are ranked in one pass, a join per match.
        longer = 4 * prefix * wanted // len(ids) if ids else count
        if longer < count // 2:
            if longer <= sorted_rows:
                ranked += [row[0] for row in cursor.fetchmany(longer - len(ranked))]
            else:
                ranked = [row[0] for row in conn.execute(sql, (match, longer))]
            ids = _passing(conn, ranked, filters, params, wanted)
            if len(ids) >= wanted:
                return ids
    sql = FILTERED_RANKED_SQL.format(table=table, filters=filters)
    return [row[0] for row in conn.execute(sql, (match, *params, wanted))]


# A row without a time (see the module docstring).
UNTIMED_SQL = "typeof(m.timestamp) NOT IN ('integer', 'real')"


def _outside(ranges: Sequence[tuple[int, int, float, float]]) -> list[tuple[int, int]]:
    """The ids no range covers: blocks holding no timed row, so their rows have no time."""
    gaps, start = [], INT64_MIN
    for lo, hi in sorted((lo, hi) for lo, hi, _, _ in ranges):
        if lo > start:
            gaps.append((start, lo - 1))
        start = max(start, hi + 1)
    if start <= INT64_MAX:
        gaps.append((start, INT64_MAX))
    return gaps


def _kept(found: list[tuple[tuple[int, float], int]], wanted: int
          ) -> list[tuple[tuple[int, float], int]]:
    """The first ``wanted`` of ``found`` (sorted), and every row tied with the last of them."""
    if len(found) <= wanted:
        return found
    cut = found[wanted - 1][0]
    return [f for f in found if f[0] <= cut]


def _by_time(
    conn: sqlite3.Connection, table: str, match: str, filters: str, params: list[str],
    wanted: int, newest: bool, per_range: int,
) -> list[tuple[int, Any]]:
    """The first ``wanted`` rows of ``table`` for ``match`` by message time (newest or oldest
    first), ties by relevance, then id, rows without a time last; as (id, timestamp).

    Ranges of ids are read in the order of their time bounds, and reading stops at the first
    range that cannot hold a row as new (old) as the last one kept: for a history written in
    time order that is a range or two, for any history it is exact. A page still short after
    two ranges asks how many rows match: at most ``per_range`` a range, they are all read in
    one statement (spread that thin, the page would need most ranges, a statement each)."""
    ranges = impact.time_ranges(conn)
    sign = -1.0 if newest else 1.0  # keys ascend from the best row
    ranges.sort(key=lambda r: (sign * (r[3] if newest else r[2]), r[0]))
    sql = BLOCK_HITS_SQL.format(table=table, filters=filters)
    times: dict[int, Any] = {}

    def read(lo: int, hi: int) -> list[tuple[tuple[int, float], int]]:
        rows = conn.execute(sql, (match, lo, hi, *params)).fetchall()
        times.update(rows)
        return [(scan.time_key(ts, sign), row_id) for row_id, ts in rows]

    found: list[tuple[tuple[int, float], int]] = []  # (time key, id), the best rows so far
    for n, (lo, hi, first_at, last_at) in enumerate(ranges):
        if len(found) >= wanted and (0, sign * (last_at if newest else first_at)) > found[-1][0]:
            break  # no row here, nor in the ranges after, is as new (old) as the last kept
        if n == 2 and len(found) < wanted and _at_most(conn, table, match,
                                                       per_range * len(ranges)):
            found = _kept(sorted(read(INT64_MIN, INT64_MAX)), wanted)  # every id, at once
            break
        found = _kept(sorted(found + read(lo, hi)), wanted)
    else:  # every range was read: rows without a time outside them follow, if there is room
        if len(found) < wanted or found[wanted - 1][0] == scan.UNTIMED_KEY:
            for lo, hi in _outside(ranges):
                found = _kept(sorted(found + read(lo, hi)), wanted)
    keys = [key for key, _ in found]
    tied = [row_id for j, (key, row_id) in enumerate(found)
            if (j and keys[j - 1] == key) or (j + 1 < len(found) and keys[j + 1] == key)]
    scores: dict[int, float] = {}
    if tied:  # rows of the same time in relevance order (FTS5's scores), then by id
        args = (match, min(tied), max(tied), json.dumps(tied))
        scores = dict(conn.execute(SCORES_SQL.format(table=table), args).fetchall())
    ordered = sorted(found, key=lambda f: (f[0], scores.get(f[1], 0.0), f[1]))[:wanted]
    return [(row_id, times[row_id]) for _, row_id in ordered]


def _route_ids(
    conn: sqlite3.Connection, table: str, match: str, conj: rank.Conjunction | None,
    filters: str, params: list[str], wanted: int, order: str | None,
    ranking: rank.Ranking = rank.RANKING,
) -> list[tuple[int, Any]]:
    """One route's first ``wanted`` rows, in its order, as (id, sort key)."""
    if order is None:
        return [(row_id, float(n)) for n, row_id in
                enumerate(_ranked(conn, table, match, conj, filters, params, wanted, ranking))]
    return _by_time(conn, table, match, filters, params, wanted, order == "newest",
                    ranking.time_order_rows_per_range)


# The rows holding a group's text: those the trigram index lists (``{rows}``), checked by the
# exact, escaped conditions of the group on the canonical content.
TRIGRAM_SEARCH_SQL = """
SELECT m.id, m.timestamp FROM messages m JOIN sessions s ON s.id = m.session_id
WHERE m.id IN ({rows}) AND {exact} {filters}
ORDER BY {untimed}, CASE WHEN {untimed} THEN NULL ELSE m.timestamp END {direction},
         m.id {direction} LIMIT ?
"""
TRIGRAM_ROWS_SQL = "SELECT rowid FROM messages_fts_trigram WHERE messages_fts_trigram MATCH ?"
LISTED_ROWS_SQL = "SELECT value FROM json_each(?)"
# The canonical fallback, with no index at all.
LIKE_SEARCH_SQL = """
SELECT m.id FROM messages m JOIN sessions s ON s.id = m.session_id
WHERE {exact} {filters}
ORDER BY {untimed}, CASE WHEN {untimed} THEN NULL ELSE m.timestamp END {direction},
         m.id {direction} LIMIT ? OFFSET ?
"""
_LIKE_TEXT = "(COALESCE(m.content, '') || char(10) || COALESCE(m.tool_name, '')" \
             " || char(10) || COALESCE(m.tool_calls, ''))"


def _word_hits(
    conn: sqlite3.Connection, plan: SearchPlan, filters: str, params: list[str], wanted: int,
    order: str | None, ranking: rank.Ranking = rank.RANKING,
) -> list[int]:
    """The first ``wanted`` rows of the word routes in the query's one order.

    Relevance: rows ``messages_fts`` finds, by its bm25(); then rows only the CJK index finds
    for the Latin words (a word glued to CJK text is a token of that index only), by its
    bm25(); then rows of the CJK alternatives, by bm25() — newest first for a CJK run shorter
    than three characters, which that index matches by substring. Each later route is asked
    only when the earlier ones are exhausted before ``wanted``, so every page is a slice of
    the same order. By time: all of them merged by message time."""
    if plan.cjk_short and not plan.fts_match:
        order = "newest"  # a short CJK query alone: newest first, whatever the sort
    routes: list[tuple[str, str, rank.Conjunction | None, str | None,
                       tuple[str, tuple[str, ...]]]] = []
    if plan.fts_match:
        routes.append(("messages_fts", plan.fts_match, plan.conjunction, order, plan.fts_where))
    if plan.latin_cjk_match:
        routes.append(("messages_fts_cjk", plan.latin_cjk_match, None, order,
                       plan.latin_cjk_where))
    if plan.cjk_match:
        routes.append(("messages_fts_cjk", plan.cjk_match, None,
                       order or ("newest" if plan.cjk_short else None), plan.cjk_where))

    def route(position: int, wanted: int) -> list[tuple[int, Any]]:
        if position == len(routes):  # CJK text inside longer words, as substrings mean it
            return _substring_rows(conn, plan.cjk_groups, filters, params, wanted, order,
                                   ranking)
        table, match, conj, route_order, (where, where_params) = routes[position]
        return _route_ids(conn, table, match, conj, filters + where, [*params, *where_params],
                          wanted, route_order, ranking)

    count = len(routes) + bool(plan.cjk_groups)
    if order is None:
        seen: dict[int, None] = {}
        for position in range(count):
            if len(seen) >= wanted:
                break
            for row_id, _ in route(position, wanted + len(seen)):
                if len(seen) < wanted:
                    seen.setdefault(row_id, None)
        return list(seen)
    merged: dict[int, tuple[tuple[int, float], int, int]] = {}
    sign = -1.0 if order == "newest" else 1.0
    for position in range(count):
        for rank_in_route, (row_id, ts) in enumerate(route(position, wanted)):
            key = (scan.time_key(ts, sign), position, rank_in_route)
            if row_id not in merged or key < merged[row_id]:
                merged[row_id] = key
    return [row_id for row_id, _ in sorted(merged.items(), key=lambda kv: (kv[1], kv[0]))][
        :wanted]


def _substring_rows(
    conn: sqlite3.Connection, groups: Sequence[LikeGroup], filters: str, params: list[str],
    wanted: int, order: str | None, ranking: rank.Ranking,
) -> list[tuple[int, Any]]:
    """Rows of user and assistant text holding a group's text anywhere, through the trigram
    index: newest first (oldest with ``order="oldest"``), as (id, timestamp). A group of the
    user's own "quoted phrases" asks for that phrase and is left out. An SQLite without the
    trigram tokenizer, or while the trigram index is stale, reads the canonical rows instead
    (``hermes_state_scan``).

    The index keeps no positions (``detail='none'``): whichever trigrams it is asked for, the
    rows it lists are checked for the text itself. It is asked first for the trigrams that
    cover each plain piece of a group's text end to end (a third of them, :func:`_trigrams`;
    a row holds every piece), for at most :attr:`~hermes_state_rank.Ranking.trigram_cover_rows`
    rows, checked by id; when more rows hold those (common trigrams, scattered through the
    rows), for every trigram of the pieces."""
    if fulltext.level_of(conn) != fulltext.FULL or index_state(conn).trigram_stale is not None:
        return scan.substring_rows(conn, groups, filters, params, wanted, order)
    direction = "ASC" if order == "oldest" else "DESC"
    found: dict[int, Any] = {}
    for group in groups:
        if not group.index_patterns or not group.substring:
            continue
        exact, exact_params = group.where("m.content", row_text=_LIKE_TEXT)
        if group.words is not None:
            exact, exact_params = f"{exact} AND {CJK_ROW_MATCHES_SQL}", (*exact_params,
                                                                          group.words)
        pieces = [pattern[1:-1] for pattern in group.index_patterns]
        most = ranking.trigram_cover_rows
        listed = [r[0] for r in conn.execute(f"{TRIGRAM_ROWS_SQL} LIMIT ?",
                                              (_trigrams(pieces), rank.bounded_rows(most + 1)))]
        rows, rows_params = LISTED_ROWS_SQL, json.dumps(listed)
        if len(listed) > most:
            rows, rows_params = TRIGRAM_ROWS_SQL, _trigrams(pieces, step=1)
        sql = TRIGRAM_SEARCH_SQL.format(rows=rows, exact=exact, filters=filters,
                                        direction=direction, untimed=UNTIMED_SQL)
        for row_id, ts in conn.execute(sql, (rows_params, *exact_params, *params, wanted)):
            found[row_id] = ts
    return scan.in_time_order(found, order, wanted)


def _trigrams(pieces: Sequence[str], step: int = 3) -> str:
    """The trigram index's MATCH for the rows holding every ``step``-th trigram of each of
    ``pieces`` and its last: by default the trigrams that cover each piece end to end,
    overlapping only to reach its end (``atomicresulthandler``: seven, of seventeen); every
    trigram with a step of 1."""
    trigrams: dict[str, None] = {}
    for piece in pieces:
        starts = sorted({*range(0, len(piece) - 2, step), len(piece) - 3})
        trigrams.update(dict.fromkeys(piece[i:i + 3].replace('"', '""') for i in starts))
    return " AND ".join(f'"{trigram}"' for trigram in trigrams)


def _like_hits(
    conn: sqlite3.Connection, plan: SearchPlan, filters: str, params: list[str],
    limit: int, offset: int, order: str | None,
) -> list[int]:
    exact, exact_params = plan.like_where(_LIKE_TEXT)
    direction = "ASC" if order == "oldest" else "DESC"
    sql = LIKE_SEARCH_SQL.format(exact=exact, filters=filters, direction=direction,
                                 untimed=UNTIMED_SQL)
    return [r[0] for r in conn.execute(sql, (*exact_params, *params, limit, offset))]


# The text columns come as bytes, decoded here (see :func:`_column_text`). With each hit, its
# neighbours in its session, by time then id, whatever their state (the context): each one's
# id, role and the start of its content (?1 characters).
HIT_ROWS_SQL = f"""
SELECT m.id, m.session_id, m.role, m.timestamp, {TEXT_BYTES_SQL}, s.source, s.model, s.started_at,
       b.id, b.role, CAST(substr(COALESCE(b.content, ''), 1, ?1) AS BLOB),
       a.id, a.role, CAST(substr(COALESCE(a.content, ''), 1, ?1) AS BLOB)
FROM messages m JOIN sessions s ON s.id = m.session_id
LEFT JOIN messages b ON b.id = (
    SELECT n.id FROM messages n
    WHERE n.session_id = m.session_id AND (n.timestamp, n.id) < (m.timestamp, m.id)
    ORDER BY n.timestamp DESC, n.id DESC LIMIT 1)
LEFT JOIN messages a ON a.id = (
    SELECT n.id FROM messages n
    WHERE n.session_id = m.session_id AND (n.timestamp, n.id) > (m.timestamp, m.id)
    ORDER BY n.timestamp, n.id LIMIT 1)
WHERE m.id IN (SELECT value FROM json_each(?2))
"""


def _column_text(value: bytes | None) -> str | None:
    """A text column read as bytes, as text: what the library writes is UTF-8, but another
    client may have stored bytes that are not, or a blob, or a number, where it writes text
    (FTS5 indexes them all as text); what is not UTF-8 shows as U+FFFD."""
    return None if value is None else value.decode("utf-8", "replace")


def _snippet_of(
    content: str | None, tool_name: str | None, tool_calls: str | None,
    marker: Marker | None,
) -> str:
    """The snippet of the column that holds the match: content, else tool calls, else tool
    name (the start of the content when none does)."""
    if marker is not None:
        for text in (content, tool_calls, tool_name):
            if text:
                spans = marker.window_spans(text, SNIPPET_WIDTH)
                first = next(spans, None)
                if first is not None:
                    return _window(text, first, spans, SNIPPET_WIDTH)
    return _window(content or "", None, iter(()), SNIPPET_WIDTH)


def _hits(
    conn: sqlite3.Connection, ids: Sequence[int], plan: SearchPlan, kind: str,
) -> list[dict[str, Any]]:
    """The hit dicts of ``ids``, in that order (see :func:`search_messages`)."""
    rows = {r[0]: r for r in conn.execute(HIT_ROWS_SQL, (CONTEXT_CHARS, json.dumps(list(ids))))}
    marker = snippet_pattern(plan, words=kind == WORD)
    texts = {row_id: tuple(map(_column_text, row[4:7])) for row_id, row in rows.items()}
    if marker is not None and marker.folded:  # else no text is read folded
        head = LEARNT_HEAD_CHARS if marker.longest is not None else None  # else read whole
        learn_characters(text[:head] for three in texts.values() for text in three if text)
    hits = []
    for row_id in ids:
        row = rows.get(row_id)
        if row is None:
            continue
        _, session_id, role, timestamp, _, _, _, source, model, started = row[:10]
        content, tool_name, tool_calls = texts[row_id]
        context = [*_neighbour(row[10:13]),
                   {"role": role, "content": (content or "")[:CONTEXT_CHARS]},
                   *_neighbour(row[13:16])]
        hit = {
            "id": row_id, "session_id": session_id, "role": role,
            "snippet": _snippet_of(content, tool_name, tool_calls, marker),
            "timestamp": timestamp, "tool_name": tool_name, "source": source, "model": model,
            "session_started": started, "context": context,
        }
        if kind == SUBSTRING:
            hit["match"] = SUBSTRING
        hits.append(hit)
    return hits


def _neighbour(columns: Sequence[Any]) -> list[dict[str, Any]]:
    """A hit's neighbour in its context, from its (id, role, start of content) columns: none
    when the id is NULL (the hit is first or last in its session)."""
    row_id, role, content = columns
    return [] if row_id is None else [{"role": role, "content": _column_text(content)}]


def _some_source_passes(
    conn: sqlite3.Connection, source_filter: str | Iterable[str] | None,
    exclude_sources: str | Iterable[str] | None,
) -> bool:
    """Whether a session passes the source filters (true without any)."""
    if source_filter is None and exclude_sources is None:
        return True
    sources, params = search_filters(source_filter, exclude_sources, None, True)
    return bool(conn.execute(SOURCES_EXIST_SQL.format(filters=sources), params).fetchone()[0])


def search_messages(
    conn: sqlite3.Connection,
    /,
    query: object,
    source_filter: str | Iterable[str] | None = None,
    exclude_sources: str | Iterable[str] | None = None,
    role_filter: str | Iterable[str] | None = None,
    limit: int = 20,
    offset: int = 0,
    sort: object = None,
    include_inactive: bool = False,
    *,
    use_index: bool = True,
    ranking: rank.Ranking = rank.RANKING,
) -> list[dict[str, Any]]:
    """Search every session's messages (see the module docstring for the routes).

    Returns hits in one order per query and filters — relevance (FTS5's ``bm25()`` over the
    whole history, ties by id) unless ``sort`` is ``"newest"`` or ``"oldest"`` (message time,
    then relevance) — of which ``offset``/``limit`` is a slice: pages never overlap or leave a
    gap. A hit is ``id, session_id, role, snippet`` (the match marked ``>>>…<<<``, the cut
    centred on it in the column that holds it), ``timestamp, tool_name, source, model,
    session_started`` and ``context``: the previous message of the session, the hit itself and
    the next one (``{role, content}``, content cut to 200 characters). A word query returns
    rows holding the words; only when none does, rows holding the text inside a word, marked
    ``"match": "substring"`` (as are all hits while the index is unusable). The whole record
    is searched once: live rows, and archived-generation rows whose message has no live copy;
    rewound rows only with ``include_inactive``, which returns every row. Any text is a valid
    query; one without a usable term finds nothing. Raises :class:`FtsCorruptError` when an
    index proves damaged (the caller detaches it and searches again with ``use_index=False``).
    ``ranking`` sets how the impact index's proofs weigh their way against FTS5's (see
    :class:`hermes_state_rank.Ranking`); the order is the same whatever it says.
    """
    if not isinstance(ranking, rank.Ranking):
        raise InvalidTypeError(f"ranking must be a Ranking, got {type(ranking).__name__}",
                               argument="ranking")
    plan = plan_search(query)
    limit, offset = max(integer("limit", limit), 0), max(integer("offset", offset), 0)
    if plan is None or limit == 0:
        return []
    order = sort_order(sort)
    # Read once: the source filters are asked twice (an iterator would be empty the second time).
    source_filter = filter_texts("source_filter", source_filter)
    exclude_sources = filter_texts("exclude_sources", exclude_sources)
    filters, params = search_filters(source_filter, exclude_sources, role_filter,
                                     include_inactive)
    if not _some_source_passes(conn, source_filter, exclude_sources):
        return []
    # Past the rows any store can hold every page is empty: the end of the page is cut there,
    # so that what the routes ask of SQLite stays within its 64-bit integers.
    offset, limit = min(offset, MAX_ROWS), min(limit, MAX_ROWS)
    state = index_state(conn)
    if scan.scans(conn, state):
        return _scanned(conn, plan, filters, params, offset, offset + limit, order)
    if use_index and state.usable:
        hits = _indexed_hits(conn, plan, filters, params, limit, offset, order, ranking)
        if hits is not None:
            return hits
    ids = _like_hits(conn, plan, filters, params, limit, offset, order)
    return _hits(conn, ids, plan, SUBSTRING)


def _scanned(
    conn: sqlite3.Connection, plan: SearchPlan, filters: str, params: list[str],
    offset: int, wanted: int, order: str | None,
) -> list[dict[str, Any]]:
    """The search without an index (``hermes_state_scan``): the word routes' rows, else the
    substring rows, as the indexed search gives them."""
    ids = scan.word_rows(conn, plan, filters, params, order)
    if ids:
        return _hits(conn, ids[offset:wanted], plan, WORD)
    rows = scan.substring_rows(conn, plan.like_groups, filters, params, wanted, order)
    return _hits(conn, [row_id for row_id, _ in rows[offset:wanted]], plan, SUBSTRING)


def _indexed_hits(
    conn: sqlite3.Connection, plan: SearchPlan, filters: str, params: list[str], limit: int,
    offset: int, order: str | None, ranking: rank.Ranking,
) -> list[dict[str, Any]] | None:
    """The page through the indexes: word hits, else substring hits; None when the index
    refused the query (the caller answers from canonical rows)."""
    wanted = offset + limit
    try:
        ids = _word_hits(conn, plan, filters, params, wanted, order, ranking)
        if ids:
            return _hits(conn, ids[offset:wanted], plan, WORD)
        rows = _substring_rows(conn, plan.like_groups, filters, params, wanted, order,
                               ranking)
        return _hits(conn, [row_id for row_id, _ in rows[offset:wanted]], plan, SUBSTRING)
    except (sqlite3.Error, MemoryError) as exc:
        damaged = isinstance(exc, MemoryError) or is_corruption_error(exc)
        if damaged and damage_is_fts_only(conn, exc):
            raise FtsCorruptError(f"full-text index damaged: {exc!r}") from exc
        if damaged or is_sqlite_lock_error(exc):
            raise
        return None  # a query the index refused
