"""The store-maintenance commands of the ``hermes-state`` command line: doctor, repair,
recover, backup, restore and replicate, with the text reports they print and the next step
each failure or finding calls for. See docs/operations.md."""

from __future__ import annotations

import argparse
import datetime
import os
import sqlite3
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hermes_state_cli_format as fmt
import hermes_state_connect as dbconn
import hermes_state_files as db_files
import hermes_state_home as home_paths
import hermes_state_fileformat as ff
import hermes_state_fulltext as fulltext
import hermes_state_maintenance as maintenance
import hermes_state_quarantine as quarantine
import hermes_state_replication as replication
from hermes_state import (
    SessionDB,
    backup_state_db,
    recover_state_db,
    repair_state_db,
    restore_state_db,
)
from hermes_state_errors import HermesStateError, StateDbCorruptError, StateDbUnavailableError
from hermes_state_lockowners import describe_lock_holders
from hermes_state_cli_common import (
    PROG,
    Progress,
    STOP_USERS,
    advice_for,
    condition_text,
    count_arg,
    not_sqlite,
    print_json,
    print_lines,
    recover_hint,
    resolve_db,
    warn,
)

__all__ = [
    "cmd_recover",
    "cmd_repair",
    "cmd_doctor",
    "KEEP_ENV",
    "cmd_backup",
    "cmd_restore",
    "cmd_replicate",
]


# --- recover and repair -------------------------------------------------------------------


def _recover_table_text(report: dict[str, Any]) -> None:
    """A recover's table of tables: rows found, copied and lost, and how each was read."""
    print(f"{'table':<24}{'found':>9}{'copied':>9}{'lost':>9}  method")
    for name, t in report["tables"].items():
        lost = "?" if t["lost"] is None else f"{'' if t['lost_exact'] else '~'}{t['lost']}"
        copied = "-" if t.get("copied") is None else t["copied"]
        print(f"{name:<24}{t['found']:>9}{copied:>9}{lost:>9}  {t['method']}")
    for name, t in report["excluded"].items():
        print(f"{name:<24}{t['found']:>9}{'-':>9}{'':>9}  excluded (runtime ledger, not copied)")


def _recover_text(report: dict[str, Any]) -> None:
    print(f"source: {report['source']} (schema version {report['schema_version']}, "
          f"read by {report['schema_read_by']})")
    if len(report.get("views", [])) > 1:
        print(f"read: {', '.join(report['views'])} (a row comes from the first that holds it)")
    _recover_table_text(report)
    if report["placeholder_sessions"]:
        print(f"placeholder sessions (row lost, messages kept): "
              f"{', '.join(report['placeholder_sessions'])}")
    for note in report["notes"]:
        print(f"note: {note}")
    for problem in report.get("unverified", []):
        print(f"! not verified: {problem}")
    if report["output"]:
        deferred = report.get("checks", {}).get("fts_rebuild") == "deferred"
        print(f"written: {report['output']} (" + (
            "FTS indexes left to rebuild on its first writable open (--defer-index)"
            if deferred else "FTS indexes rebuilt") + ")")
    elif report["readable"]:
        print(f"nothing written (--inspect-only); recover with `{PROG} sessions recover "
              f"--input {report['source']} --output <new file>`")


def cmd_recover(args: argparse.Namespace) -> int:
    if args.input_deprecated is not None:
        warn("recover --source is now --input (--source is the platform in the other "
              "commands)")
    given = args.input or args.input_deprecated
    source = Path(given).expanduser().absolute() if given else resolve_db(args)
    holders = describe_lock_holders(source)
    if holders:
        warn(f"{source} is in use ({'; '.join(holders)}); stop them for a consistent copy")
    report = recover_state_db(
        source, args.output, inspect_only=args.inspect_only, defer_index=args.defer_index,
        progress=Progress(),
    )
    if report["output"] and report.get("output_verified", True):
        report["next"] = (
            f"{STOP_USERS}, then put the recovered file in place of the damaged one with "
            f"`{PROG} --db {source} restore {report['output']}` (the damaged file is kept "
            "among the store's snapshots, marked damaged)")
    if args.json:
        print_json(report)
    else:
        _recover_text(report)
        if report.get("next"):
            print(f"next: {report['next']}")
    return _recover_status(report)


