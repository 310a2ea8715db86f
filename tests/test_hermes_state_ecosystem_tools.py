"""Generic SQLite tools read the store: a connection without any of this library's functions
lists every table and counts its rows, and Datasette and sqlite-utils find ``messages_fts`` as
the full-text index of ``messages``. So in a new store, and in one an earlier release wrote
(the same schema version, its FTS tables declared otherwise) once a writable open has brought
it forward in place, its searches finding what they found before.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, rest_of_output, subprocess_env
from test_hermes_state_upstream_upgrade import build_upstream

import hermes_state_impact as impact
from hermes_state import SessionDB

WORDS = ("harbor", "lantern", "meadow", "quartz", "willow")
QUERIES = ("harbor", "lantern meadow", "quartz*", "東京", "tool")


def message(n: int) -> dict[str, Any]:
    """The n-th message of the test store: a word of WORDS in every third one, some CJK, a
    tool result now and then (enough messages for the search index's batches)."""
    if n % 7 == 3:
        return {"role": "tool", "content": f"tool output {n}", "tool_name": "grep"}
    word = WORDS[n % len(WORDS)] if n % 3 == 0 else "plain"
    cjk = " 東京都に行きました" if n % 11 == 0 else ""
    return {"role": "user" if n % 2 else "assistant", "content": f"note {n} on {word}{cjk}"}


def fill_store(path: Path, count: int = 400) -> None:
    with SessionDB(path) as db:
        db.create_session("s1", "cli")
        db.replace_messages("s1", [message(n) for n in range(count)])


def holding(path: Path, word: str) -> set[int]:
    """The ids of the messages whose content holds ``word``."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT id, content FROM messages").fetchall()
    finally:
        conn.close()
    return {row_id for row_id, content in rows if content and word in content.split()}


def plain_counts(path: Path) -> dict[str, int]:
    """Every table of the file (shadow and vocabulary tables of FTS5 included) with its row
    count, read by a stdlib connection on which nothing is registered."""
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {name: conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
                for name in names}
    finally:
        conn.close()


def sqlite_utils(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sqlite_utils", *args], env=subprocess_env(),
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, check=False)


def assert_tools_read(path: Path) -> None:
    """What a user of the tools sees: every table counted, by a plain connection and by
    ``sqlite-utils tables --counts``; ``sqlite-utils search`` finds the messages holding a
    word, and only those."""
    counts = plain_counts(path)
    tables = sqlite_utils("tables", str(path), "--counts")
    assert tables.returncode == 0, tables.stderr
    assert {t["table"]: t["count"] for t in json.loads(tables.stdout)} == counts
    assert counts["search_impact_fts"] >= 1 and counts["messages_fts"] == counts["messages"]
    for word in ("harbor", "quartz"):
        found = sqlite_utils("search", str(path), "messages", word)
        assert found.returncode == 0, found.stderr
        assert {r["id"] for r in json.loads(found.stdout)} == holding(path, word) != set()


def results(db: SessionDB) -> dict[str, list[dict[str, Any]]]:
    return {q: db.search_messages(q, limit=50) for q in QUERIES}


def test_a_new_store_is_read_whole_by_sqlite_utils(db_path: Path) -> None:
    fill_store(db_path)
    assert_tools_read(db_path)


def test_datasette_finds_the_index_of_messages_and_counts_every_table(db_path: Path) -> None:
    datasette_app = pytest.importorskip("datasette.app")
    from datasette.utils import detect_fts

    fill_store(db_path)
    conn = sqlite3.connect(db_path)
    try:
        assert detect_fts(conn, "messages") == "messages_fts"
    finally:
        conn.close()
    app = datasette_app.Datasette([str(db_path)])

    async def visit() -> tuple[dict[str, int | None], set[int]]:
        # (the limit is in ms: the default 10 gives None for a count slowed by a busy machine)
        counts = await app.get_database("state").table_counts(limit=60_000)
        page = await app.client.get("/state/messages.json?_search=harbor&_shape=array&_size=max")
        assert page.status_code == 200, page.text
        return counts, {row["id"] for row in page.json()}

    try:
        counts, found = asyncio.run(visit())
    finally:
        app.executor.shutdown(wait=True)
    assert counts == plain_counts(db_path)
    assert found == holding(db_path, "harbor") != set()


def test_a_store_of_the_previous_application_is_read_whole_once_upgraded(db_path: Path) -> None:
    build_upstream(db_path, 1)
    with SessionDB(db_path) as db:  # upgraded, its indexes rebuilt in the background
        assert db.started_index_upkeep
        db.wait_for_index(30)
    fill_store(db_path)
    assert_tools_read(db_path)


# messages_fts and the search index's FTS5 table as the previous release declared them, at the
# same schema version: the content table in single quotes, which the tools do not recognise,
# and no %_docsize table, without which a contentless FTS5 table cannot be scanned.
EARLIER_MESSAGES_FTS_SQL = """
CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, tool_name, tool_calls,
    content='messages', content_rowid='id'
)"""
EARLIER_IMPACT_FTS_SQL = """
CREATE VIRTUAL TABLE search_impact_fts USING fts5(
    postings, content='', tokenize="unicode61 tokenchars '_'", columnsize=0, detail='none'
)"""


def as_earlier_release(path: Path) -> None:
    """Give a closed store the FTS tables the previous release made, holding what they held."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DROP TABLE messages_fts")
        conn.execute(EARLIER_MESSAGES_FTS_SQL)
        conn.execute("INSERT INTO messages_fts (messages_fts) VALUES ('rebuild')")
        (epoch,) = conn.execute("SELECT epoch FROM search_impact_state").fetchone()
        rows = conn.execute("SELECT id, postings FROM search_impact WHERE postings <> ''")
        postings = rows.fetchall()
        conn.execute("DROP TABLE search_impact_vocab")
        conn.execute("DROP TABLE search_impact_fts")
        conn.execute(EARLIER_IMPACT_FTS_SQL)
        conn.execute("CREATE VIRTUAL TABLE search_impact_vocab"
                     " USING fts5vocab(search_impact_fts, 'instance')")
        conn.execute(impact.FTS_ADD_SQL, (0, f"_epoch_{epoch}"))
        conn.executemany(impact.FTS_ADD_SQL, [(i, impact.index_text(p)) for i, p in postings])
        conn.execute("COMMIT")
    finally:
        conn.close()


