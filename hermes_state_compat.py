"""The handle's connection as the application's own SQL sees it (``SessionDB._conn``).

The previous store returned ``sqlite3.Row`` rows; the library reads tuples. :class:`RowConnection`
gives each statement its own cursor with a ``sqlite3.Row`` factory, leaving the connection
unchanged. ``_execute_write`` hands its function a :class:`WriteConnection` inside the store's
transaction: ``commit()`` does nothing and ``rollback()`` is refused (raise instead). See
docs/compatibility.md."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

from hermes_state_errors import HermesStateError

__all__ = ["Handle", "RowConnection", "WriteConnection", "execute_write", "row_connection"]

T = TypeVar("T")

RowFactory = Callable[[sqlite3.Cursor, tuple[Any, ...]], Any]


class RowConnection:
    """A view on ``conn`` whose statements return ``sqlite3.Row`` rows (see the module
    docstring). ``row_factory`` may be set on the view; it never reaches the connection.

    Each statement starts under ``lock``, the handle's: one the library is in the middle of a
    transaction on the connection waits for it to end."""

    def __init__(self, conn: sqlite3.Connection, lock: threading.RLock) -> None:
        self._connection = conn
        self._lock = lock
        self.row_factory: RowFactory | type[sqlite3.Row] | None = sqlite3.Row

    def cursor(self) -> sqlite3.Cursor:
        cursor = self._connection.cursor()
        cursor.row_factory = self.row_factory
        return cursor

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        with self._lock:
            return self.cursor().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
        with self._lock:
            return self.cursor().executemany(sql, parameters)

    def executescript(self, script: str, /) -> sqlite3.Cursor:
        with self._lock:
            return self.cursor().executescript(script)

    def __getattr__(self, name: str) -> Any:
        if name in ("_connection", "_lock"):  # not set yet (a copy being built)
            raise AttributeError(name)
        return getattr(self._connection, name)

    def __enter__(self) -> RowConnection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """As ``with conn:`` on a connection: commit what the block left open, or roll it
        back when the block raised."""
        self._connection.__exit__(exc_type, exc, traceback)

    def __repr__(self) -> str:
        return f"RowConnection({self._connection!r})"


class WriteConnection(RowConnection):
    """The view ``_execute_write`` hands its function, inside the store's transaction."""

    def commit(self) -> None:
        """Nothing: the store's transaction commits when the function returns."""

    def rollback(self) -> None:
        raise HermesStateError(
            "a function run by _execute_write cannot roll back the store's transaction: "
            "raise instead, and nothing it wrote is kept"
        )


class Handle(Protocol):
    """What the compatibility surface needs of a handle (``SessionDB``)."""

    __dict__: dict[str, Any]
    _connection: sqlite3.Connection
    _lock: threading.RLock

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...


def row_connection(db: Handle) -> RowConnection:
    """``db._conn``: the handle's connection as the previous store handed it to application
    code, its statements returning ``sqlite3.Row`` rows (the library's own code sees plain
    rows). One view per handle."""
    view = db.__dict__.get("_row_view")
    if view is None:
        view = db.__dict__["_row_view"] = RowConnection(db._connection, db._lock)
    return cast(RowConnection, view)


def execute_write(db: Handle, fn: Callable[[WriteConnection], T]) -> T:
    """``db._execute_write(fn)``: the application's ``fn(conn)`` as one write of the store, in
    one ``BEGIN IMMEDIATE`` transaction under the write patience and retry policy, refused on a
    quarantined or read-only handle, SQLite errors typed; returns what ``fn`` returns. ``conn``
    is a :class:`WriteConnection` (``sqlite3.Row`` rows)."""
    return db._write(lambda conn: fn(WriteConnection(conn, db._lock)))
