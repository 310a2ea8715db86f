"""Export and import: lossless round trips, streaming in constant memory, conflicts."""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
import tempfile
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_state import (
    ImportRejectedError,
    SessionDB,
    SessionNotFoundError,
    TitleConflictError,
)
from state_helpers import populate

# --- strategies -----------------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda kids: st.lists(kids, max_size=3)
    | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=6,
)
TEXT = st.text(max_size=60)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system"]), "content": st.none() | TEXT},
    optional={
        "tool_calls": JSON,
        "tool_call_id": st.text(min_size=1, max_size=8),
        "tool_name": st.text(max_size=10),
        "token_count": st.integers(0, 10**9),
        "finish_reason": st.sampled_from(["stop", "length", "tool_calls"]),
        "reasoning": TEXT,
        "reasoning_content": TEXT,
        "reasoning_details": JSON,
        "codex_reasoning_items": JSON,
        "codex_message_items": JSON,
        "platform_message_id": st.text(max_size=10),
        "observed": st.booleans(),
        "effect_disposition": st.sampled_from(["applied", "reverted"]),
        "api_content": TEXT,
        "display_kind": st.sampled_from(["note", "card"]),
        "display_metadata": JSON,
        "absorbed_message_uids": st.lists(st.uuids().map(lambda u: u.hex), max_size=2),
        "timestamp": st.floats(0, 4e9),
        "active": st.booleans(),
        "compacted": st.booleans(),
    },
)
USAGE = st.tuples(
    st.sampled_from(["m1", "m2"]),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.none() | st.floats(0, 100),
    st.sampled_from([None, "summary"]),
)
SESSION = st.fixed_dictionaries(
    {
        "source": st.sampled_from(["cli", "telegram", "discord"]),
        "model": st.none() | st.sampled_from(["m1", "m2"]),
        "title": st.none() | st.text(max_size=20),
        "parent": st.none() | st.integers(0, 10),
        "messages": st.lists(MESSAGE, max_size=6),
        "usage": st.lists(USAGE, max_size=2),
        "prompt": st.none() | TEXT,
        "user_id": st.none() | st.text(max_size=10),
        "end": st.none() | st.sampled_from(["user_exit", "compression"]),
    }
)


def build(db: SessionDB, spec: list[dict[str, Any]]) -> None:
    ids: list[str] = []
    for n, s in enumerate(spec):
        sid = f"s{n}-{uuid.uuid4().hex[:6]}"
        parent = ids[s["parent"]] if s["parent"] is not None and s["parent"] < len(ids) else None
        db.create_session(
            sid, s["source"], model=s["model"], system_prompt=s["prompt"], user_id=s["user_id"],
            parent_session_id=parent, origin_json={"chat": n},
        )
        title = db.sanitize_title(s["title"]) if s["title"] is not None else None
        if title is not None:
            with contextlib.suppress(TitleConflictError):  # titles are unique
                db.set_session_title(sid, title)
        if s["messages"]:
            db.replace_messages(sid, s["messages"])
        for model, tokens_in, tokens_out, cost, task in s["usage"]:
            db.update_token_counts(
                sid, tokens_in, tokens_out, model=model, estimated_cost_usd=cost, task=task
            )
        if s["end"]:
            db.end_session(sid, s["end"])
        ids.append(sid)


def comparable(lines: list[str]) -> list[dict[str, Any]]:
    """Export lines without what legitimately differs between stores: the export time and
    the row ids of messages."""
    out = []
    for line in lines:
        obj = json.loads(line)
        obj.pop("exported_at", None)
        if obj["kind"] == "message":
            obj["message"].pop("id")
        out.append(obj)
    return out


def without_message_ids(sessions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**s, "messages": [{k: v for k, v in m.items() if k != "id"} for m in s["messages"]]}
            for s in sessions]


