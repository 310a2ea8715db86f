"""Messages: counters, JSON fields, lasting uids, tool-call pairing, replay bytes, text cleaning,
and typed errors for bad input."""

from __future__ import annotations

import inspect
import math
import sqlite3
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_state import SessionDB, SessionNotFoundError

HEX32 = set("0123456789abcdef")


def is_uid(value: Any) -> bool:
    return (
        isinstance(value, str)
        and len(value) == 32
        and set(value) <= HEX32
        and uuid.UUID(hex=value).version == 4
    )


def without_lone_surrogates(text: str) -> str:
    """What the store keeps of ``text``: a high surrogate directly followed by a low one is the
    character they encode; every other surrogate is dropped; nothing else changes."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if "\ud800" <= ch <= "\udbff" and i + 1 < len(text) and "\udc00" <= text[i + 1] <= "\udfff":
            out.append(chr(0x10000 + ((ord(ch) - 0xD800) << 10) + (ord(text[i + 1]) - 0xDC00)))
            i += 2
            continue
        if not "\ud800" <= ch <= "\udfff":
            out.append(ch)
        i += 1
    return "".join(out)


def cleaned(value: Any) -> Any:
    if isinstance(value, str):
        return without_lone_surrogates(value)
    if isinstance(value, list):
        return [cleaned(v) for v in value]
    if isinstance(value, dict):
        return {cleaned(k): cleaned(v) for k, v in value.items()}
    return value


def call(call_id: str, name: str = "terminal", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.fixture
def s(db: SessionDB) -> str:
    return db.create_session("s", "cli")


# --- the public signature ---

APPEND_MESSAGE_PARAMETERS = [
    ("session_id", inspect.Parameter.empty), ("role", inspect.Parameter.empty),
    ("content", None), ("tool_name", None), ("tool_calls", None), ("tool_call_id", None),
    ("token_count", None), ("finish_reason", None), ("reasoning", None),
    ("reasoning_content", None), ("reasoning_details", None), ("codex_reasoning_items", None),
    ("codex_message_items", None), ("platform_message_id", None), ("observed", False),
    ("effect_disposition", None), ("api_content", None), ("display_kind", None),
    ("display_metadata", None), ("message_uid", None), ("timestamp", None),
]


def test_append_message_keeps_the_documented_signature() -> None:
    params = list(inspect.signature(SessionDB.append_message).parameters.values())
    assert params[0].name == "self"
    documented = [(p.name, p.default) for p in params[1 : 1 + len(APPEND_MESSAGE_PARAMETERS)]]
    assert documented == APPEND_MESSAGE_PARAMETERS
    assert SessionDB.append_message.__name__ == "append_message"


def test_reading_methods_keep_their_documented_keywords() -> None:
    def defaults(method: Any) -> dict[str, Any]:
        params = inspect.signature(method).parameters.values()
        return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}

    assert defaults(SessionDB.get_messages) == {
        "include_inactive": False, "limit": None, "offset": 0
    }
    assert defaults(SessionDB.get_messages_as_conversation) == {
        "include_ancestors": False, "include_inactive": False, "repair_alternation": False,
        "include_row_ids": False,
    }


def test_positional_arguments_follow_the_documented_order(db: SessionDB, s: str) -> None:
    db.append_message(s, "tool", "out", "terminal", None, "call-1", 7)
    m = db.get_messages(s)[0]
    assert (m["content"], m["tool_name"], m["tool_call_id"], m["token_count"]) == (
        "out", "terminal", "call-1", 7
    )


# --- counters --------------------------------------------------------------------------------


def test_append_returns_increasing_row_ids_and_counts_messages(db: SessionDB, s: str) -> None:
    first = db.append_message(s, "user", "a")
    second = db.append_message(s, "assistant", "b")
    assert second > first
    assert db.get_session(s)["message_count"] == 2


def test_tool_calls_are_counted_per_call_on_assistant_rows_only(db: SessionDB, s: str) -> None:
    db.append_message(s, "user", "do three things")
    db.append_message(s, "assistant", None, tool_calls=[call("a"), call("b"), call("c")])
    for cid in "abc":
        db.append_message(s, "tool", "done", tool_call_id=cid, tool_name="terminal")
    db.append_message(s, "assistant", "and one more", tool_calls=[call("d")])
    db.append_message(s, "assistant", "no calls", tool_calls=[])
    row = db.get_session(s)
    assert (row["message_count"], row["tool_call_count"]) == (7, 4)


def test_tool_calls_given_as_a_tuple_count_and_get_uids(db: SessionDB, s: str) -> None:
    db.append_message(s, "assistant", None, tool_calls=(call("a"), call("b")))
    (m,) = db.get_messages(s)
    assert m["tool_calls"] == [call("a"), call("b")]
    assert set(m["tool_call_uids"]) == {"a", "b"}
    assert db.get_session(s)["tool_call_count"] == 2


# --- JSON fields -----------------------------------------------------------------------------

JSON_VALUES = {
    "tool_calls": [call("c1", "search", '{"q": "東京"}'), call("c2")],
    "reasoning_details": [{"type": "reasoning.text", "text": "step", "signature": None,
                           "index": 0, "nested": {"ok": True, "ratio": 0.5}}],
    "codex_reasoning_items": [{"id": "rs_1", "summary": [{"text": "s"}], "encrypted": "xyz=="}],
    "codex_message_items": [{"type": "message", "content": [{"type": "output_text",
                                                              "text": "答え"}]}],
    "display_metadata": {"owner": {"platform": "telegram", "chat": "-100", "ids": [1, 2]}},
    "absorbed_message_uids": [uuid.uuid4().hex, uuid.uuid4().hex],
    "tool_call_uids": {"c1": uuid.uuid4().hex, "c2": [uuid.uuid4().hex, uuid.uuid4().hex]},
}


def test_every_json_field_round_trips(db: SessionDB, s: str) -> None:
    db.append_message(s, "assistant", "x", **JSON_VALUES)
    (message,) = db.get_messages(s)
    for name, value in JSON_VALUES.items():
        assert message[name] == value, name


def test_json_fields_are_stored_as_json_text(db: SessionDB, s: str) -> None:
    import json

    db.append_message(s, "assistant", "x", **JSON_VALUES)
    conn = sqlite3.connect(db.path)
    try:
        cursor = conn.execute(f"SELECT {', '.join(JSON_VALUES)} FROM messages")
        stored = dict(zip(JSON_VALUES, cursor.fetchone()))
    finally:
        conn.close()
    for name, text in stored.items():
        assert isinstance(text, str) and json.loads(text) == JSON_VALUES[name], name


def test_absent_json_fields_stay_null(db: SessionDB, s: str) -> None:
    db.append_message(s, "user", "plain")
    (message,) = db.get_messages(s)
    assert all(message[name] is None for name in JSON_VALUES)


# --- message uids ----------------------------------------------------------------------------


def test_message_uid_is_a_uuid4_hex_issued_once(db: SessionDB, s: str) -> None:
    for i in range(20):
        db.append_message(s, "user", str(i))
    uids = [m["message_uid"] for m in db.get_messages(s)]
    assert all(is_uid(u) for u in uids)
    assert len(set(uids)) == 20
    assert [m["message_uid"] for m in db.get_messages(s)] == uids


def test_a_given_message_uid_is_kept(db: SessionDB, s: str) -> None:
    uid = uuid.uuid4().hex
    db.append_message(s, "user", "copied", message_uid=uid)
    assert db.get_messages(s)[0]["message_uid"] == uid


def test_replace_messages_keeps_uids_and_recounts(db: SessionDB, s: str) -> None:
    db.append_message(s, "user", "one")
    db.append_message(s, "assistant", None, tool_calls=[call("c1"), call("c2")])
    db.append_message(s, "tool", "r", tool_call_id="c1")
    db.append_message(s, "tool", "r", tool_call_id="c2")
    db.append_message(s, "user", "dropped")
    before = db.get_messages(s)
    kept = before[:4]
    assert db.replace_messages(s, kept) is None
    after = db.get_messages(s)
    assert min(m["id"] for m in after) > max(m["id"] for m in before)
    for old, new in zip(kept, after):
        for key in ("message_uid", "content", "tool_calls", "tool_call_uids", "tool_call_uid",
                    "timestamp", "role"):
            assert new[key] == old[key], key
    row = db.get_session(s)
    assert (row["message_count"], row["tool_call_count"]) == (4, 2)


def test_replace_messages_counts_only_the_active_rows(db: SessionDB, s: str) -> None:
    db.replace_messages(s, [
        {"role": "user", "content": "archived", "active": False},
        {"role": "assistant", "content": None, "tool_calls": [call("x")], "active": False},
        {"role": "user", "content": "live"},
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
    ])
    row = db.get_session(s)
    assert (row["message_count"], row["tool_call_count"]) == (2, 2)
    assert db.message_count(s) == 2
    db.append_message(s, "user", "next")
    assert db.get_session(s)["message_count"] == db.message_count(s) == 3


def test_replace_messages_accepts_the_replay_format(db: SessionDB, s: str) -> None:
    db.append_message(s, "user", "q")
    db.append_message(s, "assistant", None, tool_calls=[call("c1")])
    db.append_message(s, "tool", "r", tool_call_id="c1", tool_name="terminal")
    replay = db.get_messages_as_conversation(s, include_row_ids=True)
    db.replace_messages(s, replay)
    assert db.get_messages_as_conversation(s) == [
        {k: v for k, v in turn.items() if k != "_row_id"} for turn in replay
    ]


def test_uids_survive_export_and_reinsert(db: SessionDB, s: str) -> None:
    db.append_message(s, "user", "hello", display_metadata={"k": 1})
    db.append_message(s, "assistant", None, tool_calls=[call("c1")], reasoning="think")
    db.append_message(s, "tool", "out", tool_call_id="c1", tool_name="terminal")
    exported = db.export_session(s)
    db.create_session("copy", "cli")
    db.replace_messages("copy", exported["messages"])
    copied = db.get_messages("copy")
    for old, new in zip(exported["messages"], copied, strict=True):
        assert {k: v for k, v in new.items() if k not in ("id", "session_id")} == {
            k: v for k, v in old.items() if k not in ("id", "session_id")
        }


def test_bad_uids_are_refused(db: SessionDB, s: str) -> None:
    for bad in ("xyz", "A" * 32, uuid.uuid4().hex[:31], uuid.uuid4().hex + "0", 12345):
        with pytest.raises((ValueError, TypeError)):
            db.append_message(s, "user", "x", message_uid=bad)
    with pytest.raises(ValueError):
        db.append_message(s, "tool", "x", tool_call_id="c", tool_call_uid="not-a-uid")
    assert db.get_messages(s) == [] and db.get_session(s)["message_count"] == 0


# --- tool-call uids --------------------------------------------------------------------------


def test_assistant_rows_get_one_uid_per_tool_call_id(db: SessionDB, s: str) -> None:
    db.append_message(s, "assistant", None, tool_calls=[call("c1"), call("c2"), call("c1")])
    uids = db.get_messages(s)[0]["tool_call_uids"]
    assert set(uids) == {"c1", "c2"}
    assert all(is_uid(u) for u in uids.values()) and uids["c1"] != uids["c2"]
    db.append_message(s, "assistant", "no tools")
    assert db.get_messages(s)[1]["tool_call_uids"] is None


def test_tool_results_are_paired_with_their_call(db: SessionDB, s: str) -> None:
    db.append_message(s, "assistant", None, tool_calls=[call("c1"), call("c2")])
    db.append_message(s, "tool", "two", tool_call_id="c2")
    db.append_message(s, "tool", "one", tool_call_id="c1")
    db.append_message(s, "tool", "stray", tool_call_id="unknown")
    caller, two, one, stray = db.get_messages(s)
    assert two["tool_call_uid"] == caller["tool_call_uids"]["c2"]
    assert one["tool_call_uid"] == caller["tool_call_uids"]["c1"]
    assert stray["tool_call_uid"] is None


def test_folded_turns_pair_results_by_occurrence(db: SessionDB, s: str) -> None:
    first, second, other = (uuid.uuid4().hex for _ in range(3))
    db.append_message(s, "assistant", None, tool_calls=[call("c1"), call("c2"), call("c1")],
                      tool_call_uids={"c1": [first, second], "c2": other})
    for cid in ("c1", "c2", "c1"):
        db.append_message(s, "tool", cid, tool_call_id=cid)
    results = db.get_messages(s)[1:]
    assert [r["tool_call_uid"] for r in results] == [first, other, second]
    replay = db.get_messages_as_conversation(s)
    assert replay[0]["_tool_call_uids"] == {"c1": [first, second], "c2": other}
    assert [t["_tool_call_uid"] for t in replay[1:]] == [first, other, second]


def test_tool_calls_json_is_never_rewritten(db: SessionDB, s: str) -> None:
    calls = [call("c1", "a", '{"x": 1}'), call("c1", "a", '{"x": 2}')]
    db.append_message(s, "assistant", None, tool_calls=calls)
    assert db.get_messages(s)[0]["tool_calls"] == calls


@pytest.mark.parametrize("folded", [False, True])
def test_missing_tool_call_uid_is_derived_on_read(db: SessionDB, s: str, folded: bool) -> None:
    u1, u2 = uuid.uuid4().hex, uuid.uuid4().hex
    mapping = {"c1": [u1, u2]} if folded else {"c1": u1}
    db.append_message(s, "assistant", None, tool_calls=[call("c1")], tool_call_uids=mapping)
    db.append_message(s, "tool", "a", tool_call_id="c1")
    db.append_message(s, "tool", "b", tool_call_id="c1")
    # A row written by an older writer carries no pairing.
    conn = sqlite3.connect(db.path)
    with conn:
        conn.execute("UPDATE messages SET tool_call_uid = NULL WHERE role = 'tool'")
    conn.close()
    assert [m["tool_call_uid"] for m in db.get_messages(s)[1:]] == [None, None]
    replay = db.get_messages_as_conversation(s)
    expected = [u1, u2] if folded else [u1, u1]
    assert [t["_tool_call_uid"] for t in replay[1:]] == expected


# --- reasoning and replay bytes --------------------------------------------------------------


@pytest.mark.parametrize("content", [None, ""])
def test_reasoning_only_reply_replays_its_reasoning_byte_for_byte(
    db: SessionDB, s: str, content: str | None
) -> None:
    text = "  The answer is 42.\n\n— 理由:  spaces  kept \t"
    db.append_message(s, "user", "question")
    db.append_message(s, "assistant", content, finish_reason="stop", reasoning=text,
                      reasoning_content=text)
    stored = db.get_messages(s)[1]
    assert stored["content"] == ""
    assert (stored["reasoning"], stored["reasoning_content"], stored["api_content"]) == (
        text, text, text
    )
    turn = db.get_messages_as_conversation(s)[1]
    assert turn["content"] == text
    assert turn["reasoning"] == text and turn["reasoning_content"] == text


def test_reasoning_only_reply_with_reasoning_field_alone(db: SessionDB, s: str) -> None:
    db.append_message(s, "assistant", "", finish_reason="stop", reasoning="only here")
    assert db.get_messages(s)[0]["api_content"] == "only here"
    assert db.get_messages_as_conversation(s)[0]["content"] == "only here"


@pytest.mark.parametrize(
    "extra",
    [{"finish_reason": "length"}, {"finish_reason": "stop", "tool_calls": [call("c")]},
     {"finish_reason": "stop", "content": "real answer"}],
    ids=["cut-off", "tool-call", "has-content"],
)
def test_other_replies_with_reasoning_keep_content_as_sent(
    db: SessionDB, s: str, extra: dict[str, Any]
) -> None:
    fields = {"content": "", **extra}
    db.append_message(s, "assistant", reasoning="thinking", **fields)
    stored = db.get_messages(s)[0]
    assert stored["api_content"] is None
    assert db.get_messages_as_conversation(s)[0]["content"] == fields["content"]


def test_api_content_replaces_content_in_the_replay(db: SessionDB, s: str) -> None:
    db.append_message(s, "user", "what I typed", api_content="what I typed\n[memory: x]")
    db.append_message(s, "user", "sent as is")
    stored = db.get_messages(s)
    assert stored[0]["content"] == "what I typed"
    replay = db.get_messages_as_conversation(s)
    assert [t["content"] for t in replay] == ["what I typed\n[memory: x]", "sent as is"]


def test_reasoning_is_restored_on_assistant_turns(db: SessionDB, s: str) -> None:
    details = [{"type": "reasoning.encrypted", "data": "abc"}]
    db.append_message(s, "assistant", "hi", reasoning="r", reasoning_content="rc",
                      reasoning_details=details, codex_reasoning_items=[{"id": "rs"}],
                      codex_message_items=[{"id": "msg"}], finish_reason="stop")
    turn = db.get_messages_as_conversation(s)[0]
    assert (turn["reasoning"], turn["reasoning_content"], turn["reasoning_details"]) == (
        "r", "rc", details
    )
    assert turn["codex_reasoning_items"] == [{"id": "rs"}]
    assert turn["codex_message_items"] == [{"id": "msg"}]


# --- the replay list -------------------------------------------------------------------------

REPLAY_KEYS = {
    "role", "content", "timestamp", "tool_calls", "tool_call_id", "tool_name",
    "effect_disposition", "message_id", "observed", "finish_reason", "reasoning",
    "reasoning_content", "reasoning_details", "codex_reasoning_items", "codex_message_items",
    "message_uid", "_absorbed_message_uids", "_tool_call_uids", "_tool_call_uid", "_row_id",
}


def test_replay_carries_uids_but_no_display_metadata(db: SessionDB, s: str) -> None:
    absorbed = [uuid.uuid4().hex]
    db.append_message(s, "user", "hi", display_kind="input", platform_message_id="p1",
                      display_metadata={"owner": "gateway:telegram:1"}, observed=False,
                      effect_disposition="applied", absorbed_message_uids=absorbed)
    db.append_message(s, "assistant", None, tool_calls=[call("c1")])
    db.append_message(s, "tool", "r", tool_call_id="c1", tool_name="terminal")
    replay = db.get_messages_as_conversation(s)
    uids = [m["message_uid"] for m in db.get_messages(s)]
    assert [t["message_uid"] for t in replay] == uids
    assert all(set(t) <= REPLAY_KEYS - {"_row_id"} for t in replay)
    assert replay[0]["_absorbed_message_uids"] == absorbed
    assert replay[2]["tool_name"] == "terminal" and replay[2]["tool_call_id"] == "c1"
    assert (replay[0]["message_id"], replay[0]["effect_disposition"]) == ("p1", "applied")
    assert "observed" not in replay[0], "observed appears only when true"
    assert "gateway:telegram:1" not in repr(replay)
    with_ids = db.get_messages_as_conversation(s, include_row_ids=True)
    assert [t["_row_id"] for t in with_ids] == [m["id"] for m in db.get_messages(s)]


def test_replay_with_ancestors_starts_at_the_lineage_root(db: SessionDB) -> None:
    db.create_session("root", "cli")
    db.append_message("root", "user", "r1")
    db.end_session("root", "compression")
    db.create_session("mid", "cli", parent_session_id="root")
    db.append_message("mid", "user", "m1")
    db.create_session("tip", "cli", parent_session_id="mid")
    db.append_message("tip", "user", "t1")
    db.append_message("tip", "assistant", "t2")
    replay = db.get_messages_as_conversation("tip", include_ancestors=True)
    contents = [t["content"] for t in replay]
    assert contents == ["r1", "m1", "t1", "t2"]
    assert [t["content"] for t in db.get_messages_as_conversation("tip")] == ["t1", "t2"]


def test_replay_skips_archived_generations(db: SessionDB, s: str) -> None:
    db.replace_messages(s, [{"role": "user", "content": "old", "active": False},
                            {"role": "user", "content": "new"}])
    assert [t["content"] for t in db.get_messages_as_conversation(s)] == ["new"]


# --- reading ---------------------------------------------------------------------------------


def test_get_messages_pagination_and_inactive_rows(db: SessionDB, s: str) -> None:
    db.replace_messages(s, [{"role": "user", "content": "archived", "active": False}])
    for i in range(5):
        db.append_message(s, "user", f"m{i}")
    assert [m["content"] for m in db.get_messages(s)] == [f"m{i}" for i in range(5)]
    assert [m["content"] for m in db.get_messages(s, limit=2)] == ["m0", "m1"]
    assert [m["content"] for m in db.get_messages(s, limit=2, offset=3)] == ["m3", "m4"]
    assert [m["content"] for m in db.get_messages(s, offset=4)] == ["m4"]
    everything = db.get_messages(s, include_inactive=True)
    assert [(m["content"], m["active"]) for m in everything][:2] == [
        ("archived", False), ("m0", True)
    ]
    assert db.message_count(s) == 5
    assert db.get_messages("no-such-session") == []


def test_fields_and_timestamp_round_trip(db: SessionDB, s: str) -> None:
    db.append_message(s, "assistant", "c", tool_name="t", token_count=12, finish_reason="stop",
                      platform_message_id="pm", observed=True, effect_disposition="ed",
                      display_kind="dk", timestamp=1234.5)
    m = db.get_messages(s)[0]
    assert (m["tool_name"], m["token_count"], m["finish_reason"], m["platform_message_id"]) == (
        "t", 12, "stop", "pm"
    )
    assert (m["observed"], m["effect_disposition"], m["display_kind"], m["timestamp"]) == (
        True, "ed", "dk", 1234.5
    )


# --- text cleaning ---------------------------------------------------------------------------

LONE = "\ud800"
TEXT_FIELDS = (
    "content", "tool_name", "tool_call_id", "finish_reason", "reasoning", "reasoning_content",
    "platform_message_id", "effect_disposition", "api_content", "display_kind",
)


def test_lone_surrogates_in_every_text_field_are_removed_only(db: SessionDB, s: str) -> None:
    text = {name: f"{name}{LONE}\x00tail\udfff😀" for name in TEXT_FIELDS}
    json_fields = {
        "tool_calls": [call("c" + LONE, "n" + LONE, '{"k": "v' + LONE + '"}')],
        "reasoning_details": [{"text": "x" + LONE}],
        "codex_reasoning_items": ["a" + LONE],
        "codex_message_items": {"m": LONE},
        "display_metadata": {"k": "v" + LONE},
    }
    db.append_message(s, "assistant", **text, **json_fields)
    (m,) = db.get_messages(s)
    for name in TEXT_FIELDS:
        assert m[name] == f"{name}\x00tail😀", name
    for name, value in json_fields.items():
        assert m[name] == cleaned(value), name
    assert m["tool_call_uids"] == {"c": m["tool_call_uids"]["c"]}
    db.append_message(s, "tool" + LONE, "r", tool_call_id="c" + LONE)
    assert db.get_messages(s)[1]["tool_call_uid"] == m["tool_call_uids"]["c"]


def test_surrogates_elsewhere_are_accepted_too(db: SessionDB) -> None:
    db.create_session("s", "cli" + LONE, model="m" + LONE, system_prompt="p" + LONE,
                      model_config={"k": "v" + LONE}, cwd="/w" + LONE)
    row = db.get_session("s")
    assert (row["source"], row["model"], row["system_prompt"], row["cwd"]) == (
        "cli", "m", "p", "/w"
    )
    assert LONE not in row["model_config"]
    db.update_system_prompt("s", "q" + LONE)
    db.update_token_counts("s", input_tokens=1, model="x" + LONE, billing_provider="b" + LONE)
    db.end_session("s", "done" + LONE)
    db.set_meta("k" + LONE, "v" + LONE)
    assert db.get_session("s")["end_reason"] == "done"
    assert db.get_meta("k") == "v"


def test_surrogate_pair_spelled_in_halves_becomes_its_character(db: SessionDB, s: str) -> None:
    db.append_message(s, "user", "smile \ud83d\ude00 and lone \ud83d!")
    assert db.get_messages(s)[0]["content"] == "smile 😀 and lone !"


# The db fixture is shared by every example on purpose: each example appends and reads back
# its own row.
FIXTURE_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
TEXT_WITH_SURROGATES = st.text(
    st.one_of(st.characters(), st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "\x00"]))
)


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURE_OK)
@given(content=TEXT_WITH_SURROGATES, api_content=st.none() | TEXT_WITH_SURROGATES)
def test_any_text_round_trips_minus_lone_surrogates(
    db: SessionDB, content: str, api_content: str | None
) -> None:
    sid = db.ensure_session("prop")
    db.append_message(sid, "user", content, api_content=api_content)
    stored = db.get_messages(sid, limit=1, offset=db.message_count(sid) - 1)[0]
    assert stored["content"] == without_lone_surrogates(content)
    expected_api = None if api_content is None else without_lone_surrogates(api_content)
    assert stored["api_content"] == expected_api
    replay = db.get_messages_as_conversation(sid)[-1]
    assert replay["content"] == (stored["content"] if api_content is None else expected_api)


JSON_SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False) | TEXT_WITH_SURROGATES
)
JSON_VALUES_ST = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None, suppress_health_check=FIXTURE_OK)
@given(value=JSON_VALUES_ST)
def test_any_json_value_round_trips(db: SessionDB, value: Any) -> None:
    sid = db.ensure_session("json")
    db.append_message(sid, "assistant", "x", reasoning_details=value, display_metadata=value)
    stored = db.get_messages(sid, limit=1, offset=db.message_count(sid) - 1)[0]
    expected = cleaned(value)
    if value is None:
        assert stored["reasoning_details"] is None
    else:
        assert stored["reasoning_details"] == expected
        assert stored["display_metadata"] == expected


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content", [123, b"bytes", 1.5, [b"bytes"], {"type": "text", "text": object()}]
)
def test_content_that_is_neither_text_nor_json_is_a_type_error(
    db: SessionDB, s: str, content: Any
) -> None:
    with pytest.raises(TypeError):
        db.append_message(s, "user", content)
    assert db.get_session(s)["message_count"] == 0


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"role": ""}, ValueError),
        ({"role": None}, ValueError),
        ({"role": "user", "timestamp": math.nan}, ValueError),
        ({"role": "user", "timestamp": "yesterday"}, TypeError),
        ({"role": "user", "token_count": "12"}, TypeError),
        ({"role": "user", "reasoning": 5}, TypeError),
        ({"role": "user", "tool_call_id": 7}, TypeError),
    ],
)
def test_bad_fields_are_typed_errors(db: SessionDB, s: str, fields: dict, error: type) -> None:
    with pytest.raises(error):
        db.append_message(s, **fields)
    assert db.get_messages(s) == [] and db.get_session(s)["message_count"] == 0


def test_unknown_session_is_session_not_found(db: SessionDB) -> None:
    with pytest.raises(SessionNotFoundError) as info:
        db.append_message("ghost", "user", "hello?")
    assert info.value.session_id == "ghost"
    assert isinstance(info.value, KeyError)
    with pytest.raises(SessionNotFoundError):
        db.replace_messages("ghost", [{"role": "user", "content": "x"}])
    assert db.message_count() == 0
