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


# Blobs another client may store: UTF-8 text, cut and spliced sequences, lone continuation
# bytes, over-long forms, surrogates, runs of continuation bytes past any code point and past
# 32 bits.
blob_pieces = st.one_of(
    st.sampled_from([b"a", b"B", b" ", b"-", b"\x00", b"\x80", b"\xbf", b"\xaa", b"\xc3",
                     b"\xc3\x84", b"\xe6\x9d\xb1", b"\xed\xa0\x80", b"\xc0\x81", b"\xef\xbf\xbf",
                     b"\xf4\x90\x80\x80", b"\xf3\xb0\x80\x80", b"\xfe" + b"\x80" * 7, b"\xff",
                     # past 32 bits the code point wraps, to a separator or to 中
                     b"\xc1\xbf\xbf\x80\x80\x80\x80\x81\x81",
                     b"\xc1\xbf\xbf\x80\x80\x80\x84\xb8\xad"]),
    st.text(max_size=4).map(str.encode), st.binary(max_size=4))
blobs = st.lists(blob_pieces, max_size=16).map(b"".join)


def _as_fts5_bytes(token: str) -> bytes | None:
    """A token of the library as FTS5 writes it (None: it holds a code point past U+10FFFF,
    which stands in for FTS5's own)."""
    return None if "\U00100000" in token else token.encode()


@settings(max_examples=400, deadline=None)
@given(blob=blobs)
def test_a_blob_is_read_as_fts5_reads_it(blob: bytes) -> None:
    conn = sqlite3.connect(":memory:")
    conn.text_factory = bytes
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
    conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
    conn.execute("INSERT INTO t (rowid, x) VALUES (1, ?)", (blob,))
    theirs = [r[0] for r in conn.execute("SELECT term FROM v ORDER BY offset")]
    conn.close()
    ours = bm25.column_tokens(bm25.fts5_text(blob))
    assert len(ours) == len(theirs)
    for mine, their in zip(ours, theirs):
        if (spelled := _as_fts5_bytes(mine)) is not None:
            assert spelled == their
    postings, length = impact.impact_postings(blob, None, None, 256.0)
    assert length == len(theirs)
    posted = {p.rsplit("_", 3)[0].encode() for p in postings.split()}
    assert posted <= {t for t in theirs if t.isascii()}
