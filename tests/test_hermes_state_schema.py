"""The schema: what a fresh store contains, how old files upgrade in place, what is refused.

Old files are built by hand with raw ``sqlite3`` in the shapes earlier versions wrote, then
opened with :class:`SessionDB`; the rows are compared value for value afterwards.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import time
from pathlib import Path

import pytest

import hermes_state_schema
from hermes_state import SCHEMA_VERSION, SessionDB, StateDbUnavailableError

EXPECTED_TABLES = {
    "sessions",
    "messages",
    "session_model_usage",
    "messages_fts",
    "messages_fts_trigram",
    "messages_fts_cjk",
    "state_meta",
    "gateway_routing",
    "compression_locks",
    "async_delegations",
    "runtime_epoch",
    "session_admissions",
    "worker_executions",
    "worker_receipts",
    "schema_version",
    "search_impact_state",
    "search_impact",
    "search_impact_fts",
    "search_impact_queue",
    "search_impact_gone",
    "search_time_blocks",
    "search_row_changes",
    "search_word_counts",
}

SESSION_COLUMNS = """
id source user_id model model_config system_prompt parent_session_id started_at ended_at
end_reason message_count tool_call_count input_tokens output_tokens cache_read_tokens
cache_write_tokens reasoning_tokens billing_provider billing_base_url billing_mode
estimated_cost_usd actual_cost_usd cost_status cost_source pricing_version title api_call_count
session_key chat_id chat_type thread_id display_name origin_json expiry_finalized cwd git_branch
git_repo_root profile_name transport_profile rewind_count archived auto_archived pinned
""".split()

MESSAGE_COLUMNS = """
id session_id role content tool_call_id tool_calls tool_name timestamp token_count
finish_reason reasoning reasoning_content reasoning_details codex_reasoning_items
codex_message_items effect_disposition platform_message_id observed active compacted
api_content display_kind display_metadata message_uid absorbed_message_uids tool_call_uids
tool_call_uid
""".split()

USAGE_COLUMNS = """
session_id model billing_provider billing_base_url billing_mode task input_tokens output_tokens
cache_read_tokens cache_write_tokens reasoning_tokens estimated_cost_usd actual_cost_usd
api_call_count
""".split()

UID_RE = re.compile(r"[0-9a-f]{32}")


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute("SELECT * FROM pragma_table_info(?)", (table,))]


def names(conn: sqlite3.Connection, kind: str) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = ?", (kind,))
    return {r[0] for r in rows if not r[0].startswith("sqlite_")}


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wait_for_fts_rebuild(db: SessionDB, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        status = db.fts_status()
        if status["rebuild_high_water"] is None and status["stale"] is None:
            return
        assert time.monotonic() < deadline, f"FTS rebuild did not finish: {status}"
        time.sleep(0.02)


# --- a fresh store ---------------------------------------------------------------------------


def test_schema_version_is_31() -> None:
    assert SCHEMA_VERSION == 31


def test_fresh_store_has_every_table_and_no_delivery_obligations(db: SessionDB) -> None:
    with raw(db.path) as conn:
        tables = names(conn, "table")
        # FTS5 shadow tables (messages_fts_data, ...) come with the virtual tables.
        assert EXPECTED_TABLES <= tables
        assert "delivery_obligations" not in tables
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(31,)]


@pytest.mark.parametrize(
    ("table", "expected"),
    [("sessions", SESSION_COLUMNS), ("messages", MESSAGE_COLUMNS),
     ("session_model_usage", USAGE_COLUMNS)],
)
def test_fresh_store_has_every_column(db: SessionDB, table: str, expected: list[str]) -> None:
    with raw(db.path) as conn:
        missing = set(expected) - set(columns(conn, table))
    assert not missing


def test_messages_id_is_autoincrement(db: SessionDB) -> None:
    db.create_session("s", "cli")
    first = db.append_message("s", "user", "a")
    db.clear_messages("s")
    # AUTOINCREMENT: a deleted id is never handed out again.
    assert db.append_message("s", "user", "b") > first


def test_fresh_store_has_the_seed_indexes(db: SessionDB) -> None:
    with raw(db.path) as conn:
        def index_columns(name: str) -> list[str]:
            return [r[2] for r in conn.execute("SELECT * FROM pragma_index_info(?)", (name,))]

        assert index_columns("idx_messages_session") == ["session_id", "timestamp"]
        assert index_columns("idx_messages_session_id") == ["session_id", "id"]
        assert index_columns("idx_sessions_source") == ["source"]
        assert index_columns("idx_sessions_parent") == ["parent_session_id"]
        assert index_columns("idx_sessions_started") == ["started_at"]
        unique, partial = conn.execute(
            "SELECT \"unique\", partial FROM pragma_index_list('sessions')"
            " WHERE name = 'idx_sessions_title_unique'"
        ).fetchone()
        assert (unique, partial) == (1, 1)


def test_fts_tables_are_fts5_with_sync_triggers(db: SessionDB) -> None:
    with raw(db.path) as conn:
        for table in ("messages_fts", "messages_fts_trigram", "messages_fts_cjk"):
            sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()
            assert "USING fts5" in sql[0]
        assert conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'messages_fts'"
        ).fetchone()[0].replace(" ", "").count("content,tool_name,tool_calls") == 1
        triggers = names(conn, "trigger")
    assert {"messages_fts_insert", "messages_fts_update", "messages_fts_delete"} <= triggers
    assert db.fts_status()["missing_triggers"] == []


@pytest.mark.parametrize("table", ["session_admissions", "worker_executions", "worker_receipts"])
def test_ledgers_reference_sessions_with_on_delete_restrict(db: SessionDB, table: str) -> None:
    with raw(db.path) as conn:
        keys = conn.execute("SELECT * FROM pragma_foreign_key_list(?)", (table,)).fetchall()
    to_sessions = [k for k in keys if k[2] == "sessions"]
    assert to_sessions, keys
    assert all(k[3] == "session_id" and k[4] == "id" and k[6] == "RESTRICT" for k in to_sessions)


def test_ledger_restrict_is_enforced(db: SessionDB) -> None:
    db.create_session("s", "cli")
    with raw(db.path) as conn:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(
            "INSERT INTO session_admissions (session_id, payload_json, status, created_at)"
            " VALUES ('s', '{}', 'done', 0)"
        )
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("DELETE FROM sessions WHERE id = 's'")


# --- upgrading old files ---------------------------------------------------------------------

# Version 1: sessions and messages with their original columns, one FTS index over content.
V1_SQL = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    user_id TEXT,
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
    timestamp REAL NOT NULL,
    token_count INTEGER,
    finish_reason TEXT
);
CREATE INDEX idx_messages_session ON messages(session_id, timestamp);
CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages', content_rowid='id');
CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER messages_au AFTER UPDATE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
"""

