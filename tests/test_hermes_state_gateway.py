"""Runtime epoch, admissions, worker ledgers, gateway tables and exception-path ownership."""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_state import SessionDB
from hermes_state_errors import (
    LedgerBusyError,
    LedgerConflictError,
    OwnerLookupError,
    ReceiptRejectedError,
    SessionNotFoundError,
    StaleEpochError,
    StateDbCorruptError,
)
from hermes_state_gateway import canonical_json, receipt_digest, with_owner_marker


def ledger_rows(db_path: Path, table: str, session_id: str) -> int:
    with sqlite3.connect(db_path) as raw:
        sql = f"SELECT COUNT(*) FROM {table} WHERE session_id = ?"
        return int(raw.execute(sql, (session_id,)).fetchone()[0])


# ---------------------------------------------------------------------------------------------
# Runtime epoch and admissions
# ---------------------------------------------------------------------------------------------


def test_each_new_owner_gets_the_next_epoch(db: SessionDB) -> None:
    assert db.get_runtime_epoch() is None
    assert db.begin_runtime_epoch("gateway-a") == 1
    assert db.begin_runtime_epoch("gateway-b") == 2
    current = db.get_runtime_epoch()
    assert (current["epoch"], current["instance_id"]) == (2, "gateway-b")


def test_admitting_the_same_request_twice_returns_the_first_admission(db: SessionDB) -> None:
    db.create_session("s1", "telegram")
    first = db.admit_input("s1", {"text": "hi"}, request_id="m-1", principal_id="u1")
    again = db.admit_input("s1", {"text": "hi, edited"}, request_id="m-1", principal_id="u1")
    assert (first["duplicate"], again["duplicate"]) == (False, True)
    assert again["id"] == first["id"]
    assert again["payload"] == {"text": "hi"}

    other_principal = db.admit_input("s1", {"text": "hi"}, request_id="m-1", principal_id="u2")
    keyless = [db.admit_input("s1", {"text": "hi"}) for _ in range(2)]
    ids = {first["id"], other_principal["id"], *(a["id"] for a in keyless)}
    assert len(ids) == 4
    assert [a["id"] for a in db.list_admissions("s1")] == sorted(ids)


