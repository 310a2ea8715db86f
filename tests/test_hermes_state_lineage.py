"""Lineage: ancestors and descendants over parent_session_id, the successor rule, and the two
sets built on it — the compression chain and the conversation's members."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import hermes_state_lineage as lineage
import hermes_state_listing as listing
from hermes_state import SessionDB, StateDbError
from state_helpers import populate


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
    listed = db.list_sessions_rich()[0]
    assert (listed["id"], listed["_lineage_root_id"]) == ("chosen", "p")


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


def test_a_child_that_continued_by_compression_is_preferred_to_a_newer_one(
    db: SessionDB,
) -> None:
    """The tip walk's preference (a child ended by compression, else a live one, else any):
    the newer child is the stale one here, and starts a chain of its own."""
    db.create_session("p", "cli", started_at=1.0)
    compress(db, "p", "old-branch", 2.0)
    compress(db, "old-branch", "old-branch-2", 3.0)
    db.create_session("new-branch", "cli", parent_session_id="p", started_at=4.0)
    assert db.get_compression_lineage("new-branch") == ["new-branch"]
    assert db.get_compression_lineage("old-branch-2") == ["p", "old-branch", "old-branch-2"]
    assert db.get_compression_tip("p") == "old-branch-2"


def test_orphaned_children_start_their_own_lineage(family: SessionDB) -> None:
    family.delete_session("gen2")
    assert ids(family.get_session_ancestors("gen3")) == ["gen3"]
    assert family.get_compression_lineage("gen3") == ["gen3"]


# --- the successor rule: which child continues a compressed session ---------------------------

DELEGATE = {"_delegate_from": "p"}
BRANCH = {"_branched_from": "p"}


def test_marked_children_and_tool_sessions_never_continue_a_compressed_session(
    db: SessionDB,
) -> None:
    db.create_session("p", "cli", started_at=1.0)
    compress(db, "p", "continuation", 2.0)
    db.create_session("delegate", "cli", parent_session_id="p", started_at=3.0,
                      model_config=DELEGATE)
    db.create_session("branch", "cli", parent_session_id="p", started_at=4.0,
                      model_config=BRANCH)
    db.create_session("tool-run", "tool", parent_session_id="p", started_at=5.0)
    db.append_message("delegate", "user", "the newest activity of all", timestamp=9.0)
    assert db.get_compression_tip("p") == "continuation"
    assert db.get_compression_lineage("p") == ["p", "continuation"]
    for child in ("delegate", "branch", "tool-run"):
        assert db.get_compression_lineage(child) == [child]
    db.delete_session("continuation")
    assert db.get_compression_tip("p") == "p"  # no continuation edge is left


def test_a_marker_whose_value_is_null_or_unreadable_config_marks_nothing(db: SessionDB) -> None:
    db.create_session("p", "cli", started_at=1.0)
    compress(db, "p", "null-marker", 2.0, model_config={"_delegate_from": None, "k": 1})
    assert db.get_compression_tip("p") == "null-marker"
    with raw(db) as conn:
        conn.execute("UPDATE sessions SET model_config = 'not json' WHERE id = 'null-marker'")
    assert db.get_compression_tip("p") == "null-marker"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_preference_is_compressed_then_live_then_any_then_newest_activity(
    db: SessionDB, seed: int
) -> None:
    """Whatever order the children were created in, the same one continues the parent."""
    import random

    children = [
        # (id, started_at, end_reason, newest message)
        ("ended-newest", 9.0, "user_exit", 20.0),
        ("live-old-but-busy", 2.0, None, 15.0),
        ("live-newer", 5.0, None, None),
        ("compressed-oldest", 1.5, "compression", None),
    ]
    random.Random(seed).shuffle(children)
    db.create_session("p", "cli", started_at=1.0)
    db.end_session("p", "compression")
    for sid, started, end, message in children:
        db.create_session(sid, "cli", parent_session_id="p", started_at=started)
        if message is not None:
            db.append_message(sid, "user", "hi", timestamp=message)
        if end is not None:
            db.end_session(sid, end)
    assert successor_of(db, "p") == "compressed-oldest"
    db.delete_session("compressed-oldest")
    assert successor_of(db, "p") == "live-old-but-busy"  # newest activity, not newest start
    db.delete_session("live-old-but-busy")
    assert successor_of(db, "p") == "live-newer"  # live beats an ended child
    db.delete_session("live-newer")
    assert successor_of(db, "p") == "ended-newest"  # any other, when nothing else is left


def test_ties_go_to_the_later_start_then_the_greater_id(db: SessionDB) -> None:
    db.create_session("p", "cli", started_at=1.0)
    db.end_session("p", "compression")
    for sid, started in (("a", 3.0), ("c", 2.0), ("b", 3.0)):
        db.create_session(sid, "cli", parent_session_id="p", started_at=started)
    assert successor_of(db, "p") == "b"


def test_a_published_successor_wins_while_it_is_still_the_child(db: SessionDB) -> None:
    db.create_session("p", "cli", started_at=1.0)
    compress(db, "p", "published", 2.0)
    compress(db, "p", "compressed-sibling", 3.0)
    db.end_session("compressed-sibling", "compression")
    publish_successor(db, "p", "published")
    assert db.get_compression_tip("p") == "published"
    with raw(db) as conn:  # the published child detached (as an import of it alone would)
        conn.execute("UPDATE sessions SET parent_session_id = NULL WHERE id = 'published'")
    assert db.get_compression_tip("p") == "compressed-sibling"
    with raw(db) as conn:
        assert lineage.forwarding_chain(conn, "p") == ["published"]  # the pointer still leads


def test_an_older_branch_the_parent_moved_past_keeps_its_own_chain(db: SessionDB) -> None:
    db.create_session("p", "cli", started_at=1.0)
    compress(db, "p", "older", 2.0)
    compress(db, "older", "older-child", 3.0)  # the older branch went on by compression
    compress(db, "p", "current", 4.0)
    publish_successor(db, "p", "current")  # and p moved past it: published
    assert db.get_compression_lineage("current") == ["p", "current"]
    assert db.get_compression_lineage("older-child") == ["older", "older-child"]
    listed = db.list_sessions_rich()[0]
    assert (listed["id"], listed["_lineage_root_id"]) == ("current", "p")
    # Unpublished, a child that ended otherwise is one the parent moved past as well.
    db.create_session("q", "cli", started_at=10.0)
    compress(db, "q", "q-older", 11.0)
    db.append_message("q-older", "user", "its last turn", timestamp=30.0)
    db.end_session("q-older", "user_exit")
    compress(db, "q", "q-current", 12.0)
    assert db.get_compression_tip("q") == "q-current"
    assert db.get_compression_lineage("q-older") == ["q-older"]


def test_a_walk_stops_at_a_cycle(db: SessionDB) -> None:
    db.create_session("a", "cli", started_at=1.0)
    compress(db, "a", "b", 2.0)
    db.end_session("b", "compression")
    with raw(db) as conn:  # only damage or a hand edit makes a cycle
        conn.execute("UPDATE sessions SET parent_session_id = 'b' WHERE id = 'a'")
    assert db.get_compression_tip("a") in {"a", "b"}
    assert set(db.get_compression_lineage("a")) == {"a", "b"}


# --- the two sets: the compression chain and the conversation's members ----------------------


@pytest.fixture
def conversation(db: SessionDB) -> SessionDB:
    """root → gen2 → tip, a delegate of gen2 still running, a branch of root, and an older
    child of root it moved past; plus an unrelated session::

        root ─┬─ gen2 ─┬─ tip
              │        └─ delegate (live, _delegate_from)
              ├─ branch (_branched_from)
              └─ older (ended)
    """
    db.create_session("root", "cli", started_at=1.0)
    db.create_session("older", "cli", parent_session_id="root", started_at=2.0)
    db.end_session("older", "user_exit")
    compress(db, "root", "gen2", 3.0)
    db.create_session("branch", "cli", parent_session_id="root", started_at=4.0,
                      model_config=BRANCH)
    compress(db, "gen2", "tip", 5.0)
    db.create_session("delegate", "subagent", parent_session_id="gen2", started_at=6.0,
                      model_config={"_delegate_from": "gen2"})
    db.create_session("elsewhere", "cli", started_at=7.0)
    return db


MEMBERS = {"root", "older", "gen2", "branch", "tip", "delegate"}


def test_the_chain_is_one_line_of_successors(conversation: SessionDB) -> None:
    for member in ("root", "gen2", "tip"):
        assert conversation.get_compression_lineage(member) == ["root", "gen2", "tip"]
    for member in ("older", "branch", "delegate"):
        assert conversation.get_compression_lineage(member) == [member]
    with raw(conversation) as conn:
        assert lineage.compression_ancestors(conn, "tip") == ["tip", "gen2", "root"]
        assert lineage.compression_ancestors(conn, "delegate") == ["delegate"]


def test_the_members_are_the_whole_conversation_from_any_of_them(
    conversation: SessionDB,
) -> None:
    with raw(conversation) as conn:
        for member in MEMBERS:
            assert lineage.conversation_members(conn, member) == MEMBERS, member
        assert lineage.conversation_members(conn, "elsewhere") == {"elsewhere"}
        assert lineage.conversation_members(conn, "missing") == set()
        # The difference, pinned: the delegate is a member, never a link of the chain.
        assert "delegate" not in lineage.compression_chain(conn, "gen2")


def test_archiving_any_member_archives_the_members(conversation: SessionDB) -> None:
    conversation.set_session_archived("delegate", True)
    archived = {s["id"] for s in conversation.search_sessions(limit=50) if s["archived"]}
    assert archived == MEMBERS
    conversation.set_session_archived("tip", False)
    assert not any(s["archived"] for s in conversation.search_sessions(limit=50))


def test_prune_keeps_a_conversation_while_a_member_is_live(db: SessionDB) -> None:
    """A finished continuation is never pruned out of a conversation whose delegate runs."""
    day = 86400.0
    old = time.time() - 200 * day
    db.create_session("root", "cli", started_at=old)
    db.create_session("a", "cli", parent_session_id="root", started_at=old + 1)
    db.end_session("root", "compression")
    db.end_session("a", "user_exit")
    db.create_session("d", "subagent", parent_session_id="root", started_at=old + 2,
                      model_config={"_delegate_from": "root"})
    assert db.prune_sessions(older_than_days=90) == 0
    assert {s["id"] for s in db.search_sessions(limit=10)} == {"root", "a", "d"}
    db.end_session("d", "done")
    assert db.prune_sessions(older_than_days=90) == 3


def test_the_sql_continuation_edge_is_the_rules_edge(conversation: SessionDB) -> None:
    """Listings that order by a chain in SQL follow the same edges the rule does."""
    conversation.create_session("tool-run", "tool", parent_session_id="gen2", started_at=8.0)
    with raw(conversation) as conn:
        edges = set(conn.execute(
            "SELECT p.id, c.id FROM sessions c JOIN sessions p ON p.id = c.parent_session_id"
            f" WHERE {lineage.CONTINUATION_EDGE_SQL}"
        ).fetchall())
        family = lineage.Family(conn, "root")
    assert edges == {("root", "older"), ("root", "gen2"), ("gen2", "tip")}
    for parent, child in edges:
        assert family.nodes[child].unmarked and family.nodes[parent].end_reason == "compression"


def test_export_of_a_lineage_is_its_compression_chain(conversation: SessionDB) -> None:
    """One export of the conversation along its chain (the delegate and the older child are
    members, not links); the command line's ``--lineage`` keeps exporting the whole tree."""
    with raw(conversation) as conn:
        chain = lineage.compression_chain(conn, "gen2")
    exported = conversation.export_session_lineage("gen2")
    assert exported is not None
    assert exported["lineage_session_ids"] == chain == ["root", "gen2", "tip"]
    assert exported["id"] == "tip" and exported["segments"][-1]["id"] == "tip"
    assert exported["messages"] == [m for s in exported["segments"] for m in s["messages"]]
    assert exported["message_count"] == len(exported["messages"])
    assert conversation.export_session_lineage("delegate")["lineage_session_ids"] == [
        "delegate"
    ]
    assert conversation.export_session_lineage("missing") is None


