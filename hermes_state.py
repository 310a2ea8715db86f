"""hermes_state: the SQLite session store of an AI agent — the ``SessionDB`` facade.

``SessionDB`` owns one connection, one re-entrant lock and the public API. Its class body is the
API's index: one line per method, naming the sibling function it runs and the call's whole
policy (read or write, the write's policy, a fallback), built by ``hermes_state_methods``.
docs/api.md ("How a call flows") traces one call end to end."""

from __future__ import annotations

# asyncio and sys are attributes of this module on purpose: the application's tests patch
# ``hermes_state.asyncio.to_thread`` (the async wrapper looks it up at each call).
import asyncio  # noqa: F401
import functools
import logging
import sqlite3
import sys  # noqa: F401
import threading
import time  # noqa: F401 -- reachable as hermes_state.time, as with the previous store
from pathlib import Path
from typing import Any

import hermes_state_arguments as arguments
import hermes_state_connect as dbconn
import hermes_state_home as home_paths
import hermes_state_compat as compat
import hermes_state_compression as compression
import hermes_state_context_window as context_window
import hermes_state_deletion as deletion
import hermes_state_errors as errors
import hermes_state_fts as fts
import hermes_state_fulltext as fulltext
import hermes_state_gateway as gateway
import hermes_state_handoff as handoff
import hermes_state_lifecycle as lifecycle
import hermes_state_lineage as lineage
import hermes_state_listing as listing
import hermes_state_maintenance as maintenance
import hermes_state_messages as messages
import hermes_state_methods as methods
import hermes_state_openability as openability
import hermes_state_operations as operations
import hermes_state_peers as peers
import hermes_state_profiles as profiles
import hermes_state_quarantine as quarantine
import hermes_state_rewind as rewind
import hermes_state_search as search
import hermes_state_seen as seen
import hermes_state_session_model as session_model
import hermes_state_sessions as sessions
import hermes_state_telegram as telegram
import hermes_state_testguard as testguard
import hermes_state_transfer as transfer
import hermes_state_turnstile as turnstile
import hermes_state_upkeep as upkeep
import hermes_state_workspace as workspace
import hermes_state_writes as writes
from hermes_state_errors import *  # noqa: F403 -- the facade re-exports the error hierarchy
from hermes_state_async import AsyncSessionDB
from hermes_state_methods import handle_method as _handle
from hermes_state_methods import lenient
from hermes_state_methods import read_method as _reads
from hermes_state_methods import write_method as _writes
from hermes_state_operations import *  # noqa: F403 -- the module-level API, re-exported
from hermes_state_profiles import ProfileStoreRegistry
import hermes_state_wal as wal
from hermes_state_writes import Timing

__all__ = ["SessionDB", "AsyncSessionDB", "Timing", "collect_profile_stats", "profile_stores",
           *operations.__all__, *errors.__all__]

# --- names the application imports from the previous store (see docs/compatibility.md) -----

_collect_delegate_child_ids = deletion.delegate_children
_delete_delegate_children = deletion.delete_delegate_children
_is_background_review_harness_message = messages.is_background_review_prompt
_strip_background_review_harness = messages.without_background_review
# The remembered last open error, cleared or set by callers that handled it themselves.
_set_last_init_error = openability.set_last_init_error
# The labels the WAL fallback has warned about once in this process (clearing it re-arms them).
_wal_fallback_warned_paths = wal.warned_labels

#: The package version (the one place it is written: the build reads it from here).
__version__ = "0.1.0"

logger = logging.getLogger("hermes_state")
# The previous store's doctor probes a file with this name.
_db_opens_cleanly = openability.db_opens_cleanly


# The write policies the table names (hermes_state_writes.WritePolicy; a write names none).
# A transcript waits 60 s; refused on a corrupt file, the messages it carries are spooled.
_TRANSCRIPT = writes.WritePolicy("transcript", quarantine.Spool())
_COMPACTION = writes.WritePolicy("transcript", quarantine.Spool(messages="compacted_messages"))
_CHILD_TRANSCRIPT = writes.WritePolicy("transcript", quarantine.Spool(session="child_session_id"))
_TRANSCRIPT_EDIT = writes.WritePolicy("transcript")  # rewinds and clears carry no messages
_ACTIVITY = writes.WritePolicy("activity")  # 0.5 s, then skipped: a stamp, not a record


