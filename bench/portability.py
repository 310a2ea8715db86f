"""Rates of export, import, backup, repair and recover on a generated store.

    python -m bench.portability [--messages 100000] [--sessions 100] [--dir DIR]

Generates a store of ``--messages`` messages (tool calls, reasoning, some CJK, some long
enough to spill onto overflow pages), then times each operation and prints messages per second.
The damaged run overwrites 1% of the ``messages`` b-tree pages (one interior page included)
with random bytes before recovering.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hermes_state import (
    SessionDB,
    backup_state_db,
    recover_state_db,
    repair_state_db,
)


def generate(path: Path, sessions: int, messages: int) -> None:
    rng = random.Random(42)
    per_session = max(1, messages // sessions)
    with SessionDB(path) as db:
        for s in range(sessions):
            sid = f"bench-{s:05d}"
            db.create_session(sid, rng.choice(["cli", "telegram", "discord"]), model="model-a")
            rows: list[dict[str, Any]] = []
            for i in range(per_session):
                kind = i % 3
                if kind == 0:
                    text = f"user turn {i}: " + " ".join(
                        rng.choice(["docker", "deploy", "東京", "gateway", "sqlite", "error"])
                        for _ in range(rng.randint(5, 60))
                    )
                    rows.append({"role": "user", "content": text})
                elif kind == 1:
                    rows.append({
                        "role": "assistant",
                        "content": "answer " + "x" * rng.randint(50, 1500),
                        "tool_calls": [{"id": f"c{i}", "function": {"name": "terminal",
                                                                   "arguments": "{}"}}],
                        "reasoning": "thinking " * rng.randint(1, 30),
                    })
                else:
                    size = 6000 if rng.random() < 0.05 else rng.randint(20, 800)
                    rows.append({"role": "tool", "content": "o" * size, "tool_call_id": f"c{i-1}",
                                 "tool_name": "terminal"})
            db.replace_messages(sid, rows)
            db.update_token_counts(sid, 1000, 500, model="model-a", estimated_cost_usd=0.01)


def timed(label: str, count: int, fn: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    print(f"{label:<34} {elapsed:8.2f} s  {count / elapsed:>10,.0f} messages/s")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--dir", help="work directory (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        os.environ["HERMES_HOME"] = str(work / "home")
        source = work / "state.db"
        timed("generate (replace_messages)", args.messages, lambda: generate(
            source, args.sessions, args.messages))
        total = sqlite3.connect(source).execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        print(f"store: {total} messages, {source.stat().st_size / 1e6:.1f} MB")

        buf = io.StringIO()

        def export() -> None:
            with SessionDB(source, read_only=True) as db:
                for line in db.iter_export_jsonl():
                    buf.write(line)

        timed("export JSONL (streaming)", total, export)
        print(f"  {len(buf.getvalue()) / 1e6:.1f} MB of JSONL")

        def import_() -> dict[str, Any]:
            with SessionDB(work / "imported.db") as db:
                return db.import_jsonl(io.StringIO(buf.getvalue()))

        timed("import JSONL", total, import_)
        timed("backup (backup API)", total, lambda: backup_state_db(source))
        timed("repair --check-only", total, lambda: repair_state_db(source, check_only=True))
        timed("recover (healthy file)", total,
              lambda: recover_state_db(source, work / "recovered.db"))

        conn = sqlite3.connect(source)
        pages = [p for p, kind in conn.execute(
            "SELECT pageno, pagetype FROM dbstat WHERE name = 'messages'") if kind != "overflow"]
        interior = [p for p, kind in conn.execute(
            "SELECT pageno, pagetype FROM dbstat WHERE name = 'messages' AND pagetype = 'internal'"
        )]
        conn.close()
        rng = random.Random(7)
        victims = rng.sample(pages, max(1, len(pages) // 100)) + interior[1:2]
        with open(source, "r+b") as fh:
            for page in victims:
                fh.seek((page - 1) * 4096)
                fh.write(rng.randbytes(4096))
        report = timed("recover (1% of pages destroyed)", total,
                       lambda: recover_state_db(source, work / "salvaged.db"))
        entry = report["tables"]["messages"]
        print(f"  found {entry['found']} of {total} ({entry['found'] / total:.2%}), "
              f"estimated lost {entry['lost']}, actually lost {total - entry['found']}")


if __name__ == "__main__":
    main()
