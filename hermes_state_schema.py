"""Applying the schema: fresh creation, declarative column reconciliation, numbered migrations.

An up-to-date file costs two reads at open. A file lacking something declared gets it in one
write. Older files are brought forward step by step, each in a write transaction that
re-reads the version, so concurrent openers run each step once. Missing columns are
reconciled from ``SCHEMA_SQL``; :data:`MIGRATIONS` is the append-only list for the rest.

The previous store stamps files in its own numbering, so a stamp alone cannot show owed data
steps. :func:`restore_data_invariants` and :func:`_previous_store_backfills` run them; both
are idempotent. A file newer than this library is never touched."""

from __future__ import annotations

import functools
import json
import re
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import hermes_state_fts as fts
import hermes_state_fulltext as fulltext
import hermes_state_impact as impact
from hermes_state_common import quote_identifier
from hermes_state_connect import set_meta, split_sql, table_exists
from hermes_state_schema_sql import (
    FTS_SQL,
    FTS_SQL_WITHOUT_TRIGRAM,
    FTS_TRIGGERS_SQL_WITHOUT_TRIGRAM,
    FTS_TRIGGER_NAMES,
    FTS_TRIGGERS_SQL,
    INDEXES_SQL,
    SCHEMA_VERSION,
    TABLES_SQL,
)
from hermes_state_errors import (
    HermesStateError,
    StateDbUnavailableError,
    foreign_database_error,
    is_corruption_error,
    is_sqlite_lock_error,
)

__all__ = [
    "MIGRATIONS",
    "read_version",
    "refuse_foreign",
    "refuse_newer",
    "configure_writable",
    "require_current",
    "ensure_schema",
    "expected_columns",
    "expected_indexes",
    "lacks_declared_schema",
    "restore_data_invariants",
    "OLD_DELEGATION_COLUMNS",
    "reshape_delegations",
    "index_attached",
    "detach_unavailable",
    "WriteFn",
]

T = TypeVar("T")


class WriteFn(Protocol):
    """Runs ``fn(conn)`` as one retried write transaction of a store and returns its result."""

    def __call__(self, fn: Callable[[sqlite3.Connection], T], /) -> T: ...


# A database with tables but no schema_version row predates version tracking.
_UNTRACKED_VERSION = 1
VERSION_SQL = "SELECT version FROM schema_version LIMIT 1"


def read_version(conn: sqlite3.Connection, /) -> int | None:
    """The schema version of the database; None for an empty (uninitialised) database."""
    try:
        row = conn.execute(VERSION_SQL).fetchone()
    except sqlite3.OperationalError as exc:
        # A lock error is not a missing table: asking again would wait out the busy timeout
        # a second time.
        if is_sqlite_lock_error(exc):
            raise
        if not table_exists(conn, "schema_version"):
            row = None
        else:  # created since, by another process opening the new file, or broken: read again
            row = conn.execute(VERSION_SQL).fetchone()
    if row is not None and row[0] is not None:
        return int(row[0])
    if table_exists(conn, "sessions"):
        return _UNTRACKED_VERSION
    return None


# The tables of a database, SQLite's own left out.
USER_TABLES_SQL = (
    "SELECT name FROM sqlite_master"
    " WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
)
# The file behind a connection ('' for a temporary or in-memory database).
MAIN_FILE_SQL = "SELECT file FROM pragma_database_list WHERE name = 'main'"


def refuse_foreign(conn: sqlite3.Connection, /) -> int | None:
    """The schema version (see :func:`read_version`); a database that holds no session store
    but other tables raises :class:`StateDbUnavailableError` with reason ``"foreign"``.

    For the operations that need a store or replace the whole file (backup, restore, repair):
    a writable open still creates the store in such a file, beside the tables it has."""
    version = read_version(conn)
    if version is None:
        tables = [r[0] for r in conn.execute(USER_TABLES_SQL)]
        if tables:
            file = conn.execute(MAIN_FILE_SQL).fetchone()
            raise foreign_database_error(Path(file[0]) if file and file[0] else None, tables)
    return version


def refuse_newer(conn: sqlite3.Connection, /, path: Path | None = None) -> int | None:
    """The schema version (see :func:`read_version`); a database written by a newer library
    raises :class:`StateDbUnavailableError` (reason "incompatible") and is left untouched."""
    found = read_version(conn)
    if found is not None and found > SCHEMA_VERSION:
        raise StateDbUnavailableError(
            f"database schema version {found} is newer than this library's {SCHEMA_VERSION}",
            reason="incompatible",
            path=path,
            schema_version=found,
        )
    return found


# Both settings are no-ops inside a transaction.
FOREIGN_KEYS_ON_SQL = "PRAGMA foreign_keys = ON"
JOURNAL_MODE_WAL_SQL = "PRAGMA journal_mode = WAL"


