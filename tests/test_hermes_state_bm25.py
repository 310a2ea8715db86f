"""FTS5's own computations reproduced: the library's tokens are unicode61's, whatever the
characters, and its BM25 score is this SQLite's ``bm25()`` bit for bit."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter

from conftest import RunPython
from hypothesis import given, settings
from hypothesis import strategies as st
from state_helpers import TRICKY

import hermes_state_bm25 as bm25
import hermes_state_impact as impact

bm25_docs = st.lists(
    st.tuples(*[st.lists(st.sampled_from(["alpha", "beta", "Gamma", "delta", "café",
                                          "東京", "x²", "beta-gamma", "ALPHA"]),
                         max_size=12).map(" ".join)] * 3),
    min_size=1, max_size=12)
bm25_queries = st.lists(st.sampled_from(["alpha", "beta", "gamma", "cafe", "東京"]),
                        min_size=1, max_size=3)


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
        frequencies = [sum(c.count(w) for c in columns for w in p) for p in phrases]
        length = sum(map(len, columns))
        score = bm25.bm25_score(idfs, frequencies, length, stats.avgdl)
        assert -score == expected
        # The same score written in SQL, as SQLite computes it.
        sql = "SELECT " + bm25.bm25_sql([f"{float(f)!r}" for f in frequencies], str(length))
        (in_sql,) = conn.execute(sql, bm25.bm25_sql_params(idfs, stats.avgdl)).fetchone()
        assert in_sql == score
    conn.close()


tricky_text = st.lists(st.one_of(st.sampled_from(TRICKY), st.sampled_from(["a", "b", " ", "-"]),
                                 st.characters(blacklist_categories=("Cs",))),
                       max_size=24).map("".join)


def fts5_tokens(text: str) -> list[str]:
    """The tokens FTS5's unicode61 makes of ``text``, in order."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
        conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        conn.execute("INSERT INTO t (rowid, x) VALUES (1, ?)", (text,))
        return [r[0] for r in conn.execute("SELECT term FROM v ORDER BY offset")]
    finally:
        conn.close()


def assert_postings_exact(text: str, theirs: list[str], avgdl: float = 256.0) -> None:
    """The row's postings are exactly the ASCII terms (of at most MAX_TERM_CHARS) whose
    frequency among FTS5's tokens reaches the least one for the row's length, each keyed by
    its own frequency and that length."""
    postings, length = impact.impact_postings(text, None, None, avgdl)
    assert length == len(theirs)
    least = impact.least_frequency(length, avgdl)
    expected = {(t, f) for t, f in Counter(theirs).items()
                if f >= least and t.isascii() and len(t) <= impact.MAX_TERM_CHARS}
    posted = [p.rsplit("_", 3) for p in postings.split()]
    assert {(t, int(f)) for t, _, f, _ in posted} == expected
    assert len(posted) == len(expected) and all(int(d) == length for *_, d in posted)


@settings(max_examples=300, deadline=None)
@given(text=tricky_text)
def test_the_librarys_tokens_are_fts5s_own(text: str) -> None:
    theirs = fts5_tokens(text)
    assert bm25.column_tokens(text) == theirs
    assert_postings_exact(text, theirs)


# Text of many scripts: letters of scripts without case (Cyrillic and Greek small letters,
# Hebrew, Arabic, Devanagari, Thai, kana, CJK, Hangul) and their neighbours, CJK and Latin
# punctuation, letters with case and diacritics, combining marks, Greek final sigma, astral
# characters, ASCII words.
_RANGES = ((0x0430, 0x044F), (0x03B1, 0x03C9), (0x05D0, 0x05EA), (0x0620, 0x064A),
           (0x0905, 0x0939), (0x0E01, 0x0E30), (0x3041, 0x3096), (0x30A1, 0x30FA),
           (0x4E00, 0x9FFF), (0xAC00, 0xD7A3))
_SCRIPTS = [chr(c) for lo, hi in _RANGES for c in (lo - 1, lo, (lo + hi) // 2, hi, hi + 1)]
_SCRIPTS += list("東京都は日本の首都です。、「」（）・ー〜！？　ㄱ가힣ÄäÉéßΣσςПпж\u0301\u3099ﬁＡａ😀")
scripts_text = st.lists(
    st.one_of(st.sampled_from(_SCRIPTS), st.sampled_from(["a", "Word", " ", "-", "7", "\n"]),
              st.characters(blacklist_categories=("Cs",))),
    min_size=1, max_size=800).map("".join)


@settings(max_examples=60, deadline=None)
@given(text=scripts_text)
def test_text_of_many_scripts_has_fts5s_tokens_and_exact_postings(text: str) -> None:
    theirs = fts5_tokens(text)
    assert bm25.column_tokens(text) == theirs
    # Asked again, its characters are known: those kept as they are are passed over.
    assert bm25.column_tokens(text) == theirs
    assert_postings_exact(text, theirs)
    thrice = "\n".join([text] * 3)  # a long row's repeated words
    assert_postings_exact(thrice, theirs * 3, avgdl=8.0)


@settings(max_examples=30, deadline=None)
@given(texts=st.lists(scripts_text, min_size=1, max_size=6))
def test_characters_learned_for_a_page_of_texts_at_once_give_fts5s_tokens(
    texts: list[str],
) -> None:
    bm25.learn_characters([*texts, None, ""])
    assert [bm25.column_tokens(t) for t in texts] == [fts5_tokens(t) for t in texts]


# A fresh process learns a page at once: CJK letters and others kept as they are, letters
# Python's tables keep but unicode61 folds (final sigma) or separates (U+19B0, a mark before
# Unicode 8), letters with diacritics, punctuation, a letter with case.
_LEARNT_IN_A_FRESH_PROCESS = r"""
import json, sys
import hermes_state_bm25 as bm25
texts = json.loads(sys.argv[1])
bm25.learn_characters(texts)
print(json.dumps([bm25.column_tokens(t) for t in texts]))
"""


def test_a_fresh_process_learns_a_page_of_characters_as_fts5_tokenizes_them(
    run_python: RunPython,
) -> None:
    cjk = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 3_000, 7))
    # The last text: characters one Unicode version Python knows calls punctuation or a
    # symbol and the other does not (unassigned then), unassigned ones, marks, emoji.
    texts = [f"東京{cjk[:200]}ς都 ᦰx ábc", f"{cjk}、。", "Ωmega ЖЖ ß ﬁne ᦰᦱ δς", "plain",
             "a\u0378b a\u058db a😀b a👍b a✅b a\u20b9b a\u0301b a\ufe0fb a\U000e0001b"]
    done = run_python(_LEARNT_IN_A_FRESH_PROCESS, json.dumps(texts))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [fts5_tokens(t) for t in texts]


