"""Sessions: creation, ending, accounting, listing, metadata, export, deletion and pruning."""

from __future__ import annotations

import inspect
import random
import sqlite3
import time
from pathlib import Path

import pytest

from hermes_state import LedgerBusyError, SessionDB, SessionNotFoundError

DAY = 86400.0


def raw(db: SessionDB) -> sqlite3.Connection:
    return sqlite3.connect(db.path, isolation_level=None)


def ids(rows: list[dict]) -> list[str]:
    return [r["id"] for r in rows]


# --- the public signatures ---


def _parameters(method) -> list[tuple[str, object]]:
    params = list(inspect.signature(method).parameters.values())[1:]
    return [(p.name, p.default) for p in params]


def test_create_session_keeps_the_documented_signature() -> None:
    empty = inspect.Parameter.empty
    assert _parameters(SessionDB.create_session) == [
        ("session_id", empty), ("source", empty), ("model", None), ("model_config", None),
        ("system_prompt", None), ("user_id", None), ("parent_session_id", None),
        ("columns", empty),
    ]
    assert _parameters(SessionDB.ensure_session) == [
        ("session_id", empty), ("source", "unknown"), ("model", None)
    ]


def test_update_token_counts_keeps_the_documented_signature() -> None:
    documented = [
        ("session_id", inspect.Parameter.empty), ("input_tokens", 0), ("output_tokens", 0),
        ("model", None), ("cache_read_tokens", 0), ("cache_write_tokens", 0),
        ("reasoning_tokens", 0), ("estimated_cost_usd", None), ("actual_cost_usd", None),
        ("cost_status", None), ("cost_source", None), ("pricing_version", None),
        ("billing_provider", None), ("billing_base_url", None), ("billing_mode", None),
        ("api_call_count", 0), ("absolute", False),
    ]
    assert _parameters(SessionDB.update_token_counts)[: len(documented)] == documented


def test_listing_and_pruning_keep_their_documented_defaults() -> None:
    assert _parameters(SessionDB.list_sessions_rich)[:4] == [
        ("source", None), ("exclude_sources", None), ("limit", 20), ("offset", 0)
    ]
    assert _parameters(SessionDB.search_sessions)[:3] == [
        ("source", None), ("limit", 20), ("offset", 0)
    ]
    assert _parameters(SessionDB.prune_sessions) == [
        ("older_than_days", 90), ("source", None), ("only_ids", None)
    ]
    assert _parameters(SessionDB.list_prune_candidates) == [
        ("older_than_days", None), ("source", None)
    ]
    assert _parameters(SessionDB.maybe_auto_prune_and_vacuum) == [
        ("retention_days", 90), ("min_interval_hours", 24), ("vacuum", True)
    ]


