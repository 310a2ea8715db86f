"""The session pickers' reads on a store of 10,000 sessions: ``python -m bench.listing``.

What it models: a store a busy agent has kept for half a year. Its sessions take their first
messages from the seeded corpus (``bench.corpus``) and come in the shapes the pickers list:
conversations compressed into chains of two to four segments, delegate children, ``/branch``
children, cron runs of a few jobs, archived conversations, titles on half of them (some with
punctuation, ``AN-94 …``), working directories under a few projects.

What it measures: the wall-clock time of each call a picker, the dashboard or ``/resume``
makes on every open, on one writable handle, as the median and 95th percentile of repeated
calls. A call the library does not offer (an older version run for comparison) is reported as
absent rather than failing, so the same script measures before and after a change.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import sqlite3
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hermes_state_connect as dbconn
import hermes_state_messages as messages
from bench.corpus import CorpusSession, generate_corpus
from bench.suite import direct, scratch_dir
from hermes_state import SessionDB

__all__ = ["build_store", "main"]

PROJECTS = ("/src/hermes", "/src/hermes-web", "/home/dev/notes", "/srv/gateway", "C:\\work\\app")
CRON_JOBS = ("nightly", "digest", "backup")


def _texts(n_sessions: int) -> list[CorpusSession]:
    """Corpus sessions to borrow messages from (cycled over the store's sessions)."""
    return list(generate_corpus(min(60_000, 12 * n_sessions), seed=1))


def _insert(conn: sqlite3.Connection, row: dict[str, Any], source: CorpusSession,
            n_messages: int) -> None:
    names = list(row)
    conn.execute(f"INSERT INTO sessions ({', '.join(names)}) VALUES "
                 f"({', '.join('?' * len(names))})", list(row.values()))
    for i, message in enumerate(source.messages[:n_messages]):
        fields = message.as_append_kwargs()
        fields["timestamp"] = row["started_at"] + 60.0 * (i + 1)
        messages.insert_message(conn, row["id"], fields)


def build_store(path: Path, n_sessions: int, seed: int = 7) -> dict[str, int]:
    """A store of exactly ``n_sessions`` sessions; returns how many of each shape."""
    r = random.Random(seed)
    texts = _texts(n_sessions)
    span = 182 * 86_400.0
    start = 1_735_689_600.0
    shapes = {"root": 0, "continuation": 0, "delegate": 0, "branch": 0, "cron": 0,
              "archived": 0}
    made = 0
    batch: list[tuple[dict[str, Any], CorpusSession, int]] = []

    def add(row: dict[str, Any], n_messages: int) -> None:
        nonlocal made
        batch.append((row, texts[made % len(texts)], n_messages))
        made += 1

    SessionDB(path, rebuild_fts=False).close()  # a new store, loaded below
    while made < n_sessions:
        t = start + r.random() * span
        sid = f"{time.strftime('%Y%m%d_%H%M%S', time.gmtime(t))}_{r.getrandbits(24):06x}"
        kind = r.random()
        base = {"id": sid, "source": r.choice(("cli", "telegram", "discord", "tui")),
                "started_at": t, "cwd": r.choice(PROJECTS) + r.choice(("", "/api", "/ui")),
                "model": "anthropic/claude-sonnet-4.6",
                "archived": int(r.random() < 0.03)}
        if r.random() < 0.5:
            base["title"] = f"{r.choice(('AN-94', 'Deploy', 'Fix', 'Plan'))} {sid[-6:]}"
        if kind < 0.05:
            job = r.choice(CRON_JOBS)
            base.update(id=f"cron_{job}_{sid}", source="cron", title=None)
            add(base, 4)
            shapes["cron"] += 1
            continue
        n_segments = r.randint(2, 4) if kind < 0.25 else 1
        parent = None
        for segment in range(n_segments):
            row = dict(base)
            if segment:
                row.update(id=f"{sid}_c{segment}", parent_session_id=parent,
                           started_at=t + 3600.0 * segment, title=None)
                shapes["continuation"] += 1
            else:
                shapes["root"] += 1
                shapes["archived"] += base["archived"]
            if segment < n_segments - 1:
                row.update(ended_at=row["started_at"] + 3000.0, end_reason="compression")
            add(row, r.randint(3, 10))
            parent = row["id"]
        if 0.25 <= kind < 0.35:
            add({"id": f"{sid}_d", "source": "subagent", "started_at": t + 60.0,
                 "parent_session_id": sid, "archived": base["archived"],
                 "model_config": json.dumps({"_delegate_from": sid})}, 4)
            shapes["delegate"] += 1
        elif 0.35 <= kind < 0.40:
            add({"id": f"{sid}_b", "source": base["source"], "started_at": t + 120.0,
                 "parent_session_id": sid, "archived": base["archived"],
                 "model_config": json.dumps({"_branched_from": sid})}, 4)
            shapes["branch"] += 1
    rows = batch[:n_sessions]
    with direct(path) as conn:
        for i in range(0, len(rows), 250):
            with dbconn.transaction(conn):
                for item in rows[i:i + 250]:
                    _insert(conn, *item)
    shapes["sessions"] = len(rows)
    return shapes


def _timed(call: Callable[[], Any], repeats: int) -> dict[str, float]:
    call()  # warm the page cache and the statement cache
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        runs.append((time.perf_counter() - t0) * 1000.0)
    runs.sort()
    return {"median_ms": round(statistics.median(runs), 2),
            "p95_ms": round(runs[min(len(runs) - 1, int(0.95 * len(runs)))], 2)}


def _accepts(method: Callable[..., Any], *names: str) -> bool:
    params = inspect.signature(method).parameters
    return all(n in params for n in names)


def measure(path: Path, repeats: int) -> dict[str, dict[str, float] | str]:
    results: dict[str, dict[str, float] | str] = {}
    with SessionDB(path, rebuild_fts=False) as db:
        rich = db.list_sessions_rich
        calls: list[tuple[str, tuple[str, ...], Callable[[], Any]]] = [
            ("list_sessions_rich() first page of 20", (), lambda: rich()),
            ("list_sessions_rich(limit=50, offset=5000)", (),
             lambda: rich(limit=50, offset=5000)),
            ("list_sessions_rich(order_by_last_active=True, limit=50)",
             ("order_by_last_active",), lambda: rich(order_by_last_active=True, limit=50)),
            ("... the same at offset=5000", ("order_by_last_active",),
             lambda: rich(order_by_last_active=True, limit=50, offset=5000)),
            ("... with search_query='an94'", ("order_by_last_active", "search_query"),
             lambda: rich(order_by_last_active=True, limit=50, search_query="an94")),
            ("... with cwd_prefix, compact_rows, min_message_count=4",
             ("cwd_prefix", "compact_rows", "min_message_count"),
             lambda: rich(order_by_last_active=True, limit=50, cwd_prefix="/src/hermes",
                          compact_rows=True, min_message_count=4)),
            (("list_sessions_rich(include_children=True, order_by_last_active=True, "
              "project_compression_tips=False)"), ("include_children",),
             lambda: rich(include_children=True, order_by_last_active=True,
                          project_compression_tips=False, limit=50)),
            ("session_count()", (), lambda: db.session_count()),
            ("session_count(exclude_children=True, exclude_sources=['cron'])",
             ("exclude_children",),
             lambda: db.session_count(exclude_children=True, exclude_sources=["cron"])),
            ("search_sessions(limit=20)", (), lambda: db.search_sessions(limit=20)),
            ("search_sessions_by_id('_c1')", (), lambda: db.search_sessions_by_id("_c1")),
            ("list_cron_job_runs('nightly')", (), lambda: db.list_cron_job_runs("nightly")),
            ("resolve_resume_session_id(a compressed root)", (),
             lambda: db.resolve_resume_session_id(_a_compressed_root(db))),
        ]
        for name, needs, call in calls:
            method_name = name.split("(")[0] if not name.startswith("...") else ""
            target = getattr(db, method_name, rich) if method_name else rich
            if (method_name and not hasattr(db, method_name)) or (
                needs and not _accepts(target, *needs)
            ):
                results[name] = "absent"
                continue
            results[name] = _timed(call, repeats)
    return results


_ROOT: list[str] = []


def _a_compressed_root(db: SessionDB) -> str:
    if not _ROOT:
        with sqlite3.connect(db.path) as conn:
            row = conn.execute("SELECT id FROM sessions WHERE end_reason = 'compression'"
                               " AND parent_session_id IS NULL ORDER BY id LIMIT 1").fetchone()
        _ROOT.append(row[0])
    return _ROOT[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.listing", description=__doc__)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--store", type=Path, help="build (or reuse) the store at this path")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with scratch_dir() as scratch:  # the home, and the store unless --store keeps it
        (scratch / "home").mkdir()
        os.environ.setdefault("HERMES_HOME", str(scratch / "home"))
        path = args.store or scratch / "listing.db"
        shapes: dict[str, int] | None = None
        if not path.exists():
            t0 = time.perf_counter()
            shapes = build_store(path, args.sessions)
            shapes["build_s"] = round(time.perf_counter() - t0)
        results = measure(path, args.repeats)
    if args.json:
        print(json.dumps({"store": shapes, "results": results}, indent=2))
        return 0
    print(f"SQLite {sqlite3.sqlite_version}; store {path}: {shapes or 'reused'}")
    for name, figure in results.items():
        shown = figure if isinstance(figure, str) else (
            f"median {figure['median_ms']:8.2f} ms   p95 {figure['p95_ms']:8.2f} ms")
        print(f"{name:<90} {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
