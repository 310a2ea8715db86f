"""search_messages through the SessionDB API, on real files: any text is a safe query, what is
written is found, the result shape, ranking, filters and pagination on every route, CJK."""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from state_helpers import Connections, raw, spell_as_earlier_version

import hermes_state_rank as rank
import hermes_state_search as search
from hermes_state import SessionDB

RESULT_KEYS = {
    "id", "session_id", "role", "timestamp", "tool_name", "snippet", "context", "source",
    "model", "session_started",
}
OPERATORS = ("AND", "OR", "NOT")


def add(db: SessionDB, session_id: str, content: str, role: str = "user", **fields: Any) -> int:
    return db.append_message(session_id, role, content, **fields)


def found(results: list[dict[str, Any]]) -> list[int]:
    """The ids of a result list, checking that none appears twice."""
    ids = [hit["id"] for hit in results]
    assert len(ids) == len(set(ids)), f"duplicate ids in {ids}"
    return ids


def unmark(snippet: str) -> str:
    return snippet.replace(search.MATCH_START, "").replace(search.MATCH_END, "")


def mark_stale(db: SessionDB) -> None:
    """Put the store on the canonical LIKE route, as a detached index does."""
    db.set_meta("fts_stale", '{"reason": "test"}')


def clear_stale(db_path: Path) -> None:
    with sqlite3.connect(db_path, isolation_level=None) as raw:
        raw.execute("DELETE FROM state_meta WHERE key = 'fts_stale'")
    raw.close()


# ---------------------------------------------------------------------------------------------
# Any text is a safe query
# ---------------------------------------------------------------------------------------------

FTS5_SYNTAX = [*'"*^:(){}[]+-,.;~\'/\\%_@#!?&|<>=`$ \t\n', "\x00", "\ud800", "\udfff",
               "AND", "OR", "NOT", "NEAR", "NEAR(", "and", "col:", "-col:", "{a b}:", "a", "b",
               "docker", "東京", "京", "한국어", "学习", "😀", "é"]
hostile_text = st.one_of(
    st.text(),
    st.text(alphabet=st.one_of(st.characters(), st.characters(categories=["Cs"]))),
    st.lists(st.sampled_from(FTS5_SYNTAX), max_size=24).map("".join),
    st.text(alphabet=st.characters(min_codepoint=0x3040, max_codepoint=0x9FFF), max_size=12),
    st.text(alphabet=st.characters(min_codepoint=0xAC00, max_codepoint=0xD7A3), max_size=12),
)
PROPERTY = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def _small_store(path: Path, *, stale: bool = False) -> SessionDB:
    db = SessionDB(path)
    db.create_session("s-cli", "cli", model="m")
    db.create_session("s-tg", "telegram")
    for text in ("docker deployment failed", "東京都に住んでいます", "한국어 텍스트 검색",
                 "it's a chat-send test", "gateway/run.py: TODO fix 50% wrong-book",
                 "我们在北京学习中文", 'a "quoted" NEAR(a b) col:term'):
        add(db, "s-cli", text)
        add(db, "s-tg", text, role="assistant")
    if stale:
        mark_stale(db)
    return db


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SessionDB, Path]]:
    """A small real store searched by the property tests (one per module), and the same store
    with its index detached, searched through the LIKE fallback."""
    path = tmp_path_factory.mktemp("search") / "state.db"
    db = _small_store(path)
    stale = _small_store(tmp_path_factory.mktemp("stale") / "state.db", stale=True)
    db.stale_twin = stale  # type: ignore[attr-defined]
    yield db, path
    stale.close()
    db.close()


@PROPERTY
@given(hostile_text)
def test_any_text_becomes_a_query_fts5_accepts_and_search_never_raises(
    shared: tuple[SessionDB, Path], query: str
) -> None:
    db, path = shared
    sanitized = SessionDB._sanitize_fts5_query(query)
    with sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True) as raw:
        if sanitized:
            raw.execute(
                "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?", (sanitized,)
            ).fetchone()
    raw.close()
    results = db.search_messages(query)
    found(results)
    if not sanitized:
        assert results == []
    found(db.search_messages(query, source_filter=["cli"], role_filter=["user"], limit=3))
    found(db.search_messages(query, exclude_sources=["telegram"], offset=1))
    stale: SessionDB = db.stale_twin  # type: ignore[attr-defined]
    assert found(stale.search_messages(query, role_filter="user")) == [] or sanitized


@pytest.mark.parametrize("cover_rows", [0, 256], ids=["every-trigram", "cover"])
def test_the_trigram_index_is_sent_whole_trigrams_and_never_a_like(
    shared: tuple[SessionDB, Path], cover_rows: int
) -> None:
    """SQLite 3.40 can crash on a trigram query with several LIKE constraints, or one of under
    three bytes: the index is asked MATCHes of trigrams instead, each of three characters,
    of every plain piece of the query's text (a row must hold them all). First those covering
    each piece end to end, for at most ``trigram_cover_rows`` rows; when more rows hold them,
    every trigram of the pieces. Either way the rows found are the ones holding the text."""
    _, path = shared
    queries = ("ployment", "ployment OR gateway", "ploy ment", "ate/run.py TODO",
               "北京学习 OR 텍스트 검색", '"50% wrong"', "cker NOT fail", "don't")
    ranking = rank.Ranking(trigram_cover_rows=cover_rows)
    statements: list[str] = []
    with sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True) as conn:
        for query in queries:
            every = search.search_messages(conn, query, limit=50, ranking=rank.Ranking(
                trigram_cover_rows=0))
            conn.set_trace_callback(statements.append)
            assert search.search_messages(conn, query, limit=50, ranking=ranking) == every
            conn.set_trace_callback(None)
    conn.close()
    asked = [s for s in statements if "messages_fts_trigram" in s and not s.startswith("--")]
    assert asked
    pieces = set()
    for sql in asked:
        assert not re.search(r"(?<!m\.)\bcontent LIKE", sql), sql  # messages' own text only
        for literal in re.findall(r"messages_fts_trigram MATCH '((?:[^']|'')*)'", sql):
            match = literal.replace("''", "'")  # the trace shows the bound text as SQL
            terms = [t.replace('""', '"') for t in re.findall(r'"((?:[^"]|"")*)"', match)]
            assert match == " AND ".join('"' + t.replace('"', '""') + '"' for t in terms)
            assert all(len(t) == 3 and not set(t) & set("%_") for t in terms), sql
            probe = sql.startswith("SELECT rowid FROM messages_fts_trigram")
            pieces.add((terms[0], terms[-1], len(terms), probe))
    # "ploy ment" and "ate/run.py TODO": the pieces' covers together.
    covers = {("plo", "ent", 3, True), ("plo", "ent", 4, True), ("ate", "ODO", 6, True),
              ("don", "n't", 2, True)}
    assert covers <= pieces
    # With no row allowed for the cover, every trigram is asked for next.
    every_trigram = {("plo", "ent", 6, False), ("ate", "ODO", 10, False)}
    assert (every_trigram <= pieces) == (cover_rows == 0)


