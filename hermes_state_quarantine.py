"""Quarantine: a damaged database file is never written again, by this process or the next.

Corruption not proven to lie in the FTS indexes quarantines the file. The handle refuses
writes (:class:`StateDbCorruptError`). The file is registered by device and inode, so every
handle of the process on it follows.

SQLite checkpoints when the last connection closes, which would copy damage in. So quarantined
connections disable that (:func:`protect`), and a read-only close guard stays open until exit.

A marker ``<db>-quarantine`` carries the quarantine to later processes. It is keyed to the
inode, so a file moved into place is not the damaged one. Maintenance that mends the file in
place clears it, as does ``doctor --clear-quarantine``. Transcripts that could not be
written go to spools on disk, never to a memory queue. Processes that opened the file before
the damage was found are not covered."""

from __future__ import annotations

import atexit
import contextlib
import datetime
import hashlib
import inspect
import json
import logging
import os
import re
import sqlite3
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeGuard

import hermes_state_fileformat as ff
import hermes_state_fts as fts
from hermes_state_common import clean_text
from hermes_state_connect import configure_connection
from hermes_state_files import fsync_directory, sidecar_paths
from hermes_state_home import append_error_log, get_hermes_home
from hermes_state_errors import StateDbCorruptError, StateDbInUseError, UnsafePathError
from hermes_state_errors import is_corruption_error
from hermes_state_lockowners import describe_lock_holders

logger = logging.getLogger("hermes_state")

__all__ = [
    "Watch",
    "OPEN_LOCK",
    "FileId",
    "file_identity",
    "inherited",
    "in_process",
    "register",
    "recorded_note",
    "record_found_damage",
    "wal_damage",
    "wal_damage_scan",
    "protect",
    "track",
    "untrack",
    "close_quarantined_handles",
    "Spool",
    "SESSIONS_SPOOL_DIR",
    "PENDING_MESSAGES_DIR",
    "spool_file_name",
    "spool_transcript",
    "spool_pending_message",
    "MARKER_SUFFIX",
    "marker_path",
    "read_marker",
    "write_marker",
    "clear_marker",
    "declare",
    "earlier_quarantine",
    "describe_marker",
    "clear_quarantine",
    "CIRCULAR_MARK",
    "TOO_DEEP_MARK",
]

MARKER_SUFFIX = "-quarantine"


def marker_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + MARKER_SUFFIX)


FileId = tuple[int, int]


