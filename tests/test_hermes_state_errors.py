"""Errors: one translation of SQLite's errors for every entry point, by result code.

The bad-file matrix runs every public operation on five kinds of file that are not a session
store — random bytes (three seeds), an empty file, a directory, another application's SQLite
database and a missing path — and asserts that each gives a typed error (a
``HermesStateError``; never a bare ``sqlite3`` or ``OSError``) or, for the operations whose
job is to examine damaged files (repair, recover), a report that says so, and that a file
refused or examined is left exactly as it was. An empty file or a missing path is where a
writable open or a restore creates a store, and a writable open creates the store beside
another application's tables: those succeed. The operations run in child processes; the
parent, which never opens the files with SQLite, reads them afterwards.
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO_ROOT, subprocess_env
from hermes_state import SessionDB, backup_state_db, is_malformed_db_error, restore_state_db
from hermes_state_errors import (
    HermesStateError,
    StateDbCannotOpenError,
    StateDbConstraintError,
    StateDbCorruptError,
    StateDbError,
    StateDbLockedError,
    StateDbReadOnlyError,
    translate,
    translated_errors,
)

# --- the bad files ----------------------------------------------------------------------------

RANDOM_SEEDS = (1, 2, 3)
KINDS = (*(f"random-{seed}" for seed in RANDOM_SEEDS), "empty", "directory", "foreign",
         "missing")

# Another application's database, shaped like the logs.db of the `llm` tool.
FOREIGN_SQL = """
CREATE TABLE _llm_migrations (name TEXT PRIMARY KEY, applied_at TEXT);
CREATE TABLE conversations (id TEXT PRIMARY KEY, name TEXT, model TEXT);
CREATE TABLE responses (id TEXT PRIMARY KEY, model TEXT, prompt TEXT, response TEXT,
    conversation_id TEXT REFERENCES conversations(id), datetime_utc TEXT);
INSERT INTO _llm_migrations VALUES ('m001_initial', '2024-01-01');
INSERT INTO conversations VALUES ('c1', 'a chat', 'gpt-4o');
INSERT INTO responses VALUES ('r1', 'gpt-4o', 'hello', 'hi there', 'c1', '2024-01-01');
"""


def make_bad_file(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind.startswith("random-"):
        path.write_bytes(random.Random(int(kind.split("-")[1])).randbytes(3 * 4096 + 123))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
        (path / "inside").write_text("not a database")
    elif kind == "foreign":
        conn = sqlite3.connect(path)
        conn.executescript(FOREIGN_SQL)
        conn.close()
    else:
        assert kind == "missing"


def state_of(path: Path) -> dict[str, Any]:
    """The file and its sidecars as plain file I/O sees them (no SQLite connection)."""
    state: dict[str, Any] = {}
    for name in (path.name, *(path.name + s for s in ("-wal", "-shm", "-journal"))):
        p = path.with_name(name)
        if p.is_dir():
            state[name] = sorted(c.name for c in p.iterdir())
        elif p.exists():
            state[name] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            state[name] = None
    return state


# --- the operations ---------------------------------------------------------------------------

# Runs each operation named in argv[1] (a JSON list of [operation, path, good store, good
# snapshot]) and prints one JSON line per operation: what it returned or raised.
CHILD = r"""
import io, json, sys
from pathlib import Path
from hermes_state import (
    is_malformed_db_error,
    SessionDB, HermesStateError, backup_state_db, collect_profile_stats, recover_state_db,
    repair_state_db, restore_state_db,
)

EXPORT = io.StringIO()
with SessionDB(sys.argv[2]) as source:
    source.create_session("imported", "cli")
    source.append_message("imported", "user", "hello")
    EXPORT.write("".join(source.iter_export_jsonl()))

def backup(p, good, snap):
    backup_state_db(p, p.parent / "backup-out.db")
def restore_snapshot(p, good, snap):
    restore_state_db(p, good)
def restore_target(p, good, snap):
    restore_state_db(snap, p)
def repair_check(p, good, snap):
    r = repair_state_db(p, check_only=True)
    return {"healthy": r["healthy"]}
def repair(p, good, snap):
    r = repair_state_db(p)
    return {"healthy": r.get("healthy"), "promoted": r["promoted"]}
def recover_inspect(p, good, snap):
    return {"readable": recover_state_db(p, inspect_only=True)["readable"]}
def recover_output(p, good, snap):
    return {"readable": recover_state_db(p, p.parent / "recovered.db")["readable"]}
def stats(p, good, snap):
    return {"errors": collect_profile_stats(p.parent)["errors"]}
def export(p, good, snap):
    with SessionDB(p, read_only=True) as db:
        list(db.iter_export_jsonl())
