"""The three FTS5 indexes on real files: triggers keep them equal to the table, a chunked rebuild
races other writers safely, a really damaged index is detached by the failing operation and
rebuilt only by an open that is alone on the file, the sqlite3 shell can read and write the
store, and the indexes stay a modest fraction of the database."""

from __future__ import annotations

import hashlib
import shutil
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hermes_state_connect as dbconn
import hermes_state_fts as fts
from hermes_state import FtsCorruptError, SessionDB, StateDbCorruptError, repair_state_db


CLEAN = {"messages_fts": None, "messages_fts_trigram": None, "messages_fts_cjk": None}
TRIGGERS = ["messages_fts_delete", "messages_fts_insert", "messages_fts_update"]
SQLITE_CORRUPT_VTAB = 267

# The check queries of the recovery runbook, as an operator types them into the sqlite3 shell.
STALE_MARKER_SQL = "SELECT key, value FROM state_meta WHERE key = 'fts_stale';"
TRIGGER_SET_SQL = """SELECT type, name FROM sqlite_master WHERE name IN
   ('messages_fts_insert','messages_fts_update','messages_fts_delete')
   ORDER BY name;"""
ROW_COUNT_SQL = """SELECT 'sessions', COUNT(*) FROM sessions
   UNION ALL SELECT 'messages', COUNT(*) FROM messages;"""


def raw(path: Path) -> sqlite3.Connection:
    """Another SQLite client on the same file (autocommit)."""
    return sqlite3.connect(path, isolation_level=None)


def ids(results: list[dict[str, Any]]) -> list[int]:
    found = [hit["id"] for hit in results]
    assert len(found) == len(set(found)), found
    return found


def triggers(path: Path) -> list[str]:
    conn = raw(path)
    try:
        return [row[1] for row in conn.execute(TRIGGER_SET_SQL)]
    finally:
        conn.close()


def index_snapshot(path: Path) -> str:
    """A digest of everything the three indexes hold (any rebuild or merge changes it)."""
    conn = raw(path)
    try:
        digest = hashlib.sha256()
        for table in fts.FTS_TABLES:
            for suffix in ("_data", "_idx"):
                for row in conn.execute(f"SELECT * FROM {table}{suffix} ORDER BY 1, 2"):
                    digest.update(repr(row).encode())
        return digest.hexdigest()
    finally:
        conn.close()


def fts_match(path: Path, table: str, expr: str) -> list[int]:
    conn = raw(path)
    try:
        sql = f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rowid"
        return [row[0] for row in conn.execute(sql, (expr,))]
    finally:
        conn.close()


def wait_until_usable(db: SessionDB, timeout: float = 20.0) -> dict[str, Any]:
    """Wait for the handle's background rebuild to finish; returns the final status."""
    deadline = time.monotonic() + timeout
    while True:
        status = db.fts_status()
        if status["stale"] is None and status["rebuild_high_water"] is None:
            return status
        assert time.monotonic() < deadline, f"rebuild did not finish: {status}"
        time.sleep(0.02)


def wait_for_maintenance(db: SessionDB) -> None:
    """Wait until the handle's open-time FTS maintenance has decided and done what it does."""
    assert db.wait_for_index(30)


# ---------------------------------------------------------------------------------------------
# Triggers keep every index equal to the table
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def store(db: SessionDB) -> SessionDB:
    db.create_session("s1", "cli")
    db.create_session("s2", "telegram")
    db.append_message("s1", "user", "first quokka question")
    db.append_message("s1", "assistant", "東京の天気は晴れ", tool_calls=[
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}])
    db.append_message("s1", "tool", "toolresult quuxfoo output", tool_name="weather",
                      tool_call_id="c1")
    db.append_message("s2", "user", "second session wombat")
    return db


def update_row(path: Path, row_id: int, **columns: Any) -> None:
    """UPDATE one message from another client, recomputing search_cjk as the library does when
    the indexed text changes."""
    conn = raw(path)
    try:
        indexed = ("content", "tool_name", "tool_calls")
        current = dict(zip(indexed, conn.execute(
            "SELECT content, tool_name, tool_calls FROM messages WHERE id = ?", (row_id,)
        ).fetchone()))
        current.update({k: v for k, v in columns.items() if k in current})
        if any(k in columns for k in indexed):
            columns["search_cjk"] = fts.cjk_index_text(*(current[k] for k in indexed))
        for column, value in columns.items():
            assert column in ("content", "tool_name", "tool_calls", "role", "search_cjk")
            conn.execute(f"UPDATE messages SET {column} = ? WHERE id = ?", (value, row_id))
    finally:
        conn.close()