def configure_writable(conn: sqlite3.Connection, /, path: Path) -> None:
    """The settings of a writable handle's connection, run outside any transaction: foreign
    keys on, the WAL journal (switching a new file to WAL needs its lock, so the caller
    retries). A file from a newer library is refused first: switching its journal mode would
    already rewrite its header."""
    refuse_newer(conn, path)
    conn.execute(FOREIGN_KEYS_ON_SQL)
    mode = conn.execute(JOURNAL_MODE_WAL_SQL).fetchone()[0]
    if str(mode).lower() != "wal":
        raise HermesStateError(f"{path} refused WAL mode (journal_mode={mode})")


def require_current(conn: sqlite3.Connection, /, path: Path) -> None:
    """What a read-only handle needs: a database at exactly :data:`SCHEMA_VERSION` (it can
    neither create nor migrate one), else :class:`StateDbUnavailableError` (``foreign`` for
    another application's database, see :func:`refuse_foreign`)."""
    version = refuse_foreign(conn)
    if version != SCHEMA_VERSION:
        raise StateDbUnavailableError(
            f"session store {path} has schema version {version}, "
            f"this library reads {SCHEMA_VERSION}",
            reason="uninitialized" if version is None else "incompatible",
            path=path,
            schema_version=version,
        )


def _set_version(conn: sqlite3.Connection, /, version: int) -> None:
    conn.execute("DELETE FROM schema_version")
    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))


