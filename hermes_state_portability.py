"""Portability: export and import, backup and restore, repair, and recovery of damaged files.

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
through the WAL. Repair and restore hold the live store with SQLite's own EXCLUSIVE lock for
their whole window (see *Exclusive maintenance* below), so no write of another process can
land between their snapshot and their promotion: they refuse (:class:`StateDbInUseError`)
while any other connection has the file open, and other processes' writes wait meanwhile.

*Recover* is for a file SQLite can no longer read whole. It never opens the source with SQLite,
so it neither writes to it nor creates a ``-wal``/``-shm`` beside it: it reads private byte
copies. (``immutable=1`` on the source would skip the WAL's committed transactions; a
``mode=ro`` open takes locks and may create the sidecars.) A hot rollback journal (an
interrupted restore, repair promotion or write) is rolled back on the copy first, so the
rows read are the committed state, not the torn mix the main file holds (a page whose journal
record is damaged is read as blank, and as the transaction left it only last). When the ``-wal``
holds commits, the source is read in views, newest first: the main file with the WAL's
verified commits folded in (past a damaged frame, where later commits verify), the main file
alone, and, where a damaged frame's page is not rewritten by a later commit, the damaged
frames' own unverified content. Rows are merged by rowid: a row comes from the newest view
that holds it, a row only an older view holds is still kept and counted as such (a WAL
written over a damaged freelist replaces pages the main file holds intact), and rowids no
row can have (≤ 0, above a sane ``sqlite_sequence``) are reported, not copied. Where the
views disagree, or a table's own count does not match its rows, losses are reported as
unknown, never as an exact zero.

In each view a table is read by SQL first; when SQLite stops at a damaged page, the table's
b-tree is walked page by page from the file format (``hermes_state_fileformat``), taking
every cell that still parses, and finally the leaf pages no tree reaches any more (those
under a destroyed interior page) are read and matched to the damaged tables by the shape of
their records. Walking pages beats bisecting rowid ranges through SQL: it knows each unreadable
page's key range, which bounds the loss, and it reaches rows no key search can. Rows go into a
fresh file with the current schema; the FTS indexes, the search index, ``search_cjk`` and
``schema_version`` are rebuilt, never copied, and the four runtime ledgers are reported but not
copied (a partial ledger could replay started work or adopt another owner's worker).
"""

from __future__ import annotations

import bisect
import contextlib
import datetime
import functools
import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import hermes_state_fileformat as ff
import hermes_state_fts as fts
import hermes_state_rank as rank
from hermes_state_common import (
    DB_FILENAME,
    DELIVERY_OBLIGATIONS_SQL,
    FTS_SQL,
    INDEXES_SQL,
    RUNTIME_LEDGER_TABLES,
    SCHEMA_VERSION,
    TABLES_SQL,
    clean_optional,
    configure_connection,
    get_hermes_home,
    hermes_root,
    journal_path,
    prepare_db_file,
    quote_identifier,
    refuse_symlinks,
    resolve_profile_home,
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
    hot_journal_error,
    is_corruption_error,
    is_hot_journal_error,
    is_sqlite_lock_error,
)
from hermes_state_lockowners import describe_lock_holders, lock_holders
from hermes_state_messages import (
    MESSAGE_FIELDS,
    SELECT_MESSAGES_SQL,
    get_messages,
    insert_message,
    message_fields,
    row_to_message,
)
from hermes_state_quarantine import clear_marker
from hermes_state_schema import (
    WriteFn,
    expected_columns,
    read_version,
    restore_data_invariants,
)
from hermes_state_sessions import get_model_usage, get_session, search_sessions, session_columns
from hermes_state_testguard import check_test_isolation

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
    "recover_state_db",
    "snapshot_dir",
    "collect_profile_stats",
]

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
    """Every session (optionally of one source, archived ones included), oldest first,
    exported as above."""
    sessions = search_sessions(conn, source=source, limit=-1, include_archived=True)
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
        spool = configure_connection(
            sqlite3.connect(Path(tmp) / "spool.db", isolation_level=None)
        )
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
    for p in (path, *sidecar_paths(path), journal_path(path)):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _connect(
    path: Path, mode: str, *, immutable: bool = False, timeout: float = _BUSY_TIMEOUT_S
) -> sqlite3.Connection:
    """A maintenance connection on a store, a snapshot or a working copy."""
    uri = f"{path.as_uri()}?mode={mode}&nofollow=1" + ("&immutable=1" if immutable else "")
    return configure_connection(sqlite3.connect(
        uri, uri=True, isolation_level=None, check_same_thread=False, timeout=timeout
    ))


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


def _copy_into(src: sqlite3.Connection, dest: Path) -> sqlite3.Connection:
    """Copy the database of ``src`` into the new file ``dest`` with the backup API and return
    a connection on the copy. One backup step: a consistent snapshot read through the WAL,
    while writers carry on (a stepwise backup would restart after every foreign write)."""
    dst = configure_connection(
        sqlite3.connect(dest, isolation_level=None, check_same_thread=False)
    )
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
    conn = _connect(db_path, "ro")
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
    conn = _connect(db_path, "rw", timeout=_EXCLUSIVE_BUSY_TIMEOUT_S)
    try:
        conn.execute("PRAGMA locking_mode = EXCLUSIVE")
        pages = _page_count(conn)  # the first read: a hot journal is rolled back here
        conn.execute("BEGIN EXCLUSIVE")  # (which writes page 1 of an empty file)
        conn.execute("COMMIT")
    except BaseException as exc:
        conn.close()
        if not isinstance(exc, sqlite3.Error):
            raise
        if is_sqlite_lock_error(exc):
            raise _in_use_error(db_path) from exc
        if is_corruption_error(exc):
            raise StateDbCorruptError(f"{db_path} is damaged: {exc}", path=db_path) from exc
        raise HermesStateError(f"{db_path} cannot be taken for maintenance: {exc}") from exc
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
def _exclusive(db_path: Path, *, create: bool = False) -> Iterator[_Exclusive]:
    """Hold the admission lock (one maintenance run at a time) and the live store itself for
    the whole block (``create``: an empty private file first, when there is none).
    :class:`StateDbInUseError` when either is taken; a damaged store is
    :class:`StateDbCorruptError`."""
    with fts.admission_lock(db_path) as admitted:
        if not admitted:
            raise StateDbInUseError(
                f"another maintenance run holds the admission lock of {db_path}", path=db_path
            )
        if create:
            prepare_db_file(db_path)
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
    return _quick_check(live)


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
    :class:`StateDbCorruptError` names it. Works while writers are running; a store with a
    hot journal cannot be read until a writable open rolls it back (``hot_journal``)."""
    with _reading(_existing_db(db_path)) as src:
        path, check = _snapshot(src, dest)
    if check != ["ok"]:
        raise StateDbCorruptError(
            f"the snapshot of {path} fails quick_check: {'; '.join(check[:3])}", path=path
        )
    return path


def _snapshot(
    src: sqlite3.Connection, dest: str | os.PathLike[str] | None
) -> tuple[Path, list[str]]:
    """Copy the database of ``src`` into a new snapshot file; its path and quick_check."""
    if dest is None:
        target = _unique_snapshot_path(snapshot_dir(), "state")
    else:
        target = _new_private_file(Path(dest).expanduser().absolute())
    try:
        conn = _copy_into(src, target)
        try:
            conn.execute("PRAGMA journal_mode = DELETE")
            return target, _quick_check(conn)
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
    say = progress or _no_progress
    snap = _existing_db(snapshot)
    target = Path(db_path).expanduser().absolute()
    check_test_isolation(target)
    refuse_symlinks(target)
    if target.exists() and snap.resolve() == target.resolve():
        raise HermesStateError(f"{snap} is the database to restore, not a snapshot of it")
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
        with _exclusive(target, create=True) as held:
            report["rolled_back_journal"] = held.rolled_back_journal
            if held.pages > 0:
                say("saving the current store", 0, None)
                report["previous_snapshot"] = str(_snapshot(held.conn, None)[0])
            report["quick_check"] = _promote(src, held.conn, say)
            clear_marker(target)
            report["row_counts"] = row_counts(held.conn)
        return report
    finally:
        src.close()


# =============================================================================================
# Repair
# =============================================================================================


def health_report(conn: sqlite3.Connection) -> dict[str, Any]:
    """The health of the database behind ``conn`` (a private copy: the FTS check is run as a
    write, rolled back): ``integrity`` (PRAGMA integrity_check lines), ``fts_integrity`` (per
    index, None when clean), ``search_index`` (its damage, None when none), ``fts_stale`` (the
    marker), ``fts_rebuilding``, ``triggers``
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
        conn.execute("BEGIN IMMEDIATE")
        try:
            search_index = rank.index_problem(conn)
        finally:
            conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        search_index = f"{type(exc).__name__}: {exc}"
    if search_index is not None:
        problems.append(f"search index: {search_index}")
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
        "search_index": search_index,
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
            rank.drop_index(conn)
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
    return configure_connection(
        sqlite3.connect(work, isolation_level=None, check_same_thread=False)
    )


