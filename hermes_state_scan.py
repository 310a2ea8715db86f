"""Search without a full-text index: the same rows, read from a scan of the canonical rows.

A handle at full-text level ``"none"`` (an SQLite without FTS5, or one opened so), and any
handle on a file whose index such a handle detached, answers searches here. The query is the
plan :func:`hermes_state_search.plan_search` makes for the indexes; this module evaluates it
row by row, on the tokens the indexes would hold.

* **Tokens.** A row is read as ``messages_fts`` reads it (content, tool name and tool calls,
  each a column of unicode61 tokens) and as ``messages_fts_cjk`` reads it (its ``search_cjk``
  text, computed here, CJK runs spelled as bigrams). A phrase matches a run of consecutive
  tokens of one column, its last token a prefix for ``word*``. Terms of one alternative may
  match in different columns; a negated conjunction leaves a row out wherever the row holds
  it. So a word glued to CJK text (``Python入門``) is found, as the indexed routes find it.
* **Candidates.** SQLite hands over only rows that may match: every row holding non-ASCII
  text (unicode61 folds ``Café`` to ``cafe``, which no LIKE sees), and the ASCII rows holding
  a token of a positive phrase as a substring. The filters apply in SQL first; Python
  tokenizes only the candidates.
* **Order.** The routes come in the indexed order (see :mod:`hermes_state_search`). Within a
  route, rows rank by FTS5's BM25 formula with N and each phrase's row count exact; the mean
  row length is estimated from the stored length in characters, scaled by the candidates'
  tokens per character. So the rows are the indexed search's rows, in FTS5's order wherever
  the estimate does not swap two close scores. ``sort="newest"``/``"oldest"`` is exact.
* **Substrings.** When no row matches as words, the rows of user and assistant text holding
  the query's text inside a word are found by LIKE over the canonical content
  (:func:`substring_rows`), newest first, as the trigram index finds them. A build without
  the trigram tokenizer uses the same function for those routes.
"""

from __future__ import annotations

import math
import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import hermes_state_fulltext as fulltext
from hermes_state_bm25 import K1, TEXT_BYTES_SQL, B, column_tokens, fts5_text
from hermes_state_fts import IndexState, cjk_index_text

Item = TypeVar("Item")

__all__ = [
    "LIKE_TEXT_SQL",
    "UNTIMED_KEY",
    "Group",
    "Plan",
    "in_time_order",
    "scans",
    "split_on",
    "substring_rows",
    "time_key",
    "word_rows",
]


class Group(Protocol):
    """One alternative of a query for the LIKE routes (``hermes_state_search.LikeGroup``)."""

    @property
    def index_patterns(self) -> tuple[str, ...]: ...

    @property
    def substring(self) -> bool: ...

    @property
    def words(self) -> str | None: ...

    @property
    def include(self) -> tuple[str, ...]: ...

    def where(self, column: str, *, trigram: bool = ...,
              row_text: str | None = ...) -> tuple[str, tuple[str, ...]]: ...


class Plan(Protocol):
    """What the scan reads of a query's plan (``hermes_state_search.SearchPlan``)."""

    @property
    def fts_match(self) -> str | None: ...

    @property
    def cjk_match(self) -> str | None: ...

    @property
    def cjk_short(self) -> bool: ...

    @property
    def cjk_groups(self) -> Sequence[Group]: ...


def scans(conn: sqlite3.Connection, /, state: IndexState) -> bool:
    """Whether searches on ``conn`` answer from the scan: a handle without FTS5, or a file
    whose index a handle without FTS5 detached (its rows since are in no index); ``state``
    is the file's index state, read in the same transaction."""
    if state.stale is not None and fulltext.UNAVAILABLE_REASON in state.stale:
        return True
    return fulltext.level_of(conn) == fulltext.NONE


# --- the expressions of a plan ------------------------------------------------------------------


@dataclass(frozen=True)
class _Phrase:
    tokens: tuple[str, ...]
    prefix: bool


@dataclass(frozen=True)
class _Alternative:
    positive: tuple[_Phrase, ...]
    negated: tuple[tuple[_Phrase, ...], ...]


