"""FTS5's own computations reproduced: the library's tokens are unicode61's, whatever the
characters, and its BM25 score is this SQLite's ``bm25()`` bit for bit."""

from __future__ import annotations

import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

import hermes_state_bm25 as bm25
import hermes_state_impact as impact
from state_helpers import TRICKY

bm25_docs = st.lists(
    st.tuples(*[st.lists(st.sampled_from(["alpha", "beta", "Gamma", "delta", "café",
                                          "東京", "x²", "beta-gamma", "ALPHA"]),
                         max_size=12).map(" ".join)] * 3),
    min_size=1, max_size=12)
bm25_queries = st.lists(st.sampled_from(["alpha", "beta", "gamma", "cafe", "東京",
                                         "beta gamma"]), min_size=1, max_size=3)


@settings(max_examples=150, deadline=None)
@given(docs=bm25_docs, query=bm25_queries)
def test_the_librarys_bm25_is_this_sqlites_bit_for_bit(
    docs: list[tuple[str, str, str]], query: list[str]
) -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(content, tool_name, tool_calls)")
    conn.executemany("INSERT INTO t VALUES (?, ?, ?)", docs)
    conn.commit()
    stats = bm25.read_stats(conn, "t")
    phrases = [tuple(bm25.column_tokens(q)) for q in query]
    expression = " ".join('"' + " ".join(p) + '"' for p in phrases)
    idfs = [stats.idf(conn.execute("SELECT count(*) FROM t WHERE t MATCH ?",
                                   ('"' + " ".join(p) + '"',)).fetchone()[0]) for p in phrases]
    for rowid, expected in conn.execute("SELECT rowid, bm25(t) FROM t WHERE t MATCH ?",
                                        (expression,)).fetchall():
        columns = [bm25.column_tokens(c) for c in docs[rowid - 1]]
        frequencies = [bm25.phrase_frequency(columns, p) for p in phrases]
        score = bm25.bm25_score(idfs, frequencies, sum(map(len, columns)), stats.avgdl)
        assert -score == expected
    conn.close()


tricky_text = st.lists(st.one_of(st.sampled_from(TRICKY), st.sampled_from(["a", "b", " ", "-"]),
                                 st.characters(blacklist_categories=("Cs",))),
                       max_size=24).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=tricky_text)
def test_the_librarys_tokens_are_fts5s_own(text: str) -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
    conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
    conn.execute("INSERT INTO t (rowid, x) VALUES (1, ?)", (text,))
    theirs = [r[0] for r in conn.execute("SELECT term FROM v ORDER BY offset")]
    conn.close()
    assert bm25.column_tokens(text) == theirs
    postings, length = impact.impact_postings(text, None, None, 256.0)
    assert length == len(theirs)
    assert {p.rsplit("_", 3)[0] for p in postings.split()} <= {t for t in theirs if t.isascii()}
