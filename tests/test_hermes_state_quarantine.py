"""Quarantine on really damaged files: a corrupt record stops every write of the process at once,
and of every process that opens the file later (the marker beside it), and nothing — no later
write, no checkpoint, no rebuild, no close, no restart — touches the file again until the
quarantine is cleared; random bytes inside leaf cells are met as corruption (cell_size_check);
damage proven to lie in the search index only takes the stale path instead; what could not be
written is spooled under the home.

Damage is made by writing bytes into a closed file. Where a ``-wal`` matters it holds committed
frames that were never checkpointed (a process died with them), so "the -wal survives" is a real
claim: a checkpoint would copy those frames into the damaged file and delete the -wal.

Whether the -wal survives ``close()`` can only be judged once the process has ended (until then
the process keeps a read-only guard open on the file), so those scenarios run in a child
process — under this interpreter, and under Python 3.12 when one can be found (there
``SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE`` exists; on 3.11 only the guard stands).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import random
import re
import shutil
import sqlite3
import stat
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import file_state, leave_committed_wal, overwrite, subprocess_env, table_pages
from state_helpers import Connections, in_transaction, process_holding

import hermes_state_common as common
import hermes_state_connect as dbconn
import hermes_state_fts as fts
import hermes_state_maintenance as maintenance
import hermes_state_quarantine as quarantine
import hermes_state_recover as recover
from hermes_state import SessionDB, StateDbCorruptError, StateDbUnavailableError, UnsafePathError
from hermes_state_errors import SQLITE_CORRUPT, SQLITE_CORRUPT_VTAB, SQLITE_NOTADB

PAGE = 4096


def make_store(db_path: Path, messages: int = 300, width: int = 200) -> None:
    """A closed store (checkpointed, no -wal) whose ``messages`` b-tree has many leaves, each
    message ``width`` characters past its number and word."""
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        for n in range(messages):
            db.append_message("s", "user", f"message {n} quokka " + "x" * width)
    assert not db_path.with_name("state.db-wal").exists()


def damage_last_messages_leaf(db_path: Path) -> None:
    """Fill the rightmost leaf of ``messages`` (where the next row goes) with 0xff bytes."""
    leaf = table_pages(db_path, "messages", "leaf")[-1]
    overwrite(db_path, (leaf - 1) * PAGE, b"\xff" * PAGE)


HEADER_DAMAGE = {
    "magic": (0, b"NOT A DATABASE!!"),
    "page-size": (16, b"\x00\x03"),
    "read-version": (18, b"\x02\xff"),
}


@pytest.fixture
def damaged(db_path: Path) -> Path:
    """A store with committed frames in its -wal and a damaged ``messages`` leaf in its file."""
    make_store(db_path)
    leave_committed_wal(db_path)
    damage_last_messages_leaf(db_path)
    return db_path


def traced(path: Path) -> tuple[SessionDB, Connections]:
    """A handle on ``path`` whose own connection's statements are traced from now on."""
    connections = Connections()
    db = SessionDB(path, on_connect=connections)
    connections.take()  # what the open ran
    return db, connections


def code(exc: BaseException) -> int:
    cause = exc.__cause__
    assert isinstance(cause, sqlite3.Error), repr(cause)
    return cause.sqlite_errorcode


# ---------------------------------------------------------------------------------------------
# A damaged record, in this process
# ---------------------------------------------------------------------------------------------


