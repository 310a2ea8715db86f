"""Portability: export and import, backup and restore, and repair.

*Export* is plain JSON data: the session row with every column, every message row of every
generation (uids, JSON fields decoded, ``active``/``compacted`` flags) and the per-model usage
rows. Nothing derived travels (no FTS text, no ``search_cjk``), so an import loses nothing.
:func:`iter_export_jsonl` streams one JSON object per line from database cursors, so a session
of any size exports in constant memory. *Import* writes each session in its own transaction,
parents before children, messages through ``insert_message`` (uids kept): an existing identical
session is skipped, an existing different one is a conflict and nothing of it is written.

The file-level operations never copy ``state.db``, ``-wal`` and ``-shm`` as separate files:
those three are one live image. Backups, the working copy of a repair and its promotion back
onto the live file all go through SQLite's backup API, which reads a consistent snapshot
through the WAL. Repair and restore need the database to themselves: they take the
cross-process admission lock and refuse (:class:`StateDbInUseError`) while ``/proc/locks``
shows any other process on the files.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import hermes_state_fts as fts
from hermes_state_common import (
    FTS_SQL,
    INDEXES_SQL,
    RUNTIME_LEDGER_TABLES,
    SCHEMA_VERSION,
    check_test_isolation,
    clean_optional,
    get_hermes_home,
    prepare_db_file,
    quote_identifier,
    refuse_symlinks,
    sidecar_paths,
    split_sql,
    table_exists,
    tighten_modes,
    transaction,
)
from hermes_state_compression import get_session_ancestors, get_session_descendants
from hermes_state_errors import (
    HermesStateError,
    SessionNotFoundError,
    StateDbCorruptError,
    StateDbInUseError,
    StateDbUnavailableError,
    is_corruption_error,
)
from hermes_state_lockowners import describe_lock_holders
from hermes_state_messages import (
    MESSAGE_FIELDS,
    SELECT_MESSAGES_SQL,
    get_messages,
    insert_message,
    message_fields,
    row_to_message,
)
from hermes_state_schema import expected_columns, read_version
from hermes_state_sessions import get_model_usage, get_session, search_sessions, session_columns

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_FORMAT_VERSION",
    "export_session",
    "export_all",
    "export_session_lineage",
    "lineage_ids",
    "iter_export_jsonl",
    "import_sessions",
    "import_jsonl",
    "backup_state_db",
    "restore_state_db",
    "repair_state_db",
    "health_report",
    "snapshot_dir",
]

T = TypeVar("T")
WriteFn = Callable[[Callable[[sqlite3.Connection], T]], T]
Progress = Callable[[str, int, "int | None"], None]

EXPORT_FORMAT = "hermes-state-export"
EXPORT_FORMAT_VERSION = 1
SNAPSHOT_DIRNAME = "state-snapshots"
_BUSY_TIMEOUT_S = 5.0


def _no_progress(stage: str, done: int, total: int | None) -> None:
    pass


# =============================================================================================
# Export
# =============================================================================================


def export_session(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """The session row plus ``messages`` (all generations, in order) and ``model_usage``."""
    session = get_session(conn, session_id)
    if session is None:
        return None
    session["messages"] = get_messages(conn, session_id, include_inactive=True)
    session["model_usage"] = get_model_usage(conn, session_id)
    return session


def export_all(conn: sqlite3.Connection, source: str | None = None) -> list[dict[str, Any]]:
    """Every session (optionally of one source), oldest first, exported as above."""
    sessions = search_sessions(conn, source=source, limit=-1)
    exported = (export_session(conn, s["id"]) for s in reversed(sessions))
    return [e for e in exported if e is not None]


def lineage_ids(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """Every session of the lineage ``session_id`` belongs to: its root (the topmost ancestor)
    and everything below it, parents before children. Empty when the session is unknown."""
    ancestors = get_session_ancestors(conn, session_id)
    if not ancestors:
        return []
    return [r["id"] for r in get_session_descendants(conn, ancestors[-1]["id"])]


def export_session_lineage(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """The whole lineage of ``session_id`` (see :func:`lineage_ids`), each session exported
    as by :func:`export_session`, parents first."""
    exported = (export_session(conn, i) for i in lineage_ids(conn, session_id))
    return [e for e in exported if e is not None]


# Oldest first, so parents usually precede their children (import does not rely on it).
EXPORT_IDS_SQL = "SELECT id FROM sessions ORDER BY started_at, id"
EXPORT_IDS_BY_SOURCE_SQL = "SELECT id FROM sessions WHERE source = ? ORDER BY started_at, id"


def _export_ids(
    conn: sqlite3.Connection,
    session_ids: Iterable[str] | None,
    source: str | None,
    lineage: bool,
) -> list[str]:
    if session_ids is None:
        if source is None:
            return [r[0] for r in conn.execute(EXPORT_IDS_SQL)]
        return [r[0] for r in conn.execute(EXPORT_IDS_BY_SOURCE_SQL, (source,))]
    ids: dict[str, None] = {}
    for session_id in session_ids:
        found = lineage_ids(conn, session_id) if lineage else (
            [session_id] if get_session(conn, session_id) is not None else []
        )
        if not found:
            raise SessionNotFoundError(session_id)
        ids.update(dict.fromkeys(found))
    return list(ids)


SESSION_MESSAGES_SQL = SELECT_MESSAGES_SQL + " WHERE session_id = ? ORDER BY id"


def _line(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def iter_export_jsonl(
    conn: sqlite3.Connection,
    session_ids: Iterable[str] | None = None,
    *,
    source: str | None = None,
    lineage: bool = False,
) -> Iterator[str]:
    """Export as JSON Lines, one line at a time, in constant memory.

    Lines: a header ``{"kind": "header", ...}``; per session a ``session`` line (the row),
    its ``message`` lines (every generation, in id order) and ``usage`` lines; a final
    ``end`` line with the totals. ``session_ids`` (default: every session, or those of
    ``source``) are expanded to their whole lineage with ``lineage=True``. Run it inside one
    read transaction for a consistent snapshot; an unknown id raises before any line."""
    ids = _export_ids(conn, session_ids, source, lineage)
    yield _line(
        {
            "kind": "header",
            "format": EXPORT_FORMAT,
            "format_version": EXPORT_FORMAT_VERSION,
            "schema_version": SCHEMA_VERSION,
            "exported_at": datetime.datetime.now(datetime.UTC).isoformat(),
        }
    )
    sessions = messages = 0
    for session_id in ids:
        session = get_session(conn, session_id)
        if session is None:  # deleted since the ids were read (no snapshot held)
            continue
        sessions += 1
        yield _line({"kind": "session", "session": session})
        cursor = conn.execute(SESSION_MESSAGES_SQL, (session_id,))
        for row in cursor:
            messages += 1
            message = row_to_message(row)
            yield _line({"kind": "message", "session_id": session_id, "message": message})
        for usage in get_model_usage(conn, session_id):
            yield _line({"kind": "usage", "session_id": session_id, "usage": usage})
    yield _line({"kind": "end", "sessions": sessions, "messages": messages})


# =============================================================================================
# Import
# =============================================================================================

_MESSAGE_DEFAULTS: dict[str, Any] = {
    **dict.fromkeys(MESSAGE_FIELDS),
    "observed": False,
    "active": True,
    "compacted": False,
}
_FLAGS = ("observed", "active", "compacted")
_USAGE_KEY = ("model", "billing_provider", "billing_base_url", "billing_mode", "task")


@dataclass
class _Incoming:
    """One session to import: its row, a re-iterable source of its messages (a retried
    transaction reads them again) and its usage rows."""

    session: dict[str, Any]
    messages: Callable[[], Iterable[Mapping[str, Any]]]
    usage: list[dict[str, Any]]

    @property
    def id(self) -> Any:
        return self.session.get("id")


def _from_dict(record: Mapping[str, Any]) -> _Incoming:
    if not isinstance(record, Mapping):
        raise TypeError(f"a session to import must be a mapping, got {type(record).__name__}")
    session = {k: v for k, v in record.items() if k not in ("messages", "model_usage")}
    messages = list(record.get("messages") or [])
    return _Incoming(session, lambda: messages, list(record.get("model_usage") or []))


def _comparable_message(message: Mapping[str, Any]) -> dict[str, Any]:
    fields = {**_MESSAGE_DEFAULTS, **{k: v for k, v in message_fields(message).items()
                                      if k in _MESSAGE_DEFAULTS}}
    for flag in _FLAGS:
        fields[flag] = bool(fields[flag])
    return fields


def _comparable_usage(rows: Iterable[Mapping[str, Any]]) -> list[tuple]:
    return sorted(
        tuple(sorted((k, v) for k, v in row.items() if k != "session_id")) for row in rows
    )


def _same_session(conn: sqlite3.Connection, existing: Mapping[str, Any], rec: _Incoming) -> bool:
    """True when the stored session equals the incoming one in every column the incoming
    record carries, message for message (streamed) and in its usage rows."""
    columns = set(session_columns())
    if any(existing.get(k) != v for k, v in rec.session.items() if k in columns):
        return False
    stored = conn.execute(SESSION_MESSAGES_SQL, (existing["id"],))
    incoming = iter(rec.messages())
    for row in stored:
        other = next(incoming, None)
        if other is None or _comparable_message(row_to_message(row)) != _comparable_message(other):
            return False
    if next(incoming, None) is not None:
        return False
    return _comparable_usage(get_model_usage(conn, existing["id"])) == _comparable_usage(rec.usage)


def _usage_columns() -> list[str]:
    return [c[0] for c in expected_columns()["session_model_usage"]]


def _import_one(conn: sqlite3.Connection, rec: _Incoming) -> dict[str, Any]:
    """Import one session in the caller's transaction; returns what happened to it."""
    session_id = rec.id
    if not isinstance(session_id, str) or not session_id.strip():
        raise ValueError(f"session id must be a non-empty string, got {session_id!r}")
    existing = get_session(conn, session_id)
    if existing is not None:
        if _same_session(conn, existing, rec):
            return {"status": "skipped"}
        return {"status": "conflict", "reason": "a different session with this id exists"}
    outcome: dict[str, Any] = {"status": "imported"}
    columns = session_columns()
    row = {k: rec.session[k] for k in columns if k in rec.session}
    unknown = sorted(set(rec.session) - set(columns))
    if unknown:
        outcome["ignored_fields"] = unknown
    title = row.get("title")
    if title is not None:
        holder = conn.execute("SELECT id FROM sessions WHERE title = ?", (title,)).fetchone()
        if holder is not None:
            row["title"] = None
            outcome["title_conflict"] = {"title": title, "held_by": holder[0]}
    parent = row.get("parent_session_id")
    if parent is not None and get_session(conn, parent) is None:
        row["parent_session_id"] = None
        outcome["parent_missing"] = parent
    names = list(row)
    conn.execute(
        f"INSERT INTO sessions ({', '.join(quote_identifier(n) for n in names)})"
        f" VALUES ({', '.join('?' * len(names))})",
        [clean_optional(v) if isinstance(v, str) else v for v in row.values()],
    )
    count = 0
    dropped: set[str] = set()
    for message in rec.messages():
        fields = message_fields(message)
        dropped.update(k for k in fields if k not in _MESSAGE_DEFAULTS)
        insert_message(
            conn,
            session_id,
            {k: v for k, v in fields.items() if k in _MESSAGE_DEFAULTS},
            count=False,
        )
        count += 1
    if dropped:
        outcome["ignored_message_fields"] = sorted(dropped)
    usage_columns = _usage_columns()
    for usage in rec.usage:
        values = {k: usage[k] for k in usage_columns if k in usage}
        values["session_id"] = session_id
        conn.execute(
            f"INSERT INTO session_model_usage ({', '.join(quote_identifier(n) for n in values)})"
            f" VALUES ({', '.join('?' * len(values))})",
            list(values.values()),
        )
    outcome["messages"] = count
    return outcome


