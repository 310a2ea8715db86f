"""The store dropped into the agent application: what its own code and tests rely on beyond the
call sites (docs/compatibility.md). Structured message content, the handle's connection and
write helper as the application uses them, the names it imports, and the smaller behaviours."""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import hermes_state
from hermes_state import (
    HermesStateError,
    ImportRejectedError,
    InvalidInputError,
    InvalidTypeError,
    SessionDB,
    StateDbConstraintError,
    StateDbLockedError,
    Timing,
)
from hermes_state_replay import route_reasoning_carriers
from state_helpers import Connections, raw

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
PHOTO_TURN = [{"type": "text", "text": "what bird is this heron"}, IMAGE]
AUDIO_TURN = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}


# --- structured content ----------------------------------------------------------------------


def _store_with_photo(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", PHOTO_TURN)
    db.append_message("s", "assistant", "A grey heron.")
    db.append_message("s", "user", AUDIO_TURN)


def test_a_multimodal_turn_round_trips_through_every_path(db: SessionDB, tmp_path: Path) -> None:
    _store_with_photo(db)
    rows = db.get_messages("s")
    assert [r["content"] for r in rows] == [PHOTO_TURN, "A grey heron.", AUDIO_TURN]
    assert rows[0]["api_content"] is None
    conversation = db.get_messages_as_conversation("s")
    assert [t["content"] for t in conversation] == [PHOTO_TURN, "A grey heron.", AUDIO_TURN]
    window = db.get_messages_around("s", rows[0]["id"], window=2)["window"]
    assert window[0]["content"] == PHOTO_TURN

    exported = db.export_session("s")
    assert exported is not None and exported["messages"][0]["content"] == PHOTO_TURN
    lines = "".join(f"{line}\n" if not line.endswith("\n") else line
                    for line in db.iter_export_jsonl(["s"]))
    with SessionDB(tmp_path / "from-jsonl.db") as other:
        other.import_jsonl(io.StringIO(lines))
        assert [r["content"] for r in other.get_messages("s")] == [
            PHOTO_TURN, "A grey heron.", AUDIO_TURN]
    with SessionDB(tmp_path / "from-records.db") as other:
        assert other.import_sessions([json.loads(json.dumps(exported))])["ok"] is True
        imported = other.get_messages_as_conversation("s")
        assert [t["content"] for t in imported] == [PHOTO_TURN, "A grey heron.", AUDIO_TURN]
        hits = other.search_messages("heron")
        assert {h["role"] for h in hits} == {"user", "assistant"}
        assert other.search_messages("image_url") == []  # the parts' keys are not text
        assert other.search_messages("iVBORw0KGgo") == []
        replayed = route_reasoning_carriers(imported, provider="openrouter")
        assert replayed[0] == {"role": "user", "content": PHOTO_TURN}


def test_a_replacement_and_a_compaction_keep_structured_content(db: SessionDB) -> None:
    _store_with_photo(db)
    turns = db.get_messages_as_conversation("s")
    db.replace_messages("s", turns[:2])
    assert [t["content"] for t in db.get_messages_as_conversation("s")] == [
        PHOTO_TURN, "A grey heron."]
    db.archive_and_compact("s", [{"role": "user", "content": PHOTO_TURN},
                                 {"role": "assistant", "content": "summary"}])
    assert db.get_messages_as_conversation("s")[0]["content"] == PHOTO_TURN


def test_content_the_previous_store_wrote_structured_reads_back_as_structures(
    db: SessionDB, db_path: Path
) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "placeholder")
    db.append_message("s", "user", "placeholder")
    db.close()
    with sqlite3.connect(db_path) as conn:  # as the previous store wrote such rows
        conn.execute("UPDATE messages SET content = ? WHERE id = 1",
                     ("\x00json:" + json.dumps(PHOTO_TURN),))
        conn.execute("UPDATE messages SET content = ? WHERE id = 2",
                     ("\x01json:" + json.dumps(AUDIO_TURN),))
    conn.close()
    with SessionDB(db_path) as reopened:
        assert [r["content"] for r in reopened.get_messages("s")] == [PHOTO_TURN, AUDIO_TURN]
        assert [t["content"] for t in reopened.get_messages_as_conversation("s")] == [
            PHOTO_TURN, AUDIO_TURN]
        assert reopened.export_session("s")["messages"][0]["content"] == PHOTO_TURN


@pytest.mark.parametrize(
    ("content", "extra", "error"),
    [
        ([{"type": "text", "text": b"bytes"}], {}, InvalidTypeError),
        ({"type": "text", "value": float("nan")}, {}, InvalidInputError),
        (PHOTO_TURN, {"api_content": "sent text"}, InvalidInputError),
    ],
)
def test_structured_content_json_cannot_carry_is_refused_and_nothing_is_written(
    db: SessionDB, content: Any, extra: dict[str, Any], error: type[Exception]
) -> None:
    db.create_session("s", "cli")
    with pytest.raises(error):
        db.append_message("s", "user", content, **extra)
    assert db.get_messages("s") == [] and db.get_session("s")["message_count"] == 0