# --- round trips ----------------------------------------------------------------------------


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(spec=st.lists(SESSION, max_size=5))
def test_export_import_export_round_trips_every_field(spec: list[dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        with SessionDB(Path(tmp) / "a.db") as a:
            build(a, spec)
            lines = list(a.iter_export_jsonl())
            as_dicts = a.export_all()
        with SessionDB(Path(tmp) / "b.db") as b:
            report = b.import_jsonl(io.StringIO("".join(reversed_sessions(lines))))
            assert report["ok"] and report["errors"] == []
            assert len(report["imported"]) == len(spec)
            assert comparable(list(b.iter_export_jsonl())) == comparable(lines)
        with SessionDB(Path(tmp) / "c.db") as c:
            report = c.import_sessions(list(reversed(as_dicts)))
            assert report["ok"] and report["imported"] == len(spec)
            assert without_message_ids(c.export_all()) == without_message_ids(as_dicts)


def reversed_sessions(lines: list[str]) -> list[str]:
    """The same stream with its session blocks in reverse order: children before parents."""
    header, *body, end = lines
    blocks: list[list[str]] = []
    for line in body:
        if line.startswith('{"kind":"session"'):
            blocks.append([])
        blocks[-1].append(line)
    return [header, *(line for block in reversed(blocks) for line in block), end]


def test_import_puts_parents_before_children_whatever_the_input_order(tmp_path: Path) -> None:
    with SessionDB(tmp_path / "a.db") as a:
        ids = populate(a, sessions=4, messages=1)
        exported = a.export_session_lineage(ids[2])["segments"]
    assert [s["id"] for s in exported] == ids  # the whole chain, root first
    with SessionDB(tmp_path / "b.db") as b:
        report = b.import_sessions(list(reversed(exported)))
        assert report["imported_ids"] == ids
        assert b.get_session(ids[3])["parent_session_id"] == ids[2]
        assert [r["id"] for r in b.get_session_ancestors(ids[3])] == list(reversed(ids))


def test_existing_sessions_are_skipped_replaced_or_fail_the_import(tmp_path: Path) -> None:
    with SessionDB(tmp_path / "a.db") as a:
        ids = populate(a, sessions=2, messages=2)
        exported = a.export_all()
    with SessionDB(tmp_path / "b.db") as b:
        assert sorted(b.import_sessions(exported)["imported_ids"]) == ids
        again = b.import_sessions(exported)
        assert sorted(again["skipped_ids"]) == ids and again["imported"] == 0
        changed = json.loads(json.dumps(exported))
        index, second = next((i, s) for i, s in enumerate(changed) if s["id"] == ids[1])
        second["messages"].append({"role": "user", "content": "not in the store"})
        before = b.get_messages(ids[1], include_inactive=True)
        # The default of a list import: an existing id is skipped, whatever it holds.
        assert sorted(b.import_sessions(changed)["skipped_ids"]) == sorted(ids)
        failed = b.import_sessions(changed, on_conflict="fail")
        assert failed["ok"] is False and failed["imported"] == 0
        assert [(e["index"], e["session_id"]) for e in failed["errors"]] == [(index, ids[1])]
        assert b.get_messages(ids[1], include_inactive=True) == before
        replaced = b.import_sessions(changed, on_conflict="replace")
        assert replaced["imported_ids"] == [ids[1]] and replaced["skipped_ids"] == [ids[0]]
        rows = b.get_messages(ids[1], include_inactive=True)
        assert rows[-1]["content"] == "not in the store" and len(rows) == len(before) + 1


def test_a_title_held_by_another_session_is_reported_and_not_taken(tmp_path: Path) -> None:
    with SessionDB(tmp_path / "a.db") as a:
        a.create_session("incoming", "cli")
        a.set_session_title("incoming", "Shared title")
        a_lines = list(a.iter_export_jsonl())
    with SessionDB(tmp_path / "b.db") as b:
        b.create_session("resident", "cli")
        b.set_session_title("resident", "Shared title")
        buf = io.StringIO("".join(a_lines))
        report = b.import_jsonl(buf)
        assert report["imported"] == ["incoming"]
        assert report["title_conflicts"] == [
            {"session_id": "incoming", "title": "Shared title", "held_by": "resident"}
        ]
        assert b.get_session_title("incoming") is None
        assert b.get_session_title("resident") == "Shared title"


def test_a_child_without_its_parent_is_imported_as_a_root_and_reported(tmp_path: Path) -> None:
    with SessionDB(tmp_path / "a.db") as a:
        ids = populate(a, sessions=2, messages=1)
        child = a.export_session(ids[1])
    with SessionDB(tmp_path / "b.db") as b:
        report = b.import_sessions([child])
        assert report["ok"] and report["detached"] == 1
        assert b.get_session(ids[1])["parent_session_id"] is None


def test_uids_generations_and_usage_survive_the_round_trip(tmp_path: Path) -> None:
    with SessionDB(tmp_path / "a.db") as a:
        ids = populate(a, sessions=1, messages=2)
        original = a.get_messages(ids[0], include_inactive=True)
        buf = io.StringIO("".join(a.iter_export_jsonl()))
    with SessionDB(tmp_path / "b.db") as b:
        b.import_jsonl(io.BytesIO(buf.getvalue().encode()))
        copied = b.get_messages(ids[0], include_inactive=True)
        assert [m["message_uid"] for m in copied] == [m["message_uid"] for m in original]
        assert [(m["active"], m["compacted"]) for m in copied][:2] == [(False, True), (True, False)]
        assert b.get_model_usage(ids[0])[0]["input_tokens"] == 100


def test_exporting_an_unknown_session_fails_before_any_line(db: SessionDB) -> None:
    stream = db.iter_export_jsonl(["nope"])
    with pytest.raises(SessionNotFoundError):
        next(stream)


def test_a_jsonl_stream_that_is_not_an_export_is_refused(db: SessionDB) -> None:
    with pytest.raises(ValueError, match="line 1"):
        db.import_jsonl(io.StringIO('{"kind": "message", "session_id": "x", "message": {}}\n'))


# --- streaming ------------------------------------------------------------------------------

BIG_SESSION_MESSAGES = 100_000


def test_a_100k_message_session_exports_in_constant_memory(db: SessionDB, db_path: Path) -> None:
    db.create_session("big", "cli")
    raw = sqlite3.connect(db_path, isolation_level=None)
    try:
        raw.execute("BEGIN")
        for name in ("messages_fts_insert", "messages_fts_update", "messages_fts_delete"):
            raw.execute(f"DROP TRIGGER {name}")  # indexing is not what this test measures
        raw.executemany(
            "INSERT INTO messages (session_id, role, content, timestamp, message_uid)"
            " VALUES ('big', 'user', ?, ?, ?)",
            ((f"message {i} " + "x" * 300, 1000.0 + i, uuid.uuid4().hex)
             for i in range(BIG_SESSION_MESSAGES)),
        )
        raw.execute("COMMIT")
    finally:
        raw.close()

    tracemalloc.start()
    try:
        written = lines = 0
        for line in db.iter_export_jsonl(["big"]):
            written += len(line)
            lines += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == BIG_SESSION_MESSAGES + 3  # header, session, messages, end
    assert written > 30_000_000
    assert peak < 2_000_000, f"peak {peak} bytes while streaming {written} bytes"


# --- a damaged stream never imports partially -------------------------------------------------


def _damaged(lines: list[str], data: st.DataObject) -> list[str]:
    """The stream cut after any line, or one line altered (a span of it deleted, or one
    character changed). Positions are drawn as fractions: line lengths vary between runs
    (ids, times), the draws must not."""

    def pick(label: str, size: int) -> int:
        return data.draw(st.integers(0, 9999), label=label) * size // 10000

    if data.draw(st.booleans(), label="truncate"):
        return lines[: pick("keep", len(lines))]
    at = pick("line", len(lines))
    text = lines[at].rstrip("\n")
    start = pick("start", len(text))
    if data.draw(st.booleans(), label="delete"):
        end = start + 1 + pick("span", len(text) - start)
        text = text[:start] + text[end:]
    else:
        text = text[:start] + data.draw(st.sampled_from("0{}\",:x9]"), label="char") + (
            text[start + 1:])
    return [*lines[:at], text + "\n", *lines[at + 1:]]


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(spec=st.lists(SESSION, min_size=1, max_size=3), data=st.data())
def test_a_truncated_or_altered_stream_imports_whole_or_not_at_all(
    spec: list[dict[str, Any]], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        with SessionDB(Path(tmp) / "a.db") as a:
            build(a, spec)
            lines = _damaged(list(a.iter_export_jsonl()), data)
        with SessionDB(Path(tmp) / "b.db") as b:
            b.create_session("resident", "cli")
            b.append_message("resident", "user", "mine")
            try:
                report = b.import_jsonl(io.StringIO("".join(lines)))
            except ImportRejectedError:
                assert [s["id"] for s in b.search_sessions(limit=-1)] == [
                    "resident"]
                assert b.message_count() == 1
                return
            # Accepted: then every session and every message line of the stream is stored.
            kinds = [json.loads(line)["kind"] for line in lines if line.strip()]
            assert report["ok"] and len(report["imported"]) == kinds.count("session")
            rows = sum(len(b.get_messages(s, include_inactive=True)) for s in report["imported"])
            assert rows == kinds.count("message")