def test_every_character_python_splits_at_is_a_unicode61_separator() -> None:
    """Tokens are the folded text split at whitespace: no character FTS5 keeps in a token
    is one ``str.split`` splits at."""
    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    assert fts5_tokens(" ".join(f"a{ch}a" for ch in spaces)) == ["a", "a"] * len(spaces)


_OTHER_LETTERS_OF_BOTH_VERSIONS = r"""
import json, sys, unicodedata
import hermes_state_bm25 as bm25
letters = [chr(c) for c in range(0x80, 0x110000) if unicodedata.category(chr(c)) == "Lo"
           and unicodedata.ucd_3_2_0.category(chr(c)) == "Lo"]
text = " ".join(f"a{ch}a" for ch in letters)
print(json.dumps([text, bm25.column_tokens(text)]))
"""


def test_every_other_letter_of_both_unicode_versions_is_one_unicode61_keeps(
    run_python: RunPython,
) -> None:
    """A letter both Unicode versions Python knows (3.2 and its own) call an other letter (Lo)
    is taken as unicode61 keeping it, FTS5 unasked: this SQLite keeps every one of them, and a
    fresh process's tokens of them are FTS5's."""
    done = run_python(_OTHER_LETTERS_OF_BOTH_VERSIONS)
    assert done.returncode == 0, done.stderr
    text, ours = json.loads(done.stdout)
    theirs = fts5_tokens(text)
    assert len(theirs) > 80_000
    assert ours == theirs == [token for token in text.split(" ") if token]


_SEPARATORS_OF_BOTH_VERSIONS = r"""
import json, sys, unicodedata
import hermes_state_bm25 as bm25
def separates(cat):
    return cat[0] in "PSZ" or cat in ("Cc", "Cf")
marks = [chr(c) for c in range(0x80, 0x110000) if separates(unicodedata.category(chr(c)))
         and separates(unicodedata.ucd_3_2_0.category(chr(c)))]
text = " ".join(f"a{ch}b" for ch in marks)
print(json.dumps([text, bm25.column_tokens(text)]))
"""


def test_every_separator_of_both_unicode_versions_is_one_unicode61_separates_at(
    run_python: RunPython,
) -> None:
    """A character both Unicode versions Python knows call punctuation, a symbol, a space, or a
    control or format character (``—``, ``…``, ``€``, ``©``, a zero-width space) is taken as
    unicode61 separating tokens there, FTS5 unasked: this SQLite separates at every one of
    them, and a fresh process's tokens of them are FTS5's."""
    done = run_python(_SEPARATORS_OF_BOTH_VERSIONS)
    assert done.returncode == 0, done.stderr
    text, ours = json.loads(done.stdout)
    theirs = fts5_tokens(text)
    assert len(theirs) > 2 * 3_000
    assert ours == theirs == ["a", "b"] * (len(theirs) // 2)


def test_changes_that_make_changed_characters_are_made_one_code_point_at_a_time() -> None:
    assert bm25.with_changes("ÄÖÄ", {"Ä": "Ö", "Ö": "o"}) == "ÖoÖ"
    assert bm25.with_changes("ÄÖÄ", {"Ä": "a", "Ö": ""}) == "aa"


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


phrase_columns = st.lists(
    st.lists(st.tuples(st.sampled_from(["session", "Session", "SESSION", "cafe", "café", "CAFÉ",
                                        "a", "b", "w1", "東京", "—", "-", "_", "ﬁ", "ß",
                                        "x²", "\u0301", "😀", ".", "\n"]),
                       st.sampled_from(["", " ", " ", "-"])).map("".join),
             max_size=30).map("".join),
    min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(columns=phrase_columns, word=st.sampled_from(["cafe", "session", "a", "b", "w1", "x"]))
def test_a_word_counted_in_folded_text_is_counted_as_in_fts5s_tokens(
    columns: list[str], word: str
) -> None:
    """A row's frequency of a word read from its columns' folded text (a pattern over the
    text) is the one its tokens give: in any script, any case."""
    folded = [bm25.folded_text(c) for c in columns if c]
    tokens = [bm25.column_tokens(c) for c in columns]
    assert bm25.text_frequency(folded, word) == sum(t.count(word) for t in tokens)
