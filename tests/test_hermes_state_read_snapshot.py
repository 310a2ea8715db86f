"""A read sees one committed state of the file, however many statements it runs: a commit by
another connection between two of them is not half seen (a search picked its ids in one state
and fetched its rows in the next, and returned short pages, even empty ones)."""

from __future__ import annotations

import sqlite3
import subprocess
import weakref
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

from hermes_state import SessionDB
from state_helpers import Connections

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
        connections = Connections()
        with SessionDB(db_path, on_connect=connections) as reader:
            OWN_CONNECTION[reader] = connections.own()
            yield reader, writer


# The reader's own connection, as its on_connect hook saw it opened.
OWN_CONNECTION: weakref.WeakKeyDictionary[SessionDB, sqlite3.Connection] = (
    weakref.WeakKeyDictionary())


class CommitBefore:
    """A trace callback for the reader's connection that runs ``commit`` (on another
    connection) just before the reader's ``nth`` statement; ``landed`` says whether it ran
    (a read of fewer statements leaves it unrun)."""

    def __init__(self, nth: int, commit: Callable[[], None]) -> None:
        self.nth, self.commit, self.seen, self.landed = nth, commit, 0, False

    def __call__(self, statement: str) -> None:
        self.seen += 1
        if self.seen == self.nth:
            self.commit()
            self.landed = True


def reads_with_a_commit_before_each_statement(
    reader: SessionDB, read: Callable[[], object], commit: Callable[[], None],
    check: Callable[[int, object], None], undo: Callable[[], None] = lambda: None,
) -> int:
    """``read()`` again and again, ``commit`` landing before its first statement, then its
    second, and so on to its last; ``check(nth, result)`` each result, ``undo()`` each
    commit. Returns how many statements the read had."""
    nth = 0
    while True:
        nth += 1
        trace = CommitBefore(nth, commit)
        OWN_CONNECTION[reader].set_trace_callback(trace)
        try:
            result = read()
        finally:
            OWN_CONNECTION[reader].set_trace_callback(None)
        check(nth, result)
        if not trace.landed:
            return nth - 1
        undo()


def s0_ids(path: Path) -> set[int]:
    with closing(sqlite3.connect(path)) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = 's0'")}


def test_a_search_sees_one_state_whatever_statement_a_commit_lands_before(
    rewritten: tuple[SessionDB, SessionDB], db_path: Path
) -> None:
    reader, writer = rewritten
    states: list[set[int]] = [s0_ids(db_path)]

    def rewrite() -> None:
        writer.replace_messages("s0", BEST)
        states.append(s0_ids(db_path))

    def check(nth: int, hits: object) -> None:
        assert isinstance(hits, list)
        found = {h["id"] for h in hits}
        assert len(hits) == 20 and len(found) == 20, (nth, hits)
        assert found <= states[-1] or (len(states) > 1 and found <= states[-2]), nth

    read = lambda: reader.search_messages("deploy", limit=20)  # noqa: E731
    assert reads_with_a_commit_before_each_statement(reader, read, rewrite, check) > 5


def move_one_message(path: Path, source: str, target: str) -> None:
    """Another client's commit: one message moves from one session to the other."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("UPDATE messages SET session_id = ? WHERE id = "
                     "(SELECT max(id) FROM messages WHERE session_id = ?)", (target, source))


def test_an_export_sees_one_state_whatever_statement_a_commit_lands_before(
    rewritten: tuple[SessionDB, SessionDB], db_path: Path
) -> None:
    reader, _ = rewritten

    def check(nth: int, exported: object) -> None:
        assert isinstance(exported, list)
        counts = {e["id"]: len(e["messages"]) for e in exported}
        assert counts in ({"s0": 30, "s1": 300}, {"s0": 29, "s1": 301}), (nth, counts)

    statements = reads_with_a_commit_before_each_statement(
        reader, reader.export_all, lambda: move_one_message(db_path, "s0", "s1"), check,
        undo=lambda: move_one_message(db_path, "s1", "s0"))
    assert statements > 3


REWRITER = """
import sys, time
from hermes_state import SessionDB
best = [{"role": "user", "content": f"deploy now {n}"} for n in range(30)]
with SessionDB(sys.argv[1]) as db:
    db.get_messages("s0")  # what it rewrites from: a handle that never read it is refused
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
