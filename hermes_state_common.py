"""What every hermes_state module shares: home and profile paths, the schema, small helpers.

Home resolution has one authority, :func:`get_hermes_home`: a context-local override first
(:func:`hermes_home_override`, safe across threads and asyncio tasks because it is a
``ContextVar``), then ``HERMES_HOME``, then the platform default. Everything else — the default
database path, profile homes, the environment handed to child processes — is derived from it at
call time, never frozen at import.

Named profiles live in ``<root>/profiles/<name>/``. The root is the resolved home, or, when the
resolved home is itself a profile directory, the root that profile belongs to; so a process
already running inside one profile resolves a sibling profile next to it, never inside itself.

``SCHEMA_SQL`` declares every table, column, index, view and trigger of the current schema
(version :data:`SCHEMA_VERSION`) but the search index's (``SEARCH_INDEX_SQL``, derived data
that ``hermes_state_impact`` creates whenever a file lacks any part of it);
``hermes_state_schema`` applies both.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import functools
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import socket
import sqlite3
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any

from hermes_state_errors import (
    HermesStateError,
    InvalidInputError,
    InvalidTypeError,
    StateDbCannotOpenError,
    StateDbReadOnlyError,
    UnsafePathError,
)

__all__ = [
    "Checked",
    "Text",
    "Key",
    "Bound",
    "OnStore",
    "SCHEMA_VERSION",
    "temp_prefix",
    "remove_abandoned_temps",
    "fsync_directory",
    "SCHEMA_SQL",
    "get_hermes_home",
    "hermes_home_override",
    "platform_default_home",
    "hermes_root",
    "default_db_path",
    "MEMORY_NAME",
    "store_path",
    "display_hermes_home",
    "validate_profile_name",
    "resolve_profile_home",
    "profile_config_path",
    "child_process_env",
    "configure_connection",
    "connect",
    "make_private_dir",
    "cannot_create",
    "transaction",
    "read_transaction",
    "DB_FILENAME",
    "DELIVERY_OBLIGATIONS_SQL",
    "FTS_SQL",
    "FTS_TRIGGERS_SQL",
    "FTS_TRIGGER_NAMES",
    "INDEXES_SQL",
    "LIVE_ADMISSION_STATUSES",
    "LIVE_EXECUTION_STATUSES",
    "RUNTIME_LEDGER_TABLES",
    "TABLES_SQL",
    "append_error_log",
    "clean_optional",
    "clean_text",
    "decode_json",
    "encode_json",
    "escape_like",
    "get_meta",
    "journal_path",
    "now",
    "placeholders",
    "prepare_db_file",
    "quote_identifier",
    "refuse_symlinks",
    "refuse_write_protected",
    "row_to_dict",
    "set_meta",
    "sidecar_paths",
    "split_sql",
    "sql_values",
    "stored_text",
    "table_exists",
    "tighten_modes",
    "wal_reset_exposed",
    "wal_without_database",
    "IMPACT_DEFAULT_AVGDL",
    "SEARCH_INDEX_SQL",
    "SEARCH_TRIGGERS_SQL",
    "SEARCH_TRIGGER_NAMES",
    "TIME_BLOCK_SHIFT",
    "CELL_SIZE_CHECK_SQL",
]

SCHEMA_VERSION = 31
DB_FILENAME = "state.db"
CONFIG_FILENAME = "config.yaml"
SIDECAR_SUFFIXES = ("-wal", "-shm")
JOURNAL_SUFFIX = "-journal"

# ---------------------------------------------------------------------------------------------
# Home and profiles
# ---------------------------------------------------------------------------------------------

_home_override: ContextVar[Path | None] = ContextVar("hermes_home_override", default=None)


def platform_default_home() -> Path:
    """``~/.hermes`` on macOS and Linux, ``%LOCALAPPDATA%/hermes`` on Windows."""
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        if local:
            return Path(local) / "hermes"
        return Path.home() / "AppData" / "Local" / "hermes"
    return Path.home() / ".hermes"


def get_hermes_home() -> Path:
    """The directory that holds this process's (or this context's) state and config."""
    override = _home_override.get()
    if override is not None:
        return override
    env = os.environ.get("HERMES_HOME")
    if env:
        return Path(env).expanduser()
    return platform_default_home()


@contextlib.contextmanager
def hermes_home_override(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Make :func:`get_hermes_home` return ``path`` inside this context only.

    The override follows the current thread or asyncio task (a ``ContextVar``): other threads
    and tasks keep resolving their own home.
    """
    home = Path(path).expanduser()
    token = _home_override.set(home)
    try:
        yield home
    finally:
        _home_override.reset(token)