def file_identity(db_path: Path) -> FileId | None:
    """(device, inode) of the database file itself (``lstat``: no descriptor is opened)."""
    try:
        st = db_path.lstat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _load(path: Path) -> dict[str, Any] | None:
    """The marker file's JSON object (``unreadable`` set when it is not one); None: no file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"path": str(path), "unreadable": str(exc)}
    try:
        marker = json.loads(text)
        if not isinstance(marker, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        return {"path": str(path), "unreadable": str(exc)}
    unusable = _unusable_identity(marker)
    if unusable is not None:
        marker["unreadable"] = unusable
    marker["path"] = str(path)
    return marker


def _is_number(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _unusable_identity(marker: Mapping[str, Any]) -> str | None:
    """Why ``marker`` names no file (its device or inode missing, or not a non-negative
    integer), None when it names one."""
    bad = [key for key in ("device", "inode") if not _is_number(marker.get(key))]
    if not bad:
        return None
    shown = ", ".join(f"{key} {marker.get(key)!r}" for key in bad)
    return f"it names no file: {shown}"


def _names(marker: dict[str, Any], identity: FileId | None) -> bool:
    """Does ``marker`` name the file whose identity is ``identity``? Only a marker whose
    device and inode are integers naming another file does not: one that cannot be read, or
    names no file at all, names any file that exists (someone wrote it for a reason). None
    names a missing file."""
    if identity is None:
        return False
    if "unreadable" in marker:
        return True
    return [marker.get("device"), marker.get("inode")] == list(identity)


def read_marker(db_path: Path) -> dict[str, Any] | None:
    """The marker of ``db_path`` when it names this very file, else None.

    A marker that cannot be parsed still counts: it is returned with ``unreadable`` set. A
    marker naming another file (the path now holds a different inode, or nothing) is
    ignored."""
    marker = _load(marker_path(db_path))
    if marker is None or not _names(marker, file_identity(db_path)):
        return None
    return marker


def write_marker(db_path: Path, reason: str) -> Path | None:
    """Write the marker of ``db_path``, or keep the one that already names this file (the
    first quarantine's time and reason are the evidence); the marker's path, None when it
    could not be written. The data and the directory entry are fsynced: the marker must
    survive a crash that follows the quarantine."""
    identity = file_identity(db_path)
    if identity is None:
        return None
    path = marker_path(db_path)
    if read_marker(db_path) is not None:
        return path
    body = {
        "device": identity[0],
        "inode": identity[1],
        "quarantined_at": time.time(),
        "pid": os.getpid(),
        "reason": reason,
    }
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
            | getattr(os, "O_CLOEXEC", 0),
            0o600,
        )
        try:
            data = json.dumps(body, ensure_ascii=False) + "\n"
            os.write(fd, data.encode("utf-8", "replace"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return path


def clear_marker(db_path: Path) -> bool:
    """Remove the marker of ``db_path`` (whatever file it names); True when there was one."""
    try:
        marker_path(db_path).unlink()
    except FileNotFoundError:
        return False
    fsync_directory(db_path.parent)
    return True


# --- what the store does with it ---------------------------------------------------------------


def declare(db_path: Path, exc: BaseException, home: Path) -> Path | None:
    """Announce the first quarantine of ``db_path`` in this process: an ERROR on the
    ``hermes_state`` logger, a line in ``<home>/logs/errors.log`` and the marker (kept when
    one already names the file). Returns the marker's path, None when it could not be
    written."""
    logger.error("quarantining %s after corruption: %s", db_path, exc)
    append_error_log(f"database quarantined: {db_path}: {exc}", home)
    written = write_marker(db_path, str(exc))
    if written is None:
        logger.warning("could not write the quarantine marker of %s: a restarted process "
                       "will write to the file again", db_path)
    return written


def describe_marker(marker: dict[str, Any]) -> str:
    """One line for people: when, by whom and why the file was quarantined."""
    if "unreadable" in marker:
        return f"by a marker that cannot be read ({marker['unreadable']})"
    at = marker.get("quarantined_at")
    when = (
        datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        if isinstance(at, (int, float)) else "at an unknown time"
    )
    return f"since {when} by process {marker.get('pid')}: {marker.get('reason')}"


def earlier_quarantine(db_path: Path) -> StateDbCorruptError | None:
    """The quarantine an earlier process declared on ``db_path``: the error a writable open
    starts out with, or None. A marker naming another file is removed on the way."""
    path = marker_path(db_path)
    marker = _load(path)
    if marker is None:
        return None
    if not _names(marker, file_identity(db_path)):
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    return StateDbCorruptError(
        f"{db_path} is quarantined {describe_marker(marker)} (marker {path})", path=db_path
    )


# How long a -wal found damaged is given before it is read again: a commit that rewrote frames
# of its own transaction in place leaves their old checksums for the moment between writing its
# commit frame and fixing them, which reads as damage.
_WAL_SECOND_LOOK_S = 0.05


def _hides_commits(scan: ff.WalScan) -> bool:
    """Whether the damage ``scan`` found hides a commit other than the last one. A failing
    frame with only the last commit after it is what a writer killed while it committed
    leaves: SQLite writes a transaction's commit frame before it fixes the checksums of the
    frames it rewrote in place, and that transaction was never acknowledged."""
    return scan.problem and scan.later_commits >= 2


@contextlib.contextmanager
def _write_lock(conn: sqlite3.Connection) -> Iterator[bool]:
    """SQLite's write lock taken through ``conn`` (a read transaction first: a first opener
    indexes the ``-wal`` there, which only reads it) and released without a write; False
    when it cannot be had within the connection's busy timeout."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error:
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def wal_damage(
    db_path: Path, conn: sqlite3.Connection | None = None
) -> StateDbCorruptError | None:
    """The damage of the ``-wal`` of ``db_path`` that SQLite's own reading hides, as the error
    a writable open starts out quarantined with; None when there is none.

    SQLite reads a ``-wal`` up to the last commit before the first frame that fails its
    checksum and ignores everything after it: a flipped byte in the middle makes every later
    commit vanish without an error, and the next checkpoint copies the part before it into
    the file and deletes the ``-wal`` with the rest. Here every frame is verified
    (:func:`hermes_state_fileformat.scan_wal`); intact commits with the current salts after a
    frame that fails are damage, unless the only one is the last commit (see
    :func:`_hides_commits`). Seen twice, a moment apart.

    Only the ``-wal`` is opened, and only read: SQLite keeps no lock on it, while closing a
    descriptor of the database file or of ``-shm`` would drop every lock this process's
    connections hold on them. (So the rows only the later commits hold are not counted here:
    that reads the database file; ``doctor`` counts them.)

    ``conn``, a connection on the store not in a transaction, lets the frames be read under
    SQLite's write lock, while no writer appends to the ``-wal`` or starts it over (a scan
    beside a writer can take frames of two moments for damage); the lock is released
    without a write."""
    scan = wal_damage_scan(db_path, conn)
    return None if scan is None else _damage_error(db_path, scan)


