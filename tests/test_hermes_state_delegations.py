"""``async_delegations`` shared with the application's delegation tool.

The tool keeps its rows in the same table of the same file, with plain ``sqlite3`` and its own
SQL: it creates the table if it is missing, adds the columns it lacks, replaces a row naming
its columns, and reads, claims and recovers rows by its own columns. ``TOOL`` below does what
it does, in a process of its own, so the table this library declares must be the one the tool
reads and writes, whichever of the two created it, and a store of this library's earlier
shape must be rebuilt into it with every row kept."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hermes_state import SessionDB, recover_state_db, repair_state_db
from hermes_state_errors import LedgerConflictError
from hermes_state_schema_sql import SCHEMA_VERSION

# The application's delegation tool, from its behaviour: argv[1] is the file, argv[2] a JSON
# list of steps; it prints one JSON result per step.
TOOL = r'''
import json, os, sqlite3, sys, time

COLUMNS = """delegation_id TEXT PRIMARY KEY, origin_session TEXT NOT NULL,
    origin_ui_session_id TEXT NOT NULL DEFAULT '', parent_session_id TEXT,
    state TEXT NOT NULL, dispatched_at REAL NOT NULL, completed_at REAL,
    updated_at REAL NOT NULL, event_json TEXT, result_json TEXT,
    delivery_state TEXT NOT NULL DEFAULT 'pending',
    delivery_attempts INTEGER NOT NULL DEFAULT 0, delivered_at REAL, owner_pid INTEGER,
    owner_started_at INTEGER, task_json TEXT, delivery_claim TEXT, delivery_claimed_at REAL"""
LATER = [("owner_pid", "INTEGER"), ("owner_started_at", "INTEGER"), ("task_json", "TEXT"),
         ("delivery_claim", "TEXT"), ("delivery_claimed_at", "REAL")]


def connect():
    conn = sqlite3.connect(sys.argv[1], timeout=10)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"CREATE TABLE IF NOT EXISTS async_delegations ({COLUMNS})")
    have = {r[1] for r in conn.execute("PRAGMA table_info(async_delegations)")}
    for name, kind in LATER:
        if name not in have:
            conn.execute(f"ALTER TABLE async_delegations ADD COLUMN {name} {kind}")
    return conn


def dispatch(conn, step):
    task = {"goal": step["goal"], "context": "ctx", "toolsets": ["web"], "is_batch": False}
    conn.execute(
        "INSERT OR REPLACE INTO async_delegations (delegation_id, origin_session,"
        " origin_ui_session_id, parent_session_id, state, dispatched_at, updated_at,"
        " delivery_state, delivery_attempts, owner_pid, owner_started_at, task_json)"
        " VALUES (?, ?, ?, ?, 'running', ?, ?, 'pending', 0, ?, NULL, ?)",
        (step["id"], step["origin"], "ui-1", step.get("parent"), step["at"], time.time(),
         step.get("pid", os.getpid()), json.dumps(task)))


def complete(conn, step):
    event = {"type": "async_delegation", "delegation_id": step["id"], "status": step["state"]}
    conn.execute(
        "UPDATE async_delegations SET state=?, completed_at=?, updated_at=?, event_json=?,"
        " result_json=?, delivery_state='pending' WHERE delegation_id=?",
        (step["state"], time.time(), time.time(), json.dumps(event),
         json.dumps({"status": step["state"], "summary": "done"}), step["id"]))


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover(conn, step):
    rows = conn.execute(
        "SELECT delegation_id, origin_session, origin_ui_session_id, parent_session_id,"
        " dispatched_at, owner_pid, owner_started_at, task_json FROM async_delegations"
        " WHERE state IN ('running','finalizing')").fetchall()
    gone = []
    for row in rows:
        if row[5] and alive(int(row[5])):
            continue
        task = json.loads(row[7] or "{}")
        event = {"delegation_id": row[0], "status": "unknown", "goal": task.get("goal", "")}
        conn.execute(
            "UPDATE async_delegations SET state='unknown', completed_at=?, updated_at=?,"
            " event_json=?, result_json=?, delivery_state='pending' WHERE delegation_id=?",
            (time.time(), time.time(), json.dumps(event), json.dumps({"status": "unknown"}),
             row[0]))
        gone.append(row[0])
    return gone


def owed(conn, step):
    return [r[0] for r in conn.execute(
        "SELECT delegation_id, event_json FROM async_delegations WHERE state != 'running'"
        " AND delivery_state='pending' AND event_json IS NOT NULL"
        " ORDER BY completed_at, delegation_id")]


def deliver(conn, step):
    claimed = conn.execute(
        "UPDATE async_delegations SET delivery_claim=?, delivery_claimed_at=?,"
        " delivery_attempts=delivery_attempts+1, updated_at=? WHERE delegation_id=?"
        " AND delivery_state='pending' AND (delivery_claim IS NULL OR delivery_claimed_at < ?)",
        ("c-1", time.time(), time.time(), step["id"], time.time() - 300)).rowcount
    done = conn.execute(
        "UPDATE async_delegations SET delivery_state='delivered', delivered_at=?, updated_at=?,"
        " delivery_claim=NULL, delivery_claimed_at=NULL WHERE delegation_id=?"
        " AND delivery_state='pending' AND delivery_claim=?",
        (time.time(), time.time(), step["id"], "c-1")).rowcount
    return [claimed, done]


def get(conn, step):
    row = conn.execute(
        "SELECT origin_session, state, dispatched_at, completed_at, result_json,"
        " delivery_state, delivery_attempts FROM async_delegations WHERE delegation_id=?",
        (step["id"],)).fetchone()
    return None if row is None else list(row)


def terminal(conn, step):
    return conn.execute("SELECT COUNT(*) FROM async_delegations"
                        " WHERE state NOT IN ('running','finalizing')").fetchone()[0]


STEPS = {"dispatch": dispatch, "complete": complete, "recover": recover, "owed": owed,
         "deliver": deliver, "get": get, "terminal": terminal}
for step in json.loads(sys.argv[2]):
    with connect() as conn:
        print(json.dumps(STEPS[step["do"]](conn, step)))
'''

# This library's earlier declaration of the table and its index.
EARLIER_SHAPE = """
CREATE TABLE async_delegations (
    delegation_id TEXT PRIMARY KEY,
    parent_session_id TEXT NOT NULL,
    child_session_id TEXT,
    status TEXT NOT NULL DEFAULT 'pending',
    task TEXT,
    result_json TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX idx_async_delegations_parent ON async_delegations(parent_session_id, status);
"""

# A process id no process has: the tool reads its owner as gone.
GONE_PID = 2**22 + 7


def tool(db_path: Path, *steps: dict[str, Any]) -> list[Any]:
    """Run the tool's ``steps`` in a process of its own; the result of each."""
    done = subprocess.run([sys.executable, "-c", TOOL, str(db_path), json.dumps(steps)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def columns(db_path: Path) -> list[str]:
    with sqlite3.connect(db_path) as conn:
        return [r[1] for r in conn.execute("PRAGMA table_info(async_delegations)")]


def indexes(db_path: Path) -> dict[str, str]:
    with sqlite3.connect(db_path) as conn:
        return dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'"
                                 " AND tbl_name = 'async_delegations' AND sql NOT NULL"))


def test_the_tool_shares_the_table_of_a_store_this_library_created(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        db.record_async_delegation("ours", "parent-1", task="summarise the repo")
        db.record_async_delegation("ours-running", "parent-1")
        db.update_async_delegation("ours-running", status="running", child_session_id="c-1")

    results = tool(
        db_path,
        {"do": "dispatch", "id": "app-done", "origin": "tg:dm:1", "parent": "parent-1",
         "goal": "find the bug", "at": 100.0},
        {"do": "complete", "id": "app-done", "state": "completed"},
        {"do": "dispatch", "id": "app-lost", "origin": "tg:dm:1", "goal": "lost", "at": 101.0,
         "pid": GONE_PID},
        {"do": "recover"},
        {"do": "owed"},
        {"do": "deliver", "id": "app-done"},
        {"do": "get", "id": "app-done"},
        {"do": "get", "id": "ours"},
    )
    # The tool recovers its own lost row; this library's running row has a live owner (the
    # process that recorded it), its pending one is not the tool's to recover.
    assert results[3] == ["app-lost"]
    assert results[4] == ["app-done", "app-lost"]
    assert results[5] == [1, 1]
    assert results[6][:2] == ["tg:dm:1", "completed"] and results[6][5:] == ["delivered", 1]
    assert results[7][:2] == ["parent-1", "pending"]

    with SessionDB(db_path) as db:
        done = db.get_async_delegation("app-done")
        assert done is not None
        assert (done["status"], done["parent_session_id"], done["task"]) == (
            "completed", "parent-1", "find the bug")
        assert done["result"] == {"status": "completed", "summary": "done"}
        assert done["task_detail"]["toolsets"] == ["web"]
        assert done["delivery_state"] == "delivered" and done["created_at"] == 100.0
        lost = db.get_async_delegation("app-lost")
        assert lost is not None and lost["status"] == "unknown"
        assert lost["parent_session_id"] is None and lost["origin_session"] == "tg:dm:1"
        with pytest.raises(LedgerConflictError):
            db.update_async_delegation("app-lost", status="completed")
        assert [d["delegation_id"] for d in db.list_async_delegations("parent-1")] == [
            "app-done", "ours", "ours-running"]
        assert [d["delegation_id"] for d in db.list_async_delegations("tg:dm:1")] == [
            "app-lost"]
        assert [d["delegation_id"] for d in db.list_async_delegations(pending_only=True)] == [
            "ours", "ours-running"]
        running = db.get_async_delegation("ours-running")
        assert running is not None
        assert (running["status"], running["child_session_id"]) == ("running", "c-1")


def test_a_store_whose_table_the_tool_created_first_opens(db_path: Path) -> None:
    tool(db_path,
         {"do": "dispatch", "id": "app-1", "origin": "tg:dm:2", "parent": "p", "goal": "g1",
          "at": 10.0},
         {"do": "complete", "id": "app-1", "state": "error"},
         {"do": "dispatch", "id": "app-2", "origin": "tg:dm:2", "parent": "p", "goal": "g2",
          "at": 11.0})
    with SessionDB(db_path) as db:
        assert db.get_async_delegation("app-1")["status"] == "error"  # type: ignore[index]
        assert [(d["delegation_id"], d["status"]) for d in db.list_async_delegations("p")] == [
            ("app-1", "error"), ("app-2", "running")]
        finished = db.update_async_delegation("app-2", status="completed", result={"n": 1})
        assert finished["completed_at"] is not None and finished["result"] == {"n": 1}
        with pytest.raises(LedgerConflictError):
            db.update_async_delegation("app-1", status="running")
        mine = db.record_async_delegation("mine", "p", task="write the tests")
        assert (mine["status"], mine["task"], mine["duplicate"]) == ("pending", "write the tests",
                                                                     False)
        with pytest.raises(LedgerConflictError):
            db.record_async_delegation("app-1", "another parent")
    # The tool goes on with the table as this library left it, and reads this library's row.
    results = tool(db_path,
                   {"do": "dispatch", "id": "app-3", "origin": "o", "goal": "g3", "at": 12.0},
                   {"do": "get", "id": "mine"}, {"do": "get", "id": "app-2"})
    assert results[1][:2] == ["p", "pending"]
    assert results[2][1] == "completed" and json.loads(results[2][4]) == {"n": 1}
    assert set(indexes(db_path)) == {"idx_async_delegations_parent",
                                     "idx_async_delegations_delivery"}


def _earlier_store(db_path: Path, table_sql: str, rows: list[tuple[Any, ...]],
                   insert_sql: str) -> None:
    """A store of this library with ``async_delegations`` declared by ``table_sql``."""
    SessionDB(db_path).close()
    with sqlite3.connect(db_path) as conn:
        conn.execute("DROP TABLE async_delegations")
        conn.executescript(table_sql)
        conn.executemany(insert_sql, rows)
    conn.close()


@pytest.mark.parametrize("full_text", ["full", "no-trigram", "none"])
def test_a_store_of_the_earlier_shape_is_rebuilt_with_every_row_kept(
    db_path: Path, full_text: str
) -> None:
    _earlier_store(db_path, EARLIER_SHAPE, [
        ("d-pending", "p1", None, "pending", "the task", None, 1.0, 1.5),
        ("d-running", "p1", "child", "running", None, None, 2.0, 2.5),
        ("d-done", "p2", "child-2", "completed", "other task", '{"summary": "ok"}', 3.0, 3.5),
    ], "INSERT INTO async_delegations VALUES (?, ?, ?, ?, ?, ?, ?, ?)")

    with SessionDB(db_path, full_text=full_text) as db:
        got = {d["delegation_id"]: d for d in db.list_async_delegations()}
        assert list(got) == ["d-pending", "d-running", "d-done"]
        keys = ("parent_session_id", "origin_session", "child_session_id", "status", "task",
                "result", "created_at", "updated_at", "completed_at")
        assert [tuple(d[k] for k in keys) for d in got.values()] == [
            ("p1", "p1", None, "pending", "the task", None, 1.0, 1.5, None),
            ("p1", "p1", "child", "running", None, None, 2.0, 2.5, None),
            ("p2", "p2", "child-2", "completed", "other task", {"summary": "ok"}, 3.0, 3.5, 3.5),
        ]
        db.update_async_delegation("d-running", status="completed")
        with pytest.raises(LedgerConflictError):
            db.update_async_delegation("d-done", status="failed")
    assert {"status", "task", "created_at"}.isdisjoint(columns(db_path))
    assert "state" in indexes(db_path)["idx_async_delegations_parent"]
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    results = tool(db_path,
                   {"do": "dispatch", "id": "app", "origin": "o", "goal": "g", "at": 4.0},
                   {"do": "get", "id": "d-done"})
    assert results[1][:2] == ["p2", "completed"]


def test_a_previous_store_table_given_the_earlier_columns_is_repaired(db_path: Path) -> None:
    """A previous store's file an earlier version of this library opened: its columns were
    added beside the tool's (``created_at`` NOT NULL on an empty table), which refused the
    tool's inserts and this library's. The tool's rows keep every value."""
    app_row = ("app-1", "tg:dm:3", "ui", "p", "completed", 5.0, 6.0, 6.5, '{"e": 1}', '{"r": 1}',
               "delivered", 2, 7.0, 123, 456, '{"goal": "g"}', None, None)
    table = (
        "CREATE TABLE async_delegations (" + TOOL.split('COLUMNS = """')[1].split('"""')[0]
        + ", child_session_id TEXT, status TEXT NOT NULL DEFAULT 'pending', task TEXT,"
        " created_at REAL);"
        "CREATE INDEX idx_async_delegations_parent ON async_delegations(parent_session_id, status);"
    )
    _earlier_store(db_path, table, [app_row],
                   "INSERT INTO async_delegations VALUES (" + ", ".join("?" * 18)
                   + ", NULL, 'pending', NULL, NULL)")
    with SessionDB(db_path) as db:
        db.record_async_delegation("mine", "p", task="t")
        app = db.get_async_delegation("app-1")
        assert app is not None and (app["status"], app["event"]) == ("completed", {"e": 1})
    with sqlite3.connect(db_path) as conn:
        kept = conn.execute("SELECT delegation_id, origin_session, origin_ui_session_id,"
                            " parent_session_id, state, dispatched_at, completed_at, updated_at,"
                            " event_json, result_json, delivery_state, delivery_attempts,"
                            " delivered_at, owner_pid, owner_started_at, task_json,"
                            " delivery_claim, delivery_claimed_at FROM async_delegations"
                            " WHERE delegation_id = 'app-1'").fetchone()
    conn.close()
    assert kept == app_row
    # The tool counts every row not running or finalizing as terminal: app-1 and "mine".
    assert tool(db_path, {"do": "dispatch", "id": "app-2", "origin": "o", "goal": "g",
                          "at": 8.0}, {"do": "terminal"})[1] == 2


def test_recover_copies_the_rows_of_the_earlier_shape_into_the_declared_one(
    db_path: Path, tmp_path: Path
) -> None:
    _earlier_store(db_path, EARLIER_SHAPE, [
        ("d-1", "p1", "child", "failed", "the task", '{"error": "x"}', 1.0, 2.0),
    ], "INSERT INTO async_delegations VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
    report = recover_state_db(db_path, tmp_path / "out.db")
    assert report["tables"]["async_delegations"]["copied"] == 1
    with SessionDB(tmp_path / "out.db", read_only=True) as copy:
        [row] = copy.list_async_delegations("p1")
        assert (row["status"], row["task"], row["result"], row["completed_at"]) == (
            "failed", "the task", {"error": "x"}, 2.0)


def test_a_repair_of_a_store_of_the_earlier_shape_rebuilds_it_with_its_rows(
    db_path: Path,
) -> None:
    _earlier_store(db_path, EARLIER_SHAPE + "DROP TRIGGER messages_fts_insert;", [
        ("d-1", "p1", None, "running", "the task", None, 1.0, 2.0),
    ], "INSERT INTO async_delegations VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
    report = repair_state_db(db_path)
    assert report["promoted"] and report["after"]["healthy"], report
    with SessionDB(db_path, read_only=True) as repaired:
        [row] = repaired.list_async_delegations(pending_only=True)
        assert (row["delegation_id"], row["status"], row["task"]) == ("d-1", "running",
                                                                     "the task")
