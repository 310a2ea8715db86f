"""The ``hermes-state`` command line."""

from __future__ import annotations

import argparse
import json
import sqlite3
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hermes_state_common as common
from hermes_state import SessionDB
from hermes_state_errors import HermesStateError

__all__ = ["main"]


def _resolve_db(args: argparse.Namespace) -> Path:
    if args.db:
        return Path(args.db).expanduser()
    home = Path(args.home).expanduser() if args.home else common.get_hermes_home()
    if args.profile:
        home = common.resolve_profile_home(args.profile, common.hermes_root(home))
    return home / common.DB_FILENAME


def _mode(path: Path) -> str:
    try:
        return oct(stat.S_IMODE(path.lstat().st_mode))
    except FileNotFoundError:
        return "absent"


def cmd_doctor(args: argparse.Namespace) -> int:
    path = _resolve_db(args)
    report: dict[str, Any] = {
        "home": common.display_hermes_home(path.parent),
        "database": str(path),
        "sqlite_version": sqlite3.sqlite_version,
        "wal_reset_exposed": common.wal_reset_exposed(),
        "files": {p.name: _mode(p) for p in (path, *common.sidecar_paths(path))},
    }
    problems: list[str] = []
    with SessionDB(path) as db:
        report["schema_version"] = db._read(lambda c: c.execute(
            "SELECT version FROM schema_version").fetchone()[0])
        report["journal_mode"] = db._read(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0])
        report["fts"] = db.fts_status()
    if report["wal_reset_exposed"]:
        problems.append(
            f"SQLite {sqlite3.sqlite_version} is inside the WAL-reset bug range (fixed in "
            "3.51.3, 3.50.7, 3.44.6); hermes_state never lets its checkpoints overlap a write"
        )
    if report["fts"]["stale"]:
        problems.append("FTS index detached (fts_stale); run: hermes-state sessions repair")
    report["problems"] = problems
    _emit(args, report)
    return 0


def _emit(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return
    for key, value in report.items():
        if key == "problems":
            continue
        print(f"{key}: {value}")
    for problem in report.get("problems", []):
        print(f"! {problem}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hermes-state", description=__doc__)
    parser.add_argument("--home", help="Hermes home (default: HERMES_HOME or ~/.hermes)")
    parser.add_argument("--profile", help="named profile under the home's profiles/")
    parser.add_argument("--db", help="database file (overrides --home/--profile)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="report the store's health and configuration")
    doctor.set_defaults(func=cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except HermesStateError as exc:
        print(f"hermes-state: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
