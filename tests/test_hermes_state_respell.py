"""The CJK index reads the tool name: a query whose required words are split between a tool name
and CJK text finds the row. A file an earlier version wrote, whose CJK index text leaves the
tool name out, is respelled by the first writable open, in the background and in chunks, and
loses nothing to writers racing it or to a SIGKILL in the middle."""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import sqlite3
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import rest_of_output
from state_helpers import assert_spelled_current, spell_as_earlier_version

import hermes_state_connect as dbconn
import hermes_state_home as home_paths
import hermes_state_fts as fts
from hermes_state import SessionDB
from hermes_state_arguments import INT64_MAX, INT64_MIN

CLEAN = {"messages_fts": None, "messages_fts_trigram": None, "messages_fts_cjk": None}


def found(db: SessionDB, query: str, sort: str | None = None) -> set[int]:
    hits = db.search_messages(query, sort=sort, limit=10_000)
    ids = [hit["id"] for hit in hits]
    assert len(ids) == len(set(ids)), ids
    assert not any("match" in hit for hit in hits), query  # word hits, not substring ones
    return set(ids)


@contextlib.contextmanager
def reopened_after_respelling(path: Path) -> Iterator[SessionDB]:
    """A writable open of ``path`` once its background maintenance, the respelling, is done."""
    with SessionDB(path) as db:
        assert db.started_index_upkeep, "the open respells in the background"
        assert db.wait_for_index(60)
        yield db


def tool_row(db: SessionDB, content: str, name: str) -> int:
    return db.append_message("s", "tool", content, tool_name=name, tool_call_id=f"c-{name}")


def split_rows(db: SessionDB) -> tuple[dict[str, set[int]], dict[str, set[int]]]:
    """Rows whose words are split between the tool name and CJK text, beside plain ones; what
    each query finds, and what it found when the CJK index left the tool name out."""
    db.create_session("s", "cli")
    tower = tool_row(db, "東京タワーの高さ", "terminal")
    glued = tool_row(db, "Python入門 notes", "foo")
    named = tool_row(db, "kiwi output", "検索")  # CJK text in the tool name only
    plain = db.append_message("s", "user", "terminal 東京 python foo")
    latin = tool_row(db, "plain output", "terminal")
    now = {
        "terminal 東京": {tower, plain},
        "terminal 東京 NOT タワー": {plain},
        "東京 NOT terminal": set(),
        "foo python": {glued, plain},
        "foo python NOT notes": {plain},
        "検索": {named},
        "検索 kiwi": {named},
        "terminal": {tower, plain, latin},
        "kiwi NOT 検索": set(),
    }
    earlier = {**now, "terminal 東京": {plain}, "terminal 東京 NOT タワー": {plain},
               "foo python": {plain}, "検索": set(), "検索 kiwi": set()}
    return now, earlier


@pytest.mark.parametrize("sort", [None, "newest", "oldest"])
def test_required_words_split_between_a_tool_name_and_cjk_text_are_found(
    db: SessionDB, sort: str | None
) -> None:
    now, _ = split_rows(db)
    for query, ids in now.items():
        assert found(db, query, sort) == ids, query


def test_a_file_spelled_by_an_earlier_version_is_respelled_by_the_next_open(
    db: SessionDB, db_path: Path
) -> None:
    now, earlier = split_rows(db)
    assert spell_as_earlier_version(db_path) == 3
    for query, ids in earlier.items():
        assert found(db, query) == ids, query  # negations still hold on such rows
    db.close()
    with reopened_after_respelling(db_path) as reopened:
        for query, ids in now.items():
            assert found(reopened, query) == ids, query
        assert reopened.check_fts_integrity() == CLEAN
    assert_spelled_current(db_path)
    with SessionDB(db_path) as again:
        assert not again.started_index_upkeep, "respelled once"


def test_a_new_file_records_the_current_spelling(db: SessionDB, db_path: Path) -> None:
    db.create_session("s", "cli")
    tool_row(db, "東京", "terminal")
    assert_spelled_current(db_path)


def test_a_rebuild_respells_every_row_it_indexes(db: SessionDB, db_path: Path) -> None:
    now, _ = split_rows(db)
    spell_as_earlier_version(db_path)
    db.rebuild_fts()
    assert_spelled_current(db_path)
    for query, ids in now.items():
        assert found(db, query) == ids, query


# Ids at both ends of the 64-bit range, around zero and far apart: a chunk is the next existing
# rows wherever they are.
EDGE_IDS = [INT64_MIN, -5, 0, 1, 2, 3, 10, 2**40, 2**40 + 1, INT64_MAX - 1, INT64_MAX]


