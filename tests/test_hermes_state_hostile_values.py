"""Hostile values through every public entry point: only typed errors, and a consistent store.

The methods are enumerated from ``SessionDB`` itself and their argument slots derived from
``inspect.signature``, so a method added later is covered without touching this file. Each
call fills every required slot with a plain value and poisons a drawn subset of slots with
lone surrogates, NUL, integers at and past the 64-bit edges, negative and non-finite numbers,
wrong types, circular, deeply nested and unserialisable structures, very long and empty
strings, and bytes — or with values drawn at random (:data:`RANDOM`). A call may return
normally or raise a ``HermesStateError`` subclass; anything else fails the test. After the
examples the file passes ``integrity_check`` and every session's counters match its rows. A
call of the wrong shape (a required argument missing, an unknown keyword) raises
``TypeError``.
"""

from __future__ import annotations

import inspect
import io
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hermes_state
from hermes_state import HermesStateError, InvalidTypeError, SessionDB, SessionNotFoundError
from state_helpers import populate

SESSION = "sess-0"


def _circular_list() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


def _circular_dict() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["self"] = value
    return value


def _deep(depth: int = 5000) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def _deep_dict(depth: int = 5000) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


class _Unrepresentable:
    def __str__(self) -> str:
        raise RuntimeError("no text")

    __repr__ = __str__


# Builders, so that a method that keeps or mutates a value never sees it again.
HOSTILE: list[Callable[[], Any]] = [
    lambda: "\ud800",
    lambda: "lone \udfff inside",
    lambda: "nul\x00byte",
    lambda: "",
    lambda: "x" * 100_000,
    lambda: b"bytes",
    lambda: bytearray(b"\xff\xfe"),
    lambda: 2**64,
    lambda: -(2**70),
    lambda: -1,
    lambda: float("nan"),
    lambda: float("inf"),
    lambda: float("-inf"),
    lambda: -0.5,
    lambda: True,
    lambda: None,
    lambda: object(),
    lambda: _Unrepresentable(),
    lambda: _circular_list(),
    lambda: _circular_dict(),
    lambda: _deep(),
    lambda: _deep_dict(),
    lambda: 2**63 - 2,
    lambda: 2**63,
    lambda: -(2**63) - 1,
    lambda: [object()],
    lambda: [{"role": "user", "content": "\ud800", "tool_calls": _circular_list()}],
    lambda: [{"role": "assistant", "tool_calls": [{"id": object()}]}],
    lambda: {"k": object()},
    lambda: {1: 2},
    lambda: {"a": "\ud800"},
    lambda: [1, 2, 3],
    lambda: ["\ud800"],
    lambda: [2**70],
    lambda: "just a string",
    lambda: 3.5,
    lambda: set(),
]


def plain(param: inspect.Parameter, paths: dict[str, Path]) -> Any:
    """A value the slot takes in ordinary use, read from its annotation (a path slot's from
    ``paths``, by name, else the first one)."""
    text = str(param.annotation)
    if "Path" in text:
        return paths.get(param.name, next(iter(paths.values())))
    if param.default is not inspect.Parameter.empty and param.default is not None:
        return param.default
    if "IO[" in text:
        return io.StringIO("")
    if text.startswith(("Iterable[Mapping", "Collection[Mapping")):
        return []
    if "Iterable[str]" in text or "Collection[str]" in text or "tuple[str" in text:
        return [SESSION]
    if text.startswith("Mapping"):
        return {}
    if text.startswith("int"):
        return 1
    if text.startswith("float"):
        return 1.0
    if text.startswith("bool"):
        return False
    if text in ("Any", "object"):
        return {"k": "v"}
    return SESSION