def test_appended_messages_are_in_every_index(store: SessionDB) -> None:
    assert store.check_fts_integrity() == CLEAN
    assert store.fts_status() == {"stale": None, "rebuild_high_water": None,
                                  "rebuild_progress": None, "missing_triggers": []}
    assert ids(store.search_messages("quokka")) == [1]
    assert ids(store.search_messages("天気")) == [2]
    assert ids(store.search_messages("weather")) == [3, 2]  # tool_name and tool_calls
    assert ids(store.search_messages("uokka")) == [1]  # substring: the trigram index


@pytest.mark.parametrize(
    ("column", "value", "old_query", "new_query"),
    [
        ("content", "changed pangolin text", "quokka", "pangolin"),
        ("content", "北京の話に変わった", "quokka", "北京"),
        ("tool_name", "barometer", "weather", "barometer"),
        ("tool_calls", '[{"id": "c9", "function": {"name": "sextant"}}]', None, "sextant"),
        ("search_cjk", "東京 京都 都", None, "京都"),
    ],
)
def test_updating_an_indexed_column_keeps_the_indexes_consistent(
    store: SessionDB, db_path: Path, column: str, value: str, old_query: str | None,
    new_query: str
) -> None:
    row = {"content": 1, "tool_name": 3, "tool_calls": 2, "search_cjk": 4}[column]
    update_row(db_path, row, **{column: value})
    assert store.check_fts_integrity() == CLEAN
    assert row in ids(store.search_messages(new_query))
    if old_query is not None:
        assert row not in ids(store.search_messages(old_query))


def test_changing_the_role_moves_a_row_in_and_out_of_the_trigram_index(
    store: SessionDB, db_path: Path
) -> None:
    assert ids(store.search_messages("uuxfo")) == []  # tool output: no substring search
    assert ids(store.search_messages("quuxfoo")) == [3]  # but found by word
    update_row(db_path, 3, role="user")
    assert store.check_fts_integrity() == CLEAN
    assert ids(store.search_messages("uuxfo")) == [3]
    update_row(db_path, 1, role="tool")
    assert store.check_fts_integrity() == CLEAN
    assert ids(store.search_messages("uokka")) == []
    assert ids(store.search_messages("quokka")) == [1]


def test_deleting_rows_in_every_way_keeps_the_indexes_consistent(
    store: SessionDB, db_path: Path
) -> None:
    conn = raw(db_path)
    conn.execute("DELETE FROM messages WHERE id = 2")
    conn.close()
    assert store.check_fts_integrity() == CLEAN
    assert ids(store.search_messages("天気")) == []

    store.clear_messages("s1")
    assert store.check_fts_integrity() == CLEAN
    assert ids(store.search_messages("quokka")) == ids(store.search_messages("weather")) == []
    assert ids(store.search_messages("wombat")) == [4]

    assert store.delete_session("s2")
    assert store.check_fts_integrity() == CLEAN
    assert store.search_messages("wombat") == []


def test_replacing_messages_keeps_the_indexes_consistent(store: SessionDB) -> None:
    store.replace_messages("s1", [
        {"role": "user", "content": "replaced armadillo"},
        {"role": "assistant", "content": "大阪に変更"},
    ])
    new = [m["id"] for m in store.get_messages("s1")]
    assert store.check_fts_integrity() == CLEAN
    assert ids(store.search_messages("armadillo")) == [new[0]]
    assert ids(store.search_messages("大阪")) == [new[1]]
    assert store.search_messages("quokka") == store.search_messages("天気") == []
    assert ids(store.search_messages("wombat")) == [4]


# ---------------------------------------------------------------------------------------------
# A chunked rebuild racing other writers
# ---------------------------------------------------------------------------------------------


def token(row: int, version: int) -> str:
    return f"r{row:03d}v{version:02d}"