_word_sources = itertools.count()
UNRELATED = "unrelated text"


def _inside_unrelated(word: str) -> bool:
    """Whether ``word`` matches the unrelated message too: a substring of it once case and
    diacritics are folded, as the word and substring indexes fold them."""
    stripped = "".join(c for c in unicodedata.normalize("NFKD", word)
                       if not unicodedata.combining(c))
    return any(form.casefold() in UNRELATED
               for form in (stripped, unicodedata.normalize("NFKC", word)))


plain_word = st.text(
    alphabet=st.characters(categories=("L", "N")), min_size=1, max_size=40
).filter(lambda word: word not in OPERATORS)  # an operator alone is no term (documented)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(word=plain_word)
def test_a_plain_word_written_into_a_message_is_found_by_searching_it(
    shared: tuple[SessionDB, Path], word: str
) -> None:
    assume(not _inside_unrelated(word))
    db, _ = shared
    source = f"word-{next(_word_sources)}"
    session = f"s-{source}"
    db.create_session(session, source)
    row = add(db, session, f"before {word} after")
    add(db, session, UNRELATED)
    assert found(db.search_messages(word, source_filter=[source])) == [row]


# ---------------------------------------------------------------------------------------------
# The hostile corpus
# ---------------------------------------------------------------------------------------------

TEN_THOUSAND = " ".join(f"w{i:04d}" for i in range(2000))[:10_000]
HOSTILE = [
    ("it's", "well, it's done"),
    ("gateway/run.py", "crash in gateway/run.py at line 3"),
    ("TODO: fix", "TODO: fix the retry loop"),
    ("wrong-book", "the wrong-book entry again"),
    ("50%", "a discount of 50% today"),
    ('"unbalanced', 'an "unbalanced quote here'),
    ("NEAR(a b)", "NEAR(a b) is fts syntax"),
    ("col:term", "col:term appears literally"),
    ("hello AND", "hello AND goodbye"),
    (TEN_THOUSAND, TEN_THOUSAND),
    ("z" * 10_000, "y " + "z" * 10_000 + " y"),
    ("***", None),
    ("OR", None),
    ("\x00", None),
    ("\ud800", None),
    ("a\x00b\ud800", None),
]


@pytest.fixture
def hostile_db(db: SessionDB) -> dict[str, int]:
    db.create_session("s1", "cli")
    add(db, "s1", "500 units in stock")
    return {text: add(db, "s1", text) for _, text in HOSTILE if text is not None}


@pytest.mark.parametrize("stale", [False, True], ids=["indexed", "stale"])
@pytest.mark.parametrize(("query", "text"), HOSTILE, ids=lambda v: repr(v)[:20])
def test_hostile_queries_never_raise_and_find_the_text_they_name(
    db: SessionDB, hostile_db: dict[str, int], query: str, text: str | None, stale: bool
) -> None:
    if stale:
        mark_stale(db)
    ids = found(db.search_messages(query, limit=50))
    if not SessionDB._sanitize_fts5_query(query):
        assert ids == []
    if text is not None:
        assert hostile_db[text] in ids
    if query == "50%":
        assert ids == [hostile_db["a discount of 50% today"]]  # not "500 units", on any route


# What another client may store where the library writes text (a number would be stored
# as text: the columns' affinity is TEXT).
FOREIGN_VALUES = [
    ("a blob", "CAST(? AS BLOB)", "kumquat stored as bytes"),
    ("text that is not UTF-8", "CAST(? AS BLOB) || x'ff'", "kumquat stored as bad bytes"),
    ("a blob in tool_calls", "CAST(? AS BLOB)", "kumquat"),
]


@pytest.mark.parametrize("stale", [False, True], ids=["indexed", "stale"])
@pytest.mark.parametrize(("kind", "value_sql", "text"), FOREIGN_VALUES, ids=lambda v: str(v))
def test_a_message_another_client_stored_as_bytes_is_found_and_shown_as_text(
    db: SessionDB, db_path: Path, kind: str, value_sql: str, text: str, stale: bool
) -> None:
    db.create_session("s1", "cli")
    add(db, "s1", "the message before")
    raw = sqlite3.connect(db_path, isolation_level=None)
    if kind.endswith("tool_calls"):
        raw.execute("INSERT INTO messages (session_id, role, content, tool_calls, timestamp)"
                    f" VALUES ('s1', 'assistant', ?, {value_sql}, 2e9)", (text, '{"x": 1}'))
    else:
        raw.execute("INSERT INTO messages (session_id, role, content, timestamp)"
                    f" VALUES ('s1', 'user', {value_sql}, 2e9)", (text,))
    raw.close()
    for n in range(300):  # the library's appends run the index's batches past that row
        add(db, "s1", f"kumquat number {n} " + "padding " * 40, timestamp=3e9 + n)
    if stale:
        mark_stale(db)
    hits = db.search_messages("kumquat", limit=400)
    assert len(found(hits)) == 301
    foreign = [h for h in hits if h["timestamp"] == 2e9]
    assert len(foreign) == 1, kind
    hit = foreign[0]
    assert isinstance(hit["snippet"], str) and ">>>kumquat<<<" in hit["snippet"]
    assert all(isinstance(c["content"], str) for c in hit["context"])
    assert db.search_messages("kumquat", sort="newest", limit=1)[0]["timestamp"] == 3e9 + 299