def import_(p, good, snap):
    with SessionDB(p) as db:
        db.import_jsonl(io.StringIO(EXPORT.getvalue()))
def open_(p, good, snap):
    SessionDB(p).close()
def open_read_only(p, good, snap):
    SessionDB(p, read_only=True).close()

OPS = {"backup": backup, "restore_snapshot": restore_snapshot,
       "restore_target": restore_target, "repair_check": repair_check, "repair": repair,
       "recover_inspect": recover_inspect, "recover_output": recover_output, "stats": stats,
       "export": export, "import": import_, "open": open_, "open_read_only": open_read_only}

for op, path, good, snap in json.loads(sys.argv[1]):
    try:
        out = {"outcome": "ok", **(OPS[op](Path(path), Path(good), Path(snap)) or {})}
    except BaseException as exc:
        out = {"outcome": "error", "type": type(exc).__name__,
               "typed": isinstance(exc, HermesStateError),
               "reason": getattr(exc, "reason", None), "message": str(exc)}
    print(json.dumps({"op": op, **out}), flush=True)
"""

OPERATIONS = ("backup", "restore_snapshot", "restore_target", "repair_check", "repair",
              "recover_inspect", "recover_output", "stats", "export", "import", "open",
              "open_read_only")

U, C = "StateDbUnavailableError", "StateDbCorruptError"
# What each operation gives for each kind of file: an error type (with its reason), "ok", or
# a report's verdict. An empty file or a missing path is where a writable open or a restore
# creates a store: that is no error for them.
UNHEALTHY = {"outcome": "ok", "healthy": False}
NOT_PROMOTED = {"outcome": "ok", "healthy": False, "promoted": False}
UNREADABLE = {"outcome": "ok", "readable": False}
OK = {"outcome": "ok"}
NOT_A_STORE = (U, "uninitialized")
FOREIGN = (U, "foreign")
EXPECTED: dict[str, dict[str, Any]] = {
    "random": {
        "backup": (C, None), "restore_snapshot": (C, None), "restore_target": (C, None),
        "repair_check": UNHEALTHY, "repair": NOT_PROMOTED, "recover_inspect": UNREADABLE,
        "recover_output": UNREADABLE, "stats": C, "export": (C, None), "import": (C, None),
        "open": (C, None), "open_read_only": (C, None),
    },
    "empty": {
        "backup": NOT_A_STORE, "restore_snapshot": NOT_A_STORE, "restore_target": OK,
        "repair_check": NOT_A_STORE, "repair": NOT_A_STORE, "recover_inspect": NOT_A_STORE,
        "recover_output": NOT_A_STORE, "stats": U, "export": NOT_A_STORE, "import": OK,
        "open": OK, "open_read_only": NOT_A_STORE,
    },
    "directory": {
        "backup": NOT_A_STORE, "restore_snapshot": NOT_A_STORE,
        "restore_target": ("UnsafePathError", None), "repair_check": NOT_A_STORE,
        "repair": NOT_A_STORE, "recover_inspect": NOT_A_STORE, "recover_output": NOT_A_STORE,
        "stats": U, "export": NOT_A_STORE, "import": ("UnsafePathError", None),
        "open": ("UnsafePathError", None), "open_read_only": NOT_A_STORE,
    },
    # A writable open creates the store in a database that has none, beside its tables;
    # a read-only one says it is another application's database, as what needs a store, or
    # would replace the whole file, does.
    "foreign": {op: FOREIGN for op in OPERATIONS} | {"stats": U, "import": OK, "open": OK},
    "missing": {
        "backup": NOT_A_STORE, "restore_snapshot": NOT_A_STORE, "restore_target": OK,
        "repair_check": NOT_A_STORE, "repair": NOT_A_STORE, "recover_inspect": NOT_A_STORE,
        "recover_output": NOT_A_STORE, "stats": U, "export": NOT_A_STORE, "import": OK,
        "open": OK, "open_read_only": NOT_A_STORE,
    },
}


def expected(kind: str, op: str) -> Any:
    return EXPECTED["random" if kind.startswith("random-") else kind][op]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every operation on every kind of bad file, one child process per kind (run at once):
    ``{kind: {op: {"result": ..., "before": ..., "after": ..., "good": ...}}}``."""
    base = tmp_path_factory.mktemp("bad-files")
    home = base / "home"
    home.mkdir()
    good = base / "good" / "state.db"
    good.parent.mkdir()
    with SessionDB(good) as db:
        db.create_session("kept", "cli")
        db.append_message("kept", "user", "a row that must stay")
    snapshot = backup_state_db(good, base / "good" / "snapshot.db")
    cases: dict[str, dict[str, dict[str, Any]]] = {}
    children = {}
    for kind in KINDS:
        plan = []
        for op in OPERATIONS:
            path = base / kind / op / "state.db"
            make_bad_file(path, kind)
            target = base / kind / op / "good" / "state.db"
            target.parent.mkdir()
            target.write_bytes(good.read_bytes())
            cases.setdefault(kind, {})[op] = {
                "path": path, "target": target, "before": state_of(path),
                "good": state_of(target),
            }
            plan.append([op, str(path), str(target), str(snapshot)])
        children[kind] = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(plan), str(base / kind / "source.db")],
            env=subprocess_env({"HERMES_HOME": str(home)}), cwd=REPO_ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
    for kind, child in children.items():
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        for line in out.splitlines():
            result = json.loads(line)
            case = cases[kind][result.pop("op")]
            case["result"] = result
            case["after"] = state_of(case["path"])
            case["good_after"] = state_of(case["target"])
    return cases


