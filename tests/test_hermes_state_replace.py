"""Transcript rewrite and dedupe as callers of the previous store use them: ``replace_messages``
(both modes, its insert rules, its bound), ``has_archived_messages``,
``has_platform_message_id``, and ``clear_messages``."""

from __future__ import annotations

import datetime
import math
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_state import InvalidInputError, SessionDB, SessionNotFoundError, StateDbClosedError

CALL = {"id": "call_1", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}


def contents(rows: list[dict[str, Any]]) -> list[Any]:
    return [r["content"] for r in rows]


def counters(db: SessionDB, session_id: str) -> tuple[int, int]:
    row = db.get_session(session_id)
    return row["message_count"], row["tool_call_count"]


def every_row(db: SessionDB, session_id: str) -> list[tuple[Any, bool, bool]]:
    return [(m["content"], m["active"], m["compacted"])
            for m in db.get_messages(session_id, include_inactive=True)]


@pytest.fixture
def history(db: SessionDB) -> SessionDB:
    """Session "s": a compaction archive, a rewound turn, and two live rows."""
    db.create_session("s", "cli")
    db.append_message("s", "user", "compacted away")
    db.archive_and_compact("s", [{"role": "user", "content": "summary"}])
    db.append_message("s", "assistant", "answer")
    rewound = db.append_message("s", "user", "taken back")
    db.rewind_to_message("s", rewound)
    return db


# ---------------------------------------------------------------------------------------------
# The two modes
# ---------------------------------------------------------------------------------------------


def test_a_replacement_removes_every_row_of_the_session_and_returns_none(
    history: SessionDB,
) -> None:
    db = history
    assert every_row(db, "s") == [("compacted away", False, True), ("summary", True, False),
                                  ("answer", True, False), ("taken back", False, False)]
    assert db.replace_messages("s", [{"role": "user", "content": "fresh"}]) is None
    assert every_row(db, "s") == [("fresh", True, False)]
    assert counters(db, "s") == (1, 0)
    assert not db.has_archived_messages("s")


def test_active_only_keeps_rewound_and_archived_rows(history: SessionDB) -> None:
    db = history
    assert db.replace_messages("s", [{"role": "user", "content": "fresh"}],
                               active_only=True) is None
    assert every_row(db, "s") == [("compacted away", False, True), ("taken back", False, False),
                                  ("fresh", True, False)]
    assert counters(db, "s") == (1, 0)
    assert db.has_archived_messages("s")


@pytest.mark.parametrize("active_only", [False, True])
def test_an_empty_list_empties_the_transcript(history: SessionDB, active_only: bool) -> None:
    db = history
    db.replace_messages("s", [], active_only)
    assert db.get_messages("s") == []
    assert counters(db, "s") == (0, 0)
    assert len(db.get_messages("s", include_inactive=True)) == (2 if active_only else 0)


@pytest.mark.parametrize("active_only", [False, True])
def test_a_missing_session_is_refused_and_nothing_is_written(
    db: SessionDB, active_only: bool
) -> None:
    with pytest.raises(SessionNotFoundError):
        db.replace_messages("ghost", [{"role": "user", "content": "x"}], active_only)
    assert db.message_count() == 0


def test_a_closed_handle_refuses(db_path: Path) -> None:
    db = SessionDB(db_path)
    db.create_session("s", "cli")
    db.close()
    with pytest.raises(StateDbClosedError):
        db.replace_messages("s", [{"role": "user", "content": "x"}])
    with pytest.raises(StateDbClosedError):
        db.has_archived_messages("s")
    with pytest.raises(StateDbClosedError):
        db.has_platform_message_id("s", "p1")
    with pytest.raises(StateDbClosedError):
        db.clear_messages("s")


# ---------------------------------------------------------------------------------------------
# The insert rules
# ---------------------------------------------------------------------------------------------


def test_role_defaults_to_unknown(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.replace_messages("s", [{"content": "no role"}, {"role": None, "content": "none"}])
    assert [m["role"] for m in db.get_messages("s")] == ["unknown", "unknown"]


def test_own_timestamps_are_kept_and_missing_ones_stamped_in_order(db: SessionDB) -> None:
    db.create_session("s", "cli")
    future = time.time() + 3600
    when = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.timezone.utc)
    before = time.time()
    db.replace_messages("s", [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c", "timestamp": 1000.5},
        {"role": "user", "content": "d", "timestamp": when},
        {"role": "user", "content": "e", "timestamp": future},
        {"role": "assistant", "content": "f"},
        {"role": "user", "content": "g"},
    ])
    after = time.time()
    stamps = [m["timestamp"] for m in db.get_messages("s")]
    assert before <= stamps[0] <= after
    assert stamps[1] == pytest.approx(stamps[0] + 1e-6, abs=1e-9)
    assert stamps[2:5] == [1000.5, when.timestamp(), future]
    assert stamps[5] == pytest.approx(future + 1e-6, abs=1e-6), "1 µs after a later previous row"
    assert stamps[6] > stamps[5]


