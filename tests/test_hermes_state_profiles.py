"""Many profiles in one process: one shared store per profile home, explicit owners."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hermes_state import SessionDB, StateDbCorruptError, hermes_home_override


@pytest.fixture
def root(hermes_home: Path) -> Path:
    return hermes_home.resolve()


@pytest.fixture
def coder(root: Path) -> Path:
    home = root / "profiles" / "coder"
    home.mkdir(parents=True)
    return home


@pytest.fixture
def writer(root: Path) -> Path:
    home = root / "profiles" / "writer"
    home.mkdir(parents=True)
    return home


def test_a_corrupt_profile_store_spools_into_its_own_home_whatever_the_context(
    coder: Path, writer: Path, damage_messages_table: Callable[[Path], None]
) -> None:
    with SessionDB(writer / "state.db", rebuild_fts=False) as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "before the damage")
    damage_messages_table(writer / "state.db")

    with hermes_home_override(coder):
        with SessionDB(writer / "state.db", rebuild_fts=False) as db:
            assert db.profile_home == writer
            with pytest.raises(StateDbCorruptError) as caught:
                db.append_message("s1", "user", "kept on disk")
    assert caught.value.spooled_to == writer / "sessions" / "s1.jsonl"
    assert "kept on disk" in caught.value.spooled_to.read_text()
    assert not (coder / "sessions").exists()


def test_a_scratch_database_belongs_to_the_home_of_the_context_that_opened_it(
    coder: Path, tmp_path: Path
) -> None:
    with hermes_home_override(coder), SessionDB(tmp_path / "scratch.db") as db:
        assert db.profile_home == coder