# --- the handle's connection and write helper -----------------------------------------------


def test_the_connection_gives_rows_by_name_and_the_library_still_reads_plain_rows(
    db: SessionDB,
) -> None:
    db.create_session("s", "cli", model="m")
    row = db._conn.execute("SELECT id, source, model FROM sessions WHERE id = ?", ["s"]).fetchone()
    assert isinstance(row, sqlite3.Row)
    assert dict(row) == {"id": "s", "source": "cli", "model": "m"} and row["model"] == "m"
    assert row[0] == "s"
    assert db.get_session("s")["model"] == "m"  # the library's own reads are unchanged
    assert db.export_session("s")["id"] == "s"
    db._conn.row_factory = None  # a caller's choice stays on its view
    assert db._conn.execute("SELECT 1").fetchone() == (1,)
    assert db.search_messages("anything") == []


def test_a_write_function_runs_in_one_immediate_transaction_and_returns_its_result(
    db: SessionDB, connections: Connections,
) -> None:
    db.create_session("s", "cli")
    statements: list[str] = []
    own = connections.own()  # the handle's connection, as its on_connect hook saw it
    own.set_trace_callback(statements.append)

    def rename(conn: Any) -> bool:
        row = conn.execute("SELECT title FROM sessions WHERE id = ?", ("s",)).fetchone()
        assert row["title"] is None
        changed = conn.execute("UPDATE sessions SET title = 'named' WHERE id = ?", ("s",))
        conn.commit()  # the previous store's functions may call it: the store commits
        return bool(changed.rowcount > 0)

    assert db._execute_write(rename) is True
    own.set_trace_callback(None)
    assert statements[0] == "BEGIN IMMEDIATE" and statements[-1] == "COMMIT"
    assert db.get_session("s")["title"] == "named"


def test_a_write_function_that_raises_leaves_nothing_written(db: SessionDB) -> None:
    db.create_session("s", "cli")

    def half_then_fail(conn: Any) -> None:
        conn.execute("UPDATE sessions SET title = 'half' WHERE id = 's'")
        raise RuntimeError("changed its mind")

    with pytest.raises(RuntimeError, match="changed its mind"):
        db._execute_write(half_then_fail)
    with pytest.raises(HermesStateError):
        db._execute_write(lambda conn: conn.rollback())
    with pytest.raises(HermesStateError):  # SQLite's own refusal, typed
        db._execute_write(lambda conn: conn.execute("INSERT INTO sessions (id) VALUES ('s')"))
    assert db.get_session("s")["title"] is None


def test_a_constraint_broken_through_the_facade_is_typed_and_rolled_back(db: SessionDB) -> None:
    db.create_session("s", "cli")

    def duplicate(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('t', 'cli', 0)")
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s', 'cli', 0)")

    with pytest.raises(StateDbConstraintError) as info:
        db._execute_write(duplicate)
    assert isinstance(info.value.__cause__, sqlite3.IntegrityError)
    assert db.get_session("t") is None  # the whole transaction was rolled back


def test_a_write_function_is_refused_on_a_read_only_handle(db: SessionDB, db_path: Path) -> None:
    db.create_session("s", "cli")
    with SessionDB(db_path, read_only=True) as reader:
        with pytest.raises(HermesStateError, match="read-only"):
            reader._execute_write(lambda conn: conn.execute("DELETE FROM sessions"))
        assert reader.get_session("s") is not None  # nothing was deleted


@pytest.mark.slow
def test_a_write_function_waits_out_another_process_and_gives_up_typed(
    db: SessionDB, db_path: Path, hold_write_lock: Any, open_db: Any
) -> None:
    db.create_session("s", "cli")
    with hold_write_lock(db_path, 1.6):  # past SQLite's own 1 s wait: the store retries
        assert db._execute_write(
            lambda conn: conn.execute("UPDATE sessions SET title = 'late' WHERE id = 's'").rowcount
        ) == 1
    assert db.write_retries > 0
    impatient = open_db(db_path, timing=Timing(write_patience_s=0.3))
    with hold_write_lock(db_path):
        with pytest.raises(StateDbLockedError):
            impatient._execute_write(lambda conn: conn.execute("DELETE FROM sessions"))
    assert db.get_session("s") is not None


# The application's pattern, in a process of its own: the ACP adapter's writes through
# _execute_write (a guarded update reporting whether it applied, a read-then-write that returns
# a value), the insights engine's reads through _conn (dict(row) over list parameters).
APPLICATION = """
import json, sys
from hermes_state import SessionDB

db = SessionDB(sys.argv[1])
db.create_session("acp-1", "acp", model="m1")
db.create_session("acp-2", "acp")
db.append_message("acp-1", "user", "hello")

def claim(conn):
    cur = conn.execute(
        "UPDATE sessions SET handoff_state = 'pending', handoff_platform = ? "
        "WHERE id = ? AND handoff_state IS NULL", ("telegram", "acp-1"))
    return cur.rowcount > 0

def bump(conn):
    row = conn.execute("SELECT message_count FROM sessions WHERE id = ?", ("acp-1",)).fetchone()
    conn.execute("UPDATE sessions SET api_call_count = ? WHERE id = ?",
                 (row["message_count"] + 10, "acp-1"))
    return row["message_count"]

first, second, counted = db._execute_write(claim), db._execute_write(claim), db._execute_write(bump)
conn = db._conn
rows = [dict(r) for r in conn.execute(
    "SELECT id, source, model, message_count, api_call_count FROM sessions s "
    "WHERE s.source = ? ORDER BY s.id", ["acp"]).fetchall()]
stats = dict(conn.execute(
    "SELECT COUNT(*) AS total_messages, "
    "SUM(CASE WHEN m.role = 'user' THEN 1 ELSE 0 END) AS user_messages "
    "FROM messages m JOIN sessions s ON s.id = m.session_id WHERE s.source = ?", ["acp"]
).fetchone())
db.close()
print(json.dumps({"claims": [first, second], "counted": counted, "rows": rows, "stats": stats}))
"""


def test_the_application_drives_the_handle_from_its_own_process(
    run_python: Callable[..., Any], db_path: Path
) -> None:
    result = run_python(APPLICATION, str(db_path))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["claims"] == [True, False] and out["counted"] == 1
    assert out["rows"] == [
        {"id": "acp-1", "source": "acp", "model": "m1", "message_count": 1,
         "api_call_count": 11},
        {"id": "acp-2", "source": "acp", "model": None, "message_count": 0,
         "api_call_count": 0},
    ]
    assert out["stats"] == {"total_messages": 1, "user_messages": 1}
    with SessionDB(db_path) as db:
        assert db.get_handoff_state("acp-1")["state"] == "pending"


# --- names the application imports ------------------------------------------------------------


def test_the_schema_script_builds_a_store_the_library_opens(tmp_path: Path) -> None:
    path = tmp_path / "scripted.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(hermes_state.SCHEMA_SQL)
    conn.close()
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "scripted store")
        assert db.search_messages("scripted")[0]["session_id"] == "s"


