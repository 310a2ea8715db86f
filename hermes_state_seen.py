"""What a handle has seen of each session: the bound a rewrite uses when its caller passes none.

A rewrite (``replace_messages``, ``archive_and_compact``) never archives or deletes a live row
above ``seen_through_id`` (see ``hermes_state_messages``). A caller that passes no bound gets
the one its handle remembers (:class:`SeenThrough`): per session, the newest row id the handle
returned from a read or wrote itself.

The facade keeps that memory current without a line of bookkeeping in its own methods: each
method that reads or writes messages is built from a :class:`Seen`, a sibling function paired
with what the handle records of its call — before it (a rewrite's bound filled in) and after
it (the ids it returned, the row before an appended one) — and with the public function whose
parameters, name and result the method shows (``like``). The record is made only once the
read returned or the write committed: a retried or failed write records nothing.
"""

from __future__ import annotations

import inspect
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

import hermes_state_compression as compression
import hermes_state_messages as messages
import hermes_state_transfer as transfer

__all__ = [
    "SEEN_SESSIONS",
    "SeenThrough",
    "Seen",
    "located",
    "APPEND_MESSAGE",
    "GET_MESSAGES",
    "GET_CONVERSATION",
    "REPLACE_MESSAGES",
    "ARCHIVE_AND_COMPACT",
    "EXPORT_SESSION",
    "EXPORT_SESSION_LINEAGE",
]

P = ParamSpec("P")
T = TypeVar("T")
U = TypeVar("U")

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


# --- the methods that keep it ------------------------------------------------------------------


@dataclass(frozen=True)
class Seen(Generic[P, U, T]):
    """A sibling function as a handle runs it while keeping its :class:`SeenThrough`.

    ``run(conn, ...)`` is what runs in the read or the write transaction; ``after(seen,
    session_id, result)`` records what it saw and returns what the method returns, once the
    read returned or the write committed; ``like`` is the public function the method stands
    for (same parameters as ``run``, checked; its result what ``after`` returns), and what a
    ``Seen`` called as a function is. ``rewrite``: the call
    takes ``seen_through_id``, filled from the memory when the caller passes none. Every such
    function takes the session id as its first parameter after the connection."""

    like: Callable[Concatenate[sqlite3.Connection, P], T]
    run: Callable[Concatenate[sqlite3.Connection, P], U]
    after: Callable[[SeenThrough, str, U], T]
    rewrite: bool = False

    def __post_init__(self) -> None:
        if _parameters(self.like) != _parameters(self.run):
            raise TypeError(f"{self.run.__name__} must take the parameters of {self.like.__name__}")

    def __call__(self, conn: sqlite3.Connection, /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Called without a handle, it is the function it stands for."""
        return self.like(conn, *args, **kwargs)

    def prepare(
        self, seen: SeenThrough, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        """The call's session id, and its keywords with the rewrite bound filled in."""
        session_id = str(args[0] if args else kwargs["session_id"])
        if self.rewrite:
            given = kwargs.get("seen_through_id")
            kwargs = {**kwargs, "seen_through_id": seen.bound(session_id, given)}
        return session_id, kwargs


def _parameters(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


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


def _wrote(seen: SeenThrough, session_id: str, located: tuple[int, int | None]) -> int:
    row_id, previous_id = located
    seen.wrote(session_id, row_id, previous_id)
    return row_id


def _saw_rows(
    seen: SeenThrough, session_id: str, rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    seen.saw(session_id, messages.newest_id(rows))
    return rows


def _saw_conversation(
    seen: SeenThrough, session_id: str, read: tuple[list[dict[str, Any]], dict[str, int]]
) -> list[dict[str, Any]]:
    turns, newest = read
    for read_id, newest_id in newest.items():
        seen.saw(read_id, newest_id)
    return turns


def _rewrote_nothing(seen: SeenThrough, session_id: str, ids: list[int]) -> None:
    seen.rewrote(session_id, ids)


def _rewrote_count(seen: SeenThrough, session_id: str, ids: list[int]) -> int:
    seen.rewrote(session_id, ids)
    return len(ids)


def _saw_export(
    seen: SeenThrough, session_id: str, exported: dict[str, Any] | None
) -> dict[str, Any] | None:
    if exported is not None:
        seen.saw(session_id, messages.newest_id(exported["messages"]))
    return exported


def _saw_exports(
    seen: SeenThrough, session_id: str, exported: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    for session in exported:
        seen.saw(session["id"], messages.newest_id(session["messages"]))
    return exported


APPEND_MESSAGE = Seen(
    like=messages.append_message, run=located(messages.append_message), after=_wrote
)
GET_MESSAGES = Seen(like=messages.get_messages, run=messages.get_messages, after=_saw_rows)
GET_CONVERSATION = Seen(
    like=messages.get_messages_as_conversation,
    run=messages.read_conversation,
    after=_saw_conversation,
)
REPLACE_MESSAGES = Seen(
    like=messages.replace_messages,
    run=messages.replace_message_rows,
    after=_rewrote_nothing,
    rewrite=True,
)
ARCHIVE_AND_COMPACT = Seen(
    like=compression.archive_and_compact,
    run=compression.archive_generation,
    after=_rewrote_count,
    rewrite=True,
)
EXPORT_SESSION = Seen(
    like=transfer.export_session, run=transfer.export_session, after=_saw_export
)
EXPORT_SESSION_LINEAGE = Seen(
    like=transfer.export_session_lineage,
    run=transfer.export_session_lineage,
    after=_saw_exports,
)