def _recover_status(report: dict[str, Any]) -> int:
    """A recover's exit status, warning on what makes it a failure or leaves it in doubt."""
    if not report["readable"]:
        warn("nothing could be read from the source; restore a snapshot "
              f"(`{PROG} restore <snapshot>`) if there is one")
        return 1
    if not report.get("output_verified", True):
        warn("the output does not hold the rows recover wrote: do not put it in place; "
              "run the recover again")
        return 1
    if report.get("unverified"):
        warn("some counts of the source do not agree (see `! not verified`): every row "
              "found was kept, but what was lost cannot be counted exactly")
    return 0


def _health_text(report: dict[str, Any]) -> None:
    integrity = report.get("integrity", [])
    print("integrity: " + ("ok" if integrity == ["ok"]
                           else _check_problem("integrity_check", integrity)))
    if report.get("damaged_tables"):
        print(f"damaged tables: {', '.join(report['damaged_tables'])}")
    for table, error in (report.get("fts_integrity") or {}).items():
        print(f"fts {table}: {error or 'ok'}")
    print(f"fts_stale: {report.get('fts_stale') or 'no'}")
    missing = (report.get("triggers") or {}).get("missing")
    print(f"triggers missing: {', '.join(missing) if missing else 'none'}")
    print(f"row counts: {fmt.counts(report.get('row_counts'))}")


def _unrepairable(health: dict[str, Any]) -> bool:
    """True when a health report shows damage a repair cannot mend: the file cannot be read,
    a canonical table's b-tree is damaged, or its rows cannot be counted."""
    counts = health.get("row_counts") or {}
    return bool(health.get("damaged_tables")) or any(
        isinstance(c, str) for c in counts.values()) or (
        not health.get("healthy") and "row_counts" not in health)


def _record_damaged(report: dict[str, Any]) -> bool:
    """True when the store's own rows (not only its indexes) failed the integrity check before
    the repair: nothing repair rebuilds can mend them."""
    integrity = (report.get("before") or {}).get("integrity")
    return bool(integrity) and integrity != ["ok"] and not report.get("promoted")


def cmd_repair(args: argparse.Namespace) -> int:
    db = resolve_db(args)
    report = repair_state_db(
        db, check_only=args.check_only, backup=not args.no_backup, progress=Progress()
    )
    if report.get("backup"):
        report["deleted_snapshots"] = _prune_snapshots(args, db, [report["backup"]])
    if args.json:
        print_json(report)
    if args.check_only:
        if not args.json:
            _check_only_text(report, db)
        return 0 if report.get("healthy") else 1
    healthy_already = bool(report.get("before", {}).get("healthy"))
    if not args.json:
        _repair_text(report, db, healthy_already)
    return 0 if report.get("promoted") or healthy_already else 1


def _check_only_text(report: dict[str, Any], db: Path) -> None:
    """What ``repair --check-only`` found, and what to do next."""
    _health_text(report)
    for problem in report.get("problems", []):
        if problem.startswith("integrity_check"):  # said above, a line per finding
            problem = _check_problem("integrity_check", report["integrity"])
        print(f"! {problem}")
    if _unrepairable(report):
        print("repair cannot mend this: it rebuilds indexes, not damaged rows")
        print(f"next: {recover_hint(db)}")
    elif not report.get("healthy"):
        print(f"next: {STOP_USERS}; then `{PROG} --db {db} sessions repair`")
    if report.get("in_use_by"):
        print(f"in use by: {'; '.join(report['in_use_by'])}")


def _repair_text(report: dict[str, Any], db: Path, healthy_already: bool) -> None:
    """What a repair did, and (when it failed) what to do next."""
    if report.get("rolled_back_journal"):
        print("rolled back an interrupted write (hot journal): the store is as it was "
              "before that write")
    if healthy_already:
        print("healthy: nothing to repair")
        return
    if report.get("promoted"):
        print(f"repaired and promoted; backup: {report.get('backup')}")
        _health_text(report["after"])
        return
    if _record_damaged(report):
        print("repair failed: the record is damaged ("
              f"{_check_problem('integrity_check', report['before']['integrity'])}); "
              "repair rebuilds indexes, not damaged rows: run recover")
    else:
        print(f"repair failed: {report.get('error') or report.get('problems')}")
    print(f"kept unchanged: {', '.join(report.get('kept', []))}")
    print(f"next: {recover_hint(db)}")


