"""A file written by the previous SessionDB opens in place and keeps every row.

The previous store stamps its own schema numbering (21 here) and a layout of its own: the
handoff and compression-state columns under its names, an inline FTS index with its own
triggers, an ``async_delegations`` table of different columns, and the Telegram topic tables
of its first topic schema (bindings without the cascade). The file is built by hand with raw
``sqlite3`` in that layout, filled with rows (fixed ones plus seeded random ones), opened with
:class:`SessionDB`, and every row of every table is compared value for value afterwards.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

import hermes_state_fts as fts
from hermes_state import SCHEMA_VERSION, SessionDB

UPSTREAM_VERSION = 21

UPSTREAM_SQL = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    user_id TEXT,
    session_key TEXT,
    chat_id TEXT,
    chat_type TEXT,
    thread_id TEXT,
    display_name TEXT,
    origin_json TEXT,
    expiry_finalized INTEGER DEFAULT 0,
    model TEXT,
    model_config TEXT,
    system_prompt TEXT,
    parent_session_id TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0,
    cache_read_tokens INTEGER DEFAULT 0,
    cache_write_tokens INTEGER DEFAULT 0,
    reasoning_tokens INTEGER DEFAULT 0,
    cwd TEXT,
    git_branch TEXT,
    git_repo_root TEXT,
    billing_provider TEXT,
    billing_base_url TEXT,
    billing_mode TEXT,
    estimated_cost_usd REAL,
    actual_cost_usd REAL,
    cost_status TEXT,
    cost_source TEXT,
    pricing_version TEXT,
    title TEXT,
    api_call_count INTEGER DEFAULT 0,
    handoff_state TEXT,
    handoff_platform TEXT,
    handoff_error TEXT,
    compression_failure_cooldown_until REAL,
    compression_failure_error TEXT,
    compression_fallback_streak INTEGER NOT NULL DEFAULT 0,
    profile_name TEXT,
    rewind_count INTEGER NOT NULL DEFAULT 0,
    archived INTEGER NOT NULL DEFAULT 0,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id)
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL,
    content TEXT,
    tool_call_id TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    effect_disposition TEXT,
    timestamp REAL NOT NULL,
    token_count INTEGER,
    finish_reason TEXT,
    reasoning TEXT,
    reasoning_content TEXT,
    reasoning_details TEXT,
    codex_reasoning_items TEXT,
    codex_message_items TEXT,
    platform_message_id TEXT,
    observed INTEGER DEFAULT 0,
    active INTEGER NOT NULL DEFAULT 1,
    compacted INTEGER NOT NULL DEFAULT 0,
    api_content TEXT
);
CREATE TABLE session_model_usage (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    model TEXT NOT NULL,
    billing_provider TEXT NOT NULL DEFAULT '',
    billing_base_url TEXT NOT NULL DEFAULT '',
    billing_mode TEXT NOT NULL DEFAULT '',
    task TEXT NOT NULL DEFAULT '',
    api_call_count INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0,
    estimated_cost_usd REAL NOT NULL DEFAULT 0,
    actual_cost_usd REAL NOT NULL DEFAULT 0,
    cost_status TEXT,
    cost_source TEXT,
    first_seen REAL,
    last_seen REAL,
    PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode, task)
);
CREATE TABLE state_meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE gateway_routing (
    scope TEXT NOT NULL DEFAULT '',
    session_key TEXT NOT NULL,
    entry_json TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (scope, session_key)
);
CREATE TABLE compression_locks (
    session_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE async_delegations (
    delegation_id TEXT PRIMARY KEY,
    origin_session TEXT NOT NULL,
    origin_ui_session_id TEXT NOT NULL DEFAULT '',
    parent_session_id TEXT,
    state TEXT NOT NULL,
    dispatched_at REAL NOT NULL,
    completed_at REAL,
    updated_at REAL NOT NULL,
    event_json TEXT,
    result_json TEXT,
    delivery_state TEXT NOT NULL DEFAULT 'pending',
    delivery_attempts INTEGER NOT NULL DEFAULT 0,
    delivered_at REAL,
    owner_pid INTEGER,
    owner_started_at INTEGER,
    task_json TEXT,
    delivery_claim TEXT,
    delivery_claimed_at REAL
);
CREATE TABLE telegram_dm_topic_mode (
    chat_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    enabled INTEGER NOT NULL DEFAULT 1,
    activated_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    has_topics_enabled INTEGER,
    allows_users_to_create_topics INTEGER,
    capability_checked_at REAL,
    intro_message_id TEXT,
    pinned_message_id TEXT
);
CREATE TABLE telegram_dm_topic_bindings (
    chat_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    session_key TEXT NOT NULL,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    managed_mode TEXT NOT NULL DEFAULT 'auto',
    linked_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (chat_id, thread_id)
);
CREATE UNIQUE INDEX idx_telegram_dm_topic_bindings_session
    ON telegram_dm_topic_bindings(session_id);
CREATE INDEX idx_telegram_dm_topic_bindings_user
    ON telegram_dm_topic_bindings(user_id, chat_id);
CREATE INDEX idx_sessions_source ON sessions(source);
CREATE INDEX idx_sessions_source_id ON sessions(source, id);
CREATE INDEX idx_sessions_parent ON sessions(parent_session_id);
CREATE INDEX idx_sessions_started ON sessions(started_at DESC);
CREATE INDEX idx_sessions_session_key ON sessions(session_key, started_at DESC);
CREATE INDEX idx_sessions_handoff_state ON sessions(handoff_state, started_at);
CREATE UNIQUE INDEX idx_sessions_title_unique ON sessions(title) WHERE title IS NOT NULL;
CREATE INDEX idx_messages_session ON messages(session_id, timestamp);
CREATE INDEX idx_messages_session_active ON messages(session_id, active, timestamp);
CREATE INDEX idx_compression_locks_expires ON compression_locks(expires_at);
CREATE INDEX idx_session_model_usage_session ON session_model_usage(session_id);
CREATE VIRTUAL TABLE messages_fts USING fts5(content);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
        || COALESCE(new.tool_calls, ''));
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE ON messages BEGIN
    DELETE FROM messages_fts WHERE rowid = old.id;
    INSERT INTO messages_fts(rowid, content) VALUES (new.id,
        COALESCE(new.content, '') || ' ' || COALESCE(new.tool_name, '') || ' '
        || COALESCE(new.tool_calls, ''));
END;
CREATE VIRTUAL TABLE messages_fts_trigram USING fts5(content, tokenize='trigram');
CREATE TRIGGER messages_fts_trigram_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts_trigram(rowid, content) VALUES (new.id, COALESCE(new.content, ''));
END;
CREATE TRIGGER messages_fts_trigram_delete AFTER DELETE ON messages BEGIN
    DELETE FROM messages_fts_trigram WHERE rowid = old.id;
END;
"""