# A term of a sanitized FTS5 expression: a string (quotes doubled inside) with an optional
# " *", or a bareword with an optional "*"; the operators are barewords.
_ITEM_RE = re.compile(r'"((?:[^"]|"")*)"( \*)?|(\S+)')
_OPERATORS = frozenset({"AND", "OR", "NOT"})


def _phrase(text: str, prefix: bool) -> _Phrase:
    return _Phrase(tuple(column_tokens(text)), prefix)


def _items(expression: str) -> list[_Phrase | str]:
    items: list[_Phrase | str] = []
    for match in _ITEM_RE.finditer(expression):
        quoted, star, bare = match.groups()
        if bare is not None and bare in _OPERATORS:
            items.append(bare)
        elif bare is not None:
            items.append(_phrase(bare.rstrip("*"), bare.endswith("*")))
        else:
            items.append(_phrase(quoted.replace('""', '"'), star is not None))
    return items


def split_on(items: Sequence[Item], op: str) -> list[list[Item]]:
    """A query's items split at each operator ``op`` (the operator dropped)."""
    parts: list[list[Item]] = [[]]
    for item in items:
        if item == op:
            parts.append([])
        else:
            parts[-1].append(item)
    return parts


def _alternatives(expression: str | None) -> list[_Alternative]:
    """An expression as an OR of alternatives, each an AND of phrases and of negated
    conjunctions (adjacent terms bind tightest, then NOT, then AND, then OR)."""
    if not expression:
        return []
    found = []
    for alternative in split_on(_items(expression), "OR"):
        positive: list[_Phrase] = []
        negated: list[tuple[_Phrase, ...]] = []
        for conjunct in split_on(alternative, "AND"):
            head, *tails = split_on(conjunct, "NOT")
            positive += [p for p in head if isinstance(p, _Phrase)]
            negated += [tuple(p for p in tail if isinstance(p, _Phrase)) for tail in tails]
        found.append(_Alternative(tuple(positive), tuple(negated)))
    return found


# --- matching one row ----------------------------------------------------------------------------


def _occurrences(column: Sequence[str], phrase: _Phrase) -> int:
    """How many times ``phrase`` occurs in one column's tokens."""
    n = len(phrase.tokens)
    if n == 0:
        return 0
    head, last = phrase.tokens[:-1], phrase.tokens[-1]
    count = 0
    for i in range(len(column) - n + 1):
        if tuple(column[i : i + n - 1]) != head:
            continue
        token = column[i + n - 1]
        if token == last or (phrase.prefix and token.startswith(last)):
            count += 1
    return count


@dataclass(frozen=True)
class _Row:
    """A candidate row: its id and time, and its tokens as each index reads them."""

    id: int
    timestamp: Any
    columns: tuple[list[str], ...]  # messages_fts: content, tool name, tool calls
    cjk: list[str]  # messages_fts_cjk: search_cjk (empty: no CJK text)
    text: str  # content, tool name and tool calls, one per line (the LIKE text)

    def frequency(self, phrase: _Phrase, *, cjk: bool) -> int:
        columns = (self.cjk,) if cjk else self.columns
        return sum(_occurrences(column, phrase) for column in columns)

    def holds(self, phrase: _Phrase) -> bool:
        return any(_occurrences(c, phrase) for c in (*self.columns, self.cjk))

    def length(self, *, cjk: bool) -> int:
        return len(self.cjk) if cjk else sum(map(len, self.columns))


def _matches(row: _Row, alternative: _Alternative, *, cjk: bool) -> bool:
    """Whether ``row`` matches ``alternative`` in one index (``cjk``: messages_fts_cjk), its
    negated conjunctions tested wherever the row holds them."""
    if not all(row.frequency(p, cjk=cjk) for p in alternative.positive):
        return False
    return not any(all(row.holds(p) for p in conj) for conj in alternative.negated)


