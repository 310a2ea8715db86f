"""Every call shape the callers of the previous ``SessionDB`` use binds against this library.

One tuple per call shape — (name, positional arguments after ``self``, keyword names) — taken
from the interface specification of those callers; module-level names bind against the
function or class itself. A shape that does not bind is a caller that breaks with a
``TypeError``. The signatures table pins names, kinds and defaults where callers rely on them.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

import hermes_state
from hermes_state import SessionDB

# The filter vocabulary of list_prune_candidates, prune_sessions and archive_sessions, every
# name as the command line and the dashboard build ``**filters`` (``older_than_days=None`` and
# explicit bounds).
PRUNE_FILTERS = (
    "older_than_days", "started_before", "started_after", "source", "end_reason", "user_id",
    "chat_id", "chat_type", "provider", "title_like", "model_like", "branch_like", "cwd_prefix",
    "min_messages", "max_messages", "min_tokens", "max_tokens", "min_cost", "max_cost",
    "min_tool_calls", "max_tool_calls", "archived",
)

METHOD_CALL_SHAPES: list[tuple[str, int, tuple[str, ...]]] = [
    # 2.2 Listing and counting
    ("list_sessions_rich", 0, ()),
    ("list_sessions_rich", 0, ("limit",)),
    ("list_sessions_rich", 0, ("limit", "offset")),
    ("list_sessions_rich", 0, ("source", "limit")),
    ("list_sessions_rich", 0, ("exclude_sources", "limit", "order_by_last_active")),
    ("list_sessions_rich", 0, ("limit", "offset", "order_by_last_active", "compact_rows")),
    ("list_sessions_rich", 0,
     ("source", "exclude_sources", "limit", "offset", "include_archived",
      "order_by_last_active", "compact_rows")),
    ("list_sessions_rich", 0,
     ("limit", "offset", "include_children", "min_message_count", "order_by_last_active",
      "compact_rows")),
    ("list_sessions_rich", 0,
     ("limit", "offset", "archived_only", "order_by_last_active", "compact_rows")),
    ("list_sessions_rich", 0,
     ("cwd_prefix", "limit", "min_message_count", "order_by_last_active", "compact_rows")),
    ("list_sessions_rich", 0,
     ("limit", "offset", "include_archived", "order_by_last_active", "search_query",
      "compact_rows")),
    ("list_sessions_rich", 0,
     ("limit", "offset", "include_archived", "order_by_last_active", "id_query")),
    ("list_sessions_rich", 0,
     ("limit", "include_children", "project_compression_tips", "order_by_last_active")),
    ("list_sessions_rich", 0,
     ("limit", "include_children", "min_message_count", "archived_only",
      "order_by_last_active", "compact_rows")),
    ("list_sessions_rich", 4, ()),
    ("session_count", 0, ()),
    ("session_count", 1, ()),
    ("session_count", 0, ("source",)),
    ("session_count", 0, ("exclude_children", "exclude_sources")),
    ("session_count", 0, ("archived_only", "exclude_children")),
    ("session_count", 0, ("min_message_count", "exclude_children", "exclude_sources")),
    ("session_count", 0, ("cwd_prefix", "min_message_count", "archived_only",
                          "exclude_children", "exclude_sources")),
    ("search_sessions_by_id", 1, ()),
    ("search_sessions_by_id", 1, ("limit",)),
    ("search_sessions_by_id", 1, ("limit", "include_archived")),
    ("list_cron_job_runs", 1, ()),
    ("list_cron_job_runs", 1, ("limit", "offset")),
    # 2.4 Resume target
    ("resolve_resume_session_id", 1, ()),
    # 3.3, 3.10, 3.13 Methods whose results callers read in their shape
    ("export_session_lineage", 1, ()),
    ("search_sessions", 0, ()),
    ("search_sessions", 0, ("source", "limit", "offset")),
    ("search_sessions", 3, ()),
    ("export_all", 0, ()),
    ("export_all", 0, ("source",)),
    ("set_session_title", 2, ()),
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
    # 2.3 Deleting, pruning, archiving
    ("delete_session", 1, ()),
    ("delete_session", 1, ("sessions_dir",)),
    ("list_prune_candidates", 0, PRUNE_FILTERS),
    ("list_prune_candidates", 0, ("older_than_days", "started_before", "started_after")),
    ("list_prune_candidates", 0, ("older_than_days", "source")),
    ("prune_sessions", 0, ("sessions_dir", *PRUNE_FILTERS)),
    ("prune_sessions", 0, ("older_than_days",)),
    ("prune_sessions", 0, ("older_than_days", "source")),
    ("maybe_auto_prune_and_vacuum", 0,
     ("retention_days", "min_interval_hours", "vacuum", "sessions_dir")),
    ("maybe_auto_prune_and_vacuum", 0, ("sessions_dir",)),
    ("archive_sessions", 0, PRUNE_FILTERS),
    ("delete_sessions", 1, ()),
    ("delete_sessions", 1, ("sessions_dir",)),
    ("delete_session_if_empty", 1, ("sessions_dir",)),
    ("count_empty_sessions", 0, ()),
    ("delete_empty_sessions", 0, ()),
    ("delete_empty_sessions", 0, ("sessions_dir",)),
    ("prune_empty_ghost_sessions", 0, ("sessions_dir",)),
    ("finalize_orphaned_compression_sessions", 0, ()),
    # 3.2 vacuum, 3.12 plain return values
    ("vacuum", 0, ()),
    ("set_session_archived", 2, ()),
    ("end_session", 2, ()),
    ("release_compression_lock", 2, ()),
    # 3.15 Gateway routing entries
    ("load_gateway_routing_entries", 0, ()),
    ("load_gateway_routing_entries", 0, ("scope",)),
    ("replace_gateway_routing_entries", 1, ("scope",)),
]

MODULE_CALL_SHAPES: list[tuple[str, int, tuple[str, ...]]] = [
    ("AsyncSessionDB", 1, ()),
    ("apply_wal_with_fallback", 1, ()),
    ("apply_wal_with_fallback", 1, ("db_label",)),
    ("is_malformed_db_error", 1, ()),
    ("workspace_key", 1, ()),
    ("format_session_db_unavailable", 0, ()),
    ("format_session_db_unavailable", 1, ()),
    ("get_last_init_error", 0, ()),
    ("repair_state_db_schema", 1, ()),
    ("repair_state_db_schema", 1, ("backup",)),
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


_P = inspect.Parameter
_POS, _KW, _VAR_KW = _P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY, _P.VAR_KEYWORD
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
                                      ("repair_alternation", _POS, False),
                                      ("include_row_ids", _KW, False)]),
    ("clear_messages", [("session_id", _POS, _NONE)]),
    ("list_sessions_rich", [
        ("source", _POS, None), ("exclude_sources", _POS, None), ("cwd_prefix", _POS, None),
        ("limit", _POS, 20), ("offset", _POS, 0), ("include_children", _POS, False),
        ("min_message_count", _POS, 0), ("project_compression_tips", _POS, True),
        ("order_by_last_active", _POS, False), ("include_archived", _POS, False),
        ("archived_only", _POS, False), ("id_query", _POS, None), ("search_query", _POS, None),
        ("compact_rows", _POS, False),
    ]),
    ("session_count", [
        ("source", _POS, None), ("cwd_prefix", _POS, None), ("min_message_count", _POS, 0),
        ("include_archived", _POS, False), ("archived_only", _POS, False),
        ("exclude_children", _POS, False), ("exclude_sources", _POS, None),
    ]),
    ("search_sessions_by_id", [("query", _POS, _NONE), ("limit", _POS, 20),
                               ("include_archived", _POS, True)]),
    ("list_cron_job_runs", [("job_id", _POS, _NONE), ("limit", _POS, 20), ("offset", _POS, 0)]),
    ("resolve_resume_session_id", [("session_id", _POS, _NONE)]),
    ("search_sessions", [("source", _POS, None), ("limit", _POS, 20), ("offset", _POS, 0)]),
    ("export_session_lineage", [("session_id", _POS, _NONE)]),
    ("delete_session", [("session_id", _POS, _NONE), ("sessions_dir", _POS, None)]),
    ("list_prune_candidates", [("older_than_days", _POS, None), ("source", _POS, None),
                               ("filters", _VAR_KW, _NONE)]),
    ("prune_sessions", [("older_than_days", _POS, 90), ("source", _POS, None),
                        ("sessions_dir", _POS, None), ("only_ids", _KW, None),
                        ("filters", _VAR_KW, _NONE)]),
    ("maybe_auto_prune_and_vacuum", [("retention_days", _POS, 90),
                                     ("min_interval_hours", _POS, 24), ("vacuum", _POS, True),
                                     ("sessions_dir", _POS, None)]),
    ("archive_sessions", [("older_than_days", _POS, None), ("source", _POS, None),
                          ("filters", _VAR_KW, _NONE)]),
    ("delete_sessions", [("session_ids", _POS, _NONE), ("sessions_dir", _POS, None)]),
    ("delete_session_if_empty", [("session_id", _POS, _NONE), ("sessions_dir", _POS, None)]),
    ("count_empty_sessions", []),
    ("delete_empty_sessions", [("sessions_dir", _POS, None)]),
    ("prune_empty_ghost_sessions", [("sessions_dir", _POS, None)]),
    ("finalize_orphaned_compression_sessions", []),
    ("vacuum", []),
    ("set_session_archived", [("session_id", _POS, _NONE), ("archived", _POS, _NONE)]),
    ("end_session", [("session_id", _POS, _NONE), ("end_reason", _POS, _NONE)]),
    ("release_compression_lock", [("session_id", _POS, _NONE), ("holder", _POS, _NONE)]),
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


def test_the_module_level_names_callers_import() -> None:
    """``_db_opens_cleanly`` is imported by name though private; the attributes are read."""
    _bind(hermes_state._db_opens_cleanly, 1, (), method=False)
    assert isinstance(hermes_state.DEFAULT_DB_PATH, Path)
    assert "DEFAULT_DB_PATH" in hermes_state.__all__
    signature = inspect.signature(hermes_state.repair_state_db_schema)
    assert signature.parameters["backup"].kind is inspect.Parameter.KEYWORD_ONLY


def test_contains_cjk_is_a_static_method_of_one_text() -> None:
    assert isinstance(inspect.getattr_static(SessionDB, "_contains_cjk"), staticmethod)
    assert list(inspect.signature(SessionDB._contains_cjk).parameters) == ["text"]


def test_a_shape_that_does_not_bind_is_caught() -> None:
    with pytest.raises(TypeError):
        _bind(SessionDB.rewind_to_message, 2, ("preserve_compaction_handoff",), method=True)
    with pytest.raises(TypeError):
        _bind(SessionDB.get_messages_around, 4, (), method=True)


@pytest.mark.parametrize(("name", "positional"), KEYWORD_ONLY, ids=[n for n, _ in KEYWORD_ONLY])
def test_the_keyword_only_parameters_refuse_positions(name: str, positional: int) -> None:
    signature = inspect.signature(getattr(SessionDB, name))
    kinds = [p.kind for p in list(signature.parameters.values())[1 + positional:]]
    assert kinds and set(kinds) == {inspect.Parameter.KEYWORD_ONLY}
    with pytest.raises(TypeError):
        signature.bind(None, *[None] * (positional + 1))