def test_a_chunked_rebuild_misses_nothing_and_indexes_nothing_twice(
    db: SessionDB, db_path: Path
) -> None:
    db.create_session("s1", "cli")
    versions: dict[int, int] = {}

    def text(row: int) -> str:
        cjk = "東京の話" if row % 3 == 0 else ""
        return f"{token(row, versions[row])} {cjk}"

    def append() -> None:
        row = db.append_message("s1", "user", "placeholder")
        versions[row] = 0
        update_row(db_path, row, content=text(row))

    for _ in range(60):
        append()
    rebuilder = raw(db_path)
    other = raw(db_path)
    with dbconn.transaction(rebuilder):
        assert fts.start_rebuild(rebuilder) == 60
    high_water = fts.index_state(rebuilder).high_water
    assert high_water == 60
    deleted: set[int] = set()

    def touch(row: int) -> None:
        if row in versions and row not in deleted:
            versions[row] += 1
            update_row(db_path, row, content=text(row))

    finished = False
    while not finished:
        progress = fts.index_state(rebuilder).progress or 0
        touch(progress)  # already indexed
        touch(progress + 3)  # not reached yet
        touch(high_water + 2)  # newer than the rebuild, kept by the triggers
        for row in (progress - 1, progress + 5):
            if row in versions and row not in deleted:
                other.execute("DELETE FROM messages WHERE id = ?", (row,))
                deleted.add(row)
        append()
        # Meanwhile searches answer from the canonical rows.
        live = max(r for r in versions if r not in deleted)
        assert ids(db.search_messages(token(live, versions[live]))) == [live]
        with dbconn.transaction(rebuilder):
            step = fts.rebuild_chunk(rebuilder, chunk_rows=7)
        assert step is not None
        finished = step.finished
    rebuilder.close()
    other.close()

    assert db.fts_status()["rebuild_high_water"] is None
    assert db.check_fts_integrity() == CLEAN
    assert len(deleted) > 10 and max(versions) > high_water + 5
    for row, version in versions.items():
        expected = [] if row in deleted else [row]
        assert fts_match(db_path, "messages_fts", token(row, version)) == expected, row
        assert ids(db.search_messages(token(row, version))) == expected, row
        if version:
            assert fts_match(db_path, "messages_fts", token(row, version - 1)) == [], row
        if row % 3 == 0:
            cjk = fts_match(db_path, "messages_fts_cjk", token(row, version))
            assert cjk == expected, row
    cjk_rows = ids(db.search_messages("東京", limit=1000))
    assert sorted(cjk_rows) == sorted(r for r in versions if r % 3 == 0 and r not in deleted)


# ---------------------------------------------------------------------------------------------
# A really damaged index
# ---------------------------------------------------------------------------------------------

# FTS5 keeps the structure of an index (its segments and levels) in the row of its %_data table
# with id 10; every segment lives in rows with larger ids.
BREAK_STRUCTURE = "UPDATE messages_fts_data SET block = x'ffffffffffffffffffffffff' WHERE id = 10"
LOSE_SEGMENTS = "DELETE FROM messages_fts_data WHERE id > 10"


@pytest.fixture
def full_store(db: SessionDB, db_path: Path) -> SessionDB:
    """A store whose index has several segments (one commit each, merged as FTS5 does)."""
    db.create_session("s1", "cli")
    for n in range(300):
        db.append_message("s1", "user", f"docker deployment {n} word{n} 東京{n}")
    conn = raw(db_path)
    segments = conn.execute("SELECT COUNT(*) FROM messages_fts_data WHERE id > 10").fetchone()[0]
    conn.close()
    assert segments > 3
    return db


def damage(path: Path, statement: str) -> None:
    conn = raw(path)
    conn.execute(statement)
    conn.close()


def corrupt_vtab_on(path: Path, statement: str, params: tuple[Any, ...] = ()) -> bool:
    """Whether ``statement`` (rolled back) fails with SQLITE_CORRUPT_VTAB."""
    conn = raw(path)
    try:
        conn.execute("BEGIN")
        conn.execute(statement, params).fetchall()
        return False
    except sqlite3.DatabaseError as exc:
        return exc.sqlite_errorcode == SQLITE_CORRUPT_VTAB
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.close()