def _glued(row: _Row, alternative: _Alternative) -> bool:
    """A Latin alternative whose terms the row holds, one of them glued to CJK text (a token
    of search_cjk only), each of them somewhere."""
    if not row.cjk or not all(row.holds(p) for p in alternative.positive):
        return False
    return not any(all(row.holds(p) for p in conj) for conj in alternative.negated)


# --- candidates ----------------------------------------------------------------------------------

# A message's text as the LIKE routes read it.
LIKE_TEXT_SQL = ("(COALESCE(m.content, '') || char(10) || COALESCE(m.tool_name, '')"
                 " || char(10) || COALESCE(m.tool_calls, ''))")
# The rows that may match: any holding non-ASCII text, or an ASCII token of a positive phrase.
CANDIDATES_SQL = f"""
SELECT m.id, m.timestamp, {TEXT_BYTES_SQL}
FROM messages m JOIN sessions s ON s.id = m.session_id
WHERE ({LIKE_TEXT_SQL} GLOB ? {{patterns}}) {{filters}}
"""
_NON_ASCII_GLOB = "*[^\x01-\x7f]*"
# What the mean row length is estimated from (see the module docstring).
STORED_LENGTH_SQL = f"""
SELECT count(*), COALESCE(sum(length({LIKE_TEXT_SQL})), 0),
       count(m.search_cjk), COALESCE(sum(length(m.search_cjk)), 0)
FROM messages m
"""


def _like(token: str) -> str:
    return "%" + token.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _candidates(
    conn: sqlite3.Connection, phrases: Iterable[_Phrase], filters: str, params: list[str],
) -> list[_Row]:
    tokens = {max(p.tokens, key=len) for p in phrases if p.tokens}
    ascii_tokens = sorted(t for t in tokens if t.isascii())
    patterns = "".join(f" OR {LIKE_TEXT_SQL} LIKE ? ESCAPE '\\'" for _ in ascii_tokens)
    sql = CANDIDATES_SQL.format(patterns=patterns, filters=filters)
    rows = []
    args = (_NON_ASCII_GLOB, *map(_like, ascii_tokens), *params)
    for row_id, timestamp, *raw in conn.execute(sql, args):
        content, tool_name, tool_calls = (fts5_text(v) for v in raw)
        spelled = cjk_index_text(content, tool_name, tool_calls)
        rows.append(_Row(
            row_id, timestamp, tuple(column_tokens(t) for t in (content, tool_name, tool_calls)),
            column_tokens(spelled), "\n".join(t or "" for t in (content, tool_name, tool_calls)),
        ))
    return rows


# --- ranking -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Stats:
    rows: int
    avgdl: float


def _stats(conn: sqlite3.Connection, candidates: Sequence[_Row], *, cjk: bool) -> _Stats:
    """N and the estimated mean length of one index (see the module docstring)."""
    rows, chars, cjk_rows, cjk_chars = conn.execute(STORED_LENGTH_SQL).fetchone()
    n, total = (cjk_rows, cjk_chars) if cjk else (rows, chars)
    seen = [r for r in candidates if (r.cjk if cjk else True)]
    seen_tokens = sum(r.length(cjk=cjk) for r in seen)
    seen_chars = sum(len(r.text) for r in seen)
    per_char = seen_tokens / seen_chars if seen_chars else 0.0
    avgdl = total * per_char / n if n and per_char else 1.0
    return _Stats(int(n), max(avgdl, 1e-9))


def _score(row: _Row, phrases: Sequence[_Phrase], counts: Sequence[int], stats: _Stats,
           *, cjk: bool) -> float:
    """FTS5's bm25() of ``row`` (lower is better, as FTS5 returns it)."""
    length = row.length(cjk=cjk)
    total = 0.0
    for phrase, n in zip(phrases, counts, strict=True):
        f = row.frequency(phrase, cjk=cjk)
        if not f:
            continue
        idf = max(math.log((stats.rows - n + 0.5) / (n + 0.5)), 1e-6)
        total += idf * f * (K1 + 1) / (f + K1 * (1 - B + B * length / stats.avgdl))
    return -total


