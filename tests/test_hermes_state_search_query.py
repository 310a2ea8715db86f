"""Query sanitizing, search planning and snippets, checked against real FTS5 tables."""

from __future__ import annotations

import itertools
import re
import sqlite3
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import hermes_state_bm25 as bm25
import hermes_state_schema_sql
from hermes_state_fts import cjk_index_text
from hermes_state_search import (
    MAX_INPUT_CHARS,
    MAX_QUERY_CHARS,
    MAX_QUERY_TERMS,
    SearchPlan,
    make_snippet,
    plan_search,
    sanitize_fts5_query,
    snippet_pattern,
)

FTS_TABLES = ("messages_fts", "messages_fts_trigram", "messages_fts_cjk")
OPERATORS = ("AND", "OR", "NOT")

# ---------------------------------------------------------------------------------------------
# Real in-memory indexes built with the production DDL
# ---------------------------------------------------------------------------------------------


def new_db() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.executescript(hermes_state_schema_sql.TABLES_SQL + hermes_state_schema_sql.FTS_SQL)
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s1', 'cli', 0)")
    return conn


def add(conn: sqlite3.Connection, content: str, role: str = "user") -> int:
    cur = conn.execute(
        "INSERT INTO messages (session_id, role, content, timestamp, search_cjk) "
        "VALUES ('s1', ?, ?, 0, ?)",
        (role, content, cjk_index_text(content, None, None)),
    )
    assert cur.lastrowid is not None
    return cur.lastrowid


def rebuild(conn: sqlite3.Connection) -> None:
    for table in FTS_TABLES:
        conn.execute(f"INSERT INTO {table}({table}) VALUES('rebuild')")


def db_with(*contents: str) -> tuple[sqlite3.Connection, list[int]]:
    conn = new_db()
    ids = [add(conn, c) for c in contents]
    rebuild(conn)
    return conn, ids


def match(conn: sqlite3.Connection, table: str, expr: str) -> set[int]:
    sql = f"SELECT rowid FROM {table} WHERE {table} MATCH ?"
    return {row[0] for row in conn.execute(sql, (expr,))}


def index_hits(conn: sqlite3.Connection, plan: SearchPlan) -> set[int]:
    """What a search on the healthy indexes returns: both routes, merged by rowid."""
    hits: set[int] = set()
    if plan.fts_match is not None:
        hits |= match(conn, "messages_fts", plan.fts_match)
    if plan.cjk_match is not None:
        hits |= match(conn, "messages_fts_cjk", plan.cjk_match)
    return hits


def like_hits(conn: sqlite3.Connection, plan: SearchPlan) -> set[int]:
    sql, params = plan.like_where("content")
    return {row[0] for row in conn.execute(f"SELECT id FROM messages WHERE {sql}", params)}


def trigram_hits(conn: sqlite3.Connection, plan: SearchPlan) -> set[int]:
    hits: set[int] = set()
    for group in plan.like_groups:
        assert group.index_patterns, "only groups with index patterns go to the trigram index"
        sql, params = group.where("content", trigram=True)
        rows = conn.execute(f"SELECT rowid FROM messages_fts_trigram WHERE {sql}", params)
        hits |= {row[0] for row in rows}
    return hits


def search(conn: sqlite3.Connection, query: str) -> set[int]:
    plan = plan_search(query)
    return set() if plan is None else index_hits(conn, plan)


CORPUS = [
    "hello world, it's a chat-send test",
    "gateway/run.py failed: TODO fix wrong-book 50% off",
    "東京都に住んでいます。東京タワーを見た",
    "京都の寺",
    "日本語の文章とPython入門",
    "한국어 텍스트 검색",
    "我们在北京学习中文",
    "snake_case and 50% off",
    "emoji 😀 party",
]


@pytest.fixture(scope="module")
def corpus() -> Iterator[sqlite3.Connection]:
    conn, _ = db_with(*CORPUS)
    yield conn
    conn.close()


def assert_plan_runs(conn: sqlite3.Connection, query: object) -> None:
    """Every expression derived from ``query`` is accepted by the index it is meant for."""
    match(conn, "messages_fts", sanitize_fts5_query(query) or "x")
    plan = plan_search(query)
    if plan is None:
        assert sanitize_fts5_query(query) == ""
        return
    assert plan.query == sanitize_fts5_query(query)
    assert plan.fts_match is not None or plan.cjk_match is not None
    index_hits(conn, plan)
    like_hits(conn, plan)
    for group in plan.like_groups:
        if group.index_patterns:
            sql, params = group.where("content", trigram=True)
            conn.execute(f"SELECT rowid FROM messages_fts_trigram WHERE {sql}", params).fetchall()


