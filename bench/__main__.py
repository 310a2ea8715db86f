"""``python -m bench``: the benchmarks of ``bench.suite`` (B1–B9) and the replication loss
window (B10, ``bench.replication``); prints the figures and writes them to
``bench/RESULTS.md`` (``--results FILE`` elsewhere, ``--no-results`` not at all)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sqlite3
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from bench import suite
from bench.replication import bench_loss_window
from bench.results import RESULTS, write_results

BENCHMARKS = (*suite.BENCHMARKS, "B10")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=suite.__doc__)
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated ids")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default="10000,50000,200000",
                        help="corpus sizes (messages) for B3/B5/B8; B7 uses the largest")
    parser.add_argument("--trials", type=int, default=6,
                        help="B10: crashes per sync interval")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="the Markdown file the figures are written to")
    parser.add_argument("--no-results", action="store_true", help="write no results file")
    args = parser.parse_args(argv)
    only = {x.strip() for x in args.only.split(",")}
    unknown = only - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmark ids: {', '.join(sorted(unknown))}")
    sizes = [int(x) for x in args.sizes.split(",")]
    figures = []
    with tempfile.TemporaryDirectory(prefix="hermes-bench-home-") as home:
        os.environ.setdefault("HERMES_HOME", home)  # never the real store
        if only & set(suite.BENCHMARKS):
            figures += suite.run(only & set(suite.BENCHMARKS), args.repeats, sizes)
        if "B10" in only:
            figures += bench_loss_window(args.trials)
    if args.json:
        print(json.dumps([asdict(f) for f in figures], indent=2))
    else:
        print(f"SQLite {sqlite3.sqlite_version}, {os.cpu_count()} cores")
        print(suite.render(figures))
    if not args.no_results and figures:
        command = shlex.join(["python", "-m", "bench",
                              *(sys.argv[1:] if argv is None else argv)])
        print(f"written to {write_results(figures, command, args.results)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
