"""Messages: one row per turn, written once, copied with its identity, replayed byte for byte.

* :func:`insert_message` is the single way a message row is written (append, replace,
  compression generations, import, the gateway's exception path): it cleans text, encodes the
  JSON-typed fields, issues ``message_uid`` (and ``tool_call_uids`` for an assistant row with
  tool calls) unless the row already has them, pairs a tool result with its call, and computes
  the CJK index text. A copy passes the uids it carries and they are kept as they are.
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

:class:`SeenThrough` is what a handle remembers when its caller passes no bound: per session,
the newest id it read or wrote (see the class).
"""

from __future__ import annotations

import math
import re
import sqlite3
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import hermes_state_fts as fts
from hermes_state_common import clean_optional, decode_json, encode_json, now
from hermes_state_errors import InvalidInputError, SessionNotFoundError
from hermes_state_lineage import session_ancestors
from hermes_state_sessions import lift_auto_archive

__all__ = [
    "MESSAGE_FIELDS",
    "JSON_FIELDS",
    "RECOUNT_SQL",
    "SEEN_SESSIONS",
    "SeenThrough",
    "insert_message",
    "append_message",
    "append_located",
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
    "SELECT_MESSAGES_SQL",
    "row_to_message",
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
_INT_FIELDS = ("token_count",)
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
    if isinstance(value, list) and occurrence < len(value) and isinstance(value[occurrence], str):
        return value[occurrence]
    return None


def _pair_tool_result(conn: sqlite3.Connection, session_id: str, tool_call_id: str) -> str | None:
    params = {"session_id": session_id, "call_id": tool_call_id}
    row = conn.execute(LAST_CALLER_SQL, params).fetchone()
    if row is None:
        return None
    mapping = decode_json(row[0])
    if not isinstance(mapping, dict) or tool_call_id not in mapping:
        return None
    return _pick_uid(mapping[tool_call_id], row[1])


def _prepare(conn: sqlite3.Connection, session_id: str, fields: Mapping[str, Any]) -> tuple:
    unknown = set(fields) - set(MESSAGE_FIELDS)
    if unknown:
        raise TypeError(f"unknown message fields: {', '.join(sorted(unknown))}")
    row: dict[str, Any] = dict.fromkeys(MESSAGE_FIELDS)
    row.update(fields)
    role = row["role"]
    if not isinstance(role, str) or not role:
        raise ValueError(f"role must be a non-empty string, got {role!r}")
    for name, value in row.items():
        if name in JSON_FIELDS or name in _FLAG_FIELDS or name in ("timestamp", "token_count"):
            continue
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a string or None, got {type(value).__name__}")
        row[name] = clean_optional(value)
    role = row["role"]

    # A reasoning-only successful reply: the reasoning text is the reply that replays.
    reasoning_text = row["reasoning_content"] or row["reasoning"]
    if (
        role == "assistant"
        and not row["content"]
        and row["finish_reason"] == "stop"
        and reasoning_text
        and not row["tool_calls"]
    ):
        row["content"] = ""
        if row["api_content"] is None:
            row["api_content"] = reasoning_text

    timestamp = now() if row["timestamp"] is None else row["timestamp"]
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)):
        raise TypeError(f"timestamp must be a number, got {type(timestamp).__name__}")
    if not math.isfinite(timestamp):
        raise ValueError(f"timestamp must be finite, got {timestamp!r}")
    row["timestamp"] = float(timestamp)
    if row["token_count"] is not None and (
        isinstance(row["token_count"], bool) or not isinstance(row["token_count"], int)
    ):
        raise TypeError("token_count must be an int or None")
    row["observed"] = int(bool(row["observed"]))
    row["active"] = 1 if row["active"] is None else int(bool(row["active"]))
    row["compacted"] = int(bool(row["compacted"]))

    row["message_uid"] = (
        new_uid() if row["message_uid"] is None else _check_uid(row["message_uid"], "message_uid")
    )
    if row["tool_call_uids"] is None and role == "assistant":
        ids = _tool_call_ids(row["tool_calls"])
        row["tool_call_uids"] = {call_id: new_uid() for call_id in ids} or None
    if (
        row["tool_call_uid"] is None
        and role == "tool"
        and row["tool_call_id"]
        and row["active"]
    ):
        row["tool_call_uid"] = _pair_tool_result(conn, session_id, row["tool_call_id"])
    if row["tool_call_uid"] is not None:
        _check_uid(row["tool_call_uid"], "tool_call_uid")

    for name in JSON_FIELDS:
        row[name] = encode_json(row[name])
    search_cjk = fts.cjk_index_text(row["content"], row["tool_calls"])
    return (session_id, *(row[name] for name in MESSAGE_FIELDS), search_cjk)


