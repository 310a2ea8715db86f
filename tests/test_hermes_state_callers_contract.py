"""Every call shape the callers of the previous ``SessionDB`` use binds against this library.

One tuple per call shape — (name, positional arguments after ``self``, keyword names) — taken
from the interface specification of those callers; module-level names bind against the
function or class itself. A shape that does not bind is a caller that breaks with a
``TypeError``. The signatures table pins names, kinds and defaults where callers rely on them.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import hermes_state
from hermes_state import SessionDB

METHOD_CALL_SHAPES: list[tuple[str, int, tuple[str, ...]]] = [
    # transcript rewrite and dedupe
    ("replace_messages", 2, ()),
    ("replace_messages", 3, ()),
    ("replace_messages", 2, ("active_only",)),
    ("has_archived_messages", 1, ()),
    ("has_platform_message_id", 2, ()),
    # rewind
    ("list_recent_user_messages", 1, ()),
    ("list_recent_user_messages", 1, ("limit",)),
    ("list_recent_user_messages", 1, ("limit", "include_inactive")),
    ("list_recent_user_messages", 3, ()),
    ("rewind_to_message", 2, ()),
    ("restore_rewound", 2, ()),
    # context windows
    ("get_messages_around", 2, ()),
    ("get_messages_around", 2, ("window",)),
    ("get_messages_around", 3, ()),
    ("get_anchored_view", 2, ("window", "bookend")),
    ("get_anchored_view", 2, ("window", "bookend", "keep_roles")),
    ("get_anchored_view", 5, ()),
    # conversation rows
    ("get_messages_as_conversation", 1, ()),
    ("get_messages_as_conversation", 2, ()),
    ("get_messages_as_conversation", 3, ()),
    ("get_messages_as_conversation", 1, ("include_ancestors",)),
    ("get_messages_as_conversation", 1, ("include_inactive",)),
    ("get_messages_as_conversation", 1, ("include_ancestors", "include_inactive")),
    # plain return values
    ("clear_messages", 1, ()),
]

MODULE_CALL_SHAPES: list[tuple[str, int, tuple[str, ...]]] = [
    ("AsyncSessionDB", 1, ()),
    ("apply_wal_with_fallback", 1, ()),
    ("apply_wal_with_fallback", 1, ("db_label",)),
    ("is_malformed_db_error", 1, ()),
]

_P = inspect.Parameter
_POS, _KW = _P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY
_NONE = _P.empty

# (name, [(parameter, kind, default)]) without ``self``; keyword-only parameters the library
# adds after the callers' ones are listed too.
SIGNATURES: list[tuple[str, list[tuple[str, Any, Any]]]] = [
    ("replace_messages", [("session_id", _POS, _NONE), ("messages", _POS, _NONE),
                          ("active_only", _POS, False), ("seen_through_id", _KW, None)]),
    ("has_archived_messages", [("session_id", _POS, _NONE)]),
    ("has_platform_message_id", [("session_id", _POS, _NONE),
                                 ("platform_message_id", _POS, _NONE)]),
    ("list_recent_user_messages", [("session_id", _POS, _NONE), ("limit", _POS, 20),
                                   ("include_inactive", _POS, False)]),
    ("rewind_to_message", [("session_id", _POS, _NONE), ("target_message_id", _POS, _NONE)]),
    ("restore_rewound", [("session_id", _POS, _NONE), ("since_message_id", _POS, _NONE)]),
    ("get_messages_around", [("session_id", _POS, _NONE), ("around_message_id", _POS, _NONE),
                             ("window", _POS, 5)]),
    ("get_anchored_view", [("session_id", _POS, _NONE), ("around_message_id", _POS, _NONE),
                           ("window", _POS, 5), ("bookend", _POS, 3),
                           ("keep_roles", _POS, ("user", "assistant"))]),
    ("get_messages_as_conversation", [("session_id", _POS, _NONE),
                                      ("include_ancestors", _POS, False),
                                      ("include_inactive", _POS, False),
                                      ("include_row_ids", _KW, False)]),
    ("clear_messages", [("session_id", _POS, _NONE)]),
]


def _bind(target: Any, positional: int, keywords: tuple[str, ...], *, method: bool) -> None:
    signature = inspect.signature(target)
    leading = (None,) if method else ()
    signature.bind(*leading, *([None] * positional), **dict.fromkeys(keywords))


@pytest.mark.parametrize(("name", "positional", "keywords"), METHOD_CALL_SHAPES)
def test_each_method_call_shape_binds(name: str, positional: int, keywords: tuple[str, ...]
                                      ) -> None:
    method = getattr(SessionDB, name, None)
    assert callable(method), f"SessionDB has no method {name}"
    _bind(method, positional, keywords, method=True)


@pytest.mark.parametrize(("name", "positional", "keywords"), MODULE_CALL_SHAPES)
def test_each_module_call_shape_binds(name: str, positional: int, keywords: tuple[str, ...]
                                      ) -> None:
    target = getattr(hermes_state, name, None)
    assert callable(target), f"hermes_state has no {name}"
    assert name in hermes_state.__all__
    _bind(target, positional, keywords, method=False)


@pytest.mark.parametrize(("name", "parameters"), SIGNATURES)
def test_signatures_keep_their_names_kinds_and_defaults(
    name: str, parameters: list[tuple[str, Any, Any]]
) -> None:
    found = list(inspect.signature(getattr(SessionDB, name)).parameters.values())
    assert found[0].name == "self"
    assert [(p.name, p.kind, p.default) for p in found[1:]] == parameters


def test_a_shape_that_does_not_bind_is_caught() -> None:
    with pytest.raises(TypeError):
        _bind(SessionDB.rewind_to_message, 2, ("preserve_compaction_handoff",), method=True)
    with pytest.raises(TypeError):
        _bind(SessionDB.get_messages_around, 4, (), method=True)
