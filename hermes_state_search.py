"""Message search: from user text to queries on the three FTS5 indexes, and snippets.

User text never reaches FTS5 as typed. :func:`sanitize_fts5_query` reduces it to a small query
language that is always valid FTS5 and that keeps the meaning of the plain queries people type:

* A *term* is a balanced ``"quoted phrase"`` or a run of non-space characters. Punctuation and
  FTS5 syntax (``* ^ : ( ) { } [ ] + , ; ~ -`` ...) at the edges of a word are dropped; a word
  that still holds punctuation inside is searched as a phrase of its parts (``chat-send`` →
  ``"chat-send"``, ``gateway/run.py`` → ``"gateway/run.py"``, ``it's`` → ``"it's"``), which
  also takes away any ``column:`` filter (``col:term`` → ``"col:term"``). Unbalanced quotes,
  control characters and lone surrogates are removed; a term without a letter or digit (``***``,
  emoji) is dropped. Prefix ``*``, ``^``, ``NEAR()`` and grouping parentheses are not offered.
* ``AND``, ``OR`` and ``NOT`` (upper case only) stay operators when they stand between two
  terms; a dangling one is dropped (``hello AND`` → ``hello``) and of several in a row the last
  one wins (``a AND NOT b`` → ``a NOT b``). Lower-case ``and``/``or``/``not`` are plain words.
  The result means what FTS5 says it means: adjacent terms (implicit AND) bind tightest, then
  ``NOT``, then ``AND``, then ``OR``; so ``a NOT b c`` is a ∧ ¬(b ∧ c).
* At most :data:`MAX_QUERY_TERMS` terms and :data:`MAX_QUERY_CHARS` characters are kept. Whole
  terms are dropped from the end; a single term longer than the cap is cut and searched as a
  prefix (``"...cut text" *``), so the text it was cut from still matches. Only the first
  :data:`MAX_INPUT_CHARS` characters of the input are read, which bounds the work per query.

:func:`plan_search` turns the same terms into one :class:`SearchPlan` per query, with a route
for each index. The query is read as an OR of *alternatives* (FTS5 gives OR the lowest
precedence); each alternative goes to one index (a Latin one to a second one as well):

* ``messages_fts`` (``fts_match``): alternatives whose positive terms hold no CJK text. This is
  the sanitized query itself when the query has no CJK at all.
* ``messages_fts_cjk`` (``cjk_match``): alternatives with CJK text in a positive term. CJK runs
  are spelled the way ``search_cjk`` indexes them (see ``hermes_state_fts``): a run of one
  character ``X`` is the prefix query ``"X" *``, two characters are the token ``"AB"``, longer
  runs the phrase of their bigrams ``"AB BC CD"``. A run followed, inside the same term, by more
  text ends there in any matching row, so it is spelled with its trailing character as well
  (``東京b`` → ``"東京 京 b"``). Latin terms, quoted phrases and the operators carry over as they
  are; Latin text keeps word semantics on both indexes (``c京d`` does not find ``abc京def``,
  ``abc京def`` does). Only rows holding CJK text are in this index, which is why alternatives
  without CJK stay on ``messages_fts`` (``東京 OR python`` gives both routes; the caller merges
  them by rowid).
  A CJK term that only ever appears after ``NOT`` in an otherwise Latin alternative cannot be
  expressed there; it is matched as a whole word on ``messages_fts`` (the LIKE route is exact).
* The Latin alternatives also go to ``messages_fts_cjk`` (``latin_cjk_match``): unicode61
  reads a CJK run and the Latin letters touching it as one token, so in ``日本語のUI設計`` or
  ``Python入門`` the word is not a token of ``messages_fts``, but it is one of ``search_cjk``.
* LIKE (``like_groups``): the whole query as an OR of :class:`LikeGroup`, each an AND of
  ``LIKE '%text%' ESCAPE '\\'`` patterns (``%``, ``_`` and ``\\`` are literal, and a word
  keeps the ``%`` and ``_`` at its edges there: ``50%`` finds ``50% off``, not ``500``) and
  of negated conjunctions, with exactly the boolean meaning above but substring semantics
  (``cat`` also finds ``concatenate``; case folding is ASCII-only). It serves the canonical-row
  fallback while the indexes are stale, and substring search through ``messages_fts_trigram``
  (non-tool rows only). SQLite hands a LIKE to a virtual table only when it has no ESCAPE
  clause, and the trigram index must only ever see literals of at least 3 characters: SQLite
  3.40 counts bytes, so ``'%東京%'`` silently finds nothing, and a short pattern beside another
  one can crash it. So each group also carries ``index_patterns``: plain ``'%piece%'`` patterns
  for the pieces of ≥ 3 characters between ``%``/``_`` in its required terms. They drive the
  index; the escaped patterns then filter exactly. A group without one cannot use the trigram
  index and is served by the canonical LIKE scan instead.

A query with no usable term (empty, whitespace, operators or symbols only) has no plan: the
search returns nothing. ``needles`` are the positive terms' texts, used by :func:`make_snippet`
to centre and mark snippets for hits from ``messages_fts_cjk`` and the LIKE routes, whose
indexed text FTS5's own ``snippet()`` would show bigram-expanded or cannot show at all.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hermes_state_common import clean_text, escape_like
from hermes_state_errors import FtsCorruptError, is_corruption_error, is_sqlite_lock_error
from hermes_state_fts import cjk_bigrams, damage_is_fts_only, has_cjk, index_state, iter_cjk_runs

__all__ = [
    "MAX_QUERY_TERMS",
    "MAX_QUERY_CHARS",
    "MAX_INPUT_CHARS",
    "SNIPPET_WIDTH",
    "MATCH_START",
    "MATCH_END",
    "ELLIPSIS",
    "LikeGroup",
    "SearchPlan",
    "sanitize_fts5_query",
    "plan_search",
    "SORTS",
    "search_sort",
    "make_snippet",
    "search_messages",
]

MAX_QUERY_TERMS = 32
MAX_QUERY_CHARS = 256
MAX_INPUT_CHARS = 64 * MAX_QUERY_CHARS
SNIPPET_WIDTH = 120
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
    word = _strip_edges(chunk)
    if not _usable(word):
        return None
    bare = word not in _KEYWORDS and all(_is_word_char(ch) for ch in word)
    like = _strip_edges(chunk, keep=_LIKE_LITERALS)
    return _Term(word, quoted=not bare, like=None if like == word else like)


def _phrase_term(content: str) -> _Term | None:
    content = content.strip()
    return _Term(content, quoted=True, phrase=True) if _usable(content) else None


def _as_text(query: object) -> str:
    if query is None:
        return ""
    if isinstance(query, (bytes, bytearray)):
        return bytes(query).decode("utf-8", "replace")
    return str(query)


def _render_term(term: _Term) -> str:
    if not term.quoted:
        return term.text + ("*" if term.prefix else "")
    return '"' + term.text.replace('"', '""') + '"' + (" *" if term.prefix else "")


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


def _split(items: Sequence[_Item], op: str) -> list[list[_Item]]:
    parts: list[list[_Item]] = [[]]
    for item in items:
        if item == op:
            parts.append([])
        else:
            parts[-1].append(item)
    return parts


def _positive_and_negated(alternative: list[_Item]) -> tuple[list[_Term], list[list[_Term]]]:
    """An OR-free alternative as its required terms and its negated conjunctions."""
    positive: list[_Term] = []
    negated: list[list[_Term]] = []
    for conjunct in _split(alternative, "AND"):
        head, *tails = _split(conjunct, "NOT")  # implicit AND binds tighter than NOT
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
    for that phrase, so substring hits do not pad out a short page of phrase hits.
    """

    include: tuple[str, ...]
    exclude: tuple[tuple[str, ...], ...]
    index_patterns: tuple[str, ...]
    substring: bool = True

    def where(self, column: str, *, trigram: bool = False) -> tuple[str, tuple[str, ...]]:
        """An SQL condition on ``column`` (a trusted SQL expression, never user text).

        With ``trigram``, the index patterns come first so FTS5 can use them (the caller runs
        this only on groups that have some).
        """
        escaped = f"{column} LIKE ? ESCAPE '\\'"
        clauses: list[str] = []
        params: list[str] = []
        if trigram:
            clauses += [f"{column} LIKE ?"] * len(self.index_patterns)
            params += self.index_patterns
        clauses += [escaped] * len(self.include)
        params += self.include
        for conjunction in self.exclude:
            clauses.append("NOT (" + " AND ".join([escaped] * len(conjunction)) + ")")
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

    def like_where(self, column: str) -> tuple[str, tuple[str, ...]]:
        """The whole query as one exact LIKE condition on ``column`` (a trusted SQL expression)."""
        parts = [group.where(column) for group in self.like_groups]
        return "(" + " OR ".join(sql for sql, _ in parts) + ")", tuple(
            p for _, params in parts for p in params
        )