class SessionDB:
    """A handle on one session store (default: ``get_hermes_home() / "state.db"``): thread-safe,
    a context manager, ``close()`` idempotent. Its parameters (``read_only``, ``seen_sessions``,
    ``timing``, ``on_connect``, ``wal_reset_exposed``, ``full_text``) are described in
    docs/api.md; its methods are the table below."""

    _connection: sqlite3.Connection  # set by the open (hermes_state_lifecycle)

    def __init__(
        self,
        db_path: str | Path | None = None,
        *,
        read_only: bool = False,
        rebuild_fts: bool = True,
        seen_sessions: int | None = None,
        timing: writes.Timing | None = None,
        on_connect: lifecycle.OnConnect | None = None,
        wal_reset_exposed: bool | None = None,
        full_text: str | None = None,
    ) -> None:
        self.full_text = fulltext.resolve(full_text)
        path = home_paths.store_path(db_path)
        testguard.check_test_isolation(path)
        self.db_path = path
        self.path = path.absolute()
        # A home's own store is its state.db; a scratch file belongs to the context's home.
        in_home = self.path.name == home_paths.DB_FILENAME
        self.profile_home = self.path.parent if in_home else home_paths.get_hermes_home().absolute()
        self.read_only = read_only
        self.timing = writes.timing_of(timing)
        self._on_connect = lifecycle.checked_hook(on_connect, wal_reset_exposed)
        self.write_retries = 0
        self._lock = threading.RLock()
        self._closed = False
        self._checkpoints = lifecycle.checkpoints(self, wal_reset_exposed)
        self._watch = lifecycle.watch(self)
        self._turnstile = turnstile.Turnstile(self.path)
        self._upkeep = upkeep.Upkeep(self)
        self._seen = seen.SeenThrough(seen_sessions)
        try:
            opening = lifecycle.open_read_only if read_only else lifecycle.open_writable
            self._connection = opening(self)
        except BaseException as exc:
            openability.record_open_error(exc)
            raise
        if (not read_only and rebuild_fts and self._watch.reason is None
                and self.full_text == fulltext.FULL):
            self._upkeep.start()

    # --- opening, reading, closing (see hermes_state_lifecycle) ------------------------------

    _connect = lifecycle.connect
    _read = lifecycle.read
    _snapshot_reader = lifecycle.snapshot_reader

    def close(self) -> None:
        """Close the handle (idempotent). A quarantined handle skips every checkpoint and
        leaves the -wal; so does one whose checkpoints are left to Litestream."""
        self._upkeep.stop()
        lifecycle.close(self)

    def __enter__(self) -> SessionDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # --- the write path (see hermes_state_writes) ---------------------------------------------

    _write = writes.write
    _outside_transaction = writes.outside_transaction

    # --- quarantine (see hermes_state_quarantine) ---------------------------------------------

    @property
    def quarantined(self) -> bool:
        """Whether the file met corruption (see hermes_state_quarantine.Watch.quarantined)."""
        return self._watch.quarantined

    # --- the compatibility surface (see hermes_state_compat and docs/compatibility.md) -------

    @property
    def _conn(self) -> compat.RowConnection:
        return compat.row_connection(self)

    _execute_write = compat.execute_write

    # --- checkpoints --------------------------------------------------------------------------

    @property
    def wal_reset_exposed(self) -> bool:
        """Whether this process's SQLite lies in the WAL-reset bug range."""
        return self._checkpoints.wal_reset_exposed

    @property
    def last_checkpoint(self) -> tuple[int, int, int] | None:
        """SQLite's result row of the handle's last checkpoint (None: none yet)."""
        return self._checkpoints.last

    @last_checkpoint.setter
    def last_checkpoint(self, row: tuple[int, int, int] | None) -> None:
        self._checkpoints.last = row

    checkpoint = _handle(writes.checkpoint)

    # --- index upkeep (see hermes_state_upkeep) -----------------------------------------------

    @property
    def started_index_upkeep(self) -> bool:
        return upkeep.started_index_upkeep(self)

    wait_for_index = _handle(upkeep.wait_for_index)
    rebuild_fts = _handle(upkeep.rebuild_fts)
    fts_status = _reads(fts.status)
    optimize_fts = _writes(fts.optimize_indexes)

    check_fts_integrity = _handle(upkeep.check_fts_integrity)
    quick_health = _reads(maintenance.quick_health)

    # --- sessions -----------------------------------------------------------------------------

    create_session = _writes(sessions.create_session)
    ensure_session = _writes(sessions.ensure_session)
    get_session = _reads(sessions.get_session)
    resolve_session_id = _reads(sessions.resolve_session_id)
    sessions_starting_with = _reads(sessions.sessions_starting_with)
    end_session = _writes(sessions.end_session)
    reopen_session = _writes(sessions.reopen_session)
    update_system_prompt = _writes(sessions.update_system_prompt)
    update_token_counts = _writes(sessions.update_token_counts)
    get_model_usage = _reads(sessions.get_model_usage)
    list_sessions_rich = _reads(listing.list_sessions_rich)
    # The previous store's name for one enriched row; the dashboard calls it.
    _get_session_rich_row = _reads(listing.get_session_rich_row)
    search_sessions = _reads(listing.search_sessions)
    session_count = _reads(listing.session_count)
    search_sessions_by_id = _reads(listing.search_sessions_by_id)
    list_cron_job_runs = _reads(listing.list_cron_job_runs)
    set_session_archived = _writes(sessions.set_session_archived)
    auto_archive_idle_sessions = _writes(sessions.auto_archive_idle_sessions)
    message_count = _reads(sessions.message_count)
    get_meta = _reads(dbconn.get_meta)
    set_meta = _writes(dbconn.set_meta)
    stats = _reads(sessions.stats)
    export_all = _reads(transfer.export_all)

    export_session = _reads(seen.EXPORT_SESSION)
    export_session_lineage = _reads(seen.EXPORT_SESSION_LINEAGE)

    iter_export_jsonl = _handle(transfer.iter_export_jsonl)
    import_sessions = _handle(transfer.import_sessions)
    import_jsonl = _handle(transfer.import_jsonl)

    # The list import's bounds, under the previous store's names.
    _IMPORT_MAX_SESSIONS = transfer.LIST_MAX_SESSIONS
    _IMPORT_MAX_MESSAGES_PER_SESSION = transfer.LIST_MAX_SESSION_MESSAGES
    _IMPORT_MAX_SESSION_BYTES = transfer.LIST_MAX_SESSION_BYTES
    _IMPORT_MAX_TOTAL_MESSAGES = transfer.LIST_MAX_MESSAGES
    _IMPORT_MAX_TOTAL_BYTES = transfer.LIST_MAX_BYTES

    # --- session model, workspace, handoff ----------------------------------------------------

    update_session_meta = _writes(session_model.update_session_meta)
    update_session_model = _writes(session_model.update_session_model)
    update_session_billing_route = _writes(session_model.update_session_billing_route)
    update_session_cwd = _writes(workspace.update_session_cwd, _ACTIVITY)
    backfill_repo_roots = _writes(workspace.backfill_repo_roots)
    distinct_session_cwds = _reads(workspace.distinct_session_cwds)
    request_handoff = _writes(handoff.request_handoff)
    claim_handoff = _writes(handoff.claim_handoff)
    complete_handoff = _writes(handoff.complete_handoff)
    fail_handoff = _writes(handoff.fail_handoff)
    get_handoff_state = _reads(handoff.get_handoff_state, fallback=lenient(lambda: None))
    list_pending_handoffs = _reads(handoff.list_pending_handoffs, fallback=lenient(list))

    clear_messages = _writes(sessions.clear_messages, _TRANSCRIPT_EDIT)

    # --- deleting, pruning, archiving (see hermes_state_deletion) ------------------------------

    delete_session = _writes(deletion.DELETE_SESSION)
    delete_sessions = _writes(deletion.DELETE_SESSIONS)
    delete_session_if_empty = _writes(deletion.DELETE_SESSION_IF_EMPTY)
    list_delete_candidates = _reads(deletion.list_delete_candidates)
    list_prune_candidates = _reads(deletion.list_prune_candidates)
    prune_sessions = _writes(deletion.PRUNE_SESSIONS)
    archive_sessions = _writes(deletion.archive_sessions)
    count_empty_sessions = _reads(deletion.count_empty_sessions)
    delete_empty_sessions = _writes(deletion.DELETE_EMPTY_SESSIONS)
    prune_empty_ghost_sessions = _writes(deletion.PRUNE_EMPTY_GHOST_SESSIONS)
    finalize_orphaned_compression_sessions = _writes(
        deletion.finalize_orphaned_compression_sessions
    )

    vacuum = _handle(writes.vacuum)

    maybe_auto_prune_and_vacuum = _handle(
        deletion.maybe_auto_prune_and_vacuum, refused=deletion.refused_auto_prune)

    # --- messages: the handle remembers what it read and wrote (see hermes_state_seen) ---------

    append_message = _writes(seen.APPEND_MESSAGE, _TRANSCRIPT)
    get_messages = _reads(seen.GET_MESSAGES)
    get_messages_as_conversation = _reads(seen.GET_CONVERSATION)
    get_resume_conversations = _reads(seen.GET_RESUME_CONVERSATIONS)
    get_ancestor_display_prefix = _reads(messages.get_ancestor_display_prefix)
    set_latest_user_api_content = _writes(messages.set_latest_user_api_content, _TRANSCRIPT_EDIT)
    replace_messages = _writes(seen.REPLACE_MESSAGES, _TRANSCRIPT)

    has_archived_messages = _reads(messages.has_archived_messages)
    has_platform_message_id = _reads(messages.has_platform_message_id)

    # --- rewind and context windows -----------------------------------------------------------

    list_recent_user_messages = _reads(rewind.list_recent_user_messages)
    rewind_to_message = _writes(seen.REWIND_TO_MESSAGE, _TRANSCRIPT_EDIT)
    restore_rewound = _writes(seen.RESTORE_REWOUND, _TRANSCRIPT_EDIT)
    get_messages_around = _reads(context_window.get_messages_around)
    get_anchored_view = _reads(context_window.get_anchored_view)

    # --- titles -------------------------------------------------------------------------------

    sanitize_title = staticmethod(arguments.operation(sessions.sanitize_title))
    set_session_title = _writes(sessions.set_session_title)
    set_auto_title_if_empty = _writes(sessions.set_auto_title_if_empty)
    get_session_title = _reads(sessions.get_session_title)
    get_session_by_title = _reads(sessions.get_session_by_title)
    resolve_session_by_title = _reads(sessions.resolve_session_by_title)
    get_next_title_in_lineage = _reads(sessions.get_next_title_in_lineage)

    # --- lineage ------------------------------------------------------------------------------

    get_session_ancestors = _reads(lineage.session_ancestors)
    get_session_descendants = _reads(lineage.session_descendants)
    get_compression_tip = _reads(lineage.get_compression_tip)
    resolve_resume_session_id = _reads(lineage.resolve_resume_session_id)
    get_compression_lineage = _reads(lineage.compression_chain)

    # --- search -------------------------------------------------------------------------------

    _sanitize_fts5_query = staticmethod(search.sanitize_fts5_query)
    _contains_cjk = staticmethod(fts.contains_cjk)

    search_messages = _reads(search.search_messages, fallback=methods.WITHOUT_DAMAGED_INDEX)

    # --- compression --------------------------------------------------------------------------

    archive_and_compact = _writes(seen.ARCHIVE_AND_COMPACT, _COMPACTION)
    publish_compression_child = _writes(compression.publish_compression_child, _CHILD_TRANSCRIPT)
    try_acquire_compression_lock = _writes(compression.try_acquire_compression_lock)
    refresh_compression_lock = _writes(compression.refresh_compression_lock)
    release_compression_lock = _writes(
        compression.release_compression_lock, fallback=lenient(lambda: None)
    )
    get_compression_lock_holder = _reads(compression.get_compression_lock_holder)
    get_compression_fallback_streak = _reads(
        compression.get_compression_fallback_streak, fallback=lenient(int)
    )
    set_compression_fallback_streak = _writes(compression.set_compression_fallback_streak)
    record_compression_failure_cooldown = _writes(
        compression.record_compression_failure_cooldown, fallback=lenient(lambda: None)
    )
    get_compression_failure_cooldown = _reads(
        compression.get_compression_failure_cooldown
    )
    clear_compression_failure_cooldown = _writes(
        compression.clear_compression_failure_cooldown, fallback=lenient(lambda: None)
    )

    # --- gateway: runtime epoch, admissions, workers ------------------------------------------

    begin_runtime_epoch = _writes(gateway.begin_runtime_epoch)
    get_runtime_epoch = _reads(gateway.get_runtime_epoch)
    admit_input = _writes(gateway.admit_input)
    claim_next_input = _writes(gateway.claim_next_input)
    settle_input = _writes(gateway.settle_input)
    resolve_unknown_input = _writes(gateway.resolve_unknown_input)
    get_admission = _reads(gateway.get_admission)
    list_admissions = _reads(gateway.list_admissions)
    receipt_digest = staticmethod(arguments.operation(gateway.receipt_digest))
    register_worker_execution = _writes(gateway.register_worker_execution)
    record_worker_receipt = _writes(gateway.record_worker_receipt)
    finish_worker_execution = _writes(gateway.finish_worker_execution)
    resolve_unknown_execution = _writes(gateway.resolve_unknown_execution)
    list_worker_executions = _reads(gateway.list_worker_executions)
    list_worker_receipts = _reads(gateway.list_worker_receipts)

    # --- gateway: outbox, routing, delegations ------------------------------------------------

    record_delivery_obligation = _writes(gateway.record_delivery_obligation)
    record_delivery_failure = _writes(gateway.record_delivery_failure)
    settle_delivery_obligation = _writes(gateway.settle_delivery_obligation)
    get_delivery_obligation = _reads(gateway.get_delivery_obligation)
    list_owed_deliveries = _reads(gateway.list_owed_deliveries)
    save_gateway_routing_entry = _writes(gateway.save_gateway_routing_entry)
    load_gateway_routing_entries = _reads(gateway.load_gateway_routing_entries)
    replace_gateway_routing_entries = _writes(gateway.replace_gateway_routing_entries)
    delete_gateway_routing_entries = _writes(gateway.delete_gateway_routing_entries)
    record_async_delegation = _writes(gateway.record_async_delegation)
    update_async_delegation = _writes(gateway.update_async_delegation)
    get_async_delegation = _reads(gateway.get_async_delegation)
    list_async_delegations = _reads(gateway.list_async_delegations)

    # --- gateway: sessions by peer, Telegram DM topics -----------------------------------------

    list_gateway_sessions = _reads(peers.list_gateway_sessions)
    find_session_by_origin = _reads(peers.find_session_by_origin)
    find_latest_gateway_session_for_peer = _reads(peers.find_latest_gateway_session_for_peer)
    record_gateway_session_peer = _writes(peers.record_gateway_session_peer)
    set_expiry_finalized = _writes(peers.set_expiry_finalized)
    apply_telegram_topic_migration = _writes(telegram.apply_telegram_topic_migration)
    enable_telegram_topic_mode = _writes(telegram.enable_telegram_topic_mode)
    disable_telegram_topic_mode = _writes(telegram.disable_telegram_topic_mode)
    is_telegram_topic_mode_enabled = _reads(telegram.is_telegram_topic_mode_enabled)
    bind_telegram_topic = _writes(telegram.bind_telegram_topic)
    get_telegram_topic_binding = _reads(telegram.get_telegram_topic_binding)
    get_telegram_topic_binding_by_session = _reads(telegram.get_telegram_topic_binding_by_session)
    list_telegram_topic_bindings_for_chat = _reads(telegram.list_telegram_topic_bindings_for_chat)
    is_telegram_session_linked_to_topic = _reads(telegram.is_telegram_session_linked_to_topic)
    delete_telegram_topic_binding = _writes(telegram.delete_telegram_topic_binding)
    list_unlinked_telegram_sessions_for_user = _reads(
        telegram.list_unlinked_telegram_sessions_for_user
    )

    # --- gateway: exception-path ownership ----------------------------------------------------

    ingress_owner_marker = staticmethod(arguments.operation(gateway.ingress_owner_marker))
    find_owned_input = _reads(gateway.find_owned_input)
    persist_exception_input = _writes(gateway.persist_exception_input, _TRANSCRIPT)


@arguments.operation
def collect_profile_stats(root: str | Path | None = None) -> dict[str, Any]:
    """:meth:`SessionDB.stats` of every profile under ``root`` (see
    hermes_state_profiles.collect_profile_stats); each store is opened read-only."""
    return profiles.collect_profile_stats(root, functools.partial(SessionDB, read_only=True))


#: This process's shared stores, one SessionDB per profile home, held by explicit owners
#: (see :class:`ProfileStoreRegistry`).
profile_stores: ProfileStoreRegistry[SessionDB] = ProfileStoreRegistry(SessionDB)
