"""The operating system's refusals reach the caller typed and say why, and change nothing.

A really full disk (a small tmpfs, mounted where root may; skipped elsewhere) under backup and
recover; another user's store (a child that drops to ``nobody``, where root may); a home the
reader may not write, with no ``-shm`` yet. Read-only opens never leave a ``-wal`` or ``-shm``
with looser modes than the database.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import file_state

from hermes_state import (
    SessionDB,
    StateDbFullError,
    backup_state_db,
    recover_state_db,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534


def fill(db_path: Path, messages: int) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        for n in range(messages):
            db.append_message("s", "user", f"message {n} " + "x" * 1000)


@contextlib.contextmanager
def small_disk(where: Path, size_kb: int) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs",
                              str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize("size_kb", [64, 160, 400])
def test_a_backup_onto_a_full_disk_is_a_full_error_and_the_store_is_untouched(
    db_path: Path, tmp_path: Path, size_kb: int
) -> None:
    fill(db_path, 600)
    before = file_state(db_path)["state.db"]
    with small_disk(tmp_path / "disk", size_kb) as disk:
        with pytest.raises(StateDbFullError):
            backup_state_db(db_path, disk / "snapshot.db")
    assert file_state(db_path)["state.db"] == before  # a reader's empty -wal aside


@pytest.mark.parametrize("size_kb", [64, 160, 400])
def test_a_recover_onto_a_full_disk_is_a_full_error_and_the_source_is_untouched(
    db_path: Path, tmp_path: Path, size_kb: int
) -> None:
    fill(db_path, 600)
    before = file_state(db_path)
    with small_disk(tmp_path / "disk", size_kb) as disk:
        with pytest.raises(StateDbFullError):
            recover_state_db(db_path, disk / "recovered.db")
    assert file_state(db_path) == before


def test_the_command_line_says_the_disk_is_full(db_path: Path, tmp_path: Path,
                                                hermes_home: Path) -> None:
    fill(db_path, 600)
    with small_disk(tmp_path / "disk", 64) as disk:
        result = subprocess.run(
            [sys.executable, "-m", "hermes_state_cli", "backup", "-o", str(disk / "s.db")],
            env={**os.environ, "HERMES_HOME": str(hermes_home)}, capture_output=True,
            text=True, timeout=120, cwd=REPO_ROOT)
    assert result.returncode == 1
    assert "no space left" in result.stderr and "Traceback" not in result.stderr


# --- another user, a home the reader may not write --------------------------------------------

# Run as ``nobody``: imports first (the interpreter's own files may be root's), then drop the
# ids and call what argv names on the store argv[1]; prints one JSON line per call.
_AS_NOBODY = textwrap.dedent(
    """
    import json, os, sys
    import hermes_state, hermes_state_cli
    from hermes_state import SessionDB, backup_state_db
    os.setgid(65534); os.setuid(65534)
    path = sys.argv[1]

    def attempt(name, call):
        try:
            value = call()
            print(json.dumps({"call": name, "ok": True, "value": value}), flush=True)
        except Exception as exc:
            print(json.dumps({"call": name, "ok": False, "type": type(exc).__name__,
                              "reason": getattr(exc, "reason", None),
                              "message": str(exc)}), flush=True)

    def browse():
        with SessionDB(path, read_only=True) as db:
            return [m["content"] for m in db.get_messages("s")]

    attempt("read", browse)
    attempt("write", lambda: SessionDB(path).close())
    attempt("backup", lambda: str(backup_state_db(path, path + ".copy")))
    attempt("cli", lambda: hermes_state_cli.main(["--db", path, "sessions", "list"]))
    """
)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory other users may enter (pytest's own are private to root)."""
    if os.geteuid() != 0:
        pytest.skip("only root can run a child as another user")
    with tempfile.TemporaryDirectory(prefix="hermes-other-user-") as tmp:
        os.chmod(tmp, 0o755)
        yield Path(tmp)


def as_nobody(db_path: Path) -> dict[str, dict[str, object]]:
    result = subprocess.run(
        [sys.executable, "-c", _AS_NOBODY, str(db_path)], capture_output=True, text=True,
        timeout=60, cwd=REPO_ROOT,
        env={**os.environ, "HERMES_HOME": str(db_path.parent),
             "PYTHONPATH": str(REPO_ROOT)},
    )
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, result.stderr
    return {line["call"]: line for line in lines}


def test_another_users_store_is_refused_typed_and_says_so(shared_dir: Path) -> None:
    home = shared_dir / "home"
    home.mkdir(mode=0o755)
    db_path = home / "state.db"
    fill(db_path, 3)
    os.chmod(db_path, 0o600)
    before = file_state(db_path)
    seen = as_nobody(db_path)
    assert seen["read"]["type"] == "StateDbCannotOpenError"
    assert "no permission to read" in str(seen["read"]["message"])
    assert seen["write"]["type"] == "StateDbReadOnlyError"
    assert "owned by uid 0" in str(seen["write"]["message"])
    assert seen["backup"]["type"] == "StateDbCannotOpenError"
    assert seen["cli"] == {"call": "cli", "ok": True, "value": 1}
    assert file_state(db_path) == before
    assert sorted(p.name for p in home.iterdir()) == ["state.db"]


def test_a_read_only_home_without_a_shm_says_why_it_cannot_be_browsed(
    shared_dir: Path,
) -> None:
    home = shared_dir / "home"
    home.mkdir(mode=0o755)
    db_path = home / "state.db"
    fill(db_path, 3)
    os.chmod(db_path, 0o644)
    assert not db_path.with_name("state.db-shm").exists()
    before = file_state(db_path)
    seen = as_nobody(db_path)
    assert seen["read"]["type"] == "StateDbUnavailableError"
    assert seen["read"]["reason"] == "read_only_directory"
    assert "-shm" in str(seen["read"]["message"])
    assert seen["write"]["type"] == "StateDbReadOnlyError"
    assert file_state(db_path) == before


def test_a_read_only_home_with_a_shm_is_browsed(shared_dir: Path) -> None:
    home = shared_dir / "home"
    home.mkdir(mode=0o755)
    db_path = home / "state.db"
    fill(db_path, 3)
    keeper = SessionDB(db_path)  # holds the -wal and -shm open, as a running writer does
    try:
        for path in home.iterdir():
            os.chmod(path, 0o644)
        seen = as_nobody(db_path)
    finally:
        keeper.close()
    assert seen["read"] == {"call": "read", "ok": True,
                            "value": ["message 0 " + "x" * 1000, "message 1 " + "x" * 1000,
                                      "message 2 " + "x" * 1000]}


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644])
def test_read_only_opens_leave_no_sidecar_looser_than_the_database(
    db_path: Path, mode: int
) -> None:
    fill(db_path, 3)
    os.chmod(db_path, mode)
    for name in ("state.db-wal", "state.db-shm"):
        assert not db_path.with_name(name).exists()
    with SessionDB(db_path, read_only=True) as db:
        assert len(db.get_messages("s")) == 3
        for name in ("state.db-wal", "state.db-shm"):
            sidecar = db_path.with_name(name)
            if sidecar.exists():
                assert stat.S_IMODE(sidecar.stat().st_mode) & ~mode == 0, name
    for name in ("state.db-wal", "state.db-shm"):
        sidecar = db_path.with_name(name)
        if sidecar.exists():
            assert stat.S_IMODE(sidecar.stat().st_mode) & ~mode == 0, name