def assert_detached(db: SessionDB, db_path: Path) -> None:
    status = db.fts_status()
    assert status["stale"] is not None
    assert sorted(status["missing_triggers"]) == TRIGGERS
    assert triggers(db_path) == []


def test_a_write_on_a_damaged_index_detaches_it_and_still_succeeds(
    full_store: SessionDB, db_path: Path
) -> None:
    damage(db_path, BREAK_STRUCTURE)
    assert corrupt_vtab_on(db_path, "INSERT INTO messages_fts(rowid, content) VALUES (9999, 'x')")
    before = index_snapshot(db_path)

    new = full_store.append_message("s1", "user", "appended after the damage: zebra")

    assert not full_store.quarantined
    assert full_store.get_messages("s1")[-1]["id"] == new
    assert_detached(full_store, db_path)
    assert index_snapshot(db_path) == before  # nothing rebuilt or touched the indexes
    later = full_store.append_message("s1", "assistant", "and a later zebra reply")
    assert ids(full_store.search_messages("zebra")) == [later, new]
    assert len(ids(full_store.search_messages("docker", limit=1000))) == 300
    assert sorted(ids(full_store.search_messages("word17"))) == [18, *range(171, 181)]
    assert len(ids(full_store.search_messages("東京1", limit=1000))) == 111
    assert index_snapshot(db_path) == before


@pytest.mark.parametrize("write", ["replace_messages", "clear_messages", "delete_session"])
def test_every_write_that_meets_a_damaged_index_detaches_it_and_succeeds(
    full_store: SessionDB, db_path: Path, write: str
) -> None:
    full_store.create_session("s2", "cli")
    full_store.append_message("s2", "user", "second session zebra")
    damage(db_path, BREAK_STRUCTURE)
    before = index_snapshot(db_path)
    if write == "replace_messages":
        full_store.replace_messages("s1", [{"role": "user", "content": "replaced zebra"}])
        assert len(ids(full_store.search_messages("zebra"))) == 2
    elif write == "clear_messages":
        assert full_store.message_count("s1") == 300
        assert full_store.clear_messages("s1") is None
        assert full_store.message_count("s1") == 0
    else:
        assert full_store.delete_session("s1")
    assert not full_store.quarantined
    assert_detached(full_store, db_path)
    assert index_snapshot(db_path) == before
    assert full_store.search_messages("docker") == []
    assert "second session zebra" in [
        hit["snippet"].replace(">>>", "").replace("<<<", "")
        for hit in full_store.search_messages("zebra")]


def test_a_search_on_a_damaged_index_detaches_it_and_answers_from_the_messages(
    full_store: SessionDB, db_path: Path
) -> None:
    damage(db_path, LOSE_SEGMENTS)
    assert corrupt_vtab_on(
        db_path, "SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'docker'")
    before = index_snapshot(db_path)

    results = full_store.search_messages("docker", limit=1000)

    assert len(ids(results)) == 300
    assert all(">>>docker<<<" in hit["snippet"] for hit in results)
    assert_detached(full_store, db_path)
    assert index_snapshot(db_path) == before
    new = full_store.append_message("s1", "user", "zebra after the search")
    assert ids(full_store.search_messages("zebra")) == [new]


def test_a_read_only_handle_answers_from_the_messages_and_writes_nothing(
    full_store: SessionDB, db_path: Path
) -> None:
    damage(db_path, LOSE_SEGMENTS)
    with SessionDB(db_path, read_only=True) as reader:
        assert len(ids(reader.search_messages("docker", limit=1000))) == 300
        assert ids(reader.search_messages("word299")) == [300]
    assert full_store.fts_status()["stale"] is None
    assert triggers(db_path) == TRIGGERS


def test_a_rebuild_cut_short_is_finished_by_the_next_open(db: SessionDB, db_path: Path) -> None:
    db.create_session("s1", "cli")
    db.replace_messages("s1", [
        {"role": "user", "content": f"row{n} 東京{n}"} for n in range(50)])
    rows = [m["id"] for m in db.get_messages("s1")]
    db.close()
    rebuilder = raw(db_path)
    with dbconn.transaction(rebuilder):
        fts.start_rebuild(rebuilder)
    with dbconn.transaction(rebuilder):
        assert fts.rebuild_chunk(rebuilder, chunk_rows=10) == fts.RebuildStep(10, False)
    rebuilder.close()  # as if the process rebuilding had died

    with SessionDB(db_path) as reopened:
        wait_until_usable(reopened)
        assert reopened.check_fts_integrity() == CLEAN
        assert fts_match(db_path, "messages_fts", "row7 OR row42") == [rows[7], rows[42]]
        assert fts_match(db_path, "messages_fts_cjk", "東京") == rows