def insert_message(
    conn: sqlite3.Connection,
    session_id: str,
    fields: Mapping[str, Any],
    *,
    count: bool = True,
) -> int:
    """Write one message row (the caller's transaction) and return its id.

    ``count`` moves the session's counters (an append); copies made by compression or
    replacement pass False and the caller sets the counters it means.
    """
    values = _prepare(conn, session_id, fields)
    if count:
        calls = tool_call_count_of(values[1], fields.get("tool_calls"))
        if conn.execute(COUNT_MESSAGE_SQL, (calls, session_id)).rowcount == 0:
            raise SessionNotFoundError(session_id)
    elif not conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone():
        raise SessionNotFoundError(session_id)
    cursor = conn.execute(INSERT_MESSAGE_SQL, values)
    return int(cursor.lastrowid or 0)


def append_message(
    conn: sqlite3.Connection,
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
    fields = {k: v for k, v in locals().items() if k not in ("conn", "session_id")}
    row_id = insert_message(conn, session_id, fields)
    if role == "user" and not observed:
        lift_auto_archive(conn, session_id, check=True)
    return row_id


# The session's row just before a given one, whatever its generation.
PREVIOUS_ROW_SQL = """
SELECT id FROM messages WHERE session_id = ? AND id < ? ORDER BY id DESC LIMIT 1
"""


def append_located(
    conn: sqlite3.Connection, session_id: str, *args: Any, **kwargs: Any
) -> tuple[int, int | None]:
    """:func:`append_message` (same arguments), and the id of the session's row just before
    the new one (None for its first row), read in the same transaction."""
    row_id = append_message(conn, session_id, *args, **kwargs)
    previous = conn.execute(PREVIOUS_ROW_SQL, (session_id, row_id)).fetchone()
    return row_id, None if previous is None else int(previous[0])


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


# --- what a handle has seen ------------------------------------------------------------------

#: How many sessions a handle remembers a bound for (least recently used ones are forgotten).
SEEN_SESSIONS = 4096


class SeenThrough:
    """Per session, the newest message id one handle has seen: the bound its rewrites use when
    the caller passes none. Thread-safe; remembers at most ``capacity`` sessions (default
    :data:`SEEN_SESSIONS`), forgetting the least recently used.

    A read that returned the session's rows raises the bound to the newest id among them (a
    read that returned none records 0: "nothing seen"); an older read never lowers it. A row
    the handle writes itself raises it to that row only when the session's row before it is
    already within the bound — a row someone else appended in between stays unseen, and so
    does every later row of the handle's own until it reads again (a rewrite that writes them
    again by uid still counts them as seen). A handle's first write of a session it never
    read vouches for everything before it. A rewrite raises it to the newest row it wrote,
    never over the rows it kept live above them.

    A session the handle has neither read nor written (or has forgotten) has no bound: the
    rewrite then covers every row present, as the caller vouches for the whole session. Two
    threads sharing one handle share its bounds; one that rewrites from its own read should
    pass ``seen_through_id`` explicitly, or another thread's later read covers rows it never
    saw.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = SEEN_SESSIONS if capacity is None else capacity
        self._lock = threading.Lock()
        self._newest: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._newest)

    def bound(self, session_id: str, given: int | None = None) -> int | None:
        """The bound of a rewrite of ``session_id``: ``given`` when the caller passed one, else
        the remembered one; None when there is neither."""
        if given is not None:
            return given
        with self._lock:
            newest = self._newest.get(session_id)
            if newest is not None:
                self._newest.move_to_end(session_id)
            return newest

    def saw(self, session_id: str, newest: int) -> None:
        """A read returned the session's rows through id ``newest`` (0: none)."""
        with self._lock:
            self._keep(session_id, max(newest, self._newest.get(session_id, newest)))

    def wrote(self, session_id: str, row_id: int, previous_id: int | None) -> None:
        """The handle wrote row ``row_id``; ``previous_id`` is the session's row before it."""
        with self._lock:
            newest = self._newest.get(session_id)
            if newest is None:
                self._keep(session_id, row_id)
            elif previous_id is None or previous_id <= newest:
                self._keep(session_id, max(row_id, newest))

    def rewrote(self, session_id: str, row_ids: Sequence[int]) -> None:
        """A rewrite wrote ``row_ids``; every live row below the newest of them is its own."""
        if row_ids:
            self.saw(session_id, max(row_ids))

    def _keep(self, session_id: str, newest: int) -> None:
        self._newest[session_id] = newest
        self._newest.move_to_end(session_id)
        while len(self._newest) > self.capacity:
            self._newest.popitem(last=False)
