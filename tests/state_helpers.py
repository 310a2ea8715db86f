"""Helpers shared by the transfer, recover, maintenance, read-only, CLI and search index tests:
stores with every kind of row, other processes holding a database, real damage to closed
files, maintenance killed in the middle of its promotion, and the search index checked whole."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import hermes_state_connect as dbconn
import hermes_state_fts as fts
import hermes_state_impact as impact
from hermes_state import SessionDB
from hermes_state_schema_sql import (
    DELIVERY_OBLIGATIONS_SQL,
    SEARCH_TRIGGER_NAMES,
    TIME_BLOCK_SHIFT,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


@contextlib.contextmanager
def raw(path: Path, *, write: bool = False) -> Iterator[sqlite3.Connection]:
    """The database file opened from outside with a plain stdlib connection, for inspecting what
    is on disk (read-only unless `write`, which damages or reshapes a file as an old version or a
    crash would); closed on leaving the block."""
    if write:
        conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    else:
        conn = sqlite3.connect(f"{Path(path).as_uri()}?mode=ro", uri=True, timeout=30)
    try:
        yield conn
    finally:
        conn.close()


class Connections:
    """A ``SessionDB(..., on_connect=...)`` hook that keeps every connection the handle opens
    and the statements each runs (sqlite3's trace callback), by role: ``"handle"`` (its own),
    ``"helper"``, ``"snapshot"``, ``"guard"``. ``trace`` is every statement in order, as
    (role, SQL) pairs. With ``trace=False`` it keeps the connections only."""

    def __init__(self, *, trace: bool = True) -> None:
        self.tracing = trace
        self.opened: list[tuple[str, sqlite3.Connection]] = []
        self.trace: list[tuple[str, str]] = []
        self.statements: dict[str, list[str]] = {}

    def __call__(self, role: str, conn: sqlite3.Connection) -> None:
        self.opened.append((role, conn))
        if not self.tracing:
            return
        mine = self.statements.setdefault(role, [])

        def seen(sql: str) -> None:
            mine.append(sql)
            self.trace.append((role, sql))

        conn.set_trace_callback(seen)

    def own(self) -> sqlite3.Connection:
        """The handle's own connection (the last one it opened as "handle")."""
        return [conn for role, conn in self.opened if role == "handle"][-1]

    def of(self, role: str) -> list[str]:
        """The statements connections of ``role`` ran (a live list: clear it to start over)."""
        return self.statements.setdefault(role, [])

    def take(self, role: str = "handle") -> list[str]:
        seen = list(self.of(role))
        self.of(role).clear()
        return seen


def in_transaction(path: Path, fn: Callable[[sqlite3.Connection], T]) -> T:
    """``fn(conn)`` in one ``BEGIN IMMEDIATE`` transaction of a connection of its own on
    ``path``, opened as the library opens its connections (for driving a sibling module's
    step functions, such as the search index's fill, beside an open handle)."""
    conn = dbconn.connect(path, "rw", timeout=30)
    try:
        with dbconn.transaction(conn):
            return fn(conn)
    finally:
        conn.close()


def populate(db: SessionDB, sessions: int = 3, messages: int = 6) -> list[str]:
    """Sessions in one lineage with titles, usage, tool calls, CJK text and an archived
    compression generation; returns the ids, root first."""
    ids = []
    for n in range(sessions):
        sid = f"sess-{n}"
        db.create_session(
            sid,
            "cli" if n % 2 == 0 else "telegram",
            model="model-a" if n % 2 == 0 else "model-b",
            system_prompt=f"prompt {n}",
            parent_session_id=ids[-1] if ids else None,
            cwd="/home/user/project",
        )
        db.set_session_title(sid, f"Title {n}")
        rows = []
        for i in range(messages):
            rows.append({"role": "user", "content": f"question {n}.{i} about docker 東京タワー"})
            rows.append(
                {
                    "role": "assistant",
                    "content": f"answer {n}.{i}",
                    "tool_calls": [{"id": f"c{i}", "function": {"name": "terminal"}}],
                    "reasoning": "thinking",
                    "reasoning_details": [{"type": "summary", "text": "x"}],
                }
            )
            rows.append({"role": "tool", "content": f"output {i}", "tool_call_id": f"c{i}",
                         "tool_name": "terminal"})
        rows[0] = {**rows[0], "active": False, "compacted": True}
        db.replace_messages(sid, rows)
        db.update_token_counts(sid, 100 + n, 50, model="model-a", estimated_cost_usd=0.25)
        if n < sessions - 1:
            db.end_session(sid, "compression")
        ids.append(sid)
    return ids


def add_ledgers_and_outbox(path: Path, session_id: str, obligations: int = 2) -> None:
    """Rows in the four runtime ledgers and in the lazily created delivery_obligations."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        now = time.time()
        conn.executescript(DELIVERY_OBLIGATIONS_SQL)
        conn.execute("BEGIN")
        conn.execute("INSERT INTO runtime_epoch VALUES (1, 3, 'inst', ?)", (now,))
        conn.execute(
            "INSERT INTO session_admissions (session_id, payload_json, status, created_at)"
            " VALUES (?, '{}', 'done', ?)",
            (session_id, now),
        )
        conn.execute(
            "INSERT INTO worker_executions (execution_id, session_id, epoch, kind, status,"
            " registered_at) VALUES ('e1', ?, 3, 'cron', 'done', ?)",
            (session_id, now),
        )
        conn.execute(
            "INSERT INTO worker_receipts VALUES ('e1', ?, 1, '{}', 'digest', ?)", (session_id, now)
        )
        for i in range(obligations):
            conn.execute(
                "INSERT INTO delivery_obligations (session_id, platform, chat_id, obligation_key,"
                " payload_json, created_at, updated_at) VALUES (?, 'telegram', 'c', ?, '{}', ?, ?)",
                (session_id, f"key-{i}", now, now),
            )
        conn.execute(
            "INSERT INTO gateway_routing VALUES ('', 'k', '{}', ?)", (now,)
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def file_hashes(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def btree_pages(path: Path, table: str) -> dict[str, list[int]]:
    """The pages of ``table``'s b-tree by kind (root, internal, leaf, overflow)."""
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        pages: dict[str, list[int]] = {"internal": [], "leaf": [], "overflow": []}
        for pageno, kind in conn.execute(
            "SELECT pageno, pagetype FROM dbstat WHERE name = ? ORDER BY pageno", (table,)
        ):
            pages[kind].append(pageno)
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,))
        pages["root"] = [root.fetchone()[0]]
        return pages
    finally:
        conn.close()


