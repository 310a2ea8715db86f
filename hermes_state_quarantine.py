"""Quarantine that outlives the process: a durable marker beside a damaged database file.

A process that meets plain corruption in a store stops writing to it (see ``hermes_state``).
That protection ends with the process; the next start of a gateway would append to the
damaged file and, at close, checkpoint the kept ``-wal`` into it. So the first process to
quarantine a file also writes ``<db>-quarantine`` beside it: a small JSON document naming the
file's identity (device and inode), when and why. Every later writable open that finds a
marker for the same file starts out quarantined (it reads, never writes or checkpoints) until
repair, restore or recover replaces or mends the file and clears it, or an operator does with
``hermes-state doctor --clear-quarantine``.

The marker is keyed to the file's identity, not its name: a file put in its place later (a
recovered copy moved over it is a new inode) is not the damaged one, and the stale marker is
ignored. Writing it is best effort: a home that cannot take it still has the in-process
quarantine.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = [
    "MARKER_SUFFIX",
    "marker_path",
    "read_marker",
    "write_marker",
    "clear_marker",
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


def read_marker(db_path: Path) -> dict[str, Any] | None:
    """The marker of ``db_path`` when it names this very file, else None.

    A marker that cannot be parsed still quarantines (someone wrote it for a reason): it is
    returned with ``unreadable`` set. A marker naming another file (the path now holds a
    different inode) is ignored."""
    path = marker_path(db_path)
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
    identity = _identity(db_path)
    if identity is not None and [marker.get("device"), marker.get("inode")] != list(identity):
        return None
    marker["path"] = str(path)
    return marker


def write_marker(db_path: Path, reason: str) -> Path | None:
    """Write (or keep) the marker of ``db_path``; the marker's path, None when it could not be
    written. The data and the directory entry are fsynced: the marker must survive a crash
    that follows the quarantine."""
    identity = _identity(db_path)
    if identity is None:
        return None
    path = marker_path(db_path)
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
            os.write(fd, (json.dumps(body, ensure_ascii=False) + "\n").encode("utf-8",
                                                                            "replace"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        with contextlib.suppress(OSError):
            dir_fd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return path


def clear_marker(db_path: Path) -> bool:
    """Remove the marker of ``db_path``; True when there was one."""
    try:
        marker_path(db_path).unlink()
    except FileNotFoundError:
        return False
    return True