@pytest.mark.parametrize("op", OPERATIONS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_file_gives_a_typed_error_and_stays_as_it_was(
    matrix: dict[str, dict[str, Any]], kind: str, op: str
) -> None:
    case = matrix[kind][op]
    result, want = case["result"], expected(kind, op)
    if result["outcome"] == "error":
        assert result["typed"], f"{result['type']} escaped: {result['message']}"
    if isinstance(want, tuple):
        assert (result.get("type"), result.get("reason")) == want, result
    elif isinstance(want, str):  # collect_profile_stats: the profile's entry in ``errors``
        assert result["outcome"] == "ok", result
        [entry] = result["errors"]
        assert entry["profile"] == "default" and str(case["path"]) in entry["error"], entry
        if want == U:
            assert entry["reason"] == ("foreign" if kind == "foreign" else "uninitialized")
        else:
            assert "reason" not in entry and " is damaged: " in entry["error"], entry
    else:
        assert {k: result.get(k) for k in want} == want, result
    if result["outcome"] == "error" or want in (UNHEALTHY, NOT_PROMOTED, UNREADABLE):
        assert case["after"] == case["before"]
    assert case["good_after"] == case["good"]  # the store beside it is never touched


def test_each_error_names_the_file(matrix: dict[str, dict[str, Any]]) -> None:
    for kind, ops in matrix.items():
        for op, case in ops.items():
            result = case["result"]
            if result["outcome"] == "error":
                assert str(case["path"]) in result["message"], (kind, op, result)


@pytest.mark.parametrize("depth", ["file/state.db", "file/sub/state.db"])
def test_a_store_whose_directory_is_a_file_cannot_be_created_typed(
    tmp_path: Path, depth: str
) -> None:
    (tmp_path / "file").write_text("in the way")
    path = tmp_path / depth
    with pytest.raises(StateDbCannotOpenError) as info:
        SessionDB(path)
    assert info.value.path == path and isinstance(info.value.__cause__, OSError)
    snapshot = backup_state_db(make_store(tmp_path / "good" / "state.db"), tmp_path / "s.db")
    with pytest.raises(StateDbCannotOpenError):
        restore_state_db(snapshot, path)
    assert (tmp_path / "file").read_text() == "in the way"


def make_store(path: Path) -> Path:
    SessionDB(path).close()
    return path


# --- translation by result code ---------------------------------------------------------------


def raised(conn: sqlite3.Connection, sql: str) -> sqlite3.Error:
    with pytest.raises(sqlite3.Error) as info:
        conn.execute(sql)
    return info.value


def test_translation_is_by_result_code_and_keeps_the_original(tmp_path: Path) -> None:
    path = tmp_path / "plain.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE t (x UNIQUE)")
    conn.execute("INSERT INTO t VALUES (1)")
    constraint = raised(conn, "INSERT INTO t VALUES (1)")
    other = raised(conn, "SELECT * FROM missing")
    conn.close()
    ro = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    read_only = raised(ro, "INSERT INTO t VALUES (2)")
    ro.close()
    with pytest.raises(sqlite3.Error) as cannot:
        sqlite3.connect(f"{(tmp_path / 'no' / 'such.db').as_uri()}?mode=ro", uri=True)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database " * 300)
    conn = sqlite3.connect(junk)
    notadb = raised(conn, "SELECT * FROM sqlite_master")
    conn.close()
    for exc, kind, code in [
        (constraint, StateDbConstraintError, "SQLITE_CONSTRAINT_UNIQUE"),
        (other, StateDbError, "SQLITE_ERROR"),
        (read_only, StateDbReadOnlyError, "SQLITE_READONLY"),
        (cannot.value, StateDbCannotOpenError, "SQLITE_CANTOPEN"),
        (notadb, StateDbCorruptError, "SQLITE_NOTADB"),
    ]:
        error = translate(exc, path)
        assert type(error) is kind, (exc, error)
        assert isinstance(error, HermesStateError) and error.path == path
        assert error.sqlite_errorcode == exc.sqlite_errorcode
        assert error.sqlite_errorname == code == exc.sqlite_errorname
        assert error.__cause__ is exc
        assert str(path) in str(error)