@functools.cache
def expected_columns() -> dict[str, list[tuple[str, str, int, str | None]]]:
    """Per table of ``SCHEMA_SQL``: (name, declared type, notnull, default SQL) of each column."""
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(TABLES_SQL)
        tables = [r[0] for r in mem.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {
            t: [
                (r[1], r[2], r[3], r[4])
                for r in mem.execute("SELECT * FROM pragma_table_info(?)", (t,))
            ]
            for t in tables
            if not t.startswith("sqlite_")
        }
    finally:
        mem.close()


def _live_columns(conn: sqlite3.Connection, /, table: str) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM pragma_table_info(?)", (table,))}


@functools.cache
def expected_indexes() -> frozenset[str]:
    """The names of the indexes ``INDEXES_SQL`` declares."""
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(TABLES_SQL + INDEXES_SQL)
        rows = mem.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql NOT NULL")
        return frozenset(r[0] for r in rows)
    finally:
        mem.close()


# The (table, column) pairs of the canonical tables named in the JSON list parameter (never of
# the FTS tables: a virtual table's columns may need its module), and every named index.
LIVE_COLUMNS_SQL = """
SELECT m.name, c.name FROM sqlite_master m, pragma_table_info(m.name) c
WHERE m.type = 'table' AND m.name IN (SELECT value FROM json_each(?))
"""
LIVE_OBJECTS_SQL = "SELECT name FROM sqlite_master WHERE type IN ('index', 'table', 'trigger')"


# The whole schema as the file stores it. What :func:`lacks_declared_schema` checks is a
# function of this text alone (a column added later is in its table's ``sql``), so a text found
# complete once is complete in any file that holds it.
SCHEMA_TEXT_SQL = """
SELECT group_concat(type || ' ' || name || ' ' || coalesce(sql, ''), char(10)) FROM sqlite_master
"""
# Schema texts this process found complete: an open of an up-to-date store then reads the text
# instead of every table's columns.
_COMPLETE_SCHEMAS: set[str] = set()
_COMPLETE_SCHEMAS_KEPT = 16


# The schema cookie: SQLite adds one to it with every change of the schema.
SCHEMA_COOKIE_SQL = "PRAGMA schema_version"


def lacks_declared_schema(conn: sqlite3.Connection, /) -> bool:
    """True when a table, column or index ``SCHEMA_SQL`` declares, or any object of the search
    index, is missing (reads only)."""
    cookie = conn.execute(SCHEMA_COOKIE_SQL).fetchone()[0]
    text = str(conn.execute(SCHEMA_TEXT_SQL).fetchone()[0] or "")
    if text in _COMPLETE_SCHEMAS:
        return False
    if _lacks_declared_schema(conn):
        return True
    # The same cookie after the check: no other process changed the schema between the reads.
    if conn.execute(SCHEMA_COOKIE_SQL).fetchone()[0] == cookie:
        if len(_COMPLETE_SCHEMAS) >= _COMPLETE_SCHEMAS_KEPT:
            _COMPLETE_SCHEMAS.clear()
        _COMPLETE_SCHEMAS.add(text)
    return False


def _lacks_declared_schema(conn: sqlite3.Connection, /) -> bool:
    tables = expected_columns()
    live = set(conn.execute(LIVE_COLUMNS_SQL, (json.dumps(list(tables)),)).fetchall())
    declared = {(t, c[0]) for t, cols in tables.items() for c in cols}
    if not declared <= live or _earlier_delegations_shape(live):
        return True
    names = {r[0] for r in conn.execute(LIVE_OBJECTS_SQL)}
    return (not (expected_indexes() <= names and set(impact.INDEX_OBJECTS) <= names
                 and set(fts.FTS_TABLES) <= names)
            or bool(_requoted_fts_tables(conn)) or impact.declared_otherwise(conn)
            or fts.earlier_update_trigger(conn) is not None)


# --- declarations of the FTS tables ----------------------------------------------------------


@functools.cache
def _declared_fts_tables() -> dict[str, str]:
    """The schema text (``sqlite_master.sql``) of each FTS table ``SCHEMA_SQL`` declares, as a
    new store holds it."""
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(TABLES_SQL + FTS_SQL)
        return dict(mem.execute(impact.DECLARATIONS_SQL, (json.dumps(fts.FTS_TABLES),)))
    finally:
        mem.close()


def _quotes_alike(sql: str) -> str:
    return sql.replace('"', "'")


def _requoted_fts_tables(conn: sqlite3.Connection, /) -> dict[str, str]:
    """The FTS tables whose schema text differs from the declared one only in the quotes
    around a name (an earlier version wrote ``content='messages'``), with the declared text.
    FTS5 reads either quotes alike, so each is the same table as the declared one."""
    live = dict(conn.execute(impact.DECLARATIONS_SQL, (json.dumps(fts.FTS_TABLES),)))
    return {
        name: sql
        for name, sql in _declared_fts_tables().items()
        if name in live and live[name] != sql and _quotes_alike(live[name]) == _quotes_alike(sql)
    }


WRITABLE_SCHEMA_SQL = "PRAGMA writable_schema = {}"
REDECLARE_SQL = "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?"


def _redeclare_fts_tables(conn: sqlite3.Connection, /) -> None:
    """Give each FTS table declared with other quotes its declared text (the caller's
    transaction): only the text in ``sqlite_master`` changes, not what it means, so the
    index, its shadow tables and its triggers stay as they are and searches find the same
    rows. The schema cookie goes up in the same transaction, as SQLite's own schema changes
    do, so every other connection reads the schema again before it next uses the table."""
    requoted = _requoted_fts_tables(conn)
    if not requoted:
        return
    cookie = int(conn.execute(SCHEMA_COOKIE_SQL).fetchone()[0])
    conn.execute(WRITABLE_SCHEMA_SQL.format("ON"))
    try:
        conn.executemany(REDECLARE_SQL, [(sql, name) for name, sql in requoted.items()])
        conn.execute(f"{SCHEMA_COOKIE_SQL} = {cookie + 1}")
    finally:
        conn.execute(WRITABLE_SCHEMA_SQL.format("OFF"))


def _has_rows(conn: sqlite3.Connection, /, table: str) -> bool:
    return conn.execute(f"SELECT 1 FROM {quote_identifier(table)} LIMIT 1").fetchone() is not None


def _reconcile_columns(conn: sqlite3.Connection, /) -> list[str]:
    """Add every column ``SCHEMA_SQL`` declares that the live tables lack; returns them.

    Idempotent, and tolerant of a column that appeared meanwhile: a failed ADD is only an
    error if the column is still missing afterwards. A ``NOT NULL`` column without a default
    joins a table with rows as a nullable column (SQLite refuses it otherwise, and the rows
    must stay).
    """
    added = []
    for table, columns in expected_columns().items():
        live = _live_columns(conn, table)
        for name, decl_type, notnull, default in columns:
            if name in live:
                continue
            ddl = (
                f"ALTER TABLE {quote_identifier(table)}"
                f" ADD COLUMN {quote_identifier(name)} {decl_type}"
            )
            if notnull and (default is not None or not _has_rows(conn, table)):
                ddl += " NOT NULL"
            if default is not None:
                ddl += f" DEFAULT {default}"
            try:
                conn.execute(ddl)
            except sqlite3.OperationalError:
                if name not in _live_columns(conn, table):
                    raise
            added.append(f"{table}.{name}")
    return added


# --- this library's earlier shape of async_delegations ----------------------------------------

# The columns only that shape had. A table holding all three was written by it: created so, or
# (a file of the previous store) given them beside the previous store's columns, which left the
# application's inserts short of created_at.
OLD_DELEGATION_COLUMNS = frozenset({"status", "task", "created_at"})
_DELEGATIONS_ASIDE = "async_delegations_earlier_shape"
# Each declared column from a table of the earlier shape that lacks it: the parent is the
# origin, the status the state, the creation time the dispatch time, a final row completed when
# it was last changed (a final row never changes again), the task the goal of a task object.
_FROM_EARLIER_SHAPE = {
    "origin_session": "COALESCE(parent_session_id, '')",
    "state": "COALESCE(status, 'pending')",
    "dispatched_at": "COALESCE(created_at, updated_at)",
    "completed_at": "CASE WHEN status IN ('completed', 'failed', 'cancelled') THEN updated_at END",
    "task_json": "CASE WHEN task IS NOT NULL THEN json_object('goal', task) END",
}


def _earlier_delegations_shape(live: set[tuple[str, str]]) -> bool:
    return {("async_delegations", c) for c in OLD_DELEGATION_COLUMNS} <= live


def reshape_delegations(conn: sqlite3.Connection, /) -> None:
    """Rebuild an ``async_delegations`` table of this library's earlier shape into the declared
    one, every row kept (the caller's transaction). A column both shapes have keeps its values
    (the application's rows in a previous store's table keep every value they had); one the
    earlier shape lacked is filled from :data:`_FROM_EARLIER_SHAPE`, or takes its default."""
    live = _live_columns(conn, "async_delegations")
    if not OLD_DELEGATION_COLUMNS <= live:
        return
    conn.execute(f"ALTER TABLE async_delegations RENAME TO {_DELEGATIONS_ASIDE}")
    declare = next(s for s in split_sql(TABLES_SQL) if " async_delegations (" in s)
    conn.execute(declare)
    columns = [c[0] for c in expected_columns()["async_delegations"]
               if c[0] in live or c[0] in _FROM_EARLIER_SHAPE]
    values = [quote_identifier(c) if c in live else _FROM_EARLIER_SHAPE[c] for c in columns]
    conn.execute(
        f"INSERT INTO async_delegations ({', '.join(map(quote_identifier, columns))})"
        f" SELECT {', '.join(values)} FROM {_DELEGATIONS_ASIDE}"
    )
    conn.execute(f"DROP TABLE {_DELEGATIONS_ASIDE}")


# --- migrations ------------------------------------------------------------------------------

_TITLE_SUFFIX_RE = re.compile(r"^(.*) #(\d+)$")


def _migrate_unique_titles(conn: sqlite3.Connection, /) -> None:
    """Titles became unique. Older files may hold duplicates: the oldest session keeps the title,
    later ones are renumbered in lineage style (``T #2``, ``T #3``…), so no title is lost."""
    dupes = conn.execute(
        "SELECT title FROM sessions WHERE title IS NOT NULL GROUP BY title HAVING COUNT(*) > 1"
    ).fetchall()
    for (title,) in dupes:
        ids = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM sessions WHERE title = ? ORDER BY started_at, id", (title,)
            )
        ]
        match = _TITLE_SUFFIX_RE.match(title)
        base, n = (match.group(1), int(match.group(2))) if match else (title, 1)
        for session_id in ids[1:]:
            while True:
                n += 1
                candidate = f"{base} #{n}"
                taken = conn.execute("SELECT 1 FROM sessions WHERE title = ?", (candidate,))
                if taken.fetchone() is None:
                    break
            conn.execute("UPDATE sessions SET title = ? WHERE id = ?", (candidate, session_id))
    conn.execute(
        "CREATE UNIQUE INDEX IF NOT EXISTS idx_sessions_title_unique"
        " ON sessions(title) WHERE title IS NOT NULL"
    )


