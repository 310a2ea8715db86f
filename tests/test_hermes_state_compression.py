"""Compression generations, split compression with a published successor, compression locks."""

from __future__ import annotations

import itertools
import json
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_state import SessionDB
from hermes_state_compression import holder_is_gone, lock_holder_name
from hermes_state_errors import (
    CompressionConflictError,
    SessionNotFoundError,
    StateDbCorruptError,
)


def seed_conversation(db: SessionDB, session_id: str = "s1") -> list[dict[str, Any]]:
    db.create_session(session_id, "cli")
    db.append_message(session_id, "system", "You are helpful.", timestamp=1.0)
    db.append_message(session_id, "user", "first question", timestamp=2.0)
    db.append_message(
        session_id, "assistant", None, timestamp=3.0,
        tool_calls=[{"id": "call_1", "function": {"name": "terminal", "arguments": "{}"}}],
    )
    db.append_message(session_id, "tool", "output", tool_call_id="call_1", timestamp=4.0)
    db.append_message(session_id, "assistant", "first answer", timestamp=5.0)
    db.append_message(session_id, "user", "latest question", timestamp=6.0)
    return db.get_messages(session_id)


def compacted_from(rows: list[dict[str, Any]], summary: str) -> list[dict[str, Any]]:
    """What a compressor keeps: the protected head and tail, a new summary between them."""
    head, tail = rows[0], rows[-1]
    return [head, {"role": "user", "content": summary, "timestamp": 5.5}, tail]


# ---------------------------------------------------------------------------------------------
# In-place compression
# ---------------------------------------------------------------------------------------------


def test_protected_messages_survive_in_both_generations(db: SessionDB) -> None:
    rows = seed_conversation(db)
    inserted = db.archive_and_compact("s1", compacted_from(rows, "summary of the middle"))
    assert inserted == 3

    every = db.get_messages("s1", include_inactive=True)
    archived = [m for m in every if not m["active"]]
    live = [m for m in every if m["active"]]
    assert [m["id"] for m in archived] == [m["id"] for m in rows]
    head, tail = rows[0], rows[-1]
    for protected in (head, tail):
        copies = [m for m in every if m["message_uid"] == protected["message_uid"]]
        assert len(copies) == 2, "one archived, one live: nothing de-duplicated"
        assert {m["active"] for m in copies} == {True, False}
        assert {(m["content"], m["timestamp"]) for m in copies} == {
            (protected["content"], protected["timestamp"])
        }
    assert [m["content"] for m in live] == [head["content"], "summary of the middle",
                                            tail["content"]]
    assert live[1]["message_uid"] not in {m["message_uid"] for m in rows}


def test_live_reads_see_only_the_active_generation(db: SessionDB) -> None:
    rows = seed_conversation(db)
    db.archive_and_compact("s1", compacted_from(rows, "summary"))

    assert [m["content"] for m in db.get_messages("s1")] == [
        "You are helpful.", "summary", "latest question",
    ]
    conversation = db.get_messages_as_conversation("s1")
    assert [(t["role"], t["content"]) for t in conversation] == [
        ("system", "You are helpful."), ("user", "summary"), ("user", "latest question"),
    ]
    assert [t["message_uid"] for t in conversation][::2] == [
        rows[0]["message_uid"], rows[-1]["message_uid"],
    ]
    assert db.message_count("s1") == 3
    assert db.get_session("s1")["message_count"] == 3
    assert db.get_session("s1")["tool_call_count"] == 0


def test_a_second_compaction_keeps_the_first_archive(db: SessionDB) -> None:
    rows = seed_conversation(db)
    db.archive_and_compact("s1", compacted_from(rows, "first summary"))
    second = db.get_messages("s1")
    db.archive_and_compact("s1", [second[0], {"role": "user", "content": "second summary"}])

    every = db.get_messages("s1", include_inactive=True)
    assert len(every) == len(rows) + 3 + 2
    assert [m["content"] for m in db.get_messages("s1")] == ["You are helpful.",
                                                             "second summary"]
    system_copies = [m for m in every if m["message_uid"] == rows[0]["message_uid"]]
    assert [m["active"] for m in system_copies] == [False, False, True]


