"""A store its owner write-protected stays protected: opening it for writing is refused with
StateDbReadOnlyError and nothing changes; tightening modes only ever takes permissions away.

The processes that write run as the file's owner would: as an ordinary user, or — when the
tests run as root, who may write anything — as root without the capabilities that override
file permissions (``setpriv``), so a mode without the write bit really refuses the write."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import file_state, leave_committed_wal, subprocess_env
from state_helpers import Connections
from hermes_state import SessionDB
from hermes_state_errors import StateDbReadOnlyError

REPO_ROOT = Path(__file__).resolve().parent.parent
_NO_OVERRIDE = "-dac_override,-dac_read_search"


def as_owner(argv: list[str]) -> list[str]:
    """``argv`` run with the file permissions an owner has and no more."""
    if os.geteuid() != 0:
        return argv
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: file modes cannot refuse a write")
    return ["setpriv", f"--bounding-set={_NO_OVERRIDE}", f"--inh-caps={_NO_OVERRIDE}", *argv]


def run_as_owner(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(as_owner([sys.executable, *argv]), env=subprocess_env(),
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)


def modes(db_path: Path) -> dict[str, int | None]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) if p.exists() else None
            for p in (db_path, db_path.with_name(db_path.name + "-wal"),
                      db_path.with_name(db_path.name + "-shm"))}


def a_store(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "before the chmod")
        db.create_session("s0", "cli", started_at=0)
        db.end_session("s0", "user_exit")


APPEND = """
import sys
from hermes_state import SessionDB
from hermes_state_errors import StateDbReadOnlyError
try:
    with SessionDB(sys.argv[1]) as db:
        db.append_message("s1", "user", "after the chmod")
except StateDbReadOnlyError as exc:
    print("refused", exc.path)
else:
    print("written")
"""


@pytest.mark.parametrize("mode", [0o444, 0o400, 0o555])
def test_a_write_to_a_write_protected_store_is_refused_and_changes_nothing(
    db_path: Path, mode: int
) -> None:
    a_store(db_path)
    db_path.chmod(mode)
    before_modes, before_bytes = modes(db_path), file_state(db_path)

    result = run_as_owner("-c", APPEND, str(db_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["refused", str(db_path)]
    assert modes(db_path) == before_modes  # no permission given back, none taken
    assert file_state(db_path) == before_bytes
    with SessionDB(db_path, read_only=True) as db:  # browsing still works
        assert [m["content"] for m in db.get_messages("s1")] == ["before the chmod"]


@pytest.mark.parametrize(("before", "after"), [
    (0o644, 0o600), (0o640, 0o600), (0o604, 0o600), (0o666, 0o600), (0o600, 0o600),
    (0o700, 0o700), (0o755, 0o700),
])
def test_a_writable_open_takes_group_and_other_bits_away_and_never_adds_one(
    db_path: Path, before: int, after: int
) -> None:
    a_store(db_path)
    db_path.chmod(before)
    result = run_as_owner("-c", APPEND, str(db_path))
    assert result.stdout.split() == ["written"], result.stderr
    assert stat.S_IMODE(db_path.stat().st_mode) == after


def test_a_write_protected_wal_refuses_the_open_and_is_left_as_it_was(db_path: Path) -> None:
    a_store(db_path)
    leave_committed_wal(db_path)
    wal = db_path.with_name("state.db-wal")
    wal.chmod(0o444)
    before = file_state(db_path)
    with pytest.raises(StateDbReadOnlyError, match="write-protected") as caught:
        SessionDB(db_path)
    assert caught.value.path == wal
    assert file_state(db_path) == before and stat.S_IMODE(wal.stat().st_mode) == 0o444


def test_the_command_line_refuses_to_delete_from_a_write_protected_store(
    db_path: Path, hermes_home: Path
) -> None:
    a_store(db_path)
    db_path.chmod(0o444)
    before = file_state(db_path)
    args = ["-m", "hermes_state_cli", "--db", str(db_path)]
    commands = (["delete", "s1", "--yes"], ["delete", "s1"], ["prune", "-y"], ["prune"])
    for command in commands:
        refused = run_as_owner(*args, "sessions", *command)  # said before any question
        assert refused.returncode == 1, (command, refused.stderr)
        assert "write-protected" in refused.stderr and "Traceback" not in refused.stderr
    # The listing's read-only open may leave an empty -wal (SQLite's own); no byte is written.
    assert file_state(db_path)["state.db"] == before["state.db"]
    wal = db_path.with_name("state.db-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    assert stat.S_IMODE(db_path.stat().st_mode) == 0o444
    listed = run_as_owner(*args, "sessions", "list", "--format", "jsonl")
    assert listed.returncode == 0, listed.stderr
    assert '"id": "s1"' in listed.stdout


def test_sqlite_refusing_a_write_is_a_typed_error(db_path: Path) -> None:
    a_store(db_path)
    connections = Connections()
    with SessionDB(db_path, on_connect=connections) as db:
        own = connections.own()
        own.execute("PRAGMA query_only = ON")  # SQLite answers SQLITE_READONLY
        with pytest.raises(StateDbReadOnlyError) as caught:
            db.append_message("s1", "user", "refused")
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        assert caught.value.__cause__.sqlite_errorcode & 0xFF == 8
        own.execute("PRAGMA query_only = OFF")
        assert [m["content"] for m in db.get_messages("s1")] == ["before the chmod"]