V1_SESSIONS = [
    ("root", "cli", "alice", "gpt-x", '{"t": 1}', "be brief", None, 100.0, 200.0, "user_exit",
     3, 1, 10, 20),
    ("child", "telegram", "12345", None, None, None, "root", 150.0, None, None, 2, 0, 0, 0),
    ("empty", "discord", None, None, None, None, None, 160.0, None, None, 0, 0, 0, 0),
]
V1_MESSAGES = [
    (1, "root", "user", "How is the weather in Tokyo?", None, None, None, 101.0, 7, None),
    (2, "root", "assistant", None, None,
     '[{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]',
     None, 102.0, None, "tool_calls"),
    (3, "root", "tool", "sunny, 24°C", "call_1", None, "weather", 103.0, None, None),
    (4, "child", "user", "東京の天気を教えてください 😀", None, None, None, 151.0, None, None),
    (5, "child", "assistant", "晴れです。気温は２４度。", None, None, None, 152.0, None, "stop"),
]
V1_MESSAGE_COLUMNS = (
    "id, session_id, role, content, tool_call_id, tool_calls, tool_name, timestamp, token_count,"
    " finish_reason"
)
V1_SESSION_COLUMNS = (
    "id, source, user_id, model, model_config, system_prompt, parent_session_id, started_at,"
    " ended_at, end_reason, message_count, tool_call_count, input_tokens, output_tokens"
)