def test_compaction_keeps_tool_call_pairing_of_retained_turns(db: SessionDB) -> None:
    rows = seed_conversation(db)
    call, result = rows[2], rows[3]
    db.archive_and_compact("s1", [call, result])

    live = db.get_messages_as_conversation("s1")
    assert live[0]["_tool_call_uids"] == call["tool_call_uids"]
    assert live[1]["_tool_call_uid"] == call["tool_call_uids"]["call_1"]
    assert db.get_session("s1")["tool_call_count"] == 1


def test_compaction_of_an_unknown_session_changes_nothing(db: SessionDB) -> None:
    seed_conversation(db)
    with pytest.raises(SessionNotFoundError):
        db.archive_and_compact("nope", [{"role": "user", "content": "x"}])
    assert len(db.get_messages("s1")) == 6


def test_a_failing_compaction_rolls_back_whole(db: SessionDB) -> None:
    rows = seed_conversation(db)
    with pytest.raises(ValueError):
        db.archive_and_compact("s1", [rows[0], {"role": "user", "message_uid": "not-a-uid"}])
    assert [m["id"] for m in db.get_messages("s1", include_inactive=True)] == [
        m["id"] for m in rows
    ]


_example_ids = itertools.count()


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kept=st.lists(st.integers(min_value=0, max_value=5), max_size=8))
def test_any_retained_selection_becomes_the_live_generation(
    db: SessionDB, kept: list[int]
) -> None:
    session_id = f"h{next(_example_ids)}"  # one shared store: a fresh session per example
    rows = seed_conversation(db, session_id)
    retained = [rows[i] for i in kept]
    assert db.archive_and_compact(session_id, retained) == len(retained)

    live = db.get_messages(session_id)
    assert [m["message_uid"] for m in live] == [m["message_uid"] for m in retained]
    assert [(m["content"], m["timestamp"]) for m in live] == [
        (m["content"], m["timestamp"]) for m in retained
    ]
    archive = [m for m in db.get_messages(session_id, include_inactive=True) if not m["active"]]
    assert [m["id"] for m in archive] == [m["id"] for m in rows]


# ---------------------------------------------------------------------------------------------
# Split compression
# ---------------------------------------------------------------------------------------------


def test_publishing_a_child_ends_the_parent_and_forwards_to_the_child(db: SessionDB) -> None:
    rows = seed_conversation(db)
    child = db.publish_compression_child(
        "s1", "s2", "cli", compacted_from(rows, "summary"), model="m", user_id="alice"
    )
    assert child == "s2"

    parent = db.get_session("s1")
    assert parent["end_reason"] == "compression"
    assert parent["ended_at"] is not None
    assert parent["successor_session_id"] == "s2"
    created = db.get_session("s2")
    assert created["parent_session_id"] == "s1"
    assert (created["model"], created["user_id"], created["ended_at"]) == ("m", "alice", None)
    assert created["message_count"] == 3

    assert [m["message_uid"] for m in db.get_messages("s2")][::2] == [
        rows[0]["message_uid"], rows[-1]["message_uid"],
    ]
    assert len(db.get_messages("s1")) == 6, "the parent's rows stay where they are"
    assert db.get_compression_tip("s1") == "s2"
    assert db.get_compression_lineage("s2") == ["s1", "s2"]
    assert [r["id"] for r in db.get_session_ancestors("s2")] == ["s2", "s1"]
    assert [r["id"] for r in db.get_session_descendants("s1")] == ["s1", "s2"]
    listed = db.list_sessions_rich()
    assert [(r["id"], r["_lineage_root_id"]) for r in listed] == [("s2", "s1")]


def test_a_chain_of_splits_resolves_to_the_newest_tip(db: SessionDB) -> None:
    seed_conversation(db)
    db.publish_compression_child("s1", "s2", "cli", [{"role": "user", "content": "a"}])
    db.publish_compression_child("s2", "s3", "cli", [{"role": "user", "content": "b"}])
    assert db.get_compression_tip("s1") == "s3"
    assert db.get_compression_lineage("s2") == ["s1", "s2", "s3"]


def test_a_parent_never_forks_into_two_successors(db: SessionDB) -> None:
    seed_conversation(db)
    db.publish_compression_child("s1", "s2", "cli", [{"role": "user", "content": "a"}])
    with pytest.raises(CompressionConflictError):
        db.publish_compression_child("s1", "s3", "cli", [{"role": "user", "content": "b"}])
    assert db.get_session("s3") is None
    assert db.get_session("s1")["successor_session_id"] == "s2"


