"""Messages: one row per turn, written once, copied with its identity, replayed byte for byte.

* A :class:`MessageRow` is the single way a message row is written (append, replace,
  compression generations, import, the gateway's exception path: :func:`insert_row`, or
  :func:`insert_message` from a mapping of fields). It is built field by field: text cleaned,
  each field checked, ``message_uid`` (and ``tool_call_uids`` for an assistant row with tool
  calls) issued unless the row already has them, a tool result paired with its call; writing
  it encodes the JSON-typed fields and computes the CJK index text. A copy passes the uids it
  carries and they are kept as they are.
* Lone surrogates are the only change ever made to text (SQLite cannot bind them).
* Appending a user turn resumes its conversation, lifting an archive only the idle clean-up
  set (see ``hermes_state_sessions``); copies made by compression, replacement or import
  never count as a resume.
* A reasoning-only successful reply keeps ``content`` empty; its text lives in
  ``reasoning``/``reasoning_content`` and in ``api_content``, which is what replays.
* :func:`conversation` is the OpenAI-format replay list: ``content`` is ``api_content`` when the
  bytes sent differ from ``content``; each turn carries its ``message_uid`` and the runtime
  ``_``-keys; display metadata stays out.

**What the caller saw.** Rewriting a session's live rows (:func:`replace_messages` here,
``archive_and_compact`` in ``hermes_state_compression``) is done by a caller that read the
session and built the new rows from what it read, while other processes may go on appending:
the compression lock does not exclude appends. So a rewrite takes ``seen_through_id``, the id
of the newest row of the session the caller read, and never archives or deletes a live row
above it. Ids are issued in commit order (``AUTOINCREMENT``, one writer at a time), so every
row at or below the newest row a read returned already existed when it read; a row above it
was appended after. A row above the bound whose ``message_uid`` the caller writes again is one
it knows, and counts as seen. Every other row above the bound stays live after the new rows:
:func:`take_unseen` lifts it out (every column but ``id``) before the rewrite and
:func:`put_back` inserts it again afterwards, in its order, so it keeps its ``message_uid``,
timestamp, tool-call uids and flags and only its physical id changes (as any copy's does), and
the FTS triggers follow both steps. ``None`` means the caller vouches for every row present.

What a handle remembers when its caller passes no bound lives in ``hermes_state_seen``.
"""

from __future__ import annotations

import math
import re
import sqlite3
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import hermes_state_fts as fts
from hermes_state_common import clean_optional, clean_text, decode_json, encode_json, now
from hermes_state_errors import InvalidInputError, SessionNotFoundError
from hermes_state_sessions import lift_auto_archive, session_ancestors

__all__ = [
    "MESSAGE_FIELDS",
    "JSON_FIELDS",
    "RECOUNT_SQL",
    "MessageRow",
    "insert_row",
    "insert_message",
    "append_message",
    "get_messages",
    "newest_id",
    "get_messages_as_conversation",
    "read_conversation",
    "message_fields",
    "check_bound",
    "take_unseen",
    "put_back",
    "replace_messages",
    "tool_call_count_of",
]

# The append_message keywords, in column order (session_id comes first in the row).
MESSAGE_FIELDS = (
    "role",
    "content",
    "tool_name",
    "tool_calls",
    "tool_call_id",
    "token_count",
    "finish_reason",
    "reasoning",
    "reasoning_content",
    "reasoning_details",
    "codex_reasoning_items",
    "codex_message_items",
    "platform_message_id",
    "observed",
    "effect_disposition",
    "api_content",
    "display_kind",
    "display_metadata",
    "message_uid",
    "timestamp",
    "absorbed_message_uids",
    "tool_call_uids",
    "tool_call_uid",
    "active",
    "compacted",
)
JSON_FIELDS = frozenset(
    {
        "tool_calls",
        "reasoning_details",
        "codex_reasoning_items",
        "codex_message_items",
        "display_metadata",
        "absorbed_message_uids",
        "tool_call_uids",
    }
)
_FLAG_FIELDS = ("observed", "active", "compacted")
_COLUMNS = ("session_id", *MESSAGE_FIELDS, "search_cjk")

