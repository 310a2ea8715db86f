"""A read sees one committed state of the file, however many statements it runs: a commit by
another connection between two of them is not half seen (a search picked its ids in one state
and fetched its rows in the next, and returned short pages, even empty ones)."""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hermes_state import SessionDB

BEST = [{"role": "user", "content": f"deploy now {n}"} for n in range(30)]
FILLER = [{"role": "user", "content": "deploy " + "filler " * 40} for _ in range(300)]


@pytest.fixture
def rewritten(db_path: Path) -> Iterator[tuple[SessionDB, SessionDB]]:
    """(reader, writer): two handles on a store where session s0 holds 30 short messages that
    match ``deploy`` better than any of s1's 300 long ones."""
    with SessionDB(db_path) as writer:
        writer.create_session("s0", "cli")
        writer.create_session("s1", "cli")
        writer.replace_messages("s0", BEST)
        writer.replace_messages("s1", FILLER)
        with SessionDB(db_path) as reader:
            yield reader, writer


def commit_before_statement(
    reader: SessionDB, nth: int, commit: Callable[[], None]
) -> Callable[[str], None]:
    """A trace callback for the reader's connection that runs ``commit`` (on another
    connection) just before the reader's ``nth`` statement, once."""
    seen = [0]

    def trace(statement: str) -> None:
        seen[0] += 1
        if seen[0] == nth:
            commit()

    return trace


def statements_of(reader: SessionDB, call: Callable[[], object]) -> int:
    statements: list[str] = []
    reader._conn.set_trace_callback(statements.append)
    try:
        call()
    finally:
        reader._conn.set_trace_callback(None)
    return len(statements)


def s0_ids(path: Path) -> set[int]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = 's0'")}
    finally:
        conn.close()


def test_a_search_sees_one_state_whatever_statement_a_commit_lands_before(
    rewritten: tuple[SessionDB, SessionDB], db_path: Path
) -> None:
    reader, writer = rewritten
    nth = 0
    while True:  # until the search has fewer statements than nth
        nth += 1
        before = s0_ids(db_path)
        reader._conn.set_trace_callback(
            commit_before_statement(reader, nth, lambda: writer.replace_messages("s0", BEST)))
        try:
            hits = [h["id"] for h in reader.search_messages("deploy", limit=20)]
        finally:
            reader._conn.set_trace_callback(None)
        after = s0_ids(db_path)
        assert len(hits) == 20 and len(set(hits)) == 20, (nth, hits)
        assert set(hits) <= before or set(hits) <= after, (nth, hits)
        if before == after:
            break
    assert nth > 5, "the commit landed before each of the search's statements in turn"


def move_one_message(path: Path, source: str, target: str) -> None:
    """Another client's commit: one message moves from one session to the other."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("UPDATE messages SET session_id = ? WHERE id = "
                     "(SELECT max(id) FROM messages WHERE session_id = ?)", (target, source))
    finally:
        conn.close()


def test_an_export_sees_one_state_whatever_statement_a_commit_lands_before(
    rewritten: tuple[SessionDB, SessionDB], db_path: Path
) -> None:
    reader, _ = rewritten
    total = statements_of(reader, reader.export_all)
    assert total > 3
    for nth in range(1, total + 1):
        reader._conn.set_trace_callback(commit_before_statement(
            reader, nth, lambda: move_one_message(db_path, "s0", "s1")))
        try:
            exported = {e["id"]: len(e["messages"]) for e in reader.export_all()}
        finally:
            reader._conn.set_trace_callback(None)
        move_one_message(db_path, "s1", "s0")
        assert exported in ({"s0": 30, "s1": 300}, {"s0": 29, "s1": 301}), (nth, exported)


REWRITER = """
import sys, time
from hermes_state import SessionDB
best = [{"role": "user", "content": f"deploy now {n}"} for n in range(30)]
with SessionDB(sys.argv[1]) as db:
    print("ready", flush=True)
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        db.replace_messages("s0", best)
"""


@pytest.mark.slow
@pytest.mark.parametrize("limit", [20, 35])
def test_pages_stay_full_while_another_process_rewrites_a_session(
    rewritten: tuple[SessionDB, SessionDB], db_path: Path,
    spawn_python: Callable[..., subprocess.Popen[str]], limit: int,
) -> None:
    """Every committed state holds at least 330 matching messages: every page is full."""
    reader, _ = rewritten
    proc = spawn_python(REWRITER, str(db_path), "3")
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    short, searches = [], 0
    while proc.poll() is None:
        for offset in (0, limit):
            hits = reader.search_messages("deploy", limit=limit, offset=offset)
            searches += 1
            if len(hits) != limit:
                short.append((offset, len(hits)))
    proc.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    assert searches > 20
    assert not short, f"{len(short)} of {searches} pages short: {short[:5]}"
    assert len(reader.search_messages("deploy", limit=limit)) == limit