# ---------------------------------------------------------------------------------------------
# The result
# ---------------------------------------------------------------------------------------------


def test_a_result_carries_the_message_its_session_and_its_neighbours(db: SessionDB) -> None:
    db.create_session("s1", "telegram", model="gpt-x")
    db.create_session("other", "cli")
    first = add(db, "s1", "P" * 300, role="system", timestamp=100.0)
    add(db, "other", "interleaved from another session mentions nothing", timestamp=110.0)
    hit = add(db, "s1", "we should fix the flaky kiwi test", role="assistant", timestamp=123.5)
    add(db, "s1", "N" * 300, role="tool", tool_name="terminal", timestamp=130.0)
    (result,) = db.search_messages("kiwi")
    assert set(result) == RESULT_KEYS
    session = db.get_session("s1")
    assert session is not None
    assert result["id"] == hit
    assert (result["session_id"], result["role"], result["timestamp"]) == ("s1", "assistant", 123.5)
    assert (result["source"], result["model"], result["tool_name"]) == ("telegram", "gpt-x", None)
    assert result["session_started"] == session["started_at"]
    assert ">>>kiwi<<<" in result["snippet"]
    assert unmark(result["snippet"]) in "we should fix the flaky kiwi test"
    assert result["context"] == [
        {"role": "system", "content": "P" * 200},
        {"role": "assistant", "content": "we should fix the flaky kiwi test"},
        {"role": "tool", "content": "N" * 200},
    ]
    (at_start,) = db.search_messages("P" * 300)
    assert at_start["id"] == first
    assert at_start["context"] == [
        {"role": "system", "content": "P" * 200},
        {"role": "assistant", "content": "we should fix the flaky kiwi test"}]
    (tool,) = db.search_messages("terminal")
    assert tool["tool_name"] == "terminal" and tool["snippet"] == ">>>terminal<<<"


def test_context_follows_message_time_then_id_whatever_the_state(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    add(db, "s1", "written first, stamped last", timestamp=300.0)
    add(db, "s1", "written second, stamped first", timestamp=100.0)
    hit = add(db, "s1", "the kiwi in the middle", timestamp=200.0)
    add(db, "s1", "same moment, other words", timestamp=200.0)  # after the hit: a larger id
    (result,) = db.search_messages("kiwi")
    assert result["id"] == hit
    assert [c["content"] for c in result["context"]] == [
        "written second, stamped first", "the kiwi in the middle", "same moment, other words"]


_STAMPS = st.sampled_from([100.0, 200.0, 300.0])


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.sampled_from(["s1", "s2"]), _STAMPS, st.booleans()),
                     min_size=1, max_size=12))
def test_each_hits_context_is_its_neighbours_by_time_then_id(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[str, float, bool]],
) -> None:
    # Few distinct times, so that many rows share one and their ids decide.
    path = tmp_path_factory.mktemp("context") / "state.db"
    written: list[tuple[int, str, float, str]] = []
    with SessionDB(path) as db:
        db.create_session("s1", "cli")
        db.create_session("s2", "cli")
        for n, (session, stamp, hit) in enumerate(rows):
            text = f"row{n} " + ("kiwi" if hit else "plum")
            written.append((add(db, session, text, timestamp=stamp), session, stamp, text))
        results = db.search_messages("kiwi", limit=50)
    assert {r["id"] for r in results} == {r[0] for r, (_, _, hit) in zip(written, rows) if hit}
    for result in results:
        row_id, session, stamp, text = next(r for r in written if r[0] == result["id"])
        timed = sorted((r[2], r[0], r[3]) for r in written if r[1] == session)
        before = [t for s, i, t in timed if (s, i) < (stamp, row_id)]
        after = [t for s, i, t in timed if (s, i) > (stamp, row_id)]
        assert [c["content"] for c in result["context"]] == [*before[-1:], text, *after[:1]]