def slots(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    """The named argument slots of ``fn`` (``self`` and ``*``/``**`` parameters left out)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY,
             inspect.Parameter.POSITIONAL_ONLY)
    return [p for p in inspect.signature(fn).parameters.values()
            if p.kind in kinds and p.name != "self"]


def public_methods() -> list[str]:
    return sorted(
        name for name, value in vars(SessionDB).items()
        if not name.startswith("_") and callable(getattr(SessionDB, name))
        and slots(getattr(SessionDB, name))
    )


def call(fn: Callable[..., Any], params: list[inspect.Parameter], poison: dict[str, Any],
         paths: dict[str, Path]) -> Any:
    positional, keywords = [], {}
    for param in params:
        if param.name in poison:
            value = poison[param.name]
        elif param.default is not inspect.Parameter.empty:
            continue
        else:
            value = plain(param, paths)
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append(value)
        else:
            keywords[param.name] = value
    result = fn(*positional, **keywords)
    if isinstance(result, Iterator):
        result = list(result)
    return result


# Tried besides the drawn examples in every slot whose annotation names one of the kinds: values
# that once escaped untyped (an OverflowError at 4 * limit, a RecursionError showing a nested
# mapping).
EDGE_BY_ANNOTATION: list[tuple[tuple[str, ...], Callable[[], Any]]] = [
    (("int",), lambda: 2**63 - 2),
    (("Mapping", "dict", "Any", "object"), lambda: _deep_dict()),
]

# Values drawn at random besides the hostile ones above: integers around every 32- and 64-bit
# edge, any float, text with any code point (lone surrogates and NUL included), bytes, and small
# nested JSON-like structures.
_EDGES = [sign * 2**bits + delta for bits in (31, 32, 53, 63, 64) for sign in (1, -1)
          for delta in (-2, -1, 0, 1)]
RANDOM: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(_EDGES),
    st.integers(min_value=-(2**66), max_value=2**66),
    st.floats(),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=40),
    st.binary(max_size=16),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=8,
    ),
)


def poisonings(params: list[inspect.Parameter]) -> st.SearchStrategy[dict[str, Any]]:
    names = [p.name for p in params]
    return st.dictionaries(
        st.sampled_from(names),
        st.one_of(st.sampled_from(HOSTILE).map(lambda build: build()), RANDOM),
        min_size=1, max_size=min(3, len(names)),
    )


def assert_only_typed(fn: Callable[..., Any], params: list[inspect.Parameter],
                      poison: dict[str, Any], paths: dict[str, Path]) -> None:
    try:
        call(fn, params, poison, paths)
    except HermesStateError:
        pass
    except BaseException as exc:  # noqa: BLE001 - the point is to see what escapes
        shown = {k: repr(v)[:60] for k, v in poison.items()}
        pytest.fail(f"{fn.__name__}({shown}) raised untyped {type(exc).__name__}: {exc!s:.200}")


# Documented: a rewind and its restore leave the counters as they were (callers expect it).
COUNTERS_LEFT_ALONE = frozenset({"rewind_to_message", "restore_rewound"})


def assert_consistent(db: SessionDB, *, counters: bool = True) -> None:
    conn = sqlite3.connect(f"{db.path.as_uri()}?mode=ro", uri=True)
    try:
        assert [row[0] for row in conn.execute("PRAGMA integrity_check")] == ["ok"]
    finally:
        conn.close()
    for session in db.search_sessions(limit=-1) if counters else []:
        rows = db.get_messages(session["id"])
        assert session["message_count"] == len(rows), session["id"]
        calls = sum(len(row["tool_calls"] or ()) for row in rows if row["role"] == "assistant")
        assert session["tool_call_count"] == calls, session["id"]


_SETTINGS = settings(
    max_examples=6, deadline=None, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize("name", public_methods())
def test_every_method_meets_hostile_values_with_typed_errors(name: str, db_path: Path) -> None:
    db = SessionDB(db_path)
    try:
        populate(db, sessions=2, messages=2)
        method = getattr(db, name)
        params = slots(method)

        @_SETTINGS
        @given(poison=poisonings(params))
        def run(poison: dict[str, Any]) -> None:
            assert_only_typed(method, params, poison, {"path": db_path})

        run()
        for param in params:  # and, in each slot of its kind, the values that escaped untyped
            for kinds, build in EDGE_BY_ANNOTATION:
                if any(kind in str(param.annotation) for kind in kinds):
                    assert_only_typed(method, params, {param.name: build()}, {"path": db_path})
        assert_consistent(db, counters=name not in COUNTERS_LEFT_ALONE)
    finally:
        db.close()


def _required(params: list[inspect.Parameter]) -> list[inspect.Parameter]:
    return [p for p in params if p.default is inspect.Parameter.empty]


def test_a_call_of_the_wrong_shape_is_pythons_type_error(db_path: Path) -> None:
    """Every method called without one of its required arguments, or with a keyword it does
    not take, raises ``TypeError`` (Python's own, or the library's ``InvalidTypeError``) or
    another typed error — never a ``KeyError`` naming the missing argument — and writes
    nothing."""
    escaped = []
    with SessionDB(db_path) as db:
        populate(db, sessions=2, messages=2)
        before = db.export_all()
        for name in public_methods():
            method = getattr(db, name)
            params = slots(method)
            shapes = [{"missing": p.name} for p in _required(params)] + [{"unknown": True}]
            for shape in shapes:
                kwargs = {p.name: plain(p, {"path": db_path}) for p in _required(params)
                          if p.name != shape.get("missing")}
                if shape.get("unknown"):
                    kwargs["no_such_argument"] = 1
                try:
                    result = method(**kwargs)
                    if isinstance(result, Iterator):
                        list(result)
                except (TypeError, HermesStateError):
                    continue
                except BaseException as exc:  # noqa: BLE001 - the point is to see what escapes
                    escaped.append(f"{name} {shape}: {type(exc).__name__}: {exc!s:.80}")
                    continue
                escaped.append(f"{name} {shape}: returned")
        assert db.export_all() == before
    assert escaped == []


def test_an_id_past_64_bits_inside_a_collection_is_an_id_that_names_no_row(db_path: Path) -> None:
    """A collection of ids takes ints as a str parameter does: one past SQLite's 64 bits is
    its text, so it matches nothing and deletes nothing (it escaped as OverflowError)."""
    huge = 2**70
    with SessionDB(db_path) as db:
        populate(db, sessions=2, messages=2)
        before = db.export_all()
        with pytest.raises(SessionNotFoundError, match=str(huge)):
            list(db.iter_export_jsonl(session_ids=[huge]))
        assert db.delete_sessions([huge, str(huge)]) == 0
        assert db.search_messages("message", source_filter=[huge]) == []
        assert db.session_count(exclude_sources=[huge]) == len(before)
        assert db.export_all() == before


@pytest.mark.parametrize("method, kwargs", [
    ("search_messages", {"query": "message", "source_filter": [None]}),
    ("search_messages", {"query": "message", "exclude_sources": ["cli", None]}),
    ("search_messages", {"query": "message", "role_filter": [None]}),
    ("list_sessions_rich", {"exclude_sources": [None]}),
    ("session_count", {"exclude_sources": (None,)}),
])
def test_a_filter_item_none_is_refused_not_read_as_the_text_none(
    db_path: Path, method: str, kwargs: dict[str, Any]
) -> None:
    """An item None in a filter list named the source (or role) "None": a session of that
    source was selected, or left out."""
    with SessionDB(db_path) as db:
        db.create_session("s-none", "None")
        db.append_message("s-none", role="user", content="a message")
        with pytest.raises(InvalidTypeError, match="an item of .* must be str, got NoneType"):
            getattr(db, method)(**kwargs)


def test_a_progress_callback_that_is_not_callable_is_refused_typed(db_path: Path) -> None:
    """``progress`` is annotated through its module (``transfer.Progress``); the check still
    knows it for a callback (a string got as far as being called)."""
    with SessionDB(db_path) as db:
        with pytest.raises(InvalidTypeError, match="progress"):
            db.import_sessions([], progress="report")  # type: ignore[arg-type]
        with pytest.raises(InvalidTypeError, match="progress"):
            db.import_jsonl(io.StringIO(""), progress=1)  # type: ignore[arg-type]
        assert db.session_count() == 0


def test_the_method_list_is_the_class() -> None:
    """A new public method is covered without being named here."""
    names = public_methods()
    assert "append_message" in names and "list_sessions_rich" in names
    assert len(names) > 100


# The module-level operations a caller runs on a store or a home. Paths that are hostile must
# be refused with a typed error before any file is touched.
MODULE_OPERATIONS = [
    "backup_state_db", "restore_state_db", "repair_state_db", "recover_state_db",
    "collect_profile_stats", "display_hermes_home", "resolve_profile_home",
    "resolve_store_home", "profile_config_path", "child_process_env", "workspace_key",
]


@pytest.mark.parametrize("name", MODULE_OPERATIONS)
def test_module_operations_meet_hostile_values_with_typed_errors(
    name: str, db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hostile string is a relative path too: whatever it creates lands in a scratch folder.
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    db = SessionDB(db_path)
    populate(db, sessions=1, messages=2)
    db.close()
    fn = getattr(hermes_state, name)
    params = slots(fn)
    home = db_path.parent
    paths = {"db_path": db_path, "source": db_path, "snapshot": db_path,
             "dest": home / "copy.db", "output": home / "recovered.db", "root": home,
             "home": home, "profile_home": home}

    @_SETTINGS
    @given(poison=poisonings(params))
    def run(poison: dict[str, Any]) -> None:
        assert_only_typed(fn, params, poison, paths)

    run()
    with SessionDB(db_path) as reopened:
        assert_consistent(reopened)
