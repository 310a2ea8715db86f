"""Conversation rows (``get_messages_as_conversation``) in the previous store's keys, with this
store's lasting uids and byte-exact replay; replayed prompts and background-review turns; and
what of them reaches a provider."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from hermes_state import SessionDB, StateDbClosedError
from hermes_state_messages import BACKGROUND_REVIEW_PROMPTS
from hermes_state_replay import PROVIDER_KEYS, route_reasoning_carriers

CALL = {"id": "call_1", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}
MEMORY_BLOCK = "<memory-context>\nThe user likes tea.\n</memory-context>\n\nWhat should I drink?"


def without_uids(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in t.items() if k not in ("message_uid", "timestamp")} for t in turns]


@pytest.fixture
def rows(db: SessionDB) -> SessionDB:
    db.create_session("s", "telegram")
    db.append_message("s", "user", MEMORY_BLOCK, platform_message_id="p1", observed=True,
                      timestamp=10.0, effect_disposition="applied")
    db.append_message("s", "assistant", None, tool_calls=[CALL], finish_reason="tool_calls",
                      reasoning="", reasoning_content="", timestamp=11.0,
                      reasoning_details=[{"type": "reasoning.text", "text": "t"}],
                      codex_reasoning_items=[{"id": "rs_1"}])
    db.append_message("s", "tool", "out", tool_call_id="call_1", tool_name="terminal",
                      timestamp=12.0)
    db.append_message("s", "assistant", "Green tea.", finish_reason="stop",
                      reasoning="they like tea", timestamp=13.0, display_kind="final",
                      display_metadata={"shown": True}, token_count=4)
    return db


def test_rows_carry_the_previous_stores_keys(rows: SessionDB) -> None:
    turns = rows.get_messages_as_conversation("s")
    assert without_uids(turns) == [
        {"role": "user", "content": MEMORY_BLOCK, "message_id": "p1", "observed": True,
         "effect_disposition": "applied"},
        {"role": "assistant", "content": None, "tool_calls": [CALL],
         "finish_reason": "tool_calls", "reasoning_content": "",
         "reasoning_details": [{"type": "reasoning.text", "text": "t"}],
         "codex_reasoning_items": [{"id": "rs_1"}],
         "_tool_call_uids": turns[1]["_tool_call_uids"]},
        {"role": "tool", "content": "out", "tool_call_id": "call_1", "tool_name": "terminal",
         "_tool_call_uid": turns[1]["_tool_call_uids"]["call_1"]},
        {"role": "assistant", "content": "Green tea.", "finish_reason": "stop",
         "reasoning": "they like tea"},
    ]
    assert [t["timestamp"] for t in turns] == [10.0, 11.0, 12.0, 13.0]
    assert [t["message_uid"] for t in turns] == [m["message_uid"] for m in rows.get_messages("s")]
    assert "name" not in turns[2], "the previous store's rows name the tool tool_name"
    assert "reasoning" not in turns[1], "an empty reasoning is not restored"


def test_replay_is_byte_exact(rows: SessionDB) -> None:
    """Text is replayed as stored: a memory-context block is not stripped, api_content wins."""
    rows.append_message("s", "user", "shown text", api_content="  sent\ttext \n")
    turns = rows.get_messages_as_conversation("s")
    assert turns[0]["content"] == MEMORY_BLOCK
    assert turns[-1]["content"] == "  sent\ttext \n"


def test_include_inactive_returns_every_row(rows: SessionDB) -> None:
    first = rows.get_messages("s")[0]["id"]
    rows.archive_and_compact("s", [{"role": "user", "content": "summary"}])
    rows.append_message("s", "user", "taken back")
    rows.rewind_to_message("s", rows.get_messages("s")[-1]["id"])
    assert [t["content"] for t in rows.get_messages_as_conversation("s")] == ["summary"]
    every = rows.get_messages_as_conversation("s", include_inactive=True, include_row_ids=True)
    assert [t["content"] for t in every] == [MEMORY_BLOCK, None, "out", "Green tea.", "summary",
                                             "taken back"]
    assert every[0]["_row_id"] == first
    assert [t["content"] for t in rows.get_messages_as_conversation("s", False, True)] == [
        t["content"] for t in every]


def test_include_row_ids_is_a_keyword(rows: SessionDB) -> None:
    turns = rows.get_messages_as_conversation("s", include_row_ids=True)
    assert [t["_row_id"] for t in turns] == [m["id"] for m in rows.get_messages("s")]
    assert all("_row_id" not in t for t in rows.get_messages_as_conversation("s"))


def test_an_unknown_session_has_an_empty_conversation(db: SessionDB) -> None:
    assert db.get_messages_as_conversation("ghost") == []
    assert db.get_messages_as_conversation("ghost", include_ancestors=True) == []


def test_a_closed_handle_refuses(db_path: Path) -> None:
    db = SessionDB(db_path)
    db.create_session("s", "cli")
    db.close()
    with pytest.raises(StateDbClosedError):
        db.get_messages_as_conversation("s", include_inactive=True)


# ---------------------------------------------------------------------------------------------
# A prompt replayed into a continuation
# ---------------------------------------------------------------------------------------------


def continuation(db: SessionDB, end_reason: str = "compression") -> None:
    db.create_session("parent", "cli")
    db.append_message("parent", "user", "earlier question")
    db.append_message("parent", "assistant", "earlier answer")
    db.append_message("parent", "user", "Fix the build")
    db.end_session("parent", end_reason)
    db.create_session("child", "cli", parent_session_id="parent")
    db.append_message("child", "user", "Summary of the earlier turns", observed=True)
    db.append_message("child", "assistant", "")  # no content, no tool calls: not a reply
    db.append_message("child", "user", "Fix the build")  # the prompt, replayed
    db.append_message("child", "assistant", "Done.")


@pytest.mark.parametrize("end_reason", ["compression", "branched"])
def test_a_replayed_prompt_is_shown_once_across_the_lineage(
    db: SessionDB, end_reason: str
) -> None:
    continuation(db, end_reason)
    lineage = db.get_messages_as_conversation("child", include_ancestors=True)
    assert [t["content"] for t in lineage] == [
        "earlier question", "earlier answer", "Fix the build", "Summary of the earlier turns",
        "", "Done."]
    assert [t["content"] for t in db.get_messages_as_conversation("child")] == [
        "Summary of the earlier turns", "", "Fix the build", "Done."], "one session: all of it"


def test_a_prompt_asked_again_after_a_reply_is_kept(db: SessionDB) -> None:
    db.create_session("parent", "cli")
    db.append_message("parent", "user", "again?")
    db.end_session("parent", "compression")
    db.create_session("child", "cli", parent_session_id="parent")
    db.append_message("child", "assistant", None, tool_calls=[CALL])  # a reply (tool calls)
    db.append_message("child", "tool", "out", tool_call_id="call_1")
    db.append_message("child", "user", "again?")
    assert [t["role"] for t in db.get_messages_as_conversation("child", True)] == [
        "user", "assistant", "tool", "user"]


# ---------------------------------------------------------------------------------------------
# Background-review turns
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", BACKGROUND_REVIEW_PROMPTS)
@pytest.mark.parametrize("role", ["user", "system"])
def test_background_review_turns_are_left_out(db: SessionDB, prompt: str, role: str) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "real question")
    db.append_message("s", "assistant", "real answer")
    db.append_message("s", role, "\n  " + prompt + ". Be brief.")
    db.append_message("s", "assistant", "Reviewing.", tool_calls=[CALL])
    db.append_message("s", "tool", "saved", tool_call_id="call_1")
    db.append_message("s", "assistant", "Nothing else to save.")
    db.append_message("s", "user", "next real question")
    replay = db.get_messages_as_conversation("s")
    assert [t["content"] for t in replay] == [
        "real question", "real answer", "Nothing else to save.", "next real question"]
    assert len(db.get_messages("s")) == 7, "the rows stay stored"


def test_a_review_prompt_without_a_reply_drops_only_itself(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", BACKGROUND_REVIEW_PROMPTS[0])
    db.append_message("s", "user", "a real question right after")
    db.append_message("s", "assistant", "a real answer")
    db.append_message("s", "assistant", f"quoting: {BACKGROUND_REVIEW_PROMPTS[1]}")
    assert [t["content"] for t in db.get_messages_as_conversation("s")] == [
        "a real question right after", "a real answer",
        f"quoting: {BACKGROUND_REVIEW_PROMPTS[1]}"]


# ---------------------------------------------------------------------------------------------
# What reaches a provider
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "openrouter", "mistral", "ollama", "kimi"])
def test_only_provider_keys_leave_the_process(rows: SessionDB, provider: str) -> None:
    turns = rows.get_messages_as_conversation("s", include_row_ids=True)
    sent = route_reasoning_carriers(turns, provider=provider)
    carriers = {"reasoning", "reasoning_content", "reasoning_details"}
    for message in sent:
        assert set(message) <= set(PROVIDER_KEYS) | carriers
    assert sent[0] == {"role": "user", "content": MEMORY_BLOCK}
    assert sent[2] == {"role": "tool", "content": "out", "tool_call_id": "call_1",
                       "name": "terminal"}, "the tool's name, as providers name it"
    assert uuid.UUID(turns[0]["message_uid"]), "the uid stays in the history, not on the wire"
