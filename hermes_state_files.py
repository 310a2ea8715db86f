"""The database file on disk: created private, never through a symlink, checked before opening.

The checks use ``stat`` only and never open a descriptor on an existing database: closing one
would drop every POSIX lock this process holds there. Temporary files carry their process and
host, so a later run removes only those whose process is gone."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
from pathlib import Path

from hermes_state_errors import (
    HermesStateError,
    StateDbCannotOpenError,
    StateDbReadOnlyError,
    UnsafePathError,
)

__all__ = [
    "cannot_create",
    "fsync_directory",
    "journal_path",
    "make_private_dir",
    "prepare_db_file",
    "refuse_symlinks",
    "refuse_write_protected",
    "remove_abandoned_temps",
    "sidecar_paths",
    "temp_prefix",
    "tighten_modes",
    "wal_without_database",
]


SIDECAR_SUFFIXES = ("-wal", "-shm")
JOURNAL_SUFFIX = "-journal"


def sidecar_paths(db_path: Path) -> list[Path]:
    return [db_path.with_name(db_path.name + suffix) for suffix in SIDECAR_SUFFIXES]


def journal_path(db_path: Path) -> Path:
    """The rollback journal beside the database: it exists only while maintenance has the
    file in rollback mode, or after such a write was interrupted (then it is hot)."""
    return db_path.with_name(db_path.name + JOURNAL_SUFFIX)


def refuse_symlinks(db_path: Path) -> None:
    """Raise :class:`UnsafePathError` if the database or a sidecar path is a symlink (dangling
    or not): whoever planted it could redirect the store's writes."""
    for path in (db_path, *sidecar_paths(db_path)):
        if path.is_symlink():
            raise UnsafePathError(
                f"refusing to open a symlink as a database file: {path}", path=path
            )


def wal_without_database(db_path: Path) -> bool:
    """True when the database file is empty but its ``-wal`` is not.

    SQLite never leaves that state (a file in WAL mode has its header written before the first
    frame), so the main file was truncated or replaced. The first connection to read it would
    delete the ``-wal`` (an empty database has nothing to replay it onto), and every page
    committed there would be lost: such a file must not be opened. ``stat`` only."""
    try:
        return db_path.stat().st_size == 0 and sidecar_paths(db_path)[0].stat().st_size > 0
    except (FileNotFoundError, NotADirectoryError):  # no file, no -wal: nothing to lose
        return False


def prepare_db_file(db_path: Path) -> bool:
    """Make ``db_path`` ready for SQLite: private directory and file, no symlinks.

    Creates the file with ``O_CREAT|O_EXCL|O_NOFOLLOW`` at mode 0600 (SQLite gives ``-wal`` and
    ``-shm`` the main file's mode), tightens existing files with ``chmod`` on the path and
    never opens a descriptor on an existing file: closing any descriptor on a database file
    drops every POSIX lock this process holds on it. Returns True when the file was created.
    An existing store its owner write-protected raises :class:`StateDbReadOnlyError` first,
    with nothing changed (:func:`refuse_write_protected`).
    """
    refuse_symlinks(db_path)
    refuse_write_protected(db_path)
    make_private_dir(db_path.parent, for_file=db_path)
    created = False
    try:
        fd = os.open(
            db_path,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            | getattr(os, "O_CLOEXEC", 0),
            0o600,
        )
        os.close(fd)
        created = True
    except FileExistsError:
        pass
    except OSError as exc:
        raise cannot_create(db_path, exc) from exc
    tighten_modes(db_path)
    return created


def _protected_mode(path: Path) -> int | None:
    """The mode of ``path`` when it is a file that may not be written, else None."""
    try:
        mode = path.lstat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there to protect
        return None
    if not stat.S_ISREG(mode) or mode & stat.S_IWUSR and os.access(path, os.W_OK):
        return None
    return mode


