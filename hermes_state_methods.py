"""How the ``SessionDB`` facade turns a sibling function into a method.

:func:`read_method` and :func:`write_method` drop the connection, keep the signature for type
checkers, and check arguments first. A method's policy is named where the facade lists it: the
write kind, a quarantine :class:`~hermes_state_quarantine.Spool`, a
:class:`~hermes_state_seen.Seen`, an :class:`~hermes_state_deletion.AfterCommit`, a
:class:`Fallback`. Method bodies hold none. A write method refuses a handle that takes no
writes, checks its arguments, runs its function as one ``hermes_state_writes.write``, spools on
corruption, then records what it saw; docs/api.md ("How a call flows") traces one call."""

from __future__ import annotations

import functools
import inspect
import logging
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, cast

import hermes_state_arguments as arguments
import hermes_state_deletion as deletion
import hermes_state_errors as errors
import hermes_state_fts as fts
import hermes_state_quarantine as quarantine
import hermes_state_search as search
import hermes_state_seen as seen
import hermes_state_writes as writes

__all__ = [
    "Fallback",
    "Handle",
    "Method",
    "SKIPPED_WHEN_LOCKED",
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


class Handle(Protocol):
    """What a generated method needs of the handle it is called on (``SessionDB``)."""

    path: Path
    profile_home: Path
    _seen: seen.SeenThrough

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    def _write(
        self, fn: Callable[[sqlite3.Connection], T], kind: writes.WriteKind = ...
    ) -> T: ...

    def _check_writable(self) -> None: ...


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


# An activity stamp whose patience ran out is skipped (the write wrapper has already logged the
# lock holders) rather than an error reaching the code that made the observation.
SKIPPED_WHEN_LOCKED: Fallback[None] = Fallback(
    (errors.StateDbLockedError,), "skipped: the store stayed locked", lambda db, a, k: None
)


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


def _parts(
    fn: Callable[..., Any],
) -> tuple[seen.Seen[..., Any, Any] | None, Callable[..., Any], Callable[..., Any]]:
    """(hook, like, run) of a factory's function: a Seen, or a plain sibling function."""
    if isinstance(fn, seen.Seen):
        return fn, fn.like, fn.run
    if isinstance(fn, deletion.AfterCommit):
        return None, fn.like, fn.run
    return None, fn, fn


def read_method(fn: Sibling[P, T], *, fallback: Fallback[T] | None = None) -> Method[P, T]:
    """A method that runs the sibling function ``fn(conn, ...)`` as a read, once
    its arguments passed ``hermes_state_arguments``' check."""
    hook, like, run = _parts(fn)
    check = arguments.checker(like)

    def method(self: Handle, /, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = check(args, kwargs)
        if hook is None:
            return self._read(lambda conn: run(conn, *args, **kwargs))
        session_id = hook.prepare(args, kwargs)
        result, note = self._read(
            lambda conn: hook.within(self._seen, conn, session_id, args, kwargs))
        return hook.record(self._seen, session_id, result, note)

    return cast("Method[P, T]", _finish(method, like, fallback))


def write_method(
    fn: Sibling[P, T],
    kind: writes.WriteKind = "write",
    *,
    spool: quarantine.Spool | None = None,
    fallback: Fallback[T] | None = None,
) -> Method[P, T]:
    """A method that runs ``fn(conn, ...)`` as one write of ``kind`` (see
    the handle's ``_write``) once its arguments passed ``hermes_state_arguments``' check. A
    store that takes no writes says so first: with ``spool``, the messages of a write refused
    because the file is corrupt are spooled, whatever their values, and the raised
    :class:`StateDbCorruptError` names the file in ``spooled_to``. An
    :class:`~hermes_state_deletion.AfterCommit` finishes once committed."""
    hook, like, run = _parts(fn)
    signature, check = inspect.signature(like), arguments.checker(like)
    finish = fn.finish if isinstance(fn, deletion.AfterCommit) else None

    def method(self: Handle, /, *args: Any, **kwargs: Any) -> Any:
        # A retried transaction calls fn again: one-shot iterators must survive that.
        args = tuple(list(a) if isinstance(a, Iterator) else a for a in args)
        kwargs = {k: list(v) if isinstance(v, Iterator) else v for k, v in kwargs.items()}
        try:
            self._check_writable()
            args, kwargs = check(args, kwargs)
            if hook is not None:
                session_id = hook.prepare(args, kwargs)
                result, note = self._write(
                    lambda conn: hook.within(self._seen, conn, session_id, args, kwargs), kind)
            else:
                result = self._write(lambda conn: run(conn, *args, **kwargs), kind)
        except errors.StateDbCorruptError as exc:
            if spool is not None:
                spool.keep(exc, signature, args, kwargs, self.profile_home)
            raise
        if finish is not None:
            return finish(result)
        return result if hook is None else hook.record(self._seen, session_id, result, note)

    return cast("Method[P, T]", _finish(method, like, fallback))