def test_a_new_open_alone_on_the_file_rebuilds_a_detached_index(
    full_store: SessionDB, db_path: Path
) -> None:
    damage(db_path, BREAK_STRUCTURE)
    new = full_store.append_message("s1", "user", "appended after the damage: zebra")
    assert_detached(full_store, db_path)
    full_store.close()

    with SessionDB(db_path) as reopened:
        status = wait_until_usable(reopened)
        assert status["missing_triggers"] == []
        assert triggers(db_path) == TRIGGERS
        assert reopened.check_fts_integrity() == CLEAN
        assert fts_match(db_path, "messages_fts", "zebra") == [new]
        assert ids(reopened.search_messages("zebra")) == [new]
        assert len(ids(reopened.search_messages("docker", limit=1000))) == 300
        assert len(ids(reopened.search_messages("東京1", limit=1000))) == 111
        later = reopened.append_message("s1", "user", "indexed again: zebra")
        assert fts_match(db_path, "messages_fts", "zebra") == [new, later]
        assert reopened.check_fts_integrity() == CLEAN


@pytest.fixture
def closed_store(db_path: Path) -> Path:
    """A store big enough for interior b-tree pages in its index, closed (to damage its file)."""
    with SessionDB(db_path) as db:
        db.create_session("s1", "cli")
        db.replace_messages("s1", [
            {"role": "user", "content": f"docker deployment {n} word{n} " + "filler " * 30}
            for n in range(3000)])
    conn = raw(db_path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return db_path


def damage_page(path: Path, table: str, page_type: str) -> None:
    """Overwrite part of a b-tree page of ``table`` in the file itself (no connection open):
    its root-most interior page, or a leaf a third of the way in — for an FTS5 ``%_data``
    table, the leaf holding the start of the ``docker`` doclist (the row whose block holds
    that term), which every ``docker`` search reads, wherever the file put it."""
    conn = raw(path)
    pages = [row[0] for row in conn.execute(
        "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = ? ORDER BY path",
        (table, page_type))]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    if page_type == "internal":
        page, offset = pages[0], 0
    elif not table.endswith("_data"):
        page, offset = pages[len(pages) // 3], 8
    else:
        (row,) = conn.execute(
            f"SELECT count(*) FROM {table} WHERE id < (SELECT min(id) FROM {table}"
            " WHERE id > 10 AND instr(block, CAST('docker' AS BLOB)) > 0)").fetchone()
        cells = conn.execute("SELECT pageno, ncell FROM dbstat WHERE name = ?"
                             " AND pagetype = 'leaf' ORDER BY path", (table,)).fetchall()
        for page, ncell in cells:
            if row < ncell:
                break
            row -= ncell
        offset = 8
    conn.close()
    with open(path, "r+b") as fh:
        fh.seek((page - 1) * page_size + offset)
        fh.write(b"\xff" * 64)


def test_an_index_btree_damaged_below_fts5_is_detached_and_never_quarantines(
    closed_store: Path,
) -> None:
    damage_page(closed_store, "messages_fts_data", "internal")
    with SessionDB(closed_store, rebuild_fts=False) as db:
        new = db.append_message("s1", "user", "zebra after the damage")
        assert_detached(db, closed_store)
        assert len(ids(db.search_messages("docker", limit=5000))) == 3000

    with SessionDB(closed_store) as reopened:  # alone on the file: it tries to rebuild
        wait_for_maintenance(reopened)
        assert not reopened.quarantined
        assert_detached(reopened, closed_store)
        with pytest.raises(FtsCorruptError):
            reopened.rebuild_fts()  # only a repair of the file can mend a damaged b-tree
        assert not reopened.quarantined
        report = reopened.check_fts_integrity()
        assert report["messages_fts"] is not None and report["messages_fts_cjk"] is None
        later = reopened.append_message("s1", "user", "and another zebra")
        assert ids(reopened.search_messages("zebra")) == [later, new]
        assert not reopened.quarantined


def test_a_damaged_index_leaf_is_detached_and_never_rebuilt_into_the_damaged_page(
    closed_store: Path,
) -> None:
    damage_page(closed_store, "messages_fts_data", "leaf")
    with SessionDB(closed_store, rebuild_fts=False) as db:
        assert len(ids(db.search_messages("docker", limit=5000))) == 3000
        assert_detached(db, closed_store)
    # The page fails SQLite's cell checks: emptying the index in place would write into it,
    # so the next open leaves the index detached; a repair rebuilds it on a copy.
    with SessionDB(closed_store) as reopened:
        wait_for_maintenance(reopened)
        assert not reopened.quarantined
        assert_detached(reopened, closed_store)
        new = reopened.append_message("s1", "user", "zebra after the damage")
        assert ids(reopened.search_messages("zebra")) == [new]
    report = repair_state_db(closed_store)
    assert report["promoted"] and report["after"]["healthy"], report
    with SessionDB(closed_store) as repaired:
        assert repaired.check_fts_integrity() == CLEAN
        assert fts_match(closed_store, "messages_fts", "word2999 OR zebra") == [3000, new]


def test_damage_to_the_messages_table_is_not_taken_for_index_damage(closed_store: Path) -> None:
    damage_page(closed_store, "messages", "leaf")
    with SessionDB(closed_store, rebuild_fts=False) as db:
        with pytest.raises(StateDbCorruptError):
            db.search_messages("docker", limit=5000)
        assert db.fts_status()["stale"] is None  # nothing was written to the damaged file
        assert triggers(closed_store) == TRIGGERS


# Opens the database, reads it (so its connection holds SQLite's shared locks), says "ready",
# and keeps the connection open until its stdin is closed.
_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
conn.execute("SELECT COUNT(*) FROM messages").fetchone()
print("ready", flush=True)
sys.stdin.read()
conn.close()
"""


@pytest.fixture
def other_process(db_path: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(db_path)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
        proc.stdout.close()


def test_a_new_open_leaves_the_index_detached_while_another_process_has_the_file(
    full_store: SessionDB, db_path: Path, request: pytest.FixtureRequest
) -> None:
    damage(db_path, BREAK_STRUCTURE)
    full_store.append_message("s1", "user", "appended after the damage: zebra")
    full_store.close()
    holder = request.getfixturevalue("other_process")

    with SessionDB(db_path) as reopened:
        wait_for_maintenance(reopened)
        assert_detached(reopened, db_path)
        new = reopened.append_message("s1", "user", "canonical writes go on: zebra")
        assert ids(reopened.search_messages("zebra"))[0] == new
        assert len(ids(reopened.search_messages("zebra"))) == 2
        assert holder.poll() is None

    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait(timeout=10)
    with SessionDB(db_path, rebuild_fts=False) as repairer:
        assert_detached(repairer, db_path)
        repairer.rebuild_fts()
        assert repairer.fts_status()["stale"] is None
        assert triggers(db_path) == TRIGGERS
        assert repairer.check_fts_integrity() == CLEAN
        assert len(fts_match(db_path, "messages_fts", "zebra")) == 2


# ---------------------------------------------------------------------------------------------
# The sqlite3 command-line shell
# ---------------------------------------------------------------------------------------------

SHELL = shutil.which("sqlite3")
needs_shell = pytest.mark.skipif(SHELL is None, reason="the sqlite3 shell is not installed")


def shell(path: Path, sql: str) -> list[str]:
    assert SHELL is not None
    done = subprocess.run([SHELL, str(path), sql], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@needs_shell
def test_the_shell_runs_the_runbook_checks_on_a_healthy_store(store: SessionDB,
                                                             db_path: Path) -> None:
    assert shell(db_path, STALE_MARKER_SQL) == []
    assert shell(db_path, TRIGGER_SET_SQL) == [f"trigger|{name}" for name in TRIGGERS]
    assert shell(db_path, ROW_COUNT_SQL) == ["sessions|2", "messages|4"]


@needs_shell
def test_the_shell_sees_a_detached_index(full_store: SessionDB, db_path: Path) -> None:
    damage(db_path, BREAK_STRUCTURE)
    full_store.append_message("s1", "user", "zebra")
    (marker,) = shell(db_path, STALE_MARKER_SQL)
    assert marker.startswith("fts_stale|")
    assert shell(db_path, TRIGGER_SET_SQL) == []
    assert shell(db_path, ROW_COUNT_SQL) == ["sessions|1", "messages|301"]


@needs_shell
def test_a_message_inserted_by_the_shell_is_indexed(store: SessionDB, db_path: Path) -> None:
    shell(db_path, "INSERT INTO messages (session_id, role, content, timestamp) "
                   "VALUES ('s2', 'user', 'the shell wrote narwhals here', 1.0);")
    shell(db_path, "UPDATE messages SET content = 'shell edited pelicans' WHERE id = 1;")
    assert store.check_fts_integrity() == CLEAN
    assert ids(store.search_messages("narwhals")) == [5]
    assert ids(store.search_messages("arwhal")) == [5]  # substring: the trigram index
    assert ids(store.search_messages("pelicans")) == [1]
    assert store.search_messages("quokka") == []


# ---------------------------------------------------------------------------------------------
# Size
# ---------------------------------------------------------------------------------------------


def test_the_database_stays_under_four_bytes_per_byte_of_content(
    db: SessionDB, db_path: Path
) -> None:
    corpus = pytest.importorskip("bench.corpus")
    sessions = list(corpus.generate_corpus(3000, seed=3))
    for session in sessions:
        db.create_session(session.session_id, session.source, model=session.model)
        db.replace_messages(session.session_id,
                            [m.as_append_kwargs() for m in session.messages])
    content = corpus.content_bytes(sessions)
    assert db.check_fts_integrity() == CLEAN
    db.close()
    conn = raw(db_path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    pages = dict(conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"))
    conn.close()
    total = db_path.stat().st_size
    shares = {name: round(size / content, 3) for name, size in
              sorted(pages.items(), key=lambda kv: -kv[1])[:8]}
    assert total / content < 4.0, f"{total / content:.2f} bytes per content byte: {shares}"


# Seeds 33, 57 and 84 make FTS5 fail with SQLITE_NOMEM (Python's MemoryError) on this data.
@pytest.mark.parametrize("seed", [*range(8), 33, 57, 84])
def test_garbage_inside_index_blocks_never_costs_a_message(
    db_path: Path, hermes_home: Path, seed: int
) -> None:
    """Random bytes inside the index's segments pass quick_check (the b-trees are sound) and
    can make FTS5 fail in any way, out-of-memory included: the append still lands, the index
    is detached, and the search answers from the messages."""
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        db.replace_messages("s", [{"role": "user", "content": f"docker deploy number {i}"}
                                  for i in range(200)])
    rng = random.Random(seed)
    raw = sqlite3.connect(db_path)
    blocks = raw.execute("SELECT id, length(block) FROM messages_fts_data WHERE id > 1")
    raw.executemany("UPDATE messages_fts_data SET block = ? WHERE id = ?",
                    [(rng.randbytes(size), block_id) for block_id, size in blocks.fetchall()])
    raw.commit()
    raw.close()
    with SessionDB(db_path, rebuild_fts=False) as db:
        row_id = db.append_message("s", "user", "after the damage, docker again")
        assert not db.quarantined
        assert row_id in [h["id"] for h in db.search_messages("damage")]
        assert len(db.search_messages("docker", limit=500)) == 201
        assert db.message_count("s") == 201
        assert db.fts_status()["stale"] is not None


# ---------------------------------------------------------------------------------------------
# A row another client gives a new id
# ---------------------------------------------------------------------------------------------

# The update trigger of earlier releases: it did not watch ``id``.
EARLIER_UPDATE_TRIGGER = """
CREATE TRIGGER messages_fts_update
AFTER UPDATE OF content, tool_name, tool_calls, role, search_cjk ON messages
WHEN (SELECT value FROM state_meta WHERE key = 'fts_rebuild_high_water') IS NULL
    OR old.id > (SELECT CAST(value AS INTEGER) FROM state_meta
                 WHERE key = 'fts_rebuild_high_water')
    OR old.id <= (SELECT CAST(value AS INTEGER) FROM state_meta
                  WHERE key = 'fts_rebuild_progress')
BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)
        VALUES ('delete', old.id, old.content, old.tool_name, old.tool_calls);
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content)
        SELECT 'delete', old.id, old.content WHERE old.role <> 'tool';
    INSERT INTO messages_fts_cjk(messages_fts_cjk, rowid, search_cjk)
        SELECT 'delete', old.id, old.search_cjk WHERE old.search_cjk IS NOT NULL;
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
        VALUES (new.id, new.content, new.tool_name, new.tool_calls);
    INSERT INTO messages_fts_trigram(rowid, content)
        SELECT new.id, new.content WHERE new.role <> 'tool';
    INSERT INTO messages_fts_cjk(rowid, search_cjk)
        SELECT new.id, new.search_cjk WHERE new.search_cjk IS NOT NULL;