def plan_search(query: object) -> SearchPlan | None:
    """The routes for ``query``, or None when it has no usable term (the search finds nothing)."""
    items = _parse(query)
    if not items:
        return None
    latin: list[list[_Item]] = []
    cjk: list[list[_Item]] = []
    groups: list[LikeGroup] = []
    needles: dict[str, None] = {}
    for alternative in _split(items, "OR"):
        positive, negated = _positive_and_negated(alternative)
        groups.append(_like_group(positive, negated))
        needles.update((t.text, None) for t in positive)
        (cjk if any(has_cjk(t.text) for t in positive) else latin).append(alternative)
    return SearchPlan(
        query=_render(items),
        fts_match=" OR ".join(_render(alt) for alt in latin) or None,
        cjk_match=" OR ".join(_render(alt, _render_cjk_term) for alt in cjk) or None,
        like_groups=tuple(groups),
        needles=tuple(needles),
        latin_cjk_match=" OR ".join(_render(alt, _render_cjk_term) for alt in latin) or None,
    )


# ---------------------------------------------------------------------------------------------
# Snippets
# ---------------------------------------------------------------------------------------------

_SEPARATORS = r"[\W_]+"


def _needle_regex(needle: str) -> str | None:
    """A needle as a regex: its words in order, any punctuation or space between them."""
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
    if words:
        return _SEPARATORS.join(re.escape(w) for w in words)
    return re.escape(needle) if needle.strip() else None