def test_reasoning_is_kept_only_on_assistant_rows(db: SessionDB) -> None:
    db.create_session("s", "cli")
    reasoning = {"reasoning": "r", "reasoning_content": "rc",
                 "reasoning_details": [{"type": "reasoning.text", "text": "t"}],
                 "codex_reasoning_items": [{"id": "rs"}], "codex_message_items": [{"id": "m"}]}
    db.replace_messages("s", [{"role": role, "content": role, **reasoning}
                              for role in ("user", "assistant", "tool", "system")])
    for row in db.get_messages("s"):
        kept = {k: row[k] for k in reasoning}
        assert kept == (reasoning if row["role"] == "assistant" else dict.fromkeys(reasoning))


def test_the_platform_id_comes_from_platform_message_id_else_message_id(db: SessionDB) -> None:
    db.create_session("s", "telegram")
    db.replace_messages("s", [
        {"role": "user", "content": "a", "platform_message_id": "p1", "message_id": "m1"},
        {"role": "user", "content": "b", "message_id": "m2"},
        {"role": "user", "content": "c", "message_id": 4711},
        {"role": "user", "content": "d", "platform_message_id": "", "message_id": "m4"},
        {"role": "user", "content": "e"},
    ])
    assert [m["platform_message_id"] for m in db.get_messages("s")] == [
        "p1", "m2", "4711", "m4", None]


def test_observed_is_stored_as_a_flag(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.replace_messages("s", [{"role": "user", "content": str(v), "observed": v}
                              for v in (True, 1, "yes", False, 0, None)])
    assert [m["observed"] for m in db.get_messages("s")] == [True, True, True, False, False,
                                                             False]


def test_counters_count_the_rows_written_and_their_tool_calls(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.replace_messages("s", [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "call_2"}]},
        {"role": "assistant", "content": None, "tool_calls": {"id": "odd", "type": "function"}},
        {"role": "assistant", "content": None, "tool_calls": '[{"id": "as_text"}]'},
        {"role": "assistant", "content": "none", "tool_calls": []},
        {"role": "tool", "content": "r", "tool_call_id": "call_1", "tool_name": "terminal"},
        {"role": "user", "content": "archived", "active": False},
    ])
    assert counters(db, "s") == (6, 4)
    assert db.get_messages("s")[3]["tool_calls"] == [{"id": "as_text"}], "JSON text is parsed"


@pytest.mark.parametrize("text", ["Infinity", "-Infinity", "NaN", "1e999", "[1e999]"])
def test_tool_calls_text_that_json_cannot_carry_is_no_tool_call(db: SessionDB, text: str) -> None:
    db.create_session("s", "cli")
    db.replace_messages("s", [{"role": "assistant", "content": None, "tool_calls": text}])
    assert db.get_messages("s")[0]["tool_calls"] == []


