"""Shared fixtures: every test runs with HERMES_HOME pointing at its own temporary directory,
so nothing here can reach a real home even by accident."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hermes_state import SessionDB


@pytest.fixture(autouse=True)
def hermes_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hermes-home"
    home.mkdir()
    monkeypatch.setenv("HERMES_HOME", str(home))
    return home


@pytest.fixture
def db_path(hermes_home: Path) -> Path:
    return hermes_home / "state.db"


@pytest.fixture
def db(db_path: Path) -> Iterator[SessionDB]:
    handle = SessionDB(db_path)
    try:
        yield handle
    finally:
        handle.close()


def _damage_messages_table(db_path: Path) -> None:
    """Overwrite the root page of a closed store's ``messages`` b-tree: real corruption of a
    canonical table (not of a search index), met by the next write that touches messages."""
    raw = sqlite3.connect(db_path)
    try:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = raw.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'")
        root = page.fetchone()[0]
        size = raw.execute("PRAGMA page_size").fetchone()[0]
    finally:
        raw.close()
    with open(db_path, "r+b") as f:
        f.seek((root - 1) * size)
        f.write(b"\xff" * size)


@pytest.fixture
def damage_messages_table() -> Callable[[Path], None]:
    return _damage_messages_table