def test_a_damaged_leaf_quarantines_at_once_and_later_writes_never_touch_the_file(
    damaged: Path, hermes_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db, trace = traced(damaged)
    caplog.set_level(logging.ERROR, logger="hermes_state")

    with pytest.raises(StateDbCorruptError) as first:
        db.append_message("s", "user", "the turn that met the damage")
    assert code(first.value) & 0xFF == SQLITE_CORRUPT
    assert db.quarantined and db.write_retries == 0
    assert trace.take().count("BEGIN IMMEDIATE") == 1  # no retry
    assert any("quarantining" in r.getMessage() for r in caplog.records)
    assert "database quarantined" in (hermes_home / "logs" / "errors.log").read_text()
    spooled = first.value.spooled_to
    assert spooled == hermes_home / "sessions" / "s.jsonl"
    assert [json.loads(line)["content"] for line in spooled.read_text().splitlines()] == [
        "the turn that met the damage"]

    after_first = file_state(damaged)
    later_writes: list[Callable[[], Any]] = [
        lambda: db.append_message("s", "assistant", "a reply"),
        lambda: db.create_session("t", "cli"),
        lambda: db.update_token_counts("s", input_tokens=3),
        lambda: db.set_meta("k", "v"),
        lambda: db.checkpoint(),
        lambda: db.check_fts_integrity(),
    ]
    for write in later_writes:
        with pytest.raises(StateDbCorruptError):
            write()
        assert trace.take() == []  # refused before a single statement
    assert file_state(damaged) == after_first
    assert len(spooled.read_text().splitlines()) == 2  # the reply was spooled too

    assert db.get_session("s")["message_count"] == 300  # reads go on
    db.close()
    assert file_state(damaged) == after_first
    assert after_first["state.db-wal"] is not None


def test_a_read_that_meets_the_damage_quarantines_a_writable_handle(damaged: Path) -> None:
    with SessionDB(damaged) as db:
        with pytest.raises(StateDbCorruptError):
            db.get_messages("s")
        assert db.quarantined
        with pytest.raises(StateDbCorruptError):
            db.set_meta("k", "v")


def test_a_search_that_meets_the_damaged_record_quarantines_instead_of_detaching(
    damaged: Path,
) -> None:
    with SessionDB(damaged) as db:
        with pytest.raises(StateDbCorruptError):
            db.search_messages("quokka", limit=1000)
        assert db.quarantined
        assert db.fts_status()["stale"] is None


def test_quarantine_covers_every_handle_of_the_process_on_that_file(
    damaged: Path, tmp_path: Path
) -> None:
    bystander, trace = traced(damaged)
    unrelated = SessionDB(tmp_path / "other" / "state.db")
    db = SessionDB(damaged)
    with pytest.raises(StateDbCorruptError):
        db.append_message("s", "user", "x")
    trace.take()
    with pytest.raises(StateDbCorruptError):
        bystander.set_meta("k", "v")
    assert trace.take() == [] and bystander.quarantined

    before = file_state(damaged)
    late = SessionDB(damaged)  # opened afterwards: quarantined from birth, writes nothing
    assert late.quarantined
    with pytest.raises(StateDbCorruptError) as refused:
        late.append_message("s", "user", "kept on disk")
    assert refused.value.spooled_to is not None
    for handle in (db, bystander, late):
        handle.close()
    assert file_state(damaged) == before

    unrelated.create_session("fine", "cli")  # another file is not affected
    assert not unrelated.quarantined
    unrelated.close()


def test_a_file_header_that_is_not_a_database_is_refused_typed_at_open(db_path: Path) -> None:
    make_store(db_path, messages=20)
    overwrite(db_path, 0, b"NOT A DATABASE!!")
    before = file_state(db_path)
    with pytest.raises(StateDbCorruptError) as writable:
        SessionDB(db_path)
    assert code(writable.value) == SQLITE_NOTADB
    with pytest.raises(StateDbCorruptError):
        SessionDB(db_path, read_only=True)
    assert file_state(db_path) == before


# Opens argv[1], reads it (page 1 cached), commits a row (its WAL frames do not hold page 1),
# says "ready"; on a line from stdin commits another row and says "committed"; on the next
# line dies.
_CACHED_WRITER = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA wal_autocheckpoint = 0")
conn.execute("INSERT INTO state_meta (key, value) VALUES ('cached', 'a')")
print("ready", flush=True)
sys.stdin.readline()
conn.execute("UPDATE state_meta SET value = 'b' WHERE key = 'cached'")
print("committed", flush=True)
sys.stdin.readline()
os._exit(0)
"""


def test_a_header_damaged_under_an_open_handle_quarantines_at_its_next_write(
    db_path: Path,
) -> None:
    make_store(db_path, messages=50)
    other = subprocess.Popen([sys.executable, "-c", _CACHED_WRITER, str(db_path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert other.stdin is not None and other.stdout is not None
    try:
        assert other.stdout.readline().strip() == "ready"
        db = SessionDB(db_path)
        db.get_session("s")
        # Another process writes the bytes (a descriptor closed here would drop our locks).
        scribble = "import sys; f = open(sys.argv[1], 'r+b'); f.write(b'NOT A DATABASE!!')"
        subprocess.run([sys.executable, "-c", scribble, str(db_path)], check=True)
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.stdout.readline().strip() == "committed"  # our page cache is now stale
        with pytest.raises(StateDbCorruptError) as first:
            db.append_message("s", "user", "x")
        assert code(first.value) == SQLITE_NOTADB and db.quarantined
        with pytest.raises(StateDbCorruptError):
            db.append_message("s", "user", "y")
    finally:
        other.stdin.write("\n")
        other.stdin.close()
        other.wait(timeout=10)
        other.stdout.close()
    before = file_state(db_path)
    db.close()  # the last connection on the file now, and still no checkpoint
    assert file_state(db_path) == before
    assert before["state.db-wal"] is not None


def test_a_truncated_file_whose_wal_holds_commits_is_refused_and_the_wal_kept(
    db_path: Path,
) -> None:
    make_store(db_path, messages=10)
    leave_committed_wal(db_path)
    db_path.write_bytes(b"")
    before = file_state(db_path)
    with pytest.raises(StateDbCorruptError):
        SessionDB(db_path)
    with pytest.raises(StateDbUnavailableError):
        SessionDB(db_path, read_only=True)
    assert file_state(db_path) == before


def test_no_index_rebuild_runs_on_a_file_whose_record_is_damaged(db_path: Path) -> None:
    make_store(db_path)
    conn = sqlite3.connect(db_path, isolation_level=None)
    with dbconn.transaction(conn):
        fts.detach_index(conn)  # an index detached earlier: the next open would rebuild it
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    damage_last_messages_leaf(db_path)
    before = file_state(db_path)

    db = SessionDB(db_path)  # its background maintenance finds the record damaged
    assert db.started_index_upkeep
    db.wait_for_index(30)
    assert db.quarantined
    status = db.fts_status()
    assert status["stale"] is not None and status["rebuild_high_water"] is None
    db.close()
    assert file_state(db_path) == before


# ---------------------------------------------------------------------------------------------
# Damage to the search index only: the stale path
# ---------------------------------------------------------------------------------------------


def damage_index_structure(db_path: Path) -> None:
    """Overwrite, in the closed file, the bytes of the FTS5 structure record of
    ``messages_fts`` (its %_data row 10) — a shadow row, not a b-tree page header."""
    conn = sqlite3.connect(db_path)
    (blob,) = conn.execute("SELECT block FROM messages_fts_data WHERE id = 10").fetchone()
    conn.close()
    data = db_path.read_bytes()
    assert len(blob) > 8 and data.count(blob) == 1
    overwrite(db_path, data.index(blob) + 4, b"\xff" * (len(blob) - 4))


def test_damaged_index_rows_take_the_stale_path_by_result_code(db_path: Path) -> None:
    make_store(db_path)
    damage_index_structure(db_path)
    probe = sqlite3.connect(db_path, isolation_level=None)
    with pytest.raises(sqlite3.DatabaseError) as raw_error:
        probe.execute("INSERT INTO messages_fts(rowid, content) VALUES (99999, 'x')")
    probe.close()
    assert raw_error.value.sqlite_errorcode == SQLITE_CORRUPT_VTAB

    with SessionDB(db_path, rebuild_fts=False) as db:
        new = db.append_message("s", "user", "written after the damage: zebra")
        assert not db.quarantined
        assert db.fts_status()["stale"] is not None
        assert [hit["id"] for hit in db.search_messages("zebra")] == [new]
        assert db.get_session("s")["message_count"] == 301


def test_damage_to_the_record_and_the_index_together_quarantines(db_path: Path) -> None:
    make_store(db_path)
    damage_index_structure(db_path)
    damage_last_messages_leaf(db_path)
    with SessionDB(db_path, rebuild_fts=False) as db:
        with pytest.raises(StateDbCorruptError):
            db.append_message("s", "user", "x")
        assert db.quarantined
    conn = sqlite3.connect(f"{db_path.as_uri()}?mode=ro", uri=True)
    assert conn.execute("SELECT value FROM state_meta WHERE key = 'fts_stale'").fetchall() == []
    conn.close()


# ---------------------------------------------------------------------------------------------
# Spools
# ---------------------------------------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_pending_messages_are_appended_one_private_json_line_each(hermes_home: Path) -> None:
    first = quarantine.spool_pending_message("chat:42", {"role": "user", "content": "héllo\ud800"})
    again = quarantine.spool_pending_message("chat:42", {"role": "user", "content": "\x00second"})
    assert first == again and first.parent == hermes_home / "pending_messages"
    assert [json.loads(line) for line in first.read_text().splitlines()] == [
        {"role": "user", "content": "héllo"}, {"role": "user", "content": "\x00second"}]
    assert mode(first) == 0o600 and mode(first.parent) == 0o700


@pytest.mark.parametrize(
    "key", ["../../escape", "/etc/passwd", "..", ".", "", "a/b", "a\x00b", "x" * 400, "\ud800"]
)
def test_a_spool_key_never_names_a_path_outside_its_directory(
    hermes_home: Path, key: str
) -> None:
    path = quarantine.spool_pending_message(key, {"k": key})
    assert path.parent == hermes_home / "pending_messages"
    assert len(path.name) <= 128 and path.name.endswith(".jsonl")
    assert json.loads(path.read_text())["k"] == common.clean_text(key)
    other = quarantine.spool_pending_message(key + "!", {"k": 1})
    assert other != path  # two keys never share a file


def test_spools_refuse_a_planted_symlink(hermes_home: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    spool = hermes_home / "pending_messages"
    spool.mkdir()
    (spool / "s1.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        quarantine.spool_pending_message("s1", {"x": 1})
    (hermes_home / "sessions").symlink_to(tmp_path)
    with pytest.raises(UnsafePathError):
        quarantine.spool_transcript("s1", [{"x": 1}])
    assert victim.read_text() == "untouched"


def test_a_transcript_that_cannot_be_spooled_still_raises_the_corrupt_error(
    damaged: Path, hermes_home: Path
) -> None:
    (hermes_home / "sessions").write_text("a file where the spool directory belongs")
    with SessionDB(damaged) as db:
        with pytest.raises(StateDbCorruptError) as caught:
            db.append_message("s", "user", "lost, and said so")
    assert caught.value.spooled_to is None
    assert any("could not be spooled" in note for note in caught.value.__notes__)


# ---------------------------------------------------------------------------------------------
# Until the process ends: under this Python and under 3.12
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interpreter:
    argv: tuple[str, ...]
    env: dict[str, str]
    version: str


def _version(argv: list[str], env: dict[str, str]) -> str | None:
    try:
        done = subprocess.run(
            [*argv, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            env={**os.environ, **env}, capture_output=True, text=True, timeout=30,
        )
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_python312() -> Interpreter | None:
    """A working Python 3.12: ``python3.12`` on PATH, else a 3.12.x that pyenv knows, run
    through its shim with ``PYENV_VERSION`` set."""
    exe = shutil.which("python3.12")
    if exe is not None and _version([exe], {}) == "3.12":
        return Interpreter((exe,), {}, "3.12")
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        return None
    listed = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True)
    for version in sorted(re.findall(r"^3\.12\.\d+$", listed.stdout, re.M), reverse=True):
        env = {"PYENV_VERSION": version}
        for argv in ([exe] if exe else [], [pyenv, "exec", "python3.12"]):
            if argv and _version(argv, env) == "3.12":
                return Interpreter(tuple(argv), env, "3.12")
    return None


@pytest.fixture(scope="module", params=["this", "3.12"])
def interpreter(request: pytest.FixtureRequest) -> Interpreter:
    if request.param == "this":
        return Interpreter((sys.executable,), {}, "%d.%d" % sys.version_info[:2])
    found = find_python312()
    if found is None:
        pytest.skip("no Python 3.12 found (neither python3.12 on PATH nor one through pyenv)")
    return found


# The scenario each child runs on argv[1]. After the first refused write it says "hashable"
# and waits for a line, so that the parent can hash the files at that moment; the last line
# it prints is a JSON report. It never opens a descriptor on the database files itself.
_CHILD = r"""
import json, os, subprocess, sys
from hermes_state import SessionDB, StateDbCorruptError
path, scenario = sys.argv[1], sys.argv[2]
report = {"setconfig": hasattr(__import__("sqlite3").Connection, "setconfig")}

def code(exc):
    return getattr(exc.__cause__, "sqlite_errorcode", None)

def pause():
    print("hashable", flush=True)
    sys.stdin.readline()

def refuse(write):
    try:
        write()
    except StateDbCorruptError as exc:
        return code(exc)
    raise AssertionError("the write was not refused")

if scenario == "header-at-open":
    try:
        SessionDB(path)
    except StateDbCorruptError as exc:
        report["open"] = code(exc)
    try:
        SessionDB(path, read_only=True)
    except StateDbCorruptError as exc:
        report["read_only_open"] = code(exc)
    pause()
else:
    bystander = SessionDB(path) if scenario == "two-handles" else None
    db = SessionDB(path)
    report["first"] = refuse(lambda: db.append_message("s", "user", "x"))
    pause()
    report["second"] = refuse(lambda: db.append_message("s", "user", "y"))
    if bystander is not None:
        report["bystander"] = refuse(lambda: bystander.set_meta("k", "v"))
    if scenario in ("closed", "two-handles"):
        db.close()  # the bystander is left for the interpreter's exit
    elif scenario == "dropped":
        del db
        __import__("gc").collect()
print(json.dumps(report), flush=True)
"""


@pytest.mark.parametrize("scenario", ["closed", "left-open", "dropped", "two-handles"])
def test_a_quarantined_file_keeps_its_wal_after_the_process_ends(
    damaged: Path, interpreter: Interpreter, scenario: str
) -> None:
    report, at_first_refusal, at_exit = run_child(interpreter, damaged, scenario)
    assert report["first"] & 0xFF == SQLITE_CORRUPT
    assert report["second"] == SQLITE_CORRUPT
    assert report["setconfig"] is (interpreter.version != "3.11")
    if scenario == "two-handles":
        assert report["bystander"] is not None
    assert at_exit == at_first_refusal
    assert at_exit["state.db-wal"] is not None


@pytest.mark.parametrize("damage", sorted(HEADER_DAMAGE))
def test_a_header_damaged_file_keeps_its_wal_after_a_refused_open(
    db_path: Path, interpreter: Interpreter, damage: str
) -> None:
    make_store(db_path, messages=50)
    leave_committed_wal(db_path)
    offset, data = HEADER_DAMAGE[damage]
    overwrite(db_path, offset, data)
    before = file_state(db_path)
    report, at_refusal, at_exit = run_child(interpreter, db_path, "header-at-open")
    assert report["open"] == SQLITE_NOTADB
    assert report["read_only_open"] == SQLITE_NOTADB
    assert before == at_refusal == at_exit


def run_child(
    interpreter: Interpreter, db_path: Path, scenario: str
) -> tuple[dict[str, Any], dict[str, str | None], dict[str, str | None]]:
    proc = subprocess.Popen(
        [*interpreter.argv, "-c", _CHILD, str(db_path), scenario],
        env=subprocess_env(interpreter.env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline().strip()
        assert line == "hashable", proc.communicate(timeout=30)
        during = file_state(db_path)
        out, err = proc.communicate("\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    return json.loads(out.splitlines()[-1]), during, file_state(db_path)


def test_the_interpreter_search_is_generic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    assert find_python312() is None  # nothing on PATH: nothing found, no hard-coded path


# ---------------------------------------------------------------------------------------------
# The quarantine outlives the process: the marker beside the file
# ---------------------------------------------------------------------------------------------


def marker_of(db_path: Path) -> dict[str, Any] | None:
    path = quarantine.marker_path(db_path)
    return json.loads(path.read_text()) if path.exists() else None


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hermes_state_cli", *args],
        env=subprocess_env({"HERMES_HOME": str(home)}), capture_output=True, text=True,
        timeout=60,
    )


# One process on argv[1] in the role argv[2]; prints a JSON report. "first" meets the damage
# (a read of every message); "restart" is the next start of the gateway: it tries writes of
# every kind (a refused one reports where its transcript was spooled) and reads; "cleared"
# comes after the quarantine was lifted.
_LIFE_CHILD = r"""
import json, sys
from hermes_state import SessionDB, StateDbCorruptError
path, role = sys.argv[1], sys.argv[2]
report = {}

def refused(write):
    try:
        write()
    except StateDbCorruptError as exc:
        return {"spooled_to": None if exc.spooled_to is None else str(exc.spooled_to)}
    return None

db = SessionDB(path)
report["born_quarantined"] = db.quarantined
if role == "first":
    report["met"] = refused(lambda: db.get_messages("s")) is not None
elif role == "restart":
    report["set_meta"] = refused(lambda: db.set_meta("k", "v"))
    report["create_session"] = refused(lambda: db.create_session("t", "cli"))
    report["append"] = refused(lambda: db.append_message("s", "user", "after the restart"))
    report["checkpoint"] = refused(db.checkpoint)
    report["sessions"] = db.session_count()
    report["message_count"] = db.get_session("s")["message_count"]
else:
    report["appended"] = db.append_message("s", "user", "after the clearing")
db.close()
print(json.dumps(report), flush=True)
"""


def live(interpreter: Interpreter, db_path: Path, role: str) -> dict[str, Any]:
    done = subprocess.run(
        [*interpreter.argv, "-c", _LIFE_CHILD, str(db_path), role],
        env=subprocess_env(interpreter.env), capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_restarted_process_never_writes_into_a_quarantined_file(
    db_path: Path, hermes_home: Path, interpreter: Interpreter, seed: int
) -> None:
    make_store(db_path)
    leave_committed_wal(db_path)
    rng = random.Random(seed)
    leaf = rng.choice(table_pages(db_path, "messages", "leaf"))
    original = db_path.read_bytes()[(leaf - 1) * PAGE : leaf * PAGE]
    overwrite(db_path, (leaf - 1) * PAGE, rng.randbytes(PAGE))
    damaged = file_state(db_path)
    assert damaged["state.db-wal"] is not None

    first = live(interpreter, db_path, "first")
    assert first == {"born_quarantined": False, "met": True}
    marker = marker_of(db_path)
    assert marker is not None and marker["inode"] == db_path.stat().st_ino
    assert file_state(db_path) == damaged

    restart = live(interpreter, db_path, "restart")  # the next start of the gateway
    spool = str(hermes_home / "sessions" / "s.jsonl")
    assert restart == {
        "born_quarantined": True,
        "set_meta": {"spooled_to": None},
        "create_session": {"spooled_to": None},
        "append": {"spooled_to": spool},
        "checkpoint": {"spooled_to": None},
        "sessions": 1,
        "message_count": 300,
    }
    assert file_state(db_path) == damaged  # nothing written, the -wal not checkpointed
    assert marker_of(db_path) == marker  # the first quarantine's evidence is kept
    assert [json.loads(line)["content"] for line in Path(spool).read_text().splitlines()] == [
        "after the restart"]

    doctor = cli(hermes_home, "--db", str(db_path), "--json", "doctor")
    assert doctor.returncode == 1
    report = json.loads(doctor.stdout)
    assert report["quarantine"]["inode"] == marker["inode"]
    assert any(p.startswith("quarantined since ") for p in report["problems"])
    assert any("--clear-quarantine" in step for step in report["next"])
    text = cli(hermes_home, "--db", str(db_path), "doctor")
    assert "quarantine: since " in text.stdout and "! quarantined since" in text.stdout

    still_damaged = cli(hermes_home, "--db", str(db_path), "doctor", "--clear-quarantine")
    assert still_damaged.returncode == 1 and "integrity_check" in still_damaged.stderr
    assert marker_of(db_path) == marker and file_state(db_path) == damaged

    overwrite(db_path, (leaf - 1) * PAGE, original)  # mended in place, as a restore does
    with process_holding(db_path):
        in_use = cli(hermes_home, "--db", str(db_path), "doctor", "--clear-quarantine")
    assert in_use.returncode == 1 and "in use" in in_use.stderr
    assert marker_of(db_path) == marker
    cleared = cli(hermes_home, "--db", str(db_path), "--json", "doctor", "--clear-quarantine")
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(cleared.stdout)["cleared"]["inode"] == marker["inode"]
    assert marker_of(db_path) is None

    after = live(interpreter, db_path, "cleared")
    assert after["born_quarantined"] is False and after["appended"] > 300


def test_a_marker_for_another_file_is_ignored_and_removed(db_path: Path) -> None:
    make_store(db_path, messages=5)
    assert quarantine.write_marker(db_path, "damaged") is not None
    replacement = db_path.with_name("recovered.db")
    shutil.copyfile(db_path, replacement)
    os.replace(replacement, db_path)  # a recovered copy moved into place: a new inode
    assert quarantine.read_marker(db_path) is None
    with SessionDB(db_path) as db:
        assert not db.quarantined
        db.append_message("s", "user", "into the new file")
    assert not quarantine.marker_path(db_path).exists()


def test_a_marker_that_cannot_be_read_still_quarantines(db_path: Path) -> None:
    make_store(db_path, messages=5)
    leave_committed_wal(db_path)
    quarantine.marker_path(db_path).write_text("{ not json")
    before = file_state(db_path)
    with SessionDB(db_path) as db:
        assert db.quarantined
        with pytest.raises(StateDbCorruptError) as refused:
            db.append_message("s", "user", "kept on disk")
        assert refused.value.spooled_to is not None
        assert "cannot be read" in str(refused.value.__cause__)
    assert file_state(db_path) == before
    assert quarantine.marker_path(db_path).read_text() == "{ not json"


def test_a_read_only_open_of_a_marked_file_reads_as_before(db_path: Path) -> None:
    make_store(db_path, messages=5)
    quarantine.write_marker(db_path, "damaged")
    with SessionDB(db_path, read_only=True) as reader:
        assert reader.get_session("s")["message_count"] == 5
        assert len(reader.search_messages("quokka")) == 5
    assert quarantine.read_marker(db_path) is not None


def test_clearing_a_store_that_is_not_quarantined_says_so(
    db_path: Path, hermes_home: Path
) -> None:
    make_store(db_path, messages=5)
    done = cli(hermes_home, "--db", str(db_path), "doctor", "--clear-quarantine")
    assert done.returncode == 0 and "is not quarantined" in done.stdout
    assert json.loads(cli(hermes_home, "--db", str(db_path), "--json", "doctor").stdout)[
        "quarantine"] is None


# ---------------------------------------------------------------------------------------------
# cell_size_check: random bytes in leaf cells are met before anything is written
# ---------------------------------------------------------------------------------------------


def scramble_cells(db_path: Path, pages: list[int], seed: int) -> None:
    """Random bytes over the cell content area of each page of the closed file: the page
    header and its cell pointers are left as they were, so the page still looks well formed."""
    rng = random.Random(seed)
    with open(db_path, "r+b") as f:
        for page in pages:
            f.seek((page - 1) * PAGE)
            head = f.read(8)
            content_start = struct.unpack(">H", head[5:7])[0] or 65536
            assert 8 < content_start < PAGE
            f.seek((page - 1) * PAGE + content_start)
            f.write(rng.randbytes(PAGE - content_start))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_bytes_in_leaf_cells_quarantine_the_first_append(
    db_path: Path, interpreter: Interpreter, seed: int
) -> None:
    make_store(db_path)
    leave_committed_wal(db_path)
    scramble_cells(db_path, table_pages(db_path, "messages", "leaf"), seed)
    before = file_state(db_path)
    report, at_first_refusal, at_exit = run_child(interpreter, db_path, "closed")
    assert report["first"] & 0xFF == SQLITE_CORRUPT
    assert report["second"] == SQLITE_CORRUPT
    assert before == at_first_refusal == at_exit
    marker = marker_of(db_path)
    assert marker is not None and marker["inode"] == db_path.stat().st_ino


@pytest.mark.parametrize("seed", [0, 2, 4])
@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
def test_a_search_over_random_bytes_in_leaf_cells_fails_instead_of_finding_nothing(
    db_path: Path, seed: int, read_only: bool
) -> None:
    """The search index is whole, so FTS5 finds the rows. Read without the cell size check,
    leaves of a row or two of random bytes pass no filter under these seeds: the search would
    answer with no hits and no error, as if the messages had never been written."""
    make_store(db_path, width=2000)
    scramble_cells(db_path, table_pages(db_path, "messages", "leaf"), seed)
    with SessionDB(db_path, read_only=read_only) as db:
        with pytest.raises(StateDbCorruptError) as met:
            db.search_messages("quokka")
        assert code(met.value) & 0xFF == SQLITE_CORRUPT
        assert db.quarantined
    marker = marker_of(db_path)
    assert marker is not None and marker["inode"] == db_path.stat().st_ino


# Every statement each connection the library opens runs, by connection: while active,
# sqlite3.connect is wrapped so that each new (real) connection reports to a trace callback.
Opened = list[tuple[str, list[str]]]


@contextlib.contextmanager
def tracing_connections(seen: Opened) -> Iterator[None]:
    connect = sqlite3.connect

    def traced(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(database, *args, **kwargs)
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        seen.append((str(database), statements))
        return conn

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqlite3, "connect", traced)
        yield


def test_every_connection_on_a_file_checks_cell_sizes_first(
    db_path: Path, hermes_home: Path
) -> None:
    damaged = hermes_home / "damaged" / "state.db"
    make_store(damaged, messages=50)
    damage_last_messages_leaf(damaged)
    opened: Opened = []
    with tracing_connections(opened):
        with SessionDB(db_path) as db:
            db.create_session("s", "cli")
            db.append_message("s", "user", "hello quokka")
            db.checkpoint()  # the helper connection, inside the WAL-reset range
            stream = "".join(db.iter_export_jsonl())  # the snapshot reader
        with SessionDB(db_path, read_only=True) as reader:
            reader.get_session("s")
        backup = maintenance.backup_state_db(db_path)
        maintenance.repair_state_db(db_path, check_only=True)
        in_transaction(db_path, fts.detach_index)  # a stale index, for the repair to work on
        maintenance.repair_state_db(db_path)
        maintenance.restore_state_db(backup, db_path)
        recover.recover_state_db(db_path, hermes_home / "recovered.db")
        with SessionDB(hermes_home / "imported.db") as other:
            other.import_jsonl(io.StringIO(stream))
        quarantine.write_marker(db_path, "a test")
        quarantine.clear_quarantine(db_path)
        with SessionDB(damaged) as victim:  # the quarantine opens the close guard
            with pytest.raises(StateDbCorruptError):
                victim.append_message("s", "user", "x")

    on_files = [(name, run) for name, run in opened if name != ":memory:"]
    assert len(on_files) > 15
    for name, statements in on_files:
        assert statements[:1] == [dbconn.CELL_SIZE_CHECK_SQL], name


def test_reading_quarantined_changes_nothing_and_the_handle_adopts_before_its_next_write(
    damaged: Path,
) -> None:
    bystander, trace = traced(damaged)
    db = SessionDB(damaged)
    with pytest.raises(StateDbCorruptError) as met:
        db.append_message("s", "user", "x")
    for _ in range(3):
        assert bystander.quarantined  # what the process knows of the file, read
    assert trace.take() == [], "reading the property took nothing on"
    with pytest.raises(StateDbCorruptError) as refused:
        bystander.set_meta("k", "v")
    assert trace.take() == [], "refused before any statement"
    assert refused.value.__cause__ is met.value.__cause__, "the error that proved the damage"
    before = file_state(damaged)
    bystander.close()
    db.close()
    assert file_state(damaged) == before, "no checkpoint at close either"
