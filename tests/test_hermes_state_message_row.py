"""The message row type: every column named once, each field checked as it is built, the
reasoning-only reply rule and uid issuing as their own steps, and the mapping entry point the
rewrites and imports use."""

from __future__ import annotations

import dataclasses
import re
import sqlite3
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hermes_state_messages as messages
from hermes_state import SessionDB
from hermes_state_messages import MESSAGE_FIELDS, MessageRow
from state_helpers import raw

UID = re.compile(r"[0-9a-f]{32}")


@pytest.fixture
def conn(db: SessionDB) -> Iterator[sqlite3.Connection]:
    """A connection to a store with one empty session: building a row queries only to pair
    a live tool result, which finds no call here."""
    db.create_session("s", "cli")
    with raw(db.db_path) as opened:
        yield opened


def test_the_row_has_one_field_per_column_in_column_order(conn: sqlite3.Connection) -> None:
    assert [f.name for f in dataclasses.fields(MessageRow)] == ["session_id", *MESSAGE_FIELDS]
    values = MessageRow.build(conn, "s", role="user", content="hi").values()
    assert len(values) == len(MESSAGE_FIELDS) + 2  # session_id first, search_cjk last
    assert messages.INSERT_MESSAGE_SQL.count("?") == len(values)


def test_a_row_is_frozen(conn: sqlite3.Connection) -> None:
    row = MessageRow.build(conn, "s", role="user", content="hi")
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.content = "changed"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "error", "text"),
    [
        ({"role": ""}, ValueError, "role must be a non-empty string"),
        ({"role": None}, ValueError, "role must be a non-empty string"),
        ({"role": "user", "content": 5}, TypeError, "content must be a string or None"),
        ({"role": "user", "token_count": True}, TypeError, "token_count must be an int"),
        ({"role": "user", "timestamp": "now"}, TypeError, "timestamp must be a number"),
        ({"role": "user", "timestamp": float("inf")}, ValueError, "timestamp must be finite"),
        ({"role": "user", "message_uid": "X" * 32}, ValueError, "message_uid must be 32"),
        ({"role": "tool", "tool_call_uid": "short"}, ValueError, "tool_call_uid must be 32"),
        ({"role": "user", "colour": "red"}, TypeError, "unknown message fields: colour"),
    ],
)
def test_each_field_is_checked_as_the_row_is_built(
    conn: sqlite3.Connection, fields: dict[str, object], error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=text):
        MessageRow.from_fields(conn, "s", fields)


def test_a_reasoning_only_successful_reply_replays_its_reasoning(
    conn: sqlite3.Connection,
) -> None:
    row = MessageRow.build(conn, "s", role="assistant", content=None, finish_reason="stop",
                           reasoning_content="the answer is 4")
    assert (row.content, row.api_content) == ("", "the answer is 4")
    kept = MessageRow.build(conn, "s", role="assistant", finish_reason="stop",
                            reasoning="thought", api_content="sent bytes")
    assert (kept.content, kept.api_content) == ("", "sent bytes")
    for other in (
        {"role": "user", "finish_reason": "stop", "reasoning": "r"},
        {"role": "assistant", "finish_reason": "length", "reasoning": "r"},
        {"role": "assistant", "finish_reason": "stop", "reasoning": "r",
         "tool_calls": [{"id": "c1"}]},
        {"role": "assistant", "finish_reason": "stop", "content": "said", "reasoning": "r"},
    ):
        row = MessageRow.from_fields(conn, "s", other)
        assert row.api_content is None and row.content == other.get("content"), other


def test_uids_are_issued_only_where_none_is_given(conn: sqlite3.Connection) -> None:
    fresh = MessageRow.build(conn, "s", role="assistant",
                             tool_calls=[{"id": "a"}, {"id": "b"}, {"id": "a"}])
    assert UID.fullmatch(fresh.message_uid)
    assert sorted(fresh.tool_call_uids) == ["a", "b"]
    assert all(UID.fullmatch(uid) for uid in fresh.tool_call_uids.values())
    carried = MessageRow.build(conn, "s", role="assistant", message_uid="1" * 32,
                               tool_calls=[{"id": "a"}], tool_call_uids={"a": "2" * 32})
    assert (carried.message_uid, carried.tool_call_uids) == ("1" * 32, {"a": "2" * 32})
    assert MessageRow.build(conn, "s", role="user").tool_call_uids is None


def test_a_live_tool_result_takes_the_uid_its_call_was_issued(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "assistant", tool_calls=[{"id": "call_1", "type": "function"}])
    db.append_message("s", "tool", "output", tool_call_id="call_1")
    call, result = db.get_messages("s")
    assert result["tool_call_uid"] == call["tool_call_uids"]["call_1"]


@given(text=st.text(max_size=40))
def test_text_keeps_every_character_but_lone_surrogates(text: str) -> None:
    conn = sqlite3.connect(":memory:")
    row = MessageRow.build(conn, "s", role="user", content=text + "\ud800")
    conn.close()
    assert row.content == "".join(c for c in text if not 0xD800 <= ord(c) <= 0xDFFF)


def test_insert_message_takes_a_mapping_and_moves_the_counters_on_request(
    db: SessionDB,
) -> None:
    db.create_session("s", "cli")
    fields = {"role": "assistant", "content": "hi", "tool_calls": [{"id": "c"}]}
    with raw(db.db_path, write=True) as c:
        first = messages.insert_message(c, "s", fields)
        copy = messages.insert_message(c, "s", fields, count=False)
    assert copy > first
    session = db.get_session("s")
    assert (session["message_count"], session["tool_call_count"]) == (1, 1)
