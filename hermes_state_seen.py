"""What a handle has seen of each session: the bound a rewrite uses when its caller passes none.

:class:`SeenThrough` remembers, per session, the newest row id the handle read or wrote, and a
digest of the live rows below it (:func:`live_digest`). The digest catches changes without a new
id, such as a rewind. A rewrite whose digest changed is refused
(:class:`~hermes_state_errors.RewriteRefusedError`) rather than undo that change. With no
bound known, forgetting the read means keeping. Methods built from :class:`Seen` record what
they saw once they commit, so the facade keeps no bookkeeping."""

from __future__ import annotations

import inspect
import json
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Concatenate, Generic, Literal, ParamSpec, TypeVar, cast

import hermes_state_compression as compression
import hermes_state_messages as messages
import hermes_state_rewind as rewind
import hermes_state_transfer as transfer
from hermes_state_errors import InvalidInputError, RewriteRefusedError

__all__ = [
    "SEEN_SESSIONS",
    "Digest",
    "Mark",
    "SeenThrough",
    "Seen",
    "live_digest",
    "located",
    "APPEND_MESSAGE",
    "GET_MESSAGES",
    "GET_CONVERSATION",
    "GET_RESUME_CONVERSATIONS",
    "REPLACE_MESSAGES",
    "ARCHIVE_AND_COMPACT",
    "EXPORT_SESSION",
    "EXPORT_SESSION_LINEAGE",
    "REWIND_TO_MESSAGE",
    "RESTORE_REWOUND",
]

P = ParamSpec("P")
T = TypeVar("T")
U = TypeVar("U")

#: How many sessions a handle remembers a bound for (least recently used ones are forgotten).
SEEN_SESSIONS = 4096

#: The live rows of a session at or below a bound, as a rewrite compares them: their count and
#: two sums over their ids (see :func:`live_digest`).
Digest = tuple[int, int, int]
_MODULUS = 2_147_483_647  # a prime: the sums stay far inside SQLite's 64-bit integers

LIVE_DIGEST_SQL = f"""
SELECT COUNT(*), COALESCE(SUM(id % {_MODULUS}), 0),
       COALESCE(SUM((id % {_MODULUS}) * (id % {_MODULUS}) % {_MODULUS}), 0)
FROM messages WHERE session_id = ? AND active = 1 AND id <= ?
"""


def live_digest(conn: sqlite3.Connection, session_id: str, through: int) -> Digest:
    """The digest of the session's live rows with an id at or below ``through``."""
    count, first, second = conn.execute(LIVE_DIGEST_SQL, (session_id, through)).fetchone()
    return int(count), int(first), int(second)


def _with_row(digest: Digest, row_id: int) -> Digest:
    """``digest`` with one more live row, ``row_id``."""
    count, first, second = digest
    part = row_id % _MODULUS
    return count + 1, first + part, second + part * part % _MODULUS


@dataclass(frozen=True)
class Mark:
    """What a handle knows of one session: the newest row id it saw, and the digest of the live
    rows at or below it as it knew them (None: not known, so nothing to compare)."""

    newest: int
    live: Digest | None = None