# ---------------------------------------------------------------------------------------------
# Any text gives a valid query
# ---------------------------------------------------------------------------------------------

CJK_ALPHABET = list(
    "東京都に住んでいます京都寺日本語文章入門" "한국어텍스트검색" "我们在北京学习中文ー々"
)
OPERATOR_ALPHABET = list('"*^:(){}[]+,;~-.\'/\\%_@#!?&|<>=`$ \t\n\x00') + [
    "AND", "OR", "NOT", "NEAR", "and", "col:", "a", "b", "東京", "😀", "\ud800",
]
cjk_text = st.lists(st.sampled_from(CJK_ALPHABET + list("ab -\"*")), max_size=20).map("".join)
operator_text = st.lists(st.sampled_from(OPERATOR_ALPHABET), max_size=20).map("".join)
queries = st.one_of(st.text(), cjk_text, operator_text)

PROPERTY = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@PROPERTY
@given(queries)
def test_every_derived_expression_is_accepted_by_real_fts5(corpus: sqlite3.Connection,
                                                           query: str) -> None:
    assert_plan_runs(corpus, query)


@PROPERTY
@given(queries)
def test_sanitized_query_respects_the_caps(corpus: sqlite3.Connection, query: str) -> None:
    sanitized = sanitize_fts5_query(query)
    assert len(sanitized) <= MAX_QUERY_CHARS
    assert sanitized.count('"') % 2 == 0
    assert "\x00" not in sanitized
    sanitized.encode("utf-8")  # no lone surrogates


latin_word = st.text(
    alphabet=st.characters(categories=("Lu", "Ll", "Nd"), max_codepoint=0x2FF),
    min_size=1, max_size=300,
).filter(lambda word: word not in OPERATORS)  # an operator alone is dropped
any_word = st.one_of(
    latin_word,
    st.text(alphabet=st.characters(categories=("Lu", "Ll", "Lo", "Nd"), max_codepoint=0x2FFF),
            min_size=1, max_size=20),
    st.lists(st.sampled_from(CJK_ALPHABET), min_size=1, max_size=8).map("".join),
).filter(lambda word: word not in OPERATORS)


@settings(max_examples=100, deadline=None)
@given(latin_word)
def test_a_plain_word_is_found_by_its_sanitized_query(word: str) -> None:
    conn, ids = db_with(f"before {word} after", "unrelated text")
    assert ids[0] in match(conn, "messages_fts", sanitize_fts5_query(word))


_TOKENIZER = sqlite3.connect(":memory:")
_TOKENIZER.executescript(
    "CREATE VIRTUAL TABLE t USING fts5(x);"
    "CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance');"
)


def unicode61_keeps_whole(word: str) -> bool:
    """True when this SQLite's unicode61 reads ``word`` as one token: its character tables
    follow an older Unicode version than Python's, so a few letters to Python are separators
    to SQLite (U+19B0 was a mark before Unicode 8)."""
    with _TOKENIZER:
        _TOKENIZER.execute("DELETE FROM t")
        _TOKENIZER.execute("INSERT INTO t VALUES (?)", (word,))
        return len(_TOKENIZER.execute("SELECT term FROM v").fetchall()) == 1


@settings(max_examples=100, deadline=None)
@given(any_word.filter(unicode61_keeps_whole))
def test_a_word_in_any_script_is_found_through_its_plan(word: str) -> None:
    conn, ids = db_with(f"前の文 {word} 後の文", "zzz")
    plan = plan_search(word)
    assert plan is not None
    assert ids[0] in index_hits(conn, plan)
    assert ids[0] in like_hits(conn, plan)