def test_positional_token_counts_follow_the_documented_order(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", 10, 20, "model-x", 3, 4, 5)
    row = db.get_session("s")
    assert [row[k] for k in ("input_tokens", "output_tokens", "model", "cache_read_tokens",
                             "cache_write_tokens", "reasoning_tokens")] == [10, 20, "model-x", 3,
                                                                            4, 5]


# --- creating --------------------------------------------------------------------------------


def test_create_session_returns_the_id_and_stores_every_field(db: SessionDB) -> None:
    before = time.time()
    assert db.create_session(
        "s1", "telegram", model="m", model_config={"temperature": 0.2}, system_prompt="sp",
        user_id="12345", cwd="/work", chat_id="c-1",
    ) == "s1"
    row = db.get_session("s1")
    assert (row["source"], row["model"], row["system_prompt"], row["user_id"]) == (
        "telegram", "m", "sp", "12345"
    )
    assert (row["cwd"], row["chat_id"]) == ("/work", "c-1")
    assert '"temperature"' in row["model_config"]
    assert before <= row["started_at"] <= time.time()
    assert (row["ended_at"], row["end_reason"], row["message_count"]) == (None, None, 0)


def test_create_session_twice_does_not_overwrite(db: SessionDB) -> None:
    db.create_session("s1", "web", model="first", user_id="basic:alice", started_at=100.0)
    assert db.create_session("s1", "cli", model="second", user_id="basic:mallory") == "s1"
    row = db.get_session("s1")
    assert (row["source"], row["model"], row["user_id"], row["started_at"]) == (
        "web", "first", "basic:alice", 100.0
    )
    assert db.session_count() == 1


def test_user_id_stays_null_when_not_given(db: SessionDB) -> None:
    db.create_session("cron-1", "cron")
    db.append_message("cron-1", "user", "scheduled")
    db.update_token_counts("cron-1", input_tokens=5, model="m")
    assert db.get_session("cron-1")["user_id"] is None


def test_create_session_rejects_bad_input(db: SessionDB) -> None:
    with pytest.raises(ValueError):
        db.create_session("", "cli")
    with pytest.raises(ValueError):
        db.create_session("s", "")
    with pytest.raises(TypeError):
        db.create_session("s", "cli", no_such_column=1)
    with pytest.raises(SessionNotFoundError):
        db.create_session("child", "cli", parent_session_id="missing")
    assert db.session_count() == 0


def test_ensure_session_creates_once(db: SessionDB) -> None:
    assert db.ensure_session("s1") == "s1"
    assert db.get_session("s1")["source"] == "unknown"
    db.create_session("s2", "cli", model="keep")
    assert db.ensure_session("s2", source="other", model="other") == "s2"
    assert (db.get_session("s2")["source"], db.get_session("s2")["model"]) == ("cli", "keep")


def test_get_session_of_unknown_id_is_none(db: SessionDB) -> None:
    assert db.get_session("nope") is None


# --- resolving ids ---------------------------------------------------------------------------


def test_resolve_session_id_by_unique_prefix(db: SessionDB) -> None:
    for sid in ("abc123", "abc456", "abd", "xyz", "abd-2"):
        db.create_session(sid, "cli")
    assert db.resolve_session_id("abc1") == "abc123"
    assert db.resolve_session_id("x") == "xyz"
    assert db.resolve_session_id("abc") is None  # ambiguous
    assert db.resolve_session_id("abd") == "abd"  # exact beats being a prefix of abd-2
    assert db.resolve_session_id("q") is None
    assert db.resolve_session_id("") is None


@pytest.mark.parametrize(
    ("existing", "prefix", "expected"),
    [
        (["a_b1", "axb2"], "a_", "a_b1"),
        (["axb2"], "a_", None),
        (["50%off", "50xoff"], "50%", "50%off"),
        (["50xoff"], "50%", None),
        (["x\\y1", "xy2"], "x\\", "x\\y1"),
        (["p1", "p2"], "%", None),
        (["ABC1", "abc2"], "abc", "abc2"),
        (["ABC1", "abc2"], "AB", "ABC1"),
        (["ABC1"], "abc", None),
    ],
)
def test_resolve_session_id_compares_exactly(
    db: SessionDB, existing: list[str], prefix: str, expected: str | None
) -> None:
    for sid in existing:
        db.create_session(sid, "cli")
    assert db.resolve_session_id(prefix) == expected


# --- ending ----------------------------------------------------------------------------------


def test_first_end_reason_is_kept(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.end_session("s", "user_exit")
    first = db.get_session("s")
    db.end_session("s", "timeout")
    again = db.get_session("s")
    assert (again["end_reason"], again["ended_at"]) == ("user_exit", first["ended_at"])


def test_reopen_lets_a_later_end_apply(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.end_session("s", "user_exit")
    db.reopen_session("s")
    row = db.get_session("s")
    assert (row["ended_at"], row["end_reason"]) == (None, None)
    db.end_session("s", "compression")
    assert db.get_session("s")["end_reason"] == "compression"


def test_ending_or_reopening_an_unknown_session_is_typed(db: SessionDB) -> None:
    with pytest.raises(SessionNotFoundError):
        db.end_session("missing", "x")
    with pytest.raises(SessionNotFoundError):
        db.reopen_session("missing")


def test_update_system_prompt(db: SessionDB) -> None:
    db.create_session("s", "cli", system_prompt="old")
    db.update_system_prompt("s", "new\nprompt")
    assert db.get_session("s")["system_prompt"] == "new\nprompt"
    with pytest.raises(SessionNotFoundError):
        db.update_system_prompt("missing", "x")


# --- accounting ------------------------------------------------------------------------------


def test_token_counts_increment(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", input_tokens=10, output_tokens=5, cache_read_tokens=3,
                           cache_write_tokens=2, reasoning_tokens=1, api_call_count=1)
    db.update_token_counts("s", input_tokens=7, output_tokens=1, api_call_count=1)
    row = db.get_session("s")
    assert [row[k] for k in ("input_tokens", "output_tokens", "cache_read_tokens",
                             "cache_write_tokens", "reasoning_tokens", "api_call_count")] == [
        17, 6, 3, 2, 1, 2
    ]


def test_token_counts_absolute_sets(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", input_tokens=100, output_tokens=50, estimated_cost_usd=1.0)
    db.update_token_counts("s", input_tokens=30, output_tokens=20, api_call_count=4,
                           estimated_cost_usd=0.25, absolute=True)
    row = db.get_session("s")
    assert (row["input_tokens"], row["output_tokens"], row["api_call_count"]) == (30, 20, 4)
    assert row["estimated_cost_usd"] == pytest.approx(0.25)


def test_costs_are_summed_and_none_leaves_them(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", input_tokens=1)
    assert db.get_session("s")["estimated_cost_usd"] is None
    db.update_token_counts("s", estimated_cost_usd=0.1, actual_cost_usd=0.05)
    db.update_token_counts("s", estimated_cost_usd=0.2)
    db.update_token_counts("s", actual_cost_usd=0.15, cost_status="final", cost_source="api",
                           pricing_version="v3")
    row = db.get_session("s")
    assert row["estimated_cost_usd"] == pytest.approx(0.3)
    assert row["actual_cost_usd"] == pytest.approx(0.2)
    assert (row["cost_status"], row["cost_source"], row["pricing_version"]) == (
        "final", "api", "v3"
    )


def test_model_is_filled_only_while_null(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.update_token_counts("s", input_tokens=1)
    assert db.get_session("s")["model"] is None
    db.update_token_counts("s", input_tokens=1, model="first-model")
    db.update_token_counts("s", input_tokens=1, model="second-model")
    assert db.get_session("s")["model"] == "first-model"
    db.create_session("t", "cli", model="configured")
    db.update_token_counts("t", input_tokens=1, model="other")
    assert db.get_session("t")["model"] == "configured"


def test_usage_is_attributed_per_model_route_and_task(db: SessionDB) -> None:
    db.create_session("s", "cli", model="main")
    db.update_token_counts("s", input_tokens=10, model="main", billing_provider="openrouter",
                           estimated_cost_usd=0.5, api_call_count=1)
    db.update_token_counts("s", input_tokens=5, model="main", billing_provider="openrouter",
                           estimated_cost_usd=0.25, api_call_count=1)
    db.update_token_counts("s", input_tokens=3, model="aux", billing_provider="openrouter",
                           task="title", api_call_count=1)
    db.update_token_counts("s", input_tokens=2, model="main", billing_provider="direct",
                           billing_base_url="https://api.example", billing_mode="byok")
    usage = {
        (u["model"], u["billing_provider"], u["billing_base_url"], u["task"]): u
        for u in db.get_model_usage("s")
    }
    assert set(usage) == {
        ("main", "openrouter", "", ""),
        ("aux", "openrouter", "", "title"),
        ("main", "direct", "https://api.example", ""),
    }
    main = usage[("main", "openrouter", "", "")]
    assert (main["input_tokens"], main["api_call_count"]) == (15, 2)
    assert main["estimated_cost_usd"] == pytest.approx(0.75)
    assert usage[("aux", "openrouter", "", "title")]["input_tokens"] == 3
    assert usage[("aux", "openrouter", "", "title")]["estimated_cost_usd"] is None
    # The session totals are the sum of the attributed rows.
    assert db.get_session("s")["input_tokens"] == sum(u["input_tokens"] for u in usage.values())


def test_usage_falls_back_to_the_session_model(db: SessionDB) -> None:
    db.create_session("s", "cli", model="configured")
    db.update_token_counts("s", input_tokens=4)
    assert [(u["model"], u["input_tokens"]) for u in db.get_model_usage("s")] == [
        ("configured", 4)
    ]


def test_token_counts_reject_bad_input_without_writing(db: SessionDB) -> None:
    db.create_session("s", "cli")
    with pytest.raises(SessionNotFoundError):
        db.update_token_counts("missing", input_tokens=1)
    with pytest.raises(TypeError):
        db.update_token_counts("s", input_tokens="10")
    with pytest.raises(TypeError):
        db.update_token_counts("s", estimated_cost_usd="cheap")
    assert db.get_session("s")["input_tokens"] == 0
    assert db.get_model_usage("s") == []


# --- listing ---------------------------------------------------------------------------------


def test_list_is_newest_first_with_pagination(db: SessionDB) -> None:
    for i in range(5):
        db.create_session(f"s{i}", "cli", started_at=1000.0 + i)
    assert ids(db.list_sessions_rich()) == ["s4", "s3", "s2", "s1", "s0"]
    assert ids(db.list_sessions_rich(limit=2, offset=1)) == ["s3", "s2"]
    assert ids(db.search_sessions(limit=2)) == ["s4", "s3"]


def test_preview_is_the_first_user_message_collapsed_and_cut(db: SessionDB) -> None:
    db.create_session("long", "cli", started_at=1.0)
    db.append_message("long", "system", "system text comes first", timestamp=10.0)
    db.append_message("long", "user", "  first\n\n\tuser   message " + "x" * 80, timestamp=11.0)
    db.append_message("long", "user", "second user message", timestamp=12.0)
    db.create_session("exact", "cli", started_at=2.0)
    db.append_message("exact", "user", "y" * 60)
    db.create_session("none", "cli", started_at=3.0)
    db.append_message("none", "assistant", "only the assistant spoke")
    previews = {r["id"]: r["preview"] for r in db.list_sessions_rich()}
    expected_long = ("first user message " + "x" * 80)[:60] + "..."
    assert previews == {"long": expected_long, "exact": "y" * 60, "none": ""}


def test_last_active_is_the_latest_message_else_started_at(db: SessionDB) -> None:
    db.create_session("quiet", "cli", started_at=500.0)
    db.create_session("busy", "cli", started_at=100.0)
    db.append_message("busy", "user", "a", timestamp=150.0)
    db.append_message("busy", "assistant", "b", timestamp=900.0)
    rows = {r["id"]: r for r in db.list_sessions_rich()}
    assert rows["quiet"]["last_active"] == 500.0
    assert rows["busy"]["last_active"] == 900.0


def test_compression_and_delegate_children_fold_into_the_root_showing_the_tip(
    db: SessionDB,
) -> None:
    db.create_session("root", "cli", started_at=100.0, title="Conversation")
    db.append_message("root", "user", "original question", timestamp=101.0)
    db.end_session("root", "compression")
    db.create_session("gen2", "cli", parent_session_id="root", started_at=200.0)
    db.append_message("gen2", "user", "summary of the past", timestamp=201.0)
    db.end_session("gen2", "compression")
    db.create_session("gen3", "cli", parent_session_id="gen2", started_at=300.0, model="tip-m")
    db.append_message("gen3", "assistant", "latest", timestamp=350.0)
    db.create_session("delegate", "subagent", parent_session_id="gen2", started_at=250.0)
    db.append_message("delegate", "user", "subtask", timestamp=260.0)
    db.create_session("other", "cli", started_at=150.0)

    rows = db.list_sessions_rich()
    assert ids(rows) == ["other", "root"]
    root = rows[1]
    assert root["tip_session_id"] == "gen3"
    assert root["tip_model"] == "tip-m"
    assert root["preview"] == "original question"
    assert root["last_active"] == 350.0
    assert rows[0]["tip_session_id"] == "other"
    assert db.session_count() == 5


def test_source_filter_and_ten_thousand_excluded_sources(db: SessionDB) -> None:
    db.create_session("a", "cli", started_at=1.0)
    db.create_session("b", "telegram", started_at=2.0)
    db.create_session("c", "discord", started_at=3.0)
    excluded = [f"source-{i}" for i in range(10_000)] + ["telegram", "discord"]
    assert ids(db.list_sessions_rich(exclude_sources=excluded)) == ["a"]
    assert ids(db.list_sessions_rich(exclude_sources=excluded[:10_000])) == ["c", "b", "a"]
    assert ids(db.list_sessions_rich(source="telegram")) == ["b"]
    assert ids(db.search_sessions(source="discord")) == ["c"]
    assert db.session_count(source="cli") == 1
    assert ids(db.list_sessions_rich(exclude_sources="telegram")) == ["c", "a"]
    assert ids(db.list_sessions_rich(exclude_sources=(s for s in ["cli"]))) == ["c", "b"]


def test_session_and_message_counts(db: SessionDB) -> None:
    assert (db.session_count(), db.message_count()) == (0, 0)
    db.create_session("a", "cli")
    db.create_session("b", "web")
    db.append_message("a", "user", "1")
    db.append_message("a", "assistant", "2")
    db.append_message("b", "user", "3")
    assert db.session_count() == 2 and db.session_count("web") == 1
    assert db.message_count() == 3
    assert (db.message_count("a"), db.message_count("b"), db.message_count("zzz")) == (2, 1, 0)


# --- metadata --------------------------------------------------------------------------------


def test_meta_round_trip(db: SessionDB) -> None:
    assert db.get_meta("missing") is None
    db.set_meta("k", "v")
    db.set_meta("k", "v2")
    db.set_meta("n", 42)
    db.set_meta("unicode", "日本語 ✓")
    assert (db.get_meta("k"), db.get_meta("n"), db.get_meta("unicode")) == ("v2", "42", "日本語 ✓")


# --- export ----------------------------------------------------------------------------------


def test_export_session_has_the_row_messages_and_usage(db: SessionDB) -> None:
    db.create_session("s", "cli", model="m", title="T")
    db.append_message("s", "user", "hi", timestamp=1.0)
    db.append_message("s", "assistant", "yo", tool_calls=[{"id": "c", "type": "function"}])
    db.update_token_counts("s", input_tokens=3, model="m")
    exported = db.export_session("s")
    assert exported["id"] == "s" and exported["title"] == "T"
    assert [m["content"] for m in exported["messages"]] == ["hi", "yo"]
    assert exported["messages"][1]["tool_calls"] == [{"id": "c", "type": "function"}]
    assert [u["input_tokens"] for u in exported["model_usage"]] == [3]
    assert db.export_session("missing") is None


def test_export_keeps_archived_generations(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.replace_messages("s", [
        {"role": "user", "content": "archived turn", "active": False},
        {"role": "user", "content": "live turn"},
    ])
    exported = db.export_session("s")["messages"]
    assert [(m["content"], m["active"]) for m in exported] == [
        ("archived turn", False), ("live turn", True)
    ]
    assert [m["content"] for m in db.get_messages("s")] == ["live turn"]


def test_export_all_is_oldest_first_and_filters_by_source(db: SessionDB) -> None:
    db.create_session("new", "cli", started_at=2.0)
    db.create_session("old", "cli", started_at=1.0)
    db.create_session("tg", "telegram", started_at=3.0)
    assert ids(db.export_all()) == ["old", "new", "tg"]
    assert ids(db.export_all(source="cli")) == ["old", "new"]


# --- clearing and deleting -------------------------------------------------------------------


def test_clear_messages_keeps_the_row_and_zeroes_counters(db: SessionDB) -> None:
    db.create_session("s", "cli", title="keep me")
    db.create_session("other", "cli")
    db.append_message("s", "user", "a")
    db.append_message("s", "assistant", None, tool_calls=[{"id": "1"}, {"id": "2"}])
    db.append_message("other", "user", "untouched")
    assert db.clear_messages("s") is None
    row = db.get_session("s")
    assert (row["message_count"], row["tool_call_count"], row["title"]) == (0, 0, "keep me")
    assert db.get_messages("s") == []
    assert db.message_count("other") == 1
    with pytest.raises(SessionNotFoundError):
        db.clear_messages("missing")


def test_delete_session_orphans_children(db: SessionDB) -> None:
    db.create_session("parent", "cli")
    db.create_session("child", "cli", parent_session_id="parent")
    db.create_session("grandchild", "cli", parent_session_id="child")
    db.append_message("parent", "user", "bye")
    db.append_message("child", "user", "still here")
    db.update_token_counts("parent", input_tokens=1, model="m")
    assert db.delete_session("parent") is True
    assert db.get_session("parent") is None
    assert db.get_messages("parent") == [] and db.get_model_usage("parent") == []
    assert db.get_session("child")["parent_session_id"] is None
    assert db.get_session("grandchild")["parent_session_id"] == "child"
    assert [m["content"] for m in db.get_messages("child")] == ["still here"]
    assert db.delete_session("parent") is False


LIVE_STATUSES = ["queued", "started", "registered", "running", "unknown"]


def _admit(db: SessionDB, session_id: str, status: str) -> None:
    with raw(db) as conn:
        conn.execute(
            "INSERT INTO session_admissions (session_id, payload_json, status, created_at)"
            " VALUES (?, '{}', ?, 0)", (session_id, status),
        )
    conn.close()


def _register_worker(db: SessionDB, session_id: str, status: str) -> None:
    with raw(db) as conn:
        conn.execute(
            "INSERT INTO worker_executions (execution_id, session_id, epoch, kind, status,"
            " registered_at) VALUES (?, ?, 1, 'cron', ?, 0)", (f"w-{status}", session_id, status),
        )
        conn.execute(
            "INSERT INTO worker_receipts (execution_id, session_id, sequence, payload_json,"
            " digest, recorded_at) VALUES (?, ?, 1, '{}', 'd', 0)", (f"w-{status}", session_id),
        )
    conn.close()


@pytest.mark.parametrize("status", LIVE_STATUSES)
@pytest.mark.parametrize("ledger", ["admission", "worker"])
def test_delete_refuses_while_ledgers_hold_live_work(
    db: SessionDB, ledger: str, status: str
) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "in flight")
    (_admit if ledger == "admission" else _register_worker)(db, "s", status)
    with pytest.raises(LedgerBusyError) as info:
        db.delete_session("s")
    assert info.value.session_id == "s"
    assert db.get_session("s") is not None and db.message_count("s") == 1


def test_delete_removes_terminal_ledger_rows_with_the_session(db: SessionDB) -> None:
    db.create_session("s", "cli")
    _admit(db, "s", "completed")
    _register_worker(db, "s", "succeeded")
    assert db.delete_session("s") is True
    with raw(db) as conn:
        for table in ("session_admissions", "worker_executions", "worker_receipts"):
            assert conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone() == (0,), table
    conn.close()


# --- pruning ---------------------------------------------------------------------------------


def _old_session(db: SessionDB, sid: str, days_ago: float, *, source: str = "cli",
                 end: str | None = "user_exit", parent: str | None = None) -> None:
    db.create_session(sid, source, started_at=time.time() - days_ago * DAY,
                      parent_session_id=parent)
    if end is not None:
        db.end_session(sid, end)


def test_prune_removes_only_ended_sessions_idle_past_the_cutoff(db: SessionDB) -> None:
    _old_session(db, "old-ended", 100)
    _old_session(db, "old-live", 100, end=None)
    _old_session(db, "recent-ended", 10)
    _old_session(db, "old-but-active", 100)
    db.append_message("old-but-active", "user", "recent", timestamp=time.time() - 5 * DAY)
    _old_session(db, "old-with-old-messages", 100)
    db.append_message("old-with-old-messages", "user", "old", timestamp=time.time() - 95 * DAY)
    assert db.prune_sessions(older_than_days=90) == 2
    remaining = {s["id"] for s in db.search_sessions(limit=100)}
    assert remaining == {"old-live", "recent-ended", "old-but-active"}
    assert db.get_messages("old-with-old-messages") == []
    assert db.prune_sessions(older_than_days=7) == 1
    assert {s["id"] for s in db.search_sessions(limit=100)} == {"old-live", "old-but-active"}


def test_prune_by_source(db: SessionDB) -> None:
    _old_session(db, "tg", 100, source="telegram")
    _old_session(db, "cli", 100, source="cli")
    assert db.prune_sessions(older_than_days=30, source="telegram") == 1
    assert db.get_session("tg") is None and db.get_session("cli") is not None


def test_prune_keeps_an_ended_parent_whose_compression_child_is_live(db: SessionDB) -> None:
    _old_session(db, "root", 200, end="compression")
    _old_session(db, "middle", 150, end="compression", parent="root")
    _old_session(db, "tip", 120, end=None, parent="middle")
    assert db.prune_sessions(older_than_days=90) == 0
    assert {s["id"] for s in db.search_sessions()} == {"root", "middle", "tip"}
    db.end_session("tip", "user_exit")
    assert db.prune_sessions(older_than_days=90) == 3  # the whole chain, as a unit
    assert db.session_count() == 0


def test_prune_skips_sessions_with_live_ledger_work(db: SessionDB) -> None:
    _old_session(db, "busy", 100)
    _old_session(db, "idle", 100)
    _admit(db, "busy", "queued")
    assert db.prune_sessions(older_than_days=90) == 1
    assert db.get_session("busy") is not None and db.get_session("idle") is None


def test_prune_keeps_a_chain_whole_while_a_member_has_live_work(db: SessionDB) -> None:
    _old_session(db, "a-root", 200, end="compression")
    _old_session(db, "b-tip", 150, parent="a-root")
    _admit(db, "b-tip", "started")
    assert db.prune_sessions(older_than_days=90) == 0
    assert db.get_session("a-root") is not None
    assert db.get_session("b-tip")["parent_session_id"] == "a-root"


def _random_forest(db: SessionDB, seed: int) -> list[str]:
    """Sessions of random ages, ended or not, some continuing an earlier one by compression,
    some with live ledger work; returns their ids."""
    rng = random.Random(seed)
    ids: list[str] = []
    for n in range(40):
        parent = rng.choice(ids) if ids and rng.random() < 0.4 else None
        sid = f"s{n:02d}"
        _old_session(db, sid, rng.choice([5, 60, 95, 200]) + rng.random(),
                     source=rng.choice(["cli", "telegram"]),
                     end=rng.choice([None, "user_exit", "compression", "compression"]),
                     parent=parent)
        if rng.random() < 0.15:
            _admit(db, sid, "queued")
        ids.append(sid)
    return ids


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_prune_candidates_are_exactly_what_the_prune_deletes(
    db: SessionDB, seed: int
) -> None:
    ids = _random_forest(db, seed)
    for days, source in ((90, "telegram"), (90, None), (None, None)):
        listed = db.list_prune_candidates(days, source=source)
        assert all(set(row) == {"id", "source", "title", "model", "started_at", "ended_at",
                                "message_count", "archived"} for row in listed)
        assert [r["started_at"] for r in listed] == sorted(r["started_at"] for r in listed)
        before = {sid for sid in ids if db.get_session(sid) is not None}
        expected = {r["id"] for r in listed}
        assert db.prune_sessions(days, source=source) == len(expected)
        after = {sid for sid in ids if db.get_session(sid) is not None}
        assert before - after == expected
    assert db.list_prune_candidates() == []  # every ended session without live work is gone


def test_a_prune_bounded_to_listed_ids_deletes_nothing_else(db: SessionDB) -> None:
    _old_session(db, "listed", 100)
    _old_session(db, "listed-then-active", 100)
    _old_session(db, "not-listed", 100)
    _old_session(db, "chain-root", 200, end="compression")
    _old_session(db, "chain-tip", 150, parent="chain-root")
    shown = ["listed", "listed-then-active", "chain-root", "unknown-id"]
    db.append_message("listed-then-active", "user", "back again")
    assert db.prune_sessions(90, only_ids=shown) == 1  # the chain goes only as a whole
    assert {s["id"] for s in db.search_sessions(limit=10)} == {
        "listed-then-active", "not-listed", "chain-root", "chain-tip"}
    assert db.prune_sessions(90, only_ids=[]) == 0


def test_auto_prune_remembers_its_last_run(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        _old_session(db, "stale", 100)
        first = db.maybe_auto_prune_and_vacuum(retention_days=90, min_interval_hours=24)
        assert first is not None and first["pruned"] == 1
        _old_session(db, "stale-2", 100)
        assert db.maybe_auto_prune_and_vacuum(retention_days=90, min_interval_hours=24) is None
    with SessionDB(db_path) as db:
        assert db.maybe_auto_prune_and_vacuum(retention_days=90, min_interval_hours=24) is None
        assert db.get_session("stale-2") is not None
        again = db.maybe_auto_prune_and_vacuum(retention_days=90, min_interval_hours=0)
        assert again is not None and again["pruned"] == 1
        assert db.get_session("stale-2") is None


def test_vacuum_keeps_the_data(db: SessionDB) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "x" * 10_000)
    db.vacuum()
    assert db.get_messages("s")[0]["content"] == "x" * 10_000