def test_an_input_without_a_payload_is_admitted_as_null(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    assert db.admit_input("s1", None)["payload"] is None
    obligation = db.record_delivery_obligation("k", platform="p", chat_id=1, payload=None)
    assert obligation["payload"] is None


def test_an_input_for_an_unknown_session_is_refused(db: SessionDB) -> None:
    with pytest.raises(SessionNotFoundError):
        db.admit_input("nope", {"text": "hi"})


def test_admissions_are_claimed_one_at_a_time_in_order(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    db.create_session("s2", "cli")
    epoch = db.begin_runtime_epoch("gw")
    a = db.admit_input("s1", "first")
    b = db.admit_input("s1", "second")
    other = db.admit_input("s2", "elsewhere")

    claimed = db.claim_next_input("s1", epoch=epoch)
    assert (claimed["id"], claimed["status"], claimed["epoch"]) == (a["id"], "started", epoch)
    assert db.claim_next_input("s1", epoch=epoch) is None, "the turn in progress blocks"
    assert db.claim_next_input("s2", epoch=epoch)["id"] == other["id"], "per session"

    settled = db.settle_input(a["id"], epoch=epoch, outcome="completed", result={"reply": 1})
    assert (settled["status"], settled["outcome"], settled["result"]) == (
        "settled", "completed", {"reply": 1}
    )
    assert db.claim_next_input("s1", epoch=epoch)["id"] == b["id"]
    db.settle_input(b["id"], epoch=epoch, outcome="failed")
    assert db.claim_next_input("s1", epoch=epoch) is None
    assert db.list_admissions("s1") == []
    assert [a["status"] for a in db.list_admissions("s1", pending_only=False)] == [
        "settled", "settled",
    ]


def test_settling_is_for_the_owner_that_claimed(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    epoch = db.begin_runtime_epoch("gw")
    a = db.admit_input("s1", "first")
    b = db.admit_input("s1", "second")
    with pytest.raises(LedgerConflictError):
        db.settle_input(a["id"], epoch=epoch, outcome="completed")  # never claimed
    cancelled = db.settle_input(b["id"], epoch=epoch, outcome="cancelled")
    assert cancelled["status"] == "settled"
    db.claim_next_input("s1", epoch=epoch)
    db.settle_input(a["id"], epoch=epoch, outcome="completed")
    with pytest.raises(LedgerConflictError):
        db.settle_input(a["id"], epoch=epoch, outcome="completed")
    with pytest.raises(LedgerConflictError):
        db.resolve_unknown_input(a["id"], epoch=epoch, outcome="failed")
    with pytest.raises(ValueError):
        db.settle_input(a["id"], epoch=epoch, outcome="finished-ish")
    with pytest.raises(LedgerConflictError):
        db.settle_input(10_000, epoch=epoch, outcome="cancelled")


def test_a_stale_epoch_is_refused_and_writes_nothing(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    old = db.begin_runtime_epoch("gw-old")
    a = db.admit_input("s1", "first")
    db.claim_next_input("s1", epoch=old)
    new = db.begin_runtime_epoch("gw-new")
    db.admit_input("s1", "second")

    for call in (
        lambda: db.claim_next_input("s1", epoch=old),
        lambda: db.settle_input(a["id"], epoch=old, outcome="completed"),
        lambda: db.resolve_unknown_input(a["id"], epoch=old, outcome="failed"),
        lambda: db.register_worker_execution("w1", "s1", epoch=old, kind="cron"),
        lambda: db.claim_next_input("s1", epoch=new + 1),
    ):
        with pytest.raises(StaleEpochError) as caught:
            call()
        assert caught.value.current_epoch == new
    assert [x["status"] for x in db.list_admissions("s1")] == ["unknown", "queued"]
    assert db.list_worker_executions("s1") == []


OWNER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from hermes_state import SessionDB

    db = SessionDB(sys.argv[1])
    epoch = db.begin_runtime_epoch("owner-that-crashes")
    claimed = db.claim_next_input("s1", epoch=epoch)
    db.register_worker_execution("w1", "s1", epoch=epoch, kind="child")
    print(epoch, claimed["id"], flush=True)
    time.sleep(60)  # mid-turn: the parent kills this process
    """
)


def test_an_owner_crash_leaves_its_turn_unknown_and_the_queue_waits(
    db: SessionDB, db_path: Path
) -> None:
    db.create_session("s1", "telegram")
    first = db.admit_input("s1", {"text": "one"}, request_id="1")
    second = db.admit_input("s1", {"text": "two"}, request_id="2")
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, str(db_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        old_epoch, claimed_id = map(int, owner.stdout.readline().split())
        assert claimed_id == first["id"]
        assert db.get_admission(first["id"])["status"] == "started"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        if owner.stdout is not None:
            owner.stdout.close()
    assert owner.returncode == -signal.SIGKILL

    epoch = db.begin_runtime_epoch("owner-after-restart")
    assert epoch == old_epoch + 1
    assert [(a["id"], a["status"]) for a in db.list_admissions("s1")] == [
        (first["id"], "unknown"), (second["id"], "queued"),
    ]
    assert db.list_worker_executions("s1")[0]["status"] == "unknown"
    assert db.claim_next_input("s1", epoch=epoch) is None, "never replayed, never skipped"
    again = db.admit_input("s1", {"text": "one"}, request_id="1")
    assert (again["id"], again["status"], again["duplicate"]) == (first["id"], "unknown", True)

    resolved = db.resolve_unknown_input(first["id"], epoch=epoch, outcome="failed")
    assert (resolved["status"], resolved["outcome"], resolved["epoch"]) == (
        "resolved", "failed", old_epoch
    )
    assert db.claim_next_input("s1", epoch=epoch)["id"] == second["id"]


# ---------------------------------------------------------------------------------------------
# Worker executions and receipts
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def execution(db: SessionDB) -> tuple[SessionDB, int]:
    db.create_session("s1", "cron")
    epoch = db.begin_runtime_epoch("gw")
    registered = db.register_worker_execution("w1", "s1", epoch=epoch, kind="cron")
    assert (registered["status"], registered["last_sequence"]) == ("registered", 0)
    return db, epoch


def receipt(db: SessionDB, sequence: int, payload: Any, digest: str | None = None) -> Any:
    return db.record_worker_receipt(
        "w1", sequence, payload, digest=receipt_digest(payload) if digest is None else digest
    )


def test_the_digest_is_sha256_of_canonical_json() -> None:
    payload = {"b": [1, 2.5, None], "a": "é", "c": {"z": True, "y": "x"}}
    text = '{"a":"é","b":[1,2.5,null],"c":{"y":"x","z":true}}'
    assert canonical_json(payload) == text
    assert receipt_digest(payload) == hashlib.sha256(text.encode("utf-8")).hexdigest()
    with pytest.raises(ValueError):
        receipt_digest({"x": float("nan")})


@settings(max_examples=50)
@given(st.dictionaries(st.text(), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=10,
)))
def test_the_digest_ignores_key_order(payload: dict[str, Any]) -> None:
    reordered = dict(reversed(list(payload.items())))
    assert receipt_digest(reordered) == receipt_digest(payload)
    assert json.loads(canonical_json(payload)) == payload


def test_receipts_are_recorded_in_sequence(execution: tuple[SessionDB, int]) -> None:
    db, _ = execution
    first = receipt(db, 1, {"step": "fetched"})
    second = db.record_worker_receipt(
        "w1", 2, {"step": "done"}, digest=receipt_digest({"step": "done"}).upper()
    )
    assert (first["sequence"], second["sequence"]) == (1, 2)
    assert [r["payload"] for r in db.list_worker_receipts("w1")] == [
        {"step": "fetched"}, {"step": "done"},
    ]
    assert db.list_worker_executions("s1")[0]["status"] == "running"


@pytest.mark.parametrize(
    ("sequence", "digest", "reason"),
    [
        (4, None, "gap"),
        (5, None, "gap"),
        (2, None, "out_of_order"),  # a duplicate of the last one
        (1, None, "out_of_order"),  # a reordering
        (0, None, "out_of_order"),
        (4, "0" * 64, "gap"),  # the sequence is checked first
    ],
)
def test_a_receipt_out_of_sequence_is_refused_and_nothing_written(
    execution: tuple[SessionDB, int], db_path: Path, sequence: int, digest: str | None,
    reason: str,
) -> None:
    db, _ = execution
    receipt(db, 1, {"n": 1})
    receipt(db, 2, {"n": 2})
    with pytest.raises(ReceiptRejectedError) as caught:
        receipt(db, sequence, {"n": sequence}, digest)
    assert caught.value.reason == reason
    assert caught.value.expected_sequence == 3
    assert [r["sequence"] for r in db.list_worker_receipts("w1")] == [1, 2]
    assert db.list_worker_executions("s1")[0]["last_sequence"] == 2


@pytest.mark.parametrize(
    "digest",
    ["0" * 64, receipt_digest({"n": 2}), receipt_digest({"n": 1}) + " ", "", "é"],
)
def test_a_receipt_with_the_wrong_digest_is_refused(
    execution: tuple[SessionDB, int], digest: str
) -> None:
    db, _ = execution
    with pytest.raises(ReceiptRejectedError) as caught:
        receipt(db, 1, {"n": 1}, digest)
    assert caught.value.reason == "digest_mismatch"
    assert db.list_worker_receipts("w1") == []
    assert db.list_worker_executions("s1")[0]["status"] == "registered"


def test_receipts_stop_when_the_execution_is_not_live(execution: tuple[SessionDB, int]) -> None:
    db, epoch = execution
    receipt(db, 1, "partial")
    with pytest.raises(ReceiptRejectedError) as caught:
        db.record_worker_receipt("nope", 1, "x", digest=receipt_digest("x"))
    assert caught.value.reason == "unknown_execution"

    new_epoch = db.begin_runtime_epoch("gw-restarted")
    assert db.list_worker_executions("s1")[0]["status"] == "unknown"
    with pytest.raises(ReceiptRejectedError) as caught:
        receipt(db, 2, "late")
    assert caught.value.reason == "not_live"
    with pytest.raises(LedgerConflictError):
        db.finish_worker_execution("w1", epoch=new_epoch, outcome="completed")
    resolved = db.resolve_unknown_execution("w1", epoch=new_epoch, outcome="failed")
    assert (resolved["status"], resolved["outcome"]) == ("resolved", "failed")
    assert db.list_worker_executions("s1") == []


def test_an_execution_is_finished_once_by_its_owner(execution: tuple[SessionDB, int]) -> None:
    db, epoch = execution
    with pytest.raises(LedgerConflictError):
        db.register_worker_execution("w1", "s1", epoch=epoch, kind="cron")
    finished = db.finish_worker_execution("w1", epoch=epoch, outcome="completed")
    assert (finished["status"], finished["outcome"]) == ("finished", "completed")
    with pytest.raises(LedgerConflictError):
        db.finish_worker_execution("w1", epoch=epoch, outcome="completed")
    with pytest.raises(ReceiptRejectedError):
        receipt(db, 1, "after the end")


# ---------------------------------------------------------------------------------------------
# Deleting and pruning with live work
# ---------------------------------------------------------------------------------------------


def test_delete_is_refused_while_work_is_live_and_clears_the_ledgers_after(
    db: SessionDB, db_path: Path
) -> None:
    db.create_session("s1", "cli")
    db.append_message("s1", "user", "hello")
    epoch = db.begin_runtime_epoch("gw")
    admission = db.admit_input("s1", "hello")
    with pytest.raises(LedgerBusyError):
        db.delete_session("s1")  # queued
    db.claim_next_input("s1", epoch=epoch)
    with pytest.raises(LedgerBusyError):
        db.delete_session("s1")  # started
    epoch = db.begin_runtime_epoch("gw-2")
    with pytest.raises(LedgerBusyError):
        db.delete_session("s1")  # unknown
    db.resolve_unknown_input(admission["id"], epoch=epoch, outcome="failed")

    db.register_worker_execution("w1", "s1", epoch=epoch, kind="kanban")
    with pytest.raises(LedgerBusyError):
        db.delete_session("s1")  # registered
    receipt(db, 1, "done")
    with pytest.raises(LedgerBusyError):
        db.delete_session("s1")  # running
    assert db.get_session("s1") is not None
    assert len(db.get_messages("s1")) == 1, "a refused delete deletes nothing"

    db.finish_worker_execution("w1", epoch=epoch, outcome="completed")
    assert db.delete_session("s1") is True
    for table in ("session_admissions", "worker_executions", "worker_receipts"):
        assert ledger_rows(db_path, table, "s1") == 0, table


def test_prune_skips_a_session_with_live_work_until_it_is_resolved(db: SessionDB) -> None:
    long_ago = time.time() - 200 * 86400
    db.create_session("old", "cli", started_at=long_ago)
    db.end_session("old", "user_exit")
    epoch = db.begin_runtime_epoch("gw")
    admission = db.admit_input("old", "late input")
    db.claim_next_input("old", epoch=epoch)
    epoch = db.begin_runtime_epoch("gw-2")

    assert db.prune_sessions(older_than_days=90) == 0
    assert db.get_session("old") is not None
    db.resolve_unknown_input(admission["id"], epoch=epoch, outcome="cancelled")
    assert db.prune_sessions(older_than_days=90) == 1
    assert db.get_session("old") is None


# ---------------------------------------------------------------------------------------------
# Routing, delivery obligations, async delegations
# ---------------------------------------------------------------------------------------------


def loaded(db: SessionDB, scope: str = "") -> dict[str, Any]:
    """The scope's routing entries, parsed as the gateway parses them."""
    return {k: json.loads(v) for k, v in db.load_gateway_routing_entries(scope=scope).items()}


def test_routing_entries_are_kept_per_scope(db: SessionDB) -> None:
    db.save_gateway_routing_entry("k1", {"chat": 1})
    db.save_gateway_routing_entry("k2", '{"chat": 2}')
    db.save_gateway_routing_entry("k1", {"chat": "other bot"}, scope="bot-b")
    db.save_gateway_routing_entry("k1", {"chat": 11})
    assert loaded(db) == {"k1": {"chat": 11}, "k2": {"chat": 2}}
    assert loaded(db, "bot-b") == {"k1": {"chat": "other bot"}}

    assert db.replace_gateway_routing_entries({"k3": [3]}, scope="bot-b") is None
    assert loaded(db, "bot-b") == {"k3": [3]}
    assert db.delete_gateway_routing_entries(["k1", "missing"]) == 1
    assert loaded(db) == {"k2": {"chat": 2}}
    assert loaded(db, "bot-b") == {"k3": [3]}
    with pytest.raises(ValueError):
        db.save_gateway_routing_entry("k4", "{not json")


def test_loaded_routing_entries_are_the_stored_json_text(db: SessionDB) -> None:
    text = '{"session_id": "s1",  "spacing": "as written", "n": 1.50}'
    db.save_gateway_routing_entry("k1", text)
    db.replace_gateway_routing_entries({"k2": text, "k3": {"x": "東京"}}, scope="s")
    assert db.load_gateway_routing_entries() == {"k1": text}
    assert db.load_gateway_routing_entries(scope="s") == {"k2": text, "k3": '{"x":"東京"}'}
    assert db.load_gateway_routing_entries(scope="no such scope") == {}


def test_any_number_of_routing_keys_can_be_deleted_at_once(db: SessionDB) -> None:
    entries = {f"key-{i}": {"i": i} for i in range(10_050)}
    assert db.replace_gateway_routing_entries(entries) is None
    doomed = (f"key-{i}" for i in range(10_000))
    assert db.delete_gateway_routing_entries(doomed) == 10_000
    assert sorted(db.load_gateway_routing_entries()) == sorted(f"key-{i}" for i in
                                                               range(10_000, 10_050))


def delivery_table_exists(db_path: Path) -> bool:
    with sqlite3.connect(db_path) as raw:
        return raw.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'delivery_obligations'"
        ).fetchone() is not None


def test_the_delivery_outbox_exists_only_after_first_use(db: SessionDB, db_path: Path) -> None:
    assert not delivery_table_exists(db_path)
    assert db.list_owed_deliveries() == []
    assert db.get_delivery_obligation("k") is None
    with pytest.raises(LedgerConflictError):
        db.settle_delivery_obligation("k")
    assert not delivery_table_exists(db_path), "reads and refusals create nothing"

    db.record_delivery_obligation("k", platform="telegram", chat_id=42, payload={"text": "hi"})
    assert delivery_table_exists(db_path)


def test_owed_deliveries_are_listed_until_settled(db: SessionDB) -> None:
    first = db.record_delivery_obligation(
        "reply-1", platform="telegram", chat_id=42, payload={"text": "a"}, session_id="s1"
    )
    db.record_delivery_obligation("reply-2", platform="discord", chat_id="c", thread_id=7,
                                  payload={"text": "b"})
    again = db.record_delivery_obligation("reply-1", platform="telegram", chat_id=42,
                                          payload={"text": "changed"})
    assert (first["duplicate"], again["duplicate"], again["payload"]) == (
        False, True, {"text": "a"}
    )
    assert [o["obligation_key"] for o in db.list_owed_deliveries()] == ["reply-1", "reply-2"]
    assert [o["obligation_key"] for o in db.list_owed_deliveries(platform="discord")] == [
        "reply-2"
    ]
    assert [o["chat_id"] for o in db.list_owed_deliveries(session_id="s1")] == ["42"]

    failed = db.record_delivery_failure("reply-1", "HTTP 502")
    assert (failed["status"], failed["attempts"], failed["last_error"]) == ("owed", 1, "HTTP 502")
    settled = db.settle_delivery_obligation("reply-1")
    assert (settled["status"], settled["settled_at"] is not None) == ("delivered", True)
    db.settle_delivery_obligation("reply-2", outcome="abandoned")
    assert db.list_owed_deliveries() == []
    with pytest.raises(LedgerConflictError):
        db.settle_delivery_obligation("reply-1")
    with pytest.raises(LedgerConflictError):
        db.record_delivery_failure("reply-1", "too late")


def test_async_delegations_only_move_forward(db: SessionDB) -> None:
    created = db.record_async_delegation("d1", "parent", task="summarise the repo")
    assert (created["status"], created["duplicate"]) == ("pending", False)
    assert db.record_async_delegation("d1", "parent")["duplicate"] is True
    with pytest.raises(LedgerConflictError):
        db.record_async_delegation("d1", "another parent")
    db.record_async_delegation("d2", "parent")

    running = db.update_async_delegation("d1", status="running", child_session_id="child")
    assert (running["status"], running["child_session_id"]) == ("running", "child")
    with pytest.raises(LedgerConflictError):
        db.update_async_delegation("d1", status="pending")
    done = db.update_async_delegation("d1", status="completed", result={"summary": "ok"})
    assert (done["status"], done["result"], done["task"]) == (
        "completed", {"summary": "ok"}, "summarise the repo"
    )
    with pytest.raises(LedgerConflictError):
        db.update_async_delegation("d1", status="failed")
    assert [d["delegation_id"] for d in db.list_async_delegations("parent")] == ["d1", "d2"]
    assert [d["delegation_id"] for d in db.list_async_delegations(pending_only=True)] == ["d2"]


# ---------------------------------------------------------------------------------------------
# Exception-path ownership
# ---------------------------------------------------------------------------------------------

PARTS = ("telegram", "coder", "dm", 1001, None, 555)


def test_a_platform_message_maps_to_one_marker_per_all_six_parts() -> None:
    marker = SessionDB.ingress_owner_marker(*PARTS)
    assert marker == SessionDB.ingress_owner_marker("telegram", "coder", "dm", "1001", "", "555")
    assert marker.startswith("ingress:v1:msg:") and len(marker) == len("ingress:v1:msg:") + 64
    variants = {
        SessionDB.ingress_owner_marker(*PARTS[:i], "other", *PARTS[i + 1:]) for i in range(6)
    }
    assert len(variants) == 6 and marker not in variants
    # Parts are kept apart: moving text across a boundary changes the marker.
    assert SessionDB.ingress_owner_marker("a", "b:c", "", "", "", "1") != (
        SessionDB.ingress_owner_marker("a", "b", "c", "", "", "1")
    )


def test_identical_keyless_turns_get_distinct_markers() -> None:
    markers = {SessionDB.ingress_owner_marker("api", "default", "", "c", None, None)
               for _ in range(100)}
    assert len(markers) == 100
    assert all(m.startswith("ingress:v1:turn:") for m in markers)


def accept(db: SessionDB, session_id: str, marker: str, text: str = "hello", **fields: Any) -> int:
    """The agent's normal persistence of an input the gateway marked."""
    return db.append_message(
        session_id, "user", text, platform_message_id="555",
        display_metadata=with_owner_marker({"sender": "alice"}, marker), **fields,
    )


def test_the_marker_never_reaches_the_provider(db: SessionDB) -> None:
    db.create_session("s1", "telegram")
    marker = SessionDB.ingress_owner_marker(*PARTS)
    accept(db, "s1", marker)
    stored = db.get_messages("s1")[0]
    assert stored["display_metadata"] == {"sender": "alice", "owner_marker": marker}
    assert stored["platform_message_id"] == "555"
    replay = db.get_messages_as_conversation("s1")
    assert marker not in json.dumps(replay)


def test_an_input_found_in_the_published_successor_is_not_appended(db: SessionDB) -> None:
    db.create_session("s1", "telegram")
    db.append_message("s1", "user", "earlier")
    db.publish_compression_child("s1", "s2", "telegram", db.get_messages("s1"))
    marker = SessionDB.ingress_owner_marker(*PARTS)
    row_id = accept(db, "s2", marker)  # the agent wrote it to the live session

    owned = db.find_owned_input("s1", marker)
    assert (owned["id"], owned["session_id"], owned["active"]) == (row_id, "s2", True)
    assert "content" not in owned, "bodies are not read"
    assert db.persist_exception_input("s1", "hello", marker=marker) == ("existing", row_id)
    assert len(db.get_messages("s2")) == 2


def test_an_input_found_in_a_compression_ancestor_is_not_appended(db: SessionDB) -> None:
    db.create_session("s1", "telegram")
    marker = SessionDB.ingress_owner_marker(*PARTS)
    row_id = accept(db, "s1", marker)
    db.publish_compression_child("s1", "s2", "telegram", [{"role": "user", "content": "sum"}])

    assert db.find_owned_input("s2", marker)["session_id"] == "s1"
    assert db.persist_exception_input("s2", "hello", marker=marker) == ("existing", row_id)
    assert [m["content"] for m in db.get_messages("s2")] == ["sum"]


def test_an_input_found_in_an_archived_generation_is_not_appended(db: SessionDB) -> None:
    db.create_session("s1", "telegram")
    marker = SessionDB.ingress_owner_marker(*PARTS)
    row_id = accept(db, "s1", marker)
    db.archive_and_compact("s1", [{"role": "user", "content": "summary"}])

    owned = db.find_owned_input("s1", marker)
    assert (owned["id"], owned["active"]) == (row_id, False)
    assert db.persist_exception_input("s1", "hello", marker=marker) == ("existing", row_id)
    assert [m["content"] for m in db.get_messages("s1")] == ["summary"]


@pytest.mark.parametrize(
    "not_an_owner",
    [{"effect_disposition": "revoked"}, {"observed": True}],
    ids=["revoked", "observed"],
)
def test_revoked_and_observed_rows_do_not_own_an_input(
    db: SessionDB, not_an_owner: dict[str, Any]
) -> None:
    db.create_session("s1", "telegram")
    marker = SessionDB.ingress_owner_marker(*PARTS)
    accept(db, "s1", marker, **not_an_owner)
    assert db.find_owned_input("s1", marker) is None
    outcome, row_id = db.persist_exception_input("s1", "hello", marker=marker)
    assert outcome == "appended"
    assert db.find_owned_input("s1", marker)["id"] == row_id


def test_identical_text_without_the_marker_does_not_own_an_input(
    db: SessionDB, db_path: Path
) -> None:
    db.create_session("s1", "telegram")
    db.append_message("s1", "user", "hello", platform_message_id="555", timestamp=5.0)
    accept(db, "s1", SessionDB.ingress_owner_marker("telegram", "coder", "dm", 1001, None, 556))
    with sqlite3.connect(db_path) as raw:  # a foreign writer's metadata that is not JSON
        raw.execute("UPDATE messages SET display_metadata = '{oops' WHERE id = 1")
    marker = SessionDB.ingress_owner_marker(*PARTS)

    outcome, row_id = db.persist_exception_input(
        "s1", "hello", marker=marker, platform_message_id="555", timestamp=5.0
    )
    assert outcome == "appended"
    appended = db.get_messages("s1")[-1]
    assert (appended["id"], appended["content"], appended["platform_message_id"]) == (
        row_id, "hello", "555"
    )
    assert appended["display_metadata"] == {"owner_marker": marker}
    assert db.persist_exception_input("s1", "hello", marker=marker) == ("existing", row_id)
    assert len(db.get_messages("s1")) == 3


def test_an_exception_input_is_appended_to_the_live_session(db: SessionDB) -> None:
    db.create_session("s1", "telegram")
    db.publish_compression_child("s1", "s2", "telegram", [])
    db.publish_compression_child("s2", "s3", "telegram", [])
    marker = SessionDB.ingress_owner_marker("api", "default", "", "c", None, None)

    outcome, row_id = db.persist_exception_input("s1", "hello", marker=marker)
    assert outcome == "appended"
    assert [m["id"] for m in db.get_messages("s3")] == [row_id]
    assert db.get_session("s3")["message_count"] == 1
    with pytest.raises(SessionNotFoundError):
        db.persist_exception_input("missing", "hello", marker=marker)


def test_nothing_is_appended_when_the_owner_read_fails(db: SessionDB, db_path: Path) -> None:
    """The owner lookup follows ``successor_session_id``; a separate connection drops that
    column, so the lookup fails for real while the append path (messages and the session
    counters) stays intact — a plain append still works afterwards."""
    db.create_session("s1", "telegram")
    marker = SessionDB.ingress_owner_marker(*PARTS)
    with sqlite3.connect(db_path) as raw:
        raw.execute("ALTER TABLE sessions DROP COLUMN successor_session_id")

    with pytest.raises(OwnerLookupError) as caught:
        db.persist_exception_input("s1", "hello", marker=marker)
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    assert db.get_messages("s1") == []
    assert db.get_session("s1")["message_count"] == 0
    db.append_message("s1", "user", "the append path itself works")
    assert len(db.get_messages("s1")) == 1


def test_a_corrupt_file_quarantines_the_exception_path_and_spools_a_replayable_call(
    db_path: Path, hermes_home: Path, damage_messages_table: Callable[[Path], None]
) -> None:
    with SessionDB(db_path, rebuild_fts=False) as db:
        db.create_session("s1", "telegram")
        db.append_message("s1", "user", "earlier")
    intact = db_path.with_name("intact.db")
    with sqlite3.connect(db_path) as raw, sqlite3.connect(intact) as copy:
        raw.backup(copy)
    raw.close()
    copy.close()
    damage_messages_table(db_path)
    marker = SessionDB.ingress_owner_marker(*PARTS)

    with SessionDB(db_path, rebuild_fts=False) as db:
        with pytest.raises(StateDbCorruptError) as caught:
            db.persist_exception_input("s1", "hello", marker=marker, platform_message_id="555")
        assert db.quarantined, "corruption met by the owner read quarantines like any write"
    assert caught.value.spooled_to == hermes_home / "sessions" / "s1.jsonl"
    (record,) = [json.loads(line) for line in caught.value.spooled_to.read_text().splitlines()]
    assert record == {"session_id": "s1", "content": "hello", "marker": marker,
                      "platform_message_id": "555"}

    with SessionDB(intact, rebuild_fts=False) as db:  # replayed where the store is whole
        outcome, row_id = db.persist_exception_input(**record)
        assert outcome == "appended"
        assert db.persist_exception_input(**record) == ("existing", row_id)


def test_the_gateway_writes_nothing_when_the_agent_owns_persistence(db: SessionDB) -> None:
    db.create_session("s1", "telegram")
    marker = SessionDB.ingress_owner_marker(*PARTS)
    assert db.persist_exception_input(
        "s1", "hello", marker=marker, agent_owns_persistence=True
    ) == ("agent_owned", None)
    assert db.get_messages("s1") == []


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.text(), st.text())
def test_the_exception_path_never_appends_twice(db: SessionDB, text: str, chat: str) -> None:
    session_id = f"p{time.monotonic_ns()}"
    db.create_session(session_id, "telegram")
    marker = SessionDB.ingress_owner_marker("telegram", "p", "", chat, None, text or "k")
    first = db.persist_exception_input(session_id, text, marker=marker)
    second = db.persist_exception_input(session_id, text + "!", marker=marker)
    assert (first[0], second) == ("appended", ("existing", first[1]))
    assert len(db.get_messages(session_id)) == 1