def hermes_root(home: Path | None = None) -> Path:
    """The root that named profiles live under (see the module docstring)."""
    home = get_hermes_home() if home is None else home
    if home.parent.name == "profiles":
        return home.parent.parent
    return home


def default_db_path() -> Path:
    return get_hermes_home() / DB_FILENAME


# What sqlite3.connect takes for a private in-memory database (a store refuses it).
MEMORY_NAME = ":memory:"


def store_path(db_path: object) -> Path:
    """The file a handle opens: ``db_path``, or the default store's when it is None."""
    if db_path is None:
        return default_db_path()
    if not isinstance(db_path, str | os.PathLike):
        raise InvalidTypeError(
            f"db_path must be a str or a path, got {type(db_path).__name__}", argument="db_path")
    if os.fspath(db_path) == MEMORY_NAME:
        raise InvalidInputError(
            f"db_path {MEMORY_NAME!r} names SQLite's in-memory database, which the store does "
            "not offer: its processes and connections share one file, so pass that file's path",
            argument="db_path")
    return Path(db_path).expanduser()


_PROFILE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def validate_profile_name(name: str) -> str:
    """Return ``name`` if it is a safe profile name, else raise :class:`UnsafePathError`.

    A name is 1–64 characters of letters, digits, ``.``, ``_`` and ``-``, starting with a letter
    or digit; so no separators, no ``..``, nothing absolute and nothing empty.
    """
    if not isinstance(name, str) or not _PROFILE_NAME_RE.fullmatch(name) or ".." in name:
        raise UnsafePathError(f"invalid profile name: {name!r}", path=str(name))
    return name


def resolve_profile_home(name: str, root: Path | None = None) -> Path:
    """The home directory of profile ``name``; ``"default"`` is the root itself.

    The result is checked to stay under ``<root>/profiles`` after resolving symlinks.
    """
    validate_profile_name(name)
    root = hermes_root() if root is None else Path(root).expanduser()
    if name == "default":
        return root
    profiles = root / "profiles"
    home = profiles / name
    resolved_profiles = profiles.resolve()
    if not home.resolve().is_relative_to(resolved_profiles):
        raise UnsafePathError(f"profile {name!r} escapes {profiles}", path=home)
    return home


def profile_config_path(profile_home: str | os.PathLike[str]) -> Path:
    """The configuration file of the profile whose home is ``profile_home``."""
    return Path(profile_home) / CONFIG_FILENAME


def display_hermes_home(home: Path | None = None) -> str:
    """Format a home for people to read (``~/.hermes/profiles/coder``); display only."""
    home = get_hermes_home() if home is None else Path(home)
    try:
        return "~/" + home.relative_to(Path.home()).as_posix()
    except ValueError:
        return str(home)