def test_runtime_markers_are_not_stored_and_unknown_keys_are_refused(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.replace_messages("s", [{"role": "user", "content": "a", "_db_persisted": True,
                               "_compressed_summary": True}])
    assert contents(db.get_messages("s")) == ["a"]
    before = db.get_messages("s", include_inactive=True)
    with pytest.raises(InvalidInputError, match="colour"):
        db.replace_messages("s", [{"role": "user", "content": "b", "colour": "red"}])
    assert db.get_messages("s", include_inactive=True) == before


@pytest.mark.parametrize(
    "messages",
    [
        "not a list",
        {"role": "user", "content": "a dict, not a list"},
        None,
        7,
        [["role", "user"]],
        [{"role": 5, "content": "x"}],
        [{"role": "", "content": "x"}],
        [{"role": "user", "content": "x", "timestamp": "yesterday"}],
        [{"role": "user", "content": "x", "timestamp": True}],
        [{"role": "user", "content": "x", "timestamp": math.nan}],
        [{"role": "user", "content": "x", "timestamp": math.inf}],
        [{"role": "user", "content": "x", "message_id": 1.5}],
        [{"role": "user", "content": "fine"}, {"role": "user", "content": "x", "bogus": 1}],
    ],
    ids=["str", "dict", "none", "int", "row-not-dict", "role-int", "role-empty", "ts-str",
         "ts-bool", "ts-nan", "ts-inf", "platform-id-float", "second-row-bad"],
)
def test_bad_input_is_a_typed_error_and_changes_nothing(history: SessionDB, messages: Any) -> None:
    db = history
    before = db.get_messages("s", include_inactive=True)
    with pytest.raises(InvalidInputError) as refused:
        db.replace_messages("s", messages)
    assert isinstance(refused.value, ValueError)
    assert db.get_messages("s", include_inactive=True) == before


def test_replay_rows_round_trip_through_a_replacement(db: SessionDB) -> None:
    db.create_session("s", "telegram")
    db.append_message("s", "user", "hi", platform_message_id="p1", observed=True,
                      effect_disposition="applied")
    db.append_message("s", "assistant", None, tool_calls=[CALL], reasoning="think",
                      reasoning_content="", finish_reason="tool_calls")
    db.append_message("s", "tool", "out", tool_call_id="call_1", tool_name="terminal")
    replay = db.get_messages_as_conversation("s")
    db.replace_messages("s", replay)
    assert db.get_messages_as_conversation("s") == replay
    assert counters(db, "s") == (3, 1)


# ---------------------------------------------------------------------------------------------
# The bound of what the caller saw, in both modes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("active_only", [False, True])
def test_a_row_appended_after_the_read_survives_either_mode(
    history: SessionDB, db_path: Path, active_only: bool
) -> None:
    db = history
    read = db.get_messages("s")
    with SessionDB(db_path, rebuild_fts=False) as other:
        late = other.append_message("s", "user", "late turn", message_uid=uuid.uuid4().hex)
        late_uid = other.get_messages("s")[-1]["message_uid"]
    db.replace_messages("s", [{"role": "user", "content": "fresh"}], active_only,
                        seen_through_id=read[-1]["id"])
    live = db.get_messages("s")
    assert contents(live) == ["fresh", "late turn"]
    assert live[-1]["message_uid"] == late_uid and live[-1]["id"] > late
    assert counters(db, "s") == (2, 0)


def test_rows_rewound_above_the_bound_are_not_removed(history: SessionDB, db_path: Path) -> None:
    """Another process appends and rewinds after the caller's read: those rows are not the
    caller's to remove, even when the replacement removes archived and rewound rows."""
    db = history
    read = db.get_messages("s")
    with SessionDB(db_path, rebuild_fts=False) as other:
        target = other.append_message("s", "user", "appended then rewound")
        other.append_message("s", "assistant", "reply, rewound too")
        other.rewind_to_message("s", target)
    db.replace_messages("s", [{"role": "user", "content": "fresh"}],
                        seen_through_id=read[-1]["id"])
    assert every_row(db, "s") == [
        ("taken back", False, False),  # rewound before the read, but above its newest live row
        ("appended then rewound", False, False),
        ("reply, rewound too", False, False),
        ("fresh", True, False),
    ], "the archive at or below the bound is removed; nothing above it is"


def test_the_remembered_bound_still_follows_the_replacement(db: SessionDB, db_path: Path) -> None:
    """The method returns None, yet the handle remembers the rows it wrote: a later rewrite
    without a bound keeps what another process appended after them."""
    db.create_session("s", "cli")
    db.append_message("s", "user", "q")
    db.replace_messages("s", [{"role": "user", "content": "one"}])
    with SessionDB(db_path, rebuild_fts=False) as other:
        other.append_message("s", "user", "late")
    db.replace_messages("s", [{"role": "user", "content": "two"}])
    assert contents(db.get_messages("s")) == ["two", "late"]


# ---------------------------------------------------------------------------------------------
# Open inputs: any message list, either mode, against a model of the rules
# ---------------------------------------------------------------------------------------------

_roles = st.sampled_from(["user", "assistant", "tool", "system", None])
_message = st.fixed_dictionaries(
    {"content": st.text(max_size=12)},
    optional={
        "role": _roles,
        "timestamp": st.floats(min_value=0, max_value=4e9) | st.none(),
        "reasoning": st.text(max_size=5),
        "platform_message_id": st.text(max_size=4) | st.none(),
        "message_id": st.text(min_size=1, max_size=4) | st.integers(0, 10**6),
        "observed": st.booleans(),
        "tool_calls": st.none() | st.lists(st.just(CALL), max_size=3) | st.just({"id": "x"}),
        "active": st.booleans(),
        "_db_persisted": st.booleans(),
    },
)
_counter = iter(range(10**9))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(messages=st.lists(_message, max_size=8), active_only=st.booleans(),
       before=st.integers(0, 4))
def test_any_message_list_is_written_by_the_rules(
    db: SessionDB, messages: list[dict[str, Any]], active_only: bool, before: int
) -> None:
    sid = f"h{next(_counter)}"
    db.create_session(sid, "cli")
    for i in range(before):
        db.append_message(sid, "user", f"old {i}")
    if before:
        db.rewind_to_message(sid, db.get_messages(sid)[-1]["id"])
    kept = [m for m in db.get_messages(sid, include_inactive=True) if not m["active"]]
    start = time.time()

    db.replace_messages(sid, messages, active_only)

    rows = db.get_messages(sid, include_inactive=True)
    assert rows[: len(kept) if active_only else 0] == (kept if active_only else [])
    written = rows[len(kept) if active_only else 0:]
    assert len(written) == len(messages)
    clock = start
    for message, row in zip(messages, written, strict=True):
        role = message.get("role") or "unknown"
        assert (row["role"], row["content"]) == (role, message["content"])
        if message.get("timestamp") is None:
            assert row["timestamp"] >= clock
        else:
            assert row["timestamp"] == message["timestamp"]
        clock = max(clock, row["timestamp"]) + 1e-6 - 1e-9
        assert row["reasoning"] == (message.get("reasoning") if role == "assistant" else None)
        platform = message.get("platform_message_id") or message.get("message_id")
        assert row["platform_message_id"] == (None if platform is None else str(platform))
        assert row["observed"] is bool(message.get("observed"))
        assert row["active"] is message.get("active", True)
    live = [m for m in messages if m.get("active", True)]
    calls = sum(0 if m.get("tool_calls") is None else
                len(m["tool_calls"]) if isinstance(m["tool_calls"], list) else 1 for m in live)
    assert counters(db, sid) == (len(live), calls)


# ---------------------------------------------------------------------------------------------
# has_archived_messages, has_platform_message_id, clear_messages
# ---------------------------------------------------------------------------------------------


def test_has_archived_messages_sees_rewound_and_compacted_rows(db: SessionDB) -> None:
    assert db.has_archived_messages("ghost") is False
    db.create_session("s", "cli")
    assert db.has_archived_messages("s") is False
    first = db.append_message("s", "user", "q")
    assert db.has_archived_messages("s") is False
    db.rewind_to_message("s", first)
    assert db.has_archived_messages("s") is True
    db.replace_messages("s", [{"role": "user", "content": "q"}])
    assert db.has_archived_messages("s") is False
    db.archive_and_compact("s", [{"role": "user", "content": "summary"}])
    assert db.has_archived_messages("s") is True


def test_has_platform_message_id_looks_at_every_row_of_that_session_only(db: SessionDB) -> None:
    db.create_session("s", "telegram")
    db.create_session("other", "telegram")
    db.append_message("s", "user", "live", platform_message_id="p-live")
    rewound = db.append_message("s", "user", "rewound", platform_message_id="4711")
    db.append_message("other", "user", "elsewhere", platform_message_id="p-other")
    db.rewind_to_message("s", rewound)
    assert db.has_platform_message_id("s", "p-live") is True
    assert db.has_platform_message_id("s", "4711") is True, "inactive rows count"
    assert db.has_platform_message_id("s", 4711) is True, "an int is compared as its text"
    assert db.has_platform_message_id("s", "p-other") is False
    assert db.has_platform_message_id("s", "missing") is False
    assert db.has_platform_message_id("ghost", "p-live") is False
    assert db.has_platform_message_id("s", "") is False
    assert db.has_platform_message_id("s", None) is False  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        db.has_platform_message_id("s", ["p-live"])  # type: ignore[arg-type]


def test_clear_messages_returns_none_and_zeroes_both_counters(history: SessionDB) -> None:
    db = history
    db.append_message("s", "assistant", None, tool_calls=[CALL])
    assert counters(db, "s") != (0, 0)
    assert db.clear_messages("s") is None
    assert db.get_messages("s", include_inactive=True) == []
    assert counters(db, "s") == (0, 0)
    assert db.get_session("s") is not None
    with pytest.raises(SessionNotFoundError):
        db.clear_messages("ghost")
