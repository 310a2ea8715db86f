"""The benchmark corpus: determinism, shape, tool-call pairing and the query guarantee."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

from bench.corpus import (
    MAX_SESSION_MESSAGES,
    MIN_SESSION_MESSAGES,
    QUERY_GUARANTEE_MESSAGES,
    CorpusSession,
    content_bytes,
    generate_corpus,
    query_terms,
)

APPEND_KEYS = {
    "role", "content", "tool_calls", "tool_call_id", "tool_name", "timestamp", "finish_reason",
    "reasoning", "token_count",
}


@pytest.fixture(scope="module")
def corpus_20k() -> list[CorpusSession]:
    return list(generate_corpus(20_000, seed=1))


@pytest.fixture(scope="module")
def corpus_10k() -> list[CorpusSession]:
    return list(generate_corpus(QUERY_GUARANTEE_MESSAGES, seed=1))


def assert_tool_pairs(session: CorpusSession) -> None:
    """Each result follows the assistant turn that made its call; each call has a result."""
    pending: set[str] = set()
    for message in session.messages:
        if message.role == "tool":
            assert message.tool_call_id in pending, session.session_id
            pending.discard(message.tool_call_id)
            continue
        assert not pending, f"unanswered calls in {session.session_id}"
        if message.tool_calls:
            assert message.role == "assistant"
            pending = {call["id"] for call in message.tool_calls}
    assert not pending, f"unanswered calls at the end of {session.session_id}"


def test_same_seed_gives_the_same_corpus_and_another_seed_does_not() -> None:
    first = list(generate_corpus(2_000, seed=5))
    assert first == list(generate_corpus(2_000, seed=5))
    other = list(generate_corpus(2_000, seed=6))
    assert [m.content for s in first for m in s.messages] != [
        m.content for s in other for m in s.messages
    ]


@pytest.mark.parametrize("total", [0, 1, 19, 20, 21, 399, 400, 401, 419, 420, 421, 5_003])
def test_corpus_holds_exactly_the_requested_messages(total: int) -> None:
    sessions = list(generate_corpus(total, seed=2))
    assert sum(len(s.messages) for s in sessions) == total
    if total >= MIN_SESSION_MESSAGES:
        assert all(
            MIN_SESSION_MESSAGES <= len(s.messages) <= MAX_SESSION_MESSAGES for s in sessions
        )
    for session in sessions:
        assert_tool_pairs(session)


def test_negative_total_is_refused() -> None:
    with pytest.raises(ValueError):
        next(generate_corpus(-1))


def test_session_lengths_are_bounded_and_mostly_short(corpus_20k: list[CorpusSession]) -> None:
    lengths = sorted(len(s.messages) for s in corpus_20k)
    assert lengths[0] >= MIN_SESSION_MESSAGES and lengths[-1] <= MAX_SESSION_MESSAGES
    assert lengths[len(lengths) // 2] < (MIN_SESSION_MESSAGES + MAX_SESSION_MESSAGES) / 2


def test_cjk_sessions_are_between_10_and_20_percent(corpus_20k: list[CorpusSession]) -> None:
    languages = [s.language for s in corpus_20k]
    share = sum(lang != "en" for lang in languages) / len(languages)
    assert 0.10 <= share <= 0.20
    assert {"zh", "ja", "ko"} <= set(languages)


def test_cjk_sessions_are_written_in_their_language(corpus_20k: list[CorpusSession]) -> None:
    scripts = {"zh": r"[\u4e00-\u9fff]", "ja": r"[\u3041-\u30ff]", "ko": r"[\uac00-\ud7a3]"}
    for session in corpus_20k:
        if session.language != "en":
            prompt = session.messages[0].content or ""
            assert re.search(scripts[session.language], prompt), prompt


def test_every_tool_result_follows_the_call_it_answers(corpus_20k: list[CorpusSession]) -> None:
    for session in corpus_20k:
        assert_tool_pairs(session)


def test_tool_calls_are_openai_shaped_with_json_arguments(
    corpus_20k: list[CorpusSession],
) -> None:
    names = set()
    for session in corpus_20k[:40]:
        for message in session.messages:
            for call in message.tool_calls or ():
                assert call["id"].startswith("call_") and call["type"] == "function"
                assert isinstance(json.loads(call["function"]["arguments"]), dict)
                names.add(call["function"]["name"])
            if message.tool_calls:
                assert message.finish_reason == "tool_calls"
            if message.role == "tool":
                assert message.tool_name
    assert {"terminal", "read_file", "web_search"} <= names


def test_tool_results_are_mostly_1_to_8_kb(corpus_20k: list[CorpusSession]) -> None:
    sizes = [
        len((m.content or "").encode()) for s in corpus_20k for m in s.messages if m.role == "tool"
    ]
    assert sum(1024 <= size <= 8192 for size in sizes) / len(sizes) >= 0.85


def test_append_kwargs_use_append_message_names_and_omit_none(
    corpus_20k: list[CorpusSession],
) -> None:
    for message in corpus_20k[0].messages + corpus_20k[1].messages:
        kwargs = message.as_append_kwargs()
        assert set(kwargs) <= APPEND_KEYS
        assert {"role", "timestamp"} <= set(kwargs)
        assert None not in kwargs.values()
        if message.role == "tool":
            assert {"content", "tool_call_id", "tool_name"} <= set(kwargs)
    assert any("reasoning" in m.as_append_kwargs() for s in corpus_20k for m in s.messages)


def test_timestamps_rise_within_sessions_spread_over_six_months(
    corpus_20k: list[CorpusSession],
) -> None:
    for session in corpus_20k:
        stamps = [m.timestamp for m in session.messages]
        assert stamps == sorted(stamps) and stamps[0] >= session.started_at
    starts = [s.started_at for s in corpus_20k]
    assert starts == sorted(starts)
    assert 150 <= (starts[-1] - starts[0]) / 86_400 <= 200


def test_english_prose_vocabulary_runs_to_thousands_of_words(
    corpus_20k: list[CorpusSession],
) -> None:
    words = set()
    for session in corpus_20k:
        for message in session.messages:
            if session.language == "en" and message.role != "tool" and message.content:
                words.update(re.findall(r"[a-z]{3,}", message.content.lower()))
    assert len(words) >= 3_000


def test_content_bytes_counts_content_and_tool_call_json(
    corpus_20k: list[CorpusSession],
) -> None:
    sessions = corpus_20k[:5]
    expected = 0
    for session in sessions:
        for message in session.messages:
            expected += len((message.content or "").encode())
            if message.tool_calls:
                text = json.dumps(message.tool_calls, ensure_ascii=False, separators=(",", ":"))
                expected += len(text.encode())
    assert content_bytes(sessions) == expected


def test_session_text_does_not_depend_on_corpus_size() -> None:
    small = list(generate_corpus(4_000, seed=3))
    large = list(generate_corpus(5_000, seed=3))
    for a, b in zip(small[:-2], large):
        assert [m.content for m in a.messages] == [m.content for m in b.messages]


def test_query_sets_are_deterministic_and_full() -> None:
    queries = query_terms(1)
    assert queries == query_terms(1)
    assert set(queries) == {
        "en_1term", "en_2term", "en_phrase", "cjk_1char", "cjk_2char", "cjk_4char",
    }
    for name, items in queries.items():
        assert len(items) >= 20 and len(set(items)) == len(items), name
    assert all(len(q) == 1 for q in queries["cjk_1char"])
    assert all(len(q) == 2 for q in queries["cjk_2char"])
    assert all(len(q) == 4 for q in queries["cjk_4char"])
    assert all(len(q.split()) == 2 for q in queries["en_2term"])


def fts_quote(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


@pytest.mark.parametrize("corpus_name", ["corpus_10k", "corpus_20k"])
def test_every_query_matches_a_message(corpus_name: str, request: pytest.FixtureRequest) -> None:
    sessions: list[CorpusSession] = request.getfixturevalue(corpus_name)
    texts = [m.content for s in sessions for m in s.messages if m.role != "tool" and m.content]
    queries = query_terms(1)

    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(content, tokenize='unicode61')")
    conn.executemany("INSERT INTO t(content) VALUES (?)", ((text,) for text in texts))

    def fts_hits(match: str) -> int:
        return conn.execute("SELECT count(*) FROM t WHERE t MATCH ?", (match,)).fetchone()[0]

    for term in queries["en_1term"]:
        assert fts_hits(fts_quote(term)), term
    for pair in queries["en_2term"]:
        assert fts_hits(" AND ".join(fts_quote(t) for t in pair.split())), pair
    for phrase in queries["en_phrase"]:
        assert fts_hits(fts_quote(phrase)), phrase
    cjk = queries["cjk_1char"] + queries["cjk_2char"] + queries["cjk_4char"]
    missing = [q for q in cjk if not any(q in text for text in texts)]
    assert not missing
