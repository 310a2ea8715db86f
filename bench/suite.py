"""The benchmark suite: every figure is hermes_state against raw ``sqlite3`` doing the same SQL.

Absolute times on a shared machine are noisy, so each figure is measured as a ratio against a
baseline run in the same process, on the same schema, moments apart: raw ``sqlite3`` executing
the statements hermes_state executes, with every parameter computed beforehand. The ratio is
what the targets are about; absolute figures are printed beside it. Each figure is the median
of several repeats, with the spread (min–max of the ratio) shown.

Run ``python -m bench`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import hermes_state
import hermes_state_messages as messages
from bench.corpus import CorpusSession, generate_corpus
from hermes_state import SessionDB

__all__ = ["main", "Figure"]


@dataclass
class Figure:
    id: str
    name: str
    ours: float
    raw: float | None
    unit: str
    ratio: float | None = None
    spread: tuple[float, float] | None = None
    target: str = ""
    ok: bool | None = None
    notes: dict[str, Any] = field(default_factory=dict)


@contextmanager
def scratch_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hermes-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def raw_connect(path: Path) -> sqlite3.Connection:
    """A raw connection with the same settings SessionDB uses."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=1.0)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA journal_mode = WAL")
    if hermes_state.common.wal_reset_exposed():
        conn.execute("PRAGMA wal_autocheckpoint = 0")
    return conn


def fresh_store(path: Path, sessions: list[CorpusSession]) -> None:
    with SessionDB(path) as db:
        for s in sessions:
            db.create_session(s.session_id, s.source, model=s.model, started_at=s.started_at)


def paired(ours: Callable[[], float], raw: Callable[[], float], repeats: int) -> tuple:
    """Alternate the two measurements ``repeats`` times; returns medians and ratio spread."""
    ours_runs, raw_runs = [], []
    for _ in range(repeats):
        ours_runs.append(ours())
        raw_runs.append(raw())
    ratios = [o / r for o, r in zip(ours_runs, raw_runs)]
    return statistics.median(ours_runs), statistics.median(raw_runs), ratios


# --- B1: append_message, one process, one transaction per message ---------------------------


def bench_append(corpus: list[CorpusSession], repeats: int, n_messages: int) -> Figure:
    """appends/s of SessionDB.append_message vs the same BEGIN/UPDATE/INSERT/COMMIT raw."""
    batch = []
    for s in corpus:
        for m in s.messages:
            batch.append((s.session_id, m.as_append_kwargs()))
            if len(batch) >= n_messages:
                break
        if len(batch) >= n_messages:
            break
    sessions = [s for s in corpus if any(sid == s.session_id for sid, _ in batch[:1])] or corpus
    used = {sid for sid, _ in batch}
    sessions = [s for s in corpus if s.session_id in used]

    def ours() -> float:
        with scratch_dir() as d:
            path = d / "state.db"
            fresh_store(path, sessions)
            with SessionDB(path) as db:
                start = time.perf_counter()
                for sid, kwargs in batch:
                    db.append_message(sid, **kwargs)
                elapsed = time.perf_counter() - start
        return len(batch) / elapsed

    def raw() -> float:
        with scratch_dir() as d:
            path = d / "state.db"
            fresh_store(path, sessions)
            prep = sqlite3.connect(path)
            rows = [
                (sid, messages._prepare(prep, sid, kwargs), messages.tool_call_count_of(
                    kwargs["role"], kwargs.get("tool_calls")))
                for sid, kwargs in batch
            ]
            prep.close()
            conn = raw_connect(path)
            start = time.perf_counter()
            for sid, values, calls in rows:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(messages.COUNT_MESSAGE_SQL, (calls, sid))
                conn.execute(messages.INSERT_MESSAGE_SQL, values)
                conn.execute("COMMIT")
            elapsed = time.perf_counter() - start
            conn.close()
        return len(batch) / elapsed

    o, r, ratios = paired(ours, raw, repeats)
    ratio = o / r
    return Figure(
        "B1", "append_message, one transaction each", o, r, "appends/s", ratio,
        (min(ratios), max(ratios)), "≥ 0.80× raw", ratio >= 0.80,
        {"messages": len(batch)},
    )


# --- B4: open + close of an up-to-date store -------------------------------------------------