@pytest.mark.parametrize("chunk_rows", [1, 3, len(EDGE_IDS), 100])
def test_respelling_covers_every_row_in_chunks_of_existing_ids(
    db_path: Path, chunk_rows: int
) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        for row_id in EDGE_IDS:
            content = f"東京 row{row_id}"
            conn.execute(
                "INSERT INTO messages (id, session_id, role, content, tool_name, timestamp,"
                " search_cjk) VALUES (?, 's', 'tool', ?, 'terminal', 1.0, ?)",
                (row_id, content, fts.cjk_index_text(content, None, None)))
        conn.execute("DELETE FROM state_meta WHERE key = ?", (fts.SPELLING_KEY,))
        assert fts.respell_due(conn)
        chunks = 0
        while True:
            with dbconn.transaction(conn):
                step = fts.respell_chunk(conn, chunk_rows)
            assert step is not None and step.indexed <= chunk_rows
            chunks += 1
            if step.finished:
                break
        assert chunks == -(-len(EDGE_IDS) // chunk_rows)
        with dbconn.transaction(conn):
            assert fts.respell_chunk(conn, chunk_rows) is None
    finally:
        conn.close()
    assert_spelled_current(db_path)
    with SessionDB(db_path, rebuild_fts=False) as db:
        assert db.check_fts_integrity() == CLEAN
        assert found(db, "terminal 東京") == set(EDGE_IDS)


def test_a_rebuild_started_midway_ends_the_respelling(db: SessionDB, db_path: Path) -> None:
    now, _ = split_rows(db)
    spell_as_earlier_version(db_path)
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        with dbconn.transaction(conn):
            assert fts.respell_chunk(conn, 2) is not None
    finally:
        conn.close()
    db.rebuild_fts()
    assert_spelled_current(db_path)  # no respelling progress left behind
    for query, ids in now.items():
        assert found(db, query) == ids, query


def test_an_unreadable_progress_marker_starts_the_respelling_over(
    db: SessionDB, db_path: Path
) -> None:
    now, _ = split_rows(db)
    spell_as_earlier_version(db_path)
    db.set_meta("search_cjk_respell_progress", "not an id")
    db.close()
    with reopened_after_respelling(db_path) as reopened:
        for query, ids in now.items():
            assert found(reopened, query) == ids, query
    assert_spelled_current(db_path)


def test_respelling_waits_for_a_rebuild_of_the_indexes(db: SessionDB, db_path: Path) -> None:
    split_rows(db)
    spell_as_earlier_version(db_path)
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("INSERT INTO state_meta (key, value) VALUES ('fts_stale', 'test')")
        with dbconn.transaction(conn):
            assert fts.respell_chunk(conn) is None
        assert fts.respell_due(conn)
    finally:
        conn.close()


@pytest.mark.parametrize("value", ["?", "CAST(? AS TEXT)"], ids=["blob", "text"])
def test_bytes_another_client_stored_are_spelled_as_fts5_reads_them(
    db: SessionDB, db_path: Path, value: str
) -> None:
    """Bytes stored as a blob, or as text that is not UTF-8, are read as FTS5 reads them, by
    the respelling and by a rebuild alike: neither stops at such a row."""
    db.create_session("s", "cli")
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        for content, tool_name in [("東京 blob".encode(), "terminal"), ("output", "京都".encode()),
                                   (b"\xff\xfe broken", b"\xe6\x9d")]:
            conn.execute("INSERT INTO messages (session_id, role, content, tool_name, timestamp)"
                         f" VALUES ('s', 'tool', {value}, {value}, 1.0)", (content, tool_name))
        conn.execute("DELETE FROM state_meta WHERE key = ?", (fts.SPELLING_KEY,))
    finally:
        conn.close()
    db.close()
    with reopened_after_respelling(db_path) as reopened:
        assert_spelled_current(db_path)
        assert found(reopened, "terminal 東京") == {1}
        assert found(reopened, "京都 output") == {2}
        reopened.rebuild_fts()
        assert reopened.check_fts_integrity() == CLEAN
        assert found(reopened, "terminal 東京") == {1}
    assert_spelled_current(db_path)


# --- other processes ---------------------------------------------------------------------------

OLD_ROWS = 1500  # tool rows holding CJK text, spelled without their tool name


@pytest.fixture(scope="module")
def earlier_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed store an earlier version wrote: tool rows with CJK text, beside user rows."""
    path = tmp_path_factory.mktemp("earlier") / "state.db"
    with home_paths.hermes_home_override(path.parent):
        with SessionDB(path) as db:
            db.create_session("s", "cli")
            db.replace_messages("s", [
                {"role": "tool", "content": f"東京 出力{n} old{n}", "tool_name": f"tool{n % 7}",
                 "tool_call_id": f"c{n}"} if n % 2 else
                {"role": "user", "content": f"question {n} 大阪"}
                for n in range(2 * OLD_ROWS)
            ])
    assert spell_as_earlier_version(path) == OLD_ROWS
    return path


@pytest.fixture
def earlier(earlier_template: Path, db_path: Path) -> Path:
    shutil.copy(earlier_template, db_path)
    return db_path


def assert_whole(path: Path, rows: int, more: int = 0) -> None:
    """Respelled, indexed exactly, with ``rows`` messages (up to ``more`` besides: appends a
    kill cut before their acknowledgement)."""
    assert_spelled_current(path)
    with SessionDB(path, rebuild_fts=False) as db:
        assert db.check_fts_integrity() == CLEAN
        assert rows <= db.message_count() <= rows + more
        assert len(found(db, "tool3 東京")) == len(range(3, 2 * OLD_ROWS, 14))


# Opens the store (its background respell in chunks of 5 rows), says so, then waits to be
# killed; with "write", appends tool rows with CJK text meanwhile, printing each acknowledged id.
_CHILD = textwrap.dedent("""
    import sys, time
    import hermes_state_fts as fts
    from hermes_state import SessionDB
    fts.RESPELL_CHUNK_ROWS = 5
    db = SessionDB(sys.argv[1])
    print("open", flush=True)
    n = 0
    while True:
        if sys.argv[2] == "write":
            print(db.append_message("s", "tool", f"京都 new{n}", tool_name="tool3",
                                    tool_call_id=f"n{n}"), flush=True)
            n += 1
        time.sleep(0.002)
""")


def spawn(spawn_python: Callable[..., Any], path: Path, mode: str) -> Any:
    child = spawn_python(_CHILD, str(path), mode)
    assert child.stdout.readline().strip() == "open"
    return child


def kill(child: Any) -> list[int]:
    """SIGKILL ``child``; the ids it acknowledged (a last line the kill cut is not one)."""
    child.send_signal(signal.SIGKILL)
    out, err = rest_of_output(child)
    assert child.returncode == -signal.SIGKILL, err
    return [int(line) for line in out.split("\n")[:-1]]


def respell_state(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT key, value FROM state_meta WHERE key LIKE 'search_cjk%'"))
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_respelling_killed_midway_goes_on_at_the_next_open(
    earlier: Path, spawn_python: Callable[..., Any], seed: int
) -> None:
    child = spawn(spawn_python, earlier, "wait")
    deadline = time.monotonic() + 30
    while "search_cjk_respell_progress" not in respell_state(earlier):  # under way
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.002)
    time.sleep(random.Random(seed).uniform(0, 0.1))
    kill(child)
    state = respell_state(earlier)
    assert fts.SPELLING_KEY not in state and int(state["search_cjk_respell_progress"]) > 1, state
    with reopened_after_respelling(earlier):
        pass
    assert_whole(earlier, 2 * OLD_ROWS)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rows_another_process_writes_during_a_respelling_are_kept_and_found(
    earlier: Path, spawn_python: Callable[..., Any], seed: int
) -> None:
    """A writer appends all along while the respelling runs, in its own process or in this
    one (whichever gets the admission lock), then is killed."""
    rng = random.Random(seed)
    writer = spawn(spawn_python, earlier, "write")
    time.sleep(rng.uniform(0, 0.1))
    with SessionDB(earlier) as db:
        deadline = time.monotonic() + 60
        while fts.SPELLING_KEY not in respell_state(earlier):
            assert time.monotonic() < deadline and writer.poll() is None
            time.sleep(0.01)
        db.wait_for_index(60)
        # The writer goes on after the respelling, however quick that was.
        while db.message_count() <= 2 * OLD_ROWS + 50:
            assert time.monotonic() < deadline and writer.poll() is None
            time.sleep(0.01)
    time.sleep(rng.uniform(0, 0.2))
    written = kill(writer)
    assert len(written) > 50
    assert_whole(earlier, 2 * OLD_ROWS + len(written), more=1)
    with SessionDB(earlier, rebuild_fts=False) as db:
        hits = found(db, "tool3 京都")
        assert set(written) <= hits and len(hits) - len(written) <= 1
