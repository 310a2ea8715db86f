"""Workspace metadata: the working-directory stamp (an activity write that is skipped, not
raised, when another process holds the lock), repository-root backfill, the distinct
directories, and ``workspace_key``."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hermes_state
from hermes_state import InvalidInputError, SessionDB, StateDbClosedError, workspace_key


def workspace(db: SessionDB, session_id: str) -> tuple[str | None, str | None, str | None]:
    row = db.get_session(session_id)
    return row["cwd"], row["git_branch"], row["git_repo_root"]


# --- update_session_cwd ----------------------------------------------------------------------


def test_the_directory_is_set_and_git_values_only_when_found(db: SessionDB) -> None:
    db.create_session("s1", "tui")
    assert db.update_session_cwd("s1", "/w/repo", "main", "/w/repo") is None
    assert workspace(db, "s1") == ("/w/repo", "main", "/w/repo")
    db.update_session_cwd("s1", "/w/repo/sub")  # a probe that found nothing erases nothing
    assert workspace(db, "s1") == ("/w/repo/sub", "main", "/w/repo")
    db.update_session_cwd("s1", "/tmp", git_branch="  ", git_repo_root="")
    assert workspace(db, "s1") == ("/tmp", "main", "/w/repo")
    db.update_session_cwd("s1", "/w/other", git_branch=" feature/x \n", git_repo_root=" /w/other ")
    assert workspace(db, "s1") == ("/w/other", "feature/x", "/w/other")


@pytest.mark.parametrize(("session_id", "cwd"), [("", "/w"), ("s1", ""), (None, "/w"),
                                                 ("s1", None), ("ghost", "/w")])
def test_an_empty_id_or_directory_or_an_unknown_id_changes_nothing(
    db: SessionDB, session_id: str | None, cwd: str | None
) -> None:
    db.create_session("s1", "tui", cwd="/before")
    db.update_session_cwd(session_id, cwd, "main")
    assert workspace(db, "s1") == ("/before", None, None)
    assert db.get_session("ghost") is None


def test_a_closed_handle_refuses_the_stamp(db_path: Path) -> None:
    db = SessionDB(db_path)
    db.close()
    with pytest.raises(StateDbClosedError):
        db.update_session_cwd("s1", "/w")


def test_the_stamp_is_skipped_not_raised_while_another_process_holds_the_lock(
    db: SessionDB, hold_write_lock, hermes_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db.create_session("s1", "tui", cwd="/before")
    with hold_write_lock(db.path), caplog.at_level(logging.WARNING, "hermes_state"):
        started = time.monotonic()
        assert db.update_session_cwd("s1", "/after", "main") is None
        waited = time.monotonic() - started
        assert workspace(db, "s1") == ("/before", None, None)
    # The activity patience (0.5 s) outlasted by SQLite's own 1 s busy wait, never the 20 s of
    # an ordinary write.
    assert 0.4 < waited < 5.0
    assert "update_session_cwd" in caplog.text and "skipped" in caplog.text
    assert "database is locked" in (hermes_home / "logs" / "errors.log").read_text()
    db.update_session_cwd("s1", "/after", "main")  # the next observation stamps again
    assert workspace(db, "s1") == ("/after", "main", None)


# --- backfill_repo_roots ---------------------------------------------------------------------


def test_backfill_fills_only_missing_roots_of_exactly_that_directory(db: SessionDB) -> None:
    db.create_session("none", "tui", cwd="/w/a")
    db.create_session("blank", "tui", cwd="/w/a", git_repo_root="")
    db.create_session("set", "tui", cwd="/w/a", git_repo_root="/elsewhere")
    db.create_session("sub", "tui", cwd="/w/a/sub")
    db.create_session("b", "tui", cwd="/w/b")
    db.backfill_repo_roots({"/w/a": "/w/a", "/w/b": "", "": "/x", "/w/c": "/w/c"})
    roots = {sid: db.get_session(sid)["git_repo_root"]
             for sid in ("none", "blank", "set", "sub", "b")}
    assert roots == {"none": "/w/a", "blank": "/w/a", "set": "/elsewhere", "sub": None,
                     "b": None}


def test_backfill_with_no_usable_pair_writes_nothing(db: SessionDB) -> None:
    db.create_session("s1", "tui", cwd="/w")
    watcher = sqlite3.connect(db.path)
    try:
        version = watcher.execute("PRAGMA data_version").fetchone()
        db.backfill_repo_roots({})
        db.backfill_repo_roots({"/w": ""})
        assert watcher.execute("PRAGMA data_version").fetchone() == version
    finally:
        watcher.close()


@pytest.mark.parametrize("pairs", [["/w"], "/w", {"/w": 3}, {7: "/w"}])
def test_backfill_refuses_what_is_not_a_mapping_of_directories(
    db: SessionDB, pairs: object
) -> None:
    with pytest.raises(InvalidInputError):
        db.backfill_repo_roots(pairs)


# --- distinct_session_cwds -------------------------------------------------------------------


def test_distinct_directories_count_every_session_and_skip_archived_ones(db: SessionDB) -> None:
    db.create_session("a1", "tui", cwd="/w/a", started_at=10.0)
    db.create_session("a2", "tui", cwd="/w/a", started_at=5.0, parent_session_id="a1")
    db.end_session("a2", "compression")
    db.create_session("b1", "cli", cwd="/w/b", started_at=1.0)
    db.create_session("blank", "cli", cwd="   ", started_at=1.0)
    db.create_session("none", "cli", started_at=1.0)
    db.create_session("arch", "cli", cwd="/w/c", started_at=2.0)
    db.set_session_archived("arch", True)
    ended = db.get_session("a2")["ended_at"]
    by_cwd = {r["cwd"]: r for r in db.distinct_session_cwds()}
    assert set(by_cwd) == {"/w/a", "/w/b"}
    assert by_cwd["/w/a"] == {"cwd": "/w/a", "sessions": 2, "last_active": ended}
    assert by_cwd["/w/b"] == {"cwd": "/w/b", "sessions": 1, "last_active": 1.0}
    with_archived = {r["cwd"]: r["sessions"] for r in db.distinct_session_cwds(True)}
    assert with_archived == {"/w/a": 2, "/w/b": 1, "/w/c": 1}
    assert all(isinstance(r["last_active"], float) for r in db.distinct_session_cwds(True))


# --- workspace_key ---------------------------------------------------------------------------


def test_workspace_key_prefers_the_repository_root_over_the_directory() -> None:
    assert "workspace_key" in hermes_state.__all__
    assert workspace_key({"git_repo_root": " /w/repo ", "cwd": "/w/repo/sub",
                          "git_branch": "main"}) == "/w/repo"
    assert workspace_key({"git_repo_root": "  ", "cwd": " /tmp "}) == "/tmp"
    assert workspace_key({"git_repo_root": None, "cwd": ""}) is None
    assert workspace_key({}) is None


@given(root=st.one_of(st.none(), st.text()), cwd=st.one_of(st.none(), st.text()),
       branch=st.one_of(st.none(), st.text()))
def test_workspace_key_of_any_row(root: str | None, cwd: str | None, branch: str | None) -> None:
    expected = (root or "").strip() or (cwd or "").strip() or None
    assert workspace_key({"git_repo_root": root, "cwd": cwd, "git_branch": branch}) == expected


def test_workspace_key_of_stored_rows(db: SessionDB) -> None:
    db.create_session("s1", "tui")
    db.update_session_cwd("s1", "/w/repo/sub", git_repo_root="/w/repo")
    db.create_session("s2", "tui", cwd="/tmp")
    assert [workspace_key(db.get_session(s)) for s in ("s1", "s2")] == ["/w/repo", "/tmp"]
