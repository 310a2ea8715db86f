"""Text another SQLite client stored that is not UTF-8.

SQLite keeps a text value as the bytes it was given, so a store another program writes may
hold text Python cannot decode. Every read of the library returns such a value as SQLite and
FTS5 read it (what search already shows), and no read changes the bytes on disk."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_state import InvalidInputError, SessionDB
from state_helpers import populate, sha256
from test_hermes_state_cli import as_json, cli

SEEDS = (1, 2, 3)

# Bytes that are not UTF-8 on their own: lone continuation bytes, cut sequences, a surrogate,
# an over-long form, a lead byte of a run past every code point. (No NUL: SQLite's own
# functions stop at one.)
_JUNK = [b"\xff", b"\x80", b"\xaa", b"\xc3", b"\xe6\x9d", b"\xed\xa0\x80", b"\xc0\xaf",
         b"\xf4\x90\x80\x80", b"\xfe\x80\x80\x80\x80\x80", b"\xf2\x80\x80\x80\x80\x80"]
_WORDS = ["docker", "gateway", "東京", "tool", "output", " ", "\n"]


def foreign_text(r: random.Random) -> bytes:
    """Words among bytes that are not UTF-8; never valid UTF-8 as a whole."""
    parts = [r.choice(_WORDS).encode() if r.random() < 0.5 else r.choice(_JUNK)
             for _ in range(r.randint(1, 12))]
    return b"".join(parts) + r.choice(_JUNK)


# SQLite's reading of a text value, code point by code point, by its own functions (length
# and substr step over characters as READ_UTF8 groups the bytes, unicode decodes one): the
# oracle, independent of the library's decoding.
_SQLITE_READS_SQL = """
WITH RECURSIVE i(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM i WHERE n < length(?1))
SELECT unicode(substr(?1, n, 1)) FROM i WHERE length(?1) > 0
"""


def as_sqlite_reads(raw: bytes) -> str:
    conn = sqlite3.connect(":memory:")
    try:
        points = [row[0] for row in conn.execute(
            _SQLITE_READS_SQL.replace("?1", "CAST(?1 AS TEXT)"), (raw,))]
    finally:
        conn.close()
    # A run of continuation bytes can add up past U+10FFFF, which no Python string holds
    # (unicode() returns such a C unsigned int as it is, or wrapped below zero): the library
    # reads it as U+100000 (unicode61 makes the same tokens of the two).
    return "".join(chr(p) if 0 <= p <= 0x10FFFF else "\U00100000" for p in points)


def store_foreign_text(db_path: Path, seed: int) -> dict[tuple[str, int | str, str], bytes]:
    """A populated store where another client wrote bytes that are not UTF-8 as text into
    message and session columns; returns (table, id, column) → the bytes."""
    with SessionDB(db_path) as db:
        populate(db)
    r = random.Random(seed)
    conn = sqlite3.connect(db_path, isolation_level=None)
    written: dict[tuple[str, int | str, str], bytes] = {}
    try:
        ids = [row[0] for row in conn.execute("SELECT id FROM messages ORDER BY id")]
        for row_id in r.sample(ids, 12):
            for column in r.sample(["content", "reasoning", "tool_name"], r.randint(1, 3)):
                raw = foreign_text(r)
                conn.execute(f"UPDATE messages SET {column} = CAST(? AS TEXT) WHERE id = ?",
                             (raw, row_id))
                written["messages", row_id, column] = raw
        for session_id in ("sess-0", "sess-2"):
            for column in ("system_prompt", "title"):
                raw = foreign_text(r)
                conn.execute(f"UPDATE sessions SET {column} = CAST(? AS TEXT) WHERE id = ?",
                             (raw, session_id))
                written["sessions", session_id, column] = raw
    finally:
        conn.close()
    return written


def stored_bytes(db_path: Path, written: dict[tuple[str, int | str, str], bytes]) -> dict:
    conn = sqlite3.connect(db_path)
    try:
        return {key: conn.execute(f"SELECT CAST({key[2]} AS BLOB) FROM {key[0]} WHERE id = ?",
                                  (key[1],)).fetchone()[0] for key in written}
    finally:
        conn.close()


def _messages_by_id(messages: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {m["id"]: m for m in messages if "id" in m}


@pytest.mark.parametrize("seed", SEEDS)
def test_every_read_returns_the_text_as_sqlite_reads_it(db_path: Path, seed: int) -> None:
    written = store_foreign_text(db_path, seed)
    before = stored_bytes(db_path, written)
    expected = {key: as_sqlite_reads(raw) for key, raw in written.items()}
    with SessionDB(db_path) as db:
        loaded: dict[int, dict[str, Any]] = {}
        for session_id in ("sess-0", "sess-1", "sess-2"):
            loaded |= _messages_by_id(db.get_messages(session_id, include_inactive=True))
            exported = db.export_session(session_id)
            assert exported is not None
            assert _messages_by_id(exported["messages"]) == _messages_by_id(
                db.get_messages(session_id, include_inactive=True))
            session = db.get_session(session_id)
            assert session is not None
            for column in ("system_prompt", "title"):
                if ("sessions", session_id, column) in expected:
                    assert session[column] == expected["sessions", session_id, column]
                    assert exported[column] == session[column]
            conversation = db.get_messages_as_conversation(session_id)
            contents = [m.get("content") for m in conversation]
            for (table, row_id, column), text in expected.items():
                if table == "messages" and column == "content" \
                        and loaded.get(row_id, {}).get("active") \
                        and loaded[row_id]["session_id"] == session_id:
                    assert text in contents
        for (table, row_id, column), text in expected.items():
            if table == "messages":
                assert loaded[row_id][column] == text
        listed = db.list_sessions_rich(include_children=True)
        assert {s["id"] for s in listed} >= {"sess-2"}
        assert len(db.export_all()) == 3
        lines = [json.loads(line) for line in db.iter_export_jsonl()]
        streamed = {line["message"]["id"]: line["message"]
                    for line in lines if line["kind"] == "message"}
        assert {i: streamed[i] for i in loaded} == loaded
    assert stored_bytes(db_path, written) == before  # nothing on disk was rewritten


def test_a_read_only_handle_and_the_command_line_read_it(db_path: Path,
                                                          hermes_home: Path) -> None:
    written = store_foreign_text(db_path, seed=4)
    digest = sha256(db_path)
    (row_id, column), raw = next(((k[1], k[2]), v) for k, v in written.items()
                                 if k[0] == "messages")
    conn = sqlite3.connect(db_path)
    (session_id,) = conn.execute("SELECT session_id FROM messages WHERE id = ?",
                                 (row_id,)).fetchone()
    conn.close()
    with SessionDB(db_path, read_only=True) as db:
        by_id = _messages_by_id(db.get_messages(session_id, include_inactive=True))
        assert by_id[row_id][column] == as_sqlite_reads(raw)
    shown = cli(hermes_home, "--json", "sessions", "show", session_id)
    assert shown.returncode == 0, shown.stderr
    exported = cli(hermes_home, "sessions", "export", session_id)
    assert exported.returncode == 0, exported.stderr
    streamed = [json.loads(line) for line in exported.stdout.splitlines()]
    message = next(line["message"] for line in streamed
                   if line["kind"] == "message" and line["message"]["id"] == row_id)
    assert message[column] == as_sqlite_reads(raw)
    assert as_json(shown)["messages"]
    assert sha256(db_path) == digest  # read-only, as it says


def test_a_rewind_to_such_a_turn_returns_it_as_sqlite_reads_it(db_path: Path) -> None:
    """The rewind reads its target row to return it: that read decodes as the others do, and
    the rows it marks keep their bytes."""
    written = store_foreign_text(db_path, seed=6)
    conn = sqlite3.connect(db_path, isolation_level=None)
    raw = b"rewind \xff\xc3 here"
    row_id, session_id = conn.execute(
        "SELECT id, session_id FROM messages WHERE role = 'user' AND active = 1"
        " ORDER BY id DESC LIMIT 1").fetchone()
    conn.execute("UPDATE messages SET content = CAST(? AS TEXT) WHERE id = ?", (raw, row_id))
    conn.close()
    written["messages", row_id, "content"] = raw
    before = stored_bytes(db_path, written)
    with SessionDB(db_path) as db:
        rewound = db.rewind_to_message(session_id, row_id)
        target = rewound["target_message"]
        assert target["content"] == as_sqlite_reads(raw) == "rewind \ufffd\ufffd here"
        assert rewound["rewound_count"] >= 1
        assert db.restore_rewound(session_id, row_id) == rewound["rewound_count"]
    assert stored_bytes(db_path, written) == before


# Any bytes but NUL, mostly pieces that are not UTF-8 on their own.
foreign_bytes = st.lists(st.one_of(st.sampled_from(_JUNK), st.binary(min_size=1, max_size=4),
                                   st.text(max_size=4).map(str.encode)), max_size=12).map(
    lambda parts: b"".join(parts).replace(b"\x00", b""))


def test_any_stored_bytes_read_as_sqlite_reads_them(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        row_id = db.append_message("s", "user", "placeholder text")
        other = sqlite3.connect(db_path, isolation_level=None)

        @settings(max_examples=200, deadline=None)
        @given(raw=foreign_bytes, name=foreign_bytes)
        def check(raw: bytes, name: bytes) -> None:
            other.execute("UPDATE messages SET content = CAST(? AS TEXT),"
                          " tool_name = CAST(? AS TEXT) WHERE id = ?", (raw, name, row_id))
            (message,) = db.get_messages("s")
            assert message["content"] == as_sqlite_reads(raw)
            assert message["tool_name"] == as_sqlite_reads(name)
            assert other.execute("SELECT CAST(content AS BLOB) FROM messages").fetchone() \
                == (raw,)

        try:
            check()
        finally:
            other.close()


def test_a_session_id_that_is_not_utf8_is_refused_not_silently_left_out(db_path: Path) -> None:
    """A read returns such an id as read, but no row is stored under that text: using it to
    look a row up (as an export does for every session it lists) is refused with a typed
    error instead of finding nothing, so no export quietly leaves a session out."""
    with SessionDB(db_path) as db:
        populate(db)
    raw = b"sess-\xff"
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("UPDATE sessions SET id = CAST(? AS TEXT) WHERE id = 'sess-1'", (raw,))
    conn.execute("UPDATE messages SET session_id = CAST(? AS TEXT)"
                 " WHERE session_id = 'sess-1'", (raw,))
    conn.execute("UPDATE sessions SET parent_session_id = CAST(? AS TEXT)"
                 " WHERE parent_session_id = 'sess-1'", (raw,))
    conn.close()
    digest = sha256(db_path)
    with SessionDB(db_path) as db:
        listed = db.list_sessions_rich(include_children=True, limit=10)
        (foreign,) = [s["id"] for s in listed if s["id"] not in ("sess-0", "sess-2")]
        assert foreign == as_sqlite_reads(raw) == "sess-\ufffd"
        for call in (lambda: db.get_messages(foreign), db.export_all,
                     lambda: db.export_session_lineage("sess-2"),
                     lambda: list(db.iter_export_jsonl()),
                     lambda: db.set_session_title(foreign, "renamed")):
            with pytest.raises(InvalidInputError, match="not UTF-8"):
                call()
        assert db.get_messages("sess-2")  # the other sessions read as ever
    assert sha256(db_path) == digest


def test_text_handed_back_is_stored_as_read_and_the_original_keeps_its_bytes(
    db_path: Path,
) -> None:
    """A compaction that keeps a turn as it read it stores the turn's text as read (valid
    UTF-8 from then on); the archived original keeps its bytes."""
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        row_id = db.append_message("s", "user", "placeholder")
        db.append_message("s", "assistant", "a reply")
    raw = b"keep \xc3 this"
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("UPDATE messages SET content = CAST(? AS TEXT) WHERE id = ?", (raw, row_id))
    conn.close()
    with SessionDB(db_path) as db:
        turns = db.get_messages_as_conversation("s")
        assert turns[0]["content"] == as_sqlite_reads(raw) == "keep \ufffd this"
        assert db.archive_and_compact("s", [{"role": "user", "content": "summary"}, turns[0]]) == 2
        assert [t["content"] for t in db.get_messages_as_conversation("s")] == [
            "summary", "keep \ufffd this"]
    conn = sqlite3.connect(db_path)
    stored = conn.execute("SELECT active, CAST(content AS BLOB) FROM messages"
                          " ORDER BY id").fetchall()
    conn.close()
    assert stored == [(0, raw), (0, b"a reply"), (1, b"summary"),
                      (1, "keep \ufffd this".encode())]