def _parents_first(records: list[_Incoming]) -> list[_Incoming]:
    """The records reordered so that a session follows its parent when both are imported;
    otherwise input order. Cycles and duplicate ids cannot loop."""
    first: dict[Any, _Incoming] = {}
    for rec in records:
        first.setdefault(rec.id, rec)
    placed: set[int] = set()
    out: list[_Incoming] = []
    for rec in records:
        chain = []
        node: _Incoming | None = rec
        while node is not None and id(node) not in placed:
            placed.add(id(node))
            chain.append(node)
            parent = node.session.get("parent_session_id")
            node = first.get(parent) if parent is not None else None
        out.extend(reversed(chain))
    return out


def _import_records(write: WriteFn, records: list[_Incoming]) -> dict[str, Any]:
    report: dict[str, Any] = {
        "imported": [],
        "skipped": [],
        "conflicts": [],
        "title_conflicts": [],
        "parent_missing": [],
        "invalid": [],
        "messages_imported": 0,
    }
    for rec in _parents_first(records):
        try:
            outcome = write(functools.partial(_import_one, rec=rec))
        except (ValueError, TypeError, sqlite3.IntegrityError) as exc:
            report["invalid"].append({"session_id": rec.id, "error": str(exc)})
            continue
        status = outcome["status"]
        if status == "skipped":
            report["skipped"].append(rec.id)
        elif status == "conflict":
            report["conflicts"].append({"session_id": rec.id, "reason": outcome["reason"]})
        else:
            report["imported"].append(rec.id)
            report["messages_imported"] += outcome["messages"]
            if "title_conflict" in outcome:
                conflict = outcome["title_conflict"]
                report["title_conflicts"].append({"session_id": rec.id, **conflict})
            if "parent_missing" in outcome:
                report["parent_missing"].append(
                    {"session_id": rec.id, "parent_session_id": outcome["parent_missing"]}
                )
            for key in ("ignored_fields", "ignored_message_fields"):
                if key in outcome:
                    report.setdefault(key, {})[rec.id] = outcome[key]
    return report