def _needles_re(needles: Iterable[str]) -> re.Pattern[str] | None:
    alternatives = {rx for rx in map(_needle_regex, needles) if rx}
    if not alternatives:
        return None
    # Longer needles first, so that at any position the longest one is marked.
    ordered = sorted(alternatives, key=lambda rx: (-len(rx), rx))
    return re.compile("|".join(f"(?:{rx})" for rx in ordered), re.IGNORECASE)


def make_snippet(text: str, needles: Sequence[str], *, width: int = SNIPPET_WIDTH) -> str:
    """``width`` characters of ``text`` centred on the first match of any needle.

    Needles match case-insensitively, and any run of spaces or punctuation inside a needle
    matches any such run in the text (as a phrase query would). Every match inside the window
    is wrapped in ``>>>`` and ``<<<``; ``...`` marks where the text was cut. Markers and
    ellipses are not counted in ``width``. Without a match the snippet is the start of the text.
    """
    width = max(width, 1)
    pattern = _needles_re(needles)
    first = pattern.search(text) if pattern else None
    start = 0
    if first is not None:
        length = first.end() - first.start()
        start = first.start() - max(width - length, 0) // 2
        start = max(0, min(start, len(text) - width, first.start()))
    end = min(len(text), start + width)
    out = [ELLIPSIS] if start > 0 else []
    pos = start
    if pattern is not None and first is not None:
        for match in pattern.finditer(text, first.start()):
            if match.start() >= end:
                break
            lo, hi = max(match.start(), start), min(match.end(), end)
            out += [text[pos:lo], MATCH_START, text[lo:hi], MATCH_END]
            pos = hi
    out.append(text[pos:end])
    if end < len(text):
        out.append(ELLIPSIS)
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Running a search
# ---------------------------------------------------------------------------------------------

