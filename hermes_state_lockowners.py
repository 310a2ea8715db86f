"""Name the processes holding SQLite's file locks on a database, read from ``/proc/locks``.

"Database is locked" alone leaves the user guessing; this gives lines such as::

    PID 594094 (hermes --worktree --yolo) holds WAL write lock on state.db-shm

Every process has the file open, so open descriptors tell nothing. The locked bytes tell a
writer from a reader, since SQLite locks fixed offsets. No descriptor is ever opened on the
files: closing one would drop this process's own locks. :func:`describe_lock_holders` never
raises; it runs on error paths."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "PROC_LOCKS_PATH",
    "PROC_LOCKS_ENV",
    "lock_table_path",
    "LockHolder",
    "ProcLock",
    "describe_lock_holders",
    "lock_holders",
    "parse_proc_locks",
]

#: The kernel's lock table, read when a call does not name another file.
PROC_LOCKS_PATH = "/proc/locks"
#: The environment variable that names another lock table (a missing file: holders cannot be
#: named, as on a system without /proc/locks), read at each call.
PROC_LOCKS_ENV = "HERMES_STATE_PROC_LOCKS"


def lock_table_path() -> str:
    """The lock table read when a call does not name one: ``$HERMES_STATE_PROC_LOCKS`` when
    set, else :data:`PROC_LOCKS_PATH`."""
    return os.environ.get(PROC_LOCKS_ENV) or PROC_LOCKS_PATH

# Offsets in the -shm file (sqlite3 os_unix.c: UNIX_SHM_BASE = 120, WAL_NREADER = 5).
_SHM_WAL_WRITE = 120
_SHM_CHECKPOINT = 121
_SHM_RECOVER = 122
_SHM_READ_MARK_0 = 123
_SHM_READ_MARKS = 5
_SHM_DMS = 128

# Offsets in the main database file (sqlite3 os.h: PENDING_BYTE and friends).
_PENDING_BYTE = 0x40000000
_RESERVED_BYTE = _PENDING_BYTE + 1
_SHARED_FIRST = _PENDING_BYTE + 2
_SHARED_SIZE = 510
_SHARED_LAST = _SHARED_FIRST + _SHARED_SIZE - 1

# Lock types that take part in fcntl byte-range locking; others never block SQLite.
_BYTE_RANGE_TYPES = frozenset({"POSIX", "OFDLCK"})

# Importance ranks: lower sorts first. Writers and maintenance first, readers last.
_RANK_WRITER = 0
_RANK_RESERVED = 1
_RANK_MAINTENANCE = 2
_RANK_EXCLUSIVE_READ_SLOT = 3
_RANK_READER = 4
_RANK_DMS = 5
_RANK_OTHER = 6

_COMMAND_MAX = 160

# "12: POSIX  ADVISORY  WRITE 594094 08:02:1234567 120 120", or "12: -> POSIX ..." for a
# waiter (deeper waiters are indented further). Device is MAJOR:MINOR in hex, inode decimal.
_PROC_LOCKS_LINE = re.compile(
    r"""
    \s*(?P<id>\d+):\s*
    (?P<arrow>->\s+)?
    (?P<type>[A-Z]+)\s+
    (?P<flavor>[A-Z]+)\s+
    (?P<mode>[A-Z]+)\s+
    (?P<pid>-?\d+)\s+
    (?P<major>[0-9a-fA-F]+):(?P<minor>[0-9a-fA-F]+):(?P<inode>\d+)\s+
    (?P<start>\d+)\s+
    (?P<end>\d+|EOF)\s*
    """,
    re.VERBOSE,
)


@dataclass(frozen=True, slots=True)
class ProcLock:
    """One line of ``/proc/locks``. ``end`` is ``None`` for ``EOF`` (to the end of any file)."""

    id: int
    type: str
    flavor: str
    mode: str
    pid: int
    major: int
    minor: int
    inode: int
    start: int
    end: int | None
    blocked: bool = False


@dataclass(frozen=True, slots=True)
class LockHolder:
    """A process holding a lock on the database, its ``-wal`` or its ``-shm``.

    ``file`` is the basename (``state.db-shm``); ``kind`` says what the locked bytes mean to
    SQLite (``WAL write``, ``RESERVED``, ``shared read-mark 0``...); ``end`` is ``None`` for EOF.
    """

    pid: int
    command: str
    file: str
    kind: str
    start: int
    end: int | None
    mode: str

    def describe(self) -> str:
        """``PID <pid> (<command>) holds <kind> lock on <file>``: one log line."""
        if self.pid <= 0:
            who = "A process not visible from here"
        else:
            who = f"PID {self.pid} ({self.command})"
        return f"{who} holds {self.kind} lock on {self.file}"


def parse_proc_locks(text: str) -> list[ProcLock]:
    """Parse the text of ``/proc/locks``; lines that do not parse are skipped."""
    locks: list[ProcLock] = []
    for line in text.splitlines():
        match = _PROC_LOCKS_LINE.fullmatch(line)
        if match is None:
            continue
        end = match["end"]
        locks.append(
            ProcLock(
                id=int(match["id"]),
                type=match["type"],
                flavor=match["flavor"],
                mode=match["mode"],
                pid=int(match["pid"]),
                major=int(match["major"], 16),
                minor=int(match["minor"], 16),
                inode=int(match["inode"]),
                start=int(match["start"]),
                end=None if end == "EOF" else int(end),
                blocked=match["arrow"] is not None,
            )
        )
    return locks


@dataclass(frozen=True, slots=True)
class _Role:
    name: str
    rank: int
    # Taken shared by some connections and exclusively by others, so the mode must be said.
    shareable: bool


def _covers(start: int, end: int | None, offset: int) -> bool:
    return start <= offset and (end is None or offset <= end)


def _span(first: int, last: int | None) -> str:
    return str(first) if first == last else f"{first}-{'EOF' if last is None else last}"


def _shm_roles(start: int, end: int | None, write: bool) -> list[_Role]:
    roles: list[_Role] = []
    if _covers(start, end, _SHM_WAL_WRITE):
        roles.append(_Role("WAL write", _RANK_WRITER, shareable=False))
    if _covers(start, end, _SHM_CHECKPOINT):
        roles.append(_Role("checkpoint", _RANK_MAINTENANCE, shareable=False))
    if _covers(start, end, _SHM_RECOVER):
        roles.append(_Role("recover", _RANK_MAINTENANCE, shareable=False))
    marks = [i for i in range(_SHM_READ_MARKS) if _covers(start, end, _SHM_READ_MARK_0 + i)]
    if marks:
        if len(marks) == 1:
            name = f"read-mark {marks[0]}"
        else:
            name = f"read-marks {marks[0]}-{marks[-1]}"
        rank = _RANK_EXCLUSIVE_READ_SLOT if write else _RANK_READER
        roles.append(_Role(name, rank, shareable=True))
    if _covers(start, end, _SHM_DMS):
        rank = _RANK_EXCLUSIVE_READ_SLOT if write else _RANK_DMS
        roles.append(_Role("dead-man switch (DMS)", rank, shareable=True))
    return roles


def _db_roles(start: int, end: int | None, write: bool) -> list[_Role]:
    roles: list[_Role] = []
    if _covers(start, end, _PENDING_BYTE):
        # Held for reading only for an instant, while a connection acquires SHARED.
        rank = _RANK_RESERVED if write else _RANK_EXCLUSIVE_READ_SLOT
        roles.append(_Role("PENDING", rank, shareable=False))
    if _covers(start, end, _RESERVED_BYTE):
        roles.append(_Role("RESERVED", _RANK_RESERVED, shareable=False))
    if start <= _SHARED_LAST and (end is None or end >= _SHARED_FIRST):
        if write:
            roles.append(_Role("EXCLUSIVE", _RANK_WRITER, shareable=False))
        else:
            roles.append(_Role("SHARED", _RANK_READER, shareable=False))
    return roles


def _known_span(suffix: str) -> tuple[int, int] | None:
    if suffix == "-shm":
        return _SHM_WAL_WRITE, _SHM_DMS
    if suffix == "":
        return _PENDING_BYTE, _SHARED_LAST
    return None


# The roles a locked range of the store's files plays (other files' ranges play none).
_ROLES_BY_SUFFIX = {"-shm": _shm_roles, "": _db_roles}


def _roles_named(roles: list[_Role], write: bool) -> str:
    """The roles, named as a lock on them is: said shared or exclusive where the role's
    name alone does not tell."""
    kind = ", ".join(role.name for role in roles)
    if not write and any(role.name != "SHARED" for role in roles):
        return f"shared {kind}"
    if write and any(role.shareable for role in roles):
        return f"exclusive {kind}"
    return kind


def _classify(suffix: str, lock: ProcLock) -> tuple[str, int]:
    """What the locked range means to SQLite, and how much it matters (lower first)."""
    write = lock.mode == "WRITE"
    find_roles = _ROLES_BY_SUFFIX.get(suffix)
    roles = find_roles(lock.start, lock.end, write) if find_roles is not None else []
    span = _span(lock.start, lock.end)
    if not roles:
        return f"{'exclusive' if write else 'shared'} byte-range {span}", _RANK_OTHER
    kind = _roles_named(roles, write)
    known = _known_span(suffix)
    if known is not None and (lock.start < known[0] or lock.end is None or lock.end > known[1]):
        kind = f"{kind} (byte-range {span})"
    return kind, min(role.rank for role in roles)


def _command(pid: int) -> str:
    """The command line of ``pid``, on one line: argv[0] reduced to its basename."""
    if pid <= 0:
        return "unknown"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        raw = b""
    argv = [arg for arg in raw.decode("utf-8", "replace").split("\0") if arg]
    if argv:
        argv[0] = os.path.basename(argv[0]) or argv[0]
        command = " ".join(argv)
    else:
        # Kernel threads and zombies have an empty cmdline; comm is all there is.
        try:
            with open(f"/proc/{pid}/comm", "rb") as fh:
                command = fh.read().decode("utf-8", "replace").strip()
        except OSError:
            command = ""
    command = " ".join(command.split())  # newlines in argv would split the log line
    if len(command) > _COMMAND_MAX:
        command = command[: _COMMAND_MAX - 1] + "…"
    return command or "unknown"


def _file_ids(db_path: str | os.PathLike[str]) -> dict[tuple[int, int, int], tuple[str, str]]:
    """(major, minor, inode) -> (suffix, basename) for the files that exist. Stat only."""
    base = os.fspath(db_path)
    ids: dict[tuple[int, int, int], tuple[str, str]] = {}
    for suffix in ("", "-wal", "-shm"):
        path = base + suffix
        try:
            st = os.stat(path)
            key = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        except (OSError, AttributeError):  # AttributeError: no os.major on Windows
            continue
        ids[key] = (suffix, os.path.basename(path))
    return ids


def lock_holders(
    db_path: str | os.PathLike[str],
    *,
    exclude_pids: Iterable[int] | None = None,
    proc_locks_path: str | None = None,
) -> list[LockHolder]:
    """The processes holding byte-range locks on ``db_path``, its ``-wal`` and its ``-shm``.

    ``exclude_pids`` defaults to this process. Sorted most important first: WAL write,
    EXCLUSIVE, RESERVED, PENDING, checkpoint and recover before read marks, SHARED and DMS.
    Returns ``[]`` when the lock table cannot be read (no ``/proc/locks`` on this system).
    ``proc_locks_path`` defaults to :func:`lock_table_path`.
    """
    excluded = frozenset((os.getpid(),) if exclude_pids is None else exclude_pids)
    files = _file_ids(db_path)
    if not files:
        return []
    try:
        table = lock_table_path() if proc_locks_path is None else proc_locks_path
        with open(table, encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return []
    ranked: list[tuple[int, int, int, int, LockHolder]] = []
    commands: dict[int, str] = {}
    order = {"": 0, "-wal": 1, "-shm": 2}
    for lock in parse_proc_locks(text):
        if lock.blocked or lock.type not in _BYTE_RANGE_TYPES or lock.pid in excluded:
            continue
        found = files.get((lock.major, lock.minor, lock.inode))
        if found is None:
            continue
        suffix, name = found
        kind, rank = _classify(suffix, lock)
        if lock.pid not in commands:
            commands[lock.pid] = _command(lock.pid)
        holder = LockHolder(
            pid=lock.pid,
            command=commands[lock.pid],
            file=name,
            kind=kind,
            start=lock.start,
            end=lock.end,
            mode=lock.mode,
        )
        ranked.append((rank, order[suffix], lock.start, lock.pid, holder))
    ranked.sort(key=lambda item: item[:4])
    return [item[4] for item in ranked]


def describe_lock_holders(
    db_path: str | os.PathLike[str],
    *,
    exclude_pids: Iterable[int] | None = None,
    proc_locks_path: str | None = None,
) -> list[str]:
    """:meth:`LockHolder.describe` lines for :func:`lock_holders`; never raises."""
    try:
        holders = lock_holders(
            db_path, exclude_pids=exclude_pids, proc_locks_path=proc_locks_path
        )
    except Exception:  # a diagnostic inside an error path must not replace the real error
        return []
    return [holder.describe() for holder in holders]