# --- doctor, backup, restore --------------------------------------------------------------


def _mode(path: Path) -> str:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return "absent"
    return f"{stat.S_IMODE(st.st_mode):04o} {st.st_size} bytes"


def _doctor_store(path: Path, report: dict[str, Any], problems: list[str], nxt: list[str]) -> None:
    db = _doctor_open(path, report, problems, nxt)
    if db is None or not _doctor_health(db, path, report, problems, nxt):
        return
    if report["quick_check"] != ["ok"]:
        problems.append(_check_problem("quick_check", report["quick_check"]))
        _record(path, problems, "quick_check fails")
        nxt.append(recover_hint(path))
    elif fulltext.detected() != fulltext.FULL:
        report["notes"].append(_FULL_TEXT_UNAVAILABLE.format(level=fulltext.detected()))
    else:
        _doctor_fts_check(path, report, problems, nxt)
    report["full_text"] = fulltext.detected()
    _doctor_index_state(path, report["fts"], report["notes"], problems, nxt)


def _doctor_open(
    path: Path, report: dict[str, Any], problems: list[str], nxt: list[str]
) -> SessionDB | None:
    """The store opened read-only; None, with what is wrong recorded, when it cannot be (a
    fresh home without a store is nothing wrong)."""
    try:
        return SessionDB(path, read_only=True)
    except StateDbUnavailableError as exc:
        report["unavailable"] = exc.reason
        if exc.reason == "uninitialized" and not path.exists():
            # A fresh home: nothing is wrong, the first writer creates the store.
            report["notes"].append(
                "no store yet: the first program that writes to it creates it")
            return None
        problems.append(f"store unavailable ({exc.reason}): {exc}")
        nxt.append(advice_for(exc, path) or "")
    except StateDbCorruptError as exc:
        problems.append(condition_text(exc, path) if not_sqlite(path) else f"store damaged: {exc}")
        problems.extend(str(note) for note in getattr(exc, "__notes__", []))
        nxt.append(advice_for(exc, path) or "")
    return None


def _doctor_health(
    db: SessionDB, path: Path, report: dict[str, Any], problems: list[str], nxt: list[str]
) -> bool:
    """Put the store's quick health and index status in ``report`` (``db`` closed after);
    False when the file is too damaged for the checks to run."""
    try:
        with db:
            report.update(db.quick_health())
            report["fts"] = db.fts_status()
    except StateDbCorruptError as exc:
        problems.append(f"store damaged: {exc}")
        problems.extend(str(note) for note in getattr(exc, "__notes__", []))
        nxt.append(recover_hint(path))
        return False
    return True


def _doctor_index_state(
    path: Path, fts: dict[str, Any], notes: list[str], problems: list[str], nxt: list[str]
) -> None:
    """What the full-text indexes' status says: detached by a process without FTS5 or
    missing rows a process without trigrams wrote (notes: the next open mends them), detached
    for damage (a problem), or a rebuild under way (a note)."""
    full = fulltext.detected() == fulltext.FULL
    if fts["stale"] and fulltext.UNAVAILABLE_REASON in fts["stale"]:
        if full:
            notes.append(
                "the full-text indexes were detached by a process whose SQLite has no FTS5 "
                "(searches scan the stored messages); the next writable open with no other "
                f"process on the store rebuilds them, or `{PROG} --db {path} sessions repair`")
    elif fts.get("trigram_stale") and full:
        notes.append(
            "the trigram index misses rows a process without the trigram tokenizer wrote "
            "(substring searches scan the stored messages); the next writable open with no "
            f"other process on the store rebuilds it, or `{PROG} --db {path} sessions repair`")
    elif fts["stale"] or fts["missing_triggers"]:
        problems.append(
            "FTS index detached" + (f" (fts_stale: {fts['stale']})" if fts["stale"] else "")
            + (f"; missing triggers: {', '.join(fts['missing_triggers'])}"
               if fts["missing_triggers"] else "")
        )
        nxt.append(f"{STOP_USERS}; `{PROG} sessions repair --check-only`; "
                   f"`{PROG} sessions repair`")
    elif fts["rebuild_high_water"] is not None:
        notes.append(
            "an FTS rebuild is under way (" + (
                "not started" if fts["rebuild_progress"] is None
                else f"indexed up to message id {fts['rebuild_progress']}")
            + f" of {fts['rebuild_high_water']}); the next writable open continues it")