def child_process_env(
    home: Path | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment for a child process that must work in ``home`` (default: this context's).

    ``HERMES_HOME`` is always set explicitly: a child that inherited only ``HOME`` would fall
    back to the default profile.
    """
    env = dict(os.environ if base is None else base)
    env["HERMES_HOME"] = str(get_hermes_home() if home is None else home)
    return env


# ---------------------------------------------------------------------------------------------
# Database files
# ---------------------------------------------------------------------------------------------


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


# Has SQLite check each cell's size against its page whenever it loads a b-tree page (a flag
# of the connection: nothing is read or written).
CELL_SIZE_CHECK_SQL = "PRAGMA cell_size_check = ON"


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


def configure_connection(conn: sqlite3.Connection, /) -> sqlite3.Connection:
    """Apply the settings every connection on a store gets, whoever opens it; returns ``conn``.

    ``cell_size_check``: by default SQLite trusts the cell sizes a b-tree page records, so a
    leaf whose cells hold random bytes (its header intact) still takes an append, and the next
    checkpoint writes that page back into the damaged file. With the check on, such a page
    fails with ``SQLITE_CORRUPT`` the first time it is loaded, so the damage is met before
    anything is written. Its cost on appends and searches is within noise (see README)."""
    conn.execute(CELL_SIZE_CHECK_SQL)
    return conn


# SQLite's busy timeout of a connection that does not say otherwise.
DEFAULT_BUSY_TIMEOUT_S = 5.0
_CONNECT_MODES = frozenset({"ro", "rw", "rwc"})


def connect(
    path: Path,
    mode: str,
    *,
    timeout: float = DEFAULT_BUSY_TIMEOUT_S,
    immutable: bool = False,
) -> sqlite3.Connection:
    """The one way the library opens a connection on a database file, whoever opens it (the
    facade, maintenance, recover, import's spool, replication, quarantine checks).

    A URI open with ``mode`` (``ro``, ``rw``, or ``rwc``, which may create the file) and
    ``nofollow=1`` (SQLite refuses a symlink), autocommit (``isolation_level=None``: the
    transaction helper says where transactions are), usable from any thread (the caller holds
    its own lock) and configured by :func:`configure_connection`. ``immutable`` is only for a
    private image nothing else can change (recover's copies): SQLite then takes no locks and
    ignores sidecars."""
    if mode not in _CONNECT_MODES:
        raise ValueError(f"mode must be one of {sorted(_CONNECT_MODES)}, got {mode!r}")
    uri = f"{path.as_uri()}?mode={mode}&nofollow=1" + ("&immutable=1" if immutable else "")
    return configure_connection(sqlite3.connect(
        uri, uri=True, isolation_level=None, check_same_thread=False, timeout=timeout
    ))


# The WAL-reset bug (corruption when a WAL reset races a concurrent checkpoint) is fixed in
# 3.51.3 and in the 3.50.7 and 3.44.6 backports.
_WAL_RESET_FIXED = ((3, 44, 6), (3, 50, 7), (3, 51, 3))


def wal_reset_exposed(version: tuple[int, ...] = sqlite3.sqlite_version_info) -> bool:
    """True when this SQLite library is inside the WAL-reset bug range."""
    for fixed in _WAL_RESET_FIXED:
        if version[:2] == fixed[:2]:
            return version < fixed
    return version < (3, 51, 3) and version[:2] not in {f[:2] for f in _WAL_RESET_FIXED}


# ---------------------------------------------------------------------------------------------
# Small shared helpers
# ---------------------------------------------------------------------------------------------

_SURROGATE_PAIR_RE = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


class Checked(enum.Enum):
    """What the annotations below tell hermes_state_arguments beyond their type (type
    checkers see a plain ``str`` or ``int``)."""

    PROSE = "prose"
    LOOKUP = "lookup"
    UNBOUNDED = "unbounded"


#: The annotation of a parameter of prose (a message's content, a system prompt, an end
#: reason): stored with lone surrogates removed (:func:`clean_text`), where a lone surrogate in
#: an id or a key is refused (see hermes_state_arguments).
Text = Annotated[str, Checked.PROSE]

#: The annotation of a key a read looks up (a session id, a chat id): one holding a lone
#: surrogate names no stored row (none can hold one), so the read answers as for an absent
#: key (see hermes_state_arguments); a write refuses such a key.
Key = Annotated[str, Checked.LOOKUP]

#: The annotation of a message id used as a bound (``seen_through_id``): an int of any size,
#: clamped to the ids SQLite can hold by its sibling (a bound beyond every row covers them all).
Bound = Annotated[int, Checked.UNBOUNDED]

#: A function that runs another on the store's connection and returns its result (a handle's
#: read, or its retried write transaction): what maintenance run in chunks is given.
OnStore = Callable[[Callable[[sqlite3.Connection], Any]], Any]


def clean_text(value: str) -> str:
    """Remove lone surrogates (SQLite cannot bind them); join valid pairs. Nothing else changes."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        pass
    joined = _SURROGATE_PAIR_RE.sub(
        lambda m: m.group(0).encode("utf-16", "surrogatepass").decode("utf-16"), value
    )
    return _SURROGATE_RE.sub("", joined)


def clean_optional(value: str | None) -> str | None:
    return None if value is None else clean_text(str(value))


def stored_text(value: object) -> str | None:
    """``str(value)`` as a key SQLite can bind and compare; None when it holds a lone
    surrogate: no stored key can, so such a key names nothing and is never written."""
    text = str(value)
    return text if clean_text(text) == text else None


def encode_json(value: Any, field: str = "value", *, sort_keys: bool = False) -> str | None:
    """JSON text for a JSON-typed column (None stays NULL); non-ASCII is kept as is, lone
    surrogates removed. What JSON cannot carry is refused, naming ``field``: another type of
    object (:class:`InvalidTypeError`), a circular or too deeply nested structure, NaN or an
    infinity (:class:`InvalidInputError`)."""
    if value is None:
        return None
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                          sort_keys=sort_keys)
    except TypeError as exc:
        raise InvalidTypeError(f"{field} is not JSON: {exc}", argument=field) from exc
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise InvalidInputError(f"{field} is not JSON: {reason}", argument=field) from exc
    return clean_text(text)


def decode_json(text: str | None) -> Any:
    """The value of a JSON-typed column; text that is not JSON is returned unchanged."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def escape_like(value: str) -> str:
    """Escape ``\\``, ``%`` and ``_`` for a ``LIKE ... ESCAPE '\\'`` pattern."""
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


ERROR_LOG_DIR, ERROR_LOG_NAME = "logs", "errors.log"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def append_error_log(line: str, home: Path | None = None) -> None:
    """Append one timestamped line to ``<home>/logs/errors.log`` (private file; ``home``
    defaults to this context's); never raises.

    Neither ``logs`` nor ``errors.log`` may be a symlink (as the database, its sidecars and
    the spools may not): the directory is opened ``O_NOFOLLOW|O_DIRECTORY`` and the file
    ``O_NOFOLLOW`` relative to it, so no planted link is followed out of the home; a refused
    or failed write is a warning on the ``hermes_state`` logger instead."""
    try:
        logs = (get_hermes_home() if home is None else home) / ERROR_LOG_DIR
        logs.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        directory = os.open(logs, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW)
        try:
            fd = os.open(ERROR_LOG_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW,
                         0o600, dir_fd=directory)
        finally:
            os.close(directory)
        try:
            os.write(fd, f"{stamp} {clean_text(line)}\n".encode())
        finally:
            os.close(fd)
    except OSError as exc:
        refused = exc.errno in (errno.ELOOP, errno.EEXIST, errno.ENOTDIR)
        logging.getLogger("hermes_state").warning(
            "%s: %s", "refusing a symlink as the error log" if refused
            else f"the error log could not be written ({exc})", line)


def now() -> float:
    return time.time()


def placeholders(n: int) -> str:
    """``?, ?, ...`` for ``n`` values (n ≥ 1)."""
    return ", ".join("?" * n)


def row_to_dict(cursor: sqlite3.Cursor, row: Sequence[Any]) -> dict[str, Any]:
    """A fetched row as a dict keyed by the cursor's column names."""
    return {d[0]: v for d, v in zip(cursor.description, row, strict=True)}


_savepoint_ids = itertools.count(1)


@contextlib.contextmanager
def transaction(
    conn: sqlite3.Connection, /, *, rollback_only: bool = False
) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction, or a SAVEPOINT when one is already open.

    Any exception rolls back (to the savepoint when nested) and propagates; a failed rollback
    never hides the original error. ``rollback_only``: the block is rolled back even when it
    succeeds — for a check SQLite runs as a write (FTS5's ``integrity-check``) that must leave
    nothing behind.
    """
    if conn.in_transaction:
        name = f"hermes_sp_{next(_savepoint_ids)}"
        conn.execute(f"SAVEPOINT {name}")
        try:
            yield conn
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute(f"ROLLBACK TO {name}")
                conn.execute(f"RELEASE {name}")
            raise
        if rollback_only:
            conn.execute(f"ROLLBACK TO {name}")
        conn.execute(f"RELEASE {name}")
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("ROLLBACK" if rollback_only else "COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


@contextlib.contextmanager
def read_transaction(conn: sqlite3.Connection, /) -> Iterator[sqlite3.Connection]:
    """One read transaction around a read of several statements, so that they all see the
    same snapshot: outside a transaction each statement sees the latest commit, which may land
    between two of them (a search would pick ids in one state and fetch the rows in another).
    Inside an open transaction, that one."""
    if conn.in_transaction:
        yield conn
        return
    conn.execute("BEGIN")
    try:
        yield conn
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@functools.cache
def split_sql(script: str) -> tuple[str, ...]:
    """Split a script of complete statements (triggers included) for conn.execute()."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            if current.strip():
                statements.append(current.strip())
            current = ""
    if current.strip():
        raise ValueError(f"incomplete SQL statement: {current.strip()[:60]!r}")
    return tuple(statements)


SET_META_SQL = """
INSERT INTO state_meta (key, value) VALUES (?, ?)
ON CONFLICT(key) DO UPDATE SET value = excluded.value
"""


def get_meta(conn: sqlite3.Connection, /, key: Text) -> str | None:
    """The value stored under ``key`` (lone surrogates removed, as :func:`set_meta` does)."""
    if not isinstance(key, str):
        raise InvalidTypeError(f"a meta key must be a string, got {type(key).__name__}")
    row = conn.execute("SELECT value FROM state_meta WHERE key = ?", (clean_text(key),)).fetchone()
    return None if row is None else row[0]


def set_meta(conn: sqlite3.Connection, /, key: Text, value: object) -> None:
    """Store ``value`` under ``key`` (strings as they are, anything else as JSON)."""
    if not isinstance(key, str):
        raise InvalidTypeError(f"a meta key must be a string, got {type(key).__name__}")
    text = value if isinstance(value, str) else encode_json(value) or "null"
    conn.execute(SET_META_SQL, (clean_text(key), clean_text(text)))


def table_exists(conn: sqlite3.Connection, /, name: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return row is not None


def quote_identifier(name: str) -> str:
    """Quote an SQL identifier (table or column name read from the schema)."""
    return '"' + name.replace('"', '""') + '"'


# ---------------------------------------------------------------------------------------------
# The schema
# ---------------------------------------------------------------------------------------------

# Canonical tables. Column additions here are picked up by _reconcile_columns() on open.
# In `sessions`, handoff_platform / handoff_error and the compression_failure_cooldown_until,
# compression_failure_error and compression_fallback_streak columns carry the previous store's
# names: the handoff and compression-state functions use them. handoff_target, handoff_at,
# compression_failure_count, last_compression_error and last_compression_failed_at are this
# library's earlier columns of other meanings; nothing here writes them, and they stay because a
# file may hold caller-set values in them.
TABLES_SQL = """
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    user_id TEXT,
    model TEXT,
    model_config TEXT,
    system_prompt TEXT,
    parent_session_id TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0,
    cache_read_tokens INTEGER DEFAULT 0,
    cache_write_tokens INTEGER DEFAULT 0,
    reasoning_tokens INTEGER DEFAULT 0,
    billing_provider TEXT,
    billing_base_url TEXT,
    billing_mode TEXT,
    estimated_cost_usd REAL,
    actual_cost_usd REAL,
    cost_status TEXT,
    cost_source TEXT,
    pricing_version TEXT,
    title TEXT,
    api_call_count INTEGER DEFAULT 0,
    session_key TEXT,
    chat_id TEXT,
    chat_type TEXT,
    thread_id TEXT,
    display_name TEXT,
    origin_json TEXT,
    expiry_finalized INTEGER DEFAULT 0,
    cwd TEXT,
    git_branch TEXT,
    git_repo_root TEXT,
    handoff_state TEXT,
    handoff_target TEXT,
    handoff_at REAL,
    handoff_platform TEXT,
    handoff_error TEXT,
    compression_failure_count INTEGER DEFAULT 0,
    last_compression_error TEXT,
    last_compression_failed_at REAL,
    compression_failure_cooldown_until REAL,
    compression_failure_error TEXT,
    compression_fallback_streak INTEGER NOT NULL DEFAULT 0,
    successor_session_id TEXT,
    profile_name TEXT,
    transport_profile TEXT,
    rewind_count INTEGER DEFAULT 0,
    archived INTEGER DEFAULT 0,
    auto_archived INTEGER DEFAULT 0,
    pinned INTEGER DEFAULT 0,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id)
);

CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL,
    content TEXT,
    tool_call_id TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    timestamp REAL NOT NULL,
    token_count INTEGER,
    finish_reason TEXT,
    reasoning TEXT,
    reasoning_content TEXT,
    reasoning_details TEXT,
    codex_reasoning_items TEXT,
    codex_message_items TEXT,
    effect_disposition TEXT,
    platform_message_id TEXT,
    observed INTEGER DEFAULT 0,
    active INTEGER DEFAULT 1,
    compacted INTEGER DEFAULT 0,
    api_content TEXT,
    display_kind TEXT,
    display_metadata TEXT,
    message_uid TEXT,
    absorbed_message_uids TEXT,
    tool_call_uids TEXT,
    tool_call_uid TEXT,
    search_cjk TEXT
);

CREATE TABLE IF NOT EXISTS session_model_usage (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    model TEXT NOT NULL DEFAULT '',
    billing_provider TEXT NOT NULL DEFAULT '',
    billing_base_url TEXT NOT NULL DEFAULT '',
    billing_mode TEXT NOT NULL DEFAULT '',
    task TEXT NOT NULL DEFAULT '',
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0,
    cache_read_tokens INTEGER DEFAULT 0,
    cache_write_tokens INTEGER DEFAULT 0,
    reasoning_tokens INTEGER DEFAULT 0,
    estimated_cost_usd REAL,
    actual_cost_usd REAL,
    api_call_count INTEGER DEFAULT 0,
    first_used_at REAL,
    last_used_at REAL,
    PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode, task)
);

CREATE TABLE IF NOT EXISTS state_meta (
    key TEXT PRIMARY KEY,
    value TEXT
);

CREATE TABLE IF NOT EXISTS gateway_routing (
    scope TEXT NOT NULL DEFAULT '',
    session_key TEXT NOT NULL,
    entry_json TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (scope, session_key)
);

CREATE TABLE IF NOT EXISTS compression_locks (
    session_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS async_delegations (
    delegation_id TEXT PRIMARY KEY,
    parent_session_id TEXT NOT NULL,
    child_session_id TEXT,
    status TEXT NOT NULL DEFAULT 'pending',
    task TEXT,
    result_json TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS runtime_epoch (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL,
    instance_id TEXT NOT NULL,
    started_at REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS session_admissions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE RESTRICT,
    principal_id TEXT NOT NULL DEFAULT '',
    request_id TEXT,
    intent TEXT NOT NULL DEFAULT 'queue',
    payload_json TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued',
    epoch INTEGER,
    outcome TEXT,
    result_json TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    UNIQUE (principal_id, session_id, request_id)
);

CREATE TABLE IF NOT EXISTS worker_executions (
    execution_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE RESTRICT,
    epoch INTEGER NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'registered',
    outcome TEXT,
    last_sequence INTEGER NOT NULL DEFAULT 0,
    registered_at REAL NOT NULL,
    finished_at REAL
);

CREATE TABLE IF NOT EXISTS worker_receipts (
    execution_id TEXT NOT NULL REFERENCES worker_executions(execution_id) ON DELETE RESTRICT,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE RESTRICT,
    sequence INTEGER NOT NULL,
    payload_json TEXT NOT NULL,
    digest TEXT NOT NULL,
    recorded_at REAL NOT NULL,
    PRIMARY KEY (execution_id, sequence)
);
"""

# The runtime ledgers' statuses in which work is live. The one definition: the ledgers' queries,
# their partial indexes and the deletion guard are all built from these.
LIVE_ADMISSION_STATUSES = ("queued", "started", "unknown")
LIVE_EXECUTION_STATUSES = ("registered", "running", "unknown")


def sql_values(values: tuple[str, ...]) -> str:
    """``('a', 'b')`` for a tuple of this module's own status constants (never user values)."""
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


INDEXES_SQL = f"""
CREATE INDEX IF NOT EXISTS idx_sessions_source ON sessions(source);
CREATE INDEX IF NOT EXISTS idx_sessions_parent ON sessions(parent_session_id);
CREATE INDEX IF NOT EXISTS idx_sessions_started ON sessions(started_at DESC);
CREATE INDEX IF NOT EXISTS idx_sessions_handoff_state ON sessions(handoff_state, started_at);
CREATE UNIQUE INDEX IF NOT EXISTS idx_sessions_title_unique
    ON sessions(title) WHERE title IS NOT NULL;
CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp);
CREATE INDEX IF NOT EXISTS idx_messages_session_id ON messages(session_id, id);
CREATE INDEX IF NOT EXISTS idx_admissions_session
    ON session_admissions(session_id, status, id);
CREATE INDEX IF NOT EXISTS idx_worker_executions_session
    ON worker_executions(session_id, status);
CREATE INDEX IF NOT EXISTS idx_admissions_live ON session_admissions(status, epoch)
    WHERE status IN {sql_values(LIVE_ADMISSION_STATUSES)};
CREATE INDEX IF NOT EXISTS idx_worker_executions_live ON worker_executions(status, epoch)
    WHERE status IN {sql_values(LIVE_EXECUTION_STATUSES)};
CREATE INDEX IF NOT EXISTS idx_async_delegations_parent
    ON async_delegations(parent_session_id, status);
"""

# The three full-text indexes are external-content FTS5 tables over `messages` (rowid = message
# id). messages_fts covers every row; messages_fts_trigram (substring search, queried with LIKE,
# hence detail=none) skips tool output, which is most of the bytes and is still searchable by
# word through messages_fts; messages_fts_cjk indexes `search_cjk`, a copy of the row's text in
# which every CJK run is spelled as overlapping bigrams (written by Python when the row is
# inserted, NULL for rows without CJK), so plain unicode61 serves 1–2 character CJK terms and
# any SQLite, the sqlite3 shell included, can read and maintain it. The views are the exact row
# sets each index covers, so FTS5 'integrity-check' compares like with like. messages_fts names
# its content table in double quotes: that is how Datasette and sqlite-utils recognise a
# table's full-text index (`content="messages"` in its declaration), so their searches of
# `messages` go through it (to FTS5 the quotes mean the same as single ones).
FTS_SQL = """
CREATE VIEW IF NOT EXISTS messages_fts_trigram_source AS
    SELECT id, content FROM messages WHERE role <> 'tool';
CREATE VIEW IF NOT EXISTS messages_fts_cjk_source AS
    SELECT id, search_cjk FROM messages WHERE search_cjk IS NOT NULL;
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content, tool_name, tool_calls,
    content="messages", content_rowid='id'
);
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts_trigram USING fts5(
    content,
    content='messages_fts_trigram_source', content_rowid='id',
    tokenize='trigram', detail='none'
);
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts_cjk USING fts5(
    search_cjk,
    content='messages_fts_cjk_source', content_rowid='id',
    tokenize='unicode61'
);
"""

FTS_TRIGGER_NAMES = ("messages_fts_insert", "messages_fts_update", "messages_fts_delete")

# A row is in the indexes unless a chunked rebuild is running and has not reached it yet:
# rows in (fts_rebuild_progress, fts_rebuild_high_water] are left to the rebuild.
_FTS_GATE = """
    (SELECT value FROM state_meta WHERE key = 'fts_rebuild_high_water') IS NULL
    OR {row}.id > (SELECT CAST(value AS INTEGER) FROM state_meta
                   WHERE key = 'fts_rebuild_high_water')
    OR {row}.id <= (SELECT CAST(value AS INTEGER) FROM state_meta
                    WHERE key = 'fts_rebuild_progress')"""

_FTS_ADD = """
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
        VALUES ({row}.id, {row}.content, {row}.tool_name, {row}.tool_calls);
    INSERT INTO messages_fts_trigram(rowid, content)
        SELECT {row}.id, {row}.content WHERE {row}.role <> 'tool';
    INSERT INTO messages_fts_cjk(rowid, search_cjk)
        SELECT {row}.id, {row}.search_cjk WHERE {row}.search_cjk IS NOT NULL;"""

_FTS_REMOVE = """
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)
        VALUES ('delete', {row}.id, {row}.content, {row}.tool_name, {row}.tool_calls);
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content)
        SELECT 'delete', {row}.id, {row}.content WHERE {row}.role <> 'tool';
    INSERT INTO messages_fts_cjk(messages_fts_cjk, rowid, search_cjk)
        SELECT 'delete', {row}.id, {row}.search_cjk WHERE {row}.search_cjk IS NOT NULL;"""

FTS_TRIGGERS_SQL = f"""
CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages
WHEN {_FTS_GATE.format(row="new")}
BEGIN{_FTS_ADD.format(row="new")}
END;
CREATE TRIGGER IF NOT EXISTS messages_fts_update
AFTER UPDATE OF content, tool_name, tool_calls, role, search_cjk ON messages
WHEN {_FTS_GATE.format(row="old")}
BEGIN{_FTS_REMOVE.format(row="old")}{_FTS_ADD.format(row="new")}
END;
CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages
WHEN {_FTS_GATE.format(row="old")}
BEGIN{_FTS_REMOVE.format(row="old")}
END;
"""

# Created on first use by the gateway's delivery ledger, not when the store is opened.
DELIVERY_OBLIGATIONS_SQL = """
CREATE TABLE IF NOT EXISTS delivery_obligations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT,
    platform TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    thread_id TEXT,
    obligation_key TEXT NOT NULL UNIQUE,
    payload_json TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'owed',
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    settled_at REAL
);
CREATE INDEX IF NOT EXISTS idx_delivery_obligations_owed
    ON delivery_obligations(status, created_at);
"""

# The search index beside the FTS indexes, derived from `messages` like them and never copied
# (hermes_state_impact creates, fills, keeps and describes it). search_impact_state is its one
# row of state: the epoch, the reference length, the batch boundary, the fill markers, the
# damaged flag. search_impact holds the high-impact postings of each message up to the batch
# boundary (text the library computes, under the epoch it was written for); search_impact_fts
# (contentless, no positions) indexes them, each posting's term beside it, and holds the token
# _epoch_<n> of its own epoch; it keeps its %_docsize table (FTS5's default), without which a
# contentless table refuses to be scanned, so any SQLite client can list and count its rows.
# Only the library writes those, never a trigger, so a damaged index cannot fail a canonical
# write. Triggers feed two plain queues the library drains:
# search_impact_queue (messages written below the batch boundary by another client, or
# changed) and search_impact_gone (deleted messages whose postings may still be indexed).
# search_time_blocks bounds the message times of each block of 4,096 ids up to the boundary,
# for searches sorted by time.
IMPACT_DEFAULT_AVGDL = 256.0
TIME_BLOCK_SHIFT = 12
SEARCH_INDEX_SQL = """
CREATE TABLE IF NOT EXISTS search_impact_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL,
    avgdl REAL NOT NULL,
    indexed INTEGER NOT NULL,
    fill_high_water INTEGER,
    fill_progress INTEGER,
    damaged INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS search_impact (
    id INTEGER PRIMARY KEY,
    epoch INTEGER NOT NULL,
    postings TEXT NOT NULL
);
CREATE VIRTUAL TABLE IF NOT EXISTS search_impact_fts USING fts5(
    postings, content='', tokenize="unicode61 tokenchars '_'", detail='none'
);
CREATE VIRTUAL TABLE IF NOT EXISTS search_impact_vocab
    USING fts5vocab(search_impact_fts, 'instance');
CREATE TABLE IF NOT EXISTS search_impact_queue (id INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS search_impact_gone (id INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS search_time_blocks (
    block INTEGER PRIMARY KEY,
    first_at REAL NOT NULL,
    last_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS search_row_changes (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    changes INTEGER NOT NULL
);
INSERT OR IGNORE INTO search_row_changes (id, changes) VALUES (1, 0);
"""

SEARCH_TRIGGER_NAMES = ("search_impact_on_insert", "search_impact_on_update",
                        "search_impact_on_delete")
# Rows past the batch boundary (``indexed``) are indexed by the next batch, whoever wrote them;
# the triggers queue the rows at or below it that are inserted, changed or moved, and bound
# their times (a row whose time is not a number bounds none).
# Each such change, and every delete, counts in search_row_changes: while that count stays,
# the rows at or below the boundary are the same (what cached match counts rely on).
_BOUNDARY = "(SELECT indexed FROM search_impact_state)"
_TIME_BLOCK_UPSERT = f"""
    INSERT INTO search_time_blocks (block, first_at, last_at)
        SELECT new.id >> {TIME_BLOCK_SHIFT}, new.timestamp, new.timestamp
        WHERE typeof(new.timestamp) IN ('integer', 'real') AND new.id <= {_BOUNDARY}
    ON CONFLICT (block) DO UPDATE SET first_at = min(first_at, excluded.first_at),
                                      last_at = max(last_at, excluded.last_at);"""
_COUNT_CHANGE = "UPDATE search_row_changes SET changes = changes + 1;"
SEARCH_TRIGGERS_SQL = f"""
CREATE TRIGGER IF NOT EXISTS search_impact_on_insert AFTER INSERT ON messages
WHEN new.id <= {_BOUNDARY}
BEGIN
    INSERT OR IGNORE INTO search_impact_queue (id) VALUES (new.id);{_TIME_BLOCK_UPSERT}
    {_COUNT_CHANGE}
END;
CREATE TRIGGER IF NOT EXISTS search_impact_on_update
AFTER UPDATE OF id, content, tool_name, tool_calls, timestamp ON messages
WHEN old.id <= {_BOUNDARY} OR new.id <= {_BOUNDARY}
BEGIN
    INSERT OR IGNORE INTO search_impact_queue (id)
        SELECT value FROM (SELECT old.id AS value UNION SELECT new.id)
        WHERE value <= {_BOUNDARY};{_TIME_BLOCK_UPSERT}
    {_COUNT_CHANGE}
END;
CREATE TRIGGER IF NOT EXISTS search_impact_on_delete AFTER DELETE ON messages
BEGIN
    DELETE FROM search_impact_queue WHERE id = old.id;
    INSERT OR IGNORE INTO search_impact_gone (id) VALUES (old.id);
    {_COUNT_CHANGE}
END;
"""

# Everything but the search index, which hermes_state_impact creates on the same terms as a
# missing one (empty, its fill due).
SCHEMA_SQL = TABLES_SQL + INDEXES_SQL + FTS_SQL + FTS_TRIGGERS_SQL

# The runtime ledgers: never copied by recover (a partial ledger could replay or adopt work).
RUNTIME_LEDGER_TABLES = (
    "runtime_epoch",
    "session_admissions",
    "worker_executions",
    "worker_receipts",
)