def refuse_write_protected(db_path: Path) -> None:
    """Raise :class:`StateDbReadOnlyError` when the database file or an existing sidecar may
    not be written: its owner took the write bit away, or this process may not write it
    (``os.access``: another owner, a read-only mount). The owner's bit counts even for a
    process that could write anyway (root): a ``chmod a-w`` is the owner saying "no writes",
    and SQLite would otherwise write straight through it."""
    for path in (db_path, *sidecar_paths(db_path)):
        # os.access is False for a file gone since the lstat too (a sidecar another
        # process's SQLite removed): only a second look that agrees refuses.
        if _protected_mode(path) is not None and (mode := _protected_mode(path)) is not None:
            owner = path.stat().st_uid if path.exists() else os.geteuid()
            whose = "" if owner == os.geteuid() else (
                f", owned by uid {owner} and not writable by uid {os.geteuid()}")
            raise StateDbReadOnlyError(
                f"{path} is write-protected (mode {stat.S_IMODE(mode):04o}{whose}): the store "
                "is not opened for writing and nothing was changed",
                path=path,
            )


def make_private_dir(directory: Path, *, for_file: Path) -> None:
    """Create ``directory`` (and its missing parents, each mode 0700) for the database file
    ``for_file``; when the operating system refuses, the typed error names that file."""
    missing = []
    folder = directory
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    try:
        # One at a time: mkdir(parents=True) would give the parents the umask's looser mode.
        for folder in reversed(missing):
            folder.mkdir(mode=0o700, exist_ok=True)
        directory.mkdir(exist_ok=True, mode=0o700)
    except OSError as exc:  # a file where a directory goes, no permission, a read-only mount
        raise cannot_create(for_file, exc) from exc


def cannot_create(db_path: Path, exc: OSError) -> HermesStateError:
    """The typed error for a database file (or its directory) the operating system would not
    create: :class:`StateDbReadOnlyError` where writing is refused, else
    :class:`StateDbCannotOpenError`."""
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return StateDbReadOnlyError(f"{db_path} cannot be created: {exc}", path=db_path)
    return StateDbCannotOpenError(f"{db_path} cannot be created: {exc}", path=db_path)


def tighten_modes(db_path: Path) -> None:
    """Take group and other permissions away from the database and its sidecars where they
    have any; the owner's bits stay as they are (a permission the owner removed is never
    given back)."""
    for path in (db_path, *sidecar_paths(db_path)):
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(f"refusing a symlink as a database file: {path}", path=path)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"not a regular file: {path}", path=path)
        if st.st_mode & 0o077:
            os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)


# --- temporary files -----------------------------------------------------------------------
# A temporary file or folder (an export being written, an import's spool, a recover's or a
# repair's work copy) is named ``<mark><pid>.<host tag>-<random>``: a later run removes it only
# when that names a process of this host that no longer exists, so a live one's is never
# touched and one of another host sharing the folder is left alone.


def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def temp_prefix(mark: str) -> str:
    """The name prefix of a temporary file of this process (``tempfile``'s ``prefix``)."""
    return f"{mark}{os.getpid()}.{_host_tag()}-"


def _owner_gone(pid: int) -> bool:
    if pid <= 0 or sys.platform == "win32":  # os.kill would terminate it on Windows
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OverflowError, OSError):
        return False  # alive but not ours to signal
    return False


def remove_abandoned_temps(directory: Path | None, mark: str) -> list[Path]:
    """Remove the temporary files and folders named with ``mark`` in ``directory`` (default:
    the system's temporary folder) whose process is provably gone; returns them. Never
    raises: a folder that cannot be listed has nothing to clean."""
    folder = Path(tempfile.gettempdir()) if directory is None else directory
    pattern = re.compile(re.escape(mark) + r"(\d+)\.([0-9a-f]{8})-")
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.search(entry.name)
        if match is None or match.group(2) != _host_tag() or not _owner_gone(int(match.group(1))):
            continue
        path = Path(entry.path)
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
    return removed


def fsync_directory(directory: Path) -> None:
    """Make a rename or link in ``directory`` durable (best effort: not every file system
    lets a directory be opened)."""
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