# Assistant rows that call tools but predate the per-call uids.
UNMAPPED_CALLERS_SQL = """
SELECT id, tool_calls FROM messages
WHERE role = 'assistant' AND tool_calls IS NOT NULL AND tool_call_uids IS NULL
"""


def _call_uids(tool_calls: str) -> str | None:
    """A ``tool_call_uids`` mapping for stored ``tool_calls`` JSON (None when it names none)."""
    try:
        calls = json.loads(tool_calls)
    except ValueError:
        return None
    ids = [c.get("id") for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    mapping = {i: uuid.uuid4().hex for i in dict.fromkeys(ids) if isinstance(i, str)}
    return json.dumps(mapping, separators=(",", ":")) if mapping else None


def _migrate_message_uids(conn: sqlite3.Connection, /) -> None:
    """Every message gets its lasting ``message_uid`` (uuid4 hex), and every assistant row that
    calls tools its ``tool_call_uids``; existing ones are kept. Tool results are paired with
    them when read (their ``tool_call_uid`` stays NULL, which means "derive it")."""
    ids = [r[0] for r in conn.execute("SELECT id FROM messages WHERE message_uid IS NULL")]
    conn.executemany(
        "UPDATE messages SET message_uid = ? WHERE id = ?", ((uuid.uuid4().hex, i) for i in ids)
    )
    mapped = [(_call_uids(calls), row_id) for row_id, calls in conn.execute(UNMAPPED_CALLERS_SQL)]
    conn.executemany(
        "UPDATE messages SET tool_call_uids = ? WHERE id = ?", [m for m in mapped if m[0]]
    )


# Legacy FTS objects: earlier generations had one index over `content` only.
_FTS_OBJECTS = ("messages_fts", "messages_fts_trigram", "messages_fts_cjk")
_FTS_VIEWS = ("messages_fts_trigram_source", "messages_fts_cjk_source")


# Triggers on `messages` that feed an FTS table, whatever their generation named them.
FTS_FEEDING_TRIGGERS_SQL = """
SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'messages'
  AND sql LIKE '%messages\\_fts%' ESCAPE '\\'
"""


def _drop_fts_triggers(conn: sqlite3.Connection, /) -> None:
    legacy = [r[0] for r in conn.execute(FTS_FEEDING_TRIGGERS_SQL)]
    for name in {*FTS_TRIGGER_NAMES, *legacy}:
        conn.execute(f"DROP TRIGGER IF EXISTS {quote_identifier(name)}")


def _drop_fts_table(conn: sqlite3.Connection, /, name: str) -> None:
    """Drop an old FTS table. FTS5 must open a table to drop it, which it cannot once the
    table's structure record is damaged; such an index is reset to an empty one first (its
    contents are about to be rebuilt from the rows anyway)."""
    drop = f"DROP TABLE IF EXISTS {quote_identifier(name)}"
    try:
        conn.execute(drop)
    except (sqlite3.Error, MemoryError) as exc:  # garbage in a structure can read as NOMEM
        if isinstance(exc, sqlite3.Error) and not is_corruption_error(exc):
            raise
        fts.empty_index(conn, name)
        conn.execute(drop)


def _migrate_fts_indexes(conn: sqlite3.Connection, /) -> None:
    """Three FTS5 indexes with gated sync triggers replace earlier generations; the new
    indexes are filled by the chunked rebuild (see hermes_state_fts)."""
    _drop_fts_triggers(conn)
    for name in _FTS_OBJECTS:
        _drop_fts_table(conn, name)
    for name in _FTS_VIEWS:
        conn.execute(f"DROP VIEW IF EXISTS {quote_identifier(name)}")
    for statement in split_sql(FTS_SQL + FTS_TRIGGERS_SQL):
        conn.execute(statement)
    fts.start_rebuild(conn)


def restore_data_invariants(conn: sqlite3.Connection, /) -> None:
    """Make the data rules older files may break true again: unique titles (the unique index
    is created), a ``message_uid`` on every message, ``active`` and ``compacted`` set on every
    message (an older writer left them NULL on a column without a default, which hid its rows
    from every read). Idempotent; for rows copied from a file of any version into the current
    schema (recover)."""
    _migrate_unique_titles(conn)
    _migrate_message_uids(conn)
    conn.execute(HEAL_FLAGS_SQL)


# Messages an older writer stored with NULL flags are live, never-compacted rows.
HEAL_FLAGS_SQL = """
UPDATE messages SET active = COALESCE(active, 1), compacted = COALESCE(compacted, 0)
WHERE active IS NULL OR compacted IS NULL
"""

_GATEWAY_BACKFILL_SQL = """
UPDATE sessions SET
    session_key = COALESCE(session_key, :session_key),
    chat_id = COALESCE(chat_id, :chat_id),
    chat_type = COALESCE(chat_type, :chat_type),
    thread_id = COALESCE(thread_id, :thread_id),
    display_name = COALESCE(display_name, :display_name),
    origin_json = COALESCE(origin_json, :origin_json),
    expiry_finalized = CASE WHEN COALESCE(expiry_finalized, 0) = 0 AND :finalized
                            THEN 1 ELSE expiry_finalized END
WHERE id = :id
"""
# One usage row per session from its totals (the previous store's files before per-model
# usage had only those), for a session that has no usage row yet.
_SEED_USAGE_SQL = """
INSERT OR IGNORE INTO session_model_usage (
    session_id, model, billing_provider, billing_base_url, billing_mode, task,
    input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens,
    estimated_cost_usd, actual_cost_usd, api_call_count, first_used_at, last_used_at)
SELECT id, COALESCE(model, 'unknown'), COALESCE(billing_provider, ''),
       COALESCE(billing_base_url, ''), COALESCE(billing_mode, ''), '',
       COALESCE(input_tokens, 0), COALESCE(output_tokens, 0), COALESCE(cache_read_tokens, 0),
       COALESCE(cache_write_tokens, 0), COALESCE(reasoning_tokens, 0), estimated_cost_usd,
       actual_cost_usd, COALESCE(api_call_count, 0), started_at, COALESCE(ended_at, started_at)
FROM sessions
WHERE COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0) + COALESCE(cache_read_tokens, 0)
      + COALESCE(cache_write_tokens, 0) + COALESCE(reasoning_tokens, 0) > 0
  AND NOT EXISTS (SELECT 1 FROM session_model_usage u WHERE u.session_id = sessions.id)
"""


def _previous_store_backfills(conn: sqlite3.Connection, stamp: int, /) -> None:
    """The data steps the previous store ran when it opened a file of its own numbering older
    than the step, owed to a file stamped ``stamp``. Before 18 the gateway's
    ``sessions/sessions.json`` beside the file fills routing and display columns that are
    still NULL; before 20 each session with token totals and no per-model usage row gets one
    from them. Each fills only what is missing, so a file this library wrote at such a stamp
    (or any file run twice) keeps every value it has. (Its step 16, tagging children that look
    like subagent runs ``_delegate_from`` by a guess, is not taken: a tagged child is deleted
    with its parent, and a guess must not make a deletion take more.)"""
    if stamp < 18:
        for params in _gateway_index_rows(conn):
            conn.execute(_GATEWAY_BACKFILL_SQL, params)
    if stamp < 20:
        conn.execute(_SEED_USAGE_SQL)


def _gateway_index_rows(conn: sqlite3.Connection) -> list[dict[str, object]]:
    """The gateway's ``sessions.json`` (under ``sessions/`` beside the database file) as
    parameters of :data:`_GATEWAY_BACKFILL_SQL`; none when it is absent or not an index (it is
    a best-effort source: a session it does not name keeps its columns as they are)."""
    data = _gateway_index(conn)
    rows = [_gateway_row(str(key), entry) for key, entry in data.items()]
    return [row for row in rows if row is not None]


def _gateway_index(conn: sqlite3.Connection) -> dict[object, object]:
    """The contents of the gateway's ``sessions.json``; empty when absent or no index."""
    row = conn.execute("SELECT file FROM pragma_database_list WHERE name = 'main'").fetchone()
    if not row or not row[0]:
        return {}
    index = Path(row[0]).parent / "sessions" / "sessions.json"
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _gateway_row(key: str, entry: object) -> dict[str, object] | None:
    """The backfill parameters of one entry of the index; None for an entry that is not a
    session's."""
    if key.startswith("_") or not isinstance(entry, dict):
        return None
    session_id = entry.get("session_id")
    if not isinstance(session_id, str) or not session_id:
        return None
    given = entry.get("origin")
    origin: dict[object, object] = given if isinstance(given, dict) else {}
    return {
        "id": session_id,
        "session_key": _text_or_none(entry.get("session_key")) or key,
        "chat_id": _text_or_none(origin.get("chat_id")),
        "chat_type": _text_or_none(entry.get("chat_type")),
        "thread_id": _text_or_none(origin.get("thread_id")),
        "display_name": _text_or_none(entry.get("display_name")),
        "origin_json": json.dumps(origin, ensure_ascii=False) if origin else None,
        "finalized": bool(entry.get("expiry_finalized") or entry.get("memory_flushed")),
    }


def _text_or_none(value: object) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    return value if isinstance(value, str) else str(value) if isinstance(value, int) else None


def _finish(conn: sqlite3.Connection, /) -> None:
    """The declared indexes, and the search index when any part of it is missing (created
    empty; the library fills it in the background)."""
    for statement in split_sql(INDEXES_SQL):
        conn.execute(statement)
    impact.ensure_index(conn)


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[sqlite3.Connection], None]


