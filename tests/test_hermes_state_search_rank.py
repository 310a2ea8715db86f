"""Ranked search through the SessionDB API: the order is FTS5's own bm25() over the whole
history (checked against FTS5 itself on a corpus of common, medium and rare words), pages are
slices of one order, time sorts, prefixes, snippets of the matching column, and the impact
index behind the ranking kept right through other clients' writes, changes, deletions and
damage."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from state_helpers import TRICKY, assert_search_index_exact, raw

import hermes_state_bm25 as bm25
import hermes_state_connect as dbconn
import hermes_state_fts as fts
import hermes_state_impact as impact
import hermes_state_rank as rank
import hermes_state_search as search
from bench.corpus import generate_corpus, query_terms
from hermes_state import InvalidInputError, InvalidTypeError, SessionDB

COMMON = ["session", "gateway", "config", "token"]  # most rows
MEDIUM = ["worker", "retry", "cache", "deploy", "deployment", "deployed"]  # about one in ten
RARE = ["zebra", "quasar", "mauve"]  # a handful each
FILLER = [f"w{i}" for i in range(300)]
T = TypeVar("T")
SOURCES = ("cli", "telegram", "discord")


def _words(r: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        x = r.random()
        if x < 0.18:
            out.append(r.choice(COMMON))
        elif x < 0.22:
            out.append(r.choice(MEDIUM))
        elif x < 0.2206:
            out.append(r.choice(RARE))
        else:
            out.append(r.choice(FILLER))
    return out


def _message(r: random.Random, n: int) -> dict[str, Any]:
    """Short prose, or long tool-like output repeating words, or a tool call with its words
    deep inside the JSON arguments."""
    kind = r.random()
    timestamp = 1_000.0 + n // 3  # every three rows share a time
    if kind < 0.55:
        text = " ".join(_words(r, r.randint(3, 30)))
        return {"role": r.choice(("user", "assistant")), "content": text.capitalize(),
                "timestamp": timestamp}
    if kind < 0.85:
        text = "\n".join(" ".join(_words(r, 12)) for _ in range(r.randint(10, 60)))
        return {"role": "tool", "content": text, "tool_name": "terminal",
                "tool_call_id": f"c{n}", "timestamp": timestamp}
    args = json.dumps({"command": " ".join(["ls"] * r.randint(20, 80) + _words(r, 8))})
    return {"role": "assistant", "content": "", "timestamp": timestamp, "tool_calls": [
        {"id": f"c{n}", "type": "function",
         "function": {"name": "terminal", "arguments": args}}]}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionDB]:
    """2,400 messages in 12 sessions of three sources, built once for the module."""
    path = tmp_path_factory.mktemp("rank") / "state.db"
    r = random.Random(16)
    db = SessionDB(path)
    n = 0
    for s in range(12):
        session = f"s{s}"
        db.create_session(session, SOURCES[s % 3])
        db.replace_messages(session, [_message(r, n + i) for i in range(200)])
        n += 200
    yield db
    db.close()


EXACT_ORDER_SQL = """
SELECT f.rowid FROM messages_fts f JOIN messages m ON m.id = f.rowid
JOIN sessions s ON s.id = m.session_id
WHERE messages_fts MATCH ? {filters} ORDER BY bm25(messages_fts), f.rowid LIMIT ?
"""


def on_file(db: SessionDB, inspect: Callable[[sqlite3.Connection], T]) -> T:
    """``inspect`` run on the store's file, opened from outside, read-only."""
    with raw(db.db_path) as conn:
        return inspect(conn)


@pytest.mark.parametrize(("knobs", "error"), [
    ({"fts5_word_rows": 1.5}, InvalidTypeError),
    ({"exact_rank_rows": "12000"}, InvalidTypeError),
    ({"head_rows": True}, InvalidTypeError),
    ({"proofs": 1}, InvalidTypeError),
    ({"proof_share": None}, InvalidTypeError),
    ({"time_order_rows_per_range": -1}, InvalidInputError),
    ({"abort_margin": -0.5}, InvalidInputError),
    ({"proof_share": math.nan}, InvalidInputError),
    ({"first_batch_postings": 0}, InvalidInputError),  # a batch of none would never move
    ({"max_batch_postings": 0}, InvalidInputError),
    ({"score_waiting_by": "guess"}, InvalidInputError),
])
def test_a_ranking_refuses_a_knob_of_the_wrong_type_or_range(
    knobs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(InvalidInputError) as raised:
        rank.Ranking(**knobs)
    assert type(raised.value) is error and raised.value.argument == next(iter(knobs))


def test_every_knob_of_a_ranking_is_checked_and_the_edges_of_its_ranges_are_taken() -> None:
    for knob in dataclasses.fields(rank.Ranking):
        with pytest.raises(InvalidInputError) as raised:
            rank.Ranking(**{knob.name: object()})
        assert raised.value.argument == knob.name
    edges = rank.Ranking(fts5_word_rows=2**70, proof_share=math.inf, head_rows=0,
                         first_batch_postings=1, abort_margin=0)
    assert (edges.fts5_word_rows, edges.proof_share) == (2**70, math.inf)
    # A share is a float, whatever number it was given as: past every float, infinite.
    shares = rank.Ranking(proof_share=1, abort_margin=2**1024)
    assert (shares.proof_share, shares.abort_margin) == (1.0, math.inf)
    assert isinstance(shares.proof_share, float)


@pytest.mark.parametrize(("knob", "size"), [
    pytest.param(f.name, 2**70 if f.type in ("int", int) else 2**1024, id=f.name)
    for f in dataclasses.fields(rank.Ranking) if f.type in ("int", int, "float", float)])
def test_a_knob_of_any_size_is_no_limit_and_never_reads_as_damage(
    corpus: SessionDB, knob: str, size: int, caplog: pytest.LogCaptureFixture,
) -> None:
    """A knob counting rows may be any integer, and a share any number (an int past every
    float too): past every row a store can hold it sets no limit. None reaches SQLite, a fetch
    or the proof's arithmetic as a number they refuse, which the search would take for a
    damaged index (a warning, FTS5 ranking instead, the index marked for a rebuild)."""
    ranking = proofs(**{"exact_rank_rows": 0, "everywhere_per_wanted": 1, knob: size})
    with caplog.at_level("WARNING"):
        for query in ("session gateway", "worker session", "session", "zebra"):
            for sort in (None, "newest"):
                got = ids(corpus.search_messages(query, sort=sort, ranking=ranking))
                assert got == ids(corpus.search_messages(query, sort=sort)), (query, sort)
        inside = corpus.search_messages("essio", ranking=ranking)
    assert inside and all(hit["match"] == "substring" for hit in inside)
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def fts5_order(db: SessionDB, query: str, limit: int = 20, **filters: Any) -> list[int]:
    """FTS5's own exact order for ``query`` under the same filters: the oracle."""
    plan = search.plan_search(query)
    assert plan is not None and plan.fts_match is not None
    where, params = search.search_filters(
        filters.get("source_filter"), filters.get("exclude_sources"),
        filters.get("role_filter"), filters.get("include_inactive", False))
    sql = EXACT_ORDER_SQL.format(filters=where)
    return [r[0] for r in on_file(db, lambda c: c.execute(sql, (plan.fts_match, *params, limit))
                                   .fetchall())]


def ids(hits: list[dict[str, Any]]) -> list[int]:
    found = [hit["id"] for hit in hits]
    assert len(found) == len(set(found)), found
    return found


def traced_search(db: SessionDB, query: str, **kw: Any) -> tuple[list[int], list[str]]:
    """Search: the hits' ids, and every statement the search ran."""
    statements: list[str] = []

    def run(conn: sqlite3.Connection) -> list[dict[str, Any]]:
        conn.set_trace_callback(statements.append)
        try:
            return search.search_messages(conn, query, **kw)
        finally:
            conn.set_trace_callback(None)

    return ids(on_file(db, run)), statements


def counts_matches(statement: str) -> bool:
    """Whether a statement counts the rows of ``messages_fts`` that match."""
    return re.search(r"count\(\*\) FROM (\(\s*SELECT 1 FROM )?messages_fts WHERE messages_fts"
                     r" MATCH", statement) is not None


def proofs(**knobs: Any) -> rank.Ranking:
    """A ranking that proves the top from the impact index however small the store, however
    few rows match and however many a proof handles (by default FTS5 ranks those at once)."""
    return rank.Ranking(**{"fts5_index_rows": 0, "fts5_word_rows": 0,
                           "proof_share": math.inf, **knobs})


# The impact index's routes on the small stores below, where a word matches a few hundred rows.
PROOFS = proofs()


def impact_reads(db: SessionDB, query: str, **kw: Any) -> tuple[list[int], int]:
    """Search, counting the reads of the impact index's postings."""
    got, statements = traced_search(db, query, **kw)
    return got, sum("FROM search_impact_vocab" in s for s in statements)


# ---------------------------------------------------------------------------------------------
# The order is FTS5's bm25()
# ---------------------------------------------------------------------------------------------

QUERIES = [
    *COMMON, *MEDIUM, *RARE,
    "session gateway", "config token", "worker session", "retry cache", "zebra session",
    '"session gateway"', '"w1 w2"', "gateway AND config", "session session",
]
FILTERS = [
    {},
    {"role_filter": ["tool"]},
    {"role_filter": ["user", "assistant"]},
    {"source_filter": ["telegram"]},
    {"exclude_sources": ["cli"], "role_filter": ["assistant"]},
]


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: ",".join(f) or "none")
def test_the_top_20_are_fts5s_own_bm25_order(
    corpus: SessionDB, filters: dict[str, Any]
) -> None:
    # Small enough that this corpus's common words take the impact index's route.
    ranking = proofs(everywhere_per_wanted=1, exact_rank_rows=40)
    through_index = 0
    for query in QUERIES:
        got, reads = impact_reads(corpus, query, ranking=ranking, **filters)
        assert got == fts5_order(corpus, query, **filters), (query, filters)
        through_index += bool(reads)
    assert through_index >= len(COMMON)  # the fast route did the work, not only FTS5


