"""The ``hermes-state`` command line: browse, export and import sessions; check, repair,
recover, back up, restore and replicate the store.

This module is the entry point: the parser of every command and option, and ``main``, which
runs a command and reports its failure. The commands live beside it, by concern: the session
commands in ``hermes_state_cli_sessions``, the store's maintenance in
``hermes_state_cli_store``; what they share (the store named, output, argument types,
advice) in ``hermes_state_cli_common``.

Each command works on one database (``--db``, else ``--profile`` under ``--home``). Read-only
commands never create, migrate or repair it. ``--json`` prints one document, failures
included. Exit status: 0 success, 1 failure or problem found, 2 bad usage. Advice on what to
do next lives in the command line, never in the library's exception messages. See
docs/operations.md."""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import hermes_state_home as home_paths
import hermes_state_search as search
from hermes_state import __version__
from hermes_state_errors import HermesStateError
from hermes_state_transfer import ON_CONFLICT_CHOICES
from hermes_state_cli_common import (
    PROG,
    advice_for,
    condition_text,
    count_arg,
    days_arg,
    home_dir,
    other_file_advice,
    print_json,
    resolve_db,
    warn,
)
from hermes_state_cli_sessions import (
    NotConfirmed,
    cmd_delete,
    cmd_export,
    cmd_import,
    cmd_list,
    cmd_prune,
    cmd_search,
    cmd_show,
    cmd_stats,
    prune_filter_options,
)
from hermes_state_cli_store import (
    KEEP_ENV,
    cmd_backup,
    cmd_doctor,
    cmd_recover,
    cmd_repair,
    cmd_replicate,
    cmd_restore,
)

__all__ = ["main", "build_parser"]

# The first lines of ``--help``: plain text (the module's docstring is reStructuredText).
DESCRIPTION = (
    "Browse, export and import sessions; check, repair, recover, back up and restore the "
    "store; replicate it with Litestream and restore it from its replica. Every command works "
    "on one database: --db PATH, else state.db of --profile NAME under --home (default: "
    "HERMES_HOME, then ~/.hermes). --json prints one JSON document on stdout (an error too, as "
    "{\"error\": {...}}). Exit status: 0 success, 1 failure (or, for checks, a problem found), "
    "2 bad usage."
)
# The roles messages are stored with.
ROLES = ("user", "assistant", "system", "tool")
SEARCH_SORTS = ("relevance", *search.SORTS)
OUTPUT_FORMATS = ("table", "json", "jsonl", "csv")




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
    prune_filter_options(p)
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
    warn(message)
    if advice:
        warn(f"next: {advice}")
    if args is not None and getattr(args, "json", False):
        print_json({"error": {"type": type(exc).__name__, "message": message,
                               "next": advice, "exit_status": status}})
    return status


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are also a JSON error object on stdout when
    ``--json`` is among the arguments."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if _Parser.json_errors:
            print_json({"error": {"type": "UsageError", "message": message, "next":
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
        home = home_dir(args)
        with home_paths.hermes_home_override(home):
            return int(args.func(args))
    except BrokenPipeError:  # `hermes-state sessions export | head`
        with contextlib.suppress(OSError):
            sys.stdout.close()
        return 0
    except KeyboardInterrupt as exc:  # a second Ctrl-C while a replicator shuts down
        for note in getattr(exc, "__notes__", ()):  # what an interrupted import kept
            warn(note)
        warn("interrupted")
        return 130
    except NotConfirmed as exc:
        return _fail(args, exc, 2, str(exc))
    except (HermesStateError, OSError, ValueError) as exc:
        return _failed(args, exc)


def _failed(args: argparse.Namespace, exc: BaseException) -> int:
    """Report a command's failure: the condition (and the notes the library added to it),
    and the advice for the store the command names."""
    try:
        db: Path | None = resolve_db(args)
    except HermesStateError:
        db = None
    message = "\n".join([condition_text(exc, db or Path.cwd()),
                         *map(str, getattr(exc, "__notes__", []))])
    advice = None if db is None else (
        other_file_advice(args.command, exc, db) or advice_for(exc, db))
    return _fail(args, exc, 1, message, advice)


if __name__ == "__main__":
    sys.exit(main())
