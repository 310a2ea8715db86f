"""The checks every public method's arguments pass before anything is read or written.

:func:`checker` builds a method's check once, from its function's evaluated hints
(``typing.get_type_hints``). So ``Optional[str]`` and ``str | None`` make one check, and a hint
that cannot be evaluated fails at build time instead of switching a check off. The check holds
what is true of a parameter in every method; a sibling checks what its own values need.

Ints fit SQLite's 64 bits, floats are finite, strings hold no lone surrogate (SQLite cannot
bind one). A ``str`` also takes an int, since callers pass ids as either. A collection of
scalars reaches the sibling as a list. :class:`hermes_state_common.Checked` marks relax the
text rules. Every refusal is an :class:`InvalidInputError` naming its ``argument``."""

from __future__ import annotations

import functools
import inspect
import math
import os
import re
import sqlite3
import sys
import types
from collections import abc
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import (
    IO,
    Annotated,
    Any,
    Literal,
    NewType,
    TypeGuard,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from hermes_state_common import Checked, clean_text
from hermes_state_errors import (
    InvalidInputError,
    InvalidTypeError,
    translate,
    translate_os_error,
)

__all__ = [
    "INT64_MIN", "INT64_MAX", "shown", "has_lone_surrogate", "Check", "checker", "checked",
    "answered", "operation", "integer", "number", "text", "filter_texts",
]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
NoneType = type(None)

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


_NOT_COLLECTIONS = (str, bytes, bytearray, Mapping)


def _is_stream(value: object) -> bool:
    return (hasattr(value, "read") or isinstance(value, Iterable)) and not isinstance(
        value, _NOT_COLLECTIONS)


def _is_collection(value: object) -> TypeGuard[Iterable[Any]]:
    return isinstance(value, Iterable) and not isinstance(value, _NOT_COLLECTIONS)


@dataclass(frozen=True, slots=True)
class _Rule:
    """What one parameter takes: values of ``types``, or None (the sibling says what None
    means) unless ``required``, one of ``choices``, a string without lone surrogates unless
    ``text`` (and without NUL where ``path``); with ``items``, also a collection whose items
    each pass ``items``; with ``stream``, also any iterable that is not a string or a mapping,
    unread. ``spelled`` is the hint as an error message shows it."""

    name: str
    spelled: str
    types: tuple[type, ...]
    text: bool = False
    items: _Rule | None = None
    path: bool = False
    stream: bool = False
    required: bool = False
    unbounded: bool = False
    choices: tuple[object, ...] = ()

    def check(self, value: Any) -> Any:
        """``value`` when it passes (a collection as the list of its checked items)."""
        kind = type(value)
        if kind is str and value.isascii() and str in self.types and not self.path:
            return value  # the common case first: no surrogate, no file name
        if value is None and not self.required:
            return value
        if isinstance(value, int) and str in self.types and not INT64_MIN <= value <= INT64_MAX:
            return str(value)  # an id given as a number is its text; this one binds as no int
        if isinstance(value, self.types):
            self._check_scalar(value)
            return value
        return self._check_other(value)

    def _check_other(self, value: Any) -> Any:
        """A value not of the rule's types: one of its choices, a stream, a collection of its
        items (or one string for it), else refused."""
        if self._is_choice(value) or (self.stream and _is_stream(value)):
            return value
        if self.items is not None and isinstance(value, str):
            self.items.check(value)  # one string for a collection: its sibling says what it means
            return value
        if self.items is not None and _is_collection(value):
            # Checked items, as the sibling gets them (an id too large for SQLite as its text).
            return [self.items.check(item) for item in value]
        raise self._refusal(value)

    def _is_choice(self, value: object) -> bool:
        return any(type(value) is type(choice) and value == choice for choice in self.choices)

    def _refusal(self, value: object) -> InvalidInputError:
        """The error of a value this rule does not take: a wrong value when it has the type of
        a choice, else a wrong type."""
        if any(type(value) is type(choice) for choice in self.choices):
            return InvalidInputError(
                f"{self.name} must be {self.spelled}, got {shown(value)}", argument=self.name)
        return InvalidTypeError(
            f"{self.name} must be {self.spelled}, got {type(value).__name__}",
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


def _members(
    hint: Any, marks: frozenset[Checked] = frozenset()
) -> Iterator[tuple[Any, frozenset[Checked]]]:
    """The members of ``hint``'s union, each with the marks (:class:`Checked`) it carries:
    ``Optional``, ``Union`` and ``|`` are flattened, ``Annotated`` gives its marks, a
    ``NewType``, a type variable or a ``type`` alias stands for what it names."""
    origin = get_origin(hint)
    if origin is Annotated:
        inner, *metadata = get_args(hint)
        yield from _members(inner, marks | {m for m in metadata if isinstance(m, Checked)})
    elif origin is Union or origin is types.UnionType:
        for member in get_args(hint):
            yield from _members(member, marks)
    elif isinstance(hint, NewType):
        yield from _members(hint.__supertype__, marks)
    elif isinstance(hint, TypeVar):
        bounds = hint.__constraints__ or (hint.__bound__ or Any,)
        for bound in bounds:
            yield from _members(bound, marks)
    elif hasattr(hint, "__value__") and type(hint).__name__ == "TypeAliasType":
        yield from _members(hint.__value__, marks)
    else:
        yield hint, marks


@dataclass(slots=True)
class _Shape:
    """What the members of one parameter's hint take, gathered before its rule is made."""

    types: set[type] = field(default_factory=set)
    choices: list[object] = field(default_factory=list)
    none: bool = False
    ids: bool = False
    text: bool = False
    unbounded: bool = False
    path: bool = False
    callable: bool = False
    mapping: bool = False
    stream: bool = False
    items: list[_Rule] = field(default_factory=list)
    open: bool = False

    def take(self, name: str, member: Any, marks: frozenset[Checked]) -> None:
        """Add what ``member`` (one member of the hint of parameter ``name``) takes."""
        origin = get_origin(member) or member
        if member is Any or member is object:
            self.open = True  # anything goes: its sibling's to check
        elif member is NoneType:
            self.none = True
        elif origin is Literal:
            self.choices.extend(get_args(member))
        elif member is str:
            self.types.add(str)
            self.ids = self.ids or Checked.PROSE not in marks
            self.text = self.text or bool(marks & {Checked.PROSE, Checked.LOOKUP})
        elif member in (int, bool, float):
            self.types.update((int, float) if member is float else (int,))
            self.unbounded = self.unbounded or Checked.UNBOUNDED in marks
        elif origin is abc.Callable:
            self.callable = True
        elif isinstance(origin, type):
            self._take_class(name, origin, get_args(member))
        else:
            self.open = True  # a hint this module does not know: its sibling's to check

    def _take_class(self, name: str, cls: type, args: tuple[Any, ...]) -> None:
        """Add what a member that is a class (``args``: its parameters) takes."""
        if issubclass(cls, (os.PathLike, PurePath)):
            self.path = True
        elif is_typeddict(cls) or issubclass(cls, Mapping):
            self.mapping = True
        elif issubclass(cls, IO):
            self.stream = True
        elif issubclass(cls, Iterable) and not issubclass(cls, (bytes, bytearray)):
            self._take_collection(name, args)
        elif _instances_checkable(cls):
            self.types.add(cls)
        else:
            self.open = True

    def _take_collection(self, name: str, args: tuple[Any, ...]) -> None:
        """A collection whose items are ``args`` (``tuple[str, ...]``'s: str): of scalars, it
        takes such a collection, items checked; of anything else, any iterable, unread."""
        item_hints = [a for a in args if a is not Ellipsis] or [Any]
        item = _rule(f"an item of {name}", Union[tuple(item_hints)])  # noqa: UP007 - built
        if item is None or item.required or item.stream or item.items or item.path:
            self.stream = True
        else:
            self.items.append(item)

    def _taken(self) -> set[type]:
        """The types the rule takes as they are (collections and streams aside)."""
        taken = set(self.types)
        if self.ids and not (self.items or self.path):
            taken.add(int)  # an id given as a number (one number is no collection, no file)
        if self.path:
            taken.update((str, os.PathLike))
        if self.mapping:
            taken.add(cast(type, Mapping))
        if self.callable:
            taken.add(cast(type, abc.Callable))
        return taken

    def rule(self, name: str, spelled: str) -> _Rule | None:
        """The rule of a parameter whose hint's members were all taken; None when one of them
        takes anything."""
        if self.open:
            return None
        taken = self._taken()
        kinds = set(self.items)
        items = next(iter(kinds)) if len(kinds) == 1 else None
        stream = self.stream or len(kinds) > 1  # collections of differing items: unread
        # None is a str's or a number's sibling's to read (often "not given"); a mapping, path,
        # stream or callback annotated without None has no such meaning.
        required = not self.none and (self.path or self.mapping or stream or self.callable
                                      or (bool(self.choices) and not taken))
        return _Rule(name, spelled, tuple(taken), self.text, items, self.path, stream,
                     required, self.unbounded, tuple(self.choices))


def _instances_checkable(cls: type) -> bool:
    """True when ``isinstance`` can test for ``cls`` (a protocol not runtime-checkable cannot)."""
    try:
        isinstance(None, cls)
    except TypeError:
        return False
    return True


def _rule(name: str, hint: Any) -> _Rule | None:
    """The rule of a parameter ``name`` of the evaluated type ``hint`` (see the module
    docstring); None for a hint that takes anything."""
    shape = _Shape()
    for member, marks in _members(hint):
        shape.take(name, member, marks)
    return shape.rule(name, _spelled(hint))


_MODULES_RE = re.compile(r"\b(?:typing|typing_extensions|collections\.abc|builtins)\.")


def _spelled(hint: Any) -> str:
    """``hint`` as an error message shows it (``str | None``: marks and module names left
    out, whatever the spelling of the source)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        return _spelled(args[0])
    if origin is Union or origin is types.UnionType:
        return " | ".join(_spelled(member) for member in args)
    if hint is NoneType:
        return "None"
    if origin is Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin is abc.Callable:
        return "Callable"
    if origin is not None and args:
        inner = ", ".join("..." if a is Ellipsis else _spelled(a) for a in args)
        return f"{_spelled(origin)}[{inner}]"
    if isinstance(hint, (type, NewType)):
        return hint.__name__
    return _MODULES_RE.sub("", repr(hint))


@dataclass(frozen=True, slots=True)
class Check:
    """The argument check of one method (see the module docstring): called with the method's
    positional and keyword arguments (its first parameter, the connection or ``self``, left
    out), it returns them as the method passes them on."""

    positional: tuple[_Rule | None, ...]
    keyword: Mapping[str, _Rule | None]
    extra_positional: _Rule | None
    extra_keyword: _Rule | None

    def __call__(
        self, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        rules = self.positional
        if len(args) > len(rules):
            rules += (self.extra_positional,) * (len(args) - len(rules))
        checked = tuple([v if r is None else r.check(v) for r, v in zip(rules, args)])
        if not kwargs:
            return checked, {}
        keyword, extra = self.keyword, self.extra_keyword
        named = {}
        for name, value in kwargs.items():
            r = keyword.get(name, extra)
            named[name] = value if r is None else r.check(value)
        return checked, named


def _hints(fn: Callable[..., Any], names: Iterable[str]) -> dict[str, Any]:
    """The evaluated hints (``typing.get_type_hints``, ``Annotated`` kept) of ``fn``'s
    parameters ``names``, in the namespace ``fn`` was written in; a hint that cannot be
    evaluated is a ``TypeError`` at once. Its return hint is left alone: it may name what is
    defined only later (the class of a method being written)."""
    target = inspect.unwrap(fn)
    annotations = getattr(target, "__annotations__", {})
    namespace = getattr(target, "__globals__", None) or vars(sys.modules[target.__module__])

    def parameters() -> None:
        """A stand-in that holds the parameters' hints only."""

    parameters.__annotations__ = {n: annotations[n] for n in names if n in annotations}
    try:
        return get_type_hints(parameters, namespace, include_extras=True)
    except Exception as exc:  # any failure to evaluate is the same refusal
        raise TypeError(f"the hints of {getattr(fn, '__qualname__', fn)!r} cannot be evaluated "
                        f"for its argument check: {exc}") from exc


def checker(fn: Callable[..., Any], *, skip: int = 1) -> Check:
    """The argument check of a method made from ``fn`` (its first ``skip`` parameters, the
    connection or ``self``, are dropped), built from its evaluated hints once."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    evaluated = _hints(fn, [p.name for p in params])
    rules = {p.name: _rule(p.name, evaluated[p.name]) if p.name in evaluated else None
             for p in params}
    kinds = inspect.Parameter
    extra = {p.kind: rules[p.name] for p in params
             if p.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)}
    return Check(
        positional=tuple(rules[p.name] for p in params
                         if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)),
        keyword={p.name: rules[p.name] for p in params
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


def answered(answer: Callable[[InvalidInputError], Any]) -> Callable[[F], F]:
    """:func:`checked` for a method that never raises: a refused argument is answered with
    ``answer(refusal)`` instead."""

    def decorate(fn: F) -> F:
        check = checker(fn)

        @functools.wraps(fn)
        def method(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            try:
                args, kwargs = check(args, kwargs)
            except InvalidInputError as refusal:
                return answer(refusal)
            return fn(self, *args, **kwargs)

        return cast(F, method)

    return decorate


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
