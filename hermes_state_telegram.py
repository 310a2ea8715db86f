"""Telegram DM topic mode: which private chats run one session per topic, and the bindings.

The two tables are created by the first opt-in write, never at open. Readers treat a missing
table as empty, so a store that never sees ``/topic`` keeps its shape. Bindings cascade on
session delete. A session binds to one topic; a second raises
:class:`TopicAlreadyLinkedError`, whose words the gateway matches. Ids are compared as
``str(value)``."""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from hermes_state_common import (
    Key,
    now,
    row_to_dict,
    stored_text,
)
from hermes_state_connect import (
    get_meta,
    set_meta,
    split_sql,
    table_exists,
)
from hermes_state_errors import (
    InvalidInputError,
    TopicAlreadyLinkedError,
    is_sqlite_lock_error,
)
from hermes_state_sessions import require_session

__all__ = [
    "TOPIC_SCHEMA_VERSION",
    "apply_telegram_topic_migration",
    "enable_telegram_topic_mode",
    "disable_telegram_topic_mode",
    "is_telegram_topic_mode_enabled",
    "bind_telegram_topic",
    "get_telegram_topic_binding",
    "get_telegram_topic_binding_by_session",
    "list_telegram_topic_bindings_for_chat",
    "is_telegram_session_linked_to_topic",
    "delete_telegram_topic_binding",
    "list_unlinked_telegram_sessions_for_user",
]

logger = logging.getLogger("hermes_state")

TOPIC_SCHEMA_VERSION = "2"
SCHEMA_VERSION_KEY = "telegram_dm_topic_schema_version"
MODE_TABLE = "telegram_dm_topic_mode"
BINDINGS_TABLE = "telegram_dm_topic_bindings"
REBUILT_BINDINGS_TABLE = "telegram_dm_topic_bindings_rebuilt"

MODE_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS telegram_dm_topic_mode (
    chat_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    enabled INTEGER NOT NULL DEFAULT 1,
    activated_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    has_topics_enabled INTEGER,
    allows_users_to_create_topics INTEGER,
    capability_checked_at REAL,
    intro_message_id TEXT,
    pinned_message_id TEXT
)
"""

# {table} is one of the two constant names above (the live table, or its rebuilt copy).
BINDINGS_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS {table} (
    chat_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    session_key TEXT NOT NULL,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    managed_mode TEXT NOT NULL DEFAULT 'auto',
    linked_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (chat_id, thread_id)
)
"""

BINDINGS_INDEXES_SQL = """
CREATE UNIQUE INDEX IF NOT EXISTS idx_telegram_dm_topic_bindings_session
    ON telegram_dm_topic_bindings(session_id);
CREATE INDEX IF NOT EXISTS idx_telegram_dm_topic_bindings_user
    ON telegram_dm_topic_bindings(user_id, chat_id);
"""

BINDING_COLUMNS = (
    "chat_id", "thread_id", "user_id", "session_key", "session_id", "managed_mode",
    "linked_at", "updated_at",
)

# The session foreign key of the live bindings table, with its ON DELETE action.
BINDING_SESSION_FK_SQL = """
SELECT on_delete FROM pragma_foreign_key_list('telegram_dm_topic_bindings')
WHERE "table" = 'sessions' AND "from" = 'session_id'
"""


def _cascades(conn: sqlite3.Connection, /) -> bool:
    return any(row[0].upper() == "CASCADE" for row in conn.execute(BINDING_SESSION_FK_SQL))


BINDINGS_COLUMNS_SQL = "SELECT name FROM pragma_table_info('telegram_dm_topic_bindings')"
# {columns}: the binding columns the old table has (names from BINDING_COLUMNS only).
COPY_BINDINGS_SQL = """
INSERT INTO telegram_dm_topic_bindings_rebuilt ({columns})
SELECT {columns} FROM telegram_dm_topic_bindings WHERE session_id IN (SELECT id FROM sessions)
"""
COUNT_BINDINGS_SQL = "SELECT COUNT(*) FROM telegram_dm_topic_bindings"
DROP_BINDINGS_SQL = "DROP TABLE telegram_dm_topic_bindings"
RENAME_REBUILT_SQL = (
    "ALTER TABLE telegram_dm_topic_bindings_rebuilt RENAME TO telegram_dm_topic_bindings"
)


