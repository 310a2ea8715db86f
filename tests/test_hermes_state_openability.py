"""The previous store's module-level helpers: the last open error, the open probe and the
schema repair its doctor and ``sessions repair`` call — on real files, really damaged."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import hermes_state
import hermes_state_openability as openability
import hermes_state_quarantine as quarantine
from hermes_state import SessionDB
from state_helpers import overwrite_pages, process_holding
from conftest import RunPython, table_pages

CANONICAL = ("sessions", "messages")


def build_store(path: Path, seed: int, sessions: int = 6) -> None:
    rng = random.Random(seed)
    with SessionDB(path) as db:
        for s in range(sessions):
            db.create_session(f"s{s}", "cli", title=f"talk {s}")
            for n in range(rng.randint(20, 60)):
                db.append_message(f"s{s}", rng.choice(["user", "assistant"]),
                                  f"deploy the gateway {n} " + "lorem ipsum " * rng.randint(1, 40))


def rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in CANONICAL}
    finally:
        conn.close()


def raw_edit(path: Path, *statements: str, writable_schema: bool = False) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        if writable_schema:
            conn.execute("PRAGMA writable_schema = ON")
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def searches(path: Path) -> list[dict[str, Any]]:
    with SessionDB(path) as db:
        assert all(v is None for v in db.check_fts_integrity().values())
        return db.search_messages("gateway", limit=5)


# --- the last open error ------------------------------------------------------------------------

def test_without_an_open_error_the_message_is_the_prefix(run_python: RunPython) -> None:
    out = run_python(
        "import hermes_state as h\n"
        "print(repr(h.get_last_init_error()), h.format_session_db_unavailable(),"
        " h.format_session_db_unavailable('Sitzungsdatenbank fehlt'), sep='|')\n"
    )
    assert out.stdout.strip() == "None|Session database not available.|Sitzungsdatenbank fehlt."


def test_a_failed_open_is_recorded_and_a_later_good_open_keeps_it(
    tmp_path: Path, db_path: Path
) -> None:
    not_a_store = tmp_path / "random.db"
    not_a_store.write_bytes(random.Random(1).randbytes(8192))
    with pytest.raises(hermes_state.StateDbCorruptError) as caught:
        SessionDB(not_a_store)
    expected = f"StateDbCorruptError: {caught.value}"
    with SessionDB(db_path):
        pass
    assert hermes_state.get_last_init_error() == expected
    assert hermes_state.format_session_db_unavailable("No store") == f"No store: {expected}."


@pytest.mark.parametrize("cause", ["locking protocol", "not authorized to use the lock"])
def test_a_locking_failure_points_at_the_file_system(cause: str) -> None:
    openability.record_open_error(sqlite3.OperationalError(cause))
    text = hermes_state.format_session_db_unavailable()
    assert text.startswith(f"Session database not available: OperationalError: {cause} (")
    assert "NFS" in text and "https://www.sqlite.org/wal.html" in text and text.endswith(").")


# --- the probe ----------------------------------------------------------------------------------

def test_a_healthy_store_opens_cleanly_and_the_probe_leaves_nothing(db_path: Path) -> None:
    build_store(db_path, 1, sessions=2)
    before = rows(db_path)
    assert hermes_state._db_opens_cleanly(db_path) is None
    assert rows(db_path) == before


def test_an_older_layout_without_the_probed_tables_is_not_damage(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    raw_edit(old, "CREATE TABLE sessions (id TEXT PRIMARY KEY)",
             "CREATE TABLE other (id INTEGER PRIMARY KEY)")
    assert openability.db_opens_cleanly(old) is None


def test_random_bytes_and_a_missing_file_give_a_reason(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(random.Random(2).randbytes(8192))
    assert "not a database" in (openability.db_opens_cleanly(junk) or "")
    assert openability.db_opens_cleanly(tmp_path / "absent.db")
    assert not (tmp_path / "absent.db").exists()


# --- the schema repair --------------------------------------------------------------------------

def test_a_missing_file_is_not_repaired_and_names_the_path(tmp_path: Path) -> None:
    result = hermes_state.repair_state_db_schema(tmp_path / "absent.db")
    assert result["repaired"] is False and result["strategy"] is None
    assert result["backup_path"] is None and str(tmp_path / "absent.db") in (result["error"] or "")


def test_a_healthy_store_is_left_alone(db_path: Path) -> None:
    build_store(db_path, 3, sessions=1)
    assert hermes_state.repair_state_db_schema(db_path) == {
        "repaired": True, "strategy": "already_healthy", "backup_path": None, "error": None}
    assert not list(db_path.parent.glob("*malformed-backup*"))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_index_that_rejects_writes_is_rebuilt(db_path: Path, seed: int) -> None:
    """A damaged structure record: FTS5 refuses the probe's insert; its rebuild rewrites it."""
    build_store(db_path, seed)
    before, raw = rows(db_path), db_path.read_bytes()
    raw_edit(db_path, "UPDATE messages_fts_data SET block = X'0000ff' WHERE id = 10")
    assert openability.db_opens_cleanly(db_path)
    result = hermes_state.repair_state_db_schema(db_path)
    assert (result["repaired"], result["strategy"], result["error"]) == (True, "rebuild_fts", None)
    assert rows(db_path) == before
    assert [h["session_id"] for h in searches(db_path)]
    backup = Path(result["backup_path"] or "")
    assert backup.name.startswith("state.db.malformed-backup-") and backup.read_bytes() != raw


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_duplicated_schema_row_is_removed(
    db_path: Path, seed: int, run_python: RunPython
) -> None:
    build_store(db_path, seed)
    before = rows(db_path)
    raw_edit(db_path, "INSERT INTO sqlite_master SELECT * FROM sqlite_master"
                      " WHERE name = 'idx_sessions_source'", writable_schema=True)
    # Another process meets the damage (and quarantines the file until the repair).
    opened = run_python("import sys, hermes_state as h\n"
                        "try: h.SessionDB(sys.argv[1])\n"
                        "except h.StateDbCorruptError: print('corrupt')\n", str(db_path))
    assert opened.stdout.strip() == "corrupt" and quarantine.read_marker(db_path)
    result = hermes_state.repair_state_db_schema(db_path, backup=False)
    assert (result["repaired"], result["strategy"], result["backup_path"]) == (
        True, "dedup_schema", None)
    assert not list(db_path.parent.glob("*malformed-backup*"))
    assert rows(db_path) == before and searches(db_path)
    assert quarantine.read_marker(db_path) is None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_damaged_index_b_tree_is_dropped_and_built_again(db_path: Path, seed: int) -> None:
    build_store(db_path, seed, sessions=12)
    before = rows(db_path)
    pages = table_pages(db_path, "messages_fts_data", "leaf")
    overwrite_pages(db_path, random.Random(seed).sample(pages, min(3, len(pages))), seed=seed)
    assert openability.db_opens_cleanly(db_path)
    quarantine.write_marker(db_path, "the index met damage")
    result = hermes_state.repair_state_db_schema(db_path)
    assert (result["repaired"], result["strategy"], result["error"]) == (
        True, "drop_fts_rebuild", None)
    assert rows(db_path) == before
    assert quarantine.read_marker(db_path) is None
    assert len(searches(db_path)) == 5
    assert Path(result["backup_path"] or "").exists()


