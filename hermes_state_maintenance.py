"""Maintenance of a session store's file: backups, restores, repairs and health checks.

The database and its ``-wal`` are one image, so every copy goes through SQLite's backup API.
Repair and restore hold SQLite's EXCLUSIVE lock for their whole window, so no write lands
between snapshot and promotion. Files that are not session stores are refused before any
write. See docs/operations.md."""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import hermes_state_fts as fts
import hermes_state_fulltext as fulltext
import hermes_state_impact as impact
from hermes_state_common import quote_identifier
from hermes_state_connect import (
    connect,
    split_sql,
    table_exists,
    transaction,
)
from hermes_state_files import (
    cannot_create,
    fsync_directory,
    journal_path,
    make_private_dir,
    prepare_db_file,
    refuse_symlinks,
    remove_abandoned_temps,
    sidecar_paths,
    temp_prefix,
    tighten_modes,
)
from hermes_state_home import get_hermes_home
from hermes_state_schema_sql import (
    FTS_SQL,
    INDEXES_SQL,
    RUNTIME_LEDGER_TABLES,
    SCHEMA_VERSION,
)
from hermes_state_errors import (
    HermesStateError,
    InvalidInputError,
    StateDbCorruptError,
    StateDbInUseError,
    StateDbUnavailableError,
    hot_journal_error,
    is_corruption_error,
    is_hot_journal_error,
    is_sqlite_lock_error,
    translate,
    translated_errors,
)
from hermes_state_lockowners import describe_lock_holders
import hermes_state_quarantine as quarantine
from hermes_state_quarantine import clear_marker
from hermes_state_schema import read_version, refuse_foreign, reshape_delegations
from hermes_state_testguard import check_test_isolation

__all__ = [
    "Progress",
    "no_progress",
    "SNAPSHOT_DIRNAME",
    "snapshot_dir",
    "store_home",
    "list_snapshots",
    "prune_snapshots",
    "utc_stamp",
    "quick_check",
    "rebuild_indexes",
    "COUNTED_TABLES",
    "row_counts",
    "backup_state_db",
    "restore_state_db",
    "repair_state_db",
    "health_report",
    "QuickHealth",
    "quick_health",
    "fts_structure_check",
    "DAMAGED_SUFFIX",
]

# A repair's work copy: ``.repair-<pid>...`` in the snapshot folder; a later repair removes
# those of a killed one.
REPAIR_MARK = ".repair-"

Progress = Callable[[str, int, "int | None"], None]

SNAPSHOT_DIRNAME = "state-snapshots"


def no_progress(stage: str, done: int, total: int | None) -> None:
    """A progress callback that reports nothing."""


# ---------------------------------------------------------------------------------------------
# Files: snapshots, exclusivity, promotion
# ---------------------------------------------------------------------------------------------


def store_home(db_path: str | os.PathLike[str]) -> Path:
    """The home a store belongs to, as ``doctor`` reports it: its database file's folder
    (the default store lives at ``<home>/state.db``)."""
    return Path(db_path).expanduser().absolute().parent


def snapshot_dir(db_path: str | os.PathLike[str] | None = None) -> Path:
    """Where the snapshots of the store at ``db_path`` live: ``<its home>/state-snapshots``
    (without a store: the current home's)."""
    home = get_hermes_home() if db_path is None else store_home(db_path)
    return home / SNAPSHOT_DIRNAME


# How the name of a snapshot that failed its check ends (``state-<stamp>-damaged.db``).
DAMAGED_SUFFIX = "-damaged"


def _snapshot_name_re(db_path: str | os.PathLike[str]) -> re.Pattern[str]:
    stem = re.escape(Path(db_path).stem)
    return re.compile(rf"{stem}-(\d{{8}}T\d{{6}}Z)(?:-(\d+))?({DAMAGED_SUFFIX})?\.db")