# A private copy has no other writer to make wait: bigger chunks than a live rebuild's.
_REBUILD_CHUNK_ROWS = 5000


def _rebuild_indexes(
    conn: sqlite3.Connection, progress: Progress, *, defer: bool = False
) -> None:
    """Create the FTS objects of the current schema and the search index, and fill them in
    chunks (the FTS rebuild also recomputes ``search_cjk``); clears every FTS marker on the
    way. With ``defer`` the indexes are left empty with their rebuild and fill due: the first
    writable open of the file fills them in the background while searches use the canonical
    rows."""
    with transaction(conn):
        for statement in split_sql(INDEXES_SQL + FTS_SQL):
            conn.execute(statement)
        total = fts.start_rebuild(conn)
        rank.create_index(conn)
    if defer:
        return
    for label, chunk in (("rebuilding FTS", fts.rebuild_chunk), ("filling the search index",
                                                                 rank.fill_chunk)):
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

    1. a snapshot in ``state-snapshots/`` (``backup=True``) — kept whatever happens;
    2. a working copy (backup API) on which the FTS objects are dropped, the file VACUUMed
       (rebuilding every ordinary index and dropping orphaned pages) and the FTS indexes,
       triggers and markers rebuilt; canonical rows are never deleted;
    3. the checks on the working copy, which must pass with every row count unchanged;
    4. only then the working copy is written onto the live file with the backup API, and a
       durable quarantine marker of the file is cleared.

    A store that is already healthy is left alone. When the checks fail, or the canonical
    tables cannot be read, nothing is promoted and ``kept`` lists the live file and the
    backup. Taking the store rolls back a hot journal an interrupted write left behind
    (``rolled_back_journal``), before anything is copied.
    """
    path = _existing_db(db_path)
    say = progress or _no_progress
    report: dict[str, Any] = {"db_path": str(path), "check_only": check_only}
    if check_only:
        report["in_use_by"] = describe_lock_holders(path)
        with tempfile.TemporaryDirectory(prefix="hermes-check-") as tmp:
            try:
                with _reading(path) as src:
                    conn = _copy_into(src, Path(tmp) / "check.db")
            except sqlite3.Error as exc:
                return {**report, **_unreadable(exc)}
            try:
                report.update(health_report(conn))
            finally:
                conn.close()
        return report
    with contextlib.ExitStack() as stack:
        try:
            held = stack.enter_context(_exclusive(path))
        except StateDbCorruptError as exc:
            cause = exc.__cause__ if isinstance(exc.__cause__, sqlite3.Error) else exc
            return {**report, **_unreadable(cause), "promoted": False, "kept": [str(path)]}
        report["rolled_back_journal"] = held.rolled_back_journal
        return _repair_held(held.conn, path, report, backup=backup, say=say)


def _repair_held(
    live: sqlite3.Connection,
    path: Path,
    report: dict[str, Any],
    *,
    backup: bool,
    say: Progress,
) -> dict[str, Any]:
    """The repair proper, on the live store ``live`` held exclusively."""
    snapshots = snapshot_dir()
    snapshots.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tempfile.TemporaryDirectory(prefix=".repair-", dir=snapshots) as tmp:
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
            if backup:
                snap, check = _snapshot(live, None)
                report["backup"] = str(snap)
                report["backup_quick_check"] = check
            conn, after, error = _repair_copy(work, conn, before["row_counts"], say)
            report["after"] = after
            if error is not None:
                kept = [str(path)] + ([report["backup"]] if backup else [])
                return {**report, "error": error, "repaired": False, "promoted": False,
                        "kept": kept}
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


# =============================================================================================
# Recover
# =============================================================================================

# Derived or rebuilt, never copied: the FTS indexes (and their shadow tables), the search
# index, the version row.
_REBUILT = (*fts.FTS_TABLES, *rank.INDEX_TABLES, "schema_version")
# state_meta keys that describe the old file's FTS indexes, not the recovered one's.
_FTS_MARKERS = (fts.STALE_KEY, fts.HIGH_WATER_KEY, fts.PROGRESS_KEY)
_INSERT_BATCH = 500
_COPY_ORDER = ("sessions", "messages", "session_model_usage")


def _affinity(declared: str) -> str:
    """SQLite's column affinity rules (datatype3 §3.1)."""
    decl = (declared or "").upper()
    if "INT" in decl:
        return "INTEGER"
    if any(t in decl for t in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if not decl or "BLOB" in decl:
        return "BLOB"
    if any(t in decl for t in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


@dataclass
class _TableShape:
    """A table's columns as the records on disk store them."""

    name: str
    columns: list[str]
    affinities: list[str]
    required: list[bool]  # NOT NULL without a default, or the primary key
    ipk: int | None  # the INTEGER PRIMARY KEY column (stored as NULL: the rowid is the value)
    rowid: bool = True
    root: int | None = None

    @property
    def min_values(self) -> int:
        """Records never hold fewer values than the last required column (later columns are
        added with ALTER TABLE ADD COLUMN and may be missing from older records)."""
        last = [i for i, r in enumerate(self.required) if r and i != self.ipk]
        return last[-1] + 1 if last else 1

    def row(self, rowid: int, values: list[Any]) -> list[Any]:
        """Record values as SQLite would return them: the rowid in the INTEGER PRIMARY KEY
        column, REAL-affinity integers as floats."""
        out = list(values)
        if self.ipk is not None and self.ipk < len(out):
            out[self.ipk] = rowid
        for i, value in enumerate(out):
            if self.affinities[i] == "REAL" and isinstance(value, int):
                out[i] = float(value)
        return out

    def fits(self, values: list[Any]) -> bool:
        """Could this record belong to this table? (Used for pages no tree reaches.)"""
        if not self.min_values <= len(values) <= len(self.columns):
            return False
        for i, value in enumerate(values):
            if i == self.ipk:
                if value is not None:
                    return False
                continue
            if value is None:
                if self.required[i]:
                    return False
                continue
            affinity = self.affinities[i]
            if affinity == "TEXT" and not isinstance(value, str):
                return False
            if affinity == "INTEGER" and not isinstance(value, int):
                return False
            if affinity == "REAL" and not isinstance(value, (int, float)):
                return False
        return True


def _shape_from_sql(name: str, sql: str | None) -> _TableShape | None:
    """The shape of a table from its CREATE TABLE statement, parsed by SQLite in memory."""
    if not sql or not sql.lstrip().upper().startswith("CREATE TABLE"):
        return None
    mem = sqlite3.connect(":memory:")
    try:
        mem.execute(sql)
        info = mem.execute("SELECT * FROM pragma_table_info(?)", (name,)).fetchall()
        listed = mem.execute("SELECT wr FROM pragma_table_list WHERE name = ?", (name,)).fetchone()
    except sqlite3.Error:
        return None
    finally:
        mem.close()
    if not info:
        return None
    pks = [r for r in info if r[5]]
    ipk = None
    if len(pks) == 1 and str(pks[0][2]).upper() == "INTEGER":
        ipk = pks[0][0]
    return _TableShape(
        name=name,
        columns=[r[1] for r in info],
        affinities=[_affinity(r[2]) for r in info],
        required=[bool(r[3] and r[4] is None) or bool(r[5]) for r in info],
        ipk=ipk,
        rowid=not (listed and listed[0]),
    )


def _current_shapes() -> dict[str, _TableShape]:
    """The shapes of the current schema's tables (and delivery_obligations)."""
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(TABLES_SQL + DELIVERY_OBLIGATIONS_SQL)
        rows = mem.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
    finally:
        mem.close()
    shapes = {n: _shape_from_sql(n, s) for n, s in rows if not n.startswith("sqlite_")}
    return {n: s for n, s in shapes.items() if s is not None}


@dataclass
class _ViewTally:
    """What one view of the source gave a table: rows read, rows only it holds (no newer
    view has their rowid), how many of those were copied or refused, and some of their ids."""

    read: int = 0
    only_here: int = 0
    copied: int = 0
    refused: int = 0
    ids: list[int] = field(default_factory=list)


@dataclass
class _TableReport:
    name: str
    shape: _TableShape
    found: int = 0
    copied: int = 0
    rejected: int = 0
    skipped: int = 0
    source_count: int | None = None
    method: str = "sql"
    error: str | None = None
    last_sql_rowid: int | None = None
    bad_pages: list[ff.BadPage] = field(default_factory=list)
    page_rowids: set[int] = field(default_factory=set)
    orphan_pages: int = 0
    rejections: list[str] = field(default_factory=list)
    excluded: bool = False
    unknown: bool = False
    sql: str | None = None
    views: dict[str, _ViewTally] = field(default_factory=dict)
    duplicates: int = 0
    impossible: list[int] = field(default_factory=list)
    impossible_count: int = 0

    @property
    def damaged(self) -> bool:
        return self.error is not None or bool(self.bad_pages)


# The views of a source, in the order their rows are taken: the main file with the verified
# commits of its -wal folded in, the main file alone, and (only where a damaged -wal frame's
# page is not rewritten by a later commit) the first view with the damaged frames' own,
# unverified content applied.
# Last comes the main file as the interrupted transaction left it, where a damaged rollback
# journal record could not restore a page (the other views read that page as blank).
VIEW_WAL, VIEW_FILE, VIEW_DAMAGED = "file+wal", "file", "damaged-wal-frames"
VIEW_TORN = "unrestored-journal-pages"
_VIEW_WORDS = {
    VIEW_FILE: "the main file",
    VIEW_DAMAGED: "the unverified content of damaged -wal frames",
    VIEW_TORN: "the pages a damaged rollback journal could not restore",
}


class _View:
    """One reading of the source: a private image file, the file-format reader on it and an
    SQLite connection on it (``immutable=1``: the image is private and never changes)."""

    def __init__(self, name: str, path: Path, page_size: int | None, notes: list[str]) -> None:
        self.name = name
        self.path = path
        self.notes = notes
        self.image = ff.DatabaseImage(path, page_size=page_size)
        self.sql: sqlite3.Connection | None = None
        try:
            self.sql = _connect(path, "ro", immutable=True)
            self.sql.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            notes.append(f"SQLite cannot open the source ({name}): {exc}")
            if self.sql is not None:
                self.sql.close()
            self.sql = None

    def close(self) -> None:
        if self.sql is not None:
            self.sql.close()
        self.image.close()


def _journal_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + "-journal")


class _Source:
    """The private images of the source, never the source itself.

    The main file is copied byte for byte and a hot rollback journal rolled back on the copy,
    so what follows reads the committed state, never the uncommitted pages an interrupted
    transaction (a killed restore or repair promotion) left in the main file. When the -wal
    holds commits, a second copy gets them folded in (past a damaged frame, where later
    commits verify): that is the newest view, and the main file alone is read too, because a
    WAL written over damage can replace pages the main file still holds intact."""

    def __init__(self, source: Path, workdir: Path) -> None:
        self.notes: list[str] = []
        base = workdir / "main.db"
        self.unreadable_bytes = _copy_bytes(source, base)
        # The -wal is read from a private copy too: scanned, folded and compared as one file.
        self.wal_path = workdir / "source.db-wal"
        wal = sidecar_paths(source)[0]
        if wal.is_file():
            self.unreadable_bytes += _copy_bytes(wal, self.wal_path)
        if self.unreadable_bytes:
            self.notes.append(f"{self.unreadable_bytes} bytes of the source could not be read")
        self.journal = ff.roll_back_journal(_journal_path(source), base)
        self.notes += self.journal.notes
        torn = self._set_aside_unrestored(base, workdir / "torn.db")
        scan = ff.scan_wal(self.wal_path)
        self.wal = ff.WalFold(page_size=scan.page_size, scan=scan, notes=list(scan.notes))
        self.wal_rows: dict[str, int] = {}
        self.views: list[_View] = []
        try:
            if scan.applied_frames(salvage=True):
                image = workdir / "image.db"
                shutil.copyfile(base, image)
                self.wal = ff.fold_wal(self.wal_path, image, scan=scan)
                if scan.problem:
                    self.wal_rows = ff.wal_damage_rows(base, self.wal_path, scan)
                self.views.append(_View(VIEW_WAL, image, self.wal.page_size, self.notes))
            self.notes += self.wal.notes
            self.views.append(_View(VIEW_FILE, base, self.wal.page_size, self.notes))
            if self.wal.unreplaced:
                damaged = workdir / "damaged.db"
                shutil.copyfile(base, damaged)
                ff.fold_wal(self.wal_path, damaged, unverified=True, scan=scan)
                self.views.append(_View(VIEW_DAMAGED, damaged, self.wal.page_size, self.notes))
            if torn is not None:
                self.views.append(_View(VIEW_TORN, torn, self.journal.page_size, self.notes))
        except BaseException:
            self.close()
            raise

    def _set_aside_unrestored(self, base: Path, torn: Path) -> Path | None:
        """Where damaged journal records left pages unrestored, those pages may hold the
        interrupted transaction's content: keep a copy as it is for a last view, and blank
        them in ``base`` (page 1 excepted: without it nothing reads), so that no row of
        theirs can pass for a committed one."""
        journal = self.journal
        pages = sorted({p for _, p in journal.damaged
                        if 1 < p <= (journal.initial_pages or 0)})
        if not pages or journal.page_size is None:
            return None
        shutil.copyfile(base, torn)
        fd = os.open(base, os.O_WRONLY)
        try:
            for pgno in pages:
                os.pwrite(fd, bytes(journal.page_size), (pgno - 1) * journal.page_size)
        finally:
            os.close(fd)
        return torn

    @property
    def primary(self) -> _View:
        return self.views[0]

    def close(self) -> None:
        for view in self.views:
            view.close()


def _copy_bytes(source: Path, dest: Path, chunk: int = 1 << 20) -> int:
    """Copy ``source`` byte for byte into the new private file ``dest``; ranges the disk
    cannot read (EIO) become zeros, page by page. Returns the number of unreadable bytes."""
    lost = 0
    src = os.open(source, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        dst = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            size = os.fstat(src).st_size
            for offset in range(0, size, chunk):
                want = min(chunk, size - offset)
                try:
                    data = os.pread(src, want, offset)
                except OSError:
                    parts = []
                    for sub in range(offset, offset + want, 4096):
                        n = min(4096, offset + want - sub)
                        try:
                            parts.append(os.pread(src, n, sub))
                        except OSError:
                            parts.append(bytes(n))
                            lost += n
                    data = b"".join(parts)
                os.pwrite(dst, data, offset)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    return lost


def _read_schema(view: _View) -> tuple[list[tuple[Any, ...]], str]:
    """sqlite_master's rows (type, name, tbl_name, rootpage, sql) and how they were read."""
    if view.sql is not None:
        try:
            rows = view.sql.execute(
                "SELECT type, name, tbl_name, rootpage, sql FROM sqlite_master"
            ).fetchall()
            return rows, "sql"
        except sqlite3.Error as exc:
            view.notes.append(f"the schema cannot be read by SQLite ({view.name}): {exc}")
    rows = ff.schema_rows(view.image)
    return rows, ("pages" if rows else "none")


@dataclass
class _Plan:
    """What to do with each table of the source."""

    copy: dict[str, _TableReport]
    excluded: dict[str, _TableReport]
    schema_method: str
    index_roots: list[int]
    table_roots: list[int]
    source_seq: dict[str, int]
    max_rowid: dict[str, int] = field(default_factory=dict)

    def reports(self) -> list[_TableReport]:
        return [*self.copy.values(), *self.excluded.values()]


def _max_rowids(view: _View, reports: Iterable[_TableReport]) -> dict[str, int]:
    """The largest rowid of each rowid table, where SQLite can seek it (the rightmost path)."""
    found: dict[str, int] = {}
    if view.sql is None:
        return found
    for report in reports:
        if not report.shape.rowid:
            continue
        with contextlib.suppress(sqlite3.Error):
            top = view.sql.execute(
                f"SELECT MAX(rowid) FROM {quote_identifier(report.name)}").fetchone()[0]
            if isinstance(top, int):
                found[report.name] = top
    return found


def _plan(src: _View) -> _Plan:
    entries, method = _read_schema(src)
    current = _current_shapes()
    virtual = {n for t, n, _, _, sql in entries if t == "table" and sql
               and sql.lstrip().upper().startswith("CREATE VIRTUAL")}
    copy: dict[str, _TableReport] = {}
    excluded: dict[str, _TableReport] = {}
    index_roots, table_roots = [], []
    for kind, name, _tbl, root, sql in entries:
        if kind == "index" and isinstance(root, int) and root > 0:
            index_roots.append(root)
        if kind != "table" or not isinstance(root, int):
            continue
        if root > 0:
            table_roots.append(root)
        if (
            name in virtual
            or name.startswith("sqlite_")
            or name in _REBUILT
            or any(name.startswith(v + "_") for v in virtual)
            or name.startswith("messages_fts")
        ):
            continue
        shape = _shape_from_sql(name, sql) or current.get(name)
        if shape is None:
            continue
        shape.root = root if root > 0 else None
        report = _TableReport(name, shape, sql=sql)
        if name in RUNTIME_LEDGER_TABLES:
            report.excluded = True
            excluded[name] = report
        else:
            report.unknown = name not in current
            copy[name] = report
    if method == "none":
        # No schema at all: every current table is looked for, by shape, among all pages.
        for name, shape in current.items():
            if name in _REBUILT:
                continue
            report = _TableReport(name, shape, method="pages", error="schema unreadable")
            (excluded if name in RUNTIME_LEDGER_TABLES else copy)[name] = report
            report.excluded = name in RUNTIME_LEDGER_TABLES
    seq: dict[str, int] = {}
    if src.sql is not None and method == "sql":
        with contextlib.suppress(sqlite3.Error):
            seq = {n: int(s) for n, s in src.sql.execute("SELECT name, seq FROM sqlite_sequence")}
    ordered = dict(sorted(copy.items(), key=lambda kv: (
        _COPY_ORDER.index(kv[0]) if kv[0] in _COPY_ORDER else len(_COPY_ORDER), kv[0])))
    plan = _Plan(ordered, excluded, method, index_roots, table_roots, seq)
    plan.max_rowid = _max_rowids(src, plan.reports())
    return plan


def _sql_rows(src: _View, report: _TableReport) -> Iterator[tuple[int | None, list[Any]]]:
    """The table through SQLite, until the first error (then ``report.error`` says why)."""
    if src.sql is None or report.error is not None:
        report.error = report.error or "SQLite cannot open the source"
        return
    shape = report.shape
    columns = ", ".join(quote_identifier(c) for c in shape.columns)
    rowid = "rowid, " if shape.rowid else "NULL, "
    try:
        report.source_count = src.sql.execute(
            f"SELECT COUNT(*) FROM {quote_identifier(report.name)}"
        ).fetchone()[0]
    except sqlite3.Error:
        report.source_count = None
    try:
        for row in src.sql.execute(f"SELECT {rowid}{columns} FROM {quote_identifier(report.name)}"):
            report.last_sql_rowid = row[0]
            yield row[0], list(row[1:])
    except sqlite3.Error as exc:
        report.error = f"{type(exc).__name__}: {exc}"
        report.source_count = None


def _sql_rows_not_in(
    src: _View, report: _TableReport, taken: set[int]
) -> Iterator[tuple[int | None, list[Any]]]:
    """The rows of an older view that no newer view gave: the rowids are scanned first (a
    scan that decodes no column) and only the missing rows are read whole. Where SQLite
    cannot do that, the whole table is read (and from there, page by page)."""
    if src.sql is None or report.error is not None or not report.shape.rowid:
        yield from _sql_rows(src, report)
        return
    table = quote_identifier(report.name)
    try:
        missing = [r for (r,) in src.sql.execute(f"SELECT rowid FROM {table}") if r not in taken]
    except sqlite3.Error:
        yield from _sql_rows(src, report)
        return
    columns = ", ".join(quote_identifier(c) for c in report.shape.columns)
    for start in range(0, len(missing), _INSERT_BATCH):
        chunk = missing[start : start + _INSERT_BATCH]
        try:
            rows = src.sql.execute(
                f"SELECT rowid, {columns} FROM {table} WHERE rowid IN"
                f" ({', '.join('?' * len(chunk))})", chunk).fetchall()
        except sqlite3.Error as exc:
            report.error = f"{type(exc).__name__}: {exc}"  # the page walk reads the rest
            return
        for row in rows:
            yield row[0], list(row[1:])


def _page_rows(
    src: _View, report: _TableReport, claimed: set[int]
) -> Iterator[tuple[int, list[Any]]]:
    """The rest of a table SQLite stopped reading: its b-tree walked page by page."""
    shape = report.shape
    if shape.root is None or not shape.rowid:
        return
    report.method = "sql+pages" if report.last_sql_rowid is not None else "pages"
    floor = report.last_sql_rowid
    for item in ff.walk_table(src.image, shape.root, claimed):
        if isinstance(item, ff.BadPage):
            report.bad_pages.append(item)
            continue
        if floor is not None and item.rowid <= floor:
            continue
        try:
            values = ff.decode_record(item.payload, src.image.encoding)
        except ff.PageError as exc:
            report.bad_pages.append(ff.BadPage(item.pgno, str(exc), item.rowid - 1, item.rowid, 1))
            continue
        if len(values) > len(shape.columns):
            report.bad_pages.append(
                ff.BadPage(item.pgno, "record wider than the table", item.rowid - 1, item.rowid, 1)
            )
            continue
        report.page_rowids.add(item.rowid)
        yield item.rowid, shape.row(item.rowid, values)


def _orphan_rows(
    src: _View, plan: _Plan, claimed: set[int], damaged: list[_TableReport]
) -> Iterator[tuple[_TableReport, int, list[Any]]]:
    """Rows of leaf pages no b-tree reaches, attributed to the one damaged table whose
    shape every record of the page fits; ambiguous pages are left alone."""
    candidates = [r for r in damaged if r.shape.rowid]
    if not candidates:
        return
    for root in plan.index_roots:
        ff.walk_index(src.image, root, claimed)
    for root in plan.table_roots:
        for _ in ff.walk_table(src.image, root, claimed):
            pass
    freelist, _complete = ff.freelist_pages(src.image)
    claimed |= freelist
    for _pgno, cells, _bad in ff.iter_orphan_leaves(src.image, claimed):
        try:
            records = [(c.rowid, ff.decode_record(c.payload, src.image.encoding)) for c in cells]
        except ff.PageError:
            continue
        owners = [r for r in candidates if all(r.shape.fits(v) for _, v in records)]
        if len(owners) != 1:
            continue
        owner = owners[0]
        owner.orphan_pages += 1
        floor = owner.last_sql_rowid
        for rowid, values in records:
            if rowid in owner.page_rowids or (floor is not None and rowid <= floor):
                continue
            owner.page_rowids.add(rowid)
            yield owner, rowid, owner.shape.row(rowid, values)


def _loss(report: _TableReport, sequence: int | None, doubts: list[str]) -> dict[str, Any]:
    """Rows lost: exact where the file says so (the unreadable cells of a readable page),
    else estimated from the rowids missing in the key ranges of the unreadable pages; unknown
    where ``doubts`` say why no count can be trusted (the views disagree, the table's own
    count does not match, a sidecar could not be fully applied)."""
    if doubts:
        return {"lost": None, "lost_exact": False, "lost_basis": "; ".join(doubts)}
    if not report.damaged:
        return {"lost": 0, "lost_exact": True, "lost_basis": None}
    if report.method == "sql":
        return {"lost": None, "lost_exact": False,
                "lost_basis": "SQLite stopped reading and the table cannot be read page by page"}
    if report.shape.root is None:
        return {"lost": None, "lost_exact": False,
                "lost_basis": "the schema is lost: rows were found by shape, losses are unknown"}
    cells = sum(p.cells for p in report.bad_pages if p.cells is not None)
    ranges = [p for p in report.bad_pages if p.cells is None]
    if not ranges:
        return {"lost": cells, "lost_exact": True, "lost_basis": "unreadable cells"}
    rowids = sorted(report.page_rowids)
    top = max(sequence or 0, rowids[-1] if rowids else 0, report.last_sql_rowid or 0)
    gaps = 0
    for page in ranges:
        low = page.low if page.low is not None else 0
        high = page.high if page.high is not None else top
        if high > low:
            held = bisect.bisect_right(rowids, high) - bisect.bisect_right(rowids, low)
            gaps += max(0, (high - low) - held)
    return {
        "lost": gaps + cells,
        "lost_exact": False,
        "lost_basis": "rowids missing from the key ranges of unreadable pages "
        "(an upper bound: rows deleted before the damage count too)",
    }


class _Writer:
    """Inserts salvaged rows into the output in batches; a batch that violates a constraint
    is retried row by row so one bad row costs only itself. A message's ``search_cjk`` is
    left out: the index rebuild recomputes it (the source's is never trusted). Without an
    output it only counts (inspect-only, and the runtime ledgers)."""

    def __init__(self, out: sqlite3.Connection | None) -> None:
        self.out = out
        self._statements: dict[tuple[str, int], tuple[str, list[int]]] = {}

    def _statement(self, report: _TableReport, width: int) -> tuple[str, list[int]]:
        """The INSERT for records of ``width`` values, and which values it takes: the output
        table's columns, by name (older records are shorter; unknown columns are dropped)."""
        key = (report.name, width)
        if key not in self._statements:
            assert self.out is not None
            known = {
                r[0]
                for r in self.out.execute("SELECT name FROM pragma_table_info(?)", (report.name,))
            }
            keep = [
                i
                for i, c in enumerate(report.shape.columns[:width])
                if c in known and c != "search_cjk"
            ]
            names = ", ".join(quote_identifier(report.shape.columns[i]) for i in keep)
            sql = (
                f"INSERT INTO {quote_identifier(report.name)} ({names})"
                f" VALUES ({', '.join('?' * len(keep))})"
            )
            self._statements[key] = (sql, keep)
        return self._statements[key]

    def write(self, report: _TableReport, rows: list[list[Any]]) -> tuple[list[int], list[str]]:
        """Insert ``rows``: the indices of those inserted, and why the others were refused."""
        if self.out is None:
            return list(range(len(rows))), []
        groups: dict[str, list[tuple[int, list[Any]]]] = {}
        for index, values in enumerate(rows):
            sql, keep = self._statement(report, len(values))
            groups.setdefault(sql, []).append((index, [values[i] for i in keep]))
        inserted: list[int] = []
        refused: list[str] = []
        for sql, params in groups.items():
            try:
                with transaction(self.out):
                    self.out.executemany(sql, [one for _, one in params])
                inserted += [index for index, _ in params]
                continue
            except sqlite3.IntegrityError:
                pass
            for index, one in params:
                try:
                    with transaction(self.out):
                        self.out.execute(sql, one)
                    inserted.append(index)
                except sqlite3.IntegrityError as exc:
                    refused.append(str(exc))
        return inserted, refused


_IDS_KEPT = 100  # rowids listed in the report per kind, at most


class _Merge:
    """Every salvaged row passes here on its way to the output: each rowid once per table,
    the newest view first, so a row an older view also holds comes from the newer one and a
    row only an older view holds is still kept (and counted as such). Rowids no row of the
    table can have (≤ 0, or above a sane sequence; see :func:`_rowid_bounds`) are set aside
    and reported. A row a constraint refuses does not take its rowid: an older view's version
    may still fill it."""

    def __init__(self, writer: _Writer, counter: _Writer, bounds: Mapping[str, int],
                 newest: str, say: Progress) -> None:
        self.writer, self.counter = writer, counter
        self.bounds = bounds
        self.newest = newest
        self.say = say
        self.seen: dict[str, set[int]] = {}

    def copy(self, target: _TableReport, read: _TableReport, view: str,
             rows: Iterable[tuple[int | None, list[Any]]]) -> None:
        """Offer ``rows`` of ``read`` (the table as ``view`` holds it) to ``target``."""
        newest = view == self.newest
        seen = self.seen.setdefault(target.name, set())
        tally = target.views.setdefault(view, _ViewTally())
        high = self.bounds.get(target.name)
        check_low = not target.unknown
        batch: list[tuple[int | None, list[Any]]] = []
        for rowid, values in rows:
            tally.read += 1
            if newest:
                target.found += 1
                if target.found % 10000 == 0:
                    self.say(f"reading {target.name}", target.found, target.source_count)
            if target.name == "state_meta" and values and values[0] in _FTS_MARKERS:
                if newest:
                    target.skipped += 1
                continue
            if rowid is None:
                if not newest:
                    continue  # a row without a rowid cannot be matched across views
            elif rowid in seen:
                if newest:
                    target.duplicates += 1
                continue
            elif (check_low and rowid <= 0) or (high is not None and rowid > high):
                if len(target.impossible) < _IDS_KEPT:
                    target.impossible.append(rowid)
                target.impossible_count += 1
                read.page_rowids.discard(rowid)
                continue
            else:
                seen.add(rowid)  # taken now, so a second copy in this batch is a duplicate
            if not newest:
                tally.only_here += 1
                target.found += 1
            batch.append((rowid, values))
            if len(batch) >= _INSERT_BATCH:
                self._flush(target, tally, newest, batch)
                batch = []
        self._flush(target, tally, newest, batch)

    def _flush(self, target: _TableReport, tally: _ViewTally, newest: bool,
               batch: list[tuple[int | None, list[Any]]]) -> None:
        if not batch:
            return
        sink = self.counter if target.excluded else self.writer
        inserted, refused = sink.write(target, [values for _, values in batch])
        if refused:  # a refused row gives its rowid back: an older view's version may fit
            seen = self.seen[target.name]
            kept = set(inserted)
            seen.difference_update(
                rowid for i, (rowid, _) in enumerate(batch) if i not in kept and rowid is not None)
        if not newest:
            tally.ids += [rowid for rowid, _ in (batch[i] for i in inserted)
                          if rowid is not None][: max(0, _IDS_KEPT - len(tally.ids))]
        tally.copied += len(inserted)
        target.copied += len(inserted)
        if newest:
            target.rejected += len(refused)
            target.rejections += refused[: max(0, 5 - len(target.rejections))]
        else:
            tally.refused += len(refused)


def _rowid_bounds(plans: list[_Plan]) -> dict[str, int]:
    """The highest rowid each AUTOINCREMENT table can hold: its ``sqlite_sequence`` value
    (the highest any view has), where that is sane, i.e. at least the largest rowid SQLite
    finds in the table of every view that can seek it. A sequence damaged downwards would
    otherwise refuse genuine rows; one damaged upwards only bounds nothing."""
    bounds = {}
    for name in {n for plan in plans for n in plan.source_seq}:
        seq = max(plan.source_seq.get(name, 0) for plan in plans)
        tops = [plan.max_rowid[name] for plan in plans if name in plan.max_rowid]
        if seq > 0 and all(top <= seq for top in tops):
            bounds[name] = seq
    return bounds


def _same_columns(read: _TableShape, target: _TableShape) -> bool:
    """Records of ``read`` fit ``target`` position by position (columns are only ever added
    at the end, so an older table's columns are a prefix of the newer one's)."""
    shorter = min(len(read.columns), len(target.columns))
    return read.columns[:shorter] == target.columns[:shorter]


def _salvage(view: _View, vplan: _Plan, plan: _Plan, merge: _Merge, say: Progress) -> None:
    """Read every table of ``view`` into the merge: through SQLite, the rest of a table
    SQLite stops reading page by page, then the pages no tree reaches."""
    claimed: set[int] = set()
    targets: dict[str, _TableReport] = {}
    for read in vplan.reports():
        target = plan.copy.get(read.name) or plan.excluded.get(read.name)
        if target is None or not _same_columns(read.shape, target.shape):
            view.notes.append(f"table {read.name} as the {view.name} view holds it does not "
                              "match the newest schema; its rows there were not read")
            continue
        targets[read.name] = target
        rows = _sql_rows(view, read) if read is target else _sql_rows_not_in(
            view, read, merge.seen.get(read.name, set()))
        merge.copy(target, read, view.name, rows)
        if read.error is not None:
            where = "" if read is target else f" ({view.name})"
            say(f"reading {read.name} page by page{where}", target.found, None)
            merge.copy(target, read, view.name, _page_rows(view, read, claimed))
    damaged = [r for r in vplan.reports() if r.damaged and r.name in targets]
    if not damaged:
        return
    say("searching unreferenced pages", 0, None)
    pending: dict[str, tuple[_TableReport, list[tuple[int | None, list[Any]]]]] = {}
    for owner, rowid, values in _orphan_rows(view, vplan, claimed, damaged):
        batch = pending.setdefault(owner.name, (owner, []))[1]
        batch.append((rowid, values))
        if len(batch) >= _INSERT_BATCH:
            merge.copy(targets[owner.name], owner, view.name, pending.pop(owner.name)[1])
    for owner, rows_left in pending.values():
        merge.copy(targets[owner.name], owner, view.name, rows_left)


# Sessions referenced by recovered rows whose own row was lost get a placeholder row.
ORPHAN_SESSIONS_SQL = """
SELECT session_id, MIN(t0), MAX(t1), SUM(active) FROM (
    SELECT session_id, timestamp AS t0, timestamp AS t1, active FROM messages
    UNION ALL
    SELECT session_id, first_used_at, last_used_at, 0 FROM session_model_usage
)
WHERE session_id IS NOT NULL AND session_id NOT IN (SELECT id FROM sessions)
GROUP BY session_id
"""
PLACEHOLDER_SESSION_SQL = """
INSERT INTO sessions (id, source, started_at, ended_at, end_reason, message_count)
VALUES (?, 'recovered', ?, ?, 'recovered', ?)
"""


def _finish_output(
    out: sqlite3.Connection, plan: _Plan, say: Progress, defer_index: bool = False
) -> tuple[list[str], dict[str, Any]]:
    """Placeholders, sequences, data invariants, indexes, FTS rebuild, version, checks."""
    now = datetime.datetime.now(datetime.UTC).timestamp()
    with transaction(out):
        orphans = out.execute(ORPHAN_SESSIONS_SQL).fetchall()
        out.executemany(
            PLACEHOLDER_SESSION_SQL,
            [(sid, t0 if t0 is not None else now, t1, n or 0) for sid, t0, t1, n in orphans],
        )
        for name, seq in plan.source_seq.items():
            if name not in plan.copy or not table_exists(out, name):
                continue
            row = out.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (name,)).fetchone()
            if row is None:
                out.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (name, seq))
            elif row[0] < seq:
                out.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = ?", (seq, name))
        restore_data_invariants(out)
        outbox = plan.copy.get("delivery_obligations")
        if plan.schema_method == "none" and outbox is not None and not outbox.copied:
            out.execute("DROP TABLE delivery_obligations")  # created lazily: only with rows
    _rebuild_indexes(out, say, defer=defer_index)
    checks: dict[str, Any] = {"fts_rebuild": "deferred" if defer_index else "done"}
    with transaction(out):
        out.execute("DELETE FROM schema_version")
        out.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
    mode = out.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    checks.update(journal_mode=mode, quick_check=_quick_check(out))
    out.execute("BEGIN IMMEDIATE")
    try:
        checks["fts_integrity"] = fts.integrity_report(out, against_content=False)
    finally:
        out.execute("ROLLBACK")
    return [r[0] for r in orphans], checks