def test_publishing_into_an_existing_session_is_refused(db: SessionDB) -> None:
    seed_conversation(db)
    db.create_session("taken", "cli")
    with pytest.raises(CompressionConflictError):
        db.publish_compression_child("s1", "taken", "cli", [{"role": "user", "content": "a"}])
    assert db.get_session("s1")["ended_at"] is None
    assert db.get_messages("taken") == []


def test_compression_lifts_an_automatic_archive_but_not_a_deliberate_one(
    db: SessionDB, db_path: Path
) -> None:
    seed_conversation(db, "auto")
    seed_conversation(db, "kept")
    with sqlite3.connect(db_path) as raw:
        raw.execute("UPDATE sessions SET archived = 1, auto_archived = 1 WHERE id = 'auto'")
        raw.execute("UPDATE sessions SET archived = 1, auto_archived = 0 WHERE id = 'kept'")

    db.archive_and_compact("auto", [{"role": "user", "content": "summary"}])
    db.archive_and_compact("kept", [{"role": "user", "content": "summary"}])
    assert (db.get_session("auto")["archived"], db.get_session("auto")["auto_archived"]) == (0, 0)
    assert (db.get_session("kept")["archived"], db.get_session("kept")["auto_archived"]) == (1, 0)

    with sqlite3.connect(db_path) as raw:
        raw.execute("UPDATE sessions SET archived = 1, auto_archived = 1 WHERE id = 'auto'")
    db.publish_compression_child("auto", "auto2", "cli", [{"role": "user", "content": "s"}])
    db.publish_compression_child("kept", "kept2", "cli", [{"role": "user", "content": "s"}])
    assert db.get_session("auto")["archived"] == 0
    assert db.get_session("kept")["archived"] == 1


def test_a_compression_refused_by_a_corrupt_file_is_spooled(
    db_path: Path, hermes_home: Path, damage_messages_table: Callable[[Path], None]
) -> None:
    with SessionDB(db_path, rebuild_fts=False) as db:
        rows = seed_conversation(db)
    damage_messages_table(db_path)
    summary = {"role": "user", "content": "summary worth keeping", "timestamp": 9.0}

    with SessionDB(db_path, rebuild_fts=False) as db:
        with pytest.raises(StateDbCorruptError) as split:
            db.publish_compression_child("s1", "s2", "cli", [summary])
        assert db.quarantined
    assert split.value.spooled_to == hermes_home / "sessions" / "s2.jsonl"
    assert [json.loads(line) for line in split.value.spooled_to.read_text().splitlines()] == [
        {"session_id": "s2", **summary}
    ]

    with SessionDB(db_path, rebuild_fts=False) as db:
        with pytest.raises(StateDbCorruptError) as in_place:
            db.archive_and_compact("s1", [rows[0], summary])
    spooled = [json.loads(line) for line in in_place.value.spooled_to.read_text().splitlines()]
    assert in_place.value.spooled_to.name == "s1.jsonl"
    assert [r["content"] for r in spooled] == ["You are helpful.", "summary worth keeping"]
    assert spooled[0]["message_uid"] == rows[0]["message_uid"]


# ---------------------------------------------------------------------------------------------
# Compression locks
# ---------------------------------------------------------------------------------------------

LOCK_CHILD = textwrap.dedent(
    """
    import sys
    from hermes_state import SessionDB
    from hermes_state_compression import lock_holder_name

    db = SessionDB(sys.argv[1])
    holder = lock_holder_name(sys.argv[3])
    for line in sys.stdin:
        command = line.strip()
        if command == "acquire":
            ok = db.try_acquire_compression_lock(sys.argv[2], holder, ttl_seconds=300)
            print(f"{int(ok)} {holder}", flush=True)
        elif command == "release":
            db.release_compression_lock(sys.argv[2], holder)
            print(int(db.get_compression_lock_holder(sys.argv[2]) is None), flush=True)
        elif command == "exit":
            break
    db.close()
    """
)


