"""Rebuilds cost the rows, not the id space: a store whose message ids jump to 2^40 (one flipped
bit in ``sqlite_sequence`` followed by appends) is rebuilt in the background, by
``rebuild_fts()``, by ``hermes-state sessions repair`` and by ``hermes-state sessions recover``
in seconds, with indexes that pass FTS5's integrity-check and find rows on both sides of the
gap; rows other processes write while a rebuild runs are indexed exactly once.

Every rebuild here is bounded by a timeout: one that walked the id space in fixed spans would
take days on these stores.
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from conftest import subprocess_env
from state_helpers import assert_search_index_exact, strip_search_index

import hermes_state_connect as dbconn
import hermes_state_home as home_paths
import hermes_state_fts as fts
from hermes_state import SessionDB

T = TypeVar("T")

CLEAN = {"messages_fts": None, "messages_fts_trigram": None, "messages_fts_cjk": None}
GAP = 1 << 40  # a single flipped bit in sqlite_sequence
BELOW = 6000  # ids 1..BELOW, every other one deleted: holes below the gap too
ABOVE = 20  # rows appended after the flipped bit: ids GAP+1 .. GAP+ABOVE
DEADLINE_S = 20.0  # a rebuild of these few thousand rows takes well under a second


def below_text(row: int) -> str:
    cjk = " 東京の話" if row % 7 == 0 else ""
    return f"low{row} wombat{cjk}"


def above_text(n: int) -> str:
    return f"high{n} wombat 大阪"


@pytest.fixture(scope="module")
def sparse_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed store: 3,000 rows with odd ids below 6,000, then ``sqlite_sequence`` jumped to
    2^40 and 20 appends above it."""
    path = tmp_path_factory.mktemp("sparse") / "state.db"
    with home_paths.hermes_home_override(path.parent):
        with SessionDB(path) as db:
            db.create_session("s1", "cli")
            db.replace_messages("s1", [
                {"role": "user" if n % 2 else "assistant", "content": below_text(n + 1)}
                for n in range(BELOW)
            ])
            raw = sqlite3.connect(path, isolation_level=None)
            raw.execute("DELETE FROM messages WHERE id % 2 = 0")
            raw.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'messages'", (GAP,))
            raw.close()
            for n in range(1, ABOVE + 1):
                assert db.append_message("s1", "user", above_text(n)) == GAP + n
    return path


@pytest.fixture
def sparse(sparse_template: Path, db_path: Path) -> Path:
    """A private copy of the sparse store whose indexes were detached (a rebuild is due)."""
    shutil.copyfile(sparse_template, db_path)
    conn = sqlite3.connect(db_path, isolation_level=None)
    with dbconn.transaction(conn):
        fts.detach_index(conn)
    conn.close()
    return db_path


def within(seconds: float, fn: Callable[[], T]) -> T:
    """``fn()``, failing the test when it has not returned after ``seconds`` (it runs in a
    daemon thread, left to the closing of its store)."""
    result: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # handed to the test below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds:g} s"
    if errors:
        raise errors[0]
    return result[0]


def fts_rows(path: Path, table: str, expr: str) -> list[int]:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        sql = f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rowid"
        return [row[0] for row in conn.execute(sql, (expr,))]
    finally:
        conn.close()


def trigram_rows(path: Path, content: str) -> list[int]:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        sql = "SELECT rowid FROM messages_fts_trigram WHERE content LIKE ? ORDER BY rowid"
        return [row[0] for row in conn.execute(sql, (content,))]
    finally:
        conn.close()


def assert_whole(path: Path) -> None:
    """Clean indexes, no rebuild left, and rows on both sides of the gap found, each once."""
    with SessionDB(path, rebuild_fts=False) as db:
        assert db.fts_status() == {"stale": None, "rebuild_high_water": None,
                                   "rebuild_progress": None, "missing_triggers": []}
        assert db.check_fts_integrity() == CLEAN
        assert [h["id"] for h in db.search_messages("low4999")] == [4999]
        assert [h["id"] for h in db.search_messages("high7")] == [GAP + 7]
        cjk = [h["id"] for h in db.search_messages("東京", limit=1000)]
        assert sorted(cjk) == list(range(7, BELOW, 14))
    assert fts_rows(path, "messages_fts", "wombat") == [
        *range(1, BELOW, 2), *range(GAP + 1, GAP + ABOVE + 1)]
    assert fts_rows(path, "messages_fts_cjk", "大阪") == list(range(GAP + 1, GAP + ABOVE + 1))