INSERT_MESSAGE_SQL = (
    f"INSERT INTO messages ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
)
# Counters move in the same transaction as the insert; no row updated means no such session.
COUNT_MESSAGE_SQL = """
UPDATE sessions SET message_count = message_count + 1,
                    tool_call_count = tool_call_count + ?
WHERE id = ?
"""

_UID_RE = re.compile(r"[0-9a-f]{32}")


def new_uid() -> str:
    return uuid.uuid4().hex


def _check_uid(value: Any, field: str) -> str:
    if not isinstance(value, str) or not _UID_RE.fullmatch(value):
        raise ValueError(f"{field} must be 32 lowercase hex characters, got {value!r}")
    return value


def tool_call_count_of(role: str, tool_calls: Any) -> int:
    """Tool calls an assistant row makes (tool-result rows make none)."""
    if role != "assistant" or not isinstance(tool_calls, (list, tuple)):
        return 0
    return len(tool_calls)


def _tool_call_ids(tool_calls: Any) -> list[str]:
    if not isinstance(tool_calls, (list, tuple)):
        return []
    ids = []
    for call in tool_calls:
        call_id = call.get("id") if isinstance(call, Mapping) else None
        if isinstance(call_id, str) and call_id not in ids:
            ids.append(call_id)
    return ids


# The latest assistant row of the session that issued uids for its tool calls.
# The latest assistant row of the session that issued uids for its tool calls, and how many
# results for this call id have been written after it.
LAST_CALLER_SQL = """
SELECT a.tool_call_uids,
       (SELECT COUNT(*) FROM messages t
        WHERE t.session_id = a.session_id AND t.id > a.id AND t.role = 'tool'
          AND t.tool_call_id = :call_id AND t.active = 1)
FROM messages a
WHERE a.session_id = :session_id AND a.role = 'assistant' AND a.active = 1
  AND a.tool_call_uids IS NOT NULL
ORDER BY a.id DESC LIMIT 1
"""


def _pick_uid(value: Any, occurrence: int) -> str | None:
    """The uid of the ``occurrence``-th result for a call id (a list after folded turns)."""
    if isinstance(value, str):
        return value
    picked = value[occurrence] if isinstance(value, list) and occurrence < len(value) else None
    return picked if isinstance(picked, str) else None


def _pair_tool_result(
    conn: sqlite3.Connection, /, session_id: str, tool_call_id: str
) -> str | None:
    params = {"session_id": session_id, "call_id": tool_call_id}
    row = conn.execute(LAST_CALLER_SQL, params).fetchone()
    if row is None:
        return None
    mapping = decode_json(row[0])
    if not isinstance(mapping, dict) or tool_call_id not in mapping:
        return None
    return _pick_uid(mapping[tool_call_id], row[1])


def _text(name: str, value: Any) -> str | None:
    """A text field: a string or None; lone surrogates removed."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a string or None, got {type(value).__name__}")
    return clean_optional(value)


def _role(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"role must be a non-empty string, got {value!r}")
    return clean_text(value)


def _token_count(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError("token_count must be an int or None")
    return value


def _timestamp(value: Any) -> float:
    """The row's time: the one given (a finite number), else now."""
    if value is None:
        return now()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"timestamp must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"timestamp must be finite, got {value!r}")
    return float(value)


def _message_uid(value: str | None) -> str:
    """The uid a copy carries (checked), or a new one for a new message."""
    return new_uid() if value is None else _check_uid(value, "message_uid")


def _tool_call_uids(role: str, tool_calls: Any, given: Any) -> Any:
    """An assistant row that makes tool calls issues one uid per call id, unless it carries
    its own mapping."""
    if given is not None or role != "assistant":
        return given
    return {call_id: new_uid() for call_id in _tool_call_ids(tool_calls)} or None