@pytest.fixture(scope="module")
def bench_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8,000 messages of the benchmark's corpus: enough long tool output that the best rows of
    its two-word queries and phrases include rows whose postings leave a frequency open."""
    path = tmp_path_factory.mktemp("bench") / "corpus-8000.db"
    sessions = [
        {"id": s.session_id, "source": s.source, "model": s.model, "started_at": s.started_at,
         "messages": [m.as_append_kwargs() for m in s.messages]}
        for s in generate_corpus(8_000, seed=1)
    ]
    with SessionDB(path) as db:
        assert db.import_sessions(sessions, limited=False)["ok"]
    return path


@pytest.mark.parametrize("route", ["text", "fts5"])
def test_rows_the_postings_leave_open_rank_alike_from_their_text_or_by_fts5(
    bench_store: Path, route: str
) -> None:
    # Such a row waits with its best case; whether it is scored from its text or by FTS5 is a
    # cost estimate, and either way the order is FTS5's.
    ranking = proofs(everywhere_per_wanted=1, exact_rank_rows=0, score_waiting_by=route)
    terms = query_terms(seed=1)
    by_fts5 = 0
    with SessionDB(bench_store, read_only=True) as db:
        for query in terms["en_2term"] + [f'"{p}"' for p in terms["en_phrase"]]:
            got, statements = traced_search(db, query, ranking=ranking)
            assert got == fts5_order(db, query), query
            by_fts5 += any("+rowid IN" in s and "bm25(messages_fts)" in s for s in statements)
            # Rows scored in one FTS5 pass have their filters checked only if they can still
            # enter the top: those failing them never do.
            got, _ = traced_search(db, query, ranking=ranking, source_filter=["telegram"])
            assert got == fts5_order(db, query, source_filter=["telegram"]), query
    assert (by_fts5 > 0) == (route == "fts5")


_PIECES = ["worker", "Worker", "WORKER", "workers", "coworker", "work", "er", "session", " ",
           "\n", "-", "ö", "Wörker", "Ｗorker", "wo\u0301rker", "\x00", "東京", "é"]
# Bytes that are not UTF-8: lone continuation bytes (FTS5 reads one as the code point of its
# value: ª, µ, ²...), a lead byte alone or cut short, a run past any code point.
_JUNK = [b"\x80", b"\xaa", b"\xb5", b"\xb2", b"\xc3", b"\xff", b"\xe6\x9d", b"\xf4\x90\x80\x80"]


class _StoredAsText(bytes):
    """Bytes another client stored as text (SQLite keeps the bytes it is given)."""


_foreign_bytes = st.lists(st.sampled_from([p.encode() for p in _PIECES] + _JUNK), max_size=8)
_column_values = st.one_of(
    st.none(),
    st.lists(st.sampled_from(_PIECES), max_size=8).map("".join),
    st.lists(st.sampled_from(_PIECES), max_size=4).map(" ".join),
    st.lists(st.sampled_from(_PIECES), max_size=8).map(lambda p: "".join(p).encode()),
    st.binary(max_size=12).map(lambda b: b"worker" + b),
    _foreign_bytes.map(lambda p: _StoredAsText(b"".join(p))),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
)


def _value_sql(value: object) -> str:
    return "CAST(? AS TEXT)" if isinstance(value, _StoredAsText) else "?"


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(_column_values, _column_values, _column_values),
                     min_size=1, max_size=8))
@example(rows=[("Wörker", None, None), (None, "wo\u0301rker", None), (b"W\xc3\xb6rker", None, None),
               ("\x00worker", None, "worker"), ("plain", "terminal", None), (None, None, None),
               (_StoredAsText(b"wor\xaaker \xffworker"), None, _StoredAsText(b"\xc3worker"))])
def test_rows_left_out_before_their_text_is_read_hold_no_token_of_the_word(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[object, object, object]],
) -> None:
    # Rows waiting on a word's frequency are read for their text only when they may hold it:
    # a row the read leaves out must have no token FTS5 makes the word, whatever its columns
    # hold (characters unicode61 folds onto it, a blob or text that is not UTF-8 another client
    # stored, a NUL, a number); and every row of ASCII text lacking the word even as a
    # substring is left out.
    path = tmp_path_factory.mktemp("lacking") / "state.db"
    SessionDB(path).close()
    conn = writer(path)
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s1', 'cli', 0)")
    written = [conn.execute(
        "INSERT INTO messages (session_id, role, content, tool_name, tool_calls, timestamp)"
        f" VALUES ('s1', 'user', {', '.join(map(_value_sql, row))}, 0)", row).lastrowid
        for row in rows]
    sql = rank.ROW_TEXT_SQL.format(filters="", ascii=rank.ASCII_ROW_SQL,
                                   lacking=rank.WORD_ABSENT_SQL)
    words = ["worker"] * 3
    kept = {r[0] for r in conn.execute(sql, (json.dumps(written), *words))}
    holding = {r[0] for r in conn.execute(
        "SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'worker'")}
    conn.close()
    assert holding <= kept
    for row_id, row in zip(written, rows):
        ascii_text = all(v is None or (isinstance(v, str) and v.isascii() and "\x00" not in v)
                         for v in row)
        if ascii_text and not any("worker" in v.lower() for v in row if v):
            assert row_id not in kept, row


def _fts5_passes(statements: list[str]) -> int:
    """How many of a search's statements had FTS5 score rows the proof left waiting."""
    return sum("+rowid IN" in s and "bm25(messages_fts)" in s for s in statements)


def listed_ids(statement: str) -> list[int]:
    """The ids a traced statement passes in its first JSON list (``json_each('[...]')``)."""
    return list(json.loads(statement.split("json_each('", 1)[1].split("'", 1)[0]))


def _texts_read(statements: list[str]) -> int:
    """How many rows' text a search's statements read to score rows the proof left waiting."""
    return sum(len(listed_ids(s)) for s in statements if "messages_fts_docsize AS d" in s)


@pytest.mark.parametrize("filters", [{}, {"source_filter": ["telegram", "email"]}],
                         ids=["none", "sources"])
@pytest.mark.parametrize("waiting", ["estimate", "text"])
def test_the_likeliest_waiting_rows_are_read_first(
    bench_store: Path, filters: dict[str, Any], waiting: str
) -> None:
    # Rows that wait with a best case. Where FTS5 would score them in one pass ("estimate":
    # more of them than their text is worth reading), the text of the likeliest few that pass
    # the filters is read first; scored from their text, the likeliest few are read first,
    # twice as many each time. Either way the top they make leaves the others out: the same
    # order, from fewer FTS5 passes or fewer rows read. (Pages of five rows: at this size few
    # rows wait, and the likeliest are fewer.)
    work = _fts5_passes if waiting == "estimate" else _texts_read
    terms = query_terms(seed=1)
    queries = terms["en_2term"] + [f'"{p}"' for p in terms["en_phrase"]]
    done, likeliest = {}, rank.RANKING.head_rows
    with SessionDB(bench_store, read_only=True) as db:
        for head in (likeliest, 0):  # 0: every waiting row at once
            ranking = proofs(everywhere_per_wanted=1, exact_rank_rows=0, head_rows=head,
                             score_waiting_by=waiting)
            done[head] = 0
            for query in queries:
                for offset in (0, 5):
                    got, statements = traced_search(db, query, limit=5, offset=offset,
                                                    ranking=ranking, **filters)
                    want = fts5_order(db, query, limit=offset + 5, **filters)[offset:]
                    assert got == want, (query, head, offset)
                    done[head] += work(statements)
    assert done[likeliest] < done[0], done


def test_a_proof_that_would_cost_more_than_fts5s_own_ranking_gives_up(
    bench_store: Path
) -> None:
    # The rows the postings leave open are scored by FTS5: with a proof allowed to handle no
    # row, the proof stops before it reads the postings of any row (those indexed under every
    # word are rows it handles too) or has FTS5 score any row, and the order is FTS5's.
    terms = query_terms(seed=1)
    queries = terms["en_2term"] + [f'"{p}"' for p in terms["en_phrase"]]

    def walks(share: float) -> tuple[int, int]:
        ranking = proofs(everywhere_per_wanted=1, exact_rank_rows=0, score_waiting_by="fts5",
                         proof_share=share)
        by_fts5 = settles = 0
        with SessionDB(bench_store, read_only=True) as db:
            for query in queries:
                got, statements = traced_search(db, query, ranking=ranking)
                assert got == fts5_order(db, query), query
                by_fts5 += any("+rowid IN" in s and "bm25(messages_fts)" in s
                               for s in statements)
                settles = max(settles, sum(
                    re.search(r"FROM search_impact\s+WHERE id IN", s) is not None
                    for s in statements))
        return by_fts5, settles

    # What a budget that never runs out lets the proofs do.
    assert all(walks(math.inf))
    assert walks(0.0) == (0, 0)


def test_the_rows_indexed_under_every_word_are_read_no_further_than_the_budget(
    bench_store: Path
) -> None:
    # Each row indexed under every word is a row the proof handles: a list longer than the
    # budget (with the rows scored before it) is read one past that and no further.
    budget = 10
    read = 0
    with SessionDB(bench_store, read_only=True) as db:
        for query in query_terms(seed=1)["en_2term"]:
            words = " AND ".join(f'"{w}"' for w in query.split())
            under_all = on_file(db, lambda c, m=words: c.execute(
                "SELECT count(*) FROM search_impact_fts WHERE search_impact_fts MATCH ?",
                (m,)).fetchone()[0])
            rarest = min(on_file(db, lambda c, m=word: c.execute(
                "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?",
                (f'"{m}"',)).fetchone()[0]) for word in query.split())
            unindexed = on_file(db, lambda c, m=words: c.execute(
                "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?"
                " AND rowid > (SELECT max(id) FROM search_impact)", (m,)).fetchone()[0])
            ranking = proofs(everywhere_per_wanted=0, exact_rank_rows=0,
                             proof_share=budget / rarest)
            got, statements = traced_search(db, query, ranking=ranking)
            assert got == fts5_order(db, query), query
            listed = [int(m.group(1)) for s in statements if (m := re.match(
                r"SELECT rowid FROM search_impact_fts WHERE search_impact_fts MATCH '[^']*' "
                r"LIMIT (-?\d+)", s))]
            assert len(listed) == 1 and 0 <= listed[0] <= budget + unindexed + 1, listed
            read += under_all > listed[0]
    assert read >= 3  # lists longer than the budget allows