def test_the_query_cap_bounds_what_a_search_reads(db: SessionDB) -> None:
    cap = hermes_state.MAX_FTS5_QUERY_CHARS
    assert cap == 2048
    assert len(SessionDB._sanitize_fts5_query("word " * cap)) <= cap
    db.create_session("s", "cli")
    db.append_message("s", "user", "needle")
    assert db.search_messages("needle OR " + "x" * (cap * 2))[0]["session_id"] == "s"


def test_the_delegate_helpers_collect_and_delete_children_only(db: SessionDB) -> None:
    db.create_session("lead", "cli")
    db.create_session("helper", "cli", parent_session_id="lead",
                      model_config={"_delegate_from": "lead"})
    db.create_session("deeper", "cli", parent_session_id="helper",
                      model_config={"_delegate_from": "helper"})
    db.create_session("branch", "cli", parent_session_id="lead")
    db.append_message("helper", "user", "work")
    assert db._execute_write(
        lambda conn: hermes_state._collect_delegate_child_ids(conn, ["lead", ""])
    ) == ["deeper", "helper"]
    deleted = db._execute_write(
        lambda conn: hermes_state._delete_delegate_children(conn, ["lead"]))
    assert deleted == ["deeper", "helper"]
    assert db.get_session("helper") is None and db.get_session("deeper") is None
    assert db.get_session("lead") is not None and db.get_session("branch") is not None


REVIEW = "Review the conversation above and consider saving to memory. Be terse."
SKILLS = "  Review the conversation above and update the skill library now."


def test_background_review_turns_are_left_out_of_a_resumed_conversation(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "real question")
    db.append_message("s", "assistant", "real answer")
    db.append_message("s", "user", REVIEW)
    db.append_message("s", "assistant", "saved two memories",
                      tool_calls=[{"id": "c1", "type": "function",
                                   "function": {"name": "memory", "arguments": "{}"}}])
    db.append_message("s", "tool", "ok", tool_call_id="c1")
    db.append_message("s", "system", SKILLS)
    db.append_message("s", "user", REVIEW)
    db.append_message("s", "assistant", "kept: the second prompt took the first one's reply")
    db.append_message("s", "user", "next question")
    turns = db.get_messages_as_conversation("s")
    assert [t["content"] for t in turns] == [
        "real question", "real answer",
        "kept: the second prompt took the first one's reply", "next question"]
    everything = db.get_messages("s")
    stripped = hermes_state._strip_background_review_harness(everything)
    assert [m["content"] for m in stripped] == [t["content"] for t in turns]
    assert hermes_state._is_background_review_harness_message({"role": "user",
                                                              "content": REVIEW})
    assert not hermes_state._is_background_review_harness_message(
        {"role": "assistant", "content": REVIEW})