# What doctor says on an SQLite that cannot keep the indexes (see hermes_state_fulltext).
_FULL_TEXT_UNAVAILABLE = (
    "full-text search is unavailable on this SQLite build (full_text={level!r}): searches "
    "scan the stored messages; a process whose SQLite has FTS5 rebuilds the indexes on its "
    "next writable open")


def _doctor_fts_check(
    path: Path, report: dict[str, Any], problems: list[str], nxt: list[str]
) -> None:
    """FTS5's check of the full-text indexes' own structures (``--full`` also checks them
    against the rows, on a copy)."""
    try:
        found = maintenance.fts_structure_check(path)
    except StateDbCorruptError:
        raise
    except HermesStateError as exc:  # the write lock held throughout, no write access
        report["notes"].append(f"the full-text indexes were not checked: {exc}")
        return
    report["fts_integrity"] = found
    damaged = {table: error for table, error in found.items() if error is not None}
    for table, error in damaged.items():
        problems.append(f"search index {table} damaged: {error}")
    if damaged:
        nxt.append(f"{STOP_USERS}; `{PROG} --db {path} sessions repair` (rebuilds the "
                   "full-text indexes from the messages)")


def _record(path: Path, problems: list[str], reason: str, *, index_damage: bool = True) -> None:
    """Whoever finds the damage first records it (the quarantine marker beside the store), so
    that the next writer does not write into the damaged file; the problems say so."""
    home = path.parent if path.name == home_paths.DB_FILENAME else home_paths.get_hermes_home()
    said = quarantine.record_found_damage(path, reason, home.absolute(),
                                          index_damage_possible=index_damage)
    if said is not None and said not in problems:
        problems.append(said)


def _doctor_quarantine(
    path: Path, report: dict[str, Any], problems: list[str], nxt: list[str]
) -> None:
    marker = quarantine.read_marker(path)
    report["quarantine"] = marker
    if marker is None:
        return
    problems.append(f"quarantined {quarantine.describe_marker(marker)}: every writable open "
                    f"refuses writes (marker {marker['path']})")
    nxt.append(recover_hint(path))
    nxt.append(f"once the file is mended in place (restore, repair) and checks clean: "
               f"{STOP_USERS}; `{PROG} --db {path} doctor --clear-quarantine`")


def cmd_clear_quarantine(args: argparse.Namespace) -> int:
    path = resolve_db(args)
    cleared = quarantine.clear_quarantine(path)
    if args.json:
        print_json({"database": str(path), "cleared": cleared})
    elif cleared is None:
        print(f"{path} is not quarantined")
    else:
        print(f"quarantine of {path} cleared (it was quarantined "
              f"{quarantine.describe_marker(cleared)})")
    return 0


def _doctor_wal(path: Path, report: dict[str, Any], problems: list[str], nxt: list[str]) -> None:
    """A damaged -wal frame hides every later commit from SQLite, so opening the store shows
    nothing wrong: verify the frames themselves (the -wal is only read), judged as a writable
    open judges them (a live -wal that changed between two scans is not judged: a frame read
    half-written beside a writer is no damage)."""
    wal = db_files.sidecar_paths(path)[0]
    if not path.is_file():
        return
    scan = quarantine.wal_damage_scan(path)
    if scan is None:
        return
    rows = ff.wal_damage_rows(path, wal, scan)
    report["wal_damage"] = {"damaged_frames": scan.damaged[:100], "readable": scan.readable,
                            "later_commits": scan.later_commits,
                            "later_frames": scan.later_frames, "rows_after_damage": rows}
    problems.append(scan.describe(rows))
    _record(path, problems, scan.describe(rows), index_damage=False)
    nxt.append(recover_hint(path))


# A running replicator this far behind its store (seconds, or ten sync intervals) is stuck.
_REPLICA_STUCK_S = 60.0


def _replica_line(status: dict[str, Any] | None) -> str:
    if status is None:
        return "none configured"
    running = (f"replicator running (Litestream pid {status['litestream_pid']})"
               if status["replicator_running"] else "replicator not running")
    stamp = datetime.datetime.fromtimestamp(status["replica_time"] or 0, datetime.UTC)
    where = (f"replica at {stamp:%Y-%m-%d %H:%M:%S} UTC, "
             f"{status['behind_s']:.0f} s behind the store"
             if status["behind_s"] is not None else status["error"])
    return f"{status['url']}: {running}; {where}; checkpoints: {status['checkpoints']}"