# Words that begin or end one another: a row's posting of one must never be read as the
# other's (the proof cuts each query word's posting out of the row's postings).
NESTED = ["deploy", "deployment", "deployed", "redeploy", "re"]
NESTED_WORD_QUERIES = ["deploy deployment", "deployed deploy", "redeploy deploy re",
                       "deployment redeploy", "re deployed"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_words_that_begin_one_another_are_scored_each_from_its_own_posting(
    tmp_path: Path, seed: int
) -> None:
    r = random.Random(seed)
    with SessionDB(tmp_path / "state.db") as db:
        db.create_session("s", "cli")
        db.create_session("t", "telegram")  # a few rows: a filter that keeps few of the best
        rows: dict[str, list[dict[str, Any]]] = {"s": [], "t": []}
        for n in range(600):
            words = [w for w in NESTED for _ in range(r.randint(0, 4))] + _words(r, 6)
            r.shuffle(words)
            session = "t" if n % 10 == 0 else "s"
            rows[session].append({"role": "user", "content": " ".join(words),
                                  "timestamp": float(n)})
            if n % 4 == 0:  # rows that tie: the best of them are told apart by id alone
                rows[session].append({"role": "user", "content": "deploy deployment re w1",
                                      "timestamp": float(n)})
        for session, messages in rows.items():
            db.replace_messages(session, messages)
    ranking = proofs(everywhere_per_wanted=1, exact_rank_rows=0)
    with SessionDB(tmp_path / "state.db") as db:
        scored = 0
        for query in NESTED_WORD_QUERIES:
            for filters in ({}, {"source_filter": ["telegram"]}):
                got, statements = traced_search(db, query, ranking=ranking, **filters)
                assert got == fts5_order(db, query, **filters), (query, filters)
                scored += any(re.search(r"FROM search_impact\s+WHERE id IN", s)
                              for s in statements)
        assert scored >= len(NESTED_WORD_QUERIES)  # scored from postings, not ranked by FTS5


def proven_alone(statements: list[str]) -> bool:
    """Whether a search proved its top from the postings alone: neither FTS5's ranking of the
    query nor the list of the rows indexed under every word."""
    return (any("FROM search_impact_vocab" in s for s in statements)
            and not any("ORDER BY bm25(messages_fts)" in s for s in statements)
            and not any(s.startswith("SELECT rowid FROM search_impact_fts") for s in statements))


def test_a_word_in_most_rows_beside_another_is_proven_from_the_postings(
    bench_store: Path
) -> None:
    # "the" is in most rows, so FTS5's idf of it is its floor: it weighs next to nothing, and
    # most rows are indexed under it. The rows indexed under both words are not scored
    # first: the postings are read, each row they find scored whichever words index it.
    proven = 0
    with SessionDB(bench_store, read_only=True) as db:
        for query in ("run the", "the tools", "and the", "database the", "the run tools"):
            for filters in ({}, {"source_filter": ["telegram"]}, {"role_filter": ["tool"]}):
                for limit, offset in ((20, 0), (5, 10)):
                    for share in (0.1, math.inf):
                        ranking = proofs(everywhere_per_wanted=0, exact_rank_rows=0,
                                         proof_share=share)
                        got, statements = traced_search(db, query, ranking=ranking,
                                                        limit=limit, offset=offset, **filters)
                        want = fts5_order(db, query, limit + offset, **filters)[offset:]
                        assert got == want, (query, filters, limit, offset, share)
                        proven += proven_alone(statements)
    assert proven >= 30  # of 60 (the others fall back to the usual proof, or to FTS5)


def test_a_word_in_most_rows_still_orders_rows_the_other_word_ties(tmp_path: Path) -> None:
    # Rows alike for "zeta" (once, in four tokens) rank by how often they hold "the", whose
    # share is a millionth of zeta's: read one posting at a time, zeta's postings find the
    # rows holding "the" three times last, and the proof must still reach them.
    group = ["zeta the w1 w2"] * 40 + ["zeta the the the"] * 25
    sessions = [{"id": "zeta", "source": "cli",
                 "messages": [{"role": "user", "content": c, "timestamp": 1.0} for c in group]}]
    sessions += [
        {"id": s.session_id, "source": s.source, "model": s.model, "started_at": s.started_at,
         "messages": [m.as_append_kwargs() for m in s.messages]}
        for s in generate_corpus(3_000, seed=2)]
    with SessionDB(tmp_path / "state.db") as db:  # imported: the index is built at once
        assert db.import_sessions(sessions, limited=False)["ok"]
    ranking = proofs(everywhere_per_wanted=0, exact_rank_rows=0, first_batch_postings=1,
                     max_batch_postings=1)
    with SessionDB(tmp_path / "state.db") as db:
        got, statements = traced_search(db, "zeta the", ranking=ranking)
        assert got == fts5_order(db, "zeta the")
        content = {m["id"]: m["content"] for m in db.get_messages("zeta")}
        assert {content[i] for i in got} == {"zeta the the the"}
        assert proven_alone(statements)


def test_a_two_word_query_reads_no_postings_of_rows_one_word_alone_indexes(
    bench_store: Path
) -> None:
    # Such a row holds the other word below the threshold: its own posting gives its best
    # case, and only the rows indexed under both words have their postings read.
    ranking = proofs(everywhere_per_wanted=1, exact_rank_rows=0)
    walked = 0
    with SessionDB(bench_store, read_only=True) as db:
        for query in query_terms(seed=1)["en_2term"]:
            got, statements = traced_search(db, query, ranking=ranking)
            assert got == fts5_order(db, query), query
            walked += any("FROM search_impact_vocab" in s for s in statements)
            assert not [s for s in statements if s.lstrip().startswith("SELECT id, epoch,")]
    assert walked


def test_common_words_are_ranked_through_the_impact_index(corpus: SessionDB) -> None:
    for word in COMMON:
        got, reads = impact_reads(corpus, word, limit=50)
        assert reads and got == fts5_order(corpus, word, 50)


def test_deep_pages_stay_exact(corpus: SessionDB) -> None:
    ranking = proofs(everywhere_per_wanted=1, exact_rank_rows=40)
    for query in ("session", "gateway config", "deploy"):
        assert ids(corpus.search_messages(
            query, limit=100, offset=150, ranking=ranking)) == fts5_order(
            corpus, query, 250)[150:]



def test_rows_of_any_script_rank_as_fts5_ranks_them(
    db: SessionDB
) -> None:
    """A row's length counts its tokens as FTS5 counts them, whatever the characters: rows of
    two tokens tie, and ties go by id, wherever the second token comes from."""
    ranking = proofs(everywhere_per_wanted=1, exact_rank_rows=10,
                     single_word_probe_postings=10**6)
    db.create_session("s1", "cli")
    long_rows = [{"role": "tool", "content": " ".join(FILLER), "tool_call_id": f"c{n}"}
                 for n in range(200)]  # so that the short rows below stand out
    db.replace_messages("s1", long_rows + [
        {"role": "user", "content": f"session {TRICKY[n % len(TRICKY)] * 2 if n % 3 else 'w1'}"}
        for n in range(300)])
    for query in ("session", "session cafe", "cafe"):
        got, _ = impact_reads(db, query, ranking=ranking, limit=50)
        assert got == fts5_order(db, query, 50), query
    assert impact_reads(db, "session", ranking=ranking, limit=50)[1]


# ---------------------------------------------------------------------------------------------
# Pages are slices of one order
# ---------------------------------------------------------------------------------------------

page_queries = st.one_of(
    st.sampled_from(COMMON + MEDIUM + RARE),
    st.lists(st.sampled_from(COMMON + MEDIUM + RARE + FILLER[:5]), min_size=2, max_size=3)
    .map(" ".join),
    st.sampled_from(['"session gateway"', "session OR zebra", "config NOT token", "deploy*",
                     "w1*", "ls terminal", "iwifru", "zzz"]),
)
page_filters = st.fixed_dictionaries({
    "source_filter": st.one_of(st.none(), st.lists(st.sampled_from(SOURCES), max_size=2)),
    "role_filter": st.one_of(st.none(), st.lists(st.sampled_from(["user", "assistant", "tool"]),
                                                  min_size=1, max_size=2)),
    "sort": st.sampled_from([None, "newest", "oldest", " Newest "]),
    "include_inactive": st.booleans(),
})


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(query=page_queries, filters=page_filters)
def test_offset_0_and_20_are_the_first_40_of_one_request(
    corpus: SessionDB, query: str, filters: dict[str, Any]
) -> None:
    first = ids(corpus.search_messages(query, limit=20, **filters))
    second = ids(corpus.search_messages(query, limit=20, offset=20, **filters))
    both = ids(corpus.search_messages(query, limit=40, **filters))
    assert first + second == both
    assert not set(first) & set(second)


# ---------------------------------------------------------------------------------------------
# Sort, prefixes, snippets
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("query", ["kiwi", "kiwi tart", "東京大学"])
def test_a_filter_that_keeps_few_of_the_best_matches_ranks_in_at_most_three_passes(
    db: SessionDB, query: str
) -> None:
    # FTS5 ranks a prefix of its order and the filters keep what they keep of it; when that
    # is too few, one longer prefix at most, then the rows that pass the filters in one pass:
    # not ever longer prefixes of the whole list, each of which scores every matching row;
    # none at all for a source that no session has. Under a source filter the first ranking
    # sorts eight prefixes at once, so a longer prefix within them is read from it.
    fts5 = rank.Ranking(proofs=False)  # FTS5 ranks, whatever the words
    for session, source in (("many", "cli"), ("weak", "telegram"), ("some", "discord"),
                            ("quiet", "email"), ("mixed", "matrix")):
        db.create_session(session, source)
    db.append_message("quiet", "user", "none of the words")
    db.replace_messages("many", [{"role": "user", "content": f"kiwi tart 東京大学 {n} x"}
                                 for n in range(3000)])
    long_text = "kiwi tart 東京大学 " + " ".join(f"w{n}" for n in range(200))
    weak = [db.append_message("weak", "user", f"{long_text} {n}") for n in range(3)]
    some = [db.append_message("some", "user", "kiwi tart 東京大学") for _ in range(5)]
    some += [db.append_message("some", "user", f"{long_text} {n}") for n in range(30)]
    # Ten of the best 56, the rest far down: a page's share says 448 rows (eight prefixes).
    for _ in range(10):
        db.append_message("mixed", "user", "kiwi tart 東京大学")
    for n in range(20):
        db.append_message("mixed", "user", f"{long_text} {n}")
    plan = search.plan_search(query)
    assert plan is not None
    table, match = (("messages_fts", plan.fts_match) if plan.fts_match
                    else ("messages_fts_cjk", plan.cjk_match))
    for sources, passes in ((["telegram"], 2), (["discord"], 3), (["cli"], 1), (["email"], 2),
                            (["nowhere"], 0), (["matrix"], 2)):
        got, statements = traced_search(db, query, source_filter=sources, ranking=fts5)
        where, params = search.search_filters(sources, None, None, False)
        oracle = EXACT_ORDER_SQL.replace("messages_fts", table).format(filters=where)
        assert got == [r[0] for r in on_file(
            db, lambda c, o=oracle, p=params: c.execute(o, (match, *p, 20)).fetchall())], sources
        rankings = [s for s in statements if f"bm25({table})" in s]
        assert len(rankings) == passes, (sources, rankings)
    assert set(ids(db.search_messages(query, source_filter=["telegram"], ranking=fts5))) == set(
        weak)
    assert ids(db.search_messages(query, source_filter=["discord"], ranking=fts5))[:5] == some[:5]


def test_fts5s_prefix_is_checked_against_the_filters_only_as_far_as_the_page_needs(
    db: SessionDB
) -> None:
    """FTS5 ranks a prefix of its order: the first rows of the page are read to check the
    filters, and the rest of the prefix only when some of those fail."""
    db.create_session("many", "cli")
    db.create_session("few", "telegram")
    db.replace_messages("many", [{"role": "user", "content": f"kiwi {n}"} for n in range(100)])
    db.replace_messages("few", [{"role": "user", "content": "kiwi"} for _ in range(10)])

    def checked(**filters: Any) -> list[int]:
        fts5 = rank.Ranking(proofs=False, fts5_word_rows=0)  # FTS5 ranks a prefix
        got, statements = traced_search(db, "kiwi", ranking=fts5, **filters)
        assert got == fts5_order(db, "kiwi", **filters), filters
        return [len(listed_ids(s)) for s in statements  # not the page's rows and sessions
                if s.lstrip().startswith("SELECT m.id FROM messages m JOIN sessions s")]

    assert checked() == [20]
    # The ten best rows are telegram's: ten more of the page are read, then the prefix's rest.
    assert checked(source_filter=["cli"]) == [20, 36]
    assert checked(source_filter=["telegram"]) == [20, 36]  # then every row that passes


def test_newest_and_oldest_order_by_time_then_relevance(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    once = db.append_message("s1", "user", "kiwi and many other words here", timestamp=50.0)
    twice = db.append_message("s1", "user", "kiwi kiwi", timestamp=50.0)
    late = db.append_message("s1", "user", "a late kiwi", timestamp=90.0)
    # written last, stamped first: time, not insertion order, decides
    early = db.append_message("s1", "user", "an early kiwi", timestamp=10.0)
    assert ids(db.search_messages("kiwi", sort="newest")) == [late, twice, once, early]
    assert ids(db.search_messages("kiwi", sort="OLDEST ")) == [early, twice, once, late]
    assert ids(db.search_messages("kiwi", sort="relevance")) == ids(
        db.search_messages("kiwi"))
    assert ids(db.search_messages("kiwi", sort="newest", limit=2, offset=1)) == [twice, once]


def test_time_sorts_are_exact_across_blocks_of_ids(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    r = random.Random(3)
    stamps = [r.uniform(0, 1e6) for _ in range(9000)]  # ids in no time order at all
    db.replace_messages("s1", [{"role": "user", "content": f"kiwi {i % 7}", "timestamp": t}
                               for i, t in enumerate(stamps)])
    rows = db.get_messages("s1")
    by_time = sorted(rows, key=lambda m: (-m["timestamp"], m["id"]))
    assert ids(db.search_messages("kiwi", sort="newest", limit=30)) == [
        m["id"] for m in by_time[:30]]
    assert ids(db.search_messages("kiwi", sort="oldest", limit=30)) == [
        m["id"] for m in by_time[::-1][:30]]


# A search in time order reads a query's rows range by range of ids; a page still short after
# two ranges reads them all at once (by default when they are at most
# ``time_order_rows_per_range`` a range). Both must give the same order.
TIME_READS = {"at once": rank.Ranking(time_order_rows_per_range=2**62),
              "range by range": rank.Ranking(time_order_rows_per_range=0)}


@pytest.mark.parametrize("sort", ["newest", "oldest"])
def test_a_time_sort_reads_a_rare_words_rows_at_once_and_a_common_ones_range_by_range(
    db: SessionDB, db_path: Path, sort: str
) -> None:
    """Each range of ids is a statement of its own: a word in a few rows a range, which would
    leave every range to be read, has its rows read in one statement once two ranges leave
    the page short; a common word is read range by range, newest (oldest) first, and stops
    early. The same rows in the same order either way, those without a time last."""
    db.create_session("s1", "cli")
    db.replace_messages("s1", [  # written in time order, as a history is
        {"role": "user", "content": f"kiwi {'plum' if i % 1500 == 7 else i % 7}",
         "timestamp": float(i)} for i in range(9000)])
    conn = writer(db_path)  # another client's rows, their times text
    conn.executemany("INSERT INTO messages (id, session_id, role, content, timestamp)"
                     " VALUES (?, 's1', 'user', ?, ?)",
                     [(20000, "plum later", "soon"), (20001, "plum", "yesterday")])
    conn.close()
    direction = "DESC" if sort == "newest" else "ASC"
    oracle = TIME_ORDER_SQL.format(direction=direction)
    expected = [r[0] for r in on_file(db, lambda c: c.execute(oracle, ("plum",)).fetchall())]

    def block_reads(query: str, ranking: rank.Ranking) -> tuple[list[int], int]:
        got, statements = traced_search(db, query, sort=sort, limit=30, ranking=ranking)
        return got, sum("FROM messages_fts f" in s and "f.rowid BETWEEN" in s
                        for s in statements)

    rare, reads = block_reads("plum", rank.RANKING)  # 8 rows, 4 ranges (2 rows each at most)
    assert rare == expected and expected[-2:] == [20001, 20000]
    assert reads == 3  # two ranges, then every id
    # Range by range, every range is read: three blocks of ids, the ids past the batch
    # boundary, the ids below the first block.
    assert block_reads("plum", TIME_READS["range by range"]) == (rare, 5)
    assert block_reads("plum", rank.Ranking(time_order_rows_per_range=1)) == (rare, 5)
    common, reads = block_reads("kiwi", rank.RANKING)
    assert len(common) == 30 and reads <= 2  # a range or two of the five
    assert block_reads("kiwi", TIME_READS["at once"]) == (common, reads)  # a full page


# The order by time: rows without a time (not a number) after every timed row, in both
# directions, all alike; ties by relevance (FTS5's bm25()), then id.
TIME_ORDER_SQL = """
SELECT f.rowid FROM messages_fts f JOIN messages m ON m.id = f.rowid
WHERE messages_fts MATCH ?
ORDER BY typeof(m.timestamp) NOT IN ('integer', 'real'),
         CASE WHEN typeof(m.timestamp) IN ('integer', 'real') THEN m.timestamp END {direction},
         bm25(messages_fts), f.rowid
"""


def _older_file_without_a_time_column_constraint(db_path: Path) -> None:
    """What a file of an older store may be: a message time that may be NULL."""
    conn = writer(db_path)
    (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages'").fetchone()
    assert "timestamp REAL NOT NULL" in sql
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'messages'",
                 (sql.replace("timestamp REAL NOT NULL", "timestamp REAL"),))
    conn.execute("PRAGMA writable_schema = OFF")
    conn.close()


@pytest.mark.parametrize("sort", ["newest", "oldest"])
def test_rows_without_a_time_sort_after_every_timed_row(
    db_path: Path, sort: str
) -> None:
    """Rows whose time is text another client stored, or NULL in an older file, come after
    every timed row in both directions, by relevance then id; and are found even in a block of
    ids holding no timed row, which the time blocks do not bound."""
    with SessionDB(db_path) as db:
        db.create_session("s1", "cli")
    _older_file_without_a_time_column_constraint(db_path)
    conn = writer(db_path)
    insert = ("INSERT INTO messages (id, session_id, role, content, timestamp)"
              " VALUES (?, 's1', 'user', ?, ?)")
    conn.executemany(insert, [(5000, "kiwi kiwi alone", None), (5001, "kiwi later", "soon"),
                              (9000, "kiwi timed", 3.5), (9001, "kiwi", "yesterday"),
                              (9002, "kiwi again", None)])
    conn.close()
    with SessionDB(db_path) as db:
        for n in range(300):  # past several batches, so that the blocks bound the rows
            db.append_message("s1", "user", f"kiwi {n % 9}", timestamp=float(n % 40))
        assert on_file(db, impact.index_whole)
        direction = "DESC" if sort == "newest" else "ASC"
        expected = [r[0] for r in on_file(db, lambda c: c.execute(
            TIME_ORDER_SQL.format(direction=direction), ("kiwi",)).fetchall())]
        assert set(expected[-4:]) == {5000, 5001, 9001, 9002}
        assert ids(db.search_messages("kiwi", sort=sort, limit=400)) == expected
        pages = [ids(db.search_messages("kiwi", sort=sort, limit=20, offset=o))
                 for o in range(0, 320, 20)]
        assert [i for page in pages for i in page] == expected


@pytest.mark.parametrize("sort", ["newest", "oldest"])
def test_substring_pages_with_rows_without_a_time_are_slices_of_one_order(
    db: SessionDB, db_path: Path, sort: str
) -> None:
    db.create_session("s1", "cli")
    conn = writer(db_path)
    conn.executemany("INSERT INTO messages (session_id, role, content, timestamp)"
                     " VALUES ('s1', 'user', ?, ?)",
                     [("unploy one", 2.0), ("unploy two", "z"), ("unploy three", "m"),
                      ("unploy four", 1.0), ("unploy five", "a")])
    conn.close()
    whole = ids(db.search_messages("ploy", sort=sort, limit=10))
    assert len(whole) == 5 and all(h["match"] == "substring"
                                   for h in db.search_messages("ploy", sort=sort))
    assert [ids(db.search_messages("ploy", sort=sort, limit=1, offset=o))[0]
            for o in range(5)] == whole
    assert whole[:2] == ([1, 4] if sort == "newest" else [4, 1])  # the timed rows first


def test_a_text_time_under_a_file_of_the_older_triggers_never_damages_the_index(
    db_path: Path
) -> None:
    """A file written before the triggers skipped times that are not numbers: its trigger
    stores text another client wrote as a time in a block's bound, which a time sort then
    treats as no bound."""
    with SessionDB(db_path) as db:
        db.create_session("s1", "cli")
        for n in range(300):
            db.append_message("s1", "user", f"kiwi {n % 9}", timestamp=float(n))
    conn = writer(db_path)
    (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'search_impact_on_update'"
                          ).fetchone()
    older = sql.replace("typeof(new.timestamp) IN ('integer', 'real')",
                        "new.timestamp IS NOT NULL")
    assert older != sql
    conn.execute("DROP TRIGGER search_impact_on_update")
    conn.execute(older)
    conn.execute("UPDATE messages SET timestamp = 'soon' WHERE id = 5")
    assert conn.execute("SELECT count(*) FROM search_time_blocks WHERE typeof(last_at) = 'text'"
                        ).fetchone() == (1,)
    conn.close()
    with SessionDB(db_path) as db:
        newest = ids(db.search_messages("kiwi", sort="newest", limit=400))
        assert newest[:3] == [300, 299, 298] and newest[-1] == 5
        assert ids(db.search_messages("kiwi", sort="oldest", limit=3)) == [1, 2, 3]
        db.append_message("s1", "user", "kiwi after", timestamp=1000.0)
        assert on_file(db, impact.index_health)["usable"]


@pytest.mark.parametrize("reads", sorted(TIME_READS))
def test_a_time_sort_finds_rows_of_any_id(db: SessionDB, db_path: Path, reads: str) -> None:
    db.create_session("s1", "cli")
    conn = writer(db_path)
    conn.executemany("INSERT INTO messages (id, session_id, role, content, timestamp)"
                     " VALUES (?, 's1', 'user', 'kiwi', ?)",
                     [(-7, 1.0), (0, 2.0), (2**62 + 10, 3.0), (2**63 - 1, 4.0)])
    conn.close()
    ranking = TIME_READS[reads]
    assert ids(db.search_messages("kiwi", sort="newest", ranking=ranking)) == [
        2**63 - 1, 2**62 + 10, 0, -7]
    assert ids(db.search_messages("kiwi", sort="oldest", ranking=ranking)) == [
        -7, 0, 2**62 + 10, 2**63 - 1]


def test_a_prefix_query_finds_every_word_it_begins(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    found = [db.append_message("s1", "user", text) for text in
             ("deploy now", "the deployment failed", "deployed twice")]
    db.append_message("s1", "user", "redeploy is another word")
    hits = db.search_messages("deploy*")
    assert sorted(ids(hits)) == found
    assert all(">>>deploy" in hit["snippet"] for hit in hits)
    assert ">>>deployment<<<" in next(h["snippet"] for h in hits if h["id"] == found[1])
    assert ids(db.search_messages("deploy")) == [found[0]]


def test_every_hit_that_holds_the_word_shows_it_marked(corpus: SessionDB) -> None:
    for word in ("terminal", "ls", *COMMON, *RARE):
        hits = corpus.search_messages(word, limit=100)
        assert hits
        for hit in hits:
            row = on_file(corpus, lambda c, i=hit["id"]: c.execute(
                "SELECT content, tool_name, tool_calls FROM messages WHERE id = ?",
                (i,)).fetchone())
            text = "\n".join(t for t in row if t).lower()
            if word in bm25.column_tokens(text):
                assert f">>>{word}<<<" in hit["snippet"].lower(), (word, hit)


def test_a_match_deep_inside_tool_call_json_is_centred(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    args = json.dumps({"command": "echo " + "padding " * 200 + "finally the needle here"})
    row = db.append_message("s1", "assistant", "", tool_calls=[
        {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": args}}])
    (hit,) = db.search_messages("needle")
    assert hit["id"] == row
    assert ">>>needle<<<" in hit["snippet"]
    window = hit["snippet"].replace(">>>", "").replace("<<<", "").strip(".")
    assert len(window) <= search.SNIPPET_WIDTH
    (by_name,) = db.search_messages("terminal")
    assert ">>>terminal<<<" in by_name["snippet"]


# ---------------------------------------------------------------------------------------------
# The impact index stays right
# ---------------------------------------------------------------------------------------------


def writer(db_path: Path) -> sqlite3.Connection:
    """A writable connection to the file from outside, as another client would hold."""
    return sqlite3.connect(db_path, isolation_level=None)


def exact(db: SessionDB, query: str, limit: int = 20) -> list[int]:
    return fts5_order(db, query, limit)


@pytest.fixture
def small(db: SessionDB) -> SessionDB:
    db.create_session("s1", "cli")
    r = random.Random(7)
    db.replace_messages("s1", [_message(r, n) for n in range(300)])
    return db


def test_rows_another_client_writes_are_found_and_then_indexed(
    small: SessionDB, db_path: Path
) -> None:
    """Rows past the batch boundary are scored from their text until a batch indexes them;
    a row written below it (an explicit id in a gap) is queued, found, and drained."""
    gap = on_file(small, lambda c: c.execute("SELECT min(id) FROM messages").fetchone()[0])
    conn = writer(db_path)
    conn.execute("DELETE FROM messages WHERE id = ?", (gap,))
    conn.executemany(
        "INSERT INTO messages (id, session_id, role, content, timestamp)"
        " VALUES (?, 's1', 'user', ?, 0)",
        [(gap, "session session"), (None, "session session session"), (None, "session")])
    conn.close()
    health = on_file(small, impact.index_health)
    assert health["queued"] == 1 and health["indexed"] < on_file(small, 
        lambda c: c.execute("SELECT max(id) FROM messages").fetchone()[0])
    got, reads = impact_reads(small, "session", ranking=PROOFS)
    assert reads and got == exact(small, "session")  # these rows are scored from their text
    for _ in range(impact.FLUSH_ROWS + impact.CHECK_EVERY):  # the library's writes index them
        small.append_message("s1", "user", "one more session")
    health = on_file(small, impact.index_health)
    assert health["queued"] == 0 and health["usable"]
    assert ids(small.search_messages("session", ranking=PROOFS)) == exact(small, "session")
    small.close()
    assert_search_index_exact(db_path)


def test_changed_and_deleted_rows_never_rank_by_stale_postings(
    small: SessionDB, db_path: Path
) -> None:
    top = exact(small, "gateway", 5)
    conn = writer(db_path)
    conn.execute("UPDATE messages SET content = 'nothing left' WHERE id = ?", (top[0],))
    conn.execute("DELETE FROM messages WHERE id = ?", (top[1],))
    conn.close()
    assert ids(small.search_messages("gateway", ranking=PROOFS)) == exact(small, "gateway")
    for _ in range(impact.CHECK_EVERY):  # some of the library's writes drain the queues
        small.append_message("s1", "user", "drain the queues")
    health = on_file(small, impact.index_health)
    assert health["queued"] == 0 and health["gone"] == 0 and health["usable"]
    got, reads = impact_reads(small, "gateway", ranking=PROOFS)
    assert reads and got == exact(small, "gateway")


def test_an_id_deleted_and_written_again_keeps_the_new_rows_postings(
    small: SessionDB, db_path: Path
) -> None:
    """Another client deletes more rows than one drain purges and writes the last id again:
    the queued row is indexed first, and the purge of the deleted ids must not take its
    postings with the old row's."""
    first = on_file(small, lambda c: c.execute("SELECT min(id) FROM messages").fetchone()[0])
    last = first + 3 * impact.DRAIN_PER_WRITE - 1
    assert last <= on_file(small, impact.index_health)["indexed"]
    conn = writer(db_path)
    conn.execute("DELETE FROM messages WHERE id BETWEEN ? AND ?", (first, last))
    conn.execute("INSERT INTO messages (id, session_id, role, content, timestamp)"
                 " VALUES (?, 's1', 'user', 'zebra zebra', 0)", (last,))
    conn.close()
    for _ in range(8 * impact.CHECK_EVERY):  # the library's writes drain both queues
        small.append_message("s1", "user", "drain the queues")
    health = on_file(small, impact.index_health)
    assert health["queued"] == 0 and health["gone"] == 0 and health["usable"]
    got, reads = impact_reads(small, "zebra", ranking=PROOFS)
    assert reads and got[0] == last and got == exact(small, "zebra")
    small.close()
    assert_search_index_exact(db_path)


def test_a_damaged_impact_index_never_fails_a_write_and_is_replaced_at_the_next_open(
    small: SessionDB, db_path: Path
) -> None:
    conn = writer(db_path)
    conn.execute("UPDATE search_impact_fts_data SET block = randomblob(length(block))"
                 " WHERE id > 10")
    conn.close()
    # the search finds the damage and notes it
    assert ids(small.search_messages("session", ranking=PROOFS)) == exact(small, "session")
    for n in range(80):  # writes go on; the index is left alone, marked damaged
        small.append_message("s1", "user", f"session after the damage {n}")
    assert not small.quarantined and small.fts_status()["stale"] is None
    assert on_file(small, impact.index_health)["damaged"]
    # FTS5 ranks
    assert ids(small.search_messages("session", ranking=PROOFS)) == exact(small, "session")
    with SessionDB(db_path) as reopened:  # replaced, then filled, in the background
        assert reopened.started_index_upkeep
        reopened.wait_for_index(30)
        health = on_file(reopened, impact.index_health)
        assert health["usable"] and not health["damaged"] and health["queued"] == 0
        got, reads = impact_reads(reopened, "session", ranking=PROOFS)
        assert reads and got == exact(reopened, "session")
    assert_search_index_exact(db_path)


# The index's FTS5 table as the library made it before it dropped the column lists (a table
# of one column has no use for them) and its %_docsize table (without which no other SQLite
# client can scan it, to count its rows).
EARLIER_IMPACT_FTS_SQL = """
CREATE VIRTUAL TABLE search_impact_fts USING fts5(
    postings, content='', tokenize="unicode61 tokenchars '_'", columnsize=0, detail='column'
)"""


def as_earlier_index_table(path: Path) -> None:
    """Give a closed store the index table an earlier version made, holding the same
    postings."""
    conn = writer(path)
    conn.execute("BEGIN IMMEDIATE")
    (epoch,) = conn.execute("SELECT epoch FROM search_impact_state").fetchone()
    rows = conn.execute("SELECT id, postings FROM search_impact WHERE postings <> ''").fetchall()
    conn.execute("DROP TABLE search_impact_vocab")
    conn.execute("DROP TABLE search_impact_fts")
    conn.execute(EARLIER_IMPACT_FTS_SQL)
    conn.execute("CREATE VIRTUAL TABLE search_impact_vocab"
                 " USING fts5vocab(search_impact_fts, 'instance')")
    conn.execute(impact.FTS_ADD_SQL, (0, f"_epoch_{epoch}"))
    conn.executemany(impact.FTS_ADD_SQL, [(i, impact.index_text(p)) for i, p in rows])
    conn.execute("COMMIT")
    conn.close()


def test_an_index_table_an_earlier_version_made_is_replaced_by_the_declared_one(
    db_path: Path
) -> None:
    ranking = proofs(everywhere_per_wanted=1, exact_rank_rows=40)
    r = random.Random(21)
    with SessionDB(db_path) as db:
        db.create_session("s1", "cli")
        db.replace_messages("s1", [_message(r, n) for n in range(600)])
    as_earlier_index_table(db_path)
    assert_search_index_exact(db_path)

    def ranked_as_fts5(db: SessionDB) -> None:
        through_index = 0
        for query in QUERIES:
            got, reads = impact_reads(db, query, ranking=ranking)
            assert got == fts5_order(db, query), query
            through_index += bool(reads)
        assert through_index >= len(COMMON)

    with SessionDB(db_path) as db:  # created anew at open, then filled
        assert db.started_index_upkeep
        db.wait_for_index(30)
        assert on_file(db, impact.index_health)["usable"]
        ranked_as_fts5(db)
        for n in range(600, 900):  # batches go into the new table
            db.append_message("s1", **_message(r, n))
        ranked_as_fts5(db)
    assert_search_index_exact(db_path)
    conn = writer(db_path)
    (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'search_impact_fts'"
                          ).fetchone()
    counts = conn.execute("SELECT (SELECT count(*) FROM search_impact_fts),"
                          " (SELECT count(*) FROM search_impact WHERE postings <> '')").fetchone()
    conn.close()
    assert "columnsize" not in sql and "detail='none'" in sql
    assert counts[0] == counts[1] + 1  # any client counts its rows: postings, the epoch's token


def test_damage_a_search_finds_is_marked_in_its_own_file_and_no_other(
    small: SessionDB, db_path: Path, tmp_path: Path
) -> None:
    """A search that finds one file's index damaged has the next write to that file mark it,
    from any handle or thread of the process; writes to another file mark nothing."""
    other_path = tmp_path / "other" / "state.db"
    other_path.parent.mkdir()
    with SessionDB(other_path) as other:
        other.create_session("o1", "cli")
        other.replace_messages("o1", [_message(random.Random(8), n) for n in range(300)])
        conn = writer(db_path)
        conn.execute("UPDATE search_impact SET epoch = epoch + 1"
                     " WHERE id = (SELECT max(id) FROM search_impact)")
        conn.close()
        with SessionDB(db_path, read_only=True) as reader:
            got = ids(reader.search_messages("session", ranking=PROOFS))
            assert got == exact(reader, "session")
        for n in range(3):  # another file, from this thread and from another
            other.append_message("o1", "user", f"session elsewhere {n}")
        appender = threading.Thread(target=other.append_message,
                                    args=("o1", "user", "session from a thread"))
        appender.start()
        appender.join()
        assert not on_file(other, impact.index_health)["damaged"]
        worker = threading.Thread(target=small.append_message,
                                  args=("s1", "user", "session after the damage"))
        worker.start()  # the damaged file's write, from a thread of its own
        worker.join()
        assert on_file(small, impact.index_health)["damaged"]
        assert not on_file(other, impact.index_health)["damaged"]


# Damage to the impact index under an open handle: parts of it dropped, emptied or holding
# values the library never writes.
IMPACT_DAMAGE = {
    "queue dropped": "DROP TABLE search_impact_queue",
    "deleted-ids list dropped": "DROP TABLE search_impact_gone",
    "postings table dropped": "DROP TABLE search_impact",
    "state dropped": "DROP TABLE search_impact_state",
    "time blocks dropped": "DROP TABLE search_time_blocks",
    "change count dropped": "DROP TABLE search_row_changes",
    "word counts dropped": "DROP TABLE search_word_counts",
    "word count text": "UPDATE search_word_counts SET matching = 'many'",
    "word counts' end text": "UPDATE search_word_counts SET upto = 'x'",
    "FTS5 table's config emptied": "DELETE FROM search_impact_fts_config",
    "postings emptied, their FTS5 rows kept": "DELETE FROM search_impact",
    "reference length 0": "UPDATE search_impact_state SET avgdl = 0",
    "reference length text": "UPDATE search_impact_state SET avgdl = 'abc'",
    "reference length negative": "UPDATE search_impact_state SET avgdl = -5",
    "boundary text": "UPDATE search_impact_state SET indexed = 'x'",
    "postings as blobs": "UPDATE search_impact SET postings = CAST(postings AS BLOB)",
    "postings garbled": "UPDATE search_impact SET postings = replace(postings, '_', '_x')",
    "time bounds text": "UPDATE search_time_blocks SET first_at = 'soon'",
    "update trigger dropped": "DROP TRIGGER search_impact_on_update",
    "insert trigger dropped": "DROP TRIGGER search_impact_on_insert",
    "delete trigger dropped": "DROP TRIGGER search_impact_on_delete",
}
DAMAGE_QUERIES = ["session", "session gateway", '"session gateway"', "gateway config token"]


@pytest.mark.parametrize("damage", sorted(IMPACT_DAMAGE))
def test_a_damaged_impact_index_under_an_open_handle_answers_exactly_and_never_fails_a_write(
    small: SessionDB, db_path: Path, damage: str
) -> None:
    """Searches rank as FTS5 does (never as substring hits), the library's writes and other
    clients' go on, and a writable open after the damage was found replaces the index."""
    # The impact index's routes, on 300 rows (a time sort through its time blocks).
    ranking = proofs(everywhere_per_wanted=1, exact_rank_rows=10,
                     time_order_rows_per_range=0)
    newest = small.search_messages("session", sort="newest", limit=30, ranking=ranking)
    conn = writer(db_path)
    conn.execute(IMPACT_DAMAGE[damage])
    conn.close()
    for query in DAMAGE_QUERIES:
        hits = small.search_messages(query, ranking=ranking)
        assert ids(hits) == exact(small, query), (damage, query)
        assert all("match" not in hit for hit in hits), (damage, query)
    again = small.search_messages("session", sort="newest", limit=30, ranking=ranking)
    assert ids(again) == ids(newest)
    for n in range(impact.FLUSH_ROWS + 2 * impact.CHECK_EVERY):  # a batch and drains are due
        small.append_message("s1", "user", f"session gateway after the damage {n}")
    conn = writer(db_path)  # another client's writes: a change, a delete, a row in the gap
    first = conn.execute("SELECT min(id) FROM messages").fetchone()[0]
    conn.execute("UPDATE messages SET content = 'session edited' WHERE id = ?", (first,))
    conn.execute("DELETE FROM messages WHERE id = ?", (first + 1,))
    conn.execute("INSERT INTO messages (id, session_id, role, content, timestamp)"
                 " VALUES (?, 's1', 'user', 'session gateway session', 0)", (first + 1,))
    conn.close()
    for query in DAMAGE_QUERIES:
        got = ids(small.search_messages(query, ranking=ranking))
        assert got == exact(small, query), (damage, query)
    assert not small.quarantined
    small.close()
    with SessionDB(db_path) as reopened:  # what this handle's FTS5 kept in memory is gone
        for query in DAMAGE_QUERIES:
            assert ids(reopened.search_messages(query, ranking=ranking)) == exact(reopened, query)
        reopened.append_message("s1", "user", "a write marks what the searches found")
    with SessionDB(db_path) as repaired:
        repaired.wait_for_index(30)
        assert on_file(repaired, impact.index_health)["usable"], damage
        for query in DAMAGE_QUERIES:
            got, reads = impact_reads(repaired, query, ranking=ranking)
            assert got == exact(repaired, query), (damage, query)
            assert reads or '"' in query, (damage, query)  # FTS5 ranks a phrase
    assert_search_index_exact(db_path)


# Damage to one row's postings: its posting of "gateway" with a "?" for the frequency's first
# digit (the token is gateway_kkkk_f_D), its postings missing, or of another epoch (read as a
# row whose postings are not current: scored from its text, and no damage).
ONE_ROW_DAMAGE = {
    "a frequency unreadable": "UPDATE search_impact SET postings = substr(postings, 1, instr("
                              "' ' || postings, ' gateway_') + 12) || '?' || substr(postings,"
                              " instr(' ' || postings, ' gateway_') + 14) WHERE id = ?",
    "postings gone": "DELETE FROM search_impact WHERE id = ?",
    "postings of another epoch": "UPDATE search_impact SET epoch = epoch + 1 WHERE id = ?",
}


@pytest.mark.parametrize("damage", sorted(ONE_ROW_DAMAGE))
def test_a_damaged_row_among_those_every_word_indexes_is_never_scored_from_its_postings(
    small: SessionDB, db_path: Path, damage: str
) -> None:
    """SQLite scores the rows indexed under every word and hands over the best: one whose
    postings do not read, or are missing, would be scored low or not at all. The search
    notices it and ranks as FTS5 does; the next write marks damage the postings show."""
    query = "session gateway"
    ranking = proofs(everywhere_per_wanted=1, exact_rank_rows=0)
    got, statements = traced_search(small, query, ranking=ranking)
    assert got == exact(small, query)
    assert any(re.search(r"FROM search_impact\s+WHERE id IN", s) for s in statements)
    both = set(on_file(small, lambda c: [r[0] for r in c.execute(
        "SELECT rowid FROM search_impact_fts WHERE search_impact_fts MATCH ?",
        ('"session" AND "gateway"',))]))
    best = next(row for row in got if row in both)
    conn = writer(db_path)
    assert conn.execute(ONE_ROW_DAMAGE[damage], (best,)).rowcount == 1
    conn.close()
    assert ids(small.search_messages(query, ranking=ranking)) == exact(small, query)
    small.append_message("s1", "user", "a write marks what the search found")
    assert on_file(small, impact.index_health)["damaged"] == ("epoch" not in damage)


def test_a_copy_that_lost_the_fts5_table_is_not_trusted(small: SessionDB, db_path: Path) -> None:
    """A salvage that skips virtual tables keeps the postings rows but not the index."""
    conn = writer(db_path)
    conn.execute("INSERT INTO search_impact_fts (search_impact_fts) VALUES ('delete-all')")
    conn.close()
    assert not on_file(small, impact.index_health)["usable"]
    got, reads = impact_reads(small, "session", ranking=PROOFS)
    assert not reads and got == exact(small, "session")
    # the search finds the damage and notes it
    assert ids(small.search_messages("session", ranking=PROOFS)) == exact(small, "session")
    small.append_message("s1", "user", "the next write marks it")
    assert on_file(small, impact.index_health)["damaged"]
    with SessionDB(db_path) as reopened:
        assert reopened.started_index_upkeep
        reopened.wait_for_index(30)
        assert on_file(reopened, impact.index_health)["usable"]
        got, reads = impact_reads(reopened, "session", ranking=PROOFS)
        assert reads and got == exact(reopened, "session")
    assert_search_index_exact(db_path)


# ---------------------------------------------------------------------------------------------
# Cached match counts, and queries matching few rows
# ---------------------------------------------------------------------------------------------

COUNTED = ['"session"', '"gateway" "config"', '"session gateway"', '"zebra"']


def counts(db: SessionDB) -> dict[str, int]:
    return {e: on_file(db, lambda c, e=e: rank.match_count(c, e)) for e in COUNTED}


def true_counts(db_path: Path) -> dict[str, int]:
    conn = writer(db_path)
    try:
        sql = "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?"
        return {e: conn.execute(sql, (e,)).fetchone()[0] for e in COUNTED}
    finally:
        conn.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cached_counts_follow_every_change_another_client_makes(
    db: SessionDB, db_path: Path, seed: int
) -> None:
    """The counts that give a phrase its idf are cached; each kind of change to the rows
    (an update, a delete, an insert into a gap, appends past the boundary, a move) is seen."""
    r = random.Random(seed)
    db.create_session("s1", "cli")
    db.replace_messages("s1", [_message(r, n) for n in range(300)])
    assert counts(db) == true_counts(db_path)
    ids_ = [row[0] for row in writer(db_path).execute("SELECT id FROM messages ORDER BY id")]
    low = r.sample(ids_[: len(ids_) // 2], 4)
    changes = [
        ("UPDATE messages SET content = 'session gateway config zebra' WHERE id = ?", low[0]),
        ("UPDATE messages SET content = 'nothing here', tool_calls = NULL WHERE id = ?",
         low[1]),
        ("DELETE FROM messages WHERE id = ?", low[2]),
        (("INSERT INTO messages (id, session_id, role, content, timestamp)"
          " VALUES (?, 's1', 'user', 'zebra session gateway config', 0)"), low[2]),
        ("UPDATE messages SET id = (SELECT max(id) + 1 FROM messages) WHERE id = ?", low[3]),
        (("INSERT INTO messages (session_id, role, content, timestamp)"
          " SELECT 's1', 'user', 'session gateway zebra', 0 WHERE ? > 0"), 1),
    ]
    for sql, arg in changes:
        conn = writer(db_path)
        conn.execute(sql, (arg,))
        conn.close()
        assert counts(db) == true_counts(db_path), sql
    for _ in range(impact.FLUSH_ROWS + impact.CHECK_EVERY):  # batches move the boundary on
        db.append_message("s1", "user", "session gateway config")
    assert counts(db) == true_counts(db_path)


def test_a_repeated_query_counts_only_the_rows_past_the_cached_boundary(
    corpus: SessionDB,
) -> None:
    """Counting a phrase reads every row holding its words: a query asked again counts
    only the rows written since, whatever the words."""
    # Counted, however small the corpus.
    ranking = proofs(everywhere_per_wanted=1)
    for query in ("session gateway", "config token", "gateway config", "retry cache"):
        corpus.search_messages(query, ranking=ranking)
        got, statements = traced_search(corpus, query, ranking=ranking)
        assert got == fts5_order(corpus, query), query
        boundary = on_file(corpus, impact.index_health)["indexed"]
        counted = [s for s in statements if counts_matches(s)]
        assert counted and all(int(n) == boundary for s in counted
                               for n in re.findall(r"rowid > (\d+)", s)), (query, counted)



def test_several_words_in_a_small_index_are_ranked_by_fts5_before_anything_is_counted(
    corpus: SessionDB,
) -> None:
    """In an index of at most ``fts5_index_rows`` rows FTS5 ranks a query of several words at
    once: nothing is counted and the impact index is not read. One row more, and the words
    are counted for the proof."""
    rows = on_file(corpus, bm25.read_stats).rows
    for query in ("session gateway", "config token", "worker session"):
        got, statements = traced_search(corpus, query)  # the default: 25,000 rows
        assert got == fts5_order(corpus, query), query
        read = [s for s in statements if "search_impact" in s or counts_matches(s)]
        assert not read, (query, read)
        got, statements = traced_search(
            corpus, query, ranking=rank.Ranking(fts5_index_rows=rows - 1))
        assert got == fts5_order(corpus, query), query
        assert any(counts_matches(s) for s in statements), query


def test_several_words_few_rows_hold_together_are_ranked_by_fts5_after_one_read(
    corpus: SessionDB,
) -> None:
    """When fewer than ``everywhere_per_wanted`` times the rows wanted are indexed under every
    word of a query, FTS5 ranks it: the impact index is asked that alone, not checked whole
    nor a word counted first. With that many rows, the proof goes on to count the words."""
    for words in (("session", "gateway"), ("config", "token"), ("worker", "session")):
        query = " ".join(words)
        under_all = on_file(corpus, lambda c, w=words: c.execute(
            "SELECT count(*) FROM search_impact_fts WHERE search_impact_fts MATCH ?",
            (" AND ".join(w),)).fetchone()[0])
        assert under_all >= 20, query
        for per_wanted, ranked_by_fts5 in ((under_all // 20 + 1, True), (under_all // 20, False)):
            got, statements = traced_search(
                corpus, query, ranking=proofs(everywhere_per_wanted=per_wanted))
            assert got == fts5_order(corpus, query), query
            asked = [s for s in statements if "search_impact_fts MATCH" in s]
            if ranked_by_fts5:
                assert len(asked) == 1 and "LIMIT" in asked[0], (query, asked)
                assert not any(counts_matches(s) for s in statements), query
            else:
                assert len(asked) > 1 and any(counts_matches(s) for s in statements), query


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: ",".join(f) or "none")
def test_a_word_matching_few_rows_is_ranked_by_fts5_at_once(
    corpus: SessionDB, filters: dict[str, Any]
) -> None:
    """A single word matching at most ``fts5_word_rows`` rows is ranked by FTS5 without a read
    of the impact index; with filters, in one pass over the rows that pass them (no prefix of
    FTS5's order that could fall short). One row more than that, and a proof reads the index."""
    for query in (*COMMON, *MEDIUM):
        matching = on_file(corpus, lambda c, q=query: bm25.count_matches(c, "messages_fts", q))
        got, statements = traced_search(
            corpus, query, ranking=proofs(fts5_word_rows=matching), **filters)
        assert got == fts5_order(corpus, query, **filters), (query, filters)
        assert not [s for s in statements if "search_impact" in s], query
        # One FTS5 ranking: of a prefix of its order, else of the rows that pass the filters.
        ranked = [s for s in statements if "bm25(messages_fts)" in s]
        assert len(ranked) == 1 and ("JOIN" not in ranked[0]) == (not filters), ranked
        got, reads = impact_reads(
            corpus, query, ranking=proofs(fts5_word_rows=matching - 1, exact_rank_rows=40),
            **filters)
        assert got == fts5_order(corpus, query, **filters), (query, filters)
        assert reads, query
    # Any count is a bound: past the rows a store can hold, every single word goes to FTS5.
    got, reads = impact_reads(corpus, "session", ranking=proofs(fts5_word_rows=2**70), **filters)
    assert got == fts5_order(corpus, "session", **filters) and not reads


FEW_PIECES = ["session", "Session", "SESSION", "cafe", "café", "CAFÉ", "a", "b", "w1",
              "gateway", "config", "zebra", "tokyo", "東京", "—", "-", "_", "ﬁ", "ß", "x²",
              "\u0301", "😀", " ", " ", " ", ".", "\n"]
FEW_PHRASES = ['"cafe session"', '"session session"', '"a a"', '"b a b"', '"gateway w1"',
               '"session tokyo"', "zebra session", '"config" "cafe"']


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_queries_matching_few_rows_are_ranked_by_fts5_at_once(db: SessionDB, seed: int) -> None:
    """Phrases and several words matching few rows are ranked by FTS5's bm25() without a read
    of the impact index (FTS5 ranks them faster than a proof): in any script, any case,
    overlapping instances, inside tool-call JSON."""
    r = random.Random(seed)
    db.create_session("s1", "cli")
    rows = []
    for n in range(400):
        text = "".join(r.choice(FEW_PIECES) + r.choice(["", " ", " ", "-"])
                       for _ in range(r.randint(2, 40)))
        if n % 5 == 0:
            rows.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": f"c{n}", "type": "function",
                 "function": {"name": "terminal", "arguments": json.dumps({"q": text})}}]})
        else:
            rows.append({"role": r.choice(("user", "tool")), "content": text,
                         "tool_call_id": f"c{n}", "tool_name": r.choice([None, "Session"])})
    db.replace_messages("s1", rows)
    for query in FEW_PHRASES:
        got, statements = traced_search(db, query, limit=50)
        expected = fts5_order(db, query, 50)
        # Fewer than 50: the CJK index's own rows come after (a word glued to CJK text).
        assert got[: len(expected)] == expected, query
        assert not [s for s in statements if "FROM search_impact_vocab" in s], query


def test_a_phrase_of_several_words_is_ranked_by_fts5_before_anything_is_counted(
    corpus: SessionDB,
) -> None:
    """FTS5 counts a phrase's matches for its idf as it ranks them: counting them first (half
    the work of its ranking) or reading the impact index would only add to it."""
    # No count is small enough to decide.
    ranking = proofs(everywhere_per_wanted=1, exact_rank_rows=0)
    for query in ('"session gateway"', '"gateway config" token'):
        got, statements = traced_search(corpus, query, ranking=ranking)
        assert got == fts5_order(corpus, query), query
        assert not [s for s in statements if "search_impact" in s or counts_matches(s)], query


def test_a_query_matching_fewer_rows_than_a_page_is_not_counted(corpus: SessionDB) -> None:
    """FTS5's ranked prefix, shorter than asked for, holds every match: nothing is left to
    count."""
    for query in ('"w1 w2"', "zebra quasar", '"zebra session"'):
        got, statements = traced_search(corpus, query, limit=50)
        expected = fts5_order(corpus, query, 50)
        assert 0 < len(expected) < 50 and got[:len(expected)] == expected, query
        assert not [s for s in statements if counts_matches(s)], query


def test_several_words_few_rows_index_together_are_ranked_by_fts5_before_any_count(
    corpus: SessionDB,
) -> None:
    """Fewer rows indexed under every word than the ranking asks for: the best rows are
    mostly rows a word's postings leave open, and FTS5 ranks at once, in its own order."""
    ranking = proofs(everywhere_per_wanted=10**6)
    for query in ("session gateway", "config token", "worker session", "retry cache"):
        got, statements = traced_search(corpus, query, ranking=ranking)
        assert got == fts5_order(corpus, query), query
        assert not [s for s in statements if counts_matches(s)], query
        assert not [s for s in statements if "FROM search_impact_vocab" in s], query


def test_a_count_stopped_at_the_limit_goes_on_from_the_last_row_it_read(db: SessionDB) -> None:
    """Each word of a query is counted no further than the limit that would send the query
    to FTS5; a proof then needs its whole count (its idf), and counts on from the last row
    the first count read instead of reading those rows again. The order is FTS5's."""
    db.create_session("s1", "cli")
    for n in range(3 * impact.FLUSH_ROWS):
        text = ("alpha beta", f"alpha w{n} and more words", f"beta w{n} and other words")[n % 3]
        db.append_message("s1", role="user", content=text)
    # A row below the boundary changed: the counts the index keeps no longer hold, and the
    # words are counted from the first row.
    conn = writer(db.db_path)
    conn.execute("UPDATE messages SET content = 'alpha beta again' WHERE id = 1")
    conn.close()
    ranking = proofs(everywhere_per_wanted=1, exact_rank_rows=10)
    got, statements = traced_search(db, "alpha beta", ranking=ranking)
    assert got == fts5_order(db, "alpha beta")
    counted = " ".join(s for s in statements if counts_matches(s))
    boundary = on_file(db, impact.index_health)["indexed"]
    starts = {int(n) for n in re.findall(r"rowid > (\d+)", counted)}
    assert starts - {0, boundary}, counted  # a count that went on from a row of the list


def kept_counts(db_path: Path) -> dict[str, tuple[int, int]]:
    """The word counts the index keeps that hold now, each (upto, rows), checked against
    FTS5's own count of the rows matching the word up to that id."""
    held = {}
    with raw(db_path) as conn:
        changes, counted = conn.execute("SELECT c.changes, s.counted_changes"
                                        " FROM search_row_changes AS c, search_impact_state AS s"
                                        ).fetchone()
        if counted != changes:
            return held
        for term, upto, rows in conn.execute("SELECT term, upto, matching FROM search_word_counts"):
            true = conn.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?"
                                " AND rowid <= ?", (bm25.phrase_match((term,)), upto))
            assert true.fetchone()[0] == rows, term
            held[term] = (upto, rows)
    return held


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_counts_kept_for_common_words_are_fts5s_through_every_change(
    db: SessionDB, db_path: Path, seed: int
) -> None:
    """Batches keep the counts of the words common in them; whatever another client changes
    (an update, a delete, an insert into a gap, a row moved past the boundary, which FTS5
    keeps under its old id), a count that still claims to hold is FTS5's."""
    r = random.Random(seed)
    db.create_session("s1", "cli")
    for n in range(6 * impact.FLUSH_ROWS):
        db.append_message("s1", **_message(r, n))
    assert {"session", "gateway", "config"} <= set(kept_counts(db_path))
    ids_ = [row[0] for row in writer(db_path).execute("SELECT id FROM messages ORDER BY id")]
    low = r.sample(ids_[: len(ids_) // 2], 3)
    for sql, arg in [
        ("UPDATE messages SET content = 'session gateway config zebra' WHERE id = ?", low[0]),
        ("DELETE FROM messages WHERE id = ?", low[1]),
        (("INSERT INTO messages (id, session_id, role, content, timestamp)"
          " VALUES (?, 's1', 'user', 'zebra session gateway config', 0)"), low[1]),
        ("UPDATE messages SET id = (SELECT max(id) + 1 FROM messages) WHERE id = ?", low[2]),
    ]:
        conn = writer(db_path)
        conn.execute(sql, (arg,))
        conn.close()
        assert kept_counts(db_path) == {}, sql  # none holds past a change below the boundary
        for n in range(impact.FLUSH_ROWS + impact.CHECK_EVERY):
            db.append_message("s1", "user", f"session gateway config {n}")
        kept_counts(db_path)
    for _ in range(4 * impact.FLUSH_ROWS):
        db.append_message("s1", "user", "session gateway config")
    assert {"session", "gateway", "config"} <= set(kept_counts(db_path))
    assert counts(db) == true_counts(db_path)


def test_no_word_count_is_kept_while_the_full_text_index_is_rebuilt(
    db: SessionDB, db_path: Path
) -> None:
    """A rebuilding FTS5 index lacks rows a new count would walk: no batch keeps counts until
    it is whole again, and those kept then are FTS5's."""
    db.create_session("s1", "cli")
    for n in range(2 * impact.FLUSH_ROWS):
        db.append_message("s1", "user", f"session gateway {n}")
    assert {"session", "gateway"} <= set(kept_counts(db_path))
    with raw(db_path, write=True) as rebuilder, dbconn.transaction(rebuilder):
        assert fts.start_rebuild(rebuilder) == 2 * impact.FLUSH_ROWS
    for n in range(impact.FLUSH_ROWS + impact.CHECK_EVERY):
        db.append_message("s1", "user", f"session gateway config {n}")
    assert kept_counts(db_path) == {}
    db.close()
    with SessionDB(db_path) as reopened:  # finishes the rebuild
        reopened.wait_for_index(30)
        assert reopened.fts_status()["rebuild_high_water"] is None
        for n in range(2 * impact.FLUSH_ROWS):
            reopened.append_message("s1", "user", f"session gateway config again {n}")
    assert {"session", "gateway", "config"} <= set(kept_counts(db_path))


def test_a_first_search_counts_common_words_only_past_the_count_the_index_keeps(
    db: SessionDB,
) -> None:
    """A process that never searched the file counts a common word only in the rows past the
    count the index keeps of it, which ends at a recent batch's boundary."""
    db.create_session("s1", "cli")
    for n in range(3 * impact.FLUSH_ROWS):
        text = ("alpha beta", f"alpha w{n} and more words", f"beta w{n} and other words")[n % 3]
        db.append_message("s1", role="user", content=text)
    ranking = proofs(everywhere_per_wanted=1, exact_rank_rows=10)
    got, statements = traced_search(db, "alpha beta", ranking=ranking)
    assert got == fts5_order(db, "alpha beta")
    counted = " ".join(s for s in statements if counts_matches(s))
    kept = {upto for upto, _ in kept_counts(db.db_path).values()}
    assert counted and {int(n) for n in re.findall(r"rowid > (\d+)", counted)} <= kept


def test_the_count_of_postings_left_leaves_out_those_already_read(db_path: Path) -> None:
    """A word's cursor, part-way through the rows of one posting token (rows of one length
    holding the word once share it), counts only the postings it has not handed out yet."""
    with SessionDB(db_path) as db:
        db.create_session("s1", "cli")
        for n in range(4 * impact.FLUSH_ROWS):
            db.append_message("s1", role="user", content=f"alpha w{n}")
    conn = sqlite3.connect(db_path)
    try:
        (posted,) = conn.execute(
            "SELECT count(*) FROM search_impact_vocab WHERE term >= 'alpha_' AND term < 'alpha`'"
        ).fetchone()
        tokens = {t for (t,) in conn.execute(
            "SELECT term FROM search_impact_vocab WHERE term >= 'alpha_' AND term < 'alpha`'")}
        assert len(tokens) == 1 and posted > rank.RANKING.first_batch_postings  # one token
        cursor = rank.Postings(conn, "alpha", rank.RANKING)
        read = 0
        while cursor.next is not None:
            assert cursor.left(impact.THRESHOLD) == posted - read
            # Counted no further than one past a limit the rest exceeds.
            assert cursor.left(impact.THRESHOLD, 5) == min(posted - read, 6)
            assert cursor.left(cursor.bound() + 0.001) == 0  # none reach past the next one
            read += len(cursor.take())
        assert read == posted and cursor.left(impact.THRESHOLD) == 0
        cursor.close()
    finally:
        conn.close()


def _tie_across_the_page(
    db: SessionDB, rows: int, holding: int, lead: tuple[str, ...] = ("kiwi",)
) -> tuple[int, int]:
    """A store of ``rows`` messages averaging exactly 18 tokens, ``holding`` of them with the
    word kiwi: the ``lead`` rows, then x ("kiwi") and y ("kiwi kiwi" and six words), which
    score a hair apart before the idf and alike after it (so FTS5 puts x, the older, first),
    then others lower. Returns the ids of the first lead row and of y."""
    db.create_session("s1", "cli")
    x = db.append_message("s1", role="user", content=lead[0])
    for text in lead[1:]:
        db.append_message("s1", role="user", content=text)
    y = db.append_message("s1", role="user", content="kiwi kiwi a b c d e f")
    tokens = sum(len(text.split()) for text in lead) + 8
    for _ in range(holding - len(lead) - 1):
        db.append_message("s1", role="user", content="kiwi " + " ".join(f"w{i}" for i in range(39)))
        tokens += 40
    rest = rows - holding
    size, longer = divmod(18 * rows - tokens, rest)
    for n in range(rest):
        words = size + (n < longer)
        db.append_message("s1", role="user", content=" ".join(f"p{i}" for i in range(words)))
    return x, y


@pytest.mark.parametrize("lead", [("kiwi",), ("kiwi", "kiwi")], ids=["one", "two-alike"])
@pytest.mark.parametrize("rows, holding", [(20, 4), (impact.FLUSH_ROWS + 2, 5)])
def test_rows_that_tie_once_the_idf_is_applied_page_as_fts5_orders_them(
    db_path: Path, rows: int, holding: int, lead: tuple[str, ...]
) -> None:
    """Scored from their text (20 rows) or from their postings (the first batch indexed),
    the rows' order at the edge of a page is FTS5's, and pages are slices of it: with one
    row a hair below y, and with two rows alike a hair below it (the second, left out at a
    tie with the first, belongs before y)."""
    with SessionDB(db_path) as db:
        x, y = _tie_across_the_page(db, rows, holding, lead)
        fts5 = on_file(db, lambda c: c.execute(
            "SELECT rowid, bm25(messages_fts) FROM messages_fts WHERE messages_fts MATCH 'kiwi'"
            " ORDER BY bm25(messages_fts), rowid").fetchall())
        assert fts5[0] == (x, fts5[1][1]) and y in [r for r, b in fts5 if b == fts5[0][1]]
        expected = [row_id for row_id, _ in fts5]
        for limit in range(1, holding + 1):
            hits = db.search_messages("kiwi", limit=limit, ranking=PROOFS)
            assert [h["id"] for h in hits] == expected[:limit]
        pages = [h["id"] for offset in range(holding)
                 for h in db.search_messages("kiwi", limit=1, offset=offset, ranking=PROOFS)]
        assert pages == expected


def test_a_word_repeated_in_the_query_ranks_as_fts5_adds_it_up(db_path: Path) -> None:
    """``kiwi kiwi kiwi``: FTS5 adds idf·x three times, which differs in its last bits from
    three times x before the idf, so two rows it scores alike keep FTS5's order."""
    with SessionDB(db_path) as db:
        db.create_session("s1", "cli")
        first = db.append_message("s1", role="user", content="kiwi kiwi kiwi kiwi a b")
        second = db.append_message("s1", role="user", content="kiwi kiwi kiwi c")
        db.append_message("s1", role="user", content="kiwi " + " ".join(f"w{i}" for i in range(9)))
        for n in range(7):
            db.append_message("s1", role="user", content=" ".join("pqrstu"[: 6 if n < 5 else 5]))
        query = "kiwi kiwi kiwi"
        fts5 = on_file(db, lambda c: c.execute(
            "SELECT rowid, bm25(messages_fts) FROM messages_fts WHERE messages_fts MATCH ?"
            " ORDER BY bm25(messages_fts), rowid", (query,)).fetchall())
        assert [r for r, _ in fts5[:2]] == [first, second] and fts5[0][1] == fts5[1][1]
        expected = [r for r, _ in fts5]
        for limit in range(1, len(expected) + 1):
            assert [h["id"] for h in db.search_messages(query, limit=limit)] == expected[:limit]
