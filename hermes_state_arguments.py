"""The checks every public method's arguments pass before anything is read or written.

The facade builds each ``SessionDB`` method from a sibling function; :func:`checker` reads that
function's signature once and returns the check the method runs on every call. It holds what is
true of a parameter whatever the method; what one method needs of its values is checked by its
sibling, where the value enters (the message row, the session columns, a ledger's states).

* A parameter annotated with scalar types only (``str``, ``int``, ``float``, ``bool``, ``None``,
  ``Text``), paths or mappings takes values of those types, or None (its sibling says what None
  means): a list, a dict, bytes, any other object, a string where a number belongs is refused
  with :class:`InvalidTypeError`. A ``str`` parameter takes an int too (callers hand over ids
  as ints as often as strings), a ``float`` parameter an int, a ``bool`` one an int; a
  path parameter a string or an ``os.PathLike``; a mapping parameter any mapping; a callback
  (``Progress``) anything callable. None is refused only where the annotation of a path, a
  mapping, a stream or a callback leaves it out.
* A parameter annotated with a collection of strings (``Iterable[str]``, alone or beside
  ``str`` and ``None``) takes such a collection, each item a string or an int, or one string
  (its sibling says what that means); the sibling gets the items as a list, so a one-shot
  iterator still gives every item, and an int id past 64 bits arrives as its text.
* A parameter annotated as a stream (``Iterable[Mapping[str, Any]]``, ``IO[Any]``) takes any
  iterable or file object that is not a string or a mapping, unread: the sibling checks each
  record as it reads it.
* An int fits SQLite's 64 bits; a float is finite.
* A string holds no lone surrogate: SQLite cannot bind one, so no stored id, key or name holds
  one, and writing one cleaned of it could name another row. A parameter annotated
  :data:`hermes_state_common.Text` is prose instead (a message's content, a system prompt, an
  end reason): its sibling stores it with lone surrogates removed, the only change ever made
  to text. A parameter annotated :data:`hermes_state_common.Key` is a key a read looks up:
  one holding a lone surrogate names no row, and its sibling answers as for an absent key. A
  path holds no NUL either, and a :data:`hermes_state_common.Bound` may be an int of any
  size (its sibling clamps it).

A parameter annotated anything else (``Any``, a collection of mappings) is its sibling's to
check. Every refusal is an :class:`InvalidInputError` (a ``ValueError``) naming the parameter
in ``argument``. :func:`checked` puts the check on a method the facade writes out;
:func:`operation` on a module-level operation, whose operating-system failures it also types
(a full disk, no permission, a read-only file system).
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from hermes_state_common import clean_text
from hermes_state_errors import (
    InvalidInputError,
    InvalidTypeError,
    translate,
    translate_os_error,
)

__all__ = [
    "INT64_MIN", "INT64_MAX", "shown", "has_lone_surrogate", "Check", "checker", "checked",
    "operation", "integer", "number", "text", "filter_texts",
]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_SHOWN_CHARS = 80


def shown(value: object) -> str:
    """``repr(value)`` cut to a length an error message can carry."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - an object that cannot describe itself is named
        return f"<{type(value).__name__}>"
    return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}... ({len(text)} chars)"


def integer(name: str, value: object, *, minimum: int | None = None) -> int:
    """``value`` when it is an int (not a bool), else :class:`InvalidTypeError` naming ``name``:
    for an ``int`` parameter whose sibling has no meaning for None. Below ``minimum``:
    :class:`InvalidInputError`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"{name} must be an integer, got {shown(value)}", argument=name)
    if minimum is not None and value < minimum:
        raise InvalidInputError(f"{name} must be at least {minimum}, got {value}", argument=name)
    return value


def filter_texts(name: str, values: str | Iterable[object] | None) -> list[str] | None:
    """A filter's values as text (one string is one value; an id given as a number is its
    text), None for no filter. An item None is refused: no stored value is the text "None"
    it would otherwise become."""
    if values is None:
        return None
    if isinstance(values, str):
        return [values]
    items = list(values)
    if any(item is None for item in items):
        raise InvalidTypeError(f"an item of {name} must be str, got NoneType", argument=name)
    return [str(item) for item in items]


def number(name: str, value: object) -> float:
    """``value`` as a float when it is a finite int or float (not a bool), else a refusal
    naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTypeError(f"{name} must be a number, got {shown(value)}", argument=name)
    if not math.isfinite(value):
        raise InvalidInputError(f"{name} must be a finite number, got {value!r}", argument=name)
    return float(value)