END
"""


def move_and_fill_the_gap(path: Path) -> None:
    """Another client moves message 2 to id 100 and writes a new message into id 2."""
    conn = raw(path)
    try:
        conn.execute("UPDATE messages SET id = 100 WHERE id = 2")
        conn.execute("INSERT INTO messages (id, session_id, role, content, timestamp)"
                     " VALUES (2, 's1', 'user', 'beta new row', 0)")
    finally:
        conn.close()


@pytest.mark.parametrize("full_text", ["full", "no-trigram"])
def test_a_row_another_client_gives_a_new_id_is_indexed_under_it_alone(
    db_path: Path, full_text: str
) -> None:
    with SessionDB(db_path, full_text=full_text) as db:
        db.create_session("s1", "cli")
        for n in range(5):
            db.append_message("s1", "user", f"alpha{n} 大阪城 common words")
    move_and_fill_the_gap(db_path)
    with SessionDB(db_path, full_text=full_text) as db:
        assert ids(db.search_messages("alpha1")) == [100]
        assert ids(db.search_messages("beta")) == [2]
        assert 100 in ids(db.search_messages("大阪", limit=10))
    assert fts_match(db_path, "messages_fts", "alpha1") == [100]
    assert fts_match(db_path, "messages_fts", "beta") == [2]
    assert 100 in fts_match(db_path, "messages_fts_cjk", "大阪")
    if full_text == "full":
        with SessionDB(db_path) as db:
            assert db.check_fts_integrity() == CLEAN


def test_an_earlier_update_trigger_is_replaced_at_the_next_open(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s1", "cli")
        for n in range(5):
            db.append_message("s1", "user", f"alpha{n} common words")
    conn = raw(db_path)
    conn.execute("DROP TRIGGER messages_fts_update")
    conn.execute(EARLIER_UPDATE_TRIGGER)
    conn.close()
    with SessionDB(db_path) as db:
        assert triggers(db_path) == TRIGGERS
        move_and_fill_the_gap(db_path)
        assert ids(db.search_messages("alpha1")) == [100]
        assert db.check_fts_integrity() == CLEAN


def test_rows_moved_across_a_rebuild_s_progress_are_indexed_once(
    db: SessionDB, db_path: Path
) -> None:
    """A move out of the rows the rebuild has indexed into those it has not reached, and the
    other way, during a chunked rebuild: each row ends up indexed once, under its new id."""
    db.create_session("s1", "cli")
    db.replace_messages("s1", [{"role": "user", "content": f"row{n} 東京{n}"} for n in range(50)])
    rows = [m["id"] for m in db.get_messages("s1")]
    rebuilder = raw(db_path)
    with dbconn.transaction(rebuilder):
        fts.start_rebuild(rebuilder)
    with dbconn.transaction(rebuilder):
        assert fts.rebuild_chunk(rebuilder, chunk_rows=20) == fts.RebuildStep(20, False)
    rebuilder.execute("UPDATE messages SET id = ? WHERE id = ?", (rows[-1] + 100, rows[3]))
    rebuilder.execute("UPDATE messages SET id = ? WHERE id = ?", (rows[0] - 1, rows[40]))
    rebuilder.close()
    db.close()
    with SessionDB(db_path) as reopened:
        wait_until_usable(reopened)
        assert reopened.check_fts_integrity() == CLEAN
        assert fts_match(db_path, "messages_fts", "row3") == [rows[-1] + 100]
        assert fts_match(db_path, "messages_fts", "row40") == [rows[0] - 1]
