"""``AsyncSessionDB``: a ``SessionDB`` for code running on an asyncio event loop.

Every store call may wait — on SQLite's busy timeout, on the write patience while another
process holds the lock (up to a minute for a transcript write), on the disk. On an event loop
that wait would stall every other task, so the wrapper runs each call in a worker thread
(``asyncio.to_thread``); ``SessionDB`` is thread-safe, and its handle lock keeps the calls of
one handle in order.

The wrapper holds nothing but the handle, as ``_db``: code that must call the store off the
loop unwraps it (``getattr(x, "_db", x)``). Every other attribute is looked up on the handle
when asked for: a callable comes back as a coroutine function running that call in a thread,
anything else as it is, and a name the handle lacks raises ``AttributeError`` — so feature
probes such as ``getattr(x, "update_session_meta", None)`` answer as on the plain handle.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes_state import SessionDB

__all__ = ["AsyncSessionDB"]


class AsyncSessionDB:
    """Awaitable calls on a :class:`~hermes_state.SessionDB` (see the module docstring)."""

    def __init__(self, db: SessionDB) -> None:
        self._db = db

    def __getattr__(self, name: str) -> Any:
        if name == "_db":  # not set yet (a copy being built): never look it up on itself
            raise AttributeError(name)
        attribute = getattr(self._db, name)
        if not callable(attribute):
            return attribute
        return _in_thread(attribute)

    def __repr__(self) -> str:
        return f"AsyncSessionDB({self._db!r})"


def _in_thread(fn: Callable[..., Any]) -> Callable[..., Coroutine[Any, Any, Any]]:
    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    return call
