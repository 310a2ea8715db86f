"""What an operator meets in the first hour with the command line, run in subprocesses on real
stores: search output at 80 columns and in a pipe, search's output formats, ``doctor`` on a
damaged search index, advice that agrees with what the next command does, the disk a restore
and a replica leave behind, and the words and conventions every command shares (``--json``
errors, files named in errors, ``-n 0``, help without markup)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import file_state, subprocess_env
from state_helpers import as_json, columns

import hermes_state_cli
import hermes_state_cli_sessions
from hermes_state import SessionDB

REPO_ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "hermes_state_cli"]
# A match far into a long message, in Latin and in CJK text.
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
LONG_PREFIX = "The install fails with a long log: " + "lorem ipsum dolor sit amet " * 6


def cli(*args: str, env: dict[str, str | None] | None = None,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=subprocess_env(env or {}), input=stdin,
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


@pytest.fixture
def logs(db_path: Path) -> list[str]:
    """Sessions with dated ids whose messages hold their match far from the start."""
    ids = []
    with SessionDB(db_path) as db:
        for n in range(3):
            sid = f"20250101_12000{n}_abcdef"
            db.create_session(sid, "telegram")
            db.append_message(sid, "user", LONG_PREFIX + f"npm ERR! code ERESOLVE number {n} "
                              "unable to resolve the dependency tree " + "more words " * 10)
            db.append_message(sid, "assistant", "日本語のテキストです。" * 8 + "東京タワーへの行き方")
            ids.append(sid)
    return ids


# --- search ----------------------------------------------------------------------------------


@pytest.mark.parametrize("env", [{"COLUMNS": "80"}, {"COLUMNS": None}],
                         ids=["80 columns", "piped"])
def test_search_shows_the_match_at_80_columns_and_in_a_pipe(
    logs: list[str], env: dict[str, str | None]
) -> None:
    for query, mark in (("ERESOLVE", ">>>ERESOLVE<<<"), ("東京", ">>>東京<<<")):
        shown = cli("sessions", "search", query, env=env)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert all(columns(line) <= 80 for line in lines), lines
        snippets = [line for line in lines if mark in line]
        assert len(snippets) == 3, lines  # every hit shows its match, whole
        assert not any(line.rstrip().endswith(">>>...") for line in lines)


def test_search_has_the_output_formats_of_list(logs: list[str]) -> None:
    hits = as_json(cli("sessions", "search", "ERESOLVE", "--json"))
    assert len(hits) == 3
    assert as_json(cli("sessions", "search", "ERESOLVE", "--format", "json")) == hits
    jsonl = cli("sessions", "search", "ERESOLVE", "--format", "jsonl")
    assert [json.loads(line) for line in jsonl.stdout.splitlines()] == hits
    table = cli("sessions", "search", "ERESOLVE", "--format", "csv")
    parsed = list(csv.DictReader(io.StringIO(table.stdout)))
    assert list(parsed[0]) == list(hermes_state_cli_sessions.SEARCH_CSV_FIELDS)
    assert [(r["session_id"], r["snippet"]) for r in parsed] == [
        (h["session_id"], h["snippet"]) for h in hits]
    both = cli("sessions", "search", "x", "--json", "--format", "csv")
    assert both.returncode == 2 and "ask for different outputs" in both.stderr


def test_limit_0_means_all_of_them(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        for n in range(25):
            db.create_session(f"s{n:02}", "cli")
            db.append_message(f"s{n:02}", "user", f"kiwi {n}")
    assert len(as_json(cli("sessions", "list", "-n", "0", "--json"))) == 25
    assert len(as_json(cli("sessions", "list", "--json"))) == 20  # the default
    assert len(as_json(cli("sessions", "search", "kiwi", "-n", "0", "--json"))) == 25
    for command in ("list", "search"):
        assert "0 for all" in cli("sessions", command, "--help").stdout


# --- doctor ----------------------------------------------------------------------------------


def test_plain_doctor_finds_a_damaged_search_index(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        for n in range(300):
            db.append_message("s", "user", f"message {n} about docker and npm")
    raw = sqlite3.connect(db_path)  # the index's own blocks zeroed: quick_check passes
    raw.execute("UPDATE messages_fts_data SET block = zeroblob(length(block)) WHERE id > 10")
    raw.commit()
    raw.close()
    before = file_state(db_path)

    doctor = cli("doctor")
    assert doctor.returncode == 1, doctor.stdout
    assert "quick check: ok" in doctor.stdout
    assert "search index: damaged (messages_fts)" in doctor.stdout
    assert "sessions repair" in doctor.stdout
    report = json.loads(cli("doctor", "--json").stdout)
    assert report["fts_integrity"]["messages_fts"] is not None
    after = file_state(db_path)  # the check writes nothing (its open may make an empty -wal)
    assert after[db_path.name] == before[db_path.name]
    assert after[f"{db_path.name}-wal"] in (before[f"{db_path.name}-wal"], EMPTY_SHA256)
    full = cli("doctor", "--full")
    assert full.returncode == 1
    assert sum("messages_fts:" in line or "messages_fts damaged" in line
               for line in full.stdout.splitlines() if line.startswith("!")) == 1


# --- advice that agrees with what the next command does ---------------------------------------


def test_a_store_with_damaged_rows_is_advised_recover_and_a_failed_repair_leaves_nothing(
    db_path: Path, hermes_home: Path, damage_messages_table: Callable[[Path], None]
) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        for n in range(2000):
            db.append_message("s", "user", f"message {n} " + "x" * 200)
    damage_messages_table(db_path)

    check = cli("sessions", "repair", "--check-only")
    assert check.returncode == 1
    advice = [line for line in check.stdout.splitlines() if line.startswith("next:")]
    assert advice and all("sessions recover" in line for line in advice)
    assert not any("sessions repair" in line for line in advice)
    assert "damaged tables: messages" in check.stdout
    assert len(check.stdout.splitlines()) < 20  # a hundred findings are counted, not listed

    repair = cli("sessions", "repair")
    assert repair.returncode == 1
    assert "sessions recover" in repair.stdout
    left = {p.name for p in hermes_home.iterdir()}
    assert "state-snapshots" not in left and "state.db.lock" not in left, left


def test_restoring_a_file_that_is_not_a_store_gives_no_advice_about_the_store(
    db_path: Path, tmp_path: Path
) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
    before = file_state(db_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping list\n")
    restore = cli("restore", str(notes))
    assert restore.returncode == 1
    assert f"{notes} is not an SQLite file" in restore.stderr
    assert "recover" not in restore.stderr and "backup --list" in restore.stderr
    assert file_state(db_path) == before
    assert cli("doctor").returncode == 0


def test_recover_names_the_next_step_and_the_damaged_store_is_saved_marked(
    db_path: Path, tmp_path: Path, damage_messages_table: Callable[[Path], None]
) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        for n in range(300):
            db.append_message("s", "user", f"message {n} " + "x" * 200)
    damage_messages_table(db_path)
    out = tmp_path / "recovered.db"

    recover = cli("sessions", "recover", "--input", str(db_path), "--output", str(out),
                  "--defer-index")
    assert recover.returncode == 0, recover.stderr
    assert "rebuilt" not in recover.stdout and "--defer-index" in recover.stdout
    step = f"hermes-state --db {db_path} restore {out}"
    assert "next: " in recover.stdout and step in recover.stdout

    restore = cli(*step.split()[1:])
    assert restore.returncode == 0, restore.stderr
    assert "it was damaged" in restore.stdout
    snapshots = as_json(cli("backup", "--list", "--json"))["snapshots"]
    assert [s["damaged"] for s in snapshots] == [True]
    assert snapshots[0]["path"].endswith("-damaged.db")
    listed = cli("backup", "--list").stdout
    assert "damaged" in listed and "1 snapshot" in listed
    again = cli("restore", snapshots[0]["path"])  # a damaged copy is never put back
    assert again.returncode == 1 and "quick_check" in again.stderr


def test_recover_reads_input_and_keeps_the_old_source_spelling(
    db_path: Path, tmp_path: Path
) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
    helps = cli("sessions", "recover", "--help").stdout
    assert "--input" in helps and "--source" not in helps
    old = cli("sessions", "recover", "--source", str(db_path), "--inspect-only")
    assert old.returncode == 0, old.stderr
    assert "--source is now --input" in old.stderr
    assert f"--input {db_path}" in old.stdout
    gone = tmp_path / "gone.db"
    missing = cli("sessions", "recover", "--input", str(gone), "--inspect-only")
    assert missing.returncode == 1 and f"check the path {gone}" in missing.stderr
    assert "snapshot" not in missing.stderr and "Errno" not in missing.stderr


# --- disk ------------------------------------------------------------------------------------


def test_snapshots_are_listed_with_their_size_and_kept_by_a_retention_rule(
    db_path: Path, tmp_path: Path
) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
    first = tmp_path / "aside.db"  # not among the store's snapshots: never pruned
    assert cli("backup", "--output", str(first)).returncode == 0
    for _ in range(3):
        done = cli("restore", str(first), "--keep", "2")
        assert done.returncode == 0, done.stderr
    snapshots = as_json(cli("backup", "--list", "--json"))["snapshots"]
    assert len(snapshots) == 2 and all(s["size"] > 0 for s in snapshots)
    listed = cli("backup", "--list").stdout
    assert "SIZE" in listed and "2 snapshots" in listed and " in all" in listed

    kept = cli("restore", snapshots[0]["path"], "--json",
               env={"HERMES_STATE_KEEP_SNAPSHOTS": "1"})
    previous = as_json(kept)["previous_snapshot"]
    left = as_json(cli("backup", "--list", "--json"))["snapshots"]
    assert [s["path"] for s in left] == [previous]  # the one just saved is always kept
    pruned = cli("backup", "--prune", "--keep", "0")
    assert pruned.returncode == 0, pruned.stderr
    assert as_json(cli("backup", "--list", "--json"))["snapshots"] == []
    refused = cli("backup", "--prune")
    assert refused.returncode == 1 and "--keep" in refused.stderr


# --- words and conventions -------------------------------------------------------------------


def test_json_errors_are_a_json_object_on_stdout(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
    missing = cli("--json", "sessions", "show", "nosuch")
    assert missing.returncode == 1
    error = json.loads(missing.stdout)["error"]
    assert error["type"] == "HermesStateError" and "nosuch" in error["message"]
    assert error["exit_status"] == 1 and "nosuch" in missing.stderr
    usage = cli("sessions", "list", "--json", "--limit", "ten")
    assert usage.returncode == 2
    assert json.loads(usage.stdout)["error"]["type"] == "UsageError"
    refused = cli("sessions", "prune", "--json", "--older-than-days", "0")  # nothing to prune
    assert refused.returncode == 0 and json.loads(refused.stdout)["pruned"] == 0


def test_import_errors_name_the_file_and_line(db_path: Path, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("\n\nthis is not an export\n")
    bad = cli("sessions", "import", str(notes))
    assert bad.returncode == 1
    assert f"{notes}: not JSON at line 3, column 1" in bad.stderr
    assert "Expecting value" in bad.stderr and "(char" not in bad.stderr
    gone = cli("sessions", "import", str(tmp_path / "gone.json"))
    assert gone.returncode == 1
    assert f"no such file: {tmp_path / 'gone.json'}" in gone.stderr
    assert "Errno" not in gone.stderr
    assert not db_path.exists()


def test_the_prune_summary_echoes_what_was_typed(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        db.end_session("s", "user_exit")
    shown = cli("sessions", "prune", "--dry-run", "--started-before", "2025-01-15",
                "--max-messages", "21", "--title-like", "deploy")
    assert shown.returncode == 0, shown.stderr
    for given in ("started before 2025-01-15", "max messages 21", "title like 'deploy'"):
        assert given in shown.stdout, shown.stdout
    assert "21.0" not in shown.stdout and "1736" not in shown.stdout


def test_bare_commands_print_their_full_help() -> None:
    bare = cli()
    assert bare.returncode == 0 and bare.stderr == ""
    assert bare.stdout.startswith("usage: hermes-state")
    for command in ("sessions", "doctor", "backup", "restore", "replicate", "--json"):
        assert command in bare.stdout
    sessions = cli("sessions")
    assert sessions.returncode == 0
    assert all(action in sessions.stdout for action in ("list", "search", "recover"))


def _parsers(parser: Any) -> list[Any]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


def test_help_shows_no_restructured_text_markup() -> None:
    top = cli("--help")
    assert top.returncode == 0
    for parser in _parsers(hermes_state_cli.build_parser()):
        text = parser.format_help()
        for markup in ("``", ":func:", ":class:", ":data:"):
            assert markup not in text, (parser.prog, markup)
    assert "``" not in top.stdout


def test_untitled_sessions_and_unknown_costs_read_as_such(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        db.create_session("plain", "cli")
        db.append_message("plain", "user", "my private first words")
        db.create_session("billed", "cli")
        db.set_session_title("billed", "Billed")
        db.update_token_counts("billed", 10, 5, actual_cost_usd=0.5)
    table = cli("sessions", "list", env={"COLUMNS": "120"}).stdout
    assert "(untitled)" in table and "my private first words" not in table
    plain = cli("sessions", "show", "plain").stdout
    assert "cost: unknown\n" in plain and "unknown estimated" not in plain
    billed = cli("sessions", "show", "billed").stdout
    assert "cost: $0.50 actual" in billed and "estimated" not in billed