class SeenThrough:
    """Per session, the newest message id one handle has seen and the digest of the live rows
    under it (a :class:`Mark`): the bound and the check of its rewrites when the caller passes
    none. Thread-safe; remembers at most ``capacity`` sessions (default
    :data:`SEEN_SESSIONS`), forgetting the least recently used.

    A read that returned the session's rows records the newest id among them (a read that
    returned none records 0: "nothing seen") — never below the bound already remembered — with
    the digest of the live rows under it, read in the same transaction. A row the handle
    writes itself raises it to that row only when the session's row before it is already
    within the bound — a row someone else appended in between stays unseen, and so does every
    later row of the handle's own until it reads again (a rewrite that writes them again by uid
    still counts them as seen). A handle's first write of a session it never read vouches for
    everything before it. A rewrite records the newest row it wrote, never the rows it kept
    live above them.

    Two threads sharing one handle share its marks; one that rewrites from its own read should
    pass ``seen_through_id`` explicitly, or another thread's later read covers rows it never
    saw.
    """

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is None:
            capacity = SEEN_SESSIONS
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise InvalidInputError(
                f"the number of sessions a handle remembers must be a positive int, "
                f"got {capacity!r}"
            )
        self.capacity = capacity
        self._lock = threading.Lock()
        self._marks: OrderedDict[str, Mark] = OrderedDict()

    def __len__(self) -> int:
        return len(self._marks)

    def mark(self, session_id: str) -> Mark | None:
        """What the handle knows of ``session_id`` (None: nothing)."""
        with self._lock:
            mark = self._marks.get(session_id)
            if mark is not None:
                self._marks.move_to_end(session_id)
            return mark

    def bound(self, session_id: str, given: int | None = None) -> int | None:
        """The bound of a rewrite of ``session_id``: ``given`` when the caller passed one, else
        the remembered one; None when there is neither."""
        if given is not None:
            return given
        mark = self.mark(session_id)
        return None if mark is None else mark.newest

    def saw(self, session_id: str, newest: int, live: Digest | None = None) -> None:
        """A read returned the session's rows through id ``newest`` (0: none). ``live``: the
        digest of the live rows through ``newest``, read with them — the read then replaces
        what was known (its ``newest`` already covers the remembered bound); without it the
        bound only rises."""
        with self._lock:
            known = self._marks.get(session_id)
            if live is not None:
                self._keep(session_id, Mark(newest, live))
            elif known is None or newest > known.newest:
                self._keep(session_id, Mark(newest))
            else:
                self._keep(session_id, known)

    def wrote(
        self,
        session_id: str,
        row_id: int,
        previous_id: int | None,
        *,
        live_row: bool = True,
        live: Digest | None = None,
    ) -> None:
        """The handle wrote row ``row_id`` (``live_row``: as a live row); ``previous_id`` is the
        session's row before it; ``live``, the digest through ``row_id`` read with the write,
        is what a first write of the session records."""
        with self._lock:
            known = self._marks.get(session_id)
            if known is None:
                self._keep(session_id, Mark(row_id, live))
            elif previous_id is None or previous_id <= known.newest:
                digest = known.live
                if digest is not None and live_row and row_id > known.newest:
                    digest = _with_row(digest, row_id)
                self._keep(session_id, Mark(max(row_id, known.newest), digest))

    def rewrote(self, session_id: str, row_ids: Sequence[int], live: Digest | None = None) -> None:
        """A rewrite wrote ``row_ids``; every live row below the newest of them is its own.
        ``live``: the digest through that row, read in the rewrite's transaction."""
        if row_ids:
            self.saw(session_id, max(row_ids), live)

    def changed(self, session_id: str, newest: int, before: Digest, after: Digest) -> None:
        """The handle itself changed live rows through ``newest`` (a rewind, a restore): the
        digest it knew, ``before``, becomes ``after`` — unless the mark moved meanwhile."""
        with self._lock:
            known = self._marks.get(session_id)
            if known is not None and known == Mark(newest, before):
                self._keep(session_id, replace(known, live=after))

    def _keep(self, session_id: str, mark: Mark) -> None:
        self._marks[session_id] = mark
        self._marks.move_to_end(session_id)
        while len(self._marks) > self.capacity:
            self._marks.popitem(last=False)


# --- the methods that keep it ------------------------------------------------------------------

#: What a call does to the handle's marks: a read records what it returned; an append the row
#: it wrote; a rewrite is checked against the mark and records the generation it wrote; a change
#: (rewind, restore) carries the digest along.
Kind = Literal["read", "append", "rewrite", "change"]

# What a call records, read in its transaction: per session (newest id, digest through it) for a
# read or a rewrite; (digest through the new row, whether it is live) for an append; (newest,
# digest before, digest after) for a change. None: nothing.
Note = Any


def _no_ids(session_id: str, result: Any) -> Mapping[str, int]:
    return {}


def _returned(result: Any) -> Any:
    return result


