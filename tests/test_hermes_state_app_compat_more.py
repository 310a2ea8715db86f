"""More of what the agent application's own code and tests rely on (docs/compatibility.md):
the list import as the web endpoint passes it through, the WAL fallback's and the open error's
module names, and the list import's bounds under their previous names."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from state_helpers import raw

import hermes_state
from hermes_state import SessionDB, format_session_db_unavailable, get_last_init_error

# --- the list import, as the web endpoint passes its result through -------------------------


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"source": "cli", "messages": []}, {"index": 1, "error": "session id is required"}),
        ({"id": "j", "model_config": "{nope", "messages": []},
         {"index": 1, "session_id": "j", "error": "model_config must be valid JSON"}),
        ({"id": "u", "user_id": ["x"], "messages": []},
         {"index": 1, "session_id": "u", "error": "user_id must be a string"}),
        ({"id": "r", "messages": [{"role": "user", "content": "a"}, {"content": "b"}]},
         {"index": 1, "session_id": "r", "error": "messages[1].role must be a non-empty string"}),
        ({"id": "n", "messages": [{"role": None, "content": "b"}]},
         {"index": 1, "session_id": "n", "error": "messages[0].role must be a non-empty string"}),
        ({"id": "big", "messages": [{"role": "user", "content": "x" * (5 * 2**20 + 1)}]},
         {"index": 1, "session_id": "big", "error": "session exceeds the import size limit"}),
        ({"id": "long", "messages": [{"role": "user", "content": "x"}] * 10_001},
         {"index": 1, "session_id": "long",
          "error": "messages exceeds the per-session import limit"}),
    ],
)
def test_a_refused_list_import_reports_each_record_once_in_the_previous_words(
    db: SessionDB, record: dict[str, Any], expected: dict[str, Any]
) -> None:
    result = db.import_sessions([{"id": "fine", "source": "cli", "messages": []}, record])
    assert result["ok"] is False and result["imported"] == 0
    assert result["errors"] == [expected]
    assert db.get_session("fine") is None


def test_a_listed_record_without_source_or_with_live_state_imports_as_history(
    db: SessionDB,
) -> None:
    record = {"id": "h", "messages": [{"role": "user", "content": "hi"}],
              "handoff_state": "active", "handoff_platform": "telegram",
              "handoff_error": "stale", "rewind_count": 3}
    assert db.import_sessions([record])["ok"] is True
    row = db.get_session("h")
    assert row is not None and row["source"] == "import"
    assert (row["handoff_state"], row["handoff_platform"], row["handoff_error"]) == (None,) * 3
    assert row["rewind_count"] == 0
    assert [m["content"] for m in db.get_messages("h")] == ["hi"]


def test_the_list_import_bounds_keep_their_previous_names() -> None:
    assert SessionDB._IMPORT_MAX_SESSIONS == 500
    assert SessionDB._IMPORT_MAX_MESSAGES_PER_SESSION == 10_000
    assert SessionDB._IMPORT_MAX_SESSION_BYTES == 5 * 2**20


# --- the module names for open errors and the WAL fallback ----------------------------------


def test_the_last_open_error_can_be_set_and_cleared_by_its_caller() -> None:
    try:
        hermes_state._set_last_init_error("OperationalError: locking protocol")
        assert get_last_init_error() == "OperationalError: locking protocol"
        text = format_session_db_unavailable(prefix="Cannot /resume")
        assert text.startswith("Cannot /resume: OperationalError: locking protocol")
        assert "NFS/SMB" in text and "sqlite.org/wal.html" in text
        hermes_state._set_last_init_error(None)
        assert format_session_db_unavailable() == "Session database not available."
    finally:
        hermes_state._set_last_init_error(None)


def test_clearing_the_warned_labels_rearms_the_fallback_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def refused(name: str) -> sqlite3.Connection:
        conn = sqlite3.connect(tmp_path / name, isolation_level=None)
        conn.set_authorizer(lambda action, a1, a2, *_: sqlite3.SQLITE_DENY
                            if action == sqlite3.SQLITE_PRAGMA and a1 == "journal_mode"
                            and (a2 or "").lower() == "wal" else sqlite3.SQLITE_OK)
        return conn

    label = "rearm-test.db"
    with caplog.at_level(logging.WARNING, logger="hermes_state"):
        for name in ("a.db", "b.db"):
            conn = refused(name)
            assert hermes_state.apply_wal_with_fallback(conn, db_label=label) == "delete"
            conn.close()
        assert len([r for r in caplog.records if label in r.getMessage()]) == 1
        assert label in hermes_state._wal_fallback_warned_paths
        hermes_state._wal_fallback_warned_paths.discard(label)
        conn = refused("c.db")
        hermes_state.apply_wal_with_fallback(conn, db_label=label)
        conn.close()
    assert len([r for r in caplog.records if label in r.getMessage()]) == 2


def test_the_time_module_is_reachable_from_the_facade() -> None:
    import time

    assert hermes_state.time is time


# --- resume reads and generated titles ------------------------------------------------------


def _chain(db: SessionDB) -> None:
    db.create_session("root", "tui")
    db.append_message("root", "user", "first prompt")
    db.append_message("root", "assistant", "first answer")
    db.end_session("root", "compression")
    db.create_session("tip", "tui", parent_session_id="root")
    db.append_message("tip", "user", "first prompt")  # the prompt replayed into the continuation
    db.append_message("tip", "user", "second prompt")
    db.append_message("tip", "assistant", "second answer")


def test_a_resume_reads_both_histories_at_once(db: SessionDB) -> None:
    _chain(db)
    model, display = db.get_resume_conversations("tip")
    assert model == db.get_messages_as_conversation("tip", repair_alternation=True)
    assert display == db.get_messages_as_conversation("tip", include_ancestors=True)
    assert [t["content"] for t in display] == [
        "first prompt", "first answer", "first prompt", "second prompt", "second answer"]
    # without the application beside the store, no repair rule applies: the turns as stored
    assert [t["content"] for t in model] == ["first prompt", "second prompt", "second answer"]


def test_the_display_prefix_is_the_ancestors_turns_only(db: SessionDB) -> None:
    _chain(db)
    assert [t["content"] for t in db.get_ancestor_display_prefix("tip")] == [
        "first prompt", "first answer"]
    assert db.get_ancestor_display_prefix("root") == []
    assert db.get_ancestor_display_prefix("nobody") == []


def test_a_generated_title_never_replaces_one_already_set(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.create_session("other", "cli")
    assert db.set_auto_title_if_empty("s", "Generated") is True
    assert db.set_auto_title_if_empty("s", "Second guess") is False
    assert db.get_session_title("s") == "Generated"
    assert db.set_auto_title_if_empty("nobody", "Generated") is False
    with pytest.raises(ValueError, match="already in use"):
        db.set_auto_title_if_empty("other", "Generated")


def test_the_replay_for_a_live_resume_goes_through_the_applications_repair(
    db: SessionDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    package = tmp_path / "app" / "agent"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "agent_runtime_helpers.py").write_text(
        "def repair_message_sequence(agent, messages):\n"
        "    before = len(messages)\n"
        "    while messages and messages[-1].get('tool_calls'):\n"
        "        messages.pop()\n"
        "    return before - len(messages)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "app"))
    for name in ("agent", "agent.agent_runtime_helpers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    db.create_session("s", "cli")
    db.append_message("s", "user", "go")
    db.append_message("s", "assistant", "", tool_calls=[{"id": "t1", "type": "function"}])
    assert len(db.get_messages_as_conversation("s")) == 2  # as stored
    assert [t["role"] for t in db.get_messages_as_conversation("s", repair_alternation=True)] \
        == ["user"]
    model, display = db.get_resume_conversations("s")
    assert (len(model), len(display)) == (1, 2)
    assert db.message_count("s") == 2  # the stored rows never change


# --- the deletion helper on a connection with part of the store's tables ---------------------


def test_the_delegate_deletion_helper_works_on_a_connection_without_the_ledgers() -> None:
    import json

    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, parent_session_id TEXT,"
                 " model_config TEXT)")
    conn.execute("CREATE TABLE messages (session_id TEXT)")
    for sid, parent in (("A", "B"), ("B", "A"), ("C", None)):
        conn.execute("INSERT INTO sessions VALUES (?, NULL, ?)",
                     (sid, json.dumps({"_delegate_from": parent}) if parent else None))
        conn.executemany("INSERT INTO messages VALUES (?)", [(sid,)] * 2)
    assert hermes_state._delete_delegate_children(conn, ["A"]) == ["B"]
    assert [r[0] for r in conn.execute("SELECT id FROM sessions ORDER BY id")] == ["A", "C"]
    assert conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = 'B'").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = 'A'").fetchone()[0] == 2
    conn.close()


# --- older files: NULL flags, a dropped unique title index -----------------------------------


def test_messages_an_older_writer_left_with_null_flags_are_live_after_the_upgrade(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE schema_version (version INTEGER);
        INSERT INTO schema_version VALUES (12);
        CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT, started_at REAL,
                               ended_at REAL, message_count INTEGER DEFAULT 0, title TEXT,
                               parent_session_id TEXT, model_config TEXT);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
                               role TEXT NOT NULL, content TEXT, timestamp REAL NOT NULL,
                               active INTEGER, compacted INTEGER);
        INSERT INTO sessions (id, source, started_at) VALUES ('s', 'discord', 1.0);
        INSERT INTO messages (session_id, role, content, timestamp)
            VALUES ('s', 'user', 'an old turn', 1.0);
    """)
    conn.commit()
    conn.close()
    with SessionDB(path) as db:
        assert [t["content"] for t in db.get_messages_as_conversation("s")] == ["an old turn"]
    with raw(path) as conn:
        assert conn.execute("SELECT active, compacted FROM messages").fetchall() == [(1, 0)]


