"""Messages: one row per turn, written once, copied with its identity, replayed byte for byte.

:class:`MessageRow` is the one way a row is written. It checks each field and issues uids
unless a copy carries them. Removing lone surrogates is the only change made to text.
Structured content is kept as JSON in ``api_content``, its text in ``content`` for indexes.
Replay (:func:`get_messages_as_conversation`) is byte-exact.

A rewrite takes ``seen_through_id``, the newest id the caller read, and never removes a live
row above it: others may append meanwhile. Ids follow commit order, so those rows are exactly
the unseen ones. :func:`take_unseen` and :func:`put_back` keep them live after the new rows.
See docs/concurrency.md."""

from __future__ import annotations

import datetime
import importlib
import json
import logging
import math
import re
import sqlite3
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import hermes_state_fts as fts
import hermes_state_impact as impact
from hermes_state_arguments import INT64_MAX, INT64_MIN, shown
from hermes_state_common import (
    Bound,
    Text,
    clean_optional,
    clean_text,
    decode_json,
    encode_json,
    now,
)
from hermes_state_errors import InvalidInputError, InvalidTypeError, SessionNotFoundError
from hermes_state_lineage import session_ancestors
from hermes_state_sessions import lift_auto_archive

__all__ = [
    "MESSAGE_FIELDS",
    "JSON_FIELDS",
    "RECOUNT_SQL",
    "MessageRow",
    "insert_row",
    "insert_message",
    "append_message",
    "SELECT_MESSAGES_SQL",
    "BACKGROUND_REVIEW_PROMPTS",
    "is_background_review_prompt",
    "without_background_review",
    "get_messages",
    "newest_id",
    "decode_content",
    "STRUCTURED_CONTENT_PREFIX",
    "structured_text",
    "stored_content",
    "hydrated_message",
    "get_messages_as_conversation",
    "read_conversation",
    "get_resume_conversations",
    "read_resume_conversations",
    "get_ancestor_display_prefix",
    "set_latest_user_api_content",
    "message_list",
    "message_fields",
    "check_bound",
    "take_unseen",
    "put_back",
    "replacement_fields",
    "replace_messages",
    "replace_message_rows",
    "has_archived_messages",
    "has_platform_message_id",
    "tool_call_count_of",
    "row_to_message",
    "CONVERSATION_SQL",
    "COUNT_MESSAGE_SQL",
    "INSERT_MESSAGE_SQL",
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
        raise InvalidInputError(f"{field} must be 32 lowercase hex characters, got {value!r}")
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
        raise InvalidTypeError(f"{name} must be a string or None, got {type(value).__name__}",
                               argument=name)
    return clean_optional(value)


def _json_field(name: str, value: Any) -> Any:
    """``value`` once JSON is shown to carry it (:func:`encode_json` refuses it, naming
    ``name``, when it cannot): a row is refused whole when it is built, never half-written."""
    encode_json(value, name)
    return value


def _structured(content: list[Any] | dict[str, Any], api_content: Any) -> tuple[str, str]:
    """(content, api_content) of a row whose content is structured (see
    :data:`STRUCTURED_CONTENT_PREFIX`): its text parts, and the structure as JSON."""
    if api_content is not None:
        raise InvalidInputError(
            "api_content cannot accompany structured content: the structure is what is sent",
            argument="api_content")
    encoded = encode_json(content, "content")
    assert encoded is not None
    return structured_text(content), STRUCTURED_CONTENT_PREFIX + encoded


def _role(value: Any) -> str:
    role = clean_text(value) if isinstance(value, str) else ""
    if not role:
        raise InvalidInputError(f"role must be a non-empty string, got {shown(value)}",
                                argument="role")
    return role


def _token_count(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidTypeError("token_count must be an int or None", argument="token_count")
    if value is not None and not INT64_MIN <= value <= INT64_MAX:
        raise InvalidInputError(f"token_count does not fit in 64 bits: {shown(value)}",
                                argument="token_count")
    return value


def _timestamp(value: Any) -> float:
    """The row's time: the one given (a finite number), else now."""
    if value is None:
        return now()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTypeError(f"timestamp must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise InvalidInputError(f"timestamp must be finite, got {value!r}")
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
    JSON value, encoded only when the row is written (a value JSON cannot carry is refused
    when the row is built: :func:`_json_field`); flags are bools."""

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
        finish_reason = _text("finish_reason", finish_reason)
        reasoning = _text("reasoning", reasoning)
        reasoning_content = _text("reasoning_content", reasoning_content)
        if isinstance(content, (list, dict)):
            content, api_content = _structured(content, api_content)
        else:
            content, api_content = _reasoning_only_reply(
                role, _text("content", content), finish_reason, reasoning, reasoning_content,
                tool_calls, _text("api_content", api_content),
            )
        tool_call_id = _text("tool_call_id", tool_call_id)
        live = True if active is None else bool(active)
        return cls(
            session_id=session_id,
            role=role,
            content=content,
            tool_name=_text("tool_name", tool_name),
            tool_calls=_json_field("tool_calls", tool_calls),
            tool_call_id=tool_call_id,
            token_count=_token_count(token_count),
            finish_reason=finish_reason,
            reasoning=reasoning,
            reasoning_content=reasoning_content,
            reasoning_details=_json_field("reasoning_details", reasoning_details),
            codex_reasoning_items=_json_field("codex_reasoning_items", codex_reasoning_items),
            codex_message_items=_json_field("codex_message_items", codex_message_items),
            platform_message_id=_text("platform_message_id", platform_message_id),
            observed=bool(observed),
            effect_disposition=_text("effect_disposition", effect_disposition),
            api_content=api_content,
            display_kind=_text("display_kind", display_kind),
            display_metadata=_json_field("display_metadata", display_metadata),
            message_uid=_message_uid(_text("message_uid", message_uid)),
            timestamp=_timestamp(timestamp),
            absorbed_message_uids=_json_field("absorbed_message_uids", absorbed_message_uids),
            tool_call_uids=_json_field(
                "tool_call_uids", _tool_call_uids(role, tool_calls, tool_call_uids)),
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
            raise InvalidTypeError(f"unknown message fields: {', '.join(sorted(unknown))}")
        return cls.build(conn, session_id, **fields)

    @property
    def tool_call_count(self) -> int:
        return tool_call_count_of(self.role, self.tool_calls)

    def values(self) -> tuple[Any, ...]:
        """The row's INSERT parameters, in column order: JSON fields encoded, flags as
        integers, and the CJK index text (of the content, tool name and encoded tool calls)."""
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
            fts.cjk_index_text(self.content, self.tool_name, tool_calls),
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
    values = row.values()
    row_id = int(conn.execute(INSERT_MESSAGE_SQL, values).lastrowid or 0)
    impact.after_insert(conn, row_id)
    return row_id


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
    role: Text,
    content: Text | list[Any] | dict[str, Any] | None = None,
    tool_name: Text | None = None,
    tool_calls: Any = None,
    tool_call_id: Text | None = None,
    token_count: int | None = None,
    finish_reason: Text | None = None,
    reasoning: Text | None = None,
    reasoning_content: Text | None = None,
    reasoning_details: Any = None,
    codex_reasoning_items: Any = None,
    codex_message_items: Any = None,
    platform_message_id: Text | None = None,
    observed: bool = False,
    effect_disposition: Text | None = None,
    api_content: Text | None = None,
    display_kind: Text | None = None,
    display_metadata: Any = None,
    message_uid: str | None = None,
    timestamp: float | None = None,
    absorbed_message_uids: list[str] | None = None,
    tool_call_uids: dict[str, Any] | None = None,
    tool_call_uid: str | None = None,
) -> int:
    """Append one message and move the session's counters (the caller's transaction).

    Returns the row id. JSON-typed fields take any JSON value and are decoded on read:
    ``tool_calls`` is normally a list of call objects, but a dict or a string is kept as the
    previous store kept it and read back the same (only a list counts calls and pairs their
    results, having ids). A new
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
    """A full row (``SELECT_MESSAGES_SQL``) as a dict: JSON fields decoded, flags as bools,
    structured content as its list or dict (:func:`stored_content`)."""
    message = dict(zip(_READ_COLUMNS, row, strict=True))
    message["content"], message["api_content"] = stored_content(
        message["content"], message["api_content"])
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


# Structured content (a list of parts, a dict) as the previous store wrote it: JSON text after
# one of these prefixes, of one length (the older one used a NUL).
STRUCTURED_CONTENT_PREFIXES = ("\x01json:", "\x00json:")
#: What precedes the JSON text of structured content in ``api_content``. A row whose content
#: is a list or a dict (a multimodal turn: text parts beside images, audio, files) keeps the
#: structure there, as what is sent, and its text parts, one per line, in ``content``: the
#: column every index, snippet and preview reads. Readers get the structure back as
#: ``content`` (and ``api_content`` None): :func:`stored_content`.
STRUCTURED_CONTENT_PREFIX = "\x00json:"


def structured_text(content: Any) -> str:
    """The text parts of structured content, one per line: each string item of a list, and
    the ``text`` of each part (a dict part, or the dict itself) that has a string one."""
    parts = content if isinstance(content, list) else [content]
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return clean_text("\n".join(texts))


def stored_content(content: Any, api_content: Any) -> tuple[Any, Any]:
    """(content, api_content) of a stored row as readers get them: structured content back
    as its list or dict with ``api_content`` None, and content the previous store wrote
    structured decoded (:func:`decode_content`); anything else as it is."""
    if isinstance(api_content, str) and api_content.startswith(STRUCTURED_CONTENT_PREFIX):
        try:
            return json.loads(api_content[len(STRUCTURED_CONTENT_PREFIX):]), None
        except ValueError:
            pass
    return decode_content(content), api_content


def decode_content(content: Any) -> Any:
    """A message's ``content`` as its writer gave it: text as it is, structured content written
    by the previous store decoded back to its list or dict (text that does not decode stays)."""
    if isinstance(content, str) and content.startswith(STRUCTURED_CONTENT_PREFIXES):
        try:
            return json.loads(content[len(STRUCTURED_CONTENT_PREFIXES[0]):])
        except ValueError:
            return content
    return content


_TOOL_CALLS_READ = _READ_COLUMNS.index("tool_calls")


def hydrated_message(row: Sequence[Any]) -> dict[str, Any]:
    """A full row (``SELECT_MESSAGES_SQL``) as :func:`get_messages` returns it, with structured
    content decoded and ``tool_calls`` that are not JSON read as ``[]`` (a JSON string, which
    ``append_message`` stores for a string it is given, reads back as that string)."""
    message = row_to_message(row)
    # decode_json keeps text that does not parse
    if isinstance(message["tool_calls"], str) and not _is_json_text(row[_TOOL_CALLS_READ]):
        message["tool_calls"] = []
    return message


def _is_json_text(text: Any) -> bool:
    try:
        json.loads(text)
    except (TypeError, ValueError):
        return False
    return True


# A session's rows for replay, live ones only unless the second parameter is true.
CONVERSATION_SQL = """
SELECT id, role, content, api_content, tool_calls, tool_call_id, tool_name, finish_reason,
       reasoning, reasoning_content, reasoning_details, codex_reasoning_items,
       codex_message_items, message_uid, absorbed_message_uids, tool_call_uids, tool_call_uid,
       timestamp, platform_message_id, observed, effect_disposition
FROM messages WHERE session_id = ? AND (active = 1 OR ?) ORDER BY id
"""

#: How the prompts of a background review (of the skill library, of memory) begin. Older agents
#: wrote those turns into the session they reviewed; replaying them would take the session over.
BACKGROUND_REVIEW_PROMPTS = (
    "Review the conversation above and update the skill library",
    "Review the conversation above and consider saving to memory",
)


def get_messages_as_conversation(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    include_ancestors: bool = False,
    include_inactive: bool = False,
    repair_alternation: bool = False,
    *,
    include_row_ids: bool = False,
) -> list[dict[str, Any]]:
    """The OpenAI-format replay list of the session (see :func:`read_conversation`)."""
    return read_conversation(
        conn, session_id, include_ancestors, include_inactive, repair_alternation,
        include_row_ids=include_row_ids,
    )[0]


logger = logging.getLogger("hermes_state")

# The agent application's own repair of a replay list whose turns do not alternate (a user
# turn after a user turn left by a turn that stored no reply, a dangling tool call): its rule,
# not the store's, so it is used where the application is installed beside the store.
ALTERNATION_REPAIR = ("agent.agent_runtime_helpers", "repair_message_sequence")


def repair_alternation_of(session_id: str, turns: list[dict[str, Any]]) -> None:
    """Run the application's alternation repair over ``turns`` in place, when the application
    is importable (else ``turns`` stay as stored); the stored rows never change."""
    module_name, function_name = ALTERNATION_REPAIR
    try:
        repair = getattr(importlib.import_module(module_name), function_name, None)
    except ImportError:
        return
    if callable(repair) and turns:
        repaired = repair(None, turns)
        if repaired:
            logger.info("repaired %s turn-alternation fault(s) in the replay of session %s "
                        "(the stored rows keep them)", repaired, session_id)


def read_conversation(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    include_ancestors: bool = False,
    include_inactive: bool = False,
    repair_alternation: bool = False,
    *,
    include_row_ids: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The replay list of the session's live rows (every row with ``include_inactive``), and
    the newest row id it returned of each session it read (0 for none).

    ``include_ancestors`` puts the sessions of its parent chain first, root first, and shows a
    prompt replayed into a continuation once: a user turn whose content equals one since the
    last assistant turn with content or tool calls is left out. A background-review prompt
    (:data:`BACKGROUND_REVIEW_PROMPTS`, a user or system turn) is left out with the assistant
    turn right after it and the tool results answering that turn's calls. ``_row_id`` on
    request. ``repair_alternation`` (for a list replayed live) passes the list through the
    application's alternation repair (:func:`repair_alternation_of`)."""
    read, newest = _read_turns(conn, session_id, include_ancestors, include_inactive)
    out = []
    for _sid, row_id, turn in read:
        if include_row_ids:
            turn["_row_id"] = row_id
        out.append(turn)
    if repair_alternation:
        repair_alternation_of(session_id, out)
    return out, newest


def _read_turns(
    conn: sqlite3.Connection, session_id: str, include_ancestors: bool, include_inactive: bool
) -> tuple[list[tuple[str, int, dict[str, Any]]], dict[str, int]]:
    """(session id, row id, turn) of each replayed row, and the newest row id of each session
    read (see :func:`read_conversation`)."""
    ids = [session_id]
    if include_ancestors:
        ids = [r["id"] for r in reversed(session_ancestors(conn, session_id))]
    read = [(sid, row_id, turn) for sid in ids
            for row_id, turn in _turns(conn, sid, include_inactive)]
    read = _without_review_turns(read)
    if include_ancestors:
        read = _without_replayed_prompts(read)
    newest = dict.fromkeys(ids, 0)
    for sid, row_id, _turn in read:
        newest[sid] = max(newest[sid], row_id)
    return read, newest


# The session's newest live user turn.
NEWEST_LIVE_USER_SQL = """
SELECT id, content, api_content FROM messages
WHERE session_id = ? AND role = 'user' AND active = 1 ORDER BY id DESC LIMIT 1
"""


def set_latest_user_api_content(
    conn: sqlite3.Connection, /, session_id: str, content: Any, api_content: Text
) -> int:
    """Record ``api_content``, the exact text sent, on the session's newest live user turn
    when that turn's content is ``content`` (a turn written before its sent form was known);
    the number of rows changed, 0 or 1. Nothing is written when the newest user turn is
    another one (a rewrite came in between) or holds structured content (its structure is
    what is sent)."""
    if not isinstance(api_content, str):
        raise InvalidTypeError(
            f"api_content must be text, got {type(api_content).__name__}", argument="api_content")
    row = conn.execute(NEWEST_LIVE_USER_SQL, (session_id,)).fetchone()
    if row is None:
        return 0
    stored, _sent = stored_content(row[1], row[2])
    if not isinstance(stored, str) or not isinstance(content, str) \
            or stored != clean_text(content):
        return 0
    sent = clean_text(api_content)
    conn.execute("UPDATE messages SET api_content = ? WHERE id = ?",
                 (None if sent == stored else sent, row[0]))
    return 1


def get_resume_conversations(
    conn: sqlite3.Connection, /, session_id: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(model_history, display_history)`` of a resume: the session's own live turns with
    the alternation repair, and the whole chain from its root as shown (the same as
    ``get_messages_as_conversation(id, repair_alternation=True)`` and ``(id,
    include_ancestors=True)``, read in one transaction)."""
    return read_resume_conversations(conn, session_id)[0]


def read_resume_conversations(
    conn: sqlite3.Connection, /, session_id: str
) -> tuple[tuple[list[dict[str, Any]], list[dict[str, Any]]], dict[str, int]]:
    """:func:`get_resume_conversations`, and the newest row id read of each session."""
    model, newest = read_conversation(conn, session_id, repair_alternation=True)
    display, chain_newest = read_conversation(conn, session_id, include_ancestors=True)
    return (model, display), {**chain_newest, **newest}


def get_ancestor_display_prefix(
    conn: sqlite3.Connection, /, session_id: str
) -> list[dict[str, Any]]:
    """The turns the displayed chain shows before the session's own: those of its ancestors
    in ``get_messages_as_conversation(id, include_ancestors=True)`` (``[]`` for a root)."""
    read, _newest = _read_turns(conn, session_id, True, False)
    return [turn for sid, _row_id, turn in read if sid != session_id]


def _turns(
    conn: sqlite3.Connection, session_id: str, include_inactive: bool
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row id, replay turn) of each row of one session, in order.

    ``content`` is ``api_content`` when the bytes sent differ; each turn carries its
    ``message_uid`` and the runtime ``_``-keys; display metadata stays out. Optional keys
    appear only when the row has a value: ``reasoning`` only when non-empty, ``observed`` only
    when true; reasoning and ``codex_*`` items, and ``finish_reason``, only on assistant turns."""
    caller_uids: dict[str, Any] = {}
    seen_results: dict[str, int] = {}
    for (
        row_id, role, content, api_content, tool_calls, tool_call_id, tool_name,
        finish_reason, reasoning, reasoning_content, reasoning_details,
        codex_reasoning_items, codex_message_items, message_uid, absorbed, call_uids,
        call_uid, timestamp, platform_message_id, observed, effect_disposition,
    ) in conn.execute(CONVERSATION_SQL, (session_id, int(bool(include_inactive)))):
        content, api_content = stored_content(content, api_content)
        turn: dict[str, Any] = {
            "role": role,
            "content": content if api_content is None else api_content,
            "timestamp": timestamp,
        }
        if tool_calls is not None:
            turn["tool_calls"] = decode_json(tool_calls)
        if tool_call_id is not None:
            turn["tool_call_id"] = tool_call_id
        if tool_name is not None:
            turn["tool_name"] = tool_name
        if effect_disposition is not None:
            turn["effect_disposition"] = effect_disposition
        if platform_message_id is not None:
            turn["message_id"] = platform_message_id
        if observed:
            turn["observed"] = True
        if role == "assistant":
            if finish_reason is not None:
                turn["finish_reason"] = finish_reason
            if reasoning:
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
        yield row_id, turn


_Read = list[tuple[str, int, dict[str, Any]]]


def is_background_review_prompt(message: object) -> bool:
    """True for a user or system message whose text begins, after leading whitespace, with
    one of :data:`BACKGROUND_REVIEW_PROMPTS`."""
    if not isinstance(message, Mapping) or message.get("role") not in ("user", "system"):
        return False
    content = message.get("content")
    return isinstance(content, str) and content.lstrip().startswith(BACKGROUND_REVIEW_PROMPTS)


def _review_kept(turns: Sequence[object]) -> list[bool]:
    """Which of ``turns`` a replay keeps: each background-review prompt goes, with the
    assistant turn right after it and the tool results that answer that turn's calls (a
    result without its call breaks a replay). A prompt right after another takes the place of
    the first one's reply, so it does not also claim the turn after it."""
    kept: list[bool] = []
    claims_reply = previous_was_prompt = False
    dropped_calls: list[str] = []
    for turn in turns:
        if is_background_review_prompt(turn):
            claims_reply = not previous_was_prompt
            previous_was_prompt = True
            kept.append(False)
            continue
        previous_was_prompt = False
        fields: Mapping[str, Any] = turn if isinstance(turn, Mapping) else {}
        role = fields.get("role")
        if claims_reply and role == "assistant":
            claims_reply = False
            dropped_calls = _tool_call_ids(fields.get("tool_calls"))
            kept.append(False)
            continue
        claims_reply = False
        if role == "tool" and fields.get("tool_call_id") in dropped_calls:
            kept.append(False)
            continue
        if role != "tool":
            dropped_calls = []
        kept.append(True)
    return kept


def without_background_review(messages: list[Any]) -> list[Any]:
    """``messages`` (replay dicts) without background-review turns (see :func:`_review_kept`);
    an item that is not a dict is kept as it is."""
    return [m for m, keep in zip(messages, _review_kept(messages), strict=True) if keep]


def _without_review_turns(read: _Read) -> _Read:
    """:func:`without_background_review` over the turns read."""
    kept = _review_kept([entry[2] for entry in read])
    return [entry for entry, keep in zip(read, kept, strict=True) if keep]


def _without_replayed_prompts(read: _Read) -> _Read:
    """Leave out a user turn whose content equals a user turn's since the last assistant turn
    with content or tool calls: the prompt a continuation replays shows once."""
    out: _Read = []
    pending: list[Any] = []
    for entry in read:
        turn = entry[2]
        if turn["role"] == "user" and turn["content"] is not None:
            if turn["content"] in pending:
                continue
            pending.append(turn["content"])
        elif turn["role"] == "assistant" and (turn["content"] or turn.get("tool_calls")):
            pending = []
        out.append(entry)
    return out


# --- rewriting -------------------------------------------------------------------------------

# Keys of the replay format that map onto message fields.
_CONVERSATION_ALIASES = {
    "_absorbed_message_uids": "absorbed_message_uids",
    "_tool_call_uids": "tool_call_uids",
    "_tool_call_uid": "tool_call_uid",
}
_IGNORED_KEYS = frozenset({"_row_id", "id", "session_id"})


def message_list(messages: object, name: str = "messages") -> list[Mapping[str, Any]]:
    """``messages`` as a list of message dicts (a rewrite's or an import's); anything else,
    or a dict with a key that is not a string, is refused before a row is written."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        raise InvalidTypeError(
            f"{name} must be a list of message dicts, got {type(messages).__name__}",
            argument=name)
    listed = list(messages)
    for index, message in enumerate(listed):
        if not isinstance(message, Mapping):
            raise InvalidTypeError(
                f"{name}[{index}] must be a dict, got {type(message).__name__}", argument=name)
        if not all(isinstance(key, str) for key in message):
            raise InvalidTypeError(f"{name}[{index}] has a key that is not a string",
                                   argument=name)
    return listed


def message_fields(message: Mapping[str, Any]) -> dict[str, Any]:
    """The insert fields of a message dict in append, export or replay format (the replay's
    ``message_id`` is the platform's id, used when ``platform_message_id`` has none)."""
    fields: dict[str, Any] = {}
    for key, value in message.items():
        if key in _IGNORED_KEYS or key == "message_id":
            continue
        if key == "name":
            key = "tool_name"
        fields[_CONVERSATION_ALIASES.get(key, key)] = value
    if not fields.get("platform_message_id") and message.get("message_id") is not None:
        fields["platform_message_id"] = message["message_id"]
    return fields


RECOUNT_SQL = """
UPDATE sessions SET message_count = ?, tool_call_count = ? WHERE id = ?
"""

# SQLite's largest row id: a bound at or above it covers every row.
_MAX_ROW_ID = 2**63 - 1


def check_bound(seen_through_id: object) -> int | None:
    """``seen_through_id`` as a rewrite uses it: None, or an int within SQLite's 64-bit range
    (one below every row is the same as -1). Anything else — a bool, a float, a numeric
    string, an int no row id can reach such as ``2**64`` — is refused."""
    if seen_through_id is None:
        return None
    if isinstance(seen_through_id, bool) or not isinstance(seen_through_id, int):
        raise InvalidInputError(
            f"seen_through_id must be a message id (int) or None, "
            f"got {type(seen_through_id).__name__}"
        )
    if not INT64_MIN <= seen_through_id <= INT64_MAX:
        raise InvalidInputError(
            f"seen_through_id must be a message id within SQLite's 64-bit range, "
            f"got {seen_through_id}"
        )
    return max(seen_through_id, -1)


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
    seen_through_id: Bound | None,
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


# What a message keeps only on an assistant row.
_ASSISTANT_ONLY_FIELDS = (
    "reasoning",
    "reasoning_content",
    "reasoning_details",
    "codex_reasoning_items",
    "codex_message_items",
)
# The smallest step between two timestamps a rewrite stamps itself.
_STAMP_STEP_S = 1e-6


def _stamp(value: Any, index: int) -> float | None:
    """A message's own timestamp as epoch seconds (None: it has none)."""
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(
            f"messages[{index}].timestamp must be a number or a datetime, "
            f"got {type(value).__name__}"
        )
    if not math.isfinite(value):
        raise InvalidInputError(f"messages[{index}].timestamp must be finite, got {value!r}")
    return float(value)


def _platform_id(value: Any, index: int) -> str | None:
    if value is None or value == "":
        return None  # no id (nor a ``message_id`` to fall back on)
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # platforms that number their messages
    raise InvalidInputError(
        f"messages[{index}] has a platform message id of type {type(value).__name__}"
    )


def _tool_calls(value: Any) -> Any:
    """Tool calls given as JSON text (a stored row passed back) are read as JSON; text that is
    not JSON (``NaN``, ``Infinity`` and numbers past a float's range included) is no tool
    call."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value, parse_constant=_not_json, parse_float=_finite)
    except ValueError:
        return []


def _not_json(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is out of a float's range")
    return number


def _given_calls(tool_calls: Any) -> int:
    """Tool calls a written message counts for: a list its length, any other value one."""
    if tool_calls is None:
        return 0
    return len(tool_calls) if isinstance(tool_calls, (list, tuple)) else 1


def replacement_fields(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The insert fields of the messages :func:`replace_messages` writes, by the rules callers
    of the previous store rely on:

    * ``role`` defaults to ``'unknown'``;
    * a message's own ``timestamp`` (a number or a ``datetime``) is kept; one without is stamped
      now, or 1 µs after the previous message's when that is later, so order survives;
    * reasoning fields and ``codex_*`` items are kept on assistant rows only;
    * the platform's id is ``platform_message_id``, else ``message_id`` (an int becomes text);
    * ``tool_calls`` given as JSON text is parsed;
    * ``_``-prefixed keys the store has no field for are runtime markers and are not stored;
      any other unknown key is refused.

    Anything else malformed raises :class:`InvalidInputError` before a row is written."""
    clock = now()
    out = []
    for index, message in enumerate(message_list(messages)):
        fields = _known_fields(message, index)
        role = fields["role"]
        stamp = _stamp(fields.get("timestamp"), index)
        fields["timestamp"] = clock if stamp is None else stamp
        clock = max(clock, fields["timestamp"]) + _STAMP_STEP_S
        if role != "assistant":
            for name in _ASSISTANT_ONLY_FIELDS:
                fields.pop(name, None)
        if "platform_message_id" in fields:
            fields["platform_message_id"] = _platform_id(fields["platform_message_id"], index)
        if "tool_calls" in fields:
            fields["tool_calls"] = _tool_calls(fields["tool_calls"])
        out.append(fields)
    return out


def _known_fields(message: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The fields of ``messages[index]`` the store keeps, with its role (``'unknown'`` when
    it has none); an unknown field or a role that is no text is refused."""
    fields = {key: value for key, value in message_fields(message).items()
              if key in MESSAGE_FIELDS or not key.startswith("_")}
    unknown = sorted(set(fields) - set(MESSAGE_FIELDS))
    if unknown:
        raise InvalidInputError(f"messages[{index}] has unknown fields: {', '.join(unknown)}")
    role = fields.get("role")
    if role is None:
        fields["role"] = "unknown"
    elif not isinstance(role, str) or not role:
        raise InvalidInputError(f"messages[{index}].role must be a non-empty string")
    return fields


# The rows a replacement removes: the live ones, and with :every_row also the archived and
# rewound ones up to :bound (rows above it are not the caller's to remove).
DELETE_REPLACED_SQL = """
DELETE FROM messages
WHERE session_id = :session_id AND (active = 1 OR (:every_row AND id <= :bound))
"""


def replace_messages(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    messages: Iterable[Mapping[str, Any]],
    active_only: bool = False,
    *,
    seen_through_id: Bound | None = None,
) -> None:
    """Replace the messages of a session (the caller's transaction): see
    :func:`replace_message_rows`, which also returns the ids it wrote."""
    replace_message_rows(
        conn, session_id, messages, active_only, seen_through_id=seen_through_id
    )


def replace_message_rows(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    messages: Iterable[Mapping[str, Any]],
    active_only: bool = False,
    *,
    seen_through_id: Bound | None = None,
) -> list[int]:
    """Replace the messages of a session (the caller's transaction); returns the ids of the
    rows written for ``messages``, in order.

    Removes the session's rows — only the live ones (``active = 1``) with ``active_only``,
    keeping rewound and compaction-archived rows — and inserts ``messages`` as new rows by the
    rules of :func:`replacement_fields`, each keeping the ``message_uid`` it carries (a new one
    is issued only where none is given). Rows the caller did not see are never removed: live
    rows above ``seen_through_id`` whose uid is not among ``messages`` stay live after the new
    rows (see the module docstring), archived and rewound rows above it stay as they are; None
    covers every row present. ``message_count`` becomes the number of live rows written (rows
    given with ``active=False`` join the archive and count for nothing) and ``tool_call_count``
    their tool calls (a list counts its length, any other value one), plus the rows kept live.
    """
    bound = check_bound(seen_through_id)
    if not conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone():
        raise SessionNotFoundError(session_id)
    given = replacement_fields(messages)
    unseen = take_unseen(conn, session_id, bound, given)
    conn.execute(DELETE_REPLACED_SQL, {
        "session_id": session_id,
        "every_row": not active_only,
        "bound": _MAX_ROW_ID if bound is None else bound,
    })
    ids, active, calls = [], 0, 0
    for fields in given:
        ids.append(insert_message(conn, session_id, fields, count=False))
        if fields.get("active") is None or fields.get("active"):
            active += 1
            calls += _given_calls(fields.get("tool_calls"))
    kept, kept_calls = put_back(conn, unseen)
    conn.execute(RECOUNT_SQL, (active + kept, calls + kept_calls, session_id))
    return ids


# Whether any row of a session is out of the live transcript (rewound or archived).
HAS_ARCHIVED_SQL = "SELECT EXISTS (SELECT 1 FROM messages WHERE session_id = ? AND active = 0)"


def has_archived_messages(conn: sqlite3.Connection, /, session_id: str) -> bool:
    """True when any row of the session has ``active = 0`` (rewound or compaction-archived);
    False for a session without such rows or without any."""
    return bool(conn.execute(HAS_ARCHIVED_SQL, (session_id,)).fetchone()[0])


# Whether any row of a session, live or not, carries a platform's message id.
HAS_PLATFORM_ID_SQL = """
SELECT EXISTS (SELECT 1 FROM messages WHERE session_id = ? AND platform_message_id = ?)
"""


def has_platform_message_id(
    conn: sqlite3.Connection, /, session_id: str, platform_message_id: str
) -> bool:
    """True when any row of the session, active or not, has that ``platform_message_id`` (the
    check before re-persisting a user turn after a transient failure). An empty or None id is
    no id: False; an int is compared as its text."""
    if platform_message_id is None or platform_message_id == "":
        return False
    if isinstance(platform_message_id, bool) or not isinstance(platform_message_id, (str, int)):
        raise InvalidInputError(
            f"platform_message_id must be a string, got {type(platform_message_id).__name__}"
        )
    params = (session_id, str(platform_message_id))
    return bool(conn.execute(HAS_PLATFORM_ID_SQL, params).fetchone()[0])