@dataclass(frozen=True)
class Seen(Generic[P, U, T]):
    """A sibling function as a handle runs it while keeping its :class:`SeenThrough`.

    ``run(conn, ...)`` is what runs in the read or the write transaction; ``after(result)`` is
    what the method returns of it; ``like`` is the public function the method stands for (same
    parameters as ``run``, checked; its result what ``after`` returns), and what a ``Seen``
    called as a function is. ``kind`` says what the call does to the handle's marks (see
    :data:`Kind`); ``newest(session_id, result)`` gives, for a read, the newest row id it
    returned of each session it read, and for a rewrite the ids it wrote. Every such function
    takes the session id as its first parameter after the connection; a rewrite takes
    ``seen_through_id``."""

    like: Callable[Concatenate[sqlite3.Connection, P], T]
    run: Callable[Concatenate[sqlite3.Connection, P], U]
    after: Callable[[U], T] = _returned
    kind: Kind = "read"
    newest: Callable[[str, U], Mapping[str, int]] = _no_ids

    def __post_init__(self) -> None:
        if _parameters(self.like) != _parameters(self.run):
            raise TypeError(f"{self.run.__name__} must take the parameters of {self.like.__name__}")

    def __call__(self, conn: sqlite3.Connection, /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Called without a handle, it is the function it stands for."""
        return self.like(conn, *args, **kwargs)

    def prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The call's session id; a call without one is refused as Python refuses it."""
        if args:
            return str(args[0])
        if "session_id" in kwargs:
            return str(kwargs["session_id"])
        raise TypeError(
            f"{self.like.__name__}() missing 1 required positional argument: 'session_id'"
        )

    def within(
        self,
        seen: SeenThrough,
        conn: sqlite3.Connection,
        session_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> tuple[U, Note]:
        """Run the call in its transaction; (its result, what the handle is to record)."""
        mark = seen.mark(session_id)
        if self.kind == "rewrite":
            kwargs = {**kwargs, "seen_through_id": _checked_bound(
                conn, session_id, mark, self.like, args, kwargs)}
        elif self.kind == "change" and mark is not None and mark.live is not None:
            before = live_digest(conn, session_id, mark.newest)
            result = self.run(conn, *args, **kwargs)
            if before != mark.live:
                return result, None  # changed by others first: the mark stays stale
            return result, (mark.newest, before, live_digest(conn, session_id, mark.newest))
        result = self.run(conn, *args, **kwargs)
        if self.kind == "read":
            return result, self._read_note(seen, conn, session_id, mark, result)
        if self.kind == "append":
            return result, self._append_note(conn, session_id, mark, result)
        if self.kind == "rewrite":
            return result, self._rewrite_note(conn, session_id, mark, result)
        return result, None

    def _read_note(self, seen: SeenThrough, conn: sqlite3.Connection, session_id: str,
                   mark: Mark | None, result: U) -> dict[str, tuple[int, Digest]]:
        """What a read records of each session it read: the newest id it returned (or the
        one already known, if later) and the digest through it."""
        note: dict[str, tuple[int, Digest]] = {}
        for read_id, newest in self.newest(session_id, result).items():
            known = mark if read_id == session_id else seen.mark(read_id)
            through = max(newest, 0 if known is None else known.newest)
            note[read_id] = (through, live_digest(conn, read_id, through))
        return note

    def _append_note(self, conn: sqlite3.Connection, session_id: str, mark: Mark | None,
                     result: U) -> tuple[Digest | None, bool]:
        """What an append records: the digest through the new row (a first write of the
        session only) and whether the row is live."""
        row_id = cast("tuple[int, int | None]", result)[0]
        live = conn.execute(ROW_LIVE_SQL, (row_id,)).fetchone()
        first = live_digest(conn, session_id, row_id) if mark is None else None
        return first, bool(live and live[0])

    def _rewrite_note(self, conn: sqlite3.Connection, session_id: str, mark: Mark | None,
                      result: U) -> tuple[int, Digest] | None:
        """What a rewrite records: the newest id it wrote (else the one known) and the
        digest through it; None when there is neither."""
        ids = list(self.newest(session_id, result).values())
        last = max(ids) if ids else None if mark is None else mark.newest
        return None if last is None else (last, live_digest(conn, session_id, last))

    def record(self, seen: SeenThrough, session_id: str, result: U, note: Note) -> T:
        """Once the read returned or the write committed: record ``note``; the method's
        result."""
        if self.kind == "read":
            for read_id, (through, digest) in note.items():
                seen.saw(read_id, through, digest)
        elif self.kind == "append":
            row_id, previous_id = cast("tuple[int, int | None]", result)
            first, live_row = note
            seen.wrote(session_id, row_id, previous_id, live_row=live_row, live=first)
        elif self.kind == "rewrite" and note is not None:
            through, digest = note
            seen.rewrote(session_id, [through], digest)
        elif self.kind == "change" and note is not None:
            seen.changed(session_id, *note)
        return self.after(result)


def _parameters(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


ROW_LIVE_SQL = "SELECT active FROM messages WHERE id = ?"


def _checked_bound(
    conn: sqlite3.Connection,
    session_id: str,
    mark: Mark | None,
    like: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> int | None:
    """The bound a rewrite runs with, in its transaction: the one given, else the remembered
    one, else the newest row its messages carry again. Refused (:class:`RewriteRefusedError`)
    when the live rows under the remembered bound changed since the handle knew them, or when
    no bound is known and its messages carry none of the rows it would remove."""
    call = inspect.signature(like).bind(conn, *args, **kwargs)
    call.apply_defaults()
    given = messages.check_bound(call.arguments["seen_through_id"])
    # A bound above the remembered one came from a read this handle did not make: not checked.
    known = None if mark is None or (given is not None and given > mark.newest) else mark.live
    if known is not None and mark is not None and (
        live_digest(conn, session_id, mark.newest) != known
    ):
        raise RewriteRefusedError(
            f"the live rows of session {session_id!r} changed since this handle read them "
            f"(a rewind, a restore or another rewrite): read the session again and "
            f"rewrite from that read; nothing was written",
            session_id=session_id,
        )
    if given is not None:
        return given
    if mark is not None:
        return mark.newest
    written = call.arguments.get("messages", call.arguments.get("compacted_messages"))
    every_row = not call.arguments.get("active_only", True)
    return _implicit_bound(conn, session_id, written, every_row)


# The newest row of a session carrying one of the uids (a JSON array).
NEWEST_CARRIED_SQL = """
SELECT MAX(id) FROM messages
WHERE session_id = ? AND message_uid IN (SELECT value FROM json_each(?))
"""
# Whether a rewrite would remove any row of the session (with :every_row, inactive ones too).
REMOVES_ANY_SQL = """
SELECT EXISTS (SELECT 1 FROM messages WHERE session_id = ? AND (active = 1 OR ?))
"""


def _implicit_bound(
    conn: sqlite3.Connection, session_id: str, written: object, every_row: bool
) -> int | None:
    """With no bound known: the newest row of the session whose uid the new messages carry;
    None when the rewrite would remove nothing; else the rewrite is refused."""
    if not isinstance(written, Iterable) or isinstance(written, (str, bytes, Mapping)):
        return None  # not a message list: the rewrite itself refuses it
    uids = sorted({m["message_uid"] for m in written
                   if isinstance(m, Mapping) and isinstance(m.get("message_uid"), str)})
    newest = conn.execute(NEWEST_CARRIED_SQL, (session_id, json.dumps(uids))).fetchone()[0]
    if newest is not None:
        return int(newest)
    if not conn.execute(REMOVES_ANY_SQL, (session_id, int(every_row))).fetchone()[0]:
        return None
    raise RewriteRefusedError(
        f"this handle has not read session {session_id!r} (or no longer remembers it), no "
        f"seen_through_id was given and the new messages carry none of its rows by "
        f"message_uid: rows it never saw would be lost. Read the session and rewrite from that "
        f"read, or pass seen_through_id; nothing was written",
        session_id=session_id,
    )


# The session's row just before a given one, whatever its generation.
PREVIOUS_ROW_SQL = """
SELECT id FROM messages WHERE session_id = ? AND id < ? ORDER BY id DESC LIMIT 1
"""


def located(
    append: Callable[Concatenate[sqlite3.Connection, P], int],
) -> Callable[Concatenate[sqlite3.Connection, P], tuple[int, int | None]]:
    """``append`` (a function that appends one row of its session and returns its id), also
    returning the id of the session's row just before the new one (None for its first row),
    read in the same transaction."""

    def append_located(
        conn: sqlite3.Connection, /, *args: P.args, **kwargs: P.kwargs
    ) -> tuple[int, int | None]:
        row_id = append(conn, *args, **kwargs)
        session_id = args[0] if args else kwargs["session_id"]
        previous = conn.execute(PREVIOUS_ROW_SQL, (session_id, row_id)).fetchone()
        return row_id, None if previous is None else int(previous[0])

    append_located.__signature__ = inspect.signature(append)  # type: ignore[attr-defined]
    return append_located


def _row_id(located: tuple[int, int | None]) -> int:
    return located[0]


def _rows_newest(session_id: str, rows: list[dict[str, Any]]) -> Mapping[str, int]:
    return {session_id: messages.newest_id(rows)}


def _conversation_newest(
    session_id: str, read: tuple[list[dict[str, Any]], dict[str, int]]
) -> Mapping[str, int]:
    return read[1]


def _turns(read: tuple[list[dict[str, Any]], dict[str, int]]) -> list[dict[str, Any]]:
    return read[0]


def _written(session_id: str, ids: list[int]) -> Mapping[str, int]:
    return {str(n): row_id for n, row_id in enumerate(ids)}


def _count(ids: list[int]) -> int:
    return len(ids)


def _nothing(ids: list[int]) -> None:
    return None


def _export_newest(session_id: str, exported: dict[str, Any] | None) -> Mapping[str, int]:
    if exported is None:
        return {}
    return {session_id: messages.newest_id(exported["messages"])}


def _lineage_newest(session_id: str, exported: dict[str, Any] | None) -> Mapping[str, int]:
    segments = exported["segments"] if exported is not None else ()
    return {segment["id"]: messages.newest_id(segment["messages"]) for segment in segments}


APPEND_MESSAGE = Seen(
    like=messages.append_message, run=located(messages.append_message), after=_row_id,
    kind="append",
)
GET_MESSAGES = Seen(like=messages.get_messages, run=messages.get_messages, newest=_rows_newest)
GET_CONVERSATION = Seen(
    like=messages.get_messages_as_conversation,
    run=messages.read_conversation,
    after=_turns,
    newest=_conversation_newest,
)
Histories = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def _histories(read: tuple[Histories, dict[str, int]]) -> Histories:
    return read[0]


def _histories_newest(session_id: str, read: tuple[Histories, dict[str, int]]) -> Mapping[str, int]:
    return read[1]


GET_RESUME_CONVERSATIONS = Seen(
    like=messages.get_resume_conversations,
    run=messages.read_resume_conversations,
    after=_histories,
    newest=_histories_newest,
)
REPLACE_MESSAGES = Seen(
    like=messages.replace_messages,
    run=messages.replace_message_rows,
    after=_nothing,
    kind="rewrite",
    newest=_written,
)
ARCHIVE_AND_COMPACT = Seen(
    like=compression.archive_and_compact,
    run=compression.archive_generation,
    after=_count,
    kind="rewrite",
    newest=_written,
)
EXPORT_SESSION = Seen(
    like=transfer.export_session, run=transfer.export_session, newest=_export_newest
)
EXPORT_SESSION_LINEAGE = Seen(
    like=transfer.export_session_lineage,
    run=transfer.export_session_lineage,
    newest=_lineage_newest,
)
REWIND_TO_MESSAGE = Seen(like=rewind.rewind_to_message, run=rewind.rewind_to_message, kind="change")
RESTORE_REWOUND = Seen(like=rewind.restore_rewound, run=rewind.restore_rewound, kind="change")
