"""Telegram DM topic mode through the public API: tables created on demand only, readers that
never create them, bindings one topic per session, the cascade, and the rebuild of an older
bindings table."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_state import (
    InvalidInputError,
    SessionDB,
    SessionNotFoundError,
    StateDbClosedError,
    TopicAlreadyLinkedError,
)

TOPIC_TABLES = {"telegram_dm_topic_mode", "telegram_dm_topic_bindings"}
BINDING_KEYS = {"chat_id", "thread_id", "user_id", "session_key", "session_id", "managed_mode",
                "linked_at", "updated_at"}


def tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()


def raw_rows(path: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def bind(db: SessionDB, session_id: str, chat: object = "c1", thread: object = "t1",
         **extra: object) -> None:
    db.bind_telegram_topic(chat_id=chat, thread_id=thread, user_id="u1",
                           session_key=f"tg:{chat}:{thread}", session_id=session_id, **extra)


# --- never created at open, never by a reader ------------------------------------------------


def test_readers_of_a_store_without_topic_tables_see_nothing_and_create_nothing(
    db: SessionDB,
) -> None:
    db.create_session("s1", "telegram", user_id="u1")
    watcher = sqlite3.connect(db.path)
    try:
        version = watcher.execute("PRAGMA data_version").fetchone()
        assert db.is_telegram_topic_mode_enabled(chat_id="c1", user_id="u1") is False
        assert db.get_telegram_topic_binding(chat_id="c1", thread_id="t1") is None
        assert db.get_telegram_topic_binding_by_session(session_id="s1") is None
        assert db.list_telegram_topic_bindings_for_chat(chat_id="c1") == []
        assert db.is_telegram_session_linked_to_topic(session_id="s1") is False
        assert db.delete_telegram_topic_binding(chat_id="c1", thread_id="t1") == 0
        db.disable_telegram_topic_mode(chat_id="c1")
        assert [r["id"] for r in db.list_unlinked_telegram_sessions_for_user(
            chat_id="c1", user_id="u1")] == ["s1"]
        assert watcher.execute("PRAGMA data_version").fetchone() == version
    finally:
        watcher.close()
    assert not TOPIC_TABLES & tables(db.path)


def test_opening_a_store_never_creates_the_topic_tables(db_path: Path) -> None:
    for _ in range(2):
        SessionDB(db_path).close()
    assert not TOPIC_TABLES & tables(db_path)


def test_the_migration_creates_both_tables_once_and_records_version_2(db: SessionDB) -> None:
    db.apply_telegram_topic_migration()
    assert TOPIC_TABLES <= tables(db.path)
    assert db.get_meta("telegram_dm_topic_schema_version") == "2"
    indexes = {r[0] for r in raw_rows(
        db.path, "SELECT name FROM sqlite_master WHERE type = 'index'"
        " AND tbl_name = 'telegram_dm_topic_bindings' AND sql NOT NULL")}
    assert indexes == {"idx_telegram_dm_topic_bindings_session",
                       "idx_telegram_dm_topic_bindings_user"}
    watcher = sqlite3.connect(db.path)
    try:
        version = watcher.execute("PRAGMA data_version").fetchone()
        db.apply_telegram_topic_migration()
        assert watcher.execute("PRAGMA data_version").fetchone() == version  # wrote nothing
    finally:
        watcher.close()


# --- topic mode ------------------------------------------------------------------------------


def test_enable_creates_the_tables_and_the_mode_row(db: SessionDB) -> None:
    before = time.time()
    db.enable_telegram_topic_mode(chat_id=100, user_id=7, has_topics_enabled=True,
                                  allows_users_to_create_topics=False)
    (row,) = raw_rows(db.path, "SELECT chat_id, user_id, enabled, activated_at, updated_at,"
                      " has_topics_enabled, allows_users_to_create_topics, capability_checked_at"
                      " FROM telegram_dm_topic_mode")
    assert row[:3] == ("100", "7", 1)
    assert before <= row[3] == row[4] == row[7] <= time.time()
    assert row[5:7] == (1, 0)
    assert db.is_telegram_topic_mode_enabled(chat_id="100", user_id="7")
    assert db.is_telegram_topic_mode_enabled(chat_id=100, user_id=7)


def test_re_enable_keeps_activation_and_overwrites_the_rest(db: SessionDB) -> None:
    db.enable_telegram_topic_mode(chat_id="c1", user_id="u1", has_topics_enabled=True)
    ((activated,),) = raw_rows(db.path, "SELECT activated_at FROM telegram_dm_topic_mode")
    db.disable_telegram_topic_mode(chat_id="c1")
    assert not db.is_telegram_topic_mode_enabled(chat_id="c1", user_id="u1")
    time.sleep(0.01)
    db.enable_telegram_topic_mode(chat_id="c1", user_id="u2", allows_users_to_create_topics=True)
    (row,) = raw_rows(db.path, "SELECT user_id, enabled, activated_at, updated_at,"
                      " has_topics_enabled, allows_users_to_create_topics"
                      " FROM telegram_dm_topic_mode")
    assert row[0:3] == ("u2", 1, activated)
    assert row[3] > activated
    assert row[4:] == (None, 1)


def test_mode_is_enabled_only_for_its_own_user(db: SessionDB) -> None:
    db.enable_telegram_topic_mode(chat_id="c1", user_id="u1")
    assert db.is_telegram_topic_mode_enabled(chat_id="c1", user_id="u1")
    assert not db.is_telegram_topic_mode_enabled(chat_id="c1", user_id="u2")
    assert not db.is_telegram_topic_mode_enabled(chat_id="c2", user_id="u1")


def test_disable_clears_the_chats_bindings_unless_asked_not_to(db: SessionDB) -> None:
    for sid in ("s1", "s2", "s3"):
        db.create_session(sid, "telegram")
    db.enable_telegram_topic_mode(chat_id="c1", user_id="u1")
    bind(db, "s1", thread="t1")
    bind(db, "s2", thread="t2")
    bind(db, "s3", chat="c2")
    db.disable_telegram_topic_mode(chat_id="c1", clear_bindings=False)
    assert len(db.list_telegram_topic_bindings_for_chat(chat_id="c1")) == 2
    db.disable_telegram_topic_mode(chat_id="c1")
    assert db.list_telegram_topic_bindings_for_chat(chat_id="c1") == []
    assert db.get_telegram_topic_binding(chat_id="c2", thread_id="t1")["session_id"] == "s3"


@pytest.mark.parametrize("flag", ["yes", 1.5, object()])
def test_a_capability_flag_must_be_a_bool_or_none(db: SessionDB, flag: object) -> None:
    with pytest.raises(InvalidInputError):
        db.enable_telegram_topic_mode(chat_id="c1", user_id="u1", has_topics_enabled=flag)
    assert not TOPIC_TABLES & tables(db.path)


# --- bindings --------------------------------------------------------------------------------


def test_a_binding_reads_back_with_exactly_its_columns(db: SessionDB) -> None:
    db.create_session("s1", "telegram")
    before = time.time()
    db.bind_telegram_topic(chat_id=42, thread_id=17, user_id=9, session_key="tg:42:17",
                           session_id="s1", managed_mode="restored")
    binding = db.get_telegram_topic_binding(chat_id="42", thread_id="17")
    assert set(binding) == BINDING_KEYS
    assert {k: binding[k] for k in BINDING_KEYS - {"linked_at", "updated_at"}} == {
        "chat_id": "42", "thread_id": "17", "user_id": "9", "session_key": "tg:42:17",
        "session_id": "s1", "managed_mode": "restored"}
    assert before <= binding["linked_at"] == binding["updated_at"] <= time.time()
    assert db.get_telegram_topic_binding_by_session(session_id="s1") == binding
    assert db.is_telegram_session_linked_to_topic(session_id="s1")
    assert db.get_telegram_topic_binding(chat_id="42", thread_id="18") is None


def test_binding_the_same_pair_again_refreshes_it_and_keeps_linked_at(db: SessionDB) -> None:
    db.create_session("s1", "telegram")
    bind(db, "s1")
    first = db.get_telegram_topic_binding(chat_id="c1", thread_id="t1")
    time.sleep(0.01)
    db.bind_telegram_topic(chat_id="c1", thread_id="t1", user_id="u9", session_key="k2",
                           session_id="s1", managed_mode="new_replaced")
    again = db.get_telegram_topic_binding(chat_id="c1", thread_id="t1")
    assert again["linked_at"] == first["linked_at"] < again["updated_at"]
    assert (again["user_id"], again["session_key"], again["managed_mode"]) == (
        "u9", "k2", "new_replaced")


def test_a_topic_can_be_pointed_at_another_session(db: SessionDB) -> None:
    db.create_session("s1", "telegram")
    db.create_session("s2", "telegram")
    bind(db, "s1")
    bind(db, "s2")
    assert db.get_telegram_topic_binding(chat_id="c1", thread_id="t1")["session_id"] == "s2"
    assert not db.is_telegram_session_linked_to_topic(session_id="s1")


def test_a_session_bound_elsewhere_is_refused_and_nothing_changes(db: SessionDB) -> None:
    db.create_session("s1", "telegram")
    bind(db, "s1", thread="t1")
    before = db.list_telegram_topic_bindings_for_chat(chat_id="c1")
    with pytest.raises(TopicAlreadyLinkedError) as info:
        bind(db, "s1", thread="t2")
    assert isinstance(info.value, ValueError)
    assert "already linked" in str(info.value)
    assert (info.value.session_id, info.value.chat_id, info.value.thread_id) == ("s1", "c1", "t1")
    assert db.list_telegram_topic_bindings_for_chat(chat_id="c1") == before


def test_binding_a_missing_session_is_refused_before_anything_is_written(db: SessionDB) -> None:
    with pytest.raises(SessionNotFoundError):
        bind(db, "ghost")
    assert not TOPIC_TABLES & tables(db.path)
    db.create_session("s1", "telegram")
    bind(db, "s1")
    with pytest.raises(SessionNotFoundError):
        bind(db, "ghost", thread="t2")
    assert [b["session_id"] for b in db.list_telegram_topic_bindings_for_chat(chat_id="c1")] == [
        "s1"]


@pytest.mark.parametrize("field", ["chat_id", "thread_id", "user_id", "session_key",
                                   "session_id", "managed_mode"])
def test_a_none_id_is_refused_rather_than_stored_as_text(db: SessionDB, field: str) -> None:
    db.create_session("s1", "telegram")
    args = {"chat_id": "c1", "thread_id": "t1", "user_id": "u1", "session_key": "k",
            "session_id": "s1", "managed_mode": "auto", field: None}
    with pytest.raises(InvalidInputError):
        db.bind_telegram_topic(**args)
    assert not TOPIC_TABLES & tables(db.path)


def test_bindings_of_a_chat_are_listed_most_recently_updated_first(db: SessionDB) -> None:
    for n in range(3):
        db.create_session(f"s{n}", "telegram")
        bind(db, f"s{n}", thread=f"t{n}")
        time.sleep(0.005)
    bind(db, "s0", thread="t0")  # refreshed last
    listed = db.list_telegram_topic_bindings_for_chat(chat_id="c1")
    assert [b["thread_id"] for b in listed] == ["t0", "t2", "t1"]
    assert all(set(b) == BINDING_KEYS for b in listed)


def test_deleting_the_last_binding_switches_topic_mode_off(db: SessionDB) -> None:
    for sid in ("s1", "s2"):
        db.create_session(sid, "telegram")
    db.enable_telegram_topic_mode(chat_id="c1", user_id="u1")
    bind(db, "s1", thread="t1")
    bind(db, "s2", thread="t2")
    assert db.delete_telegram_topic_binding(chat_id="c1", thread_id="t1") == 1
    assert db.is_telegram_topic_mode_enabled(chat_id="c1", user_id="u1")
    assert db.delete_telegram_topic_binding(chat_id="c1", thread_id="t1") == 0
    assert db.delete_telegram_topic_binding(chat_id="c1", thread_id="t2") == 1
    assert not db.is_telegram_topic_mode_enabled(chat_id="c1", user_id="u1")


@pytest.mark.parametrize("remove", ["delete_session", "prune_sessions"])
def test_a_removed_session_takes_its_binding_with_it(db: SessionDB, remove: str) -> None:
    db.create_session("old", "telegram", started_at=1.0)
    db.create_session("keep", "telegram")
    db.end_session("old", "user_exit")
    bind(db, "old", thread="t1")
    bind(db, "keep", thread="t2")
    if remove == "delete_session":
        assert db.delete_session("old")
    else:
        assert db.prune_sessions(older_than_days=1) == 1
    assert db.get_telegram_topic_binding(chat_id="c1", thread_id="t1") is None
    assert db.get_telegram_topic_binding(chat_id="c1", thread_id="t2")["session_id"] == "keep"


ids = st.one_of(st.text(min_size=0, max_size=40), st.integers(-(2**62), 2**62))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(chat=ids, thread=ids, user=ids)
def test_ids_of_any_text_or_number_round_trip_as_their_str(
    db: SessionDB, chat: object, thread: object, user: object
) -> None:
    db.create_session("s1", "telegram")
    db.bind_telegram_topic(chat_id=chat, thread_id=thread, user_id=user, session_key="k",
                           session_id="s1")
    db.enable_telegram_topic_mode(chat_id=chat, user_id=user)
    binding = db.get_telegram_topic_binding(chat_id=str(chat), thread_id=str(thread))
    assert (binding["chat_id"], binding["thread_id"], binding["user_id"]) == (
        str(chat), str(thread), str(user))
    assert db.get_telegram_topic_binding(chat_id=chat, thread_id=thread) == binding
    assert db.is_telegram_topic_mode_enabled(chat_id=str(chat), user_id=user)
    assert db.delete_telegram_topic_binding(chat_id=chat, thread_id=thread) == 1
    assert not db.is_telegram_topic_mode_enabled(chat_id=chat, user_id=user)


def test_a_lone_surrogate_id_finds_nothing_and_cannot_be_written(db: SessionDB) -> None:
    db.create_session("s1", "telegram")
    bind(db, "s1")
    assert db.get_telegram_topic_binding(chat_id="c1\ud800", thread_id="t1") is None
    assert db.delete_telegram_topic_binding(chat_id="c1\ud800", thread_id="t1") == 0
    with pytest.raises(InvalidInputError):
        bind(db, "s1", chat="c1\ud800")


def test_a_closed_handle_raises_instead_of_answering(db_path: Path) -> None:
    db = SessionDB(db_path)
    db.close()
    with pytest.raises(StateDbClosedError):
        db.get_telegram_topic_binding(chat_id="c1", thread_id="t1")
    with pytest.raises(StateDbClosedError):
        db.enable_telegram_topic_mode(chat_id="c1", user_id="u1")


# --- sessions no topic is bound to -----------------------------------------------------------


def test_unlinked_sessions_are_the_users_telegram_sessions_without_a_binding(
    db: SessionDB,
) -> None:
    db.create_session("bound", "telegram", user_id="u1", started_at=10.0)
    db.create_session("old", "telegram", user_id="u1", started_at=20.0)
    db.create_session("new", "telegram", user_id="u1", started_at=30.0)
    db.create_session("talkative", "telegram", user_id="u1", started_at=5.0)
    db.create_session("other-user", "telegram", user_id="u2", started_at=40.0)
    db.create_session("cli", "cli", user_id="u1", started_at=50.0)
    db.append_message("talkative", "user", "  first line\r\nsecond line  ", timestamp=60.0)
    db.append_message("talkative", "user", "later", timestamp=61.0)
    bind(db, "bound")
    rows = db.list_unlinked_telegram_sessions_for_user(chat_id="any chat", user_id="u1")
    assert [r["id"] for r in rows] == ["talkative", "new", "old"]
    assert rows[0]["preview"] == "first line  second line"
    assert rows[0]["last_active"] == 61.0
    assert (rows[1]["preview"], rows[1]["last_active"]) == ("", 30.0)
    assert set(db.get_session("new")) <= set(rows[1])
    assert [r["id"] for r in db.list_unlinked_telegram_sessions_for_user(
        chat_id="c1", user_id="u1", limit=1)] == ["talkative"]
    assert db.list_unlinked_telegram_sessions_for_user(chat_id="c1", user_id="u1", limit=0) == []


def test_a_long_first_message_is_cut_to_60_characters_in_the_preview(db: SessionDB) -> None:
    db.create_session("s1", "telegram", user_id="u1")
    db.append_message("s1", "assistant", "not a user message", timestamp=1.0)
    db.append_message("s1", "user", "x" * 59 + "東京" + "y" * 10, timestamp=2.0)
    (row,) = db.list_unlinked_telegram_sessions_for_user(chat_id="c1", user_id="u1")
    assert row["preview"] == "x" * 59 + "東..."


# --- an older bindings table -----------------------------------------------------------------

# The first topic schema: the bindings' session key had no ON DELETE CASCADE.
V1_TOPIC_SQL = """
CREATE TABLE telegram_dm_topic_mode (
    chat_id TEXT PRIMARY KEY, user_id TEXT NOT NULL, enabled INTEGER NOT NULL DEFAULT 1,
    activated_at REAL NOT NULL, updated_at REAL NOT NULL, has_topics_enabled INTEGER,
    allows_users_to_create_topics INTEGER, capability_checked_at REAL, intro_message_id TEXT,
    pinned_message_id TEXT
);
CREATE TABLE telegram_dm_topic_bindings (
    chat_id TEXT NOT NULL, thread_id TEXT NOT NULL, user_id TEXT NOT NULL,
    session_key TEXT NOT NULL, session_id TEXT NOT NULL REFERENCES sessions(id),
    managed_mode TEXT NOT NULL DEFAULT 'auto', linked_at REAL NOT NULL,
    updated_at REAL NOT NULL, PRIMARY KEY (chat_id, thread_id)
);
CREATE UNIQUE INDEX idx_telegram_dm_topic_bindings_session
    ON telegram_dm_topic_bindings(session_id);