def wal_damage_scan(
    db_path: Path, conn: sqlite3.Connection | None = None
) -> ff.WalScan | None:
    """The scan of the ``-wal`` of ``db_path`` when it found damage that hides commits, judged
    as :func:`wal_damage` judges it; None when there is none."""
    wal = sidecar_paths(db_path)[0]
    try:
        if wal.stat().st_size <= _WAL_HEADER_BYTES:
            return None
    except FileNotFoundError:
        return None
    if conn is not None:
        with _write_lock(conn) as held:
            if held:
                scan = ff.scan_wal(wal)
                return scan if _hides_commits(scan) else None
    # Without the write lock a writer may append to the -wal, or start it over, while it is
    # read, and a frame read half-written with whole frames after it looks like damage: only
    # a -wal that stood still across two scans a moment apart is judged.
    stamp = _wal_stamp(wal)
    scan = ff.scan_wal(wal)
    if not _hides_commits(scan):
        return None
    time.sleep(_WAL_SECOND_LOOK_S)
    again = ff.scan_wal(wal)
    return again if again == scan and _wal_stamp(wal) == stamp else None


def _wal_stamp(wal: Path) -> tuple[int, int, int] | None:
    """What changes when anything writes the ``-wal``: its inode, size and modification time."""
    try:
        st = wal.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


_WAL_HEADER_BYTES = 32


def _damage_error(db_path: Path, scan: ff.WalScan) -> StateDbCorruptError:
    first = scan.damaged[0]
    where = "its header" if first == 0 else f"frame {first}"
    return StateDbCorruptError(
        f"{db_path}: the -wal is damaged at {where}: SQLite reads only its first "
        f"{scan.readable} frames and drops the {scan.later_commits} commit(s) after it "
        f"({scan.later_frames} intact frames)", path=db_path)


# Reads every page of every b-tree; 'ok' alone when the file is sound.
INTEGRITY_CHECK_SQL = "PRAGMA integrity_check"


def clear_quarantine(db_path: Path) -> dict[str, Any] | None:
    """Remove the marker of ``db_path`` once writing to the file is safe again; returns the
    marker removed, None when there was none.

    Refused with :class:`StateDbInUseError` while another process has the database open (a
    process that met the damage keeps its own quarantine until it exits, and the file cannot
    have been mended under it: stop them first), and with :class:`StateDbCorruptError` while
    the ``-wal`` is damaged in the middle (:func:`wal_damage`) or ``PRAGMA integrity_check``
    of the file (read-only, through its ``-wal``) finds anything: the damage is still there,
    and recover or restore is the way out."""
    marker = read_marker(db_path)
    if marker is None:
        return None
    _refuse_other_holders(db_path)
    damage = wal_damage(db_path)  # integrity_check reads only what SQLite reads of the -wal
    problems = [str(damage)] if damage is not None else _integrity_problems(db_path)
    if problems:
        raise StateDbCorruptError(
            f"{db_path} still fails integrity_check: {'; '.join(problems[:3])}", path=db_path
        )
    _refuse_other_holders(db_path)
    clear_marker(db_path)
    logger.warning("quarantine of %s cleared (%s)", db_path, describe_marker(marker))
    return marker