def overwrite_pages(path: Path, pages: list[int], seed: int = 0, page_size: int = 4096) -> None:
    """Destroy whole pages of a closed database file with random bytes."""
    rng = random.Random(seed)
    with open(path, "r+b") as fh:
        for page in pages:
            fh.seek((page - 1) * page_size)
            fh.write(rng.randbytes(page_size))


@contextlib.contextmanager
def process_holding(path: Path, body: str = "") -> Iterator[subprocess.Popen[str]]:
    """Another process with ``path`` open (a read done, so it holds its WAL locks), running
    ``body`` (``conn`` is its connection) and then waiting until the context ends."""
    code = textwrap.dedent(
        f"""
        import sqlite3, sys
        conn = sqlite3.connect({str(path)!r}, isolation_level=None)
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        """
    ) + textwrap.dedent(body) + '\nprint("ready", flush=True)\nsys.stdin.read()\n'
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        release_process(proc)


def release_process(proc: subprocess.Popen[str]) -> None:
    """End a child that holds something until its stdin closes: close stdin, wait briefly,
    kill it if it does not go, and close its stdout."""
    if proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


# --- maintenance killed half-way --------------------------------------------------------------

# Runs the command line in a fresh interpreter (with run_python / spawn_python): argv[1:] are
# its arguments.
CLI_CODE = "import sys, hermes_state_cli; sys.exit(hermes_state_cli.main(sys.argv[1:]))"

_PROMOTING = re.compile(r"promoting (\d+)/(\d+)$")
_JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")