FUTURE = time.time() + 3600.0

SESSIONS: list[dict[str, Any]] = [
    {"id": "up-root", "source": "cli", "model": "gpt-x", "model_config": '{"temperature":0.2}',
     "system_prompt": "be brief", "started_at": 100.0, "ended_at": 200.0,
     "end_reason": "compression", "message_count": 3, "tool_call_count": 1,
     "input_tokens": 10, "output_tokens": 20, "cwd": "/srv/repo", "git_branch": "main",
     "git_repo_root": "/srv/repo", "billing_provider": "openrouter", "title": "Upstream root",
     "api_call_count": 2, "handoff_state": "failed", "handoff_platform": "telegram",
     "handoff_error": "the gateway was offline", "compression_failure_cooldown_until": FUTURE,
     "compression_failure_error": "rate limited", "compression_fallback_streak": 2,
     "profile_name": "work", "rewind_count": 1, "archived": 0},
    {"id": "up-child", "source": "telegram", "user_id": "4242", "session_key": "tg:dm:4242",
     "chat_id": "4242", "chat_type": "dm", "thread_id": "17", "display_name": "Ana",
     "origin_json": '{"platform":"telegram"}', "parent_session_id": "up-root",
     "started_at": 201.0, "message_count": 3, "handoff_state": "pending",
     "handoff_platform": "discord", "compression_fallback_streak": 0, "archived": 0},
    {"id": "up-archived", "source": "discord", "started_at": 50.0, "ended_at": 60.0,
     "end_reason": "user_exit", "archived": 1, "compression_fallback_streak": 5},
]