CONTEXT_CHARS = 200

# The columns of a hit; {snippet} and {rank} depend on the route.
_HIT_COLUMNS = """m.id, m.session_id, m.role, m.timestamp, s.source, s.model,
       s.started_at, {snippet} AS snippet, {rank} AS rank"""

FTS_SEARCH_SQL = f"""
SELECT {_HIT_COLUMNS.format(
    snippet="snippet(messages_fts, -1, '>>>', '<<<', '...', 24)", rank="bm25(messages_fts)")}
FROM messages_fts f JOIN messages m ON m.id = f.rowid JOIN sessions s ON s.id = m.session_id
WHERE messages_fts MATCH ? AND f.rowid > ? {{filters}}
ORDER BY rank, m.id LIMIT ?
"""
CJK_SEARCH_SQL = f"""
SELECT {_HIT_COLUMNS.format(snippet="m.content", rank="bm25(messages_fts_cjk)")}
FROM messages_fts_cjk f JOIN messages m ON m.id = f.rowid JOIN sessions s ON s.id = m.session_id
WHERE messages_fts_cjk MATCH ? AND f.rowid > ? {{filters}}
ORDER BY rank, m.id LIMIT ?
"""

# Ranking costs time in proportion to the matches ranked, and a common word matches a large
# share of the history. So the ranked queries look at the newest messages first: the window
# starts at RANK_WINDOW_START message ids and grows (by what is missing, up to 16×) until it
# holds RANK_CANDIDATES
# matches (counting is cheap: FTS5 walks its doclist within the rowid range without ranking)
# and enough hits after the filters — or until it is the whole history. A rare term is
# therefore ranked over everything; a common one over its most recent few hundred matches.
RANK_WINDOW_START = 1024
RANK_CANDIDATES = 256
COUNT_IN_WINDOW_SQL = "SELECT COUNT(*) FROM {table} WHERE {table} MATCH ? AND rowid > ?"
# A sort by time orders every match of an index (no window) by the message's time and rank:
# only ids and ranks, since a snippet made by FTS5 for each match is what would cost; the
# rows shown are then read by id and their snippets made from their text.
TIMED_IDS_SQL = """
SELECT m.id, bm25({table}) AS rank
FROM {table} f JOIN messages m ON m.id = f.rowid JOIN sessions s ON s.id = m.session_id
WHERE {table} MATCH ? {filters}
ORDER BY {order} LIMIT ?
"""
HITS_BY_ID_SQL = f"""
SELECT {_HIT_COLUMNS.format(snippet="m.content", rank="NULL")}
FROM messages m JOIN sessions s ON s.id = m.session_id
WHERE m.id IN (SELECT value FROM json_each(?))
"""
NEWEST_MESSAGE_SQL = "SELECT COALESCE(MAX(id), 0) FROM messages"
# One LIKE reaches the trigram table (SQLite 3.40 can crash on several beside a short one);
# the exact, escaped conditions of the group then filter the canonical content.
TRIGRAM_SEARCH_SQL = f"""
SELECT {_HIT_COLUMNS.format(snippet="m.content", rank="NULL")}
FROM messages_fts_trigram t JOIN messages m ON m.id = t.rowid
JOIN sessions s ON s.id = m.session_id
WHERE t.content LIKE ? AND {{exact}} {{filters}}
ORDER BY {{order}} LIMIT ?
"""
# The canonical fallback: no index at all, newest first.
LIKE_SEARCH_SQL = f"""
SELECT {_HIT_COLUMNS.format(snippet="m.content", rank="NULL")}
FROM messages m JOIN sessions s ON s.id = m.session_id
WHERE {{exact}} {{filters}}
ORDER BY {{order}} LIMIT ? OFFSET ?
"""
# The ORDER BY of each route for each sort: "relevance" ranks (the routes without a rank, the
# trigram and canonical ones, give the newest first); "newest" and "oldest" order by the
# message's timestamp, then rank, then id.
SORTS = ("relevance", "newest", "oldest")
_TIMED_ORDER = {
    "newest": "m.timestamp DESC, rank, m.id DESC",
    "oldest": "m.timestamp, rank, m.id",
}
_TRIGRAM_ORDER = {
    "relevance": "t.rowid DESC",
    "newest": "m.timestamp DESC, m.id DESC",
    "oldest": "m.timestamp, m.id",
}
_CANONICAL_ORDER = {**_TRIGRAM_ORDER, "relevance": "m.timestamp DESC, m.id DESC"}