def fill_store(path: Path, messages: int, reasoning_bytes: int) -> None:
    """A store with an empty session ``w`` and a session ``bulk`` of ``messages`` rows whose
    unindexed reasoning text makes the file big (so copies and promotions take a moment)."""
    with SessionDB(path) as db:
        db.create_session("w", "cli")
        db.create_session("bulk", "cli")
        db.replace_messages("bulk", [
            {"role": "assistant", "content": f"answer {i}",
             "reasoning": os.urandom(reasoning_bytes // 2).hex()}
            for i in range(messages)
        ])


def every_message(path: Path) -> list[tuple[object, ...]]:
    """Every message row (id, session, uid, content, reasoning) of a closed store, in id
    order, read through a read-only connection."""
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(
            "SELECT id, session_id, message_uid, content, reasoning FROM messages ORDER BY id"
        ).fetchall()
    finally:
        conn.close()


def detach_index_by_hand(path: Path) -> None:
    """What the run-time detach leaves, done by hand: the ``fts_stale`` marker ("test") set
    and a sync trigger gone. A repair of it rebuilds the indexes and promotes."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("INSERT INTO state_meta (key, value) VALUES ('fts_stale', 'test')")
        conn.execute("DROP TRIGGER messages_fts_insert")
    finally:
        conn.close()


def kill_while_promoting(proc: subprocess.Popen[str], nth: int = 1) -> tuple[int, int]:
    """SIGKILL the maintenance command ``proc`` (stderr piped) as soon as it reports the
    ``nth`` step of its promotion with part of the pages written and part not; returns that
    step's (pages done, pages in all). AssertionError when it ends before that step."""
    assert proc.stderr is not None
    seen = 0
    for line in proc.stderr:
        match = _PROMOTING.search(line.strip())
        if match and 0 < int(match[1]) < int(match[2]):
            seen += 1
            if seen == nth:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return int(match[1]), int(match[2])
    proc.wait()
    raise AssertionError(f"no promotion step {nth} reported (exit {proc.returncode})")


def has_hot_journal(path: Path) -> bool:
    """A rollback journal with a live header beside ``path``: what an interrupted write
    leaves (SQLite deletes the journal, or zeroes its header, when a write ends)."""
    try:
        with open(path.with_name(path.name + "-journal"), "rb") as fh:
            return fh.read(len(_JOURNAL_MAGIC)) == _JOURNAL_MAGIC
    except FileNotFoundError:
        return False


# --- interrupted transactions and damaged sidecars --------------------------------------------


def store_of(path: Path, prefix: str, sessions: int, per_session: int, seed: int) -> None:
    """A store whose rows all carry ``prefix`` (so two stores' rows can be told apart), with
    message sizes from ``seed`` (some spill to overflow pages)."""
    rng = random.Random(seed)
    with SessionDB(path) as db:
        for s in range(sessions):
            sid = f"{prefix}-{s}"
            db.create_session(sid, "cli")
            db.replace_messages(sid, [
                {"role": "user", "content": f"{prefix} {s}.{i} " + "x" * rng.randint(50, 2500)
                 + ("y" * 6000 if i % 53 == 0 else "")}
                for i in range(per_session)
            ])


def kill_restore_midway(home: Path, db_path: Path, snapshot: Path,
                        journal_bytes: int = 3 << 20) -> None:
    """Run ``hermes-state restore`` of ``snapshot`` onto ``db_path`` in another process and
    kill it (SIGKILL) while it promotes: once the live file's rollback journal has grown past
    ``journal_bytes`` (so the page cache has spilled snapshot pages into the live file). What
    is left is SQLite's own torn state: a main file mixing both databases, and a hot journal."""
    journal = db_path.with_name(db_path.name + "-journal")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes_state_cli", "--db", str(db_path), "restore",
         str(snapshot)],
        env=_child_env(HERMES_HOME=str(home)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError):
                if journal.stat().st_size > journal_bytes:
                    proc.kill()
                    break
            time.sleep(0.0005)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -9, "the restore finished before it could be killed"
    assert journal.stat().st_size > journal_bytes


# Appends argv[3] messages to session argv[2] of the store at argv[1] through SessionDB,
# printing each acknowledged id, then dies without closing: the -wal keeps every commit.
_APPEND_AND_DIE = """
import os, sys
from hermes_state import SessionDB
db = SessionDB(sys.argv[1])
for i in range(int(sys.argv[3])):
    print(db.append_message(sys.argv[2], "user", f"acked {i} " + "y" * (100 + 37 * i)), flush=True)
os._exit(0)
"""

# Appends to session argv[2] through SessionDB until a write fails as corrupt, printing each
# acknowledged id, then "corrupt" and the error; closes the handle (quarantined: no checkpoint).
_APPEND_UNTIL_CORRUPT = """
import sys
from hermes_state import SessionDB, StateDbCorruptError
db = SessionDB(sys.argv[1])
try:
    for i in range(3000):
        print(db.append_message(sys.argv[2], "user", f"acked {i} " + "z" * 300), flush=True)
except StateDbCorruptError as exc:
    print("corrupt", exc, flush=True)
db.close()
"""


def _child_env(**overrides: str) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **overrides}