def test_the_async_wrapper_offloads_through_the_modules_asyncio(
    db: SessionDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    offloaded: list[str] = []
    real = hermes_state.asyncio.to_thread

    async def spy(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        offloaded.append(fn.__name__)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(hermes_state.asyncio, "to_thread", spy)
    wrapped = hermes_state.AsyncSessionDB(db)
    asyncio.run(wrapped.create_session("s", "cli"))
    assert offloaded == ["create_session"] and hermes_state.sys.modules["hermes_state"]


# --- the smaller behaviours -------------------------------------------------------------------


def test_optimize_fts_merges_each_index_and_search_still_answers(db: SessionDB) -> None:
    db.create_session("s", "cli")
    for n in range(30):
        db.append_message("s", "user", f"segment {n} 東京タワー")
    assert db.optimize_fts() == 3
    assert len(db.search_messages("segment", limit=50)) == 30
    assert len(db.search_messages("東京", limit=50)) == 30
    assert db.check_fts_integrity() == dict.fromkeys(db.check_fts_integrity())


def test_optimize_fts_counts_the_indexes_a_build_without_trigram_keeps(tmp_path: Path) -> None:
    # Without the trigram tokenizer the word and CJK indexes are still kept: both are merged
    # and counted, on a store built that way and on an indexed store such a handle opens.
    built = tmp_path / "built.db"
    with SessionDB(built, full_text="no-trigram") as db:
        db.create_session("s", "cli")
        for n in range(20):
            db.append_message("s", "user", f"segment {n} 東京タワー")
        assert db.optimize_fts() == 2
        assert db.vacuum() == 2
        assert len(db.search_messages("segment", limit=50)) == 20
        assert len(db.search_messages("東京", limit=50)) == 20
    indexed = tmp_path / "indexed.db"
    with SessionDB(indexed) as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "segment zero")
    with SessionDB(indexed, full_text="no-trigram") as db:
        db.append_message("s", "user", "segment one")
        assert db.optimize_fts() == 2
        assert len(db.search_messages("segment", limit=50)) == 2
    with SessionDB(indexed) as db:  # a full handle rebuilds the trigram index at open
        assert db.wait_for_index(timeout=30)
        assert db.optimize_fts() == 3
        assert len(db.search_messages("gment on", limit=50)) == 1


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return info.st_mtime_ns, info.st_size


def test_a_handle_that_only_reads_leaves_the_file_as_it_was(db_path: Path) -> None:
    # The application's event poller skips its work while state.db's modification time stays
    # the same, opening and closing a handle on each tick: reads must not touch the file.
    with SessionDB(db_path) as writer:
        writer.create_session("s", "telegram", session_key="agent:main:telegram:dm:1")
        writer.append_message("s", "user", "hello there")
    before = _stamp(db_path)
    wal = db_path.with_name(f"{db_path.name}-wal")
    for _ in range(3):
        with SessionDB(db_path) as reader:
            reader.list_gateway_sessions(active_only=True)
            reader.get_messages("s")
            reader.search_messages("hello")
        with SessionDB(db_path, read_only=True) as reader:
            reader.get_messages_as_conversation("s")
        assert _stamp(db_path) == before
        # A read-only connection cannot remove the write-ahead log SQLite opened for it;
        # nothing is ever written into it.
        wal_stamp = _stamp(wal)
        assert wal_stamp is None or wal_stamp[1] == 0


def test_no_compression_lock_for_an_empty_session_id(db: SessionDB) -> None:
    assert db.try_acquire_compression_lock("", "pid=1") is False
    assert db.get_compression_lock_holder("") is None


def test_deleting_an_empty_session_removes_its_transcripts(db: SessionDB, tmp_path: Path) -> None:
    sessions_dir = tmp_path / "sessions"
    sessions_dir.mkdir()
    files = [sessions_dir / "lazy.json", sessions_dir / "lazy.jsonl",
             sessions_dir / "request_dump_lazy_1.json"]
    for path in files:
        path.write_text("")
    db.create_session("lazy", "cli")
    assert db.delete_session_if_empty("lazy", sessions_dir=sessions_dir) is True
    assert not any(path.exists() for path in files)


def test_creating_an_existing_session_fills_what_is_still_missing(db: SessionDB) -> None:
    db.create_session("g", "telegram", user_id="u1", chat_id="c1")
    db.create_session("g", "cli", model="m", model_config={"provider": "p"},
                      system_prompt="be brief", user_id="u2", chat_id="c2", cwd="/w")
    row = db.get_session("g")
    assert (row["source"], row["user_id"], row["chat_id"]) == ("telegram", "u1", "c1")
    assert (row["model"], row["system_prompt"], row["cwd"]) == ("m", "be brief", "/w")
    assert json.loads(row["model_config"]) == {"provider": "p"}
    db.create_session("g", "cli", model="other")
    assert db.get_session("g")["model"] == "m"


def test_a_second_create_never_closes_a_parent_cycle(db: SessionDB) -> None:
    db.create_session("a", "cli")
    db.create_session("b", "cli", parent_session_id="a")
    db.create_session("a", "cli", parent_session_id="b")
    assert db.get_session("a")["parent_session_id"] is None


def test_the_compact_rich_row_leaves_the_system_prompt_out(db: SessionDB) -> None:
    db.create_session("s", "cli", system_prompt="a long prompt")
    db.append_message("s", "user", "first words")
    full = db._get_session_rich_row("s")
    compact = db._get_session_rich_row("s", compact_rows=True)
    assert full is not None and compact is not None
    assert full["system_prompt"] == "a long prompt" and "system_prompt" not in compact
    assert compact["preview"] == "first words" and compact["last_active"] >= compact["started_at"]
    assert db._get_session_rich_row("missing") is None


def test_a_cjk_query_with_a_percent_sign_matches_it_literally(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "任务100%完成了")
    db.append_message("s", "user", "任务100完成了")
    assert [h["snippet"] for h in db.search_messages("100%完成")] == ["任务>>>100%完成<<<了"]


# --- the web import endpoint's validation -----------------------------------------------------


def test_an_import_reports_bad_records_and_imports_nothing(db: SessionDB) -> None:
    result = db.import_sessions([
        {"id": "good", "source": "cli", "messages": [{"role": "user", "content": "hi"}]},
        {"id": "bad-config", "source": "cli", "model_config": "{not json", "messages": []},
        {"id": "bad-role", "source": "cli", "messages": [{"content": "no role"}]},
    ])
    assert result["ok"] is False and result["imported"] == 0
    errors = {e["session_id"]: e["error"] for e in result["errors"]}
    assert errors["bad-config"] == "model_config must be valid JSON"
    assert "role must be a non-empty string" in errors["bad-role"]
    assert db.get_session("good") is None


def test_an_import_detaches_missing_self_and_cyclic_parents(db: SessionDB) -> None:
    result = db.import_sessions([
        {"id": "orphan", "source": "cli", "parent_session_id": "nowhere", "messages": []},
        {"id": "self", "source": "cli", "parent_session_id": "self", "messages": []},
        {"id": "c1", "source": "cli", "parent_session_id": "c2", "messages": []},
        {"id": "c2", "source": "cli", "parent_session_id": "c1", "messages": []},
    ])
    assert result["ok"] is True and result["imported"] == 4
    parents = [db.get_session(s)["parent_session_id"] for s in ("orphan", "self", "c1", "c2")]
    assert parents[:2] == [None, None] and None in parents[2:]
    assert db.get_session("c1")["started_at"] > 0  # a record written by hand starts now


def test_wal_falls_back_on_a_locking_protocol_error_raised_without_its_code(
    tmp_path: Path,
) -> None:
    """A connection wrapper raises SQLite's text alone (the kanban store's own wrapper does)."""

    class NetworkMount(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if "journal_mode=wal" in sql.lower().replace(" ", ""):
                raise sqlite3.OperationalError("locking protocol")
            return super().execute(sql, *args)

    conn = sqlite3.connect(tmp_path / "kanban.db", factory=NetworkMount, isolation_level=None)
    try:
        assert hermes_state.apply_wal_with_fallback(conn, db_label="kanban.db") == "delete"
        conn.execute("CREATE TABLE t (x)")
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    finally:
        conn.close()


def _route(db: SessionDB, session_id: str) -> tuple[Any, Any, Any]:
    row = db.get_session(session_id)
    return row["billing_provider"], row["billing_base_url"], row["billing_mode"]


def test_the_first_accounted_route_replaces_the_requested_one_and_stays(db: SessionDB) -> None:
    db.create_session("s", "cli", model="main")
    db.update_session_billing_route("s", provider="openrouter", base_url="https://or.example",
                                    billing_mode="byok")
    db.update_token_counts("s", model="main", billing_provider="ignored", cost_status="unknown")
    assert _route(db, "s") == ("openrouter", "https://or.example", "byok")  # counts nothing
    db.update_token_counts("s", input_tokens=10, api_call_count=1,
                           billing_provider="anthropic", billing_base_url="https://a.example")
    assert _route(db, "s") == ("anthropic", "https://a.example", None)  # all three at once
    db.update_token_counts("s", input_tokens=4, api_call_count=1, model="backup",
                           billing_provider="fallback", billing_base_url="https://f.example")
    assert _route(db, "s") == ("anthropic", "https://a.example", None)
    db.update_token_counts("s", input_tokens=1)  # no route, no model: the session's
    usage = {(u["model"], u["billing_provider"]): u["input_tokens"]
             for u in db.get_model_usage("s") if u["input_tokens"]}
    assert usage == {("main", "anthropic"): 11, ("backup", "fallback"): 4}


def test_the_gateway_exception_path_keeps_a_photo_turn(db: SessionDB) -> None:
    db.create_session("g", "telegram")
    assert db.persist_exception_input("g", PHOTO_TURN, marker="in-1")[0] == "appended"
    assert db.persist_exception_input("g", PHOTO_TURN, marker="in-1")[0] == "existing"
    assert [r["content"] for r in db.get_messages("g")] == [PHOTO_TURN]


# --- what the web endpoint, old stores and old tool-call shapes rely on ------------------------


@pytest.mark.parametrize(
    ("record", "code"),
    [
        (7, "invalid-record"),
        ({"id": "", "source": "cli"}, "missing-id"),
        ({"id": "r", "source": 5}, "invalid-field"),
        ({"id": "r", "source": "cli", "model_config": "{not json"}, "invalid-model-config"),
        ({"id": "r", "source": "cli", "model_config": 3}, "invalid-model-config"),
        ({"id": "r", "source": "cli", "messages": "hello"}, "invalid-messages"),
        ({"id": "r", "source": "cli", "messages": [3]}, "invalid-message"),
        ({"id": "r", "source": "cli", "messages": [{"content": "no role"}]}, "missing-role"),
        ({"id": "r", "source": "cli", "messages": [{"role": "", "content": "x"}]}, "missing-role"),
        ({"id": "r", "source": "cli", "messages": [{"role": "user", "content": 5}]},
         "unsupported-text"),
        ({"id": "r", "source": "cli", "messages": [{"role": "user", "content": b"raw"}]},
         "unsupported-text"),
        ({"id": "r", "source": "cli", "messages": [{"role": "user", "content": "\ud800"}]},
         "unsupported-text"),
        ({"id": "r", "source": "cli",
          "messages": [{"role": "user", "content": [{"type": "text", "text": float("nan")}]}]},
         "unsupported-text"),
        ({"id": "r", "source": "cli",
          "messages": [{"role": "user", "content": "x", "timestamp": "noon"}]},
         "invalid-message-field"),
        ({"id": "r", "source": "cli",
          "messages": [{"role": "user", "content": "x", "token_count": 2**70}]}, "out-of-range"),
        ({"id": "r", "source": "cli", "model_usage": [{"model": "m"}, {"model": "m"}]},
         "invalid-usage"),
        ({"id": "r", "source": "cli", "message_count": 4}, "truncated-record"),
        ({"id": "r", "source": "cli", "messages": [{"role": "user", "content": "x"}] * 10_001},
         "too-large"),
    ],
)
def test_each_refused_record_is_reported_once_in_the_previous_stores_shape(
    db: SessionDB, record: Any, code: str
) -> None:
    # ``code`` names the kind of fault; a list import reports it in the previous store's
    # shape, which the web endpoint passes through: index, message, session id when given.
    result = db.import_sessions([{"id": "fine", "source": "cli", "messages": []}, record])
    assert result["ok"] is False and db.get_session("fine") is None
    [error] = result["errors"]
    assert error["index"] == 1 and set(error) <= {"index", "error", "session_id"}, code
    assert isinstance(error["error"], str) and error["error"]  # the readable message stays


def test_codes_name_batch_and_store_conflicts_and_a_broken_stream(db: SessionDB) -> None:
    twice = db.import_sessions([{"id": "t", "source": "cli"}, {"id": "t", "source": "cli"}])
    assert [e["index"] for e in twice["errors"]] == [1]
    db.import_sessions([{"id": "held", "source": "cli"}])
    clash = db.import_sessions([{"id": "held", "source": "other"}], on_conflict="fail")
    assert [e["session_id"] for e in clash["errors"]] == ["held"]
    many = db.import_sessions([{"id": f"m{n}", "source": 5} for n in range(250)])
    assert many["errors"][-1] == {"error": "50 more problem(s) not listed"}
    for text, code in (("", "invalid-stream"), ("garbage\n", "not-json")):
        with pytest.raises(ImportRejectedError) as caught:
            db.import_jsonl(io.StringIO(text))
        assert caught.value.errors[0]["code"] == code


def test_a_stream_refused_whole_carries_the_code_of_its_fault(db: SessionDB) -> None:
    from hermes_state_transfer import read_json_export

    long_line = '{"kind": "header", "note": "' + "x" * 5000 + '"}\n'
    with pytest.raises(ImportRejectedError) as caught:
        db.import_jsonl(io.StringIO(long_line), max_record_bytes=4096)
    assert [(e["line"], e["code"]) for e in caught.value.errors] == [(1, "too-large")]
    for text, limit, code in (("garbage", 100, "not-json"), ("[1, 2", 100, "not-json"),
                              (b'["\xff"]', 100, "not-json"), ("[" + " " * 200, 100, "too-large")):
        with pytest.raises(ImportRejectedError) as caught:
            read_json_export(io.BytesIO(text) if isinstance(text, bytes) else io.StringIO(text),
                             limit)
        assert [e["code"] for e in caught.value.errors] == [code], text


@pytest.mark.parametrize(
    "calls",
    [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}},
        '[{"id": "c2", "type": "function"}]',
        "a provider's own notation",
        [{"id": "c3", "type": "function", "function": {"name": "memory", "arguments": "{}"}}],
    ],
)
def test_tool_calls_of_any_json_shape_are_kept_and_read_back_the_same(
    db: SessionDB, tmp_path: Path, calls: Any
) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "assistant", None, tool_calls=calls)
    assert db.get_messages("s")[0]["tool_calls"] == calls
    assert db.get_messages_as_conversation("s")[0]["tool_calls"] == calls
    exported = db.export_session("s")
    assert exported is not None and exported["messages"][0]["tool_calls"] == calls
    assert db.get_session("s")["tool_call_count"] == (1 if isinstance(calls, list) else 0)
    with SessionDB(tmp_path / "other.db") as other:
        assert other.import_sessions([exported])["ok"] is True
        assert other.get_messages("s")[0]["tool_calls"] == calls


