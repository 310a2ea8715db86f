"""The session commands of the ``hermes-state`` command line: list, search, show, stats,
export, import, prune and delete.

Commands that delete list what they will delete, ask, and delete only the listed ids. A stdin
that is not a terminal refuses without ``--yes``. An export or an import into a new store
appears only whole (written under a temporary name, linked into place at the end)."""

from __future__ import annotations

import argparse
import contextlib
import csv
import errno
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import hermes_state_cli_format as fmt
import hermes_state_files as db_files
import hermes_state_home as home_paths
import hermes_state_search as search
from hermes_state import SessionDB, collect_profile_stats
from hermes_state_errors import HermesStateError, ImportRejectedError
from hermes_state_transfer import read_json_export
from hermes_state_cli_common import (
    Progress,
    home_dir,
    moment_arg,
    number_arg,
    open_read_only,
    open_writable,
    print_json,
    print_lines,
    resolve_db,
    warn,
    yes_no_arg,
)

__all__ = [
    "LIST_CSV_FIELDS",
    "cmd_list",
    "SEARCH_CSV_FIELDS",
    "cmd_search",
    "cmd_show",
    "cmd_stats",
    "cmd_export",
    "cmd_import",
    "NotConfirmed",
    "cmd_prune",
    "cmd_delete",
    "PRUNE_FILTER_OPTIONS",
    "prune_filter_options",
]


# --- sessions: browsing -------------------------------------------------------------------


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
    with open_read_only(args) as db:
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
        print_json(rows)
    elif form == "jsonl":
        for row in rows:
            print(json.dumps(row, ensure_ascii=False, default=str))
    elif form == "csv":
        writer = csv.DictWriter(sys.stdout, csv_fields, extrasaction="ignore",
                                lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    elif rows:
        print_lines(table(rows))
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
    with open_read_only(args) as db:
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
    with open_read_only(args) as db:
        session_id = _resolve_session(db, args.session)
        session = db.get_session(session_id)
        messages = db.get_messages(session_id, include_inactive=args.include_inactive)
    first = 0 if args.tail is None else max(len(messages) - args.tail, 0)
    shown = messages[first:]
    if args.json:
        print_json({**(session or {}), "messages": shown})
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
        result = collect_profile_stats(home_paths.hermes_root(home_dir(args)))
        if args.json:
            print_json(result)
        else:
            for name, stats in result["profiles"].items():
                print(f"{name}: {fmt.plural(stats['sessions'], 'session')}, "
                      f"{fmt.plural(stats['messages'], 'message')}, estimated cost "
                      f"{fmt.money(stats['estimated_cost_usd'], 'unknown')}")
            for error in result["errors"]:
                print(f"{error['profile']}: unavailable: {error['error']}")
        return 1 if result["errors"] else 0
    with open_read_only(args) as db:
        stats = db.stats()
    if args.json:
        print_json(stats)
    else:
        print_lines(fmt.stats_lines(stats))
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
    progress = Progress()
    with open_read_only(args) as db:
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
                 out: IO[str], progress: Progress) -> None:
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
                  out: IO[str], progress: Progress) -> int:
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
        warn(f"{name}: {where}{session}: {e['error']}")
    warn("nothing was imported")


def _import_into_store(
    args: argparse.Namespace, work: Callable[[SessionDB], dict[str, Any]]
) -> dict[str, Any]:
    """Run an import (``work``) on the store ``args`` names; its report. A store that is not
    there yet is written beside its path under a temporary name and linked into place only
    when the import is whole, never over a file created meanwhile: an import that is rejected
    or interrupted leaves no store behind (what a killed one left, the next import into that
    folder removes), nor the folders its open created."""
    path = resolve_db(args)
    if path.exists() or path.is_symlink():
        with open_writable(args) as db:
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
                        source, on_conflict=args.on_conflict, progress=Progress()
                    )
                except ImportRejectedError as exc:
                    return {"ok": False, "errors": exc.errors}
            try:
                data = read_json_export(source)
            except ImportRejectedError as exc:
                return {"ok": False, "errors": exc.errors}
            return db.import_sessions(
                data if isinstance(data, list) else [data], on_conflict=args.on_conflict,
                limited=False, progress=Progress(),
            )

        report = _import_into_store(args, work)
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    if args.json:
        print_json(report)
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


class NotConfirmed(Exception):
    """A deletion nobody confirmed: stdin is not a terminal and ``--yes`` was not given."""


def _confirm(args: argparse.Namespace, rows: Sequence[dict[str, Any]], what: str) -> bool:
    """Whether to delete ``rows``: ``--yes``, or ``y`` answered on the terminal after the list
    (on stderr: stdout keeps the result). End of input is a no."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise NotConfirmed(f"{what}: {_doomed_summary(rows)}; nothing deleted without "
                            "confirmation and stdin is not a terminal: pass --yes to delete, "
                            "or --dry-run to list them")
    print_lines(fmt.doomed_table(rows), sys.stderr)
    print(f"{what}: {_doomed_summary(rows)}. Delete? [y/N] ", end="", file=sys.stderr,
          flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _dry_run(args: argparse.Namespace, rows: Sequence[dict[str, Any]], what: str) -> int:
    if args.json:
        print_json({"dry_run": True, "sessions": rows,
                     "messages": sum(r.get("message_count") or 0 for r in rows)})
    else:
        if rows:
            print_lines(fmt.doomed_table(rows))
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
    with open_read_only(args) as db:
        doomed = db.list_prune_candidates(args.older_than_days, source=args.source, **filters)
    if args.dry_run:
        return _dry_run(args, doomed, f"would delete {what}")
    if not doomed:
        if args.json:
            print_json({"pruned": 0, "deleted": [], "kept": []})
        else:
            print(f"nothing to prune: no {what}")
        return 0
    db_files.refuse_write_protected(resolve_db(args))  # before asking, not after
    if not _confirm(args, doomed, f"to delete: {what}"):
        warn("nothing deleted")
        return 1
    shown = [r["id"] for r in doomed]
    with open_writable(args) as db:
        pruned = db.prune_sessions(args.older_than_days, source=args.source, only_ids=shown,
                                   **filters)
        kept = [sid for sid in shown if db.get_session(sid) is not None]
    deleted = sorted(set(shown) - set(kept))
    if args.json:
        print_json({"pruned": pruned, "deleted": deleted, "kept": kept})
    else:
        print(f"deleted {fmt.plural(pruned, 'session')}")
        if kept:
            print(f"kept {fmt.plural(len(kept), 'listed session')} that changed since the list "
                  f"was made (new activity or live work): {', '.join(kept)}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with open_read_only(args) as db:
        session_id = _resolve_session(db, args.session)
        doomed = db.list_delete_candidates(session_id) or [
            {key: session_id if key == "id" else None for key in DOOMED_FIELDS}]
    delegates = len(doomed) - 1
    what = f"session {session_id} and its messages" + (
        f", with {fmt.plural(delegates, 'delegate session')}" if delegates else "") + (
        " (its other child sessions are kept)")
    if args.dry_run:
        return _dry_run(args, doomed, f"would delete {what}")
    db_files.refuse_write_protected(resolve_db(args))
    if not _confirm(args, doomed, f"to delete: {what}"):
        warn("nothing deleted")
        return 1
    with open_writable(args) as db:
        deleted = db.delete_session(session_id)
    if args.json:
        print_json({"session_id": session_id, "deleted": deleted})
    else:
        print(f"deleted {session_id}" if deleted else f"no session {session_id}")
    return 0 if deleted else 1


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


def prune_filter_options(parser: argparse.ArgumentParser) -> None:
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