def _acknowledged(code: str, *args: str) -> tuple[list[int], str]:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, env=_child_env())
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    return [int(x) for x in lines if x.isdigit()], done.stdout


def append_and_die(db_path: Path, session_id: str, count: int) -> list[int]:
    """``count`` messages appended by another process that then dies without closing; returns
    the ids it was acknowledged."""
    ids, _ = _acknowledged(_APPEND_AND_DIE, str(db_path), session_id, str(count))
    assert len(ids) == count
    return ids


def append_until_corrupt(db_path: Path, session_id: str) -> list[int]:
    """Append from another process until SessionDB reports corruption; returns the ids it was
    acknowledged before that."""
    ids, out = _acknowledged(_APPEND_UNTIL_CORRUPT, str(db_path), session_id)
    assert "corrupt" in out, "the writer never met the damage"
    return ids


def point_freelist_at_live_pages(db_path: Path, table: str, seed: int) -> list[int]:
    """Damage the freelist trunk page of a closed store: its leaf entries are replaced by
    pages of ``table``'s b-tree (some twice), so SQLite hands out live pages as free ones.
    Returns the pages named."""
    rng = random.Random(seed)
    leaves = btree_pages(db_path, table)["leaf"]
    with open(db_path, "r+b") as fh:
        header = fh.read(100)
        page_size = int.from_bytes(header[16:18], "big")
        trunk = int.from_bytes(header[32:36], "big")
        assert trunk, "the store has no free pages"
        fh.seek((trunk - 1) * page_size)
        page = bytearray(fh.read(page_size))
        count = int.from_bytes(page[4:8], "big")
        named = [rng.choice(leaves) for _ in range(count)]
        for i, pgno in enumerate(named):
            page[8 + 4 * i: 12 + 4 * i] = pgno.to_bytes(4, "big")
        fh.seek((trunk - 1) * page_size)
        fh.write(page)
    return named


def flip_byte(path: Path, offset: int, bit: int = 0x10) -> None:
    """Flip one bit of the byte at ``offset`` of a closed file."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ bit]))


def wal_frame_offset(wal: Path, frame: int, page_size: int = 4096) -> int:
    """Where frame ``frame`` (from 1) of a -wal starts: its 24-byte header, then the page."""
    return 32 + (frame - 1) * (24 + page_size)


def strip_search_index(path: Path) -> None:
    """Make a closed store what a file of schema 31 written before the search index existed
    is: every object of the index gone, everything else as it was."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for name in SEARCH_TRIGGER_NAMES:
            conn.execute(f"DROP TRIGGER {name}")
        for name in (*impact.INDEX_VIRTUAL_TABLES[::-1], *impact.INDEX_TABLES):
            conn.execute(f"DROP TABLE {name}")
    finally:
        conn.close()