MESSAGES: list[dict[str, Any]] = [
    {"session_id": "up-root", "role": "user", "content": "How is the weather in Tokyo?",
     "timestamp": 101.0, "platform_message_id": "m-1"},
    {"session_id": "up-root", "role": "assistant", "content": None, "timestamp": 102.0,
     "tool_calls": json.dumps([{"id": "call_1", "type": "function",
                                "function": {"name": "weather", "arguments": "{}"}}]),
     "finish_reason": "tool_calls", "reasoning": "look it up"},
    {"session_id": "up-root", "role": "tool", "content": "sunny, 24°C", "tool_call_id": "call_1",
     "tool_name": "weather", "timestamp": 103.0, "effect_disposition": "read_only"},
    {"session_id": "up-child", "role": "user", "content": "東京の天気を教えてください 😀",
     "timestamp": 202.0, "observed": 1},
    {"session_id": "up-child", "role": "assistant", "content": "晴れです。", "timestamp": 203.0,
     "active": 0},
    {"session_id": "up-child", "role": "assistant", "content": "晴れ、24度です。",
     "timestamp": 204.0, "api_content": "晴れ、24度です。"},
]

OTHER_ROWS: dict[str, list[dict[str, Any]]] = {
    "session_model_usage": [
        {"session_id": "up-root", "model": "gpt-x", "billing_provider": "openrouter",
         "api_call_count": 2, "input_tokens": 10, "output_tokens": 20,
         "estimated_cost_usd": 0.01, "cost_status": "estimated", "first_seen": 101.0,
         "last_seen": 103.0},
    ],
    "state_meta": [
        {"key": "last_auto_prune", "value": "1700000000.0"},
        {"key": "telegram_dm_topic_schema_version", "value": "1"},
        {"key": "ghost_session_prune_v1", "value": "done"},
    ],
    "gateway_routing": [
        {"scope": "", "session_key": "tg:dm:4242",
         "entry_json": '{"session_id": "up-child",  "spacing": "kept as written"}',
         "updated_at": 205.0},
        {"scope": "/srv/sessions", "session_key": "dc:1", "entry_json": '{"a":1}',
         "updated_at": 206.0},
    ],
    "compression_locks": [
        {"session_id": "up-child", "holder": "pid=1:host=h", "acquired_at": 1.0,
         "expires_at": 2.0},
    ],
    "async_delegations": [
        {"delegation_id": "d-1", "origin_session": "up-root", "parent_session_id": "up-root",
         "state": "completed", "dispatched_at": 150.0, "completed_at": 160.0,
         "updated_at": 160.0, "result_json": '{"ok":true}', "delivery_state": "delivered"},
    ],
    "telegram_dm_topic_mode": [
        {"chat_id": "4242", "user_id": "4242", "enabled": 1, "activated_at": 190.0,
         "updated_at": 191.0, "has_topics_enabled": 1, "allows_users_to_create_topics": 0,
         "capability_checked_at": 190.0, "intro_message_id": "900"},
    ],
    "telegram_dm_topic_bindings": [
        {"chat_id": "4242", "thread_id": "17", "user_id": "4242", "session_key": "tg:dm:4242",
         "session_id": "up-child", "managed_mode": "restored", "linked_at": 192.0,
         "updated_at": 193.0},
    ],
}

UPSTREAM_TABLES = ("sessions", "messages", *OTHER_ROWS)
UID_RE = re.compile(r"[0-9a-f]{32}")


def insert(conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> None:
    names = ", ".join(row)
    conn.execute(f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(row))})",
                 tuple(row.values()))