def test_tool_calls_json_cannot_carry_are_refused_and_nothing_is_written(db: SessionDB) -> None:
    db.create_session("s", "cli")
    with pytest.raises(InvalidTypeError):
        db.append_message("s", "assistant", "x", tool_calls={"call": object()})
    with pytest.raises(InvalidInputError):
        db.append_message("s", "assistant", "x", tool_calls=[{"arguments": float("inf")}])
    assert db.get_messages("s") == [] and db.get_session("s")["message_count"] == 0


# A file the previous store wrote at its schema 16–18: sessions with the gateway's routing
# columns (the display columns came with 18), messages with their reasoning fields, the
# inline FTS index of the time, no per-model usage table yet (it came with 20).
def _previous_store_sql(version: int) -> str:
    display = ("    display_name TEXT,\n    origin_json TEXT,\n"
               "    expiry_finalized INTEGER DEFAULT 0,\n") if version >= 18 else ""
    return f"""
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT,
    session_key TEXT, chat_id TEXT, chat_type TEXT, thread_id TEXT,
{display}    model TEXT, model_config TEXT, system_prompt TEXT, parent_session_id TEXT,
    started_at REAL NOT NULL, ended_at REAL, end_reason TEXT,
    message_count INTEGER DEFAULT 0, tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0, output_tokens INTEGER DEFAULT 0,
    cache_read_tokens INTEGER DEFAULT 0, cache_write_tokens INTEGER DEFAULT 0,
    reasoning_tokens INTEGER DEFAULT 0, billing_provider TEXT, billing_base_url TEXT,
    billing_mode TEXT, estimated_cost_usd REAL, actual_cost_usd REAL, cost_status TEXT,
    cost_source TEXT, pricing_version TEXT, title TEXT, api_call_count INTEGER DEFAULT 0,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id)
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL, content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT,
    timestamp REAL NOT NULL, token_count INTEGER, finish_reason TEXT, reasoning TEXT,
    reasoning_details TEXT, codex_reasoning_items TEXT, active INTEGER DEFAULT 1
);
CREATE TABLE state_meta (key TEXT PRIMARY KEY, value TEXT);
CREATE UNIQUE INDEX idx_sessions_title_unique ON sessions(title) WHERE title IS NOT NULL;
CREATE VIRTUAL TABLE messages_fts USING fts5(content);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, COALESCE(new.content, ''));
END;
INSERT INTO schema_version VALUES ({version});
INSERT INTO sessions (id, source, user_id, session_key, chat_type, model, started_at,
                      input_tokens, output_tokens, api_call_count, billing_provider,
                      estimated_cost_usd)
    VALUES ('tg', 'telegram', '42', NULL, 'dm', 'gpt-x', 100.0, 120, 30, 3, 'openrouter', 0.5);
INSERT INTO sessions (id, source, session_key, chat_id, started_at)
    VALUES ('dc', 'discord', 'dc:kept', 'chan-kept', 200.0);
INSERT INTO sessions (id, source, started_at, title) VALUES ('cli', 'cli', 300.0, 'Local');
INSERT INTO messages (session_id, role, content, timestamp)
    VALUES ('tg', 'user', 'こんにちは, weather in Tokyo?', 101.0);
INSERT INTO messages (session_id, role, content, timestamp, reasoning)
    VALUES ('tg', 'assistant', 'sunny', 102.0, 'looked it up');
"""