def _ranked(conn: sqlite3.Connection, rows: list[_Row], candidates: list[_Row],
            alternatives: Sequence[_Alternative], *, cjk: bool) -> dict[int, float]:
    """Each of ``rows`` with its score for the positive phrases of ``alternatives`` (a phrase
    the query repeats counts each time, as in FTS5's ``bm25()``)."""
    phrases = [p for a in alternatives for p in a.positive]
    counts = [sum(1 for r in candidates if r.frequency(p, cjk=cjk)) for p in phrases]
    stats = _stats(conn, candidates, cjk=cjk)
    return {r.id: _score(r, phrases, counts, stats, cjk=cjk) for r in rows}


# --- the search ----------------------------------------------------------------------------------


#: The place by time of a row without a time: after every timed one.
UNTIMED_KEY = (1, 0.0)


def time_key(timestamp: object, sign: float) -> tuple[int, float]:
    """A row's place by time, ascending from the best row: its time signed for the direction
    (``sign`` -1 for newest first), a row without a time after every timed one."""
    if isinstance(timestamp, int | float):
        return 0, sign * timestamp
    return UNTIMED_KEY


def in_time_order(
    found: dict[int, Any], order: str | None, wanted: int | None
) -> list[tuple[int, Any]]:
    """``found`` (id → timestamp) newest first (oldest with ``order="oldest"``), ties by id in
    the same direction, the first ``wanted`` (None: all)."""
    sign = 1.0 if order == "oldest" else -1.0
    ordered = sorted(found.items(), key=lambda kv: (time_key(kv[1], sign), sign * kv[0]))
    return ordered if wanted is None else ordered[:wanted]


def _literal(plan: Plan) -> tuple[str, ...]:
    """The texts a single CJK alternative holds with a symbol between its parts (``100%完成``):
    the index reads no symbol, so the row must hold the text as it is (see
    ``hermes_state_search``)."""
    if len(plan.cjk_groups) != 1:
        return ()
    texts = tuple(_unlike(p) for p in plan.cjk_groups[0].include)
    if all(ch.isalnum() or ch.isspace() for text in texts for ch in text):
        return ()
    return texts


def _unlike(pattern: str) -> str:
    """The text of a ``'%text%'`` pattern escaped for ``LIKE ... ESCAPE '\\'``."""
    return re.sub(r"\\(.)", r"\1", pattern[1:-1])


def _holds_literally(row: _Row, texts: Sequence[str]) -> bool:
    folded = row.text.lower() if row.text.isascii() else _ascii_lower(row.text)
    return all(_ascii_lower(text) in folded for text in texts)


def _ascii_lower(text: str) -> str:
    return "".join(ch.lower() if ch.isascii() else ch for ch in text)


def word_rows(
    conn: sqlite3.Connection, plan: Plan, filters: str, params: list[str], order: str | None,
) -> list[int]:
    """Every row the indexed word routes would find for ``plan`` under the filters, in the
    query's one order (see the module docstring); ``order`` is None, "newest" or "oldest"."""
    latin = _alternatives(plan.fts_match)
    cjk = _alternatives(plan.cjk_match)
    if plan.cjk_short and not plan.fts_match:
        order = "newest"  # a short CJK query alone: newest first, whatever the sort
    phrases = [p for a in (*latin, *cjk) for p in a.positive]
    candidates = _candidates(conn, phrases, filters, params) if phrases else []
    routes = _routes(candidates, latin, cjk, _literal(plan))
    scores = {
        **_ranked(conn, routes[0], candidates, latin, cjk=False),
        **_ranked(conn, routes[1], candidates, latin, cjk=True),
        **_ranked(conn, routes[2], candidates, cjk, cjk=True),
    }
    found = {r.id for route in routes for r in route}
    inside = [(row_id, ts) for row_id, ts in substring_rows(
        conn, plan.cjk_groups, filters, params, None, order) if row_id not in found]
    if order is None:
        return _by_relevance(routes, scores, plan.cjk_short) + [row_id for row_id, _ in inside]
    sign = -1.0 if order == "newest" else 1.0
    keyed = [((time_key(r.timestamp, sign), position, scores[r.id]), r.id)
             for position, route in enumerate(routes) for r in route]
    keyed += [((time_key(ts, sign), len(routes), 0.0), row_id) for row_id, ts in inside]
    return [row_id for _, row_id in sorted(keyed)]


