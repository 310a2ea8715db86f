"""Bad input is refused with a typed error before anything is read or written, and a refused
turn on a quarantined handle is still spooled.

Lone surrogates in ids and sources, integers past 64 bits, tool calls JSON cannot carry and
values of the wrong type each raise an :class:`InvalidInputError` (a ``ValueError``; a wrong
type an :class:`InvalidTypeError`, also a ``TypeError``) naming the argument; the store is
unchanged. On a quarantined handle the corrupt error wins over any such value, and the turn
is spooled as faithfully as its values allow.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import file_state, leave_committed_wal, overwrite, table_pages

import hermes_state_quarantine as quarantine
from hermes_state import (
    HermesStateError,
    InvalidInputError,
    InvalidTypeError,
    SessionDB,
    StateDbCorruptError,
)

PAGE = 4096
LONE = "bad\ud800id"


def circular() -> list[Any]:
    calls: list[Any] = [{"id": "c1", "function": {"name": "terminal"}}]
    calls.append(calls)
    return calls


@pytest.fixture
def store(db: SessionDB) -> SessionDB:
    db.create_session("s1", "cli")
    db.append_message("s1", "user", "hello")
    return db


SURROGATE_CALLS: dict[str, Callable[[SessionDB], Any]] = {
    "append_message": lambda db: db.append_message(LONE, "user", "x"),
    "end_session": lambda db: db.end_session(LONE, "done"),
    "set_session_title": lambda db: db.set_session_title(LONE, "a title"),
    "get_messages": lambda db: db.get_messages(LONE),
    "list_sessions_rich": lambda db: db.list_sessions_rich(source=LONE),
    "get_session_title": lambda db: db.get_session_title(LONE),
    "create_session": lambda db: db.create_session(LONE, "cli"),
    "update_token_counts": lambda db: db.update_token_counts(LONE, 1, 1),
    "search_sessions": lambda db: db.search_sessions(source=LONE),
    "session_count": lambda db: db.session_count(source=LONE),
    "delete_session": lambda db: db.delete_session(LONE),
    "export_session": lambda db: db.export_session(LONE),
}


@pytest.mark.parametrize("call", SURROGATE_CALLS.values(), ids=SURROGATE_CALLS.keys())
def test_a_lone_surrogate_in_an_id_or_source_is_refused_typed(
    store: SessionDB, call: Callable[[SessionDB], Any]
) -> None:
    before = file_state(store.path)
    with pytest.raises(InvalidInputError) as caught:
        call(store)
    assert isinstance(caught.value, ValueError)
    assert caught.value.argument in ("session_id", "source")
    assert "lone surrogate" in str(caught.value)
    assert file_state(store.path) == before


HUGE_CALLS: dict[str, Callable[[SessionDB], Any]] = {
    "update_token_counts": lambda db: db.update_token_counts("s1", input_tokens=2**64),
    "token_count": lambda db: db.append_message("s1", "user", "x", token_count=2**70),
    "get_messages_limit": lambda db: db.get_messages("s1", limit=2**64),
    "list_sessions_rich_limit": lambda db: db.list_sessions_rich(limit=-(2**64)),
    "rewind": lambda db: db.rewind_to_message("s1", 2**63),
}


@pytest.mark.parametrize("call", HUGE_CALLS.values(), ids=HUGE_CALLS.keys())
def test_an_integer_past_64_bits_is_refused_typed(
    store: SessionDB, call: Callable[[SessionDB], Any]
) -> None:
    before = store.get_session("s1")
    with pytest.raises(InvalidInputError, match="64 bits"):
        call(store)
    assert store.get_session("s1") == before


BAD_TOOL_CALLS: dict[str, Callable[[], Any]] = {
    "circular": circular,
    "unserialisable": lambda: [{"id": "c1", "function": object()}],
    "nan": lambda: [{"id": "c1", "score": float("nan")}],
    "deep": lambda: [_deep(5000)],
}


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("make", BAD_TOOL_CALLS.values(), ids=BAD_TOOL_CALLS.keys())
def test_tool_calls_json_cannot_carry_are_refused_and_nothing_is_written(
    store: SessionDB, make: Callable[[], Any]
) -> None:
    with pytest.raises(InvalidInputError) as caught:
        store.append_message("s1", "assistant", "reply", tool_calls=make())
    assert caught.value.argument == "tool_calls"
    assert [m["content"] for m in store.get_messages("s1")] == ["hello"]
    assert store.get_session("s1")["message_count"] == 1


def test_a_wrong_type_is_an_invalid_type_error_and_still_a_type_error(store: SessionDB) -> None:
    with pytest.raises(TypeError) as caught:
        store.get_messages(["s1"])
    assert isinstance(caught.value, InvalidTypeError)
    assert isinstance(caught.value, InvalidInputError) and isinstance(caught.value, ValueError)
    assert caught.value.argument == "session_id"
    with pytest.raises(TypeError):
        store.update_token_counts("s1", input_tokens="12")
    with pytest.raises(ValueError):
        store.set_session_title("s1", "x" * 10_000)


def test_a_lookup_by_a_key_no_row_can_hold_finds_nothing(store: SessionDB) -> None:
    store.create_session("bad", "cli")  # what the key would name with the surrogate removed
    assert store.get_session("bad\ud800") is None
    assert store.resolve_session_id("bad\ud800") is None
    assert store.get_telegram_topic_binding(chat_id="c\udc00", thread_id="t") is None


def test_prose_keeps_its_text_with_lone_surrogates_removed(store: SessionDB) -> None:
    """Content is prose, not a key: it is stored cleaned, never refused."""
    store.append_message("s1", "assistant", "half \ud83d a pair")
    assert store.get_messages("s1")[-1]["content"] == "half  a pair"


def damage_last_messages_leaf(db_path: Path) -> None:
    leaf = table_pages(db_path, "messages", "leaf")[-1]
    overwrite(db_path, (leaf - 1) * PAGE, b"\xff" * PAGE)


@pytest.fixture
def quarantined(db_path: Path) -> SessionDB:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        for n in range(200):
            db.append_message("s", "user", f"message {n} " + "x" * 200)
    leave_committed_wal(db_path)
    damage_last_messages_leaf(db_path)
    handle = SessionDB(db_path)
    with pytest.raises(StateDbCorruptError):
        handle.get_messages("s")
    assert handle.quarantined
    return handle


HOSTILE_TURNS: dict[str, tuple[Callable[[], Any], Any]] = {
    "circular": (circular, [{"id": "c1", "function": {"name": "terminal"}},
                            quarantine.CIRCULAR_MARK]),
    "unserialisable": (lambda: [{"id": "c1", "function": b"raw"}],
                       [{"id": "c1", "function": "raw"}]),
    "nested": (lambda: [{"id": "c1", "args": _deep(300)}], None),
}


@pytest.mark.parametrize("case", HOSTILE_TURNS.values(), ids=HOSTILE_TURNS.keys())
def test_on_a_quarantined_handle_the_corrupt_error_wins_and_the_turn_is_spooled(
    quarantined: SessionDB, hermes_home: Path, case: tuple[Callable[[], Any], Any]
) -> None:
    make, spooled_calls = case
    before = file_state(quarantined.path)
    with pytest.raises(StateDbCorruptError) as caught:
        quarantined.append_message("s", "assistant", "the reply", tool_calls=make())
    spooled = caught.value.spooled_to
    assert spooled == hermes_home / "sessions" / "s.jsonl"
    (record,) = [json.loads(line) for line in spooled.read_text().splitlines()]
    assert record["session_id"] == "s" and record["content"] == "the reply"
    assert record["role"] == "assistant"
    if spooled_calls is not None:
        assert record["tool_calls"] == spooled_calls
    else:
        assert quarantine.TOO_DEEP_MARK in json.dumps(record["tool_calls"])
    # A surrogate id is spooled too: the corrupt error wins over every refusal.
    with pytest.raises(StateDbCorruptError) as lone:
        quarantined.append_message(LONE, "user", "still kept")
    assert lone.value.spooled_to is not None and "still kept" in lone.value.spooled_to.read_text()
    quarantined.close()
    assert file_state(quarantined.path) == before


def test_every_refusal_is_a_hermes_state_error(store: SessionDB) -> None:
    for call in [*SURROGATE_CALLS.values(), *HUGE_CALLS.values()]:
        with pytest.raises(HermesStateError):
            call(store)