def random_rows(seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Sessions and messages of any text, in the shapes the previous store wrote."""
    rng = random.Random(seed)
    alphabet = "abcxyz 東京語한국😀\n\t'\"%_\\"
    sessions, messages = [], []
    for n in range(rng.randint(3, 8)):
        sid = f"rnd-{seed}-{n}"
        sessions.append({
            "id": sid, "source": rng.choice(["cli", "telegram", "tui", "cron"]),
            "started_at": rng.uniform(0, 1e9), "title": None if rng.random() < 0.5 else
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) + f" {sid}",
            "cwd": rng.choice([None, "", "/r/a", "/r/b"]),
            "handoff_state": rng.choice([None, "pending", "running", "completed", "failed"]),
            "handoff_platform": rng.choice([None, "telegram", "slack"]),
            "compression_fallback_streak": rng.randint(0, 9),
            "compression_failure_cooldown_until": rng.choice([None, rng.uniform(0, 2e9)]),
            "archived": rng.randint(0, 1),
        })
        for _ in range(rng.randint(0, 6)):
            messages.append({
                "session_id": sid, "role": rng.choice(["user", "assistant", "tool"]),
                "content": "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))),
                "timestamp": rng.uniform(0, 1e9), "active": rng.randint(0, 1),
            })
    return sessions, messages


def build_upstream(path: Path, seed: int) -> None:
    extra_sessions, extra_messages = random_rows(seed)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.executescript(UPSTREAM_SQL)
        conn.execute("BEGIN")
        conn.execute("INSERT INTO schema_version VALUES (?)", (UPSTREAM_VERSION,))
        for row in SESSIONS + extra_sessions:
            insert(conn, "sessions", row)
        for row in MESSAGES + extra_messages:
            insert(conn, "messages", row)
        for table, table_rows in OTHER_ROWS.items():
            for row in table_rows:
                insert(conn, table, row)
        conn.execute("COMMIT")
    finally:
        conn.close()


def upstream_columns(path: Path) -> dict[str, list[str]]:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return {t: [r[1] for r in conn.execute("SELECT * FROM pragma_table_info(?)", (t,))]
                for t in UPSTREAM_TABLES}
    finally:
        conn.close()


def with_spelling(rows: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """``rows`` as the upgrade leaves them: state_meta records how the CJK index is spelled."""
    meta = sorted([*rows["state_meta"], (fts.SPELLING_KEY, fts.CJK_SPELLING)])
    return {**rows, "state_meta": meta}


def table_rows(path: Path, columns: dict[str, list[str]]) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return {
            t: conn.execute(
                f"SELECT {', '.join(cols)} FROM {t} ORDER BY {', '.join(cols[:1])}, rowid"
            ).fetchall()
            for t, cols in columns.items()
        }
    finally:
        conn.close()


def wait_for_fts_rebuild(db: SessionDB, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while db.fts_status()["rebuild_high_water"] is not None:
        assert time.monotonic() < deadline, "the FTS rebuild did not finish"
        time.sleep(0.02)


@pytest.fixture(params=[1, 2, 3], ids=lambda s: f"seed{s}")
def upstream_path(db_path: Path, request: pytest.FixtureRequest) -> Path:
    build_upstream(db_path, request.param)
    return db_path


def test_every_row_of_every_table_is_kept(upstream_path: Path) -> None:
    columns = upstream_columns(upstream_path)
    before = table_rows(upstream_path, columns)
    with SessionDB(upstream_path) as db:
        assert db.get_session("up-child")["parent_session_id"] == "up-root"
        wait_for_fts_rebuild(db)  # its progress markers live in state_meta meanwhile
    assert table_rows(upstream_path, columns) == with_spelling(before)
    conn = sqlite3.connect(upstream_path)
    try:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [
            (SCHEMA_VERSION,)]
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        conn.close()
    with SessionDB(upstream_path) as db:  # a second open changes nothing either
        assert db.get_session("up-root")["title"] == "Upstream root"
    assert table_rows(upstream_path, columns) == with_spelling(before)


def test_upgraded_messages_get_lasting_uids_and_pair_their_tool_results(
    upstream_path: Path,
) -> None:
    sessions = ("up-root", "up-child")
    with SessionDB(upstream_path) as db:
        rows = [m for s in sessions for m in db.get_messages(s, True)]
        turns = db.get_messages_as_conversation("up-root")
    uids = [m["message_uid"] for m in rows]
    assert len(uids) == len(MESSAGES) == len(set(uids))
    assert all(UID_RE.fullmatch(uid) for uid in uids)
    assert turns[2]["_tool_call_uid"] == turns[1]["_tool_call_uids"]["call_1"]
    with SessionDB(upstream_path) as db:
        again = [m["message_uid"] for s in sessions for m in db.get_messages(s, True)]
    assert again == uids


def test_upgraded_rows_answer_through_the_callers_methods(upstream_path: Path) -> None:
    with SessionDB(upstream_path) as db:
        root = db.get_session("up-root")
        assert (root["handoff_state"], root["handoff_platform"], root["handoff_error"]) == (
            "failed", "telegram", "the gateway was offline")
        assert db.get_handoff_state("up-root") == {
            "state": "failed", "platform": "telegram", "error": "the gateway was offline"}
        assert "up-child" in [r["id"] for r in db.list_pending_handoffs()]
        assert db.get_compression_fallback_streak("up-root") == 2
        assert db.get_compression_fallback_streak("up-archived") == 5
        cooldown = db.get_compression_failure_cooldown("up-root")
        assert cooldown is not None and cooldown["error"] == "rate limited"
        assert db.load_gateway_routing_entries() == {
            "tg:dm:4242": OTHER_ROWS["gateway_routing"][0]["entry_json"]}
        assert db.is_telegram_topic_mode_enabled(chat_id=4242, user_id="4242")
        binding = db.get_telegram_topic_binding(chat_id="4242", thread_id=17)
        assert binding == OTHER_ROWS["telegram_dm_topic_bindings"][0]
        wait_for_fts_rebuild(db)
        hits = db.search_messages("weather")  # the old index's rows are searchable again
        assert {h["session_id"] for h in hits} == {"up-root"}


def test_the_old_bindings_table_gains_its_cascade_and_keeps_its_rows(upstream_path: Path) -> None:
    with SessionDB(upstream_path) as db:
        db.apply_telegram_topic_migration()
        assert db.get_meta("telegram_dm_topic_schema_version") == "2"
        assert db.get_telegram_topic_binding_by_session(session_id="up-child") == (
            OTHER_ROWS["telegram_dm_topic_bindings"][0])
        assert db.is_telegram_topic_mode_enabled(chat_id="4242", user_id="4242")
        db.delete_session("up-child")
        assert db.get_telegram_topic_binding(chat_id="4242", thread_id="17") is None
        assert db.list_telegram_topic_bindings_for_chat(chat_id="4242") == []


# Opens argv[1] once the clock reaches argv[2]; prints how many messages carry a uid.
OPEN_SCRIPT = """
import json, sys, time
from hermes_state import SessionDB
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
with SessionDB(sys.argv[1]) as db:
    ids = [s["id"] for s in db.search_sessions(limit=1000)]
    print(json.dumps(sum(bool(m["message_uid"]) for s in ids for m in db.get_messages(s, True))))
"""


@pytest.mark.slow
def test_processes_upgrading_the_file_at_once_all_succeed_and_lose_nothing(
    upstream_path: Path, spawn_python
) -> None:
    columns = upstream_columns(upstream_path)
    before = table_rows(upstream_path, columns)
    start = f"{time.time() + 0.8:.3f}"
    procs = [spawn_python(OPEN_SCRIPT, str(upstream_path), start) for _ in range(3)]
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert json.loads(out) == len(before["messages"])
    with SessionDB(upstream_path) as db:
        wait_for_fts_rebuild(db)
    assert table_rows(upstream_path, columns) == with_spelling(before)
