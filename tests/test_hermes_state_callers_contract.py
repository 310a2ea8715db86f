"""Every call shape the previous SessionDB's callers use binds to this SessionDB.

One row per call shape, taken from the callers' contract: (method name, number of positional
arguments after ``self``, names of the keyword arguments). A row binds when
``inspect.signature(SessionDB.<name>).bind(self, *positionals, **keywords)`` accepts it.
Append a section's rows under its own heading.
"""

from __future__ import annotations

import inspect

import pytest

from hermes_state import SessionDB

CALL_SHAPES: list[tuple[str, int, tuple[str, ...]]] = [
    # 2.4 Resume target and workspace metadata
    ("update_session_cwd", 2, ()),
    ("update_session_cwd", 2, ("git_branch", "git_repo_root")),
    ("update_session_cwd", 4, ()),
    ("backfill_repo_roots", 1, ()),
    ("distinct_session_cwds", 0, ()),
    ("distinct_session_cwds", 0, ("include_archived",)),
    # 2.5 Telegram DM topic mode
    ("apply_telegram_topic_migration", 0, ()),
    ("get_telegram_topic_binding", 0, ("chat_id", "thread_id")),
    ("is_telegram_topic_mode_enabled", 0, ("chat_id", "user_id")),
    ("bind_telegram_topic", 0, ("chat_id", "thread_id", "user_id", "session_key", "session_id")),
    ("bind_telegram_topic", 0,
     ("chat_id", "thread_id", "user_id", "session_key", "session_id", "managed_mode")),
    ("enable_telegram_topic_mode", 0, ("chat_id", "user_id")),
    ("enable_telegram_topic_mode", 0,
     ("chat_id", "user_id", "has_topics_enabled", "allows_users_to_create_topics")),
    ("disable_telegram_topic_mode", 0, ("chat_id",)),
    ("disable_telegram_topic_mode", 0, ("chat_id", "clear_bindings")),
    ("delete_telegram_topic_binding", 0, ("chat_id", "thread_id")),
    ("list_telegram_topic_bindings_for_chat", 0, ("chat_id",)),
    ("get_telegram_topic_binding_by_session", 0, ("session_id",)),
    ("is_telegram_session_linked_to_topic", 0, ("session_id",)),
    ("list_unlinked_telegram_sessions_for_user", 0, ("chat_id", "user_id", "limit")),
    # 2.7 Cross-platform handoff
    ("fail_handoff", 2, ()),
    ("get_handoff_state", 1, ()),
    ("request_handoff", 2, ()),
    ("list_pending_handoffs", 0, ()),
    ("claim_handoff", 1, ()),
    ("complete_handoff", 1, ()),
    # 2.9 Session model and metadata updates
    ("update_session_meta", 2, ()),
    ("update_session_meta", 3, ()),
    ("update_session_meta", 2, ("model",)),
    ("update_session_model", 2, ()),
    ("update_session_billing_route", 1, ("provider", "base_url")),
    ("update_session_billing_route", 1, ("provider", "base_url", "billing_mode")),
    # 2.11 Gateway routing lookups
    ("list_gateway_sessions", 0, ()),
    ("list_gateway_sessions", 0, ("platform", "active_only")),
    ("find_session_by_origin", 0, ("platform", "chat_id")),
    ("find_session_by_origin", 0, ("platform", "chat_id", "thread_id", "user_id")),
    ("find_latest_gateway_session_for_peer", 0,
     ("source", "user_id", "session_key", "chat_id", "chat_type", "thread_id")),
    ("record_gateway_session_peer", 1,
     ("source", "user_id", "session_key", "chat_id", "chat_type", "thread_id", "display_name",
      "origin_json")),
    ("set_expiry_finalized", 1, ()),
    ("set_expiry_finalized", 2, ()),
    # 2.12 Compression state
    ("get_compression_fallback_streak", 1, ()),
    ("set_compression_fallback_streak", 2, ()),
    ("record_compression_failure_cooldown", 2, ()),
    ("record_compression_failure_cooldown", 3, ()),
    ("record_compression_failure_cooldown", 2, ("error",)),
    ("get_compression_failure_cooldown", 1, ()),
    ("clear_compression_failure_cooldown", 1, ()),
    # 3.15 Gateway routing entries
    ("load_gateway_routing_entries", 0, ()),
    ("load_gateway_routing_entries", 0, ("scope",)),
    ("replace_gateway_routing_entries", 1, ("scope",)),
]

# Methods whose parameters the contract makes keyword-only (after any positional it lists).
KEYWORD_ONLY: list[tuple[str, int]] = [
    ("get_telegram_topic_binding", 0),
    ("is_telegram_topic_mode_enabled", 0),
    ("bind_telegram_topic", 0),
    ("enable_telegram_topic_mode", 0),
    ("disable_telegram_topic_mode", 0),
    ("delete_telegram_topic_binding", 0),
    ("list_telegram_topic_bindings_for_chat", 0),
    ("get_telegram_topic_binding_by_session", 0),
    ("is_telegram_session_linked_to_topic", 0),
    ("list_unlinked_telegram_sessions_for_user", 0),
    ("update_session_billing_route", 1),
    ("list_gateway_sessions", 0),
    ("find_session_by_origin", 0),
    ("find_latest_gateway_session_for_peer", 0),
    ("record_gateway_session_peer", 1),
]


def shape_id(shape: tuple[str, int, tuple[str, ...]]) -> str:
    name, positional, keywords = shape
    return f"{name}/{positional}/{','.join(keywords) or '-'}"


@pytest.mark.parametrize("shape", CALL_SHAPES, ids=shape_id)
def test_the_call_shape_binds(shape: tuple[str, int, tuple[str, ...]]) -> None:
    name, positional, keywords = shape
    method = getattr(SessionDB, name, None)
    assert callable(method), f"SessionDB has no method {name}"
    inspect.signature(method).bind(None, *[None] * positional, **dict.fromkeys(keywords))


@pytest.mark.parametrize(("name", "positional"), KEYWORD_ONLY, ids=[n for n, _ in KEYWORD_ONLY])
def test_the_keyword_only_parameters_refuse_positions(name: str, positional: int) -> None:
    signature = inspect.signature(getattr(SessionDB, name))
    kinds = [p.kind for p in list(signature.parameters.values())[1 + positional:]]
    assert kinds and set(kinds) == {inspect.Parameter.KEYWORD_ONLY}
    with pytest.raises(TypeError):
        signature.bind(None, *[None] * (positional + 1))
