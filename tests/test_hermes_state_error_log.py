"""The error log never writes through a symlink: ``<home>/logs`` or ``<home>/logs/errors.log``
planted as a link out of the home is refused, as the database, sidecar and spool paths are,
and the operation that logs goes on (the log write never raises)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import leave_committed_wal, overwrite, table_pages

from hermes_state import SessionDB, StateDbCorruptError

PAGE = 4096


def damaged_store(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        for n in range(200):
            db.append_message("s", "user", f"message {n} " + "x" * 200)
    leave_committed_wal(db_path)
    leaf = table_pages(db_path, "messages", "leaf")[-1]
    overwrite(db_path, (leaf - 1) * PAGE, b"\xff" * PAGE)


def plant(layout: str, home: Path, outside: Path) -> Path:
    """Plant the link of ``layout``; returns the file outside the home a write would reach."""
    outside.mkdir()
    logs = home / "logs"
    if layout == "logs-dir":
        logs.symlink_to(outside, target_is_directory=True)
        return outside / "errors.log"
    logs.mkdir(mode=0o700)
    target = outside / "victim.txt"
    if layout == "log-file":
        target.write_text("precious\n")
    (logs / "errors.log").symlink_to(target)
    return target


@pytest.mark.parametrize("layout", ["logs-dir", "log-file", "dangling"])
def test_a_symlinked_error_log_is_never_written_through(
    layout: str, db_path: Path, hermes_home: Path, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    damaged_store(db_path)
    target = plant(layout, hermes_home, tmp_path / "outside")
    before = target.read_bytes() if target.exists() else None
    caplog.set_level(logging.WARNING, logger="hermes_state")

    db = SessionDB(db_path)
    with pytest.raises(StateDbCorruptError) as caught:
        db.append_message("s", "user", "the turn that met the damage")
    db.close()

    assert (target.read_bytes() if target.exists() else None) == before
    assert caught.value.spooled_to is not None  # the turn is kept all the same
    assert any("refusing a symlink as the error log" in r.getMessage() for r in caplog.records)


def test_the_error_log_is_written_where_nothing_is_planted(
    db_path: Path, hermes_home: Path
) -> None:
    damaged_store(db_path)
    db = SessionDB(db_path)
    with pytest.raises(StateDbCorruptError):
        db.append_message("s", "user", "x")
    db.close()
    log = hermes_home / "logs" / "errors.log"
    assert "database quarantined" in log.read_text()
    assert log.stat().st_mode & 0o777 == 0o600