def _doctor_replica(
    path: Path, report: dict[str, Any], problems: list[str], nxt: list[str]
) -> None:
    """Whether the store has a replica configured (its replicator's record) and how far
    behind it is."""
    status = replication.replica_status(path)
    report["replica"] = status
    if status is None:
        return
    url, behind = status["url"], status["behind_s"]
    if status["error"] is not None and status["replica_time"] is None:
        problems.append(f"replica {url}: {status['error']}")
    if not status["replicator_running"] and (behind is None or behind > 0):
        problems.append(f"the replica {url} misses the store's latest commits and no "
                        "replicator is running")
        nxt.append(f"`{PROG} --db {path} replicate --to {url}` (or `{PROG} --db {path} "
                   "replicate --forget` if the store is not to be replicated any more)")
    elif behind is not None and behind > max(_REPLICA_STUCK_S,
                                              10 * (status["sync_interval_s"] or 1.0)):
        problems.append(f"the replica {url} is {behind:.0f} s behind its store")
        nxt.append("read the replicator's log (its stderr): the replica may be unreachable")


# How many of a check's findings doctor shows (the count says how many there are).
_CHECK_LINES_SHOWN = 3


def _check_problem(name: str, rows: Sequence[str]) -> str:
    """One problem line for a check's findings: how many, and the first few."""
    lines = fmt.check_findings(rows)
    first = "; ".join(lines[:_CHECK_LINES_SHOWN])
    more = ", ..." if len(lines) > _CHECK_LINES_SHOWN else ""
    return f"{name}: {fmt.plural(len(lines), 'problem')}, first: {first}{more}"


def _doctor_full(path: Path, report: dict[str, Any], problems: list[str], nxt: list[str]) -> None:
    """``--full``: the health report of a copy (every check repair makes)."""
    if "unavailable" in report or "quick_check" not in report:
        return
    health = repair_state_db(path, check_only=True, progress=Progress())
    report["health"] = health
    integrity = health.get("integrity") or ["ok"]
    if integrity != ["ok"]:
        _record(path, problems, "integrity_check fails")
    _add_new_problems(report, health, problems)
    if not health.get("healthy") and not nxt:
        nxt.append(f"{STOP_USERS}; `{PROG} sessions repair`")


def _add_new_problems(report: dict[str, Any], health: dict[str, Any], problems: list[str]
                      ) -> None:
    """Add to ``problems`` those of the health report that doctor's own checks did not
    already state."""
    checked = any(problem.startswith("quick_check") for problem in problems)
    seen = {table for table, error in (report.get("fts_integrity") or {}).items() if error}
    for problem in health.get("problems", []):
        if problem.startswith("fts ") and problem.split()[1].rstrip(":") in seen:
            continue  # the structure check above already said so
        # integrity_check repeats what quick_check already listed: the damage is said once.
        if problem not in problems and not (checked and problem.startswith("integrity_check")):
            problems.append(problem)


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.clear_quarantine:
        return cmd_clear_quarantine(args)
    path = resolve_db(args)
    report = _doctor_facts(path)
    problems: list[str] = []
    nxt: list[str] = []
    checks = [_doctor_quarantine, _doctor_store, _doctor_wal, _doctor_replica]
    if args.full:
        checks.append(_doctor_full)
    for check in checks:
        # One check that cannot run is one problem: the report (one JSON document with
        # --json) still comes out whole.
        try:
            check(path, report, problems, nxt)
        except (HermesStateError, OSError) as exc:
            problems.append(condition_text(exc, path))
            nxt.append(advice_for(exc, path) or "")
    report.setdefault("replica", None)
    if report.get("quarantine") is None:  # a check above may have found and recorded damage
        report["quarantine"] = quarantine.read_marker(path)
    report["problems"] = problems
    report["next"] = [n for n in dict.fromkeys(nxt) if n]
    if args.json:
        print_json(report)
    else:
        _print_doctor(report)
    return 1 if problems else 0


