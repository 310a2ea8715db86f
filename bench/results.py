"""``bench/RESULTS.md``: the latest figures of each benchmark, as ``python -m bench`` wrote them.

Each benchmark id has its own section, replaced whenever a run measures that id and kept
otherwise, so ``python -m bench --only B10`` refreshes B10 and leaves the rest as they were.
Every section names the command, the time, the SQLite and Python versions and the machine's
load it was measured with: absolute figures depend on them; ratios against raw ``sqlite3``
measured moments apart in the same run are what the targets are about.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import sqlite3
from pathlib import Path

from bench.suite import Figure

__all__ = ["RESULTS", "section", "write_results"]

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"

_HEAD = """# Benchmark results

Written by `python -m bench` (see `docs/performance.md` for what each figure measures). Each
benchmark's section is replaced by the latest run that measured it. The ratio column is
hermes_state against raw `sqlite3` running the same SQL on the same schema in the same run;
absolute figures depend on the machine and its load, named under each heading.
"""


def _cell(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def section(bench_id: str, figures: list[Figure], command: str) -> str:
    """The Markdown section of one benchmark id."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## {bench_id}",
        "",
        (f"`{command}`, {when}; SQLite {sqlite3.sqlite_version}, Python "
         f"{platform.python_version()}, {os.cpu_count()} cores, load average {load}."),
        "",
        "| figure | hermes_state | raw sqlite3 | unit | ratio | spread | target |",
        "|---|---|---|---|---|---|---|",
    ]
    notes = []
    for f in figures:
        spread = f"{f.spread[0]:.2f}–{f.spread[1]:.2f}" if f.spread else ""
        mark = "" if f.ok is None else (" ✓" if f.ok else " ✗")
        lines.append(f"| {f.name} | {_cell(f.ours)} | {_cell(f.raw)} | {f.unit} | "
                     f"{_cell(f.ratio)} | {spread} | {f.target}{mark} |")
        if f.notes:
            notes.append(f"- {f.name}: " + ", ".join(f"{k}={v}" for k, v in f.notes.items()))
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def _sections(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for chunk in re.split(r"\n(?=## )", text):
        match = re.match(r"## (B\d+)\n", chunk)
        if match:
            found[match.group(1)] = chunk.rstrip("\n") + "\n"
    return found


def _order(bench_id: str) -> int:
    return int(bench_id[1:])


def write_results(figures: list[Figure], command: str, path: Path = RESULTS) -> Path:
    """Replace the sections of the ids ``figures`` measured in ``path``; keep the others."""
    kept = _sections(path.read_text(encoding="utf-8")) if path.exists() else {}
    measured: dict[str, list[Figure]] = {}
    for f in figures:
        measured.setdefault(f.id, []).append(f)
    for bench_id, group in measured.items():
        kept[bench_id] = section(bench_id, group, command)
    body = "\n".join(kept[k] for k in sorted(kept, key=_order))
    staged = path.with_name(path.name + ".tmp")
    staged.write_text(_HEAD + "\n" + body, encoding="utf-8")
    os.replace(staged, path)
    return path