def assert_search_index_exact(path: Path) -> None:
    """The search index of a closed store is whole and right: every message up to the batch
    boundary not waiting in the queue has the postings its text gives, and its time in its
    block; ``search_impact_fts`` holds exactly the stored postings, each once (nothing indexed
    twice or missed), beside its epoch token."""
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        epoch, avgdl, indexed, high_water, damaged = conn.execute(
            "SELECT epoch, avgdl, indexed, fill_high_water, damaged FROM search_impact_state"
        ).fetchone()
        assert high_water is None and not damaged, "the index is whole"
        queued = {r[0] for r in conn.execute("SELECT id FROM search_impact_queue")}
        gone = {r[0] for r in conn.execute("SELECT id FROM search_impact_gone")}
        kept = {i: (e, p) for i, e, p in conn.execute(
            "SELECT id, epoch, postings FROM search_impact")}
        rows = conn.execute("SELECT id, CAST(content AS BLOB), CAST(tool_name AS BLOB),"
                            " CAST(tool_calls AS BLOB) FROM messages").fetchall()
        for row_id, content, tool_name, tool_calls in rows:
            if row_id not in queued and row_id <= indexed:  # past it: the next batch's
                expected = impact.impact_postings(content, tool_name, tool_calls, avgdl)[0]
                assert kept.get(row_id) == (epoch, expected), row_id
        assert set(kept) - {r[0] for r in rows} <= gone, "postings of deleted rows are purged"
        expected_tokens = Counter(
            (token, row_id) for row_id, (_, postings) in kept.items()
            if postings for token in impact.index_text(postings).split())
        expected_tokens[(f"_epoch_{epoch}", 0)] += 1
        found = Counter(conn.execute("SELECT term, doc FROM search_impact_vocab").fetchall())
        assert found == expected_tokens
        blocks = dict(((b, (lo, hi)) for b, lo, hi in conn.execute(
            "SELECT block, first_at, last_at FROM search_time_blocks")))
        for row_id, stamp in conn.execute("SELECT id, timestamp FROM messages WHERE id <= ?",
                                          (indexed,)):
            lo, hi = blocks[row_id >> TIME_BLOCK_SHIFT]
            assert lo <= stamp <= hi, row_id
    finally:
        conn.close()


# Characters unicode61 and Python classify or fold differently: symbols and letters newer than
# SQLite's tables, combining marks, stacked diacritics, Greek with accents, ligatures, emoji,
# private use, unassigned code points.
TRICKY = ["⭊", "⮳", "ễ", "ầ", "Ὑ", "\u0301", "\u09fe", "ﬁ", "😀", "\ue000", "\u0ee6", "Ａ",
          "東京", "x²", "café", "—", "\u200d", "\u00ad", "é", "ß"]


def spell_as_earlier_version(path: Path) -> int:
    """Make a store's CJK index text what an earlier version wrote (without the tool name),
    through another client while the store may be open; returns the rows respelled."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(
            "SELECT id, content, tool_calls, search_cjk FROM messages WHERE tool_name IS NOT NULL"
        ).fetchall()
        changed = [(spelt, row_id) for row_id, content, tool_calls, stored in rows
                   if (spelt := fts.cjk_index_text(content, None, tool_calls)) != stored]
        conn.executemany("UPDATE messages SET search_cjk = ? WHERE id = ?", changed)
        conn.execute("DELETE FROM state_meta WHERE key = ?", (fts.SPELLING_KEY,))
        conn.execute("COMMIT")
        return len(changed)
    finally:
        conn.close()


def assert_spelled_current(path: Path) -> None:
    """Every row's CJK index text is the current spelling, and the file records it."""
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        for row_id, content, tool_name, tool_calls, stored in conn.execute(
                "SELECT id, CAST(content AS BLOB), CAST(tool_name AS BLOB),"
                " CAST(tool_calls AS BLOB), search_cjk FROM messages"):
            assert stored == fts.cjk_index_text(content, tool_name, tool_calls), row_id
        meta = dict(conn.execute("SELECT key, value FROM state_meta WHERE key LIKE 'search_cjk%'"))
        assert meta == {fts.SPELLING_KEY: fts.CJK_SPELLING}
    finally:
        conn.close()


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    """The JSON a command printed, once it exited 0."""
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def columns(text: str) -> int:
    """How many terminal columns ``text`` takes (wide characters two, combining marks none)."""
    return sum(0 if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf")
               else 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)