def test_a_store_whose_unique_title_index_was_dropped_opens_and_keeps_titles_unique(
    tmp_path: Path,
) -> None:
    path = tmp_path / "titles.db"
    with SessionDB(path) as db:
        for sid in ("older", "newer"):
            db.create_session(sid, "cli")
            db.append_message(sid, "user", f"kept in {sid}")
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX idx_sessions_title_unique")
    conn.execute("UPDATE sessions SET title = 'shared' WHERE id IN ('older', 'newer')")
    conn.commit()
    conn.close()
    with SessionDB(path) as db:
        assert db.get_session_title("older") == "shared"
        assert db.get_session_title("newer") == "shared #2"
        assert [m["content"] for m in db.get_messages("newer")] == ["kept in newer"]
        db.create_session("future", "cli")
        with pytest.raises(ValueError, match="already in use"):
            db.set_session_title("future", "shared")


# --- the sent form of a turn written before it was known --------------------------------------


def test_the_sent_form_lands_on_the_newest_user_turn_only_when_it_is_that_turn(
    db: SessionDB,
) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "earlier")
    db.append_message("s", "assistant", "ok")
    db.append_message("s", "user", "what now")
    assert db.set_latest_user_api_content("s", "something else", "<ctx/>what now") == 0
    assert db.set_latest_user_api_content("s", "what now", "<ctx/>what now") == 1
    rows = db.get_messages("s")
    assert [r["api_content"] for r in rows] == [None, None, "<ctx/>what now"]
    assert rows[-1]["content"] == "what now"
    assert db.get_messages_as_conversation("s")[-1]["content"] == "<ctx/>what now"
    db.append_message("s", "user", [{"type": "text", "text": "a photo"}])
    assert db.set_latest_user_api_content("s", [{"type": "text", "text": "a photo"}], "x") == 0
    assert db.set_latest_user_api_content("nobody", "what now", "x") == 0