# --- helpers ---------------------------------------------------------------------------------


@contextlib.contextmanager
def raw(db: SessionDB) -> Iterator[sqlite3.Connection]:
    """A second connection on the store, committing on exit."""
    conn = sqlite3.connect(db.path, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def successor_of(db: SessionDB, session_id: str) -> str | None:
    with raw(db) as conn:
        return lineage.successor(conn, session_id)


# ---------------------------------------------------------------------------------------------
# A read that fails is no busy file
# ---------------------------------------------------------------------------------------------


def _chain(path: Path, updates: list[str]) -> None:
    """populate()'s chain sess-0 → sess-1 → sess-2 (the tip), then text that is not UTF-8
    written by another client: each update sets its columns to ``:raw`` as text."""
    with SessionDB(path) as handle:
        populate(handle)
    conn = sqlite3.connect(path, isolation_level=None)
    for sql in updates:
        conn.execute(sql, {"raw": b"sess-\xff"})
    conn.close()


def test_a_tip_that_cannot_be_read_fails_the_listing_not_shows_the_root(db_path: Path) -> None:
    """Only a busy or locked file leaves a compressed row unprojected: a tip whose title is
    not UTF-8 raises (a listing showing the ended root instead would send a resume there)."""
    _chain(db_path, ["UPDATE sessions SET title = CAST(:raw AS TEXT) WHERE id = 'sess-2'"])
    with SessionDB(db_path) as handle:
        with pytest.raises(StateDbError, match="UTF-8"):
            handle.list_sessions_rich()


def test_a_lineage_that_cannot_be_read_fails_the_resume_not_returns_the_root(
    db_path: Path,
) -> None:
    _chain(db_path, [
        "UPDATE sessions SET id = CAST(:raw AS TEXT) WHERE id = 'sess-1'",
        "UPDATE messages SET session_id = CAST(:raw AS TEXT) WHERE session_id = 'sess-1'",
        "UPDATE sessions SET parent_session_id = CAST(:raw AS TEXT)"
        " WHERE parent_session_id = 'sess-1'",
    ])
    with SessionDB(db_path) as handle:
        with pytest.raises(StateDbError, match="UTF-8"):
            handle.resolve_resume_session_id("sess-0")


class _BusyWalk(sqlite3.Connection):
    """A connection whose statements reading ``busy_sql`` fail as a locked file does."""

    busy_sql = ""

    def execute(self, sql, *args):  # type: ignore[no-untyped-def, override]
        if self.busy_sql and self.busy_sql in sql:
            exc = sqlite3.OperationalError("database is locked")
            exc.sqlite_errorcode = 5  # type: ignore[attr-defined]  # SQLITE_BUSY
            raise exc
        return super().execute(sql, *args)


def test_a_busy_file_during_the_walk_still_answers_with_what_it_has(db_path: Path) -> None:
    _chain(db_path, [])
    conn = sqlite3.connect(db_path, factory=_BusyWalk)
    try:
        assert lineage.resolve_resume_session_id(conn, "sess-0") == "sess-2"
        conn.busy_sql = lineage.RESUME_CHILD_SQL.strip()[:40]
        assert lineage.resolve_resume_session_id(conn, "sess-0") == "sess-2"  # the tip
        listed = [(r["id"], r["end_reason"]) for r in listing.list_sessions_rich(conn)]
        assert listed == [("sess-2", None)]  # the root, shown as its tip
        conn.busy_sql = "FROM sessions s WHERE s.id = ?"  # the tip's row, not the page
        listed = [(r["id"], r["end_reason"]) for r in listing.list_sessions_rich(conn)]
        assert listed == [("sess-0", "compression")]  # left as it is
    finally:
        conn.close()
