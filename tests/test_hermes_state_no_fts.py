"""The store on SQLite builds without FTS5 (or without its trigram tokenizer): detection, a
store without the index, an indexed store opened by such a build (its index detached, never a
write refused), two builds writing one file at once, searches that answer what the indexes
answer, and index operations that say full-text search is unavailable.

A process "without FTS5" here is a real one: a ``sitecustomize`` removes the ``fts5`` and
``fts5vocab`` modules from every connection its ``sqlite3`` opens (SQLite's own
``sqlite3_create_module_v2`` with no module), so creating an FTS5 table fails with ``no such
module: fts5`` exactly as on a build without it, and so does every write whose triggers feed
one."""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, subprocess_env
from hypothesis import given, settings
from hypothesis import strategies as st
from state_helpers import every_message, release_process
from test_hermes_state_upstream_upgrade import build_upstream

import hermes_state_cli
import hermes_state_fulltext as fulltext
from hermes_state import (
    FullTextUnavailableError,
    InvalidInputError,
    SessionDB,
)

# Removes FTS5 from every connection this interpreter's sqlite3 opens.
WITHOUT_FTS5 = '''
import ctypes
import sqlite3

_lib = ctypes.CDLL("libsqlite3.so.0")
_lib.sqlite3_create_module_v2.argtypes = [
    ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
_connect = sqlite3.connect


def connect(*args, **kwargs):
    conn = _connect(*args, **kwargs)
    handle = ctypes.c_void_p.from_address(id(conn) + object.__basicsize__).value
    for module in (b"fts5", b"fts5vocab"):
        _lib.sqlite3_create_module_v2(handle, module, None, None, None)
    return conn


sqlite3.connect = connect
'''

FTS_TRIGGERS = {"messages_fts_insert", "messages_fts_update", "messages_fts_delete"}
INDEX_TABLES = {"messages_fts", "messages_fts_trigram", "messages_fts_cjk", "search_impact_fts"}


@pytest.fixture
def without_fts5(tmp_path: Path, run_python: Any) -> dict[str, str]:
    """The environment of a process whose SQLite has no FTS5 (skipped where the mechanism
    cannot work: an SQLite linked statically into Python)."""
    site = tmp_path / "site-without-fts5"
    site.mkdir()
    (site / "sitecustomize.py").write_text(WITHOUT_FTS5)
    env = {"PYTHONPATH": str(site)}
    probe = run_python(
        "import sqlite3\n"
        "try:\n"
        "    sqlite3.connect(':memory:').execute('CREATE VIRTUAL TABLE t USING fts5(x)')\n"
        "except sqlite3.OperationalError as exc:\n"
        "    print(exc)\n", env=env)
    if probe.stdout.strip() != "no such module: fts5":
        pytest.skip(f"cannot take FTS5 away from this sqlite3: {probe.stderr[-300:]}")
    return env


def names(path: Path, kind: str) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = ?",
                                           (kind,))}
    finally:
        conn.close()


def stale_reason(path: Path) -> str | None:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT value FROM state_meta WHERE key = 'fts_stale'").fetchone()
    finally:
        conn.close()
    return None if row is None else str(json.loads(row[0])["reason"])