def _doctor_facts(path: Path) -> dict[str, Any]:
    """What doctor reports before any check: the home, the files and their modes, the
    SQLite version and its WAL-reset exposure, the processes holding the store."""
    report: dict[str, Any] = {
        "home": home_paths.display_hermes_home(maintenance.store_home(path)),
        "database": str(path),
        "sqlite_version": sqlite3.sqlite_version,
        "wal_reset_exposed": dbconn.wal_reset_exposed(),
        "files": {p.name: _mode(p) for p in (path, *db_files.sidecar_paths(path))},
        "in_use_by": describe_lock_holders(path),
        "notes": [],
    }
    journal = db_files.journal_path(path)
    if journal.exists():  # only while maintenance runs, or after it was interrupted
        report["files"][journal.name] = _mode(journal)
    if report["wal_reset_exposed"]:
        report["notes"].append(
            f"SQLite {sqlite3.sqlite_version} is inside the WAL-reset bug range (fixed in "
            "3.51.3, 3.50.7, 3.44.6): automatic checkpoints are off and only a writer holding "
            "the write lock checkpoints; upgrading SQLite removes the exposure")
    return report


def _print_doctor(report: dict[str, Any]) -> None:
    print_lines(fmt.doctor_lines(report))
    print(f"replica: {_replica_line(report['replica'])}")
    for note in report["notes"]:
        print(f"note: {note}")
    for problem in report["problems"]:
        print(f"! {problem}")
    for step in report["next"]:
        print(f"next: {step}")
    if not report["problems"]:
        print("ok")


# The retention rule of snapshots when --keep is not given: keep the newest N of them.
KEEP_ENV = "HERMES_STATE_KEEP_SNAPSHOTS"


def _keep(args: argparse.Namespace) -> int | None:
    """How many snapshots to keep: ``--keep``, else ``HERMES_STATE_KEEP_SNAPSHOTS``, else
    None (every one)."""
    if args.keep is not None:
        return int(args.keep)
    text = os.environ.get(KEEP_ENV, "").strip()
    if not text:
        return None
    try:
        return count_arg(text)
    except argparse.ArgumentTypeError as exc:
        raise HermesStateError(f"{KEEP_ENV}: {exc}") from None


def _prune_snapshots(args: argparse.Namespace, db: Path, spare: Sequence[str] = ()
                     ) -> list[str]:
    """Apply the retention rule after a snapshot was taken (the ``spare`` ones, just taken,
    are always kept); the paths deleted."""
    keep = _keep(args)
    return [] if keep is None else maintenance.prune_snapshots(db, keep, spare=spare)


def _snapshot_lines(db: Path, snapshots: Sequence[dict[str, Any]]) -> list[str]:
    if not snapshots:
        return [f"no snapshots of {db} in {maintenance.snapshot_dir(db)}"]
    lines = fmt.table(
        (fmt.Column("TAKEN (UTC)", keep=True), fmt.Column("SIZE", align=">", keep=True),
         fmt.Column("STATE", keep=True), fmt.Column("PATH", keep=True)),
        [(s["taken_at"][:19].replace("T", " "), fmt.size(s["size"]),
          "damaged" if s["damaged"] else "-", s["path"]) for s in snapshots])
    total = sum(s["size"] for s in snapshots)
    damaged = sum(1 for s in snapshots if s["damaged"])
    return [*lines, f"{fmt.plural(len(snapshots), 'snapshot')}, {fmt.size(total)} in all"
            + (f"; {damaged} damaged (a damaged store saved by a restore: kept for inspection, "
               "it cannot be restored)" if damaged else "")]


