"""Rewind (``/undo``, ``/rewind``): ``list_recent_user_messages``, ``rewind_to_message``,
``restore_rewound``; rewound rows against compaction archives, in new and in older stores."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hermes_state import InvalidInputError, SessionDB, SessionNotFoundError, StateDbClosedError

CALL = {"id": "call_1", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}


def flags(db: SessionDB, session_id: str) -> list[tuple[Any, bool, bool]]:
    return [(m["content"], m["active"], m["compacted"])
            for m in db.get_messages(session_id, include_inactive=True)]


def seed(db: SessionDB, session_id: str = "s") -> list[int]:
    """user, assistant (tool call), tool, user, assistant: the five row ids."""
    db.create_session(session_id, "cli")
    return [
        db.append_message(session_id, "user", "first question"),
        db.append_message(session_id, "assistant", None, tool_calls=[CALL]),
        db.append_message(session_id, "tool", "output", tool_call_id="call_1",
                          tool_name="terminal"),
        db.append_message(session_id, "user", "second question"),
        db.append_message(session_id, "assistant", "second answer"),
    ]


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


# ---------------------------------------------------------------------------------------------
# list_recent_user_messages
# ---------------------------------------------------------------------------------------------


def test_recent_user_messages_are_newest_first_and_live_by_default(db: SessionDB) -> None:
    ids = seed(db)
    recent = db.list_recent_user_messages("s")
    assert recent == [
        {"id": ids[3], "timestamp": db.get_messages("s")[3]["timestamp"],
         "preview": "second question"},
        {"id": ids[0], "timestamp": db.get_messages("s")[0]["timestamp"],
         "preview": "first question"},
    ]
    db.rewind_to_message("s", ids[3])
    assert [r["id"] for r in db.list_recent_user_messages("s")] == [ids[0]]
    assert [r["id"] for r in db.list_recent_user_messages("s", include_inactive=True)] == [
        ids[3], ids[0]]
    assert [r["id"] for r in db.list_recent_user_messages("s", 1, True)] == [ids[3]]


def test_recent_user_messages_edge_cases(db: SessionDB) -> None:
    seed(db)
    assert db.list_recent_user_messages("ghost") == []
    assert db.list_recent_user_messages("s", limit=0) == []
    assert db.list_recent_user_messages("s", limit=-5) == []
    db.create_session("empty", "cli")
    assert db.list_recent_user_messages("empty") == []
    with pytest.raises(InvalidInputError):
        db.list_recent_user_messages("s", limit="10")  # type: ignore[arg-type]


def test_previews_collapse_whitespace_and_are_cut_to_80_characters(
    db: SessionDB, db_path: Path
) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "  spaced \n\n out\t\ttext  ")
    db.append_message("s", "user", "x" * 80)
    db.append_message("s", "user", "y" * 81)
    db.append_message("s", "user", None)
    previews = [r["preview"] for r in reversed(db.list_recent_user_messages("s"))]
    assert previews == ["spaced out text", "x" * 80, "y" * 77 + "...", ""]


def test_previews_of_structured_content_from_the_previous_store(
    db: SessionDB, db_path: Path
) -> None:
    """The previous store kept multimodal content as JSON after a prefix; a file it wrote
    still previews by its text parts."""
    db.create_session("s", "cli")
    ids = [db.append_message("s", "user", f"placeholder {n}") for n in range(3)]
    stored = [
        "\x00json:" + json.dumps([{"type": "text", "text": "look at"},
                                  {"type": "image_url", "image_url": {"url": "data:..."}},
                                  {"type": "text", "text": "this   picture"}]),
        "\x01json:" + json.dumps([{"type": "image_url", "image_url": {"url": "data:..."}}]),
        "\x01json:" + json.dumps({"type": "text", "text": "one part"}),
    ]
    conn = raw(db_path)
    for row_id, content in zip(ids, stored, strict=True):
        conn.execute("UPDATE messages SET content = ? WHERE id = ?", (content, row_id))
    conn.close()
    previews = [r["preview"] for r in reversed(db.list_recent_user_messages("s"))]
    assert previews == ["look at this picture", "[multimodal content]", "one part"]
    target = db.rewind_to_message("s", ids[0])["target_message"]
    assert target["content"][2] == {"type": "text", "text": "this   picture"}


# ---------------------------------------------------------------------------------------------
# rewind_to_message
# ---------------------------------------------------------------------------------------------


def test_a_rewind_hides_the_target_and_everything_after_it(db: SessionDB) -> None:
    ids = seed(db)
    before = db.get_session("s")
    result = db.rewind_to_message("s", ids[3])
    assert set(result) == {"rewound_count", "target_message", "new_head_id"}
    assert result["rewound_count"] == 2
    assert result["new_head_id"] == ids[2]
    target = result["target_message"]
    assert (target["id"], target["session_id"], target["role"], target["content"]) == (
        ids[3], "s", "user", "second question")
    assert target["active"] == 1, "the row as read before the rewind"
    assert [m["id"] for m in db.get_messages("s")] == ids[:3]
    assert [t["content"] for t in db.get_messages_as_conversation("s")] == [
        "first question", None, "output"]
    assert flags(db, "s")[3:] == [("second question", False, False),
                                  ("second answer", False, False)]
    assert db.search_messages("second") == [], "rewound rows are not found"
    after = db.get_session("s")
    assert after["rewind_count"] == before["rewind_count"] + 1 == 1
    assert (after["message_count"], after["tool_call_count"]) == (
        before["message_count"], before["tool_call_count"]), "counters are left as they were"


def test_the_target_row_keeps_tool_calls_as_stored_text(db: SessionDB, db_path: Path) -> None:
    db.create_session("s", "cli")
    target = db.append_message("s", "user", "q", platform_message_id="p1")
    conn = raw(db_path)
    conn.execute("UPDATE messages SET tool_calls = ? WHERE id = ?", ('[{"id": "x"}]', target))
    conn.close()
    row = db.rewind_to_message("s", target)["target_message"]
    assert row["tool_calls"] == '[{"id": "x"}]'
    assert row["platform_message_id"] == "p1" and row["message_uid"]


def test_every_rewind_counts_even_when_nothing_changes(db: SessionDB) -> None:
    ids = seed(db)
    assert db.rewind_to_message("s", ids[0])["rewound_count"] == 5
    again = db.rewind_to_message("s", ids[0])
    assert again["rewound_count"] == 0
    assert again["new_head_id"] is None
    assert again["target_message"]["active"] == 0
    assert db.get_session("s")["rewind_count"] == 2


@pytest.mark.parametrize("target", ["assistant", "tool", "unknown_id", "other_session",
                                    "unknown_session"])
def test_a_target_that_is_not_a_user_turn_of_the_session_is_a_value_error(
    db: SessionDB, target: str
) -> None:
    ids = seed(db)
    other = seed(db, "other")
    session, message = {
        "assistant": ("s", ids[1]),
        "tool": ("s", ids[2]),
        "unknown_id": ("s", 10**9),
        "other_session": ("s", other[0]),
        "unknown_session": ("ghost", ids[0]),
    }[target]
    before = flags(db, "s"), db.get_session("s")["rewind_count"]
    with pytest.raises(InvalidInputError) as refused:
        db.rewind_to_message(session, message)
    assert isinstance(refused.value, ValueError)
    assert (flags(db, "s"), db.get_session("s")["rewind_count"]) == before


@pytest.mark.parametrize("bad", ["3", 3.0, True, None])
def test_a_target_id_that_is_not_an_int_is_refused(db: SessionDB, bad: Any) -> None:
    seed(db)
    with pytest.raises(InvalidInputError):
        db.rewind_to_message("s", bad)
    with pytest.raises(InvalidInputError):
        db.restore_rewound("s", bad)


def test_a_closed_handle_refuses(db_path: Path) -> None:
    db = SessionDB(db_path)
    ids = seed(db)
    db.close()
    for call in (lambda: db.list_recent_user_messages("s"),
                 lambda: db.rewind_to_message("s", ids[0]),
                 lambda: db.restore_rewound("s", ids[0])):
        with pytest.raises(StateDbClosedError):
            call()


# ---------------------------------------------------------------------------------------------
# Rewound rows and compaction archives
# ---------------------------------------------------------------------------------------------


def test_compaction_after_a_rewind_keeps_the_two_kinds_apart(db: SessionDB) -> None:
    ids = seed(db)
    db.rewind_to_message("s", ids[3])
    db.archive_and_compact("s", [{"role": "user", "content": "summary"}])
    assert flags(db, "s") == [
        ("first question", False, True), (None, False, True), ("output", False, True),
        ("second question", False, False), ("second answer", False, False),
        ("summary", True, False),
    ]


def legacy_session(db: SessionDB, db_path: Path, session_id: str) -> list[int]:
    """A session as a store written before compaction marked its archives leaves it: an
    archived generation with ``compacted = 0``, a live one, and no rewind."""
    db.create_session(session_id, "cli")
    ids = [db.append_message(session_id, "user", f"{session_id} old question"),
           db.append_message(session_id, "assistant", f"{session_id} old answer")]
    db.archive_and_compact(session_id, [{"role": "user", "content": f"{session_id} summary"}])
    ids += [db.get_messages(session_id)[0]["id"],
            db.append_message(session_id, "user", f"{session_id} new question"),
            db.append_message(session_id, "assistant", f"{session_id} new answer")]
    conn = raw(db_path)
    conn.execute("UPDATE messages SET compacted = 0 WHERE session_id = ?", (session_id,))
    conn.execute("UPDATE sessions SET rewind_count = 0 WHERE id = ?", (session_id,))
    conn.close()
    assert [f[1:] for f in flags(db, session_id)] == [(False, False)] * 2 + [(True, False)] * 3
    return ids


def test_the_first_rewind_of_an_older_session_marks_its_archive_compacted(
    db: SessionDB, db_path: Path
) -> None:
    ids = legacy_session(db, db_path, "old")
    legacy_session(db, db_path, "untouched")

    db.rewind_to_message("old", ids[3])

    assert flags(db, "old") == [
        ("old old question", False, True), ("old old answer", False, True),
        ("old summary", True, False),
        ("old new question", False, False), ("old new answer", False, False),
    ], "archived rows are compacted, rewound ones are not: active=0, compacted=0 is rewound"
    assert [f[1:] for f in flags(db, "untouched")][:2] == [(False, False)] * 2, \
        "another session is marked at its own first rewind"

    # A later rewind marks nothing: the row rewound above, still inactive, stays rewound.
    db.restore_rewound("old", ids[4])
    assert db.rewind_to_message("old", ids[3])["rewound_count"] == 1
    assert [f[1:] for f in flags(db, "old")][3:] == [(False, False)] * 2
    assert db.get_session("old")["rewind_count"] == 2


def test_a_refused_first_rewind_marks_nothing(db: SessionDB, db_path: Path) -> None:
    ids = legacy_session(db, db_path, "old")
    with pytest.raises(InvalidInputError):
        db.rewind_to_message("old", ids[4])  # an assistant turn
    assert [f[1:] for f in flags(db, "old")][:2] == [(False, False)] * 2
    assert db.get_session("old")["rewind_count"] == 0


# ---------------------------------------------------------------------------------------------
# restore_rewound
# ---------------------------------------------------------------------------------------------


def test_restore_brings_rewound_rows_back_from_an_id_on(db: SessionDB) -> None:
    ids = seed(db)
    db.rewind_to_message("s", ids[3])
    assert db.restore_rewound("s", ids[4]) == 1
    assert [m["id"] for m in db.get_messages("s")] == [*ids[:3], ids[4]]
    assert db.restore_rewound("s", ids[0]) == 1
    assert [m["id"] for m in db.get_messages("s")] == ids
    assert db.restore_rewound("s", ids[0]) == 0
    assert all(not m["compacted"] for m in db.get_messages("s"))


def test_restore_includes_compaction_archives(db: SessionDB) -> None:
    ids = seed(db)
    db.archive_and_compact("s", [{"role": "user", "content": "summary"}])
    assert db.restore_rewound("s", ids[0]) == 5
    assert [m["content"] for m in db.get_messages("s")] == [
        "first question", None, "output", "second question", "second answer", "summary"]
    assert all(not m["compacted"] for m in db.get_messages("s")), "live rows are not compacted"


def test_restore_of_a_missing_session_raises(db: SessionDB) -> None:
    with pytest.raises(SessionNotFoundError):
        db.restore_rewound("ghost", 1)


# ---------------------------------------------------------------------------------------------
# Beside another process
# ---------------------------------------------------------------------------------------------

# Appends argv[3] user turns to session argv[2] of store argv[1], printing each row id once the
# append is acknowledged.
APPENDER = textwrap.dedent(
    """
    import sys
    from hermes_state import SessionDB
    with SessionDB(sys.argv[1], rebuild_fts=False) as db:
        for n in range(int(sys.argv[3])):
            print(db.append_message(sys.argv[2], "user", f"turn {n}"), flush=True)
    """
)


@pytest.mark.parametrize("seed_n", [1, 2, 3])
def test_rewinds_beside_an_appender_delete_nothing(
    db: SessionDB, spawn_python: Callable[..., subprocess.Popen[str]], seed_n: int
) -> None:
    """Rewinds run while another process appends: every acknowledged row still exists, each
    one live or rewound, and no rewind ever took back a row below its target."""
    db.create_session("s", "cli")
    db.append_message("s", "user", "start")
    proc = spawn_python(APPENDER, str(db.path), "s", str(40 * seed_n))
    rewinds = []
    while proc.poll() is None:
        users = db.list_recent_user_messages("s", limit=3)
        if users:
            target = users[-1]["id"]
            rewinds.append((target, db.rewind_to_message("s", target)["new_head_id"]))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    acknowledged = [int(line) for line in out.split()]
    assert rewinds and len(acknowledged) == 40 * seed_n
    every = {m["id"]: m for m in db.get_messages("s", include_inactive=True)}
    assert set(acknowledged) <= set(every), "a rewind deletes nothing"
    for target, head in rewinds:
        assert head is None or head < target
    assert all(not m["compacted"] for m in every.values())
    assert db.get_session("s")["rewind_count"] == len(rewinds)
