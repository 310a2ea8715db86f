"""Read-only browsing: every read works, nothing is ever created, migrated, checkpointed or
repaired, and an unusable store is a typed 503."""

from __future__ import annotations

import io
import json
import sqlite3
import time
from pathlib import Path

import pytest

from hermes_state import (
    HermesStateError,
    SessionDB,
    StateDbUnavailableError,
    collect_profile_stats,
)
from state_helpers import detach_index_by_hand, file_hashes, populate, process_holding, sha256


def unavailable(path: Path) -> StateDbUnavailableError:
    with pytest.raises(StateDbUnavailableError) as info:
        SessionDB(path, read_only=True)
    assert info.value.http_status == 503
    return info.value


def test_a_missing_store_is_unavailable_and_nothing_is_created(tmp_path: Path) -> None:
    before = file_hashes(tmp_path)
    error = unavailable(tmp_path / "nowhere" / "state.db")
    assert error.reason == "uninitialized"
    assert not (tmp_path / "nowhere").exists()
    assert file_hashes(tmp_path) == before


def test_a_zero_byte_file_is_unavailable_and_left_alone(tmp_path: Path) -> None:
    empty = tmp_path / "profile" / "state.db"
    empty.parent.mkdir()
    empty.touch()
    assert unavailable(empty).reason == "uninitialized"
    assert sorted(p.name for p in empty.parent.iterdir()) == ["state.db"]
    assert empty.stat().st_size == 0


def test_a_database_without_tables_is_uninitialized(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    sqlite3.connect(path).execute("PRAGMA user_version = 7").connection.close()
    assert unavailable(path).reason == "uninitialized"


def test_an_old_schema_is_incompatible_and_not_touched(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, started_at REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
            role TEXT NOT NULL, content TEXT, timestamp REAL NOT NULL);
        INSERT INTO sessions VALUES ('s', 'cli', 1);
        """
    )
    conn.close()
    before = file_hashes(tmp_path)
    error = unavailable(path)
    assert error.reason == "incompatible" and error.schema_version == 1
    assert file_hashes(tmp_path) == before


def test_a_newer_schema_is_incompatible(db_path: Path) -> None:
    SessionDB(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    before = sha256(db_path)
    error = unavailable(db_path)
    assert error.reason == "incompatible" and error.schema_version == 99
    assert sha256(db_path) == before


def test_a_lock_held_past_the_read_budget_is_busy_after_about_five_seconds(
    db_path: Path,
) -> None:
    with SessionDB(db_path) as db:
        populate(db, sessions=1, messages=1)
    body = """
    conn.execute("PRAGMA locking_mode = EXCLUSIVE")
    conn.execute("BEGIN EXCLUSIVE")
    conn.execute("INSERT INTO state_meta (key, value) VALUES ('held', '1')")
    """
    with process_holding(db_path, body):
        start = time.monotonic()
        error = unavailable(db_path)
        waited = time.monotonic() - start
    assert error.reason == "busy"
    assert 4.0 <= waited < 8.0


def test_every_read_works_and_nothing_is_written(db_path: Path) -> None:
    with SessionDB(db_path) as writer:
        ids = populate(writer)
        writer.append_message(ids[0], "user", "still only in the WAL")
        # The writable handle stays open: its last writes are in the WAL, not the main file.
        main_before = sha256(db_path)
        with SessionDB(db_path, read_only=True) as db:
            assert [r["_lineage_root_id"] for r in db.list_sessions_rich()] == [ids[0]]
            assert db.get_session(ids[1])["title"] == "Title 1"
            assert db.get_messages(ids[0])[-1]["content"] == "still only in the WAL"
            assert db.get_messages_as_conversation(ids[2], include_ancestors=True)
            assert db.stats()["sessions"] == 3
            assert db.session_count() == 3 and db.message_count(ids[0]) > 0
            assert db.resolve_session_id("sess-1") == ids[1]
            assert db.get_session_by_title("Title 2")["id"] == ids[2]
            assert len(db.export_session_lineage(ids[1])["segments"]) == 3
            assert len(db.export_all()) == 3
            assert db.export_session(ids[0])["model_usage"]
            lines = list(db.iter_export_jsonl())
            assert json.loads(lines[-1]) == {"kind": "end", "sessions": 3,
                                             "messages": db.message_count() + 3}
            assert db.fts_status()["stale"] is None
            for write in (
                lambda: db.create_session("x", "cli"),
                lambda: db.append_message(ids[0], "user", "no"),
                lambda: db.import_jsonl(io.StringIO("".join(lines))),
                lambda: db.check_fts_integrity(),
            ):
                with pytest.raises(HermesStateError, match="read-only"):
                    write()
        assert sha256(db_path) == main_before  # no checkpoint, no write, on close either


def test_read_only_open_never_starts_an_index_rebuild(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        populate(db, sessions=1, messages=1)
    detach_index_by_hand(db_path)
    with SessionDB(db_path, read_only=True) as db:
        time.sleep(0.2)
        assert db.fts_status()["stale"] is not None
        assert db.fts_status()["missing_triggers"]


def make_profile(root: Path, name: str | None) -> Path:
    home = root if name is None else root / "profiles" / name
    home.mkdir(parents=True, exist_ok=True)
    return home / "state.db"


def test_profile_stats_report_a_failing_profile_and_return_the_others(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for name, sessions in ((None, 2), ("coder", 1)):
        with SessionDB(make_profile(root, name)) as db:
            populate(db, sessions=sessions, messages=1)
    make_profile(root, "broken").write_bytes(b"this is not a database at all" * 200)
    make_profile(root, "empty").touch()
    before = file_hashes(root)

    result = collect_profile_stats(root)
    assert {n: s["sessions"] for n, s in result["profiles"].items()} == {"default": 2, "coder": 1}
    errors = {e["profile"]: e for e in result["errors"]}
    assert set(errors) == {"broken", "empty"}
    assert errors["empty"]["reason"] == "uninitialized"
    # Reading created at most the WAL readers' sidecars; no database changed.
    after = file_hashes(root)
    assert {k: v for k, v in after.items() if k in before} == before
    assert all(k.endswith(("-wal", "-shm")) for k in set(after) - set(before))


def test_profile_stats_of_a_root_without_a_default_store_lists_it_as_an_error(
    tmp_path: Path,
) -> None:
    with SessionDB(make_profile(tmp_path, "only")) as db:
        populate(db, sessions=1, messages=1)
    result = collect_profile_stats(tmp_path)
    assert list(result["profiles"]) == ["only"]
    assert result["errors"] == [
        {"profile": "default", "error": result["errors"][0]["error"], "reason": "uninitialized"}
    ]