def cmd_backup(args: argparse.Namespace) -> int:
    db = resolve_db(args)
    if args.list:
        snapshots = maintenance.list_snapshots(db)
        if args.json:
            print_json({"snapshots": snapshots, "total_size": sum(s["size"] for s in snapshots)})
        else:
            print_lines(_snapshot_lines(db, snapshots))
        return 0
    if args.prune:
        if _keep(args) is None:
            raise HermesStateError(f"--prune needs --keep N (or {KEEP_ENV})")
        deleted = _prune_snapshots(args, db)
        if args.json:
            print_json({"deleted": deleted})
        else:
            for old in deleted:
                print(f"deleted older snapshot {old}")
            print(f"deleted {fmt.plural(len(deleted), 'snapshot')}")
        return 0
    path = backup_state_db(db, args.output)
    deleted = _prune_snapshots(args, db, [str(path)])
    if args.json:
        print_json({"snapshot": str(path), "deleted": deleted})
    else:
        print(path)
        for old in deleted:
            print(f"deleted older snapshot {old}")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    if args.from_replica:
        return _restore_from_replica(args)
    snapshot = Path(args.snapshot).expanduser()
    if not snapshot.exists():
        raise HermesStateError(f"snapshot not found: {snapshot}")
    db = resolve_db(args)
    report = restore_state_db(snapshot, db, progress=Progress())
    previous = report["previous_snapshot"]
    report["deleted_snapshots"] = _prune_snapshots(args, db, [previous] if previous else [])
    if args.json:
        print_json(report)
    else:
        if report["rolled_back_journal"]:
            print("rolled back an interrupted write (hot journal) before the restore")
        print(f"restored {report['db_path']} from {report['restored_from']}")
        _say_previous(report)
        for old in report["deleted_snapshots"]:
            print(f"deleted older snapshot {old}")
        print(f"row counts: {fmt.counts(report['row_counts'])}")
    return 0


def _say_previous(report: dict[str, Any]) -> None:
    """Where a restore kept the store it replaced."""
    previous = report.get("previous_snapshot")
    if previous:
        damaged = (" (it was damaged: kept as it was for inspection; `sessions recover` gets "
                   "out what it holds)" if report.get("previous_damaged") else "")
        print(f"the previous database was saved as {previous}{damaged}")


def _restore_from_replica(args: argparse.Namespace) -> int:
    output = Path(args.output).expanduser() if args.output else None
    when = replication.parse_timestamp(args.timestamp) if args.timestamp else None
    db = resolve_db(args)
    report = replication.restore_from_replica(
        args.from_replica, db, output=output, timestamp=when, progress=Progress()
    )
    previous = report.get("previous_snapshot")
    report["deleted_snapshots"] = [] if output else _prune_snapshots(
        args, db, [previous] if previous else [])
    if args.json:
        print_json(report)
    else:
        _replica_restore_text(report)
    return 0


def _replica_restore_text(report: dict[str, Any]) -> None:
    """What a restore from a replica did: where to, as of when, and the checks' results."""
    as_of = f" as of {report['timestamp']}" if report["timestamp"] else ""
    print(f"restored {report['restored_to']} from {report['replica']}{as_of}")
    _say_previous(report)
    for old in report["deleted_snapshots"]:
        print(f"deleted older snapshot {old}")
    print("integrity: ok; fts: " + ", ".join(
        f"{table} {error or 'ok'}" for table, error in report["fts_integrity"].items()))
    print(f"row counts: {fmt.counts(report['row_counts'])}")
    for note in report["notes"]:
        print(f"note: {note}")


# --- replicate ----------------------------------------------------------------------------


def cmd_replicate(args: argparse.Namespace) -> int:
    path = resolve_db(args)
    if args.forget:
        return _forget_replica(args, path)
    url = replication.replica_url(args.url)
    interval = replication.parse_interval(args.sync_interval)
    SessionDB(path, read_only=True).close()  # an initialised, current, readable store
    if args.config_only:
        print(replication.litestream_config(path, url, sync_interval=interval), end="")
        return 0
    replication.replicate(
        path, url, sync_interval=interval, leave_checkpoints=args.leave_checkpoints,
        on_start=lambda record: warn(
            f"replicating {path} to {url} every {args.sync_interval} with Litestream "
            f"{record['litestream']} (pid {record['litestream_pid']}); Ctrl-C stops"),
    )
    warn("replication stopped")
    return 0


def _forget_replica(args: argparse.Namespace, path: Path) -> int:
    """``replicate --forget``: drop the store's replica and Litestream's state beside it."""
    state = replication.litestream_dir(path)
    freed = sum(f.stat().st_size for f in state.rglob("*") if f.is_file()) \
        if state.is_dir() and not state.is_symlink() else 0
    forgotten = replication.forget_replica(path)
    if args.json:
        print_json({"database": str(path), "forgotten": forgotten,
                     "removed": str(state) if freed or forgotten else None,
                     "freed_bytes": freed})
    elif forgotten:
        print(f"{path}: replica forgotten; Litestream's state beside it removed "
              f"({fmt.size(freed)} freed)")
    else:
        print(f"{path}: no replica configured")
    return 0