# ---------------------------------------------------------------------------------------------
# The hostile corpus and the documented rewrites
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("chat-send", '"chat-send"'),
        ("hello AND", "hello"),
        ("OR foo", "foo"),
        ("NOT foo", "foo"),
        ("a AND OR b", "a OR b"),
        ("a AND NOT b", "a NOT b"),
        ("a OR", "a"),
        ("AND OR NOT", ""),
        ("and or not", "and or not"),
        ("it's", '"it\'s"'),
        ("gateway/run.py", '"gateway/run.py"'),
        ("TODO: fix", "TODO fix"),
        ("wrong-book", '"wrong-book"'),
        ("50%", "50"),
        ('"unbalanced', "unbalanced"),
        ('a"b"c', 'a "b" c'),
        ('"hello world" x', '"hello world" x'),
        ("***", ""),
        ("NEAR(a b)", '"NEAR(a" b'),
        ("col:term", '"col term"'),
        ("error:timeout", '"error timeout"'),
        ("{a b}:c", 'a "b} c"'),
        ("^start", "start"),
        ("-neg", "neg"),
        ("foo* +bar", "foo* bar"),
        ("deploy*", "deploy*"),
        ("deploy***", "deploy*"),
        ("*deploy", "deploy"),
        ("gateway/run*", '"gateway/run" *'),
        ("-AND", '"AND"'),
        ("snake_case", '"snake_case"'),
        ('""', ""),
        ("   \t\n ", ""),
        ("\x00", ""),
        ("a\x00b", "a b"),
        ("\ud800", ""),
        ("x\ud800y", "xy"),
        ("😀 party", "party"),
        ("😀", ""),
        ("東京 python", "東京 python"),
        (None, ""),
        (b"caf\xc3\xa9", "café"),
        (42, "42"),
    ],
)
def test_hostile_queries_are_rewritten_as_documented(
    corpus: sqlite3.Connection, query: object, expected: str
) -> None:
    assert sanitize_fts5_query(query) == expected
    assert_plan_runs(corpus, query)


def test_hostile_queries_still_find_what_they_name(corpus: sqlite3.Connection) -> None:
    rows = {text: i + 1 for i, text in enumerate(CORPUS)}
    assert search(corpus, "it's") == {rows[CORPUS[0]]}
    assert search(corpus, "chat-send") == {rows[CORPUS[0]]}
    assert search(corpus, "gateway/run.py") == {rows[CORPUS[1]]}
    assert search(corpus, "TODO: fix") == {rows[CORPUS[1]]}
    # Words joined by a colon are a phrase, as FTS5 would read them quoted.
    assert search(corpus, "failed:TODO") == {rows[CORPUS[1]]}
    assert search(corpus, "world:chat") == set()
    assert search(corpus, "wrong-book") == {rows[CORPUS[1]]}
    assert search(corpus, "^party*") == {rows[CORPUS[8]]}
    assert plan_search("***") is None
    assert plan_search("AND") is None


def test_many_words_are_capped_at_whole_terms() -> None:
    query = " ".join(f"word{i}" for i in range(100))
    sanitized = sanitize_fts5_query(query)
    assert sanitized.split() == [f"word{i}" for i in range(MAX_QUERY_TERMS)]
    long_words = " ".join(f'"{"x" * 50} {i}"' for i in range(20))
    sanitized = sanitize_fts5_query(long_words)
    assert len(sanitized) <= MAX_QUERY_CHARS
    assert re.fullmatch(r'("x{50} \d+" ?)+', sanitized)