def import_sessions(write: WriteFn, sessions: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Import exported sessions (``export_session`` / ``export_all`` dicts), any order.

    ``write(fn)`` runs ``fn(conn)`` in one retried write transaction; each session gets its
    own. Report: ``imported``, ``skipped`` (an identical session exists), ``conflicts`` (a
    different one exists; nothing of it written), ``title_conflicts`` (imported without the
    title another session holds), ``parent_missing`` (imported as a root: its parent is
    neither stored nor imported), ``invalid`` (rejected records) and ``messages_imported``.
    """
    return _import_records(write, [_from_dict(s) for s in sessions])


# The JSONL importer spools lines into a private SQLite file first: memory stays bounded,
# sessions can be reordered parents-first, and a retried transaction can re-read a session.
SPOOL_SCHEMA_SQL = """
CREATE TABLE lines (n INTEGER PRIMARY KEY, block INTEGER, kind TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX lines_by_block ON lines (block, kind, n);
"""
SPOOL_INSERT_SQL = "INSERT INTO lines (n, block, kind, body) VALUES (?, ?, ?, ?)"
SPOOL_BLOCK_SQL = "SELECT body FROM lines WHERE block = ? AND kind = ? ORDER BY n"


def _spool_jsonl(fp: IO[Any], spool: sqlite3.Connection) -> list[tuple[int, dict[str, Any]]]:
    """Load JSONL lines into ``spool``; returns (block, session row) for each session line.
    A message or usage line belongs to the latest session line of its session id."""
    spool.executescript(SPOOL_SCHEMA_SQL)
    sessions: list[tuple[int, dict[str, Any]]] = []
    blocks: dict[Any, int] = {}
    batch: list[tuple] = []
    spool.execute("BEGIN")
    for n, raw in enumerate(fp, start=1):
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
            kind = obj["kind"]
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"line {n} is not an export line: {exc}") from None
        if kind == "header":
            if obj.get("format") != EXPORT_FORMAT:
                raise ValueError(f"line {n}: not a {EXPORT_FORMAT} stream")
            continue
        if kind == "end":
            continue
        if kind == "session":
            session = obj.get("session")
            if not isinstance(session, dict):
                raise ValueError(f"line {n}: a session line needs a 'session' object")
            blocks[session.get("id")] = n
            sessions.append((n, session))
            continue
        if kind not in ("message", "usage"):
            raise ValueError(f"line {n}: unknown kind {kind!r}")
        block = blocks.get(obj.get("session_id"))
        if block is None or not isinstance(obj.get(kind), dict):
            raise ValueError(f"line {n}: {kind} of a session that has no session line before it")
        batch.append((n, block, kind, json.dumps(obj[kind], ensure_ascii=False)))
        if len(batch) >= 1000:
            spool.executemany(SPOOL_INSERT_SQL, batch)
            batch.clear()
    spool.executemany(SPOOL_INSERT_SQL, batch)
    spool.execute("COMMIT")
    return sessions


def import_jsonl(write: WriteFn, fp: IO[Any]) -> dict[str, Any]:
    """Import a stream written by :func:`iter_export_jsonl` (text or binary file object,
    read line by line; memory stays bounded by one session row at a time plus the ids).
    Same rules and report as :func:`import_sessions`."""
    with tempfile.TemporaryDirectory(prefix="hermes-import-") as tmp:
        spool = sqlite3.connect(Path(tmp) / "spool.db", isolation_level=None)
        try:
            spool.execute("PRAGMA journal_mode = OFF")
            spool.execute("PRAGMA synchronous = OFF")
            sessions = _spool_jsonl(fp, spool)

            def spooled(block: int, kind: str) -> Iterator[dict[str, Any]]:
                return (json.loads(b) for (b,) in spool.execute(SPOOL_BLOCK_SQL, (block, kind)))

            records = [
                _Incoming(
                    session,
                    functools.partial(spooled, block, "message"),
                    list(spooled(block, "usage")),
                )
                for block, session in sessions
            ]
            return _import_records(write, records)
        finally:
            spool.close()


# =============================================================================================
# Files: snapshots, exclusivity, promotion
# =============================================================================================


def snapshot_dir() -> Path:
    """Where snapshots live: ``get_hermes_home()/state-snapshots``."""
    return get_hermes_home() / SNAPSHOT_DIRNAME


def _utc_stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")


def _new_private_file(path: Path) -> Path:
    """Create ``path`` empty with mode 0600 (never an existing file, never through a link)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(
        path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600
    )
    os.close(fd)
    return path


def _unique_snapshot_path(directory: Path, prefix: str) -> Path:
    stamp = _utc_stamp()
    for n in range(1, 1000):
        candidate = directory / (f"{prefix}-{stamp}.db" if n == 1 else f"{prefix}-{stamp}-{n}.db")
        try:
            return _new_private_file(candidate)
        except FileExistsError:
            continue
    raise HermesStateError(f"no free snapshot name in {directory}")


def _remove_db_files(path: Path) -> None:
    for p in (path, *sidecar_paths(path), path.with_name(path.name + "-journal")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _connect(path: Path, mode: str, *, immutable: bool = False) -> sqlite3.Connection:
    uri = f"{path.as_uri()}?mode={mode}&nofollow=1" + ("&immutable=1" if immutable else "")
    return sqlite3.connect(
        uri, uri=True, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S
    )


def _existing_db(db_path: str | os.PathLike[str]) -> Path:
    path = Path(db_path).expanduser().absolute()
    check_test_isolation(path)
    refuse_symlinks(path)
    if not path.is_file() or path.stat().st_size == 0:
        raise StateDbUnavailableError(
            f"no initialised session store at {path}", reason="uninitialized", path=path
        )
    return path


def _quick_check(conn: sqlite3.Connection) -> list[str]:
    try:
        return [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
    except sqlite3.Error as exc:
        return [f"{type(exc).__name__}: {exc}"]


def _copy_live(db_path: Path, dest: Path) -> sqlite3.Connection:
    """Copy the live database into the new file ``dest`` with the backup API and return a
    connection on the copy. One backup step: a consistent snapshot read through the WAL,
    while writers carry on (a stepwise backup would restart after every foreign write)."""
    src = _connect(db_path, "ro")
    try:
        dst = sqlite3.connect(dest, isolation_level=None, check_same_thread=False)
        try:
            src.backup(dst)
        except BaseException:
            dst.close()
            raise
    finally:
        src.close()
    return dst


@contextlib.contextmanager
def _exclusive(db_path: Path) -> Iterator[None]:
    """Hold the admission lock and make sure no other process has the database open;
    :class:`StateDbInUseError` otherwise."""
    with fts.admission_lock(db_path) as admitted:
        if not admitted:
            raise StateDbInUseError(
                f"another maintenance run holds the admission lock of {db_path}", path=db_path
            )
        _refuse_other_holders(db_path)
        yield


def _refuse_other_holders(db_path: Path) -> None:
    if fts.other_processes_hold(db_path):
        holders = describe_lock_holders(db_path)
        detail = "; ".join(holders) if holders else "other processes may have it open"
        raise StateDbInUseError(f"{db_path} is in use: {detail}", path=db_path, holders=holders)


def _promote(src: sqlite3.Connection, db_path: Path) -> list[str]:
    """Write the database of ``src`` onto ``db_path`` with the backup API; returns the live
    file's quick_check. The live file leaves WAL mode for the copy (so a snapshot with
    another page size can be restored) and returns to it afterwards."""
    dst = _connect(db_path, "rwc")
    try:
        dst.execute("PRAGMA journal_mode = DELETE")
        src.backup(dst)
        mode = dst.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise HermesStateError(f"{db_path} refused WAL mode (journal_mode={mode})")
        return _quick_check(dst)
    finally:
        dst.close()
        tighten_modes(db_path)


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


# =============================================================================================
# Backup and restore
# =============================================================================================


def backup_state_db(
    db_path: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None
) -> Path:
    """Snapshot the database with the backup API; returns the snapshot's path.

    ``dest`` defaults to ``get_hermes_home()/state-snapshots/state-<UTC timestamp>.db`` and
    must not exist. The snapshot is a self-contained file (rollback journal mode, 0600) that
    passed ``PRAGMA quick_check``; one that fails it is kept for inspection and
    :class:`StateDbCorruptError` names it. Works while writers are running."""
    path, check = _snapshot(_existing_db(db_path), dest)
    if check != ["ok"]:
        raise StateDbCorruptError(
            f"the snapshot of {path} fails quick_check: {'; '.join(check[:3])}", path=path
        )
    return path


def _snapshot(db_path: Path, dest: str | os.PathLike[str] | None) -> tuple[Path, list[str]]:
    if dest is None:
        target = _unique_snapshot_path(snapshot_dir(), "state")
    else:
        target = _new_private_file(Path(dest).expanduser().absolute())
    try:
        conn = _copy_live(db_path, target)
        try:
            conn.execute("PRAGMA journal_mode = DELETE")
            return target, _quick_check(conn)
        finally:
            conn.close()
    except BaseException:
        _remove_db_files(target)
        raise


def restore_state_db(
    snapshot: str | os.PathLike[str], db_path: str | os.PathLike[str]
) -> dict[str, Any]:
    """Replace the database at ``db_path`` with ``snapshot`` (backup API, page for page, so
    ledgers and everything else come back whole).

    The snapshot must pass quick_check and be a session store no newer than this library;
    the current database, if any, is snapshotted first (``previous_snapshot``). Refused with
    :class:`StateDbInUseError` while other processes hold the database."""
    snap = _existing_db(snapshot)
    target = Path(db_path).expanduser().absolute()
    check_test_isolation(target)
    refuse_symlinks(target)
    src = _connect(snap, "ro")
    try:
        check = _quick_check(src)
        if check != ["ok"]:
            raise StateDbCorruptError(
                f"snapshot {snap} fails quick_check: {'; '.join(check[:3])}", path=snap
            )
        version = read_version(src)
        if version is None or version > SCHEMA_VERSION:
            raise StateDbUnavailableError(
                f"snapshot {snap} has schema version {version}; this library reads "
                f"up to {SCHEMA_VERSION}",
                reason="uninitialized" if version is None else "incompatible",
                path=snap,
                schema_version=version,
            )
        report: dict[str, Any] = {
            "restored_from": str(snap),
            "db_path": str(target),
            "schema_version": version,
            "previous_snapshot": None,
        }
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with _exclusive(target):
            if target.is_file() and target.stat().st_size > 0:
                report["previous_snapshot"] = str(_snapshot(target, None)[0])
            prepare_db_file(target)
            report["quick_check"] = _promote(src, target)
        live = _connect(target, "ro")
        try:
            report["row_counts"] = row_counts(live)
        finally:
            live.close()
        return report
    finally:
        src.close()


# =============================================================================================
# Repair
# =============================================================================================


def health_report(conn: sqlite3.Connection) -> dict[str, Any]:
    """The health of the database behind ``conn`` (a private copy: the FTS check is run as a
    write, rolled back): ``integrity`` (PRAGMA integrity_check lines), ``fts_integrity`` (per
    index, None when clean), ``fts_stale`` (the marker), ``fts_rebuilding``, ``triggers``
    (expected and missing), ``row_counts``, ``schema_version``, ``problems``, ``healthy``."""
    problems: list[str] = []
    try:
        integrity = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
    except sqlite3.Error as exc:
        integrity = [f"{type(exc).__name__}: {exc}"]
    if integrity != ["ok"]:
        problems.append("integrity_check: " + "; ".join(integrity[:3]))
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            fts_integrity = fts.integrity_report(conn)
        finally:
            conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        fts_integrity = {t: f"{type(exc).__name__}: {exc}" for t in fts.FTS_TABLES}
    problems += [f"fts {t}: {e}" for t, e in fts_integrity.items() if e is not None]
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
    counts = row_counts(conn)
    problems += [f"{t} cannot be counted: {c}" for t, c in counts.items() if isinstance(c, str)]
    return {
        "integrity": integrity,
        "fts_integrity": fts_integrity,
        "fts_stale": stale,
        "fts_rebuilding": rebuilding,
        "triggers": {"expected": list(fts.FTS_TRIGGER_NAMES), "missing": missing},
        "row_counts": counts,
        "schema_version": version,
        "problems": problems,
        "healthy": not problems,
    }


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
        return conn
    except sqlite3.DatabaseError as exc:
        if not is_corruption_error(exc):
            raise
    conn.execute("PRAGMA writable_schema = ON")
    with transaction(conn):
        conn.execute(
            "DELETE FROM sqlite_master"
            " WHERE name LIKE :p ESCAPE '\\' OR tbl_name LIKE :p ESCAPE '\\'",
            {"p": "messages\\_fts%"},
        )
    conn.execute("PRAGMA writable_schema = OFF")
    conn.close()  # the schema changed underneath SQLite: start from a fresh connection
    return sqlite3.connect(work, isolation_level=None, check_same_thread=False)


def _rebuild_indexes(conn: sqlite3.Connection, progress: Progress) -> None:
    """Create the FTS objects of the current schema and fill them with the chunked rebuild
    (which also recomputes ``search_cjk``); clears every FTS marker on the way."""
    with transaction(conn):
        for statement in split_sql(INDEXES_SQL + FTS_SQL):
            conn.execute(statement)
        total = fts.start_rebuild(conn)
    done = 0
    while True:
        with transaction(conn):
            left = fts.rebuild_chunk(conn, 5000)
        if not left:
            break
        done = total - left
        progress("rebuilding FTS", done, total)
    progress("rebuilding FTS", total, total)


def repair_state_db(
    db_path: str | os.PathLike[str],
    *,
    check_only: bool = False,
    backup: bool = True,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Check, and unless ``check_only`` repair, the derived structures of a session store.

    ``check_only``: the :func:`health_report` of a backup-API copy (nothing is written to the
    database; it may run while others use it). Repair, with the database to itself:

    1. a snapshot in ``state-snapshots/`` (``backup=True``) — kept whatever happens;
    2. a working copy (backup API) on which the FTS objects are dropped, the file VACUUMed
       (rebuilding every ordinary index and dropping orphaned pages) and the FTS indexes,
       triggers and markers rebuilt; canonical rows are never deleted;
    3. the checks on the working copy, which must pass with every row count unchanged;
    4. only then the working copy is written onto the live file with the backup API.

    A store that is already healthy is left alone. When the checks fail, or the canonical
    tables cannot be read, nothing is promoted and ``kept`` lists the live file and the
    backup. Refused with :class:`StateDbInUseError` while other processes hold the database.
    """
    path = _existing_db(db_path)
    say = progress or _no_progress
    report: dict[str, Any] = {"db_path": str(path), "check_only": check_only}
    if check_only:
        report["in_use_by"] = describe_lock_holders(path)
        with tempfile.TemporaryDirectory(prefix="hermes-check-") as tmp:
            try:
                conn = _copy_live(path, Path(tmp) / "check.db")
            except sqlite3.Error as exc:
                return {**report, **_unreadable(exc)}
            try:
                report.update(health_report(conn))
            finally:
                conn.close()
        return report
    with _exclusive(path):
        snapshots = snapshot_dir()
        snapshots.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.TemporaryDirectory(prefix=".repair-", dir=snapshots) as tmp:
            work = _new_private_file(Path(tmp) / "work.db")
            say("copying", 0, None)
            try:
                conn = _copy_live(path, work)
            except sqlite3.Error as exc:
                return {**report, **_unreadable(exc), "promoted": False, "kept": [str(path)]}
            try:
                before = health_report(conn)
                report["before"] = before
                if before["healthy"]:
                    return {**report, "repaired": False, "promoted": False, "backup": None}
                if backup:
                    snap, check = _snapshot(path, None)
                    report["backup"] = str(snap)
                    report["backup_quick_check"] = check
                conn, after, error = _repair_copy(work, conn, before["row_counts"], say)
                report["after"] = after
                if error is not None:
                    kept = [str(path)] + ([report["backup"]] if backup else [])
                    return {**report, "error": error, "repaired": False, "promoted": False,
                            "kept": kept}
                _refuse_other_holders(path)
                say("promoting", 0, None)
                report["live_quick_check"] = _promote(conn, path)
                return {**report, "repaired": True, "promoted": True}
            finally:
                conn.close()


def _unreadable(exc: sqlite3.Error) -> dict[str, Any]:
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
        _rebuild_indexes(conn, say)
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
