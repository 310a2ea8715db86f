"""A hot rollback journal, left by a restore or repair killed half-way through its promotion,
is diagnosed everywhere a store is only read, and the command that fixes it works.

SQLite rolls a hot journal back at the first read of a writable connection. A read-only
connection may not, and fails with SQLITE_READONLY_ROLLBACK: read-only opens, ``doctor``,
browsing and ``repair --check-only`` turn that into ``StateDbUnavailableError`` with reason
``hot_journal`` (the command line adds what to run), and change nothing on disk.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hermes_state import (
    SessionDB,
    StateDbUnavailableError,
    backup_state_db,
    repair_state_db,
)
from state_helpers import (
    CLI_CODE,
    detach_index_by_hand,
    every_message,
    fill_store,
    has_hot_journal,
    kill_while_promoting,
    sha256,
)

SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("big") / "state.db"
    fill_store(path, 3000, 12000)  # ~40 MB: the promotion takes several reported steps
    return path.read_bytes()


@pytest.fixture
def interrupted(
    db_path: Path, template: bytes, spawn_python, tmp_path: Path
) -> Callable[[int], dict[str, Any]]:
    """``interrupted(seed)``: the store after a restore (odd seeds) or a repair (even seeds)
    was killed during its promotion; returns the path, what it held before and its files."""

    def make(seed: int) -> dict[str, Any]:
        db_path.write_bytes(template)
        os.chmod(db_path, 0o600)
        if seed % 2:
            args = ["restore", str(backup_state_db(db_path, tmp_path / "snapshot.db"))]
            with SessionDB(db_path) as db:
                db.append_message("w", "user", "only in the live store")
        else:
            detach_index_by_hand(db_path)
            args = ["sessions", "repair"]
        before = every_message(db_path)
        proc = spawn_python(CLI_CODE, "--db", str(db_path), *args)
        kill_while_promoting(proc, nth=1 + seed % 2)
        assert has_hot_journal(db_path)
        files = {p.name: sha256(p) for p in sorted(db_path.parent.glob("state.db*"))}
        return {"path": db_path, "before": before, "files": files, "killed": args[0]}

    return make


def files_of(path: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in sorted(path.parent.glob("state.db*"))}


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_read_only_access_reports_a_hot_journal_typed_and_changes_nothing(
    interrupted, seed: int
) -> None:
    store = interrupted(seed)
    path = store["path"]
    for attempt in (
        lambda: SessionDB(path, read_only=True),
        lambda: repair_state_db(path, check_only=True),
        lambda: backup_state_db(path),
    ):
        with pytest.raises(StateDbUnavailableError) as caught:
            attempt()
        assert caught.value.reason == "hot_journal"
        assert caught.value.http_status == 503
        assert caught.value.path == path
        assert "hot rollback journal" in str(caught.value)
        assert caught.value.__cause__.sqlite_errorcode == 776  # SQLITE_READONLY_ROLLBACK
    assert files_of(path) == store["files"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_the_command_line_diagnoses_a_hot_journal_and_names_the_fix(
    interrupted, run_python, seed: int
) -> None:
    store = interrupted(seed)
    path = store["path"]
    fix = f"hermes-state --db {path} sessions repair"

    doctor = run_python(CLI_CODE, "--db", str(path), "doctor", "--json")
    assert doctor.returncode == 1
    report = json.loads(doctor.stdout)  # one JSON document, nothing else
    assert report["unavailable"] == "hot_journal"
    assert any("hot rollback journal" in p for p in report["problems"])
    assert any(fix in step for step in report["next"])
    assert "state.db-journal" in report["files"]

    for args in (["sessions", "list"], ["sessions", "repair", "--check-only"],
                 ["sessions", "stats"], ["backup"]):
        done = run_python(CLI_CODE, "--db", str(path), *args)
        assert done.returncode == 1, args
        assert "Traceback" not in done.stderr and "OperationalError" not in done.stderr
        assert "hot rollback journal" in done.stderr, (args, done.stderr)
        assert f"next: `{fix}`" in done.stderr, (args, done.stderr)
    assert files_of(path) == store["files"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_the_named_fix_rolls_the_interrupted_write_back_and_the_store_is_whole(
    interrupted, run_python, seed: int
) -> None:
    store = interrupted(seed)
    path = store["path"]
    fixed = run_python(CLI_CODE, "--db", str(path), "sessions", "repair", timeout=120)
    assert fixed.returncode == 0, fixed.stderr
    assert "rolled back an interrupted write" in fixed.stdout
    assert not has_hot_journal(path)
    # The rolled-back store is the one before the killed promotion, row for row; a killed
    # repair's store still needed its repair, and got it.
    assert every_message(path) == store["before"]
    if store["killed"] == "restore":
        assert "healthy: nothing to repair" in fixed.stdout
    else:
        assert "repaired and promoted" in fixed.stdout
    assert repair_state_db(path, check_only=True)["healthy"]
    listed = run_python(CLI_CODE, "--db", str(path), "sessions", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {row["id"] for row in json.loads(listed.stdout)} == {"w", "bulk"}
    doctor = run_python(CLI_CODE, "--db", str(path), "doctor", "--json")
    assert doctor.returncode == 0, doctor.stdout
    assert "state.db-journal" not in json.loads(doctor.stdout)["files"]
