"""``AsyncSessionDB``: a ``SessionDB`` for code running on an asyncio event loop.

Any store call may wait on the lock or the disk, which would stall the loop. So each call runs
in a worker thread (``asyncio.to_thread``); the handle lock keeps one handle's calls in order.
The wrapper holds only the handle, as ``_db``. Other attributes come from the handle, callables
as coroutine functions, so feature probes answer as on the plain handle."""

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