def test_a_message_with_the_term_many_times_ranks_first(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    once = add(db, "s1", "kiwi alpha bravo charlie delta")
    many = add(db, "s1", "kiwi kiwi kiwi kiwi delta")
    assert found(db.search_messages("kiwi")) == [many, once]


@pytest.mark.parametrize("stale", [False, True], ids=["indexed", "stale"])
def test_a_match_in_tool_calls_or_tool_name_is_marked_in_the_snippet(
    db: SessionDB, stale: bool
) -> None:
    db.create_session("s1", "cli")
    call = add(db, "s1", "", role="assistant", tool_calls=[{
        "id": "c1", "type": "function",
        "function": {"name": "web_search", "arguments": '{"query": "東京 天気 kiwi"}'}}])
    result = add(db, "s1", "plain result text", role="tool", tool_name="kiwitool",
                 tool_call_id="c1")
    if stale:
        mark_stale(db)
    for query, row, marked in (("kiwi", call, "kiwi"), ("天気", call, "天気"),
                               ("kiwitool", result, "kiwitool")):
        hits = {hit["id"]: hit["snippet"] for hit in db.search_messages(query)}
        assert f">>>{marked}<<<" in hits[row], (query, hits)


@pytest.mark.parametrize("sort", [None, "newest"])
def test_a_word_glued_to_cjk_text_is_marked_in_the_snippet(db: SessionDB, sort: str | None
                                                          ) -> None:
    """The CJK index finds ``python`` in ``Python入門``: the snippet marks it there too, in
    whichever column holds it, and still marks no word inside a longer one."""
    db.create_session("s1", "cli")
    glued = add(db, "s1", "Python入門 and pythonic")
    named = add(db, "s1", None, role="tool", tool_name="検索tool", tool_call_id="c1")
    inside = add(db, "s1", "東京 abcpython入門")
    expected = {
        "python": {glued: ">>>Python<<<入門 and pythonic"},
        "pyth*": {glued: ">>>Python<<<入門 and >>>pythonic<<<"},
        "tool": {named: "検索>>>tool<<<"},
        "入門 python": {glued: ">>>Python<<<>>>入門<<< and pythonic"},
    }
    for query, snippets in expected.items():
        hits = {hit["id"]: hit["snippet"] for hit in db.search_messages(query, sort=sort)}
        assert hits == snippets, query
    assert inside not in found(db.search_messages("python"))


@pytest.mark.parametrize("sort", [None, "newest", "oldest"])
def test_a_word_beside_cjk_text_found_inside_a_longer_word_is_still_a_word(
    db: SessionDB, sort: str | None
) -> None:
    """Rows holding the query's CJK text inside a longer word are found by substring, but the
    query's other words keep their word meaning there."""
    db.create_session("s1", "cli")
    word = add(db, "s1", "abc東京def python")
    inside = add(db, "s1", "abc東京def abcpython")
    glued = add(db, "s1", "abc東京def python入門")
    expected = {"c東京d python": {word, glued}, "c東京d": {word, inside, glued},
                "c東京d pyth*": {word, glued}, 'c東京d "python"': {word, glued}}
    for query, ids in expected.items():
        assert set(found(db.search_messages(query, sort=sort))) == ids, query


def _rewind(db_path: Path, session_id: str, ids: list[int]) -> None:
    """Rewind rows away, as /undo leaves them: inactive, not compacted, and the session's
    rewind count raised."""
    with sqlite3.connect(db_path, isolation_level=None) as raw:
        raw.executemany("UPDATE messages SET active = 0 WHERE id = ?", [(i,) for i in ids])
        raw.execute("UPDATE sessions SET rewind_count = rewind_count + 1 WHERE id = ?",
                    (session_id,))
    raw.close()


def _mark_compacted(db_path: Path, session_id: str) -> None:
    """What compression now records on the rows it archives."""
    with sqlite3.connect(db_path, isolation_level=None) as raw:
        raw.execute("UPDATE messages SET compacted = 1 WHERE session_id = ? AND active = 0",
                    (session_id,))
    raw.close()


@pytest.mark.parametrize("marked", [False, True], ids=["archived-before-marking", "compacted"])
@pytest.mark.parametrize(
    ("query", "kept", "dropped", "stale"),
    [("kiwi", "kiwi we keep", "old kiwi turn", False),
     ("東京", "東京の話を続ける", "古い東京の話", False),
     ("iwitur", "kiwiturn we keep", "old kiwiturn", False),
     ("kiwi", "kiwi we keep", "old kiwi turn", True)],
    ids=["fts", "cjk", "trigram", "stale"],
)
def test_the_whole_record_is_searched_once_and_rewound_rows_are_left_out(
    db: SessionDB, db_path: Path, query: str, kept: str, dropped: str, stale: bool, marked: bool
) -> None:
    db.create_session("s1", "cli")
    protected = add(db, "s1", kept)
    summarized = add(db, "s1", dropped)
    [copy] = db.get_messages("s1")[:1]
    db.archive_and_compact("s1", [copy])  # keeps ``kept`` under the same message_uid
    if marked:
        _mark_compacted(db_path, "s1")
    live = [m["id"] for m in db.get_messages("s1")]
    assert protected not in live and len(live) == 1
    if stale:
        mark_stale(db)
    # The live copy of the protected message, and the summarized-away one from the archive.
    assert sorted(found(db.search_messages(query, limit=50))) == sorted([*live, summarized])
    everything = found(db.search_messages(query, include_inactive=True, limit=50))
    assert sorted(everything) == sorted([protected, summarized, *live])

    db.create_session("s2", "cli")
    undone = add(db, "s2", dropped)
    _rewind(db_path, "s2", [undone])
    assert undone not in found(db.search_messages(query, limit=50))
    assert undone in found(db.search_messages(query, include_inactive=True, limit=50))


def test_a_word_spelled_with_accents_is_marked_where_it_is(db: SessionDB) -> None:
    """unicode61 folds accents (and drops a combining one), so ``cafe`` finds ``Café`` and
    ``café`` finds ``cafe``; the snippet marks the word as the text spells it, centred on it."""
    db.create_session("s1", "cli")
    long_row = add(db, "s1", "x " * 200 + "Zürich meeting " + "y " * 200)
    decomposed = add(db, "s1", "the nai\u0308ve cafe\u0301 plan")
    plain = add(db, "s1", "plain cafe here")
    [hit] = db.search_messages("zurich")
    before, marked, after = re.split(">>>|<<<", hit["snippet"])
    assert hit["id"] == long_row and marked == "Zürich"
    assert before.startswith("... x") and after.endswith("y ...")  # the window is around it
    assert abs(len(before) - len(after)) <= len(" meeting") + 1
    hits = {h["id"]: h["snippet"] for h in db.search_messages("café")}
    assert hits == {decomposed: "the nai\u0308ve >>>cafe\u0301<<< plan",
                    plain: "plain >>>cafe<<< here"}
    assert [h["snippet"] for h in db.search_messages("naive")] == [
        "the >>>nai\u0308ve<<< cafe\u0301 plan"]


def test_cjk_text_with_accents_is_marked_beside_a_latin_word(db: SessionDB) -> None:
    """A query of CJK text and a Latin word reads the text folded: the CJK term's accented
    letters are folded with it, so both stay marked."""
    db.create_session("s1", "cli")
    paris = add(db, "s1", "Rendez-vous à 東京é demain")
    name = add(db, "s1", "Ünïcode 東京Ü here")
    assert [(h["id"], h["snippet"]) for h in db.search_messages("東京é OR zebra")] == [
        (paris, "Rendez-vous à >>>東京é<<< demain")]
    assert [(h["id"], h["snippet"]) for h in db.search_messages("東京Ü ünïcode")] == [
        (name, ">>>Ünïcode<<< >>>東京Ü<<< here")]


def test_a_substring_hit_is_marked_where_like_found_it(db: SessionDB) -> None:
    """LIKE folds ASCII case only: the snippet marks and centres on what it matched, not on
    a letter only Python's case folding makes alike (the Kelvin sign, Ä, ẞ)."""
    db.create_session("s1", "cli")
    pad = " filler" * 30
    for query, lookalike, real in [("kit", "tool\u212ait", "toolkit"),
                                   ("ärger", "xÄRGERx", "xärgerx"),
                                   ("straße", "xSTRAẞEx", "xstraßex")]:
        row = add(db, "s1", f"{lookalike}{pad} {real}")
        [hit] = db.search_messages(query)
        assert (hit["id"], hit["match"]) == (row, "substring")
        assert re.findall(">>>(.*?)<<<", hit["snippet"]) == [query], hit["snippet"]


def test_source_filters_given_as_iterators_are_read_once(db: SessionDB) -> None:
    """The module's search asks the source filters twice (do any sessions pass, then the
    rows): an iterator given there is read once, not found empty the second time."""
    db.create_session("s-cli", "cli")
    db.create_session("s-tg", "telegram")
    cli = add(db, "s-cli", "kiwi here")
    add(db, "s-tg", "kiwi there")
    for filters in ({"source_filter": iter(["cli"])}, {"exclude_sources": iter(["telegram"])}):
        with raw(db.db_path) as conn:
            hits = search.search_messages(conn, "kiwi", **filters)
        assert found(hits) == [cli], filters


def test_a_substring_needs_three_characters_beside_a_healthy_index(db: SessionDB) -> None:
    """The trigram index serves substrings of three characters or more; a shorter query is a
    word only (``ph`` finds the word, not ``graph``), and finds nothing when no row holds it."""
    db.create_session("s1", "cli")
    add(db, "s1", "graphql endpoint")
    word = add(db, "s1", "the ph of the water")
    assert [(h["id"], h.get("match")) for h in db.search_messages("ph")] == [(word, None)]
    assert db.search_messages("gr") == []
    assert [h["match"] for h in db.search_messages("gra")] == ["substring"]


@pytest.mark.parametrize(("query", "text", "stale"), [
    ("kiwi", "kiwi we keep a while", False), ("東京", "東京の話を続ける", False),
    ("iwitur", "kiwiturn we keep", False), ("kiwi", "kiwi we keep a while", True),
], ids=["fts", "cjk", "trigram", "stale"])
def test_a_message_archived_by_two_compactions_is_found_once(
    db: SessionDB, query: str, text: str, stale: bool
) -> None:
    """Kept through one compaction (archived, and copied under its message_uid), then
    summarized away by the next (archived again, no live copy left): one hit, the newest
    archived copy; with include_inactive, every copy."""
    db.create_session("s1", "cli")
    first = add(db, "s1", text)
    add(db, "s1", "an unrelated reply")
    [copy] = db.get_messages("s1")[:1]
    db.archive_and_compact("s1", [copy])
    [second] = [m["id"] for m in db.get_messages("s1")]
    db.archive_and_compact("s1", [{"role": "user", "content": "a summary of it all"}])
    if stale:
        mark_stale(db)
    assert found(db.search_messages(query, limit=50)) == [second]
    assert sorted(found(db.search_messages(query, include_inactive=True, limit=50))) == [
        first, second]
    for sort in ("newest", "oldest"):
        assert found(db.search_messages(query, sort=sort, limit=50)) == [second]


# ---------------------------------------------------------------------------------------------
# Filters, wildcards and pages, on every route
# ---------------------------------------------------------------------------------------------

# One query per route: a word (messages_fts), CJK (messages_fts_cjk), a substring that is no
# word (messages_fts_trigram), and the same word with the index detached (LIKE fallback).
ROUTES = {
    "fts": ("kiwi", "kiwi {n}", False),
    "cjk": ("東京", "東京 {n}", False),
    "trigram": ("iwifru", "kiwifruit {n}", False),
    "stale": ("kiwi", "kiwi {n}", True),
}


@pytest.fixture(params=list(ROUTES))
def route(request: pytest.FixtureRequest, db: SessionDB) -> tuple[SessionDB, str]:
    query, template, stale = ROUTES[request.param]
    for source in ("cli", "telegram", "discord"):
        db.create_session(f"s-{source}", source)
        for n in range(4):
            add(db, f"s-{source}", template.format(n=n), role="user")
            add(db, f"s-{source}", template.format(n=n), role="assistant")
    add(db, "s-cli", "unrelated message")
    if stale:
        mark_stale(db)
    return db, query


def sources_and_roles(results: list[dict[str, Any]]) -> set[tuple[str, str]]:
    found(results)
    return {(hit["source"], hit["role"]) for hit in results}


def test_filters_apply_on_every_route(route: tuple[SessionDB, str]) -> None:
    db, query = route
    everything = db.search_messages(query, limit=100)
    assert len(everything) == 24
    assert all(search.MATCH_START in hit["snippet"] for hit in everything)
    assert sources_and_roles(db.search_messages(query, source_filter=["cli"], limit=100)) == {
        ("cli", "user"), ("cli", "assistant")}
    excluded = db.search_messages(query, exclude_sources=["telegram", "discord"], limit=100)
    assert {source for source, _ in sources_and_roles(excluded)} == {"cli"}
    roles = db.search_messages(query, role_filter=["assistant"], limit=100)
    assert len(roles) == 12 and {role for _, role in sources_and_roles(roles)} == {"assistant"}
    both = db.search_messages(query, source_filter=["discord"], role_filter=["user"], limit=100)
    assert sources_and_roles(both) == {("discord", "user")} and len(both) == 4
    assert db.search_messages(query, source_filter=["nowhere"]) == []


def test_source_filters_no_session_passes_find_nothing_without_reading_messages(
    route: tuple[SessionDB, str], connections: Connections,
) -> None:
    """A source no session has (a misspelt one, say) cannot match a row: no route is asked,
    where each of them, the substring route included, would read every match to find none."""
    db, query = route
    statements: list[str] = []
    connections.own().set_trace_callback(statements.append)
    try:
        assert found(db.search_messages(query, source_filter=["cli"], limit=100))
        assert any("messages" in sql for sql in statements)
        for filters in ({"source_filter": ["nowhere"]}, {"source_filter": []},
                        {"source_filter": "nowhere", "role_filter": ["user"]},
                        {"exclude_sources": ["cli", "telegram", "discord"]},
                        {"source_filter": ["cli"], "exclude_sources": "cli"}):
            statements.clear()
            assert db.search_messages(query, limit=100, sort="newest", **filters) == [], filters
            assert not [sql for sql in statements if "messages" in sql], filters
    finally:
        connections.own().set_trace_callback(None)


def test_filter_lists_of_ten_thousand_entries_are_accepted(route: tuple[SessionDB, str]) -> None:
    db, query = route
    many = [f"source-{i}" for i in range(9_999)]
    only_cli = db.search_messages(query, source_filter=[*many, "cli"], limit=100)
    assert len(only_cli) == 8 and {hit["source"] for hit in only_cli} == {"cli"}
    not_tg = db.search_messages(query, exclude_sources=[*many, "telegram"], limit=100)
    assert len(not_tg) == 16 and "telegram" not in {hit["source"] for hit in not_tg}
    roles = db.search_messages(query, role_filter=[*many, "user"], limit=100)
    assert len(roles) == 12


def test_pages_are_consistent_on_every_route(route: tuple[SessionDB, str]) -> None:
    db, query = route
    everything = found(db.search_messages(query, limit=100))
    for size in (1, 5, 7):
        pages: list[int] = []
        for offset in range(0, 30, size):
            pages += found(db.search_messages(query, limit=size, offset=offset))
        assert pages == everything, size
    assert db.search_messages(query, limit=5, offset=1_000) == []
    assert db.search_messages(query, limit=0) == []


def test_substring_hits_only_when_no_row_holds_the_word_and_they_say_so(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    words = [add(db, "s1", "kiwi " * (1 + n % 3) + "end") for n in range(3)]
    inside = [add(db, "s1", f"kiwifruit number {n}") for n in range(9)]
    hits = db.search_messages("kiwi", limit=100)
    assert sorted(found(hits)) == sorted(words)  # no padding with kiwifruit
    assert all("match" not in hit for hit in hits)
    assert db.search_messages("kiwi", offset=3) == []
    substring = db.search_messages("iwifrui", limit=100)
    assert found(substring) == inside[::-1]  # newest first
    assert all(hit["match"] == "substring" for hit in substring)
    assert all(">>>iwifrui<<<" in hit["snippet"] for hit in substring)
    assert found(db.search_messages("iwifrui", sort="oldest", limit=3)) == inside[:3]
    assert db.search_messages("iwifrui", role_filter=["assistant"]) == []


def test_a_row_holding_a_substrings_trigrams_apart_is_no_hit(db: SessionDB) -> None:
    """The trigram index finds the rows holding trigrams that cover the text (``wit``,
    ``urn``, ``rni`` for ``witurni``), wherever they are in the row: each is checked for the
    text itself, its ASCII letters in any case."""
    db.create_session("s1", "cli")
    add(db, "s1", "wit urn rni, and wiT uRNi")
    inside = [add(db, "s1", text) for text in ("KIWITURNIP", "xwiturnix", "a xwiTurni b")]
    hits = db.search_messages("witurni")
    assert found(hits) == inside[::-1]
    assert {hit["match"] for hit in hits} == {"substring"}


@pytest.mark.parametrize("stale", [False, True], ids=["indexed", "stale"])
def test_percent_and_underscore_are_literal_in_like_paths(db: SessionDB, stale: bool) -> None:
    db.create_session("s1", "cli")
    percent = add(db, "s1", "a discount of 50% today")
    add(db, "s1", "500 units in stock")
    rebate = add(db, "s1", "rebate50% applied")
    add(db, "s1", "rebate500 applied")
    underscore = add(db, "s1", "the key_name field")
    add(db, "s1", "the keyXname field")
    a_b = add(db, "s1", "a_b")
    add(db, "s1", "axb")
    if stale:
        mark_stale(db)
    # Indexed, "50%" is the word 50; on the LIKE route it is the text "50%", in "rebate50%" too.
    assert set(found(db.search_messages("50%"))) == ({percent, rebate} if stale else {percent})
    assert found(db.search_messages("bate50%")) == [rebate]  # the trigram route when indexed
    assert found(db.search_messages("key_name")) == [underscore]
    assert found(db.search_messages("a_b")) == [a_b]


# ---------------------------------------------------------------------------------------------
# CJK
# ---------------------------------------------------------------------------------------------

CJK_MESSAGES = {
    "ja": ("東京都に住んでいます。猫!", "cli", "user"),
    "zh": ("我们在北京学习中文", "telegram", "assistant"),
    "ko": ("한국어 텍스트 데이터베이스 검색", "discord", "user"),
    "mixed": ("日本語のUI設計とPython入門", "cli", "assistant"),
    "latin": ("python and ui without cjk", "cli", "user"),
}


@pytest.fixture
def cjk_db(db: SessionDB) -> tuple[SessionDB, dict[str, int]]:
    ids = {}
    for key, (text, source, role) in CJK_MESSAGES.items():
        db.create_session(f"s-{key}", source)
        add(db, f"s-{key}", "previous line", role="system")
        ids[key] = add(db, f"s-{key}", text, role=role)
    return db, ids


@pytest.mark.parametrize(
    ("query", "key"),
    [
        ("東", "ja"), ("す", "ja"), ("猫", "ja"), ("東京", "ja"), ("東京都", "ja"),
        ("住んでいます", "ja"), ("北", "zh"), ("文", "zh"), ("北京", "zh"), ("学习中", "zh"),
        ("我们在北京", "zh"), ("검", "ko"), ("색", "ko"), ("검색", "ko"), ("텍스트", "ko"),
        ("데이터베이스", "ko"), ("入", "mixed"), ("Python入門", "mixed"), ("門", "mixed"),
    ],
)
def test_cjk_queries_of_every_length_are_found_with_their_filters(
    cjk_db: tuple[SessionDB, dict[str, int]], query: str, key: str
) -> None:
    db, ids = cjk_db
    _, source, role = CJK_MESSAGES[key]
    assert found(db.search_messages(query)) == [ids[key]]
    assert found(db.search_messages(query, source_filter=[source], role_filter=[role])) == [
        ids[key]]
    other_role = "assistant" if role == "user" else "user"
    assert db.search_messages(query, role_filter=[other_role]) == []
    assert db.search_messages(query, exclude_sources=[source]) == []
    (hit,) = db.search_messages(query)
    assert f">>>{query}<<<" in hit["snippet"]


def test_mixed_cjk_and_latin_queries(cjk_db: tuple[SessionDB, dict[str, int]]) -> None:
    db, ids = cjk_db
    assert found(db.search_messages("Python 入門")) == [ids["mixed"]]
    assert sorted(found(db.search_messages("東京 OR 北京"))) == sorted([ids["ja"], ids["zh"]])
    assert sorted(found(db.search_messages("猫 OR without"))) == sorted([ids["ja"], ids["latin"]])
    assert found(db.search_messages("東京 NOT 猫")) == []


def test_a_latin_word_inside_cjk_text_is_found(cjk_db: tuple[SessionDB, dict[str, int]]) -> None:
    db, ids = cjk_db
    assert sorted(found(db.search_messages("UI"))) == sorted([ids["mixed"], ids["latin"]])
    assert sorted(found(db.search_messages("python"))) == sorted([ids["mixed"], ids["latin"]])


@pytest.mark.parametrize("query", ["kiwi", "zebra", "東京タワー", "東"])
@pytest.mark.parametrize("sort", [None, "newest"])
def test_pages_as_far_as_64_bits_reach_answer_without_error(
    db: SessionDB, query: str, sort: str | None
) -> None:
    db.create_session("s", "cli")
    for n in range(5):
        add(db, "s", f"kiwi {n} 東京タワー", timestamp=float(n))
    everything = found(db.search_messages(query, sort=sort, limit=100))
    big = 2**63 - 1
    for offset, limit in ((0, big), (2, big), (2**62, 20), (45, big - 40), (big, big)):
        assert found(db.search_messages(query, sort=sort, limit=limit, offset=offset)) == (
            everything[offset:]), (offset, limit)


def _calls(name: str) -> list[dict[str, Any]]:
    return [{"id": "c", "type": "function", "function": {"name": name, "arguments": "{}"}}]


@pytest.mark.parametrize("earlier", [False, True], ids=["current", "earlier-spelling"])
@pytest.mark.parametrize("sort", [None, "newest", "oldest"])
def test_a_negated_word_excludes_a_row_whatever_column_holds_it(
    db: SessionDB, db_path: Path, sort: str | None, earlier: bool
) -> None:
    """A row holding a negated word in any column, or half of a negated conjunction, is left
    out, on every route and in every order; also in a file an earlier version wrote, whose
    index of CJK text (and of words glued to it) holds the content and the tool calls but not
    the tool name."""
    db.create_session("s", "cli")
    plain = add(db, "s", "kiwi plain")
    tool = add(db, "s", "kiwi 日本語 output", "tool", tool_name="terminal", tool_call_id="c1")
    call = add(db, "s", "kiwi 東京", "assistant", tool_calls=_calls("zebra"))
    glued = add(db, "s", "kiwi東京 notes")
    glued_tool = add(db, "s", "kiwi東京 result", "tool", tool_name="terminal", tool_call_id="c2")
    cjk_tool = add(db, "s", "東京タワー", "tool", tool_name="terminal", tool_call_id="c3")
    cjk_call = add(db, "s", "東京都", "assistant", tool_calls=_calls("zebra"))
    inside = add(db, "s", "abc京def")  # found as a substring inside a longer word
    inside_call = add(db, "s", "abc京def", "assistant", tool_calls=_calls("zebra"))
    if earlier:
        assert spell_as_earlier_version(db_path) == 3
    expected = {
        "kiwi NOT terminal": {plain, call, glued},
        "kiwi NOT zebra": {plain, tool, glued, glued_tool},
        "kiwi NOT output terminal": {plain, call, glued, glued_tool},
        "東京 NOT terminal": {call, glued, cjk_call},
        "東京 NOT zebra": {glued, glued_tool, cjk_tool},
        "東京 NOT タワー terminal": {call, glued, glued_tool, cjk_call},
        "kiwi NOT terminal OR 東京 NOT zebra": {plain, call, glued, glued_tool, cjk_tool},
        "c京de": {inside, inside_call},
        "c京de NOT zebra": {inside},
    }
    for query, ids in expected.items():
        hits = db.search_messages(query, sort=sort, limit=50)
        assert set(found(hits)) == ids, query
        assert not any("match" in hit for hit in hits), query


@pytest.mark.parametrize("sort", [None, "newest"])
def test_a_negated_word_glued_to_cjk_text_leaves_the_row_out(
    db: SessionDB, sort: str | None
) -> None:
    """A word glued to CJK text is a word of the row (``python`` finds ``Python入門``), and a
    CJK term inside a longer run is held by it: negated, either leaves the row out of the
    Latin words' own index too, which reads the glued text as one token."""
    db.create_session("s", "cli")
    glued = add(db, "s", "Python入門 hello")
    glued_after = add(db, "s", "hello 入門python")
    in_calls = add(db, "s", "hello", "assistant", tool_calls=[
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '"python入門"'}}])
    hello = add(db, "s", "hello there")
    glued_there = add(db, "s", "Python入門 hello there")
    longer_run = add(db, "s", "alpha 京都大阪")
    run = add(db, "s", "alpha 大阪")
    glued_run = add(db, "s", "alpha 大阪beta")
    alpha = add(db, "s", "alpha only")
    expected = {
        "python": {glued, glued_after, in_calls, glued_there},
        "hello NOT python": {hello},
        "hello NOT pyt*": {hello},
        "hello NOT python there": {glued, glued_after, in_calls, hello},
        "大阪": {longer_run, run, glued_run},
        "alpha NOT 大阪": {alpha},
        "hello NOT python OR alpha NOT 大阪": {hello, alpha},
    }
    for query, ids in expected.items():
        assert set(found(db.search_messages(query, sort=sort, limit=50))) == ids, query