def test_a_lock_error_translates_to_the_locked_type(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    first = sqlite3.connect(path, isolation_level=None)
    second = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        first.execute("BEGIN IMMEDIATE")
        busy = raised(second, "BEGIN IMMEDIATE")
    finally:
        first.close()
        second.close()
    error = translate(busy, path)
    assert type(error) is StateDbLockedError and error.sqlite_errorname == "SQLITE_BUSY"


def test_the_context_manager_raises_the_translation_from_the_original(tmp_path: Path) -> None:
    conn = sqlite3.connect(":memory:")
    with pytest.raises(StateDbError) as info, translated_errors(tmp_path / "x.db"):
        conn.execute("SELEC nonsense")
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    assert info.value.sqlite_errorname == "SQLITE_ERROR"
    with translated_errors(None):  # nothing raised: nothing happens
        conn.execute("SELECT 1")
    conn.close()


# --- is_malformed_db_error: errors of the caller's own connections to damaged files ------


def error_of(path: Path, sql: str) -> sqlite3.Error:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(sql).fetchall()
    except sqlite3.Error as exc:
        return exc
    finally:
        conn.close()
    raise AssertionError(f"{sql!r} succeeded on {path}")


def test_a_damaged_table_is_malformed(
    db: SessionDB, db_path: Path, damage_messages_table: object
) -> None:
    db.create_session("s", "cli")
    for n in range(50):
        db.append_message("s", "user", f"message {n} " + "x" * 200)
    db.close()
    damage_messages_table(db_path)  # type: ignore[operator]
    exc = error_of(db_path, "SELECT * FROM messages")
    assert "database disk image is malformed" in str(exc)
    assert is_malformed_db_error(exc) is True


def test_a_damaged_schema_is_malformed(tmp_path: Path) -> None:
    path = tmp_path / "schema.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE t (x)")
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET sql = 'CREATE TABLE t (x' WHERE name = 't'")
    conn.close()
    exc = error_of(path, "SELECT * FROM t")
    assert "malformed database schema" in str(exc)
    assert is_malformed_db_error(exc) is True


def test_other_errors_are_not_malformed(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database file at all" * 200)
    not_a_db = error_of(garbage, "SELECT * FROM sqlite_master")
    assert "file is not a database" in str(not_a_db)
    assert is_malformed_db_error(not_a_db) is False, "no schema repair helps this one"
    missing = error_of(tmp_path / "fine.db", "SELECT * FROM no_such_table")
    assert is_malformed_db_error(missing) is False
    assert is_malformed_db_error(ValueError("database disk image is malformed")) is False
    assert is_malformed_db_error(StateDbCorruptError("database disk image is malformed")) is False
    assert is_malformed_db_error(StateDbLockedError("locked")) is False


@pytest.mark.parametrize("text", ["Database Disk Image Is Malformed",
                                  "MALFORMED DATABASE SCHEMA (t) - near x"])
def test_text_is_matched_without_regard_to_case(text: str) -> None:
    """An error re-raised from its message keeps no result code: the text is the test."""
    assert is_malformed_db_error(sqlite3.DatabaseError(text)) is True
    assert is_malformed_db_error(sqlite3.OperationalError(text)) is True


def test_unnamed_cause_reads_only_errors_whose_code_names_no_cause() -> None:
    import hermes_state_errors as errors_module

    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE TABLE t (a)")
        causes = []
        for sql in ("SELECT * FROM main.gone", "SELECT nocol FROM t", "INSERT INTO t (b) VALUES (1)"):
            with pytest.raises(sqlite3.OperationalError) as caught:
                conn.execute(sql)
            causes.append(errors_module.unnamed_cause(caught.value))
        assert causes == [("missing_table", "gone"), ("missing_column", "nocol"),
                          ("missing_column", "b")]
        assert errors_module.missing_table(caught.value) is None
    finally:
        conn.close()
    # A message carrying another result code is never read, whatever it says.
    busy = sqlite3.OperationalError("no such table: gone")
    busy.sqlite_errorcode = errors_module.SQLITE_BUSY  # type: ignore[attr-defined]
    assert errors_module.unnamed_cause(busy) is None