def test_a_term_longer_than_the_cap_is_cut_into_a_prefix_that_still_matches() -> None:
    phrase = " ".join(f"token{i}" for i in range(MAX_INPUT_CHARS // 6))
    compound = phrase.replace(" ", "-")
    conn, ids = db_with(f"intro {phrase} outro", f"intro {compound} outro", "token1 token2")
    sanitized = sanitize_fts5_query(compound)
    assert len(sanitized) <= MAX_QUERY_CHARS and sanitized.endswith('" *')
    assert sanitize_fts5_query("z" * (MAX_INPUT_CHARS + 10)) == "z" * MAX_INPUT_CHARS
    assert match(conn, "messages_fts", sanitize_fts5_query(compound)) == {ids[0], ids[1]}
    plan = plan_search(compound)
    assert plan is not None and like_hits(conn, plan) == {ids[1]}
    # Past the input cap a quoted phrase loses its closing quote: its words are searched.
    assert sanitize_fts5_query(f'"{phrase}"').split() == [
        f"token{i}" for i in range(MAX_QUERY_TERMS)]


def test_a_very_long_hostile_string_is_handled_quickly(corpus: sqlite3.Connection) -> None:
    query = ('a"b NEAR( *:^ \ud800 \x00 東京 ' * 20000) + '"'
    sanitized = sanitize_fts5_query(query)
    assert 0 < len(sanitized) <= MAX_QUERY_CHARS
    assert_plan_runs(corpus, query)
    assert sanitize_fts5_query("*" * MAX_INPUT_CHARS + " word") == ""
    assert sanitize_fts5_query("*" * (MAX_INPUT_CHARS - 5) + " word") == "word"


# ---------------------------------------------------------------------------------------------
# Boolean operators mean what FTS5 says, on every route
# ---------------------------------------------------------------------------------------------

VOCAB = ["alpha", "bravo", "charlie", "delta"]


@pytest.fixture(scope="module")
def vocab_db() -> Iterator[sqlite3.Connection]:
    docs = [
        " ".join(words)
        for n in range(1, len(VOCAB) + 1)
        for words in itertools.combinations(VOCAB, n)
    ]
    conn, _ = db_with(*docs)
    yield conn
    conn.close()


boolean_query = st.lists(
    st.sampled_from(VOCAB + ["AND", "OR", "NOT", "and", "(", ")", "-", "*"]), max_size=9
).map(" ".join)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(boolean_query)
def test_like_fallback_and_trigram_agree_with_fts5_on_boolean_queries(
    vocab_db: sqlite3.Connection, query: str
) -> None:
    plan = plan_search(query)
    if plan is None:
        return
    assert plan.cjk_match is None and plan.fts_match == plan.query
    expected = match(vocab_db, "messages_fts", plan.fts_match)
    assert like_hits(vocab_db, plan) == expected
    if all(group.index_patterns for group in plan.like_groups):
        assert trigram_hits(vocab_db, plan) == expected


@pytest.mark.parametrize(
    ("query", "must_have", "must_lack"),
    [
        ("alpha NOT bravo charlie", {"alpha bravo"}, {"alpha bravo charlie"}),
        ("alpha bravo OR charlie", {"charlie"}, {"alpha"}),
        ("alpha AND bravo NOT charlie", {"alpha bravo"}, {"alpha bravo charlie"}),
    ],
)
def test_implicit_and_binds_tighter_than_not(
    vocab_db: sqlite3.Connection, query: str, must_have: set[str], must_lack: set[str]
) -> None:
    plan = plan_search(query)
    assert plan is not None
    rows = dict(vocab_db.execute("SELECT content, id FROM messages"))
    hits = like_hits(vocab_db, plan)
    assert hits == match(vocab_db, "messages_fts", plan.query)
    assert {rows[c] for c in must_have} <= hits
    assert not {rows[c] for c in must_lack} & hits


# ---------------------------------------------------------------------------------------------
# CJK through messages_fts_cjk
# ---------------------------------------------------------------------------------------------

CJK_DOCS = {
    "ja": "東京都に住んでいます",
    "zh": "我们在北京学习中文",
    "ko": "한국어 텍스트 검색",
    "single": "abc京def",
    "mixed": "Python入門の本",
    "latin": "python without any cjk",
    "other": "大阪府の天気",
}


@pytest.fixture(scope="module")
def cjk_db() -> Iterator[tuple[sqlite3.Connection, dict[str, int]]]:
    conn, ids = db_with(*CJK_DOCS.values())
    yield conn, dict(zip(CJK_DOCS, ids, strict=True))
    conn.close()


@pytest.mark.parametrize(
    ("query", "doc"),
    [
        ("東", "ja"), ("す", "ja"), ("東京", "ja"), ("京都", "ja"), ("東京都", "ja"),
        ("住んでいます", "ja"), ("でいます", "ja"),
        ("北", "zh"), ("文", "zh"), ("北京", "zh"), ("学习中", "zh"), ("我们在北京学习中文", "zh"),
        ("검", "ko"), ("색", "ko"), ("한국", "ko"), ("텍스트", "ko"), ("한국어 검색", "ko"),
        ("京", "single"), ("abc京def", "single"), ("abc 京", "single"),
        ("入", "mixed"), ("Python入門", "mixed"), ("python 入門", "mixed"), ("門の本", "mixed"),
    ],
)
def test_cjk_queries_of_every_length_find_their_message(
    cjk_db: tuple[sqlite3.Connection, dict[str, int]], query: str, doc: str
) -> None:
    conn, ids = cjk_db
    plan = plan_search(query)
    assert plan is not None and plan.cjk_match is not None and plan.fts_match is None
    hits = match(conn, "messages_fts_cjk", plan.cjk_match)
    assert ids[doc] in hits
    for other, text in CJK_DOCS.items():
        assert (ids[other] in hits) == _words_in(query, text), other
    assert like_hits(conn, plan) == {i for k, i in ids.items() if _words_in(query, CJK_DOCS[k])}


def _words_in(query: str, text: str) -> bool:
    return all(w.lower() in text.lower() for w in query.split())


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("京", '"京" *'),
        ("東京", '"東京"'),
        ("東京都", '"東京 京都"'),
        ("住んでいます", '"住ん んで でい いま ます"'),
        ("東京b", '"東京 京 b"'),
        ("a入", '"a 入" *'),
        ("東京 python", '"東京" python'),
        ("東京 NOT 大阪", '"東京" NOT "大阪"'),
    ],
)
def test_cjk_runs_are_spelled_as_the_index_spells_them(query: str, expected: str) -> None:
    plan = plan_search(query)
    assert plan is not None and plan.cjk_match == expected