# Append-only. Versions not listed here only added columns (handled by _reconcile_columns).
MIGRATIONS: tuple[Migration, ...] = (
    Migration(12, "unique session titles", _migrate_unique_titles),
    Migration(18, "lasting message uids", _migrate_message_uids),
    Migration(31, "three FTS5 indexes with gated triggers", _migrate_fts_indexes),
)


def _create_tables(conn: sqlite3.Connection, /) -> None:
    """The declared tables of a new store. A table another program created first (the
    application's delegation tool creates ``async_delegations``) is brought to the
    declaration as at an upgrade, so the indexes after it find their columns."""
    for statement in split_sql(TABLES_SQL):
        conn.execute(statement)
    reshape_delegations(conn)
    _reconcile_columns(conn)


def _create_fresh(conn: sqlite3.Connection, /) -> bool:
    if read_version(conn) is not None:
        return False
    _create_tables(conn)
    for statement in split_sql(INDEXES_SQL + FTS_SQL + FTS_TRIGGERS_SQL):
        conn.execute(statement)
    set_meta(conn, fts.SPELLING_KEY, fts.CJK_SPELLING)
    impact.create_index(conn)
    _set_version(conn, SCHEMA_VERSION)
    return True


def _bootstrap(conn: sqlite3.Connection, /) -> None:
    """Tables and columns first. An old generation's FTS triggers go too: the data migrations
    below rewrite rows, and a legacy index that is damaged or already gone would make every
    such rewrite fail, while the FTS migration rebuilds the indexes from the rows anyway."""
    if (read_version(conn) or 0) >= SCHEMA_VERSION:
        return
    stamp = read_version(conn)
    _drop_fts_triggers(conn)
    for statement in split_sql(TABLES_SQL):
        conn.execute(statement)
    reshape_delegations(conn)
    if "messages.message_uid" in _reconcile_columns(conn):
        restore_data_invariants(conn)  # owed whatever the stamp says (see the module doc)
    if stamp is not None:  # an empty file is created whole, owing nothing
        _previous_store_backfills(conn, stamp)


