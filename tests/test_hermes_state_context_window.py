"""Context windows around a message: ``get_messages_around`` and ``get_anchored_view``, checked
case by case and against a model of the rules over any session."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_state import InvalidInputError, SessionDB, StateDbClosedError

CALL = {"id": "call_1", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}
EMPTY_AROUND = {"window": [], "messages_before": 0, "messages_after": 0}
EMPTY_VIEW = {**EMPTY_AROUND, "bookend_start": [], "bookend_end": []}


def ids(rows: list[dict[str, Any]]) -> list[int]:
    return [r["id"] for r in rows]


def conversation(db: SessionDB, session_id: str = "s", turns: int = 10) -> list[int]:
    """``turns`` × (user, assistant calling a tool, tool result): the row ids in order."""
    db.create_session(session_id, "cli")
    out = []
    for n in range(turns):
        out.append(db.append_message(session_id, "user", f"question {n}"))
        out.append(db.append_message(session_id, "assistant", f"answer {n}",
                                     tool_calls=[{**CALL, "id": f"call_{n}"}]))
        out.append(db.append_message(session_id, "tool", f"output {n}",
                                     tool_call_id=f"call_{n}", tool_name="terminal"))
    return out


# ---------------------------------------------------------------------------------------------
# get_messages_around
# ---------------------------------------------------------------------------------------------


def test_the_window_is_the_anchor_and_its_neighbours_in_order(db: SessionDB) -> None:
    rows = conversation(db)
    around = db.get_messages_around("s", rows[10], window=3)
    assert ids(around["window"]) == rows[7:14]
    assert (around["messages_before"], around["messages_after"]) == (3, 3)
    assert around["window"] == db.get_messages("s")[7:14], "full rows, as get_messages reads them"


def test_fewer_rows_than_the_window_means_an_end_of_the_session(db: SessionDB) -> None:
    rows = conversation(db, turns=2)
    around = db.get_messages_around("s", rows[1])
    assert ids(around["window"]) == rows
    assert (around["messages_before"], around["messages_after"]) == (1, 4)
    assert db.get_messages_around("s", rows[0], window=0) == {
        "window": db.get_messages("s")[:1], "messages_before": 0, "messages_after": 0}
    assert ids(db.get_messages_around("s", rows[0], window=-4)["window"]) == rows[:1]


@pytest.mark.parametrize("where", ["unknown id", "other session", "unknown session"])
def test_an_anchor_outside_the_session_gives_an_empty_window(db: SessionDB, where: str) -> None:
    rows = conversation(db, turns=2)
    other = conversation(db, "other", turns=1)
    session, anchor = {"unknown id": ("s", 10**9), "other session": ("s", other[0]),
                       "unknown session": ("ghost", rows[0])}[where]
    assert db.get_messages_around(session, anchor) == EMPTY_AROUND
    assert db.get_anchored_view(session, anchor) == EMPTY_VIEW


def test_windows_include_rewound_and_archived_rows(db: SessionDB) -> None:
    rows = conversation(db, turns=3)
    db.rewind_to_message("s", rows[6])
    db.archive_and_compact("s", [{"role": "user", "content": "summary"}])
    every = db.get_messages("s", include_inactive=True)
    around = db.get_messages_around("s", rows[6], window=20)
    assert around["window"] == every
    assert [(m["active"], m["compacted"]) for m in around["window"]][5:8] == [
        (False, True), (False, False), (False, False)], "archived, then rewound"


def test_rows_are_hydrated(db: SessionDB, db_path: Path) -> None:
    db.create_session("s", "cli")
    structured = db.append_message("s", "user", "placeholder")
    broken = db.append_message("s", "assistant", None, tool_calls=[CALL])
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("UPDATE messages SET content = ? WHERE id = ?",
                 ("\x01json:" + json.dumps([{"type": "text", "text": "hi"}]), structured))
    conn.execute("UPDATE messages SET tool_calls = 'not json' WHERE id = ?", (broken,))
    conn.close()
    first, second = db.get_messages_around("s", structured, window=1)["window"]
    assert first["content"] == [{"type": "text", "text": "hi"}]
    assert second["tool_calls"] == [], "tool calls that are not JSON read as none"
    assert first["message_uid"] and first["tool_calls"] is None


@pytest.mark.parametrize("bad", [{"around_message_id": "3"}, {"around_message_id": True},
                                 {"window": 2.5}, {"window": "5"}, {"bookend": None},
                                 {"keep_roles": "user"}, {"keep_roles": (1, 2)}])
def test_arguments_of_the_wrong_kind_are_refused(db: SessionDB, bad: dict[str, Any]) -> None:
    rows = conversation(db, turns=1)
    args = {"session_id": "s", "around_message_id": rows[0], **bad}
    with pytest.raises(InvalidInputError):
        db.get_anchored_view(**args)
    if "bookend" not in bad and "keep_roles" not in bad:
        with pytest.raises(InvalidInputError):
            db.get_messages_around(**args)


def test_a_closed_handle_refuses(db_path: Path) -> None:
    db = SessionDB(db_path)
    rows = conversation(db, turns=1)
    db.close()
    with pytest.raises(StateDbClosedError):
        db.get_messages_around("s", rows[0])
    with pytest.raises(StateDbClosedError):
        db.get_anchored_view("s", rows[0])


# ---------------------------------------------------------------------------------------------
# get_anchored_view
# ---------------------------------------------------------------------------------------------


def test_the_view_keeps_user_and_assistant_rows_and_always_the_anchor(db: SessionDB) -> None:
    rows = conversation(db)  # user, assistant, tool; ten times
    tool_anchor = rows[14]
    view = db.get_anchored_view("s", tool_anchor, window=3, bookend=2)
    assert ids(view["window"]) == rows[12:17], "the tool rows around it go, the anchor stays"
    assert (view["messages_before"], view["messages_after"]) == (3, 3), "of the whole slice"
    assert ids(view["bookend_start"]) == rows[0:2]
    assert ids(view["bookend_end"]) == rows[27:29], "the last tool row is not a bookend"
    assert view["bookend_start"] == db.get_messages("s")[:2]


def test_bookends_skip_empty_content_and_are_empty_at_the_ends(db: SessionDB) -> None:
    db.create_session("s", "cli")
    rows = [db.append_message("s", "user", "")]  # no content: never a bookend
    rows += [db.append_message("s", role, f"{role} {n}")
             for n in range(6) for role in ("user", "assistant")]
    rows.append(db.append_message("s", "assistant", None, tool_calls=[CALL]))
    view = db.get_anchored_view("s", rows[6], window=1, bookend=3)
    assert ids(view["bookend_start"]) == rows[1:4]
    assert ids(view["bookend_end"]) == rows[10:13], "the call with no content is skipped"
    whole = db.get_anchored_view("s", rows[6], window=50)
    assert whole["bookend_start"] == whole["bookend_end"] == []
    assert db.get_anchored_view("s", rows[6], bookend=-2)["bookend_start"] == []


def test_keep_roles_none_drops_the_role_filter(db: SessionDB) -> None:
    rows = conversation(db)
    view = db.get_anchored_view("s", rows[15], window=1, bookend=2, keep_roles=None)
    assert ids(view["window"]) == rows[14:17]
    assert ids(view["bookend_start"]) == rows[:2]
    assert ids(view["bookend_end"]) == rows[-2:]
    only_tools = db.get_anchored_view("s", rows[15], window=1, bookend=1, keep_roles=("tool",))
    assert ids(only_tools["window"]) == [rows[14], rows[15]]
    assert ids(only_tools["bookend_start"]) == [rows[2]]


# ---------------------------------------------------------------------------------------------
# Any session, any window: against a model of the rules
# ---------------------------------------------------------------------------------------------

_row = st.tuples(st.sampled_from(["user", "assistant", "tool", "system"]),
                 st.sampled_from(["", "text", None]), st.booleans())
_counter = iter(range(10**9))


def model_view(every: list[dict[str, Any]], anchor: int, window: int, bookend: int,
               roles: tuple[str, ...] | None) -> dict[str, Any]:
    at = next(i for i, r in enumerate(every) if r["id"] == anchor)
    w, b = max(window, 0), max(bookend, 0)
    slice_ = every[max(at - w, 0): at + w + 1]

    def kept(r: dict[str, Any]) -> bool:
        return roles is None or r["role"] in roles

    def bookend_row(r: dict[str, Any]) -> bool:
        return kept(r) and bool(r["content"])

    below = [r for r in every if r["id"] < slice_[0]["id"] and bookend_row(r)]
    above = [r for r in every if r["id"] > slice_[-1]["id"] and bookend_row(r)]
    return {
        "window": [r for r in slice_ if r["id"] == anchor or kept(r)],
        "messages_before": at - max(at - w, 0),
        "messages_after": len(slice_) - 1 - (at - max(at - w, 0)),
        "bookend_start": below[:b],
        "bookend_end": above[max(len(above) - b, 0):] if b else [],
    }


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=st.lists(_row, min_size=1, max_size=14), data=st.data(),
       window=st.integers(-3, 8), bookend=st.integers(-2, 5),
       roles=st.sampled_from([("user", "assistant"), None, ("tool",), ()]))
def test_any_window_matches_the_model(
    db: SessionDB, rows: list[tuple[str, str | None, bool]], data: st.DataObject,
    window: int, bookend: int, roles: tuple[str, ...] | None,
) -> None:
    sid = f"h{next(_counter)}"
    db.create_session(sid, "cli")
    for role, content, _ in rows:
        db.append_message(sid, role, content)
    for (role, _, rewound), row in zip(rows, db.get_messages(sid), strict=True):
        if rewound and role == "user":
            db.rewind_to_message(sid, row["id"])  # inactive rows belong in windows too
    every = db.get_messages(sid, include_inactive=True)
    anchor = data.draw(st.sampled_from([r["id"] for r in every]))

    expected = model_view(every, anchor, window, bookend, roles)
    assert db.get_anchored_view(sid, anchor, window, bookend, roles) == expected
    at = ids(every).index(anchor)
    before, after = expected["messages_before"], expected["messages_after"]
    assert db.get_messages_around(sid, anchor, window) == {
        "window": every[at - before: at + after + 1],
        "messages_before": before,
        "messages_after": after,
    }