def _refuse_other_holders(db_path: Path) -> None:
    if fts.other_processes_hold(db_path):
        holders = describe_lock_holders(db_path)
        detail = "; ".join(holders) if holders else "other processes may have it open"
        raise StateDbInUseError(f"{db_path} is in use: {detail}", path=db_path, holders=holders)


def _integrity_problems(db_path: Path) -> list[str]:
    """integrity_check's findings (empty when the file is sound) from a read-only connection;
    a file SQLite cannot read at all is one finding."""
    try:
        conn = configure_connection(sqlite3.connect(
            f"{db_path.as_uri()}?mode=ro&nofollow=1", uri=True, isolation_level=None
        ))
    except sqlite3.Error as exc:
        return [f"{type(exc).__name__}: {exc}"]
    try:
        rows = [r[0] for r in conn.execute(INTEGRITY_CHECK_SQL).fetchall()]
    except sqlite3.Error as exc:
        return [f"{type(exc).__name__}: {exc}"]
    finally:
        conn.close()
    return [] if rows == ["ok"] else rows


# --- this process: the registry, the close guards, the exit hook ------------------------------

# Serialises, inside this process, creating a database file, opening a writable handle on it
# and registering a quarantine: an opening handle sees every quarantine registered before it,
# and the descriptor prepare_db_file() closes can never belong to a file another handle has
# locked.
OPEN_LOCK = threading.Lock()


@dataclass(frozen=True)
class _Quarantined:
    error: BaseException  # what proved the file corrupt
    guard: sqlite3.Connection | None  # its close guard, open until the process exits


# The files this process has quarantined (guarded by OPEN_LOCK; read without it).
_FILES: dict[FileId, _Quarantined] = {}


class Handle(Protocol):
    """A writable store handle, as the exit hook sees it."""

    @property
    def quarantined(self) -> bool: ...

    def close(self) -> None: ...


# The open writable handles of this process (added under OPEN_LOCK).
_HANDLES: weakref.WeakSet[Handle] = weakref.WeakSet()


def in_process(file_id: FileId | None) -> BaseException | None:
    """The error that quarantined the file ``file_id`` in this process, else None. A plain
    read: a handle takes the quarantine on explicitly (before a write, at close)."""
    entry = None if file_id is None else _FILES.get(file_id)
    return None if entry is None else entry.error


def inherited(db_path: Path) -> BaseException | None:
    """The quarantine a new writable handle on ``db_path`` starts out with: this process's,
    else an earlier process's marker (removed on the way when it names another file). The
    caller holds OPEN_LOCK."""
    earlier = in_process(file_identity(db_path))
    return earlier if earlier is not None else earlier_quarantine(db_path)


def register(
    db_path: Path,
    file_id: FileId | None,
    exc: BaseException,
    home: Path,
    open_guard: Callable[[], sqlite3.Connection],
) -> Path | None:
    """Quarantine the file ``file_id`` for the whole process. The first registration of a
    file opens its close guard with ``open_guard()`` (a read-only connection, configured as
    the handle's are) and declares the quarantine (:func:`declare`: log lines, marker).
    Returns the marker that names the file, None when there is none (it could not be
    written)."""
    if file_id is None:
        return None
    with OPEN_LOCK:
        if file_id not in _FILES:
            _FILES[file_id] = _Quarantined(exc, _open_close_guard(open_guard))
            return declare(db_path, exc, home)
    return marker_path(db_path) if read_marker(db_path) is not None else None


def recorded_note(db_path: Path, marker: Path | None) -> str:
    """What a reader that met damage says about recording it (``marker``: where it is)."""
    if marker is not None:
        return (f"the damage is recorded in {marker}: every writable open of {db_path} "
                "refuses writes until it is mended")
    return (f"the damage could not be recorded: no quarantine marker can be written beside "
            f"{db_path}, so a program that opens it writable next will write into the "
            "damaged file; stop the programs that write it")