def _rebuild_bindings(conn: sqlite3.Connection, /) -> None:
    """Replace a bindings table without the cascade by one with it (SQLite cannot alter a
    foreign key), copying every binding whose session still exists."""
    live = {r[0] for r in conn.execute(BINDINGS_COLUMNS_SQL)}
    columns = ", ".join(c for c in BINDING_COLUMNS if c in live)
    conn.execute(BINDINGS_TABLE_SQL.format(table=REBUILT_BINDINGS_TABLE))
    copied = conn.execute(COPY_BINDINGS_SQL.format(columns=columns)).rowcount
    (total,) = conn.execute(COUNT_BINDINGS_SQL).fetchone()
    if total > copied:
        logger.warning("%d Telegram topic binding(s) named deleted sessions; not copied",
                       total - copied)
    conn.execute(DROP_BINDINGS_SQL)
    conn.execute(RENAME_REBUILT_SQL)


def apply_telegram_topic_migration(conn: sqlite3.Connection, /) -> None:
    """Create the two topic tables when missing, give an older bindings table its cascade, and
    record topic schema version 2. Idempotent; writes nothing when all of it is in place."""
    if table_exists(conn, BINDINGS_TABLE) and not _cascades(conn):
        _rebuild_bindings(conn)
    conn.execute(MODE_TABLE_SQL)
    conn.execute(BINDINGS_TABLE_SQL.format(table=BINDINGS_TABLE))
    for statement in split_sql(BINDINGS_INDEXES_SQL):
        conn.execute(statement)
    if get_meta(conn, SCHEMA_VERSION_KEY) != TOPIC_SCHEMA_VERSION:
        set_meta(conn, SCHEMA_VERSION_KEY, TOPIC_SCHEMA_VERSION)


# --- arguments -------------------------------------------------------------------------------


def _written_id(name: str, value: object) -> str:
    """An id about to be stored: ``str(value)``; None and lone surrogates are refused."""
    text = None if value is None else stored_text(value)
    if text is None:
        raise InvalidInputError(f"{name} must be an id (a string or a number), got {value!r}")
    return text


def _flag(name: str, value: bool | None) -> int | None:
    if value is None:
        return None
    if not isinstance(value, (bool, int)):
        raise InvalidInputError(f"{name} must be True, False or None, got {value!r}")
    return 1 if value else 0


def _limit(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"limit must be an int, got {value!r}")
    return max(value, 0)


