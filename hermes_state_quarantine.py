"""Quarantine that outlives the process: a durable marker beside a damaged database file.

A process that meets plain corruption in a store stops writing to it (see ``hermes_state``).
That protection would end with the process; the next start of a gateway would append to the
damaged file and, at close, checkpoint the kept ``-wal`` into it. So the first process to
quarantine a file also writes ``<db>-quarantine`` beside it (:func:`declare`): a small JSON
document naming the file's identity (device and inode), when, by which process and why. Every
later writable open that finds a marker for the same file starts out quarantined
(:func:`earlier_quarantine`): it reads, never writes or checkpoints, and spools what it cannot
write. That lasts until the marker stops applying — another file is put in its place (below) —
or is cleared: by maintenance that mends the file in place (:func:`clear_marker`), or by an
operator with ``hermes-state doctor --clear-quarantine`` (:func:`clear_quarantine`), which
refuses while another process has the database open or while the file still fails
``PRAGMA integrity_check``.

The marker is keyed to the file's identity, not its name: a file put in its place later (a
recovered copy moved over it is a new inode) is not the damaged one, and the stale marker is
removed by the next writable open, so that a later file that happens to get the old inode
number is not taken for the damaged one. A marker is read when a store is opened, never on
each write: a process that already had the file open when another one quarantined it is not
stopped by it. Writing the marker is best effort: a home that cannot take it still has the
in-process quarantine, and the failure is logged.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import hermes_state_fts as fts
from hermes_state_common import append_error_log, configure_connection
from hermes_state_errors import StateDbCorruptError, StateDbInUseError
from hermes_state_lockowners import describe_lock_holders

logger = logging.getLogger("hermes_state")

__all__ = [
    "MARKER_SUFFIX",
    "marker_path",
    "read_marker",
    "write_marker",
    "clear_marker",
    "declare",
    "earlier_quarantine",
    "describe_marker",
    "clear_quarantine",
]

MARKER_SUFFIX = "-quarantine"


def marker_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + MARKER_SUFFIX)


def _identity(db_path: Path) -> tuple[int, int] | None:
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
    marker["path"] = str(path)
    return marker


def _names(marker: dict[str, Any], identity: tuple[int, int] | None) -> bool:
    """Does ``marker`` name the file whose identity is ``identity``? One that cannot be read
    names any file that exists (someone wrote it for a reason); none names a missing file."""
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
    if marker is None or not _names(marker, _identity(db_path)):
        return None
    return marker


def write_marker(db_path: Path, reason: str) -> Path | None:
    """Write the marker of ``db_path``, or keep the one that already names this file (the
    first quarantine's time and reason are the evidence); the marker's path, None when it
    could not be written. The data and the directory entry are fsynced: the marker must
    survive a crash that follows the quarantine."""
    identity = _identity(db_path)
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
        _fsync_directory(path.parent)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return path


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def clear_marker(db_path: Path) -> bool:
    """Remove the marker of ``db_path`` (whatever file it names); True when there was one."""
    try:
        marker_path(db_path).unlink()
    except FileNotFoundError:
        return False
    _fsync_directory(db_path.parent)
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
    if not _names(marker, _identity(db_path)):
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    return StateDbCorruptError(
        f"{db_path} is quarantined {describe_marker(marker)} (marker {path})", path=db_path
    )


# Reads every page of every b-tree; 'ok' alone when the file is sound.
INTEGRITY_CHECK_SQL = "PRAGMA integrity_check"


def clear_quarantine(db_path: Path) -> dict[str, Any] | None:
    """Remove the marker of ``db_path`` once writing to the file is safe again; returns the
    marker removed, None when there was none.

    Refused with :class:`StateDbInUseError` while another process has the database open (a
    process that met the damage keeps its own quarantine until it exits, and the file cannot
    have been mended under it: stop them first), and with :class:`StateDbCorruptError` while
    ``PRAGMA integrity_check`` of the file (read-only, through its ``-wal``) finds anything:
    the damage is still there, and recover or restore is the way out."""
    marker = read_marker(db_path)
    if marker is None:
        return None
    _refuse_other_holders(db_path)
    problems = _integrity_problems(db_path)
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