def test_cjk_text_that_is_not_a_substring_is_not_found(
    cjk_db: tuple[sqlite3.Connection, dict[str, int]]
) -> None:
    conn, _ = cjk_db
    for query in ("東都", "京b", "北学", "都に住み", "國"):
        assert search(conn, query) == set(), query


def test_mixed_cjk_and_latin_finds_only_messages_with_both() -> None:
    conn, ids = db_with("東京 python guide", "東京 only", "python only", "大阪 python")
    assert search(conn, "東京 python") == {ids[0]}
    assert search(conn, "python 東京") == {ids[0]}
    assert search(conn, '"東京 python"') == {ids[0]}
    assert search(conn, "東京 NOT python") == {ids[1]}
    assert search(conn, "東 OR 大") == {ids[0], ids[1], ids[3]}


def test_an_or_without_cjk_is_served_by_messages_fts() -> None:
    conn, ids = db_with("東京 tower", "python only", "nothing here")
    plan = plan_search("東京 OR python")
    assert plan is not None
    assert (plan.fts_match, plan.cjk_match) == ("python", '"東京"')
    assert index_hits(conn, plan) == like_hits(conn, plan) == {ids[0], ids[1]}


# ---------------------------------------------------------------------------------------------
# LIKE routes: literal wildcards, and the trigram index really used
# ---------------------------------------------------------------------------------------------


def test_like_wildcards_in_the_query_are_literal() -> None:
    conn, ids = db_with("50% off", "500 off", "snake_case", "snakeXcase", r"a\b")
    for query, expected in (('"50%"', {ids[0]}), ("snake_case", {ids[2]}), (r'"a\b"', {ids[4]})):
        plan = plan_search(query)
        assert plan is not None
        assert like_hits(conn, plan) == expected, query


def test_trigram_route_uses_the_index_without_escape_and_filters_exactly() -> None:
    conn, ids = db_with("hello world 50% off", "hello world 500 off", "concatenate")
    add(conn, "hello world 50% off", role="tool")  # tool output is not in the trigram index
    rebuild(conn)
    plan = plan_search('"world 50%"')
    assert plan is not None
    (group,) = plan.like_groups
    assert group.index_patterns == ("%world 50%",)
    sql, params = group.where("content", trigram=True)
    detail = conn.execute(
        f"EXPLAIN QUERY PLAN SELECT rowid FROM messages_fts_trigram WHERE {sql}", params
    ).fetchall()[0][-1]
    assert re.search(r"INDEX \d+:L", detail), detail
    assert trigram_hits(conn, plan) == {ids[0]}
    substring = plan_search("concat")
    assert substring is not None and trigram_hits(conn, substring) == {ids[2]}


def test_short_literals_never_reach_the_trigram_index() -> None:
    for query in ("東京", "ab", "a_b%c", "50%"):
        plan = plan_search(query)
        assert plan is not None
        assert not any(g.index_patterns for g in plan.like_groups), query


# ---------------------------------------------------------------------------------------------
# Snippets
# ---------------------------------------------------------------------------------------------


def unmark(snippet: str) -> str:
    return snippet.replace(">>>", "").replace("<<<", "").removeprefix("...").removesuffix("...")