def _complete_current(conn: sqlite3.Connection, /) -> None:
    """A current-version file that lacks part of the declaration (written before a column or
    index was declared) gets it; the version stays."""
    if read_version(conn) != SCHEMA_VERSION or not lacks_declared_schema(conn):
        return
    for statement in split_sql(TABLES_SQL):
        conn.execute(statement)
    reshape_delegations(conn)
    _reconcile_columns(conn)
    # The handle runs a rebuild it finds due in the background; searches read the rows meanwhile.
    fts.restore_missing_indexes(conn)
    # A file whose unique title index went missing may hold duplicate titles by now: they are
    # renumbered as at the upgrade, so the index can be created again and nothing is refused.
    _migrate_unique_titles(conn)
    _finish(conn)
    _redeclare_fts_tables(conn)
    fts.replace_earlier_update_trigger(conn)


def _run_migration(conn: sqlite3.Connection, /, migration: Migration) -> None:
    if (read_version(conn) or 0) >= migration.version:
        return
    migration.apply(conn)
    if migration.version == SCHEMA_VERSION:
        _finish(conn)
    _set_version(conn, migration.version)


def _finish_upgrade(conn: sqlite3.Connection, /) -> None:
    """The last step when no migration carries the current version: indexes, then the bump.
    (Indexes come last because the unique title index needs the title migration first.)"""
    if (read_version(conn) or 0) >= SCHEMA_VERSION:
        return
    _finish(conn)
    _set_version(conn, SCHEMA_VERSION)