# ---------------------------------------------------------------------------------------------
# Every rebuild of the library
# ---------------------------------------------------------------------------------------------


def test_the_background_rebuild_of_a_sparse_store_finishes_in_seconds(sparse: Path) -> None:
    db = SessionDB(sparse)
    try:
        assert db.started_index_upkeep
        assert db.wait_for_index(DEADLINE_S), (
            f"the background rebuild ran for over {DEADLINE_S:g} s")
    finally:
        db.close()
    assert_whole(sparse)


def test_rebuild_fts_of_a_sparse_store_finishes_in_seconds(sparse: Path) -> None:
    with SessionDB(sparse, rebuild_fts=False) as db:
        within(DEADLINE_S, db.rebuild_fts)
    assert_whole(sparse)


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hermes_state_cli", *args],
        env=subprocess_env({"HERMES_HOME": str(home)}), capture_output=True, text=True,
        timeout=DEADLINE_S * 2,
    )


@pytest.mark.slow
def test_repair_of_a_sparse_store_finishes_in_seconds(sparse: Path, hermes_home: Path) -> None:
    done = cli(hermes_home, "--db", str(sparse), "--json", "sessions", "repair")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["promoted"] and report["after"]["healthy"]
    assert report["after"]["row_counts"]["messages"] == BELOW // 2 + ABOVE
    assert_whole(sparse)


@pytest.mark.slow
@pytest.mark.parametrize("defer", [False, True], ids=["indexed", "deferred"])
def test_recover_of_a_sparse_store_finishes_in_seconds(
    sparse: Path, hermes_home: Path, defer: bool
) -> None:
    output = hermes_home / "recovered.db"
    args = ["--json", "sessions", "recover", "--input", str(sparse), "--output", str(output)]
    done = cli(hermes_home, *args, *(["--defer-index"] if defer else []))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["tables"]["messages"]["copied"] == BELOW // 2 + ABOVE
    assert report["checks"]["fts_integrity"] == CLEAN
    if defer:  # the first writable open rebuilds, in the background
        db = SessionDB(output)
        try:
            assert db.started_index_upkeep
            assert db.wait_for_index(DEADLINE_S)
        finally:
            db.close()
    assert_whole(output)
    with SessionDB(output) as db:
        assert db.append_message("s1", "user", "after the recover") == GAP + ABOVE + 1


# ---------------------------------------------------------------------------------------------
# Other processes writing while a rebuild runs
# ---------------------------------------------------------------------------------------------

# Another process writing into argv[1]: for each line of JSON on stdin, a list of [id, token],
# it writes one row per pair — an append through SessionDB when the id is null (the id comes
# from the sequence, above the rebuild's high water), else a row with that explicit id, as
# another SQLite client would — and prints the ids written, as one JSON line.
_WRITER = r"""
import json, sqlite3, sys, time
from hermes_state import SessionDB
db = SessionDB(sys.argv[1], rebuild_fts=False)
other = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
print("ready", flush=True)
for line in sys.stdin:
    rows = []
    for row, token in json.loads(line):
        if row is None:
            row = db.append_message("s1", "user", f"{token} wombat")
        else:
            other.execute(
                "INSERT INTO messages (id, session_id, role, content, timestamp)"
                " VALUES (?, 's1', 'user', ?, ?)", (row, f"{token} wombat", time.time()))
        rows.append(row)
    print(json.dumps(rows), flush=True)
other.close()
db.close()
"""