def text(name: str, value: object) -> str:
    """``value`` when it is a string, else :class:`InvalidTypeError` naming ``name``."""
    if not isinstance(value, str):
        raise InvalidTypeError(f"{name} must be a string, got {shown(value)}", argument=name)
    return value


def has_lone_surrogate(text: str) -> bool:
    """True when SQLite could not bind ``text`` as it is (it holds a surrogate code point)."""
    return not text.isascii() and clean_text(text) != text


# The Python types each scalar annotation takes (an int is a float, as for type checkers).
_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str, int), "Text": (str,), "Key": (str, int), "Bound": (int,), "int": (int,),
    "float": (int, float),
    "bool": (int,),
    "None": (),
}
# Path annotations: a string or an os.PathLike, a string without NUL (no file name holds one).
_PATHS = frozenset({"Path", "PathLike[str]", "PathArg"})
# Mapping annotations: any mapping (its keys and values are the sibling's to check).
_MAPPINGS = frozenset({"Mapping[str, Any]", "Mapping[str, str]", "dict[str, Any]"})
# Callback annotations: anything callable.
_CALLABLES = frozenset({"Progress"})
# The annotations of a collection of strings.
_COLLECTIONS = frozenset({
    "Iterable[str]", "Collection[str]", "Sequence[str]", "list[str]", "tuple[str, ...]",
    "set[str]", "frozenset[str]",
})
# Annotations of a stream of records or lines: any iterable (or file object) that is not a
# string or a mapping, passed on unread (the sibling checks each record as it reads it).
_STREAMS = frozenset({"Iterable[Mapping[str, Any]]", "IO[Any]"})
_NOT_COLLECTIONS = (str, bytes, bytearray, Mapping)


def _is_stream(value: object) -> bool:
    return (hasattr(value, "read") or isinstance(value, Iterable)) and not isinstance(
        value, _NOT_COLLECTIONS)


@dataclass(frozen=True, slots=True)
class _Rule:
    """What one parameter takes: values of ``types``, or None (the sibling says what None
    means), a string without lone surrogates unless ``text`` (and without NUL where ``path``);
    with ``items``, also a collection whose items each pass ``items``; with ``stream``, also
    any iterable that is not a string or a mapping, unread."""

    name: str
    annotation: str
    types: tuple[type, ...]
    text: bool = False
    items: _Rule | None = None
    path: bool = False
    stream: bool = False
    required: bool = False
    unbounded: bool = False

    def check(self, value: Any) -> Any:
        """``value`` when it passes (a collection as the list of its checked items)."""
        if value is None and not self.required:
            return value
        if isinstance(value, int) and str in self.types and not INT64_MIN <= value <= INT64_MAX:
            return str(value)  # an id given as a number is its text; this one binds as no int
        if isinstance(value, self.types):
            self._check_scalar(value)
            return value
        if self.stream and _is_stream(value):
            return value
        if self.items is not None and isinstance(value, str):
            self.items.check(value)  # one string for a collection: its sibling says what it means
            return value
        if (self.items is not None and isinstance(value, Iterable)
                and not isinstance(value, _NOT_COLLECTIONS)):
            # Checked items, as the sibling gets them (an id too large for SQLite as its text).
            return [self.items.check(item) for item in value]
        raise InvalidTypeError(
            f"{self.name} must be {self.annotation}, got {type(value).__name__}",
            argument=self.name)

    def _check_scalar(self, value: object) -> None:
        if isinstance(value, str):
            if not self.text and has_lone_surrogate(value):
                raise InvalidInputError(
                    f"{self.name} holds a lone surrogate, which no stored value can: "
                    f"{shown(value)}", argument=self.name)
            if self.path and "\0" in value:
                raise InvalidInputError(f"{self.name} holds a NUL character, which no file "
                                        f"name can: {shown(value)}", argument=self.name)
        elif isinstance(value, bool):
            return
        elif isinstance(value, int) and not self.unbounded:
            if not INT64_MIN <= value <= INT64_MAX:
                raise InvalidInputError(
                    f"{self.name} does not fit in 64 bits: {shown(value)}", argument=self.name)
        elif isinstance(value, float) and not math.isfinite(value):
            raise InvalidInputError(
                f"{self.name} must be a finite number, got {value!r}", argument=self.name)