# The gateway's index beside the file, as the gateway wrote it then.
SESSIONS_INDEX = {
    "_meta": {"session_id": "tg"},  # a key starting with "_" is not a session
    "agent:main:telegram:dm:42": {
        "session_id": "tg", "chat_type": "group", "display_name": "Ana",
        "origin": {"platform": "telegram", "chat_id": "42", "thread_id": "7"},
        "memory_flushed": True,
    },
    "agent:main:discord:1": {
        "session_id": "dc", "session_key": "dc:index", "display_name": "Bo",
        "origin": {"platform": "discord", "chat_id": "chan-index"},
    },
    "agent:main:slack:9": {"session_id": "gone", "display_name": "nobody"},
}


def _previous_store_file(tmp_path: Path, version: int, index: Any) -> Path:
    path = tmp_path / f"v{version}" / "state.db"
    (path.parent / "sessions").mkdir(parents=True)
    if index is not None:
        text = index if isinstance(index, str) else json.dumps(index)
        (path.parent / "sessions" / "sessions.json").write_text(text, encoding="utf-8")
    with sqlite3.connect(path) as conn:
        conn.executescript(_previous_store_sql(version))
    conn.close()
    return path


@pytest.mark.parametrize("version", [16, 17, 18])
def test_a_store_the_previous_store_wrote_at_16_to_18_upgrades_with_its_backfills(
    tmp_path: Path, version: int
) -> None:
    path = _previous_store_file(tmp_path, version, SESSIONS_INDEX)
    with SessionDB(path) as db:
        tg, dc = db.get_session("tg"), db.get_session("dc")
        if version < 18:  # the gateway's index fills what is still NULL, never what is set
            assert (tg["session_key"], tg["chat_id"], tg["thread_id"]) == (
                "agent:main:telegram:dm:42", "42", "7")
            assert (tg["chat_type"], tg["display_name"], tg["expiry_finalized"]) == (
                "dm", "Ana", 1)
            assert json.loads(tg["origin_json"])["platform"] == "telegram"
            assert (dc["session_key"], dc["chat_id"], dc["display_name"]) == (
                "dc:kept", "chan-kept", "Bo")
        else:  # a file at 18 had its backfill when the previous store stamped it
            assert (tg["session_key"], tg["display_name"], tg["origin_json"]) == (
                None, None, None)
        assert db.get_session("cli")["display_name"] is None
        [usage] = db.get_model_usage("tg")  # seeded from the session's totals
        assert (usage["model"], usage["billing_provider"], usage["task"]) == (
            "gpt-x", "openrouter", "")
        assert (usage["input_tokens"], usage["output_tokens"], usage["api_call_count"]) == (
            120, 30, 3)
        assert usage["estimated_cost_usd"] == 0.5
        assert db.get_model_usage("dc") == [] and db.get_model_usage("cli") == []
        messages = db.get_messages("tg")
        assert [m["content"] for m in messages] == ["こんにちは, weather in Tokyo?", "sunny"]
        assert messages[1]["reasoning"] == "looked it up"
        assert all(len(m["message_uid"]) == 32 for m in messages)
        db.append_message("tg", "user", "after the upgrade")
        db.update_token_counts("tg", input_tokens=5, api_call_count=1)
    with SessionDB(path) as db:  # a second open backfills nothing twice
        assert [u["input_tokens"] for u in db.get_model_usage("tg")] == [125]
        assert db.get_session("dc")["display_name"] == ("Bo" if version < 18 else None)


