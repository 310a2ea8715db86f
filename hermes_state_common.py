"""Small helpers every module shares: text SQLite can bind, JSON columns, SQL fragments, and
the annotations the argument checks read.

SQLite cannot bind a lone surrogate. Prose is stored without them (:func:`clean_text`); a key
holding one names nothing (:func:`stored_text`)."""

from __future__ import annotations

import enum
import json
import re
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from hermes_state_errors import InvalidInputError, InvalidTypeError

__all__ = [
    "Bound",
    "Checked",
    "Key",
    "OnStore",
    "Text",
    "clean_optional",
    "clean_text",
    "decode_json",
    "encode_json",
    "escape_like",
    "now",
    "placeholders",
    "quote_identifier",
    "row_to_dict",
    "stored_text",
]


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


def now() -> float:
    return time.time()


def placeholders(n: int) -> str:
    """``?, ?, ...`` for ``n`` values (n ≥ 1)."""
    return ", ".join("?" * n)


def row_to_dict(cursor: sqlite3.Cursor, row: Sequence[Any]) -> dict[str, Any]:
    """A fetched row as a dict keyed by the cursor's column names."""
    return {d[0]: v for d, v in zip(cursor.description, row, strict=True)}


def quote_identifier(name: str) -> str:
    """Quote an SQL identifier (table or column name read from the schema)."""
    return '"' + name.replace('"', '""') + '"'
