"""The search index kept whole: created on a file that lacks it (version unchanged), filled in
the background in chunks while other processes append, insert, change and delete rows, resumed
after a fill killed midway, created once by processes opening such a file together, and never
copied by recover or repair, which build it anew. Searches rank exactly meanwhile."""

from __future__ import annotations

import math
import random
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from state_helpers import (
    assert_search_index_exact,
    in_transaction,
    raw,
    strip_search_index,
)

import hermes_state_impact as impact
from hermes_state import SessionDB, recover_state_db, repair_state_db
from hermes_state_rank import Ranking
from hermes_state_schema_sql import SCHEMA_VERSION

SEEDS = [1, 2, 3]
WORDS = ["session", "gateway", "config", "token", "worker", "retry", "deploy", "zebra"]
FILLER = [f"w{i}" for i in range(200)]
QUERIES = ["session", "gateway config", "worker", "deploy retry", '"session gateway"']

EXACT_ORDER_SQL = """
SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? ORDER BY bm25(messages_fts), rowid
LIMIT 20
"""


def text(r: random.Random) -> str:
    """Short prose or long output that repeats its words."""
    words = [r.choice(WORDS) if r.random() < 0.2 else r.choice(FILLER)
             for _ in range(r.choice((r.randint(3, 20), r.randint(100, 400))))]
    return " ".join(words)


# The sessions' counters after the raw delete, so that the store stays one an import accepts.
COUNT_AGAIN_SQL = """
UPDATE sessions
SET message_count = (SELECT COUNT(*) FROM messages m WHERE m.session_id = sessions.id)
"""


