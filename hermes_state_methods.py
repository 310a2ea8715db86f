"""How the ``SessionDB`` facade turns a sibling function into a method.

:func:`read_method` and :func:`write_method` drop the connection, keep the signature for type
checkers, and bind a table entry to its path: a read runs on the handle's connection
(``hermes_state_lifecycle.read``); a write follows the write path, whose policy reads top to
bottom in ``hermes_state_writes.call``. An entry names its function and, for a write, its
:class:`~hermes_state_writes.WritePolicy`; the function is a plain sibling, a
:class:`~hermes_state_seen.Seen` (the handle remembers what the call saw) or an
:class:`~hermes_state_deletion.AfterCommit` (work done once committed). A :class:`Fallback`
says what a method answers instead of a store error. docs/api.md ("How a call flows") traces
one call."""

from __future__ import annotations

import functools
import inspect
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, cast

import hermes_state_arguments as arguments
import hermes_state_deletion as deletion
import hermes_state_errors as errors
import hermes_state_fts as fts
import hermes_state_search as search
import hermes_state_seen as seen
import hermes_state_writes as writes

__all__ = [
    "Fallback",
    "Handle",
    "Method",
    "STORE_ERRORS",
    "Sibling",
    "WITHOUT_DAMAGED_INDEX",
    "handle_method",
    "lenient",
    "read_method",
    "write_method",
]

logger = logging.getLogger("hermes_state")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
P = ParamSpec("P")


class Handle(writes.Store, Protocol):
    """What a generated method needs of the handle it is called on (``SessionDB``)."""

    _seen: seen.SeenThrough

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...


# A generated method: the sibling function's own parameters and result, the connection dropped.
Method = Callable[Concatenate[Handle, P], T]
Sibling = Callable[Concatenate[sqlite3.Connection, P], T]


@dataclass(frozen=True)
class Fallback(Generic[T_co]):
    """What a method answers instead of raising one of ``catch``: ``answer(db, args, kwargs)``
    of the call, after a WARNING that says ``what`` happened."""

    catch: tuple[type[BaseException], ...]
    what: str
    answer: Callable[[Any, tuple[Any, ...], dict[str, Any]], T_co]


# What a failing store does (a closed handle included) — not what a bad argument does: an
# InvalidInputError still reaches the caller.
STORE_ERRORS: tuple[type[BaseException], ...] = (
    sqlite3.Error, errors.StateDbLockedError, errors.StateDbCorruptError, errors.StateDbFullError,
    errors.StateDbIOError, errors.StateDbReadOnlyError, errors.StateDbCannotOpenError,
    errors.StateDbConstraintError, errors.StateDbError, errors.StateDbClosedError,
    errors.StateDbUnavailableError,
)


def lenient(answer: Callable[[], T]) -> Fallback[T]:
    """For callers that probe the store and switch a feature off on failure: a store error is
    answered with ``answer()``."""
    return Fallback(STORE_ERRORS, "answered without the store", lambda db, a, k: answer())


