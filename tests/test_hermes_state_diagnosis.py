"""Diagnosis that fits the case, through the command line in subprocesses and the public API.

A file that is not SQLite, another application's database, a missing snapshot, an ambiguous
id prefix, a main file truncated beside its ``-wal``, a repair of damaged rows: each is named
for what it is, the advice never assumes a gateway, and ``doctor --json`` prints exactly one
JSON document whatever it meets.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import file_state, overwrite, table_pages

from hermes_state import SessionDB, StateDbUnavailableError

PAGE = 4096


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HERMES_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "hermes_state_cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def llm_logs_db(path: Path) -> Path:
    """A database of another application (the tables of ``llm``'s ``logs.db``)."""
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE conversations (id TEXT PRIMARY KEY, name TEXT, model TEXT);
        CREATE TABLE responses (id TEXT PRIMARY KEY, model TEXT, prompt TEXT, response TEXT);
        INSERT INTO conversations VALUES ('01j', 'hello', 'gpt-4o-mini');
    """)
    conn.commit()
    conn.close()
    return path


def truncated_store(db_path: Path) -> None:
    """A store whose main file was emptied while its -wal still holds committed frames."""
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("INSERT INTO state_meta (key, value) VALUES ('k', 'in the wal only')")
    conn.commit()
    wal = db_path.with_name(db_path.name + "-wal").read_bytes()
    conn.close()  # the last close checkpoints and removes the -wal: put it back
    db_path.write_bytes(b"")
    db_path.with_name(db_path.name + "-wal").write_bytes(wal)


def test_a_file_that_is_not_sqlite_is_named_so(hermes_home: Path, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping list: milk, eggs\n" * 20)
    result = cli(hermes_home, "--db", str(notes), "sessions", "list")
    assert result.returncode == 1
    assert "is not an SQLite file" in result.stderr
    assert "gateway" not in result.stderr
    assert notes.read_text().startswith("shopping list")


def test_another_applications_database_is_not_a_store_and_is_left_alone(
    hermes_home: Path, tmp_path: Path
) -> None:
    logs = llm_logs_db(tmp_path / "logs.db")
    before = file_state(logs)
    with pytest.raises(StateDbUnavailableError) as caught:
        SessionDB(logs, read_only=True)
    assert caught.value.reason == "foreign"
    result = cli(hermes_home, "--db", str(logs), "sessions", "list")
    assert result.returncode == 1
    assert "not a session store" in result.stderr and "another application" in result.stderr
    assert "gateway" not in result.stderr
    doctor = cli(hermes_home, "--db", str(logs), "doctor")
    assert doctor.returncode == 1 and "not a session store" in doctor.stdout
    assert file_state(logs) == before


def test_a_missing_snapshot_is_not_found(hermes_home: Path, db_path: Path) -> None:
    SessionDB(db_path).close()
    before = file_state(db_path)
    result = cli(hermes_home, "restore", str(hermes_home / "no-such-snapshot.db"))
    assert result.returncode == 1
    assert "snapshot not found" in result.stderr
    assert file_state(db_path) == before


def test_an_ambiguous_prefix_lists_what_it_matches(hermes_home: Path, db_path: Path) -> None:
    with SessionDB(db_path) as db:
        for n in range(3):
            db.create_session(f"2025070{n}_120000_ab", "cli", started_at=float(n))
        db.create_session("20250801_120000_cd", "cli")
        assert db.sessions_starting_with("2025070") == [
            "20250702_120000_ab", "20250701_120000_ab", "20250700_120000_ab"]
    result = cli(hermes_home, "sessions", "show", "2025070")
    assert result.returncode == 1
    assert "ambiguous: 3 sessions start with 2025070 — 20250702_120000_ab" in result.stderr
    assert "no session matches" not in result.stderr
    missing = cli(hermes_home, "sessions", "show", "1999")
    assert "no session matches" in missing.stderr


def test_a_main_file_truncated_beside_its_wal_is_truncated_not_uninitialised(
    hermes_home: Path, db_path: Path
) -> None:
    truncated_store(db_path)
    before = file_state(db_path)
    with pytest.raises(StateDbUnavailableError) as caught:
        SessionDB(db_path, read_only=True)
    assert caught.value.reason == "truncated"
    result = cli(hermes_home, "sessions", "list")
    assert result.returncode == 1
    assert "truncated" in result.stderr and "uninitiali" not in result.stderr
    doctor = cli(hermes_home, "doctor", "--json")
    report = json.loads(doctor.stdout)
    assert report["unavailable"] == "truncated"
    assert file_state(db_path) == before  # the -wal that holds the data is untouched


def test_repair_of_damaged_rows_says_the_record_is_damaged(
    hermes_home: Path, db_path: Path
) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        for n in range(200):
            db.append_message("s", "user", f"message {n} " + "x" * 200)
    leaf = table_pages(db_path, "messages", "leaf")[2]
    overwrite(db_path, (leaf - 1) * PAGE, b"\xff" * PAGE)
    result = cli(hermes_home, "sessions", "repair")
    assert result.returncode == 1
    assert "the record is damaged" in result.stdout and "run recover" in result.stdout
    assert "disk is full" not in result.stdout + result.stderr


@pytest.mark.parametrize("case", ["fresh", "not-sqlite", "foreign", "truncated", "damaged"])
def test_doctor_json_is_always_one_document(
    case: str, hermes_home: Path, db_path: Path
) -> None:
    hermes_home.mkdir(parents=True, exist_ok=True)
    if case == "not-sqlite":
        db_path.write_bytes(b"\x00not a database\x00" * 100)
    elif case == "foreign":
        llm_logs_db(db_path)
    elif case == "truncated":
        truncated_store(db_path)
    elif case == "damaged":
        with SessionDB(db_path) as db:
            db.create_session("s", "cli")
            for n in range(200):
                db.append_message("s", "user", f"message {n} " + "x" * 200)
        overwrite(db_path, (table_pages(db_path, "messages", "leaf")[2] - 1) * PAGE,
                  b"\xff" * PAGE)
    result = cli(hermes_home, "doctor", "--json", "--full")
    report = json.loads(result.stdout)  # exactly one document: nothing before or after it
    assert isinstance(report, dict) and report["database"] == str(db_path)
    assert result.returncode == (0 if case == "fresh" else 1)
    assert bool(report["problems"]) == (case != "fresh")
    assert not any("gateway" in step for step in report["next"])


def test_advice_for_a_missing_store_assumes_no_gateway(hermes_home: Path) -> None:
    result = cli(hermes_home, "sessions", "list")
    assert result.returncode == 1
    assert "no session store" in result.stderr and "gateway" not in result.stderr


def test_doctor_says_the_check_findings_once_with_a_count(
    hermes_home: Path, db_path: Path
) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        for n in range(300):
            db.append_message("s", "user", f"message {n} " + "x" * 200)
    for leaf in table_pages(db_path, "messages", "leaf")[2:6]:
        overwrite(db_path, (leaf - 1) * PAGE + 3, b"\x00\x50")  # bad cell counts
    result = cli(hermes_home, "doctor", "--full")
    assert result.returncode == 1
    findings = [line for line in result.stdout.splitlines() if "free space corruption" in line]
    assert len(findings) == 1, result.stdout  # quick_check's, not integrity_check's again
    assert findings[0].startswith("! quick_check: ") and " problems, first: " in findings[0]
    assert findings[0].count("Page ") == 3
    assert "\n*** in database" not in result.stdout