def _unqualified(member: str) -> str:
    """An annotation without its module (``transfer.Progress`` is ``Progress``)."""
    head, bracket, rest = member.partition("[")
    return head.rsplit(".", 1)[-1] + bracket + rest


def _rule(param: inspect.Parameter) -> _Rule | None:
    """The rule of a parameter annotated with the kinds of the module docstring only; None for
    any other (its sibling checks it)."""
    annotation = param.annotation
    if annotation is inspect.Parameter.empty:
        return None
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    members = {_unqualified(member.strip()) for member in text.split("|")}
    scalars, collections = members & _TYPES.keys(), members & _COLLECTIONS
    paths, mappings, streams = members & _PATHS, members & _MAPPINGS, members & _STREAMS
    callables = members & _CALLABLES
    if scalars | collections | paths | mappings | streams | callables != members:
        return None
    types: set[type] = {t for member in scalars for t in _TYPES[member]}
    if collections and "int" not in members:
        types.discard(int)  # one number is no collection (its items may be numbers)
    if paths:
        types |= {str, os.PathLike}
        if "int" not in members:
            types.discard(int)  # a number is no file name
    if mappings:
        types.add(Mapping)
    if callables:
        types.add(cast(type, Callable))
    items = _Rule(f"an item of {param.name}", "str", (str, int)) if collections else None
    # None is a str's or a number's sibling's to read (often "not given"); a mapping, path,
    # stream or callback annotated without None has no such meaning.
    required = "None" not in members and bool(paths | mappings | streams | callables)
    return _Rule(param.name, text, tuple(types), bool(members & {"Text", "Key"}), items,
                 bool(paths), bool(streams), required, "Bound" in members)


@dataclass(frozen=True, slots=True)
class Check:
    """The argument check of one method (see the module docstring): called with the method's
    positional and keyword arguments (its first parameter, the connection or ``self``, left
    out), it returns them as the method passes them on."""

    positional: Sequence[_Rule | None]
    keyword: Mapping[str, _Rule | None]
    extra_positional: _Rule | None
    extra_keyword: _Rule | None

    def __call__(
        self, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        count = len(self.positional)
        checked = tuple(
            _checked(self.positional[i] if i < count else self.extra_positional, value)
            for i, value in enumerate(args)
        )
        return checked, {
            name: _checked(self.keyword.get(name, self.extra_keyword), value)
            for name, value in kwargs.items()
        }


def _checked(rule: _Rule | None, value: Any) -> Any:
    return value if rule is None else rule.check(value)


def checker(fn: Callable[..., Any], *, skip: int = 1) -> Check:
    """The argument check of a method made from ``fn`` (its first ``skip`` parameters, the
    connection or ``self``, are dropped)."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    kinds = inspect.Parameter
    positional = [p for p in params if p.kind in (kinds.POSITIONAL_ONLY,
                                                  kinds.POSITIONAL_OR_KEYWORD)]
    extra = {p.kind: _rule(p) for p in params
             if p.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)}
    return Check(
        positional=tuple(_rule(p) for p in positional),
        keyword={p.name: _rule(p) for p in params
                 if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)},
        extra_positional=extra.get(kinds.VAR_POSITIONAL),
        extra_keyword=extra.get(kinds.VAR_KEYWORD),
    )


F = TypeVar("F", bound=Callable[..., Any])


def checked(fn: F) -> F:
    """A method ``fn(self, ...)`` that runs its argument check first (for the few methods the
    facade writes out instead of building them from a sibling function)."""
    check = checker(fn)

    @functools.wraps(fn)
    def method(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = check(args, kwargs)
        return fn(self, *args, **kwargs)

    return cast(F, method)


def operation(fn: F) -> F:
    """A module-level operation (backup, restore, repair, recover, the home helpers) that runs
    its argument check first and whose operating-system and SQLite failures reach the caller
    typed (:func:`hermes_state_errors.translate_os_error`, :func:`translate`)."""
    check = checker(fn, skip=0)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = check(args, kwargs)
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            raise translate_os_error(exc) from exc
        except sqlite3.Error as exc:
            raise translate(exc, None) from exc

    return cast(F, run)