def store(path: Path, seed: int, rows: int = 1200) -> None:
    """A closed store of ``rows`` messages in three sessions, every tenth one deleted (gaps
    another client may fill)."""
    r = random.Random(seed)
    with SessionDB(path) as db:
        for s in range(3):
            db.create_session(f"s{s}", "cli")
            db.replace_messages(f"s{s}", [
                {"role": "user", "content": text(r), "timestamp": 1000.0 + n}
                for n in range(rows // 3)])
    with raw(path, write=True) as conn:
        conn.execute("DELETE FROM messages WHERE id % 10 = 0")
        conn.execute(COUNT_AGAIN_SQL)


def fts5_order(db: SessionDB, query: str) -> list[int]:
    import hermes_state_search as search

    plan = search.plan_search(query)
    assert plan is not None
    with raw(db.db_path) as conn:
        return [r[0] for r in conn.execute(EXACT_ORDER_SQL, (plan.fts_match,)).fetchall()]


# Proofs from the impact index on these small stores, however few rows a query matches and
# however many a proof handles (by default FTS5 ranks a small store's queries at once).
PROOFS = Ranking(fts5_index_rows=0, fts5_word_rows=0, proof_share=math.inf)


def assert_searches_exact(db: SessionDB) -> None:
    for query in QUERIES:
        got = [h["id"] for h in db.search_messages(query, ranking=PROOFS)]
        assert got == fts5_order(db, query), query


def state(path: Path) -> dict[str, Any]:
    with raw(path) as conn:
        return impact.index_health(conn)


def epoch_of(path: Path) -> int:
    with raw(path) as conn:
        return int(impact.read_state(conn).epoch)


def drain(db: SessionDB) -> None:
    """Index what other clients wrote (normally a few rows at each of the library's writes)."""
    while in_transaction(db.path, lambda c: impact.drain_queue(c, 1000)):
        pass


# ---------------------------------------------------------------------------------------------
# A file without the index
# ---------------------------------------------------------------------------------------------


def test_a_file_without_the_index_gains_it_in_place_and_fills_it(db_path: Path) -> None:
    store(db_path, 1)
    strip_search_index(db_path)
    with SessionDB(db_path, rebuild_fts=False) as db:
        with raw(db_path) as conn:
            version = conn.execute("SELECT version FROM schema_version").fetchall()
        assert version == [(SCHEMA_VERSION,)] == [(31,)]
        health = state(db.db_path)
        assert health["filling"] and not health["usable"]
        assert_searches_exact(db)  # ranked by FTS5 while it fills
        db.rebuild_fts()  # finishes the fill now
        assert state(db.db_path)["usable"]
        assert_searches_exact(db)
    assert_search_index_exact(db_path)
    watcher = sqlite3.connect(db_path, isolation_level=None)
    before = watcher.execute("PRAGMA data_version").fetchone()
    with SessionDB(db_path) as db:  # whole now: the open writes nothing, fills nothing
        assert not db.started_index_upkeep
    assert watcher.execute("PRAGMA data_version").fetchone() == before
    watcher.close()


def test_a_writable_open_fills_it_in_the_background(db_path: Path) -> None:
    store(db_path, 2)
    strip_search_index(db_path)
    with SessionDB(db_path) as db:
        assert db.started_index_upkeep
        db.wait_for_index(30)
        assert state(db.db_path)["usable"]
        assert_searches_exact(db)
    assert_search_index_exact(db_path)


def foreign_bytes(r: random.Random) -> bytes:
    """What another client may store where the library writes UTF-8 text: words of the
    queries among bytes that are not UTF-8 (lone continuation bytes, cut sequences, a run past
    any code point)."""
    junk = [b"\xff", b"\x80", b"\xc3", b"\xe6\x9d", b"\xf4\x90\x80\x80", b"\xc3\x84"]
    return b"".join(r.choice(WORDS).encode() if r.random() < 0.6 else r.choice(junk)
                    for _ in range(r.randint(1, 30)))


# The bytes stored as a blob, or as text (SQLite keeps text as the bytes it is given).
STORED_AS = {"blob": "?", "text": "CAST(? AS TEXT)"}


@pytest.mark.parametrize("stored", list(STORED_AS))
@pytest.mark.parametrize("seed", SEEDS)
def test_bytes_another_client_stored_are_indexed_as_fts5_reads_them(
    db_path: Path, seed: int, stored: str
) -> None:
    """Rows in the gaps (queued by the triggers), rows past the batch boundary (ranked from
    their text), rows the batches, the fill and an FTS rebuild read: the index stays whole,
    ranks them as FTS5 does, and an open replaces nothing."""
    r = random.Random(seed)
    store(db_path, seed)
    conn = sqlite3.connect(db_path, isolation_level=None)
    value = STORED_AS[stored]
    rows = [(row_id, foreign_bytes(r), r.choice([None, foreign_bytes(r)]))
            for row_id in range(10, 400, 10)]
    conn.executemany("INSERT INTO messages (id, session_id, role, content, tool_name, timestamp)"
                     f" VALUES (?, 's0', 'user', {value}, {value}, 1.0)", rows)
    conn.executemany("INSERT INTO messages (session_id, role, content, timestamp)"
                     f" VALUES ('s1', 'user', {value}, 2.0)",
                     [(foreign_bytes(r),) for _ in range(20)])
    conn.close()
    with SessionDB(db_path) as db:
        assert_searches_exact(db)  # the new rows from their text
        for n in range(2 * impact.FLUSH_ROWS):
            db.append_message("s2", "user", text(r), timestamp=3000.0 + n)
        drain(db)
        assert_searches_exact(db)
        assert state(db.db_path)["usable"]
    assert_search_index_exact(db_path)
    strip_search_index(db_path)
    with SessionDB(db_path) as db:  # the fill reads every row
        assert db.started_index_upkeep
        db.wait_for_index(30)
        assert state(db.db_path)["usable"]
        assert_searches_exact(db)
        epoch = epoch_of(db.db_path)
        db.rebuild_fts()  # the FTS indexes from every row again, search_cjk recomputed
        assert_searches_exact(db)
    with SessionDB(db_path) as db:
        assert not db.started_index_upkeep and epoch_of(db.db_path) == epoch
    assert_search_index_exact(db_path)


# ---------------------------------------------------------------------------------------------
# Other processes while it fills
# ---------------------------------------------------------------------------------------------

# Another process writing argv[1] while the fill runs: appends through SessionDB (which keep
# the index themselves) and, as another SQLite client would, rows with explicit ids in the
# gaps below the fill's high water, changed texts and timestamps, and deleted rows. It prints
# "ready", then one line per round.
_WRITER = r"""
import random, sqlite3, sys
from hermes_state import SessionDB
path, seed = sys.argv[1], int(sys.argv[2])
r = random.Random(seed)
db = SessionDB(path, rebuild_fts=False)
other = sqlite3.connect(path, isolation_level=None, timeout=30)
words = ["session", "gateway", "config", "worker", "zebra"] + [f"w{i}" for i in range(50)]
def text():
    return " ".join(r.choice(words) for _ in range(r.choice((5, 200))))
print("ready", flush=True)
for n in range(60):
    db.append_message("s0", "user", text())
    gap = r.randrange(1, 120) * 10
    other.execute("INSERT OR IGNORE INTO messages (id, session_id, role, content, timestamp)"
                  " VALUES (?, 's1', 'user', ?, ?)", (gap, text(), 500.0 + n))
    row = r.randrange(1, 1200)
    other.execute("UPDATE messages SET content = ?, timestamp = timestamp + 1 WHERE id = ?",
                  (text(), row))
    other.execute("DELETE FROM messages WHERE id = ?", (r.randrange(1, 1200),))
    print(n, flush=True)
db.close()
other.close()
"""


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_fill_beside_other_writers_indexes_every_row_once(
    db_path: Path, seed: int, spawn_python: Callable[..., subprocess.Popen[str]]
) -> None:
    store(db_path, seed)
    strip_search_index(db_path)
    with SessionDB(db_path, rebuild_fts=False) as db:
        writers = [spawn_python(_WRITER, str(db_path), str(seed * 10 + k)) for k in range(2)]
        for proc in writers:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        while in_transaction(db_path, lambda c: impact.fill_chunk(c, 40)) is not None:
            time.sleep(0.005)  # chunks interleave with the writers' transactions
        for proc in writers:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
        drain(db)
        assert_searches_exact(db)
    assert_search_index_exact(db_path)


# Runs the fill of argv[1] in chunks of 30 rows and says how far it got after each.
_FILLER = r"""
import sys
from pathlib import Path
import hermes_state_connect as dbconn
import hermes_state_impact as impact
conn = dbconn.connect(Path(sys.argv[1]), "rw", timeout=30)
while True:
    with dbconn.transaction(conn):
        step = impact.fill_chunk(conn, 30)
    if step is None or step.finished:
        break
    print("chunk", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_fill_killed_midway_is_finished_by_the_next_open(
    db_path: Path, seed: int, spawn_python: Callable[..., subprocess.Popen[str]]
) -> None:
    store(db_path, seed)
    strip_search_index(db_path)
    SessionDB(db_path, rebuild_fts=False).close()  # the index, its fill due
    proc = spawn_python(_FILLER, str(db_path))
    assert proc.stdout is not None
    for _ in range(random.Random(seed).randint(3, 12)):
        assert proc.stdout.readline().strip() == "chunk"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert state(db_path)["filling"]
    with SessionDB(db_path) as db:
        assert db.started_index_upkeep
        db.wait_for_index(30)
        assert state(db.db_path)["usable"]
        assert_searches_exact(db)
    assert_search_index_exact(db_path)


# Opens argv[1] at the moment argv[2] appears, appends a row and prints its id.
_OPENER = r"""
import os, sys, time
from hermes_state import SessionDB
while not os.path.exists(sys.argv[2]):
    time.sleep(0.001)
with SessionDB(sys.argv[1]) as db:
    print(db.append_message("s0", "user", "session opened together"), flush=True)
    db.wait_for_index(60)
"""


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_processes_opening_a_file_without_it_at_once_create_one_index(
    db_path: Path, tmp_path: Path, seed: int,
    spawn_python: Callable[..., subprocess.Popen[str]],
) -> None:
    store(db_path, seed, rows=600)
    strip_search_index(db_path)
    go = tmp_path / "go"
    openers = [spawn_python(_OPENER, str(db_path), str(go)) for _ in range(3)]
    time.sleep(0.5)
    go.touch()
    appended = []
    for proc in openers:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        appended.append(int(out))
    assert len(set(appended)) == 3
    with SessionDB(db_path) as db:
        db.wait_for_index(30)
        assert state(db.db_path)["usable"]
        assert_searches_exact(db)
    assert_search_index_exact(db_path)


# ---------------------------------------------------------------------------------------------
# Recover and repair build it anew
# ---------------------------------------------------------------------------------------------


def poison(path: Path) -> None:
    """Give a closed store's index rows that no message of it would ever produce."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("UPDATE search_impact SET postings = 'bogus_0000_1_1'")
        conn.execute("INSERT INTO search_impact_queue (id) VALUES (999999)")
        conn.execute("UPDATE search_time_blocks SET first_at = 1e12, last_at = 1e12")
    finally:
        conn.close()


@pytest.mark.parametrize("defer", [False, True], ids=["rebuilt", "deferred"])
def test_recover_never_copies_the_index_and_builds_it_anew(
    db_path: Path, tmp_path: Path, defer: bool
) -> None:
    store(db_path, 4, rows=600)
    poison(db_path)
    out = tmp_path / "recovered.db"
    report = recover_state_db(db_path, out, defer_index=defer)
    assert not set(report["tables"]) & {*impact.INDEX_TABLES, *impact.INDEX_VIRTUAL_TABLES}
    assert report["complete"] and report["verified"]
    assert state(out)["filling"] == defer
    with SessionDB(out) as db:
        db.wait_for_index(30)
        assert state(db.db_path)["usable"]
        assert_searches_exact(db)
    assert_search_index_exact(out)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_export_carries_no_index_and_import_builds_it_from_the_rows(
    db_path: Path, tmp_path: Path, seed: int
) -> None:
    """The index is no part of an export: a poisoned one leaves no trace in the lines, and
    the imported store's index is made from its own rows (whole, exact, searches in FTS5's
    order)."""
    store(db_path, seed, rows=600)
    poison(db_path)
    export = tmp_path / "export.jsonl"
    with SessionDB(db_path, read_only=True) as db, open(export, "w", encoding="utf-8") as fh:
        fh.writelines(db.iter_export_jsonl())
    assert "bogus" not in export.read_text(encoding="utf-8")
    imported = tmp_path / "imported" / "state.db"
    imported.parent.mkdir()
    with SessionDB(imported) as db, open(export, encoding="utf-8") as fh:
        report = db.import_jsonl(fh)
        assert len(report["imported"]) == 3 and report["ok"]
        db.wait_for_index(30)
        assert state(db.db_path)["usable"]
        assert_searches_exact(db)
    assert_search_index_exact(imported)


def test_repair_builds_a_damaged_index_anew(db_path: Path) -> None:
    store(db_path, 5, rows=600)
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("UPDATE search_impact_fts_data SET block = randomblob(length(block))"
                 " WHERE id > 10")
    conn.close()
    poison(db_path)
    report = repair_state_db(db_path, backup=False)
    assert report["repaired"], report
    assert_search_index_exact(db_path)
    with SessionDB(db_path) as db:
        assert not db.started_index_upkeep
        assert_searches_exact(db)


def test_a_sort_by_time_is_exact_while_the_blocks_fill(db_path: Path) -> None:
    r = random.Random(6)
    with SessionDB(db_path) as db:
        db.create_session("s0", "cli")
        db.replace_messages("s0", [{"role": "user", "content": f"kiwi {r.random()}",
                                    "timestamp": r.uniform(0, 1e6)} for _ in range(5000)])
    strip_search_index(db_path)
    with SessionDB(db_path, rebuild_fts=False) as db:
        rows = sorted(db.get_messages("s0"), key=lambda m: (-m["timestamp"], m["id"]))
        want = [m["id"] for m in rows[:30]]
        assert [h["id"] for h in db.search_messages("kiwi", sort="newest", limit=30)] == want
        in_transaction(db_path, lambda c: impact.fill_chunk(c, 2000))  # part of the blocks known
        assert [h["id"] for h in db.search_messages("kiwi", sort="newest", limit=30)] == want
        db.rebuild_fts()
        assert [h["id"] for h in db.search_messages("kiwi", sort="newest", limit=30)] == want