def record_found_damage(
    db_path: Path, reason: str, home: Path, *, index_damage_possible: bool = True
) -> str | None:
    """Record damage a check found without meeting it in a read (``doctor``: quick_check or
    integrity_check lines, a damaged ``-wal``): the quarantine marker, log lines, and for
    this process the quarantine. Returns what to tell the user (see :func:`recorded_note`),
    None when the damage provably lies in the full-text indexes only (the writers detach
    those and go on). ``index_damage_possible=False``: the finding cannot be index damage."""
    if index_damage_possible and _index_damage_only(db_path):
        return None
    error = StateDbCorruptError(f"{db_path} is damaged: {reason}", path=db_path)
    marker = register(
        db_path, file_identity(db_path), error, home,
        lambda: configure_connection(sqlite3.connect(
            f"{db_path.as_uri()}?mode=ro&nofollow=1", uri=True, isolation_level=None)),
    )
    return recorded_note(db_path, marker)


def _index_damage_only(db_path: Path) -> bool:
    """True when the canonical tables pass quick_check and an FTS shadow table fails it (read
    through a read-only connection, which never checkpoints)."""
    try:
        conn = configure_connection(sqlite3.connect(
            f"{db_path.as_uri()}?mode=ro&nofollow=1", uri=True, isolation_level=None))
    except sqlite3.Error:
        return False
    try:
        return not fts.damaged_canonical_tables(conn) and bool(fts.damaged_shadow_tables(conn))
    except sqlite3.Error:
        return False
    finally:
        conn.close()


# The first read of a close guard, which takes the database's shared lock.
GUARD_READ_SQL = "SELECT COUNT(*) FROM sqlite_master"


def _open_close_guard(connect: Callable[[], sqlite3.Connection]) -> sqlite3.Connection | None:
    """A read-only connection that has read the file, so it holds SQLite's shared lock on it
    (in WAL mode a connection keeps that lock while it is open, even after a read that failed
    on a damaged page); None when not even that can be had."""
    try:
        guard = connect()
    except sqlite3.Error:
        return None
    with contextlib.suppress(sqlite3.Error):
        guard.execute(GUARD_READ_SQL).fetchone()
    return guard


# SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, which the sqlite3 module exposes from Python 3.12 on.
_NO_CKPT_ON_CLOSE: int | None = getattr(sqlite3, "SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE", None)


def protect(*connections: sqlite3.Connection | None) -> None:
    """Keep each connection from checkpointing when it closes (where this Python can)."""
    for conn in filter(None, connections):
        if _NO_CKPT_ON_CLOSE is not None and hasattr(conn, "setconfig"):
            with contextlib.suppress(sqlite3.Error):
                conn.setconfig(_NO_CKPT_ON_CLOSE, True)


def track(handle: Handle) -> None:
    """Count ``handle`` among the open writable handles (the caller holds OPEN_LOCK)."""
    _HANDLES.add(handle)


def untrack(handle: Handle) -> None:
    _HANDLES.discard(handle)


@atexit.register
def close_quarantined_handles() -> None:
    """At exit, close every handle still open on a quarantined file (each skips its
    checkpoint) while the file's close guard is still open."""
    for handle in list(_HANDLES):
        if handle.quarantined:
            handle.close()


# --- the spool ---------------------------------------------------------------------------------

SESSIONS_SPOOL_DIR = "sessions"
PENDING_MESSAGES_DIR = "pending_messages"
_SPOOL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def spool_file_name(key: str) -> str:
    """The spool file of ``key`` (a session id or key): ``<key>.jsonl`` when the key is a safe
    file name, else its safe characters (at most 64) and a digest of the whole key, so no key
    names a path outside its spool directory and two keys never share a file."""
    key = str(key)
    if _SPOOL_NAME_RE.fullmatch(key):
        return f"{key}.jsonl"
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", key)[:64].lstrip("._-")
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{safe}~{digest}.jsonl" if safe else f"~{digest}.jsonl"


# Past this depth a spooled value is cut short: a structure nested deeper is not a transcript.
_SPOOL_DEPTH = 100
CIRCULAR_MARK = "<circular reference>"
TOO_DEEP_MARK = "<nested too deeply>"