def assert_tools_trip(path: Path) -> None:
    """What the tools did with a store of the previous release."""
    with pytest.raises(sqlite3.OperationalError, match="does not support scanning"):
        plain_counts(path)
    assert sqlite_utils("tables", str(path), "--counts").returncode != 0
    refused = sqlite_utils("search", str(path), "messages", "harbor")
    assert refused.returncode != 0 and "not configured for full-text search" in refused.stderr


def test_a_store_of_the_previous_release_is_brought_forward_and_searches_the_same(
    db_path: Path,
) -> None:
    fill_store(db_path)
    as_earlier_release(db_path)
    assert_tools_trip(db_path)
    with SessionDB(db_path, read_only=True) as reader:  # reads it as it is
        before = results(reader)
        with SessionDB(db_path) as db:  # brings it forward
            assert db.started_index_upkeep
            db.wait_for_index(30)
            assert results(db) == before
            assert db.fts_status()["missing_triggers"] == []
            assert db.check_fts_integrity() == dict.fromkeys(
                ("messages_fts", "messages_fts_trigram", "messages_fts_cjk"))
            db.append_message("s1", "user", "a harbor after the upgrade")
            assert results(reader)["harbor"] == results(db)["harbor"]
        snippets = [r["snippet"] for r in results(reader)["harbor"]]
        assert "a >>>harbor<<< after the upgrade" in snippets
    assert_tools_read(db_path)


def test_a_store_of_the_previous_release_whose_search_index_fts5_cannot_open_is_replaced(
    db_path: Path,
) -> None:
    """Its index table, too damaged to be dropped through FTS5, is emptied through its shadow
    tables first, those it has (no %_docsize)."""
    fill_store(db_path)
    as_earlier_release(db_path)
    conn = sqlite3.connect(db_path)
    try:  # the structure record
        conn.execute("UPDATE search_impact_fts_data SET block = randomblob(length(block))"
                     " WHERE id = 10")
        conn.commit()
    finally:
        conn.close()
    with SessionDB(db_path) as db:
        assert db.started_index_upkeep
        db.wait_for_index(30)
        assert {r["id"] for r in db.search_messages("harbor", limit=200)} == holding(
            db_path, "harbor")
    assert_tools_read(db_path)


def test_a_connection_that_read_the_earlier_declaration_reads_the_new_one(
    db_path: Path,
) -> None:
    """Another client connected before the upgrade: SQLite reads the schema again before its
    next statement, and its writes keep the index whole."""
    fill_store(db_path, 40)
    as_earlier_release(db_path)
    other = sqlite3.connect(db_path, isolation_level=None)
    try:
        assert other.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH"
                             " 'harbor'").fetchone()[0] > 0
        with SessionDB(db_path):
            pass
        other.execute("INSERT INTO messages (session_id, role, content, timestamp)"
                      " VALUES ('s1', 'user', 'harbor from another client', 1.0)")
        found = other.execute("SELECT m.content FROM messages_fts f JOIN messages m"
                              " ON m.id = f.rowid WHERE messages_fts MATCH 'client'").fetchall()
        assert found == [("harbor from another client",)]
        (sql,) = other.execute("SELECT sql FROM sqlite_master WHERE name = 'messages_fts'"
                               ).fetchone()
        assert 'content="messages"' in sql
    finally:
        other.close()
    with SessionDB(db_path) as db:
        assert db.check_fts_integrity()["messages_fts"] is None
        assert [r["id"] for r in db.search_messages("client")] == [41]


# Waits for the file argv[2] to appear, then opens the store argv[1] and appends a message.
OPENER = """
import sys, time
from pathlib import Path
from hermes_state import SessionDB
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.002)
with SessionDB(sys.argv[1]) as db:
    db.append_message("s1", "user", f"harbor written by opener {sys.argv[3]}")
print("appended")
"""


@pytest.mark.slow
def test_openers_racing_on_a_store_of_the_previous_release_bring_it_forward_once(
    db_path: Path, tmp_path: Path, spawn_python: Callable[..., subprocess.Popen[str]],
) -> None:
    fill_store(db_path, 200)
    as_earlier_release(db_path)
    go = tmp_path / "go"
    openers = [spawn_python(OPENER, str(db_path), str(go), str(n)) for n in range(4)]
    go.touch()
    for opener in openers:
        out, err = rest_of_output(opener)
        assert opener.returncode == 0 and out == "appended\n", err
    conn = sqlite3.connect(db_path)
    try:
        declared = conn.execute("SELECT name, sql FROM sqlite_master"
                                " WHERE name IN ('messages_fts', 'search_impact_fts')").fetchall()
    finally:
        conn.close()
    assert sorted(name for name, _ in declared) == ["messages_fts", "search_impact_fts"]
    assert all("content='messages'" not in sql and "columnsize" not in sql
               for _, sql in declared)
    with SessionDB(db_path) as db:
        assert db.check_fts_integrity() == dict.fromkeys(
            ("messages_fts", "messages_fts_trigram", "messages_fts_cjk"))
        assert len(db.search_messages("opener", limit=50)) == 4
    assert_tools_read(db_path)