def _tool_call_uid(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    role: str,
    tool_call_id: str | None,
    active: bool,
    given: str | None,
) -> str | None:
    """A live tool result takes the uid its call was issued, unless it carries one."""
    uid = given
    if uid is None and role == "tool" and tool_call_id and active:
        uid = _pair_tool_result(conn, session_id, tool_call_id)
    return None if uid is None else _check_uid(uid, "tool_call_uid")


def _reasoning_only_reply(
    role: str,
    content: str | None,
    finish_reason: str | None,
    reasoning: str | None,
    reasoning_content: str | None,
    tool_calls: Any,
    api_content: str | None,
) -> tuple[str | None, str | None]:
    """(content, api_content) of the row. A successful assistant reply made of reasoning only
    keeps ``content`` empty, and its reasoning text is what replays."""
    reasoning_text = reasoning_content or reasoning
    if (
        role == "assistant"
        and not content
        and finish_reason == "stop"
        and reasoning_text
        and not tool_calls
    ):
        return "", reasoning_text if api_content is None else api_content
    return content, api_content


@dataclass(frozen=True, slots=True)
class MessageRow:
    """One message row as it is inserted, every field checked (:meth:`build`).

    Text fields are strings or None (lone surrogates removed); the JSON-typed fields hold any
    JSON value, encoded only when the row is written; flags are bools."""

    session_id: str
    role: str
    content: str | None
    tool_name: str | None
    tool_calls: Any
    tool_call_id: str | None
    token_count: int | None
    finish_reason: str | None
    reasoning: str | None
    reasoning_content: str | None
    reasoning_details: Any
    codex_reasoning_items: Any
    codex_message_items: Any
    platform_message_id: str | None
    observed: bool
    effect_disposition: str | None
    api_content: str | None
    display_kind: str | None
    display_metadata: Any
    message_uid: str
    timestamp: float
    absorbed_message_uids: Any
    tool_call_uids: Any
    tool_call_uid: str | None
    active: bool
    compacted: bool

    @classmethod
    def build(
        cls,
        conn: sqlite3.Connection,
        /,
        session_id: str,
        role: Any = None,
        content: Any = None,
        tool_name: Any = None,
        tool_calls: Any = None,
        tool_call_id: Any = None,
        token_count: Any = None,
        finish_reason: Any = None,
        reasoning: Any = None,
        reasoning_content: Any = None,
        reasoning_details: Any = None,
        codex_reasoning_items: Any = None,
        codex_message_items: Any = None,
        platform_message_id: Any = None,
        observed: Any = False,
        effect_disposition: Any = None,
        api_content: Any = None,
        display_kind: Any = None,
        display_metadata: Any = None,
        message_uid: Any = None,
        timestamp: Any = None,
        absorbed_message_uids: Any = None,
        tool_call_uids: Any = None,
        tool_call_uid: Any = None,
        active: Any = None,
        compacted: Any = False,
    ) -> MessageRow:
        """Check and complete one message's fields (``conn`` pairs a tool result with its
        call). ``active`` None means live; uids are issued where none is given."""
        role = _role(role)
        content = _text("content", content)
        finish_reason = _text("finish_reason", finish_reason)
        reasoning = _text("reasoning", reasoning)
        reasoning_content = _text("reasoning_content", reasoning_content)
        content, api_content = _reasoning_only_reply(
            role, content, finish_reason, reasoning, reasoning_content, tool_calls,
            _text("api_content", api_content),
        )
        tool_call_id = _text("tool_call_id", tool_call_id)
        live = True if active is None else bool(active)
        return cls(
            session_id=session_id,
            role=role,
            content=content,
            tool_name=_text("tool_name", tool_name),
            tool_calls=tool_calls,
            tool_call_id=tool_call_id,
            token_count=_token_count(token_count),
            finish_reason=finish_reason,
            reasoning=reasoning,
            reasoning_content=reasoning_content,
            reasoning_details=reasoning_details,
            codex_reasoning_items=codex_reasoning_items,
            codex_message_items=codex_message_items,
            platform_message_id=_text("platform_message_id", platform_message_id),
            observed=bool(observed),
            effect_disposition=_text("effect_disposition", effect_disposition),
            api_content=api_content,
            display_kind=_text("display_kind", display_kind),
            display_metadata=display_metadata,
            message_uid=_message_uid(_text("message_uid", message_uid)),
            timestamp=_timestamp(timestamp),
            absorbed_message_uids=absorbed_message_uids,
            tool_call_uids=_tool_call_uids(role, tool_calls, tool_call_uids),
            tool_call_uid=_tool_call_uid(
                conn, session_id, role, tool_call_id, live, _text("tool_call_uid", tool_call_uid)
            ),
            active=live,
            compacted=bool(compacted),
        )

    @classmethod
    def from_fields(
        cls, conn: sqlite3.Connection, /, session_id: str, fields: Mapping[str, Any]
    ) -> MessageRow:
        """:meth:`build` from a mapping of message fields (see :data:`MESSAGE_FIELDS`)."""
        unknown = set(fields) - set(MESSAGE_FIELDS)
        if unknown:
            raise TypeError(f"unknown message fields: {', '.join(sorted(unknown))}")
        return cls.build(conn, session_id, **fields)

    @property
    def tool_call_count(self) -> int:
        return tool_call_count_of(self.role, self.tool_calls)

    def values(self) -> tuple[Any, ...]:
        """The row's INSERT parameters, in column order: JSON fields encoded, flags as
        integers, and the CJK index text (of the content and the encoded tool calls)."""
        tool_calls = encode_json(self.tool_calls)
        return (
            self.session_id,
            self.role,
            self.content,
            self.tool_name,
            tool_calls,
            self.tool_call_id,
            self.token_count,
            self.finish_reason,
            self.reasoning,
            self.reasoning_content,
            encode_json(self.reasoning_details),
            encode_json(self.codex_reasoning_items),
            encode_json(self.codex_message_items),
            self.platform_message_id,
            int(self.observed),
            self.effect_disposition,
            self.api_content,
            self.display_kind,
            encode_json(self.display_metadata),
            self.message_uid,
            self.timestamp,
            encode_json(self.absorbed_message_uids),
            encode_json(self.tool_call_uids),
            self.tool_call_uid,
            int(self.active),
            int(self.compacted),
            fts.cjk_index_text(self.content, tool_calls),
        )


