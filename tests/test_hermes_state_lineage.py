"""Lineage: ancestors and descendants over parent_session_id, and compression chains."""

from __future__ import annotations

import sqlite3

import pytest

from hermes_state import SessionDB


def ids(rows: list[dict]) -> list[str]:
    return [r["id"] for r in rows]


def compress(db: SessionDB, parent: str, child: str, started_at: float, **columns) -> None:
    """What a compression split leaves behind: a child, and the parent ended by compression."""
    db.create_session(child, "cli", parent_session_id=parent, started_at=started_at, **columns)
    db.end_session(parent, "compression")


def publish_successor(db: SessionDB, parent: str, successor: str) -> None:
    conn = sqlite3.connect(db.path)
    with conn:
        conn.execute(
            "UPDATE sessions SET successor_session_id = ? WHERE id = ?", (successor, parent)
        )
    conn.close()


@pytest.fixture
def family(db: SessionDB) -> SessionDB:
    """root → gen2 → gen3 (compression chain, gen3 live), plus delegates hanging off it:

    root ─┬─ gen2 ─┬─ gen3
          │        └─ helper (subagent, started before gen3)
          └─ side (subagent of root, started before gen2)
    """
    db.create_session("root", "cli", started_at=100.0, title="Root")
    db.create_session("side", "subagent", parent_session_id="root", started_at=110.0)
    compress(db, "root", "gen2", 200.0)
    db.create_session("helper", "subagent", parent_session_id="gen2", started_at=250.0)
    compress(db, "gen2", "gen3", 300.0)
    return db


def test_ancestors_start_at_the_session_nearest_first(family: SessionDB) -> None:
    rows = family.get_session_ancestors("gen3")
    assert ids(rows) == ["gen3", "gen2", "root"]
    assert rows[-1]["title"] == "Root" and rows[-1]["parent_session_id"] is None
    assert rows[0]["parent_session_id"] == "gen2"
    assert ids(family.get_session_ancestors("helper")) == ["helper", "gen2", "root"]
    assert ids(family.get_session_ancestors("root")) == ["root"]
    assert family.get_session_ancestors("missing") == []


def test_descendants_cover_the_whole_subtree_breadth_first(family: SessionDB) -> None:
    rows = family.get_session_descendants("root")
    assert ids(rows) == ["root", "side", "gen2", "helper", "gen3"]
    assert ids(family.get_session_descendants("gen2")) == ["gen2", "helper", "gen3"]
    assert ids(family.get_session_descendants("gen3")) == ["gen3"]
    assert family.get_session_descendants("missing") == []


def test_deep_lineage(db: SessionDB) -> None:
    db.create_session("s0", "cli", started_at=0.0)
    for i in range(1, 300):
        compress(db, f"s{i - 1}", f"s{i}", float(i))
    assert len(db.get_session_ancestors("s299")) == 300
    assert len(db.get_session_descendants("s0")) == 300
    assert db.get_compression_tip("s0") == "s299"
    assert db.get_compression_lineage("s150") == [f"s{i}" for i in range(300)]


def test_compression_tip_follows_newest_children_of_compressed_sessions(
    family: SessionDB,
) -> None:
    assert family.get_compression_tip("root") == "gen3"
    assert family.get_compression_tip("gen2") == "gen3"
    assert family.get_compression_tip("gen3") == "gen3"
    assert family.get_compression_tip("side") == "side"
    assert family.get_compression_tip("missing") == "missing"  # no continuation: its input


def test_children_of_a_session_not_ended_by_compression_are_no_successors(
    db: SessionDB,
) -> None:
    db.create_session("p", "cli", started_at=1.0)
    db.create_session("delegate", "subagent", parent_session_id="p", started_at=2.0)
    assert db.get_compression_tip("p") == "p"
    db.end_session("p", "user_exit")
    assert db.get_compression_tip("p") == "p"
    assert db.get_compression_lineage("delegate") == ["delegate"]


def test_a_published_successor_wins_over_a_newer_child(db: SessionDB) -> None:
    db.create_session("p", "cli", started_at=1.0)
    compress(db, "p", "chosen", 2.0)
    db.create_session("newer-delegate", "subagent", parent_session_id="p", started_at=3.0)
    assert db.get_compression_tip("p") == "newer-delegate"  # nothing published yet
    publish_successor(db, "p", "chosen")
    assert db.get_compression_tip("p") == "chosen"
    assert db.get_compression_lineage("chosen") == ["p", "chosen"]
    assert db.get_compression_lineage("newer-delegate") == ["newer-delegate"]
    assert db.list_sessions_rich()[0]["tip_session_id"] == "chosen"


def test_a_published_successor_that_is_gone_is_ignored(db: SessionDB) -> None:
    db.create_session("p", "cli", started_at=1.0)
    compress(db, "p", "c", 2.0)
    publish_successor(db, "p", "deleted-long-ago")
    assert db.get_compression_tip("p") == "c"


def test_compression_lineage_runs_root_to_tip_from_any_member(family: SessionDB) -> None:
    for member in ("root", "gen2", "gen3"):
        assert family.get_compression_lineage(member) == ["root", "gen2", "gen3"]
    assert family.get_compression_lineage("missing") == []


def test_a_delegate_is_not_part_of_its_parents_compression_lineage(family: SessionDB) -> None:
    assert family.get_compression_lineage("helper") == ["helper"]
    assert family.get_compression_lineage("side") == ["side"]
    assert family.get_compression_tip("helper") == "helper"


def test_a_stale_branch_has_its_own_lineage(db: SessionDB) -> None:
    db.create_session("p", "cli", started_at=1.0)
    compress(db, "p", "old-branch", 2.0)
    compress(db, "old-branch", "old-branch-2", 3.0)
    db.create_session("new-branch", "cli", parent_session_id="p", started_at=4.0)
    assert db.get_compression_lineage("new-branch") == ["p", "new-branch"]
    assert db.get_compression_lineage("old-branch-2") == ["old-branch", "old-branch-2"]


def test_orphaned_children_start_their_own_lineage(family: SessionDB) -> None:
    family.delete_session("gen2")
    assert ids(family.get_session_ancestors("gen3")) == ["gen3"]
    assert family.get_compression_lineage("gen3") == ["gen3"]