def _rows(conn: sqlite3.Connection, /, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
    """The rows of a read over the topic tables; none while a table it reads does not exist.
    A missing key (lone surrogate) reads as no row."""
    if any(p is None for p in params):
        return []
    try:
        cursor = conn.execute(sql, params)
    except sqlite3.OperationalError as exc:
        if is_sqlite_lock_error(exc) or (
            table_exists(conn, MODE_TABLE) and table_exists(conn, BINDINGS_TABLE)
        ):
            raise
        return []
    return [row_to_dict(cursor, r) for r in cursor.fetchall()]


# --- topic mode ------------------------------------------------------------------------------

UPSERT_MODE_SQL = """
INSERT INTO telegram_dm_topic_mode (
    chat_id, user_id, enabled, activated_at, updated_at,
    has_topics_enabled, allows_users_to_create_topics, capability_checked_at
) VALUES (?, ?, 1, ?, ?, ?, ?, ?)
ON CONFLICT (chat_id) DO UPDATE SET
    user_id = excluded.user_id,
    enabled = 1,
    updated_at = excluded.updated_at,
    has_topics_enabled = excluded.has_topics_enabled,
    allows_users_to_create_topics = excluded.allows_users_to_create_topics,
    capability_checked_at = excluded.capability_checked_at
"""


def enable_telegram_topic_mode(
    conn: sqlite3.Connection,
    /,
    *,
    chat_id: str,
    user_id: str,
    has_topics_enabled: bool | None = None,
    allows_users_to_create_topics: bool | None = None,
) -> None:
    """Turn topic mode on for one private chat (creating the tables if needed). The capability
    flags are overwritten on every enable; ``activated_at`` is set by the first one only."""
    chat, user = _written_id("chat_id", chat_id), _written_id("user_id", user_id)
    flags = (_flag("has_topics_enabled", has_topics_enabled),
             _flag("allows_users_to_create_topics", allows_users_to_create_topics))
    apply_telegram_topic_migration(conn)
    stamp = now()
    conn.execute(UPSERT_MODE_SQL, (chat, user, stamp, stamp, *flags, stamp))


DISABLE_MODE_SQL = "UPDATE telegram_dm_topic_mode SET enabled = 0, updated_at = ? WHERE chat_id = ?"
DELETE_CHAT_BINDINGS_SQL = "DELETE FROM telegram_dm_topic_bindings WHERE chat_id = ?"


def disable_telegram_topic_mode(
    conn: sqlite3.Connection, /, *, chat_id: str, clear_bindings: bool = True
) -> None:
    """Turn topic mode off for one chat; ``clear_bindings`` also drops the chat's bindings.
    Without the tables this does nothing (and creates nothing)."""
    chat = stored_text(chat_id)
    if chat is None:
        return
    if table_exists(conn, MODE_TABLE):
        conn.execute(DISABLE_MODE_SQL, (now(), chat))
    if clear_bindings and table_exists(conn, BINDINGS_TABLE):
        conn.execute(DELETE_CHAT_BINDINGS_SQL, (chat,))


MODE_ENABLED_SQL = """
SELECT enabled FROM telegram_dm_topic_mode WHERE chat_id = ? AND user_id = ? AND enabled
"""


def is_telegram_topic_mode_enabled(
    conn: sqlite3.Connection, /, *, chat_id: str, user_id: str
) -> bool:
    """True only when the chat's mode row belongs to that user and is enabled."""
    return bool(_rows(conn, MODE_ENABLED_SQL, (stored_text(chat_id), stored_text(user_id))))


# --- bindings --------------------------------------------------------------------------------

SELECT_BINDING_SQL = f"SELECT {', '.join(BINDING_COLUMNS)} FROM telegram_dm_topic_bindings"
BINDING_BY_TOPIC_SQL = SELECT_BINDING_SQL + " WHERE chat_id = ? AND thread_id = ?"
BINDING_BY_SESSION_SQL = SELECT_BINDING_SQL + " WHERE session_id = ?"
BINDINGS_OF_CHAT_SQL = (
    SELECT_BINDING_SQL + " WHERE chat_id = ? ORDER BY updated_at DESC, thread_id"
)
UPSERT_BINDING_SQL = """
INSERT INTO telegram_dm_topic_bindings (
    chat_id, thread_id, user_id, session_key, session_id, managed_mode, linked_at, updated_at
) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (chat_id, thread_id) DO UPDATE SET
    user_id = excluded.user_id,
    session_key = excluded.session_key,
    session_id = excluded.session_id,
    managed_mode = excluded.managed_mode,
    updated_at = excluded.updated_at
"""


def bind_telegram_topic(
    conn: sqlite3.Connection,
    /,
    *,
    chat_id: str,
    thread_id: str,
    user_id: str,
    session_key: str,
    session_id: str,
    managed_mode: str = "auto",
) -> None:
    """Bind the topic (chat, thread) to a session (creating the tables if needed); see the
    module docstring for the one-topic-per-session rule."""
    values = {name: _written_id(name, value) for name, value in (
        ("chat_id", chat_id), ("thread_id", thread_id), ("user_id", user_id),
        ("session_key", session_key), ("session_id", session_id),
        ("managed_mode", managed_mode))}
    require_session(conn, values["session_id"])
    apply_telegram_topic_migration(conn)
    for bound in _rows(conn, BINDING_BY_SESSION_SQL, (values["session_id"],)):
        if (bound["chat_id"], bound["thread_id"]) != (values["chat_id"], values["thread_id"]):
            raise TopicAlreadyLinkedError(
                f"session {values['session_id']!r} is already linked to another Telegram topic"
                f" (chat {bound['chat_id']!r}, thread {bound['thread_id']!r})",
                session_id=values["session_id"],
                chat_id=bound["chat_id"],
                thread_id=bound["thread_id"],
            )
    stamp = now()
    conn.execute(UPSERT_BINDING_SQL, (*values.values(), stamp, stamp))


def get_telegram_topic_binding(
    conn: sqlite3.Connection, /, *, chat_id: Key, thread_id: Key
) -> dict[str, Any] | None:
    """The binding of one topic, or None."""
    found = _rows(conn, BINDING_BY_TOPIC_SQL, (stored_text(chat_id), stored_text(thread_id)))
    return found[0] if found else None


def get_telegram_topic_binding_by_session(
    conn: sqlite3.Connection, /, *, session_id: str
) -> dict[str, Any] | None:
    """The binding that names the session, or None."""
    found = _rows(conn, BINDING_BY_SESSION_SQL, (stored_text(session_id),))
    return found[0] if found else None


def list_telegram_topic_bindings_for_chat(
    conn: sqlite3.Connection, /, *, chat_id: str
) -> list[dict[str, Any]]:
    """The chat's bindings, most recently updated first."""
    return _rows(conn, BINDINGS_OF_CHAT_SQL, (stored_text(chat_id),))


def is_telegram_session_linked_to_topic(conn: sqlite3.Connection, /, *, session_id: str) -> bool:
    """True when a binding names the session."""
    return bool(_rows(conn, BINDING_BY_SESSION_SQL, (stored_text(session_id),)))


DELETE_BINDING_SQL = "DELETE FROM telegram_dm_topic_bindings WHERE chat_id = ? AND thread_id = ?"
CHAT_HAS_BINDINGS_SQL = "SELECT 1 FROM telegram_dm_topic_bindings WHERE chat_id = ? LIMIT 1"


def delete_telegram_topic_binding(
    conn: sqlite3.Connection, /, *, chat_id: Key, thread_id: Key
) -> int:
    """Drop one topic's binding; returns the rows removed (0 when absent or without tables).
    Removing the chat's last binding switches the chat's topic mode off in the same
    transaction."""
    chat, thread = stored_text(chat_id), stored_text(thread_id)
    if chat is None or thread is None or not table_exists(conn, BINDINGS_TABLE):
        return 0
    removed = conn.execute(DELETE_BINDING_SQL, (chat, thread)).rowcount
    last_one = removed and conn.execute(CHAT_HAS_BINDINGS_SQL, (chat,)).fetchone() is None
    if last_one and table_exists(conn, MODE_TABLE):
        conn.execute(DISABLE_MODE_SQL, (now(), chat))
    return removed


# --- sessions not bound to a topic -----------------------------------------------------------

PREVIEW_CHARS = 60

# A user's Telegram sessions as enriched rows: every column, the first user message (for the
# preview) and the newest message time, else the start. {unbound} is empty, or the clause
# below when the bindings table exists.
USER_TELEGRAM_SESSIONS_SQL = """
SELECT s.*,
    (SELECT m.content FROM messages m
     WHERE m.session_id = s.id AND m.role = 'user' AND m.content IS NOT NULL
     ORDER BY m.timestamp, m.id LIMIT 1) AS _first_user,
    COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = s.id),
             s.started_at) AS last_active
FROM sessions s
WHERE s.source = 'telegram' AND s.user_id = ? {unbound}
ORDER BY last_active DESC, s.started_at DESC, s.id DESC
LIMIT ?
"""
UNBOUND_CLAUSE = (
    "AND NOT EXISTS (SELECT 1 FROM telegram_dm_topic_bindings b WHERE b.session_id = s.id)"
)


def _preview(text: str | None) -> str:
    """The first user message with CR and LF as spaces, trimmed, cut to 60 characters plus
    ``...``."""
    if not text:
        return ""
    flat = text.replace("\r", " ").replace("\n", " ").strip()
    return flat if len(flat) <= PREVIEW_CHARS else flat[:PREVIEW_CHARS] + "..."


def list_unlinked_telegram_sessions_for_user(
    conn: sqlite3.Connection, /, *, chat_id: str, user_id: str, limit: int = 10
) -> list[dict[str, Any]]:
    """The user's Telegram sessions no topic is bound to, most recently active first, with
    ``preview`` and ``last_active``. ``chat_id`` is accepted and not used as a filter; without
    the bindings table every Telegram session of the user is unlinked."""
    user = stored_text(user_id)
    if user is None:
        return []
    unbound = UNBOUND_CLAUSE if table_exists(conn, BINDINGS_TABLE) else ""
    cursor = conn.execute(USER_TELEGRAM_SESSIONS_SQL.format(unbound=unbound),
                          (user, _limit(limit)))
    rows = [row_to_dict(cursor, r) for r in cursor.fetchall()]
    for row in rows:
        row["preview"] = _preview(row.pop("_first_user"))
    return rows