def test_a_negated_word_is_held_by_a_tool_name_as_fts5_tokenizes_it(db: SessionDB) -> None:
    db.create_session("s", "cli")
    names = ["Términal", "read_file", "terminals", "TERMINAL", None, "ターミナル terminal"]
    rows = {name: add(db, "s", "東京 output", "tool" if name else "user", tool_name=name,
                      tool_call_id=f"c{n}" if name else None)
            for n, name in enumerate(names)}
    expected = {
        "東京 NOT terminal": {"read_file", "terminals", None},
        "東京 NOT file": {"Términal", "terminals", "TERMINAL", None, "ターミナル terminal"},
        "東京 NOT term*": {"read_file", None},
        '東京 NOT "read file"': {"Términal", "terminals", "TERMINAL", None, "ターミナル terminal"},
    }
    for query, kept in expected.items():
        assert set(found(db.search_messages(query))) == {rows[n] for n in kept}, query


def test_cjk_snippets_are_short_and_centred_on_the_match(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    text = "前置きの文章です。" * 40 + "東京タワーに行きました。" + "後書きの文章です。" * 40
    add(db, "s1", text)
    (hit,) = db.search_messages("東京タワー")
    snippet = hit["snippet"]
    assert ">>>東京タワー<<<" in snippet
    window = unmark(snippet).removeprefix("...").removesuffix("...")
    assert window in text and len(window) <= search.SNIPPET_WIDTH
    before, _, after = window.partition("東京タワー")
    assert abs(len(before) - len(after)) <= 2


def test_a_one_character_cjk_query_is_served_by_the_cjk_index(db: SessionDB,
                                                              db_path: Path) -> None:
    db.create_session("s1", "cli")
    db.replace_messages("s1", [
        {"role": "user", "content": f"第{n}回の会議で東京と大阪の話をした" if n % 50 else
         f"鯨の話 {n}"} for n in range(3000)
    ])
    plan = search.plan_search("鯨")
    assert plan is not None and plan.cjk_match is not None and plan.cjk_short
    filters, params = search.search_filters(["cli"], None, ["user"], False)
    sql = "EXPLAIN QUERY PLAN " + search.BLOCK_HITS_SQL.format(
        table="messages_fts_cjk", filters=filters)
    with sqlite3.connect(db_path) as raw:
        steps = [row[-1] for row in raw.execute(sql, (plan.cjk_match, 0, 4096, *params))]
    raw.close()
    assert any(re.fullmatch(r"SCAN f VIRTUAL TABLE INDEX \d+:M\d+.*", s) for s in steps), steps
    assert not any(s.startswith("SCAN m") for s in steps), steps
    hits = db.search_messages("鯨", limit=100, source_filter=["cli"], role_filter=["user"])
    assert len(found(hits)) == 60
    assert found(hits) == sorted(found(hits), reverse=True)  # newest first, whatever the sort
    assert found(db.search_messages("鯨", limit=100, sort="oldest")) == found(hits)


# ---------------------------------------------------------------------------------------------
# What a new query compiles
# ---------------------------------------------------------------------------------------------

# Code points a character class of a pattern compiled for one query may cover: a few ASCII
# ranges. A class over most of Unicode (any non-ASCII character, the CJK blocks) costs
# milliseconds to compile, which a query asked for the first time would pay.
SMALL_CLASS = 1_000


def _class_sizes(pattern: str) -> list[int]:
    """How many code points each character class of ``pattern`` covers."""
    sizes: list[int] = []

    def walk(items: Any) -> None:
        for op, arg in items:
            name = str(op)
            if name == "IN":
                listed = sum(hi - lo + 1 if str(kind) == "RANGE" else 1
                             for kind, value in arg if str(kind) in ("RANGE", "LITERAL")
                             for lo, hi in [value if str(kind) == "RANGE" else (value, value)])
                negated = any(str(kind) == "NEGATE" for kind, _ in arg)
                sizes.append(0x110000 - listed if negated else listed)
            for value in arg if isinstance(arg, (list, tuple)) else ():
                if isinstance(value, re._parser.SubPattern):  # type: ignore[attr-defined]
                    walk(value)
                elif isinstance(value, (list, tuple)):
                    for inner in value:
                        if isinstance(inner, re._parser.SubPattern):  # type: ignore[attr-defined]
                            walk(inner)

    walk(re._parser.parse(pattern))  # type: ignore[attr-defined]
    return sizes


@pytest.mark.parametrize("query", [
    "mercurial", "mercur*", '"mercurial lantern"', "mercurial lantern", "Café", "Python入門",
    "東京 lantern", "lantern NOT mercurial",
])
def test_a_new_query_compiles_no_pattern(
    db: SessionDB, monkeypatch: pytest.MonkeyPatch, query: str
) -> None:
    db.create_session("s1", "cli")
    for n in range(40):
        add(db, "s1", f"the mercurial lantern {n} glowed; Café au lait, Python入門 東京 {n}")
        add(db, "s1", f"a lantern {n} alone, mercurialness aside", role="assistant")
    assert db.search_messages("warm the process up") == []
    compiled: list[str] = []
    real = re._compile  # type: ignore[attr-defined]

    def counting(pattern: Any, flags: Any) -> Any:
        if isinstance(pattern, str):
            compiled.append(pattern)
        return real(pattern, flags)

    monkeypatch.setattr(re, "_compile", counting)
    re.purge()  # every pattern compiled from here on is compiled for this query
    hits = db.search_messages(query, limit=50)
    assert hits and all(">>>" in hit["snippet"] for hit in hits)
    # Words and phrases of word hits are found as plain text: the query compiles nothing.
    assert compiled == []


# A fresh process's first search, which meets long text of other scripts: it prints each
# pattern compiled for it.
FIRST_SEARCH = """
import json, re, sys
from hermes_state import SessionDB
compiled = []
real = re._compile
def counting(pattern, flags):
    if isinstance(pattern, str):
        compiled.append(pattern)
    return real(pattern, flags)
with SessionDB(sys.argv[1], read_only=True) as db:
    db.search_messages("warm the process up")
    re._compile = counting
    re.purge()
    hits = db.search_messages(sys.argv[2])
print(json.dumps([len(hits), compiled]))
"""


@pytest.mark.parametrize("query", ["peer", "peer review"])
def test_a_first_search_meeting_long_text_of_other_scripts_compiles_no_large_class(
    tmp_path: Path, query: str
) -> None:
    """Text with many characters of other scripts is folded as unicode61 folds it: the
    characters it may change are found without a class over Unicode compiled for them."""
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s1", "cli")
        long_text = "东京的同行评审 Überprüfung рецензия коллег " * 40
        for n in range(30):
            add(db, "s1", f"peer review {n}: {long_text}")
            add(db, "s1", f"a short note {n}", role="assistant")
    out = subprocess.run([sys.executable, "-c", FIRST_SEARCH, str(path), query],
                         capture_output=True, text=True, check=True, timeout=120,
                         cwd=Path(__file__).parent.parent).stdout
    found, compiled = json.loads(out)
    assert found == 20
    assert [p for p in compiled if any(size > SMALL_CLASS for size in _class_sizes(p))] == []