@pytest.mark.parametrize("stamp", [16, 17])
def test_a_current_file_stamped_below_18_gets_the_owed_backfills_and_keeps_its_values(
    tmp_path: Path, stamp: int
) -> None:
    # The application's own upgrade tests make an "older" file this way: a store of the
    # current shape with its stamp rolled back and the rows the steps fill taken out.
    path = tmp_path / "state.db"
    (tmp_path / "sessions").mkdir()
    (tmp_path / "sessions" / "sessions.json").write_text(json.dumps(SESSIONS_INDEX))
    with SessionDB(path) as db:
        db.create_session("tg", "telegram", model="gpt-x")
        db.update_token_counts("tg", input_tokens=7, output_tokens=2, model="gpt-x",
                               billing_provider="openrouter", api_call_count=1)
        db.create_session("dc", "discord", model="m1")
        db.update_token_counts("dc", input_tokens=5, model="m1", api_call_count=1)
        db.update_token_counts("dc", input_tokens=4, model="m2", api_call_count=1)
    with raw(path, write=True) as conn:
        conn.execute("DELETE FROM session_model_usage WHERE session_id = 'tg'")
        conn.execute("UPDATE sessions SET session_key = NULL, display_name = NULL")
        conn.execute("UPDATE schema_version SET version = ?", (stamp,))
    with SessionDB(path) as db:
        [usage] = db.get_model_usage("tg")
        assert (usage["model"], usage["input_tokens"], usage["output_tokens"]) == ("gpt-x", 7, 2)
        tg = db.get_session("tg")
        assert (tg["session_key"], tg["display_name"]) == ("agent:main:telegram:dm:42", "Ana")
        # a session that has usage rows keeps exactly those (no row seeded from its totals)
        assert sorted((u["model"], u["input_tokens"]) for u in db.get_model_usage("dc")) == [
            ("m1", 5), ("m2", 4)]
        assert db.get_session("dc")["display_name"] == "Bo"


@pytest.mark.parametrize("index", [None, "{not json", "[1, 2]"])
def test_an_absent_or_unreadable_gateway_index_leaves_the_columns_as_they_are(
    tmp_path: Path, index: Any
) -> None:
    path = _previous_store_file(tmp_path, 16, index)
    with SessionDB(path) as db:
        assert db.get_session("tg")["display_name"] is None
        assert db.get_session("dc")["session_key"] == "dc:kept"
        assert len(db.get_model_usage("tg")) == 1