class LockChild:
    """A separate process that takes and releases compression locks on command."""

    def __init__(self, db_path: Path, session_id: str, label: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LOCK_CHILD, str(db_path), session_id, label],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )

    def send(self, command: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def finish(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("exit\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def test_only_one_of_several_processes_takes_the_lock(db: SessionDB, db_path: Path) -> None:
    children = [LockChild(db_path, "s1", f"racer-{i}") for i in range(3)]
    try:
        for child in children:  # all commands first, then all answers: the takes race
            assert child.proc.stdin is not None
            child.proc.stdin.write("acquire\n")
            child.proc.stdin.flush()
        answers = []
        for child in children:
            assert child.proc.stdout is not None
            answers.append(child.proc.stdout.readline().strip().split(" ", 1))
        winners = [holder for ok, holder in answers if ok == "1"]
        assert len(winners) == 1
        assert db.get_compression_lock_holder("s1") == winners[0]
        assert not db.try_acquire_compression_lock("s1", lock_holder_name("parent"))
    finally:
        for child in children:
            child.finish()


def test_a_released_lock_can_be_taken_by_another_process(db: SessionDB, db_path: Path) -> None:
    child = LockChild(db_path, "s1", "compressor")
    try:
        ok, holder = child.send("acquire").split(" ", 1)
        assert ok == "1"
        mine = lock_holder_name("parent")
        assert not db.try_acquire_compression_lock("s1", mine)
        assert db.release_compression_lock("s1", mine) is None
        assert db.get_compression_lock_holder("s1") == holder, "only the holder releases"
        assert not db.refresh_compression_lock("s1", mine), "only the holder refreshes"
        assert db.get_compression_lock_holder("s1") == holder
        assert child.send("release") == "1"
        assert db.get_compression_lock_holder("s1") is None
        assert db.try_acquire_compression_lock("s1", mine)
        assert child.send("acquire").startswith("0 ")
    finally:
        child.finish()


def test_the_lock_of_a_process_that_exited_can_be_reclaimed(db: SessionDB, db_path: Path) -> None:
    child = LockChild(db_path, "s1", "crashed")
    ok, holder = child.send("acquire").split(" ", 1)
    assert ok == "1"
    assert f"pid={child.proc.pid}" in holder
    assert not holder_is_gone(holder), "alive: the lock binds"
    assert not db.try_acquire_compression_lock("s1", "someone else")
    child.finish()  # exits and is reaped without releasing

    assert holder_is_gone(holder)
    assert db.get_compression_lock_holder("s1") is None
    assert db.try_acquire_compression_lock("s1", "someone else", ttl_seconds=60)
    assert db.get_compression_lock_holder("s1") == "someone else"


def test_an_expired_lock_can_be_reclaimed(db: SessionDB) -> None:
    assert db.try_acquire_compression_lock("s1", "first", ttl_seconds=0.05)
    assert not db.try_acquire_compression_lock("s1", "second")
    time.sleep(0.1)
    assert db.get_compression_lock_holder("s1") is None
    assert db.try_acquire_compression_lock("s1", "second")
    assert not db.refresh_compression_lock("s1", "first")
    assert db.refresh_compression_lock("s1", "second", ttl_seconds=600)
    assert db.release_compression_lock("s1", "second") is None
    assert db.get_compression_lock_holder("s1") is None


def test_a_holder_that_proves_nothing_keeps_its_lock(db: SessionDB) -> None:
    other_host = f"host=not-{socket.gethostname()} pid=999999999 remote"
    for holder in ("no pid at all", other_host, f"pid={os.getpid()} alive", "ppid=1"):
        assert not holder_is_gone(holder), holder
    assert db.try_acquire_compression_lock("s2", other_host)
    assert not db.try_acquire_compression_lock("s2", "local")


def test_reacquiring_ones_own_lock_extends_it(db: SessionDB) -> None:
    assert db.try_acquire_compression_lock("s1", "me", ttl_seconds=0.05)
    assert db.try_acquire_compression_lock("s1", "me", ttl_seconds=600)
    time.sleep(0.1)
    assert db.get_compression_lock_holder("s1") == "me"


@pytest.mark.parametrize("ttl", [0, -1, float("inf"), float("nan")])
def test_a_lock_needs_a_positive_finite_ttl(db: SessionDB, ttl: float) -> None:
    with pytest.raises(ValueError):
        db.try_acquire_compression_lock("s1", "me", ttl_seconds=ttl)