def ensure_schema(
    conn: sqlite3.Connection, /, write: WriteFn, *, full_text: str = fulltext.FULL
) -> int | None:
    """Bring the database to :data:`SCHEMA_VERSION`; returns the version it was found at.

    ``write(fn)`` must run ``fn(conn)`` in one retried write transaction. ``full_text`` is the
    handle's level (see hermes_state_fulltext): at ``"none"`` the FTS tables, their triggers
    and the search index are neither created nor checked, and an index the file has is
    detached (:func:`_ensure_without_index`).
    """
    if full_text == fulltext.NONE:
        return _ensure_without_index(conn, write)
    if full_text == fulltext.NO_TRIGRAM:
        return _ensure_without_trigram(conn, write)
    found = refuse_newer(conn)
    if found == SCHEMA_VERSION:
        if _fts_generation_due(conn):
            write(_replace_fts_generation)
        if lacks_declared_schema(conn):
            write(_complete_current)
        return found
    if found is None and write(_create_fresh):
        return None
    write(_bootstrap)
    for migration in MIGRATIONS:
        write(functools.partial(_run_migration, migration=migration))
    write(_finish_upgrade)
    return found


# --- a build without FTS5 (see hermes_state_fulltext) ----------------------------------------


def _lacks_canonical_schema(conn: sqlite3.Connection, /) -> bool:
    """True when a canonical table, column or index ``SCHEMA_SQL`` declares is missing (the
    FTS tables and the search index are not asked for: this SQLite cannot make them)."""
    tables = expected_columns()
    live = set(conn.execute(LIVE_COLUMNS_SQL, (json.dumps(list(tables)),)).fetchall())
    declared = {(t, c[0]) for t, cols in tables.items() for c in cols}
    names = {r[0] for r in conn.execute(LIVE_OBJECTS_SQL)}
    return (not (declared <= live and expected_indexes() <= names)
            or _earlier_delegations_shape(live))


def _complete_canonical(conn: sqlite3.Connection, /) -> None:
    if not _lacks_canonical_schema(conn):
        return
    for statement in split_sql(TABLES_SQL):
        conn.execute(statement)
    reshape_delegations(conn)
    _reconcile_columns(conn)
    for statement in split_sql(INDEXES_SQL):
        conn.execute(statement)


def index_attached(conn: sqlite3.Connection, /) -> bool:
    """Whether the file's indexes may still be fed, or read as whole, by anyone: an FTS sync
    trigger is there, the ``fts_stale`` marker is not, or the search index is not marked
    damaged (its library-side upkeep writes an FTS5 table)."""
    state = fts.index_state(conn)
    search_index = impact.read_state(conn)
    return (len(fts.missing_triggers(conn)) < len(fts.FTS_TRIGGER_NAMES)
            or state.stale is None or state.rebuilding
            or (search_index is not None and not search_index.damaged))


def detach_unavailable(conn: sqlite3.Connection, /) -> None:
    """What a handle without the trigram tokenizer needs to write rows: the triggers that
    feed the two other indexes only (:func:`hermes_state_fts.detach_trigram`). For one
    without FTS5: detach the indexes (the caller's transaction): the FTS sync
    triggers dropped and ``fts_stale`` set (reason ``fts5-unavailable``), the search index
    marked damaged. Every later write of ``messages`` then works on this SQLite, and
    every process reads the indexes as unusable until one with FTS5 rebuilds them. Nothing
    is written when they are detached already."""
    if fulltext.level_of(conn) == fulltext.NO_TRIGRAM:
        if fts.trigram_fed(conn):
            fts.detach_trigram(conn, reason=fulltext.TRIGRAM_UNAVAILABLE_REASON)
        return
    if not index_attached(conn):
        return
    state = fts.index_state(conn)
    if (state.stale is None or state.rebuilding
            or len(fts.missing_triggers(conn)) < len(fts.FTS_TRIGGER_NAMES)):
        fts.detach_index(conn, reason=fulltext.UNAVAILABLE_REASON)
    if impact.read_state(conn) is not None:
        impact.mark_index_damaged(conn)