def search_sort(sort: object) -> str:
    """One of :data:`SORTS`: ``newest`` or ``oldest`` (any case, spaces around ignored),
    anything else (None included) is ``relevance``."""
    word = sort.strip().lower() if isinstance(sort, str) else None
    return word if word in ("newest", "oldest") else "relevance"


def _sort_key(sort: str) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """Python's order for hits merged from several routes, as the routes' ORDER BY."""
    if sort == "relevance":
        return lambda h: (h["rank"] if h["rank"] is not None else math.inf,)
    sign = -1 if sort == "newest" else 1
    return lambda h: (sign * (h["timestamp"] or 0),
                      h["rank"] if h["rank"] is not None else math.inf, sign * h["id"])


_LIKE_TEXT = "(COALESCE(m.content, '') || char(10) || COALESCE(m.tool_name, '')" \
             " || char(10) || COALESCE(m.tool_calls, ''))"

CONTEXT_BEFORE_SQL = """
SELECT role, substr(content, 1, ?) FROM messages
WHERE session_id = ? AND id < ? AND active = 1 ORDER BY id DESC LIMIT 1
"""
CONTEXT_AFTER_SQL = """
SELECT role, substr(content, 1, ?) FROM messages
WHERE session_id = ? AND id > ? AND active = 1 ORDER BY id LIMIT 1
"""