INSERT INTO state_meta (key, value) VALUES ('telegram_dm_topic_schema_version', '1');
"""


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_older_bindings_table_is_rebuilt_with_the_cascade_and_keeps_its_rows(
    db_path: Path, seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    with SessionDB(db_path) as db:
        for n in range(seed * 3):
            db.create_session(f"s{n}", "telegram")
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.executescript(V1_TOPIC_SQL)
        rows = [("c1", f"t{n}", "u1", f"k{n}", f"s{n}", "auto", float(n), float(n) + 0.5)
                for n in range(seed * 3)]
        conn.executemany("INSERT INTO telegram_dm_topic_bindings VALUES (?,?,?,?,?,?,?,?)", rows)
        # A binding whose session is gone: the cascade would have removed it.
        conn.execute("INSERT INTO telegram_dm_topic_bindings VALUES"
                     " ('c1', 'orphan', 'u1', 'k', 'deleted-session', 'auto', 1, 1)")
    finally:
        conn.close()
    with SessionDB(db_path) as db, caplog.at_level(logging.WARNING, "hermes_state"):
        assert db.get_telegram_topic_binding(chat_id="c1", thread_id="t0")["session_id"] == "s0"
        db.apply_telegram_topic_migration()
        assert "1 Telegram topic binding(s) named deleted sessions" in caplog.text
        assert db.get_meta("telegram_dm_topic_schema_version") == "2"
        kept = raw_rows(db_path, "SELECT chat_id, thread_id, user_id, session_key, session_id,"
                        " managed_mode, linked_at, updated_at FROM telegram_dm_topic_bindings"
                        " ORDER BY linked_at")
        assert kept == rows
        fk = raw_rows(db_path, "SELECT on_delete FROM pragma_foreign_key_list("
                      "'telegram_dm_topic_bindings')")
        assert fk == [("CASCADE",)]
        db.delete_session("s0")
        assert db.get_telegram_topic_binding(chat_id="c1", thread_id="t0") is None
        with pytest.raises(TopicAlreadyLinkedError):
            bind(db, "s1", chat="c9")
    assert raw_rows(db_path, "PRAGMA foreign_key_check") == []