def build_v1(path: Path, *, version_table: bool) -> None:
    with raw(path) as conn:
        conn.executescript(V1_SQL)
        if version_table:
            conn.executescript(
                "CREATE TABLE schema_version (version INTEGER NOT NULL);"
                "INSERT INTO schema_version VALUES (1);"
            )
        conn.execute("BEGIN")
        conn.executemany(f"INSERT INTO sessions ({V1_SESSION_COLUMNS}) VALUES "
                         f"({', '.join('?' * 14)})", V1_SESSIONS)
        conn.executemany(f"INSERT INTO messages ({V1_MESSAGE_COLUMNS}) VALUES "
                         f"({', '.join('?' * 10)})", V1_MESSAGES)
        conn.execute("COMMIT")
    conn.close()


def rows(path: Path, sql: str) -> list[tuple]:
    conn = raw(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


@pytest.fixture
def v1_path(db_path: Path, request: pytest.FixtureRequest) -> Path:
    build_v1(db_path, version_table=getattr(request, "param", True))
    return db_path


@pytest.mark.parametrize("v1_path", [True, False], indirect=True, ids=["v1-row", "untracked"])
def test_version_1_file_upgrades_in_place_with_every_row_intact(v1_path: Path) -> None:
    with SessionDB(v1_path) as db:
        wait_for_fts_rebuild(db)
        assert db.check_fts_integrity() == dict.fromkeys(
            ("messages_fts", "messages_fts_trigram", "messages_fts_cjk")
        )
        assert db.get_session("child")["user_id"] == "12345"
        assert [m["content"] for m in db.get_messages("child")] == [
            V1_MESSAGES[3][3], V1_MESSAGES[4][3]
        ]
        assert db.get_messages("root")[1]["tool_calls"] == json.loads(V1_MESSAGES[1][5])
        assert [s["id"] for s in db.get_session_ancestors("child")] == ["child", "root"]
    assert rows(v1_path, f"SELECT {V1_SESSION_COLUMNS} FROM sessions ORDER BY id") == sorted(
        V1_SESSIONS
    )
    assert rows(v1_path, f"SELECT {V1_MESSAGE_COLUMNS} FROM messages ORDER BY id") == V1_MESSAGES
    assert rows(v1_path, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    with raw(v1_path) as conn:
        assert set(MESSAGE_COLUMNS) <= set(columns(conn, "messages"))
        assert set(SESSION_COLUMNS) <= set(columns(conn, "sessions"))
        assert EXPECTED_TABLES <= names(conn, "table")
        triggers = names(conn, "trigger")
    assert not {"messages_ai", "messages_ad", "messages_au"} & triggers
    conn.close()


def test_upgrade_backfills_lasting_message_uids(v1_path: Path) -> None:
    with SessionDB(v1_path) as db:
        first = [m["message_uid"] for m in db.get_messages("root") + db.get_messages("child")]
    assert len(first) == len(V1_MESSAGES) == len(set(first))
    assert all(UID_RE.fullmatch(uid) for uid in first)
    with SessionDB(v1_path) as db:
        again = [m["message_uid"] for m in db.get_messages("root") + db.get_messages("child")]
    assert again == first


def test_upgraded_tool_calls_get_uids_and_their_results_are_paired(v1_path: Path) -> None:
    with SessionDB(v1_path) as db:
        turns = db.get_messages_as_conversation("root")
    caller, result = turns[1], turns[2]
    assert set(caller["_tool_call_uids"]) == {"call_1"}
    assert UID_RE.fullmatch(caller["_tool_call_uids"]["call_1"])
    assert result["_tool_call_uid"] == caller["_tool_call_uids"]["call_1"]


def test_upgraded_rows_get_default_flags_and_counters(v1_path: Path) -> None:
    with SessionDB(v1_path) as db:
        messages = db.get_messages("root")
        assert all(m["active"] and not m["compacted"] and not m["observed"] for m in messages)
        session = db.get_session("root")
        assert (session["message_count"], session["tool_call_count"]) == (3, 1)
        assert session["cache_read_tokens"] == 0 and session["title"] is None


def test_upgraded_search_indexes_hold_the_old_rows(v1_path: Path) -> None:
    with SessionDB(v1_path) as db:
        wait_for_fts_rebuild(db)
        db.append_message("child", "user", "新しい東京の質問 tokyo")
    with raw(v1_path) as conn:
        def match(table: str, query: str) -> list[int]:
            return [r[0] for r in conn.execute(
                f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rowid", (query,)
            )]

        assert match("messages_fts", "weather") == [1, 2, 3]  # content, tool_calls, tool_name
        assert match("messages_fts", "content:weather") == [1]
        assert match("messages_fts", "tool_name:weather") == [3]
        assert match("messages_fts", "tokyo") == [1, 6]
        assert match("messages_fts", "tool_calls:call_1") == [2]
        assert match("messages_fts_trigram", '"天気を"') == [4]
        assert match("messages_fts_cjk", '"東京"') == [4, 6]
    conn.close()


def test_rebuild_fts_on_an_upgraded_file_is_clean(v1_path: Path) -> None:
    with SessionDB(v1_path) as db:
        db.rebuild_fts()
        assert db.fts_status()["rebuild_high_water"] is None
        assert set(db.check_fts_integrity().values()) == {None}


@pytest.mark.parametrize(
    "damage",
    [
        "DROP TABLE messages_fts",  # its triggers stay behind, pointing at nothing
        "UPDATE messages_fts_data SET block = randomblob(length(block)) WHERE id > 1",
    ],
    ids=["legacy-index-gone", "legacy-index-damaged"],
)
def test_a_broken_legacy_index_does_not_block_the_upgrade(v1_path: Path, damage: str) -> None:
    with raw(v1_path) as conn:
        conn.execute(damage)
    conn.close()
    with SessionDB(v1_path) as db:
        db.rebuild_fts()
        assert set(db.check_fts_integrity().values()) == {None}
        assert not db.quarantined
        db.append_message("root", "user", "after the upgrade")
    assert rows(v1_path, f"SELECT {V1_MESSAGE_COLUMNS} FROM messages ORDER BY id")[:5] == (
        V1_MESSAGES
    )


# Version 10: titles existed but were not unique yet; messages had no uids.
V10_SQL = V1_SQL.replace(
    "    output_tokens INTEGER DEFAULT 0,\n    FOREIGN KEY",
    "    output_tokens INTEGER DEFAULT 0,\n    title TEXT,\n    FOREIGN KEY",
) + (
    "CREATE TABLE schema_version (version INTEGER NOT NULL);"
    "INSERT INTO schema_version VALUES (10);"
)

V10_TITLES = [
    ("a", 1.0, "Fix bug"),
    ("b", 2.0, "Fix bug"),
    ("c", 3.0, "Fix bug #2"),
    ("d", 4.0, "Fix bug"),
    ("e", 5.0, "Deploy #5"),
    ("f", 6.0, "Deploy #5"),
    ("g", 7.0, None),
    ("h", 8.0, None),
    ("i", 9.0, "日本語のタイトル"),
]


def test_duplicate_titles_are_renumbered_not_lost(db_path: Path) -> None:
    with raw(db_path) as conn:
        conn.executescript(V10_SQL)
        conn.executemany(
            "INSERT INTO sessions (id, source, started_at, title) VALUES (?, 'cli', ?, ?)",
            V10_TITLES,
        )
    conn.close()
    with SessionDB(db_path) as db:
        titles = {s: db.get_session_title(s) for s, _, _ in V10_TITLES}
        assert titles == {
            "a": "Fix bug", "b": "Fix bug #3", "c": "Fix bug #2", "d": "Fix bug #4",
            "e": "Deploy #5", "f": "Deploy #6", "g": None, "h": None, "i": "日本語のタイトル",
        }
        assert db.resolve_session_by_title("Fix bug") == "d"
        with pytest.raises(ValueError):
            db.set_session_title("g", "Fix bug #3")


# --- up-to-date and newer files --------------------------------------------------------------


def test_opening_an_up_to_date_store_writes_nothing(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli", title="x")
        db.append_message("s", "user", "hello")
    watcher = raw(db_path)
    try:
        state = "SELECT * FROM pragma_data_version, pragma_schema_version"
        before = watcher.execute(state).fetchone()
        digest = file_digest(db_path)
        with SessionDB(db_path) as db:
            assert db.get_session("s")["title"] == "x"
        # data_version moves when another connection commits; schema_version on any DDL.
        assert watcher.execute(state).fetchone() == before
        assert file_digest(db_path) == digest
        wal = db_path.with_name("state.db-wal")
        assert not wal.exists() or wal.stat().st_size == 0
    finally:
        watcher.close()


def build_newer(path: Path, journal_mode: str) -> None:
    with raw(path) as conn:
        conn.execute(f"PRAGMA journal_mode = {journal_mode}")
        conn.executescript(
            "CREATE TABLE schema_version (version INTEGER NOT NULL);"
            "INSERT INTO schema_version VALUES (99);"
            "CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT, started_at REAL,"
            " shiny_new_column TEXT);"
            "INSERT INTO sessions VALUES ('future', 'cli', 1.0, 'x');"
        )
    conn.close()


@pytest.mark.parametrize("journal_mode", ["delete", "wal"])
def test_newer_store_is_refused_and_left_byte_for_byte(db_path: Path, journal_mode: str) -> None:
    build_newer(db_path, journal_mode)
    before = sorted(p.name for p in db_path.parent.iterdir())
    digest = file_digest(db_path)
    for read_only in (False, True):
        with pytest.raises(StateDbUnavailableError) as info:
            SessionDB(db_path, read_only=read_only)
        assert info.value.reason == "incompatible"
        assert info.value.schema_version == 99
        assert info.value.http_status == 503
    assert file_digest(db_path) == digest
    # WAL readers may leave an empty -wal and the -shm behind; nothing else may appear.
    after = {p.name: p for p in db_path.parent.iterdir()}
    assert set(after) - set(before) <= {"state.db-wal", "state.db-shm"}
    assert "state.db-wal" not in after or after["state.db-wal"].stat().st_size == 0
    if journal_mode == "delete":
        assert set(after) == set(before)
    assert rows(db_path, "SELECT version FROM schema_version") == [(99,)]


# --- several processes upgrading one file ----------------------------------------------------

# Opens argv[1] once the clock reaches argv[3], recording in argv[2] every migration step this
# process actually applied.
MIGRATE_SCRIPT = """
import json, os, sys, time
import hermes_state_schema as schema
from hermes_state import SessionDB

def record(tag):
    fd = os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, f"{os.getpid()} {tag}\\n".encode())
    os.close(fd)

def wrap(step):
    def apply(conn):
        step.apply(conn)
        record(step.version)
    return schema.Migration(step.version, step.description, apply)

schema.MIGRATIONS = tuple(wrap(m) for m in schema.MIGRATIONS)
time.sleep(max(0.0, float(sys.argv[3]) - time.time()))
with SessionDB(sys.argv[1]) as db:
    print(json.dumps({"messages": db.message_count(), "sessions": db.session_count()}))
"""


def test_two_processes_upgrading_at_once_migrate_once(
    v1_path: Path, tmp_path: Path, spawn_python
) -> None:
    log = tmp_path / "migrations.log"
    start = f"{time.time() + 0.6:.3f}"
    procs = [spawn_python(MIGRATE_SCRIPT, str(v1_path), str(log), start) for _ in range(2)]
    outputs = [p.communicate(timeout=60) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
        assert json.loads(out) == {"messages": len(V1_MESSAGES), "sessions": len(V1_SESSIONS)}
    applied = [line.split()[1] for line in log.read_text().splitlines()]
    assert sorted(applied) == sorted(str(m.version) for m in hermes_state_schema.MIGRATIONS)
    assert rows(v1_path, f"SELECT {V1_MESSAGE_COLUMNS} FROM messages ORDER BY id") == V1_MESSAGES
    with SessionDB(v1_path) as db:
        db.rebuild_fts()
        assert set(db.check_fts_integrity().values()) == {None}
        uids = [m["message_uid"] for s in ("root", "child") for m in db.get_messages(s)]
        assert len(set(uids)) == len(V1_MESSAGES)


# --- a current-version file written before columns were declared ------------------------------

# The columns and index the previous store's callers rely on, declared after version 31 first
# shipped: a version-31 file written before then lacks them.
CALLER_COLUMNS = {
    "handoff_platform": None,
    "handoff_error": None,
    "compression_failure_cooldown_until": None,
    "compression_failure_error": None,
    "compression_fallback_streak": 0,
}


def strip_caller_columns(path: Path) -> None:
    """Make ``path`` the version-31 file it was before the caller columns were declared."""
    with raw(path) as conn:
        conn.execute("DROP INDEX idx_sessions_handoff_state")
        for name in CALLER_COLUMNS:
            conn.execute(f"ALTER TABLE sessions DROP COLUMN {name}")
    conn.close()


def test_every_full_session_row_carries_the_callers_columns(db: SessionDB) -> None:
    db.create_session("s", "cli")
    row = db.get_session("s")
    assert {name: row[name] for name in CALLER_COLUMNS} == CALLER_COLUMNS
    assert set(CALLER_COLUMNS) <= set(db.list_sessions_rich()[0])
    # This library's own handoff and compression-failure columns stay beside them.
    assert {"handoff_target", "handoff_at", "compression_failure_count",
            "last_compression_error", "last_compression_failed_at"} <= set(row)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_version_31_file_without_them_gains_them_in_place(db_path: Path, seed: int) -> None:
    with SessionDB(db_path) as db:
        for n in range(seed * 4):
            db.create_session(f"s{n}", "cli", title=f"title {n}", handoff_state="pending",
                              handoff_target="telegram", compression_failure_count=n)
            db.append_message(f"s{n}", "user", f"message {n} 東京")
        uids = [m["message_uid"] for n in range(seed * 4) for m in db.get_messages(f"s{n}")]
    strip_caller_columns(db_path)
    before = rows(db_path, "SELECT * FROM sessions ORDER BY id")
    messages_before = rows(db_path, "SELECT * FROM messages ORDER BY id")
    with SessionDB(db_path) as db:
        row = db.get_session("s0")
        assert {name: row[name] for name in CALLER_COLUMNS} == CALLER_COLUMNS
        assert (row["handoff_state"], row["handoff_target"], row["compression_failure_count"]) == (
            "pending", "telegram", 0)
        assert [m["message_uid"] for n in range(seed * 4)
                for m in db.get_messages(f"s{n}")] == uids
    width = len(before[0])
    assert [r[:width] for r in rows(db_path, "SELECT * FROM sessions ORDER BY id")] == before
    assert rows(db_path, "SELECT * FROM messages ORDER BY id") == messages_before
    assert rows(db_path, "SELECT version FROM schema_version") == [(31,)]
    with raw(db_path) as conn:
        assert set(CALLER_COLUMNS) <= set(columns(conn, "sessions"))
        assert "idx_sessions_handoff_state" in names(conn, "index")
    conn.close()


def test_the_completed_file_then_opens_without_writing(db_path: Path) -> None:
    SessionDB(db_path).close()
    strip_caller_columns(db_path)
    SessionDB(db_path).close()
    digest = file_digest(db_path)
    with SessionDB(db_path) as db:
        assert db.get_session("none") is None
    assert file_digest(db_path) == digest


OPEN_SCRIPT = """
import sys, time
from hermes_state import SessionDB
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
with SessionDB(sys.argv[1]) as db:
    print(db.get_session("s0")["compression_fallback_streak"])
"""


@pytest.mark.slow
def test_processes_completing_one_file_at_once_all_succeed(db_path: Path, spawn_python) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s0", "cli")
    strip_caller_columns(db_path)
    start = f"{time.time() + 0.8:.3f}"
    procs = [spawn_python(OPEN_SCRIPT, str(db_path), start) for _ in range(3)]
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert out.strip() == "0"


@pytest.mark.parametrize("shadows_too", [True, False])
@pytest.mark.parametrize("removed", ["messages_fts", "messages_fts_trigram", "messages_fts_cjk"])
def test_an_index_removed_from_the_schema_comes_back_rebuilt(
    db_path: Path, removed: str, shadows_too: bool
) -> None:
    """The schema rows of an FTS index deleted (as a repair does when DROP cannot walk a
    damaged b-tree), its shadow tables' too or not: the next writable open creates it again
    and rebuilds every index."""
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        for n in range(30):
            db.append_message("s", "user", f"deploy the gateway {n} 東京の天気")
        before = db.get_messages("s")
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("PRAGMA writable_schema = ON")
    raw.execute("BEGIN IMMEDIATE")
    version = raw.execute("PRAGMA schema_version").fetchone()[0]
    shadows = removed + "\\_%" if shadows_too else removed
    raw.execute("DELETE FROM sqlite_master WHERE name = ? OR name LIKE ? ESCAPE '\\'",
                (removed, shadows))
    raw.execute(f"PRAGMA schema_version = {version + 1}")
    raw.execute("COMMIT")
    raw.close()
    with SessionDB(db_path) as db:
        db.rebuild_fts()
        assert all(v is None for v in db.check_fts_integrity().values())
        assert db.get_messages("s") == before
        hits = db.search_messages("gateway", limit=50)
        assert len(hits) == 30 and all(h.get("match") != "substring" for h in hits)
        assert len(db.search_messages("東京", limit=50)) == 30


# --- processes creating one new store together -------------------------------------------------


def test_a_version_table_created_while_the_version_is_read_is_read(tmp_path: Path) -> None:
    """Processes opening one new file together: another one can commit the version table
    between the read that found no such table and the look that tells a missing table from a
    broken one. The version it committed is read (it was the error "no such table")."""
    path = tmp_path / "new.db"
    creator = sqlite3.connect(path, isolation_level=None)
    reader = sqlite3.connect(path, isolation_level=None)

    def create_at_the_next_statement(_sql: str) -> None:
        reader.set_trace_callback(None)
        creator.executescript(
            "BEGIN; CREATE TABLE schema_version (version INTEGER NOT NULL);"
            f" INSERT INTO schema_version VALUES ({SCHEMA_VERSION}); COMMIT;")

    reader.set_trace_callback(create_at_the_next_statement)
    try:
        assert hermes_state_schema.read_version(reader) == SCHEMA_VERSION
    finally:
        reader.close()
        creator.close()


# Creates a session in a new store argv[1] once the clock reaches argv[2].
FIRST_OPEN_SCRIPT = """
import os, sys, time
from hermes_state import SessionDB
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
with SessionDB(sys.argv[1]) as db:
    db.create_session(f"s{os.getpid()}", "cli")
"""


@pytest.mark.slow
def test_processes_opening_one_new_store_together_all_succeed(
    tmp_path: Path, spawn_python
) -> None:
    for attempt in range(4):
        path = tmp_path / f"new-{attempt}.db"
        start = f"{time.time() + 0.8:.3f}"
        procs = [spawn_python(FIRST_OPEN_SCRIPT, str(path), start) for _ in range(6)]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
        with SessionDB(path) as db:
            assert db.session_count() == len(procs)