def _as_list(values: str | Iterable[str] | None) -> list[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        return [values]
    return [str(v) for v in values]


def search_filters(
    source_filter: str | Iterable[str] | None,
    exclude_sources: str | Iterable[str] | None,
    role_filter: str | Iterable[str] | None,
    include_inactive: bool,
) -> tuple[str, list[str]]:
    """SQL conditions on ``m`` (messages) and ``s`` (sessions). Each list travels as one JSON
    parameter, so any length works and nothing is formatted into SQL text."""
    sql, params = "", []
    if not include_inactive:
        sql += " AND m.active = 1"
    for values, condition in (
        (_as_list(source_filter), "s.source IN"),
        (_as_list(exclude_sources), "s.source NOT IN"),
        (_as_list(role_filter), "m.role IN"),
    ):
        if values is None or (condition.endswith("NOT IN") and not values):
            continue
        sql += f" AND {condition} (SELECT value FROM json_each(?))"
        params.append(json.dumps(values))
    return sql, params


def _hits(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, params)
    return [
        dict(zip(("id", "session_id", "role", "timestamp", "source", "model",
                  "session_started", "snippet", "rank"), row, strict=True))
        for row in cursor
    ]


# A hit's other indexed text: the CJK and LIKE routes also find matches in tool calls and names.
HIT_TOOL_TEXT_SQL = "SELECT tool_calls, tool_name FROM messages WHERE id = ?"


def _snippet(conn: sqlite3.Connection, hit: dict[str, Any], needles: Sequence[str]) -> str:
    """The snippet of a hit whose ``snippet`` column holds its content: made from the content,
    or from the tool calls or tool name when the match is there and not in the content."""
    content = hit["snippet"] or ""
    pattern = _needles_re(needles)
    if pattern is not None and pattern.search(content) is None:
        for text in conn.execute(HIT_TOOL_TEXT_SQL, (hit["id"],)).fetchone() or ():
            if text and pattern.search(text):
                return make_snippet(text, needles)
    return make_snippet(content, needles)


def _ranked_hits(
    conn: sqlite3.Connection, table: str, sql: str, match: str, params: list[str], wanted: int
) -> list[dict[str, Any]]:
    """The best ``wanted`` hits of ``match`` on ``table`` within the recency window above."""
    newest = conn.execute(NEWEST_MESSAGE_SQL).fetchone()[0]
    count_sql = COUNT_IN_WINDOW_SQL.format(table=table)
    span = RANK_WINDOW_START
    while True:
        floor = max(newest - span, 0)
        if floor:
            found = conn.execute(count_sql, (match, floor)).fetchone()[0]
            if found < RANK_CANDIDATES:
                # Widen in proportion to what is missing (at least 2×, at most 16×).
                span *= min(max(2 * RANK_CANDIDATES // max(found, 1), 2), 16)
                continue
        hits = _hits(conn, sql, (match, floor, *params, wanted))
        if len(hits) >= wanted or floor == 0:
            return hits
        span *= 4


def _route_hits(
    conn: sqlite3.Connection, table: str, template: str, match: str, filters: str,
    params: list[str], wanted: int, sort: str,
) -> list[dict[str, Any]]:
    """The first ``wanted`` hits of ``match`` on one index (``template`` its hit query): the
    best within the recency window, or, sorted by time, the first of every match. A hit whose
    snippet FTS5 did not make carries its content there (see :func:`_snippet`)."""
    if sort == "relevance":
        return _ranked_hits(conn, table, template.format(filters=filters), match, params, wanted)
    ids_sql = TIMED_IDS_SQL.format(table=table, filters=filters, order=_TIMED_ORDER[sort])
    ranks = dict(conn.execute(ids_sql, (match, *params, wanted)).fetchall())
    hits = _hits(conn, HITS_BY_ID_SQL, (json.dumps(list(ranks)),))
    for hit in hits:
        hit["rank"] = ranks[hit["id"]]
    return sorted(hits, key=_sort_key(sort))


def _index_hits(
    conn: sqlite3.Connection, plan: SearchPlan, filters: str, params: list[str], wanted: int,
    sort: str = "relevance",
) -> list[dict[str, Any]]:
    """Hits from the FTS indexes, best first, then trigram substring hits where those left the
    page short, newest first; with a ``sort`` by time, all of them in that order."""
    hits: list[dict[str, Any]] = []
    if plan.fts_match:
        for hit in _route_hits(conn, "messages_fts", FTS_SEARCH_SQL, plan.fts_match, filters,
                               params, wanted, sort):
            if sort != "relevance":
                hit["snippet"] = _snippet(conn, hit, plan.needles)
            hits.append(hit)
    # Latin words glued to CJK text are tokens of messages_fts_cjk only: asked for there when
    # messages_fts did not already fill the page, so a plain Latin search costs one query (a
    # sort by time always asks: a glued match may be the newest).
    short = len(hits) < wanted or sort != "relevance"
    latin_glued = plan.latin_cjk_match if short else None
    cjk_match = " OR ".join(m for m in (plan.cjk_match, latin_glued) if m)
    if cjk_match:
        for hit in _route_hits(conn, "messages_fts_cjk", CJK_SEARCH_SQL, cjk_match, filters,
                               params, wanted, sort):
            hit["snippet"] = _snippet(conn, hit, plan.needles)
            hits.append(hit)
    hits.sort(key=_sort_key(sort))
    best: dict[int, dict[str, Any]] = {}
    for hit in hits:
        best.setdefault(hit["id"], hit)  # a row both indexes found keeps its better rank
    hits = list(best.values())
    for group in plan.like_groups:
        if len(hits) >= wanted or not group.index_patterns or not group.substring:
            continue
        exact, exact_params = group.where("m.content")
        index_pattern = max(group.index_patterns, key=len)
        found = {h["id"] for h in hits}
        sql = TRIGRAM_SEARCH_SQL.format(exact=exact, filters=filters,
                                        order=_TRIGRAM_ORDER[sort])
        for hit in _hits(conn, sql, (index_pattern, *exact_params, *params, wanted)):
            if hit["id"] not in found:
                hit["snippet"] = _snippet(conn, hit, plan.needles)
                hits.append(hit)
    if sort != "relevance":
        hits.sort(key=_sort_key(sort))
    return hits


def _like_hits(
    conn: sqlite3.Connection, plan: SearchPlan, filters: str, params: list[str],
    limit: int, offset: int, sort: str = "relevance",
) -> list[dict[str, Any]]:
    exact, exact_params = plan.like_where(_LIKE_TEXT)
    sql = LIKE_SEARCH_SQL.format(exact=exact, filters=filters, order=_CANONICAL_ORDER[sort])
    hits = _hits(conn, sql, (*exact_params, *params, limit, offset))
    for hit in hits:
        hit["snippet"] = _snippet(conn, hit, plan.needles)
    return hits


def _add_context(conn: sqlite3.Connection, hit: dict[str, Any]) -> dict[str, Any]:
    context = []
    for sql in (CONTEXT_BEFORE_SQL, CONTEXT_AFTER_SQL):
        row = conn.execute(sql, (CONTEXT_CHARS, hit["session_id"], hit["id"])).fetchone()
        if row is not None:
            context.append({"role": row[0], "content": row[1]})
    hit["context"] = context
    hit.pop("rank", None)
    return hit


def search_messages(
    conn: sqlite3.Connection,
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
) -> list[dict[str, Any]]:
    """Search every session's messages (see the module docstring for the routes).

    Returns ``id, session_id, role, timestamp, snippet`` (matches marked ``>>>…<<<``),
    ``context`` (the previous and next message of the same session, ``{role, content}`` with
    content cut to 200 characters), ``source, model, session_started``; best matches first,
    or by the message's time with ``sort`` ``"newest"`` / ``"oldest"`` (:func:`search_sort`:
    then by rank; an order by time ranks every match, not only the most recent ones).
    Archived generations are left out unless ``include_inactive``. Any text is a valid query;
    one without a usable term finds nothing. Raises :class:`FtsCorruptError` when an index
    proves damaged (the caller detaches it and searches again with ``use_index=False``).
    """
    plan = plan_search(query)
    limit, offset, order = max(int(limit), 0), max(int(offset), 0), search_sort(sort)
    if plan is None or limit == 0:
        return []
    filters, params = search_filters(source_filter, exclude_sources, role_filter,
                                     include_inactive)
    hits = None
    if use_index and index_state(conn).usable:
        try:
            hits = _index_hits(conn, plan, filters, params, offset + limit, order)[offset:]
        except (sqlite3.Error, MemoryError) as exc:
            damaged = isinstance(exc, MemoryError) or is_corruption_error(exc)
            if damaged and damage_is_fts_only(conn, exc):
                raise FtsCorruptError(f"full-text index damaged: {exc!r}") from exc
            if damaged or is_sqlite_lock_error(exc):
                raise
            hits = None  # a query the index refused: answer from canonical rows
    if hits is None:
        hits = _like_hits(conn, plan, filters, params, limit, offset, order)
    return [_add_context(conn, hit) for hit in hits[:limit]]