def list_snapshots(db_path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The snapshots of the store at ``db_path`` (named after its file, in its snapshot
    folder; another store's are never listed), newest first: ``path``, ``taken_at`` (the UTC
    stamp of the name), ``size`` and ``damaged`` (the copy of a damaged store a restore saved:
    it failed quick_check, and cannot be restored)."""
    folder = snapshot_dir(db_path)
    pattern = _snapshot_name_re(db_path)
    found: list[tuple[tuple[str, int], dict[str, Any]]] = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(folder):
            match = pattern.fullmatch(entry.name)
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            stamp = datetime.datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ")
            taken = stamp.replace(tzinfo=datetime.UTC).isoformat()
            order = (match.group(1), int(match.group(2) or 1))
            found.append((order, {"path": entry.path, "taken_at": taken,
                                  "size": entry.stat(follow_symlinks=False).st_size,
                                  "damaged": match.group(3) is not None}))
    return [info for _, info in sorted(found, key=lambda f: f[0], reverse=True)]


def prune_snapshots(
    db_path: str | os.PathLike[str], keep: int, *, spare: Iterable[str] = ()
) -> list[str]:
    """Delete all but the newest ``keep`` snapshots of the store at ``db_path`` (never
    another store's, never one of ``spare``, which count among the kept); returns the paths
    deleted."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise InvalidInputError(f"keep must be a non-negative integer, got {keep!r}")
    spared = {os.path.abspath(p) for p in spare}
    snapshots = list_snapshots(db_path)
    kept = [i for i in snapshots if os.path.abspath(i["path"]) in spared]
    others = [i for i in snapshots if os.path.abspath(i["path"]) not in spared]
    deleted = []
    for info in others[max(keep - len(kept), 0):]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(info["path"])
            deleted.append(info["path"])
        with contextlib.suppress(FileNotFoundError):  # a damaged store kept with its -wal
            sidecar_paths(Path(info["path"]))[0].unlink()
    return deleted


def utc_stamp() -> str:
    """Now, in UTC, as the stamp in snapshot and output names."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")


def _new_private_file(path: Path) -> Path:
    """Create ``path`` empty with mode 0600 (never an existing file, never through a link);
    FileExistsError when it exists, a typed error when it cannot be created."""
    make_private_dir(path.parent, for_file=path)
    try:
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600
        )
    except FileExistsError:
        raise
    except OSError as exc:
        raise cannot_create(path, exc) from exc
    os.close(fd)
    return path


def _unique_snapshot_path(directory: Path, prefix: str, suffix: str = "") -> Path:
    stamp = utc_stamp()
    for n in range(1, 1000):
        name = f"{prefix}-{stamp}" if n == 1 else f"{prefix}-{stamp}-{n}"
        candidate = directory / f"{name}{suffix}.db"
        try:
            return _new_private_file(candidate)
        except FileExistsError:
            continue
    raise HermesStateError(f"no free snapshot name in {directory}")


def _remove_db_files(path: Path) -> None:
    for p in (path, *sidecar_paths(path), journal_path(path)):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _existing_db(db_path: str | os.PathLike[str]) -> Path:
    path = Path(db_path).expanduser().absolute()
    check_test_isolation(path)
    refuse_symlinks(path)
    if not path.is_file() or path.stat().st_size == 0:
        raise StateDbUnavailableError(
            f"no initialised session store at {path}", reason="uninitialized", path=path
        )
    return path


QUICK_CHECK_SQL = "PRAGMA quick_check"


def quick_check(conn: sqlite3.Connection) -> list[str]:
    """``PRAGMA quick_check``'s lines (an error's text where it cannot run)."""
    try:
        return [r[0] for r in conn.execute(QUICK_CHECK_SQL).fetchall()]
    except sqlite3.Error as exc:
        return [f"{type(exc).__name__}: {exc}"]


def _copy_into(src: sqlite3.Connection, dest: Path) -> sqlite3.Connection:
    """Copy the database of ``src`` into the new file ``dest`` with the backup API and return
    a connection on the copy. One backup step: a consistent snapshot read through the WAL,
    while writers carry on (a stepwise backup would restart after every foreign write)."""
    dst = connect(dest, "rwc")
    try:
        src.backup(dst)
    except BaseException:
        dst.close()
        raise
    return dst


@contextlib.contextmanager
def _reading(db_path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection on the live database, beside its writers. A hot journal, which
    such a connection may not roll back, raises the typed ``hot_journal`` error."""
    conn = connect(db_path, "ro")
    try:
        yield conn
    except sqlite3.Error as exc:
        if is_hot_journal_error(exc):
            raise hot_journal_error(db_path) from exc
        raise
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# Exclusive maintenance: repair and restore hold SQLite's own EXCLUSIVE lock on the live file
# for their whole window, from the first read of it to the last page written onto it.
#
# One connection takes it: ``locking_mode = EXCLUSIVE`` (it never releases a lock once taken),
# then ``BEGIN EXCLUSIVE; COMMIT``. Every WAL connection keeps a SHARED lock for as long as it
# is open, so this fails with SQLITE_BUSY while any other connection anywhere (this process's
# own included) has the file open: that is the refusal, after a short busy timeout. From then
# on every other open, read and write gets SQLITE_BUSY and waits within its patience. (With
# the lock taken before its first read, the connection keeps the WAL index in its own memory
# and never touches ``-shm``.) The snapshot and the working copy are read through it. The
# promotion first takes the file out of WAL mode (``journal_mode = DELETE``: a rollback-mode
# destination may even change its page size), then writes the repaired copy into it with the
# backup API (the connection holds the lock but no transaction). At the end the file goes
# back to WAL mode while the lock is still held, and closing the connection releases it. A
# store found healthy is never switched: only its committed WAL frames, if any, are
# checkpointed when the connection closes.
#
# A kill -9 at any step leaves a file SQLite itself makes whole: before the promotion, the
# live store untouched; during it, a hot ``-journal`` that the next writable open rolls back to
# the store as it was before the promotion (read-only opens cannot: ``hot_journal``); after
# it, the promoted store in rollback mode, which the next writable open puts back in WAL mode.
# /proc/locks is read only to name holders: SQLite's lock is the proof of exclusivity.
# ---------------------------------------------------------------------------------------------

# How long taking the store waits for a lock: a writer that is just closing is waited for, a
# process that keeps the file open is refused promptly.
_EXCLUSIVE_BUSY_TIMEOUT_S = 0.5
# The promotion copies at least this many pages per step, and at most about 20 steps; progress
# is reported after each.
_PROMOTE_STEP_PAGES = 1024
_PROMOTE_STEPS = 20
# The first bytes of a rollback journal whose header is live (SQLite zeroes them when done).
_JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")


@dataclass
class _Exclusive:
    """The live store held by maintenance: its connection, its size in pages when it was
    taken (0: an empty file), and whether taking it rolled back a hot journal left by an
    interrupted write."""

    conn: sqlite3.Connection
    pages: int
    rolled_back_journal: bool


def _page_count(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA page_count").fetchone()[0])


def _journal_is_hot(db_path: Path) -> bool:
    """Whether a journal with a live header lies beside the file (it is hot when no process
    is writing through it; under the admission lock and before taking the store, none is)."""
    try:
        with open(journal_path(db_path), "rb") as fh:  # not a database file: no locks at stake
            return fh.read(len(_JOURNAL_MAGIC)) == _JOURNAL_MAGIC
    except FileNotFoundError:
        return False


def _in_use_error(db_path: Path) -> StateDbInUseError:
    others = describe_lock_holders(db_path)
    own = len(describe_lock_holders(db_path, exclude_pids=())) > len(others)
    parts = others + (["this process itself has it open"] if own else [])
    detail = "; ".join(parts) or "another connection has it open"
    return StateDbInUseError(f"{db_path} is in use: {detail}", path=db_path, holders=others)


def _take_exclusive(db_path: Path) -> _Exclusive:
    hot = _journal_is_hot(db_path)
    conn = connect(db_path, "rw", timeout=_EXCLUSIVE_BUSY_TIMEOUT_S)
    try:
        conn.execute("PRAGMA locking_mode = EXCLUSIVE")
        pages = _page_count(conn)  # the first read: a hot journal is rolled back here
        # Taking the lock, not a transaction of work: nothing is written (but page 1 of an
        # empty file), and from here on the lock stays (locking_mode EXCLUSIVE).
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("COMMIT")
        if pages > 0:
            refuse_foreign(conn)  # another application's database is refused untouched
    except BaseException as exc:
        conn.close()
        if not isinstance(exc, sqlite3.Error):
            raise
        if is_sqlite_lock_error(exc):
            raise _in_use_error(db_path) from exc
        raise translate(exc, db_path) from exc
    return _Exclusive(conn, pages, rolled_back_journal=hot and not _journal_is_hot(db_path))


def _release_exclusive(held: _Exclusive, db_path: Path, *, check: bool) -> None:
    """Back to WAL mode (if the promotion left it) while the lock is still held, then close,
    which releases it. With ``check`` a store that stays in rollback mode is an error;
    otherwise (cleaning up after a failure) the next writable open switches it."""
    try:
        mode = held.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if check and str(mode).lower() != "wal":
            raise HermesStateError(f"{db_path} refused WAL mode (journal_mode={mode})")
        if not _journal_is_hot(db_path):
            # A promoted page 1 that already says WAL moves the connection to WAL mode by
            # itself, and in exclusive locking mode SQLite then keeps the finished journal
            # (header zeroed) instead of deleting it; nothing can need it now.
            with contextlib.suppress(FileNotFoundError):
                journal_path(db_path).unlink()
    except sqlite3.Error:
        if check:
            raise
    finally:
        held.conn.close()
        tighten_modes(db_path)


@contextlib.contextmanager
def _admitted(db_path: Path) -> Iterator[None]:
    """Hold the admission lock: one maintenance run at a time (:class:`StateDbInUseError`
    when another run holds it)."""
    with fts.admission_lock(db_path) as admitted:
        if not admitted:
            raise StateDbInUseError(
                f"another maintenance run holds the admission lock of {db_path}", path=db_path
            )
        yield


@contextlib.contextmanager
def _exclusive(
    db_path: Path, *, create: bool = False, admitted: bool = False
) -> Iterator[_Exclusive]:
    """Hold the admission lock (unless the caller holds it: ``admitted``) and the live store
    itself for the whole block (``create``: an empty private file first, when there is
    none). :class:`StateDbInUseError` when either is taken; a damaged store is
    :class:`StateDbCorruptError`."""
    if create:  # (first: a file that cannot be created is that, not a lock held elsewhere)
        prepare_db_file(db_path)
    with contextlib.nullcontext() if admitted else _admitted(db_path):
        held = _take_exclusive(db_path)
        try:
            yield held
        except BaseException:
            _release_exclusive(held, db_path, check=False)
            raise
        _release_exclusive(held, db_path, check=True)


def _promote(src: sqlite3.Connection, live: sqlite3.Connection, say: Progress) -> list[str]:
    """Write the database of ``src`` onto the held live store in rollback mode, in steps with
    progress (the source is private, so no step restarts); returns its quick_check."""
    mode = live.execute("PRAGMA journal_mode = DELETE").fetchone()[0]
    if str(mode).lower() != "delete":
        raise HermesStateError(f"the live store refused rollback mode (journal_mode={mode})")
    total = _page_count(src)
    step = max(_PROMOTE_STEP_PAGES, -(-total // _PROMOTE_STEPS))

    def report(status: int, remaining: int, pages: int) -> None:
        say("promoting", pages - remaining, pages)

    say("promoting", 0, total)
    src.backup(live, pages=step, progress=report)
    return quick_check(live)


# Canonical and ledger tables whose row counts a repair must leave unchanged.
COUNTED_TABLES = (
    "sessions",
    "messages",
    "session_model_usage",
    "gateway_routing",
    "compression_locks",
    "async_delegations",
    "delivery_obligations",
    *RUNTIME_LEDGER_TABLES,
)


def row_counts(conn: sqlite3.Connection) -> dict[str, int | str]:
    """Row counts of the counted tables that exist (an error text where counting failed)."""
    counts: dict[str, int | str] = {}
    for table in COUNTED_TABLES:
        try:
            if table_exists(conn, table):
                counts[table] = conn.execute(
                    f"SELECT COUNT(*) FROM {quote_identifier(table)}"
                ).fetchone()[0]
        except sqlite3.Error as exc:
            counts[table] = f"{type(exc).__name__}: {exc}"
    return counts


# ---------------------------------------------------------------------------------------------
# Backup and restore
# ---------------------------------------------------------------------------------------------


def backup_state_db(
    db_path: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None
) -> Path:
    """Snapshot the database with the backup API; returns the snapshot's path.

    ``dest`` defaults to ``get_hermes_home()/state-snapshots/state-<UTC timestamp>.db`` and
    must not exist. The snapshot is a self-contained file (rollback journal mode, 0600) that
    passed ``PRAGMA quick_check``; one that fails it is kept for inspection and
    :class:`StateDbCorruptError` names it. Works while writers are running; a store with a
    hot journal cannot be read until a writable open rolls it back (``hot_journal``)."""
    source = _existing_db(db_path)
    with translated_errors(source), _reading(source) as src:
        refuse_foreign(src)
        path, check = _snapshot(src, dest, source)
    if check != ["ok"]:
        raise StateDbCorruptError(
            f"the snapshot of {path} fails quick_check: {'; '.join(check[:3])}", path=path
        )
    return path


def _snapshot(
    src: sqlite3.Connection, dest: str | os.PathLike[str] | None, db_path: Path
) -> tuple[Path, list[str]]:
    """Copy the database of ``src`` (the store at ``db_path``) into a new snapshot file (by
    default among that store's snapshots); its path and quick_check."""
    if dest is None:
        target = _unique_snapshot_path(snapshot_dir(db_path), db_path.stem)
    else:
        target = Path(dest).expanduser().absolute()
        try:
            _new_private_file(target)
        except FileExistsError:
            raise HermesStateError(f"the snapshot {target} already exists") from None
    try:
        conn = _copy_into(src, target)
        try:
            conn.execute("PRAGMA journal_mode = DELETE")
            return target, quick_check(conn)
        finally:
            conn.close()
    except BaseException:
        _remove_db_files(target)
        raise


def restore_state_db(
    snapshot: str | os.PathLike[str],
    db_path: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Replace the database at ``db_path`` with ``snapshot`` (backup API, page for page, so
    ledgers and everything else come back whole).

    The snapshot must pass quick_check and be a session store no newer than this library.
    The live store is held exclusively for the whole restore (see *Exclusive maintenance*):
    refused with :class:`StateDbInUseError` while any other connection has it open; other
    processes' opens and writes wait meanwhile. The current database, if any, is snapshotted
    first (``previous_snapshot``), inside the same hold, so every write it acknowledged is
    either in that snapshot or lands on the restored store afterwards. ``rolled_back_journal``
    says that taking the store rolled back an interrupted write. A durable quarantine marker
    of the file is cleared once the snapshot is in place."""
    say = progress or no_progress
    snap = _existing_db(snapshot)
    target = Path(db_path).expanduser().absolute()
    check_test_isolation(target)
    refuse_symlinks(target)
    if target.exists() and snap.resolve() == target.resolve():
        raise HermesStateError(f"{snap} is the database to restore, not a snapshot of it")
    with translated_errors(snap):
        src = connect(snap, "ro")
    try:
        with translated_errors(snap):
            version = _checked_snapshot(src, snap)
        report: dict[str, Any] = {
            "restored_from": str(snap),
            "db_path": str(target),
            "schema_version": version,
            "previous_snapshot": None,
        }
        with translated_errors(target), _exclusive(target, create=True) as held:
            report["rolled_back_journal"] = held.rolled_back_journal
            if held.pages > 0:
                say("saving the current store", 0, None)
                saved, report["previous_damaged"] = _save_previous(held.conn, target)
                report["previous_snapshot"] = str(saved)
            report["quick_check"] = _promote(src, held.conn, say)
            clear_marker(target)
            report["row_counts"] = row_counts(held.conn)
        return report
    finally:
        src.close()


def _save_previous(live: sqlite3.Connection, db_path: Path) -> tuple[Path, bool]:
    """Keep the store a restore replaces (held exclusively: nothing appends meanwhile): its
    snapshot, or, when its ``-wal`` is damaged in the middle, the file and its ``-wal`` byte
    for byte, since SQLite sees none of the commits after the damage and ``recover`` can fold
    them from the copy. The kept path, and whether it is damaged."""
    if quarantine.wal_damage(db_path) is not None:
        return _raw_copy(db_path), True
    saved, check = _snapshot(live, None, db_path)
    return (saved, False) if check == ["ok"] else (_mark_damaged(saved), True)


def _raw_copy(db_path: Path) -> Path:
    """The database file and its ``-wal`` copied as they are, under a ``-damaged`` snapshot
    name, durably (the restore overwrites the originals next)."""
    target = _unique_snapshot_path(snapshot_dir(db_path), db_path.stem, DAMAGED_SUFFIX)
    try:
        for source, copy in ((db_path, target), (sidecar_paths(db_path)[0],
                                                 sidecar_paths(target)[0])):
            if copy != target:
                _new_private_file(copy)
            with open(source, "rb") as src, open(copy, "r+b") as dest:
                shutil.copyfileobj(src, dest)
                dest.flush()
                os.fsync(dest.fileno())
        fsync_directory(target.parent)
    except BaseException:
        _remove_db_files(target)
        raise
    return target


def _mark_damaged(snapshot: Path) -> Path:
    """Rename a snapshot that failed its check to its ``-damaged`` name (never over a file);
    its new path."""
    marked = snapshot.with_name(snapshot.stem + DAMAGED_SUFFIX + snapshot.suffix)
    try:
        os.link(snapshot, marked)
    except OSError:
        return snapshot  # kept under its plain name: list_snapshots cannot tell, restore can
    os.unlink(snapshot)
    return marked


def _checked_snapshot(src: sqlite3.Connection, snap: Path) -> int:
    """The schema version of a snapshot fit to restore: it passes quick_check and is a
    session store no newer than this library."""
    check = quick_check(src)
    if check != ["ok"]:
        raise StateDbCorruptError(
            f"snapshot {snap} fails quick_check: {'; '.join(check[:3])}", path=snap
        )
    version = refuse_foreign(src)
    if version is None or version > SCHEMA_VERSION:
        raise StateDbUnavailableError(
            f"snapshot {snap} has schema version {version}; this library reads "
            f"up to {SCHEMA_VERSION}",
            reason="uninitialized" if version is None else "incompatible",
            path=snap,
            schema_version=version,
        )
    return version


# ---------------------------------------------------------------------------------------------
# Health and repair
# ---------------------------------------------------------------------------------------------


def health_report(conn: sqlite3.Connection) -> dict[str, Any]:
    """The health of the database behind ``conn`` (a private copy: the FTS check is run as a
    write, rolled back): ``integrity`` (PRAGMA integrity_check lines), ``damaged_tables`` (the
    canonical tables whose b-trees fail the check: rows no repair can mend, the file needs
    recovery), ``fts_integrity`` (per index, None when clean), ``search_index`` (its damage,
    None when none), ``fts_stale`` (the marker), ``fts_rebuilding``, ``triggers`` (expected and
    missing), ``row_counts``, ``schema_version``, ``problems``, ``healthy``."""
    problems: list[str] = []
    integrity, damaged_tables = _integrity(conn, problems)
    fts_integrity, search_index = _index_integrity(conn, problems)
    stale, rebuilding, missing, version = _index_state(conn, problems)
    counts = row_counts(conn)
    problems += [f"{t} cannot be counted: {c}" for t, c in counts.items() if isinstance(c, str)]
    return {
        "integrity": integrity,
        "damaged_tables": damaged_tables,
        "fts_integrity": fts_integrity,
        "search_index": search_index,
        "fts_stale": stale,
        "fts_rebuilding": rebuilding,
        "triggers": {"expected": list(fts.FTS_TRIGGER_NAMES), "missing": missing},
        "row_counts": counts,
        "schema_version": version,
        "problems": problems,
        "healthy": not problems,
    }


def _integrity(conn: sqlite3.Connection, problems: list[str]) -> tuple[list[str], list[str]]:
    """``PRAGMA integrity_check``'s lines and, when it fails, the damaged canonical tables."""
    try:
        integrity = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
    except sqlite3.Error as exc:
        integrity = [f"{type(exc).__name__}: {exc}"]
    damaged_tables: list[str] = []
    if integrity != ["ok"]:
        problems.append("integrity_check: " + "; ".join(integrity[:3]))
        try:
            damaged_tables = fts.damaged_canonical_tables(conn)
        except sqlite3.Error:
            damaged_tables = ["sqlite_master"]
    return integrity, damaged_tables


def _index_integrity(
    conn: sqlite3.Connection, problems: list[str]
) -> tuple[dict[str, str | None], str | None]:
    """Each FTS index's integrity check and the search index's damage, each run as a write
    that is rolled back."""
    try:
        with transaction(conn, rollback_only=True):
            fts_integrity = fts.integrity_report(conn)
    except sqlite3.Error as exc:
        fts_integrity = {t: f"{type(exc).__name__}: {exc}" for t in fts.FTS_TABLES}
    problems += [f"fts {t}: {e}" for t, e in fts_integrity.items() if e is not None]
    try:
        with transaction(conn, rollback_only=True):
            search_index = impact.index_problem(conn)
    except sqlite3.Error as exc:
        search_index = f"{type(exc).__name__}: {exc}"
    if search_index is not None:
        problems.append(f"search index: {search_index}")
    return fts_integrity, search_index


def _index_state(
    conn: sqlite3.Connection, problems: list[str]
) -> tuple[str | None, bool, list[str], int | None]:
    """The ``fts_stale`` marker, an unfinished rebuild, the missing triggers and the schema
    version."""
    try:
        state = fts.index_state(conn)
        stale, rebuilding = state.stale, state.rebuilding
        missing = fts.missing_triggers(conn)
        version: int | None = read_version(conn)
    except sqlite3.Error as exc:
        stale, rebuilding, missing, version = None, False, [], None
        problems.append(f"state unreadable: {exc}")
    if stale is not None:
        problems.append(f"fts_stale marker set: {stale}")
    if rebuilding:
        problems.append("an FTS rebuild is unfinished")
    if missing:
        problems.append("missing FTS triggers: " + ", ".join(missing))
    return stale, rebuilding, missing, version


class QuickHealth(TypedDict):
    """What :func:`quick_health` reads."""

    schema_version: int | None
    journal_mode: str
    quick_check: list[str]


JOURNAL_MODE_SQL = "PRAGMA journal_mode"


def quick_health(conn: sqlite3.Connection) -> QuickHealth:
    """A quick look at a live store through its own connection (``doctor``): its schema
    version, its journal mode and ``PRAGMA quick_check``'s lines. Reads only; SQLite's errors
    propagate (a store too damaged for the look at all is damage)."""
    return {
        "schema_version": read_version(conn),
        "journal_mode": str(conn.execute(JOURNAL_MODE_SQL).fetchone()[0]),
        "quick_check": [r[0] for r in conn.execute(QUICK_CHECK_SQL).fetchall()],
    }


# How long the FTS structure check waits for the write lock (SQLite runs the check as a write).
_FTS_CHECK_BUSY_TIMEOUT_S = 2.0


def fts_structure_check(db_path: str | os.PathLike[str]) -> dict[str, str | None]:
    """FTS5's 'integrity-check' of each full-text index's own structures (not against the
    rows, a third of the time of the full check) on the live store: None per clean index,
    else the error. What ``doctor`` runs without ``--full``.

    SQLite runs the check as a write, so it takes the write lock for a moment (waiting up to
    two seconds: :class:`StateDbLockedError` after that) and writes nothing. A read-only
    connection stays open until the writable one is closed, so closing it never checkpoints
    or removes the -wal."""
    path = _existing_db(db_path)
    with translated_errors(path):
        guard = connect(path, "ro")
        try:
            guard.execute("SELECT count(*) FROM sqlite_master").fetchone()
            conn = connect(path, "rw", timeout=_FTS_CHECK_BUSY_TIMEOUT_S)
            try:
                return fts.integrity_report(conn, against_content=False)
            finally:
                conn.close()
        finally:
            guard.close()


def _drop_fts(work: Path, conn: sqlite3.Connection) -> sqlite3.Connection:
    """Remove the FTS tables, views and triggers from the working copy. A damaged shadow
    b-tree cannot be dropped (DROP walks it), so then its schema rows are deleted instead and
    the following VACUUM leaves the orphaned pages behind. Returns the connection to use."""
    names = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE ? ESCAPE '\\'",
            ("messages\\_fts%",),
        )
    ]
    try:
        with transaction(conn):
            for name in names:
                conn.execute(f"DROP TRIGGER IF EXISTS {quote_identifier(name)}")
            for table in fts.FTS_TABLES:
                conn.execute(f"DROP TABLE IF EXISTS {quote_identifier(table)}")
            for view in ("messages_fts_trigram_source", "messages_fts_cjk_source"):
                conn.execute(f"DROP VIEW IF EXISTS {quote_identifier(view)}")
            impact.drop_index(conn)
        return conn
    except sqlite3.DatabaseError as exc:
        if not is_corruption_error(exc):
            raise
    conn.execute("PRAGMA writable_schema = ON")
    with transaction(conn):
        for pattern in ("messages\\_fts%", "search\\_impact%", "search\\_time%"):
            conn.execute(
                "DELETE FROM sqlite_master"
                " WHERE name LIKE :p ESCAPE '\\' OR tbl_name LIKE :p ESCAPE '\\'",
                {"p": pattern},
            )
    conn.execute("PRAGMA writable_schema = OFF")
    conn.close()  # the schema changed underneath SQLite: start from a fresh connection
    return connect(work, "rw")


# A private copy has no other writer to make wait: bigger chunks than a live rebuild's.
_REBUILD_CHUNK_ROWS = 5000


def rebuild_indexes(
    conn: sqlite3.Connection, progress: Progress, *, defer: bool = False
) -> None:
    """Create the FTS objects of the current schema and the search index, and fill them in
    chunks (the FTS rebuild also recomputes ``search_cjk``); clears every FTS marker on the
    way. With ``defer`` the indexes are left empty with their rebuild and fill due: the first
    writable open of the file fills them in the background while searches use the canonical
    rows. An ``async_delegations`` of this library's earlier shape is rebuilt into the
    declared one first, as a writable open does, so its indexes find their columns."""
    with transaction(conn):
        reshape_delegations(conn)
        for statement in split_sql(INDEXES_SQL + FTS_SQL):
            conn.execute(statement)
        total = fts.start_rebuild(conn)
        impact.create_index(conn)
    if defer:
        return
    for label, chunk in (("rebuilding FTS", fts.rebuild_chunk),
                         ("filling the search index", impact.fill_chunk)):
        done = 0
        while True:
            with transaction(conn):
                step = chunk(conn, _REBUILD_CHUNK_ROWS)
            if step is None or step.finished:
                break
            done += step.indexed
            progress(label, done, total)
        progress(label, total, total)


def repair_state_db(
    db_path: str | os.PathLike[str],
    *,
    check_only: bool = False,
    backup: bool = True,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Check, and unless ``check_only`` repair, the derived structures of a session store.

    ``check_only``: the :func:`health_report` of a backup-API copy (nothing is written to the
    database; it may run while others use it; a hot journal, which only a writable open may
    roll back, is :class:`StateDbUnavailableError` ``hot_journal``). Repair holds the live
    store exclusively for its whole window (see *Exclusive maintenance*; refused with
    :class:`StateDbInUseError` while any other connection has it open, other processes'
    writes wait meanwhile):

    1. a working copy (backup API) on which the FTS objects and the search index are
       dropped, the file VACUUMed (rebuilding every ordinary index and dropping orphaned
       pages) and the FTS indexes, triggers and markers and the search index rebuilt;
       canonical rows are never deleted;
    2. the checks on the working copy, which must pass with every row count unchanged;
    3. only then a snapshot among the store's snapshots (:func:`snapshot_dir`,
       ``backup=True``), and the working copy written onto the live file with the backup
       API, and a durable quarantine marker of the file is cleared.

    A store that is already healthy is left alone. When the checks fail, or the canonical
    tables cannot be read, nothing is promoted, ``kept`` lists the live file (untouched) and
    no snapshot is left behind. Taking the store rolls back a hot journal an interrupted write
    left behind (``rolled_back_journal``), before anything is copied.

    Both check and repair read or rebuild the FTS indexes: on an SQLite without them they
    raise :class:`FullTextUnavailableError` before anything is read.
    """
    path = _existing_db(db_path)
    if fulltext.detected() != fulltext.FULL:
        raise fulltext.unavailable(fulltext.detected(), "repair")
    say = progress or no_progress
    report: dict[str, Any] = {"db_path": str(path), "check_only": check_only}
    with translated_errors(path):
        if check_only:
            return _check(path, report, say)
        return _repair(path, report, backup=backup, say=say)


def _check(path: Path, report: dict[str, Any], say: Progress) -> dict[str, Any]:
    """The check-only run: the health of a private backup-API copy."""
    report["in_use_by"] = describe_lock_holders(path)
    with tempfile.TemporaryDirectory(prefix="hermes-check-") as tmp:
        say("copying", 0, None)
        try:
            with _reading(path) as src:
                refuse_foreign(src)
                conn = _copy_into(src, Path(tmp) / "check.db")
        except sqlite3.Error as exc:
            return {**report, **_unreadable(exc)}
        try:
            say("checking integrity and the FTS indexes", 0, None)
            report.update(health_report(conn))
        finally:
            conn.close()
    return report


def _repair(path: Path, report: dict[str, Any], *, backup: bool, say: Progress
            ) -> dict[str, Any]:
    """The repair run: take the store, then repair it while it is held — unless the store
    must be left exactly as it is (see :func:`_left_alone`). A run that promotes nothing
    leaves nothing behind: the snapshot folder and the admission lock's file are removed
    again when this run created them."""
    folder, lock = snapshot_dir(path), fts.admission_lock_path(path)
    made = (not folder.exists(), not lock.exists())
    result: dict[str, Any] = {}
    try:
        with _admitted(path):  # from the trial on a copy to the promotion
            result = (_left_alone(path, report, say)
                      or _repair_taken(path, report, backup=backup, say=say))
        return result
    finally:
        if not result.get("promoted"):
            if made[0]:
                with contextlib.suppress(OSError):  # only an empty folder
                    folder.rmdir()
            if made[1]:
                fts.remove_admission_lock(path)


def _repair_taken(path: Path, report: dict[str, Any], *, backup: bool, say: Progress
                  ) -> dict[str, Any]:
    """Repair the store while it is held."""
    with contextlib.ExitStack() as stack:
        try:
            held = stack.enter_context(_exclusive(path, admitted=True))
        except StateDbCorruptError as exc:
            cause = exc.__cause__ if isinstance(exc.__cause__, sqlite3.Error) else exc
            return {**report, **_unreadable(cause), "promoted": False, "kept": [str(path)]}
        report["rolled_back_journal"] = held.rolled_back_journal
        return _repair_held(held.conn, path, report, backup=backup, say=say)


def _left_alone(path: Path, report: dict[str, Any], say: Progress) -> dict[str, Any] | None:
    """The report of a repair that must not take the store, None when it may.

    Taking the store opens a writable connection, and the last connection to close copies
    the ``-wal`` into the file and deletes it: into a damaged file, that turns what recover
    could still read into what it cannot. So nothing takes a store whose ``-wal`` is damaged
    in the middle (a repair rebuilds from what SQLite reads, which leaves out the commits
    after the damage), and the repair is first made on a copy read beside the writers: a
    store that copy cannot mend is never taken, nor one that is healthy but quarantined
    (there is nothing to promote, and the quarantine is cleared by ``doctor
    --clear-quarantine`` once it checks clean). A store with a hot journal is taken at once:
    only a writable open may roll it back."""
    kept = [str(path)]
    damage = quarantine.wal_damage(path)
    if damage is not None:
        return {**report, "error": f"{damage}; a repair rebuilds from what SQLite reads and "
                "would leave those commits out: recover the store instead",
                "repaired": False, "promoted": False, "backup": None,
                "kept": [*kept, str(sidecar_paths(path)[0])]}
    if _journal_is_hot(path):
        return None
    snapshots = snapshot_dir(path)
    make_private_dir(snapshots, for_file=snapshots / path.name)
    remove_abandoned_temps(snapshots, REPAIR_MARK)
    with tempfile.TemporaryDirectory(prefix=temp_prefix(REPAIR_MARK), dir=snapshots) as tmp:
        work = _new_private_file(Path(tmp) / "work.db")
        say("copying", 0, None)
        try:
            with _reading(path) as src:
                refuse_foreign(src)
                conn = _copy_into(src, work)
        except sqlite3.Error as exc:
            return {**report, **_unreadable(exc), "promoted": False, "kept": kept}
        try:
            before = health_report(conn)
            if before["healthy"]:
                marker = quarantine.read_marker(path)
                if marker is None:
                    return None
                return {**report, "before": before, "repaired": False, "promoted": False,
                        "backup": None, "quarantine": marker}
            conn, after, error = _repair_copy(work, conn, before["row_counts"], say)
        finally:
            conn.close()
    if error is None:
        return None
    return {**report, "before": before, "after": after, "error": error, "repaired": False,
            "promoted": False, "backup": None, "kept": kept}


def _repair_held(
    live: sqlite3.Connection,
    path: Path,
    report: dict[str, Any],
    *,
    backup: bool,
    say: Progress,
) -> dict[str, Any]:
    """The repair proper, on the live store ``live`` held exclusively."""
    snapshots = snapshot_dir(path)
    make_private_dir(snapshots, for_file=snapshots / path.name)
    remove_abandoned_temps(snapshots, REPAIR_MARK)  # a killed repair's work copies
    with tempfile.TemporaryDirectory(prefix=temp_prefix(REPAIR_MARK), dir=snapshots) as tmp:
        work = _new_private_file(Path(tmp) / "work.db")
        say("copying", 0, None)
        try:
            conn = _copy_into(live, work)
        except sqlite3.Error as exc:
            return {**report, **_unreadable(exc), "promoted": False, "kept": [str(path)]}
        try:
            before = health_report(conn)
            report["before"] = before
            if before["healthy"]:
                return {**report, "repaired": False, "promoted": False, "backup": None}
            conn, after, error = _repair_copy(work, conn, before["row_counts"], say)
            report["after"] = after
            if error is not None:  # the live file is untouched: no snapshot is needed
                return {**report, "error": error, "repaired": False, "promoted": False,
                        "backup": None, "kept": [str(path)]}
            # Taken only now, just before the promotion: the store is still held, so it is the
            # state the working copy was made from, and a failed repair leaves no snapshot.
            if backup:
                snap, check = _snapshot(live, None, path)
                report["backup"] = str(snap)
                report["backup_quick_check"] = check
            report["live_quick_check"] = _promote(conn, live, say)
            clear_marker(path)
            return {**report, "repaired": True, "promoted": True}
        finally:
            conn.close()


def _unreadable(exc: BaseException) -> dict[str, Any]:
    problem = f"the database cannot be read: {type(exc).__name__}: {exc}"
    return {"healthy": False, "problems": [problem], "integrity": [problem], "repaired": False}


def _repair_copy(
    work: Path, conn: sqlite3.Connection, counts: Mapping[str, int | str], say: Progress
) -> tuple[sqlite3.Connection, dict[str, Any] | None, str | None]:
    """Rebuild the derived structures of the working copy and check it; returns the
    connection, the health after, and the reason it must not be promoted (None: promote)."""
    unreadable = [t for t, c in counts.items() if isinstance(c, str)]
    if unreadable:
        return conn, None, (
            "canonical tables cannot be read (" + ", ".join(unreadable) + "); a rebuild of "
            "the indexes cannot help, the file needs recovery"
        )
    try:
        say("dropping FTS", 0, None)
        conn = _drop_fts(work, conn)
        say("vacuuming", 0, None)
        conn.execute("VACUUM")
        rebuild_indexes(conn, say)
        with transaction(conn):
            conn.execute(
                "DELETE FROM state_meta WHERE key IN (?, ?, ?)",
                (fts.STALE_KEY, fts.HIGH_WATER_KEY, fts.PROGRESS_KEY),
            )
    except sqlite3.Error as exc:
        return conn, None, f"rebuilding on the working copy failed: {type(exc).__name__}: {exc}"
    after = health_report(conn)
    if not after["healthy"]:
        return conn, after, "the working copy still fails its checks"
    changed = {t: (c, after["row_counts"].get(t)) for t, c in counts.items()
               if after["row_counts"].get(t) != c}
    if changed:
        return conn, after, f"row counts changed on the working copy: {changed}"
    return conn, after, None