def message_ids(path: Path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM messages ORDER BY id")]
    finally:
        conn.close()


def ids(hits: list[dict[str, Any]]) -> list[int]:
    return [h["id"] for h in hits]


def run_ok(run_python: Any, code: str, *args: str, env: dict[str, str]) -> str:
    result = run_python(code, *args, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return str(result.stdout)


# --- detection and the parameter ----------------------------------------------------------------


@pytest.mark.slow
def test_a_process_without_fts5_detects_it_and_opens_at_level_none(
    tmp_path: Path, run_python: Any, without_fts5: dict[str, str]
) -> None:
    path = tmp_path / "state.db"
    out = run_ok(run_python, """
import sys
import hermes_state_fulltext as fulltext
from hermes_state import FullTextUnavailableError, SessionDB
print(fulltext.detected())
for level in ("full", "no-trigram"):
    try:
        SessionDB(sys.argv[1], full_text=level)
    except FullTextUnavailableError as exc:
        print("refused", level, exc.level)
with SessionDB(sys.argv[1]) as db:
    print(db.full_text)
    db.create_session("s1", "cli")
    db.append_message("s1", "user", "deploy the gateway")
    print([h["id"] for h in db.search_messages("gateway")])
""", str(path), env=without_fts5)
    assert out.split("\n")[:5] == ["none", "refused full none", "refused no-trigram none",
                                   "none", "[1]"]
    assert not names(path, "table") & INDEX_TABLES
    assert not names(path, "trigger") & FTS_TRIGGERS
    assert stale_reason(path) == fulltext.UNAVAILABLE_REASON


def test_the_full_text_parameter_is_checked(tmp_path: Path) -> None:
    assert fulltext.detected() in fulltext.LEVELS
    for bad in ("fts5", "", 0, True):
        with pytest.raises(InvalidInputError):
            SessionDB(tmp_path / "x.db", full_text=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "x.db").exists()
    with SessionDB(tmp_path / "y.db") as db:
        assert db.full_text == fulltext.detected()
    with SessionDB(tmp_path / "y.db", full_text="none") as db:
        assert db.full_text == "none"


# --- a store kept without the index ---------------------------------------------------------------


def test_a_new_store_without_fts_has_no_index_and_everything_else_works(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    with SessionDB(path, full_text="none") as db:
        db.create_session("root", "cli", model="m1")
        db.set_session_title("root", "First title")
        db.append_message("root", "user", "Tokyo trip plan 東京へ行く")
        db.append_message("root", "assistant", "Booked the train", )
        db.end_session("root", "compression")
        db.create_session("child", "cli", parent_session_id="root")
        db.append_message("child", "user", "continue the trip plan")
        assert db.get_compression_tip("root") == "child"
        db.create_session("gw", "telegram")
        db.begin_runtime_epoch("owner-1")
        admitted = db.admit_input("gw", {"text": "hi"}, request_id="r1")
        assert db.get_admission(admitted["id"])["status"] == "queued"
        db.replace_messages("child", [{"role": "user", "content": "rewritten trip plan"}])
        exported = "".join(db.iter_export_jsonl())
        assert db.message_count("child") == 1
        assert {h["session_id"] for h in db.search_messages("trip")} == {"root", "child"}
        assert ids(db.search_messages("東京")) == [1]
        assert db.optimize_fts() == 0
        assert db.vacuum() == 0
        db.delete_session("child")
    assert not names(path, "table") & INDEX_TABLES
    assert not names(path, "trigger") & FTS_TRIGGERS
    other = tmp_path / "other.db"
    with SessionDB(other, full_text="none") as db:
        db.import_jsonl(io.StringIO(exported))
        assert sorted(s["id"] for s in db.search_sessions()) == ["child", "gw", "root"]
        assert ids(db.search_messages("rewritten")) != []


def test_index_operations_say_full_text_search_is_unavailable(tmp_path: Path) -> None:
    with SessionDB(tmp_path / "state.db", full_text="none") as db:
        with pytest.raises(FullTextUnavailableError, match="unavailable") as rebuilt:
            db.rebuild_fts()
        assert rebuilt.value.level == "none"
        with pytest.raises(FullTextUnavailableError, match="unavailable"):
            db.check_fts_integrity()
        assert db.optimize_fts() == 0


# --- the scan answers what the indexes answer ---------------------------------------------------

CORPUS = [
    ("cli", "user", "Deploy the gateway to production tonight", None),
    ("cli", "assistant", "The gateway deploy failed: timeout in chat-send", None),
    ("cli", "tool", "deploy log: gateway/run.py exited 1", "shell"),
    ("telegram", "user", "Python入門の本を買った", None),
    ("telegram", "assistant", "東京都の天気は晴れです", None),
    ("telegram", "user", "東京に行きたい。京都も。", None),
    ("cli", "user", "The café downtown serves CAFE au lait", None),
    ("cli", "assistant", "concatenate the cat files, then deploy again", None),
    ("discord", "user", "100%完成です、ありがとう", None),
    ("discord", "user", "100完成ではない", None),
    ("cli", "assistant", "graph theory and deployment graphs", None),
    ("cli", "user", "gateway gateway gateway deploy deploy", None),
    ("discord", "assistant", "It's fine — deploying now, honestly", None),
    ("cli", "tool", '{"result": "gateway restarted"}', "restart_gateway"),
]
QUERIES = ["deploy", "gateway", "gateway deploy", '"the gateway"', "deploy OR 東京",
           "deploy NOT gateway", "dep*", "python", "東京", "東", "京都", "cafe", "café",
           "cat", "gra", "100%完成", "chat-send", "it's", "gateway/run.py", "restart_gateway",
           "deploy AND NOT timeout", "晴れ", "入門", "no-such-word", "ploy"]


def build(path: Path, full_text: str | None) -> SessionDB:
    db = SessionDB(path, full_text=full_text)
    for i, (source, role, content, tool) in enumerate(CORPUS):
        sid = f"s-{source}"
        if db.get_session(sid) is None:
            db.create_session(sid, source)
        db.append_message(sid, role, content, tool_name=tool)
    return db


@pytest.mark.parametrize("sort", [None, "newest", "oldest"])
def test_scanned_searches_find_the_indexed_rows(tmp_path: Path, sort: str | None) -> None:
    indexed = build(tmp_path / "indexed.db", None)
    scanned = build(tmp_path / "scanned.db", "none")
    try:
        assert indexed.full_text == "full"
        for query in QUERIES:
            for filters in ({}, {"source_filter": ["cli"]}, {"exclude_sources": ["cli"]},
                            {"role_filter": ["user"]}):
                want = indexed.search_messages(query, sort=sort, limit=50, **filters)
                got = scanned.search_messages(query, sort=sort, limit=50, **filters)
                assert sorted(ids(got)) == sorted(ids(want)), (query, filters)
                assert [h.get("match") for h in got] == [h.get("match") for h in want]
                if sort is not None:  # time order is exact
                    assert ids(got) == ids(want), (query, filters)
                snippets = {h["id"]: h["snippet"] for h in want}
                assert {h["id"]: h["snippet"] for h in got} == snippets, query
            pages = [ids(scanned.search_messages(query, sort=sort, limit=3, offset=o))
                     for o in range(0, 15, 3)]
            whole = ids(scanned.search_messages(query, sort=sort, limit=15))
            assert [row for page in pages for row in page] == whole
    finally:
        indexed.close()
        scanned.close()


def test_scanned_relevance_ranks_as_bm25_does(tmp_path: Path) -> None:
    indexed = build(tmp_path / "indexed.db", None)
    scanned = build(tmp_path / "scanned.db", "none")
    try:
        for query in ("gateway", "deploy", "gateway deploy"):
            assert ids(scanned.search_messages(query)) == ids(indexed.search_messages(query))
    finally:
        indexed.close()
        scanned.close()


def test_without_trigram_substrings_scan_and_words_keep_fts5(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with build(path, None) as db:
        full = {q: ids(db.search_messages(q)) for q in QUERIES}
    # Another client empties the word index: a handle that reads it finds no word there,
    # while the substring routes (scanned without the trigram index) still find theirs.
    with SessionDB(path, full_text="no-trigram") as db:
        assert db.full_text == "no-trigram"
        assert {q: ids(db.search_messages(q)) for q in QUERIES} == full
        conn = sqlite3.connect(path)
        conn.execute("INSERT INTO messages_fts_trigram(messages_fts_trigram) VALUES ('delete-all')")
        conn.commit()
        assert ids(db.search_messages("ploy")) == full["ploy"] != []
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('delete-all')")
        conn.commit()
        conn.close()
        # The words come from FTS5: none is left there, so only substring hits remain.
        assert {h.get("match") for h in db.search_messages("gatew*")} == {"substring"}


# --- an indexed store and a build without FTS5 ----------------------------------------------------


def wait_until_rebuilt(db: SessionDB, timeout: float = 60.0) -> None:
    """Wait for the handle's background rebuild (public status only)."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = db.fts_status()
        if (status["stale"] is None and status["rebuild_high_water"] is None
                and not status["missing_triggers"]):
            return
        time.sleep(0.05)
    raise AssertionError(f"the index was not rebuilt: {db.fts_status()}")


# Appends argv[2] messages "bravo <i>" to session "b" (created when missing), printing each id
# once it is acknowledged; with argv[3] == "pause", waits for a line on stdin half-way.
APPEND_WITHOUT_FTS5 = """
import sys
from hermes_state import SessionDB
count, pause = int(sys.argv[2]), sys.argv[3] == "pause"
with SessionDB(sys.argv[1]) as db:
    print("level", db.full_text, flush=True)
    if db.get_session("b") is None:
        db.create_session("b", "cli")
    for i in range(count):
        if pause and i == count // 2:
            print("half", flush=True)
            sys.stdin.readline()
        print("id", db.append_message("b", "user", f"bravo message {i} 東京"), flush=True)
    print("scan", *[h["id"] for h in db.search_messages("bravo", limit=1000)], flush=True)
"""


def acknowledged(out: str) -> list[int]:
    return [int(line.split()[1]) for line in out.splitlines() if line.startswith("id ")]


@pytest.mark.slow
def test_an_indexed_store_opened_without_fts5_detaches_it_and_loses_nothing(
    tmp_path: Path, run_python: Any, without_fts5: dict[str, str]
) -> None:
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("a", "cli")
        before = [db.append_message("a", "user", f"alpha message {i}") for i in range(5)]
    # The previous store's schema repair probes with a write: a build without FTS5 meets the
    # triggers there, which is no damage (a SessionDB detaches them).
    probe = run_ok(run_python, "import sys, hermes_state as hs\n"
                   "print(hs.repair_state_db_schema(sys.argv[1])['strategy'])",
                   str(path), env=without_fts5)
    assert probe.split() == ["already_healthy"]
    out = run_ok(run_python, APPEND_WITHOUT_FTS5, str(path), "6", "no", env=without_fts5)
    added = acknowledged(out)
    assert out.startswith("level none") and len(added) == 6
    assert [int(i) for i in out.split("scan")[1].split()] == added
    rows = {row[0]: row[3] for row in every_message(path)}
    assert sorted(rows) == sorted(before + added)
    assert not names(path, "trigger") & FTS_TRIGGERS
    assert stale_reason(path) == fulltext.UNAVAILABLE_REASON
    with SessionDB(path) as db:  # a process with FTS5, alone on the file: rebuilt
        wait_until_rebuilt(db)
        assert db.check_fts_integrity() == dict.fromkeys(
            ("messages_fts", "messages_fts_trigram", "messages_fts_cjk"))
        assert sorted(ids(db.search_messages("bravo", limit=100))) == added
        assert sorted(ids(db.search_messages("東京", limit=100))) == added
        assert sorted(ids(db.search_messages("alpha", limit=100))) == before
    assert names(path, "trigger") >= FTS_TRIGGERS


@pytest.mark.slow
def test_the_command_line_without_fts5_searches_and_doctor_says_so(
    tmp_path: Path, run_python: Any, without_fts5: dict[str, str]
) -> None:
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("a", "cli")
        db.append_message("a", "user", "alpha message")
    run_ok(run_python, APPEND_WITHOUT_FTS5, str(path), "2", "no", env=without_fts5)
    cli = "import runpy; runpy.run_module('hermes_state_cli', run_name='__main__')"
    found = run_python(cli, "--db", str(path), "sessions", "search", "bravo", env=without_fts5)
    assert found.returncode == 0, found.stderr
    assert found.stdout.count(">>>bravo<<<") == 2
    doctor = run_python(cli, "--db", str(path), "doctor", env=without_fts5)
    assert "full-text search is unavailable on this SQLite build" in doctor.stdout
    assert "Traceback" not in doctor.stderr
    repair = run_python(cli, "--db", str(path), "sessions", "repair", env=without_fts5)
    assert repair.returncode != 0 and "full-text search is unavailable" in repair.stderr
    assert "Traceback" not in repair.stderr


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_builds_write_one_file_at_once_and_nothing_is_lost(
    tmp_path: Path, without_fts5: dict[str, str], seed: int
) -> None:
    """A process with FTS5 keeps its handle open and writes while one without FTS5 writes the
    same file; half-way the first rebuilds the index (its triggers come back while the other
    still runs, and its next write detaches them again). Every acknowledged write stays, and
    every search answers the rows that are there."""
    import random
    rng = random.Random(seed)
    path = tmp_path / "state.db"
    count = rng.randrange(20, 40)
    with SessionDB(path) as db:
        db.create_session("a", "cli")
        alpha = [db.append_message("a", "user", f"alpha message {i}") for i in range(3)]
        child = subprocess.Popen(
            [sys.executable, "-c", APPEND_WITHOUT_FTS5, str(path), str(count), "pause"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=subprocess_env(without_fts5), cwd=REPO_ROOT)
        try:
            assert child.stdout is not None and child.stdin is not None
            lines = []
            while (line := child.stdout.readline()) and line.strip() != "half":
                lines.append(line)
                if rng.random() < 0.5:
                    alpha.append(db.append_message("a", "user", f"alpha message {len(alpha)}"))
            assert line.strip() == "half", child.stderr.read() if child.stderr else ""
            bravo = acknowledged("".join(lines))
            assert db.fts_status()["stale"] is not None  # detached by the other process
            assert sorted(ids(db.search_messages("bravo", limit=1000))) == bravo
            db.rebuild_fts()  # the triggers are back while the other process still writes
            assert db.fts_status()["stale"] is None
            assert sorted(ids(db.search_messages("alpha", limit=1000))) == alpha
            child.stdin.write("go\n")
            child.stdin.flush()
            for _ in range(rng.randrange(1, 5)):
                alpha.append(db.append_message("a", "user", f"alpha message {len(alpha)}"))
            out, err = child.communicate(timeout=120)
        finally:
            release_process(child)
            if child.stderr is not None:
                child.stderr.close()
        assert child.returncode == 0, err[-3000:]
        bravo += acknowledged(out)
        assert len(bravo) == count
        assert stale_reason(path) == fulltext.UNAVAILABLE_REASON  # detached again
        # This process's searches now scan: the rows written without an index are found.
        assert sorted(ids(db.search_messages("bravo", limit=1000))) == sorted(bravo)
        assert sorted(ids(db.search_messages("alpha", limit=1000))) == sorted(alpha)
        assert [int(i) for i in out.split("scan")[1].split()] == sorted(bravo)
    rows = {row[0] for row in every_message(path)}
    assert rows == set(alpha) | set(bravo)
    with SessionDB(path) as db:
        wait_until_rebuilt(db)
        assert db.check_fts_integrity() == dict.fromkeys(
            ("messages_fts", "messages_fts_trigram", "messages_fts_cjk"))
        assert sorted(ids(db.search_messages("bravo", limit=1000))) == sorted(bravo)
        assert sorted(ids(db.search_messages("alpha", limit=1000))) == sorted(alpha)


def test_a_store_made_without_trigram_keeps_two_indexes_until_a_full_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "state.db"
    scanned = build(path, "no-trigram")
    indexed = build(tmp_path / "indexed.db", None)
    try:
        assert "messages_fts_trigram" not in names(path, "table")
        assert {"messages_fts", "messages_fts_cjk", "search_impact_fts"} <= names(path, "table")
        assert names(path, "trigger") >= FTS_TRIGGERS
        assert "trigram_stale" in scanned.fts_status()
        for query in QUERIES:
            for sort in (None, "newest"):
                want = indexed.search_messages(query, sort=sort, limit=50)
                got = scanned.search_messages(query, sort=sort, limit=50)
                assert ids(got) == ids(want), (query, sort)
                assert [h["snippet"] for h in got] == [h["snippet"] for h in want]
    finally:
        indexed.close()
        scanned.close()
    assert hermes_state_cli.main(["--db", str(path), "doctor"]) == 0  # not damage
    assert "the trigram index misses rows" in capsys.readouterr().out
    with SessionDB(path) as db:  # a handle with the trigram tokenizer, alone: all three
        wait_until_rebuilt(db)
        assert "trigram_stale" not in db.fts_status()
        assert db.check_fts_integrity() == dict.fromkeys(
            ("messages_fts", "messages_fts_trigram", "messages_fts_cjk"))
        assert ids(db.search_messages("ploy")) != []
    with SessionDB(path, full_text="no-trigram") as db:  # its triggers stop feeding it again
        db.append_message("s-cli", "user", "redeploy later")
        assert "trigram_stale" in db.fts_status()
        assert "redeploy later" in [h["snippet"].replace(">>>", "").replace("<<<", "")
                                    for h in db.search_messages("ploy")]


WORDS = ["deploy", "gateway", "the", "cat", "東京", "京都", "東", "python", "入門", "café",
         "cafe", "graph", "100%完成", "dep*", "gate*", '"the gateway"', "chat-send", "it's",
         "AND", "OR", "NOT", "晴れ", "ploy", "restart_gateway", "log:", "*", "Deploy"]


@pytest.fixture(scope="module")
def twin_stores(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("twins")
    indexed, scanned = build(folder / "indexed.db", None), build(folder / "scanned.db", "none")
    yield indexed, scanned
    indexed.close()
    scanned.close()


@settings(max_examples=60, deadline=None)
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
       sort=st.sampled_from([None, "newest", "oldest"]))
def test_any_query_scans_to_the_indexed_rows(
    twin_stores: tuple[SessionDB, SessionDB], words: list[str], sort: str | None
) -> None:
    indexed, scanned = twin_stores
    query = " ".join(words)
    want = indexed.search_messages(query, sort=sort, limit=50)
    got = scanned.search_messages(query, sort=sort, limit=50)
    assert sorted(ids(got)) == sorted(ids(want)), query
    if sort is not None:
        assert ids(got) == ids(want), query
    assert {h["id"]: h["snippet"] for h in got} == {h["id"]: h["snippet"] for h in want}


@pytest.mark.slow
def test_a_previous_store_upgraded_without_fts5_gets_its_index_at_the_next_full_open(
    tmp_path: Path, run_python: Any, without_fts5: dict[str, str]
) -> None:
    """The FTS generation step cannot run without FTS5 (the old index can be neither dropped
    nor replaced there): it is left due, and the next open with FTS5 replaces the old tables
    before it completes the schema."""
    path = tmp_path / "state.db"
    build_upstream(path, 0)
    rows_before = message_ids(path)
    out = run_ok(run_python, """
import sys
from hermes_state import SessionDB
with SessionDB(sys.argv[1]) as db:
    sid = db.list_sessions_rich(limit=1)[0]["id"]
    print(db.append_message(sid, "user", "written while upgraded without fts5"))
""", str(path), env=without_fts5)
    added = int(out.split()[0])
    assert message_ids(path) == [*rows_before, added]
    assert stale_reason(path) == fulltext.UNAVAILABLE_REASON
    with SessionDB(path) as db:
        wait_until_rebuilt(db)
        assert db.check_fts_integrity() == dict.fromkeys(
            ("messages_fts", "messages_fts_trigram", "messages_fts_cjk"))
        assert ids(db.search_messages("upgraded")) == [added]
        assert db.get_meta("fts_generation_due") is None
    assert message_ids(path) == [*rows_before, added]
