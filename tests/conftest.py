"""Shared fixtures: every test runs with HERMES_HOME pointing at its own temporary directory,
so nothing here can reach a real home even by accident."""

from __future__ import annotations

from collections.abc import Iterator
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