def recover_state_db(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    inspect_only: bool = False,
    defer_index: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Salvage what the session store at ``source`` still holds into a fresh database.

    The output's FTS indexes are rebuilt before it is published, unless ``defer_index``:
    then they are left to the first writable open (in the background, searches answering
    from canonical rows meanwhile), which gets a large store back in service sooner.

    ``output`` (default ``get_hermes_home()/state-recovered-<UTC timestamp>.db``) must not
    exist; it appears only when complete. With ``inspect_only`` nothing is written anywhere
    but a private temporary directory, and the report says what a recover would copy.
    The source is never written to and never opened by SQLite; nothing is created beside it
    but the output, when asked for there (its working directory is the output's).

    The report: ``tables`` — per copied table ``found`` (rows read), ``copied``, ``rejected``
    (constraint violations), ``lost`` with ``lost_exact``/``lost_basis`` (an estimate unless
    exact; None when it cannot be counted), ``method`` (``sql`` or ``sql+pages``/``pages``
    when the file format had to be read), ``sources`` (rows copied from each view),
    ``only_in`` (per older view: rows only it holds, kept, and some of their ids),
    ``impossible_ids`` (found, not copied), ``verified`` (counts match; ``unverified`` says
    why not); ``excluded`` — the runtime ledgers, found but not copied; ``views`` (what was
    read, newest first); ``journal`` (None, or what the hot rollback journal's rollback
    restored and what it could not); ``wal`` (frames applied, and a damaged frame with the
    commits, frames and rows after it); ``notes`` (plain sentences on all of it);
    ``verified`` and ``output_verified`` (the output holds what was written); ``rebuilt``;
    ``placeholder_sessions`` (sessions whose row was lost but whose messages were not);
    ``readable`` (False only when nothing at all could be read).
    """
    src_path = Path(source).expanduser().absolute()
    check_test_isolation(src_path)
    if not src_path.is_file():
        raise StateDbUnavailableError(
            f"no database file at {src_path}", reason="uninitialized", path=src_path
        )
    own = [h for h in lock_holders(src_path, exclude_pids=()) if h.pid == os.getpid()]
    if own:
        raise StateDbInUseError(
            f"this process has {src_path} open; recover must run where it is closed "
            "(closing a descriptor would drop this process's locks on it)",
            path=src_path,
        )
    say = progress or _no_progress
    out_path: Path | None = None
    if not inspect_only:
        out_path = Path(output).expanduser().absolute() if output is not None else (
            get_hermes_home() / f"state-recovered-{_utc_stamp()}.db"
        )
        if out_path.resolve() in {p.resolve() for p in (src_path, *sidecar_paths(src_path))}:
            raise HermesStateError(f"the output {out_path} would overwrite the source")
        if out_path.exists() or out_path.is_symlink():
            raise HermesStateError(f"the output {out_path} already exists")
        out_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    workdir = out_path.parent if out_path is not None else None
    with tempfile.TemporaryDirectory(prefix=".hermes-recover-", dir=workdir) as tmp:
        say("copying the source", 0, None)
        src = _Source(src_path, Path(tmp))
        try:
            return _recover(src, src_path, out_path, Path(tmp), say, defer_index)
        finally:
            src.close()


def _recover(
    src: _Source, src_path: Path, out_path: Path | None, tmp: Path, say: Progress,
    defer_index: bool = False,
) -> dict[str, Any]:
    plan = _plan(src.primary)
    older = [(view, _plan(view)) for view in src.views[1:]]
    partial = tmp / "output.db"
    out: sqlite3.Connection | None = None
    if out_path is not None:
        prepare_db_file(partial)
        out = configure_connection(sqlite3.connect(partial, isolation_level=None))
        out.execute("PRAGMA journal_mode = MEMORY")
        out.execute("PRAGMA synchronous = OFF")
        ddl = TABLES_SQL + (DELIVERY_OBLIGATIONS_SQL if "delivery_obligations" in plan.copy else "")
        for statement in split_sql(ddl):
            out.execute(statement)
        for report in [r for r in plan.copy.values() if r.unknown]:
            try:  # a table this schema does not know is copied with its own definition
                out.execute(report.sql or "")
            except sqlite3.Error as exc:
                del plan.copy[report.name]
                src.notes.append(f"table {report.name} was not copied: {exc}")
    bounds = _rowid_bounds([plan, *(p for _, p in older)])
    merge = _Merge(_Writer(out), _Writer(None), bounds, src.primary.name, say)
    try:
        _salvage(src.primary, plan, plan, merge, say)
        for view, vplan in older:
            say(f"reading the {view.name} view", 0, None)
            _salvage(view, vplan, plan, merge, say)
        placeholders: list[str] = []
        checks: dict[str, Any] = {}
        if out is not None:
            placeholders, checks = _finish_output(out, plan, say, defer_index)
        result = _assemble(src, src_path, out_path, plan, out, placeholders, checks, bounds)
        if out is not None and out_path is not None:
            out.close()
            out = None
            _publish(partial, out_path)
        return result
    finally:
        if out is not None:
            out.close()


def _publish(partial: Path, output: Path) -> None:
    """Make the finished output durable, then give it its name (never over an existing file)."""
    fd = os.open(partial, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.link(partial, output)
    partial.unlink()
    dir_fd = os.open(output.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _doubts(src: _Source, report: _TableReport, primary: str) -> list[str]:
    """Why the rows lost from this table cannot be counted exactly, even where every page
    read (plain sentences, for the report)."""
    doubts = []
    for view, tally in report.views.items():
        if view != primary and tally.copied:
            doubts.append(f"the views of the source disagree: {tally.copied} rows only "
                          f"{_VIEW_WORDS[view]} holds were kept; rows no view holds cannot be "
                          "counted")
    read = report.views.get(primary, _ViewTally()).read
    if report.source_count is not None and report.source_count != read:
        doubts.append(f"SQLite counts {report.source_count} rows in the table but its b-tree "
                      f"yields {read}")
    if report.impossible_count:
        doubts.append(f"{report.impossible_count} rows with impossible ids were found "
                      "(pages reused or damaged)")
    if src.journal.damaged or src.journal.header_damaged:
        doubts.append("the rollback journal could not be fully rolled back")
    if src.wal.unreplaced:
        doubts.append("pages of damaged -wal frames kept their older content")
    return doubts


# The output's own FTS markers (a deferred rebuild sets them) are not rows recover copied.
OUTPUT_META_COUNT_SQL = (
    f"SELECT COUNT(*) FROM state_meta WHERE key NOT IN ({', '.join('?' * len(_FTS_MARKERS))})"
)


def _output_count(out: sqlite3.Connection, table: str) -> int:
    """Rows of ``table`` in the output that recover wrote there."""
    if not table_exists(out, table):
        return 0
    if table == "state_meta":
        return int(out.execute(OUTPUT_META_COUNT_SQL, _FTS_MARKERS).fetchone()[0])
    return int(out.execute(f"SELECT COUNT(*) FROM {quote_identifier(table)}").fetchone()[0])


def _table_entry(
    src: _Source, report: _TableReport, out: sqlite3.Connection | None, plan: _Plan,
    placeholders: int,
) -> dict[str, Any]:
    primary = src.primary.name
    entry: dict[str, Any] = {"found": report.found}
    if not report.excluded:
        entry["copied"] = report.copied if out is not None else None
        entry["rejected"] = report.rejected
        if report.skipped:
            entry["skipped"] = report.skipped
    entry.update(_loss(report, plan.source_seq.get(report.name), _doubts(src, report, primary)))
    entry["method"] = report.method
    entry["source_count"] = report.source_count
    entry["sources"] = {view: tally.copied for view, tally in report.views.items()}
    only_in = {view: {"found": tally.only_here,
                      "copied": tally.copied if out is not None else None,
                      "refused": tally.refused, "ids": tally.ids}
               for view, tally in report.views.items() if view != primary and tally.only_here}
    if only_in:
        entry["only_in"] = only_in
    if report.duplicates:
        entry["duplicates"] = report.duplicates
    if report.impossible_count:
        entry["impossible_ids"] = {"count": report.impossible_count, "ids": report.impossible}
    if report.error is not None:
        entry["error"] = report.error
    if report.bad_pages:
        entry["unreadable_pages"] = sorted({p.pgno for p in report.bad_pages})[:100]
    if report.orphan_pages:
        entry["unreferenced_pages_read"] = report.orphan_pages
    if report.rejections:
        entry["rejections"] = report.rejections
    if report.unknown:
        entry["unknown_table"] = True
    problems = []
    if out is not None and not report.excluded:
        entry["output_count"] = _output_count(out, report.name)
        expected = report.copied + (placeholders if report.name == "sessions" else 0)
        if entry["output_count"] != expected:
            entry["output_verified"] = False
            problems.append(f"the output holds {entry['output_count']} rows where {expected} "
                            "were written")
    read = report.views.get(primary, _ViewTally()).read
    if report.source_count is not None and report.source_count != read:
        problems.append(f"SQLite counts {report.source_count} rows in the source's table "
                        f"but reading it yields {read}")
    if out is not None or report.source_count is not None:
        entry["verified"] = not problems
    if problems:
        entry["unverified"] = problems
    return entry


def _journal_entry(src: _Source, in_use: bool) -> dict[str, Any] | None:
    journal = src.journal
    if not journal.hot:
        return None
    entry = {
        "rolled_back_pages": journal.rolled_back_pages,
        "damaged_records": [{"record": n, "page": p} for n, p in journal.damaged][:100],
        "header_damaged": journal.header_damaged,
        "transaction_in_progress": in_use,
    }
    what = ("of a transaction still in progress" if in_use else "left by an interrupted "
            "transaction: a killed restore, repair promotion or write")
    if journal.header_damaged:
        src.notes.append(f"the source has a rollback journal {what}; its header is damaged: "
                         "nothing could be rolled back, so pages may hold uncommitted content")
    else:
        src.notes.append(f"the source has a hot rollback journal {what}; it was rolled back on "
                         f"the private copy first ({journal.rolled_back_pages} pages), so the "
                         "rows read are the committed state; the source is unchanged")
    if journal.damaged:
        pages = ", ".join(str(p) for _, p in journal.damaged[:10])
        src.notes.append(f"{len(journal.damaged)} records of the rollback journal fail their "
                         f"checksum (pages {pages}): those pages could not be restored and may "
                         "hold uncommitted content, so their rows are taken last, only where no "
                         "restored page holds them; every record that verifies was rolled back")
    return entry


def _wal_entry(src: _Source) -> dict[str, Any]:
    scan = src.wal.scan
    entry: dict[str, Any] = {
        "frames": scan.frames, "applied": src.wal.frames, "readable_by_sqlite": scan.readable,
        "stale_frames": scan.stale_frames, "uncommitted_frames": scan.torn_frames,
    }
    if scan.problem:
        entry.update(damaged_frames=scan.damaged[:100], later_commits=scan.later_commits,
                     later_frames=scan.later_frames, rows_after_damage=src.wal_rows,
                     unreplaced_pages=src.wal.unreplaced)
        src.notes.append(scan.describe(src.wal_rows) + "; those commits verify and were "
                         "folded in")
        if src.wal.unreplaced:
            pages = ", ".join(str(p) for p in src.wal.unreplaced[:10])
            src.notes.append(f"pages {pages} of damaged -wal frames are not rewritten by a "
                             "later commit and keep their older content; where that leaves "
                             "the image inconsistent, tables are read page by page")
    return entry


def _assemble(
    src: _Source,
    src_path: Path,
    out_path: Path | None,
    plan: _Plan,
    out: sqlite3.Connection | None,
    placeholders: list[str],
    checks: dict[str, Any],
    bounds: Mapping[str, int],
) -> dict[str, Any]:
    holders = describe_lock_holders(src_path)
    journal = _journal_entry(src, bool(holders))
    wal = _wal_entry(src)
    tables = {
        name: _table_entry(src, r, out, plan, len(placeholders)) for name, r in plan.copy.items()
    }
    excluded = {name: _table_entry(src, r, None, plan, 0) for name, r in plan.excluded.items()}
    for name in RUNTIME_LEDGER_TABLES:
        excluded.setdefault(name, {"found": 0, "present": False})
    for name, report in [*plan.copy.items(), *plan.excluded.items()]:
        _table_notes(src, name, report, bounds)
    version = None
    if src.primary.sql is not None:
        with contextlib.suppress(sqlite3.Error):
            version = read_version(src.primary.sql)
    found = sum(t["found"] for t in tables.values()) + sum(t["found"] for t in excluded.values())
    lost_values = [t.get("lost") for t in tables.values()]
    unverified = [f"{name}: {problem}" for name, t in tables.items()
                  for problem in t.get("unverified", [])]
    return {
        "source": str(src_path),
        "output": str(out_path) if out_path is not None else None,
        "inspect_only": out_path is None,
        "source_in_use": holders,
        "schema_version": version,
        "schema_read_by": plan.schema_method,
        "page_size": src.primary.image.page_size,
        "pages": src.primary.image.page_count,
        "views": [view.name for view in src.views],
        "journal": journal,
        "wal": wal,
        "wal_frames_applied": src.wal.frames,
        "notes": src.notes,
        "tables": tables,
        "excluded": excluded,
        "rebuilt": list(_REBUILT),
        "placeholder_sessions": placeholders,
        "rows_found": found,
        "rows_lost": None if None in lost_values else sum(v or 0 for v in lost_values),
        "complete": all(t.get("lost") == 0 for t in tables.values()),
        "verified": not unverified,
        "output_verified": all(t.get("output_verified", True) for t in tables.values()),
        "unverified": unverified,
        "readable": found > 0 or not any(r.damaged for r in plan.reports()),
        "checks": checks,
    }


def _table_notes(src: _Source, name: str, report: _TableReport, bounds: Mapping[str, int]
                 ) -> None:
    """The report's notes on where a table's rows came from and what was set aside."""
    primary = src.primary.name
    for view, tally in report.views.items():
        if view == primary or not tally.only_here:
            continue
        refused = f" ({tally.refused} refused: a newer row holds their key)" if (
            tally.refused) else ""
        ids = ", ".join(str(i) for i in tally.ids[:10])
        why = {
            VIEW_FILE: "the -wal's version of their pages differs; they may include rows "
                       "deleted after the last checkpoint",
            VIEW_TORN: "no restored page holds them; they may be content the interrupted "
                       "transaction never committed: check them",
        }.get(view, "no verified content holds them: check them")
        src.notes.append(f"{name}: {tally.only_here} rows only {_VIEW_WORDS[view]} holds, "
                         f"{tally.copied} kept{refused} ({why}; ids {ids})")
    if report.impossible_count:
        limit = f"above its sequence {bounds[name]} or " if name in bounds else ""
        ids = ", ".join(str(i) for i in report.impossible[:10])
        src.notes.append(f"{name}: {report.impossible_count} rows with impossible ids "
                         f"({limit}≤ 0) were found and not copied: {ids}")
    if report.error is not None and src.wal.scan.problem and report.views.get(primary):
        src.notes.append(f"{name}: the image with the later -wal commits folded in is "
                         f"inconsistent ({report.error}); the rest was read page by page")


def collect_profile_stats(
    root: str | os.PathLike[str] | None, open_read_only: Callable[[Path], Any]
) -> dict[str, Any]:
    """``stats()`` of every profile under ``root`` (default: the Hermes root): ``default``
    (``<root>/state.db``) and each ``<root>/profiles/<name>/state.db``, each opened with
    ``open_read_only(path)``. A profile that fails goes to ``errors`` (``profile``, ``error``
    and the unavailable ``reason`` when there is one); the others are still returned."""
    base = hermes_root() if root is None else Path(root).expanduser()
    names = ["default"]
    profiles = base / "profiles"
    if profiles.is_dir():
        names += sorted(
            p.name
            for p in profiles.iterdir()
            if (p / DB_FILENAME).exists() or (p / DB_FILENAME).is_symlink()
        )
    result: dict[str, Any] = {"profiles": {}, "errors": []}
    for name in names:
        try:
            home = resolve_profile_home(name, base)
            with open_read_only(home / DB_FILENAME) as db:
                result["profiles"][name] = db.stats()
        except (HermesStateError, sqlite3.Error, OSError) as exc:
            entry: dict[str, Any] = {"profile": name, "error": str(exc)}
            reason = getattr(exc, "reason", None)
            if reason:
                entry["reason"] = reason
            result["errors"].append(entry)
    return result