SESSION_EXISTS_SQL = "SELECT 1 FROM sessions WHERE id = ?"


def insert_row(conn: sqlite3.Connection, /, row: MessageRow, *, count: bool = True) -> int:
    """Write one message row (the caller's transaction) and return its id.

    ``count`` moves the session's counters (an append); copies made by compression or
    replacement pass False and the caller sets the counters it means."""
    if count:
        if conn.execute(COUNT_MESSAGE_SQL, (row.tool_call_count, row.session_id)).rowcount == 0:
            raise SessionNotFoundError(row.session_id)
    elif not conn.execute(SESSION_EXISTS_SQL, (row.session_id,)).fetchone():
        raise SessionNotFoundError(row.session_id)
    cursor = conn.execute(INSERT_MESSAGE_SQL, row.values())
    return int(cursor.lastrowid or 0)


def insert_message(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    fields: Mapping[str, Any],
    *,
    count: bool = True,
) -> int:
    """:func:`insert_row` of the row built from message ``fields`` (append, export or replay
    keys already mapped: see :func:`message_fields`)."""
    return insert_row(conn, MessageRow.from_fields(conn, session_id, fields), count=count)


def append_message(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    role: str,
    content: str | None = None,
    tool_name: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    tool_call_id: str | None = None,
    token_count: int | None = None,
    finish_reason: str | None = None,
    reasoning: str | None = None,
    reasoning_content: str | None = None,
    reasoning_details: Any = None,
    codex_reasoning_items: Any = None,
    codex_message_items: Any = None,
    platform_message_id: str | None = None,
    observed: bool = False,
    effect_disposition: str | None = None,
    api_content: str | None = None,
    display_kind: str | None = None,
    display_metadata: Any = None,
    message_uid: str | None = None,
    timestamp: float | None = None,
    absorbed_message_uids: list[str] | None = None,
    tool_call_uids: dict[str, Any] | None = None,
    tool_call_uid: str | None = None,
) -> int:
    """Append one message and move the session's counters (the caller's transaction).

    Returns the row id. JSON-typed fields take any JSON value and are decoded on read. A new
    user turn (not an ``observed`` one) resumes the conversation: an archive the idle clean-up
    set is lifted, a deliberate one stays."""
    row = MessageRow.build(
        conn,
        session_id,
        role=role,
        content=content,
        tool_name=tool_name,
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
        token_count=token_count,
        finish_reason=finish_reason,
        reasoning=reasoning,
        reasoning_content=reasoning_content,
        reasoning_details=reasoning_details,
        codex_reasoning_items=codex_reasoning_items,
        codex_message_items=codex_message_items,
        platform_message_id=platform_message_id,
        observed=observed,
        effect_disposition=effect_disposition,
        api_content=api_content,
        display_kind=display_kind,
        display_metadata=display_metadata,
        message_uid=message_uid,
        timestamp=timestamp,
        absorbed_message_uids=absorbed_message_uids,
        tool_call_uids=tool_call_uids,
        tool_call_uid=tool_call_uid,
    )
    row_id = insert_row(conn, row)
    if role == "user" and not observed:
        lift_auto_archive(conn, session_id, check=True)
    return row_id


