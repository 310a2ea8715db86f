"""Repair, backup and restore: checked snapshots, promotion only after the checks pass,
never while another process holds the database."""

from __future__ import annotations

import re
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hermes_state import (
    SessionDB,
    StateDbCorruptError,
    StateDbInUseError,
    backup_state_db,
    repair_state_db,
    restore_state_db,
)
from hermes_state_maintenance import list_snapshots
from state_helpers import (
    add_ledgers_and_outbox,
    btree_pages,
    overwrite_pages,
    populate,
    process_holding,
    sha256,
)


@pytest.fixture
def store(db_path: Path) -> list[str]:
    with SessionDB(db_path) as db:
        ids = populate(db)
    add_ledgers_and_outbox(db_path, ids[0])
    return ids


def raw(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def make_stale(path: Path) -> None:
    """What the run-time detach leaves behind, done by hand: marker set, triggers gone."""
    raw(
        path,
        "INSERT INTO state_meta (key, value) VALUES ('fts_stale', '{\"reason\": \"corrupt\"}')",
        "DROP TRIGGER messages_fts_insert",
        "DROP TRIGGER messages_fts_update",
        "DROP TRIGGER messages_fts_delete",
    )


def search_hits(path: Path, term: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH ?", (term,)
        ).fetchone()[0]
    finally:
        conn.close()


def test_check_only_on_a_healthy_store_reports_health_and_changes_nothing(
    store: list[str], db_path: Path
) -> None:
    before = sha256(db_path)
    report = repair_state_db(db_path, check_only=True)
    assert report["healthy"] and report["problems"] == []
    assert report["integrity"] == ["ok"]
    assert set(report["fts_integrity"]) == {"messages_fts", "messages_fts_trigram",
                                            "messages_fts_cjk"}
    assert report["triggers"]["missing"] == []
    assert report["row_counts"]["messages"] > 0 and report["row_counts"]["sessions"] == 3
    assert sha256(db_path) == before


def test_check_only_names_a_detached_index(store: list[str], db_path: Path) -> None:
    make_stale(db_path)
    before = sha256(db_path)
    report = repair_state_db(db_path, check_only=True)
    assert not report["healthy"]
    assert report["fts_stale"] is not None
    assert set(report["triggers"]["missing"]) == {
        "messages_fts_insert", "messages_fts_update", "messages_fts_delete"
    }
    assert any("fts_stale" in p for p in report["problems"])
    assert sha256(db_path) == before


def test_check_only_sees_damage_inside_an_fts_index(store: list[str], db_path: Path) -> None:
    raw(db_path, "DELETE FROM messages_fts_data WHERE id > 1")
    report = repair_state_db(db_path, check_only=True)
    assert report["fts_integrity"]["messages_fts"] is not None
    assert not report["healthy"]


def test_repair_restores_triggers_and_clears_the_marker_without_losing_rows(
    store: list[str], db_path: Path, hermes_home: Path
) -> None:
    make_stale(db_path)
    with SessionDB(db_path, rebuild_fts=False) as db:
        db.append_message(store[0], "user", "written while detached: zebra")
        counts = repair_state_db(db_path, check_only=True)["row_counts"]
    assert search_hits(db_path, "zebra") == 0

    report = repair_state_db(db_path)
    assert report["promoted"] and report["repaired"]
    assert report["after"]["healthy"] and report["after"]["row_counts"] == counts
    assert report["live_quick_check"] == ["ok"]
    backup = Path(report["backup"])
    assert backup.parent == hermes_home / "state-snapshots"
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600

    after = repair_state_db(db_path, check_only=True)
    assert after["healthy"] and after["row_counts"] == counts and after["fts_stale"] is None
    assert search_hits(db_path, "zebra") == 1
    conn = sqlite3.connect(db_path)
    try:  # the seed's post-repair checks, verbatim
        marker = "SELECT key, value FROM state_meta WHERE key = 'fts_stale'"
        assert conn.execute(marker).fetchall() == []
        assert [r[1] for r in conn.execute(
            "SELECT type, name FROM sqlite_master WHERE name IN"
            " ('messages_fts_insert','messages_fts_update','messages_fts_delete') ORDER BY name"
        )] == ["messages_fts_delete", "messages_fts_insert", "messages_fts_update"]
    finally:
        conn.close()
    # No separate file copies of the live image anywhere: the live files, the lock files of
    # maintenance and of writers' turns, and one self-contained snapshot (the working copy is
    # gone).
    assert {p.name for p in db_path.parent.iterdir()} <= {
        "state.db", "state.db-wal", "state.db-shm", "state.db.lock", "state.db.writers",
        "state-snapshots",
    }
    assert list(backup.parent.iterdir()) == [backup]


def test_repair_rebuilds_an_fts_index_whose_pages_are_destroyed(
    store: list[str], db_path: Path
) -> None:
    counts = repair_state_db(db_path, check_only=True)["row_counts"]
    overwrite_pages(db_path, btree_pages(db_path, "messages_fts_data")["leaf"][:1])
    assert not repair_state_db(db_path, check_only=True)["healthy"]
    report = repair_state_db(db_path)
    assert report["promoted"], report.get("error")
    after = repair_state_db(db_path, check_only=True)
    assert after["healthy"] and after["row_counts"] == counts
    assert search_hits(db_path, "docker") == 3 * 6


def test_repair_of_a_healthy_store_does_nothing(store: list[str], db_path: Path) -> None:
    before = sha256(db_path)
    report = repair_state_db(db_path)
    assert report["repaired"] is False and report["promoted"] is False
    assert sha256(db_path) == before


def test_repair_is_refused_while_another_process_holds_the_database(
    store: list[str], db_path: Path
) -> None:
    make_stale(db_path)
    before = sha256(db_path)
    with process_holding(db_path) as proc:
        with pytest.raises(StateDbInUseError) as info:
            repair_state_db(db_path)
        assert any(f"PID {proc.pid}" in h for h in info.value.holders)
        with pytest.raises(StateDbInUseError):
            restore_state_db(backup_state_db(db_path), db_path)
    assert sha256(db_path) == before


def test_a_failed_repair_keeps_the_live_file_and_leaves_no_snapshot(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        for n in range(8):
            db.create_session(f"s{n}", "cli")
            db.replace_messages(f"s{n}", [{"role": "user", "content": "y" * 700}] * 60)
    make_stale(db_path)
    leaves = btree_pages(db_path, "messages")["leaf"]
    overwrite_pages(db_path, leaves[len(leaves) // 2 : len(leaves) // 2 + 1])
    before = sha256(db_path)
    report = repair_state_db(db_path)
    assert report["promoted"] is False and report["error"]
    assert report["kept"] == [str(db_path)] and report["backup"] is None
    assert list_snapshots(db_path) == []
    assert sha256(db_path) == before


WRITER = textwrap.dedent(
    """
    import sys, time
    from hermes_state import SessionDB
    with SessionDB(sys.argv[1]) as db:
        db.create_session("load", "cli")
        print("ready", flush=True)
        n, stop = 0, time.monotonic() + float(sys.argv[2])
        while time.monotonic() < stop:
            db.append_message("load", "user", f"message {n} " + "x" * 200)
            n += 1
    print(n, flush=True)
    """
)


def test_backup_under_a_writers_load_completes_and_passes_quick_check(
    db_path: Path, tmp_path: Path
) -> None:
    SessionDB(db_path).close()
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db_path), "2.5"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        snapshots = []
        for _ in range(3):
            time.sleep(0.4)
            snapshots.append(backup_state_db(db_path))
        written = int(writer.stdout.readline())
    finally:
        writer.wait(timeout=30)
    assert writer.returncode == 0 and written > 0
    seen = []
    for snap in snapshots:
        assert re.fullmatch(r"state-\d{8}T\d{6}Z(-\d+)?\.db", snap.name)
        assert not Path(str(snap) + "-wal").exists()  # self-contained
        conn = sqlite3.connect(snap)
        try:
            assert conn.execute("PRAGMA quick_check").fetchall() == [("ok",)]
            seen.append(conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0])
        finally:
            conn.close()
    assert seen == sorted(seen) and seen[-1] <= written


def test_restore_brings_back_every_table_including_the_ledgers(
    store: list[str], db_path: Path, tmp_path: Path
) -> None:
    snapshot = backup_state_db(db_path, tmp_path / "snap.db")
    expected = repair_state_db(snapshot, check_only=True)["row_counts"]
    raw(db_path, "DELETE FROM worker_receipts", "DELETE FROM worker_executions",
        "DELETE FROM session_admissions", "DELETE FROM runtime_epoch", "DELETE FROM messages")
    report = restore_state_db(snapshot, db_path)
    assert report["quick_check"] == ["ok"]
    assert report["row_counts"] == expected
    assert report["row_counts"]["worker_receipts"] == 1
    assert Path(report["previous_snapshot"]).exists()
    with SessionDB(db_path) as db:  # a normal writable open works on the restored file
        assert db.get_session(store[0]) is not None
        db.append_message(store[0], "user", "after restore")


def test_restore_refuses_a_damaged_snapshot(
    store: list[str], db_path: Path, tmp_path: Path
) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"x" * 8192)
    before = sha256(db_path)
    with pytest.raises(StateDbCorruptError):
        restore_state_db(junk, db_path)
    assert sha256(db_path) == before
