"""The argument checks follow the evaluated hints, whatever their spelling.

Every parameter of every public method and module operation is handed a value of a type its
hint does not admit (read here from ``typing.get_type_hints``, not from the hint's text), and
the refusal must be an :class:`InvalidTypeError` naming that parameter. Small functions hinted
in every spelling of the same types (``Optional[str]``, ``Union[str, None]``, ``str | None``,
evaluated or as strings) get checks that refuse alike.
"""

from __future__ import annotations

import inspect
import os
import sys
import types
import typing
from collections import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path, PurePath
from typing import IO, Annotated, Any, Literal, NewType, Optional, TypedDict, Union

import pytest

import hermes_state
from hermes_state import InvalidInputError, InvalidTypeError, SessionDB
from hermes_state_arguments import checker

NoneType = type(None)


# --- what a hint admits, read from the evaluated type ------------------------------------------


def members(hint: Any) -> list[Any]:
    """The members of a hint's union (``Annotated`` and ``NewType`` seen through)."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        return members(typing.get_args(hint)[0])
    if origin is Union or origin is types.UnionType:
        return [member for arg in typing.get_args(hint) for member in members(arg)]
    if isinstance(hint, NewType):
        return members(hint.__supertype__)
    return [hint]


def admits(member: Any, value: object) -> bool:
    """Whether ``member`` could take ``value``, read generously (an id may be a number, one
    string may stand for a collection of strings), so that a value it refuses is plainly of
    the wrong type."""
    origin = typing.get_origin(member) or member
    if member is Any or member is object:
        return True
    if member is NoneType:
        return value is None
    if origin is Literal:
        return value in typing.get_args(member)
    if member is str:
        return isinstance(value, (str, int))
    if member in (int, bool):
        return isinstance(value, int)
    if member is float:
        return isinstance(value, (int, float))
    if origin is abc.Callable:
        return callable(value)
    if not isinstance(origin, type):
        return True
    if issubclass(origin, (os.PathLike, PurePath)):
        return isinstance(value, (str, os.PathLike))
    if typing.is_typeddict(origin) or issubclass(origin, Mapping):
        return isinstance(value, Mapping)
    if issubclass(origin, (IO, Iterable)):
        return isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping))
    return isinstance(value, origin)


# Tried in this order: the first one no member of the hint admits is the wrong value.
WRONG: list[object] = [3.5, "text", 7, ["text"], {"key": "value"}, b"raw bytes"]


def wrong_value(hint: Any) -> object:
    """A value of a type ``hint`` does not admit; none for a hint that admits anything."""
    candidates = [v for v in WRONG if not any(admits(m, v) for m in members(hint))]
    return candidates[0] if candidates else None


def fitting_value(hint: Any) -> object:
    """A value ``hint`` admits (for the parameters a call needs besides the one tested)."""
    for member in members(hint):
        if typing.get_origin(member) is Literal:
            return typing.get_args(member)[0]
    for value in [["s1"], "s1", 1, 1.5, {"k": "v"}, print]:
        if any(admits(m, value) for m in members(hint)):
            return value
    raise AssertionError(f"no plain value fits {hint!r}")


def slots(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    """The named parameters of ``fn`` (``self`` and ``*``/``**`` parameters left out)."""
    named = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
             inspect.Parameter.KEYWORD_ONLY)
    return [p for p in inspect.signature(fn).parameters.values()
            if p.kind in named and p.name != "self"]


def call_with(fn: Callable[..., Any], wrong: str, value: object) -> Any:
    """``fn`` called with ``value`` for parameter ``wrong`` and a fitting value for every
    other parameter without a default."""
    hints = typing.get_type_hints(fn, include_extras=True)
    positional: list[object] = []
    keywords: dict[str, object] = {}
    for param in slots(fn):
        if param.name == wrong:
            given = value
        elif param.default is inspect.Parameter.empty:
            given = fitting_value(hints[param.name])
        elif param.kind is inspect.Parameter.POSITIONAL_ONLY:
            given = param.default
        else:
            continue
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append(given)
        else:
            keywords[param.name] = given
    result = fn(*positional, **keywords)
    return list(result) if isinstance(result, abc.Iterator) else result


# --- every public method and module operation ---------------------------------------------------


def public_methods() -> list[str]:
    return sorted(name for name, value in vars(SessionDB).items()
                  if not name.startswith("_") and callable(getattr(SessionDB, name))
                  and slots(getattr(SessionDB, name)))


# The module-level operations whose arguments are checked (the rest of ``__all__`` is the error
# hierarchy's classifiers, which take any exception, and context managers).
MODULE_OPERATIONS = [
    "backup_state_db", "restore_state_db", "repair_state_db", "recover_state_db",
    "repair_state_db_schema", "collect_profile_stats", "display_hermes_home",
    "resolve_profile_home", "resolve_store_home", "profile_config_path", "child_process_env",
    "workspace_key",
]

# Documented never to raise (it runs at start-up): a refused argument is its report's error.
NEVER_RAISES = frozenset({"maybe_auto_prune_and_vacuum"})


def assert_refused(fn: Callable[..., Any], name: str, *, raising: bool = True) -> int:
    """Each parameter of ``fn`` given a value of a wrong type is refused, naming it; returns
    how many parameters were tried (those hinted ``Any`` take anything)."""
    hints = typing.get_type_hints(fn, include_extras=True)
    tried = 0
    for param in slots(fn):
        hint = hints[param.name]
        value = wrong_value(hint)
        if value is None:
            assert any(m is Any or m is object for m in members(hint)), (name, param.name)
            continue
        tried += 1
        where = f"{name}({param.name}={value!r}) with {param.name} hinted {hint!r}"
        if not raising:
            report = call_with(fn, param.name, value)
            assert param.name in report.get("error", ""), (where, report)
            continue
        with pytest.raises(InvalidTypeError) as refused:
            call_with(fn, param.name, value)
        assert refused.value.argument == param.name, (where, refused.value)
        assert param.name in str(refused.value), where
    return tried


@pytest.mark.parametrize("name", public_methods())
def test_every_parameter_of_every_method_refuses_a_value_of_a_wrong_type(
    name: str, db: SessionDB
) -> None:
    db.create_session("s1", "cli")
    before = db.export_all()
    tried = assert_refused(getattr(db, name), name, raising=name not in NEVER_RAISES)
    assert tried or all(p.annotation in ("Any", "object") for p in slots(getattr(db, name)))
    assert db.export_all() == before


@pytest.mark.parametrize("name", MODULE_OPERATIONS)
def test_every_parameter_of_every_operation_refuses_a_value_of_a_wrong_type(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a fitting relative path lands in the test's own folder
    assert assert_refused(getattr(hermes_state, name), name) > 0
    assert list(tmp_path.iterdir()) == [tmp_path / "hermes-home"]


def test_the_methods_tried_are_the_class() -> None:
    """A method added later is tried without being named here."""
    names = public_methods()
    assert {"append_message", "get_session", "import_jsonl", "sanitize_title"} <= set(names)
    assert len(names) > 100


# --- one hint, every spelling ---------------------------------------------------------------------

# The same types spelled as a script may write them. This module's hints are strings
# (``from __future__ import annotations``), evaluated where the function is written; the
# same functions compiled without that import hold evaluated hints.
SessionId = NewType("SessionId", str)
Tags = Sequence[str]


class Origin(TypedDict):
    platform: str


SPELLINGS = '''
def optional(value: Optional[str]) -> None: ...
def union(value: Union[str, None]) -> None: ...
def pipe(value: str | None) -> None: ...
def typing_union(value: typing.Union[None, str]) -> None: ...
def annotated(value: Annotated[Optional[str], "a mark"]) -> None: ...
def new_type(value: Optional[SessionId]) -> None: ...
def optional_int(value: Optional[int]) -> None: ...
def optional_float(value: Union[float, None]) -> None: ...
def optional_bool(value: Optional[bool]) -> None: ...
def sequence(value: Optional[Sequence[str]]) -> None: ...
def alias(value: Optional[Tags]) -> None: ...
def iterable(value: Union[Iterable[str], None]) -> None: ...
def mapping(value: Optional[Mapping[str, Any]]) -> None: ...
def typed_dict(value: Origin) -> None: ...
def path(value: Union[str, os.PathLike[str], None]) -> None: ...
def callback(value: Optional[Callable[[str], None]]) -> None: ...
def literal(value: Literal["skip", "fail"]) -> None: ...
'''

WRONG_FOR: dict[str, object] = {
    "optional": [1], "union": [1], "pipe": [1], "typing_union": [1], "annotated": [1],
    "new_type": [1], "optional_int": "1", "optional_float": "1.5", "optional_bool": "yes",
    "sequence": 7, "alias": 7, "iterable": 7, "mapping": ["key"], "typed_dict": ["key"],
    "path": 7, "callback": "report", "literal": "other",
}
RIGHT_FOR: dict[str, object] = {
    "optional": "x", "union": "x", "pipe": "x", "typing_union": "x", "annotated": "x",
    "new_type": "x", "optional_int": 1, "optional_float": 1.5, "optional_bool": True,
    "sequence": ["x"], "alias": ("x",), "iterable": iter(["x"]), "mapping": {"k": "v"},
    "typed_dict": {"platform": "cli"}, "path": Path("x"), "callback": print, "literal": "skip",
}


def spelled_functions(*, evaluated: bool) -> dict[str, Callable[..., None]]:
    """The functions of ``SPELLINGS``, with hints as strings or evaluated."""
    space: dict[str, Any] = {**globals(), "Optional": Optional}  # the names SPELLINGS uses
    source = SPELLINGS if evaluated else "from __future__ import annotations\n" + SPELLINGS
    exec(compile(source, "<spellings>", "exec", dont_inherit=True), space)  # noqa: S102
    functions = {name: space[name] for name in WRONG_FOR}
    for fn in functions.values():
        assert isinstance(next(iter(fn.__annotations__.values())), str) is not evaluated
    return functions


@pytest.mark.parametrize("evaluated", [False, True], ids=["string hints", "evaluated hints"])
@pytest.mark.parametrize("name", WRONG_FOR)
def test_a_check_refuses_a_wrong_type_whatever_the_spelling_of_the_hint(
    name: str, evaluated: bool
) -> None:
    check = checker(spelled_functions(evaluated=evaluated)[name], skip=0)
    with pytest.raises(InvalidInputError) as refused:
        check((WRONG_FOR[name],), {})
    assert refused.value.argument == "value"
    assert isinstance(refused.value, TypeError) is (name != "literal")
    with pytest.raises(InvalidInputError):
        check((), {"value": WRONG_FOR[name]})
    check((RIGHT_FOR[name],), {})
    if name in ("typed_dict", "literal"):  # None is no member: refused
        with pytest.raises(InvalidTypeError):
            check((None,), {})
    else:
        assert check((None,), {}) == ((None,), {})


def test_the_spellings_of_one_type_make_the_same_check() -> None:
    """``Optional[str]``, ``Union[str, None]`` and ``str | None`` are one type: a value is
    passed or refused alike by all of them."""
    values: list[object] = ["x", 7, None, 2**70, "lone \ud800", [1], 1.5, b"x"]
    outcomes = []
    for evaluated in (False, True):
        functions = spelled_functions(evaluated=evaluated)
        for name in ("optional", "union", "pipe", "typing_union", "annotated", "new_type"):
            check = checker(functions[name], skip=0)
            outcomes.append([outcome(check, value) for value in values])
    assert all(outcome == outcomes[0] for outcome in outcomes), outcomes
    assert outcomes[0] == [("x",), ("7",), (None,), ("1180591620717411303424",),
                           "InvalidInputError", "InvalidTypeError", "InvalidTypeError",
                           "InvalidTypeError"]


def outcome(check: Callable[..., Any], value: object) -> object:
    try:
        (passed,), _ = check((value,), {})
    except InvalidInputError as exc:
        return type(exc).__name__
    return (str(passed) if isinstance(passed, int) else passed,)


def test_a_hint_that_cannot_be_evaluated_is_an_error_when_the_check_is_built() -> None:
    """A check silently switched off by a hint it cannot read is what this module prevents:
    a hint naming what does not exist fails at once, not at the first call."""
    def undefined(value: NoSuchType) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(TypeError, match="undefined"):
        checker(undefined, skip=0)


def test_a_hint_of_any_takes_anything() -> None:
    def anything(value: Any, other: object) -> None: ...

    check = checker(anything, skip=0)
    for value in (object(), b"x", 2**80, "lone \ud800", None):
        assert check((value, value), {}) == ((value, value), {})


if sys.version_info >= (3, 12):  # pragma: no cover - the ``type`` statement
    def test_a_type_statement_alias_is_seen_through() -> None:
        space: dict[str, Any] = {}
        exec("type Ids = list[str] | None\ndef f(value: Ids) -> None: ...", space)  # noqa: S102
        with pytest.raises(InvalidTypeError):
            checker(space["f"], skip=0)((7,), {})