def bench_open_close(repeats: int, iterations: int = 200) -> Figure:
    with scratch_dir() as d:
        path = d / "state.db"
        SessionDB(path).close()

        def ours() -> float:
            start = time.perf_counter()
            for _ in range(iterations):
                SessionDB(path, rebuild_fts=False).close()
            return (time.perf_counter() - start) / iterations * 1e3

        def raw() -> float:
            start = time.perf_counter()
            for _ in range(iterations):
                conn = raw_connect(path)
                conn.execute("SELECT version FROM schema_version").fetchone()
                conn.close()
            return (time.perf_counter() - start) / iterations * 1e3

        o, r, ratios = paired(ours, raw, repeats)
    ratio = o / r
    return Figure(
        "B4", "open + close of an up-to-date store", o, r, "ms", ratio,
        (min(ratios), max(ratios)), "≤ 3× raw connect + same pragmas", ratio <= 3.0,
    )


# --- B6: get_messages_as_conversation of a long session --------------------------------------

RAW_CONVERSATION_JSON = (4, 10, 11, 12, 14, 15)


def bench_conversation(repeats: int, n_messages: int = 20_000) -> Figure:
    corpus = list(generate_corpus(n_messages * 2, seed=6))
    with scratch_dir() as d:
        path = d / "state.db"
        with SessionDB(path) as db:
            db.create_session("long", "cli")
            rows = [m for s in corpus for m in s.messages][:n_messages]
            db._write(lambda c: [messages.insert_message(c, "long", m.as_append_kwargs())
                                 for m in rows], "transcript")
            db._write(lambda c: None)

        def ours() -> float:
            with SessionDB(path, rebuild_fts=False) as db:
                start = time.perf_counter()
                conv = db.get_messages_as_conversation("long")
                elapsed = time.perf_counter() - start
            assert len(conv) == n_messages
            return elapsed * 1e3

        def raw() -> float:
            conn = raw_connect(path)
            start = time.perf_counter()
            out = []
            for row in conn.execute(messages.CONVERSATION_SQL, ("long",)):
                row = list(row)
                for i in RAW_CONVERSATION_JSON:
                    if row[i] is not None:
                        row[i] = json.loads(row[i])
                out.append(row)
            elapsed = time.perf_counter() - start
            conn.close()
            return elapsed * 1e3

        o, r, ratios = paired(ours, raw, repeats)
    ratio = o / r
    return Figure(
        "B6", f"get_messages_as_conversation, {n_messages:,} messages", o, r, "ms", ratio,
        (min(ratios), max(ratios)), "≤ 2× raw SELECT + JSON decode", ratio <= 2.0,
    )


# --- driver ----------------------------------------------------------------------------------

BENCHMARKS = ("B1", "B4", "B6")


def run(only: set[str], repeats: int, size: int) -> list[Figure]:
    figures = []
    corpus = list(generate_corpus(size, seed=1))
    if "B1" in only:
        figures.append(bench_append(corpus, repeats, n_messages=min(size, 2000)))
    if "B4" in only:
        figures.append(bench_open_close(repeats))
    if "B6" in only:
        figures.append(bench_conversation(repeats))
    return figures


def render(figures: list[Figure]) -> str:
    head = f"{'id':<4} {'figure':<46} {'ours':>12} {'raw':>12} {'unit':<10} {'ratio':>6} " \
           f"{'spread':>13}  target"
    lines = [head, "-" * len(head)]
    for f in figures:
        raw = f"{f.raw:,.2f}" if f.raw is not None else "-"
        ratio = f"{f.ratio:.2f}" if f.ratio is not None else "-"
        spread = f"{f.spread[0]:.2f}–{f.spread[1]:.2f}" if f.spread else "-"
        mark = "" if f.ok is None else (" ok" if f.ok else " MISS")
        lines.append(
            f"{f.id:<4} {f.name:<46} {f.ours:>12,.2f} {raw:>12} {f.unit:<10} {ratio:>6} "
            f"{spread:>13}  {f.target}{mark}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated ids")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", type=int, default=10_000, help="corpus messages for B1")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("HERMES_HOME", tempfile.mkdtemp(prefix="hermes-bench-home-"))
    figures = run({x.strip() for x in args.only.split(",")}, args.repeats, args.size)
    if args.json:
        print(json.dumps([asdict(f) for f in figures], indent=2))
    else:
        print(f"SQLite {sqlite3.sqlite_version}, {os.cpu_count()} cores")
        print(render(figures))
    return 0