def test_snippet_is_centred_on_the_first_match_and_marks_it() -> None:
    text = "a" * 300 + " needle " + "b" * 300
    snippet = make_snippet(text, ["needle"], width=60)
    assert snippet.startswith("...") and snippet.endswith("...")
    assert ">>>needle<<<" in snippet
    before, after = unmark(snippet).split("needle")
    assert abs(len(before) - len(after)) <= 1
    assert len(unmark(snippet)) == 60


def test_snippet_marks_every_occurrence_in_the_window_case_insensitively() -> None:
    text = "x " * 100 + "Foo bar foo baz FOO " + "y " * 100
    snippet = make_snippet(text, ["foo"], width=40)
    assert snippet.count(">>>") == 3
    assert ">>>Foo<<<" in snippet and ">>>FOO<<<" in snippet


def test_short_text_is_unchanged_but_marked() -> None:
    assert make_snippet("hello world", ["world"]) == "hello >>>world<<<"
    assert make_snippet("hello world", ["nothing"]) == "hello world"
    assert make_snippet("hello world", []) == "hello world"
    assert make_snippet("", ["x"]) == ""


def test_without_a_match_the_snippet_is_the_start_of_the_text() -> None:
    assert make_snippet("abcdef" * 50, ["zzz"], width=10) == "abcdefabcd..."


def test_snippet_of_cjk_text_is_centred_on_the_cjk_needle() -> None:
    text = "前置きの文章です。" * 20 + "東京タワーに行きました。" + "後書きの文章です。" * 20
    plan = plan_search("東京 タワー")
    assert plan is not None
    snippet = make_snippet(text, list(plan.needles), width=30)
    assert ">>>東京<<<>>>タワー<<<" in snippet
    assert snippet.startswith("...") and snippet.endswith("...")
    assert make_snippet(text, ["東京タワー", "東京"], width=30).count(">>>東京タワー<<<") == 1


def test_snippet_matches_a_phrase_across_other_punctuation() -> None:
    snippet = make_snippet("see gateway-run.py now", ["gateway/run.py"])
    assert snippet == "see >>>gateway-run.py<<< now"
    assert make_snippet("Hello,   World!", ["hello world"]) == ">>>Hello,   World<<<!"


def test_a_match_longer_than_the_window_is_cut_but_marked() -> None:
    snippet = make_snippet("intro " + "long" * 50 + " outro", ["long" * 50], width=20)
    assert snippet == "...>>>" + ("long" * 5) + "<<<..."


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet="abc 東京 -", max_size=300),
    st.lists(st.text(alphabet="abc東京-", min_size=1, max_size=4), max_size=3),
    st.integers(min_value=1, max_value=80),
)
def test_snippet_is_always_a_window_of_the_text(text: str, needles: list[str], width: int) -> None:
    snippet = make_snippet(text, needles, width=width)
    window = unmark(snippet)
    assert window in text
    assert len(window) == min(width, len(text))
    assert snippet.startswith("...") or text.startswith(window)
    assert snippet.endswith("...") or text.endswith(window)
    assert snippet.count(">>>") == snippet.count("<<<")
    if any(n.lower() in text.lower() for n in needles):
        assert ">>>" in snippet


# Letters that fold onto ASCII ones under re.IGNORECASE (Kelvin sign, long s, dotted and
# dotless i), CJK, punctuation: the marker's scan, needle by needle with word boundaries told
# by the characters around a match, must find what its one regular expression finds.
_MARKER_CHARS = "abKk\u212a\u017fs\u0130\u0131i 東京-_.*\""


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet=_MARKER_CHARS, min_size=1, max_size=30),
    st.text(alphabet=_MARKER_CHARS, max_size=200),
    st.booleans(),
)
def test_a_snippet_marker_finds_exactly_what_its_pattern_finds(
    query: str, text: str, words: bool
) -> None:
    plan = plan_search(query)
    marker = snippet_pattern(plan, words=words) if plan is not None else None
    if marker is None:
        return
    for sample in (text, text.encode("ascii", "ignore").decode()):
        assert list(marker.finditer(sample)) == [
            m.span() for m in marker.pattern.finditer(sample)]


def test_a_snippet_marker_finds_a_word_after_many_near_misses() -> None:
    plan = plan_search("left")
    assert plan is not None
    marker = snippet_pattern(plan, words=True)
    assert marker is not None
    text = "lefty cleft LEFTOVER " * 300 + "turn Left now"
    assert [text[start:end] for start, end in marker.spans(text)] == ["Left"]
    assert make_snippet(text, marker, width=9) == "...n >>>Left<<< no..."
    # Matches never overlap: the scan goes on where a match ends, as finditer does.
    phrase_plan = plan_search('"a a"')
    assert phrase_plan is not None
    phrase = snippet_pattern(phrase_plan, words=True)
    assert phrase is not None
    assert list(phrase.finditer("a-a-a a")) == [(0, 3), (4, 7)]