def _search_without_index(
    db: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[dict[str, Any]]:
    """A search that met a damaged index: detach it (when this handle may write) and answer
    from the canonical rows."""
    if not db.read_only and not db.quarantined:
        db._write(fts.detach_index)
    result: list[dict[str, Any]] = db._read(
        lambda conn: search.search_messages(conn, *args, **kwargs, use_index=False))
    return result


# A search that meets a damaged FTS index answers from the canonical rows.
WITHOUT_DAMAGED_INDEX = Fallback(
    (errors.FtsCorruptError,), "met a damaged FTS index; detaching it", _search_without_index
)


H = TypeVar("H")


def handle_method(
    fn: Callable[Concatenate[H, P], T],
    *,
    refused: Callable[[errors.InvalidInputError], T] | None = None,
) -> Callable[Concatenate[H, P], T]:
    """A method written as a function of the handle itself, ``fn(db, ...)``: for what needs
    more than one connection's statement (a snapshot reader, several transactions, the index
    upkeep), its arguments checked first; with ``refused``, a method that never raises answers
    a refused argument with ``refused(refusal)``."""
    method = arguments.checked(fn) if refused is None else arguments.answered(refused)(fn)
    method.__signature__ = _method_signature(fn)  # type: ignore[attr-defined]
    return method


def _method_signature(fn: Callable[..., Any]) -> inspect.Signature:
    """``fn``'s signature with its leading connection parameter shown as ``self``."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sig.replace(parameters=[self_param, *params[1:]])


def _finish(
    method: Callable[..., Any], like: Callable[..., Any], fallback: Fallback[Any] | None
) -> Callable[..., Any]:
    """``method`` named, documented and signed as ``like``, with its ``fallback``."""
    if fallback is not None:
        call = method

        def method(self: Handle, /, *args: Any, **kwargs: Any) -> Any:
            try:
                return call(self, *args, **kwargs)
            except fallback.catch as exc:
                logger.warning("%s on %s %s: %s", like.__name__, self.path, fallback.what, exc)
                return fallback.answer(self, args, kwargs)

    functools.update_wrapper(method, like)
    method.__signature__ = _method_signature(like)  # type: ignore[attr-defined]
    return method


# How one call of a table entry's function runs on a handle (see hermes_state_writes.Work).
Bind = Callable[[Handle, writes.Args, writes.Kwargs], writes.Work[Any, Any]]


def _bound(fn: Callable[..., Any]) -> tuple[Callable[..., Any], Bind]:
    """(the public function it stands for, how one call of it runs on a handle) of a table
    entry's function: a ``Seen`` keeps the handle's marks, an ``AfterCommit`` finishes once
    committed, a plain sibling runs as it is."""
    if isinstance(fn, seen.Seen):
        hook = fn

        def remembering(db: Handle, args: writes.Args, kwargs: writes.Kwargs) -> Any:
            session_id = hook.prepare(args, kwargs)
            return writes.Work(
                lambda conn: hook.within(db._seen, conn, session_id, args, kwargs),
                lambda done: hook.record(db._seen, session_id, *done))

        return hook.like, remembering
    like: Callable[..., Any] = fn
    run: Callable[..., Any] = fn
    finish: Callable[[Any], Any] = _same
    if isinstance(fn, deletion.AfterCommit):
        like, run, finish = fn.like, fn.run, fn.finish

    def plain(db: Handle, args: writes.Args, kwargs: writes.Kwargs) -> Any:
        return writes.Work(lambda conn: run(conn, *args, **kwargs), finish)

    return like, plain


def _same(result: Any) -> Any:
    return result


def read_method(fn: Sibling[P, T], *, fallback: Fallback[T] | None = None) -> Method[P, T]:
    """A method that runs the sibling function ``fn(conn, ...)`` as a read, once
    its arguments passed ``hermes_state_arguments``' check."""
    like, bind = _bound(fn)
    check = arguments.checker(like)

    def method(self: Handle, /, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = check(args, kwargs)
        work = bind(self, args, kwargs)
        return work.finish(self._read(work.run))

    return cast("Method[P, T]", _finish(method, like, fallback))


#: The policy of a write the table names no other for: 20 s of patience, nothing spooled.
WRITE = writes.WritePolicy()


def write_method(
    fn: Sibling[P, T],
    policy: writes.WritePolicy = WRITE,
    *,
    fallback: Fallback[T] | None = None,
) -> Method[P, T]:
    """A method that runs ``fn(conn, ...)`` down the write path under ``policy``
    (``hermes_state_writes.call``)."""
    like, bind = _bound(fn)
    function = writes.Function(
        like.__name__, inspect.signature(like), arguments.checker(like), bind)

    def method(self: Handle, /, *args: Any, **kwargs: Any) -> Any:
        return writes.call(self, policy, function, args, kwargs)

    return cast("Method[P, T]", _finish(method, like, fallback))
