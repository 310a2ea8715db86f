"""Helpers shared by the portability, recover, repair, read-only and CLI tests: stores with
every kind of row, other processes holding a database, real damage to closed files, and
maintenance killed in the middle of its promotion."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

from hermes_state import SessionDB
from hermes_state_common import DELIVERY_OBLIGATIONS_SQL


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