# Letters unicode61 folds (accents, upper case, a combining acute it drops), plain ones and
# separators: words spelled one way in the text and another in the query.
_FOLDED_CHARS = ["cafe", "café", "CAFÉ", "cafe\u0301", "ca\u0301fe", "naïve", "nai\u0308ve",
                 "Zürich", "zurich", "x", "é", " ", "-", "\u0301", "ß",
                 # a token character unicode61 has no class for; letters Python alone folds alike
                 "🙂", "thanks", "sınır", "sinir", "ı", "İ", "go🙂go", "go"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_FOLDED_CHARS), max_size=12),
       st.sampled_from(["cafe", "café", "naive", "zurich", "caf*", '"cafe x"', "thanks",
                        "sinir", '"thanks🙂"', "go🙂go"]))
def test_a_word_hit_marks_the_word_however_the_text_spells_it(
    pieces: list[str], query: str
) -> None:
    """Where the index finds the word (its tokens, as unicode61 folds them), the snippet of a
    word hit marks it, and what it marks folds to the query's words."""
    text = "".join(pieces)
    plan = plan_search(query)
    assert plan is not None
    words = bm25.column_tokens(query.strip('"*'))
    tokens = bm25.column_tokens(text)
    prefix = query.endswith("*")
    holds = any(
        tokens[i:i + len(words)] == words if not prefix else tokens[i].startswith(words[0])
        for i in range(len(tokens)))
    snippet = make_snippet(text, snippet_pattern(plan, words=True), width=1000)
    marked = re.findall(">>>(.*?)<<<", snippet, re.DOTALL)
    assert bool(marked) == holds, (text, query, snippet)
    for span in marked:
        found = bm25.column_tokens(span)
        assert found[:1] and (found[0].startswith(words[0]) if prefix else found == words)


# Text of a long message read folded: words spelled several ways, CJK, separators, and
# characters whose folding changes the text's length (a combining acute dropped).
_HEAD_PIECES = ["cafe", "café", "CAFÉ", "Zürich", "zurich", "東京", "。", "，", " ", "-", "x",
                "tokyo", "TOKYO", "Tōkyō", "cafés", "xcafe", "🙂", "ca\u0301fe"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_HEAD_PIECES), min_size=1, max_size=80),
       st.sampled_from(["cafe", "zurich", "tokyo", "cafe tokyo", "東京", "cafe 東京", "caf*",
                        '"cafe tokyo"', "cafes"]),
       st.integers(min_value=1, max_value=40), st.integers(min_value=-1, max_value=120),
       st.booleans())
# The window's last match (tokyo) starts in the head and ends past it.
@example(["cafe", " ", "tokyo", " ", "東京"], "cafe tokyo", 6, 7, True)
# A phrase's match in the window runs past the head.
@example(["TOKYO", "x", "，", "Tōkyō", " ", " ", "xcafe", "xcafe", "東京", "CAFÉ", " ", "tokyo",
          "CAFÉ"], '"cafe tokyo"', 2, 9, True)
# Folding drops a combining acute: the folded head is shorter than the text's.
@example(["ca\u0301fe", "CAFÉ", "東京", "CAFÉ", "Tōkyō", "東京", "CAFÉ", "ca\u0301fe", "Tōkyō",
          "Tōkyō", "，", "Tōkyō", "xcafe", "🙂", "，", "-", "Tōkyō", " ", "CAFÉ"], "cafe 東京", 12, 1,
         True)
def test_a_snippet_looked_for_in_the_head_of_a_long_text_is_the_whole_texts(
    pieces: list[str], query: str, width: int, head: int, words: bool
) -> None:
    """A snippet is looked for in a head of the text first, longer each time it cannot tell
    the window; whatever the head, the snippet is the one of the whole text."""
    text = "".join(pieces)
    plan = plan_search(query)
    assert plan is not None
    marker = snippet_pattern(plan, words=words)
    whole = make_snippet(text, marker, width=width, head=len(text) + 1)
    assert make_snippet(text, marker, width=width, head=head) == whole