def free_ids_near(conn: sqlite3.Connection, around: int, rng: random.Random) -> list[int]:
    """Free ids just below and just above ``around`` (holes the rebuild has passed and holes
    it has not reached yet), one somewhere in the gap and one below id 0."""
    def free(candidates: range) -> int | None:
        for row in rng.sample(candidates, min(len(candidates), 50)):
            if conn.execute("SELECT 1 FROM messages WHERE id = ?", (row,)).fetchone() is None:
                return row
        return None

    picks = [free(range(max(around - 60, 1), around + 1)), free(range(around + 1, around + 60)),
             free(range(BELOW, GAP)), free(range(-GAP, 1))]
    return [row for row in picks if row is not None]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rows_other_processes_write_during_a_sparse_rebuild_are_indexed_once(
    sparse: Path, seed: int
) -> None:
    rng = random.Random(seed)
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(sparse)], env=subprocess_env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert writer.stdin is not None and writer.stdout is not None
    rebuilder = sqlite3.connect(sparse, isolation_level=None, timeout=30)
    written: dict[int, str] = {}
    try:
        assert writer.stdout.readline().strip() == "ready"

        def write(rows: list[int | None]) -> None:
            tokens = [f"w{seed}n{len(written) + i}" for i in range(len(rows))]
            assert writer.stdin is not None and writer.stdout is not None
            writer.stdin.write(json.dumps([list(pair) for pair in zip(rows, tokens)]) + "\n")
            writer.stdin.flush()
            done = json.loads(writer.stdout.readline())
            written.update(zip(done, tokens))

        write([None, *free_ids_near(rebuilder, BELOW // 2, rng)])  # before the rebuild starts
        with dbconn.transaction(rebuilder):
            fts.start_rebuild(rebuilder)
        deadline = time.monotonic() + DEADLINE_S
        chunks = 0
        while fts.index_state(rebuilder).rebuilding:
            assert time.monotonic() < deadline, f"{chunks} chunks in {DEADLINE_S:g} s"
            progress = fts.index_state(rebuilder).progress or 0
            write([None, *free_ids_near(rebuilder, min(progress, BELOW), rng)])
            with dbconn.transaction(rebuilder):
                fts.rebuild_chunk(rebuilder, 40)
            chunks += 1
        write([None, *free_ids_near(rebuilder, BELOW // 2, rng)])  # after it
        writer.stdin.close()
        assert writer.wait(timeout=30) == 0, writer.stderr.read() if writer.stderr else ""
    finally:
        rebuilder.close()
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        for pipe in (writer.stdout, writer.stderr):
            if pipe is not None:
                pipe.close()
    assert chunks > 50 and len(written) > 150
    with SessionDB(sparse, rebuild_fts=False) as db:
        assert db.check_fts_integrity() == CLEAN
        for row, token in written.items():
            assert fts_rows(sparse, "messages_fts", token) == [row], token
            assert trigram_rows(sparse, f"{token} wombat") == [row], token
            hits = [h["id"] for h in db.search_messages(token)]  # the word, then substrings
            assert hits[0] == row and hits.count(row) == 1, token
    assert_whole_with(sparse, set(written))


def assert_whole_with(path: Path, extra: set[int]) -> None:
    expected = sorted({*range(1, BELOW, 2), *range(GAP + 1, GAP + ABOVE + 1), *extra})
    assert fts_rows(path, "messages_fts", "wombat") == expected
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        assert [r[0] for r in conn.execute("SELECT id FROM messages ORDER BY id")] == expected
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# Ids at and below zero
# ---------------------------------------------------------------------------------------------

# Rows another client inserted with ids of its own choosing, down to the smallest 64-bit id.
LOW_IDS = [-(2**63), -(2**40), -5, 0]


def store_with_low_ids(path: Path) -> None:
    with SessionDB(path) as db:
        db.create_session("s1", "cli")
        for n in range(3):
            db.append_message("s1", "user", f"positive{n} wombat 東京")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for n, row_id in enumerate(LOW_IDS):
            conn.execute(
                "INSERT INTO messages (id, session_id, role, content, timestamp)"
                " VALUES (?, 's1', 'user', ?, ?)", (row_id, f"low{n} wombat", 10.0 + n))
    finally:
        conn.close()


def test_a_rebuild_indexes_the_rows_at_and_below_id_zero(db_path: Path) -> None:
    store_with_low_ids(db_path)
    with SessionDB(db_path, rebuild_fts=False) as db:
        db.rebuild_fts()
        assert db.check_fts_integrity() == CLEAN
        for n, row_id in enumerate(LOW_IDS):
            assert [h["id"] for h in db.search_messages(f"low{n}")] == [row_id]
        assert len(db.search_messages("wombat", limit=100)) == len(LOW_IDS) + 3
    assert fts_rows(db_path, "messages_fts", "wombat") == [*LOW_IDS, 1, 2, 3]


def test_the_search_index_fill_covers_the_rows_at_and_below_id_zero(db_path: Path) -> None:
    store_with_low_ids(db_path)
    strip_search_index(db_path)
    with SessionDB(db_path) as db:
        assert db.started_index_upkeep
        db.wait_for_index(DEADLINE_S)
        wombats = [h["id"] for h in db.search_messages("wombat", limit=100)]
        assert sorted(wombats) == [*LOW_IDS, 1, 2, 3]
    assert_search_index_exact(db_path)