# --- reading ---------------------------------------------------------------------------------

_READ_COLUMNS = ("id", "session_id", *MESSAGE_FIELDS)
SELECT_MESSAGES_SQL = f"SELECT {', '.join(_READ_COLUMNS)} FROM messages"


def row_to_message(row: Sequence[Any]) -> dict[str, Any]:
    message = dict(zip(_READ_COLUMNS, row, strict=True))
    for name in JSON_FIELDS:
        if message[name] is not None:
            message[name] = decode_json(message[name])
    for name in _FLAG_FIELDS:
        message[name] = bool(message[name])
    return message


def get_messages(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    include_inactive: bool = False,
    limit: int | None = None,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """Rows of a session in order (active generation only unless asked), every field decoded."""
    sql = SELECT_MESSAGES_SQL + " WHERE session_id = ?"
    if not include_inactive:
        sql += " AND active = 1"
    sql += " ORDER BY id LIMIT ? OFFSET ?"
    rows = conn.execute(sql, (session_id, -1 if limit is None else limit, offset))
    return [row_to_message(r) for r in rows]


def newest_id(rows: Iterable[Mapping[str, Any]]) -> int:
    """The newest ``id`` among message rows (0 for none): what a read of them has seen."""
    return max((int(r["id"]) for r in rows), default=0)


CONVERSATION_SQL = """
SELECT id, role, content, api_content, tool_calls, tool_call_id, tool_name, finish_reason,
       reasoning, reasoning_content, reasoning_details, codex_reasoning_items,
       codex_message_items, message_uid, absorbed_message_uids, tool_call_uids, tool_call_uid
FROM messages WHERE session_id = ? AND active = 1 ORDER BY id
"""


def get_messages_as_conversation(
    conn: sqlite3.Connection,
    session_id: str,
    include_ancestors: bool = False,
    include_row_ids: bool = False,
) -> list[dict[str, Any]]:
    """The OpenAI-format replay list of the session's active rows (see the module docstring);
    ``include_ancestors=True`` prepends its lineage, root first; ``_row_id`` on request."""
    return read_conversation(conn, session_id, include_ancestors, include_row_ids)[0]


def read_conversation(
    conn: sqlite3.Connection,
    session_id: str,
    include_ancestors: bool = False,
    include_row_ids: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """:func:`get_messages_as_conversation`, and the newest row id it returned of each session
    it read (0 for none)."""
    ids = [session_id]
    if include_ancestors:
        ids = [r["id"] for r in reversed(session_ancestors(conn, session_id))]
    return conversation(conn, ids, include_row_ids=include_row_ids)


def conversation(
    conn: sqlite3.Connection, session_ids: Iterable[str], *, include_row_ids: bool = False
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The OpenAI-format replay list of the sessions' active rows, in the order given, and
    the newest row id it holds of each session (0 for none)."""
    out: list[dict[str, Any]] = []
    newest: dict[str, int] = {}
    for session_id in session_ids:
        caller_uids: dict[str, Any] = {}
        seen_results: dict[str, int] = {}
        newest[session_id] = 0
        for (
            row_id, role, content, api_content, tool_calls, tool_call_id, tool_name,
            finish_reason, reasoning, reasoning_content, reasoning_details,
            codex_reasoning_items, codex_message_items, message_uid, absorbed, call_uids,
            call_uid,
        ) in conn.execute(CONVERSATION_SQL, (session_id,)):
            turn: dict[str, Any] = {
                "role": role,
                "content": content if api_content is None else api_content,
            }
            if tool_calls is not None:
                turn["tool_calls"] = decode_json(tool_calls)
            if tool_call_id is not None:
                turn["tool_call_id"] = tool_call_id
            if role == "tool" and tool_name is not None:
                turn["name"] = tool_name
            if role == "assistant":
                if finish_reason is not None:
                    turn["finish_reason"] = finish_reason
                if reasoning is not None:
                    turn["reasoning"] = reasoning
                if reasoning_content is not None:
                    turn["reasoning_content"] = reasoning_content
                if reasoning_details is not None:
                    turn["reasoning_details"] = decode_json(reasoning_details)
                if codex_reasoning_items is not None:
                    turn["codex_reasoning_items"] = decode_json(codex_reasoning_items)
                if codex_message_items is not None:
                    turn["codex_message_items"] = decode_json(codex_message_items)
            turn["message_uid"] = message_uid
            if absorbed is not None:
                turn["_absorbed_message_uids"] = decode_json(absorbed)
            if call_uids is not None:
                caller_uids = decode_json(call_uids)
                seen_results = {}
                turn["_tool_call_uids"] = caller_uids
            if role == "tool" and tool_call_id is not None:
                occurrence = seen_results.get(tool_call_id, 0)
                seen_results[tool_call_id] = occurrence + 1
                if call_uid is None and isinstance(caller_uids, dict):
                    call_uid = _pick_uid(caller_uids.get(tool_call_id), occurrence)
            if call_uid is not None:
                turn["_tool_call_uid"] = call_uid
            if include_row_ids:
                turn["_row_id"] = row_id
            newest[session_id] = row_id
            out.append(turn)
    return out, newest


# --- rewriting -------------------------------------------------------------------------------

# Keys of the replay format that map onto message fields.
_CONVERSATION_ALIASES = {
    "_absorbed_message_uids": "absorbed_message_uids",
    "_tool_call_uids": "tool_call_uids",
    "_tool_call_uid": "tool_call_uid",
}
_IGNORED_KEYS = frozenset({"_row_id", "id", "session_id"})


def message_fields(message: Mapping[str, Any]) -> dict[str, Any]:
    """The insert fields of a message dict in append, export or replay format."""
    fields: dict[str, Any] = {}
    for key, value in message.items():
        if key in _IGNORED_KEYS:
            continue
        if key == "name":
            key = "tool_name"
        fields[_CONVERSATION_ALIASES.get(key, key)] = value
    return fields


RECOUNT_SQL = """
UPDATE sessions SET message_count = ?, tool_call_count = ? WHERE id = ?
"""

# SQLite's largest row id: a bound at or above it covers every row.
_MAX_ROW_ID = 2**63 - 1


def check_bound(seen_through_id: object) -> int | None:
    """``seen_through_id`` as a rewrite uses it: None, or an int within SQLite's range (a
    bound beyond every row is the same as the largest id, one below every row the same as
    -1). Anything else — a bool, a float, a numeric string — is refused."""
    if seen_through_id is None:
        return None
    if isinstance(seen_through_id, bool) or not isinstance(seen_through_id, int):
        raise InvalidInputError(
            f"seen_through_id must be a message id (int) or None, "
            f"got {type(seen_through_id).__name__}"
        )
    return min(max(seen_through_id, -1), _MAX_ROW_ID)


# The live rows above a bound, oldest first: the id, then every other column.
UNSEEN_ROWS_SQL = f"""
SELECT id, {', '.join(_COLUMNS)} FROM messages
WHERE session_id = ? AND active = 1 AND id > ? ORDER BY id
"""
DELETE_ROW_SQL = "DELETE FROM messages WHERE id = ?"
_UID_COLUMN = _COLUMNS.index("message_uid")
_ROLE_COLUMN = _COLUMNS.index("role")
_TOOL_CALLS_COLUMN = _COLUMNS.index("tool_calls")


def take_unseen(
    conn: sqlite3.Connection,
    session_id: str,
    seen_through_id: int | None,
    written: Iterable[Mapping[str, Any]],
) -> list[tuple[Any, ...]]:
    """Lift out the live rows of a session the caller did not see (the caller's transaction):
    those above ``seen_through_id`` (already checked) whose ``message_uid`` is not among the
    ``written`` message fields. Returns them, every column but ``id``, oldest first, for
    :func:`put_back`; deleting them fires the FTS triggers as any delete does."""
    if seen_through_id is None:
        return []
    known = {fields.get("message_uid") for fields in written} - {None}
    unseen = []
    for row_id, *values in conn.execute(UNSEEN_ROWS_SQL, (session_id, seen_through_id)).fetchall():
        if values[_UID_COLUMN] in known:
            continue  # the caller writes it again: it saw this one
        conn.execute(DELETE_ROW_SQL, (row_id,))
        unseen.append(tuple(values))
    return unseen


def put_back(conn: sqlite3.Connection, rows: Iterable[tuple[Any, ...]]) -> tuple[int, int]:
    """Insert rows from :func:`take_unseen` again, in order, column for column (so after every
    row written since they were taken); returns (rows, tool calls they make)."""
    count = calls = 0
    for values in rows:
        conn.execute(INSERT_MESSAGE_SQL, values)
        count += 1
        calls += tool_call_count_of(
            values[_ROLE_COLUMN], decode_json(values[_TOOL_CALLS_COLUMN])
        )
    return count, calls


def replace_messages(
    conn: sqlite3.Connection,
    session_id: str,
    messages: Iterable[Mapping[str, Any]],
    *,
    seen_through_id: int | None = None,
) -> list[int]:
    """Replace the active generation of a session (the caller's transaction); returns the ids
    of the rows written for ``messages``, in order.

    Each message keeps the ``message_uid`` it carries (a new one is issued only where none is
    given); archived generations are left alone. Live rows the caller did not see — above
    ``seen_through_id``, their uid not among ``messages`` — are not deleted: they stay live
    after the new rows (see the module docstring); None covers every row present. The
    counters are recomputed from the live rows, as appending would have left them; rows given
    with ``active=False`` join the archive and count for nothing.
    """
    bound = check_bound(seen_through_id)
    if not conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone():
        raise SessionNotFoundError(session_id)
    given = [message_fields(message) for message in messages]
    unseen = take_unseen(conn, session_id, bound, given)
    conn.execute("DELETE FROM messages WHERE session_id = ? AND active = 1", (session_id,))
    ids, active, calls = [], 0, 0
    for fields in given:
        ids.append(insert_message(conn, session_id, fields, count=False))
        if fields.get("active") is None or fields.get("active"):
            active += 1
            calls += tool_call_count_of(str(fields.get("role")), fields.get("tool_calls"))
    kept, kept_calls = put_back(conn, unseen)
    conn.execute(RECOUNT_SQL, (active + kept, calls + kept_calls, session_id))
    return ids