def test_a_store_another_process_holds_is_not_touched(db_path: Path) -> None:
    build_store(db_path, 4, sessions=2)
    raw_edit(db_path, "UPDATE messages_fts_data SET block = X'0000ff' WHERE id = 10")
    raw = db_path.read_bytes()
    with process_holding(db_path):
        result = hermes_state.repair_state_db_schema(db_path)
    assert result["repaired"] is False and "in use" in (result["error"] or "")
    assert db_path.read_bytes() == raw and not list(db_path.parent.glob("*malformed-backup*"))


def test_what_no_strategy_mends_is_reported_and_rows_stay(db_path: Path) -> None:
    build_store(db_path, 5, sessions=4)
    overwrite_pages(db_path, table_pages(db_path, "messages", "leaf")[:2], seed=5)
    result = hermes_state.repair_state_db_schema(db_path)
    assert result["repaired"] is False and result["strategy"] is None and result["error"]
    assert Path(result["backup_path"] or "").exists()


# --- the attributes ------------------------------------------------------------------------------

def test_db_path_is_the_path_given_and_default_db_path_the_home_store(
    hermes_home: Path, tmp_path: Path
) -> None:
    with SessionDB(tmp_path / "given.db") as db:
        assert db.db_path == tmp_path / "given.db" and db.db_path.exists()
    assert hermes_state.DEFAULT_DB_PATH.name == "state.db"
    assert isinstance(hermes_state.DEFAULT_DB_PATH, Path)