def _create_fresh_without_index(conn: sqlite3.Connection, /) -> bool:
    if read_version(conn) is not None:
        return False
    _create_tables(conn)
    for statement in split_sql(INDEXES_SQL):
        conn.execute(statement)
    set_meta(conn, fts.SPELLING_KEY, fts.CJK_SPELLING)
    fts.detach_index(conn, reason=fulltext.UNAVAILABLE_REASON)
    _set_version(conn, SCHEMA_VERSION)
    return True


# Set when a build without FTS5 (or its trigram tokenizer) brought a file past the FTS
# generation step without replacing the earlier generation's tables (it cannot drop or
# create them): the next open with FTS5 replaces them before anything else.
FTS_GENERATION_DUE_KEY = "fts_generation_due"
FTS_GENERATION_DUE_SQL = "SELECT 1 FROM state_meta WHERE key = 'fts_generation_due'"


def _fts_generation_due(conn: sqlite3.Connection, /) -> bool:
    return conn.execute(FTS_GENERATION_DUE_SQL).fetchone() is not None


def _replace_fts_generation(conn: sqlite3.Connection, /) -> None:
    """The FTS generation step a build without FTS5 left due (the caller's transaction)."""
    if _fts_generation_due(conn):
        _migrate_fts_indexes(conn)
        conn.execute("DELETE FROM state_meta WHERE key = ?", (FTS_GENERATION_DUE_KEY,))


def _migrate_without_index(conn: sqlite3.Connection, /, migration: Migration) -> None:
    """One migration step on a build without FTS5: the FTS generation step only detaches the
    old index (this SQLite can neither drop nor create an FTS5 table) and leaves its
    replacement due (:data:`FTS_GENERATION_DUE_KEY`)."""
    if (read_version(conn) or 0) >= migration.version:
        return
    if migration.apply is _migrate_fts_indexes:
        _drop_fts_triggers(conn)
        fts.detach_index(conn, reason=fulltext.UNAVAILABLE_REASON)
        set_meta(conn, FTS_GENERATION_DUE_KEY, str(migration.version))
    else:
        migration.apply(conn)
    if migration.version == SCHEMA_VERSION:
        for statement in split_sql(INDEXES_SQL):
            conn.execute(statement)
    _set_version(conn, migration.version)


def _finish_upgrade_without_index(conn: sqlite3.Connection, /) -> None:
    if (read_version(conn) or 0) >= SCHEMA_VERSION:
        return
    for statement in split_sql(INDEXES_SQL):
        conn.execute(statement)
    _set_version(conn, SCHEMA_VERSION)


def _bring_forward_without_index(
    conn: sqlite3.Connection, /, write: WriteFn, found: int | None
) -> None:
    """A store found at version ``found`` brought to this one with its indexes left out: the
    canonical schema completed, or every migration run without them."""
    if found == SCHEMA_VERSION:
        if _lacks_canonical_schema(conn):
            write(_complete_canonical)
        return
    write(_bootstrap)
    for migration in MIGRATIONS:
        write(functools.partial(_migrate_without_index, migration=migration))
    write(_finish_upgrade_without_index)


def _ensure_without_index(conn: sqlite3.Connection, /, write: WriteFn) -> int | None:
    """:func:`ensure_schema` at level ``"none"``: the canonical schema only, the index detached
    (reads only, for a file already so)."""
    found = refuse_newer(conn)
    if found is None and write(_create_fresh_without_index):
        return None
    _bring_forward_without_index(conn, write, found)
    if index_attached(conn):
        write(detach_unavailable)
    return found


# --- a build without the trigram tokenizer -------------------------------------------------------


def _create_fresh_without_trigram(conn: sqlite3.Connection, /) -> bool:
    if read_version(conn) is not None:
        return False
    _create_tables(conn)
    script = INDEXES_SQL + FTS_SQL_WITHOUT_TRIGRAM + FTS_TRIGGERS_SQL_WITHOUT_TRIGRAM
    for statement in split_sql(script):
        conn.execute(statement)
    set_meta(conn, fts.SPELLING_KEY, fts.CJK_SPELLING)
    fts.detach_trigram(conn, reason=fulltext.TRIGRAM_UNAVAILABLE_REASON)
    impact.create_index(conn)
    _set_version(conn, SCHEMA_VERSION)
    return True


def _ensure_without_trigram(conn: sqlite3.Connection, /, write: WriteFn) -> int | None:
    """:func:`ensure_schema` at level ``"no-trigram"``: a new store gets every index but the
    trigram one; an indexed store's triggers stop feeding it (its marker set), the two other
    indexes kept. A file this SQLite cannot bring forward with its indexes (an FTS generation
    before the current one) has them detached, as at level ``"none"``."""
    found = refuse_newer(conn)
    if found is None and write(_create_fresh_without_trigram):
        return None
    _bring_forward_without_index(conn, write, found)
    if fts.trigram_fed(conn):
        write(detach_unavailable)
    if fts.earlier_update_trigger(conn) is not None:
        write(fts.replace_earlier_update_trigger)
    return found