def _routes(
    candidates: list[_Row], latin: list[_Alternative], cjk: list[_Alternative],
    literal: tuple[str, ...],
) -> list[list[_Row]]:
    """The candidates each word route finds first: ``messages_fts``'s, then the CJK index's
    for the Latin words (a word glued to CJK text), then the CJK alternatives'."""
    routes: list[list[_Row]] = [[], [], []]
    for row in candidates:
        if any(_matches(row, a, cjk=False) for a in latin):
            routes[0].append(row)
        elif any(_glued(row, a) for a in latin):
            routes[1].append(row)
        elif any(_matches(row, a, cjk=True) for a in cjk) and (
                not literal or _holds_literally(row, literal)):
            routes[2].append(row)
    return routes


def _by_relevance(
    routes: list[list[_Row]], scores: dict[int, float], newest_cjk: bool
) -> list[int]:
    """The routes' rows route by route, each by its score, then id (the CJK alternatives'
    newest first, when their runs are shorter than three characters)."""
    ids = [r.id for r in sorted(routes[0], key=lambda r: (scores[r.id], r.id))]
    ids += [r.id for r in sorted(routes[1], key=lambda r: (scores[r.id], r.id))]
    if newest_cjk:
        ids += [r.id for r in sorted(routes[2], key=lambda r: (
            time_key(r.timestamp, -1.0), scores[r.id], r.id))]
    else:
        ids += [r.id for r in sorted(routes[2], key=lambda r: (scores[r.id], r.id))]
    return ids


# The canonical rows of user and assistant text a group finds as a substring, as the trigram
# index finds them (its LIKE is implied by the group's exact conditions).
SUBSTRING_SQL = f"""
SELECT m.id, m.timestamp, {TEXT_BYTES_SQL}
FROM messages m JOIN sessions s ON s.id = m.session_id
WHERE m.role <> 'tool' AND {{exact}} {{filters}}
ORDER BY {{untimed}}, CASE WHEN {{untimed}} THEN NULL ELSE m.timestamp END {{direction}},
         m.id {{direction}} {{limit}}
"""
UNTIMED_SQL = "typeof(m.timestamp) NOT IN ('integer', 'real')"


def substring_rows(
    conn: sqlite3.Connection, groups: Sequence[Group], filters: str, params: list[str],
    wanted: int | None, order: str | None,
) -> list[tuple[int, Any]]:
    """The trigram route without the trigram index: rows of user and assistant text holding a
    group's text anywhere, newest first (oldest with ``order="oldest"``), the first
    ``wanted`` (None: all), as (id, timestamp). Groups the trigram route leaves out (no piece
    of three characters, or only the user's own quoted phrases) are left out; a group's
    ``words`` stay words (checked on the row's tokens)."""
    direction = "ASC" if order == "oldest" else "DESC"
    found: dict[int, Any] = {}
    for group in groups:
        if not group.index_patterns or not group.substring:
            continue
        exact, exact_params = group.where("m.content", row_text=LIKE_TEXT_SQL)
        words = _alternatives(group.words)
        # With words to check in Python, every row is read; else the first ``wanted`` do.
        limit = "" if words or wanted is None else "LIMIT ?"
        sql = SUBSTRING_SQL.format(exact=exact, filters=filters, direction=direction,
                                   untimed=UNTIMED_SQL, limit=limit)
        args = (*exact_params, *params, *([wanted] if limit else []))
        for row_id, timestamp, *raw in conn.execute(sql, args):
            if words:
                content, tool_name, tool_calls = (fts5_text(v) for v in raw)
                row = _Row(row_id, timestamp, tuple(
                    column_tokens(t) for t in (content, tool_name, tool_calls)),
                    column_tokens(cjk_index_text(content, tool_name, tool_calls)), "")
                if not any(_matches(row, a, cjk=True) for a in words):
                    continue
            found[row_id] = timestamp
    return in_time_order(found, order, wanted)