def spoolable(value: Any, depth: int = 0, seen: frozenset[int] = frozenset()) -> Any:
    """``value`` as JSON can carry it, as faithfully as it allows: mappings (keys as text) and
    sequences kept, a reference back into itself as :data:`CIRCULAR_MARK`, what lies deeper
    than ``_SPOOL_DEPTH`` as :data:`TOO_DEEP_MARK`, any other object as its ``str`` (its type
    name when even that fails). A spool that refused a value would lose the whole turn."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if id(value) in seen:
        return CIRCULAR_MARK
    if depth >= _SPOOL_DEPTH:
        return TOO_DEEP_MARK
    inner = seen | {id(value)}
    if isinstance(value, Mapping):
        return {_spool_key(k): spoolable(v, depth + 1, inner) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [spoolable(item, depth + 1, inner) for item in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "backslashreplace")
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - an object that cannot describe itself is named instead
        return f"<{type(value).__name__}>"


def _spool_key(key: object) -> str:
    text = spoolable(key)
    return text if isinstance(text, str) else json.dumps(text)


def _append_jsonl(
    directory: Path, key: str, records: Iterable[Mapping[str, Any]]
) -> Path:
    """Append ``records`` to ``directory/spool_file_name(key)``, one JSON object per line.

    The directory is created private (0700) and must not be a symlink; the file is private
    (0600), opened ``O_APPEND|O_NOFOLLOW`` so concurrent appenders never interleave inside a
    line and a planted symlink is refused; the data and the directory entry are fsynced
    before returning."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISLNK(directory.lstat().st_mode):
            raise UnsafePathError(f"refusing a symlink as a spool directory: {directory}",
                                  path=directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / spool_file_name(key)
    data = "".join(
        clean_text(json.dumps(spoolable(r), ensure_ascii=False)) + "\n" for r in records
    ).encode()
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_directory(directory)
    return path


def spool_transcript(
    session_id: str, records: Iterable[Mapping[str, Any]], home: Path | None = None
) -> Path:
    """Append ``records`` to ``<home>/sessions/<id>.jsonl`` (see :func:`spool_file_name`; one
    JSON object per line, fsync; ``home`` defaults to this context's) and return that file."""
    directory = (get_hermes_home() if home is None else home) / SESSIONS_SPOOL_DIR
    return _append_jsonl(directory, session_id, records)


def spool_pending_message(
    key: str, message: Mapping[str, Any], home: Path | None = None
) -> Path:
    """Append one accepted input to the gateway's spool, ``<home>/pending_messages/<key>.jsonl``
    (same file discipline as :func:`spool_transcript`), and return that file.

    ``key`` is what the gateway files the input under (the session id, or its session key
    when no session exists yet); ``message`` is stored as given, as one JSON line (lone
    surrogates removed, other values that are not JSON as their ``str``)."""
    directory = (get_hermes_home() if home is None else home) / PENDING_MESSAGES_DIR
    return _append_jsonl(directory, key, [message])


@dataclass(frozen=True)
class Spool:
    """How a transcript write names what it writes: the parameter holding its session id and
    the one holding its messages. A call without messages (an append) is its own record: its
    arguments, ``**`` keywords flattened."""

    session: str = "session_id"
    messages: str = "messages"

    def keep(
        self,
        exc: StateDbCorruptError,
        signature: inspect.Signature,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        home: Path,
    ) -> None:
        """Spool the messages of a write refused with ``exc`` and name the file in its
        ``spooled_to``; ``signature`` is the write's (its connection parameter first). When
        the spool cannot be written either, the error says so in a note and stays the one
        raised."""
        try:
            bound = signature.bind(None, *args, **kwargs).arguments
        except TypeError as call_error:  # not a call of this write: nothing names a turn
            exc.add_note(f"nothing was spooled: {call_error}")
            return
        session_id = _spool_key(bound.get(self.session))
        messages = bound.get(self.messages)
        listed: list[Any] = (list(messages) if _is_records(messages)
                             else [_call_record(signature, bound)])
        records = [r if isinstance(r, Mapping) else {"message": r} for r in listed]
        try:
            exc.spooled_to = spool_transcript(
                session_id, [{"session_id": session_id, **r} for r in records], home=home
            )
        except (OSError, UnsafePathError) as spool_error:
            logger.error("could not spool the transcript of %s: %s", session_id, spool_error)
            exc.add_note(f"the transcript could not be spooled: {spool_error}")


def _is_records(messages: Any) -> TypeGuard[Iterable[Any]]:
    return bool(messages) and isinstance(messages, Iterable) and not isinstance(
        messages, (str, bytes, bytearray, Mapping))


def _call_record(signature: inspect.Signature, bound: Mapping[str, Any]) -> dict[str, Any]:
    connection = next(iter(signature.parameters))
    record: dict[str, Any] = {}
    for name, value in bound.items():
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            record.update(value)
        elif name != connection:
            record[name] = value
    return record


# --- one handle's quarantine --------------------------------------------------------------------


class Watch:
    """The quarantine of one handle: the identity of its file, the damage that quarantined it
    (``reason``; None while it writes), and what meeting damage does to it.

    ``lock`` is the handle's lock, held while the handle enters quarantine; ``connections()``
    are the handle's connections (each kept from checkpointing once quarantined); ``guard()``
    opens a read-only connection for the file's close guard; ``fts_only(exc)`` proves damage
    lies in the FTS indexes only."""

    def __init__(
        self,
        path: Path,
        home: Path,
        *,
        read_only: bool,
        lock: contextlib.AbstractContextManager[Any],
        connections: Callable[[], Iterable[sqlite3.Connection | None]],
        guard: Callable[[], sqlite3.Connection],
        fts_only: Callable[[BaseException], bool],
    ) -> None:
        self.path = path
        self.home = home
        self.read_only = read_only
        self.file_id: FileId | None = None
        self.reason: BaseException | None = None
        self._lock = lock
        self._connections = connections
        self._guard = guard
        self._fts_only = fts_only

    @property
    def quarantined(self) -> bool:
        """True once this handle, or another handle of this process on the same file, met
        corruption (or the file was quarantined before it was opened). Reading it changes
        nothing: the handle takes such a quarantine on before its next write and at close."""
        return self.reason is not None or in_process(self.file_id) is not None

    def earlier(self) -> BaseException | None:
        """Damage another handle of this process met, which a writable handle not yet
        quarantined takes on (before its next write and at close)."""
        if self.reason is not None or self.read_only:
            return None
        return in_process(self.file_id)

    def adopt(self) -> None:
        """Take on the quarantine another handle of this process met (:meth:`earlier`)."""
        earlier = self.earlier()
        if earlier is not None:
            self.enter(earlier)

    def enter(self, exc: BaseException) -> None:
        """Never write to this file again from this process: refuse writes, skip checkpoints,
        keep every one of the handle's connections from checkpointing when it closes, and
        register the file (the first registration declares it)."""
        with self._lock:
            if self.reason is not None:
                return
            self.reason = exc
            protect(*self._connections())
            register(self.path, self.file_id, exc, self.home, self._guard)

    def met_damage(self, exc: sqlite3.Error, error: BaseException) -> None:
        """A read met ``exc``, raised as ``error``: corruption of the record (not provably of
        the FTS indexes only) quarantines a writable handle (:meth:`enter`). A read-only handle
        records it: it quarantines the file for its process and writes the marker beside it
        where the folder allows, so the next writer starts out quarantined; ``error`` says
        which, in a note."""
        if not is_corruption_error(exc) or self._fts_only(exc):
            return
        if self.read_only:
            self.record(exc, error)
        else:
            self.enter(exc)

    def record(self, exc: BaseException, error: BaseException) -> None:
        """Whoever meets the damage first records it: for a read-only handle, the file's
        quarantine in its process and the marker beside it; ``error`` says which, in a note."""
        marker = register(self.path, self.file_id, exc, self.home, self._guard)
        error.add_note(recorded_note(self.path, marker))

    def refuse_writes(self) -> None:
        """:class:`StateDbCorruptError` once the handle is quarantined."""
        if self.reason is not None:
            raise StateDbCorruptError(
                f"{self.path} is quarantined after corruption; no further writes on this handle",
                path=self.path,
            ) from self.reason
